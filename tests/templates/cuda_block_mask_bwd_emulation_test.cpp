// The mma backward (templates/cuda/attention_bwd.cuh) reading a mask_mod's block map (issue 31)
// on the host through the device-primitive emulator against the fp64 reference gradients: the
// dK/dV kernel walks each key tile's non-empty query tiles (the transposed lists, head after head
// of a GQA group, one map or a map per head), the dQ kernel (-det) each query tile's key tiles,
// full tiles unmasked; the masks of support/block_mask_cases.hpp (whole rows and tiles empty,
// nothing hidden, everything hidden with every key NaN, per head). The map comes from the host
// evaluation of the mask (cuda_block_mask_emulation_test checks the builder against it); a map
// that calls partial tiles full gives wrong gradients.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "generator/block_mask.hpp"
#include "generator/problem.hpp"
#include "support/attention_cases.hpp"
#include "support/block_mask_cases.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "templates/attention_params.h"
// The order matters (as the renderer assembles the source).
// clang-format off
#include "support/cuda_emulator.hpp"
#include "support/block_mask_variant.hpp"
#include "templates/attention_common.h"
#include "templates/cuda/tiles.cuh"
#include "templates/cuda/attention_bwd.cuh"
#include "templates/cuda/attention_bwd_common.cuh"
#include "support/cuda_backward_emulation.hpp"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

template <class K>
::testing::AssertionResult gradients_match(int mask_case, const ft::Shape& shape, DType dtype,
                                           int head_dim, uint64_t seed, bool corrupt = false) {
  const AttentionConfig config{K::kBlockM,        K::kBlockN,
                               K::kWarps,         K::kStages,
                               KernelFamily::Mma, K::kDqAtomic ? DqMode::Atomic : DqMode::Separate};
  ft::block_mask_case = mask_case;
  AttentionProblem problem =
      ft::make_problem(shape, head_dim, dtype, /*causal=*/true, Pass::Backward);
  problem.variant.mask_mod = ft::block_mask_case_expression(mask_case);
  if (!validate(problem).ok()) return ::testing::AssertionFailure() << "invalid problem";
  if (!block_mask_applies(problem, config))
    return ::testing::AssertionFailure() << "the config reads no block map";
  const BlockMaskShape mask_shape = block_mask_shape(problem, K::kBlockM, K::kBlockN);
  ft::HostBlockMask map = ft::host_block_mask(mask_shape);
  const int64_t diagonal = shape.seqlen_k - shape.seqlen_q;
  ft::fill_block_mask(
      map, ft::expected_states(mask_shape, [&](int64_t b, int64_t h, int64_t i, int64_t j) {
        return j <= i + diagonal && ft::block_mask_case_mask(mask_case, b, h, i, j);
      }));
  if (corrupt) {  // every tile of both lists called full
    for (int64_t i = 0; i < mask_shape.maps() * mask_shape.q_tiles() * mask_shape.k_tiles(); ++i) {
      map.map.q_list[i] |= 1;
      map.map.k_list[i] |= 1;
    }
  }
  VariantFunctions functions;
  functions.mask_mod = [mask_case](int64_t b, int64_t h, int64_t i, int64_t j) {
    return ft::block_mask_case_mask(mask_case, b, h, i, j);
  };
  HostInputs inputs = ft::random_inputs(problem, seed, functions);
  if (mask_case == ft::kAllHidden) ft::poison_keys(problem, inputs, 0, problem.seqlen_k);
  ft::Gradients gradients;
  if (std::string error = ft::run_backward<K>(problem, config, inputs, &gradients, &map.map);
      !error.empty())
    return ::testing::AssertionFailure() << "emulator: " << error;
  const GradientComparison comparison =
      compare_gradients(problem, gradients.dq, gradients.dk, gradients.dv,
                        reference_attention(problem, inputs, functions));
  if (within_tolerance(comparison, gradient_tolerance(dtype))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << comparison.to_string();
}

template <class K>
void check(DType dtype, int head_dim, uint64_t seed) {
  for (int mask_case = 0; mask_case < ft::kMaskCases; ++mask_case)
    for (const ft::Shape& shape : {ft::Shape{1, 1, 1, 1, 1}, ft::Shape{1, 4, 2, 150, 150},
                                   ft::Shape{1, 2, 2, 17, 200}, ft::Shape{1, 2, 1, 170, 61}}) {
      SCOPED_TRACE(std::string(ft::block_mask_case_name(mask_case)) + " " + shape.to_string() +
                   (K::kDqAtomic ? " atomic dQ" : " separate dQ"));
      EXPECT_TRUE(gradients_match<K>(mask_case, shape, dtype, head_dim, seed++));
    }
}

TEST(CudaBlockMaskBwdEmulation, TheGradientsReadingTheMapMatchTheFp64Reference) {
  // Atomic dQ at 64 x 64; -det (the dQ kernel) at 64 x 32 with one buffer.
  check<flashjit_kernel::BwdTraits<64, 64, 64, 4, 2, true, true, true>>(DType::BF16, 64, 3);
  check<flashjit_kernel::BwdTraits<64, 64, 32, 4, 1, false, true, false>>(DType::F16, 64, 19);
}

TEST(CudaBlockMaskBwdEmulation, AMapThatCallsPartialTilesFullIsWrong) {
  using K = flashjit_kernel::BwdTraits<64, 64, 32, 4, 1, false, true, false>;
  EXPECT_TRUE(
      gradients_match<K>(ft::kDocuments48, ft::Shape{1, 1, 1, 170, 170}, DType::F16, 64, 5));
  EXPECT_FALSE(gradients_match<K>(ft::kDocuments48, ft::Shape{1, 1, 1, 170, 170}, DType::F16, 64, 5,
                                  /*corrupt=*/true));
}

}  // namespace
}  // namespace flashjit
