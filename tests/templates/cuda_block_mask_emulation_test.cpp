// The block map of a mask_mod (issue 31) on the host through the device-primitive emulator
// (tests/support/cuda_emulator.hpp): the builder's kernels (templates/cuda/block_mask.cuh) against
// a host evaluation of the mask on every element (masks that empty whole rows and whole tiles,
// hide nothing, hide everything, differ per head; sizes 1, 17, 1000), and the mma forward
// (templates/cuda/attention_fwd.cuh) reading the map against the fp64 reference. The mask_mod
// compiled in dispatches on support/block_mask_cases.hpp's block_mask_case, so that one
// translation unit runs every mask.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "generator/block_mask.hpp"
#include "generator/problem.hpp"
#include "runtime/launch_params.hpp"
#include "support/attention_cases.hpp"
#include "support/block_mask_cases.hpp"
#include "support/forward_emulation.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "templates/attention_params.h"
// The order matters (as the renderer assembles the source).
// clang-format off
#include "support/cuda_emulator.hpp"
#include "support/block_mask_variant.hpp"
#include "templates/attention_common.h"
#include "templates/cuda/online_softmax.cuh"
#include "templates/cuda/block_mask.cuh"
// (tiles before the kernel)
#include "templates/cuda/tiles.cuh"
#include "templates/cuda/warp_mma.cuh"
// (the kernel last)
#include "templates/cuda/attention_fwd.cuh"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// The compiled-in variant's visibility on the host: causal (bottom-right) and the mask.
bool host_visible(int mask_case, int64_t seqlen_q, int64_t seqlen_k, int64_t b, int64_t h,
                  int64_t i, int64_t j) {
  return j <= i + (seqlen_k - seqlen_q) && ft::block_mask_case_mask(mask_case, b, h, i, j);
}

// Builds the map of `shape` with the emulated builder kernels; "" or the emulator's error.
std::string build(const BlockMaskShape& shape, ft::HostBlockMask* host) {
  *host = ft::host_block_mask(shape);
  FlashjitAttentionParams params{};
  params.batch = static_cast<int>(shape.batch);
  params.heads_q = params.heads_kv = static_cast<int>(shape.heads_q);
  params.group_size = 1;
  params.seqlen_q = static_cast<int>(shape.seqlen_q);
  params.seqlen_k = static_cast<int>(shape.seqlen_k);
  const FlashjitBlockMask map = host->map;
  ft::CudaGrid states;
  states.x = static_cast<int>((shape.k_tiles() + kBlockMaskWarps - 1) / kBlockMaskWarps);
  states.y = static_cast<int>(shape.q_tiles());
  states.z = static_cast<int>(shape.maps());
  std::string error = ft::emulate_cuda(states, kBlockMaskThreads, 0,
                                       [&] { flashjit_kernel::block_mask_states(params, map); });
  if (!error.empty()) return "states: " + error;
  ft::CudaGrid lists;
  lists.x = static_cast<int>(
      (shape.maps() * (shape.q_tiles() + shape.k_tiles()) + kBlockMaskThreads - 1) /
      kBlockMaskThreads);
  error = ft::emulate_cuda(lists, kBlockMaskThreads, 0,
                           [&] { flashjit_kernel::block_mask_lists(map); });
  return error.empty() ? "" : "lists: " + error;
}

TEST(CudaBlockMaskEmulation, TheBuilderMatchesTheHostEvaluation) {
  static_assert(flashjit_kernel::kBlockMaskThreads == kBlockMaskThreads &&
                flashjit_kernel::kBlockMaskWarps == kBlockMaskWarps);
  struct Size {
    int64_t q, k;
  };
  for (int mask_case = 0; mask_case < ft::kMaskCases; ++mask_case)
    for (Size size : {Size{1, 1}, Size{17, 1000}, Size{1000, 17}, Size{1000, 1000}, Size{200, 130}})
      for (auto [block_m, block_n] : {std::pair{64, 64}, std::pair{128, 32}, std::pair{16, 48}}) {
        if (size.q * size.k > 200 * 1000 && block_m != 64) continue;  // keep the test short
        BlockMaskShape shape;
        shape.seqlen_q = size.q;
        shape.seqlen_k = size.k;
        shape.batch = 2;
        shape.heads_q = 3;
        shape.block_m = block_m;
        shape.block_n = block_n;
        shape.per_head = mask_case == ft::kPerHead;
        SCOPED_TRACE(std::string(ft::block_mask_case_name(mask_case)) + " " + shape.to_string());
        ft::block_mask_case = mask_case;
        ft::HostBlockMask built;
        ASSERT_EQ(build(shape, &built), "");
        const std::vector<unsigned char> expected =
            ft::expected_states(shape, [&](int64_t b, int64_t h, int64_t i, int64_t j) {
              return host_visible(mask_case, size.q, size.k, b, h, i, j);
            });
        EXPECT_EQ(ft::compare_block_mask(built, expected), "");
      }
}

// The forward of `shape` with mask case `mask_case` through the emulated mma kernel K reading the
// map the emulated builder made (`corrupt`: every tile of the lists marked full, which must show).
template <class K>
::testing::AssertionResult forward_matches(int mask_case, const ft::Shape& shape, DType dtype,
                                           int head_dim, uint64_t seed, bool corrupt = false) {
  ft::block_mask_case = mask_case;
  AttentionProblem problem = ft::make_problem(shape, head_dim, dtype, /*causal=*/true);
  problem.variant.mask_mod = mask_case == ft::kPerHead ? "head >= 0" : "q_idx >= 0";
  if (!validate(problem).ok()) return ::testing::AssertionFailure() << "invalid problem";
  const BlockMaskShape mask_shape = block_mask_shape(problem, K::kBlockM, K::kBlockN);
  if (mask_shape.per_head != (mask_case == ft::kPerHead))
    return ::testing::AssertionFailure() << "per_head";
  ft::HostBlockMask map;
  if (std::string error = build(mask_shape, &map); !error.empty())
    return ::testing::AssertionFailure() << "builder: " << error;
  if (corrupt) {
    for (int64_t i = 0; i < mask_shape.maps() * mask_shape.q_tiles() * mask_shape.k_tiles(); ++i)
      map.map.q_list[i] |= 1;
  }
  VariantFunctions functions;
  functions.mask_mod = [mask_case](int64_t b, int64_t h, int64_t i, int64_t j) {
    return ft::block_mask_case_mask(mask_case, b, h, i, j);
  };
  HostInputs inputs = ft::random_inputs(problem, seed);
  // Everything hidden: every key NaN, so that a kernel loading any fails.
  if (mask_case == ft::kAllHidden) ft::poison_keys(problem, inputs, 0, problem.seqlen_k);
  std::vector<uint16_t> o;
  std::vector<float> lse;
  const FlashjitBlockMask block_mask = map.map;
  const std::string error = ft::run_guarded_forward(
      problem, inputs,
      [&](const AttentionProblem& p, const ft::HostInputs& in,
          const FlashjitAttentionParams& params) {
        ft::clear_globals();
        for (const std::vector<uint16_t>* tensor : {&in.q, &in.k, &in.v})
          ft::register_global(tensor->data(), tensor->size() * sizeof(uint16_t));
        const auto grid = ft::forward_grid<ft::CudaGrid>(p, K::kBlockM);
        return ft::emulate_cuda(grid, K::kThreads, K::kSmemElements * 2, [&] {
          flashjit_kernel::attention_forward<K>(params, &block_mask);
        });
      },
      &o, &lse);
  if (!error.empty()) return ::testing::AssertionFailure() << "emulator: " << error;
  return ft::matches_reference(
      compare(problem, o, lse, reference_attention(problem, inputs, functions)));
}

template <class K>
void check_forward(DType dtype, int head_dim, uint64_t seed) {
  for (int mask_case = 0; mask_case < ft::kMaskCases; ++mask_case)
    for (const ft::Shape& shape : {ft::Shape{1, 1, 1, 1, 1}, ft::Shape{2, 2, 1, 170, 170},
                                   ft::Shape{1, 2, 2, 17, 230}, ft::Shape{1, 1, 1, 200, 61}}) {
      SCOPED_TRACE(std::string(ft::block_mask_case_name(mask_case)) + " " + shape.to_string());
      EXPECT_TRUE(forward_matches<K>(mask_case, shape, dtype, head_dim, seed++));
    }
}

TEST(CudaBlockMaskEmulation, TheForwardReadingTheMapMatchesTheFp64Reference) {
  check_forward<flashjit_kernel::Traits<64, 64, 32, 4, 2, true, true>>(DType::BF16, 64, 11);
  check_forward<flashjit_kernel::Traits<128, 128, 64, 4, 3, false, true>>(DType::F16, 128, 31);
}

TEST(CudaBlockMaskEmulation, AMapThatCallsPartialTilesFullIsWrong) {
  // Documents of 48 at 64 x 32 tiles: partial tiles across the documents' edges, which the
  // kernel masks only because the map says partial.
  using K = flashjit_kernel::Traits<64, 64, 32, 4, 2, true, true>;
  EXPECT_TRUE(forward_matches<K>(ft::kDocuments48, ft::Shape{1, 1, 1, 170, 170}, DType::BF16, 64, 5,
                                 /*corrupt=*/false));
  EXPECT_FALSE(forward_matches<K>(ft::kDocuments48, ft::Shape{1, 1, 1, 170, 170}, DType::BF16, 64,
                                  5, /*corrupt=*/true));
}

}  // namespace
}  // namespace flashjit
