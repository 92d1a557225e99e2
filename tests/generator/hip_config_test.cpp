#include "generator/hip_config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "generator/render.hpp"
#include "generator/variant.hpp"
#include "support/variant_cases.hpp"

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

// Attention variants (templates/hip/attention_fwd.hpp's FLASHJIT_VARIANT blocks): every kind, a
// combination and packed documents get legal HIP configs at every head dim on both targets, each
// rendering the variant prelude and entering through attention_forward_variant; a user expression
// adds the CUDA budget's allowance to the register estimate (so its legal set is the plain one's or
// smaller); plain problems render exactly as before.
TEST(HipConfig, VariantProblemsGetHipConfigs) {
  std::vector<std::pair<std::string, Variant>> variants;
  for (const testing::VariantCase& c : testing::variant_cases())
    variants.push_back({c.name, c.variant});
  for (const testing::NamedVariant& n : testing::compile_variants())
    variants.push_back({n.name, n.variant});
  for (const char* arch : {"gfx90a", "gfx942"})
    for (int d : {64, 128, 256}) {
      const DeviceSpec device = gfx(arch);
      const AttentionProblem plain = problem(d, /*causal=*/true);
      const std::vector<AttentionConfig> plain_legal = legal_hip_configs(plain, device);
      AttentionProblem varlen = AttentionProblem::make_varlen(8, 16, 16, 4096, 4096, 20000, 20000,
                                                              d, DType::BF16, /*causal=*/true);
      std::vector<std::pair<std::string, AttentionProblem>> problems = {{"varlen", varlen}};
      for (const auto& [name, variant] : variants) {
        AttentionProblem p = plain;
        p.variant = variant;
        problems.push_back({name, p});
      }
      for (const auto& [name, p] : problems) {
        const std::string where = name + " " + arch + " d" + std::to_string(d);
        ASSERT_TRUE(validate(p).ok()) << where << ": " << validate(p).error().describe();
        const std::vector<AttentionConfig> legal = legal_hip_configs(p, device);
        ASSERT_FALSE(legal.empty()) << where;
        const bool user_expression = !p.variant.score_mod.empty() || !p.variant.mask_mod.empty();
        for (const AttentionConfig& c : legal) {
          EXPECT_NE(std::find(plain_legal.begin(), plain_legal.end(), c), plain_legal.end())
              << where << " " << c.to_string();
          EXPECT_EQ(hip_estimated_registers(c, p),
                    hip_estimated_registers(c, plain) + (user_expression ? 48 : 0))
              << where << " " << c.to_string();
        }
        if (!user_expression) {
          EXPECT_EQ(legal, plain_legal) << where;
        }
        const AttentionConfig def = default_hip_config(p, device).value();
        EXPECT_TRUE(check_hip_config(def, p, device).ok()) << where;
        const Result<KernelSource> source = render_hip_attention(p, def);
        ASSERT_TRUE(source.ok()) << where << ": " << source.error().describe();
        EXPECT_NE(source->text.find(render_variant_prelude(p).value()), std::string::npos) << where;
        EXPECT_NE(source->text.find("flashjit_hip::attention_forward_variant<Config>(params);"),
                  std::string::npos)
            << where;
        EXPECT_NE(source->label.find(p.variant.key()), std::string::npos) << where;
      }
    }
  const Result<KernelSource> plain = render_hip_attention(problem(128, true), {128, 64, 4, 1});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->text.find("#define FLASHJIT_VARIANT"), std::string::npos);
  EXPECT_NE(plain->text.find("flashjit_hip::attention_forward<Config>(params);"),
            std::string::npos);
}

// ---- the backward pass ----------------------------------------------------------------------

AttentionProblem backward(int head_dim, bool deterministic = false, DType dtype = DType::BF16) {
  AttentionProblem p =
      AttentionProblem::make(2, 16, 4, 1000, 3000, head_dim, dtype, true).with_pass(Pass::Backward);
  p.deterministic = deterministic;
  return p;
}

AttentionConfig det(AttentionConfig c) {
  c.dq = DqMode::Separate;
  return c;
}

TEST(HipBackwardConfig, LdsArithmetic) {
  // dK/dV: stages * 2 * (Bm * dp [Q, dO rows] + dp * (Bm + 4) [transposed]) * 2 bytes, plus the
  // atomic mode's dS tile Bm * (Bn + 4) * 2.
  EXPECT_EQ(hip_bwd_dkdv_lds_bytes({32, 128, 4, 1}, backward(128)),
            2 * (32 * 128 + 128 * 36) * 2 + 32 * 132 * 2);
  EXPECT_EQ(hip_bwd_dkdv_lds_bytes(det({32, 64, 4, 1}), backward(128)),
            2 * (32 * 128 + 128 * 36) * 2);
  EXPECT_EQ(hip_bwd_dkdv_lds_bytes({16, 64, 4, 2}, backward(96)),  // d 96 -> 128
            2 * 2 * (16 * 128 + 128 * 20) * 2 + 16 * 68 * 2);
  // dQ (-det): stages * (2 * Bn * dp [K, V rows] + dp * (Bn + 4) [K^T]) * 2; none when atomic.
  EXPECT_EQ(hip_bwd_dq_lds_bytes(det({32, 64, 4, 1}), backward(128)),
            (2 * 64 * 128 + 128 * 68) * 2);
  EXPECT_EQ(hip_bwd_dq_lds_bytes({32, 64, 4, 1}, backward(128)), 0);
}

TEST(HipBackwardConfig, LaunchShapesFollowTheContract) {
  const AttentionProblem p = backward(128);
  const BackwardShapes atomic = hip_backward_shapes({32, 128, 4, 1}, p);
  EXPECT_EQ(atomic.preprocess, (KernelShape{kBackwardPreprocessThreads, 0}));
  EXPECT_EQ(atomic.dkdv, (KernelShape{256, hip_bwd_dkdv_lds_bytes({32, 128, 4, 1}, p)}));
  EXPECT_EQ(atomic.dq, atomic.preprocess);  // the convert
  const BackwardShapes separate = hip_backward_shapes(det({64, 64, 2, 1}), backward(64));
  EXPECT_EQ(separate.dkdv.threads, 128);
  EXPECT_EQ(separate.dq.threads, 4 * 64);  // block_m / 16 waves
  EXPECT_EQ(separate.dq.smem_bytes, hip_bwd_dq_lds_bytes(det({64, 64, 2, 1}), backward(64)));
}

TEST(HipBackwardConfig, EveryLegalConfigFitsTheDevice) {
  for (const char* arch : {"gfx90a", "gfx942"})
    for (int d : {8, 64, 96, 128, 192, 256})
      for (bool deterministic : {false, true}) {
        const DeviceSpec device = gfx(arch);
        const AttentionProblem p = backward(d, deterministic);
        const auto legal = legal_hip_configs(p, device);
        ASSERT_FALSE(legal.empty()) << arch << " d" << d << " deterministic " << deterministic;
        bool any_atomic = false, any_separate = false;
        for (const AttentionConfig& c : legal) {
          const BackwardShapes shapes = hip_backward_shapes(c, p);
          EXPECT_LE(shapes.dkdv.smem_bytes, 65536) << c.to_string();
          EXPECT_LE(shapes.dq.smem_bytes, 65536) << c.to_string();
          EXPECT_LE(hip_bwd_dkdv_estimated_registers(c, p), hip_register_budget(c, device))
              << c.to_string();
          EXPECT_LE(hip_bwd_dq_estimated_registers(c, p),
                    hip_wave_register_budget(hip_bwd_dq_waves(c), device))
              << c.to_string();
          EXPECT_EQ(c.block_n % (16 * c.warps), 0) << c.to_string();
          EXPECT_LE(c.block_n / c.warps, 32) << c.to_string();
          any_atomic |= c.dq == DqMode::Atomic;
          any_separate |= c.dq == DqMode::Separate;
          Result<KernelSource> source = render_hip_attention(p, c);
          EXPECT_TRUE(source.ok()) << c.to_string() << ": " << source.error().describe();
        }
        // A deterministic problem gets separate dQ kernels only; the others both kinds.
        EXPECT_EQ(any_atomic, !deterministic) << arch << " d" << d;
        EXPECT_TRUE(any_separate) << arch << " d" << d;
        EXPECT_TRUE(std::is_sorted(legal.begin(), legal.end()));
        EXPECT_EQ(std::set<AttentionConfig>(legal.begin(), legal.end()).size(), legal.size());
        Result<AttentionConfig> def = default_hip_config(p, device);
        ASSERT_TRUE(def.ok()) << def.error().describe();
        EXPECT_TRUE(check_hip_config(*def, p, device).ok()) << def->to_string();
        EXPECT_EQ(def->dq, deterministic ? DqMode::Separate : DqMode::Atomic);
        // The legal set is the same for either dtype and causal setting (the compile test relies
        // on it).
        AttentionProblem other = backward(d, deterministic, DType::F16);
        other.causal = false;
        EXPECT_EQ(legal_hip_configs(other, device), legal) << arch << " d" << d;
      }
}

TEST(HipBackwardConfig, Defaults) {
  const DeviceSpec device = gfx("gfx90a");
  // Atomic, 4 waves (one per SIMD), the most keys per workgroup, then the largest Q/dO block.
  EXPECT_EQ(default_hip_config(backward(64), device)->to_string(), "m64n128w4s1");
  EXPECT_EQ(default_hip_config(backward(128), device)->to_string(), "m32n128w4s1");
  EXPECT_EQ(default_hip_config(backward(256), device)->to_string(), "m16n64w4s1");
  EXPECT_EQ(default_hip_config(backward(128, true), device)->to_string(), "m32n64w4s1-det");
  EXPECT_EQ(default_hip_config(backward(256, true), device)->to_string(), "m16n32w2s1-det");
}

TEST(HipBackwardConfig, IllegalConfigsSayWhy) {
  const DeviceSpec device = gfx("gfx90a");
  auto why = [&](AttentionConfig c, const AttentionProblem& p) {
    Status status = check_hip_config(c, p, device);
    return status.ok() ? std::string("legal") : status.error().message;
  };
  auto has = [](const std::string& text, const char* part) {
    return text.find(part) != std::string::npos;
  };
  EXPECT_EQ(why({32, 128, 4, 1}, backward(128)), "legal");
  EXPECT_TRUE(has(why({32, 128, 4, 1}, backward(128, true)), "deterministic"));
  EXPECT_EQ(why(det({32, 64, 4, 1}), backward(128, true)), "legal");
  EXPECT_TRUE(has(why(det({128, 64, 4, 1}), problem(128)), "backward pass only"));
  EXPECT_TRUE(has(why({128, 64, 4, 1}, backward(128)), "block_m = 128 not in {16, 32, 64}"));
  EXPECT_TRUE(has(why({32, 256, 4, 1}, backward(128)), "block_n = 256 not in {32, 64, 128}"));
  EXPECT_TRUE(has(why({32, 32, 1, 1}, backward(128)), "warps (wavefronts) = 1 not in {2, 4, 8}"));
  EXPECT_TRUE(has(why({32, 128, 2, 1}, backward(128)), "16 or 32 keys per wave"));
  EXPECT_TRUE(has(why({32, 64, 2, 3}, backward(128)), "stages (LDS buffers) = 3"));
  EXPECT_TRUE(has(why({16, 64, 4, 1}, backward(64)), "block_m * padded head dim = 16 * 64"));
  EXPECT_EQ(why({16, 64, 4, 1}, backward(128)), "legal");
  EXPECT_TRUE(has(why({64, 64, 4, 1}, backward(128)), "the dK/dV kernel's LDS 76288 B exceeds"));
  EXPECT_TRUE(has(why(det({32, 128, 4, 1}), backward(128)), "the dQ kernel's LDS 99328 B"));
  EXPECT_TRUE(has(why({16, 128, 4, 1}, backward(256)), "the dK/dV kernel's estimated"));
  EXPECT_TRUE(has(why(det({16, 64, 4, 1}), backward(256)), "K/V tile copies per thread"));
  AttentionProblem f32 = backward(64);
  f32.dtype = DType::F32;
  EXPECT_TRUE(has(why({32, 64, 4, 1}, f32), "f16 and bf16"));
  f32.pass = Pass::Forward;
  EXPECT_TRUE(has(why({128, 64, 4, 1}, f32), "f16 and bf16"));
}

TEST(HipBackwardConfig, PlanShowsBothKernelsAndTheLegalSet) {
  const AttentionProblem p = backward(128);
  const std::string plan = explain_hip_plan(p, gfx("gfx90a"));
  EXPECT_NE(plan.find("dK/dV kernel"), std::string::npos) << plan;
  EXPECT_NE(plan.find("dQ kernel (-det)"), std::string::npos) << plan;
  EXPECT_NE(plan.find("stages * 2 * (Bm * 128 + 128 * (Bm + 4)) * 2"), std::string::npos) << plan;
  EXPECT_NE(plan.find("m32n64w4s1-det"), std::string::npos) << plan;
  EXPECT_NE(plan.find(std::to_string(legal_hip_configs(p, gfx("gfx90a")).size()) +
                      " legal configs. Default (untuned): m32n128w4s1"),
            std::string::npos)
      << plan;
}

TEST(HipBackwardConfig, RenderDefinesTheThreeEntries) {
  const AttentionProblem p = backward(128);
  auto atomic = render_hip_attention(p, {32, 128, 4, 1});
  ASSERT_TRUE(atomic.ok()) << atomic.error().describe();
  EXPECT_EQ(atomic->entries, (std::vector<std::string>{kBackwardPreprocessEntry, kBackwardDkDvEntry,
                                                       kBackwardDqEntry}));
  EXPECT_EQ(atomic->label, "attention_bwd_hip d128 bf16 causal m32n128w4s1");
  EXPECT_NE(atomic->text.find("flashjit_hip::BwdTraits</*head_dim=*/128, /*block_m=*/32, "
                              "/*block_n=*/128, /*waves=*/4, /*stages=*/1, /*bf16=*/true, "
                              "/*causal=*/true, /*dq_atomic=*/true>"),
            std::string::npos);
  EXPECT_NE(atomic->text.find("backward_dq_convert<128, true>"), std::string::npos);
  EXPECT_EQ(atomic->text.find("#include"), std::string::npos);
  auto separate = render_hip_attention(p, det({32, 64, 4, 1}));
  ASSERT_TRUE(separate.ok()) << separate.error().describe();
  EXPECT_NE(separate->text.find("attention_backward_dq<Config>"), std::string::npos);
  EXPECT_NE(separate->text.find("__launch_bounds__(Config::kDqThreads)"), std::string::npos);
  EXPECT_FALSE(render_hip_attention(p, {32, 128, 4, 3}).ok());
  AttentionProblem deterministic = p;
  deterministic.deterministic = true;
  EXPECT_FALSE(render_hip_attention(deterministic, {32, 128, 4, 1}).ok());
}

// Variants in the backward (templates/hip/attention_bwd.hpp's FLASHJIT_VARIANT blocks): every
// kind and combination gets legal configs at every head dim on both targets, within the plain
// problem's legal set (a user expression adds its register allowance to both kernels'
// estimates); its dK/dV and dQ kernels enter through the *_variant entries.
TEST(HipBackwardConfig, VariantProblemsGetHipConfigs) {
  for (const char* arch : {"gfx90a", "gfx942"})
    for (int d : {64, 128, 256})
      for (bool deterministic : {false, true}) {
        const DeviceSpec device = gfx(arch);
        const AttentionProblem plain = backward(d, deterministic);
        const std::vector<AttentionConfig> plain_legal = legal_hip_configs(plain, device);
        for (const testing::NamedVariant& named : testing::backward_compile_variants()) {
          AttentionProblem p = plain;
          p.variant = named.variant;
          const std::string where = std::string(named.name) + " " + arch + " d" +
                                    std::to_string(d) + (deterministic ? " det" : "");
          ASSERT_TRUE(validate(p).ok()) << where << ": " << validate(p).error().describe();
          const std::vector<AttentionConfig> legal = legal_hip_configs(p, device);
          ASSERT_FALSE(legal.empty()) << where;
          const bool user_expression = !p.variant.score_mod.empty() || !p.variant.mask_mod.empty();
          for (const AttentionConfig& c : legal) {
            EXPECT_NE(std::find(plain_legal.begin(), plain_legal.end(), c), plain_legal.end())
                << where << " " << c.to_string();
            EXPECT_EQ(hip_bwd_dkdv_estimated_registers(c, p),
                      hip_bwd_dkdv_estimated_registers(c, plain) + (user_expression ? 48 : 0))
                << where << " " << c.to_string();
          }
          if (!user_expression) {
            EXPECT_EQ(legal, plain_legal) << where;
          }
          const AttentionConfig def = default_hip_config(p, device).value();
          const Result<KernelSource> source = render_hip_attention(p, def);
          ASSERT_TRUE(source.ok()) << where << ": " << source.error().describe();
          EXPECT_NE(source->text.find(render_variant_prelude(p).value()), std::string::npos)
              << where;
          EXPECT_NE(source->text.find("attention_backward_dkdv_variant<Config>"), std::string::npos)
              << where;
          EXPECT_EQ(source->text.find("attention_backward_dq_variant<Config>") != std::string::npos,
                    deterministic)
              << where;
        }
      }
  // Packed documents: the plain problem's legal set; the row kernels through their *_varlen
  // entries.
  for (bool deterministic : {false, true}) {
    AttentionProblem varlen = AttentionProblem::make_varlen(8, 16, 4, 4096, 4096, 20000, 20000, 128,
                                                            DType::BF16, /*causal=*/true)
                                  .with_pass(Pass::Backward);
    varlen.deterministic = deterministic;
    AttentionProblem plain = backward(128, deterministic);
    EXPECT_EQ(legal_hip_configs(varlen, gfx("gfx90a")), legal_hip_configs(plain, gfx("gfx90a")));
    const AttentionConfig def = default_hip_config(varlen, gfx("gfx90a")).value();
    const Result<KernelSource> source = render_hip_attention(varlen, def);
    ASSERT_TRUE(source.ok()) << source.error().describe();
    EXPECT_NE(source->text.find("flashjit_hip::backward_preprocess_varlen<128, true>(params);"),
              std::string::npos);
    EXPECT_EQ(source->text.find("flashjit_hip::backward_dq_convert_varlen<128, true>(params);") !=
                  std::string::npos,
              !deterministic);
  }
}

}  // namespace
}  // namespace flashjit
