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
#include "support/forward_emulation.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "support/variant_emulation.hpp"
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
  for (const std::string& line :
       ft::emulated_forward_prelude_lines(/*with_mask_mod=*/FLASHJIT_EMULATED_MASK_MOD == 1))
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
  // The rendered HIP source carries that prelude and enters through the variant's entry.
  const std::string source = render_hip_attention(p, AttentionConfig{64, 32, 2, 2}).value().text;
  EXPECT_NE(source.find(prelude), std::string::npos);
  EXPECT_NE(source.find("flashjit_hip::attention_forward_variant<Config>(params);"),
            std::string::npos);
}

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
  ft::check_variant_forward_emulation(
      kVariant, dtype, head_dim, K::kBlockN, /*seed=*/7,
      [](const AttentionProblem& problem, const ft::HostInputs&,
         const FlashjitAttentionParams& params) {
        const auto grid = ft::forward_grid<ft::HipGrid>(problem, K::kBlockM);
        return ft::emulate_hip(grid, K::kThreads, K::kLdsBytes,
                               [&] { flashjit_hip::attention_forward_variant<K>(params); });
      });
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
