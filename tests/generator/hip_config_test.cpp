#include "generator/hip_config.hpp"

#include <gtest/gtest.h>

#include <set>

#include "generator/render.hpp"

namespace flashjit {
namespace {

DeviceSpec gfx(const char* arch) { return known_device(arch).value(); }

AttentionProblem problem(int head_dim, bool causal = false) {
  return AttentionProblem::make(1, 16, 16, 4096, 4096, head_dim, DType::BF16, causal);
}

TEST(HipConfig, LdsArithmetic) {
  // stages * (Bc * dp [K] + dp * (Bc + 4) [padded V^T]) * 2 bytes.
  EXPECT_EQ(hip_lds_bytes({128, 64, 4, 1}, problem(128)), (64 * 128 + 128 * 68) * 2);
  EXPECT_EQ(hip_lds_bytes({128, 32, 4, 2}, problem(128)), 2 * (32 * 128 + 128 * 36) * 2);
  EXPECT_EQ(hip_lds_bytes({64, 32, 2, 1}, problem(96)), (32 * 128 + 128 * 36) * 2);  // d 96 -> 128
}

TEST(HipConfig, EveryLegalConfigFitsTheDevice) {
  for (const char* arch : {"gfx90a", "gfx942"})
    for (int d : {64, 96, 128, 192, 256}) {
      const DeviceSpec device = gfx(arch);
      const auto p = problem(d);
      const auto legal = legal_hip_configs(p, device);
      ASSERT_FALSE(legal.empty()) << arch << " d" << d;
      for (const AttentionConfig& c : legal) {
        EXPECT_LE(hip_lds_bytes(c, p), 65536) << c.to_string();
        EXPECT_LE(hip_estimated_registers(c, p), hip_register_budget(c, device)) << c.to_string();
        EXPECT_EQ(c.block_m % (16 * c.warps), 0) << c.to_string();
        EXPECT_LE(c.warps * 64, 1024);
        EXPECT_GE(hip_resource_use(c, p, device).blocks_per_cu, 1) << c.to_string();
        // Every legal config renders (the template's constraints hold).
        EXPECT_TRUE(render_hip_attention(p, c).ok()) << c.to_string();
      }
      EXPECT_TRUE(std::is_sorted(legal.begin(), legal.end()));
      EXPECT_EQ(std::set<AttentionConfig>(legal.begin(), legal.end()).size(), legal.size());
      // The default is one of them.
      Result<AttentionConfig> def = default_hip_config(p, device);
      ASSERT_TRUE(def.ok());
      EXPECT_TRUE(check_hip_config(*def, p, device).ok()) << def->to_string();
    }
}

TEST(HipConfig, RegisterBudgetHalvesPastFourWaves) {
  const DeviceSpec device = gfx("gfx90a");
  EXPECT_EQ(hip_register_budget({64, 32, 1, 1}, device), 512);
  EXPECT_EQ(hip_register_budget({128, 32, 4, 1}, device), 512);
  EXPECT_EQ(hip_register_budget({128, 32, 8, 1}, device), 256);
}

TEST(HipConfig, IllegalConfigsSayWhy) {
  const DeviceSpec device = gfx("gfx90a");
  auto why = [&](AttentionConfig c, int d) {
    Status status = check_hip_config(c, problem(d), device);
    return status.ok() ? std::string("legal") : status.error().message;
  };
  EXPECT_NE(why({128, 64, 4, 3}, 128).find("stages (LDS buffers) = 3"), std::string::npos);
  EXPECT_NE(why({128, 64, 16, 1}, 128).find("warps (wavefronts) = 16"), std::string::npos);
  EXPECT_NE(why({128, 64, 2, 1}, 128).find("16 or 32 rows per wave"), std::string::npos);
  EXPECT_NE(why({128, 64, 4, 2}, 128).find("LDS 67584 B exceeds"), std::string::npos);
  EXPECT_NE(why({128, 128, 4, 1}, 256).find("copies per thread"), std::string::npos);
  EXPECT_NE(why({256, 32, 8, 1}, 256).find("O accumulator"), std::string::npos);
  // Two stages fit where the tiles are small: d 64 x block_n 64 (33792 B), d 128 x block_n 32
  // (34816 B).
  EXPECT_EQ(why({128, 64, 4, 2}, 64), "legal");
  EXPECT_EQ(why({128, 32, 4, 2}, 128), "legal");
}

TEST(HipConfig, PlanShowsTheArithmeticAndTheLegalSet) {
  const std::string plan = explain_hip_plan(problem(128), gfx("gfx942"));
  EXPECT_NE(plan.find("gfx942 (table: MI300X)"), std::string::npos) << plan;
  EXPECT_NE(plan.find("65536 / (3 * 128 * 4) = 42"), std::string::npos) << plan;
  EXPECT_NE(plan.find("LDS   = stages * (Bc * 128 + 128 * (Bc + 4)) * 2 B"), std::string::npos)
      << plan;
  EXPECT_NE(plan.find("Default (untuned): " +
                      default_hip_config(problem(128), gfx("gfx942"))->to_string()),
            std::string::npos);
  EXPECT_NE(plan.find("illegal: LDS"), std::string::npos);
}

TEST(HipConfig, RenderNamesTheConfigAndIncludesNothing) {
  auto p = AttentionProblem::make(1, 2, 2, 64, 64, 128, DType::F16, true);
  auto source = render_hip_attention(p, {128, 64, 4, 1});
  ASSERT_TRUE(source.ok()) << source.error().describe();
  EXPECT_EQ(source->entry(), kAttentionForwardEntry);
  EXPECT_EQ(source->label, "attention_fwd_hip d128 f16 causal m128n64w4s1");
  EXPECT_NE(source->text.find("flashjit_hip::Traits</*head_dim=*/128, /*block_m=*/128, "
                              "/*block_n=*/64, /*waves=*/4, /*stages=*/1, /*bf16=*/false, "
                              "/*causal=*/true>"),
            std::string::npos);
  EXPECT_NE(source->text.find("namespace flashjit_attention"), std::string::npos);
  EXPECT_EQ(source->text.find("#include"), std::string::npos);
  EXPECT_FALSE(render_hip_attention(p, {128, 64, 4, 3}).ok());  // 3 stages: not in the template
}

}  // namespace
}  // namespace flashjit
