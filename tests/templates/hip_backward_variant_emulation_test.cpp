// The HIP backward template (templates/hip/attention_bwd.hpp) with an attention variant
// (templates/attention_variant.h) run on the host through the emulation of its AMD primitives
// (tests/support/hip_emulator.hpp) against the fp64 reference gradients, as
// tests/templates/cuda_backward_variant_emulation_test.cpp does for the CUDA mma backward: causal
// sliding window + prefix-LM + soft-capping + ALiBi + a user score_mod (with its score_mod_grad) +
// a user mask_mod at once, so that query- and key-block skipping, per-element masking, every
// score modification and the chain factor of dS run, in both dQ modes (Atomic, -det), GQA, odd
// lengths. Hidden key blocks hold NaN: a kernel that uses one fails. The variant is compiled in
// (one per translation unit): the defines are what the generator renders for emulated_variant()
// in a backward problem, which the first test checks.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "generator/device.hpp"
#include "generator/hip_config.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "generator/variant.hpp"
#include "support/attention_cases.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "support/variant_emulation.hpp"
#include "templates/attention_params.h"
// clang-format off: the order matters (as the renderer assembles the source)
#include "support/hip_emulator.hpp"
#define FLASHJIT_VARIANT_MASK_MOD 1
#define FLASHJIT_VARIANT_SCORE_MOD_GRAD 1
#include "support/emulated_variant.h"
#include "templates/attention_common.h"
#include "templates/hip/tiles.hpp"
// (the kernels last, in the renderer's order: the row kernels)
#include "templates/hip/attention_bwd_common.hpp"
// (the dK/dV and dQ kernels)
#include "templates/hip/attention_bwd.hpp"
// clang-format on
#include "support/hip_backward_emulation.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// The variant compiled in above (support/emulated_variant.h) and its host expressions.
const ft::VariantCase kVariant = ft::emulated_variant(/*with_mask_mod=*/true);

TEST(HipBackwardVariantEmulation, TheDefinesAreWhatTheGeneratorRenders) {
  AttentionProblem p =
      AttentionProblem::make(1, 1, 1, 16, 16, 64, DType::BF16, true).with_pass(Pass::Backward);
  p.variant = kVariant.variant;
  const std::string prelude = render_variant_prelude(p).value();
  for (const std::string& line : ft::emulated_backward_prelude_lines())
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
  // The rendered HIP backward carries that prelude; its dK/dV and dQ kernels enter through the
  // variant's entries, the row kernels are the plain ones.
  for (DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
    AttentionConfig config{32, 64, 4, 1};
    config.dq = dq;
    p.deterministic = dq == DqMode::Separate;
    const Result<KernelSource> source = render_hip_attention(p, config);
    ASSERT_TRUE(source.ok()) << source.error().describe();
    EXPECT_NE(source->text.find(prelude), std::string::npos);
    EXPECT_NE(source->text.find("flashjit_hip::attention_backward_dkdv_variant<Config>(params);"),
              std::string::npos);
    EXPECT_EQ(source->text.find("flashjit_hip::attention_backward_dq_variant<Config>(params);") !=
                  std::string::npos,
              dq == DqMode::Separate);
    EXPECT_NE(source->text.find("flashjit_hip::backward_preprocess<64, true>(params);"),
              std::string::npos);
  }
}

template <class K>
void check(DType dtype, int head_dim) {
  AttentionConfig config{K::kBlockM, K::kBlockN, K::kWaves, K::kStages};
  config.dq = K::kDqAtomic ? DqMode::Atomic : DqMode::Separate;
  SCOPED_TRACE(config.to_string());
  ft::check_variant_backward_emulation(
      kVariant, dtype, head_dim, K::kBlockN, /*seed=*/23,
      [&](const AttentionProblem& variant_problem, const ft::HostInputs& inputs,
          ft::Gradients* out) -> std::string {
        AttentionProblem problem = variant_problem;
        problem.deterministic = !K::kDqAtomic;
        // The config is one the generator offers for the variant on gfx90a.
        const Status legal = check_hip_config(config, problem, known_device("gfx90a").value());
        if (!legal.ok()) return legal.error().describe();
        return ft::run_hip_backward<K>(problem, config, inputs, out);
      });
}

//                                    d    Bm   Bn  W  S  bf16   causal atomic
TEST(HipBackwardVariantEmulation, AtomicMatchesTheFp64Reference) {
  check<flashjit_hip::BwdTraits<64, 32, 64, 4, 2, true, true, true>>(DType::BF16, 64);
  check<flashjit_hip::BwdTraits<40, 32, 32, 2, 2, false, true, true>>(DType::F16, 40);
}

TEST(HipBackwardVariantEmulation, DeterministicMatchesTheFp64Reference) {
  check<flashjit_hip::BwdTraits<96, 32, 64, 2, 1, true, true, false>>(DType::BF16, 96);
  check<flashjit_hip::BwdTraits<64, 64, 128, 8, 1, false, true, false>>(DType::F16, 64);
}

// The comparison must be able to fail on a variant: an LSE off by 0.05 scales every P.
TEST(HipBackwardVariantEmulation, AShiftedLseIsCaught) {
  typedef flashjit_hip::BwdTraits<64, 32, 64, 4, 2, true, true, true> K;
  AttentionConfig config{K::kBlockM, K::kBlockN, K::kWaves, K::kStages};
  AttentionProblem problem =
      ft::make_problem({2, 2, 1, 70, 150}, 64, DType::BF16, true, Pass::Backward);
  problem.variant = kVariant.variant;
  const ft::HostInputs inputs = ft::random_inputs(problem, 5, kVariant.functions);
  ft::Gradients gradients;
  ASSERT_EQ(
      ft::run_hip_backward<K>(problem, config, inputs, &gradients, ft::HipBackwardFault::kShiftLse),
      "");
  const GradientComparison comparison =
      compare_gradients(problem, gradients.dq, gradients.dk, gradients.dv,
                        ft::reference_attention(problem, inputs, kVariant.functions));
  EXPECT_FALSE(within_tolerance(comparison, gradient_tolerance(DType::BF16)))
      << comparison.to_string();
}

}  // namespace
}  // namespace flashjit
