#include "generator/render.hpp"

#include <gtest/gtest.h>

#include "templates/embedded.hpp"

namespace flashjit {
namespace {

TEST(Render, SourceIsSelfContainedAndNamesTheConfig) {
  auto p = AttentionProblem::make(1, 2, 2, 64, 64, 128, DType::BF16, true);
  auto source = render_cuda_attention(p, {128, 64, 4, 2});
  ASSERT_TRUE(source.ok()) << source.error().describe();
  EXPECT_EQ(source->entry(), kAttentionForwardEntry);
  EXPECT_EQ(source->label, "attention_fwd d128 bf16 causal m128n64w4s2");
  const std::string& text = source->text;
  EXPECT_NE(text.find("struct FlashjitAttentionParams"), std::string::npos);
  EXPECT_NE(text.find("Traits</*head_dim=*/128, /*block_m=*/128, /*block_n=*/64, /*warps=*/4, "
                      "/*stages=*/2, /*bf16=*/true, /*causal=*/true>"),
            std::string::npos);
  EXPECT_NE(text.find("extern \"C\" __global__"), std::string::npos);
  EXPECT_EQ(text.find("#include"), std::string::npos) << "templates must not include headers";
}

TEST(Render, DistinctProblemsAndConfigsGiveDistinctSources) {
  auto base = AttentionProblem::make(1, 2, 2, 64, 64, 128, DType::BF16, false);
  auto f16 = base;
  f16.dtype = DType::F16;
  auto causal = base;
  causal.causal = true;
  auto d64 = AttentionProblem::make(1, 2, 2, 64, 64, 64, DType::BF16, false);
  const std::string a = render_cuda_attention(base, {128, 64, 4, 2})->text;
  EXPECT_NE(a, render_cuda_attention(f16, {128, 64, 4, 2})->text);
  EXPECT_NE(a, render_cuda_attention(causal, {128, 64, 4, 2})->text);
  EXPECT_NE(a, render_cuda_attention(d64, {128, 64, 4, 2})->text);
  EXPECT_NE(a, render_cuda_attention(base, {128, 64, 4, 3})->text);
  // Runtime-only fields do not change the source (one binary serves every seqlen).
  auto longer = AttentionProblem::make(3, 2, 2, 4097, 4097, 128, DType::BF16, false);
  EXPECT_EQ(a, render_cuda_attention(longer, {128, 64, 4, 2})->text);
}

TEST(Render, RejectsBadInputWithTheReason) {
  auto p = AttentionProblem::make(1, 2, 2, 64, 64, 100, DType::BF16, false);
  auto r = render_cuda_attention(p, {128, 64, 4, 2});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("head_dim = 100"), std::string::npos);
  p = AttentionProblem::make(1, 2, 2, 64, 64, 128, DType::BF16, false);
  r = render_cuda_attention(p, {128, 48, 4, 2});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("block_n = 48"), std::string::npos);
}

TEST(Render, TemplatesAreEmbeddedAndVersioned) {
  EXPECT_FALSE(templates::text("cuda/attention_fwd.cuh").empty());
  EXPECT_FALSE(templates::text("attention_params.h").empty());
  EXPECT_TRUE(templates::text("no/such/file").empty());
  EXPECT_EQ(generator_version().size(), 16u);
  EXPECT_EQ(generator_version(), generator_version());
  // One version per backend: each differs from the others and from the all-templates one; a
  // device of no known backend gets the all-templates version.
  const std::string& cuda = generator_version_of("cuda|NVIDIA H100 80GB HBM3|sm90");
  const std::string& hip = generator_version_of("hip|AMD Instinct MI250X|gfx90a");
  const std::string& cpu = generator_version_of("cpu|AMD EPYC|2cores");
  EXPECT_EQ(cuda.size(), 16u);
  EXPECT_NE(cuda, hip);
  EXPECT_NE(cuda, cpu);
  EXPECT_NE(hip, cpu);
  EXPECT_NE(cuda, generator_version());
  EXPECT_EQ(generator_version_of("fake|Fake GPU"), generator_version());
  EXPECT_EQ(generator_version_of("cuda|"), cuda);
  // Rows of variant problems: the whole templates (variant code included), another version.
  EXPECT_NE(variant_generator_version_of("cuda|"), cuda);
  EXPECT_EQ(variant_generator_version_of("fake|Fake GPU"), generator_version());
  // Rows a decode config may serve: the plain templates with the decode family's (which the
  // prefill version leaves out: a change to decode kernels leaves prefill rows current).
  for (const char* backend : {"cuda|", "cpu|"}) {
    EXPECT_NE(decode_generator_version_of(backend), generator_version_of(backend)) << backend;
    EXPECT_NE(decode_generator_version_of(backend), variant_generator_version_of(backend));
  }
  EXPECT_EQ(decode_generator_version_of("fake|Fake GPU"), generator_version());
}

// The HIP templates' plain version: what the tuning DB keys the HIP rows of plain problems with.
// The variants in the HIP forward (issue 17) left it as it was (the plain kernels compile from
// exactly the text they had); a change to what a plain HIP kernel compiles from changes it, and
// this pin with it (on purpose: the HIP rows tuned before become stale).
// The HIP forward's variant code is all in its FLASHJIT_VARIANT branches: the plain kernels
// compile from the text they had (so plain rows stay current), the variant ones from more.
TEST(Render, ThePlainHipForwardHasNoVariantCode) {
  const std::string plain = plain_kernel_text(templates::text("hip/attention_fwd.hpp"));
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(plain.find("flashjit_variant"), std::string::npos);
  EXPECT_EQ(plain.find("FLASHJIT_VARIANT"), std::string::npos);
  EXPECT_NE(plain, templates::text("hip/attention_fwd.hpp"));
  EXPECT_NE(variant_generator_version_of("hip|"), generator_version_of("hip|"));
}

TEST(Render, PlainKernelTextDropsTheVariantBranchesOnly) {
  const std::string text =
      "a\n"
      "#ifdef FLASHJIT_VARIANT\n"
      "variant 1\n"
      "#if X\n"
      "nested in variant\n"
      "#endif\n"
      "#else\n"
      "plain 1\n"
      "#ifdef FLASHJIT_VARIANT_SOFTCAP\n"  // another macro: kept whole
      "softcap\n"
      "#endif\n"
      "#endif\n"
      "  #  ifdef FLASHJIT_VARIANT\n"
      "variant 2\n"
      "#endif\n"
      "#ifndef Y\n"
      "b\n"
      "#else\n"
      "c\n"
      "#endif\n"
      "struct P {\n"
      "  int read;\n"
      "  // FLASHJIT_VARIANT_FIELDS_BEGIN\n"
      "  int variant_field;\n"
      "  // FLASHJIT_VARIANT_FIELDS_END\n"
      "};";
  EXPECT_EQ(plain_kernel_text(text),
            "a\nplain 1\n#ifdef FLASHJIT_VARIANT_SOFTCAP\nsoftcap\n#endif\n"
            "#ifndef Y\nb\n#else\nc\n#endif\nstruct P {\n  int read;\n};");
  // The shipped templates: no variant code left, the plain code intact.
  const std::string ws = plain_kernel_text(templates::text("cuda/ws/softmax.cuh"));
  EXPECT_EQ(ws.find("FLASHJIT_VARIANT"), std::string::npos);
  EXPECT_EQ(ws.find("fv::score"), std::string::npos);
  EXPECT_NE(ws.find("void update("), std::string::npos);
  const std::string fwd = plain_kernel_text(templates::text("cuda/attention_fwd.cuh"));
  EXPECT_EQ(fwd.find("fv::"), std::string::npos);
  EXPECT_NE(fwd.find("block_needs_mask"), std::string::npos);
  const std::string hip = plain_kernel_text(templates::text("hip/attention_fwd.hpp"));
  EXPECT_EQ(hip.find("fv::"), std::string::npos);
  EXPECT_EQ(hip.find("attention_forward_variant"), std::string::npos);
  EXPECT_NE(hip.find("block_needs_mask"), std::string::npos);
  // The backward templates (variants since issue 17's backward stage) likewise.
  for (const char* path :
       {"cuda/attention_bwd.cuh", "cuda/attention_bwd_sm90.cuh", "cpu/attention_bwd.hpp"}) {
    const std::string bwd = plain_kernel_text(templates::text(path));
    EXPECT_EQ(bwd.find("FLASHJIT_VARIANT"), std::string::npos) << path;
    EXPECT_EQ(bwd.find("flashjit_variant"), std::string::npos) << path;
    EXPECT_EQ(bwd.find("score_and_grad"), std::string::npos) << path;
    EXPECT_NE(bwd.find(std::string(path).find("cuda") == 0 ? "block_needs_mask" : "kv_end"),
              std::string::npos)
        << path;
  }
  // The launch parameters: the variant fields left out, and they are the struct's last fields
  // (adding one moves no field a plain kernel reads).
  const std::string params(templates::text("attention_params.h"));
  const std::string plain_params = plain_kernel_text(params);
  EXPECT_EQ(plain_params.find("alibi_slopes"), std::string::npos);
  EXPECT_NE(plain_params.find("num_splits"), std::string::npos);
  const size_t end = params.find("// FLASHJIT_VARIANT_FIELDS_END");
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(params.substr(params.find('\n', end) + 1, 3), "};\n");
}

}  // namespace
}  // namespace flashjit
