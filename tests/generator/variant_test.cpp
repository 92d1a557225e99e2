// Attention variants in the generator (issue 17): validation with typed errors, the variant key,
// the families that take variants, and rendering (plain problems render exactly as before: the
// variant adds only its prelude; the user's expressions land on marked lines).
#include "generator/variant.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>

#include "generator/config.hpp"
#include "generator/cpu_config.hpp"
#include "generator/decode_config.hpp"
#include "generator/device.hpp"
#include "generator/hip_config.hpp"
#include "generator/render.hpp"
#include "runtime/backend.hpp"
#include "runtime/tuning_store.hpp"

namespace flashjit {
namespace {

AttentionProblem problem_with(Variant variant, bool causal = true) {
  AttentionProblem p = AttentionProblem::make(2, 8, 2, 1000, 1000, 128, DType::BF16, causal);
  p.variant = std::move(variant);
  return p;
}

void expect_error(const AttentionProblem& p, ErrorCode code, const std::string& needle) {
  const Status status = validate(p);
  ASSERT_FALSE(status.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_EQ(status.error().code, code) << status.error().message;
  EXPECT_NE(status.error().message.find(needle), std::string::npos) << status.error().message;
}

TEST(Variant, ValidatesEachField) {
  Variant v;
  EXPECT_FALSE(v.active());
  v.window_left = -2;
  expect_error(problem_with(v), ErrorCode::InvalidArgument, "window_left = -2");
  v = Variant();
  v.window_right = int64_t{1} << 40;
  expect_error(problem_with(v), ErrorCode::InvalidArgument, "window_right = 1099511627776");
  for (float bad : {0.f, -1.f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    v = Variant();
    v.softcap = bad;
    expect_error(problem_with(v), ErrorCode::InvalidArgument, "softcap = ");
  }
  v = Variant();
  v.prefix = -1;
  expect_error(problem_with(v), ErrorCode::InvalidArgument, "prefix = -1");
  v = Variant();
  v.window_left = 128;
  v.window_right = 0;
  v.softcap = 50.f;
  v.alibi = true;
  v.prefix = 16;
  v.score_mod = "score - 0.1f * abs(q_idx - kv_idx)";
  v.mask_mod = "(q_idx / 64) == (kv_idx / 64) || kv_idx < 4";
  EXPECT_TRUE(validate(problem_with(v)).ok()) << validate(problem_with(v)).error().message;
}

TEST(Variant, RefusesWhatIsNotOneExpression) {
  const char* refused[] = {
      "score; return 0", "({ score; })", "score }",  "#define x 1", "score // comment",
      "score /* c */",   "(score",       "score)",   "score) + (1", "return score",
      "\"text\"",        "'c'",          "score \\", "   ",         "min(score, goto)",
  };
  for (const char* text : refused) {
    SCOPED_TRACE(text);
    Variant v;
    v.score_mod = text;
    expect_error(problem_with(v), ErrorCode::InvalidArgument,
                 std::string("score_mod = \"") + text + "\"");
    v = Variant();
    v.mask_mod = text;
    expect_error(problem_with(v), ErrorCode::InvalidArgument, "mask_mod = \"");
  }
  for (const char* text : {"score * returned_value", "min(score, 30.f) + max(q_idx, kv_idx)",
                           "a[0] / 2", "score\n- 1"}) {
    EXPECT_TRUE(check_variant_expression("score_mod", text).ok()) << text;
  }
}

TEST(Variant, ContiguousKvOnlyAndBackwardRules) {
  Variant v;
  v.softcap = 30.f;
  AttentionProblem p = problem_with(v).with_pass(Pass::Backward);
  EXPECT_TRUE(validate(p).ok());  // the backward takes variants (CPU, CUDA mma)
  // Its score_mod needs a derivative (tests/runtime/cpu/cpu_backward_variant_test.cpp checks the
  // messages in full).
  v.score_mod = "score * 2.0f";
  expect_error(problem_with(v).with_pass(Pass::Backward), ErrorCode::InvalidArgument,
               "needs score_mod_grad");
  v.score_mod_grad = "2.0f";
  EXPECT_TRUE(validate(problem_with(v).with_pass(Pass::Backward)).ok());
  EXPECT_NE(problem_with(v).variant.key().find("score_mod_grad#"), std::string::npos);
  v = Variant();
  v.softcap = 30.f;
  p = problem_with(v).with_paged_kv(16, 200);
  expect_error(p, ErrorCode::Unsupported, "contiguous K/V");
}

TEST(Variant, KeyNamesEverythingCompiledIn) {
  EXPECT_EQ(Variant().key(), "");
  Variant v;
  v.window_left = 1024;
  v.window_right = 0;
  v.softcap = 50.f;
  v.alibi = true;
  v.prefix = 7;
  EXPECT_EQ(v.key(), "window(1024,0) softcap50 alibi prefix7");
  Variant a, b;
  a.score_mod = "score * 2";
  b.score_mod = "score * 3";
  EXPECT_NE(a.key(), b.key());
  EXPECT_EQ(a.key().rfind("score_mod#", 0), 0u);
  // Part of the kernel signature and of the tuning key; a plain problem's key is as before.
  const AttentionProblem plain = problem_with(Variant());
  EXPECT_EQ(ProblemSignature::of(plain).variant, "");
  EXPECT_EQ(ProblemKey::of(plain).to_string(), "d128 bf16 causal g4 q1024 k1024 bh16");
  EXPECT_EQ(ProblemKey::of(plain).generator_version("cuda|"),
            generator_version_of("cuda|", Pass::Forward));
  const AttentionProblem windowed = problem_with(v);
  EXPECT_FALSE(ProblemSignature::of(windowed) == ProblemSignature::of(plain));
  EXPECT_EQ(ProblemKey::of(windowed).to_string(),
            "d128 bf16 causal g4 q1024 k1024 bh16 window(1024,0) softcap50 alibi prefix7");
  // A variant key's rows are stamped with the variant templates' version.
  EXPECT_EQ(ProblemKey::of(windowed).generator_version("cuda|"),
            variant_generator_version_of("cuda|", Pass::Forward));
  // A key a decode config may serve (at most 16 queries, or a paged cache), with the version of
  // the plain templates and the decode family's; a backward one never.
  AttentionProblem decode = problem_with(Variant());
  decode.seqlen_q = 1;
  EXPECT_TRUE(ProblemKey::of(decode).may_run_decode());
  EXPECT_EQ(ProblemKey::of(decode).generator_version("cuda|"),
            decode_generator_version_of("cuda|"));
  decode.pass = Pass::Backward;
  EXPECT_FALSE(ProblemKey::of(decode).may_run_decode());
  EXPECT_EQ(ProblemKey::of(decode).generator_version("cuda|"),
            generator_version_of("cuda|", Pass::Backward));
  // A backward variant key: the variant templates' backward version.
  AttentionProblem windowed_backward = windowed;
  windowed_backward.pass = Pass::Backward;
  EXPECT_EQ(ProblemKey::of(windowed_backward).generator_version("cuda|"),
            variant_generator_version_of("cuda|", Pass::Backward));
  decode.seqlen_q = 17;
  decode.pass = Pass::Forward;
  EXPECT_FALSE(ProblemKey::of(decode).may_run_decode());
  EXPECT_FALSE(ProblemKey::of(problem_with(v)).may_run_decode());
}

TEST(Variant, TheCudaPrefillFamiliesHipAndTheCpuTakeVariants) {
  Variant v;
  v.window_left = 256;
  const AttentionProblem p = problem_with(v);
  const DeviceSpec h100 = known_device("sm90").value();
  const std::vector<AttentionConfig> legal = legal_configs(p, h100);
  ASSERT_FALSE(legal.empty());
  std::set<KernelFamily> families;
  for (const AttentionConfig& c : legal) families.insert(c.family);
  // The sm90 families take variants (kSm90VariantsVerifiedOnGpu in generator/config.cpp): the
  // families and the default are the plain problem's (sm90 d128: the -ws tile).
  EXPECT_EQ(families,
            (std::set<KernelFamily>{KernelFamily::Mma, KernelFamily::Wgmma, KernelFamily::Ws}));
  EXPECT_EQ(default_config(p, h100).value(), default_config(problem_with(Variant()), h100).value());
  EXPECT_EQ(default_config(p, h100).value().family, KernelFamily::Ws);
  EXPECT_TRUE(check_config(AttentionConfig::parse("m128n64w8s2-wgmma").value(), p, h100).ok());
  EXPECT_TRUE(check_config(default_config(problem_with(Variant()), h100).value(), p, h100).ok());
  EXPECT_EQ(default_config(p, known_device("sm80").value()).value().family, KernelFamily::Mma);
  // A mask_mod: not the wgmma family (ptxas serializes its wgmmas with one), the others.
  Variant masked = v;
  masked.mask_mod = "(q_idx / 64) == (kv_idx / 64)";
  const AttentionProblem m = problem_with(masked);
  const Status wgmma = check_config(AttentionConfig::parse("m128n64w8s2-wgmma").value(), m, h100);
  ASSERT_FALSE(wgmma.ok());
  EXPECT_EQ(wgmma.error().code, ErrorCode::Unsupported);
  EXPECT_EQ(default_config(m, h100).value().family, KernelFamily::Ws);
  for (const AttentionConfig& c : legal_configs(m, h100))
    EXPECT_NE(c.family, KernelFamily::Wgmma) << c.to_string();
  // A decode-shaped problem: no -decode configs for a variant.
  AttentionProblem decode = AttentionProblem::make(4, 32, 8, 1, 4096, 128, DType::BF16, false);
  decode.variant = v;
  for (const AttentionConfig& c : legal_configs(decode, h100))
    EXPECT_NE(c.family, KernelFamily::Decode) << c.to_string();
  // HIP: the plain problem's configs (more: tests/generator/hip_config_test.cpp).
  const DeviceSpec mi250 = known_device("gfx90a").value();
  EXPECT_FALSE(legal_hip_configs(p, mi250).empty());
  EXPECT_EQ(legal_hip_configs(p, mi250), legal_hip_configs(problem_with(Variant()), mi250));
}

// The source of a variant problem minus its prelude, with the plain label: the plain source.
std::string without_prelude(std::string text, const AttentionProblem& variant_problem) {
  const size_t begin = text.find("// ---- attention variant:");
  const std::string end_marker = "// ---- end of the attention variant ----\n";
  const size_t end = text.find(end_marker);
  if (begin == std::string::npos || end == std::string::npos) return "(no prelude)";
  text.erase(begin, end + end_marker.size() - begin);
  const std::string label_suffix = " " + variant_problem.variant.key();
  text.erase(text.find(label_suffix), label_suffix.size());
  return text;
}

TEST(Variant, PlainSourcesAreUnchangedAndVariantsOnlyAddTheirPrelude) {
  Variant v;
  v.window_left = 64;
  v.window_right = 0;
  v.alibi = true;
  v.score_mod = "score - 0.1f * abs(q_idx - kv_idx)";
  const AttentionProblem plain = problem_with(Variant());
  const AttentionProblem variant = problem_with(v);
  const AttentionConfig mma{128, 64, 4, 2};
  const AttentionConfig cpu{64, 64, 1, 1};
  const Result<KernelSource> cuda_plain = render_cuda_attention(plain, mma);
  const Result<KernelSource> cuda_variant = render_cuda_attention(variant, mma);
  const Result<KernelSource> cpu_plain = render_cpu_attention(plain, cpu);
  const Result<KernelSource> cpu_variant = render_cpu_attention(variant, cpu);
  ASSERT_TRUE(cuda_plain.ok() && cuda_variant.ok() && cpu_plain.ok() && cpu_variant.ok());
  for (const KernelSource* s : {&cuda_plain.value(), &cpu_plain.value()}) {
    EXPECT_EQ(s->text.find("#define FLASHJIT_VARIANT"), std::string::npos);
    EXPECT_EQ(s->text.find("FLASHJIT_ATTENTION_VARIANT_H"), std::string::npos);
  }
  EXPECT_EQ(without_prelude(cuda_variant->text, variant), cuda_plain->text);
  EXPECT_EQ(without_prelude(cpu_variant->text, variant), cpu_plain->text);
  // The wgmma and -ws families likewise.
  for (const char* name : {"m128n64w8s2-wgmma", "m128n128w12s2-ws-pp-persist"}) {
    const AttentionConfig config = AttentionConfig::parse(name).value();
    const Result<KernelSource> family_plain = render_cuda_attention(plain, config);
    const Result<KernelSource> family_variant = render_cuda_attention(variant, config);
    ASSERT_TRUE(family_plain.ok() && family_variant.ok()) << name;
    EXPECT_EQ(family_plain->text.find("#define FLASHJIT_VARIANT"), std::string::npos) << name;
    EXPECT_EQ(without_prelude(family_variant->text, variant), family_plain->text) << name;
  }
  // The user's expression lands on one marked line of the variant's source.
  const std::string line = "return static_cast<float>(score - 0.1f * abs(q_idx - kv_idx));  " +
                           std::string(kVariantExpressionMarker) + "score_mod";
  EXPECT_NE(cuda_variant->text.find(line), std::string::npos);
  EXPECT_NE(cpu_variant->text.find(line), std::string::npos);
  EXPECT_NE(cuda_variant->label.find("window(64,0) alibi score_mod#"), std::string::npos);
}

TEST(Variant, CompileErrorsQuoteTheExpression) {
  Variant v;
  v.score_mod = "score + nope";
  const AttentionProblem p = problem_with(v);
  const std::string source = "line 1\nline 2\n  return static_cast<float>(score + nope);  " +
                             std::string(kVariantExpressionMarker) + "score_mod\n";
  const Error nvrtc{ErrorCode::CompileFailed,
                    "NVRTC nvrtcCompileProgram failed for 'x': NVRTC_ERROR_COMPILATION\n"
                    "k.cu(3): error: identifier \"nope\" is undefined\n"};
  Error e = explain_variant_compile_error(p, source, nvrtc);
  EXPECT_EQ(e.code, ErrorCode::CompileFailed);
  EXPECT_EQ(e.message.rfind("score_mod = \"score + nope\" does not compile: k.cu(3): error: "
                            "identifier \"nope\" is undefined",
                            0),
            0u)
      << e.message;
  const Error clang{ErrorCode::CompileFailed,
                    "k.cpp failed to compile with clang 14:\nk.cpp:2:5: error: something else\n"};
  e = explain_variant_compile_error(p, source, clang);
  EXPECT_EQ(
      e.message.rfind("score_mod = \"score + nope\": the kernel does not compile: k.cpp:2:5", 0),
      0u)
      << e.message;
  // Without user expressions the error is passed on as it is.
  e = explain_variant_compile_error(problem_with(Variant()), source, clang);
  EXPECT_EQ(e.message, clang.message);
}

}  // namespace
}  // namespace flashjit
