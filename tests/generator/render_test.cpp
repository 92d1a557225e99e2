#include "generator/render.hpp"

#include <gtest/gtest.h>

#include <algorithm>

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
  // One version per backend and pass: each differs from the others and from the all-templates
  // one; a device of no known backend gets the all-templates version.
  const Pass fwd = Pass::Forward, bwd = Pass::Backward;
  const std::string& cuda = generator_version_of("cuda|NVIDIA H100 80GB HBM3|sm90", fwd);
  const std::string& hip = generator_version_of("hip|AMD Instinct MI250X|gfx90a", fwd);
  const std::string& cpu = generator_version_of("cpu|AMD EPYC|2cores", fwd);
  EXPECT_EQ(cuda.size(), 16u);
  EXPECT_NE(cuda, hip);
  EXPECT_NE(cuda, cpu);
  EXPECT_NE(hip, cpu);
  EXPECT_NE(cuda, generator_version());
  EXPECT_EQ(generator_version_of("fake|Fake GPU", fwd), generator_version());
  EXPECT_EQ(generator_version_of("fake|Fake GPU", bwd), generator_version());
  EXPECT_EQ(generator_version_of("cuda|", fwd), cuda);
  for (const char* backend : {"cuda|", "hip|", "cpu|"}) {
    SCOPED_TRACE(backend);
    const std::string& forward = generator_version_of(backend, fwd);
    const std::string& backward = generator_version_of(backend, bwd);
    EXPECT_NE(forward, backward);
    // Rows of variant problems: the whole templates (variant code included), other versions.
    EXPECT_NE(variant_generator_version_of(backend, fwd), forward);
    EXPECT_NE(variant_generator_version_of(backend, bwd), backward);
    EXPECT_NE(variant_generator_version_of(backend, fwd),
              variant_generator_version_of(backend, bwd));
    // Rows a decode config may serve: the forward's templates with the decode family's (which
    // the prefill version leaves out: a change to decode kernels leaves prefill rows current).
    EXPECT_NE(decode_generator_version_of(backend), forward);
    EXPECT_NE(decode_generator_version_of(backend), variant_generator_version_of(backend, fwd));
    // None is a version of the scheme before (TuningStore::open re-stamps those).
    const LegacyRowVersions& legacy = legacy_row_versions_of(backend);
    for (const std::string* old : {&legacy.plain, &legacy.variant, &legacy.decode})
      for (const std::string* now : {&forward, &backward, &decode_generator_version_of(backend)})
        EXPECT_NE(*old, *now);
  }
  EXPECT_EQ(variant_generator_version_of("fake|Fake GPU", fwd), generator_version());
  EXPECT_EQ(decode_generator_version_of("fake|Fake GPU"), generator_version());
}

// What each row version hashes: the templates its pass's kernels are assembled from, no others.
// Texts changed one at a time (the build's texts otherwise): the versions they should change do,
// the others do not.
TEST(Render, RowVersionsHashTheTemplatesOfTheirPassOnly) {
  auto version_with = [](const std::string& changed, std::string_view backend, RowKind kind,
                         Pass pass) {
    return detail::row_version(backend, kind, pass, [&](std::string_view path) {
      if (path != changed) return templates::text(path);
      static std::string edited;
      edited = std::string(templates::text(path)) + "\n// an edit\n";
      return std::string_view(edited);
    });
  };
  struct Case {
    const char* file;
    const char* backend;
    bool forward, backward, decode, variant;  // which versions it is in
  };
  const Case cases[] = {
      {"cuda/attention_bwd_sm90.cuh", "cuda", false, true, false, true},
      {"cuda/attention_bwd_sm90_dq.cuh", "cuda", false, true, false, true},
      {"cuda/attention_bwd_common.cuh", "cuda", false, true, false, true},
      {"cuda/ws/softmax.cuh", "cuda", true, false, true, true},
      // In the forward's -ws family and the backward's ws family (the fused kernel).
      {"cuda/tma.cuh", "cuda", true, true, true, true},
      {"cuda/ws/attention_bwd_ws.cuh", "cuda", false, true, false, true},
      {"cuda/bulk_group.cuh", "cuda", false, true, false, true},
      {"cuda/attention_fwd.cuh", "cuda", true, false, true, true},
      {"cuda/common.cuh", "cuda", true, true, true, true},
      {"cuda/decode.cuh", "cuda", false, false, true, false},
      {"attention_common.h", "cuda", true, true, true, true},
      {"attention_params.h", "cpu", true, true, true, true},
      {"attention_variant.h", "cuda", false, false, false, true},
      {"attention_common.h", "cpu", false, false, false, false},  // the CPU templates' own rules
      {"cpu/attention_bwd.hpp", "cpu", false, true, false, true},
      {"cpu/attention_bwd_dq.hpp", "cpu", false, true, false, true},
      {"cpu/attention_fwd.hpp", "cpu", true, false, true, true},
      {"hip/attention_bwd_common.hpp", "hip", false, true, false, true},
      {"hip/decode.hpp", "hip", false, false, true, false},
      {"hip/attention_fwd.hpp", "cuda", false, false, false, false},  // another backend's
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.file) + " on " + c.backend);
    auto changes = [&](RowKind kind, Pass pass) {
      const std::string before = version_with("", c.backend, kind, pass);
      return version_with(c.file, c.backend, kind, pass) != before;
    };
    EXPECT_EQ(changes(RowKind::Plain, Pass::Forward), c.forward);
    EXPECT_EQ(changes(RowKind::Plain, Pass::Backward), c.backward);
    EXPECT_EQ(changes(RowKind::Decode, Pass::Forward), c.decode);
    EXPECT_EQ(changes(RowKind::Variant, Pass::Forward) || changes(RowKind::Variant, Pass::Backward),
              c.variant);
  }
  // The build's versions are these functions of the embedded texts.
  auto embedded = [](std::string_view path) { return templates::text(path); };
  EXPECT_EQ(detail::row_version("cuda", RowKind::Plain, Pass::Backward, embedded),
            generator_version_of("cuda|", Pass::Backward));
  EXPECT_EQ(detail::row_version("hip", RowKind::Variant, Pass::Forward, embedded),
            variant_generator_version_of("hip|", Pass::Forward));
}

// Every embedded template is in some family's list, so in some row version (a template no list
// names would change kernels without staling any row... or be dead).
TEST(Render, EveryTemplateIsInARowVersion) {
  int count = 0;
  const std::string_view* paths = templates::paths(&count);
  ASSERT_GT(count, 10);
  for (int i = 0; i < count; ++i) {
    // checks/ (the decode table check kernel, issue 33) is launched beside the kernels, never
    // compiled into one: no row's kernel changes with it.
    if (paths[i].substr(0, 7) == "checks/") continue;
    bool named = false;
    for (std::string_view backend : kTemplateBackends)
      for (RowKind kind : {RowKind::Plain, RowKind::Variant, RowKind::Decode})
        for (Pass pass : {Pass::Forward, Pass::Backward}) {
          const std::vector<std::string_view> files = detail::row_templates(backend, kind, pass);
          named = named || std::find(files.begin(), files.end(), paths[i]) != files.end();
        }
    EXPECT_TRUE(named) << paths[i] << " is in no family's list (generator/template_files.hpp)";
  }
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
  EXPECT_NE(variant_generator_version_of("hip|", Pass::Forward),
            generator_version_of("hip|", Pass::Forward));
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
       {"cuda/attention_bwd.cuh", "cuda/attention_bwd_sm90.cuh", "cuda/attention_bwd_sm90_dq.cuh",
        "cpu/attention_bwd.hpp", "cpu/attention_bwd_dq.hpp"}) {
    const std::string bwd = plain_kernel_text(templates::text(path));
    EXPECT_EQ(bwd.find("FLASHJIT_VARIANT"), std::string::npos) << path;
    EXPECT_EQ(bwd.find("flashjit_variant"), std::string::npos) << path;
    EXPECT_EQ(bwd.find("score_and_grad"), std::string::npos) << path;
    // The plain masking rule is kept: the CUDA files', the CPU dK/dV block's, the CPU dQ block's.
    const std::string file(path);
    EXPECT_NE(bwd.find(file.find("cuda") == 0               ? "block_needs_mask"
                       : file == "cpu/attention_bwd_dq.hpp" ? "kv_end"
                                                            : "m_first"),
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
