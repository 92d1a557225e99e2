// The CUDA backward with attention variants (templates/cuda/attention_bwd.cuh, the mma family)
// compiles with NVRTC for sm80 and sm90, each variant kind and a combination, in both dQ modes
// (atomic and -det), at the default tile and the register-heaviest legal one, spilling no more
// than the plain backward of the same tile plus a bound (the chain factor of a variant that
// modifies the scores is one more fp32 per score); the wgmma family refuses variants in the
// backward (Unsupported) so that the legal configs and the default are mma ones; a score_mod_grad
// that does not compile is quoted. No GPU needed (NVRTC only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "generator/backward_config.hpp"
#include "generator/backward_config_sm90.hpp"
#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/render.hpp"
#include "generator/variant.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "support/parallel.hpp"
#include "support/variant_cases.hpp"

namespace flashjit {
namespace {

// The forward compile tests' variants, each score_mod with its derivative (a backward needs it).
std::vector<testing::NamedVariant> variants() { return testing::backward_compile_variants(); }

struct Job {
  std::string label;
  AttentionProblem problem;
  AttentionConfig config;
  int arch;
};

struct Outcome {
  std::string error;
  cuda::PtxasReport dkdv, dq;  // dq: the -det mode's kernel (else not reported)
  bool wgmma_serialized = false;
};

Outcome compile(const Job& job) {
  Outcome outcome;
  Result<KernelSource> source = render_cuda_attention(job.problem, job.config);
  if (!source.ok()) {
    outcome.error = source.error().describe();
    return outcome;
  }
  Result<Binary> binary = cuda::nvrtc_compile(source.value(), job.arch);
  if (!binary.ok()) {
    outcome.error =
        explain_variant_compile_error(job.problem, source->text, binary.error()).describe();
    return outcome;
  }
  outcome.dkdv = cuda::parse_ptxas_report(binary->compile_log, kBackwardDkDvEntry);
  outcome.dq = cuda::parse_ptxas_report(binary->compile_log, kBackwardDqEntry);
  outcome.wgmma_serialized =
      binary->compile_log.find("wgmma.mma_async instructions are serialized") != std::string::npos;
  return outcome;
}

// The mma family's default backward tile (the default itself where it is an mma tile, else the
// first legal mma tile: on sm90 the default is a wgmma tile) and its register-heaviest legal tile,
// each in both dQ modes.
std::vector<AttentionConfig> tiles_of(const AttentionProblem& problem, const DeviceSpec& device) {
  std::vector<AttentionConfig> legal = legal_backward_configs(problem, device);
  std::erase_if(legal, [](const AttentionConfig& c) { return c.family != KernelFamily::Mma; });
  std::vector<AttentionConfig> out;
  if (legal.empty()) return out;
  AttentionConfig def = default_backward_config(problem, device).value();
  if (def.family != KernelFamily::Mma) def = legal.front();
  const AttentionConfig heaviest = *std::max_element(
      legal.begin(), legal.end(), [&](const AttentionConfig& a, const AttentionConfig& b) {
        return a.block_m * a.block_n < b.block_m * b.block_n;
      });
  for (AttentionConfig c : {def, heaviest})
    for (DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
      c.dq = dq;
      if (check_backward_config(c, problem, device).ok() &&
          std::find(out.begin(), out.end(), c) == out.end())
        out.push_back(c);
    }
  return out;
}

// FLASHJIT_COMPILE_ALL=1: every variant on both archs (the GPU session's run), else CI's subset
// (sm80: every variant; sm90: the combination).
bool compile_all() {
  const char* all = std::getenv("FLASHJIT_COMPILE_ALL");
  return all != nullptr && std::string(all) == "1";
}

// Spill bytes a variant may add over the plain kernel of the same tile: the scores' derivative
// lives beside S (one more fp32 per score of the warp's block) in the heaviest tiles.
constexpr int kMaxExtraSpillBytes = 256;

TEST(CudaBackwardVariantCompile, EveryVariantCompilesOnTheMmaFamily) {
  const AttentionProblem plain =
      AttentionProblem::make(1, 16, 16, 4096, 4096, 128, DType::BF16, /*causal=*/true)
          .with_pass(Pass::Backward);
  std::vector<Job> jobs;  // the plain baselines first, then the variants
  std::vector<Job> variant_jobs;
  for (int arch : {80, 90}) {
    const DeviceSpec device = known_device("sm" + std::to_string(arch)).value();
    for (const testing::NamedVariant& named : variants()) {
      if (arch == 90 && !compile_all() && std::string(named.name) != "everything") continue;
      AttentionProblem p = plain;
      p.variant = named.variant;
      const std::vector<AttentionConfig> tiles = tiles_of(p, device);
      ASSERT_FALSE(tiles.empty()) << named.name << " sm" << arch;
      for (const AttentionConfig& tile : tiles) {
        EXPECT_EQ(tile.family, KernelFamily::Mma) << tile.to_string();
        variant_jobs.push_back({named.name, p, tile, arch});
        const bool seen = std::any_of(jobs.begin(), jobs.end(), [&](const Job& j) {
          return j.arch == arch && j.config == tile;
        });
        if (!seen) jobs.push_back({"plain", plain, tile, arch});
      }
    }
  }
  const size_t baselines = jobs.size();
  jobs.insert(jobs.end(), variant_jobs.begin(), variant_jobs.end());
  const std::vector<Outcome> outcomes =
      testing::parallel_map<Outcome>(jobs.size(), [&](size_t i) { return compile(jobs[i]); });
  for (size_t i = 0; i < jobs.size(); ++i) {
    const std::string where =
        jobs[i].label + " sm" + std::to_string(jobs[i].arch) + " " + jobs[i].config.to_string();
    ASSERT_EQ(outcomes[i].error, "") << where;
    ASSERT_GT(outcomes[i].dkdv.registers, 0) << where << ": no ptxas report of dK/dV";
    if (jobs[i].config.dq == DqMode::Separate) {
      ASSERT_GT(outcomes[i].dq.registers, 0) << where << ": no ptxas report of dQ";
    }
    if (i < baselines) continue;
    size_t base = 0;
    while (!(jobs[base].arch == jobs[i].arch && jobs[base].config == jobs[i].config)) ++base;
    EXPECT_LE(outcomes[i].dkdv.spill_store_bytes,
              outcomes[base].dkdv.spill_store_bytes + kMaxExtraSpillBytes)
        << where << " dK/dV";
    EXPECT_LE(outcomes[i].dq.spill_store_bytes,
              outcomes[base].dq.spill_store_bytes + kMaxExtraSpillBytes)
        << where << " dQ";
    std::printf(
        "  %-14s sm%d %-16s dK/dV %3d registers, %4d bytes spilled (plain %3d, %4d); dQ %3d, %4d "
        "(plain %3d, %4d)\n",
        jobs[i].label.c_str(), jobs[i].arch, jobs[i].config.to_string().c_str(),
        outcomes[i].dkdv.registers, outcomes[i].dkdv.spill_store_bytes,
        outcomes[base].dkdv.registers, outcomes[base].dkdv.spill_store_bytes,
        outcomes[i].dq.registers, outcomes[i].dq.spill_store_bytes, outcomes[base].dq.registers,
        outcomes[base].dq.spill_store_bytes);
  }
}

// The wgmma backward template's variant code compiles for sm90a at every legal tile of the plain
// problem that the variant's budget keeps, its wgmmas never serialized by ptxas, spilling no more
// than the plain kernel.
TEST(CudaBackwardVariantCompile, WgmmaVariantsCompileWithoutSerialization) {
  const DeviceSpec sm90 = known_device("sm90").value();
  std::vector<Job> jobs;
  for (int d : {64, 128}) {
    const AttentionProblem plain =
        AttentionProblem::make(1, 16, 16, 4096, 4096, d, DType::BF16, /*causal=*/true)
            .with_pass(Pass::Backward);
    std::vector<AttentionConfig> tiles = legal_backward_configs(plain, sm90);
    std::erase_if(tiles, [](const AttentionConfig& c) { return c.family != KernelFamily::Wgmma; });
    ASSERT_FALSE(tiles.empty()) << d;
    for (const AttentionConfig& tile : tiles) {
      jobs.push_back({"plain", plain, tile, 90});
      for (const testing::NamedVariant& named : variants()) {
        const std::string name = named.name;
        if (!compile_all() && name != "everything" && name != "softcap_alibi") continue;
        AttentionProblem p = plain;
        p.variant = named.variant;
        // A tile the variant's own budget leaves out (a user expression's registers) is not
        // offered for it: nothing to hold to the plain kernel's spills.
        const std::vector<AttentionConfig> legal = legal_backward_configs(p, sm90);
        if (std::find(legal.begin(), legal.end(), tile) == legal.end()) continue;
        jobs.push_back({named.name, p, tile, 90});
      }
    }
  }
  const std::vector<Outcome> outcomes =
      testing::parallel_map<Outcome>(jobs.size(), [&](size_t i) { return compile(jobs[i]); });
  size_t base = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const std::string where = jobs[i].label + " d" + std::to_string(jobs[i].problem.head_dim) +
                              " " + jobs[i].config.to_string();
    ASSERT_EQ(outcomes[i].error, "") << where;
    ASSERT_GT(outcomes[i].dkdv.registers, 0) << where << ": no ptxas report of dK/dV";
    EXPECT_FALSE(outcomes[i].wgmma_serialized) << where << ": ptxas serialized the wgmmas";
    if (jobs[i].label == "plain") {
      base = i;
      continue;
    }
    EXPECT_LE(outcomes[i].dkdv.spill_store_bytes, outcomes[base].dkdv.spill_store_bytes) << where;
    EXPECT_LE(outcomes[i].dq.spill_store_bytes, outcomes[base].dq.spill_store_bytes) << where;
    std::printf(
        "  %-14s %-22s dK/dV %3d registers, %3d spilled (plain %3d, %3d); dQ %3d, %3d "
        "(plain %3d, %3d)\n",
        jobs[i].label.c_str(), where.c_str() + jobs[i].label.size() + 1, outcomes[i].dkdv.registers,
        outcomes[i].dkdv.spill_store_bytes, outcomes[base].dkdv.registers,
        outcomes[base].dkdv.spill_store_bytes, outcomes[i].dq.registers,
        outcomes[i].dq.spill_store_bytes, outcomes[base].dq.registers,
        outcomes[base].dq.spill_store_bytes);
  }
}

// Packed variable-length documents (varlen): the *_varlen entries of the mma family (sm80: the
// default and register-heaviest tiles in both dQ modes) and of the wgmma family (sm90a: the plain
// problem's default wgmma tile in both dQ modes, every wgmma tile with FLASHJIT_COMPILE_ALL=1;
// named configs) compile, alone and with a window +
// softcap, spilling no more than the plain backward of the same tile (plus the bound above with
// the softcap's chain factor), with no larger stack frame than the plain kernel (the document's
// copy of the params in registers) and (wgmma) no serialized wgmma.
TEST(CudaBackwardVariantCompile, VarlenCompilesOnTheMmaAndWgmmaFamilies) {
  const AttentionProblem plain =
      AttentionProblem::make(1, 16, 16, 4096, 4096, 128, DType::BF16, /*causal=*/true)
          .with_pass(Pass::Backward);
  const AttentionProblem varlen =
      AttentionProblem::make_varlen(8, 16, 16, 4096, 4096, 20000, 20000, 128, DType::BF16, true)
          .with_pass(Pass::Backward);
  AttentionProblem windowed = varlen;
  windowed.variant.window_left = 1024;
  windowed.variant.softcap = 30.f;
  const DeviceSpec sm80 = known_device("sm80").value(), sm90 = known_device("sm90").value();
  std::vector<AttentionConfig> wgmma_tiles;
  if (compile_all()) {
    wgmma_tiles = legal_backward_configs(plain, sm90);
    std::erase_if(wgmma_tiles,
                  [](const AttentionConfig& c) { return c.family != KernelFamily::Wgmma; });
  } else {
    // (The plain problem's own default is the ws family's fused kernel, which takes no variant
    // or packed documents: the wgmma family's tile is the one these run on.)
    AttentionConfig tile = default_wgmma_backward_config(plain, sm90).value();
    ASSERT_EQ(tile.family, KernelFamily::Wgmma) << tile.to_string();
    for (DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
      tile.dq = dq;
      wgmma_tiles.push_back(tile);
    }
  }
  std::vector<Job> jobs;  // (plain, varlen, windowed) per tile
  const std::vector<AttentionConfig> mma_tiles = tiles_of(varlen, sm80);
  ASSERT_FALSE(mma_tiles.empty());
  for (const auto& [tiles, arch] : {std::pair{mma_tiles, 80}, std::pair{wgmma_tiles, 90}})
    for (const AttentionConfig& tile : tiles) {
      EXPECT_EQ(tile.family, arch == 80 ? KernelFamily::Mma : KernelFamily::Wgmma);
      jobs.push_back({"plain", plain, tile, arch});
      jobs.push_back({"varlen", varlen, tile, arch});
      jobs.push_back({"varlen_window_softcap", windowed, tile, arch});
    }
  const std::vector<Outcome> outcomes =
      testing::parallel_map<Outcome>(jobs.size(), [&](size_t i) { return compile(jobs[i]); });
  for (size_t i = 0; i < jobs.size(); ++i) {
    const std::string where =
        jobs[i].label + " sm" + std::to_string(jobs[i].arch) + " " + jobs[i].config.to_string();
    ASSERT_EQ(outcomes[i].error, "") << where;
    ASSERT_GT(outcomes[i].dkdv.registers, 0) << where << ": no ptxas report of dK/dV";
    EXPECT_FALSE(outcomes[i].wgmma_serialized) << where << ": ptxas serialized the wgmmas";
    const Outcome& base = outcomes[i / 3 * 3];
    const int bound = jobs[i].label == "varlen" ? 0 : kMaxExtraSpillBytes;
    for (const auto& [kernel, report, plain_report] :
         {std::tuple{"dK/dV", outcomes[i].dkdv, base.dkdv},
          std::tuple{"dQ", outcomes[i].dq, base.dq}}) {
      EXPECT_LE(report.spill_store_bytes, plain_report.spill_store_bytes + bound)
          << where << " " << kernel;
      EXPECT_LE(report.stack_frame_bytes, plain_report.stack_frame_bytes + bound)
          << where << " " << kernel;
    }
    std::printf(
        "  %-22s sm%d %-18s dK/dV %3d registers, %3d spilled, %3d stack (plain %3d, %3d, %3d); "
        "dQ %3d, %3d, %3d (plain %3d, %3d, %3d)\n",
        jobs[i].label.c_str(), jobs[i].arch, jobs[i].config.to_string().c_str(),
        outcomes[i].dkdv.registers, outcomes[i].dkdv.spill_store_bytes,
        outcomes[i].dkdv.stack_frame_bytes, base.dkdv.registers, base.dkdv.spill_store_bytes,
        base.dkdv.stack_frame_bytes, outcomes[i].dq.registers, outcomes[i].dq.spill_store_bytes,
        outcomes[i].dq.stack_frame_bytes, base.dq.registers, base.dq.spill_store_bytes,
        base.dq.stack_frame_bytes);
  }
}

// The wgmma backward's variant code passed its GPU test (runtime_cuda_backward_variant_test on an
// H100): a variant problem on sm90 gets every wgmma config the plain problem has, and the plain
// problem's default (a wgmma tile).
TEST(CudaBackwardVariantCompile, WgmmaFamilyIsOfferedForVariants) {
  AttentionProblem p = AttentionProblem::make(1, 16, 16, 4096, 4096, 128, DType::BF16, true)
                           .with_pass(Pass::Backward);
  p.variant.softcap = 30.f;
  const DeviceSpec sm90 = known_device("sm90").value();
  AttentionProblem plain = p;
  plain.variant = Variant();
  const std::vector<AttentionConfig> legal = legal_backward_configs(p, sm90);
  int wgmma = 0;
  for (const AttentionConfig& c : legal_backward_configs(plain, sm90)) {
    if (c.family != KernelFamily::Wgmma) continue;
    ++wgmma;
    EXPECT_NE(std::find(legal.begin(), legal.end(), c), legal.end()) << c.to_string();
  }
  EXPECT_GT(wgmma, 0) << "the plain problem has wgmma backward configs on sm90";
  // The plain problem's default is the ws family's fused kernel; the variant falls back to the
  // wgmma family's tile for the same problem.
  EXPECT_EQ(default_backward_config(plain, sm90).value().family, KernelFamily::Ws);
  EXPECT_EQ(default_backward_config(p, sm90).value(),
            default_wgmma_backward_config(plain, sm90).value());
  EXPECT_EQ(default_backward_config(p, sm90).value().family, KernelFamily::Wgmma);
}

TEST(CudaBackwardVariantCompile, AScoreModGradThatDoesNotCompileIsQuoted) {
  AttentionProblem p =
      AttentionProblem::make(1, 4, 4, 256, 256, 64, DType::F16, false).with_pass(Pass::Backward);
  p.variant.score_mod = "score * 2.0f";
  p.variant.score_mod_grad = "2.0f * undefined_name";
  const AttentionConfig config = default_backward_config(p, known_device("sm80").value()).value();
  const Outcome outcome = compile({"bad", p, config, 80});
  ASSERT_NE(outcome.error, "");
  EXPECT_EQ(outcome.error.find("score_mod_grad = \"2.0f * undefined_name\" does not compile: "),
            outcome.error.find("score_mod_grad"))
      << outcome.error;
  EXPECT_NE(outcome.error.find("undefined_name"), std::string::npos) << outcome.error;
}

}  // namespace
}  // namespace flashjit
