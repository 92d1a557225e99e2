#include "generator/config.hpp"

#include <gtest/gtest.h>

#include <set>

namespace flashjit {
namespace {

DeviceSpec sm(int arch) { return *known_device("sm" + std::to_string(arch)); }

AttentionProblem problem(int head_dim, bool causal = false) {
  return AttentionProblem::make(1, 16, 16, 4096, 4096, head_dim, DType::BF16, causal);
}

TEST(Config, CudaTemplateTakesSixteenBitStorageOnly) {
  EXPECT_TRUE(check_cuda_problem(problem(128)).ok());
  AttentionProblem fp32 = problem(128);
  fp32.dtype = DType::F32;
  const Status rejected = check_cuda_problem(fp32);
  ASSERT_FALSE(rejected.ok());
  EXPECT_EQ(rejected.error().code, ErrorCode::Unsupported);
  EXPECT_NE(rejected.error().message.find("dtype = f32: the CUDA backend supports f16 and bf16"),
            std::string::npos)
      << rejected.error().message;
  EXPECT_TRUE(legal_configs(fp32, sm(90)).empty());
  const Status config = check_config({64, 64, 4, 2}, fp32, sm(90));
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.error().message.find("dtype = f32"), std::string::npos);
  ASSERT_FALSE(default_config(fp32, sm(90)).ok());
  EXPECT_EQ(default_config(fp32, sm(90)).error().code, ErrorCode::Unsupported);
}

TEST(Config, ParseAndPrintRoundTrip) {
  AttentionConfig c{128, 64, 4, 2};
  EXPECT_EQ(c.to_string(), "m128n64w4s2");
  auto parsed = AttentionConfig::parse("m64n32w2s3");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, (AttentionConfig{64, 32, 2, 3}));
  const AttentionConfig wgmma{128, 128, 8, 2, KernelFamily::Wgmma};
  EXPECT_EQ(wgmma.to_string(), "m128n128w8s2-wgmma");
  EXPECT_EQ(AttentionConfig::parse("m128n128w8s2-wgmma").value(), wgmma);
  for (const char* bad :
       {"", "m128", "m128n64w4", "x128n64w4s2", "m128n64w4s2extra", "m128n64w4s2-wgmm"}) {
    auto r = AttentionConfig::parse(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("m<block_m>n<block_n>w<warps>s<stages>"), std::string::npos);
  }
}

TEST(Config, SmemBudgetArithmetic) {
  // (Br + 2 * stages * Bc) * padded_d * 2 bytes
  EXPECT_EQ(smem_bytes({128, 64, 4, 2}, problem(128)), (128 + 2 * 2 * 64) * 128 * 2);
  EXPECT_EQ(smem_bytes({64, 64, 4, 3}, problem(256)), (64 + 2 * 3 * 64) * 256 * 2);
  EXPECT_EQ(padded_head_dim(64), 64);
  EXPECT_EQ(padded_head_dim(72), 128);
  EXPECT_EQ(padded_head_dim(96), 128);
  EXPECT_EQ(padded_head_dim(256), 256);
}

TEST(Config, EveryLegalConfigFitsTheDevice) {
  for (int arch : {80, 86, 89, 90})
    for (int d : {64, 96, 128, 256}) {
      const DeviceSpec device = sm(arch);
      const auto p = problem(d);
      const auto legal = legal_configs(p, device);
      ASSERT_FALSE(legal.empty()) << "sm" << arch << " d" << d;
      for (const AttentionConfig& c : legal) {
        EXPECT_LE(smem_bytes(c, p), device.smem_per_block_optin) << c.to_string();
        EXPECT_LE(estimated_registers(c, p), device.max_regs_per_thread) << c.to_string();
        if (c.family == KernelFamily::Ws)  // a producer warpgroup + one consumer per 64 rows
          EXPECT_EQ(c.warps, c.block_m / 16 + 4) << c.to_string();
        else
          EXPECT_EQ(c.block_m % (16 * c.warps), 0) << c.to_string();
        EXPECT_GE(resource_use(c, p, device).ctas_per_sm, 1) << c.to_string();
      }
      // Stable order and no duplicates.
      EXPECT_TRUE(std::is_sorted(legal.begin(), legal.end()));
      EXPECT_EQ(std::set<AttentionConfig>(legal.begin(), legal.end()).size(), legal.size());
    }
}

TEST(Config, BudgetRejectsWhatDoesNotFit) {
  // d = 256 with 3 stages of 64-row K/V tiles needs 256 KiB: over every device.
  Status status = check_config({128, 64, 8, 3}, problem(256), sm(90));
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("shared memory"), std::string::npos);
  // 99 KiB devices cannot hold what a 227 KiB device can.
  AttentionConfig big{128, 64, 8, 3};
  EXPECT_TRUE(check_config(big, problem(128), sm(90)).ok());
  EXPECT_FALSE(check_config(big, problem(128), sm(86)).ok());
  EXPECT_LT(legal_configs(problem(128), sm(86)).size(), legal_configs(problem(128), sm(90)).size());
  // Template constraints.
  EXPECT_FALSE(check_config({48, 64, 4, 2}, problem(128), sm(90)).ok());   // block_m choice
  EXPECT_FALSE(check_config({64, 64, 8, 2}, problem(128), sm(90)).ok());   // 8 rows per warp
  EXPECT_FALSE(check_config({256, 64, 4, 2}, problem(128), sm(90)).ok());  // 64 rows per warp
  // Too few threads for the tile: each would issue 16 copies per K/V tile.
  status = check_config({64, 128, 4, 2}, problem(128), sm(90));
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("copies per thread"), std::string::npos);
  // Registers: 32 rows per warp at d = 256 needs 256 accumulator registers alone.
  status = check_config({128, 32, 4, 2}, problem(256), sm(90));
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("registers"), std::string::npos);
}

TEST(Config, DefaultFollowsTheStartingFormula) {
  // sm90, wgmma family (block_m 64 or 128) where the -ws tile is not the default (padded head
  // dim 64 with few key blocks per tile: tests/generator/forward_config_ws_test.cpp):
  // 232448 / (3 * 64 * 4) = 302 rows -> 128.
  const auto short_d64 = AttentionProblem::make(1, 16, 16, 512, 512, 64, DType::BF16, false);
  EXPECT_EQ(default_config(short_d64, sm(90)).value(),
            (AttentionConfig{128, 64, 8, 2, KernelFamily::Wgmma}));
  EXPECT_EQ(default_config(problem(128), sm(90))->family, KernelFamily::Ws);
  // sm80 (163 KiB), mma family: 108 rows at d = 128 -> 64; 217 at d = 64 -> 128.
  EXPECT_EQ(default_config(problem(128), sm(80))->block_m, 64);
  EXPECT_EQ(default_config(problem(64), sm(80))->block_m, 128);
  for (int arch : {80, 86, 89})
    for (int d : {64, 128, 256})
      EXPECT_EQ(default_config(problem(d), sm(arch))->family, KernelFamily::Mma);
  for (int arch : {80, 86, 89, 90})
    for (int d : {64, 128, 256}) {
      auto c = default_config(problem(d), sm(arch));
      ASSERT_TRUE(c.ok());
      EXPECT_TRUE(check_config(*c, problem(d), sm(arch)).ok()) << c->to_string();
    }
}

TEST(Config, PlanShowsTheArithmeticAndTheLegalSet) {
  const std::string plan = explain_plan(problem(128), sm(90));
  EXPECT_NE(plan.find("232448 / (3 * 128 * 4) = 151"), std::string::npos) << plan;
  EXPECT_NE(plan.find("legal configs"), std::string::npos);
  EXPECT_NE(plan.find("Default (untuned): " + default_config(problem(128), sm(90))->to_string()),
            std::string::npos);
  EXPECT_NE(plan.find("illegal: shared memory"), std::string::npos) << plan;
  EXPECT_NE(plan.find("wgmma family"), std::string::npos) << plan;
  EXPECT_EQ(explain_plan(problem(128), sm(80)).find("wgmma family"), std::string::npos);
}

TEST(Config, WgmmaFamilyOnlyOnSm90) {
  const AttentionConfig wgmma{128, 128, 8, 2, KernelFamily::Wgmma};
  EXPECT_TRUE(check_config(wgmma, problem(128), sm(90)).ok());
  for (int arch : {80, 86, 89}) {
    Status status = check_config(wgmma, problem(128), sm(arch));
    ASSERT_FALSE(status.ok());
    EXPECT_NE(status.error().message.find("need sm90"), std::string::npos)
        << status.error().message;
    for (const AttentionConfig& c : legal_configs(problem(128), sm(arch)))
      EXPECT_EQ(c.family, KernelFamily::Mma) << c.to_string();
  }
  // Warps follow block_m (one warpgroup per 64 rows); 64-row tiles at d = 256 need 16 copies.
  EXPECT_FALSE(check_config({128, 128, 4, 2, KernelFamily::Wgmma}, problem(128), sm(90)).ok());
  EXPECT_FALSE(check_config({64, 64, 4, 2, KernelFamily::Wgmma}, problem(256), sm(90)).ok());
  // Shared memory: + 1024 bytes for the swizzle-atom alignment.
  EXPECT_EQ(smem_bytes(wgmma, problem(128)), 1024 + (128 + 2 * 2 * 128) * 128 * 2);
}

}  // namespace
}  // namespace flashjit
