// The CUDA decode template (templates/cuda/decode.cuh: the split kernel and its fused combine, GQA
// packing, paged or contiguous K/V) run on the host through the CUDA emulation
// (tests/support/cuda_emulator.hpp) against the fp64 reference, on configs chosen to cover every
// code path: block_m 16 and 32, 2/4/8 warps (their merge), 2-4 stages, block_n 32..128, bf16 and
// fp16, causal or not, contiguous and paged (16, 32, 256 keys per page), a padded head dim (72)
// and d 256; splits 1 (direct write), 3 and auto (the combine, empty splits), lengths 0, 1,
// page_size +- 1, GQA 1:1 to 8:1, seqlen_q 1 to 16 and a chunked prefill. Every key and page the
// kernel must not read is NaN (tests/support/decode_cases.hpp), outputs are poisoned and guarded.
// No GPU needed: runs in CI.
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
// The kernels need their primitives declared before them: params, emulated primitives, rules.
#include "support/cuda_emulator.hpp"
#include "templates/attention_common.h"
#include "templates/decode_split.h"
#include "templates/cuda/online_softmax.cuh"
#include "templates/cuda/tiles.cuh"
#include "templates/cuda/warp_mma.cuh"
// clang-format off: the order of the templates matters (as the renderer assembles them)
#include "templates/cuda/decode.cuh"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// The decode launch (render_decode.hpp's contract, as runtime/decode_launch.hpp launches it on a
// GPU): the split counters zeroed (the workspace is NaN besides), then the split kernel, whose
// last split per tile combines. The counters must be zero again after it (a CUDA graph replays the
// launch as it is).
template <class K>
std::string run_decode(const ft::DecodeInputs& d, const AttentionConfig& config, int splits,
                       std::vector<uint16_t>* o_out, std::vector<float>* lse_out) {
  ft::EmulatedDecode call(d, config, splits, {K::kThreads, K::kSmemBytes});
  if (std::string error = call.layout_error(splits); !error.empty()) return error;
  ft::clear_globals();
  for (const std::vector<uint16_t>* tensor : {&d.inputs.q, &d.inputs.k, &d.inputs.v})
    ft::register_global(tensor->data(), tensor->size() * sizeof(uint16_t));
  const ft::CudaGrid grid{static_cast<int>(call.launch.split.grid_x),
                          static_cast<int>(call.launch.split.grid_y),
                          static_cast<int>(call.launch.split.grid_z)};
  const std::string error = ft::emulate_cuda(
      grid, K::kThreads, K::kSmemBytes, [&] { flashjit_kernel::decode_split<K>(call.params); });
  if (!error.empty()) return "split kernel: " + error;
  return call.finish(d.problem, o_out, lse_out);
}

template <int D, int BM, int BN, int W, int S, bool BF16, bool CAUSAL, int PAGE>
ft::DecodeEmulationCase decode_case() {
  typedef flashjit_kernel::DecodeTraits<D, BM, BN, W, S, BF16, CAUSAL, PAGE> K;
  return {D,
          {BM, BN, W, S, KernelFamily::Decode},
          BF16 ? DType::BF16 : DType::F16,
          CAUSAL,
          PAGE,
          &run_decode<K>,
          K::kSmemBytes,
          K::kThreads};
}

class CudaDecodeEmulation : public ::testing::TestWithParam<ft::DecodeEmulationCase> {};

TEST_P(CudaDecodeEmulation, MatchesTheFp64Reference) {
  ft::DecodeEmulationBackend cuda;
  cuda.check_budget = [](const ft::DecodeEmulationCase& c, const AttentionProblem& p) {
    const Status legal = check_decode_config(c.config, p, *known_device("sm90"));
    ASSERT_TRUE(legal.ok()) << legal.error().describe();
    // What the generator budgets is what the template takes.
    const DecodeResources budget = decode_resources(c.config, p);
    EXPECT_EQ(budget.smem_bytes, c.shared_bytes) << c.name();
    EXPECT_EQ(budget.threads, c.threads) << c.name();
  };
  // Auto on an H100: 132 SMs, 2 CTAs per SM at most.
  cuda.resolve_splits = [](const AttentionConfig& c, const AttentionProblem& p) {
    return decode_splits(c, p, 132, 2);
  };
  ft::check_decode_emulation(GetParam(), cuda, 7);
}

INSTANTIATE_TEST_SUITE_P(Configs, CudaDecodeEmulation,
                         ::testing::Values(decode_case<128, 16, 64, 4, 3, true, false, 16>(),
                                           decode_case<128, 16, 64, 4, 2, false, true, 0>(),
                                           decode_case<64, 32, 128, 8, 2, true, true, 32>(),
                                           decode_case<64, 16, 32, 2, 4, false, false, 256>(),
                                           decode_case<72, 32, 64, 4, 3, true, true, 0>(),
                                           decode_case<256, 16, 64, 4, 2, true, false, 16>()),
                         [](const ::testing::TestParamInfo<ft::DecodeEmulationCase>& info) {
                           return info.param.name();
                         });

}  // namespace
}  // namespace flashjit
