// The CUDA forward with attention variants compiles with NVRTC without spilling more than the
// same plain config does (nothing, at these tiles), for each variant kind and a combination: the
// mma family for sm80 (and the combination for sm90), the wgmma and -ws families for sm90a, at
// the default tile and (user expressions, the built-in ones together) at the register-heaviest
// legal tile, the wgmmas never serialized by ptxas and (-ws) setmaxnreg never ignored; and a user
// expression that does not compile is a CompileFailed error quoting it and NVRTC's first message;
// packed variable-length documents compile on the mma, wgmma and -ws families.
// No GPU needed (NVRTC only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/render.hpp"
#include "generator/variant.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "support/parallel.hpp"
#include "support/variant_cases.hpp"

namespace flashjit {
namespace {

using testing::compile_variants;
using Named = testing::NamedVariant;

struct Job {
  std::string label;
  AttentionProblem problem;
  AttentionConfig config;
  int arch;
};

// ptxas's report of a job, and whether it serialized the wgmmas (its log says so).
struct Outcome {
  cuda::PtxasReport report;
  bool wgmma_serialized = false;
  bool setmaxnreg_warning = false;  // ptxas ignored or warned about setmaxnreg (-ws)
};

Outcome compile(const Job& job, std::string* error) {
  Result<KernelSource> source = render_cuda_attention(job.problem, job.config);
  if (!source.ok()) {
    *error = source.error().describe();
    return {};
  }
  Result<Binary> binary = cuda::nvrtc_compile(source.value(), job.arch);
  if (!binary.ok()) {
    *error = binary.error().describe();
    return {};
  }
  const std::string& log = binary->compile_log;
  return {cuda::parse_ptxas_report(log),
          log.find("wgmma.mma_async instructions are serialized") != std::string::npos,
          log.find("setmaxnreg") != std::string::npos || log.find("C7508") != std::string::npos};
}

// The default tile of `family` (the formula's pick among its legal tiles when the device's
// default is of another family) and its register-heaviest legal tile.
// (The plain problem's configs that check_config accepts for the variant: legal_configs does not
// offer the sm90 families for variants until they have run on a GPU, generator/config.cpp.)
std::vector<AttentionConfig> tiles_of(const AttentionProblem& problem, const DeviceSpec& device,
                                      KernelFamily family) {
  AttentionProblem plain = problem;
  plain.variant = Variant();
  std::vector<AttentionConfig> legal = legal_configs(plain, device);
  std::erase_if(legal, [&](const AttentionConfig& c) {
    return c.family != family || !check_config(c, problem, device).ok();
  });
  if (legal.empty()) return {};
  const AttentionConfig heaviest = *std::max_element(
      legal.begin(), legal.end(), [&](const AttentionConfig& a, const AttentionConfig& b) {
        return estimated_registers(a, problem) < estimated_registers(b, problem);
      });
  AttentionConfig def = default_config(plain, device).value();
  if (def.family != family || !check_config(def, problem, device).ok()) def = legal.front();
  if (def == heaviest) return {def};
  return {def, heaviest};
}

// FLASHJIT_COMPILE_ALL=1: every variant of the list below (the GPU session's run), else CI's
// subset.
bool compile_all() {
  const char* all = std::getenv("FLASHJIT_COMPILE_ALL");
  return all != nullptr && std::string(all) == "1";
}

TEST(CudaVariantCompile, EveryVariantCompilesWithoutNewSpills) {
  const AttentionProblem plain =
      AttentionProblem::make(1, 16, 16, 4096, 4096, 128, DType::BF16, /*causal=*/true);
  std::vector<Job> jobs;  // the plain baselines (one per arch and tile) first, then the variants
  std::vector<Job> variant_jobs;
  struct Target {
    int arch;
    KernelFamily family;
  };
  for (const Target target : {Target{80, KernelFamily::Mma}, Target{90, KernelFamily::Mma},
                              Target{90, KernelFamily::Wgmma}, Target{90, KernelFamily::Ws}}) {
    const int arch = target.arch;
    const bool mma90 = arch == 90 && target.family == KernelFamily::Mma;
    const DeviceSpec device = known_device("sm" + std::to_string(arch)).value();
    // mma on sm80, wgmma and -ws on sm90: every variant at its default tile, the heaviest tile
    // too for the user expressions (mma) or the combinations (wgmma, -ws); mma on sm90 (the same
    // template as on sm80): the combination at its default tile. CI (without
    // FLASHJIT_COMPILE_ALL=1) compiles a third of that: each family's register-heaviest
    // variants (sm80 for the mma template).
    for (const Named& named : compile_variants()) {
      const std::string name = named.name;
      if (mma90 && name != "everything") continue;
      const bool in_ci =
          target.family == KernelFamily::Mma
              ? !mma90 && (name == "everything" || name == "mask_mod")
              : name == "softcap_alibi" ||
                    name == (target.family == KernelFamily::Ws ? "everything" : "score_mod");
      if (!compile_all() && !in_ci) continue;
      AttentionProblem p = plain;
      p.variant = named.variant;
      std::vector<AttentionConfig> tiles = tiles_of(p, device, target.family);
      if (target.family == KernelFamily::Wgmma && !p.variant.mask_mod.empty()) {
        // Refused (ptxas serializes the wgmmas with one): config.cpp.
        EXPECT_TRUE(tiles.empty()) << named.name;
        const Status refused =
            check_config(AttentionConfig::parse("m128n64w8s2-wgmma").value(), p, device);
        ASSERT_FALSE(refused.ok());
        EXPECT_EQ(refused.error().code, ErrorCode::Unsupported);
        continue;
      }
      ASSERT_FALSE(tiles.empty()) << named.name;
      const bool heaviest_too =
          target.family != KernelFamily::Mma
              ? name == "everything" || name == "softcap_alibi" || name == "score_mod"
              : !mma90 && (name == "everything" || name == "mask_mod");
      if (!heaviest_too) tiles.resize(1);
      for (const AttentionConfig& tile : tiles) {
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
  std::vector<std::string> errors(jobs.size());
  const std::vector<Outcome> outcomes = testing::parallel_map<Outcome>(
      jobs.size(), [&](size_t i) { return compile(jobs[i], &errors[i]); });
  std::vector<cuda::PtxasReport> reports;
  for (const Outcome& outcome : outcomes) reports.push_back(outcome.report);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const std::string where =
        jobs[i].label + " sm" + std::to_string(jobs[i].arch) + " " + jobs[i].config.to_string();
    ASSERT_EQ(errors[i], "") << where;
    ASSERT_GE(reports[i].spill_store_bytes, 0) << where << ": no ptxas report";
    EXPECT_FALSE(outcomes[i].wgmma_serialized) << where << ": ptxas serialized the wgmmas";
    EXPECT_FALSE(outcomes[i].setmaxnreg_warning) << where << ": ptxas ignored setmaxnreg";
    if (i < baselines) continue;
    size_t base = 0;
    while (!(jobs[base].arch == jobs[i].arch && jobs[base].config == jobs[i].config)) ++base;
    EXPECT_LE(reports[i].spill_store_bytes, reports[base].spill_store_bytes) << where;
    std::printf("  %-10s sm%d %-14s %3d registers, %3d bytes spilled (plain: %3d, %3d)\n",
                jobs[i].label.c_str(), jobs[i].arch, jobs[i].config.to_string().c_str(),
                reports[i].registers, reports[i].spill_store_bytes, reports[base].registers,
                reports[base].spill_store_bytes);
  }
}

// Packed variable-length documents (varlen): the mma family's attention_forward_varlen (sm80),
// the wgmma family's attention_forward_sm90_varlen and the -ws family's attention_forward_ws with
// its varlen pieces (sm90a; also as -pp-persist: the persistent scheduler's skipping) compile at
// the default and the register-heaviest tile, alone and with a window + softcap, spilling no more
// than the plain kernel of the same tile, with no stack frame for the document's copy of the
// params, no serialized wgmma and (-ws) no setmaxnreg warning. On sm90 every family is offered
// and the d128 default is the -ws one.
TEST(CudaVariantCompile, VarlenCompilesWithoutNewSpillsOnEveryFamily) {
  const AttentionProblem plain =
      AttentionProblem::make(1, 16, 16, 4096, 4096, 128, DType::BF16, /*causal=*/true);
  AttentionProblem varlen = AttentionProblem::make_varlen(8, 16, 16, 4096, 4096, 20000, 20000, 128,
                                                          DType::BF16, /*causal=*/true);
  AttentionProblem windowed = varlen;
  windowed.variant.window_left = 1024;
  windowed.variant.softcap = 30.f;
  const DeviceSpec sm80 = known_device("sm80").value();
  const DeviceSpec sm90 = known_device("sm90").value();
  std::vector<Job> jobs;
  for (const auto& [device, family, arch] :
       {std::tuple{sm80, KernelFamily::Mma, 80}, std::tuple{sm90, KernelFamily::Wgmma, 90},
        std::tuple{sm90, KernelFamily::Ws, 90}}) {
    std::vector<AttentionConfig> tiles = tiles_of(varlen, device, family);
    ASSERT_FALSE(tiles.empty()) << "sm" << arch;
    if (family == KernelFamily::Ws) {
      AttentionConfig persistent = tiles.front();
      persistent.pingpong = persistent.persistent = true;
      ASSERT_TRUE(check_config(persistent, varlen, device).ok()) << persistent.to_string();
      tiles.push_back(persistent);
    }
    for (const AttentionConfig& tile : tiles) {
      jobs.push_back({"plain", plain, tile, arch});
      jobs.push_back({"varlen", varlen, tile, arch});
      jobs.push_back({"varlen_window_softcap", windowed, tile, arch});
    }
  }
  std::vector<std::string> errors(jobs.size());
  const std::vector<Outcome> outcomes = testing::parallel_map<Outcome>(
      jobs.size(), [&](size_t i) { return compile(jobs[i], &errors[i]); });
  for (size_t i = 0; i < jobs.size(); ++i) {
    const std::string where =
        jobs[i].label + " sm" + std::to_string(jobs[i].arch) + " " + jobs[i].config.to_string();
    ASSERT_EQ(errors[i], "") << where;
    ASSERT_GE(outcomes[i].report.spill_store_bytes, 0) << where << ": no ptxas report";
    const cuda::PtxasReport& base = outcomes[i / 3 * 3].report;
    EXPECT_LE(outcomes[i].report.spill_store_bytes, base.spill_store_bytes) << where;
    // The document's copy of the parameters lives in registers, not in a stack frame.
    EXPECT_LE(outcomes[i].report.stack_frame_bytes, base.stack_frame_bytes) << where;
    EXPECT_FALSE(outcomes[i].wgmma_serialized) << where << ": ptxas serialized the wgmmas";
    EXPECT_FALSE(outcomes[i].setmaxnreg_warning) << where << ": ptxas ignored setmaxnreg";
    std::printf(
        "  %-22s sm%d %-20s %3d registers, %3d bytes spilled, %3d stack (plain: %3d, %3d, "
        "%3d)\n",
        jobs[i].label.c_str(), jobs[i].arch, jobs[i].config.to_string().c_str(),
        outcomes[i].report.registers, outcomes[i].report.spill_store_bytes,
        outcomes[i].report.stack_frame_bytes, base.registers, base.spill_store_bytes,
        base.stack_frame_bytes);
  }
  for (const Job& job : jobs) {
    if (job.label == "plain") continue;
    Result<KernelSource> source = render_cuda_attention(job.problem, job.config);
    ASSERT_TRUE(source.ok());
    const char* entry = job.config.family == KernelFamily::Ws
                            ? "#define FLASHJIT_VARIANT_VARLEN 1\n"
                        : job.arch == 90 ? "attention_forward_sm90_varlen<Config>(params)"
                                         : "attention_forward_varlen<Config>(params)";
    EXPECT_NE(source->text.find(entry), std::string::npos) << job.config.to_string();
  }

  const std::vector<AttentionConfig> legal = legal_configs(varlen, sm90);
  for (KernelFamily family : {KernelFamily::Mma, KernelFamily::Wgmma, KernelFamily::Ws})
    EXPECT_TRUE(std::any_of(legal.begin(), legal.end(),
                            [&](const AttentionConfig& c) { return c.family == family; }))
        << "family " << static_cast<int>(family);
  EXPECT_EQ(default_config(varlen, sm90).value().family, KernelFamily::Ws);
}

TEST(CudaVariantCompile, AnExpressionThatDoesNotCompileIsQuoted) {
  AttentionProblem p = AttentionProblem::make(1, 4, 4, 256, 256, 64, DType::F16, false);
  p.variant.mask_mod = "q_idx >= kv_idx && undefined_name";
  const AttentionConfig config{64, 64, 4, 2};
  Result<KernelSource> source = render_cuda_attention(p, config);
  ASSERT_TRUE(source.ok()) << source.error().describe();
  Result<Binary> binary = cuda::nvrtc_compile(source.value(), 80);
  ASSERT_FALSE(binary.ok());
  const Error error = explain_variant_compile_error(p, source->text, binary.error());
  EXPECT_EQ(error.code, ErrorCode::CompileFailed);
  EXPECT_EQ(error.message.rfind("mask_mod = \"q_idx >= kv_idx && undefined_name\" does not "
                                "compile: ",
                                0),
            0u)
      << error.message;
  EXPECT_NE(error.message.find("undefined_name"), std::string::npos) << error.message;
}

}  // namespace
}  // namespace flashjit
