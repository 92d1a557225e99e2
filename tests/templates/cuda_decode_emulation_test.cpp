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
#include "support/reference.hpp"
#include "templates/attention_params.h"
// The kernels need their primitives declared before them: params, emulated primitives, rules.
#include "support/cuda_emulator.hpp"
#include "templates/attention_common.h"
#include "templates/cuda/tiles.cuh"
// clang-format off: the order of the templates matters (as the renderer assembles them)
#include "templates/cuda/decode.cuh"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

constexpr size_t kGuardElements = 64;

// The decode launch (render_decode.hpp's contract, as runtime/decode_launch.hpp launches it on a
// GPU): the split counters zeroed (the workspace is NaN besides), then the split kernel, whose
// last split per tile combines. The counters must be zero again after it (a CUDA graph replays the
// launch as it is).
template <class K>
std::string run_decode(const ft::DecodeInputs& d, const AttentionConfig& config, int splits,
                       std::vector<uint16_t>* o_out, std::vector<float>* lse_out) {
  const AttentionProblem& p = d.problem;
  std::vector<uint16_t> o(p.o_span() + kGuardElements, ft::kPoisonBits);
  std::vector<float> lse(p.lse_elements() + kGuardElements, -1.f);
  std::fill(lse.begin(), lse.begin() + p.lse_elements(), std::numeric_limits<float>::quiet_NaN());
  const DecodeLaunch launch = decode_launch(p, config, splits, {K::kThreads, K::kSmemBytes});
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
  ft::clear_globals();
  for (const std::vector<uint16_t>* tensor : {&d.inputs.q, &d.inputs.k, &d.inputs.v})
    ft::register_global(tensor->data(), tensor->size() * sizeof(uint16_t));

  const ft::CudaGrid grid{static_cast<int>(launch.split.grid_x),
                          static_cast<int>(launch.split.grid_y),
                          static_cast<int>(launch.split.grid_z)};
  std::string error = ft::emulate_cuda(grid, K::kThreads, K::kSmemBytes,
                                       [&] { flashjit_kernel::decode_split<K>(params); });
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
  int smem_bytes, threads;  // the template's, compared with the generator's

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

struct Shape {
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  std::vector<int32_t> lengths;  // per sequence; the paged cache's page size is the config's
};

// Small enough to emulate, around every edge: lengths 0, 1, 15..17 (page 16), a page +- 1 of the
// larger pages, GQA 1:1 .. 8:1, MQA, seqlen_q 1 .. 16, chunked prefill (seqlen_q 21 > keys of
// the second sequence: causal rows with no key).
std::vector<Shape> shapes(int page_size) {
  const int page = page_size > 0 ? page_size : 64;
  return {
      {3, 8, 2, 1, page + 1, {1, page - 1, page + 1}},  // GQA 4:1, one query
      {2, 2, 2, 3, 2 * page + 5, {0, 2 * page + 5}},    // MHA, a sequence with no key
      {1, 16, 2, 2, 3 * page, {3 * page - 7}},          // GQA 8:1 x 2 queries = 16 rows
      {1, 4, 1, 16, page + 17, {page + 17}},            // MQA, 16 queries = 64 rows
      {2, 2, 1, 21, 2 * page, {2 * page, 12}},          // chunked prefill
  };
}

class CudaDecodeEmulation : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(CudaDecodeEmulation, MatchesTheFp64Reference) {
  const DecodeCase& c = GetParam();
  uint64_t seed = 7;
  int runs = 0;
  for (const Shape& shape : shapes(c.page_size)) {
    AttentionProblem problem =
        AttentionProblem::make(shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q,
                               shape.seqlen_k, c.head_dim, c.dtype, c.causal);
    const ft::DecodeInputs d = ft::make_decode_inputs(problem, shape.lengths, c.page_size, seed++);
    ASSERT_TRUE(check_decode_config(c.config, d.problem, *known_device("sm90")).ok())
        << check_decode_config(c.config, d.problem, *known_device("sm90")).error().describe();
    // What the generator budgets is what the template takes.
    const DecodeResources budget = decode_resources(c.config, d.problem);
    EXPECT_EQ(budget.smem_bytes, c.smem_bytes) << c.name();
    EXPECT_EQ(budget.threads, c.threads) << c.name();
    const ft::Reference reference = ft::decode_reference(d);
    // 1: the split kernel writes o; 3: three ranges (some empty for short sequences) merged by
    // the last of each tile; auto on an H100 (132 SMs): as many as the keys' blocks allow.
    for (int splits : {1, 3, decode_splits(c.config, d.problem, 132, 2)}) {
      AttentionConfig config = c.config;
      config.splits = splits;
      const int resolved = decode_splits(config, d.problem, 132, 2);
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

INSTANTIATE_TEST_SUITE_P(Configs, CudaDecodeEmulation,
                         ::testing::Values(decode_case<128, 16, 64, 4, 3, true, false, 16>(),
                                           decode_case<128, 16, 64, 4, 2, false, true, 0>(),
                                           decode_case<64, 32, 128, 8, 2, true, true, 32>(),
                                           decode_case<64, 16, 32, 2, 4, false, false, 256>(),
                                           decode_case<72, 32, 64, 4, 3, true, true, 0>(),
                                           decode_case<256, 16, 64, 4, 2, true, false, 16>()),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) {
                           return info.param.name();
                         });

}  // namespace
}  // namespace flashjit
