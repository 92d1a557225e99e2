// The fp64 reference's attention variants (window, softcap, ALiBi, prefix, user score/mask mods)
// against hand-computed small cases: the oracle every variant kernel is verified against.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "support/reference.hpp"

namespace flashjit::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double v_value(int64_t j, int c) { return j + c / 8.0; }

// One head, d = 8, f32: q = k = 0 (every scale * q . k is 0, so the variant alone decides the
// scores) unless set later; v_j[c] = j + c / 8.
struct Case {
  AttentionProblem problem;
  HostInputs inputs;
};
Case zero_case(int64_t seqlen_q, int64_t seqlen_k, bool causal, Variant variant) {
  Case c;
  c.problem = AttentionProblem::make(1, 1, 1, seqlen_q, seqlen_k, 8, DType::F32, causal);
  c.problem.variant = std::move(variant);
  const AttentionProblem& p = c.problem;
  c.inputs.q.assign(p.q_span() * 2, 0);
  c.inputs.k.assign(p.kv_span() * 2, 0);
  c.inputs.v.assign(p.kv_span() * 2, 0);
  for (int64_t j = 0; j < seqlen_k; ++j)
    for (int col = 0; col < 8; ++col)
      set_element(c.inputs.v.data(), j * p.v_strides.seq + col, v_value(j, col), DType::F32);
  return c;
}

// Row i of the reference against softmax weights w_j (unnormalized, exp of the scores) over keys.
void expect_row(const Reference& ref, int64_t i, const std::vector<std::pair<int64_t, double>>& w) {
  SCOPED_TRACE("row " + std::to_string(i));
  if (w.empty()) {
    EXPECT_EQ(ref.lse[i], kInf);
    for (int c = 0; c < 8; ++c) EXPECT_EQ(ref.o[i * 8 + c], 0.0);
    return;
  }
  double sum = 0;
  for (auto [j, weight] : w) sum += weight;
  EXPECT_NEAR(ref.lse[i], std::log(sum), 1e-12);
  for (int c = 0; c < 8; ++c) {
    double expected = 0;
    for (auto [j, weight] : w) expected += weight * v_value(j, c);
    EXPECT_NEAR(ref.o[i * 8 + c], expected / sum, 1e-12) << "col " << c;
  }
}
// Uniform weights over `keys`.
std::vector<std::pair<int64_t, double>> uniform(std::initializer_list<int64_t> keys) {
  std::vector<std::pair<int64_t, double>> w;
  for (int64_t j : keys) w.push_back({j, 1.0});
  return w;
}

TEST(ReferenceVariant, SlidingWindowSquare) {
  Variant v;
  v.window_left = 1;
  v.window_right = 0;
  const Case c = zero_case(4, 4, false, v);
  const Reference ref = reference_attention(c.problem, c.inputs);
  expect_row(ref, 0, uniform({0}));
  expect_row(ref, 1, uniform({0, 1}));
  expect_row(ref, 2, uniform({1, 2}));
  expect_row(ref, 3, uniform({2, 3}));
}

TEST(ReferenceVariant, WindowIsAlignedBottomRight) {
  // seqlen_q 2, seqlen_k 5: diagonal 3; row i sees keys [i + 3 - 1, i + 3 + 1] within [0, 5).
  Variant v;
  v.window_left = 1;
  v.window_right = 1;
  const Case c = zero_case(2, 5, false, v);
  const Reference ref = reference_attention(c.problem, c.inputs);
  expect_row(ref, 0, uniform({2, 3, 4}));
  expect_row(ref, 1, uniform({3, 4}));
}

TEST(ReferenceVariant, CausalCapsTheRightSideAndOneSideMayBeUnbounded) {
  Variant v;
  v.window_left = -1;  // unbounded on the left
  v.window_right = 2;  // capped at the diagonal by causal
  Case c = zero_case(3, 3, true, v);
  Reference ref = reference_attention(c.problem, c.inputs);
  expect_row(ref, 0, uniform({0}));
  expect_row(ref, 1, uniform({0, 1}));
  expect_row(ref, 2, uniform({0, 1, 2}));
  // Non-causal, left 0, right unbounded: row i sees keys >= i.
  v.window_left = 0;
  v.window_right = -1;
  c = zero_case(3, 3, false, v);
  ref = reference_attention(c.problem, c.inputs);
  expect_row(ref, 0, uniform({0, 1, 2}));
  expect_row(ref, 1, uniform({1, 2}));
  expect_row(ref, 2, uniform({2}));
}

TEST(ReferenceVariant, EmptyWindowsGiveRowsWithNoKeys) {
  // seqlen_q 5, seqlen_k 2, window (0, 0): row i sees key i - 3 only, when it exists.
  Variant v;
  v.window_left = 0;
  v.window_right = 0;
  const Case c = zero_case(5, 2, false, v);
  const Reference ref = reference_attention(c.problem, c.inputs);
  for (int i = 0; i < 3; ++i) expect_row(ref, i, {});
  expect_row(ref, 3, uniform({0}));
  expect_row(ref, 4, uniform({1}));
}

TEST(ReferenceVariant, PrefixIsVisibleToEveryQuery) {
  // Causal, window (0, 0), prefix 2: row i sees keys {0, 1} and itself.
  Variant v;
  v.window_left = 0;
  v.window_right = 0;
  v.prefix = 2;
  const Case c = zero_case(5, 5, true, v);
  const Reference ref = reference_attention(c.problem, c.inputs);
  expect_row(ref, 0, uniform({0, 1}));
  expect_row(ref, 1, uniform({0, 1}));
  expect_row(ref, 2, uniform({0, 1, 2}));
  expect_row(ref, 4, uniform({0, 1, 4}));
}

TEST(ReferenceVariant, AlibiBiasesBySlopeTimesDistance) {
  Variant v;
  v.alibi = true;
  Case c = zero_case(3, 3, true, v);
  c.inputs.alibi_slopes = {0.75f};
  const Reference ref = reference_attention(c.problem, c.inputs);
  // score(i, j) = 0.75 * (j - i) for j <= i.
  expect_row(ref, 0, {{0, 1.0}});
  expect_row(ref, 1, {{0, std::exp(-0.75)}, {1, 1.0}});
  expect_row(ref, 2, {{0, std::exp(-1.5)}, {1, std::exp(-0.75)}, {2, 1.0}});
}

TEST(ReferenceVariant, AlibiTakesEachHeadsSlope) {
  // Two query heads of one kv head (GQA): random_inputs gives the standard slopes 2^(-8(h+1)/H).
  AttentionProblem p = AttentionProblem::make(1, 2, 1, 2, 2, 8, DType::F32, false);
  p.variant.alibi = true;
  HostInputs inputs = random_inputs(p, 1);
  ASSERT_EQ(inputs.alibi_slopes.size(), 2u);
  EXPECT_FLOAT_EQ(inputs.alibi_slopes[0], 1.0f / 16);
  EXPECT_FLOAT_EQ(inputs.alibi_slopes[1], 1.0f / 256);
  std::fill(inputs.q.begin(), inputs.q.end(), 0);  // scores: the bias alone
  const Reference ref = reference_attention(p, inputs);
  // lse [b, h, s]; row 0 of head h: keys 0, 1 with scores 0 and slope_h.
  for (int h = 0; h < 2; ++h)
    EXPECT_NEAR(ref.lse[h * 2 + 0],
                std::log(1 + std::exp(static_cast<double>(inputs.alibi_slopes[h]))), 1e-12);
}

TEST(ReferenceVariant, SoftcapBoundsTheScores) {
  Variant v;
  v.softcap = 2.0f;
  Case c = zero_case(1, 2, false, v);
  set_element(c.inputs.q.data(), 0, 3.0f, DType::F32);  // q0 = 3 e0, k0 = 4 e0, k1 = 0
  set_element(c.inputs.k.data(), 0, 4.0f, DType::F32);
  const Reference ref = reference_attention(c.problem, c.inputs);
  const double s0 = 12.0 * static_cast<double>(c.problem.scale());
  expect_row(ref, 0, {{0, std::exp(2.0 * std::tanh(s0 / 2.0))}, {1, 1.0}});
}

TEST(ReferenceVariant, UserScoreAndMaskMods) {
  Variant v;
  v.score_mod = "score - 0.5f * abs(q_idx - kv_idx)";
  v.mask_mod = "kv_idx % 2 == 0";
  const Case c = zero_case(3, 4, false, v);
  VariantFunctions f;
  f.score_mod = [](double s, int64_t, int64_t, int64_t i, int64_t j) {
    return s - 0.5 * std::abs(static_cast<double>(i - j));
  };
  f.mask_mod = [](int64_t, int64_t, int64_t, int64_t j) { return j % 2 == 0; };
  const Reference ref = reference_attention(c.problem, c.inputs, f);
  expect_row(ref, 0, {{0, 1.0}, {2, std::exp(-1.0)}});
  expect_row(ref, 1, {{0, std::exp(-0.5)}, {2, std::exp(-0.5)}});
  expect_row(ref, 2, {{0, std::exp(-1.0)}, {2, 1.0}});
  // A score_mod of -inf everywhere hides every key: rows with no key.
  f.score_mod = [](double, int64_t, int64_t, int64_t, int64_t) { return -kInf; };
  const Reference hidden = reference_attention(c.problem, c.inputs, f);
  for (int i = 0; i < 3; ++i) expect_row(hidden, i, {});
}

TEST(ReferenceVariant, MissingHostFunctionsOrSlopesMakeEverythingFail) {
  Variant v;
  v.mask_mod = "q_idx >= kv_idx";
  Case c = zero_case(2, 2, false, v);
  Reference ref = reference_attention(c.problem, c.inputs);  // no mask_mod function
  for (double x : ref.o) EXPECT_TRUE(std::isnan(x));
  // Whatever a kernel wrote, it does not pass against that.
  std::vector<uint16_t> o(c.problem.o_span() * 2, 0);
  EXPECT_FALSE(within_tolerance(compare(c.problem, o, {}, ref)));
  v = Variant();
  v.alibi = true;
  c = zero_case(2, 2, false, v);  // no slopes
  ref = reference_attention(c.problem, c.inputs);
  EXPECT_TRUE(std::isnan(ref.o[0]));
}

TEST(ReferenceVariant, PlainProblemsAreUnchanged) {
  // The variant path with an inactive variant is the plain path: same numbers bit for bit.
  const AttentionProblem p = AttentionProblem::make(2, 4, 2, 37, 53, 16, DType::BF16, true);
  const HostInputs inputs = random_inputs(p, 7);
  const Reference a = reference_attention(p, inputs);
  AttentionProblem windowed = p;  // a window wider than the sequence: the same visible set
  windowed.variant.window_left = 1000;
  windowed.variant.window_right = 1000;
  const Reference b = reference_attention(windowed, inputs);
  ASSERT_EQ(a.o.size(), b.o.size());
  for (size_t i = 0; i < a.o.size(); ++i) ASSERT_NEAR(a.o[i], b.o[i], 1e-12) << i;
  for (size_t i = 0; i < a.lse.size(); ++i) ASSERT_NEAR(a.lse[i], b.lse[i], 1e-12) << i;
}

}  // namespace
}  // namespace flashjit::testing
