// The wgmma forward template (templates/cuda/attention_fwd_sm90.cuh) with an attention variant
// (templates/attention_variant.h) run on the host through the sm_90a emulator
// (tests/support/sm90_emulator.hpp: wgmma with the documented operand layouts and late
// execution, cp.async with late copies) against the fp64 reference: causal sliding window +
// prefix-LM + soft-capping + ALiBi + a user score_mod and mask_mod at once, so that key-block
// skipping, per-element masking and every score modification run in the wgmma pipeline (whose
// loads and softmax are shifted one block apart). Hidden key blocks hold NaN: a kernel that loads
// one fails. The variant is compiled in (one per translation unit): the defines below are what
// the generator renders for emulated_variant(), which the first test checks. (The generator does
// not offer this family for a mask_mod, only because ptxas then serializes its wgmmas: the template
// computes it right, as this test shows.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "generator/variant.hpp"
#include "runtime/launch_params.hpp"
#include "support/attention_cases.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
// The order matters (as the renderer assembles the source):
// clang-format off
#include "templates/attention_params.h"
// (the emulated primitives before the templates)
#include "support/sm90_emulator.hpp"
#define FLASHJIT_VARIANT_MASK_MOD 1
#include "support/emulated_variant.h"
#include "templates/attention_common.h"
// (tiles before the kernel)
#include "templates/cuda/sm90_tiles.cuh"
// (the kernel last)
#include "templates/cuda/attention_fwd_sm90.cuh"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// The variant compiled in above (support/emulated_variant.h) and its host expressions.
const ft::VariantCase kVariant = ft::emulated_variant(/*with_mask_mod=*/true);

TEST(CudaVariantSm90Emulation, TheDefinesAreWhatTheGeneratorRenders) {
  AttentionProblem p = AttentionProblem::make(1, 1, 1, 16, 16, 64, DType::BF16, true);
  p.variant = kVariant.variant;
  const std::string prelude = render_variant_prelude(p).value();
  for (const char* line :
       {"#define FLASHJIT_VARIANT_CAUSAL 1\n", "#define FLASHJIT_VARIANT_WINDOW_LEFT (40)\n",
        "#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)\n", "#define FLASHJIT_VARIANT_PREFIX 24\n",
        "#define FLASHJIT_VARIANT_SOFTCAP 2.000000000e+00f\n", "#define FLASHJIT_VARIANT_ALIBI 1\n",
        "#define FLASHJIT_VARIANT_SCORE_MOD 1\n", "#define FLASHJIT_VARIANT_MASK_MOD 1\n",
        "  return static_cast<float>(score - 0.05f * abs(q_idx - kv_idx) + 0.25f * head - "
        "batch);",
        "  return static_cast<bool>((kv_idx + head + batch) % 5 != 0 || q_idx < 8);"})
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
}

template <class K>
std::string run_forward(const AttentionProblem& problem, const ft::HostInputs& inputs,
                        std::vector<uint16_t>* o, std::vector<float>* lse) {
  o->assign(problem.o_span(), ft::kPoisonBits);
  lse->assign(problem.lse_elements(), std::numeric_limits<float>::quiet_NaN());
  AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), o->data(), lse->data()};
  args.alibi_slopes = inputs.alibi_slopes.data();
  const FlashjitAttentionParams params = make_launch_params(problem, args);
  const ft::Sm90Grid grid{static_cast<int>((problem.seqlen_q + K::kBlockM - 1) / K::kBlockM),
                          static_cast<int>(problem.heads_q), static_cast<int>(problem.batch)};
  ft::Sm90Options options;
  options.late_wgmma = true;  // P V of the previous block still in flight during the softmax
  return ft::emulate_sm90(
      grid, K::kThreads, K::kSmemBytes, [&] { flashjit_kernel::attention_forward_sm90<K>(params); },
      options);
}

struct Case {
  ft::Shape shape;
  int64_t nan_keys_begin = 0, nan_keys_end = 0;  // keys no query sees, set to NaN
};

template <class K>
void check(DType dtype, int head_dim) {
  const Case cases[] = {
      {{1, 1, 1, 1, 1}},
      {{2, 2, 1, 70, 150}},  // GQA, more keys, ragged blocks; batch 1 shifts both mods
      {{1, 2, 2, 100, 40}},  // more queries: the first 60 rows see only the prefix
      // diagonal 260: row 0 sees [220, 260] and the prefix [0, 24): with 64-key blocks, keys
      // [64, 192) are in blocks no row sees (the prefix's one block is read whole, masked per
      // element); with 128-key blocks the band starts in block 1, so none is hidden.
      {{1, 2, 1, 40, 300}, K::kBlockN, K::kBlockN == 64 ? 192 : K::kBlockN},
  };
  uint64_t seed = 11;
  for (const Case& c : cases) {
    AttentionProblem problem = ft::make_problem(c.shape, head_dim, dtype, true, Pass::Forward);
    problem.variant = kVariant.variant;
    ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
    ft::HostInputs inputs = ft::random_inputs(problem, seed++);
    ft::poison_keys(problem, inputs, c.nan_keys_begin, c.nan_keys_end);
    std::vector<uint16_t> o;
    std::vector<float> lse;
    ASSERT_EQ(run_forward<K>(problem, inputs, &o, &lse), "") << c.shape.to_string();
    EXPECT_TRUE(ft::matches_reference(
        ft::compare(problem, o, lse, ft::reference_attention(problem, inputs, kVariant.functions))))
        << c.shape.to_string();
  }
}

TEST(CudaVariantSm90Emulation, MatchesTheFp64Reference) {
  // Sm90Traits<HEAD_DIM, BLOCK_M, BLOCK_N, WARPS, STAGES, IS_BF16, CAUSAL>: one warpgroup, n64,
  // 2 buffers; two warpgroups, n128, 3 buffers.
  check<flashjit_kernel::Sm90Traits<64, 64, 64, 4, 2, true, true>>(DType::BF16, 64);
  check<flashjit_kernel::Sm90Traits<128, 128, 128, 8, 3, false, true>>(DType::F16, 128);
}

}  // namespace
}  // namespace flashjit
