// The decode family's problem fields, config names, budget and enumeration
// (generator/decode_config.hpp, KvCache in generator/problem.hpp): typed errors naming the bad
// value, the split formula, which families a problem enumerates, the render contract.
#include "generator/decode_config.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "generator/cpu_config.hpp"
#include "generator/hip_config.hpp"
#include "generator/render.hpp"
#include "generator/render_decode.hpp"

namespace flashjit {
namespace {

DeviceSpec sm(int arch) { return *known_device("sm" + std::to_string(arch)); }

AttentionProblem decode(int64_t batch = 4, int64_t seqlen_k = 8192) {
  return AttentionProblem::make(batch, 32, 8, 1, seqlen_k, 128, DType::BF16, false);
}

void expect_error(const Status& status, const std::string& text) {
  ASSERT_FALSE(status.ok()) << "expected an error containing: " << text;
  EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(status.error().message.find(text), std::string::npos) << status.error().message;
}

TEST(DecodeConfig, NamesRoundTrip) {
  for (const char* name : {"m16n64w4s3-decode", "m32n128w8s2-decode-split8", "m16n64w1s1-decode"}) {
    Result<AttentionConfig> c = AttentionConfig::parse(name);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->family, KernelFamily::Decode);
    EXPECT_EQ(c->to_string(), name);
  }
  EXPECT_EQ(AttentionConfig::parse("m16n64w4s3-decode-split8")->splits, 8);
  EXPECT_EQ(AttentionConfig::parse("m16n64w4s3-decode")->splits, 0);
  EXPECT_FALSE(AttentionConfig::parse("m128n64w4s2-split4").ok());
  EXPECT_FALSE(AttentionConfig::parse("m16n64w4s3-decode-split0").ok());
}

TEST(DecodeConfig, PagedProblemValidation) {
  const AttentionProblem paged = decode().with_paged_kv(16, 4 * 512);
  EXPECT_TRUE(validate(paged).ok()) << validate(paged).error().message;
  EXPECT_EQ(paged.kv.max_pages, 512);
  EXPECT_EQ(paged.kv_span(), 4 * 512 * 16 * 8 * 128);
  for (int bad : {8, 24, 272}) {
    AttentionProblem p = paged;
    p.kv.page_size = bad;
    expect_error(validate(p), "page_size = " + std::to_string(bad) + ": must be a multiple of 16");
  }
  AttentionProblem small = paged;
  small.kv.max_pages = 100;
  expect_error(validate(small), "fewer than seqlen_k = 8192");
  AttentionProblem no_lengths = paged;
  no_lengths.kv.seqlens_k = false;
  expect_error(validate(no_lengths), "needs per-sequence lengths");
  AttentionProblem no_pages = paged;
  no_pages.kv.num_pages = 0;
  expect_error(validate(no_pages), "num_pages = 0");
  expect_error(validate(paged.with_pass(Pass::Backward)), "for the forward pass");
  AttentionProblem stray = decode();
  stray.kv.num_pages = 3;
  expect_error(validate(stray), "must be 0 without a page size");
}

TEST(DecodeConfig, WhichProblemsEnumerateTheFamily) {
  EXPECT_TRUE(is_decode_problem(decode()));
  EXPECT_FALSE(is_decode_problem(AttentionProblem::make(1, 8, 8, 4096, 4096, 128, DType::BF16,
                                                        false)));  // prefill
  EXPECT_FALSE(is_decode_problem(decode(4, 64)));                  // too few keys to matter
  const AttentionProblem paged_prefill =
      AttentionProblem::make(1, 8, 8, 512, 4096, 128, DType::BF16, true).with_paged_kv(16, 256);
  EXPECT_TRUE(is_decode_problem(paged_prefill));  // chunked prefill on a paged cache
  // A decode problem: prefill families and decode configs, tuned together; default decode.
  const std::vector<AttentionConfig> legal = legal_configs(decode(), sm(90));
  EXPECT_TRUE(std::any_of(legal.begin(), legal.end(), [](const AttentionConfig& c) {
    return c.family == KernelFamily::Wgmma;
  }));
  EXPECT_TRUE(std::any_of(legal.begin(), legal.end(), [](const AttentionConfig& c) {
    return c.family == KernelFamily::Decode && c.splits == 128;
  }));
  EXPECT_EQ(default_config(decode(), sm(90))->family, KernelFamily::Decode);
  // Paged: the decode family only; a prefill config says why.
  for (const AttentionConfig& c : legal_configs(paged_prefill, sm(90)))
    EXPECT_EQ(c.family, KernelFamily::Decode) << c.to_string();
  expect_error(check_config({128, 64, 4, 2}, paged_prefill, sm(90)),
               "is read by the -decode family only");
  // Contiguous with more than 16 queries: not a decode config's problem.
  expect_error(
      check_config({16, 64, 4, 2, KernelFamily::Decode},
                   AttentionProblem::make(1, 8, 8, 17, 4096, 128, DType::BF16, false), sm(80)),
      "seqlen_q = 17");
  // HIP: not yet (stage 2), an Unsupported error naming the family.
  const Status hip =
      check_hip_config({16, 64, 4, 2, KernelFamily::Decode}, decode(), *known_device("gfx90a"));
  ASSERT_FALSE(hip.ok());
  EXPECT_EQ(hip.error().code, ErrorCode::Unsupported);
  // The CPU: its own decode configs (warps = stages = 1).
  const CpuSpec cpu = known_cpu();
  EXPECT_EQ(default_cpu_config(decode(), cpu)->family, KernelFamily::Decode);
  EXPECT_TRUE(check_cpu_config({16, 128, 1, 1, KernelFamily::Decode}, decode(), cpu).ok());
  expect_error(check_cpu_config({16, 128, 4, 2, KernelFamily::Decode}, decode(), cpu),
               "must be 1 on the CPU");
}

TEST(DecodeConfig, TemplateConstraintsAndBudget) {
  const AttentionProblem p = decode();
  expect_error(check_decode_config({16, 32, 4, 2, KernelFamily::Decode}, p, sm(80)),
               "block_n / warps = 8 keys per warp");
  expect_error(check_decode_config({64, 64, 4, 2, KernelFamily::Decode}, p, sm(80)),
               "block_m = 64 not in {16, 32}");
  AttentionConfig too_many{16, 64, 4, 2, KernelFamily::Decode};
  too_many.splits = 129;
  expect_error(check_decode_config(too_many, p, sm(80)), "splits = 129");
  // smem = Q + max(K/V stages, the warps' merge): 16*128*2 + max(2*3*64*128*2, 4*16*130*4).
  const DecodeResources r = decode_resources({16, 64, 4, 3, KernelFamily::Decode}, p);
  EXPECT_EQ(r.smem_bytes, 16 * 128 * 2 + 2 * 3 * 64 * 128 * 2);
  EXPECT_EQ(r.threads, 128);
  EXPECT_EQ(r.copies, 64 * 16 / 128);
  const DecodeResources merge = decode_resources({32, 64, 8, 2, KernelFamily::Decode}, p);
  EXPECT_EQ(merge.smem_bytes, 32 * 128 * 2 + 8 * 32 * 130 * 4);
  const std::string plan = explain_plan(p, sm(90));
  EXPECT_NE(plan.find("packed rows"), std::string::npos) << plan;
  EXPECT_NE(plan.find("Default (untuned): m16n64w4s"), std::string::npos) << plan;
}

TEST(DecodeConfig, AutoSplitsFillTheDevice) {
  const AttentionConfig tile{16, 64, 4, 3, KernelFamily::Decode};
  // batch 1 x 8 kv heads x 1 row tile = 8 CTAs; 132 SMs x 2 = 264 slots: 33 splits, then even
  // ranges over the 128 blocks of 8192 keys: ceil(128 / ceil(128 / 33)) = 32.
  EXPECT_EQ(decode_splits(tile, decode(1), 132, 2), 32);
  // Whole waves: batch 4 is 32 CTAs per split, 8 splits fill the 264 slots (9 would make 288: a
  // second wave of 24); batch 16 (128 per split): 2, not 3 (384).
  EXPECT_EQ(decode_splits(tile, decode(4), 132, 2), 8);
  EXPECT_EQ(decode_splits(tile, decode(16), 132, 2), 2);
  // The CUDA default: one CTA per SM (132 slots): batch 1 16 splits, 4 4, 16 1.
  EXPECT_EQ(decode_splits(tile, decode(1), sm(90)), 16);
  EXPECT_EQ(decode_splits(tile, decode(4), sm(90)), 4);
  EXPECT_EQ(decode_splits(tile, decode(16), sm(90)), 1);
  // A paged cache: two per SM (264 slots).
  AttentionProblem paged = decode(4);
  paged.kv.page_size = 16;
  EXPECT_EQ(decode_splits(tile, paged, sm(90)), 8);
  // batch 64: 512 CTAs already: 1 split.
  EXPECT_EQ(decode_splits(tile, decode(64), 132, 2), 1);
  // Few keys: at most one split per block.
  EXPECT_EQ(decode_splits(tile, decode(1, 130), 132, 2), 3);
  // Explicit splits are clamped to the blocks.
  AttentionConfig eight = tile;
  eight.splits = 8;
  EXPECT_EQ(decode_splits(eight, decode(1), 132, 2), 8);
  EXPECT_EQ(decode_splits(eight, decode(1, 200), 132, 2), 4);
  // The enumeration: auto, then 1, 2, 4, ... up to the blocks (200 keys / 64: 4 blocks).
  std::vector<int> splits;
  for (const AttentionConfig& c : legal_decode_configs(decode(1, 200), sm(80)))
    if (c.block_m == 16 && c.block_n == 64 && c.warps == 4 && c.stages == 3)
      splits.push_back(c.splits);
  EXPECT_EQ(splits, (std::vector<int>{0, 1, 2, 4}));
}

TEST(DecodeConfig, RenderContract) {
  const AttentionProblem paged = decode().with_paged_kv(32, 4 * 256);
  AttentionConfig c{16, 64, 4, 3, KernelFamily::Decode};
  Result<KernelSource> a = render_cuda_attention(paged, c);
  ASSERT_TRUE(a.ok()) << a.error().message;
  // One entry on a GPU: the tile's last split combines (no combine kernel).
  EXPECT_EQ(a->entries, (std::vector<std::string>{kDecodeSplitEntry}));
  EXPECT_NE(a->text.find("/*page_size=*/32"), std::string::npos);
  // The split count is not in the source: one binary serves every split choice of a tile.
  c.splits = 8;
  Result<KernelSource> b = render_cuda_attention(paged, c);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->text, b->text);
  Result<KernelSource> cpu = render_cpu_attention(paged, {16, 64, 1, 1, KernelFamily::Decode});
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  EXPECT_EQ(cpu->entries, (std::vector<std::string>{kCpuDecodeSplitEntry, kCpuDecodeCombineEntry}));
  // A prefill render of a paged problem is an error, not a source that ignores the pages.
  EXPECT_FALSE(render_cuda_attention(paged, {64, 64, 4, 2}).ok());
}

}  // namespace
}  // namespace flashjit
