// The warp-specialized forward (templates/cuda/ws/, configs "-ws") on packed variable-length
// documents run on the host through the sm_90a emulator (tests/support/sm90_emulator.hpp: TMA
// loads landing when the scheduler chooses, mbarrier phases, wgmma with late execution) against
// the fp64 reference per document (ft::check_varlen_emulation's cases: documents of 1, 17, ~100
// rows, empty ones, seqlen_q != seqlen_k both ways, GQA 2:2 and 4:1, causal with a sliding
// window, poisoned o, NaN spare keys past the last document). What is new on this family: the
// tensor maps span the packed tensors (runtime/tensor_map_spec.hpp), so a tile's TMA boxes read
// rows of the next document (or the NaN spare rows): the masks and the zeroed V rows
// (ws_zero_rows_from) must keep them out, and the epilogue's stores must stop at the document's
// last row (ws_store_rows); the tile schedulers skip tiles past their document's queries. The
// variant compiled in is support/emulated_varlen.h (templates_cuda_varlen_emulation_test checks
// its defines).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/problem.hpp"
#include "runtime/launch_params.hpp"
#include "runtime/tensor_map_spec.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
// The order matters (as the renderer assembles the source):
// clang-format off
#include "templates/attention_params.h"
// (the emulated primitives before the templates)
#include "support/sm90_emulator.hpp"
#include "support/emulated_varlen.h"
// (tiles, then the -ws pieces in the renderer's order)
#include "templates/cuda/sm90_tiles.cuh"
#include "templates/cuda/ws/pipeline.cuh"
#include "templates/cuda/ws/traits.cuh"
#include "templates/cuda/ws/tile_scheduler.cuh"
#include "templates/cuda/ws/pingpong.cuh"
#include "templates/cuda/ws/softmax.cuh"
#include "templates/cuda/ws/mainloop.cuh"
#include "templates/cuda/ws/epilogue.cuh"
#include "templates/cuda/ws/attention_fwd_ws.cuh"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// The grid of a persistent config in the emulation (the device's is one CTA per SM slot): fewer
// CTAs than tiles, so that each walks several and skips some.
constexpr int kPersistentCtas = 3;

// One config: WsTraits<HEAD_DIM, BLOCK_M, BLOCK_N, WARPS, STAGES, BF16, causal, PP, PERSIST>,
// run on every case under two emulator schedules (loads landing late / early with late wgmma
// waits).
template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int STAGES, bool BF16, bool PINGPONG,
          bool PERSISTENT>
void check() {
  constexpr int kWarps = BLOCK_M / 16 + 4;
  using K = flashjit_kernel::WsTraits<HEAD_DIM, BLOCK_M, BLOCK_N, kWarps, STAGES, BF16, true,
                                      PINGPONG, PERSISTENT>;
  AttentionConfig config{BLOCK_M, BLOCK_N, kWarps, STAGES, KernelFamily::Ws};
  config.pingpong = PINGPONG;
  config.persistent = PERSISTENT;
  SCOPED_TRACE(config.to_string());
  const DType dtype = BF16 ? DType::BF16 : DType::F16;
  for (bool early : {false, true}) {
    SCOPED_TRACE(early ? "loads early, wgmma waits late" : "loads late");
    uint64_t seed = 41;
    ft::check_varlen_emulation(
        dtype, HEAD_DIM,
        [&](const AttentionProblem& problem, const ft::HostInputs& inputs, std::vector<uint16_t>* o,
            std::vector<float>* lse) -> std::string {
          const Status legal = check_config(config, problem, *known_device("sm90"));
          if (!legal.ok()) return legal.error().describe();
          AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), o->data(),
                             lse->data()};
          args.cu_seqlens_q = inputs.cu_seqlens_q.data();
          args.cu_seqlens_k = inputs.cu_seqlens_k.data();
          const FlashjitAttentionParams params = make_launch_params(problem, args);
          Result<ForwardTensorMapSpecs> specs = forward_tensor_map_specs(params, problem, config);
          if (!specs.ok()) return specs.error().describe();
          FlashjitForwardTensorMaps maps;
          ft::encode_tensor_map(specs->q, &maps.q);
          ft::encode_tensor_map(specs->k, &maps.k);
          ft::encode_tensor_map(specs->v, &maps.v);
          ft::encode_tensor_map(specs->o, &maps.o);
          const LaunchShape launch = forward_launch(
              problem, config, {K::kThreads, K::kSmemBytes, PERSISTENT ? kPersistentCtas : 0});
          const ft::Sm90Grid grid{static_cast<int>(launch.grid_x), static_cast<int>(launch.grid_y),
                                  static_cast<int>(launch.grid_z)};
          ft::Sm90Options options;
          options.seed = seed++;
          options.early_landing = early;
          options.late_wgmma = early;
          options.launch_registers = K::kLaunchRegisters;
          return ft::emulate_sm90(
              grid, K::kThreads, K::kSmemBytes,
              [&] { flashjit_kernel::attention_forward_ws<K>(params, maps); }, options);
        });
  }
}

TEST(CudaVarlenWsEmulation, OneConsumerMatchesTheFp64ReferencePerDocument) {
  check<64, 64, 64, 2, true, false, false>();
}

TEST(CudaVarlenWsEmulation, PersistentPingPongMatchesTheFp64ReferencePerDocument) {
  // Two consumers taking turns, each CTA walking several tiles; n128, 3 stages.
  check<128, 128, 128, 3, false, true, true>();
}

TEST(CudaVarlenWsEmulation, ThreeConsumersPersistentMatchTheFp64ReferencePerDocument) {
  check<64, 192, 64, 2, true, false, true>();
}

}  // namespace
}  // namespace flashjit
