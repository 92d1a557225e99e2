// The CUDA mma forward for packed variable-length documents (attention_forward_varlen in
// templates/cuda/attention_fwd.cuh, flashjit_variant::document_view in
// templates/attention_variant.h) run on the host through the device-primitive emulator
// (tests/support/cuda_emulator.hpp) against the fp64 reference per document: documents of 1, 17,
// ~100 rows, empty ones, seqlen_q != seqlen_k both ways, GQA, causal with a sliding window (the
// diagonal and the band per document). o is poisoned: every document row must be written and the
// spare rows past the last document left alone; the spare key rows are NaN, so a tile that reads
// past its document fails. The variant is compiled in (one per translation unit): the defines
// below are what the generator renders, which the first test checks.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "generator/variant.hpp"
#include "runtime/launch_params.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "templates/attention_params.h"
// clang-format off: the order matters (as the renderer assembles the source)
#include "support/cuda_emulator.hpp"
#define FLASHJIT_VARIANT 1
#define FLASHJIT_VARIANT_CAUSAL 1
#define FLASHJIT_VARIANT_WINDOW_LEFT (30)
#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)
#define FLASHJIT_VARIANT_PREFIX 0
#define FLASHJIT_VARIANT_ALIBI 0
#define FLASHJIT_VARIANT_SCORE_MOD 0
#define FLASHJIT_VARIANT_MASK_MOD 0
#define FLASHJIT_VARIANT_VARLEN 1
#include "templates/attention_common.h"
#include "templates/attention_variant.h"
// (tiles before the kernel)
#include "templates/cuda/tiles.cuh"
// (the kernel last)
#include "templates/cuda/attention_fwd.cuh"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

Variant compiled_variant() {
  Variant v;
  v.window_left = 30;
  v.varlen = true;
  return v;
}

AttentionProblem make_problem(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                              int64_t spare, int64_t heads_q, int64_t heads_kv, int head_dim,
                              DType dtype) {
  int64_t max_q = 1, max_k = 1, total_q = spare, total_k = spare;
  for (size_t b = 0; b < q.size(); ++b) {
    max_q = std::max(max_q, q[b]);
    max_k = std::max(max_k, k[b]);
    total_q += q[b];
    total_k += k[b];
  }
  AttentionProblem p =
      AttentionProblem::make_varlen(static_cast<int64_t>(q.size()), heads_q, heads_kv, max_q, max_k,
                                    total_q, total_k, head_dim, dtype, true);
  p.variant = compiled_variant();
  p.variant.total_q = total_q;
  p.variant.total_k = total_k;
  return p;
}

TEST(CudaVarlenEmulation, TheDefinesAreWhatTheGeneratorRenders) {
  const AttentionProblem p = make_problem({16}, {16}, 0, 1, 1, 64, DType::BF16);
  const std::string prelude = render_variant_prelude(p).value();
  for (const char* line :
       {"#define FLASHJIT_VARIANT_CAUSAL 1\n", "#define FLASHJIT_VARIANT_WINDOW_LEFT (30)\n",
        "#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)\n", "#define FLASHJIT_VARIANT_PREFIX 0\n",
        "#define FLASHJIT_VARIANT_ALIBI 0\n", "#define FLASHJIT_VARIANT_SCORE_MOD 0\n",
        "#define FLASHJIT_VARIANT_MASK_MOD 0\n", "#define FLASHJIT_VARIANT_VARLEN 1\n"})
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
  EXPECT_EQ(prelude.find("\n#define FLASHJIT_VARIANT_SOFTCAP"), std::string::npos);
}

template <class K>
std::string run_forward(const AttentionProblem& problem, const ft::HostInputs& inputs,
                        std::vector<uint16_t>* o, std::vector<float>* lse) {
  o->assign(problem.o_span(), ft::kPoisonBits);
  lse->assign(problem.lse_elements(), std::numeric_limits<float>::quiet_NaN());
  AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), o->data(), lse->data()};
  args.cu_seqlens_q = inputs.cu_seqlens_q.data();
  args.cu_seqlens_k = inputs.cu_seqlens_k.data();
  const FlashjitAttentionParams params = make_launch_params(problem, args);
  ft::clear_globals();
  for (const std::vector<uint16_t>* tensor : {&inputs.q, &inputs.k, &inputs.v})
    ft::register_global(tensor->data(), tensor->size() * sizeof(uint16_t));
  ft::CudaGrid grid;
  grid.x = static_cast<int>((problem.seqlen_q + K::kBlockM - 1) / K::kBlockM);
  grid.y = static_cast<int>(problem.heads_q);
  grid.z = static_cast<int>(problem.batch);
  return ft::emulate_cuda(grid, K::kThreads, K::kSmemElements * 2,
                          [&] { flashjit_kernel::attention_forward_varlen<K>(params); });
}

template <class K>
void check(DType dtype, int head_dim) {
  struct Case {
    std::vector<int64_t> q, k;
    int64_t spare;
  };
  const Case cases[] = {
      {{1}, {1}, 0},
      // 17 queries of 5 keys (rows that see none), empty documents, more keys than queries.
      {{17, 0, 3, 100, 1}, {5, 4, 0, 130, 1}, 9},
      {{70, 40}, {40, 70}, 3},
  };
  uint64_t seed = 3;
  for (const Case& c : cases)
    for (const auto [heads_q, heads_kv] : {std::pair<int64_t, int64_t>{2, 2}, {4, 1}}) {
      const AttentionProblem problem =
          make_problem(c.q, c.k, c.spare, heads_q, heads_kv, head_dim, dtype);
      ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
      ft::HostInputs inputs = ft::random_inputs(problem, seed++);
      inputs.cu_seqlens_q = cu_seqlens_of(c.q);
      inputs.cu_seqlens_k = cu_seqlens_of(c.k);
      const int64_t keys = inputs.cu_seqlens_k.back();
      ft::poison_keys(problem, inputs, keys, problem.variant.total_k);
      std::vector<uint16_t> o;
      std::vector<float> lse;
      ASSERT_EQ(run_forward<K>(problem, inputs, &o, &lse), "") << problem.to_string();
      const Comparison result =
          ft::compare(problem, o, lse, ft::reference_attention(problem, inputs));
      EXPECT_TRUE(ft::matches_reference(result)) << problem.to_string();
      EXPECT_EQ(result.o_padding_written, 0) << problem.to_string();
    }
}

TEST(CudaVarlenEmulation, MatchesTheFp64ReferencePerDocument) {
  check<flashjit_kernel::Traits<64, 64, 32, 4, 2, true, true>>(DType::BF16, 64);
  check<flashjit_kernel::Traits<128, 128, 64, 4, 3, false, true>>(DType::F16, 128);
}

}  // namespace
}  // namespace flashjit
