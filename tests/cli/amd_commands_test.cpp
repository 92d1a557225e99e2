// The `flashjit` binary on AMD targets without an AMD GPU: `plan --arch gfx942|gfx90a` prints the
// LDS budget, `show --arch gfx90a` the HIP source, `compile --arch gfx90a` compiles with hipRTC
// (HIP builds), and `compile --arch gfx942` on a ROCm that does not know gfx942 fails with exit
// status 1 and a one-line reason instead of dying.
#include <gtest/gtest.h>

#include <string>

#include "support/command.hpp"

namespace {

using Outcome = flashjit::testing::CommandOutcome;

Outcome flashjit(const std::string& args) {
  return flashjit::testing::run_command(std::string(FLASHJIT_CLI_PATH) + " " + args);
}

TEST(AmdCommands, PlanForGfx942ShowsTheLdsBudget) {
  const Outcome plan = flashjit("plan --arch gfx942 --head-dim 128");
  ASSERT_EQ(plan.status, 0) << plan.output;
  EXPECT_NE(plan.output.find("gfx942 (table: MI300X)"), std::string::npos) << plan.output;
  EXPECT_NE(plan.output.find("304 CUs, wave64"), std::string::npos) << plan.output;
  EXPECT_NE(plan.output.find("<= 65536 B per workgroup"), std::string::npos) << plan.output;
  EXPECT_NE(plan.output.find("legal configs. Default (untuned): m"), std::string::npos);
  EXPECT_NE(plan.output.find("illegal: LDS"), std::string::npos) << plan.output;
}

TEST(AmdCommands, PlanAndShowForGfx90a) {
  const Outcome plan = flashjit("plan --arch gfx90a --head-dim 64 --causal");
  ASSERT_EQ(plan.status, 0) << plan.output;
  EXPECT_NE(plan.output.find("gfx90a (table: MI210 / MI250 GCD)"), std::string::npos);
  const Outcome show = flashjit("show --arch gfx90a --config m64n32w4s2 --dtype fp16");
  ASSERT_EQ(show.status, 0) << show.output;
  EXPECT_NE(show.output.find("flashjit_hip::Traits</*head_dim=*/128, /*block_m=*/64, "
                             "/*block_n=*/32, /*waves=*/4, /*stages=*/2, /*bf16=*/false"),
            std::string::npos)
      << show.output.substr(0, 2000);
  EXPECT_NE(show.output.find("__builtin_amdgcn_mfma_f32_16x16x16"), std::string::npos);
  // A config the HIP template does not have is a usage error naming it.
  const Outcome bad = flashjit("show --arch gfx90a --config m128n64w4s3");
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find("stages"), std::string::npos) << bad.output;
}

#if FLASHJIT_HAVE_HIP_BACKEND
TEST(AmdCommands, CompileForGfx90aAndCrashIsolationForGfx942) {
  const Outcome good = flashjit("compile --arch gfx90a --head-dim 64 --config m64n32w4s1");
  if (good.output.find("hiprtc unavailable") != std::string::npos) {
    GTEST_SKIP() << good.output;
  }
  ASSERT_EQ(good.status, 0) << good.output;
  EXPECT_NE(good.output.find("m64n32w4s1"), std::string::npos);
  EXPECT_NE(good.output.find(" ok"), std::string::npos) << good.output;

  const Outcome mi300 = flashjit("compile --arch gfx942 --head-dim 64 --config m64n32w4s1");
  if (mi300.status == 0) {
    std::printf("  this ROCm compiles gfx942:\n%s", mi300.output.c_str());
  } else {
    EXPECT_EQ(mi300.status, 1) << mi300.output;
    EXPECT_NE(mi300.output.find("FAILED"), std::string::npos) << mi300.output;
    EXPECT_NE(mi300.output.find("for gfx942 crashed"), std::string::npos) << mi300.output;
  }
}
#endif

}  // namespace
