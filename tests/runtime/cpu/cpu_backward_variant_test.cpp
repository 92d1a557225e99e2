// Attention variants in the CPU backend's backward pass (issue 17; templates/cpu/attention_bwd.hpp
// with templates/attention_variant.h) against the fp64 reference gradients (tuner/reference.hpp):
// each variant of support/variant_cases.hpp and combinations, in fp32 (every tile shape's
// smallest, both dQ modes) and bf16 (the default), over odd shapes (1 x 1, 17, seqlen_q shorter
// and longer than seqlen_k, GQA 4:1) with poisoned outputs; rows that see no key (dQ = 0, no
// NaN); key blocks hidden from every query and query blocks that see no key are never read (NaN
// there); the typed refusals (a score_mod without score_mod_grad, varlen). Skips without the CPU
// backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generator/backward_config.hpp"
#include "generator/device.hpp"
#include "generator/render.hpp"
#include "runtime/runtime.hpp"
#include "support/parallel.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"

#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.hpp"
#endif

namespace flashjit {
namespace {

namespace ft = flashjit::testing;
using Case = ft::VariantCase;

AttentionProblem make_problem(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q,
                              int64_t seqlen_k, const Case& c, DType dtype, int d = 64) {
  AttentionProblem p =
      AttentionProblem::make(batch, heads_q, heads_kv, seqlen_q, seqlen_k, d, dtype, c.causal)
          .with_pass(Pass::Backward);
  p.variant = c.variant;
  return p;
}

// A backward problem with a score_mod and no score_mod_grad is refused before anything is
// compiled, naming what is missing; packed documents are a valid backward problem, on CUDA too.
// (No backend needed.)
TEST(BackwardVariantProblem, TypedRefusals) {
  Case c{"score_mod", false, {}, {}};
  c.variant.score_mod = "score * 2.0f";
  AttentionProblem p = make_problem(1, 2, 2, 16, 16, c, DType::F32);
  Status status = validate(p);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(status.error().message.find("score_mod = \"score * 2.0f\""), std::string::npos)
      << status.error().message;
  EXPECT_NE(status.error().message.find("needs score_mod_grad"), std::string::npos)
      << status.error().message;
  EXPECT_TRUE(validate(p.with_pass(Pass::Forward)).ok());  // the forward needs no derivative
  p.variant.score_mod_grad = "2.0f";
  EXPECT_TRUE(validate(p).ok());
  // A derivative without its score_mod.
  p.variant.score_mod.clear();
  status = validate(p);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("score_mod_grad = \"2.0f\" without a score_mod"),
            std::string::npos)
      << status.error().message;
  // Not one expression.
  p.variant.score_mod = "score";
  p.variant.score_mod_grad = "1.0f; return 0";
  status = validate(p);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().message.rfind("score_mod_grad = ", 0), 0u) << status.error().message;
  // Varlen: a valid backward problem (the gradients packed too), not on the CUDA families.
  AttentionProblem varlen =
      AttentionProblem::make_varlen(2, 2, 2, 16, 16, 32, 32, 64, DType::BF16, true)
          .with_pass(Pass::Backward);
  EXPECT_TRUE(validate(varlen).ok()) << validate(varlen).error().describe();
  EXPECT_EQ(varlen.dq_span(), 32 * 2 * 64);
  AttentionProblem batched = varlen;
  batched.dk_strides.batch = 16 * 2 * 64;
  status = validate(batched);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("dk.batch stride"), std::string::npos)
      << status.error().message;
  // On CUDA: mma configs (and on sm90 the wgmma family's, as for every variant).
  for (const char* device : {"sm80", "sm90"}) {
    const DeviceSpec spec = known_device(device).value();
    const std::vector<AttentionConfig> legal = legal_backward_configs(varlen, spec);
    EXPECT_TRUE(std::any_of(legal.begin(), legal.end(), [](const AttentionConfig& c) {
      return c.family == KernelFamily::Mma;
    })) << device;
    EXPECT_TRUE(
        check_backward_config(AttentionConfig::parse("m64n64w4s2-det").value(), varlen, spec).ok())
        << device;
  }
}

// The rendered backward source: the derivative only in backward kernels, on a marked line.
TEST(BackwardVariantProblem, ScoreModGradRendersInTheBackwardOnly) {
  Case c{"score_mod", false, {}, {}};
  c.variant.score_mod = "score * 2.0f";
  c.variant.score_mod_grad = "2.0f + 0.0f * q_idx";
  const AttentionProblem p = make_problem(1, 2, 2, 16, 16, c, DType::F32);
  const AttentionConfig config{64, 64, 1, 1};
  Result<KernelSource> backward = render_cpu_attention(p, config);
  ASSERT_TRUE(backward.ok()) << backward.error().describe();
  EXPECT_NE(backward->text.find("#define FLASHJIT_VARIANT_SCORE_MOD_GRAD 1"), std::string::npos);
  EXPECT_NE(backward->text.find("return static_cast<float>(2.0f + 0.0f * q_idx);  "
                                "// flashjit:score_mod_grad"),
            std::string::npos);
  Result<KernelSource> forward = render_cpu_attention(p.with_pass(Pass::Forward), config);
  ASSERT_TRUE(forward.ok()) << forward.error().describe();
  EXPECT_EQ(forward->text.find("FLASHJIT_VARIANT_SCORE_MOD_GRAD 1"), std::string::npos);
  EXPECT_EQ(forward->text.find("// flashjit:score_mod_grad"), std::string::npos);
}

#if FLASHJIT_HAVE_CPU_BACKEND

const cpu::CpuBackend& backend() {
  static const std::unique_ptr<cpu::CpuBackend> instance = cpu::CpuBackend::create().value();
  return *instance;
}

struct Shape {
  const char* name;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
};
const Shape kShapes[] = {
    {"one", 1, 2, 2, 1, 1},           {"seventeen", 2, 2, 2, 17, 17},
    {"q_shorter", 1, 2, 1, 100, 300}, {"q_longer", 1, 4, 2, 300, 100},
    {"gqa", 2, 8, 2, 65, 65},
};

AttentionProblem make_problem(const Shape& s, const Case& c, DType dtype) {
  return make_problem(s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k, c, dtype);
}

struct Gradients {
  std::vector<uint16_t> dq, dk, dv;  // raw storage, poisoned before the launch
};

Result<Gradients> run_backward(const Kernel& kernel, const AttentionProblem& problem,
                               const ft::HostInputs& inputs) {
  Gradients out{ft::poisoned_storage(problem.dq_span(), problem.dtype),
                ft::poisoned_storage(problem.dkv_span(), problem.dtype),
                ft::poisoned_storage(problem.dkv_span(), problem.dtype)};
  std::vector<float> lse = inputs.lse;
  AttentionArgs args;
  args.q = inputs.q.data();
  args.k = inputs.k.data();
  args.v = inputs.v.data();
  args.o = const_cast<uint16_t*>(inputs.o.data());
  args.lse = lse.data();
  args.d_o = inputs.d_o.data();
  args.dq = out.dq.data();
  args.dk = out.dk.data();
  args.dv = out.dv.data();
  args.alibi_slopes = inputs.alibi_slopes.empty() ? nullptr : inputs.alibi_slopes.data();
  FLASHJIT_TRY(kernel.launch(problem, args));
  return out;
}

::testing::AssertionResult check(const Kernel& kernel, const AttentionProblem& problem,
                                 const ft::HostInputs& inputs, const VariantFunctions& functions) {
  Result<Gradients> g = run_backward(kernel, problem, inputs);
  if (!g.ok()) return ::testing::AssertionFailure() << g.error().describe();
  const ft::Reference reference = ft::reference_attention(problem, inputs, functions);
  const GradientComparison comparison = compare_gradients(problem, g->dq, g->dk, g->dv, reference);
  const double limit = gradient_tolerance(problem.dtype);
  if (within_tolerance(comparison, limit)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "limit " << limit << ": " << comparison.to_string();
}

TEST(CpuBackwardVariant, EachVariantMatchesTheReference) {
  const cpu::CpuBackend& cpu = backend();
  struct Build {
    Case c;
    DType dtype;
    AttentionConfig config;
  };
  std::vector<Build> builds;
  // Every case in fp32 with the smallest tile (the most blocks to skip or mask) in both dQ modes
  // (fused into the dK/dV items, and -det); three in bf16 with the default tile (the bf16
  // dot-product path where the host has it).
  for (const Case& c : ft::variant_cases()) {
    const AttentionProblem probe = make_problem(kShapes[0], c, DType::F32);
    const std::vector<AttentionConfig> legal = cpu.legal_configs(probe);
    ASSERT_FALSE(legal.empty()) << c.name;
    for (DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
      AttentionConfig config = legal.front();
      config.dq = dq;
      ASSERT_TRUE(cpu.check_config(config, probe).ok()) << c.name << " " << config.to_string();
      builds.push_back({c, DType::F32, config});
    }
    const std::string name = c.name;
    if (name == "window_softcap_alibi_causal" || name == "score_mod_nonlinear_softcap" ||
        name == "mask_mod_causal")
      builds.push_back(
          {c, DType::BF16, cpu.default_config(make_problem(kShapes[0], c, DType::BF16)).value()});
  }
  using Built = std::optional<Result<std::shared_ptr<Kernel>>>;
  std::vector<Built> kernels = ft::parallel_map<Built>(builds.size(), [&](size_t i) {
    const Build& b = builds[i];
    return Built(build_kernel(cpu, nullptr, make_problem(kShapes[0], b.c, b.dtype), b.config));
  });
  int checked = 0;
  for (size_t i = 0; i < builds.size(); ++i) {
    const Build& b = builds[i];
    const std::string label =
        std::string(b.c.name) + " " + to_string(b.dtype) + " " + b.config.to_string();
    ASSERT_TRUE(kernels[i]->ok()) << label << ": " << kernels[i]->error().describe();
    for (const Shape& shape : kShapes) {
      const AttentionProblem problem = make_problem(shape, b.c, b.dtype);
      const ft::HostInputs inputs = ft::random_inputs(problem, 100 + i, b.c.functions);
      EXPECT_TRUE(check(***kernels[i], problem, inputs, b.c.functions))
          << label << " " << shape.name;
      ++checked;
    }
  }
  std::printf("%zu backward variant kernels, %d shape runs checked\n", builds.size(), checked);
}

// Sets rows [begin, end) of `storage` (q-shaped: heads_q heads, `strides`) to NaN.
void poison_rows(const AttentionProblem& problem, const Strides& strides,
                 std::vector<uint16_t>& storage, int64_t begin, int64_t end) {
  for (int64_t b = 0; b < problem.batch; ++b)
    for (int64_t i = begin; i < end; ++i)
      for (int64_t h = 0; h < problem.heads_q; ++h)
        for (int c = 0; c < problem.head_dim; ++c)
          ft::set_element(storage.data(),
                          b * strides.batch + i * strides.seq + h * strides.head + c, NAN,
                          problem.dtype);
}

// Key blocks a window hides from every query are never read by either loop: seqlen_q 64, seqlen_k
// 1000 (diagonal 936), a causal window of 32 keys: no query sees a key below 904, so keys
// [0, 768) are NaN (whole blocks for every block_n). Query blocks that see no key are never
// read by the dK/dV loop: an empty window (0, 0) with seqlen_q 300 > seqlen_k 100 (diagonal
// -200) gives rows [0, 200) no key, so their q and dO rows [0, 128) are NaN (whole blocks for
// every block_m); their dQ must be 0.
TEST(CpuBackwardVariant, HiddenBlocksAreNeverRead) {
  const cpu::CpuBackend& cpu = backend();
  Case windowed{"window", true, {}, {}};
  windowed.variant.window_left = 32;
  windowed.variant.window_right = 0;
  Case empty_rows{"empty_rows", false, {}, {}};
  empty_rows.variant.window_left = empty_rows.variant.window_right = 0;
  // A mask_mod hiding keys [0, 768) (causal alone would read them): both kernels ask it over
  // each block and skip the blocks it hides whole.
  Case masked{"mask_mod", true, {}, {}};
  masked.variant.mask_mod = "kv_idx >= 768";
  masked.functions.mask_mod = [](int64_t, int64_t, int64_t, int64_t j) { return j >= 768; };
  for (const Case& c : {windowed, empty_rows, masked}) {
    const bool keys = c.causal;
    const AttentionProblem problem = keys ? make_problem(1, 2, 1, 64, 1000, c, DType::F32)
                                          : make_problem(1, 2, 1, 300, 100, c, DType::F32);
    for (DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
      AttentionConfig config = cpu.legal_configs(problem).front();
      config.dq = dq;
      Result<std::shared_ptr<Kernel>> kernel = build_kernel(cpu, nullptr, problem, config);
      ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
      ft::HostInputs inputs = ft::random_inputs(problem, 9, c.functions);
      if (keys)
        ft::poison_keys(problem, inputs, 0, 768);
      else {
        poison_rows(problem, problem.q_strides, inputs.q, 0, 128);
        poison_rows(problem, problem.do_strides, inputs.d_o, 0, 128);
      }
      EXPECT_TRUE(check(**kernel, problem, inputs, c.functions))
          << c.name << " " << config.to_string();
      // The check can fail: the plain kernel (no window) reads every block, and NaN spreads.
      if (dq == DqMode::Separate) {
        AttentionProblem plain = problem;
        plain.variant = Variant();
        plain.causal = keys;
        Result<std::shared_ptr<Kernel>> full = build_kernel(cpu, nullptr, plain, config);
        ASSERT_TRUE(full.ok()) << full.error().describe();
        EXPECT_FALSE(check(**full, plain, inputs, {})) << c.name << " without the variant";
      }
    }
  }
}

// The reference's chain factor is what the kernel must reproduce: a kernel whose dS lacked the
// soft-cap's derivative would be far off. (Checks the check: the softcap problem's gradients
// against the reference of the same scores without the chain factor, i.e. a softcap so large
// that tanh is linear, differ.)
TEST(CpuBackwardVariant, SoftcapChainFactorMatters) {
  Case c{"softcap", false, {}, {}};
  c.variant.softcap = 0.75f;
  const AttentionProblem problem = make_problem(1, 2, 2, 40, 40, c, DType::F32);
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(backend(), nullptr, problem, backend().default_config(problem).value());
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  const ft::HostInputs inputs = ft::random_inputs(problem, 4);
  EXPECT_TRUE(check(**kernel, problem, inputs, {}));
  Result<Gradients> g = run_backward(**kernel, problem, inputs);
  ASSERT_TRUE(g.ok());
  // The same o and lse, reference gradients with dS not multiplied by 1 - tanh^2: score_mod
  // stands in for the soft-cap with a derivative of 1.
  AttentionProblem unchained = problem;
  unchained.variant.softcap.reset();
  unchained.variant.score_mod = "0.75f * tanh(score / 0.75f)";
  unchained.variant.score_mod_grad = "1.0f";
  VariantFunctions f;
  f.score_mod = [](double s, int64_t, int64_t, int64_t, int64_t) {
    return 0.75 * std::tanh(s / 0.75);
  };
  f.score_mod_grad = [](double, int64_t, int64_t, int64_t, int64_t) { return 1.0; };
  const GradientComparison wrong = compare_gradients(problem, g->dq, g->dk, g->dv,
                                                     ft::reference_attention(unchained, inputs, f));
  EXPECT_GT(wrong.dq.rel_error, 0.1) << wrong.to_string();
}

// Packed variable-length documents (varlen): documents of 1, 17, 0, 40 and 5 queries against 3,
// 17, 4, 0 and 9 keys (empty ones, seqlen_q != seqlen_k both ways, per document), spare rows past
// the last document (poisoned: left unwritten) and spare keys set to NaN (never read), plain
// causal and with a window + softcap + ALiBi, GQA, fp32 in both dQ modes; each document's
// gradients against the reference of that document alone.
TEST(CpuBackwardVariant, PackedDocumentsMatchTheReferencePerDocument) {
  const cpu::CpuBackend& cpu = backend();
  const std::vector<int64_t> q_lengths = {1, 17, 0, 40, 5}, k_lengths = {3, 17, 4, 0, 9};
  const int64_t spare = 7;
  const int64_t total_q = 63 + spare, total_k = 33 + spare;
  for (const bool windowed : {false, true}) {
    AttentionProblem problem =
        AttentionProblem::make_varlen(5, 4, 2, 40, 17, total_q, total_k, 64, DType::F32, true)
            .with_pass(Pass::Backward);
    if (windowed) {
      problem.variant.window_left = 6;
      problem.variant.softcap = 1.5f;
      problem.variant.alibi = true;
    }
    ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
    ft::HostInputs inputs = ft::random_inputs(problem, 31);
    inputs.cu_seqlens_q = cu_seqlens_of(q_lengths);
    inputs.cu_seqlens_k = cu_seqlens_of(k_lengths);
    ft::poison_keys(problem, inputs, total_k - spare, total_k);
    set_forward_outputs(problem, inputs);
    for (DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
      AttentionConfig config = cpu.legal_configs(problem).front();
      config.dq = dq;
      Result<std::shared_ptr<Kernel>> kernel = build_kernel(cpu, nullptr, problem, config);
      ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
      Gradients out{ft::poisoned_storage(problem.dq_span(), problem.dtype),
                    ft::poisoned_storage(problem.dkv_span(), problem.dtype),
                    ft::poisoned_storage(problem.dkv_span(), problem.dtype)};
      std::vector<float> lse = inputs.lse;
      AttentionArgs args;
      args.q = inputs.q.data();
      args.k = inputs.k.data();
      args.v = inputs.v.data();
      args.o = inputs.o.data();
      args.lse = lse.data();
      args.d_o = inputs.d_o.data();
      args.dq = out.dq.data();
      args.dk = out.dk.data();
      args.dv = out.dv.data();
      args.alibi_slopes = inputs.alibi_slopes.empty() ? nullptr : inputs.alibi_slopes.data();
      args.cu_seqlens_q = inputs.cu_seqlens_q.data();
      args.cu_seqlens_k = inputs.cu_seqlens_k.data();
      const Status launched = (*kernel)->launch(problem, args);
      ASSERT_TRUE(launched.ok()) << launched.error().describe();
      const GradientComparison comparison = compare_gradients(
          problem, out.dq, out.dk, out.dv, ft::reference_attention(problem, inputs));
      EXPECT_TRUE(within_tolerance(comparison, gradient_tolerance(problem.dtype)))
          << (windowed ? "window+softcap+alibi " : "causal ") << config.to_string() << ": "
          << comparison.to_string();
      // The spare rows past the last document are left as they were.
      const int64_t row = problem.heads_q * problem.head_dim;
      for (int64_t i = 63 * row; i < total_q * row; ++i)
        ASSERT_EQ(out.dq[2 * i], ft::kPoisonBits) << "dq written past the documents";
    }
  }
  // Offsets that do not describe the documents are a typed error before anything runs.
  AttentionProblem problem =
      AttentionProblem::make_varlen(2, 2, 2, 16, 16, 32, 32, 64, DType::F32, false)
          .with_pass(Pass::Backward);
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(cpu, nullptr, problem, cpu.default_config(problem).value());
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  ft::HostInputs inputs = ft::random_inputs(problem, 5);
  std::vector<int32_t> bad = {0, 20, 32};  // a document of 20 > max_seqlen_q 16
  std::vector<uint16_t> dq = ft::poisoned_storage(problem.dq_span(), problem.dtype);
  std::vector<uint16_t> dk = ft::poisoned_storage(problem.dkv_span(), problem.dtype);
  std::vector<uint16_t> dv = dk;
  AttentionArgs args;
  args.q = inputs.q.data();
  args.k = inputs.k.data();
  args.v = inputs.v.data();
  args.o = inputs.o.data();
  args.lse = inputs.lse.data();
  args.d_o = inputs.d_o.data();
  args.dq = dq.data();
  args.dk = dk.data();
  args.dv = dv.data();
  args.cu_seqlens_q = bad.data();
  args.cu_seqlens_k = inputs.cu_seqlens_k.data();
  const Status refused = (*kernel)->launch(problem, args);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("cu_seqlens_q"), std::string::npos)
      << refused.error().message;
}

TEST(CpuBackwardVariant, ScoreModGradThatDoesNotCompileIsQuoted) {
  Case c{"score_mod", false, {}, {}};
  c.variant.score_mod = "score * 2.0f";
  c.variant.score_mod_grad = "undefined_derivative";
  const AttentionProblem problem = make_problem(1, 1, 1, 16, 16, c, DType::F32);
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(backend(), nullptr, problem, backend().default_config(problem).value());
  ASSERT_FALSE(kernel.ok());
  EXPECT_EQ(kernel.error().code, ErrorCode::CompileFailed);
  EXPECT_EQ(kernel.error().message.rfind(
                "score_mod_grad = \"undefined_derivative\" does not compile: ", 0),
            0u)
      << kernel.error().message;
}

#else
TEST(CpuBackwardVariant, SkippedWithoutTheCpuBackend) { GTEST_SKIP() << "built without LLVM"; }
#endif

}  // namespace
}  // namespace flashjit
