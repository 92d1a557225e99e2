// The HIP attention kernel body (templates/hip/attention_fwd.hpp) run on the host through an
// emulation of its AMD primitives (tests/support/hip_emulator.hpp), against the fp64 reference.
// No AMD GPU is needed, so this runs in CI; it checks the kernel's algorithm, indexing, LDS
// layout, MFMA operand/result layouts (as AMD documents them), masking, GQA, strides and LSE on
// a set of configs chosen to cover every code path (1/2/4/8 waves, 16/32 rows per wave, block_n
// 32/64/128, 1/2 LDS stages, padded head dims, fp16/bf16, causal or not). It does not show that
// the hardware behaves as documented: that needs a run on an MI200/MI300 (README, "AMD (HIP)").
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/hip_config.hpp"
#include "generator/problem.hpp"
#include "runtime/launch_params.hpp"
#include "support/attention_cases.hpp"
#include "support/forward_emulation.hpp"
#include "support/reference.hpp"
#include "templates/attention_params.h"
// The kernel needs, in this order: params (above), the emulated primitives, the common rules, the
// tiles.
// clang-format off
#include "support/hip_emulator.hpp"
#include "templates/attention_common.h"
#include "templates/hip/tiles.hpp"
#include "templates/hip/attention_fwd.hpp"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

constexpr double kMaxOutputRelError = 1e-2;
constexpr double kMaxLseAbsError = 1e-3;
// Runs the emulated kernel for `problem`; fills o (whole span, poisoned first) and lse.
template <class K>
std::string run_emulated(const AttentionProblem& problem, const ft::HostInputs& inputs,
                         std::vector<uint16_t>* o, std::vector<float>* lse) {
  return ft::run_guarded_forward(
      problem, inputs,
      [](const AttentionProblem& problem, const ft::HostInputs&,
         const FlashjitAttentionParams& params) {
        const auto grid = ft::forward_grid<ft::HipGrid>(problem, K::kBlockM);
        return ft::emulate_hip(grid, K::kThreads, K::kLdsBytes,
                               [&] { flashjit_hip::attention_forward<K>(params); });
      },
      o, lse);
}

using RunFn = std::string (*)(const AttentionProblem&, const ft::HostInputs&,
                              std::vector<uint16_t>*, std::vector<float>*);

struct EmulatedConfig {
  int head_dim;
  AttentionConfig config;
  DType dtype;
  bool causal;
  RunFn run;
  int lds_bytes;  // the template's own count, compared with the generator's

  std::string name() const { return ft::emulation_case_name(head_dim, config, dtype, causal); }
};

template <int D, int BM, int BN, int W, int S, bool BF16, bool CAUSAL>
EmulatedConfig emulated() {
  typedef flashjit_hip::Traits<D, BM, BN, W, S, BF16, CAUSAL> K;
  return {D,      {BM, BN, W, S},   BF16 ? DType::BF16 : DType::F16,
          CAUSAL, &run_emulated<K>, K::kLdsBytes};
}

void PrintTo(const EmulatedConfig& config, std::ostream* out) { *out << config.name(); }

std::vector<EmulatedConfig> emulated_configs() {
  return {
      emulated<64, 32, 32, 1, 1, true, true>(),      // 1 wave, 32 rows, block_n 32, 1 stage
      emulated<64, 64, 64, 2, 2, false, false>(),    // 2 waves of 32 rows, 2 stages
      emulated<64, 256, 128, 8, 1, true, false>(),   // 8 waves, block_n 128
      emulated<96, 128, 32, 8, 2, false, true>(),    // padded head dim (96 -> 128), 8 waves
      emulated<128, 128, 64, 4, 1, true, true>(),    // the d = 128 default
      emulated<128, 128, 64, 4, 1, false, false>(),  //
      emulated<128, 64, 32, 4, 2, true, false>(),    // 16 rows per wave, 2 stages
      emulated<192, 64, 64, 4, 1, true, true>(),     // 24 chunks per row (not a power of two)
      emulated<256, 128, 32, 8, 1, true, true>(),    // the d = 256 default
      emulated<256, 32, 32, 2, 1, false, false>(),   //
  };
}

class HipEmulation : public ::testing::TestWithParam<EmulatedConfig> {};

TEST_P(HipEmulation, MatchesTheFp64Reference) {
  const EmulatedConfig& c = GetParam();
  // The emulated config must be one the generator allows on gfx90a, with the same LDS size.
  const DeviceSpec gfx90a = known_device("gfx90a").value();
  {
    const AttentionProblem problem =
        ft::make_problem(ft::emulation_shapes()[1], c.head_dim, c.dtype, c.causal);
    Status legal = check_hip_config(c.config, problem, gfx90a);
    EXPECT_TRUE(legal.ok()) << legal.error().describe();
    EXPECT_EQ(hip_lds_bytes(c.config, problem), c.lds_bytes);
  }
  const auto start = std::chrono::steady_clock::now();
  double worst_o = 0, worst_lse = 0;
  uint64_t seed = 1;
  for (const ft::Shape& shape : ft::emulation_shapes()) {
    const AttentionProblem problem = ft::make_problem(shape, c.head_dim, c.dtype, c.causal);
    ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
    const ft::HostInputs inputs = ft::random_inputs(problem, seed++);
    const ft::Reference reference = ft::reference_attention(problem, inputs);
    std::vector<uint16_t> o;
    std::vector<float> lse;
    const std::string error = c.run(problem, inputs, &o, &lse);
    if (!error.empty()) {
      ADD_FAILURE() << c.name() << " " << shape.to_string() << ": " << error;
      continue;
    }
    const ft::Comparison comparison = ft::compare(problem, o, lse, reference);
    worst_o = std::max(worst_o, comparison.o_rel_error);
    worst_lse = std::max(worst_lse, comparison.lse_max_abs_error);
    EXPECT_TRUE(ft::matches_reference(comparison, kMaxOutputRelError, kMaxLseAbsError))
        << c.name() << " " << shape.to_string();
  }
  std::printf("  %s: %zu shapes emulated in %.1f s, worst o rel error %.2e, lse abs error %.2e\n",
              c.name().c_str(), ft::emulation_shapes().size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              worst_o, worst_lse);
}

INSTANTIATE_TEST_SUITE_P(Configs, HipEmulation, ::testing::ValuesIn(emulated_configs()),
                         [](const ::testing::TestParamInfo<EmulatedConfig>& info) {
                           return info.param.name();
                         });

// The emulation must be able to fail: a kernel whose wave diverges at an MFMA is reported, and a
// wrong MFMA layout (A and B swapped) gives wrong numbers.
TEST(HipEmulator, ReportsDivergenceAtAWaveOperation) {
  const std::string error = ft::emulate_hip({1, 1, 1}, 64, 16, [] {
    if (flashjit_hip::lane_index() < 32) {
      flashjit_hip::mfma_16x16x16<true>(0, 0, 0, 0, flashjit_hip::f32x4{0, 0, 0, 0});
    }
  });
  EXPECT_NE(error.find("divergent"), std::string::npos) << error;
}

TEST(HipEmulator, ReportsABarrierNotEveryThreadReaches) {
  const std::string error = ft::emulate_hip({1, 1, 1}, 128, 16, [] {
    if (flashjit_hip::thread_index() < 64) flashjit_hip::barrier();
  });
  EXPECT_NE(error.find("barrier"), std::string::npos) << error;
}

TEST(HipEmulator, MfmaComputesTheDocumentedLayout) {
  // A[i][k] = i + k, B[k][j] = (k == j) (identity): D = A. Lane l holds A[l % 16][4 (l / 16) + e]
  // and B[4 (l / 16) + e][l % 16], and gets D[4 (l / 16) + e][l % 16].
  std::vector<float> d(64 * 4, -1.f);
  const std::string error = ft::emulate_hip({1, 1, 1}, 64, 16, [&] {
    const int l = flashjit_hip::lane_index(), g = l / 16, r = l % 16;
    uint16_t a[4], b[4];
    for (int e = 0; e < 4; ++e) {
      a[e] = float_to_bf16(static_cast<float>(r + 4 * g + e));
      b[e] = float_to_bf16(4 * g + e == r ? 1.f : 0.f);
    }
    const flashjit_hip::f32x4 out = flashjit_hip::mfma_16x16x16<true>(
        a[0] | (uint32_t{a[1]} << 16), a[2] | (uint32_t{a[3]} << 16), b[0] | (uint32_t{b[1]} << 16),
        b[2] | (uint32_t{b[3]} << 16), flashjit_hip::f32x4{0.5f, 0.5f, 0.5f, 0.5f});
    for (int e = 0; e < 4; ++e) d[l * 4 + e] = out[e];
  });
  ASSERT_EQ(error, "");
  for (int l = 0; l < 64; ++l)
    for (int e = 0; e < 4; ++e) {
      const int row = 4 * (l / 16) + e, col = l % 16;
      EXPECT_EQ(d[l * 4 + e], static_cast<float>(row + col) + 0.5f) << "lane " << l << " e " << e;
    }
}

}  // namespace
}  // namespace flashjit
