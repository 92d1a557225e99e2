// The ws family's fused backward (templates/cuda/ws/attention_bwd_ws.cuh) compiled for the host
// against the emulation of its sm_90a primitives (tests/support/sm90_emulator.hpp: TMA loads
// landing late or early, mbarrier phases, named barriers, wgmma with late execution, bulk
// reductions that read shared memory at their wait, setmaxnreg checked against the launch's
// registers), run on shapes that hit the edges and compared with the fp64 reference gradients.
// The preprocess (delta, lse_log2, zeroed dq_accum) and the convert run on the host as
// cuda/attention_bwd_common.cuh defines them (support/sm90_backward_emulation.hpp).
//
// This checks the algorithm, indexing, the producer/consumer/writer protocol (every buffer's
// reuse under late loads and late wgmmas), tile layouts, descriptors and masking as the
// emulator documents the hardware; that the hardware agrees is the GPU tests' part.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "generator/backward_config_ws.hpp"
#include "generator/device.hpp"
#include "runtime/launch_params.hpp"
#include "runtime/tensor_map_spec.hpp"
#include "tuner/reference.hpp"
// The order matters: the template sees the emulated primitives.
// clang-format off
#include "templates/attention_params.h"
#include "templates/attention_common.h"
#include "support/sm90_emulator.hpp"
#include "templates/cuda/sm90_tiles.cuh"
#include "templates/cuda/attention_bwd_sm90.cuh"
#include "templates/cuda/attention_bwd_sm90_dq.cuh"
#include "templates/cuda/ws/pipeline.cuh"
#include "templates/cuda/ws/pingpong.cuh"
#include "templates/cuda/ws/attention_bwd_ws.cuh"
// clang-format on
#include "support/sm90_backward_emulation.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

struct Shape {
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  bool bhsd = false;
  std::string to_string() const {
    return "(b" + std::to_string(batch) + " hq" + std::to_string(heads_q) + " hkv" +
           std::to_string(heads_kv) + " sq" + std::to_string(seqlen_q) + " sk" +
           std::to_string(seqlen_k) + (bhsd ? " bhsd)" : " bshd)");
  }
};

// One row, ragged tails, seqlen_q != seqlen_k both ways (causal key blocks that no query sees:
// dK = dV = 0 written without a step), GQA over several query blocks, batches, BHSD.
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> list = {
      {1, 1, 1, 1, 1},     {1, 2, 2, 17, 17},        {1, 1, 1, 100, 300}, {1, 1, 1, 300, 100},
      {1, 4, 1, 129, 200}, {2, 4, 2, 70, 170, true}, {1, 1, 1, 257, 257},
  };
  return list;
}

AttentionProblem make_problem(const Shape& shape, int head_dim, DType dtype, bool causal) {
  return AttentionProblem::make(shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q,
                                shape.seqlen_k, head_dim, dtype, causal,
                                shape.bhsd ? Layout::BHSD : Layout::BSHD)
      .with_pass(Pass::Backward);
}

// The launch the runtime makes (grid of backward_launch's dK/dV entry, the tensor maps of
// backward_tensor_map_specs), emulated.
template <class K>
std::string run_ws_backward(const AttentionProblem& p, const AttentionConfig& config,
                            const HostInputs& in, ft::Gradients* out,
                            const ft::Sm90Options& options) {
  return ft::run_backward_around_host_rows(
      p, config, in, out, [&](FlashjitAttentionParams& params) -> std::string {
        Result<ForwardTensorMapSpecs> specs = backward_tensor_map_specs(params, p, config);
        if (!specs.ok()) return specs.error().describe();
        FlashjitForwardTensorMaps maps;
        ft::encode_tensor_map(specs->q, &maps.q);
        ft::encode_tensor_map(specs->k, &maps.k);
        ft::encode_tensor_map(specs->v, &maps.v);
        ft::encode_tensor_map(specs->o, &maps.o);
        // The runtime's grid: one CTA per key tile, or (-persist) a few CTAs that walk several
        // tiles each (3 here, where the GPU has one per SM).
        const KernelShape shape{K::kThreads, K::kSmemBytes, K::kPersistent ? 3 : 0};
        const LaunchShape launch =
            backward_launch(p, config, BackwardShapes{KernelShape{}, shape, KernelShape{}}).dkdv;
        const ft::Sm90Grid grid{static_cast<int>(launch.grid_x), static_cast<int>(launch.grid_y),
                                static_cast<int>(launch.grid_z)};
        std::string error = ft::emulate_sm90(
            grid, K::kThreads, K::kSmemBytes,
            [&] { flashjit_kernel::attention_backward_ws_dkdv<K>(params, maps); }, options);
        return error.empty() ? "" : "fused kernel: " + error;
      });
}

template <int HEAD_DIM, int BLOCK_M, int STAGES, bool BF16, bool CAUSAL, bool PERSISTENT = false,
          bool PINGPONG = false>
void check_config() {
  using K = flashjit_kernel::WsBwdTraits<HEAD_DIM, BLOCK_M, 128, 12, STAGES, BF16, CAUSAL, true,
                                         PERSISTENT, PINGPONG>;
  AttentionConfig config{BLOCK_M, 128, 12, STAGES, KernelFamily::Ws, DqMode::Atomic};
  config.persistent = PERSISTENT;
  config.pingpong = PINGPONG;
  const DType dtype = BF16 ? DType::BF16 : DType::F16;
  std::string name = "d";
  name += std::to_string(HEAD_DIM);
  name += " ";
  name += to_string(dtype);
  name += CAUSAL ? " causal " : " non-causal ";
  name += config.to_string();
  // The template and the budget agree on the launch (the kernel traps on too little shared
  // memory), the config is legal, and setmaxnreg's split is the budget's.
  const AttentionProblem sample = make_problem(shapes()[1], HEAD_DIM, dtype, CAUSAL);
  const Status legal = check_ws_backward_config(config, sample, *known_device("sm90"));
  ASSERT_TRUE(legal.ok()) << name << ": " << legal.error().message;
  EXPECT_EQ(ws_backward_dkdv_smem_bytes(config, sample), K::kSmemBytes) << name;
  EXPECT_EQ(ws_backward_dkdv_threads(config), K::kThreads) << name;
  EXPECT_EQ(ws_backward_consumer_register_limit(config), K::kConsumerRegisters) << name;
  const double tolerance = gradient_tolerance(dtype);
  double worst = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < shapes().size(); ++i) {
    const Shape& shape = shapes()[i];
    const AttentionProblem p = make_problem(shape, HEAD_DIM, dtype, CAUSAL);
    ASSERT_TRUE(validate(p).ok()) << validate(p).error().describe();
    const uint64_t seed = 104729ull * (i + 1) + HEAD_DIM + BLOCK_M + (CAUSAL ? 1 : 0);
    const HostInputs inputs = random_inputs(p, seed);
    const Reference reference = reference_attention(p, inputs);
    // Every other shape with loads landing at random points and wgmma waits deferred.
    ft::Sm90Options options;
    options.seed = seed;
    options.early_landing = options.late_wgmma = i % 2 == 1;
    options.launch_registers = K::kLaunchRegisters;
    ft::Gradients gradients;
    const std::string error = run_ws_backward<K>(p, config, inputs, &gradients, options);
    const std::string where =
        name + " shape=" + shape.to_string() + " seed=" + std::to_string(seed);
    ASSERT_TRUE(error.empty()) << where << ": " << error;
    const GradientComparison comparison =
        compare_gradients(p, gradients.dq, gradients.dk, gradients.dv, reference);
    EXPECT_TRUE(within_tolerance(comparison, tolerance))
        << where << ": " << comparison.to_string() << " (tolerance " << tolerance << ")";
    worst = std::max(worst, comparison.max_rel_error());
  }
  std::printf("  %-36s max relative L2 error %.2e (tolerance %.1e), %.1f s\n", name.c_str(), worst,
              tolerance,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// Every legal shape: block_m 64 with one dQ column tile per consumer, 2 stages (3 do not fit
// at d 128), both dtypes, causal and not, a padded head dim; head dims up to 64, where the two
// consumers each compute their keys' share of the step's one dQ tile (2 and 3 stages).
TEST(CudaBwdWsEmulation, D128) {
  check_config<128, 64, 2, true, true>();
  check_config<128, 64, 2, false, false>();
}
TEST(CudaBwdWsEmulation, PaddedHeadDim96) { check_config<96, 64, 2, true, true>(); }
TEST(CudaBwdWsEmulation, D64DqSharesByKeys) {
  check_config<64, 64, 2, true, true>();
  check_config<64, 64, 3, false, false>();
  check_config<40, 64, 2, true, false>();  // padded to 64
}
// -persist: 3 CTAs walk every key tile of the shape (tiles no query sees among them, causal),
// carrying the pipelines, the dQ rounds and the K/V loads across tiles.
TEST(CudaBwdWsEmulation, Persistent) {
  check_config<128, 64, 2, true, true, true>();
  check_config<128, 64, 2, false, false, true>();
  check_config<64, 64, 2, true, true, true>();
}
// -pp: the consumers take turns issuing S^T and dP^T and announce their dS^T rows by mbarriers
// (no meeting point a step): d 128 and 96, and d 64 (its dQ shares need no meeting anyway;
// with -persist: at d 128 the two spill).
TEST(CudaBwdWsEmulation, PingPong) {
  check_config<128, 64, 2, true, true, false, true>();
  check_config<96, 64, 2, false, false, false, true>();
  check_config<64, 64, 2, true, false, false, true>();
  check_config<64, 64, 3, false, true, true, true>();
}

// The family takes plain attention only: variants, packed documents, deterministic problems and
// head dims past 128 have no ws config (they fall back to the wgmma and mma families).
TEST(CudaBwdWsBudget, ProblemsTheFamilyDoesNotTake) {
  const DeviceSpec& h100 = *known_device("sm90");
  AttentionProblem p =
      AttentionProblem::make(1, 4, 4, 1024, 1024, 128, DType::BF16, true, Layout::BSHD)
          .with_pass(Pass::Backward);
  EXPECT_FALSE(ws_backward_candidates(p).empty());
  AttentionProblem windowed = p;
  windowed.variant.window_left = 64;
  EXPECT_TRUE(ws_backward_candidates(windowed).empty());
  AttentionProblem deterministic = p;
  deterministic.deterministic = true;
  EXPECT_TRUE(ws_backward_candidates(deterministic).empty());
  AttentionProblem d256 =
      AttentionProblem::make(1, 4, 4, 1024, 1024, 256, DType::BF16, true, Layout::BSHD)
          .with_pass(Pass::Backward);
  EXPECT_TRUE(ws_backward_candidates(d256).empty());
  // A named config for such a problem is refused with the reason.
  const AttentionConfig named{64, 128, 12, 2, KernelFamily::Ws, DqMode::Atomic};
  const Status refused = check_ws_backward_config(named, windowed, h100);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("variants"), std::string::npos) << refused.error().message;
  // d 64: block_m 128 (a dQ tile per consumer) is over the registers; block_m 64 (the
  // consumers' shares of one dQ tile) is legal with 2 and 3 stages.
  AttentionProblem d64 =
      AttentionProblem::make(1, 4, 4, 1024, 1024, 64, DType::BF16, true, Layout::BSHD)
          .with_pass(Pass::Backward);
  for (const AttentionConfig& c : ws_backward_candidates(d64))
    EXPECT_EQ(check_ws_backward_config(c, d64, h100).ok(), c.block_m == 64) << c.to_string();
  // Not on sm80 either.
  EXPECT_FALSE(check_ws_backward_config(named, p, *known_device("sm80")).ok());
  EXPECT_TRUE(check_ws_backward_config(named, p, h100).ok());
}

}  // namespace
}  // namespace flashjit
