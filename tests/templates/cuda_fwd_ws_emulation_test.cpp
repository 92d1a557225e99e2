// The warp-specialized Hopper forward (templates/cuda/ws/, configs "-ws") compiled for the host
// against an emulation of its sm_90a primitives (tests/support/sm90_emulator.hpp: TMA loads that
// land when the scheduler chooses and complete on their mbarriers, mbarrier phases and parities,
// named barriers, setmaxnreg checked against the launch, wgmma with late execution, TMA stores),
// run on shapes that hit the edges and compared with the fp64 reference. The tensor maps are the
// ones the CUDA backend encodes (runtime/tensor_map_spec.hpp), written in the emulator's form.
//
// Each config runs under two schedules: loads landing only when no thread can go on (every
// consumer waits first), and loads landing at random points with wgmma waits deferred past the
// other warpgroups' turns at random (seeded). Persistent configs ("-persist") run on a grid of
// kPersistentCtas CTAs, so that each walks several tiles (pipelines, Q rounds and ping-pong
// turns carried from tile to tile, causal tiles with no key last). The emulator's rules fail
// a read of a TMA-filled byte before its mbarrier phase was waited for, a load into a buffer a
// wgmma may still read, a generic store a TMA store reads unfenced, and setmaxnreg counts that do
// not fit the launch. That the hardware matches the documented layouts and counts is
// tests/runtime/cuda/tma_probe_test.cpp's part (on an H100).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/forward_config_ws.hpp"
#include "runtime/launch_params.hpp"
#include "runtime/tensor_map_spec.hpp"
#include "support/attention_cases.hpp"
#include "support/forward_emulation.hpp"
#include "support/reference.hpp"
#include "support/tma_box.hpp"
// The order matters: the template sees the emulated primitives.
// clang-format off
#include "templates/attention_params.h"
#include "templates/attention_common.h"
#include "support/sm90_emulator.hpp"
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
using ft::make_problem;
using ft::Shape;
using ft::Storage;

constexpr double kMaxOutputRelError = 1e-2;
constexpr double kMaxLseAbsError = 1e-3;

// The grid of a persistent config in the emulation (the device's is one CTA per SM slot).
constexpr int kPersistentCtas = 3;

// The shared emulation shapes, plus causal query blocks that see no key at all (the kernel's
// n_blocks == 0 path: no load, O = 0, lse = +inf), a long sequence (many pipeline rounds) and
// many tiles of GQA heads (a persistent CTA's several rounds, walked both ways when causal).
const std::vector<Shape>& ws_shapes() {
  static const std::vector<Shape> shapes = [] {
    std::vector<Shape> all = ft::emulation_shapes();
    all.push_back({1, 1, 1, 200, 40});
    all.push_back({1, 1, 1, 64, 600});
    all.push_back({2, 3, 1, 300, 260});
    return all;
  }();
  return shapes;
}

struct Outcome {
  std::string error;
  ft::Comparison comparison;
};

template <class K>
Outcome run_forward(const AttentionProblem& p, const AttentionConfig& config,
                    const ft::HostInputs& inputs, const ft::Reference& reference,
                    const ft::Sm90Options& options) {
  Outcome out;
  std::vector<uint16_t> o;
  std::vector<float> lse;
  out.error = ft::run_guarded_forward(
      p, inputs,
      [&](const AttentionProblem& problem, const ft::HostInputs&,
          const FlashjitAttentionParams& params) {
        // The runtime's grid for this config (persistent: kPersistentCtas CTAs at most).
        return ft::emulate_ws_forward(
            problem, config, params, K::kThreads, K::kSmemBytes, kPersistentCtas,
            [&](const FlashjitForwardTensorMaps& maps) {
              flashjit_kernel::attention_forward_ws<K>(params, maps);
            },
            options);
      },
      &o, &lse);
  if (out.error.empty()) out.comparison = ft::compare(p, o, lse, reference);
  return out;
}

// One emulated config: the traits the renderer instantiates, and the same knobs as a config.
template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int STAGES, bool BF16, bool CAUSAL,
          bool PINGPONG = false, bool PERSISTENT = false>
void check_config() {
  constexpr int kWarps = BLOCK_M / 16 + 4;
  using K = flashjit_kernel::WsTraits<HEAD_DIM, BLOCK_M, BLOCK_N, kWarps, STAGES, BF16, CAUSAL,
                                      PINGPONG, PERSISTENT>;
  AttentionConfig config{BLOCK_M, BLOCK_N, kWarps, STAGES, KernelFamily::Ws};
  config.pingpong = PINGPONG;
  config.persistent = PERSISTENT;
  const DType dtype = BF16 ? DType::BF16 : DType::F16;
  std::string name = "d";
  name += std::to_string(HEAD_DIM);
  name += " ";
  name += to_string(dtype);
  name += CAUSAL ? " causal " : " non-causal ";
  name += config.to_string();

  // The budget and the template agree on everything the launch and setmaxnreg depend on.
  const AttentionProblem sample = make_problem(ws_shapes()[1], HEAD_DIM, dtype, CAUSAL);
  const DeviceSpec sm90 = *known_device("sm90");  // a copy: known_device returns by value
  ASSERT_TRUE(check_config(config, sample, sm90).ok())
      << name << ": " << check_config(config, sample, sm90).error().message;
  const WsResources r = ws_resources(config, sample);
  EXPECT_EQ(r.smem_bytes, K::kSmemBytes) << name;
  EXPECT_EQ(r.threads, K::kThreads) << name;
  EXPECT_EQ(r.ctas_per_sm, K::kCtasPerSm) << name;
  EXPECT_EQ(r.launch_registers, K::kLaunchRegisters) << name;
  EXPECT_EQ(r.producer_registers, K::kProducerRegisters) << name;
  EXPECT_EQ(r.consumer_registers, K::kConsumerRegisters) << name;

  double worst_o = 0, worst_lse = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < ws_shapes().size(); ++i) {
    const Shape& shape = ws_shapes()[i];
    const AttentionProblem p = make_problem(shape, HEAD_DIM, dtype, CAUSAL);
    ASSERT_TRUE(validate(p).ok()) << validate(p).error().describe();
    const uint64_t seed = 7919ull * (i + 1) + HEAD_DIM + (CAUSAL ? 1 : 0);
    const ft::HostInputs inputs = ft::random_inputs(p, seed);
    const ft::Reference reference = ft::reference_attention(p, inputs);
    for (bool early : {false, true}) {
      ft::Sm90Options options;
      options.seed = seed;
      options.early_landing = early;
      options.late_wgmma = early;
      options.launch_registers = K::kLaunchRegisters;
      const Outcome outcome = run_forward<K>(p, config, inputs, reference, options);
      std::string where = name;
      where += " shape=";
      where += shape.to_string();
      where += " seed=";
      where += std::to_string(seed);
      where += early ? " (loads land early, wgmma waits late)" : " (loads land late)";
      ASSERT_TRUE(outcome.error.empty()) << where << ": " << outcome.error;
      EXPECT_TRUE(ft::matches_reference(outcome.comparison, kMaxOutputRelError, kMaxLseAbsError))
          << where;
      worst_o = std::max(worst_o, outcome.comparison.o_rel_error);
      worst_lse = std::max(worst_lse, outcome.comparison.lse_max_abs_error);
    }
  }
  std::printf("  %-36s max o rel %.2e, max lse abs %.2e, %.1f s\n", name.c_str(), worst_o,
              worst_lse,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// Every code path of the template: 1, 2 and 3 consumer warpgroups (two CTAs per SM with one),
// block_n 64 and 128, 2 to 4 stages (pipelines that wrap and that do not), P V in one or two
// n128 chunks (d 128, 256) or n64 (d 64), a padded head dim (zero-filled columns loaded, never
// stored), both dtypes, causal and not (with query blocks that see no key); each schedule: one
// tile per CTA or persistent, ping-pong between 2 and 3 consumers or not.
TEST(CudaFwdWsEmulation, D64) {
  check_config<64, 192, 128, 2, true, false>();
  check_config<64, 192, 128, 2, false, true>();
  check_config<64, 64, 64, 3, true, true>();
}
TEST(CudaFwdWsEmulation, D128) {
  check_config<128, 128, 128, 2, true, true>();
  check_config<128, 128, 128, 2, false, false>();
  check_config<128, 128, 64, 4, true, false>();
}
TEST(CudaFwdWsEmulation, D256) {
  check_config<256, 128, 64, 2, true, false>();
  check_config<256, 128, 64, 2, false, true>();
}
TEST(CudaFwdWsEmulation, PaddedHeadDim96) { check_config<96, 128, 64, 3, true, true>(); }
TEST(CudaFwdWsEmulation, PingPong) {
  check_config<64, 192, 128, 2, true, true, true>();     // three consumers in turn
  check_config<128, 128, 128, 2, false, false, true>();  // two
  check_config<256, 128, 64, 2, true, true, true>();
}
TEST(CudaFwdWsEmulation, Persistent) {
  check_config<64, 64, 64, 3, false, true, false, true>();  // one consumer, two CTAs per SM
  check_config<128, 128, 128, 3, true, true, false, true>();
  check_config<128, 128, 64, 2, false, false, false, true>();
}
TEST(CudaFwdWsEmulation, PingPongPersistent) {
  check_config<64, 192, 128, 2, false, false, true, true>();
  check_config<128, 128, 128, 2, true, true, true, true>();
  check_config<256, 128, 64, 2, false, true, true, true>();
  check_config<96, 192, 64, 4, true, true, true, true>();
}

// ---- the schedule's pieces alone --------------------------------------------------------------

// Ping-pong (ws/pingpong.cuh): the consumers' turns come strictly in order, 0, 1, (2,) 0, ...,
// over two tiles' worth of steps with one init, whatever the emulator's warpgroup order.
template <int CONSUMERS>
struct TurnsTraits {
  static constexpr bool kPingPong = true;
  static constexpr int kConsumers = CONSUMERS;
};

template <int CONSUMERS>
void check_turn_order() {
  constexpr int kSteps = 5;  // per tile
  std::vector<int> order;
  const std::string error = ft::emulate_sm90({1, 1, 1}, 128 * CONSUMERS, 0, [&] {
    const flashjit_kernel::WsTurns<TurnsTraits<CONSUMERS>> turns{
        static_cast<int>(threadIdx.x / 128)};
    turns.init();
    for (int tile = 0; tile < 2; ++tile)
      for (int step = 0; step < kSteps; ++step) {
        turns.take();
        if (threadIdx.x % 128 == 0) order.push_back(turns.consumer);
        turns.pass();
      }
  });
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_EQ(order.size(), static_cast<size_t>(2 * kSteps * CONSUMERS));
  for (size_t i = 0; i < order.size(); ++i)
    EXPECT_EQ(order[i], static_cast<int>(i % CONSUMERS)) << "turn " << i;
}

TEST(CudaFwdWsSchedule, ConsumersTakeTurnsInOrder) {
  check_turn_order<2>();
  check_turn_order<3>();
}

// The persistent tile scheduler (ws/tile_scheduler.cuh): every tile exactly once over the grid;
// causal lists heaviest first (a CTA's query blocks never increase) and walks odd rounds
// backwards; non-causal keeps the grid's order (query block fastest).
TEST(CudaFwdWsSchedule, PersistentCtasWalkEveryTileOnce) {
  struct Case {
    int m_blocks, heads, batch, ctas;
  };
  for (const Case& c : {Case{5, 3, 2, 4}, Case{1, 1, 1, 1}, Case{7, 2, 1, 14}, Case{3, 1, 1, 5}})
    for (bool causal : {false, true}) {
      FlashjitAttentionParams p{};
      p.seqlen_q = c.m_blocks * 64 - 10;
      p.heads_q = c.heads;
      p.batch = c.batch;
      const int tiles = c.m_blocks * c.heads * c.batch;
      const int grid = std::min(tiles, c.ctas);
      std::vector<std::vector<flashjit_kernel::WsTile>> walked(grid);
      const std::string error = ft::emulate_sm90({grid, 1, 1}, 128, 0, [&] {
        if (threadIdx.x != 0) return;
        auto walk = [&](auto scheduler) {
          for (flashjit_kernel::WsTile tile; scheduler.next(tile);)
            walked[blockIdx.x].push_back(tile);
        };
        if (causal)
          walk(flashjit_kernel::WsTileScheduler<true, true>(p, 64));
        else
          walk(flashjit_kernel::WsTileScheduler<false, true>(p, 64));
      });
      ASSERT_TRUE(error.empty()) << error;
      std::vector<int> seen(tiles, 0);
      for (int cta = 0; cta < grid; ++cta) {
        const auto& list = walked[cta];
        EXPECT_GE(list.size(), static_cast<size_t>(tiles / grid));
        EXPECT_LE(list.size(), static_cast<size_t>((tiles + grid - 1) / grid));
        for (size_t i = 0; i < list.size(); ++i) {
          const flashjit_kernel::WsTile& t = list[i];
          ASSERT_TRUE(t.m_block >= 0 && t.m_block < c.m_blocks && t.head >= 0 && t.head < c.heads &&
                      t.batch >= 0 && t.batch < c.batch);
          ++seen[(t.batch * c.heads + t.head) * c.m_blocks + t.m_block];
          if (causal && i > 0) {
            EXPECT_LE(t.m_block, list[i - 1].m_block);
          }
        }
      }
      for (int t = 0; t < tiles; ++t) EXPECT_EQ(seen[t], 1) << "tile " << t;
      // Round 0: CTA c takes list entry c (causal: the last query block first); round 1 is
      // walked backwards when causal.
      const flashjit_kernel::WsTile first = walked[0][0];
      EXPECT_EQ(first.m_block, causal ? c.m_blocks - 1 : 0);
      if (causal && tiles >= 2 * grid) {  // list entry 2 grid - 1, not grid
        EXPECT_EQ(walked[0][1].m_block, c.m_blocks - 1 - (2 * grid - 1) / (c.heads * c.batch));
      }
    }
}

// ---- the emulator's TMA and mbarriers against the statements the H100 probes check ----------
// (tests/runtime/cuda/tma_probe_test.cpp runs the same boxes on the hardware.)

struct BoxRun {
  std::string error;
  std::vector<uint16_t> image;
};

// One thread loads a box expecting `expect_bytes` on a fresh mbarrier; every thread waits for
// phase 0, then the box's shared bytes are read back.
BoxRun load_box(const TensorMapSpec& spec, const int (&coords)[4], uint32_t expect_bytes,
                bool fence_init = true) {
  FlashjitTensorMap map;
  ft::encode_tensor_map(spec, &map);
  const uint32_t box_bytes = spec.box[0] * spec.box[1] * 2;
  BoxRun run;
  run.image.resize(box_bytes / 2);
  run.error = ft::emulate_sm90({1, 1, 1}, 128, static_cast<int>(box_bytes) + 1024 + 8, [&] {
    using namespace flashjit_kernel;
    const u32 window = shared_address(shared_bytes);
    const u32 base = (window + 1023) & ~1023u;
    const u32 barrier = base + box_bytes;
    if (threadIdx.x == 0) {
      mbarrier_init(barrier, 1);
      if (fence_init) fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_tx(barrier, expect_bytes);
      tma_load_4d(base, &map, barrier, coords[0], coords[1], coords[2], coords[3]);
    }
    mbarrier_wait(barrier, 0);
    for (u32 i = threadIdx.x; i < box_bytes / 2; i += 128)
      std::memcpy(&run.image[i], shared_bytes + (base - window) + 2 * i, 2);
  });
  return run;
}

TEST(Sm90EmulatorTma, LoadLandsTheDocumentedBox) {
  std::vector<uint16_t> tensor(ft::kTmaProbeElements);
  std::mt19937 random(4242);
  for (uint16_t& v : tensor) v = static_cast<uint16_t>(random() & 0x7FFF);
  const struct {
    int rows;
    int coords[4];
  } cases[] = {{64, {0, 0, 1, 0}}, {64, {64, 80, 2, 1}}, {128, {0, 10, 0, 1}}};
  for (const auto& c : cases) {
    const TensorMapSpec spec = ft::tma_probe_spec(tensor.data(), c.rows);
    const BoxRun run = load_box(spec, c.coords, spec.box[0] * spec.box[1] * 2);
    ASSERT_TRUE(run.error.empty()) << run.error;
    EXPECT_EQ(run.image, ft::tma_box_image(spec, c.coords, tensor.data()))
        << "box of " << c.rows << " rows at (" << c.coords[0] << ", " << c.coords[1] << ")";
  }
}

TEST(Sm90EmulatorTma, RulesFailWhatTheHardwareWouldNotDo) {
  std::vector<uint16_t> tensor(ft::kTmaProbeElements, 0x3F80);
  const TensorMapSpec spec = ft::tma_probe_spec(tensor.data(), 64);
  const int coords[4] = {0, 0, 0, 0};
  // A phase expecting more bytes than the box brings never completes.
  EXPECT_NE(load_box(spec, coords, 64 * 64 * 2 + 16).error.find("stuck"), std::string::npos);
  // An mbarrier used by other threads without fence.mbarrier_init.
  EXPECT_NE(load_box(spec, coords, 64 * 64 * 2, /*fence_init=*/false).error.find("before its init"),
            std::string::npos);
}

}  // namespace
}  // namespace flashjit
