// The HIP decode budget (generator/decode_config.hpp's HIP section, templates/hip/decode.hpp):
// the legal tiles and their arithmetic, the decode family offered for decode problems beside the
// prefill configs and alone for paged / per-sequence-length problems, the default, the plan, the
// rendered source.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "generator/decode_config.hpp"
#include "generator/hip_config.hpp"
#include "generator/render.hpp"
#include "generator/render_decode.hpp"

namespace flashjit {
namespace {

DeviceSpec gfx(const char* arch) { return known_device(arch).value(); }

AttentionProblem decode(int head_dim = 128, int64_t heads_q = 32, int64_t seqlen_q = 1) {
  return AttentionProblem::make(4, heads_q, 8, seqlen_q, 8192, head_dim, DType::BF16, false);
}

AttentionProblem paged(int head_dim = 128, int64_t seqlen_q = 1) {
  return decode(head_dim, 32, seqlen_q).with_paged_kv(16, 4 * 8192 / 16);
}

void expect_error(const Status& status, const std::string& text) {
  ASSERT_FALSE(status.ok()) << "expected an error containing '" << text << "'";
  EXPECT_NE(status.error().message.find(text), std::string::npos) << status.error().message;
}

AttentionConfig tile(int m, int n, int waves, int stages, int splits = 0) {
  AttentionConfig c{m, n, waves, stages, KernelFamily::Decode};
  c.splits = splits;
  return c;
}

TEST(HipDecodeConfig, LdsArithmetic) {
  // max(stages * (Bc * dp + dp * (Bc + 4)) * 2, waves * Bm * (dp + 2) * 4).
  EXPECT_EQ(hip_decode_lds_bytes(tile(16, 64, 4, 1), decode()), (64 * 128 + 128 * 68) * 2);
  EXPECT_EQ(hip_decode_lds_bytes(tile(32, 32, 4, 1), decode()), 4 * 32 * 130 * 4);  // the merge
  EXPECT_EQ(hip_decode_lds_bytes(tile(16, 32, 2, 2), decode(72)), 2 * (32 * 128 + 128 * 36) * 2);
}

TEST(HipDecodeConfig, EveryLegalConfigFitsTheDevice) {
  for (const char* arch : {"gfx90a", "gfx942"})
    for (int d : {64, 72, 128, 256})
      for (const AttentionProblem& p : {decode(d), paged(d), decode(d, 32, 4)}) {
        const DeviceSpec device = gfx(arch);
        const std::vector<AttentionConfig> legal = legal_hip_decode_configs(p, device);
        ASSERT_FALSE(legal.empty()) << arch << " d" << d << " " << p.to_string();
        for (const AttentionConfig& c : legal) {
          EXPECT_EQ(c.family, KernelFamily::Decode);
          EXPECT_TRUE(check_hip_config(c, p, device).ok()) << c.to_string();
          EXPECT_LE(hip_decode_lds_bytes(c, p), device.smem_per_block_optin) << c.to_string();
          EXPECT_LE(hip_decode_estimated_registers(c, p), hip_wave_register_budget(c.warps, device))
              << c.to_string();
          EXPECT_TRUE(render_hip_attention(p, c).ok()) << c.to_string();
        }
        // block_m 32 only where the packed rows need it (4:1 x 4 queries = 16 rows: not yet).
        EXPECT_EQ(std::any_of(legal.begin(), legal.end(),
                              [](const AttentionConfig& c) { return c.block_m == 32; }),
                  decode_packed_rows(p) > 16)
            << p.to_string();
      }
}

TEST(HipDecodeConfig, OfferedForDecodeProblemsAndAloneForPagedOnes) {
  const DeviceSpec device = gfx("gfx90a");
  // A contiguous decode problem: the prefill configs and the decode family, tuned together; the
  // untuned default is a decode config.
  const std::vector<AttentionConfig> legal = legal_hip_configs(decode(), device);
  EXPECT_TRUE(std::any_of(legal.begin(), legal.end(), [](const AttentionConfig& c) {
    return c.family == KernelFamily::Decode && c.splits == 0;
  }));
  EXPECT_TRUE(std::any_of(legal.begin(), legal.end(), [](const AttentionConfig& c) {
    return c.family == KernelFamily::Decode && c.splits == 128;
  }));
  EXPECT_TRUE(std::any_of(legal.begin(), legal.end(), [](const AttentionConfig& c) {
    return c.family != KernelFamily::Decode;
  }));
  EXPECT_EQ(default_hip_config(decode(), device)->family, KernelFamily::Decode);
  // Paged or per-sequence lengths: the decode family only (and at any seqlen_q); a prefill
  // config says why.
  AttentionProblem seqlens = decode();
  seqlens.kv.seqlens_k = true;
  for (const AttentionProblem& p : {paged(), paged(128, 40), seqlens}) {
    const std::vector<AttentionConfig> only = legal_hip_configs(p, device);
    ASSERT_FALSE(only.empty()) << p.to_string();
    for (const AttentionConfig& c : only)
      EXPECT_EQ(c.family, KernelFamily::Decode) << c.to_string();
    EXPECT_EQ(default_hip_config(p, device)->family, KernelFamily::Decode);
  }
  expect_error(check_hip_config({128, 64, 4, 1}, paged(), device),
               "is read by the -decode family only");
  // A prefill problem: no decode configs; a prefill config with splits is refused.
  const AttentionProblem prefill = AttentionProblem::make(1, 8, 8, 512, 512, 128, DType::BF16, 0);
  for (const AttentionConfig& c : legal_hip_configs(prefill, device))
    EXPECT_NE(c.family, KernelFamily::Decode) << c.to_string();
  AttentionConfig split_prefill{128, 64, 4, 1};
  split_prefill.splits = 4;
  expect_error(check_hip_config(split_prefill, prefill, device), "-split<N>");
}

TEST(HipDecodeConfig, IllegalConfigsSayWhy) {
  const DeviceSpec device = gfx("gfx90a");
  expect_error(check_hip_config(tile(64, 64, 4, 1), decode(), device), "block_m = 64");
  expect_error(check_hip_config(tile(16, 256, 4, 1), decode(), device), "block_n = 256");
  expect_error(check_hip_config(tile(16, 64, 8, 1), decode(), device), "warps (wavefronts) = 8");
  expect_error(check_hip_config(tile(16, 64, 4, 3), decode(), device), "stages (LDS buffers) = 3");
  expect_error(check_hip_config(tile(16, 32, 4, 1), decode(), device),
               "block_n / waves = 8 keys per wave");
  expect_error(check_hip_config(tile(16, 128, 1, 1), decode(), device),
               "32 K/V tile copies per thread exceed 8");
  expect_error(check_hip_config(tile(32, 32, 1, 1), decode(256, 32, 4), device),
               "the O accumulator takes 128 registers");
  expect_error(check_hip_config(tile(16, 64, 4, 1, 129), decode(), device), "splits = 129");
  expect_error(check_hip_config(tile(16, 64, 4, 1), decode().with_pass(Pass::Backward), device),
               "the -decode family is a forward kernel");
  AttentionProblem f32 = decode();
  f32.dtype = DType::F32;
  expect_error(check_hip_config(tile(16, 64, 4, 1), f32, device), "dtype = f32");
  // Contiguous with more than 16 queries: not a decode config's problem.
  expect_error(check_hip_config(tile(16, 64, 4, 1), decode(128, 32, 17), device), "seqlen_q = 17");
}

TEST(HipDecodeConfig, DefaultAndAutoSplits) {
  const DeviceSpec device = gfx("gfx90a");
  // 4 packed rows: block_m 16; at d 128 no 4-wave tile leaves LDS for a second workgroup on a
  // CU of 64 KiB (m16n64w4s1 takes 33792 B), 2 waves of 16 keys do (17408 B).
  EXPECT_EQ(default_hip_decode_config(decode(), device)->to_string(), "m16n32w2s1-decode");
  EXPECT_EQ(default_hip_decode_config(decode(128, 32, 8), device)->block_m, 32);  // 32 rows
  // 110 CUs x 2 workgroups over batch 4 x 8 kv heads x 1 tile = 6 splits (8192 keys: 128 blocks,
  // evened out to ceil(128 / ceil(128 / 6)) = 6).
  EXPECT_EQ(hip_decode_splits(tile(16, 64, 4, 1), decode(), device), 6);
  EXPECT_EQ(hip_decode_splits(tile(16, 64, 4, 1, 16), decode(), device), 16);
}

TEST(HipDecodeConfig, PlanShowsTheBudgetAndTheLegalSet) {
  const std::string plan = explain_hip_plan(paged(), gfx("gfx90a"));
  EXPECT_NE(plan.find("templates/hip/decode.hpp"), std::string::npos) << plan;
  EXPECT_NE(plan.find("m16n64w4s1-decode"), std::string::npos) << plan;
  EXPECT_NE(plan.find("illegal: LDS"), std::string::npos) << plan;
  EXPECT_NE(plan.find("Default (untuned): m16n32w2s1-decode"), std::string::npos) << plan;
}

TEST(HipDecodeConfig, RenderDefinesTheSplitEntryAndIncludesNothing) {
  const AttentionProblem p = paged(72);
  auto source = render_hip_attention(p, tile(16, 64, 4, 1, 8));
  ASSERT_TRUE(source.ok()) << source.error().describe();
  ASSERT_EQ(source->entries, std::vector<std::string>{kDecodeSplitEntry});
  EXPECT_NE(source->label.find("decode_hip d72 bf16"), std::string::npos) << source->label;
  EXPECT_EQ(source->label.find("split8"), std::string::npos) << source->label;  // one binary
  EXPECT_NE(source->text.find("flashjit_hip::DecodeTraits</*head_dim=*/72, /*block_m=*/16, "
                              "/*block_n=*/64, /*warps=*/4, /*stages=*/1, /*bf16=*/true, "
                              "/*causal=*/false, /*page_size=*/16>"),
            std::string::npos);
  EXPECT_EQ(source->text.find("#include"), std::string::npos);
  EXPECT_FALSE(render_hip_attention(p, tile(16, 64, 4, 3)).ok());  // 3 stages: not in the template
}

}  // namespace
}  // namespace flashjit
