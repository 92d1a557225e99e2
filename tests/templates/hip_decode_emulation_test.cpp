// The HIP decode template (templates/hip/decode.hpp: the split kernel and its fused combine, GQA
// packing, paged or contiguous K/V) run on the host through the HIP emulation
// (tests/support/hip_emulator.hpp) against the fp64 reference, on configs chosen to cover every
// code path: block_m 16 and 32, 1/2/4 waves (their merge), 1 and 2 LDS stages, block_n 32..128,
// bf16 and fp16, causal or not, contiguous and paged (16, 32, 256 keys per page), a padded head
// dim (72) and d 256; splits 1 (direct write), 3 and auto (the combine, empty splits), and the
// shapes of tests/support/decode_cases.hpp (lengths 0, 1, page_size +- 1, GQA 1:1 to 8:1,
// seqlen_q 1 to 16, a chunked prefill). Every key and page the kernel must not read is NaN,
// outputs are poisoned and guarded, and the split counters must be zero after the launch. No AMD
// GPU needed: runs in CI; what the emulation cannot show is in hip_emulator.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "generator/decode_config.hpp"
#include "generator/device.hpp"
#include "generator/problem.hpp"
#include "runtime/decode_launch.hpp"
#include "support/decode_cases.hpp"
#include "support/decode_emulation.hpp"
#include "support/reference.hpp"
#include "templates/attention_params.h"
// The kernel needs, in this order: params (above), the emulated primitives, the common rules, the
// tiles.
// clang-format off
#include "support/hip_emulator.hpp"
#include "templates/attention_common.h"
#include "templates/decode_split.h"
#include "templates/hip/tiles.hpp"
#include "templates/hip/decode.hpp"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// The decode launch (render_decode.hpp's contract, as runtime/decode_launch.hpp launches it): the
// split counters zeroed (the rest of the workspace is NaN), then the split kernel, whose last
// split per tile combines; the counters must be zero again after it.
template <class K>
std::string run_decode(const ft::DecodeInputs& d, const AttentionConfig& config, int splits,
                       std::vector<uint16_t>* o_out, std::vector<float>* lse_out) {
  ft::EmulatedDecode call(d, config, splits, {K::kThreads, K::kLdsBytes});
  if (std::string error = call.layout_error(splits); !error.empty()) return error;
  ft::HipGrid grid;
  grid.x = static_cast<int>(call.launch.split.grid_x);
  grid.y = static_cast<int>(call.launch.split.grid_y);
  grid.z = static_cast<int>(call.launch.split.grid_z);
  const std::string error = ft::emulate_hip(grid, K::kThreads, K::kLdsBytes,
                                            [&] { flashjit_hip::decode_split<K>(call.params); });
  if (!error.empty()) return "split kernel: " + error;
  return call.finish(d.problem, o_out, lse_out);
}

template <int D, int BM, int BN, int W, int S, bool BF16, bool CAUSAL, int PAGE>
ft::DecodeEmulationCase decode_case() {
  typedef flashjit_hip::DecodeTraits<D, BM, BN, W, S, BF16, CAUSAL, PAGE> K;
  return {D,
          {BM, BN, W, S, KernelFamily::Decode},
          BF16 ? DType::BF16 : DType::F16,
          CAUSAL,
          PAGE,
          &run_decode<K>,
          K::kLdsBytes,
          K::kThreads};
}

class HipDecodeEmulation : public ::testing::TestWithParam<ft::DecodeEmulationCase> {};

TEST_P(HipDecodeEmulation, MatchesTheFp64Reference) {
  const DeviceSpec device = *known_device("gfx90a");
  ft::DecodeEmulationBackend hip;
  hip.check_budget = [&](const ft::DecodeEmulationCase& c, const AttentionProblem& p) {
    const Status legal = check_hip_decode_config(c.config, p, device);
    ASSERT_TRUE(legal.ok()) << legal.error().describe();
    // What the generator budgets is what the template takes.
    EXPECT_EQ(hip_decode_lds_bytes(c.config, p), c.shared_bytes) << c.name();
    EXPECT_EQ(c.config.warps * 64, c.threads) << c.name();
  };
  // Auto on gfx90a: as many as the keys' blocks allow.
  hip.resolve_splits = [&](const AttentionConfig& c, const AttentionProblem& p) {
    return hip_decode_splits(c, p, device);
  };
  ft::check_decode_emulation(GetParam(), hip, 11);
}

INSTANTIATE_TEST_SUITE_P(Configs, HipDecodeEmulation,
                         ::testing::Values(decode_case<128, 16, 64, 4, 1, true, false, 16>(),
                                           decode_case<128, 16, 32, 2, 2, false, true, 0>(),
                                           decode_case<64, 32, 128, 4, 1, true, true, 32>(),
                                           decode_case<64, 16, 32, 1, 2, false, false, 256>(),
                                           decode_case<72, 32, 64, 2, 1, true, true, 0>(),
                                           decode_case<256, 16, 32, 2, 1, true, false, 16>(),
                                           decode_case<64, 16, 64, 4, 2, false, true, 0>()),
                         [](const ::testing::TestParamInfo<ft::DecodeEmulationCase>& info) {
                           return info.param.name();
                         });

}  // namespace
}  // namespace flashjit
