// The warp-specialized forward (templates/cuda/ws/, configs "-ws") on packed variable-length
// documents run on the host through the sm_90a emulator (tests/support/sm90_emulator.hpp: TMA
// loads landing when the scheduler chooses, mbarrier phases, wgmma with late execution) against
// the fp64 reference per document (ft::check_varlen_emulation's cases: documents of 1, 17, ~100
// rows, one of 300 among short ones, empty ones, seqlen_q != seqlen_k both ways, GQA 2:2 and 4:1,
// causal with a sliding window, poisoned o, NaN spare keys past the last document; built a second
// time with FLASHJIT_EMULATED_VARLEN_NON_CAUSAL=1: non-causal, no window, the test names prefixed
// "NonCausal."). What is new on this family: the
// tensor maps span the packed tensors (runtime/tensor_map_spec.hpp), so a tile's TMA boxes read
// rows of the next document (or the NaN spare rows): the masks and the zeroed V rows
// (ws_zero_rows_from) must keep them out, and the epilogue's stores must stop at the document's
// last row (ws_store_rows); the tile schedulers skip tiles past their document's queries. The
// variant compiled in is support/emulated_varlen.h (the first test checks its defines against
// the generator's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/problem.hpp"
#include "generator/variant.hpp"
#include "runtime/launch_params.hpp"
#include "runtime/tensor_map_spec.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
// The order matters (as the renderer assembles the source):
// clang-format off
#include "templates/attention_params.h"
// (the emulated primitives before the templates)
#include "support/sm90_emulator.hpp"
#include "support/emulated_varlen.h"
#include "templates/cuda/online_softmax.cuh"
// (tiles, then the -ws pieces in the renderer's order)
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

constexpr bool kCausal = FLASHJIT_VARIANT_CAUSAL != 0;

TEST(CudaVarlenWsEmulation, TheDefinesAreWhatTheGeneratorRenders) {
  const AttentionProblem p = ft::varlen_emulation_problem(DType::BF16, 64, kCausal);
  const std::string prelude = render_variant_prelude(p).value();
  for (const char* line :
       {kCausal ? "#define FLASHJIT_VARIANT_CAUSAL 1\n" : "#define FLASHJIT_VARIANT_CAUSAL 0\n",
        kCausal ? "#define FLASHJIT_VARIANT_WINDOW_LEFT (30)\n"
                : "#define FLASHJIT_VARIANT_WINDOW_LEFT (-1)\n",
        "#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)\n", "#define FLASHJIT_VARIANT_PREFIX 0\n",
        "#define FLASHJIT_VARIANT_ALIBI 0\n", "#define FLASHJIT_VARIANT_SCORE_MOD 0\n",
        "#define FLASHJIT_VARIANT_MASK_MOD 0\n", "#define FLASHJIT_VARIANT_VARLEN 1\n"})
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
  EXPECT_EQ(prelude.find("\n#define FLASHJIT_VARIANT_SOFTCAP"), std::string::npos);
}

// The grid of a persistent config in the emulation (the device's is one CTA per SM slot): fewer
// CTAs than tiles, so that each walks several and skips some.
constexpr int kPersistentCtas = 3;

// One config: WsTraits<HEAD_DIM, BLOCK_M, BLOCK_N, WARPS, STAGES, BF16, kCausal, PP, PERSIST>,
// run on every case under two emulator schedules (loads landing late / early with late wgmma
// waits).
template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int STAGES, bool BF16, bool PINGPONG,
          bool PERSISTENT>
void check() {
  constexpr int kWarps = BLOCK_M / 16 + 4;
  using K = flashjit_kernel::WsTraits<HEAD_DIM, BLOCK_M, BLOCK_N, kWarps, STAGES, BF16, kCausal,
                                      PINGPONG, PERSISTENT>;
  AttentionConfig config{BLOCK_M, BLOCK_N, kWarps, STAGES, KernelFamily::Ws};
  config.pingpong = PINGPONG;
  config.persistent = PERSISTENT;
  SCOPED_TRACE(config.to_string());
  const DType dtype = BF16 ? DType::BF16 : DType::F16;
  for (bool early : {false, true}) {
    SCOPED_TRACE(early ? "loads early, wgmma waits late" : "loads late");
    uint64_t seed = 41;
    ft::check_varlen_emulation(
        dtype, HEAD_DIM,
        [&](const AttentionProblem& problem, const ft::HostInputs& inputs, std::vector<uint16_t>* o,
            std::vector<float>* lse) -> std::string {
          const Status legal = check_config(config, problem, *known_device("sm90"));
          if (!legal.ok()) return legal.error().describe();
          AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), o->data(),
                             lse->data()};
          args.cu_seqlens_q = inputs.cu_seqlens_q.data();
          args.cu_seqlens_k = inputs.cu_seqlens_k.data();
          const FlashjitAttentionParams params = make_launch_params(problem, args);
          ft::Sm90Options options;
          options.seed = seed++;
          options.early_landing = early;
          options.late_wgmma = early;
          options.launch_registers = K::kLaunchRegisters;
          return ft::emulate_ws_forward(
              problem, config, params, K::kThreads, K::kSmemBytes, kPersistentCtas,
              [&](const FlashjitForwardTensorMaps& maps) {
                flashjit_kernel::attention_forward_ws<K>(params, maps);
              },
              options);
        },
        kCausal);
  }
}

// The tensor maps of packed documents span the packed tensors: one batch entry of total_q (q, o)
// and total_k (k, v) rows with the seq and head strides, the boxes of the config; a plain
// problem's keep seqlen x heads x batch.
TEST(CudaVarlenWsEmulation, TheTensorMapsSpanThePackedTensors) {
  const AttentionConfig config = AttentionConfig::parse("m128n64w12s2-ws").value();
  AttentionProblem varlen =
      AttentionProblem::make_varlen(3, 8, 2, 1000, 900, 1500, 1201, 128, DType::BF16, kCausal);
  alignas(16) static const uint16_t storage[8] = {};
  AttentionArgs args{storage, storage, storage, const_cast<uint16_t*>(storage), nullptr};
  const int32_t cu[4] = {0, 0, 0, 0};
  args.cu_seqlens_q = args.cu_seqlens_k = cu;
  Result<ForwardTensorMapSpecs> specs =
      forward_tensor_map_specs(make_launch_params(varlen, args), varlen, config);
  ASSERT_TRUE(specs.ok()) << specs.error().describe();
  struct Expected {
    const TensorMapSpec& spec;
    uint64_t rows, heads, box_rows;
  };
  for (const Expected& e : {Expected{specs->q, 1500, 8, 128}, Expected{specs->k, 1201, 2, 64},
                            Expected{specs->v, 1201, 2, 64}, Expected{specs->o, 1500, 8, 64}}) {
    SCOPED_TRACE(e.spec.tensor);
    EXPECT_EQ(e.spec.dims[0], 128u);
    EXPECT_EQ(e.spec.dims[1], e.rows);
    EXPECT_EQ(e.spec.dims[2], e.heads);
    EXPECT_EQ(e.spec.dims[3], 1u);
    EXPECT_EQ(e.spec.strides_bytes[0], e.heads * 128 * 2);  // (total, heads, d) contiguous
    EXPECT_EQ(e.spec.strides_bytes[1], 128u * 2);
    EXPECT_EQ(e.spec.box[1], e.box_rows);
  }
  const AttentionProblem plain = AttentionProblem::make(3, 8, 2, 1000, 900, 128, DType::BF16, true);
  specs = forward_tensor_map_specs(make_launch_params(plain, args), plain, config);
  ASSERT_TRUE(specs.ok()) << specs.error().describe();
  EXPECT_EQ(specs->q.dims[1], 1000u);
  EXPECT_EQ(specs->q.dims[3], 3u);
  EXPECT_EQ(specs->k.dims[1], 900u);
  EXPECT_EQ(specs->k.dims[3], 3u);
}

// WsVariantTileScheduler on packed documents, both schedules: every (query block, head,
// document) tile that starts inside its document is handed out exactly once over the grid,
// placed at its document's first rows (q_row, k_row; map_batch 0); none past its document's end;
// the producer thread and a consumer thread of a CTA walk the same tiles. Persistent: the CTAs'
// tile counts differ by at most one (the list holds no tile past a document's end) and, causal,
// each CTA's query blocks come heaviest (last) first.
TEST(CudaVarlenWsEmulation, TheSchedulersHandOutEachTileInsideItsDocumentOnce) {
  constexpr int kBlockM = 64, kHeads = 2;
  const std::vector<int> cu_q = {0, 5, 5, 305, 338, 400}, cu_k = {0, 7, 9, 300, 301, 333};
  const int docs = static_cast<int>(cu_q.size()) - 1, m_blocks = (300 + kBlockM - 1) / kBlockM;
  FlashjitAttentionParams params{};
  params.batch = docs;
  params.heads_q = kHeads;
  params.seqlen_q = 300;
  params.cu_seqlens_q = cu_q.data();
  params.cu_seqlens_k = cu_k.data();
  using Tiles = std::multiset<std::tuple<int, int, int>>;  // (m_block, head, document)
  Tiles expected;
  for (int doc = 0; doc < docs; ++doc)
    for (int m = 0; m * kBlockM < cu_q[doc + 1] - cu_q[doc]; ++m)
      for (int h = 0; h < kHeads; ++h) expected.insert({m, h, doc});
  auto walk = [&](auto scheduler, ft::Sm90Grid grid, bool persistent) {
    using Scheduler = typename decltype(scheduler)::type;
    // Per CTA and thread (0: the producer, 128: a consumer), the tiles in order.
    std::map<std::pair<int, int>, std::vector<flashjit_kernel::WsTile>> walked;
    const std::string error = ft::emulate_sm90(grid, 256, 1024, [&] {
      Scheduler tiles(params, kBlockM);
      const int thread = static_cast<int>(threadIdx.x);
      const int cta = static_cast<int>(blockIdx.x + grid.x * (blockIdx.y + grid.y * blockIdx.z));
      for (flashjit_kernel::WsTile t; tiles.next(t);)
        if (thread == 0 || thread == 128) walked[{cta, thread}].push_back(t);
    });
    ASSERT_EQ(error, "");
    Tiles seen;
    std::vector<size_t> counts(grid.x * grid.y * grid.z, 0);
    for (const auto& [where, list] : walked) {
      if (where.second != 0) continue;
      counts[where.first] = list.size();
      for (size_t i = 1; persistent && kCausal && i < list.size(); ++i)
        EXPECT_GE(list[i - 1].m_block, list[i].m_block) << "CTA " << where.first;
      const auto consumer = walked.find({where.first, 128});
      ASSERT_NE(consumer, walked.end()) << "CTA " << where.first;
      ASSERT_EQ(consumer->second.size(), list.size()) << "CTA " << where.first;
      for (size_t i = 0; i < list.size(); ++i) {
        const flashjit_kernel::WsTile& t = list[i];
        const flashjit_kernel::WsTile& c = consumer->second[i];
        EXPECT_EQ(std::tie(t.m_block, t.head, t.batch), std::tie(c.m_block, c.head, c.batch));
        EXPECT_EQ(t.q_row, cu_q[t.batch]);
        EXPECT_EQ(t.k_row, cu_k[t.batch]);
        EXPECT_EQ(t.map_batch, 0);
        seen.insert({t.m_block, t.head, t.batch});
      }
    }
    EXPECT_EQ(seen, expected);
    if (persistent) {
      EXPECT_LE(*std::max_element(counts.begin(), counts.end()),
                *std::min_element(counts.begin(), counts.end()) + 1);
    }
  };
  {
    SCOPED_TRACE("one tile per CTA");
    walk(std::type_identity<flashjit_kernel::WsVariantTileScheduler<kCausal, false>>(),
         ft::Sm90Grid{m_blocks, kHeads, docs}, false);
  }
  {
    SCOPED_TRACE("persistent, 4 CTAs");
    walk(std::type_identity<flashjit_kernel::WsVariantTileScheduler<kCausal, true>>(),
         ft::Sm90Grid{4, 1, 1}, true);
  }
}

TEST(CudaVarlenWsEmulation, OneConsumerMatchesTheFp64ReferencePerDocument) {
  check<64, 64, 64, 2, true, false, false>();
}

TEST(CudaVarlenWsEmulation, PersistentPingPongMatchesTheFp64ReferencePerDocument) {
  // Two consumers taking turns, each CTA walking several tiles; n128, 3 stages.
  check<128, 128, 128, 3, false, true, true>();
}

TEST(CudaVarlenWsEmulation, ThreeConsumersPersistentMatchTheFp64ReferencePerDocument) {
  check<64, 192, 64, 2, true, false, true>();
}

}  // namespace
}  // namespace flashjit
