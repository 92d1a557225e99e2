// The CPU forward at every x86-64 ISA level its templates have a path for
// (runtime/cpu/clang_jit.hpp CpuIsa: SSE, AVX2, AVX-512, AVX-512 + BF16), whatever the host: each
// level compiled by Clang for fp16, bf16 and fp32 at d 64 and 128, its assembly checked for the
// level's instructions and for register tiles that fit the register file (no vector register
// spilled in a tile); the levels the host can execute also run against the fp64 reference over the
// emulation shapes (1 to 130 rows, seqlen_q != seqlen_k both ways, GQA, MQA, BHSD, padded strides),
// causal and not. The bf16 dot-product path (AVX512_BF16) runs on any host through its emulation.
// Skips in a build without the CPU backend.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generator/render.hpp"
#include "support/attention_cases.hpp"
#include "support/parallel.hpp"
#include "support/reference.hpp"

#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/clang_jit.hpp"
#include "runtime/cpu/cpu_backend.hpp"
#endif

namespace flashjit {
namespace {

namespace ft = flashjit::testing;

#if FLASHJIT_HAVE_CPU_BACKEND

using cpu::CpuIsa;

constexpr CpuIsa kIsas[] = {CpuIsa::Sse, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16};
constexpr DType kDtypes[] = {DType::F16, DType::BF16, DType::F32};
constexpr int kHeadDims[] = {64, 128};
const AttentionConfig kConfig{64, 64, 1, 1};  // the default on every host of 32-48 KiB L1d

const cpu::CpuBackend& backend() {
  static const std::unique_ptr<cpu::CpuBackend> instance = cpu::CpuBackend::create().value();
  return *instance;
}

struct Variant {
  CpuIsa isa;
  DType dtype;
  int head_dim;
  std::string label() const {
    return std::string(cpu::to_string(isa)) + " " + to_string(dtype) + " d" +
           std::to_string(head_dim);
  }
};

std::vector<Variant> variants() {
  std::vector<Variant> out;
  for (CpuIsa isa : kIsas)
    for (DType dtype : kDtypes)
      for (int d : kHeadDims) out.push_back({isa, dtype, d});
  return out;
}

AttentionProblem probe(int head_dim, DType dtype, bool causal) {
  return ft::make_problem(ft::emulation_shapes()[1], head_dim, dtype, causal);
}

// The assembly of each function whose label contains `name` (AT&T syntax, from its label to
// LLVM's .Lfunc_end label after it).
std::vector<std::string> function_bodies(const std::string& assembly, const std::string& name) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = assembly.find(name, at)) != std::string::npos) {
    const size_t line_start = assembly.rfind('\n', at) + 1;
    const size_t line_end = assembly.find('\n', at);
    const bool is_label = assembly.compare(line_start, 2, "_Z") == 0 &&
                          line_end != std::string::npos && assembly[line_end - 1] == ':';
    if (!is_label) {
      at = line_end;
      continue;
    }
    const size_t end = assembly.find(".Lfunc_end", line_end);
    out.push_back(assembly.substr(line_start, end - line_start));
    at = end;
  }
  return out;
}

// Lines of `body` that move a vector register to or from the stack (a spill or its reload).
std::vector<std::string> spills(const std::string& body) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < body.size()) {
    size_t end = body.find('\n', start);
    if (end == std::string::npos) end = body.size();
    const std::string line = body.substr(start, end - start);
    if (line.find("(%rsp)") != std::string::npos &&
        (line.find("%xmm") != std::string::npos || line.find("%ymm") != std::string::npos ||
         line.find("%zmm") != std::string::npos))
      out.push_back(line);
    start = end + 1;
  }
  return out;
}

// Every level compiles for every dtype and head dim; the tiles use the level's registers and
// instructions and fit its register file.
TEST(CpuIsa, EveryLevelCompilesWithItsInstructionsAndNoSpills) {
  const std::vector<Variant> all = variants();
  using Compiled = std::optional<Result<cpu::ClangOutput>>;
  std::vector<Compiled> assembly = ft::parallel_map<Compiled>(all.size(), [&](size_t i) {
    Result<KernelSource> source =
        render_cpu_attention(probe(all[i].head_dim, all[i].dtype, false), kConfig);
    if (!source.ok()) return Compiled(source.error());
    const cpu::HostTarget target = cpu::isa_target(all[i].isa);
    return Compiled(
        cpu::compile_cpp(source->text, "attention_fwd_cpu.cpp", cpu::EmitKind::Assembly, &target));
  });
  for (size_t i = 0; i < all.size(); ++i) {
    const Variant& v = all[i];
    ASSERT_TRUE(assembly[i]->ok()) << v.label() << ": " << (*assembly[i]).error().describe();
    const std::string text((*assembly[i])->bytes.begin(), (*assembly[i])->bytes.end());
    const bool avx512 = v.isa == CpuIsa::Avx512 || v.isa == CpuIsa::Avx512Bf16;
    EXPECT_EQ(text.find("%zmm") != std::string::npos, avx512) << v.label();
    EXPECT_EQ(text.find("%ymm") != std::string::npos, v.isa != CpuIsa::Sse) << v.label();
    EXPECT_EQ(text.find("vfmadd") != std::string::npos, v.isa != CpuIsa::Sse) << v.label();
    if (v.dtype == DType::F16 && v.isa != CpuIsa::Sse) {
      EXPECT_NE(text.find("vcvtph2ps"), std::string::npos) << v.label() << ": F16C widening";
    }
    const bool dot = v.isa == CpuIsa::Avx512Bf16 && v.dtype == DType::BF16;
    EXPECT_EQ(text.find("vdpbf16ps") != std::string::npos, dot) << v.label();
    // The products' tiles (the dot-product ones on the BF16 level) and nothing spilled in them.
    const std::vector<std::string> tiles = function_bodies(text, dot ? "_tile_dot" : "_tile");
    EXPECT_GE(tiles.size(), 2u) << v.label() << ": expected the S and O tiles";
    for (const std::string& tile : tiles) {
      const std::vector<std::string> spilled = spills(tile);
      EXPECT_TRUE(spilled.empty())
          << v.label() << ": " << spilled.size() << " vector spills or reloads in "
          << tile.substr(0, tile.find('\n'))
          << ", first: " << (spilled.empty() ? "" : spilled.front());
    }
  }
}

// A forward kernel of `problem`, compiled for `isa`, `prefix` put before its source.
Result<std::shared_ptr<Kernel>> build_for(CpuIsa isa, const AttentionProblem& problem,
                                          const std::string& prefix = "") {
  Result<KernelSource> source = backend().render(problem, kConfig);
  if (!source.ok()) return source.error();
  source->text = prefix + source->text;
  const cpu::HostTarget target = cpu::isa_target(isa);
  Result<cpu::ClangOutput> object =
      cpu::compile_cpp(source->text, "attention_fwd_cpu.cpp", cpu::EmitKind::Object, &target);
  if (!object.ok()) return object.error();
  Binary binary;
  binary.bytes = std::move(object->bytes);
  return backend().load(binary, *source, ProblemSignature::of(problem), kConfig);
}

// Runs `kernel` over `shapes` (the emulation shapes unless given) against the fp64 reference
// (outputs poisoned first).
void check_shapes(const Kernel& kernel, int head_dim, DType dtype, bool causal,
                  const std::string& label, uint64_t seed,
                  const std::vector<ft::Shape>& shapes = ft::emulation_shapes()) {
  for (const ft::Shape& shape : shapes) {
    const AttentionProblem problem = ft::make_problem(shape, head_dim, dtype, causal);
    const ft::HostInputs inputs = ft::random_inputs(problem, seed++);
    std::vector<uint16_t> o = ft::poisoned_storage(problem.o_span(), dtype);
    std::vector<float> lse(static_cast<size_t>(problem.lse_elements()), -12345.0f);
    const Status status = kernel.launch(
        problem, {inputs.q.data(), inputs.k.data(), inputs.v.data(), o.data(), lse.data()});
    ASSERT_TRUE(status.ok()) << label << " " << shape.to_string() << ": "
                             << status.error().describe();
    const double max_rel = dtype == DType::F32 ? 2e-5 : 1e-2;
    const double max_lse = dtype == DType::F32 ? 2e-5 : 1e-3;
    EXPECT_TRUE(ft::matches_reference(
        ft::compare(problem, o, lse, ft::reference_attention(problem, inputs)), max_rel, max_lse))
        << label << " " << shape.to_string();
  }
}

// Every level the host can execute, for every dtype and head dim, causal and not.
TEST(CpuIsa, LevelsTheHostRunsMatchTheReference) {
  std::vector<std::pair<Variant, bool>> items;  // (variant, causal)
  for (const Variant& v : variants())
    if (cpu::host_runs(v.isa))
      for (bool causal : {false, true}) items.push_back({v, causal});
  ASSERT_FALSE(items.empty()) << "the host runs no level, not even SSE";
  using Built = std::optional<Result<std::shared_ptr<Kernel>>>;
  std::vector<Built> kernels = ft::parallel_map<Built>(items.size(), [&](size_t i) {
    const auto& [v, causal] = items[i];
    return Built(build_for(v.isa, probe(v.head_dim, v.dtype, causal)));
  });
  std::string ran;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& [v, causal] = items[i];
    const std::string label = v.label() + (causal ? " causal" : "");
    ASSERT_TRUE(kernels[i]->ok()) << label << ": " << (*kernels[i]).error().describe();
    check_shapes(***kernels[i], v.head_dim, v.dtype, causal, label, 100 + 20 * i);
    if (ran.find(cpu::to_string(v.isa)) == std::string::npos)
      ran += std::string(ran.empty() ? "" : ", ") + cpu::to_string(v.isa);
  }
  std::printf("ran the levels %s (%zu kernels) on %s\n", ran.c_str(), items.size(),
              backend().cpu().to_string().c_str());
}

// fp32 K and V rows 4 KiB apart (BSHD with heads_kv x head_dim = 1024): read in place with
// AVX-512's tiles, packed with AVX2's (attention_fwd.hpp, in_place); an even and an odd last key
// block, GQA, causal and not, on every level the host runs.
TEST(CpuIsa, Fp32RowsFourKibApartMatchTheReference) {
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (!cpu::host_runs(isa)) continue;
    for (int d : kHeadDims) {
      const int64_t heads_kv = 1024 / d;
      const std::vector<ft::Shape> shapes = {{1, heads_kv, heads_kv, 70, 130},
                                             {1, 2 * heads_kv, heads_kv, 33, 129}};
      for (bool causal : {false, true}) {
        const std::string label = std::string(cpu::to_string(isa)) + " fp32 d" + std::to_string(d) +
                                  " rows 4 KiB apart" + (causal ? " causal" : "");
        const AttentionProblem problem = ft::make_problem(shapes[0], d, DType::F32, causal);
        const Result<std::shared_ptr<Kernel>> kernel = build_for(isa, problem);
        ASSERT_TRUE(kernel.ok()) << label << ": " << kernel.error().describe();
        check_shapes(**kernel, d, DType::F32, causal, label, 700 + d + causal, shapes);
      }
    }
  }
}

// The bf16 dot-product path (vdpbf16ps, P rounded to bf16) on any host: the source with
// FLASHJIT_CPU_EMULATE_DOT_BF16 defined (common.hpp emulates the two AVX512_BF16 instructions),
// compiled for the host's level, d 64 and 128, causal and not.
TEST(CpuIsa, Bf16DotProductPathMatchesTheReference) {
  std::vector<std::pair<int, bool>> items;
  for (int d : kHeadDims)
    for (bool causal : {false, true}) items.push_back({d, causal});
  const CpuIsa host = cpu::host_runs(CpuIsa::Avx2) ? CpuIsa::Avx2 : CpuIsa::Sse;
  using Built = std::optional<Result<std::shared_ptr<Kernel>>>;
  std::vector<Built> kernels = ft::parallel_map<Built>(items.size(), [&](size_t i) {
    return Built(build_for(host, probe(items[i].first, DType::BF16, items[i].second),
                           "#define FLASHJIT_CPU_EMULATE_DOT_BF16 1\n"));
  });
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string label =
        "bf16 dot products d" + std::to_string(items[i].first) + (items[i].second ? " causal" : "");
    ASSERT_TRUE(kernels[i]->ok()) << label << ": " << (*kernels[i]).error().describe();
    check_shapes(***kernels[i], items[i].first, DType::BF16, items[i].second, label, 500 + 20 * i);
  }
}

// FLASHJIT_CPU_ISA: the names of the levels, a bad value named with what is allowed (and refused
// by a fresh process's backend: the variable is read once per process), the features a cap
// leaves out.
TEST(CpuIsaCap, ParsesTheLevelsAndNamesABadValue) {
  for (CpuIsa isa : kIsas) {
    const Result<std::optional<CpuIsa>> cap = cpu::parse_isa_cap(cpu::to_string(isa));
    ASSERT_TRUE(cap.ok()) << cpu::to_string(isa);
    EXPECT_EQ(*cap, std::optional<CpuIsa>(isa));
  }
  EXPECT_EQ(*cpu::parse_isa_cap(""), std::nullopt) << "empty: no cap";
  const Result<std::optional<CpuIsa>> bad = cpu::parse_isa_cap("AVX2");
  ASSERT_FALSE(bad.ok()) << "the names are lower case";
  EXPECT_EQ(bad.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(bad.error().message.find("FLASHJIT_CPU_ISA=AVX2"), std::string::npos);
  EXPECT_NE(bad.error().message.find("avx512bf16"), std::string::npos) << "names what is allowed";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process reads the variable anew
  setenv("FLASHJIT_CPU_ISA", "AVX2", 1);
  EXPECT_EXIT(
      {
        const Result<std::unique_ptr<cpu::CpuBackend>> refused = cpu::CpuBackend::create();
        std::exit(!refused.ok() && refused.error().code == ErrorCode::InvalidArgument ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "")
      << "a backend under a bad cap";
  unsetenv("FLASHJIT_CPU_ISA");
  EXPECT_EQ(*cpu::parse_isa_cap(nullptr), std::nullopt);

  CpuSpec all = backend().cpu();
  all.avx2 = all.fma = all.f16c = all.avx512f = all.avx512bf16 = true;
  EXPECT_EQ(cpu::capped(all, CpuIsa::Avx512Bf16).isa(), all.isa());
  EXPECT_EQ(cpu::capped(all, CpuIsa::Avx512).isa(), "avx512f avx2 fma f16c");
  EXPECT_EQ(cpu::capped(all, CpuIsa::Avx2).isa(), "avx2 fma f16c");
  EXPECT_EQ(cpu::capped(all, CpuIsa::Sse).isa(), "baseline");
}

// A process under a cap plans, compiles and runs for the cap's level: SSE (every x86-64 host
// runs it) in a fresh process (the host's target is read once per process): the plan's ISA says
// "baseline", the kernel's assembly has no ymm or zmm register, and it matches the reference.
// Exit codes of the child: 0 all good, 2-6 the first check that failed.
int capped_process_checks() {
  const Result<std::unique_ptr<cpu::CpuBackend>> capped = cpu::CpuBackend::create();
  if (!capped.ok()) return 2;
  if ((*capped)->cpu().isa() != "baseline" || cpu::host_target().cpu != "x86-64") return 3;
  const AttentionProblem problem = probe(64, DType::F32, true);
  Result<KernelSource> source = (*capped)->render(problem, kConfig);
  if (!source.ok()) return 4;
  const Result<cpu::ClangOutput> assembly =
      cpu::compile_cpp(source->text, "attention_fwd_cpu.cpp", cpu::EmitKind::Assembly);
  if (!assembly.ok()) return 4;
  const std::string text(assembly->bytes.begin(), assembly->bytes.end());
  if (text.find("%ymm") != std::string::npos || text.find("%zmm") != std::string::npos) return 5;
  const Result<Binary> binary = (*capped)->compile(*source);
  if (!binary.ok()) return 6;
  const Result<std::shared_ptr<Kernel>> kernel =
      (*capped)->load(*binary, *source, ProblemSignature::of(problem), kConfig);
  if (!kernel.ok()) return 6;
  check_shapes(**kernel, 64, DType::F32, true, "sse cap", 900);
  return ::testing::Test::HasFailure() ? 6 : 0;
}

TEST(CpuIsaCap, ACappedProcessPlansCompilesAndRunsTheCappedLevel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: host_target() read anew
  setenv("FLASHJIT_CPU_ISA", "sse", 1);
  EXPECT_EXIT(std::exit(capped_process_checks()), ::testing::ExitedWithCode(0), "");
  unsetenv("FLASHJIT_CPU_ISA");
}

#else

TEST(CpuIsa, NotBuilt) { GTEST_SKIP() << "built without the CPU backend (FLASHJIT_CPU=OFF)"; }

#endif

}  // namespace
}  // namespace flashjit
