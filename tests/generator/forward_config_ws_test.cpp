// The -ws family's budget (generator/forward_config_ws.hpp): names, legality on sm90 only, the
// knob rules, shared memory and the consumers' registers after setmaxnreg, the default tile and
// the plan. The template agrees with these numbers: tests/templates/cuda_fwd_ws_emulation_test.cpp
// checks WsTraits against ws_resources, cuda_compile_test.cpp that every legal config compiles
// without spills.
#include "generator/forward_config_ws.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "generator/config.hpp"
#include "generator/device.hpp"

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
  EXPECT_EQ(two.smem_bytes, 1024 + 128 * 128 * 2 + 2 * 2 * 128 * 128 * 2 + 8 * 9);
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
  // sm90's untuned default stays the wgmma family's until -ws is measured on an H100.
  EXPECT_EQ(default_config(problem(128), sm(90))->family, KernelFamily::Wgmma);
  const std::string plan = explain_plan(problem(128), sm(90));
  EXPECT_NE(plan.find("-ws family"), std::string::npos) << plan;
  EXPECT_NE(plan.find("Proposed -ws default: m128n128w12s2-ws"), std::string::npos) << plan;
  EXPECT_EQ(explain_plan(problem(128), sm(80)).find("-ws family"), std::string::npos);
}

}  // namespace
}  // namespace flashjit
