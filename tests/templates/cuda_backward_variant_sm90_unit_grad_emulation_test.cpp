// The wgmma backward template (templates/cuda/attention_bwd_sm90.cuh) with a variant whose
// d score / d s is 1 (flashjit_variant::kScoreGradIsOne: causal sliding window + prefix-LM +
// ALiBi, no soft-cap, no score_mod), run on the host through the sm_90a emulator against the fp64
// reference gradients: the path that forms P while dP is in flight and skips the per-score mask in
// blocks every row sees whole, in both kernels, both dQ modes, RS and SS dK/dV. Hidden key blocks
// hold NaN. (cuda_backward_variant_sm90_emulation_test runs the chain-factor path; on an H100:
// runtime_cuda_backward_variant_test.)
#include <gtest/gtest.h>

#include "generator/problem.hpp"
#include "support/attention_cases.hpp"
#include "support/variant_cases.hpp"
#include "support/variant_emulation.hpp"
#include "tuner/reference.hpp"
// The order matters (as the renderer assembles the source):
// clang-format off
#include "templates/attention_params.h"
// (the emulated primitives before the templates)
#include "support/sm90_emulator.hpp"
#define FLASHJIT_VARIANT 1
#define FLASHJIT_VARIANT_CAUSAL 1
#define FLASHJIT_VARIANT_WINDOW_LEFT (40)
#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)
#define FLASHJIT_VARIANT_PREFIX 24
#define FLASHJIT_VARIANT_ALIBI 1
#define FLASHJIT_VARIANT_SCORE_MOD 0
#define FLASHJIT_VARIANT_MASK_MOD 0
#define FLASHJIT_VARIANT_VARLEN 0
#include "templates/attention_variant.h"
#include "templates/attention_common.h"
// (tiles before the kernel)
#include "templates/cuda/sm90_tiles.cuh"
// (the kernel last)
#include "templates/cuda/attention_bwd_sm90.cuh"
#include "templates/cuda/attention_bwd_sm90_dq.cuh"
// clang-format on
#include "support/sm90_backward_emulation.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

static_assert(flashjit_variant::kScoreGradIsOne, "this test is of the unit-gradient path");

// The variant compiled in above.
ft::VariantCase unit_grad_variant() {
  ft::VariantCase c{"window_prefix_alibi", true, {}, {}};
  c.variant.window_left = 40;
  c.variant.prefix = 24;
  c.variant.alibi = true;
  return c;
}

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool BF16, bool ATOMIC>
void check() {
  ft::check_sm90_variant_backward<flashjit_kernel::Sm90BwdTraits<HEAD_DIM, BLOCK_M, BLOCK_N, WARPS,
                                                                 STAGES, BF16, true, ATOMIC>>(
      unit_grad_variant(), /*seed=*/29);
}

TEST(CudaBackwardVariantSm90UnitGradEmulation, MatchesTheFp64Reference) {
  // As the chain-factor test: RS dK/dV with Atomic dQ; SS dK/dV with the dQ kernel; 128 keys a
  // block (the dQ kernel's S and dP of 128 columns) at a padded head dim.
  check<64, 64, 64, 4, 2, true, true>();
  check<128, 64, 64, 8, 2, false, false>();
  check<96, 64, 128, 8, 2, true, false>();
}

}  // namespace
}  // namespace flashjit
