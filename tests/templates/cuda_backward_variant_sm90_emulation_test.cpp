// The wgmma backward template (templates/cuda/attention_bwd_sm90.cuh) with an attention variant
// (templates/attention_variant.h) run on the host through the sm_90a emulator
// (tests/support/sm90_emulator.hpp) against the fp64 reference gradients: causal sliding window +
// prefix-LM + soft-capping + ALiBi + a user score_mod (with its score_mod_grad) and mask_mod at
// once, so that query- and key-block skipping, per-element masking, every score modification and
// the chain factor of dS run in both kernels, both dQ modes, register (RS) and shared-memory (SS)
// dK/dV. Hidden key blocks hold NaN. (On an H100: runtime_cuda_backward_variant_test.)
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

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
#define FLASHJIT_VARIANT_MASK_MOD 1
#define FLASHJIT_VARIANT_SCORE_MOD_GRAD 1
#include "support/emulated_variant.h"
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

// The variant compiled in above (support/emulated_variant.h) and its host expressions.
const ft::VariantCase kVariant = ft::emulated_variant(/*with_mask_mod=*/true);

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool BF16, bool ATOMIC>
void check() {
  ft::check_sm90_variant_backward<flashjit_kernel::Sm90BwdTraits<HEAD_DIM, BLOCK_M, BLOCK_N, WARPS,
                                                                 STAGES, BF16, true, ATOMIC>>(
      kVariant, /*seed=*/23);
}

TEST(CudaBackwardVariantSm90Emulation, MatchesTheFp64Reference) {
  // One warpgroup (RS dK/dV), Atomic; two warpgroups sharing 64 keys (SS dK/dV), -det (the dQ
  // kernel); two warpgroups of 64 keys each, a padded head dim.
  check<64, 64, 64, 4, 2, true, true>();
  check<128, 64, 64, 8, 2, false, false>();
  check<96, 64, 128, 8, 2, true, false>();
}

}  // namespace
}  // namespace flashjit
