// Every legal config of the HIP attention templates compiles with hipRTC for gfx90a (MI200), with
// no scratch memory (no register spills) and at most the registers its wave count allows, every
// kernel of it (the backward's three entry points each). Needs no GPU (hipRTC only, in worker
// processes), so it runs in CI: a template or generator change that breaks any corner of the HIP
// config space fails here, not on an AMD machine later. Attention variants: every kind and a
// combination at the default and heaviest tile (forward; the backward's at its default tiles and
// the combination's heaviest), and a user expression that does not compile.
//
// The forward: one gtest per (head_dim, dtype, causal) group of the standard set. The backward:
// its legal set does not depend on dtype or causal (checked), so each config of d 64, 128, 256 is
// compiled twice, as bf16 causal and as fp16 non-causal: both MFMA types and both masking paths
// (their register counts differ by a few, either way, so both are checked). Each group prints a
// table of its configs with the compiler's register counts. Skips where hipRTC cannot be loaded;
// only in builds with the HIP backend.
#include <gtest/gtest.h>

#if FLASHJIT_HAVE_HIP_BACKEND

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "generator/decode_config.hpp"
#include "generator/device.hpp"
#include "generator/hip_config.hpp"
#include "generator/render.hpp"
#include "generator/variant.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"
#include "support/parallel.hpp"
#include "support/variant_cases.hpp"

namespace flashjit {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::mutex total_mutex;
double total_compile_seconds = 0;
double total_wall_seconds = 0;
int total_compiles = 0;

class TotalCompileTime : public ::testing::Environment {
 public:
  void TearDown() override {
    if (total_compiles == 0) return;
    std::printf(
        "[ total    ] %d hipRTC compiles: %.1f s of compile time, %.1f s wall on %u threads\n",
        total_compiles, total_compile_seconds, total_wall_seconds, testing::worker_count());
  }
};
::testing::Environment* const total_environment =
    ::testing::AddGlobalTestEnvironment(new TotalCompileTime);

struct CompileOutcome {
  AttentionConfig config;
  bool ok = false;
  std::string error;
  size_t code_bytes = 0;
  hip::CodeObjectResources resources;         // the first kernel's
  std::vector<std::string> entries;           // the source's entry points, in order
  std::vector<hip::KernelResources> kernels;  // each kernel's
  double seconds = 0;
};

CompileOutcome compile_one(const AttentionProblem& problem, const AttentionConfig& config,
                           const std::string& target) {
  CompileOutcome outcome;
  outcome.config = config;
  const Clock::time_point start = Clock::now();
  Result<KernelSource> source = render_hip_attention(problem, config);
  if (!source.ok()) {
    outcome.error = "render: " + source.error().describe();
    return outcome;
  }
  Result<Binary> binary = hip::hiprtc_compile(source.value(), target);
  outcome.seconds = seconds_since(start);
  if (!binary.ok()) {
    outcome.error = binary.error().describe();
    return outcome;
  }
  outcome.ok = true;
  outcome.code_bytes = binary->bytes.size();
  outcome.resources = hip::parse_code_object_resources(binary->bytes);
  outcome.entries = source->entries;
  outcome.kernels = hip::parse_code_object_kernels(binary->bytes);
  return outcome;
}

std::vector<CompileOutcome> compile_all(const AttentionProblem& problem,
                                        const std::vector<AttentionConfig>& configs,
                                        const std::string& target) {
  const Clock::time_point start = Clock::now();
  std::vector<CompileOutcome> outcomes = testing::parallel_map<CompileOutcome>(
      configs.size(), [&](size_t i) { return compile_one(problem, configs[i], target); });
  const double wall = seconds_since(start);
  double compile_seconds = 0;
  for (const CompileOutcome& outcome : outcomes) compile_seconds += outcome.seconds;
  std::printf("  %zu compiles for %s: %.1f s wall, %.1f s compile time (%.2f s each)\n",
              outcomes.size(), target.c_str(), wall, compile_seconds,
              outcomes.empty() ? 0.0 : compile_seconds / outcomes.size());
  std::lock_guard<std::mutex> lock(total_mutex);
  total_compile_seconds += compile_seconds;
  total_wall_seconds += wall;
  total_compiles += static_cast<int>(outcomes.size());
  return outcomes;
}

// One kernel for wave64, no scratch (spills; at most `allowed_spills` VGPRs spilled where given),
// no static LDS (the templates use dynamic LDS only), registers within what `waves` waves leave
// each lane.
void expect_clean_kernel(const hip::CodeObjectResources& r, int waves, const DeviceSpec& device,
                         const std::string& where, int allowed_spills = 0) {
  EXPECT_EQ(r.wavefront_size, 64) << where;
  if (allowed_spills == 0) {
    EXPECT_EQ(r.scratch_bytes, 0) << where << ": scratch memory (spills), " << r.vgprs << " VGPRs, "
                                  << r.vgpr_spills << " spilled";
  }
  EXPECT_LE(r.vgpr_spills, allowed_spills) << where;
  EXPECT_EQ(r.lds_bytes, 0) << where;
  EXPECT_GT(r.vgprs, 0) << where << ": no register count in the code object";
  EXPECT_LE(r.vgprs, hip_wave_register_budget(waves, device)) << where;
}

// Compiled, a non-empty code object, every kernel clean (the forward's one; the backward's
// preprocess, dK/dV and dQ kernels, with their own wave counts).
void expect_clean(const CompileOutcome& o, const AttentionProblem& problem,
                  const DeviceSpec& device, const std::string& group, int allowed_spills = 0) {
  const std::string where = group + " config " + o.config.to_string();
  if (!o.ok) {
    ADD_FAILURE() << where << " failed to compile:\n" << o.error;
    return;
  }
  EXPECT_GT(o.code_bytes, 0u) << where;
  if (!problem.is_backward()) {
    expect_clean_kernel(o.resources, o.config.warps, device, where);
    return;
  }
  const BackwardShapes shapes = hip_backward_shapes(o.config, problem);
  const int waves[] = {shapes.preprocess.threads / kHipWaveSize, shapes.dkdv.threads / kHipWaveSize,
                       shapes.dq.threads / kHipWaveSize};
  ASSERT_EQ(o.kernels.size(), o.entries.size()) << where;
  for (size_t e = 0; e < o.entries.size() && e < 3; ++e) {
    EXPECT_EQ(o.kernels[e].name, o.entries[e]) << where;
    expect_clean_kernel(o.kernels[e].resources, waves[e], device, where + " " + o.entries[e],
                        allowed_spills);
  }
}

// The backward's table: per config the dK/dV and dQ kernels' LDS, estimated and compiled
// registers (VGPRs + AGPRs, of them AGPRs), and the spills of all three kernels.
void print_backward_table(const std::vector<CompileOutcome>& outcomes,
                          const AttentionProblem& problem) {
  std::printf("  %-16s %6s %6s %5s %9s %5s %9s %6s %7s %6s\n", "config", "LDS", "LDS dQ", "est",
              "dK/dV v/a", "est", "dQ v/a", "spill", "code", "sec");
  for (const CompileOutcome& o : outcomes) {
    if (!o.ok || o.kernels.size() != 3) {
      std::printf("  %-16s FAILED\n", o.config.to_string().c_str());
      continue;
    }
    int spills = 0;
    for (const hip::KernelResources& k : o.kernels)
      spills += std::max(0, k.resources.vgpr_spills) + std::max(0, k.resources.sgpr_spills);
    const hip::CodeObjectResources& dkdv = o.kernels[1].resources;
    const hip::CodeObjectResources& dq = o.kernels[2].resources;
    std::printf("  %-16s %6d %6d %5d %5d/%-3d %5d %5d/%-3d %6d %7zu %6.2f\n",
                o.config.to_string().c_str(), hip_bwd_dkdv_lds_bytes(o.config, problem),
                hip_bwd_dq_lds_bytes(o.config, problem),
                hip_bwd_dkdv_estimated_registers(o.config, problem), dkdv.vgprs, dkdv.agprs,
                hip_bwd_dq_estimated_registers(o.config, problem), dq.vgprs, dq.agprs, spills,
                o.code_bytes, o.seconds);
  }
  std::fflush(stdout);
}

void print_table(const std::vector<CompileOutcome>& outcomes, const AttentionProblem& problem,
                 const DeviceSpec& device) {
  std::printf("  %-14s %7s %5s %5s %5s %5s %6s %7s %6s\n", "config", "LDS", "est", "vgpr", "agpr",
              "sgpr", "spill", "code", "sec");
  for (const CompileOutcome& o : outcomes) {
    if (!o.ok) {
      std::printf("  %-14s FAILED\n", o.config.to_string().c_str());
      continue;
    }
    const bool decode = o.config.family == KernelFamily::Decode;
    std::printf("  %-14s %7d %5d %5d %5d %5d %6d %7zu %6.2f\n", o.config.to_string().c_str(),
                decode ? hip_decode_lds_bytes(o.config, problem) : hip_lds_bytes(o.config, problem),
                decode ? hip_decode_estimated_registers(o.config, problem)
                       : hip_estimated_registers(o.config, problem),
                o.resources.vgprs, o.resources.agprs, o.resources.sgprs, o.resources.vgpr_spills,
                o.code_bytes, o.seconds);
  }
  (void)device;
  std::fflush(stdout);
}

struct CompileGroup {
  int head_dim;
  DType dtype;
  bool causal;

  std::string name() const {
    std::string text = "gfx90a_d";
    text += std::to_string(head_dim);
    text += "_";
    text += to_string(dtype);
    text += causal ? "_causal" : "_noncausal";
    return text;
  }
};

void PrintTo(const CompileGroup& group, std::ostream* out) { *out << group.name(); }

bool have_hiprtc() { return hip::hiprtc_version().rfind("hiprtc unavailable", 0) != 0; }

class HipCompileAllConfigs : public ::testing::TestWithParam<CompileGroup> {};

TEST_P(HipCompileAllConfigs, EveryLegalConfigCompilesWithoutSpills) {
  if (!have_hiprtc()) GTEST_SKIP() << hip::hiprtc_version();
  const CompileGroup& group = GetParam();
  const DeviceSpec device = known_device("gfx90a").value();
  const auto problem =
      AttentionProblem::make(2, 16, 16, 4096, 4096, group.head_dim, group.dtype, group.causal);
  const std::vector<AttentionConfig> configs = legal_hip_configs(problem, device);
  ASSERT_FALSE(configs.empty()) << "no legal config for " << group.name();
  const std::vector<CompileOutcome> outcomes = compile_all(problem, configs, "gfx90a");
  print_table(outcomes, problem, device);
  for (const CompileOutcome& outcome : outcomes)
    expect_clean(outcome, problem, device, group.name());
}

std::vector<CompileGroup> all_groups() {
  std::vector<CompileGroup> groups;
  for (int head_dim : {64, 128, 256})
    for (DType dtype : {DType::F16, DType::BF16})
      for (bool causal : {false, true}) groups.push_back({head_dim, dtype, causal});
  return groups;
}

INSTANTIATE_TEST_SUITE_P(AllGroups, HipCompileAllConfigs, ::testing::ValuesIn(all_groups()),
                         [](const ::testing::TestParamInfo<CompileGroup>& info) {
                           return info.param.name();
                         });

// Head dims that are not a power of two: padded to padded_head_dim() (96 -> 128, 192 -> 192).
TEST(HipCompilePaddedHeadDim, DefaultConfigsOfHeadDims96And192Compile) {
  if (!have_hiprtc()) GTEST_SKIP() << hip::hiprtc_version();
  const DeviceSpec device = known_device("gfx90a").value();
  for (int head_dim : {96, 192}) {
    const auto problem = AttentionProblem::make(1, 8, 8, 1000, 1000, head_dim, DType::BF16, true);
    Result<AttentionConfig> config = default_hip_config(problem, device);
    ASSERT_TRUE(config.ok()) << config.error().describe();
    const std::vector<CompileOutcome> outcomes = compile_all(problem, {config.value()}, "gfx90a");
    print_table(outcomes, problem, device);
    expect_clean(outcomes.front(), problem, device,
                 "gfx90a_d" + std::to_string(head_dim) + "_bf16_causal");
  }
}

// ---- decode -----------------------------------------------------------------------------------

// Every legal tile of the decode template (templates/hip/decode.hpp; the split count is a launch
// parameter, so the auto-split config stands for its tile) compiles cleanly: d 64, 128, 256 and
// a padded 72, bf16 and fp16, causal or not, contiguous (per-sequence lengths) or paged (16 and
// 256 keys per page: the paged copies' page addresses cost registers).
struct DecodeCompileGroup {
  int head_dim;
  DType dtype;
  bool causal;
  int page_size;

  std::string name() const {
    std::string text = "gfx90a_decode_d";
    text += std::to_string(head_dim);
    text += "_";
    text += to_string(dtype);
    text += causal ? "_causal" : "_noncausal";
    text += page_size > 0 ? "_paged" + std::to_string(page_size) : std::string("_seqlens");
    return text;
  }
  AttentionProblem problem() const {
    // 8:1 GQA x 4 queries: 32 packed rows, so both block_m 16 and 32 are offered.
    AttentionProblem p = AttentionProblem::make(4, 32, 4, 4, 8192, head_dim, dtype, causal);
    if (page_size > 0) return p.with_paged_kv(page_size, 4 * 8192 / page_size);
    p.kv.seqlens_k = true;
    return p;
  }
};

void PrintTo(const DecodeCompileGroup& group, std::ostream* out) { *out << group.name(); }

class HipCompileAllDecodeConfigs : public ::testing::TestWithParam<DecodeCompileGroup> {};

TEST_P(HipCompileAllDecodeConfigs, EveryLegalTileCompilesWithoutSpills) {
  if (!have_hiprtc()) GTEST_SKIP() << hip::hiprtc_version();
  const DecodeCompileGroup& group = GetParam();
  const DeviceSpec device = known_device("gfx90a").value();
  const AttentionProblem problem = group.problem();
  std::vector<AttentionConfig> tiles;
  for (const AttentionConfig& c : legal_hip_configs(problem, device)) {
    ASSERT_EQ(c.family, KernelFamily::Decode) << c.to_string() << ": " << group.name();
    if (c.splits == 0) tiles.push_back(c);
  }
  ASSERT_FALSE(tiles.empty()) << "no legal decode config for " << group.name();
  const std::vector<CompileOutcome> outcomes = compile_all(problem, tiles, "gfx90a");
  print_table(outcomes, problem, device);
  for (const CompileOutcome& outcome : outcomes)
    expect_clean(outcome, problem, device, group.name());
}

std::vector<DecodeCompileGroup> decode_groups() {
  return {{64, DType::BF16, true, 0},    {64, DType::F16, false, 16}, {72, DType::BF16, false, 0},
          {128, DType::BF16, false, 16}, {128, DType::F16, true, 0},  {128, DType::BF16, true, 256},
          {256, DType::BF16, false, 16}, {256, DType::F16, true, 0}};
}

INSTANTIATE_TEST_SUITE_P(DecodeGroups, HipCompileAllDecodeConfigs,
                         ::testing::ValuesIn(decode_groups()),
                         [](const ::testing::TestParamInfo<DecodeCompileGroup>& info) {
                           return info.param.name();
                         });

// ---- the backward pass ----------------------------------------------------------------------

struct BackwardCompileGroup {
  int head_dim;
  DType dtype;
  bool causal;

  std::string name() const {
    std::string text = "gfx90a_bwd_d";
    text += std::to_string(head_dim);
    text += "_";
    text += to_string(dtype);
    text += causal ? "_causal" : "_noncausal";
    return text;
  }
  AttentionProblem problem() const {
    return AttentionProblem::make(2, 16, 16, 4096, 4096, head_dim, dtype, causal)
        .with_pass(Pass::Backward);
  }
};

void PrintTo(const BackwardCompileGroup& group, std::ostream* out) { *out << group.name(); }

class HipCompileAllBackwardConfigs : public ::testing::TestWithParam<BackwardCompileGroup> {};

TEST_P(HipCompileAllBackwardConfigs, EveryLegalConfigCompilesWithoutSpills) {
  if (!have_hiprtc()) GTEST_SKIP() << hip::hiprtc_version();
  const BackwardCompileGroup& group = GetParam();
  const DeviceSpec device = known_device("gfx90a").value();
  const AttentionProblem problem = group.problem();
  const std::vector<AttentionConfig> configs = legal_hip_configs(problem, device);
  ASSERT_FALSE(configs.empty()) << "no legal config for " << group.name();
  // The legal set is the same for every dtype and causal setting of this head dim: compiling it
  // in two of the four covers every config of the standard set.
  for (DType dtype : {DType::F16, DType::BF16})
    for (bool causal : {false, true}) {
      const BackwardCompileGroup other{group.head_dim, dtype, causal};
      EXPECT_EQ(legal_hip_configs(other.problem(), device), configs) << other.name();
    }
  // Deterministic problems have legal (-det) configs at every head dim.
  AttentionProblem deterministic = problem;
  deterministic.deterministic = true;
  EXPECT_FALSE(legal_hip_configs(deterministic, device).empty()) << group.name();

  const std::vector<CompileOutcome> outcomes = compile_all(problem, configs, "gfx90a");
  print_backward_table(outcomes, problem);
  for (const CompileOutcome& outcome : outcomes)
    expect_clean(outcome, problem, device, group.name());
}

std::vector<BackwardCompileGroup> backward_groups() {
  std::vector<BackwardCompileGroup> groups;
  for (int head_dim : {64, 128, 256}) {
    groups.push_back({head_dim, DType::BF16, true});
    groups.push_back({head_dim, DType::F16, false});
  }
  return groups;
}

INSTANTIATE_TEST_SUITE_P(BackwardGroups, HipCompileAllBackwardConfigs,
                         ::testing::ValuesIn(backward_groups()),
                         [](const ::testing::TestParamInfo<BackwardCompileGroup>& info) {
                           return info.param.name();
                         });

// ---- attention variants --------------------------------------------------------------------

// Every variant kind and their combination (support/variant_cases.hpp's compile_variants), and
// packed documents alone and with a window + softcap, at d = 128 (bf16, causal): each at its
// default tile and at the legal tile of the most estimated registers, clean as above; the plain
// kernel of the same tile is compiled beside it for the table.
TEST(HipCompileVariants, EveryVariantCompilesCleanAtTheDefaultAndHeaviestTile) {
  if (!have_hiprtc()) GTEST_SKIP() << hip::hiprtc_version();
  const DeviceSpec device = known_device("gfx90a").value();
  struct Job {
    std::string label;
    AttentionProblem problem;
    AttentionConfig config;
  };
  std::vector<Job> jobs;
  for (int head_dim : {128, 256}) {
    const std::string d = "d" + std::to_string(head_dim) + " ";
    const AttentionProblem plain =
        AttentionProblem::make(1, 16, 16, 4096, 4096, head_dim, DType::BF16, /*causal=*/true);
    std::vector<std::pair<std::string, AttentionProblem>> problems;
    for (const testing::NamedVariant& named : testing::compile_variants()) {
      AttentionProblem p = plain;
      p.variant = named.variant;
      problems.push_back({d + named.name, p});
    }
    AttentionProblem varlen = AttentionProblem::make_varlen(8, 16, 16, 4096, 4096, 20000, 20000,
                                                            head_dim, DType::BF16, /*causal=*/true);
    problems.push_back({d + "varlen", varlen});
    varlen.variant.window_left = 1024;
    varlen.variant.softcap = 30.f;
    problems.push_back({d + "varlen_window_softcap", varlen});
    for (const auto& [name, problem] : problems) {
      const std::vector<AttentionConfig> legal = legal_hip_configs(problem, device);
      ASSERT_FALSE(legal.empty()) << name;
      const AttentionConfig def = default_hip_config(problem, device).value();
      const AttentionConfig heaviest = *std::max_element(
          legal.begin(), legal.end(), [&](const AttentionConfig& a, const AttentionConfig& b) {
            return hip_estimated_registers(a, problem) < hip_estimated_registers(b, problem);
          });
      for (const AttentionConfig& tile : {def, heaviest}) {
        auto seen = [&](const std::string& label) {
          return std::any_of(jobs.begin(), jobs.end(),
                             [&](const Job& j) { return j.label == label && j.config == tile; });
        };
        if (seen(name)) continue;
        jobs.push_back({name, problem, tile});
        if (!seen(d + "plain")) jobs.push_back({d + "plain", plain, tile});
      }
    }
  }
  const Clock::time_point start = Clock::now();
  const std::vector<CompileOutcome> outcomes = testing::parallel_map<CompileOutcome>(
      jobs.size(),
      [&](size_t i) { return compile_one(jobs[i].problem, jobs[i].config, "gfx90a"); });
  std::printf("  %zu compiles: %.1f s wall\n", jobs.size(), seconds_since(start));
  std::printf("  %-27s %-14s %5s %5s %5s %6s\n", "variant", "config", "est", "vgpr", "agpr",
              "spill");
  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompileOutcome& o = outcomes[i];
    expect_clean(o, jobs[i].problem, device, jobs[i].label);
    if (!o.ok) continue;
    std::printf("  %-27s %-14s %5d %5d %5d %6d\n", jobs[i].label.c_str(),
                o.config.to_string().c_str(), hip_estimated_registers(o.config, jobs[i].problem),
                o.resources.vgprs, o.resources.agprs, o.resources.vgpr_spills);
    if (jobs[i].label.find("plain") != std::string::npos) continue;
    const Result<KernelSource> source = render_hip_attention(jobs[i].problem, o.config);
    ASSERT_TRUE(source.ok());
    EXPECT_NE(source->text.find("flashjit_hip::attention_forward_variant<Config>(params);"),
              std::string::npos)
        << jobs[i].label;
  }
  std::fflush(stdout);
}

// The backward of every variant kind and their combination (support/variant_cases.hpp's
// backward_compile_variants) and of packed documents alone and with a window + softcap, at d = 128
// (bf16, causal): each at its default tile in both dQ modes,
// the combination also at the legal tile of the most estimated dK/dV registers; every kernel clean
// as above (registers within its waves' budget), entering through the variant entries. Where the
// plain backward spills nothing (HipCompileAllBackwardConfigs), a variant's per-score masking
// may spill a few VGPRs of the dK/dV kernel at the largest tile (hipRTC 5.2: 4 for the window,
// prefix and varlen + window variants at m32n128w4s1): at most kMaxVariantSpills.
constexpr int kMaxVariantSpills = 8;

TEST(HipCompileVariants, EveryBackwardVariantCompilesWithinTheSpillBound) {
  if (!have_hiprtc()) GTEST_SKIP() << hip::hiprtc_version();
  const DeviceSpec device = known_device("gfx90a").value();
  const AttentionProblem plain =
      AttentionProblem::make(1, 16, 16, 4096, 4096, 128, DType::BF16, /*causal=*/true)
          .with_pass(Pass::Backward);
  struct Job {
    std::string label;
    AttentionProblem problem;
    AttentionConfig config;
  };
  std::vector<std::pair<std::string, AttentionProblem>> problems;
  for (const testing::NamedVariant& named : testing::backward_compile_variants()) {
    AttentionProblem p = plain;
    p.variant = named.variant;
    problems.push_back({named.name, p});
  }
  AttentionProblem varlen = AttentionProblem::make_varlen(8, 16, 16, 4096, 4096, 20000, 20000, 128,
                                                          DType::BF16, /*causal=*/true)
                                .with_pass(Pass::Backward);
  problems.push_back({"varlen", varlen});
  varlen.variant.window_left = 1024;
  varlen.variant.softcap = 30.f;
  problems.push_back({"varlen_window", varlen});
  std::vector<Job> jobs;
  for (const auto& [name, problem] : problems) {
    for (bool deterministic : {false, true}) {
      AttentionProblem p = problem;
      p.deterministic = deterministic;
      const std::vector<AttentionConfig> legal = legal_hip_configs(p, device);
      ASSERT_FALSE(legal.empty()) << name;
      std::vector<AttentionConfig> tiles = {default_hip_config(p, device).value()};
      if (name == "everything") {
        tiles.push_back(*std::max_element(legal.begin(), legal.end(),
                                          [&](const AttentionConfig& a, const AttentionConfig& b) {
                                            return hip_bwd_dkdv_estimated_registers(a, p) <
                                                   hip_bwd_dkdv_estimated_registers(b, p);
                                          }));
      }
      for (const AttentionConfig& tile : tiles) jobs.push_back({name, p, tile});
    }
  }
  const Clock::time_point start = Clock::now();
  const std::vector<CompileOutcome> outcomes = testing::parallel_map<CompileOutcome>(
      jobs.size(),
      [&](size_t i) { return compile_one(jobs[i].problem, jobs[i].config, "gfx90a"); });
  std::printf("  %zu backward compiles: %.1f s wall\n", jobs.size(), seconds_since(start));
  std::printf("  %-14s %-18s %9s %6s %9s %6s\n", "variant", "config", "dkdv vgpr", "spill",
              "dq vgpr", "spill");
  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompileOutcome& o = outcomes[i];
    expect_clean(o, jobs[i].problem, device, "backward " + jobs[i].label, kMaxVariantSpills);
    if (!o.ok || o.kernels.size() < 3) continue;
    std::printf("  %-14s %-18s %9d %6d %9d %6d\n", jobs[i].label.c_str(),
                o.config.to_string().c_str(), o.kernels[1].resources.vgprs,
                o.kernels[1].resources.vgpr_spills, o.kernels[2].resources.vgprs,
                o.kernels[2].resources.vgpr_spills);
    const Result<KernelSource> source = render_hip_attention(jobs[i].problem, o.config);
    ASSERT_TRUE(source.ok());
    EXPECT_NE(source->text.find("flashjit_hip::attention_backward_dkdv_variant<Config>(params);"),
              std::string::npos)
        << jobs[i].label;
  }
  std::fflush(stdout);
}

// A user expression that does not compile is a CompileFailed error quoting it and hipRTC's first
// message (explain_variant_compile_error reads hipRTC's "file:line:column: error:" lines).
TEST(HipCompileVariants, AnExpressionThatDoesNotCompileIsQuoted) {
  if (!have_hiprtc()) GTEST_SKIP() << hip::hiprtc_version();
  AttentionProblem p = AttentionProblem::make(1, 4, 4, 256, 256, 64, DType::F16, false);
  p.variant.mask_mod = "q_idx >= kv_idx && undefined_name";
  const AttentionConfig config{64, 64, 4, 2};
  Result<KernelSource> source = render_hip_attention(p, config);
  ASSERT_TRUE(source.ok()) << source.error().describe();
  Result<Binary> binary = hip::hiprtc_compile(source.value(), "gfx90a");
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

#else

TEST(HipCompileAllConfigs, NotBuilt) {
  GTEST_SKIP() << "built without the HIP backend (no ROCm headers)";
}

#endif
