// The block map of a mask_mod (issue 31) without a GPU: which problems and kernels read one, the
// map's layout, the generated builder compiling with NVRTC without spills for sm80 and sm90, the
// mask-using configs' sources (the map as a second parameter) compiling without spills, and plain
// and other variant sources rendered as before (no map).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "generator/block_mask.hpp"
#include "generator/config.hpp"
#include "generator/render.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"

namespace flashjit {
namespace {

AttentionProblem mask_problem(const std::string& mask_mod, bool causal = true) {
  AttentionProblem p = AttentionProblem::make(2, 4, 2, 8192, 8192, 128, DType::BF16, causal);
  p.variant.mask_mod = mask_mod;
  return p;
}

TEST(BlockMask, BatchOrHeadMakesTheMapPerHead) {
  EXPECT_FALSE(mask_mod_uses_batch_or_head("(q_idx / 2048) == (kv_idx / 2048)"));
  EXPECT_TRUE(mask_mod_uses_batch_or_head("head % 2 == 0 || q_idx >= kv_idx"));
  EXPECT_TRUE(mask_mod_uses_batch_or_head("(kv_idx+batch)%5!=0"));
  EXPECT_FALSE(mask_mod_uses_batch_or_head("heads_q > 0 && my_batch < 1 && 1e5f > kv_idx"));
  EXPECT_FALSE(block_mask_shape(mask_problem("q_idx >= kv_idx"), 128, 64).per_head);
  const BlockMaskShape per_head = block_mask_shape(mask_problem("head != 1"), 128, 64);
  EXPECT_TRUE(per_head.per_head);
  EXPECT_EQ(per_head.maps(), 8);
  // One map: the same shape whatever the batch and heads (a cached map serves them all).
  AttentionProblem other = mask_problem("q_idx >= kv_idx");
  other.batch = 5;
  other.heads_q = other.heads_kv = 3;
  EXPECT_EQ(block_mask_shape(other, 128, 64),
            block_mask_shape(mask_problem("q_idx >= kv_idx"), 128, 64));
  EXPECT_EQ(block_mask_shape(other, 128, 64).maps(), 1);
}

TEST(BlockMask, TheLayoutHoldsEveryArrayApartAndAligned) {
  BlockMaskShape s = block_mask_shape(mask_problem("head != 1"), 128, 64);
  s.seqlen_q = 1000;
  s.seqlen_k = 17;
  EXPECT_EQ(s.q_tiles(), 8);
  EXPECT_EQ(s.k_tiles(), 1);
  const size_t ints_q = static_cast<size_t>(s.maps() * s.q_tiles()) * 4;
  const size_t ints_qk = static_cast<size_t>(s.maps() * s.q_tiles() * s.k_tiles()) * 4;
  const size_t ints_k = static_cast<size_t>(s.maps() * s.k_tiles()) * 4;
  EXPECT_GE(s.q_list_offset(), s.q_count_offset() + ints_q);
  EXPECT_GE(s.k_count_offset(), s.q_list_offset() + ints_qk);
  EXPECT_GE(s.k_list_offset(), s.k_count_offset() + ints_k);
  EXPECT_GE(s.states_offset(), s.k_list_offset() + ints_qk);
  EXPECT_GE(s.bytes(), s.states_offset() + ints_qk / 4);
  for (size_t offset :
       {s.q_list_offset(), s.k_count_offset(), s.k_list_offset(), s.states_offset(), s.bytes()})
    EXPECT_EQ(offset % 256, 0u);
}

TEST(BlockMask, OnlyMaskModKernelsOfTheFamiliesThatReadItTakeAMap) {
  AttentionConfig mma = AttentionConfig::parse("m128n64w4s2").value();
  EXPECT_TRUE(block_mask_applies(mask_problem("q_idx >= kv_idx"), mma));
  AttentionProblem plain = mask_problem("");
  EXPECT_FALSE(block_mask_applies(plain, mma));
  AttentionProblem window = plain;
  window.variant.window_left = 128;
  EXPECT_FALSE(block_mask_applies(window, mma));
  AttentionProblem varlen =
      AttentionProblem::make_varlen(3, 4, 2, 100, 100, 250, 250, 128, DType::BF16, true);
  varlen.variant.mask_mod = "q_idx >= kv_idx";
  EXPECT_FALSE(block_mask_applies(varlen, mma));
  // The rendered sources: the map as a second parameter only where it applies.
  const std::string parameter = "const __grid_constant__ FlashjitBlockMask block_mask";
  Result<KernelSource> masked = render_cuda_attention(mask_problem("q_idx >= kv_idx"), mma);
  ASSERT_TRUE(masked.ok()) << masked.error().describe();
  EXPECT_TRUE(masked->block_mask);
  EXPECT_NE(masked->text.find(parameter), std::string::npos);
  EXPECT_NE(masked->text.find("#define FLASHJIT_VARIANT_BLOCK_MASK 1"), std::string::npos);
  for (const AttentionProblem& p : {plain, window}) {
    Result<KernelSource> source = render_cuda_attention(p, mma);
    ASSERT_TRUE(source.ok()) << source.error().describe();
    EXPECT_FALSE(source->block_mask);
    EXPECT_EQ(source->text.find(parameter), std::string::npos);
    EXPECT_EQ(source->text.find("#define FLASHJIT_VARIANT_BLOCK_MASK 1"), std::string::npos);
  }
  // A mask_mod without one is refused by the builder's renderer.
  EXPECT_FALSE(render_block_mask_builder(plain).ok());
}

void expect_no_spills(const KernelSource& source, int arch,
                      const std::vector<std::string>& entries) {
  Result<Binary> binary = cuda::nvrtc_compile(source, arch);
  ASSERT_TRUE(binary.ok()) << binary.error().describe();
  for (const std::string& entry : entries) {
    const cuda::PtxasReport report = cuda::parse_ptxas_report(binary->compile_log, entry);
    EXPECT_EQ(report.spill_store_bytes, 0) << source.label << " " << entry << " sm" << arch;
    EXPECT_EQ(report.spill_load_bytes, 0) << source.label << " " << entry << " sm" << arch;
  }
}

TEST(BlockMaskCompile, TheBuilderCompilesWithoutSpills) {
  AttentionProblem windowed = mask_problem("(q_idx / 2048) == (kv_idx / 2048)");
  windowed.variant.window_left = 300;
  windowed.variant.prefix = 16;
  for (const AttentionProblem& p : {mask_problem("(q_idx / 2048) == (kv_idx / 2048)"),
                                    mask_problem("(kv_idx + head) % 5 != 0", false), windowed}) {
    Result<KernelSource> source = render_block_mask_builder(p);
    ASSERT_TRUE(source.ok()) << source.error().describe();
    for (int arch : {80, 90}) expect_no_spills(*source, arch, source->entries);
  }
  // One source per visibility: a score_mod or another batch size renders the same builder.
  AttentionProblem other = mask_problem("(q_idx / 2048) == (kv_idx / 2048)");
  other.batch = 7;
  other.variant.score_mod = "score * 2.0f";
  EXPECT_EQ(render_block_mask_builder(other)->text,
            render_block_mask_builder(mask_problem("(q_idx / 2048) == (kv_idx / 2048)"))->text);
}

TEST(BlockMaskCompile, MaskConfigsCompileWithoutSpills) {
  // (Tiles that compile without spills with the per-element mask_mod of before: at 32 rows per
  // warp, m128n64w4s2 spilled 176 bytes then, 216 with the map. Two per family, to stay short.)
  for (const char* tile : {"m64n64w4s2", "m128n128w8s2"}) {
    AttentionProblem p = mask_problem("(q_idx / 2048) == (kv_idx / 2048)");
    Result<KernelSource> source = render_cuda_attention(p, AttentionConfig::parse(tile).value());
    ASSERT_TRUE(source.ok()) << source.error().describe();
    ASSERT_TRUE(source->block_mask);
    expect_no_spills(*source, 80, {kAttentionForwardEntry});
  }
  // The mma backward (its dK/dV and dQ kernels), Atomic and -det, at tiles without spills before.
  for (const char* tile : {"m64n64w8s2", "m128n32w8s2-det"}) {
    AttentionProblem p =
        mask_problem("(q_idx / 2048) == (kv_idx / 2048)").with_pass(Pass::Backward);
    Result<KernelSource> source = render_cuda_attention(p, AttentionConfig::parse(tile).value());
    ASSERT_TRUE(source.ok()) << source.error().describe();
    ASSERT_TRUE(source->block_mask);
    expect_no_spills(*source, 80, {kBackwardDkDvEntry, kBackwardDqEntry});
  }
  // The wgmma backward (sm90a): the default -det tile, Atomic with one and two warpgroups.
  for (const char* tile : {"m64n64w4s2-wgmma-det", "m64n128w8s2-wgmma"}) {
    AttentionProblem p =
        mask_problem("(q_idx / 2048) == (kv_idx / 2048)").with_pass(Pass::Backward);
    Result<KernelSource> source = render_cuda_attention(p, AttentionConfig::parse(tile).value());
    ASSERT_TRUE(source.ok()) << source.error().describe();
    ASSERT_TRUE(source->block_mask);
    expect_no_spills(*source, 90, {kBackwardDkDvEntry, kBackwardDqEntry});
  }
  // The -ws family (sm90a): two consumers taking turns, one consumer (-persist: the same tile
  // code).
  for (const char* tile : {"m128n128w12s2-ws-pp", "m64n64w8s2-ws"}) {
    AttentionProblem p = mask_problem("(q_idx / 2048) == (kv_idx / 2048)");
    Result<KernelSource> source = render_cuda_attention(p, AttentionConfig::parse(tile).value());
    ASSERT_TRUE(source.ok()) << source.error().describe();
    ASSERT_TRUE(source->block_mask);
    expect_no_spills(*source, 90, {kAttentionForwardEntry});
  }
}

}  // namespace
}  // namespace flashjit
