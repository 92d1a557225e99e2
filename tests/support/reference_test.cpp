// Tests of the test support itself: the fp64 reference, the conversions and compare(). Every GPU
// correctness verdict rests on these, so they check against values derived by hand.
#include "support/reference.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace flashjit::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

float from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

TEST(HalfConversion, EveryBf16PatternRoundTrips) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float value = bf16_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(value)))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(float_to_bf16(value), bits) << std::hex << bits;
  }
}

TEST(HalfConversion, EveryFp16PatternRoundTrips) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float value = fp16_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(value)))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(float_to_fp16(value), bits) << std::hex << bits;
  }
}

TEST(HalfConversion, KnownValues) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);  // largest finite half
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7BFF);  // below the halfway point to 65536
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);  // tie rounds to even: infinity
  EXPECT_EQ(float_to_fp16(1e10f), 0x7C00);
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to infinity
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));

  // Ties round to even, in both formats.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);             // halfway 1 .. 1+2^-7: down to even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);         // halfway 1+2^-7 .. 1+2^-6: up
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // just above halfway: up
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(float_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);

  // fp16 subnormals: multiples of 2^-24.
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);      // tie: down to even (zero)
  EXPECT_EQ(float_to_fp16(3 * 0x1p-25f), 0x0002);  // tie 1.5 -> 2
  EXPECT_EQ(float_to_fp16(-0x1p-24f), 0x8001);
  EXPECT_EQ(float_to_fp16(0x3FFp-24f), 0x03FF);  // largest subnormal
  EXPECT_EQ(float_to_fp16(0x1p-14f), 0x0400);    // smallest normal
  EXPECT_EQ(float_to_fp16(0x7FFp-25f), 0x0400);  // rounds up out of the subnormals
  EXPECT_FLOAT_EQ(fp16_to_float(0x0001), 0x1p-24f);
  EXPECT_FLOAT_EQ(fp16_to_float(0x8200), -0x200p-24f);
  EXPECT_EQ(fp16_to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(float_to_bf16(from_bits(0x00000001)), 0x0000);  // float subnormal to bf16 zero
}

// One head, d = 8, hand-set inputs: q_i, k_j are multiples of unit vectors, so every score is
// known in closed form. V rows differ in every column to catch index mix-ups.
struct TinyCase {
  AttentionProblem problem;
  HostInputs inputs;
};

TinyCase tiny_case(int64_t seqlen_q, int64_t seqlen_k, bool causal, DType dtype) {
  TinyCase tiny;
  tiny.problem = AttentionProblem::make(1, 1, 1, seqlen_q, seqlen_k, 8, dtype, causal);
  const AttentionProblem& p = tiny.problem;
  const int words = storage_words(dtype);
  tiny.inputs.q.assign(p.q_span() * words, 0);  // +0.0 in every dtype
  tiny.inputs.k.assign(p.kv_span() * words, 0);
  tiny.inputs.v.assign(p.kv_span() * words, 0);
  for (int64_t i = 0; i < seqlen_q; ++i) {  // q_i = (i + 1) e_(i mod 8)
    set_element(tiny.inputs.q.data(), i * p.q_strides.seq + i % 8, static_cast<float>(i + 1),
                dtype);
  }
  for (int64_t j = 0; j < seqlen_k; ++j) {  // k_j = 2 e_(j mod 8), v_j[c] = j + c / 8
    set_element(tiny.inputs.k.data(), j * p.k_strides.seq + j % 8, 2.0f, dtype);
    for (int c = 0; c < 8; ++c)
      set_element(tiny.inputs.v.data(), j * p.v_strides.seq + c, j + c / 8.0f, dtype);
  }
  return tiny;
}

double v_value(int64_t j, int c) { return j + c / 8.0; }

TEST(ReferenceAttention, HandComputedTwoByTwo) {
  for (DType dtype : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(to_string(dtype));
    const TinyCase tiny = tiny_case(2, 2, /*causal=*/false, dtype);
    const Reference ref = reference_attention(tiny.problem, tiny.inputs);
    ASSERT_EQ(ref.o.size(), 2u * 8u);
    ASSERT_EQ(ref.lse.size(), 2u);

    const double scale = tiny.problem.scale();  // a float, as the kernel gets it
    // Row 0: q0 = e0, scores (2 scale, 0). Row 1: q1 = 2 e1, scores (0, 4 scale).
    const double scores[2][2] = {{2 * scale, 0.0}, {0.0, 4 * scale}};
    for (int i = 0; i < 2; ++i) {
      const double e0 = std::exp(scores[i][0]), e1 = std::exp(scores[i][1]);
      EXPECT_NEAR(ref.lse[i], std::log(e0 + e1), 1e-12) << "row " << i;
      for (int c = 0; c < 8; ++c) {
        const double expected = (e0 * v_value(0, c) + e1 * v_value(1, c)) / (e0 + e1);
        EXPECT_NEAR(ref.o[i * 8 + c], expected, 1e-12) << "row " << i << " col " << c;
      }
    }
  }
}

TEST(ReferenceAttention, HandComputedCausalTwoByTwo) {
  const TinyCase tiny = tiny_case(2, 2, /*causal=*/true, DType::F16);
  const Reference ref = reference_attention(tiny.problem, tiny.inputs);
  const double scale = tiny.problem.scale();  // a float, as the kernel gets it
  // Row 0 sees key 0 only: o = v0, lse = its score.
  EXPECT_NEAR(ref.lse[0], 2 * scale, 1e-12);
  for (int c = 0; c < 8; ++c) EXPECT_NEAR(ref.o[c], v_value(0, c), 1e-12);
  // Row 1 sees both keys: scores (0, 4 scale).
  const double e1 = std::exp(4 * scale);
  EXPECT_NEAR(ref.lse[1], std::log(1 + e1), 1e-12);
  for (int c = 0; c < 8; ++c) {
    EXPECT_NEAR(ref.o[8 + c], (v_value(0, c) + e1 * v_value(1, c)) / (1 + e1), 1e-12);
  }
}

TEST(ReferenceAttention, CausalWithMoreQueriesThanKeysHasEmptyRows) {
  // seqlen_q 5, seqlen_k 2, bottom-right aligned: row i sees j <= i - 3.
  const TinyCase tiny = tiny_case(5, 2, /*causal=*/true, DType::BF16);
  const Reference ref = reference_attention(tiny.problem, tiny.inputs);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ref.lse[i], kInf) << "row " << i;
    for (int c = 0; c < 8; ++c) EXPECT_EQ(ref.o[i * 8 + c], 0.0) << "row " << i;
  }
  // Row 3: q3 = 4 e3, k0 = 2 e0: the one visible score is 0; o = v0.
  EXPECT_NEAR(ref.lse[3], 0.0, 1e-12);
  for (int c = 0; c < 8; ++c) EXPECT_NEAR(ref.o[3 * 8 + c], v_value(0, c), 1e-12);
  // Row 4: q4 = 5 e4, orthogonal to both keys: uniform over keys 0 and 1.
  EXPECT_NEAR(ref.lse[4], std::log(2.0), 1e-12);
  for (int c = 0; c < 8; ++c) {
    EXPECT_NEAR(ref.o[4 * 8 + c], (v_value(0, c) + v_value(1, c)) / 2, 1e-12);
  }
}

TEST(ReferenceAttention, CausalWithMoreKeysSeesThePrefixOfKeys) {
  // seqlen_q 2, seqlen_k 5: row 0 sees keys 0..3, row 1 all five.
  const TinyCase tiny = tiny_case(2, 5, /*causal=*/true, DType::BF16);
  const Reference ref = reference_attention(tiny.problem, tiny.inputs);
  const double scale = tiny.problem.scale();  // a float, as the kernel gets it
  // Row 0: q0 = e0: scores (2 scale, 0, 0, 0).
  const double e = std::exp(2 * scale);
  EXPECT_NEAR(ref.lse[0], std::log(e + 3), 1e-12);
  for (int c = 0; c < 8; ++c) {
    const double expected =
        (e * v_value(0, c) + v_value(1, c) + v_value(2, c) + v_value(3, c)) / (e + 3);
    EXPECT_NEAR(ref.o[c], expected, 1e-12);
  }
}

// K/V of a GQA problem expanded to one kv head per query head (head h gets kv head h / G or,
// with `wrong_mapping`, h % heads_kv), as an MHA problem.
void expand_to_mha(const AttentionProblem& gqa, const HostInputs& in, bool wrong_mapping,
                   AttentionProblem* mha, HostInputs* out) {
  *mha = AttentionProblem::make(gqa.batch, gqa.heads_q, gqa.heads_q, gqa.seqlen_q, gqa.seqlen_k,
                                gqa.head_dim, gqa.dtype, gqa.causal);
  out->q = in.q;  // same contiguous BSHD layout for q
  out->k.assign(mha->kv_span(), 0);
  out->v.assign(mha->kv_span(), 0);
  for (int64_t b = 0; b < gqa.batch; ++b) {
    for (int64_t s = 0; s < gqa.seqlen_k; ++s) {
      for (int64_t h = 0; h < gqa.heads_q; ++h) {
        const int64_t src_head = wrong_mapping ? h % gqa.heads_kv : h / gqa.group_size();
        for (int c = 0; c < gqa.head_dim; ++c) {
          const int64_t dst =
              b * mha->k_strides.batch + s * mha->k_strides.seq + h * mha->k_strides.head + c;
          const int64_t src =
              b * gqa.k_strides.batch + s * gqa.k_strides.seq + src_head * gqa.k_strides.head + c;
          out->k[dst] = in.k[src];
          out->v[dst] = in.v[src];
        }
      }
    }
  }
}

TEST(ReferenceAttention, GqaMatchesMhaWithRepeatedKvHeads) {
  const auto gqa = AttentionProblem::make(2, 8, 2, 33, 47, 16, DType::BF16, /*causal=*/true);
  const HostInputs inputs = random_inputs(gqa, 7);
  const Reference gqa_ref = reference_attention(gqa, inputs);

  AttentionProblem mha;
  HostInputs mha_inputs;
  expand_to_mha(gqa, inputs, /*wrong_mapping=*/false, &mha, &mha_inputs);
  const Reference mha_ref = reference_attention(mha, mha_inputs);
  ASSERT_EQ(gqa_ref.o.size(), mha_ref.o.size());
  for (size_t i = 0; i < gqa_ref.o.size(); ++i) ASSERT_DOUBLE_EQ(gqa_ref.o[i], mha_ref.o[i]) << i;
  for (size_t i = 0; i < gqa_ref.lse.size(); ++i) ASSERT_DOUBLE_EQ(gqa_ref.lse[i], mha_ref.lse[i]);

  // The comparison can fail: interleaved head mapping (h % heads_kv) gives other results.
  expand_to_mha(gqa, inputs, /*wrong_mapping=*/true, &mha, &mha_inputs);
  const Reference wrong_ref = reference_attention(mha, mha_inputs);
  double max_diff = 0;
  for (size_t i = 0; i < gqa_ref.o.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(gqa_ref.o[i] - wrong_ref.o[i]));
  }
  EXPECT_GT(max_diff, 1e-3);
}

TEST(ReferenceAttention, StridedInputsMatchContiguousCopy) {
  const auto dense = AttentionProblem::make(2, 2, 2, 19, 23, 32, DType::F16, /*causal=*/false);
  AttentionProblem strided = dense;
  // Head stride d + 8, and 24 extra elements at the end of each sequence row.
  const int64_t head_stride = dense.head_dim + 8;
  for (Strides* strides : {&strided.q_strides, &strided.o_strides}) {
    strides->head = head_stride;
    strides->seq = dense.heads_q * head_stride + 24;
    strides->batch = dense.seqlen_q * strides->seq + 8;
  }
  for (Strides* strides : {&strided.k_strides, &strided.v_strides}) {
    strides->head = head_stride;
    strides->seq = dense.heads_kv * head_stride + 24;
    strides->batch = dense.seqlen_k * strides->seq + 8;
  }
  const HostInputs strided_inputs = random_inputs(strided, 11);
  ASSERT_EQ(static_cast<int64_t>(strided_inputs.q.size()), strided.q_span());

  // Padding is random too: a kernel reading it must not get zeros.
  int64_t zero_padding = 0;
  for (int64_t c = dense.head_dim; c < head_stride; ++c) zero_padding += strided_inputs.q[c] == 0;
  EXPECT_LT(zero_padding, 4);

  HostInputs dense_inputs;
  auto copy = [](const std::vector<uint16_t>& src, const Strides& src_strides,
                 const Strides& dst_strides, int64_t batch, int64_t seq, int64_t heads, int d,
                 int64_t dst_span) {
    std::vector<uint16_t> dst(dst_span);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int c = 0; c < d; ++c)
            dst[b * dst_strides.batch + s * dst_strides.seq + h * dst_strides.head + c] =
                src[b * src_strides.batch + s * src_strides.seq + h * src_strides.head + c];
    return dst;
  };
  dense_inputs.q =
      copy(strided_inputs.q, strided.q_strides, dense.q_strides, 2, 19, 2, 32, dense.q_span());
  dense_inputs.k =
      copy(strided_inputs.k, strided.k_strides, dense.k_strides, 2, 23, 2, 32, dense.kv_span());
  dense_inputs.v =
      copy(strided_inputs.v, strided.v_strides, dense.v_strides, 2, 23, 2, 32, dense.kv_span());

  const Reference strided_ref = reference_attention(strided, strided_inputs);
  const Reference dense_ref = reference_attention(dense, dense_inputs);
  ASSERT_EQ(strided_ref.o, dense_ref.o);
  ASSERT_EQ(strided_ref.lse, dense_ref.lse);
}

TEST(ReferenceAttention, SoftmaxRowsSumToOneOnConstantV) {
  // With V = 1 everywhere every visible row of O is exactly 1 (up to rounding).
  auto problem = AttentionProblem::make(1, 2, 1, 70, 50, 64, DType::BF16, /*causal=*/true);
  HostInputs inputs = random_inputs(problem, 3);
  std::fill(inputs.v.begin(), inputs.v.end(), float_to_bf16(1.0f));
  const Reference ref = reference_attention(problem, inputs);
  for (int64_t i = 0; i < problem.seqlen_q; ++i) {
    const bool empty = i + problem.seqlen_k - problem.seqlen_q < 0;
    for (int64_t h = 0; h < 2; ++h) {
      EXPECT_NEAR(ref.o[(i * 2 + h) * 64], empty ? 0.0 : 1.0, 1e-12) << i;
      EXPECT_EQ(std::isinf(ref.lse[h * problem.seqlen_q + i]), empty) << i;
    }
  }
}

// o rounded from the reference, laid out through the problem's o strides in a poisoned buffer.
std::vector<uint16_t> rounded_output(const AttentionProblem& problem, const Reference& ref) {
  std::vector<uint16_t> o = poisoned_storage(problem.o_span(), problem.dtype);
  size_t index = 0;
  for (int64_t b = 0; b < problem.batch; ++b)
    for (int64_t s = 0; s < problem.seqlen_q; ++s)
      for (int64_t h = 0; h < problem.heads_q; ++h)
        for (int c = 0; c < problem.head_dim; ++c, ++index)
          set_element(o.data(),
                      b * problem.o_strides.batch + s * problem.o_strides.seq +
                          h * problem.o_strides.head + c,
                      static_cast<float>(ref.o[index]), problem.dtype);
  return o;
}

TEST(Compare, RoundedReferencePassesAndDefectsFail) {
  auto problem = AttentionProblem::make(1, 2, 2, 9, 4, 16, DType::BF16, /*causal=*/true);
  problem.o_strides.head = 24;  // padded o: 8 padding elements per head
  problem.o_strides.seq = 2 * 24;
  problem.o_strides.batch = 9 * 2 * 24;
  const HostInputs inputs = random_inputs(problem, 5);
  const Reference ref = reference_attention(problem, inputs);
  std::vector<float> lse(ref.lse.begin(), ref.lse.end());
  std::vector<uint16_t> o = rounded_output(problem, ref);

  const Comparison good = compare(problem, o, lse, ref);
  EXPECT_TRUE(matches_reference(good));
  EXPECT_LT(good.o_rel_error, 4e-3);  // bf16 rounding alone: <= 2^-9 relative
  EXPECT_EQ(good.lse_mismatched_infinite, 0);
  EXPECT_EQ(good.o_padding_written, 0);

  {  // one element left poisoned: NaN and poisoned both count
    auto bad = o;
    bad[problem.o_strides.seq * 8 + 3] = kPoisonBits;
    const Comparison c = compare(problem, bad, lse, ref);
    EXPECT_EQ(c.poisoned_left, 1);
    EXPECT_EQ(c.o_nan_count, 1);
    EXPECT_FALSE(matches_reference(c));
  }
  {  // a write into the padding between heads
    auto bad = o;
    bad[16] = float_to_bf16(0.0f);
    const Comparison c = compare(problem, bad, lse, ref);
    EXPECT_EQ(c.o_padding_written, 1);
    EXPECT_FALSE(matches_reference(c));
  }
  {  // o off by 5% everywhere
    auto bad = o;
    for (auto& bits : bad) {
      if (bits != kPoisonBits) bits = float_to_bf16(bf16_to_float(bits) * 1.05f);
    }
    const Comparison c = compare(problem, bad, lse, ref);
    EXPECT_GT(c.o_rel_error, 0.03);
    EXPECT_FALSE(matches_reference(c));
  }
  {  // an empty row (causal, seqlen_q > seqlen_k) reported with a finite lse, and lse NaN
    auto bad_lse = lse;
    ASSERT_EQ(ref.lse[0], kInf);
    bad_lse[0] = 0.0f;
    bad_lse[8] = std::nanf("");
    const Comparison c = compare(problem, o, bad_lse, ref);
    EXPECT_EQ(c.lse_mismatched_infinite, 1);
    EXPECT_EQ(c.lse_max_abs_error, kInf);
    EXPECT_FALSE(matches_reference(c));
  }
  {  // lse off by 0.01 on one row
    auto bad_lse = lse;
    bad_lse[8] += 0.01f;
    const Comparison c = compare(problem, o, bad_lse, ref);
    EXPECT_NEAR(c.lse_max_abs_error, 0.01, 1e-4);
    EXPECT_FALSE(matches_reference(c));
  }
  {  // no lse given: lse unchecked, o still checked
    const Comparison c = compare(problem, o, {}, ref);
    EXPECT_FALSE(c.lse_checked);
    EXPECT_TRUE(matches_reference(c));
  }
}

// fp32 storage: two 16-bit words per element, exact round trips, and compare() sees one element
// (not one word) as poisoned, written padding or wrong.
TEST(Compare, Fp32StorageIsTwoWordsPerElement) {
  EXPECT_EQ(storage_words(DType::F32), 2);
  EXPECT_EQ(storage_words(DType::BF16), 1);
  std::vector<uint16_t> words(4, 0);
  for (float value : {1.0f, -3.14159274f, 1e-30f, 65504.5f, 0.1f}) {
    set_element(words.data(), 1, value, DType::F32);
    EXPECT_EQ(element_value(words.data(), 1, DType::F32), value);
    set_element(words.data(), 3, value, DType::BF16);
    EXPECT_EQ(words[3], float_to_bf16(value));
    EXPECT_EQ(element_value(words.data(), 3, DType::BF16), bf16_to_float(float_to_bf16(value)));
  }
  EXPECT_TRUE(std::isnan(element_value(poisoned_storage(1, DType::F32).data(), 0, DType::F32)));

  auto problem = AttentionProblem::make(1, 2, 2, 9, 4, 16, DType::F32, /*causal=*/false);
  problem.o_strides.head = 24;  // padded o
  problem.o_strides.seq = 2 * 24;
  problem.o_strides.batch = 9 * 2 * 24;
  const HostInputs inputs = random_inputs(problem, 5);
  ASSERT_EQ(inputs.q.size(), static_cast<size_t>(problem.q_span() * 2));
  int64_t beyond_bf16 = 0;  // fp32 inputs keep their low mantissa bits
  for (int64_t i = 0; i < problem.q_span(); ++i) beyond_bf16 += inputs.q[2 * i] != 0;
  EXPECT_GT(beyond_bf16, problem.q_span() / 2);
  const Reference ref = reference_attention(problem, inputs);
  std::vector<float> lse(ref.lse.begin(), ref.lse.end());
  const std::vector<uint16_t> o = rounded_output(problem, ref);
  const Comparison good = compare(problem, o, lse, ref);
  EXPECT_TRUE(matches_reference(good, 1e-6, 1e-6));
  EXPECT_LT(good.o_rel_error, 1e-7);
  {  // the high word of one element poisoned: that element is NaN, not poisoned
    auto bad = o;
    bad[2 * (problem.o_strides.seq * 3 + 5) + 1] = kPoisonBits;
    const Comparison c = compare(problem, bad, lse, ref);
    EXPECT_EQ(c.poisoned_left, 0);
    EXPECT_EQ(c.o_nan_count, 1);
    EXPECT_FALSE(matches_reference(c));
  }
  {  // both words poisoned: poisoned (and NaN)
    auto bad = o;
    bad[2 * 7] = bad[2 * 7 + 1] = kPoisonBits;
    const Comparison c = compare(problem, bad, lse, ref);
    EXPECT_EQ(c.poisoned_left, 1);
    EXPECT_EQ(c.o_nan_count, 1);
  }
  {  // one word of padding written: one element of padding
    auto bad = o;
    bad[2 * 17] = 0;
    const Comparison c = compare(problem, bad, lse, ref);
    EXPECT_EQ(c.o_padding_written, 1);
    EXPECT_FALSE(matches_reference(c));
  }
  {  // 1e-4 relative off everywhere: beyond what fp32 storage allows
    auto bad = o;
    for (int64_t i = 0; i < problem.o_span(); ++i) {
      const float value = element_value(bad.data(), i, DType::F32);
      if (!std::isnan(value)) set_element(bad.data(), i, value * 1.0001f, DType::F32);
    }
    const Comparison c = compare(problem, bad, lse, ref);
    EXPECT_NEAR(c.o_rel_error, 1e-4, 1e-5);
    EXPECT_FALSE(matches_reference(c, 1e-5, 1e-5));
  }
}

TEST(Compare, AllRowsEmptyUsesAbsoluteError) {
  const auto problem = AttentionProblem::make(1, 1, 1, 3, 1, 8, DType::F16, /*causal=*/true);
  const HostInputs inputs = random_inputs(problem, 9);
  Reference ref = reference_attention(problem, inputs);
  std::fill(ref.o.begin(), ref.o.end(), 0.0);  // pretend every row is empty
  std::vector<uint16_t> o(problem.o_span(), float_to_fp16(0.0f));
  EXPECT_EQ(compare(problem, o, {}, ref).o_rel_error, 0.0);
  o[0] = float_to_fp16(0.5f);
  EXPECT_NEAR(compare(problem, o, {}, ref).o_rel_error, 0.5, 1e-6);
}

}  // namespace
}  // namespace flashjit::testing

// ---- The reference gradients (every backward verdict rests on them) --------------------------

namespace flashjit::testing {
namespace {

// L = sum(dO * O) as a function of the inputs, in fp64 from the forward reference.
double loss(const AttentionProblem& problem, const HostInputs& inputs,
            const VariantFunctions& functions) {
  const Reference forward =
      reference_attention(problem.with_pass(Pass::Forward), inputs, functions);
  double total = 0;
  size_t index = 0;  // forward.o is dense [b, s, h, d]
  for (int64_t b = 0; b < problem.batch; ++b)
    for (int64_t s = 0; s < problem.seqlen_q; ++s)
      for (int64_t h = 0; h < problem.heads_q; ++h)
        for (int c = 0; c < problem.head_dim; ++c, ++index) {
          const int64_t at = b * problem.do_strides.batch + s * problem.do_strides.seq +
                             h * problem.do_strides.head + c;
          total += element_value(inputs.d_o.data(), at, problem.dtype) * forward.o[index];
        }
  return total;
}

// The dense index [b, s, h, c] of storage offset `offset` under `strides` (-1 for padding).
int64_t dense_index(const AttentionProblem& p, const Strides& strides, int64_t seqlen,
                    int64_t heads, int64_t offset) {
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < seqlen; ++s)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = b * strides.batch + s * strides.seq + h * strides.head;
        if (offset >= base && offset < base + p.head_dim)
          return ((b * seqlen + s) * heads + h) * p.head_dim + (offset - base);
      }
  return -1;
}

// Central differences of L against reference_attention's dq, dk, dv, for every element of the
// fp32 backward problem `p` (the variant's user expressions through `functions`).
void expect_finite_differences(const AttentionProblem& p, const VariantFunctions& functions,
                               uint64_t seed, const std::string& what) {
  HostInputs inputs = random_inputs(p, seed, functions);
  const Reference reference = reference_attention(p, inputs, functions);
  struct Tensor {
    const char* name;
    std::vector<uint16_t>* storage;
    const std::vector<double>* gradient;
    Strides strides;
    int64_t seqlen, heads;
  };
  const Tensor tensors[] = {{"q", &inputs.q, &reference.dq, p.q_strides, p.seqlen_q, p.heads_q},
                            {"k", &inputs.k, &reference.dk, p.k_strides, p.seqlen_k, p.heads_kv},
                            {"v", &inputs.v, &reference.dv, p.v_strides, p.seqlen_k, p.heads_kv}};
  for (const Tensor& t : tensors) {
    const int64_t elements = static_cast<int64_t>(t.storage->size()) / 2;
    double max_error = 0, max_gradient = 0;
    for (int64_t i = 0; i < elements; ++i) {
      const int64_t dense = dense_index(p, t.strides, t.seqlen, t.heads, i);
      ASSERT_GE(dense, 0);
      const float x = element_value(t.storage->data(), i, p.dtype);
      const float h = 1e-3f;
      set_element(t.storage->data(), i, x + h, p.dtype);
      const float up = element_value(t.storage->data(), i, p.dtype);
      const double l_up = loss(p, inputs, functions);
      set_element(t.storage->data(), i, x - h, p.dtype);
      const float down = element_value(t.storage->data(), i, p.dtype);
      const double l_down = loss(p, inputs, functions);
      set_element(t.storage->data(), i, x, p.dtype);
      const double numeric = (l_up - l_down) / (static_cast<double>(up) - down);
      const double analytic = (*t.gradient)[static_cast<size_t>(dense)];
      max_error = std::max(max_error, std::abs(numeric - analytic));
      max_gradient = std::max(max_gradient, std::abs(analytic));
    }
    // Central differences are exact to O(h^2) ~ 1e-6 of the curvature; the gradients are O(1).
    EXPECT_LT(max_error, 1e-5 * std::max(1.0, max_gradient))
        << t.name << " " << what << ": max |numeric - analytic| = " << max_error
        << " (max |gradient| " << max_gradient << ")";
    EXPECT_GT(max_gradient, 1e-2) << t.name << " " << what
                                  << ": a gradient of zeros would pass trivially";
  }
}

// Every element of a small fp32 problem (GQA 2:1, odd lengths, causal with seqlen_q > seqlen_k so
// that some rows see no key, and not causal).
TEST(ReferenceGradients, MatchFiniteDifferences) {
  for (bool causal : {false, true}) {
    AttentionProblem p = AttentionProblem::make(1, 4, 2, 7, 5, 8, DType::F32, causal);
    p.pass = Pass::Backward;
    expect_finite_differences(p, {}, 42 + causal, causal ? "causal" : "plain");
  }
}

// The same with each variant (issue 17): the window (rows that see nothing included), prefix-LM,
// the soft-cap's chain factor, ALiBi's bias (no gradient of its own), a mask_mod, a score_mod with
// its derivative, and window + softcap + ALiBi on GQA, causal, seqlen_q != seqlen_k.
TEST(ReferenceGradients, VariantsMatchFiniteDifferences) {
  struct Case {
    const char* name;
    bool causal;
    Variant variant;
    VariantFunctions functions;
  };
  std::vector<Case> cases;
  Variant window;
  window.window_left = 1;
  window.window_right = 0;  // diagonal -2: rows 0 and 1 see no key
  cases.push_back({"window", false, window, {}});
  Variant prefix;
  prefix.window_left = 0;
  prefix.prefix = 2;
  cases.push_back({"prefix", true, prefix, {}});
  Variant softcap;
  softcap.softcap = 0.75f;
  cases.push_back({"softcap", false, softcap, {}});
  Variant alibi;
  alibi.alibi = true;
  cases.push_back({"alibi", true, alibi, {}});
  Variant mask;
  mask.mask_mod = "(q_idx + kv_idx) % 3 != 0";
  VariantFunctions mask_f;
  mask_f.mask_mod = [](int64_t, int64_t, int64_t i, int64_t j) { return (i + j) % 3 != 0; };
  cases.push_back({"mask_mod", false, mask, mask_f});
  Variant score;
  score.score_mod = "score * score * 0.5f + head * kv_idx * 0.1f";
  VariantFunctions score_f;
  score_f.score_mod = [](double s, int64_t, int64_t h, int64_t, int64_t j) {
    return 0.5 * s * s + 0.1 * static_cast<double>(h * j);
  };
  score_f.score_mod_grad = [](double s, int64_t, int64_t, int64_t, int64_t) { return s; };
  cases.push_back({"score_mod", false, score, score_f});
  Variant combined;
  combined.window_left = 3;
  combined.softcap = 1.5f;
  combined.alibi = true;
  combined.score_mod = "score * 1.25f";
  VariantFunctions combined_f;
  combined_f.score_mod = [](double s, int64_t, int64_t, int64_t, int64_t) { return 1.25 * s; };
  combined_f.score_mod_grad = [](double, int64_t, int64_t, int64_t, int64_t) { return 1.25; };
  cases.push_back({"window_softcap_alibi_score_mod", true, combined, combined_f});
  for (const Case& c : cases) {
    for (auto [seqlen_q, seqlen_k] : {std::pair<int64_t, int64_t>{7, 5}, {5, 9}}) {
      AttentionProblem p =
          AttentionProblem::make(1, 4, 2, seqlen_q, seqlen_k, 8, DType::F32, c.causal);
      p.pass = Pass::Backward;
      p.variant = c.variant;
      expect_finite_differences(
          p, c.functions, 7,
          std::string(c.name) + " " + std::to_string(seqlen_q) + "x" + std::to_string(seqlen_k));
    }
  }
}

// A score_mod without its derivative: gradients all NaN (nothing can pass against them).
TEST(ReferenceGradients, ScoreModWithoutGradientIsNaN) {
  AttentionProblem p = AttentionProblem::make(1, 2, 2, 5, 5, 8, DType::F32, false);
  p.pass = Pass::Backward;
  p.variant.score_mod = "score * 2.0f";
  VariantFunctions f;
  f.score_mod = [](double s, int64_t, int64_t, int64_t, int64_t) { return 2 * s; };
  const Reference r = reference_attention(p, random_inputs(p, 3, f), f);
  EXPECT_FALSE(std::isnan(r.o[0]));
  EXPECT_TRUE(std::isnan(r.dq[0]) && std::isnan(r.dk[0]) && std::isnan(r.dv[0]));
}

// The gradients compare() machinery: the rounded reference passes, defects fail.
TEST(ReferenceGradients, CompareGradientsCatchesDefects) {
  AttentionProblem p = AttentionProblem::make(2, 4, 2, 33, 17, 16, DType::BF16, true, Layout::BHSD);
  p.pass = Pass::Backward;
  const HostInputs inputs = random_inputs(p, 7);
  const Reference reference = reference_attention(p, inputs);
  auto rounded = [&](const std::vector<double>& dense, const Strides& strides, int64_t span,
                     int64_t seqlen, int64_t heads) {
    std::vector<uint16_t> bits = poisoned_storage(span, p.dtype);
    size_t index = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s = 0; s < seqlen; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int c = 0; c < p.head_dim; ++c, ++index)
            set_element(bits.data(), b * strides.batch + s * strides.seq + h * strides.head + c,
                        static_cast<float>(dense[index]), p.dtype);
    return bits;
  };
  std::vector<uint16_t> dq =
      rounded(reference.dq, p.dq_strides, p.dq_span(), p.seqlen_q, p.heads_q);
  std::vector<uint16_t> dk =
      rounded(reference.dk, p.dk_strides, p.dkv_span(), p.seqlen_k, p.heads_kv);
  std::vector<uint16_t> dv =
      rounded(reference.dv, p.dv_strides, p.dkv_span(), p.seqlen_k, p.heads_kv);
  GradientComparison good = compare_gradients(p, dq, dk, dv, reference);
  EXPECT_TRUE(within_tolerance(good, gradient_tolerance(p.dtype))) << good.to_string();
  EXPECT_LT(good.max_rel_error(), 5e-3);

  std::vector<uint16_t> unwritten = dk;
  unwritten[5] = kPoisonBits;
  GradientComparison poisoned = compare_gradients(p, dq, unwritten, dv, reference);
  EXPECT_FALSE(within_tolerance(poisoned, gradient_tolerance(p.dtype)));
  EXPECT_EQ(poisoned.dk.poisoned_left, 1);

  // dK in place of dV: far off.
  GradientComparison wrong = compare_gradients(p, dq, dk, dk, reference);
  EXPECT_FALSE(within_tolerance(wrong, gradient_tolerance(p.dtype))) << wrong.to_string();
  EXPECT_GT(wrong.dv.rel_error, 0.5);
}

}  // namespace
}  // namespace flashjit::testing
