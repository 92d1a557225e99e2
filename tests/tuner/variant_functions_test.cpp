// The fp64 reference's own evaluation of user expressions (issue 17, tuner/variant_functions):
// the JIT'd score_mod / mask_mod / score_mod_grad equal hand-written host functions on random
// arguments, float literals are evaluated in double, a bad expression is a typed error quoting
// it, host functions the caller gives win, and the reference of a variant problem computed with
// JIT'd functions matches the one with hand-written functions (forward and backward). Without
// the CPU backend: the Unsupported error.
#include "tuner/variant_functions.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "runtime/runtime.hpp"
#include "tuner/reference.hpp"

namespace flashjit {
namespace {

TEST(DoubleExpression, DropsTheSuffixOfFloatLiteralsOnly) {
  EXPECT_EQ(double_expression("score - 0.1f * abs(q_idx - kv_idx)"),
            "score - 0.1 * abs(q_idx - kv_idx)");
  EXPECT_EQ(double_expression("1e-3f + 2.F + .5f + 1.5e+2f"), "1e-3 + 2. + .5 + 1.5e+2");
  // Hexadecimal integers, names with digits and plain integers stay as they are.
  EXPECT_EQ(double_expression("0x1f + x2f + q_idx / 64 + 1.0"), "0x1f + x2f + q_idx / 64 + 1.0");
  EXPECT_EQ(double_expression("score*1.0f-kv_idx"), "score*1.0-kv_idx");
}

#if FLASHJIT_HAVE_CPU_BACKEND

struct Arguments {
  double score;
  int64_t batch, head, q_idx, kv_idx;
};

std::vector<Arguments> random_arguments(int count) {
  std::mt19937_64 rng(17);
  std::normal_distribution<double> score(0.0, 4.0);
  std::uniform_int_distribution<int64_t> small(0, 16), index(0, 5000);
  std::vector<Arguments> out;
  for (int i = 0; i < count; ++i)
    out.push_back({score(rng), small(rng), small(rng), index(rng), index(rng)});
  out.push_back({0.0, 0, 0, 0, 0});
  out.push_back({-1e6, 1, 0, 999, 1});
  return out;
}

// Equal to the last bits but for an FMA contraction (-O3, the host CPU): relative 1e-14.
void expect_close(double expected, double actual) {
  EXPECT_NEAR(actual, expected, 1e-14 * std::max(1.0, std::abs(expected)));
}

TEST(VariantFunctionsOf, EqualHandWrittenFunctionsOnRandomArguments) {
  Variant v;
  v.score_mod = "5.0f * tanh(score / 5.0f) - 0.1f * abs(q_idx - kv_idx) + 0.25f * head";
  v.mask_mod = "(q_idx / 64) == (kv_idx / 64) || max(batch, head) > 12 || min(q_idx, kv_idx) < 3";
  v.score_mod_grad = "1.0f - tanh(score / 5.0f) * tanh(score / 5.0f)";
  Result<VariantFunctions> f = variant_functions_of(v);
  ASSERT_TRUE(f.ok()) << f.error().describe();
  ASSERT_TRUE(f->score_mod && f->mask_mod && f->score_mod_grad);
  int masked = 0, seen = 0;
  for (const Arguments& a : random_arguments(2000)) {
    const double distance = static_cast<double>(std::llabs(a.q_idx - a.kv_idx));
    // In double: 0.1, not float's 0.1f (which is 0.1 + 1.5e-9).
    expect_close(5.0 * std::tanh(a.score / 5.0) - 0.1 * distance + 0.25 * a.head,
                 f->score_mod(a.score, a.batch, a.head, a.q_idx, a.kv_idx));
    const double t = std::tanh(a.score / 5.0);
    expect_close(1.0 - t * t, f->score_mod_grad(a.score, a.batch, a.head, a.q_idx, a.kv_idx));
    const bool expected = a.q_idx / 64 == a.kv_idx / 64 || std::max(a.batch, a.head) > 12 ||
                          std::min(a.q_idx, a.kv_idx) < 3;
    EXPECT_EQ(f->mask_mod(a.batch, a.head, a.q_idx, a.kv_idx), expected)
        << a.batch << " " << a.head << " " << a.q_idx << " " << a.kv_idx;
    (expected ? seen : masked) += 1;
  }
  EXPECT_GT(masked, 100);  // both outcomes happen
  EXPECT_GT(seen, 100);
}

TEST(VariantFunctionsOf, IndicesAreSixtyFourBitAndOnlyGivenExpressionsCompile) {
  Variant v;
  v.score_mod = "score + q_idx * kv_idx";  // 3e9 * 3e9 overflows 32 bits
  Result<VariantFunctions> f = variant_functions_of(v);
  ASSERT_TRUE(f.ok()) << f.error().describe();
  EXPECT_FALSE(f->mask_mod);
  EXPECT_FALSE(f->score_mod_grad);
  EXPECT_EQ(f->score_mod(0.5, 0, 0, 3000000000LL, 3), 0.5 + 9000000000.0);
  // Again (from the cache: nothing compiled): the same values; the functions outlive another
  // copy's release.
  const size_t modules = compiled_expression_modules();
  Result<VariantFunctions> again = variant_functions_of(v);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(compiled_expression_modules(), modules);
  f = Result<VariantFunctions>(VariantFunctions{});
  EXPECT_EQ(again->score_mod(-2.0, 0, 0, 7, 5), 33.0);
  EXPECT_TRUE(variant_functions_of(Variant{}).ok());
  // Other text: another module.
  v.score_mod = "score + q_idx * kv_idx + 1";
  ASSERT_TRUE(variant_functions_of(v).ok());
  EXPECT_EQ(compiled_expression_modules(), modules + 1);
}

TEST(VariantFunctionsOf, ABadExpressionIsATypedErrorQuotingIt) {
  Variant v;
  v.score_mod = "score * 2.0f";
  v.mask_mod = "q_idx >= no_such_variable";
  Result<VariantFunctions> f = variant_functions_of(v);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code, ErrorCode::CompileFailed);
  const std::string& message = f.error().message;
  EXPECT_NE(message.find("mask_mod = \"q_idx >= no_such_variable\" does not compile"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("no_such_variable"), std::string::npos) << message;
  EXPECT_NE(message.find("error:"), std::string::npos) << message;
  EXPECT_EQ(message.find("score_mod = "), std::string::npos) << message;  // only the bad one
}

TEST(CompleteVariantFunctions, GivenFunctionsWinAndTheForwardNeedsNoDerivative) {
  AttentionProblem problem = AttentionProblem::make(1, 2, 2, 17, 17, 32, DType::F32, false);
  problem.variant.score_mod = "score * 0.5f";
  problem.variant.mask_mod = "kv_idx <= q_idx + 1";
  problem.variant.score_mod_grad = "0.5f";
  VariantFunctions given;
  given.score_mod = [](double, int64_t, int64_t, int64_t, int64_t) { return 42.0; };
  Result<VariantFunctions> forward = complete_variant_functions(problem, given);
  ASSERT_TRUE(forward.ok()) << forward.error().describe();
  EXPECT_EQ(forward->score_mod(1.0, 0, 0, 0, 0), 42.0);
  ASSERT_TRUE(forward->mask_mod);
  EXPECT_TRUE(forward->mask_mod(0, 0, 3, 4));
  EXPECT_FALSE(forward->mask_mod(0, 0, 3, 5));
  EXPECT_FALSE(forward->score_mod_grad);
  Result<VariantFunctions> backward =
      complete_variant_functions(problem.with_pass(Pass::Backward), given);
  ASSERT_TRUE(backward.ok()) << backward.error().describe();
  ASSERT_TRUE(backward->score_mod_grad);
  EXPECT_EQ(backward->score_mod_grad(3.0, 0, 0, 0, 0), 0.5);
  EXPECT_EQ(backward->score_mod(1.0, 0, 0, 0, 0), 42.0);
}

double max_abs_difference(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isinf(a[i]) && a[i] == b[i]) continue;  // rows with no key: lse +inf in both
    worst = std::max(worst, std::abs(a[i] - b[i]));
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
  }
  return worst;
}

// The reference of a score_mod + mask_mod problem (odd sizes, GQA, causal; forward and
// backward) with JIT'd functions matches the one with hand-written functions, and differs from
// that of another score_mod (the comparison can fail).
TEST(CompleteVariantFunctions, TheReferenceMatchesHandWrittenFunctions) {
  AttentionProblem forward = AttentionProblem::make(2, 4, 2, 33, 47, 32, DType::F32, true);
  forward.variant.score_mod = "score - 0.1f * abs(q_idx - kv_idx) + 0.05f * tanh(score)";
  forward.variant.mask_mod = "(kv_idx % 5) != 1 || batch == 1";
  forward.variant.score_mod_grad = "1.0f + 0.05f * (1.0f - tanh(score) * tanh(score))";
  VariantFunctions hand;
  hand.score_mod = [](double s, int64_t, int64_t, int64_t q, int64_t k) {
    return s - 0.1 * static_cast<double>(std::llabs(q - k)) + 0.05 * std::tanh(s);
  };
  hand.mask_mod = [](int64_t b, int64_t, int64_t, int64_t k) { return k % 5 != 1 || b == 1; };
  hand.score_mod_grad = [](double s, int64_t, int64_t, int64_t, int64_t) {
    return 1.0 + 0.05 * (1.0 - std::tanh(s) * std::tanh(s));
  };
  for (const AttentionProblem& problem : {forward, forward.with_pass(Pass::Backward)}) {
    SCOPED_TRACE(problem.to_string());
    Result<VariantFunctions> jit = complete_variant_functions(problem, {});
    ASSERT_TRUE(jit.ok()) << jit.error().describe();
    const HostInputs inputs = random_inputs(problem, 7, hand);
    const Reference expected = reference_attention(problem, inputs, hand);
    const Reference actual = reference_attention(problem, inputs, *jit);
    EXPECT_LT(max_abs_difference(expected.o, actual.o), 1e-12);
    EXPECT_LT(max_abs_difference(expected.lse, actual.lse), 1e-12);
    if (problem.is_backward()) {
      EXPECT_FALSE(actual.dq.empty());
      EXPECT_LT(max_abs_difference(expected.dq, actual.dq), 1e-12);
      EXPECT_LT(max_abs_difference(expected.dk, actual.dk), 1e-12);
      EXPECT_LT(max_abs_difference(expected.dv, actual.dv), 1e-12);
    }
    AttentionProblem other = problem;
    other.variant.score_mod = "score - 0.1f * abs(q_idx - kv_idx)";
    Result<VariantFunctions> other_jit = complete_variant_functions(other, {});
    ASSERT_TRUE(other_jit.ok()) << other_jit.error().describe();
    EXPECT_GT(max_abs_difference(expected.o, reference_attention(other, inputs, *other_jit).o),
              1e-4);
  }
}

#else  // !FLASHJIT_HAVE_CPU_BACKEND

TEST(VariantFunctionsOf, WithoutTheCpuBackendIsUnsupported) {
  Variant v;
  v.score_mod = "score * 2.0f";
  Result<VariantFunctions> f = variant_functions_of(v);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code, ErrorCode::Unsupported);
  EXPECT_NE(f.error().message.find("score * 2.0f"), std::string::npos) << f.error().message;
  EXPECT_NE(f.error().message.find("CPU backend"), std::string::npos) << f.error().message;
}

#endif  // FLASHJIT_HAVE_CPU_BACKEND

}  // namespace
}  // namespace flashjit
