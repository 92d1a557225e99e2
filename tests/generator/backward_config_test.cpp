// The backward pass's budget (generator/backward_config.hpp): the mma family's legal sets, the
// rules that make a config illegal (each named with its reason), the default formula, the launch
// shapes and the plan text.
#include "generator/backward_config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "generator/render.hpp"

namespace flashjit {
namespace {

DeviceSpec sm(int arch) { return *known_device("sm" + std::to_string(arch)); }

AttentionProblem backward(int head_dim, bool causal = false, bool deterministic = false,
                          DType dtype = DType::BF16) {
  AttentionProblem p = AttentionProblem::make(2, 16, 4, 4096, 4096, head_dim, dtype, causal)
                           .with_pass(Pass::Backward);
  p.deterministic = deterministic;
  return p;
}

AttentionConfig mma(int block_m, int block_n, int warps, int stages, DqMode dq = DqMode::Atomic) {
  return {block_m, block_n, warps, stages, KernelFamily::Mma, dq};
}

// The message of an illegal config, or "" when it is legal.
std::string why(const AttentionConfig& c, const AttentionProblem& p, const DeviceSpec& device) {
  const Status status = check_backward_config(c, p, device);
  return status.ok() ? "" : status.error().message;
}

TEST(BackwardConfig, LegalSetsAreNonEmptyForEveryHeadDimAndArchitecture) {
  for (int arch : {80, 86, 89, 90})
    for (int d = 8; d <= 256; d += 8)
      for (bool deterministic : {false, true})
        for (DType dtype : {DType::F16, DType::BF16}) {
          const DeviceSpec device = sm(arch);
          const AttentionProblem p = backward(d, d % 16 == 0, deterministic, dtype);
          const std::vector<AttentionConfig> legal = legal_backward_configs(p, device);
          const std::string where = "sm" + std::to_string(arch) + " d" + std::to_string(d) +
                                    (deterministic ? " deterministic" : "");
          ASSERT_FALSE(legal.empty()) << where;
          EXPECT_TRUE(std::is_sorted(legal.begin(), legal.end())) << where;
          EXPECT_EQ(std::set<AttentionConfig>(legal.begin(), legal.end()).size(), legal.size());
          for (const AttentionConfig& c : legal) {
            EXPECT_TRUE(check_backward_config(c, p, device).ok()) << where << " " << c.to_string();
            EXPECT_TRUE(check_backward_template(c, p).ok()) << where << " " << c.to_string();
            // What the legal set promises the launch: it fits the device.
            const BackwardResources use = backward_resources(c, p, device);
            EXPECT_LE(use.dkdv_smem_bytes, device.smem_per_block_optin) << c.to_string();
            EXPECT_LE(use.dkdv_registers, device.max_regs_per_thread) << c.to_string();
            EXPECT_GE(use.ctas_per_sm, 1) << where << " " << c.to_string();
            if (c.dq == DqMode::Separate) {
              EXPECT_LE(use.dq_smem_bytes, device.smem_per_block_optin) << c.to_string();
              EXPECT_LE(use.dq_registers, device.max_regs_per_thread) << c.to_string();
            }
            if (arch != 90) EXPECT_EQ(c.family, KernelFamily::Mma) << c.to_string();
            if (deterministic) {
              EXPECT_EQ(c.dq, DqMode::Separate) << where << " " << c.to_string();
            }
          }
          if (!deterministic) {
            EXPECT_TRUE(std::any_of(legal.begin(), legal.end(), [](const AttentionConfig& c) {
              return c.dq == DqMode::Atomic;
            })) << where;
          }
          // Forwarded through config.hpp's functions for backward problems.
          EXPECT_EQ(legal_configs(p, device), legal) << where;
        }
}

TEST(BackwardConfig, DefaultIsLegalAndFollowsTheFormula) {
  for (int arch : {80, 86, 89, 90})
    for (int d = 8; d <= 256; d += 8)
      for (bool deterministic : {false, true}) {
        const AttentionProblem p = backward(d, false, deterministic);
        Result<AttentionConfig> def = default_backward_config(p, sm(arch));
        ASSERT_TRUE(def.ok()) << def.error().describe();
        EXPECT_TRUE(check_backward_config(*def, p, sm(arch)).ok()) << def->to_string();
        // sm90: the ws family's fused kernel where it takes the problem and is faster (d 65..128,
        // not deterministic), else the wgmma family's tile where it has one (-det there: measured
        // faster); elsewhere the mma family's formula, atomic unless deterministic.
        const bool ws = def->family == KernelFamily::Ws;
        const bool wgmma = def->family == KernelFamily::Wgmma;
        EXPECT_EQ(ws, arch == 90 && d > 64 && d <= 128 && !deterministic) << d << " " << def->to_string();
        EXPECT_EQ(wgmma, arch == 90 && !ws && (d <= 128 || d > 192))
            << d << " " << def->to_string();
        EXPECT_EQ(def->dq, (deterministic || wgmma) && !ws ? DqMode::Separate : DqMode::Atomic);
        EXPECT_EQ(default_config(p, sm(arch)).value(), *def);
      }
  // On an H100 the wgmma family; FlashAttention-2's tile shapes on an A100 (and on an H100 where
  // the wgmma family has no shape: 136 <= d <= 192).
  EXPECT_EQ(default_backward_config(backward(64), sm(90))->to_string(), "m128n64w4s2-wgmma-det");
  EXPECT_EQ(default_backward_config(backward(128), sm(90))->to_string(), "m64n128w12s2-ws");
  EXPECT_EQ(default_backward_config(backward(128, true), sm(90))->to_string(),
            "m64n128w12s2-ws-persist");
  EXPECT_EQ(default_backward_config(backward(128, false, true), sm(90))->to_string(),
            "m64n64w4s2-wgmma-det");
  EXPECT_EQ(default_backward_config(backward(256), sm(90))->to_string(), "m64n64w8s2-wgmma-det");
  EXPECT_EQ(default_backward_config(backward(160), sm(90))->to_string(), "m64n64w8s2");
  EXPECT_EQ(default_backward_config(backward(64), sm(80))->to_string(), "m128n128w8s2");
  EXPECT_EQ(default_backward_config(backward(128), sm(80))->to_string(), "m64n128w8s2");
  EXPECT_EQ(default_backward_config(backward(256), sm(80))->to_string(), "m64n64w8s1");
  EXPECT_EQ(default_backward_config(backward(128, false, true), sm(80))->to_string(),
            "m64n128w8s1-det");
}

TEST(BackwardConfig, IllegalConfigsAreNamedWithTheirReason) {
  const AttentionProblem p = backward(128);
  const DeviceSpec h100 = sm(90);
  struct Case {
    AttentionConfig config;
    const char* because;
  } cases[] = {
      {mma(48, 128, 8, 2), "block_m = 48 not in {32, 64, 128}"},
      {mma(64, 256, 8, 2), "block_n = 256 not in {32, 64, 128}"},
      {mma(64, 128, 2, 2), "warps = 2 not in {4, 8}"},
      {mma(64, 128, 8, 3), "stages = 3 not in {1, 2}"},
      // 32 x 64 S over 8 warps: 16-row blocks of 16 columns need 2 x 4 warps; 32 x 32 does not
      // split into 8 warps of 16 rows and 16 columns.
      {mma(32, 32, 8, 2), "does not split over 8 warps"},
      {mma(128, 128, 8, 1), "registers per thread exceed 255"},
      {mma(64, 128, 8, 1), "stages = 1: 2 stages fit in shared memory"},
      {mma(64, 32, 8, 2), "block_n = 32: block_n = 64 fits in shared memory"},
  };
  for (const Case& c : cases) {
    const std::string message = why(c.config, p, h100);
    EXPECT_NE(message.find(c.because), std::string::npos)
        << c.config.to_string() << ": '" << message << "' should say '" << c.because << "'";
    EXPECT_EQ(message.rfind("config " + c.config.to_string() + ": ", 0), 0u) << message;
  }
  // Shared memory: d 256 with 128 query rows in 2 stages needs 257 KiB.
  EXPECT_NE(why(mma(128, 64, 8, 2), backward(256), h100).find("dK/dV kernel: shared memory"),
            std::string::npos);
  // The dQ kernel's budget counts for -det: m64n128w8s2-det's needs 176 KiB, more than an A100.
  EXPECT_TRUE(check_backward_config(mma(64, 128, 8, 2), p, sm(80)).ok());
  EXPECT_NE(why(mma(64, 128, 8, 2, DqMode::Separate), p, sm(80)).find("dQ kernel: shared memory"),
            std::string::npos);

  // Deterministic problems: no atomics.
  const std::string atomic = why(mma(64, 128, 8, 2), backward(128, false, true), h100);
  EXPECT_NE(atomic.find("deterministic"), std::string::npos) << atomic;
  EXPECT_TRUE(
      check_backward_config(mma(64, 128, 8, 2, DqMode::Separate), backward(128, false, true), h100)
          .ok());

  // The wgmma family off sm90, another dtype: named.
  EXPECT_TRUE(check_backward_config({64, 128, 8, 2, KernelFamily::Wgmma}, p, h100).ok());
  const Status wgmma = check_backward_config({64, 128, 8, 2, KernelFamily::Wgmma}, p, sm(80));
  ASSERT_FALSE(wgmma.ok());
  EXPECT_NE(wgmma.error().message.find("sm90"), std::string::npos) << wgmma.error().message;
  const Status fp32 =
      check_backward_config(mma(64, 128, 8, 2), backward(128, false, false, DType::F32), h100);
  ASSERT_FALSE(fp32.ok());
  EXPECT_EQ(fp32.error().code, ErrorCode::Unsupported);
  EXPECT_NE(fp32.error().message.find("dtype = f32"), std::string::npos);
  EXPECT_TRUE(legal_backward_configs(backward(128, false, false, DType::F32), h100).empty());
  EXPECT_FALSE(default_backward_config(backward(128, false, false, DType::F32), h100).ok());
}

TEST(BackwardConfig, TemplateConstraintsNeedNoDevice) {
  const AttentionProblem p = backward(128);
  // Legal to render although the H100's budget prefers the larger knob value.
  EXPECT_TRUE(check_backward_template(mma(64, 128, 8, 1), p).ok());
  EXPECT_TRUE(check_backward_template(mma(64, 32, 8, 1, DqMode::Separate), p).ok());
  // Beyond the budget of any device, still a shape the template has.
  EXPECT_TRUE(check_backward_template(mma(128, 128, 4, 2), backward(256)).ok());
  EXPECT_FALSE(check_backward_template(mma(32, 32, 8, 2), p).ok());
  EXPECT_TRUE(check_backward_template({64, 128, 8, 2, KernelFamily::Wgmma}, p).ok());
  EXPECT_FALSE(check_backward_template({32, 128, 8, 2, KernelFamily::Wgmma}, p).ok());
  // The renderer checks the same: a source with the three entry points, or the reason.
  Result<KernelSource> source = render_cuda_attention(p, mma(64, 128, 8, 1));
  ASSERT_TRUE(source.ok()) << source.error().describe();
  EXPECT_EQ(source->entries, (std::vector<std::string>{kBackwardPreprocessEntry, kBackwardDkDvEntry,
                                                       kBackwardDqEntry}));
  EXPECT_NE(source->text.find("BwdTraits</*head_dim=*/128, /*block_m=*/64, /*block_n=*/128"),
            std::string::npos);
  EXPECT_NE(source->text.find("backward_dq_convert<128, true>"), std::string::npos);
  Result<KernelSource> det = render_cuda_attention(p, mma(64, 128, 8, 2, DqMode::Separate));
  ASSERT_TRUE(det.ok()) << det.error().describe();
  EXPECT_NE(det->text.find("attention_backward_dq<Config>"), std::string::npos);
  Result<KernelSource> bad = render_cuda_attention(p, mma(32, 32, 8, 2));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("does not split over 8 warps"), std::string::npos);
}

TEST(BackwardConfig, WarpTilingsAndLaunchShapes) {
  // FlashAttention-2's d = 128 shapes: S 64 x 128 as 2 x 4 warps of 32 x 32, dK/dV 128 x 128 as
  // 4 x 2 warps of 32 x 64, dQ 64 x 128 as 2 x 4 warps of 32 x 32.
  const BackwardWarpTiling s = backward_warp_tiling(64, 128, 8);
  EXPECT_TRUE(s.valid);
  EXPECT_EQ(s.warps_m, 2);
  EXPECT_EQ(s.rows, 32);
  EXPECT_EQ(s.cols, 32);
  const BackwardWarpTiling kv = backward_warp_tiling(128, 128, 8);
  EXPECT_EQ(kv.warps_m, 4);
  EXPECT_EQ(kv.cols, 64);
  // 32 x 32 over 4 warps: 16-row blocks (32-row blocks would leave 8 columns per warp).
  const BackwardWarpTiling small = backward_warp_tiling(32, 32, 4);
  EXPECT_TRUE(small.valid);
  EXPECT_EQ(small.rows, 16);
  EXPECT_EQ(small.cols, 16);
  EXPECT_FALSE(backward_warp_tiling(32, 32, 8).valid);

  EXPECT_EQ(backward_padded_head_dim(8), 64);
  EXPECT_EQ(backward_padded_head_dim(72), 128);
  EXPECT_EQ(backward_padded_head_dim(136), 256);
  EXPECT_EQ(backward_padded_head_dim(256), 256);

  // K, V + 2 x (Q, dO) + P, dS + 2 x (lse_log2, D), and the dQ kernel's Q, dO + 2 x (K, V) + dS.
  const AttentionProblem p = backward(96);  // padded to 128
  const AttentionConfig c = mma(64, 128, 8, 2, DqMode::Separate);
  EXPECT_EQ(backward_dkdv_smem_bytes(c, p),
            2 * 128 * 128 * 2 + 2 * 2 * 64 * 128 * 2 + 2 * 64 * 128 * 2 + 2 * 2 * 64 * 4);
  EXPECT_EQ(backward_dq_smem_bytes(c, p), 2 * 64 * 128 * 2 + 2 * 2 * 128 * 128 * 2 + 64 * 128 * 2);
  EXPECT_EQ(backward_dkdv_threads(c), 256);
  EXPECT_EQ(backward_dq_threads(c), 256);
  const BackwardResources use = backward_resources(c, p, sm(90));
  EXPECT_EQ(use.dkdv_smem_bytes, backward_dkdv_smem_bytes(c, p));
  EXPECT_EQ(use.dq_smem_bytes, backward_dq_smem_bytes(c, p));
  EXPECT_EQ(use.ctas_per_sm, 1);
}

TEST(BackwardConfig, PlanShowsTheArithmeticAndTheLegalSet) {
  const AttentionProblem p = backward(128, true);
  const std::string plan = explain_plan(p, sm(90));
  for (const char* expected :
       {"attention_backward(", "Starting formula", "min(128, 16384 / 128) = 128", "smem dK/dV",
        "smem dQ", "regs dK/dV", "<= 232448 B per block", "m64n128w8s2 ", "m64n128w8s2-det",
        "164864", "legal", "illegal: stages = 1", "legal configs.",
        "Default (untuned): m64n128w12s2-ws-persist", "wgmma family (sm_90a", "ws family (sm_90a",
        "m64n128w12s2-ws ", "198720", "Default on sm90: the ws family's fused kernel"}) {
    EXPECT_NE(plan.find(expected), std::string::npos) << "missing '" << expected << "' in:\n"
                                                      << plan;
  }
  const std::string det = explain_backward_plan(backward(128, false, true), sm(80));
  EXPECT_NE(det.find("only -det configs"), std::string::npos) << det;
  EXPECT_NE(det.find("Default (untuned): m64n128w8s1-det"), std::string::npos) << det;
}

}  // namespace
}  // namespace flashjit
