// The -ws forward (templates/cuda/ws/) reading a mask_mod's block map (issue 31) on the host
// through the sm90 emulator (tests/support/sm90_emulator.hpp) against the fp64 reference: the
// masks of support/block_mask_cases.hpp (whole rows and tiles empty, nothing hidden, everything
// hidden with every key NaN, per head) on ragged shapes, one consumer warpgroup and two taking
// turns in a persistent grid. The map comes from the host evaluation of the mask (the builder's
// own emulation test checks the builder against the same evaluation); a map that calls partial
// tiles full gives wrong results (the kernel masks what the map says).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "generator/block_mask.hpp"
#include "generator/config.hpp"
#include "generator/device.hpp"
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
#include "support/sm90_emulator.hpp"
#include "support/block_mask_variant.hpp"
#include "templates/attention_common.h"
#include "templates/cuda/online_softmax.cuh"
#include "templates/cuda/sm90_tiles.cuh"
#include "templates/cuda/ws/pipeline.cuh"
#include "templates/cuda/ws/traits.cuh"
#include "templates/cuda/ws/tile_scheduler.cuh"
#include "templates/cuda/ws/pingpong.cuh"
#include "templates/cuda/ws/softmax.cuh"
#include "templates/cuda/ws/mainloop.cuh"
#include "templates/cuda/ws/epilogue.cuh"
#include "templates/cuda/ws/attention_fwd_ws.cuh"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

template <class K>
::testing::AssertionResult forward_matches(const AttentionConfig& config, int mask_case,
                                           const ft::Shape& shape, DType dtype, int head_dim,
                                           uint64_t seed, bool corrupt = false) {
  ft::block_mask_case = mask_case;
  AttentionProblem problem = ft::make_problem(shape, head_dim, dtype, /*causal=*/true);
  problem.variant.mask_mod = ft::block_mask_case_expression(mask_case);
  if (!validate(problem).ok()) return ::testing::AssertionFailure() << "invalid problem";
  if (!check_config(config, problem, *known_device("sm90")).ok())
    return ::testing::AssertionFailure() << "not a legal sm90 config: " << config.to_string();
  if (!block_mask_applies(problem, config))
    return ::testing::AssertionFailure() << "the config reads no block map";
  const BlockMaskShape mask_shape = block_mask_shape(problem, K::kBlockM, K::kBlockN);
  ft::HostBlockMask map = ft::host_block_mask(mask_shape);
  const int64_t diagonal = shape.seqlen_k - shape.seqlen_q;
  ft::fill_block_mask(
      map, ft::expected_states(mask_shape, [&](int64_t b, int64_t h, int64_t i, int64_t j) {
        return j <= i + diagonal && ft::block_mask_case_mask(mask_case, b, h, i, j);
      }));
  if (corrupt)
    for (int64_t i = 0; i < mask_shape.maps() * mask_shape.q_tiles() * mask_shape.k_tiles(); ++i)
      map.map.q_list[i] |= 1;
  VariantFunctions functions;
  functions.mask_mod = [mask_case](int64_t b, int64_t h, int64_t i, int64_t j) {
    return ft::block_mask_case_mask(mask_case, b, h, i, j);
  };
  HostInputs inputs = ft::random_inputs(problem, seed);
  if (mask_case == ft::kAllHidden) ft::poison_keys(problem, inputs, 0, problem.seqlen_k);
  std::vector<uint16_t> o;
  std::vector<float> lse;
  const FlashjitBlockMask block_mask = map.map;
  const std::string error = ft::run_guarded_forward(
      problem, inputs,
      [&](const AttentionProblem& p, const ft::HostInputs&,
          const FlashjitAttentionParams& params) -> std::string {
        ft::Sm90Options options;
        options.seed = seed;
        options.launch_registers = K::kLaunchRegisters;
        return ft::emulate_ws_forward(
            p, config, params, K::kThreads, K::kSmemBytes, /*persistent_ctas=*/2,
            [&](const FlashjitForwardTensorMaps& maps) {
              flashjit_kernel::attention_forward_ws<K>(params, maps, &block_mask);
            },
            options);
      },
      &o, &lse);
  if (!error.empty()) return ::testing::AssertionFailure() << "emulator: " << error;
  return ft::matches_reference(
      compare(problem, o, lse, reference_attention(problem, inputs, functions)));
}

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int STAGES, bool BF16, bool PINGPONG,
          bool PERSISTENT>
void check(uint64_t seed) {
  constexpr int kWarps = BLOCK_M / 16 + 4;
  using K = flashjit_kernel::WsTraits<HEAD_DIM, BLOCK_M, BLOCK_N, kWarps, STAGES, BF16, true,
                                      PINGPONG, PERSISTENT>;
  AttentionConfig config{BLOCK_M, BLOCK_N, kWarps, STAGES, KernelFamily::Ws};
  config.pingpong = PINGPONG;
  config.persistent = PERSISTENT;
  for (int mask_case = 0; mask_case < ft::kMaskCases; ++mask_case)
    for (const ft::Shape& shape : {ft::Shape{1, 1, 1, 1, 1}, ft::Shape{2, 2, 1, 170, 170},
                                   ft::Shape{1, 2, 2, 17, 230}, ft::Shape{1, 1, 1, 200, 61}}) {
      SCOPED_TRACE(config.to_string() + " " + ft::block_mask_case_name(mask_case) + " " +
                   shape.to_string());
      EXPECT_TRUE(forward_matches<K>(config, mask_case, shape, BF16 ? DType::BF16 : DType::F16,
                                     HEAD_DIM, seed++));
    }
}

TEST(CudaBlockMaskWsEmulation, TheForwardReadingTheMapMatchesTheFp64Reference) {
  check<64, 64, 64, 2, true, false, false>(41);
  check<128, 128, 128, 3, false, true, true>(61);
}

TEST(CudaBlockMaskWsEmulation, AMapThatCallsPartialTilesFullIsWrong) {
  using K = flashjit_kernel::WsTraits<64, 64, 64, 8, 2, true, true, false, false>;
  const AttentionConfig config{64, 64, 8, 2, KernelFamily::Ws};
  EXPECT_TRUE(forward_matches<K>(config, ft::kDocuments48, ft::Shape{1, 1, 1, 170, 170},
                                 DType::BF16, 64, 5));
  EXPECT_FALSE(forward_matches<K>(config, ft::kDocuments48, ft::Shape{1, 1, 1, 170, 170},
                                  DType::BF16, 64, 5, /*corrupt=*/true));
}

}  // namespace
}  // namespace flashjit
