// Attention variants on the CPU backend (issue 17): each variant and combinations against the fp64
// reference (tuner/reference.hpp) over odd shapes, GQA/MQA, causal, fp32 (tight) and bf16, with
// poisoned outputs; hidden key blocks poisoned with NaN to prove they are never read; a user
// expression that does not compile is an error quoting it. Skips without the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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

#if FLASHJIT_HAVE_CPU_BACKEND

const cpu::CpuBackend& backend() {
  static const std::unique_ptr<cpu::CpuBackend> instance = cpu::CpuBackend::create().value();
  return *instance;
}

using Case = ft::VariantCase;

Variant window(int64_t left, int64_t right) {
  Variant v;
  v.window_left = left;
  v.window_right = right;
  return v;
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

AttentionProblem make_problem(const Shape& s, const Case& c, DType dtype, int d = 64) {
  AttentionProblem p = AttentionProblem::make(s.batch, s.heads_q, s.heads_kv, s.seqlen_q,
                                              s.seqlen_k, d, dtype, c.causal);
  p.variant = c.variant;
  return p;
}

double max_rel_error(DType dtype) { return dtype == DType::F32 ? 2e-5 : 1e-2; }
double max_lse_error(DType dtype) { return dtype == DType::F32 ? 2e-5 : 1e-3; }

// Launches with poisoned o and lse and compares with the reference. `nan_keys`: keys [0, n) of K
// and V set to NaN first (keys no query sees: a kernel that loads their blocks gets NaN in o).
::testing::AssertionResult run_and_check(const Kernel& kernel, const AttentionProblem& problem,
                                         const VariantFunctions& functions, uint64_t seed,
                                         int64_t nan_keys = 0) {
  ft::HostInputs inputs = ft::random_inputs(problem, seed);
  for (int64_t b = 0; b < problem.batch; ++b)
    for (int64_t j = 0; j < nan_keys; ++j)
      for (int64_t h = 0; h < problem.heads_kv; ++h)
        for (int c = 0; c < problem.head_dim; ++c) {
          const float nan = std::numeric_limits<float>::quiet_NaN();
          ft::set_element(inputs.k.data(),
                          b * problem.k_strides.batch + j * problem.k_strides.seq +
                              h * problem.k_strides.head + c,
                          nan, problem.dtype);
          ft::set_element(inputs.v.data(),
                          b * problem.v_strides.batch + j * problem.v_strides.seq +
                              h * problem.v_strides.head + c,
                          nan, problem.dtype);
        }
  std::vector<uint16_t> o = ft::poisoned_storage(problem.o_span(), problem.dtype);
  std::vector<float> lse(static_cast<size_t>(problem.lse_elements()), -12345.0f);
  AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), o.data(), lse.data()};
  args.alibi_slopes = inputs.alibi_slopes.empty() ? nullptr : inputs.alibi_slopes.data();
  Status status = kernel.launch(problem, args);
  if (!status.ok()) return ::testing::AssertionFailure() << status.error().describe();
  const ft::Reference reference = ft::reference_attention(problem, inputs, functions);
  return ft::matches_reference(ft::compare(problem, o, lse, reference),
                               max_rel_error(problem.dtype), max_lse_error(problem.dtype));
}

TEST(CpuVariant, EachVariantMatchesTheReference) {
  const cpu::CpuBackend& cpu = backend();
  struct Build {
    Case c;
    DType dtype;
    AttentionConfig config;
  };
  std::vector<Build> builds;
  // Every case in fp32 (tight bounds) with the smallest tile (the most key blocks to skip or
  // mask); three in bf16 with the default tile (the bf16 dot-product path where the host has it).
  for (const Case& c : ft::variant_cases()) {
    const AttentionProblem probe = make_problem(kShapes[0], c, DType::F32);
    const std::vector<AttentionConfig> legal = cpu.legal_configs(probe);
    ASSERT_FALSE(legal.empty()) << c.name;
    builds.push_back({c, DType::F32, legal.front()});
    const std::string name = c.name;
    if (name == "window_softcap_alibi_causal" || name == "score_mod" || name == "mask_mod_causal")
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
      EXPECT_TRUE(
          run_and_check(***kernels[i], make_problem(shape, b.c, b.dtype), b.c.functions, 100 + i))
          << label << " " << shape.name;
      ++checked;
    }
  }
  std::printf("%zu variant kernels, %d shape runs checked\n", builds.size(), checked);
}

// The bf16 dot-product path (scores unscaled until the softmax) on any host: the rendered source
// with FLASHJIT_CPU_EMULATE_DOT_BF16 defined (templates/cpu/common.hpp emulates the AVX512_BF16
// instructions where the host lacks them), for the cases that modify scores.
TEST(CpuVariant, Bf16DotProductPathMatchesTheReference) {
  const cpu::CpuBackend& cpu = backend();
  for (const Case& c : ft::variant_cases()) {
    const std::string name = c.name;
    if (name != "window_softcap_alibi_causal" && name != "score_mod") continue;
    const AttentionProblem probe = make_problem(kShapes[0], c, DType::BF16);
    const AttentionConfig config = cpu.legal_configs(probe).front();
    Result<KernelSource> source = cpu.render(probe, config);
    ASSERT_TRUE(source.ok()) << source.error().describe();
    source->text = "#define FLASHJIT_CPU_EMULATE_DOT_BF16 1\n" + source->text;
    Result<Binary> binary = cpu.compile(*source);
    ASSERT_TRUE(binary.ok()) << binary.error().describe();
    Result<std::shared_ptr<Kernel>> kernel =
        cpu.load(*binary, *source, ProblemSignature::of(probe), config);
    ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
    for (const Shape& shape : kShapes)
      EXPECT_TRUE(run_and_check(**kernel, make_problem(shape, c, DType::BF16), c.functions, 400))
          << name << " " << config.to_string() << " " << shape.name << " (bf16 dot products)";
  }
}

// Key blocks that a window (or a mask_mod) hides from every query are never read: with seqlen_q
// 64 and seqlen_k 1000 (diagonal 936), a causal window of 32 keys shows no query a key below 904,
// so keys [0, 768) (whole blocks for every block_n, all of which divide 768) are NaN. The prefix-LM
// case (prefix 16) reads its first block and hides [block_n, 768) the same way.
TEST(CpuVariant, HiddenKeyBlocksAreNeverRead) {
  const cpu::CpuBackend& cpu = backend();
  const Shape shape{"decode_like", 1, 2, 1, 64, 1000};
  Case windowed{"window", true, window(32, 0), {}};
  Case prefixed{"prefix", true, window(32, 0), {}};
  prefixed.variant.prefix = 16;
  // A mask_mod has no block rule: the kernel asks it over each block and skips the blocks it
  // hides whole (here [0, 768), which causal alone would read).
  Case masked{"mask_mod", true, {}, {}};
  masked.variant.mask_mod = "kv_idx >= 768";
  masked.functions.mask_mod = [](int64_t, int64_t, int64_t, int64_t j) { return j >= 768; };
  for (const Case& c : {windowed, prefixed, masked}) {
    const AttentionProblem problem = make_problem(shape, c, DType::F32);
    for (const AttentionConfig& config : cpu.legal_configs(problem)) {
      Result<std::shared_ptr<Kernel>> kernel = build_kernel(cpu, nullptr, problem, config);
      ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
      if (c.variant.prefix == 0) {
        EXPECT_TRUE(run_and_check(**kernel, problem, c.functions, 5, 768))
            << c.name << " " << config.to_string();
      } else {
        // NaN keys [block_n, 768): the prefix's one block is read whole (its keys past 16 are
        // masked per element); set them by hand (run_and_check poisons from 0).
        ft::HostInputs inputs = ft::random_inputs(problem, 6);
        for (int64_t j = config.block_n; j < 768; ++j)
          for (int col = 0; col < problem.head_dim; ++col) {
            ft::set_element(inputs.k.data(), j * problem.k_strides.seq + col, NAN, DType::F32);
            ft::set_element(inputs.v.data(), j * problem.v_strides.seq + col, NAN, DType::F32);
          }
        std::vector<uint16_t> o = ft::poisoned_storage(problem.o_span(), problem.dtype);
        std::vector<float> lse(static_cast<size_t>(problem.lse_elements()));
        ASSERT_TRUE((*kernel)
                        ->launch(problem, {inputs.q.data(), inputs.k.data(), inputs.v.data(),
                                           o.data(), lse.data()})
                        .ok());
        EXPECT_TRUE(ft::matches_reference(
            ft::compare(problem, o, lse, ft::reference_attention(problem, inputs)), 2e-5, 2e-5))
            << c.name << " " << config.to_string();
      }
      break;  // the smallest tile is enough (each build costs a compile)
    }
  }
  // The check can fail: without the window every key is read, and NaN reaches o.
  const AttentionProblem plain = AttentionProblem::make(1, 2, 1, 64, 1000, 64, DType::F32, true);
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(cpu, nullptr, plain, cpu.legal_configs(plain).front());
  ASSERT_TRUE(kernel.ok());
  EXPECT_FALSE(run_and_check(**kernel, plain, {}, 5, 768));
}

TEST(CpuVariant, ExpressionThatDoesNotCompileIsQuoted) {
  AttentionProblem problem = AttentionProblem::make(1, 1, 1, 16, 16, 64, DType::F32, false);
  problem.variant.score_mod = "score * undefined_thing";
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(backend(), nullptr, problem, backend().default_config(problem).value());
  ASSERT_FALSE(kernel.ok());
  EXPECT_EQ(kernel.error().code, ErrorCode::CompileFailed);
  const std::string& message = kernel.error().message;
  EXPECT_EQ(message.rfind("score_mod = \"score * undefined_thing\" does not compile: ", 0), 0u)
      << message;
  EXPECT_NE(message.find("undefined_thing"), std::string::npos) << message;
  // A mask_mod that is not a bool-convertible expression of its variables (no `score` there).
  problem.variant.score_mod.clear();
  problem.variant.mask_mod = "score > 0";
  kernel = build_kernel(backend(), nullptr, problem, backend().default_config(problem).value());
  ASSERT_FALSE(kernel.ok());
  EXPECT_EQ(kernel.error().message.rfind("mask_mod = \"score > 0\" does not compile: ", 0), 0u)
      << kernel.error().message;
}

TEST(CpuVariant, AlibiNeedsSlopes) {
  AttentionProblem problem = AttentionProblem::make(1, 2, 2, 16, 16, 64, DType::F32, true);
  problem.variant.alibi = true;
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(backend(), nullptr, problem, backend().default_config(problem).value());
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  const ft::HostInputs inputs = ft::random_inputs(problem, 1);
  std::vector<uint16_t> o = ft::poisoned_storage(problem.o_span(), problem.dtype);
  Status status =
      (*kernel)->launch(problem, {inputs.q.data(), inputs.k.data(), inputs.v.data(), o.data()});
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("alibi_slopes"), std::string::npos);
  // A plain problem is not the ALiBi kernel's.
  AttentionProblem plain = problem;
  plain.variant = Variant();
  status = (*kernel)->launch(plain, {inputs.q.data(), inputs.k.data(), inputs.v.data(), o.data()});
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("does not match"), std::string::npos);
}

#else
TEST(CpuVariant, SkippedWithoutTheCpuBackend) { GTEST_SKIP() << "built without LLVM"; }
#endif

}  // namespace
}  // namespace flashjit
