// The -ws family's budget (generator/forward_config_ws.hpp): names, legality on sm90 only, the
// knob rules, shared memory and the consumers' registers after setmaxnreg, the default tile and
// the plan. The template agrees with these numbers: tests/templates/cuda_fwd_ws_emulation_test.cpp
// checks WsTraits against ws_resources, cuda_compile_test.cpp that every legal config compiles
// without spills.
#include "generator/forward_config_ws.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "runtime/launch_params.hpp"

namespace flashjit {
namespace {

AttentionProblem problem(int head_dim, bool causal = false) {
  return AttentionProblem::make(2, 16, 16, 4096, 4096, head_dim, DType::BF16, causal);
}
const DeviceSpec& sm(int arch) {
  static const DeviceSpec sm80 = *known_device("sm80"), sm90 = *known_device("sm90");
  return arch == 90 ? sm90 : sm80;
}

TEST(WsConfig, NamesRoundTrip) {
  const AttentionConfig ws{128, 128, 12, 2, KernelFamily::Ws};
  EXPECT_EQ(ws.to_string(), "m128n128w12s2-ws");
  EXPECT_EQ(AttentionConfig::parse("m128n128w12s2-ws").value(), ws);
  EXPECT_FALSE(AttentionConfig::parse("m128n128w12s2-ws-wgmma").ok());
}

AttentionConfig scheduled(AttentionConfig c, bool pingpong, bool persistent) {
  c.pingpong = pingpong;
  c.persistent = persistent;
  return c;
}

TEST(WsConfig, ScheduleNamesRoundTrip) {
  const AttentionConfig tile{128, 128, 12, 2, KernelFamily::Ws};
  for (bool pingpong : {false, true})
    for (bool persistent : {false, true}) {
      const AttentionConfig c = scheduled(tile, pingpong, persistent);
      EXPECT_EQ(AttentionConfig::parse(c.to_string()).value(), c) << c.to_string();
    }
  EXPECT_EQ(scheduled(tile, true, true).to_string(), "m128n128w12s2-ws-pp-persist");
  EXPECT_EQ(scheduled(tile, false, true).to_string(), "m128n128w12s2-ws-persist");
  // The schedule belongs to -ws, in this order.
  for (const char* bad : {"m128n128w12s2-ws-persist-pp", "m128n128w8s2-wgmma-pp", "m128n64w4s2-pp",
                          "m128n64w4s2-persist"})
    EXPECT_FALSE(AttentionConfig::parse(bad).ok()) << bad;
}

TEST(WsConfig, ScheduleKnobsAreWsOnly) {
  // Ping-pong needs two consumers to take turns.
  const Status one =
      check_config(scheduled({64, 128, 8, 2, KernelFamily::Ws}, true, false), problem(128), sm(90));
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.error().message.find("ping-pong (-pp) takes turns between 2 or 3"),
            std::string::npos)
      << one.error().message;
  EXPECT_TRUE(
      check_config(scheduled({64, 128, 8, 2, KernelFamily::Ws}, false, true), problem(128), sm(90))
          .ok());
  // No other family, backend or pass has them.
  for (const AttentionConfig& c : {scheduled({128, 64, 8, 2, KernelFamily::Wgmma}, true, false),
                                   scheduled({128, 64, 4, 2, KernelFamily::Mma}, false, true)}) {
    const Status status = check_config(c, problem(128), sm(90));
    ASSERT_FALSE(status.ok()) << c.to_string();
    EXPECT_NE(status.error().message.find("a knob of the -ws family only"), std::string::npos)
        << status.error().message;
    EXPECT_FALSE(check_config(c, problem(128).with_pass(Pass::Backward), sm(90)).ok());
  }
  // The schedule costs no resources: every legal tile is legal in each schedule it can run.
  for (int head_dim : {64, 128, 256}) {
    const std::vector<AttentionConfig> legal = legal_configs(problem(head_dim), sm(90));
    int tiles = 0, scheduled_configs = 0;
    for (const AttentionConfig& c : legal) {
      if (c.family != KernelFamily::Ws) continue;
      ++scheduled_configs;
      if (c.pingpong || c.persistent) continue;
      ++tiles;
      for (bool pingpong : {false, true})
        for (bool persistent : {false, true}) {
          const AttentionConfig s = scheduled(c, pingpong, persistent);
          const bool runs = !pingpong || c.block_m >= 128;
          EXPECT_EQ(std::find(legal.begin(), legal.end(), s) != legal.end(), runs) << s.to_string();
          EXPECT_EQ(ws_resources(s, problem(head_dim)).smem_bytes,
                    ws_resources(c, problem(head_dim)).smem_bytes);
        }
    }
    EXPECT_GT(scheduled_configs, 2 * tiles) << head_dim;
  }
}

TEST(WsConfig, PersistentGridIsOneCtaPerSmSlot) {
  // Two consumers: one CTA per SM, 132 on an H100; one consumer at d 64: two per SM.
  const AttentionConfig two = scheduled({128, 128, 12, 2, KernelFamily::Ws}, false, true);
  EXPECT_EQ(ws_persistent_ctas(two, problem(128), sm(90)), 132);
  const AttentionConfig one = scheduled({64, 64, 8, 2, KernelFamily::Ws}, false, true);
  EXPECT_EQ(ws_persistent_ctas(one, problem(64), sm(90)), 2 * 132);
  // The launch: min(tiles, CTAs) in grid x. 2 x 16 heads x 32 query blocks = 1024 tiles.
  const LaunchShape big = forward_launch(problem(128), two, {384, 1000, 132});
  EXPECT_EQ(big.grid_x, 132);
  EXPECT_EQ(big.grid_y, 1);
  EXPECT_EQ(big.grid_z, 1);
  const auto small = AttentionProblem::make(1, 3, 3, 200, 200, 128, DType::BF16, true);
  EXPECT_EQ(forward_launch(small, two, {384, 1000, 132}).grid_x, 2 * 3);
  // Without persistent_ctas the contract's grid.
  const LaunchShape grid = forward_launch(problem(128), two, {384, 1000});
  EXPECT_EQ(grid.grid_x, 32);
  EXPECT_EQ(grid.grid_y, 16);
  EXPECT_EQ(grid.grid_z, 2);
}

TEST(WsConfig, LegalOnSm90Only) {
  const AttentionConfig ws{128, 128, 12, 2, KernelFamily::Ws};
  EXPECT_TRUE(check_config(ws, problem(128), sm(90)).ok());
  const Status status = check_config(ws, problem(128), sm(80));
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("need sm90"), std::string::npos) << status.error().message;
  for (const AttentionConfig& c : legal_configs(problem(128), sm(80)))
    EXPECT_NE(c.family, KernelFamily::Ws) << c.to_string();
  // The backward has its own families: -ws is a forward config.
  EXPECT_FALSE(check_config(ws, problem(128).with_pass(Pass::Backward), sm(90)).ok());
}

TEST(WsConfig, KnobRulesNameTheBadValue) {
  auto message = [](const AttentionConfig& c, int head_dim) {
    const Status s = check_config(c, problem(head_dim), sm(90));
    return s.ok() ? std::string("ok") : s.error().message;
  };
  EXPECT_NE(message({128, 128, 8, 2, KernelFamily::Ws}, 128).find("warps = 8"), std::string::npos);
  EXPECT_NE(message({96, 64, 10, 2, KernelFamily::Ws}, 128).find("block_m = 96"),
            std::string::npos);
  EXPECT_NE(message({128, 32, 12, 2, KernelFamily::Ws}, 128).find("block_n = 32"),
            std::string::npos);
  EXPECT_NE(message({128, 64, 12, 5, KernelFamily::Ws}, 128).find("stages = 5"), std::string::npos);
  // d 128 with three consumers (160 registers each after setmaxnreg): S and P of 128 keys
  // beside O do not fit; with 64 keys they do.
  EXPECT_NE(message({192, 128, 16, 2, KernelFamily::Ws}, 128).find("registers"), std::string::npos);
  EXPECT_EQ(message({192, 64, 16, 2, KernelFamily::Ws}, 128), "ok");
  // Shared memory: Q of 192 rows and 4 stages of 128 keys at d 256 is far over 227 KB.
  EXPECT_NE(message({192, 128, 16, 4, KernelFamily::Ws}, 256).find("shared memory"),
            std::string::npos);
}

TEST(WsConfig, ResourcesFollowTheTraits) {
  // Two consumers: 384 threads, one CTA per SM: 65536 / 384 = 170 -> 168 registers at launch;
  // the producer drops to 24, the consumers take (3 * 168 - 24) / 2 = 240.
  const WsResources two = ws_resources({128, 128, 12, 2, KernelFamily::Ws}, problem(128));
  EXPECT_EQ(two.threads, 384);
  EXPECT_EQ(two.ctas_per_sm, 1);
  EXPECT_EQ(two.launch_registers, 168);
  EXPECT_EQ(two.producer_registers, 24);
  EXPECT_EQ(two.consumer_registers, 240);
  EXPECT_EQ(two.smem_bytes, 1024 + 128 * 128 * 2 + 2 * 2 * 128 * 128 * 2 + 8 * 10);
  // Three consumers: 512 threads: 128 at launch, (4 * 128 - 24) / 3 = 162 -> 160.
  const WsResources three = ws_resources({192, 128, 16, 2, KernelFamily::Ws}, problem(64));
  EXPECT_EQ(three.launch_registers, 128);
  EXPECT_EQ(three.consumer_registers, 160);
  // One consumer: two CTAs per SM, 65536 / 512 = 128 at launch, 2 * 128 - 24 = 232.
  const WsResources one = ws_resources({64, 64, 8, 2, KernelFamily::Ws}, problem(64));
  EXPECT_EQ(one.ctas_per_sm, 2);
  EXPECT_EQ(one.launch_registers, 128);
  EXPECT_EQ(one.consumer_registers, 232);
  // Every legal config fits the device.
  for (int head_dim : {64, 128, 256})
    for (const AttentionConfig& c : legal_configs(problem(head_dim), sm(90))) {
      if (c.family != KernelFamily::Ws) continue;
      const WsResources r = ws_resources(c, problem(head_dim));
      EXPECT_LE(r.smem_bytes, sm(90).smem_per_block_optin) << c.to_string();
      EXPECT_LE(r.consumer_estimate, r.consumer_registers) << c.to_string();
      EXPECT_LE(r.producer_registers + r.consumers * r.consumer_registers,
                (1 + r.consumers) * r.launch_registers)
          << c.to_string();
    }
}

TEST(WsConfig, DefaultTilePerHeadDimAndPlan) {
  EXPECT_EQ(default_ws_config(problem(64), sm(90))->to_string(), "m192n128w16s2-ws");
  EXPECT_EQ(default_ws_config(problem(128), sm(90))->to_string(), "m128n128w12s2-ws");
  EXPECT_EQ(default_ws_config(problem(256), sm(90))->to_string(), "m128n64w12s2-ws");
  EXPECT_FALSE(default_ws_config(problem(128), sm(80)).ok());
  for (int head_dim : {64, 128, 256}) {
    const std::vector<AttentionConfig> legal = legal_configs(problem(head_dim), sm(90));
    EXPECT_NE(std::find(legal.begin(), legal.end(), *default_ws_config(problem(head_dim), sm(90))),
              legal.end())
        << head_dim;
  }
  const std::string plan = explain_plan(problem(128), sm(90));
  EXPECT_NE(plan.find("-ws family"), std::string::npos) << plan;
  EXPECT_NE(plan.find("-ws tile: m128n128w12s2-ws (32.0 key blocks per tile on average); sm90's "
                      "default"),
            std::string::npos)
      << plan;
  EXPECT_NE(plan.find("Default (untuned): m128n128w12s2-ws"), std::string::npos) << plan;
  EXPECT_EQ(explain_plan(problem(128), sm(80)).find("-ws family"), std::string::npos);
}

AttentionProblem square(int head_dim, int64_t n, bool causal) {
  // The benchmark grid's shapes: B x N = 16k tokens, H x d = 2048.
  return AttentionProblem::make(16384 / n, 2048 / head_dim, 2048 / head_dim, n, n, head_dim,
                                DType::BF16, causal);
}

TEST(WsConfig, MeanKeyBlocksFollowsTheKeyRange) {
  const AttentionConfig m192{192, 128, 16, 2, KernelFamily::Ws};
  EXPECT_DOUBLE_EQ(mean_key_blocks(m192, square(64, 512, false)), 4.0);
  EXPECT_DOUBLE_EQ(mean_key_blocks(m192, square(64, 1024, false)), 8.0);
  // Causal, 512 rows: tiles [0, 192), [192, 384), [384, 512) see 2, 3 and 4 blocks of 128 keys.
  EXPECT_DOUBLE_EQ(mean_key_blocks(m192, square(64, 512, true)), 3.0);
  EXPECT_NEAR(mean_key_blocks(m192, square(64, 1024, true)), 32.0 / 6, 1e-12);
  EXPECT_NEAR(mean_key_blocks(m192, square(64, 2048, true)), 101.0 / 11, 1e-12);
  // seqlen_q > seqlen_k, causal: the first 3000 - 100 = 2900 rows see no key (15 of 16 tiles).
  const auto tall = AttentionProblem::make(1, 4, 4, 3000, 100, 64, DType::BF16, true);
  EXPECT_DOUBLE_EQ(mean_key_blocks(m192, tall), 1.0 / 16);
  // One query row, many keys (decoding): every key block.
  const auto decode = AttentionProblem::make(8, 16, 16, 1, 5000, 64, DType::BF16, false);
  EXPECT_DOUBLE_EQ(mean_key_blocks(m192, decode), 40.0);
}

// sm90's default is the -ws tile where the H100 measured it faster than the wgmma default
// (docs/PERFORMANCE.md, stage 1), the wgmma default elsewhere: each measured shape on its side.
TEST(WsConfig, DefaultIsWsWhereItMeasuredFaster) {
  struct Case {
    int head_dim;
    int64_t n;
    bool causal;
    bool ws;  // measured -ws / wgmma default > 1
  };
  const Case cases[] = {
      // d 64: 0.96 0.83 0.85 slower; 1.05 1.02 1.18 1.12 1.31 faster.
      {64, 512, false, false},
      {64, 512, true, false},
      {64, 1024, true, false},
      {64, 1024, false, true},
      {64, 2048, true, true},
      {64, 2048, false, true},
      {64, 4096, true, true},
      {64, 16384, false, true},
      // d 128 and 256: faster at every shape, the smallest included (1.20, 1.18 causal 512).
      {128, 512, true, true},
      {128, 512, false, true},
      {128, 16384, false, true},
      {256, 512, true, true},
      {256, 8192, false, true},
      {256, 16384, true, true},
  };
  for (const Case& c : cases) {
    const AttentionProblem p = square(c.head_dim, c.n, c.causal);
    const std::string name = "d" + std::to_string(c.head_dim) + " N " + std::to_string(c.n) +
                             (c.causal ? " causal" : "");
    Result<AttentionConfig> def = default_config(p, sm(90));
    ASSERT_TRUE(def.ok()) << name;
    EXPECT_EQ(def->family, c.ws ? KernelFamily::Ws : KernelFamily::Wgmma) << name;
    if (c.ws) {
      EXPECT_EQ(*def, *default_ws_config(p, sm(90))) << name;
    }
    EXPECT_TRUE(check_config(*def, p, sm(90)).ok()) << name;
    EXPECT_EQ(ws_is_default(*default_ws_config(p, sm(90)), p), c.ws) << name;
  }
  // A padded head dim of 128 (d = 96) is -ws at any size; of 64 (d = 40) by the key blocks.
  EXPECT_EQ(default_config(AttentionProblem::make(1, 8, 8, 200, 200, 96, DType::F16, true), sm(90))
                ->family,
            KernelFamily::Ws);
  EXPECT_EQ(default_config(AttentionProblem::make(1, 8, 8, 200, 200, 40, DType::F16, true), sm(90))
                ->family,
            KernelFamily::Wgmma);
  EXPECT_EQ(default_config(AttentionProblem::make(1, 8, 8, 200, 3000, 40, DType::F16, true), sm(90))
                ->family,
            KernelFamily::Ws);
  // Not on sm80; and the plan says why at d = 64.
  EXPECT_EQ(default_config(square(128, 4096, false), sm(80))->family, KernelFamily::Mma);
  const std::string plan = explain_plan(square(64, 512, false), sm(90));
  EXPECT_NE(plan.find("-ws tile: m192n128w16s2-ws (4.0 key blocks per tile on average); not the "
                      "default (padded head dim 64: -ws from 8 key blocks per tile)"),
            std::string::npos)
      << plan;
}

}  // namespace
}  // namespace flashjit
