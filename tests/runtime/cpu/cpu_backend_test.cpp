// The CPU backend (Clang/LLVM 14 + ORC JIT) against the fp64 reference: every legal config (the
// tuner's candidates) for d 64 and 128, two accepted non-candidates at d 64 (the default for d 96
// and 256) x fp16/bf16/fp32 x causal, over the shapes of the GPU
// tests (seqlen 1, 17, 1000, seqlen_q != seqlen_k both ways, GQA, MQA, padded BSHD, BHSD); clang
// diagnostics in compile errors; tune -> store -> a new process's attention(). Skips in a build
// without the CPU backend.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "generator/cpu_config.hpp"
#include "generator/render.hpp"
#include "runtime/runtime.hpp"
#include "support/parallel.hpp"
#include "support/reference.hpp"
#include "tuner/tuner.hpp"

#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/clang_jit.hpp"
#include "runtime/cpu/cpu_backend.hpp"
#include "runtime/cpu/cpu_info.hpp"
#endif

namespace flashjit {
namespace {

namespace ft = flashjit::testing;
namespace fs = std::filesystem;

TEST(CpuConfig, BudgetArithmetic) {
  const CpuSpec cpu = known_cpu();  // 1 MiB L2, 32 KiB L1d
  const AttentionProblem p = AttentionProblem::make(1, 1, 1, 128, 128, 128, DType::BF16, false);
  const AttentionConfig c{64, 64, 1, 1};
  EXPECT_EQ(cpu_working_set_bytes(c, p),
            4 * (64 * 128 + 2 * 64 * 128 + 64 * 64 + 64 * 128 + 3 * 64));
  EXPECT_EQ(cpu_kv_block_bytes(c, p), 8 * 64 * 128);
  EXPECT_TRUE(check_cpu_config(c, p, cpu).ok());
  Status bad = check_cpu_config({64, 64, 4, 2}, p, cpu);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("must be 1 on the CPU"), std::string::npos);
  bad = check_cpu_config({48, 64, 1, 1}, p, cpu);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("block_m = 48"), std::string::npos);
  CpuSpec small = cpu;
  small.l2_bytes = 256 << 10;
  bad = check_cpu_config({128, 256, 1, 1}, p, small);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("exceeds the L2"), std::string::npos);
  // Br = 64 (one register tile of queries); Bc = (32 KiB / 2) / (4 * 64) = 64.
  EXPECT_EQ(cpu_score_block_bytes(c), 4 * 64 * 64);
  EXPECT_EQ(default_cpu_config(p, cpu).value(), (AttentionConfig{64, 64, 1, 1}));
  CpuSpec big_l1 = cpu;
  big_l1.l1d_bytes = 48 << 10;  // 24 KiB / 256 B = 96 -> 64
  EXPECT_EQ(default_cpu_config(p, big_l1).value(), (AttentionConfig{64, 64, 1, 1}));
  big_l1.l1d_bytes = 128 << 10;  // 64 KiB / 256 B = 256
  EXPECT_EQ(default_cpu_config(p, big_l1).value(), (AttentionConfig{64, 256, 1, 1}));
  const std::string plan = explain_cpu_plan(p, cpu);
  EXPECT_NE(plan.find("16384 / (4 * 64) = 64"), std::string::npos) << plan;
  EXPECT_EQ(legal_cpu_configs(p, small).size() < legal_cpu_configs(p, cpu).size(), true);

  // Tuning candidates: block_m >= 32 and the S^T block within the L1d (32 KiB): m32n32..m32n256,
  // m64n32..m64n128, m128n32, m128n64. The others stay legal for check_cpu_config.
  EXPECT_EQ(legal_cpu_configs(p, cpu).size(), 9u);
  EXPECT_TRUE(check_cpu_config({16, 64, 1, 1}, p, cpu).ok());
  EXPECT_FALSE(cpu_forward_candidate({16, 64, 1, 1}, cpu));
  EXPECT_FALSE(cpu_forward_candidate({128, 128, 1, 1}, cpu));
  EXPECT_TRUE(cpu_forward_candidate({128, 64, 1, 1}, cpu));
  EXPECT_TRUE(cpu_forward_candidate({32, 256, 1, 1}, cpu));
  EXPECT_NE(explain_cpu_plan(p, cpu).find("legal, no candidate"), std::string::npos);
  CpuSpec no_l1 = cpu;  // an unknown L1d: every config that fits the L2 is a candidate
  no_l1.l1d_bytes = 0;
  EXPECT_EQ(legal_cpu_configs(p, no_l1).size(), 16u);
  // The register file and tile by ISA level.
  EXPECT_EQ(cpu_vector_registers(cpu), 16);
  EXPECT_EQ(cpu_vector_lanes(cpu), 8);
  EXPECT_EQ(cpu_tile_queries(cpu), 16);
  CpuSpec avx512 = cpu;
  avx512.avx512f = true;
  EXPECT_EQ(cpu_vector_registers(avx512), 32);
  EXPECT_EQ(cpu_vector_lanes(avx512), 16);
  EXPECT_EQ(cpu_tile_queries(avx512), 64);
  CpuSpec sse = cpu;
  sse.avx2 = sse.fma = false;
  EXPECT_EQ(cpu_vector_lanes(sse), 4);
}

#if FLASHJIT_HAVE_CPU_BACKEND

TEST(CpuInfo, ParsesCacheSizes) {
  EXPECT_EQ(cpu::parse_cache_size("48K"), 48 << 10);
  EXPECT_EQ(cpu::parse_cache_size("32M"), 32 << 20);
  EXPECT_EQ(cpu::parse_cache_size("512"), 512);
  EXPECT_EQ(cpu::parse_cache_size("x"), 0);
  const CpuSpec host = cpu::host_cpu();
  EXPECT_GE(host.cores, 1);
  EXPECT_GT(host.l1d_bytes, 0);
  EXPECT_GT(host.l2_bytes, 0);
}

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
    {"q_shorter", 1, 2, 2, 100, 300, Shape::kBshd},
    {"q_longer", 1, 2, 2, 300, 100, Shape::kBshd},
    {"gqa", 2, 8, 2, 65, 65, Shape::kBshd},
    {"mqa", 1, 4, 1, 70, 90, Shape::kBshd},
    {"padded_bshd", 2, 2, 2, 33, 47, Shape::kPadded},
    {"bhsd", 1, 3, 3, 50, 40, Shape::kBhsd},
};
const Shape kLongShape = {"thousand", 1, 1, 1, 1000, 1000, Shape::kBshd};

AttentionProblem make_problem(const Shape& s, int d, DType dtype, bool causal) {
  AttentionProblem p =
      AttentionProblem::make(s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k, d, dtype,
                             causal, s.layout == Shape::kBhsd ? Layout::BHSD : Layout::BSHD);
  if (s.layout == Shape::kPadded) {  // rows padded by 8 elements, sequences by 16, batches by 32
    auto padded = [&](int64_t seqlen, int64_t heads) {
      Strides st;
      st.head = d + 8;
      st.seq = heads * st.head + 16;
      st.batch = seqlen * st.seq + 32;
      return st;
    };
    p.q_strides = p.o_strides = padded(s.seqlen_q, s.heads_q);
    p.k_strides = p.v_strides = padded(s.seqlen_k, s.heads_kv);
  }
  return p;
}

// Tolerances against the fp64 reference: 16-bit storage rounds o to 2^-9 (bf16) relative; fp32
// storage leaves only the fp32 arithmetic (seen: o 7e-7, lse 1.3e-6), so it must be far closer
// (a kernel that rounded anything to 16 bits would fail).
double max_rel_error(DType dtype) { return dtype == DType::F32 ? 2e-5 : 1e-2; }
double max_lse_error(DType dtype) { return dtype == DType::F32 ? 2e-5 : 1e-3; }

// Runs `kernel` on `problem` with poisoned outputs and compares with the fp64 reference.
::testing::AssertionResult run_and_check(const Kernel& kernel, const AttentionProblem& problem,
                                         uint64_t seed) {
  const ft::HostInputs inputs = ft::random_inputs(problem, seed);
  std::vector<uint16_t> o = ft::poisoned_storage(problem.o_span(), problem.dtype);
  std::vector<float> lse(static_cast<size_t>(problem.lse_elements()), -12345.0f);
  Status status = kernel.launch(
      problem, {inputs.q.data(), inputs.k.data(), inputs.v.data(), o.data(), lse.data()});
  if (!status.ok()) return ::testing::AssertionFailure() << status.error().describe();
  const ft::Reference reference = ft::reference_attention(problem, inputs);
  return ft::matches_reference(ft::compare(problem, o, lse, reference),
                               max_rel_error(problem.dtype), max_lse_error(problem.dtype));
}

struct Variant {
  int head_dim;
  DType dtype;
  bool causal;
  AttentionConfig config;
  bool long_shape;  // also run the 1000 x 1000 shape
};

TEST(CpuAttention, EveryLegalConfigMatchesTheReference) {
  const cpu::CpuBackend& cpu = backend();
  std::vector<Variant> variants;
  for (int d : {64, 128, 96, 256}) {
    for (DType dtype : {DType::F16, DType::BF16, DType::F32}) {
      for (bool causal : {false, true}) {
        const AttentionProblem probe = make_problem(kShapes[0], d, dtype, causal);
        const AttentionConfig def = cpu.default_config(probe).value();
        if (d == 64 || d == 128) {
          for (const AttentionConfig& c : cpu.legal_configs(probe))
            variants.push_back({d, dtype, causal, c, c == def});
          // Configs check_config accepts that are no tuning candidate (cpu_forward_candidate):
          // a single lane vector of queries, and S^T blocks over the L1d.
          for (const AttentionConfig c : {AttentionConfig{16, 256, 1, 1}, {128, 128, 1, 1}})
            if (d == 64 && cpu.check_config(c, probe).ok())
              variants.push_back({d, dtype, causal, c, false});
        } else {
          variants.push_back({d, dtype, causal, def, false});
        }
      }
    }
  }
  // Compile everything first, on all cores.
  using Built = std::optional<Result<std::shared_ptr<Kernel>>>;
  std::vector<Built> kernels = ft::parallel_map<Built>(variants.size(), [&](size_t i) {
    const Variant& v = variants[i];
    return Built(build_kernel(cpu, nullptr, make_problem(kShapes[0], v.head_dim, v.dtype, v.causal),
                              v.config));
  });
  int checked = 0;
  for (size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    const std::string label = "d" + std::to_string(v.head_dim) + " " + to_string(v.dtype) +
                              (v.causal ? " causal " : " ") + v.config.to_string();
    const Result<std::shared_ptr<Kernel>>& kernel = *kernels[i];
    ASSERT_TRUE(kernel.ok()) << label << ": " << kernel.error().describe();
    for (const Shape& shape : kShapes) {
      EXPECT_TRUE(
          run_and_check(**kernel, make_problem(shape, v.head_dim, v.dtype, v.causal), 1000 + i))
          << label << " " << shape.name;
      ++checked;
    }
    if (v.long_shape) {
      EXPECT_TRUE(
          run_and_check(**kernel, make_problem(kLongShape, v.head_dim, v.dtype, v.causal), 7))
          << label << " " << kLongShape.name;
    }
  }
  std::printf("%zu kernels, %d shape runs checked on %s\n", variants.size(), checked,
              cpu.cpu().to_string().c_str());
}

TEST(CpuAttention, ObjectComesBackFromTheBinaryCache) {
  const fs::path dir =
      fs::temp_directory_path() / ("flashjit_cpu_cache_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const BinaryCache cache(dir);
  const AttentionProblem p = make_problem(kShapes[1], 64, DType::BF16, true);
  const AttentionConfig c = backend().default_config(p).value();
  BuildPath path = BuildPath::FromDiskCache;
  ASSERT_TRUE(build_kernel(backend(), &cache, p, c, &path).ok());
  EXPECT_EQ(path, BuildPath::Compiled);
  Result<std::shared_ptr<Kernel>> again = build_kernel(backend(), &cache, p, c, &path);
  ASSERT_TRUE(again.ok()) << again.error().describe();
  EXPECT_EQ(path, BuildPath::FromDiskCache);
  EXPECT_TRUE(run_and_check(**again, p, 3));
  fs::remove_all(dir);
}

TEST(CpuAttention, LaunchRejectsAMismatchedSignature) {
  const AttentionProblem p = make_problem(kShapes[1], 64, DType::BF16, false);
  auto kernel = build_kernel(backend(), nullptr, p, backend().default_config(p).value());
  ASSERT_TRUE(kernel.ok());
  AttentionProblem other = p;
  other.causal = true;
  std::vector<uint16_t> buffer(static_cast<size_t>(p.q_span()));
  Status status = (*kernel)->launch(
      other, {buffer.data(), buffer.data(), buffer.data(), buffer.data(), nullptr});
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("does not match"), std::string::npos);
}

TEST(CpuCompile, ErrorsCarryClangDiagnostics) {
  Result<cpu::ClangOutput> out =
      cpu::compile_cpp("int f() { return undefined_name + 1; }\n", "broken.cpp");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().code, ErrorCode::CompileFailed);
  EXPECT_NE(out.error().message.find("broken.cpp:1:18: error"), std::string::npos)
      << out.error().message;
  EXPECT_NE(out.error().message.find("undefined_name"), std::string::npos);

  KernelSource source =
      backend().render(make_problem(kShapes[0], 64, DType::F16, false), {32, 64, 1, 1}).value();
  source.text += "\nstatic_assert(sizeof(int) == 3, \"flashjit broken on purpose\");\n";
  Result<Binary> binary = backend().compile(source);
  ASSERT_FALSE(binary.ok());
  EXPECT_NE(binary.error().message.find("flashjit broken on purpose"), std::string::npos);
  EXPECT_NE(binary.error().message.find(source.label), std::string::npos);
}

TEST(CpuCompile, VectorizedForTheHost) {
  const KernelSource source =
      backend().render(make_problem(kShapes[0], 128, DType::BF16, false), {64, 64, 1, 1}).value();
  Result<cpu::ClangOutput> assembly =
      cpu::compile_cpp(source.text, "attention_fwd_cpu.cpp", cpu::EmitKind::Assembly);
  ASSERT_TRUE(assembly.ok()) << assembly.error().describe();
  const std::string text(assembly->bytes.begin(), assembly->bytes.end());
  const CpuSpec& spec = backend().cpu();
  if (spec.avx512f) {
    EXPECT_NE(text.find("zmm"), std::string::npos);
  }
  if (spec.avx2) {
    EXPECT_NE(text.find("ymm"), std::string::npos);
  }
  if (spec.fma) {
    EXPECT_NE(text.find("vfmadd"), std::string::npos);
  }
  // bf16 storage on a host with AVX512_BF16: both products are bf16 dot products.
  if (spec.avx512bf16) {
    EXPECT_NE(text.find("vdpbf16ps"), std::string::npos);
  }
}

// Tune a tiny problem into a temporary DB, then a new process (fork) serves it from attention().
void tuned_config_served_to_a_new_process(DType dtype) {
  const fs::path dir = fs::temp_directory_path() /
                       ("flashjit_cpu_e2e_" + std::to_string(getpid()) + "_" + to_string(dtype));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path db = dir / "tuning.db";
  const AttentionProblem problem = AttentionProblem::make(1, 2, 2, 128, 128, 64, dtype, true);
  AttentionConfig chosen;
  {
    auto store = TuningStore::open(db);
    ASSERT_TRUE(store.ok()) << store.error().describe();
    const BinaryCache cache(dir / "cache");
    TuneOptions options;
    options.warmup_ms = 2;
    options.min_time_ms = 5;
    options.min_samples = 3;
    options.retime_top = 2;
    Tuner tuner(backend(), &cache, store->get(), options);
    Result<TuneReport> report = tuner.tune(problem);
    ASSERT_TRUE(report.ok()) << report.error().describe();
    ASSERT_TRUE(report->choice.has_value()) << report->note;
    for (const TuneResult& r : report->results)
      EXPECT_EQ(r.status, TuneStatus::Timed) << r.config.to_string() << ": " << r.message;
    chosen = report->choice->config;
  }
  std::fflush(nullptr);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fds[0]);
    RuntimeOptions options;
    options.backend = "cpu";
    options.user_db = db;
    options.cache_dir = dir / "cache";
    auto runtime = Runtime::create(options);
    std::string answer = "error";
    if (runtime.ok()) {
      auto kernel = (*runtime)->attention(problem);
      auto selected = (*runtime)->select_config(problem);
      if (kernel.ok() && selected.ok() && selected->second == ChoiceSource::Exact) {
        answer = (*kernel)->config().to_string();
        if (!run_and_check(**kernel, problem, 11)) answer = "wrong result";
      } else if (!kernel.ok()) {
        answer = kernel.error().describe();
      }
    } else {
      answer = runtime.error().describe();
    }
    (void)!write(pipe_fds[1], answer.data(), answer.size());
    close(pipe_fds[1]);
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string answer;
  char buffer[256];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;) answer.append(buffer, n);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_EQ(answer, chosen.to_string());
  fs::remove_all(dir);
}

TEST(CpuEndToEnd, TunedConfigServedToANewProcess) {
  tuned_config_served_to_a_new_process(DType::BF16);
}

TEST(CpuEndToEnd, TunedFp32ConfigServedToANewProcess) {
  tuned_config_served_to_a_new_process(DType::F32);
}

#else

TEST(CpuBackend, NotBuilt) {
  RuntimeOptions options;
  options.backend = "cpu";
  Result<std::unique_ptr<Runtime>> runtime = Runtime::create(options);
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.error().code, ErrorCode::Unsupported);
  GTEST_SKIP() << "built without the CPU backend (LLVM/Clang 14 not found)";
}

#endif

}  // namespace
}  // namespace flashjit
