// The HIP forward template (templates/hip/attention_fwd.hpp) with an attention variant
// (templates/attention_variant.h) run on the host through the emulation of its AMD primitives
// (tests/support/hip_emulator.hpp) against the fp64 reference, as
// tests/templates/cuda_variant_emulation_test.cpp does for the CUDA mma forward: causal sliding
// window + prefix-LM + soft-capping + ALiBi + a user score_mod at once, so that key-block skipping,
// per-element masking, fully visible blocks whose scores are modified and every score
// modification run. Hidden key blocks hold NaN: a kernel that loads one fails. The variant is
// compiled in (one per translation unit): support/emulated_variant.h holds what the generator
// renders for emulated_variant(), which the first test checks. Built twice (tests/CMakeLists.txt):
// templates_hip_variant_mask_mod_emulation_test defines FLASHJIT_EMULATED_MASK_MOD=1, adding the
// emulated variant's mask_mod (every visited block then masked per element through it).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "generator/device.hpp"
#include "generator/hip_config.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "generator/variant.hpp"
#include "runtime/launch_params.hpp"
#include "support/attention_cases.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "templates/attention_params.h"
// clang-format off: the order matters (as the renderer assembles the source)
#include "support/hip_emulator.hpp"
#ifndef FLASHJIT_EMULATED_MASK_MOD
#define FLASHJIT_EMULATED_MASK_MOD 0
#endif
#define FLASHJIT_VARIANT_MASK_MOD FLASHJIT_EMULATED_MASK_MOD
#include "support/emulated_variant.h"
#include "templates/attention_common.h"
#include "templates/hip/tiles.hpp"
// (the kernel last)
#include "templates/hip/attention_fwd.hpp"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// The variant compiled in above (support/emulated_variant.h) and its host expressions.
const ft::VariantCase kVariant = ft::emulated_variant(FLASHJIT_EMULATED_MASK_MOD == 1);

TEST(HipVariantEmulation, TheDefinesAreWhatTheGeneratorRenders) {
  AttentionProblem p = AttentionProblem::make(1, 1, 1, 16, 16, 64, DType::BF16, true);
  p.variant = kVariant.variant;
  const std::string prelude = render_variant_prelude(p).value();
  for (const char* line :
       {"#define FLASHJIT_VARIANT_CAUSAL 1\n", "#define FLASHJIT_VARIANT_WINDOW_LEFT (40)\n",
        "#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)\n", "#define FLASHJIT_VARIANT_PREFIX 24\n",
        "#define FLASHJIT_VARIANT_SOFTCAP 2.000000000e+00f\n", "#define FLASHJIT_VARIANT_ALIBI 1\n",
        "#define FLASHJIT_VARIANT_SCORE_MOD 1\n",
        FLASHJIT_EMULATED_MASK_MOD ? "#define FLASHJIT_VARIANT_MASK_MOD 1\n"
                                   : "#define FLASHJIT_VARIANT_MASK_MOD 0\n",
        "  return static_cast<float>(score - 0.05f * abs(q_idx - kv_idx) + 0.25f * head - "
        "batch);"})
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
  if (FLASHJIT_EMULATED_MASK_MOD) {
    EXPECT_NE(prelude.find("  return static_cast<bool>((kv_idx + head + batch) % 5 != 0 || "
                           "q_idx < 8);"),
              std::string::npos);
  }
  // The rendered HIP source carries that prelude and enters through the variant's entry.
  const std::string source = render_hip_attention(p, AttentionConfig{64, 32, 2, 2}).value().text;
  EXPECT_NE(source.find(prelude), std::string::npos);
  EXPECT_NE(source.find("flashjit_hip::attention_forward_variant<Config>(params);"),
            std::string::npos);
}

template <class K>
std::string run_forward(const AttentionProblem& problem, const ft::HostInputs& inputs,
                        std::vector<uint16_t>* o, std::vector<float>* lse) {
  o->assign(problem.o_span(), ft::kPoisonBits);
  lse->assign(problem.lse_elements(), std::numeric_limits<float>::quiet_NaN());
  AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), o->data(), lse->data()};
  args.alibi_slopes = inputs.alibi_slopes.data();
  const FlashjitAttentionParams params = make_launch_params(problem, args);
  ft::HipGrid grid;
  grid.x = static_cast<int>((problem.seqlen_q + K::kBlockM - 1) / K::kBlockM);
  grid.y = static_cast<int>(problem.heads_q);
  grid.z = static_cast<int>(problem.batch);
  return ft::emulate_hip(grid, K::kThreads, K::kLdsBytes,
                         [&] { flashjit_hip::attention_forward_variant<K>(params); });
}

struct Case {
  ft::Shape shape;
  int64_t nan_keys_begin = 0, nan_keys_end = 0;  // keys no query sees, set to NaN
};

template <class K>
void check(DType dtype, int head_dim) {
  // The config is one the generator offers for the variant on gfx90a.
  {
    AttentionProblem problem = AttentionProblem::make(1, 2, 2, 300, 300, head_dim, dtype, true);
    problem.variant = kVariant.variant;
    const AttentionConfig config{K::kBlockM, K::kBlockN, K::kWaves, K::kStages};
    const Status legal = check_hip_config(config, problem, known_device("gfx90a").value());
    EXPECT_TRUE(legal.ok()) << legal.error().describe();
  }
  static_assert(K::kBlockN <= 64, "the last case's hidden keys start at block_n");
  const Case cases[] = {
      {{1, 1, 1, 1, 1}},
      {{2, 2, 1, 70, 150}},  // GQA, more keys, ragged blocks; batch 1 shifts the score_mod
      {{1, 2, 2, 100, 40}},  // more queries: the first 60 rows see only the prefix
      // diagonal 260: row 0 sees [220, 260] and the prefix [0, 24): keys [block_n, 192) are in
      // blocks no row sees (the prefix's one block is read whole, masked per element).
      {{1, 2, 1, 40, 300}, K::kBlockN, 192},
  };
  uint64_t seed = 7;
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

TEST(HipVariantEmulation, MatchesTheFp64Reference) {
  // 2 waves of 32 rows, block_n 32, 2 LDS stages; 4 waves of 16 rows, block_n 64, 1 stage; the
  // d = 128 default (4 waves of 32 rows, block_n 64, 1 stage).
  check<flashjit_hip::Traits<64, 64, 32, 2, 2, true, true>>(DType::BF16, 64);
  check<flashjit_hip::Traits<64, 64, 64, 4, 1, false, true>>(DType::F16, 64);
  check<flashjit_hip::Traits<128, 128, 64, 4, 1, false, true>>(DType::F16, 128);
}

}  // namespace
}  // namespace flashjit
