// Every legal config of the HIP attention template compiles with hipRTC for gfx90a (MI200), with
// no scratch memory (no register spills) and at most the registers its wave count allows. Needs
// no GPU (hipRTC only, in worker processes), so it runs in CI: a template or generator change
// that breaks any corner of the HIP config space fails here, not on an AMD machine later.
//
// One gtest per (head_dim, dtype, causal) group of the standard set; each prints a table of its
// configs with the compiler's register counts. Skips where hipRTC cannot be loaded; only in builds
// with the HIP backend.
#include <gtest/gtest.h>

#if FLASHJIT_HAVE_HIP_BACKEND

#include <chrono>
#include <cstdio>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "generator/device.hpp"
#include "generator/hip_config.hpp"
#include "generator/render.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"
#include "support/parallel.hpp"

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
  hip::CodeObjectResources resources;
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

// Compiled, a non-empty code object for wave64, no scratch (spills), no static LDS (the template
// uses dynamic LDS only), registers within what the config's waves leave each lane.
void expect_clean(const CompileOutcome& o, const AttentionProblem& problem,
                  const DeviceSpec& device, const std::string& group) {
  const std::string where = group + " config " + o.config.to_string();
  if (!o.ok) {
    ADD_FAILURE() << where << " failed to compile:\n" << o.error;
    return;
  }
  EXPECT_GT(o.code_bytes, 0u) << where;
  EXPECT_EQ(o.resources.wavefront_size, 64) << where;
  EXPECT_EQ(o.resources.scratch_bytes, 0)
      << where << ": scratch memory (spills), " << o.resources.vgprs << " VGPRs, "
      << o.resources.vgpr_spills << " spilled";
  EXPECT_EQ(o.resources.vgpr_spills, 0) << where;
  EXPECT_EQ(o.resources.lds_bytes, 0) << where;
  EXPECT_GT(o.resources.vgprs, 0) << where << ": no register count in the code object";
  EXPECT_LE(o.resources.vgprs, hip_register_budget(o.config, device)) << where;
  (void)problem;
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
    std::printf("  %-14s %7d %5d %5d %5d %5d %6d %7zu %6.2f\n", o.config.to_string().c_str(),
                hip_lds_bytes(o.config, problem), hip_estimated_registers(o.config, problem),
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

}  // namespace
}  // namespace flashjit

#else

TEST(HipCompileAllConfigs, NotBuilt) {
  GTEST_SKIP() << "built without the HIP backend (no ROCm headers)";
}

#endif
