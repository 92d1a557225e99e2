// The warp-specialized forward (templates/cuda/ws/, configs "-ws") with an attention variant
// (templates/attention_variant.h) run on the host through the sm_90a emulator
// (tests/support/sm90_emulator.hpp: TMA loads landing when the scheduler chooses, mbarrier
// phases, setmaxnreg checked against the launch, wgmma with late execution, TMA stores) against
// the fp64 reference: causal sliding window + prefix-LM + soft-capping + ALiBi + a user score_mod
// and mask_mod at once, so that the producer's block order, the consumers' masking and score
// modification and the epilogue's LSE all run the variant. Hidden key blocks hold NaN: a kernel
// that loads one fails. The variant is compiled in (one per translation unit); its defines are
// those of cuda_variant_sm90_emulation_test.cpp, which checks them against the generator.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/forward_config_ws.hpp"
#include "generator/problem.hpp"
#include "runtime/launch_params.hpp"
#include "support/attention_cases.hpp"
#include "support/forward_emulation.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "support/variant_emulation.hpp"
// The order matters (as the renderer assembles the source):
// clang-format off
#include "templates/attention_params.h"
// (the emulated primitives before the templates)
#include "support/sm90_emulator.hpp"
#define FLASHJIT_VARIANT_MASK_MOD 1
#include "support/emulated_variant.h"
#include "templates/attention_common.h"
#include "templates/cuda/online_softmax.cuh"
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

// The grid of a persistent config in the emulation (the device's is one CTA per SM slot).
constexpr int kPersistentCtas = 2;

// The variant compiled in above (support/emulated_variant.h) and its host expressions.
const ft::VariantCase kVariant = ft::emulated_variant(/*with_mask_mod=*/true);

// One config: WsTraits<HEAD_DIM, BLOCK_M, BLOCK_N, WARPS, STAGES, BF16, CAUSAL, PP, PERSIST>, each
// case run with the loads landing late, then early with wgmma waiting late.
template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int STAGES, bool BF16, bool PINGPONG,
          bool PERSISTENT>
void check() {
  constexpr int kWarps = BLOCK_M / 16 + 4;
  using K = flashjit_kernel::WsTraits<HEAD_DIM, BLOCK_M, BLOCK_N, kWarps, STAGES, BF16, true,
                                      PINGPONG, PERSISTENT>;
  AttentionConfig config{BLOCK_M, BLOCK_N, kWarps, STAGES, KernelFamily::Ws};
  config.pingpong = PINGPONG;
  config.persistent = PERSISTENT;
  const DType dtype = BF16 ? DType::BF16 : DType::F16;
  for (bool early : {false, true}) {
    SCOPED_TRACE(config.to_string() +
                 (early ? " (loads early, wgmma waits late)" : " (loads late)"));
    uint64_t landing_seed = 24;  // the emulator's schedule: one per case
    ft::check_variant_forward_emulation(
        kVariant, dtype, HEAD_DIM, BLOCK_N, /*seed=*/23,
        [&](const AttentionProblem& problem, const ft::HostInputs&,
            const FlashjitAttentionParams& params) -> std::string {
          if (!check_config(config, problem, *known_device("sm90")).ok())
            return "not a legal sm90 config: " + config.to_string();
          ft::Sm90Options options;
          options.seed = landing_seed++;
          options.early_landing = early;
          options.late_wgmma = early;
          options.launch_registers = K::kLaunchRegisters;
          return ft::emulate_ws_forward(
              problem, config, params, K::kThreads, K::kSmemBytes, kPersistentCtas,
              [&](const FlashjitForwardTensorMaps& maps) {
                flashjit_kernel::attention_forward_ws<K>(params, maps);
              },
              options);
        });
  }
}

TEST(CudaVariantWsEmulation, MatchesTheFp64Reference) {
  // One consumer warpgroup, n64, 2 stages; two consumers taking turns (-pp), persistent (each
  // CTA walks several tiles), n128, 3 stages.
  check<64, 64, 64, 2, true, false, false>();
  check<128, 128, 128, 3, false, true, true>();
}

}  // namespace
}  // namespace flashjit
