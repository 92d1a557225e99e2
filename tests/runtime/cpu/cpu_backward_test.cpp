// The CPU backend's backward pass (templates/cpu/attention_bwd.hpp) against the fp64 reference
// gradients (tuner/reference.hpp): every legal backward config for d 64 and 128 in fp32, the
// default in both dQ modes (fused and -det) in fp16 and bf16, the default for d 8, 96 and 256,
// causal and not, over odd shapes (seqlen 1, 17, ~100, seqlen_q != seqlen_k both ways, GQA 4:1,
// MQA, batch 3, BHSD and padded strides for every tensor), with poisoned outputs; the fused dQ
// split over the key blocks (a pool of more threads than work items); a finite-difference check
// of the gradients' definition; bitwise reproducibility and the caller's workspace; typed errors
// for bad input. Skips in a build without the CPU backend (the budget test runs everywhere).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "generator/cpu_config.hpp"
#include "generator/render.hpp"
#include "runtime/runtime.hpp"
#include "support/parallel.hpp"
#include "support/reference.hpp"

#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.hpp"
#include "runtime/cpu/cpu_info.hpp"
#endif

namespace flashjit {
namespace {

namespace ft = flashjit::testing;

AttentionProblem backward_problem(int64_t batch, int64_t heads_q, int64_t heads_kv,
                                  int64_t seqlen_q, int64_t seqlen_k, int d, DType dtype,
                                  bool causal, Layout layout = Layout::BSHD) {
  return AttentionProblem::make(batch, heads_q, heads_kv, seqlen_q, seqlen_k, d, dtype, causal,
                                layout)
      .with_pass(Pass::Backward);
}

TEST(CpuBackwardConfig, BudgetArithmetic) {
  const CpuSpec cpu = known_cpu();  // 1 MiB L2, 32 KiB L1d
  const AttentionProblem p = backward_problem(1, 1, 1, 128, 128, 128, DType::BF16, false);
  AttentionConfig c{32, 64, 1, 1};
  c.dq = DqMode::Separate;
  EXPECT_EQ(c.to_string(), "m32n64w1s1-det");
  EXPECT_EQ(cpu_backward_dkdv_bytes(c, p), 4 * (4 * 64 * 128 + 2 * 32 * 128 + 2 * 32 * 64));
  EXPECT_EQ(cpu_backward_dq_bytes(c, p), 4 * (3 * 32 * 128 + 2 * 64 * 128 + 2 * 64 * 32));
  EXPECT_EQ(cpu_backward_working_set_bytes(c, p), cpu_backward_dkdv_bytes(c, p));
  EXPECT_EQ(cpu_scratch_bytes(c, p), cpu_backward_working_set_bytes(c, p));
  EXPECT_EQ(cpu_backward_score_bytes(c), 8 * 32 * 64);
  EXPECT_TRUE(check_cpu_config(c, p, cpu).ok());

  // The fused dQ (DqMode::Atomic, no suffix): K as rows of d to 16 and the dQ_i rows of the
  // accumulator (d to 64) on top of the dK/dV item; its dQ item only sums, with no scratch.
  AttentionConfig fused = c;
  fused.dq = DqMode::Atomic;
  EXPECT_EQ(fused.to_string(), "m32n64w1s1");
  EXPECT_EQ(cpu_backward_dkdv_bytes(fused, p),
            cpu_backward_dkdv_bytes(c, p) + 4 * (64 * 128 + 32 * 128));
  EXPECT_EQ(cpu_backward_dq_bytes(fused, p), 0);
  AttentionProblem odd_d = p;
  odd_d.head_dim = 72;  // K rows of 80 lanes, accumulator rows of 128
  EXPECT_EQ(cpu_backward_dkdv_bytes(fused, odd_d),
            4 * (4 * 64 * 72 + 2 * 32 * 72 + 2 * 32 * 64 + 64 * 80 + 32 * 128));
  EXPECT_TRUE(check_cpu_config(fused, p, cpu).ok());
  // -det (a separate dQ pass) exists in the backward only.
  Status bad = check_cpu_config(c, p.with_pass(Pass::Forward), cpu);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("backward pass only"), std::string::npos);
  // The backward's own block choices: no block_n = 256, no block_m = 16.
  AttentionConfig wide_block{64, 256, 1, 1};
  bad = check_cpu_config(wide_block, p, cpu);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("block_n = 256"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("(backward)"), std::string::npos);
  // The L2 budget: m128n128-det at d = 256 needs 4 * (4*128*256 + 2*128*256 + 2*128*128) =
  // 896 KiB; the fused m128n128 4 * (128*256 + 128*256) = 256 KiB more: over a 1 MiB L2.
  AttentionProblem wide = p;
  wide.head_dim = 256;
  AttentionConfig big{128, 128, 1, 1};
  big.dq = DqMode::Separate;
  EXPECT_EQ(cpu_backward_working_set_bytes(big, wide), 917504);
  EXPECT_TRUE(check_cpu_config(big, wide, cpu).ok());
  AttentionConfig big_fused = big;
  big_fused.dq = DqMode::Atomic;
  EXPECT_EQ(cpu_backward_working_set_bytes(big_fused, wide), 917504 + 262144);
  bad = check_cpu_config(big_fused, wide, cpu);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("exceeds the L2"), std::string::npos);
  CpuSpec small = cpu;
  small.l2_bytes = 512 << 10;
  bad = check_cpu_config(big, wide, small);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("exceeds the L2"), std::string::npos);

  // 3 x 3 blocks, all fused (-det is legal too but no candidate where the fused one fits); every
  // one within the L2. At d = 256: -det for m128n128 (over the L2 fused, 896 KiB as -det).
  const std::vector<AttentionConfig> legal = legal_cpu_configs(p, cpu);
  EXPECT_EQ(legal.size(), 9u);
  for (const AttentionConfig& config : legal) {
    EXPECT_EQ(config.dq, DqMode::Atomic) << config.to_string();
    EXPECT_LE(cpu_backward_working_set_bytes(config, p), cpu.l2_bytes) << config.to_string();
  }
  const std::vector<AttentionConfig> legal_wide = legal_cpu_configs(wide, cpu);
  ASSERT_EQ(legal_wide.size(), 9u);
  EXPECT_EQ(legal_wide.back(), big);
  EXPECT_EQ(legal_wide[7].dq, DqMode::Atomic);
  // Bc = 64 (one register tile of keys); Br = L1d / (8 Bc): 32 KiB -> 64, 48 KiB -> 96 -> 64,
  // 16 KiB -> 32, 128 KiB -> 256 -> 128; the fused dQ.
  AttentionConfig expected{64, 64, 1, 1};
  EXPECT_EQ(default_cpu_config(p, cpu).value(), expected);
  CpuSpec other = cpu;
  other.l1d_bytes = 48 << 10;
  EXPECT_EQ(default_cpu_config(p, other).value(), expected);
  other.l1d_bytes = 16 << 10;
  expected.block_m = 32;
  EXPECT_EQ(default_cpu_config(p, other).value(), expected);
  other.l1d_bytes = 128 << 10;
  expected.block_m = 128;
  EXPECT_EQ(default_cpu_config(p, other).value(), expected);
  // -det where the fused dQ does not fit the L2 (m128n64 at d = 256 in a 700 KiB L2: the fused
  // item needs 4 * (4*64*256 + 2*128*256 + 2*128*64 + 64*256 + 128*256) = 768 KiB, -det 576).
  other.l2_bytes = 700 << 10;
  AttentionConfig det{128, 64, 1, 1};
  det.dq = DqMode::Separate;
  EXPECT_EQ(default_cpu_config(wide, other).value(), det);
  // The forward's default is unchanged by the pass plumbing.
  EXPECT_EQ(default_cpu_config(p.with_pass(Pass::Forward), cpu).value(),
            (AttentionConfig{64, 64, 1, 1}));
  const std::string plan = explain_cpu_plan(p, cpu);
  EXPECT_NE(plan.find("Br = L1d / (8 Bc) = 32768 / (8 * 64) = 64"), std::string::npos) << plan;
  EXPECT_NE(plan.find("Default (untuned): m64n64w1s1\n"), std::string::npos) << plan;

  // The renderer: three entry points in launch order, the backward template, the dQ mode.
  AttentionConfig default_det = expected;
  default_det.dq = DqMode::Separate;
  for (const AttentionConfig& config : {expected, default_det}) {
    const Result<KernelSource> source = render_cpu_attention(p, config);
    ASSERT_TRUE(source.ok()) << source.error().describe();
    EXPECT_EQ(source->entries,
              (std::vector<std::string>{kCpuBackwardPreprocessEntry, kCpuBackwardDkDvEntry,
                                        kCpuBackwardDqEntry}));
    EXPECT_NE(source->text.find("flashjit_cpu::BwdTraits"), std::string::npos);
    EXPECT_NE(
        source->text.find(config.dq == DqMode::Atomic ? "/*fused_dq=*/true" : "/*fused_dq=*/false"),
        std::string::npos);
  }
}

// The fused dQ's split count: 1 where batch x heads_kv gives every thread 4 work items, else
// enough splits of the key blocks for that (at most the key blocks there are).
TEST(CpuBackwardConfig, FusedDqSplits) {
  AttentionConfig fused{64, 64, 1, 1};
  AttentionConfig det = fused;
  det.dq = DqMode::Separate;
  auto problem = [](int64_t batch, int64_t heads_kv, int64_t seqlen_k) {
    return backward_problem(batch, 2 * heads_kv, heads_kv, 100, seqlen_k, 64, DType::F32, false);
  };
  // 4 dK/dV work items per thread: ceil(4 threads / (batch x heads_kv)) splits, at most the key
  // blocks (1000 keys: 16 blocks of 64).
  EXPECT_EQ(cpu_backward_dq_splits(fused, problem(2, 4, 1000), 2), 1);    // 8 items already
  EXPECT_EQ(cpu_backward_dq_splits(fused, problem(1, 4, 1000), 2), 2);    // 4 -> 8 items
  EXPECT_EQ(cpu_backward_dq_splits(fused, problem(3, 1, 1000), 2), 3);    // 3 -> 9 items
  EXPECT_EQ(cpu_backward_dq_splits(fused, problem(1, 1, 1000), 2), 8);    // 1 -> 8 items
  EXPECT_EQ(cpu_backward_dq_splits(fused, problem(2, 8, 1000), 6), 2);    // 16 -> 32 items
  EXPECT_EQ(cpu_backward_dq_splits(fused, problem(7, 7, 1000), 6), 1);    // 49 >= 24
  EXPECT_EQ(cpu_backward_dq_splits(fused, problem(1, 1, 1000), 32), 16);  // all 16 key blocks
  EXPECT_EQ(cpu_backward_dq_splits(fused, problem(1, 1, 100), 16), 2);    // 2 key blocks
  EXPECT_EQ(cpu_backward_dq_splits(fused, problem(1, 1, 1000), 1), 1);    // one core
  EXPECT_EQ(cpu_backward_dq_splits(det, problem(1, 1, 1000), 16), 1);     // no accumulator
}

#if FLASHJIT_HAVE_CPU_BACKEND

const cpu::CpuBackend& backend() {
  static const std::unique_ptr<cpu::CpuBackend> instance = cpu::CpuBackend::create().value();
  return *instance;
}

struct Shape {
  const char* name;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  enum { kBshd, kBhsd, kPadded } layout;
};

const Shape kShapes[] = {
    {"one", 1, 2, 2, 1, 1, Shape::kBshd},
    {"seventeen", 1, 2, 2, 17, 17, Shape::kBshd},
    {"q_shorter", 1, 2, 2, 45, 131, Shape::kBshd},
    {"q_longer", 1, 2, 2, 131, 45, Shape::kBshd},
    {"gqa_4to1_batch3", 3, 8, 2, 33, 40, Shape::kBshd},
    {"mqa", 1, 4, 1, 70, 90, Shape::kBshd},
    {"padded", 2, 4, 2, 37, 29, Shape::kPadded},
    {"bhsd", 1, 3, 3, 50, 66, Shape::kBhsd},
};
const Shape kLongShape = {"thousand", 1, 2, 1, 1000, 999, Shape::kBshd};

// Every tensor padded differently (rows by 8t elements, sequences by 16, batches by 32), so
// that a kernel reading one tensor through another's strides lands on garbage.
AttentionProblem make_problem(const Shape& s, int d, DType dtype, bool causal) {
  AttentionProblem p =
      backward_problem(s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k, d, dtype, causal,
                       s.layout == Shape::kBhsd ? Layout::BHSD : Layout::BSHD);
  if (s.layout == Shape::kPadded) {
    int tensor = 0;
    auto padded = [&](int64_t seqlen, int64_t heads) {
      Strides st;
      st.head = d + 8 * ++tensor;
      st.seq = heads * st.head + 16;
      st.batch = seqlen * st.seq + 32;
      return st;
    };
    p.q_strides = padded(s.seqlen_q, s.heads_q);
    p.k_strides = padded(s.seqlen_k, s.heads_kv);
    p.v_strides = padded(s.seqlen_k, s.heads_kv);
    p.o_strides = padded(s.seqlen_q, s.heads_q);
    p.do_strides = padded(s.seqlen_q, s.heads_q);
    p.dq_strides = padded(s.seqlen_q, s.heads_q);
    p.dk_strides = padded(s.seqlen_k, s.heads_kv);
    p.dv_strides = padded(s.seqlen_k, s.heads_kv);
  }
  return p;
}

struct Gradients {
  std::vector<uint16_t> dq, dk, dv;  // raw storage, poisoned before the launch
};

// One backward launch into poisoned gradient buffers.
Result<Gradients> run_backward(const Kernel& kernel, const AttentionProblem& problem,
                               const ft::HostInputs& inputs, void* workspace = nullptr,
                               size_t workspace_bytes = 0) {
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
  args.workspace = workspace;
  args.workspace_bytes = workspace_bytes;
  FLASHJIT_TRY(kernel.launch(problem, args));
  return out;
}

// Inputs and reference gradients, shared by every config of one (shape, d, dtype, causal).
struct Case {
  AttentionProblem problem;
  ft::HostInputs inputs;
  ft::Reference reference;
};

// The largest relative error seen per dtype, over every gradient of every run (reported for the
// calibration of gradient_tolerance).
std::map<DType, double>& worst_errors() {
  static std::map<DType, double> worst;
  return worst;
}

::testing::AssertionResult check(const Kernel& kernel, const Case& c) {
  Result<Gradients> g = run_backward(kernel, c.problem, c.inputs);
  if (!g.ok()) return ::testing::AssertionFailure() << g.error().describe();
  const GradientComparison comparison =
      compare_gradients(c.problem, g->dq, g->dk, g->dv, c.reference);
  double& worst = worst_errors()[c.problem.dtype];
  worst = std::max(worst,
                   std::isnan(comparison.max_rel_error()) ? INFINITY : comparison.max_rel_error());
  const double limit = gradient_tolerance(c.problem.dtype);
  if (within_tolerance(comparison, limit)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "limit " << limit << ": " << comparison.to_string();
}

struct Variant {
  int head_dim;
  DType dtype;
  bool causal;
  AttentionConfig config;
  bool is_default;
};

TEST(CpuBackward, EveryLegalConfigMatchesTheReference) {
  const cpu::CpuBackend& cpu = backend();
  std::vector<Variant> variants;
  for (int d : {64, 128, 8, 96, 256})
    for (DType dtype : {DType::F16, DType::BF16, DType::F32})
      for (bool causal : {false, true}) {
        const AttentionProblem probe = make_problem(kShapes[0], d, dtype, causal);
        const AttentionConfig def = cpu.default_config(probe).value();
        variants.push_back({d, dtype, causal, def, true});
        if (d != 64 && d != 128) continue;
        // fp32: every block pair in both dQ modes (each tile shape; -det is legal where the
        // fused dQ is, though no tuning candidate there); fp16 and bf16 differ only in their
        // conversions: the default's blocks in the other dQ mode.
        for (const AttentionConfig& legal : cpu.legal_configs(probe))
          for (DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
            AttentionConfig c = legal;
            c.dq = dq;
            const bool default_blocks = c.block_m == def.block_m && c.block_n == def.block_n;
            if (c != def && (dtype == DType::F32 || default_blocks) &&
                cpu.check_config(c, probe).ok())
              variants.push_back({d, dtype, causal, c, false});
          }
      }

  // Compile every kernel and make every case's inputs and reference first, on all cores.
  using Built = std::optional<Result<std::shared_ptr<Kernel>>>;
  std::vector<Built> kernels = ft::parallel_map<Built>(variants.size(), [&](size_t i) {
    const Variant& v = variants[i];
    return Built(build_kernel(cpu, nullptr, make_problem(kShapes[0], v.head_dim, v.dtype, v.causal),
                              v.config));
  });
  using Key = std::tuple<int, DType, bool, int>;  // d, dtype, causal, shape (-1: the long one)
  std::vector<Key> keys;
  for (const Variant& v : variants) {
    if (!v.is_default) continue;
    for (int s = -1; s < static_cast<int>(std::size(kShapes)); ++s)
      keys.emplace_back(v.head_dim, v.dtype, v.causal, s);
  }
  std::vector<std::shared_ptr<Case>> made =
      ft::parallel_map<std::shared_ptr<Case>>(keys.size(), [&](size_t i) {
        const auto [d, dtype, causal, s] = keys[i];
        auto c = std::make_shared<Case>();
        c->problem = make_problem(s < 0 ? kLongShape : kShapes[s], d, dtype, causal);
        c->inputs = ft::random_inputs(c->problem, 100 + i);
        c->reference = ft::reference_attention(c->problem, c->inputs);
        return c;
      });
  std::map<Key, std::shared_ptr<Case>> cases;
  for (size_t i = 0; i < keys.size(); ++i) cases[keys[i]] = made[i];

  int runs = 0;
  for (size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    const std::string label = "d" + std::to_string(v.head_dim) + " " + to_string(v.dtype) +
                              (v.causal ? " causal " : " ") + v.config.to_string();
    const Result<std::shared_ptr<Kernel>>& kernel = *kernels[i];
    ASSERT_TRUE(kernel.ok()) << label << ": " << kernel.error().describe();
    for (int s = v.is_default ? -1 : 0; s < static_cast<int>(std::size(kShapes)); ++s) {
      const Case& c = *cases.at(Key{v.head_dim, v.dtype, v.causal, s});
      EXPECT_TRUE(check(**kernel, c)) << label << " " << (s < 0 ? kLongShape : kShapes[s]).name;
      ++runs;
    }
  }
  std::printf("%zu backward kernels, %d shape runs checked on %s\n", variants.size(), runs,
              cpu.cpu().to_string().c_str());
  for (const auto& [dtype, worst] : worst_errors())
    std::printf("  worst relative L2 gradient error, %s: %.3g (tolerance %.3g)\n", to_string(dtype),
                worst, gradient_tolerance(dtype));
}

// A bf16 kernel that takes the dot-product path whatever the host (see below).
Result<std::shared_ptr<Kernel>> build_dot_kernel(const AttentionProblem& problem,
                                                 const AttentionConfig& config) {
  Result<KernelSource> source = backend().render(problem, config);
  if (!source.ok()) return source.error();
  source->text = "#define FLASHJIT_CPU_EMULATE_DOT_BF16 1\n" + source->text;
  Result<Binary> binary = backend().compile(*source);
  if (!binary.ok()) return binary.error();
  return backend().load(*binary, *source, ProblemSignature::of(problem), config);
}

// The bf16 dot-product path (vdpbf16ps, P and dS rounded to bf16) on any host: the rendered
// source with FLASHJIT_CPU_EMULATE_DOT_BF16 defined (templates/cpu/common.hpp emulates the two
// AVX512_BF16 instructions where the host lacks them), over every shape, causal and not, for
// configs that cover each tile shape (2 and 4 lane vectors on either side, more than 4).
TEST(CpuBackward, Bf16DotProductPathMatchesTheReference) {
  struct Item {
    int d;
    bool causal;
    AttentionConfig config;
  };
  std::vector<Item> items;
  for (bool causal : {false, true})
    for (auto [d, m, n] :
         {std::tuple{64, 32, 32}, std::tuple{64, 128, 128}, std::tuple{128, 64, 64}})
      for (DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
        AttentionConfig c{m, n, 1, 1};
        c.dq = dq;
        items.push_back({d, causal, c});
      }
  using Built = std::optional<Result<std::shared_ptr<Kernel>>>;
  std::vector<Built> kernels = ft::parallel_map<Built>(items.size(), [&](size_t i) {
    return Built(build_dot_kernel(
        make_problem(kShapes[0], items[i].d, DType::BF16, items[i].causal), items[i].config));
  });
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string label = "d" + std::to_string(items[i].d) +
                              (items[i].causal ? " causal " : " ") + items[i].config.to_string() +
                              " (bf16 dot products)";
    ASSERT_TRUE(kernels[i]->ok()) << label << ": " << (*kernels[i]).error().describe();
    for (const Shape& shape : kShapes) {
      Case c{make_problem(shape, items[i].d, DType::BF16, items[i].causal), {}, {}};
      c.inputs = ft::random_inputs(c.problem, 300 + i);
      c.reference = ft::reference_attention(c.problem, c.inputs);
      EXPECT_TRUE(check(***kernels[i], c)) << label << " " << shape.name;
    }
  }
}

// What the kernels reach on the benchmark's kind of problem (N = 512, d = 128), per dtype and
// arithmetic (bf16 also through the dot-product path), for the calibration of
// gradient_tolerance (printed, and held to it).
TEST(CpuBackward, ErrorsAtBenchmarkSize) {
  const cpu::CpuBackend& cpu = backend();
  struct Item {
    DType dtype;
    bool dot;
    bool causal = false;
  };
  std::vector<Item> items;
  for (bool causal : {false, true})
    for (auto [dtype, dot] : {std::pair{DType::F16, false}, std::pair{DType::BF16, false},
                              std::pair{DType::BF16, true}, std::pair{DType::F32, false}})
      items.push_back({dtype, dot, causal});
  auto problem_of = [](const Item& item) {
    return backward_problem(1, 2, 2, 512, 512, 128, item.dtype, item.causal);
  };
  using Built = std::optional<Result<std::shared_ptr<Kernel>>>;
  std::vector<Built> kernels = ft::parallel_map<Built>(items.size(), [&](size_t i) {
    const AttentionProblem problem = problem_of(items[i]);
    const AttentionConfig config = cpu.default_config(problem).value();
    return Built(items[i].dot ? build_dot_kernel(problem, config)
                              : build_kernel(cpu, nullptr, problem, config));
  });
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_TRUE(kernels[i]->ok()) << (*kernels[i]).error().describe();
    const Kernel& kernel = ***kernels[i];
    Case c{problem_of(items[i]), {}, {}};
    c.inputs = ft::random_inputs(c.problem, 77);
    c.reference = ft::reference_attention(c.problem, c.inputs);
    Result<Gradients> g = run_backward(kernel, c.problem, c.inputs);
    ASSERT_TRUE(g.ok()) << g.error().describe();
    const GradientComparison comparison =
        compare_gradients(c.problem, g->dq, g->dk, g->dv, c.reference);
    std::printf("%s%s %s: dq %.3g dk %.3g dv %.3g\n", c.problem.to_string().c_str(),
                items[i].dot ? " (bf16 dot products)" : "", kernel.config().to_string().c_str(),
                comparison.dq.rel_error, comparison.dk.rel_error, comparison.dv.rel_error);
    EXPECT_TRUE(within_tolerance(comparison, gradient_tolerance(items[i].dtype)))
        << comparison.to_string();
  }
}

// The gradients' definition, independently of the reference's gradient code: with
// L = sum(dO * O(q, k, v)) and O from the fp64 reference forward, dL/dx for a sample of elements
// of q, k and v by central differences, (L(x + h) - L(x - h)) / (2h), against the kernel's fp32
// dq, dk and dv. h = 2^-8 on inputs of size ~1: the truncation error, h^2 |L'''| / 6, and the
// fp64 cancellation, ~1e-16 |L| / h, stay near 1e-7 of the tensor's largest gradient (seen: at
// most 2e-7), the kernel's fp32 gradients are within ~1e-6 relative; the limit, 1e-5 of the
// largest gradient, is far below the O(1) error of a wrong term (a missing scale, a group head
// not summed, the wrong D, a key masked or not).
TEST(CpuBackward, FiniteDifferences) {
  const cpu::CpuBackend& cpu = backend();
  struct FdShape {
    int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
    bool causal;
  };
  for (const FdShape& s : {FdShape{2, 4, 2, 19, 23, false}, FdShape{1, 3, 1, 21, 13, true},
                           FdShape{1, 2, 2, 9, 26, true}}) {
    const AttentionProblem problem = backward_problem(s.batch, s.heads_q, s.heads_kv, s.seqlen_q,
                                                      s.seqlen_k, 16, DType::F32, s.causal);
    const AttentionProblem forward = problem.with_pass(Pass::Forward);
    Result<std::shared_ptr<Kernel>> kernel =
        build_kernel(cpu, nullptr, problem, cpu.default_config(problem).value());
    ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
    ft::HostInputs inputs = ft::random_inputs(problem, 5);
    Result<Gradients> g = run_backward(**kernel, problem, inputs);
    ASSERT_TRUE(g.ok()) << g.error().describe();

    // L = sum(dO * O), O dense [b, s, h, d] from the fp64 forward.
    const std::vector<double> d_o = [&] {
      std::vector<double> dense;
      for (int64_t b = 0; b < problem.batch; ++b)
        for (int64_t i = 0; i < problem.seqlen_q; ++i)
          for (int64_t h = 0; h < problem.heads_q; ++h)
            for (int c = 0; c < problem.head_dim; ++c)
              dense.push_back(ft::element_value(inputs.d_o.data(),
                                                b * problem.do_strides.batch +
                                                    i * problem.do_strides.seq +
                                                    h * problem.do_strides.head + c,
                                                DType::F32));
      return dense;
    }();
    auto loss = [&](const ft::HostInputs& x) {
      const ft::Reference r = ft::reference_attention(forward, x);
      double sum = 0;
      for (size_t i = 0; i < r.o.size(); ++i) sum += d_o[i] * r.o[i];
      return sum;
    };

    struct Tensor {
      const char* name;
      std::vector<uint16_t> ft::HostInputs::*input;
      const std::vector<uint16_t>* gradient;
      Strides strides, gradient_strides;
      int64_t seqlen, heads;
    };
    const Tensor tensors[] = {
        {"q", &ft::HostInputs::q, &g->dq, problem.q_strides, problem.dq_strides, s.seqlen_q,
         s.heads_q},
        {"k", &ft::HostInputs::k, &g->dk, problem.k_strides, problem.dk_strides, s.seqlen_k,
         s.heads_kv},
        {"v", &ft::HostInputs::v, &g->dv, problem.v_strides, problem.dv_strides, s.seqlen_k,
         s.heads_kv},
    };
    std::mt19937_64 engine(11);
    for (const Tensor& t : tensors) {
      double largest = 0;  // the tensor's largest |gradient|, the error's scale
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t i = 0; i < t.seqlen; ++i)
          for (int64_t h = 0; h < t.heads; ++h)
            for (int c = 0; c < problem.head_dim; ++c) {
              const float value =
                  ft::element_value(t.gradient->data(),
                                    b * t.gradient_strides.batch + i * t.gradient_strides.seq +
                                        h * t.gradient_strides.head + c,
                                    DType::F32);
              largest = std::max(largest, std::abs(static_cast<double>(value)));
            }
      ASSERT_GT(largest, 0) << t.name;
      double worst = 0;
      for (int sample = 0; sample < 12; ++sample) {
        const int64_t b = engine() % s.batch, i = engine() % t.seqlen, h = engine() % t.heads;
        const int c = static_cast<int>(engine() % problem.head_dim);
        const int64_t at = b * t.strides.batch + i * t.strides.seq + h * t.strides.head + c;
        ft::HostInputs x = inputs;
        const float value = ft::element_value((x.*t.input).data(), at, DType::F32);
        const float h_step = 1.0f / 256;
        ft::set_element((x.*t.input).data(), at, value + h_step, DType::F32);
        const double up = loss(x);
        ft::set_element((x.*t.input).data(), at, value - h_step, DType::F32);
        const double down = loss(x);
        const double numeric = (up - down) / (2.0 * h_step);
        const double kernel_value =
            ft::element_value(t.gradient->data(),
                              b * t.gradient_strides.batch + i * t.gradient_strides.seq +
                                  h * t.gradient_strides.head + c,
                              DType::F32);
        worst = std::max(worst, std::abs(kernel_value - numeric) / largest);
        EXPECT_LE(std::abs(kernel_value - numeric), 1e-5 * largest)
            << "d" << t.name << "[" << b << ", " << i << ", " << h << ", " << c << "]: kernel "
            << kernel_value << ", finite difference " << numeric << " (" << problem.to_string()
            << ")";
      }
      std::printf("%s d%s: worst |kernel - finite difference| = %.2g of the largest |gradient|\n",
                  problem.to_string().c_str(), t.name, worst);
    }
  }
}

// Two launches give the same bits, with the kernel's own workspace and with the caller's.
TEST(CpuBackward, BitwiseReproducibleWithEitherWorkspace) {
  const cpu::CpuBackend& cpu = backend();
  for (DType dtype : {DType::BF16, DType::F32})
    for (DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
      const AttentionProblem problem = make_problem(kShapes[4], 64, dtype, true);
      AttentionConfig config = cpu.default_config(problem).value();
      config.dq = dq;
      Result<std::shared_ptr<Kernel>> kernel = build_kernel(cpu, nullptr, problem, config);
      ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
      const ft::HostInputs inputs = ft::random_inputs(problem, 3);
      const Result<Gradients> first = run_backward(**kernel, problem, inputs);
      const Result<Gradients> second = run_backward(**kernel, problem, inputs);
      const size_t bytes = (*kernel)->workspace_bytes(problem);
      EXPECT_GT(bytes, 0u);
      Result<DeviceBuffer> workspace = cpu.allocate(bytes);
      ASSERT_TRUE(workspace.ok());
      ASSERT_TRUE(cpu.fill_bytes(workspace->get(), 0xFF, bytes).ok());  // stale garbage
      const Result<Gradients> caller =
          run_backward(**kernel, problem, inputs, workspace->get(), bytes);
      for (const Result<Gradients>* run : {&first, &second, &caller})
        ASSERT_TRUE(run->ok()) << run->error().describe();
      for (const Result<Gradients>* other : {&second, &caller}) {
        EXPECT_EQ((*other)->dq, first->dq) << to_string(dtype) << " " << config.to_string();
        EXPECT_EQ((*other)->dk, first->dk) << to_string(dtype) << " " << config.to_string();
        EXPECT_EQ((*other)->dv, first->dv) << to_string(dtype) << " " << config.to_string();
      }
      const ft::Reference reference = ft::reference_attention(problem, inputs);
      EXPECT_TRUE(within_tolerance(
          compare_gradients(problem, caller->dq, caller->dk, caller->dv, reference),
          gradient_tolerance(dtype)));
    }
}

// The fused dQ split over the key blocks: a pool of 5 threads for problems of 1 to 6 (batch,
// kv head) pairs, so that the dK/dV work items add into 2 to 5 copies of the dQ accumulator
// that the dQ items sum (one shape of a single key block as the unsplit control); against the
// reference and bitwise reproducible.
TEST(CpuBackward, FusedDqSplitOverTheKeyBlocks) {
  CpuSpec spec = cpu::host_cpu();
  spec.cores = 5;
  const std::unique_ptr<cpu::CpuBackend> five = cpu::CpuBackend::create(spec).value();
  std::vector<std::tuple<DType, bool>> items;
  for (DType dtype : {DType::F32, DType::BF16})
    for (bool causal : {false, true}) items.emplace_back(dtype, causal);
  using Built = std::optional<Result<std::shared_ptr<Kernel>>>;
  std::vector<Built> kernels = ft::parallel_map<Built>(items.size(), [&](size_t i) {
    const AttentionProblem problem =
        make_problem(kShapes[0], 64, std::get<0>(items[i]), std::get<1>(items[i]));
    return Built(build_kernel(*five, nullptr, problem, five->default_config(problem).value()));
  });
  int split_runs = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_TRUE(kernels[i]->ok()) << (*kernels[i]).error().describe();
    const Kernel& kernel = ***kernels[i];
    ASSERT_EQ(kernel.config().dq, DqMode::Atomic);
    for (const Shape& shape : {kLongShape, kShapes[2], kShapes[4], kShapes[5], kShapes[7]}) {
      Case c{make_problem(shape, 64, std::get<0>(items[i]), std::get<1>(items[i])), {}, {}};
      const int splits = cpu_backward_dq_splits(kernel.config(), c.problem, 5);
      split_runs += splits > 1;
      c.inputs = ft::random_inputs(c.problem, 500 + i);
      c.reference = ft::reference_attention(c.problem, c.inputs);
      EXPECT_TRUE(check(kernel, c)) << c.problem.to_string() << ", " << splits << " splits";
      const Result<Gradients> first = run_backward(kernel, c.problem, c.inputs);
      const Result<Gradients> second = run_backward(kernel, c.problem, c.inputs);
      ASSERT_TRUE(first.ok() && second.ok());
      EXPECT_EQ(first->dq, second->dq) << c.problem.to_string();
      EXPECT_EQ(first->dk, second->dk) << c.problem.to_string();
      EXPECT_EQ(first->dv, second->dv) << c.problem.to_string();
    }
  }
  // 16, 3, 1 (one key block), 2 and 2 splits: the thousand keys, q_shorter, gqa, mqa, bhsd.
  EXPECT_EQ(split_runs, 4 * 4);
}

::testing::AssertionResult fails_with(const Status& status, ErrorCode code,
                                      const std::string& text) {
  if (status.ok()) return ::testing::AssertionFailure() << "succeeded; expected '" << text << "'";
  if (status.error().code != code || status.error().message.find(text) == std::string::npos)
    return ::testing::AssertionFailure()
           << status.error().describe() << "; expected '" << text << "'";
  return ::testing::AssertionSuccess() << status.error().describe();
}

TEST(CpuBackward, BadInputIsATypedErrorNamingIt) {
  const cpu::CpuBackend& cpu = backend();
  const AttentionProblem problem = make_problem(kShapes[1], 64, DType::BF16, false);
  Result<std::shared_ptr<Kernel>> built =
      build_kernel(cpu, nullptr, problem, cpu.default_config(problem).value());
  ASSERT_TRUE(built.ok()) << built.error().describe();
  const Kernel& kernel = **built;
  ft::HostInputs inputs = ft::random_inputs(problem, 9);
  Gradients g{ft::poisoned_storage(problem.dq_span(), problem.dtype),
              ft::poisoned_storage(problem.dkv_span(), problem.dtype),
              ft::poisoned_storage(problem.dkv_span(), problem.dtype)};
  AttentionArgs good;
  good.q = inputs.q.data();
  good.k = inputs.k.data();
  good.v = inputs.v.data();
  good.o = inputs.o.data();
  good.lse = inputs.lse.data();
  good.d_o = inputs.d_o.data();
  good.dq = g.dq.data();
  good.dk = g.dk.data();
  good.dv = g.dv.data();
  ASSERT_TRUE(kernel.launch(problem, good).ok());

  AttentionArgs args = good;
  args.lse = nullptr;
  EXPECT_TRUE(fails_with(kernel.launch(problem, args), ErrorCode::InvalidArgument, "lse is null"));
  args = good;
  args.dq = nullptr;
  EXPECT_TRUE(fails_with(kernel.launch(problem, args), ErrorCode::InvalidArgument, "dq is null"));
  args = good;
  args.d_o = nullptr;
  EXPECT_TRUE(fails_with(kernel.launch(problem, args), ErrorCode::InvalidArgument, "do is null"));
  args = good;
  args.dk = reinterpret_cast<char*>(g.dk.data()) + 1;
  EXPECT_TRUE(fails_with(kernel.launch(problem, args), ErrorCode::InvalidArgument,
                         "must be 2-byte aligned"));
  // Wrong signature: the forward pass, another head dim, causal.
  EXPECT_TRUE(fails_with(kernel.launch(problem.with_pass(Pass::Forward), good),
                         ErrorCode::InvalidArgument, "does not match the kernel's bwd d64"));
  AttentionProblem causal = problem;
  causal.causal = true;
  EXPECT_TRUE(
      fails_with(kernel.launch(causal, good), ErrorCode::InvalidArgument, "does not match"));
  // A caller's workspace one byte too small.
  const size_t bytes = kernel.workspace_bytes(problem);
  Result<DeviceBuffer> workspace = cpu.allocate(bytes);
  ASSERT_TRUE(workspace.ok());
  args = good;
  args.workspace = workspace->get();
  args.workspace_bytes = bytes - 1;
  EXPECT_TRUE(fails_with(kernel.launch(problem, args), ErrorCode::InvalidArgument,
                         "workspace_bytes = " + std::to_string(bytes - 1)));
  // An invalid problem (the gradient strides are checked too).
  AttentionProblem bad = problem;
  bad.dk_strides.seq = 3;
  EXPECT_FALSE(kernel.launch(bad, good).ok());
  // A forward kernel does not take the backward problem.
  const AttentionProblem forward = problem.with_pass(Pass::Forward);
  Result<std::shared_ptr<Kernel>> forward_kernel =
      build_kernel(cpu, nullptr, forward, cpu.default_config(forward).value());
  ASSERT_TRUE(forward_kernel.ok());
  EXPECT_TRUE(fails_with((*forward_kernel)->launch(problem, good), ErrorCode::InvalidArgument,
                         "does not match"));
}

// Runtime::attention_backward serves the CPU backward (the default config, compiled once).
TEST(CpuBackward, ThroughTheRuntime) {
  RuntimeOptions options;
  options.backend = "cpu";
  options.record_misses = false;
  options.tune_on_miss = false;
  Result<std::unique_ptr<Runtime>> runtime = Runtime::create(options);
  ASSERT_TRUE(runtime.ok()) << runtime.error().describe();
  const AttentionProblem problem = make_problem(kShapes[5], 128, DType::BF16, true);
  Result<std::shared_ptr<Kernel>> kernel =
      (*runtime)->attention_backward(problem.with_pass(Pass::Forward));
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  EXPECT_EQ((*kernel)->signature().pass, Pass::Backward);
  const ft::HostInputs inputs = ft::random_inputs(problem, 21);
  Result<Gradients> g = run_backward(**kernel, problem, inputs);
  ASSERT_TRUE(g.ok()) << g.error().describe();
  const ft::Reference reference = ft::reference_attention(problem, inputs);
  EXPECT_TRUE(within_tolerance(compare_gradients(problem, g->dq, g->dk, g->dv, reference),
                               gradient_tolerance(DType::BF16)));
}

#endif  // FLASHJIT_HAVE_CPU_BACKEND

}  // namespace
}  // namespace flashjit
