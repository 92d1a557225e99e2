#include "support/variant_emulation.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "support/attention_cases.hpp"
#include "support/reference.hpp"

namespace flashjit::testing {
namespace {

struct VariantEmulationCase {
  Shape shape;
  int64_t nan_keys_begin = 0, nan_keys_end = 0;  // keys no query sees, set to NaN
};

std::vector<VariantEmulationCase> variant_emulation_cases(int block_n) {
  return {
      {{1, 1, 1, 1, 1}},
      {{2, 2, 1, 70, 150}},
      {{1, 2, 2, 100, 40}},
      {{1, 4, 2, 17, 1000}},
      {{1, 2, 1, 40, 300}, block_n, 220 / block_n * block_n},
  };
}

// The case's problem of `pass` with the variant.
AttentionProblem case_problem(const VariantCase& variant, const VariantEmulationCase& c,
                              DType dtype, int head_dim, Pass pass) {
  AttentionProblem problem = make_problem(c.shape, head_dim, dtype, true, pass);
  problem.variant = variant.variant;
  return problem;
}

}  // namespace

void check_variant_forward_emulation(const VariantCase& variant, DType dtype, int head_dim,
                                     int block_n, uint64_t seed, const ForwardLaunch& launch) {
  for (const VariantEmulationCase& c : variant_emulation_cases(block_n)) {
    SCOPED_TRACE(std::string(variant.name) + " " + c.shape.to_string());
    const AttentionProblem problem = case_problem(variant, c, dtype, head_dim, Pass::Forward);
    ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
    HostInputs inputs = random_inputs(problem, seed++);
    poison_keys(problem, inputs, c.nan_keys_begin, c.nan_keys_end);
    std::vector<uint16_t> o;
    std::vector<float> lse;
    ASSERT_EQ(run_guarded_forward(problem, inputs, launch, &o, &lse), "");
    EXPECT_TRUE(matches_reference(
        compare(problem, o, lse, reference_attention(problem, inputs, variant.functions))));
  }
}

void check_variant_backward_emulation(const VariantCase& variant, DType dtype, int head_dim,
                                      int block_n, uint64_t seed, const EmulatedBackward& launch) {
  for (const VariantEmulationCase& c : variant_emulation_cases(block_n)) {
    SCOPED_TRACE(std::string(variant.name) + " " + c.shape.to_string());
    const AttentionProblem problem = case_problem(variant, c, dtype, head_dim, Pass::Backward);
    ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
    HostInputs inputs = random_inputs(problem, seed++, variant.functions);
    poison_keys(problem, inputs, c.nan_keys_begin, c.nan_keys_end);
    Gradients gradients;
    ASSERT_EQ(launch(problem, inputs, &gradients), "");
    const GradientComparison comparison =
        compare_gradients(problem, gradients.dq, gradients.dk, gradients.dv,
                          reference_attention(problem, inputs, variant.functions));
    EXPECT_TRUE(within_tolerance(comparison, gradient_tolerance(dtype))) << comparison.to_string();
  }
}

}  // namespace flashjit::testing
