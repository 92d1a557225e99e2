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
#include "support/reference.hpp"
#include "templates/attention_params.h"
// The kernel needs, in this order: params (above), the emulated primitives, the common rules, the
// tiles.
// clang-format off
#include "support/hip_emulator.hpp"
#include "templates/attention_common.h"
#include "templates/hip/tiles.hpp"
#include "templates/hip/decode.hpp"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

constexpr size_t kGuardElements = 64;

// The decode launch (render_decode.hpp's contract, as runtime/decode_launch.hpp launches it): the
// split counters zeroed (the rest of the workspace is NaN), then the split kernel, whose last
// split per tile combines; the counters must be zero again after it.
template <class K>
std::string run_decode(const ft::DecodeInputs& d, const AttentionConfig& config, int splits,
                       std::vector<uint16_t>* o_out, std::vector<float>* lse_out) {
  const AttentionProblem& p = d.problem;
  std::vector<uint16_t> o(p.o_span() + kGuardElements, ft::kPoisonBits);
  std::vector<float> lse(p.lse_elements() + kGuardElements, -1.f);
  std::fill(lse.begin(), lse.begin() + p.lse_elements(), std::numeric_limits<float>::quiet_NaN());
  const DecodeLaunch launch = decode_launch(p, config, splits, {K::kThreads, K::kLdsBytes});
  std::vector<float> workspace(launch.workspace.bytes / sizeof(float) + 64,
                               std::numeric_limits<float>::quiet_NaN());
  AttentionArgs args{d.inputs.q.data(), d.inputs.k.data(), d.inputs.v.data(), o.data(), lse.data()};
  args.block_table = p.kv.paged() ? d.inputs.block_table.data() : nullptr;
  args.seqlens_k = p.kv.seqlens_k ? d.inputs.seqlens_k.data() : nullptr;
  FlashjitAttentionParams params = make_launch_params(p, args);
  auto* base = reinterpret_cast<unsigned char*>(workspace.data());
  base += (256 - reinterpret_cast<uintptr_t>(base) % 256) % 256;
  bind_decode(params, p, args, launch.workspace, base);
  int32_t* counters = reinterpret_cast<int32_t*>(base + launch.workspace.counters_offset);
  const size_t counter_count = launch.workspace.counter_bytes / sizeof(int32_t);
  if (splits > 1 && reinterpret_cast<const unsigned char*>(counters) !=
                        reinterpret_cast<const unsigned char*>(params.partial_lse +
                                                               splits * launch.workspace.rows))
    return "the counters are not where the kernel looks for them";
  std::fill(counters, counters + counter_count, 0);

  ft::HipGrid grid;
  grid.x = static_cast<int>(launch.split.grid_x);
  grid.y = static_cast<int>(launch.split.grid_y);
  grid.z = static_cast<int>(launch.split.grid_z);
  std::string error = ft::emulate_hip(grid, K::kThreads, K::kLdsBytes,
                                      [&] { flashjit_hip::decode_split<K>(params); });
  if (!error.empty()) return "split kernel: " + error;
  for (size_t i = 0; i < counter_count; ++i)
    if (counters[i] != 0)
      return "split counter " + std::to_string(i) + " left at " + std::to_string(counters[i]);
  for (size_t i = p.o_span(); i < o.size(); ++i)
    if (o[i] != ft::kPoisonBits) return "o written past its span";
  for (size_t i = p.lse_elements(); i < lse.size(); ++i)
    if (lse[i] != -1.f) return "lse written past its end";
  o_out->assign(o.begin(), o.begin() + p.o_span());
  lse_out->assign(lse.begin(), lse.begin() + p.lse_elements());
  return "";
}

using DecodeFn = std::string (*)(const ft::DecodeInputs&, const AttentionConfig&, int,
                                 std::vector<uint16_t>*, std::vector<float>*);

struct DecodeCase {
  int head_dim;
  AttentionConfig config;
  DType dtype;
  bool causal;
  int page_size;
  DecodeFn run;
  int lds_bytes, threads;  // the template's, compared with the generator's

  std::string name() const {
    std::string text = "d";
    text += std::to_string(head_dim);
    text += "_";
    text += config.to_string();
    text += "_";
    text += to_string(dtype);
    text += causal ? "_causal" : "_noncausal";
    text += page_size > 0 ? "_paged" + std::to_string(page_size) : std::string("_contiguous");
    for (char& ch : text)
      if (ch == '-') ch = '_';  // gtest names: letters, digits and underscores
    return text;
  }
};

void PrintTo(const DecodeCase& c, std::ostream* out) { *out << c.name(); }

template <int D, int BM, int BN, int W, int S, bool BF16, bool CAUSAL, int PAGE>
DecodeCase decode_case() {
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

class HipDecodeEmulation : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(HipDecodeEmulation, MatchesTheFp64Reference) {
  const DecodeCase& c = GetParam();
  const DeviceSpec device = *known_device("gfx90a");
  uint64_t seed = 11;
  int runs = 0;
  for (const ft::DecodeShape& shape : ft::decode_shapes(c.page_size)) {
    AttentionProblem problem =
        AttentionProblem::make(shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q,
                               shape.seqlen_k, c.head_dim, c.dtype, c.causal);
    const ft::DecodeInputs d = ft::make_decode_inputs(problem, shape.lengths, c.page_size, seed++);
    const Status legal = check_hip_decode_config(c.config, d.problem, device);
    ASSERT_TRUE(legal.ok()) << legal.error().describe();
    // What the generator budgets is what the template takes.
    EXPECT_EQ(hip_decode_lds_bytes(c.config, d.problem), c.lds_bytes) << c.name();
    EXPECT_EQ(c.config.warps * 64, c.threads) << c.name();
    const ft::Reference reference = ft::decode_reference(d);
    // 1: the split kernel writes o; 3: three ranges (some empty for short sequences) merged by
    // the last of each tile; auto on gfx90a: as many as the keys' blocks allow.
    for (int splits : {1, 3, hip_decode_splits(c.config, d.problem, device)}) {
      AttentionConfig config = c.config;
      config.splits = splits;
      const int resolved = hip_decode_splits(config, d.problem, device);
      std::vector<uint16_t> o;
      std::vector<float> lse;
      const std::string label =
          c.name() + " b" + std::to_string(shape.batch) + " hq" + std::to_string(shape.heads_q) +
          " hkv" + std::to_string(shape.heads_kv) + " sq" + std::to_string(shape.seqlen_q) +
          " splits " + std::to_string(resolved);
      const std::string error = c.run(d, config, resolved, &o, &lse);
      ASSERT_EQ(error, "") << label;
      EXPECT_TRUE(ft::matches_reference(ft::compare(d.problem, o, lse, reference))) << label;
      ++runs;
    }
  }
  EXPECT_EQ(runs, 15);
}

INSTANTIATE_TEST_SUITE_P(Configs, HipDecodeEmulation,
                         ::testing::Values(decode_case<128, 16, 64, 4, 1, true, false, 16>(),
                                           decode_case<128, 16, 32, 2, 2, false, true, 0>(),
                                           decode_case<64, 32, 128, 4, 1, true, true, 32>(),
                                           decode_case<64, 16, 32, 1, 2, false, false, 256>(),
                                           decode_case<72, 32, 64, 2, 1, true, true, 0>(),
                                           decode_case<256, 16, 32, 2, 1, true, false, 16>(),
                                           decode_case<64, 16, 64, 4, 2, false, true, 0>()),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) {
                           return info.param.name();
                         });

}  // namespace
}  // namespace flashjit
