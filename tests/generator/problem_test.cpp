#include "generator/problem.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace flashjit {
namespace {

AttentionProblem valid_problem() {
  return AttentionProblem::make(2, 8, 2, 100, 300, 128, DType::BF16, true);
}

// The message must name the field and the bad value.
void expect_invalid(const AttentionProblem& problem, const std::string& needle) {
  Status status = validate(problem);
  ASSERT_FALSE(status.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(status.error().message.find(needle), std::string::npos) << status.error().message;
}

TEST(Problem, ValidProblemPasses) {
  EXPECT_TRUE(validate(valid_problem()).ok());
  EXPECT_TRUE(validate(AttentionProblem::make(1, 1, 1, 1, 1, 8, DType::F16, false)).ok());
  EXPECT_TRUE(
      validate(AttentionProblem::make(3, 4, 1, 4097, 17, 256, DType::F16, false, Layout::BHSD))
          .ok());
}

TEST(Problem, RejectsEachBadField) {
  auto p = valid_problem();
  p.batch = 0;
  expect_invalid(p, "batch = 0");
  p = valid_problem();
  p.heads_kv = 3;
  expect_invalid(p, "heads_kv = 3");
  p = valid_problem();
  p.heads_kv = 16;
  expect_invalid(p, "heads_kv = 16");
  p = valid_problem();
  p.seqlen_q = 0;
  expect_invalid(p, "seqlen_q = 0");
  p = valid_problem();
  p.seqlen_k = -5;
  expect_invalid(p, "seqlen_k = -5");
  for (int bad : {0, 4, 100, 264, 512}) {
    p = AttentionProblem::make(1, 1, 1, 16, 16, bad, DType::BF16, false);
    expect_invalid(p, "head_dim = " + std::to_string(bad));
  }
  p = valid_problem();
  p.softmax_scale = std::nanf("");
  expect_invalid(p, "softmax_scale");
}

TEST(Problem, RejectsMisalignedAndOverlappingStrides) {
  auto p = valid_problem();
  p.q_strides.seq += 4;  // rows no longer 16-byte aligned
  expect_invalid(p, "q.seq stride");
  p = valid_problem();
  p.k_strides.head = -128;
  expect_invalid(p, "k.head stride = -128");
  p = valid_problem();
  p.o_strides.seq = 64;  // rows of 128 elements overlap
  expect_invalid(p, "o strides");
  // Inputs may broadcast (stride 0); outputs may not.
  p = valid_problem();
  p.k_strides.batch = 0;
  p.v_strides.batch = 0;
  EXPECT_TRUE(validate(p).ok());
  p.o_strides.batch = 0;
  expect_invalid(p, "o strides");
}

// Strides whose span does not fit an int64 (found by tests/fuzz/python_arrays.cpp: the span was
// computed with a signed overflow) are an error, as are spans just past 2^62 elements.
TEST(Problem, RejectsStridesWhoseSpanOverflows) {
  auto p = valid_problem();
  p.q_strides.seq = int64_t{1} << 60;  // 99 rows x 2^60: past int64
  expect_invalid(p, "q strides span more than 2^62 elements");
  p = valid_problem();
  p.k_strides = {INT64_MAX - 7, 0, 0};  // batch 2: one step of ~2^63
  expect_invalid(p, "k strides span more than 2^62 elements");
  p = valid_problem();
  p.o_strides.head = ((int64_t{1} << 62) / 7 + 8) / 8 * 8;  // 7 steps: just past 2^62
  expect_invalid(p, "o strides span more than 2^62 elements");
  // Within 2^62 and without overlap: 2^61 + 7 * 2^58 + 99 * 1024 + 128 elements.
  p.o_strides = {int64_t{1} << 61, 8 * 128, int64_t{1} << 58};
  EXPECT_TRUE(validate(p).ok()) << validate(p).error().message;
}

// Fuzz problem_config (issue 33, corpus/problem_config/regression_contiguous_strides_overflow):
// a contiguous problem whose extents multiply past int64 (heads 1226130831 x seqlen_k 100000012 x
// d 128) was undefined behaviour in contiguous_strides (before validate() could refuse it); now
// the strides saturate and validate() names what is wrong.
TEST(Problem, ContiguousStridesOfHugeExtentsSaturate) {
  const Strides s = contiguous_strides(Layout::BSHD, 100000012, 1226130831, 128);
  EXPECT_EQ(s.batch, INT64_MAX & ~7);
  EXPECT_EQ(s.seq, int64_t{1226130831} * 128);
  EXPECT_EQ(contiguous_strides(Layout::BHSD, int64_t{1} << 40, int64_t{1} << 30, 128).batch,
            INT64_MAX & ~7);
  auto p =
      AttentionProblem::make(1, 1226130831, 1226130831, 4096, 100000012, 128, DType::BF16, false);
  expect_invalid(p, "heads_q = 1226130831: must be in [1, 65535]");
}

TEST(Problem, PaddedStridesAreAccepted) {
  auto p = AttentionProblem::make(2, 4, 4, 33, 33, 64, DType::F16, false);
  p.q_strides = {33 * (4 * 64 + 24), 4 * 64 + 24, 64};
  p.o_strides = {33 * (4 * 72 + 8), 4 * 72 + 8, 72};
  EXPECT_TRUE(validate(p).ok()) << validate(p).error().message;
  EXPECT_EQ(p.o_span(), 1 * 33 * (4 * 72 + 8) + 32 * (4 * 72 + 8) + 3 * 72 + 64);
}

TEST(Problem, LayoutsAndDerivedValues) {
  EXPECT_EQ(contiguous_strides(Layout::BSHD, 10, 4, 64), (Strides{10 * 4 * 64, 4 * 64, 64}));
  EXPECT_EQ(contiguous_strides(Layout::BHSD, 10, 4, 64), (Strides{4 * 10 * 64, 64, 10 * 64}));
  auto p = AttentionProblem::make(2, 8, 2, 100, 300, 128, DType::BF16, false);
  EXPECT_FLOAT_EQ(p.scale(), 1.0f / std::sqrt(128.0f));
  p.softmax_scale = 0.5f;
  EXPECT_FLOAT_EQ(p.scale(), 0.5f);
  EXPECT_EQ(p.group_size(), 4);
  EXPECT_DOUBLE_EQ(p.flops(), 4.0 * 2 * 8 * 100 * 300 * 128);
  p.causal = true;
  EXPECT_DOUBLE_EQ(p.flops(), 2.0 * 2 * 8 * 100 * 300 * 128);
  EXPECT_EQ(p.q_span(), 2 * 100 * 8 * 128);
  EXPECT_EQ(p.kv_span(), 2 * 300 * 2 * 128);
  EXPECT_EQ(p.lse_elements(), 2 * 8 * 100);
}

TEST(Problem, ParsesDtypes) {
  EXPECT_EQ(*parse_dtype("bf16"), DType::BF16);
  EXPECT_EQ(*parse_dtype("BFloat16"), DType::BF16);
  EXPECT_EQ(*parse_dtype("fp16"), DType::F16);
  EXPECT_EQ(*parse_dtype("fp32"), DType::F32);
  EXPECT_EQ(*parse_dtype("Float32"), DType::F32);
  EXPECT_EQ(*parse_dtype("f32"), DType::F32);
  for (DType dtype : {DType::F16, DType::BF16, DType::F32})
    EXPECT_EQ(*parse_dtype(to_string(dtype)), dtype);
  EXPECT_EQ(dtype_bytes(DType::F16), 2);
  EXPECT_EQ(dtype_bytes(DType::BF16), 2);
  EXPECT_EQ(dtype_bytes(DType::F32), 4);
  auto bad = parse_dtype("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'fp8'"), std::string::npos);
  EXPECT_NE(bad.error().message.find("f32 (fp32"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace flashjit
