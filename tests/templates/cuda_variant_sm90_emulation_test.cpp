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
#include "support/forward_emulation.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "support/variant_emulation.hpp"
// The order matters (as the renderer assembles the source):
// clang-format off
#include "templates/attention_params.h"
// (the emulated primitives before the templates)
#include "support/sm90_emulator.hpp"
#define FLASHJIT_VARIANT_MASK_MOD 1
#include "support/emulated_variant.h"
#include "templates/attention_common.h"
#include "templates/cuda/online_softmax.cuh"
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
  for (const std::string& line : ft::emulated_forward_prelude_lines(/*with_mask_mod=*/true))
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
}

template <class K>
void check(DType dtype, int head_dim, uint64_t seed) {
  ft::check_variant_forward_emulation(
      kVariant, dtype, head_dim, K::kBlockN, seed,
      [](const AttentionProblem& problem, const ft::HostInputs&,
         const FlashjitAttentionParams& params) {
        const auto grid = ft::forward_grid<ft::Sm90Grid>(problem, K::kBlockM);
        ft::Sm90Options options;
        options.late_wgmma = true;  // P V of the previous block still in flight during the softmax
        return ft::emulate_sm90(
            grid, K::kThreads, K::kSmemBytes,
            [&] { flashjit_kernel::attention_forward_sm90<K>(params); }, options);
      });
}

TEST(CudaVariantSm90Emulation, MatchesTheFp64Reference) {
  // Sm90Traits<HEAD_DIM, BLOCK_M, BLOCK_N, WARPS, STAGES, IS_BF16, CAUSAL>: one warpgroup, n64,
  // 2 buffers; two warpgroups, n128, 3 buffers.
  check<flashjit_kernel::Sm90Traits<64, 64, 64, 4, 2, true, true>>(DType::BF16, 64, /*seed=*/11);
  check<flashjit_kernel::Sm90Traits<128, 128, 128, 8, 3, false, true>>(DType::F16, 128,
                                                                       /*seed=*/11);
}

}  // namespace
}  // namespace flashjit
