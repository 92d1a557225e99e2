// The CUDA mma backward template (templates/cuda/attention_bwd.cuh) with an attention variant
// (templates/attention_variant.h) run on the host through the device-primitive emulator
// (tests/support/cuda_emulator.hpp) against the fp64 reference gradients: causal sliding window +
// prefix-LM + soft-capping + ALiBi + a user score_mod (with its score_mod_grad) + a user mask_mod
// at once, so that query- and key-block skipping, per-element masking, every score modification
// and the chain factor of dS run, in both dQ modes. Hidden key blocks hold NaN: a kernel that
// uses one fails. The variant is compiled in (one per translation unit): the defines are what
// the generator renders for emulated_variant() in a backward problem, which the first test checks.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "generator/variant.hpp"
#include "support/attention_cases.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "support/variant_emulation.hpp"
#include "templates/attention_params.h"
// clang-format off: the order matters (as the renderer assembles the source)
#include "support/cuda_emulator.hpp"
#define FLASHJIT_VARIANT_MASK_MOD 1
#define FLASHJIT_VARIANT_SCORE_MOD_GRAD 1
#include "support/emulated_variant.h"
#include "templates/attention_common.h"
// (tiles before the kernels)
#include "templates/cuda/tiles.cuh"
// (the kernels last)
#include "templates/cuda/attention_bwd.cuh"
#include "templates/cuda/attention_bwd_common.cuh"
// clang-format on
#include "support/cuda_backward_emulation.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// The variant compiled in above (support/emulated_variant.h) and its host expressions.
const ft::VariantCase kVariant = ft::emulated_variant(/*with_mask_mod=*/true);

TEST(CudaBackwardVariantEmulation, TheDefinesAreWhatTheGeneratorRenders) {
  AttentionProblem p =
      AttentionProblem::make(1, 1, 1, 16, 16, 64, DType::BF16, true).with_pass(Pass::Backward);
  p.variant = kVariant.variant;
  const std::string prelude = render_variant_prelude(p).value();
  for (const std::string& line : ft::emulated_backward_prelude_lines())
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
}

template <class K>
void check(DType dtype, int head_dim) {
  const AttentionConfig config{K::kBlockM,        K::kBlockN,
                               K::kWarps,         K::kStages,
                               KernelFamily::Mma, K::kDqAtomic ? DqMode::Atomic : DqMode::Separate};
  SCOPED_TRACE(config.to_string());
  ft::check_variant_backward_emulation(
      kVariant, dtype, head_dim, K::kBlockN, /*seed=*/11,
      [&](const AttentionProblem& problem, const ft::HostInputs& inputs, ft::Gradients* out) {
        return ft::run_backward<K>(problem, config, inputs, out);
      });
}

TEST(CudaBackwardVariantEmulation, MatchesTheFp64Reference) {
  // Atomic dQ, 32-row warp blocks; -det with 4 warps, one buffer, block_n 32; a padded head dim.
  check<flashjit_kernel::BwdTraits<64, 64, 64, 4, 2, true, true, true>>(DType::BF16, 64);
  check<flashjit_kernel::BwdTraits<64, 32, 32, 4, 1, false, true, false>>(DType::F16, 64);
  check<flashjit_kernel::BwdTraits<72, 64, 128, 8, 2, true, true, false>>(DType::BF16, 72);
}

}  // namespace
}  // namespace flashjit
