// The HIP backward kernels (templates/hip/attention_bwd.hpp: dK/dV, dQ; the row kernels of
// hip/attention_bwd_common.hpp: preprocess, the convert) run on the host through the emulation of
// their AMD primitives (tests/support/hip_emulator.hpp), launched as the runtime launches them
// (runtime/launch_params.hpp's backward_launch with generator/hip_config.hpp's shapes, the
// workspace bound by bind_workspace), and their dQ, dK, dV compared with the fp64 reference
// gradients (tuner/reference.hpp). No AMD GPU is needed, so this runs in CI. The configs cover
// every code path: DqMode::Atomic (fp32 atomics into the workspace, emulated as plain adds: lanes
// run one at a time) and Separate (the dQ kernel), 1 and 2 LDS buffers, 16 and 32 keys per wave,
// 2/4/8 waves, streamed blocks of 16/32/64 query rows, copies that do not split evenly over the
// threads, padded head dims (8, 40, 96 -> 64, 64, 128), d 192 and 256, fp16/bf16, causal or
// not; the shapes tests/support/attention_cases.hpp's emulation set. Outputs and the workspace are
// poisoned (NaN) first, with guard words after every buffer. As for the forward, this checks the
// algorithm, indexing, LDS layouts and MFMA layouts as AMD documents them, not the hardware.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/hip_config.hpp"
#include "generator/problem.hpp"
#include "runtime/launch_params.hpp"
#include "support/attention_cases.hpp"
#include "support/reference.hpp"
#include "templates/attention_params.h"
// The kernel needs, in this order: params (above), the emulated primitives, the common rules, the
// tiles.
// clang-format off
#include "support/hip_emulator.hpp"
#include "templates/attention_common.h"
#include "templates/hip/tiles.hpp"
#include "templates/hip/attention_bwd_common.hpp"
#include "templates/hip/attention_bwd.hpp"
// clang-format on
#include "support/hip_backward_emulation.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

using ft::Gradients;
using Fault = ft::HipBackwardFault;
using RunFn = std::string (*)(const AttentionProblem&, const AttentionConfig&,
                              const ft::HostInputs&, Gradients*, Fault);

struct EmulatedConfig {
  int head_dim;
  AttentionConfig config;
  DType dtype;
  bool causal;
  RunFn run;
  int dkdv_lds, dq_lds;  // the template's own counts, compared with the generator's

  std::string name() const { return ft::emulation_case_name(head_dim, config, dtype, causal); }
};

template <int D, int BM, int BN, int W, int S, bool DET, bool BF16, bool CAUSAL>
EmulatedConfig emulated() {
  typedef flashjit_hip::BwdTraits<D, BM, BN, W, S, BF16, CAUSAL, !DET> K;
  AttentionConfig config{BM, BN, W, S};
  config.dq = DET ? DqMode::Separate : DqMode::Atomic;
  return {D,
          config,
          BF16 ? DType::BF16 : DType::F16,
          CAUSAL,
          &ft::run_hip_backward<K>,
          K::kLdsBytes,
          K::kDqLdsBytes};
}

void PrintTo(const EmulatedConfig& config, std::ostream* out) { *out << config.name(); }

//                  d    Bm   Bn  W  S  det    bf16   causal
std::vector<EmulatedConfig> emulated_configs() {
  return {
      emulated<64, 32, 64, 4, 2, false, true, true>(),      // 2 buffers, 16 keys per wave
      emulated<64, 64, 128, 8, 1, true, false, false>(),    // 4 query tiles, 8 waves, dQ: 4 waves
      emulated<40, 32, 32, 2, 2, false, true, false>(),     // head dim 40 -> 64
      emulated<96, 32, 64, 2, 1, true, true, true>(),       // 96 -> 128, 32 keys per wave
      emulated<128, 32, 128, 4, 1, false, true, true>(),    // the d = 128 default
      emulated<128, 32, 64, 4, 1, true, false, true>(),     // its deterministic twin's shape
      emulated<128, 16, 128, 8, 2, false, false, false>(),  // 8 waves, 2 buffers, uneven copies
      emulated<192, 16, 64, 4, 1, false, true, true>(),     // 12 dim tiles over 4 waves (dQ)
      emulated<256, 16, 64, 4, 1, false, true, false>(),    // the d = 256 default
      emulated<256, 16, 32, 2, 1, true, false, true>(),     // d = 256, deterministic
      emulated<8, 32, 64, 4, 1, false, false, true>(),      // head dim 8: 2 lanes per row
  };
}

AttentionProblem backward_problem(const ft::Shape& shape, const EmulatedConfig& c) {
  AttentionProblem problem = ft::make_problem(shape, c.head_dim, c.dtype, c.causal, Pass::Backward);
  problem.deterministic = c.config.dq == DqMode::Separate;
  return problem;
}

class HipBackwardEmulation : public ::testing::TestWithParam<EmulatedConfig> {};

TEST_P(HipBackwardEmulation, GradientsMatchTheFp64Reference) {
  const EmulatedConfig& c = GetParam();
  // The emulated config must be one the generator allows on gfx90a, with the same LDS sizes.
  const DeviceSpec gfx90a = known_device("gfx90a").value();
  {
    const AttentionProblem problem = backward_problem(ft::emulation_shapes()[1], c);
    Status legal = check_hip_config(c.config, problem, gfx90a);
    EXPECT_TRUE(legal.ok()) << legal.error().describe();
    EXPECT_EQ(hip_bwd_dkdv_lds_bytes(c.config, problem), c.dkdv_lds);
    EXPECT_EQ(hip_bwd_dq_lds_bytes(c.config, problem), c.dq_lds);
  }
  const double tolerance = gradient_tolerance(c.dtype);
  const auto start = std::chrono::steady_clock::now();
  double worst[3] = {0, 0, 0};
  uint64_t seed = 100;
  for (const ft::Shape& shape : ft::emulation_shapes()) {
    const AttentionProblem problem = backward_problem(shape, c);
    ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
    const ft::HostInputs inputs = ft::random_inputs(problem, seed++);
    const ft::Reference reference = ft::reference_attention(problem, inputs);
    Gradients gradients;
    const std::string error = c.run(problem, c.config, inputs, &gradients, Fault::kNone);
    if (!error.empty()) {
      ADD_FAILURE() << c.name() << " " << shape.to_string() << ": " << error;
      continue;
    }
    const GradientComparison comparison =
        compare_gradients(problem, gradients.dq, gradients.dk, gradients.dv, reference);
    worst[0] = std::max(worst[0], comparison.dq.rel_error);
    worst[1] = std::max(worst[1], comparison.dk.rel_error);
    worst[2] = std::max(worst[2], comparison.dv.rel_error);
    EXPECT_TRUE(within_tolerance(comparison, tolerance))
        << c.name() << " " << shape.to_string() << " (limit " << tolerance
        << "): " << comparison.to_string();
  }
  std::printf("  %s: %zu shapes in %.1f s, worst rel error dq %.2e dk %.2e dv %.2e\n",
              c.name().c_str(), ft::emulation_shapes().size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              worst[0], worst[1], worst[2]);
}

INSTANTIATE_TEST_SUITE_P(Configs, HipBackwardEmulation, ::testing::ValuesIn(emulated_configs()),
                         [](const ::testing::TestParamInfo<EmulatedConfig>& info) {
                           return info.param.name();
                         });

// The comparison must be able to fail: without the dQ kernel dq stays poisoned, and an LSE off by
// 0.05 scales every P by e^-0.05.
TEST(HipBackwardEmulationFaults, AreCaught) {
  for (const EmulatedConfig& c : {emulated_configs()[4], emulated_configs()[5]}) {
    const AttentionProblem problem = backward_problem(ft::emulation_shapes()[5], c);
    const ft::HostInputs inputs = ft::random_inputs(problem, 7);
    const ft::Reference reference = ft::reference_attention(problem, inputs);
    for (Fault fault : {Fault::kSkipDqKernel, Fault::kShiftLse}) {
      Gradients gradients;
      ASSERT_EQ(c.run(problem, c.config, inputs, &gradients, fault), "") << c.name();
      const GradientComparison comparison =
          compare_gradients(problem, gradients.dq, gradients.dk, gradients.dv, reference);
      EXPECT_FALSE(within_tolerance(comparison, gradient_tolerance(c.dtype)))
          << c.name() << " fault " << static_cast<int>(fault) << ": " << comparison.to_string();
    }
  }
}

}  // namespace
}  // namespace flashjit
