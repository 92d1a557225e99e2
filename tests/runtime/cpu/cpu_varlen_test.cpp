// Packed variable-length documents (Variant::varlen, issue 17) on the CPU backend: documents of
// odd lengths (1, 17, ~1000, empty queries, empty keys, seqlen_q != seqlen_k both ways), GQA,
// causal, with a window + softcap and a mask_mod that reads the document index, against the fp64
// reference per document (tuner/reference.hpp); o poisoned with NaN, so that every document row
// must be written and every row outside the documents left untouched; the host checks of the
// offsets. Skips without the CPU backend.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/runtime.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"

#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.hpp"
#endif

namespace flashjit {
namespace {

namespace ft = flashjit::testing;

#if FLASHJIT_HAVE_CPU_BACKEND

const cpu::CpuBackend& backend() {
  static const std::unique_ptr<cpu::CpuBackend> instance = cpu::CpuBackend::create().value();
  return *instance;
}

// Documents: query and key lengths of each, and spare rows past the last document (left
// untouched by the kernel).
struct Documents {
  std::vector<int64_t> q, k;
  int64_t spare_q = 0, spare_k = 0;
};

int64_t longest(const std::vector<int64_t>& lengths) {
  int64_t m = 1;
  for (int64_t n : lengths) m = std::max(m, n);
  return m;
}
int64_t sum(const std::vector<int64_t>& lengths) {
  int64_t s = 0;
  for (int64_t n : lengths) s += n;
  return s;
}

AttentionProblem make_problem(const Documents& docs, int64_t heads_q, int64_t heads_kv, DType dtype,
                              bool causal, const Variant& variant = {}) {
  AttentionProblem p = AttentionProblem::make_varlen(
      static_cast<int64_t>(docs.q.size()), heads_q, heads_kv, longest(docs.q), longest(docs.k),
      sum(docs.q) + docs.spare_q, sum(docs.k) + docs.spare_k, 64, dtype, causal);
  const Variant packed = p.variant;
  p.variant = variant;
  p.variant.varlen = true;
  p.variant.total_q = packed.total_q;
  p.variant.total_k = packed.total_k;
  return p;
}

ft::HostInputs inputs_for(const AttentionProblem& problem, const Documents& docs, uint64_t seed) {
  ft::HostInputs inputs = ft::random_inputs(problem, seed);
  inputs.cu_seqlens_q = cu_seqlens_of(docs.q);
  inputs.cu_seqlens_k = cu_seqlens_of(docs.k);
  return inputs;
}

struct Launched {
  Status status;
  std::vector<uint16_t> o;
  std::vector<float> lse;
};

Launched launch(const Kernel& kernel, const AttentionProblem& problem,
                const ft::HostInputs& inputs) {
  Launched out{ok_status(), ft::poisoned_storage(problem.o_span(), problem.dtype),
               std::vector<float>(static_cast<size_t>(problem.lse_elements()), -12345.0f)};
  AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), out.o.data(),
                     out.lse.data()};
  args.alibi_slopes = inputs.alibi_slopes.empty() ? nullptr : inputs.alibi_slopes.data();
  args.cu_seqlens_q = inputs.cu_seqlens_q.data();
  args.cu_seqlens_k = inputs.cu_seqlens_k.data();
  out.status = kernel.launch(problem, args);
  return out;
}

::testing::AssertionResult run_and_check(const Kernel& kernel, const AttentionProblem& problem,
                                         const Documents& docs, uint64_t seed,
                                         const VariantFunctions& functions = {}) {
  const ft::HostInputs inputs = inputs_for(problem, docs, seed);
  const Launched run = launch(kernel, problem, inputs);
  if (!run.status.ok()) return ::testing::AssertionFailure() << run.status.error().describe();
  const ft::Reference reference = ft::reference_attention(problem, inputs, functions);
  const double tolerance = problem.dtype == DType::F32 ? 2e-5 : 1e-2;
  const double lse_tolerance = problem.dtype == DType::F32 ? 2e-5 : 1e-3;
  return ft::matches_reference(ft::compare(problem, run.o, run.lse, reference), tolerance,
                               lse_tolerance);
}

Result<std::shared_ptr<Kernel>> build(const AttentionProblem& problem) {
  const cpu::CpuBackend& cpu = backend();
  // The smallest tile: the most query tiles past short documents, the most key blocks.
  return build_kernel(cpu, nullptr, problem, cpu.legal_configs(problem).front());
}

// Lengths: 1, 17, ~1000, an empty document, a document with queries and no keys; seqlen_q <
// seqlen_k and > in different documents; spare rows past the last document.
const Documents kMixed{{1, 17, 1000, 0, 5, 40}, {1, 40, 900, 3, 0, 12}, 7, 5};

TEST(CpuVarlen, DocumentsMatchTheReferencePerDocument) {
  struct Case {
    const char* name;
    bool causal;
    DType dtype;
    int64_t heads_q, heads_kv;
  };
  const Case cases[] = {
      {"gqa", false, DType::F32, 4, 2},
      {"gqa_causal", true, DType::F32, 4, 2},
      {"mqa_causal_bf16", true, DType::BF16, 3, 1},
  };
  for (const Case& c : cases) {
    const AttentionProblem problem = make_problem(kMixed, c.heads_q, c.heads_kv, c.dtype, c.causal);
    Result<std::shared_ptr<Kernel>> kernel = build(problem);
    ASSERT_TRUE(kernel.ok()) << c.name << ": " << kernel.error().describe();
    EXPECT_TRUE(run_and_check(**kernel, problem, kMixed, 11)) << c.name;
    // The same kernel serves other documents (the offsets are launch arguments).
    const Documents other{{300, 2, 64, 1, 1, 9}, {299, 70, 64, 1, 2, 9}, 0, 0};
    EXPECT_TRUE(run_and_check(
        **kernel, make_problem(other, c.heads_q, c.heads_kv, c.dtype, c.causal), other, 12))
        << c.name << " other documents";
  }
}

TEST(CpuVarlen, WithAWindowSoftcapAndAMaskModOfTheDocument) {
  Variant v;
  v.window_left = 24;
  v.window_right = 0;
  v.softcap = 1.5f;
  // The batch a mask_mod sees is the document's index.
  v.mask_mod = "batch != 2 || (kv_idx % 3) != 0";
  VariantFunctions functions;
  functions.mask_mod = [](int64_t b, int64_t, int64_t, int64_t j) { return b != 2 || j % 3 != 0; };
  const AttentionProblem problem = make_problem(kMixed, 4, 2, DType::F32, true, v);
  Result<std::shared_ptr<Kernel>> kernel = build(problem);
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  EXPECT_TRUE(run_and_check(**kernel, problem, kMixed, 21, functions));
  // The check can fail: a mask_mod of another document index is a different answer.
  VariantFunctions wrong;
  wrong.mask_mod = [](int64_t b, int64_t, int64_t, int64_t j) { return b != 1 || j % 3 != 0; };
  EXPECT_FALSE(run_and_check(**kernel, problem, kMixed, 21, wrong));
}

// Rows of other documents are neither read nor written: NaN in every key and value outside a
// document's own range changes nothing, and the reference of merged documents (one document
// seeing the other's keys) does not pass.
TEST(CpuVarlen, DocumentsDoNotSeeEachOther) {
  const Documents docs{{20, 33}, {25, 30}, 3, 4};
  const AttentionProblem problem = make_problem(docs, 2, 2, DType::F32, false);
  Result<std::shared_ptr<Kernel>> kernel = build(problem);
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  ft::HostInputs inputs = inputs_for(problem, docs, 31);
  // Spare key rows (past the last document) are NaN: a kernel that reads past a document fails.
  ft::poison_keys(problem, inputs, sum(docs.k), problem.variant.total_k);
  const Launched run = launch(**kernel, problem, inputs);
  ASSERT_TRUE(run.status.ok()) << run.status.error().describe();
  const Comparison result =
      ft::compare(problem, run.o, run.lse, ft::reference_attention(problem, inputs));
  EXPECT_TRUE(ft::matches_reference(result, 2e-5, 2e-5));
  EXPECT_EQ(result.poisoned_left, 0);      // every document row written
  EXPECT_EQ(result.o_padding_written, 0);  // the spare rows untouched
  // Merged: one document of all the rows.
  ft::HostInputs merged = inputs;
  merged.cu_seqlens_q = cu_seqlens_of({53});
  merged.cu_seqlens_k = cu_seqlens_of({55});
  AttentionProblem one = make_problem({{53}, {55}, 3, 4}, 2, 2, DType::F32, false);
  const ft::Reference merged_reference = ft::reference_attention(one, merged);
  EXPECT_FALSE(
      ft::matches_reference(ft::compare(one, run.o, run.lse, merged_reference), 2e-5, 2e-5));
}

TEST(CpuVarlen, BadOffsetsAreTypedErrors) {
  const Documents docs{{4, 2}, {4, 2}, 0, 0};  // at most 4 rows each, 6 in all
  const AttentionProblem problem = make_problem(docs, 1, 1, DType::F32, false);
  Result<std::shared_ptr<Kernel>> kernel = build(problem);
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  struct Bad {
    std::vector<int32_t> cu;
    const char* expected;
  };
  const Bad bad[] = {
      {{1, 4, 6}, "cu_seqlens_q[0] = 1: must be 0"},
      {{0, 3, 2}, "cu_seqlens_q[2] = 2 < cu_seqlens_q[1] = 3"},
      {{0, 0, 5}, "document 1 has 5 rows"},
      {{0, 4, 8}, "cu_seqlens_q[2] = 8: past the packed tensor's 6 rows"},
  };
  for (const Bad& b : bad) {
    ft::HostInputs inputs = inputs_for(problem, docs, 1);
    inputs.cu_seqlens_q = b.cu;
    const Launched run = launch(**kernel, problem, inputs);
    ASSERT_FALSE(run.status.ok()) << b.expected;
    EXPECT_EQ(run.status.error().code, ErrorCode::InvalidArgument);
    EXPECT_NE(run.status.error().message.find(b.expected), std::string::npos)
        << run.status.error().message;
  }
  ft::HostInputs inputs = inputs_for(problem, docs, 1);
  std::vector<uint16_t> o = ft::poisoned_storage(problem.o_span(), problem.dtype);
  AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), o.data()};
  args.cu_seqlens_q = inputs.cu_seqlens_q.data();  // cu_seqlens_k missing
  const Status status = (*kernel)->launch(problem, args);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("cu_seqlens_k is null"), std::string::npos)
      << status.error().message;
}

#else
TEST(CpuVarlen, SkippedWithoutTheCpuBackend) { GTEST_SKIP() << "built without LLVM"; }
#endif

}  // namespace
}  // namespace flashjit
