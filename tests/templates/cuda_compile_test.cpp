// Every legal config of the CUDA attention templates compiles with NVRTC, for sm80 and sm90,
// spilling at most a few values (kMaxSpillBytes): the forward's, and the backward's (every
// kernel of its source: preprocess, dK/dV, and the convert or the separate dQ kernel; the wgmma
// family's backward with no spill at all and no serialized wgmma). Needs no
// GPU (NVRTC only), so it runs in CI: a template or generator change that breaks any corner of
// the config space fails here, not on a GPU machine later.
//
// One gtest per (pass, arch, head_dim, dtype, causal) group; each prints a table of its configs.
//
// The -ws family (about 450 forward configs: tiles x ping-pong x persistent) is too many for
// CI's two cores: there every code path is compiled instead, that is each kernel variant (the
// consumer warpgroup count, which sets the launch bounds and the registers after setmaxnreg,
// times each schedule: ping-pong or not, persistent or not) per head dim, dtype and causal
// setting, at its register-heaviest tile (the widest block_n; the fewest stages, which change
// shared-memory offsets only). FLASHJIT_COMPILE_ALL=1 compiles every legal tile of every family
// (bench/device_run.sh sets it on the GPU machine's 16 cores).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "generator/backward_config.hpp"
#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/forward_config_ws.hpp"
#include "generator/render.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "support/attention_cases.hpp"
#include "support/parallel.hpp"

namespace flashjit {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Compile seconds over the whole process (all groups this process ran), printed at exit.
std::mutex total_mutex;
double total_compile_seconds = 0;
double total_wall_seconds = 0;
int total_compiles = 0;

class TotalCompileTime : public ::testing::Environment {
 public:
  void TearDown() override {
    if (total_compiles == 0) return;
    std::printf(
        "[ total    ] %d NVRTC compiles: %.1f s of compile time, %.1f s wall on %u threads\n",
        total_compiles, total_compile_seconds, total_wall_seconds, testing::worker_count());
  }
};
::testing::Environment* const total_environment =
    ::testing::AddGlobalTestEnvironment(new TotalCompileTime);

struct CompileOutcome {
  AttentionConfig config;
  bool ok = false;
  std::string error;  // render or compile error, with the log
  std::string log;    // the compile log (ptxas' report and notes)
  size_t cubin_bytes = 0;
  cuda::PtxasReport report;  // the worst of the source's kernels
  // The backward's kernels: dK/dV and (DqMode::Separate) the dQ kernel.
  cuda::PtxasReport preprocess_report, dkdv_report, dq_report;
  double seconds = 0;
};

CompileOutcome compile_one(const AttentionProblem& problem, const AttentionConfig& config,
                           int arch) {
  CompileOutcome outcome;
  outcome.config = config;
  const Clock::time_point start = Clock::now();
  Result<KernelSource> source = render_cuda_attention(problem, config);
  if (!source.ok()) {
    outcome.error = "render: " + source.error().describe();
    return outcome;
  }
  Result<Binary> binary = cuda::nvrtc_compile(source.value(), arch);
  outcome.seconds = seconds_since(start);
  if (!binary.ok()) {
    outcome.error = binary.error().describe();
    return outcome;
  }
  outcome.ok = true;
  outcome.cubin_bytes = binary->bytes.size();
  outcome.report = cuda::parse_ptxas_report(binary->compile_log);
  outcome.preprocess_report =
      cuda::parse_ptxas_report(binary->compile_log, kBackwardPreprocessEntry);
  outcome.dkdv_report = cuda::parse_ptxas_report(binary->compile_log, kBackwardDkDvEntry);
  outcome.dq_report = cuda::parse_ptxas_report(binary->compile_log, kBackwardDqEntry);
  outcome.log = binary->compile_log;
  return outcome;
}

std::vector<CompileOutcome> compile_all(const AttentionProblem& problem,
                                        const std::vector<AttentionConfig>& configs, int arch) {
  const Clock::time_point start = Clock::now();
  std::vector<CompileOutcome> outcomes = testing::parallel_map<CompileOutcome>(
      configs.size(), [&](size_t i) { return compile_one(problem, configs[i], arch); });
  const double wall = seconds_since(start);
  double compile_seconds = 0;
  for (const CompileOutcome& outcome : outcomes) compile_seconds += outcome.seconds;
  std::printf("  %zu compiles for sm_%d: %.1f s wall, %.1f s compile time (%.2f s each)\n",
              outcomes.size(), arch, wall, compile_seconds,
              outcomes.empty() ? 0.0 : compile_seconds / outcomes.size());
  std::lock_guard<std::mutex> lock(total_mutex);
  total_compile_seconds += compile_seconds;
  total_wall_seconds += wall;
  total_compiles += static_cast<int>(outcomes.size());
  return outcomes;
}

// Near the 255-register cap ptxas may spill a few values (seen: prefetch addresses, stored once
// and reloaded once per K/V block, outside the MMA path); more than this means the register
// budget in generator/config.cpp no longer describes the template.
constexpr int kMaxSpillBytes = 128;

// Checks one outcome: compiled, non-empty CUBIN, a ptxas report with at most kMaxSpillBytes.
void expect_clean(const CompileOutcome& outcome, const std::string& group) {
  const std::string where = group + " config " + outcome.config.to_string();
  if (!outcome.ok) {
    ADD_FAILURE() << where << " failed to compile:\n" << outcome.error;
    return;
  }
  EXPECT_GT(outcome.cubin_bytes, 0u) << where << ": empty CUBIN";
  EXPECT_GT(outcome.report.registers, 0) << where << ": no ptxas register report in the log";
  EXPECT_LE(outcome.report.spill_store_bytes, kMaxSpillBytes)
      << where << ": " << outcome.report.spill_store_bytes << " bytes of spill stores ("
      << outcome.report.registers << " registers)";
  // ptxas serializes every wgmma of a kernel (a wait after each) when it cannot prove which
  // accumulators are in flight: correct, but the tensor cores idle (notes C7514/C7515 etc.).
  EXPECT_EQ(outcome.log.find("wgmma.mma_async instructions are serialized"), std::string::npos)
      << where << ": ptxas serialized the wgmmas:\n"
      << outcome.log;
  if (outcome.config.family == KernelFamily::Ws) {
    // The -ws kernels: no spill at all (their consumers' registers are set by setmaxnreg from
    // the budget), and setmaxnreg not dropped (warning C7508: "'setmaxnreg' ignored to maintain
    // minimum register requirements", which leaves the consumers at the launch count).
    EXPECT_EQ(outcome.report.spill_store_bytes, 0) << where << ": spills";
    EXPECT_EQ(outcome.report.spill_load_bytes, 0) << where << ": spill loads";
    EXPECT_EQ(outcome.log.find("C7508"), std::string::npos)
        << where << ": ptxas ignored setmaxnreg:\n"
        << outcome.log;
    EXPECT_EQ(outcome.log.find("setmaxnreg"), std::string::npos)
        << where << ": ptxas warns about setmaxnreg:\n"
        << outcome.log;
  }
}

void print_table(const std::vector<CompileOutcome>& outcomes, const AttentionProblem& problem) {
  std::printf("  %-28s %5s %5s %7s %6s %6s %8s %6s\n", "config", "regs", "est", "spill", "load",
              "stack", "cubin", "sec");
  for (const CompileOutcome& o : outcomes) {
    if (!o.ok) {
      std::printf("  %-28s FAILED\n", o.config.to_string().c_str());
      continue;
    }
    std::printf("  %-28s %5d %5d %7d %6d %6d %8zu %6.2f\n", o.config.to_string().c_str(),
                o.report.registers, estimated_registers(o.config, problem),
                o.report.spill_store_bytes, o.report.spill_load_bytes, o.report.stack_frame_bytes,
                o.cubin_bytes, o.seconds);
  }
  std::fflush(stdout);
}

struct CompileGroup {
  int arch;
  int head_dim;
  DType dtype;
  bool causal;

  std::string name() const {
    return "sm" + std::to_string(arch) + "_d" + std::to_string(head_dim) + "_" + to_string(dtype) +
           (causal ? "_causal" : "_noncausal");
  }
};

// gtest prints a failing test's parameter: by name rather than as raw bytes.
void PrintTo(const CompileGroup& group, std::ostream* out) { *out << group.name(); }

bool compile_all_tiles() {
  const char* all = std::getenv("FLASHJIT_COMPILE_ALL");
  return all != nullptr && std::string(all) == "1";
}

// The -ws configs CI compiles (see the top): per consumer count and schedule, the legal tile of
// the widest block_n, then the fewest stages. Other families' configs pass through.
std::vector<AttentionConfig> code_paths(const std::vector<AttentionConfig>& configs) {
  std::vector<AttentionConfig> kept;
  for (const AttentionConfig& c : configs) {
    if (c.family != KernelFamily::Ws) {
      kept.push_back(c);
      continue;
    }
    auto same_path = [&](const AttentionConfig& o) {
      return o.family == KernelFamily::Ws && o.block_m == c.block_m && o.pingpong == c.pingpong &&
             o.persistent == c.persistent;
    };
    auto heavier = [&](const AttentionConfig& o) {
      return o.block_n > c.block_n || (o.block_n == c.block_n && o.stages < c.stages);
    };
    if (std::none_of(configs.begin(), configs.end(),
                     [&](const AttentionConfig& o) { return same_path(o) && heavier(o); }))
      kept.push_back(c);
  }
  return kept;
}

class CudaCompileAllConfigs : public ::testing::TestWithParam<CompileGroup> {};

TEST_P(CudaCompileAllConfigs, EveryLegalConfigCompilesWithoutSpills) {
  const CompileGroup& group = GetParam();
  Result<DeviceSpec> device = known_device("sm" + std::to_string(group.arch));
  ASSERT_TRUE(device.ok()) << device.error().describe();
  // legal_configs depends on the head dim and the device only; the sizes are representative.
  const auto problem =
      AttentionProblem::make(2, 16, 16, 4096, 4096, group.head_dim, group.dtype, group.causal);
  const std::vector<AttentionConfig> legal =
      testing::selected_families(legal_configs(problem, device.value()));
  const std::vector<AttentionConfig> configs = compile_all_tiles() ? legal : code_paths(legal);
  if (configs.size() < legal.size())
    std::printf("  %zu of %zu legal configs: every -ws code path (FLASHJIT_COMPILE_ALL=1: all)\n",
                configs.size(), legal.size());
  if (configs.empty() && std::getenv("FLASHJIT_TEST_FAMILIES"))
    GTEST_SKIP() << "no config of $FLASHJIT_TEST_FAMILIES is legal for " << group.name();
  ASSERT_FALSE(configs.empty()) << "no legal config for " << group.name();

  const std::vector<CompileOutcome> outcomes = compile_all(problem, configs, group.arch);
  print_table(outcomes, problem);
  for (const CompileOutcome& outcome : outcomes) expect_clean(outcome, group.name());
}

std::vector<CompileGroup> all_groups() {
  std::vector<CompileGroup> groups;
  for (int arch : {80, 90})
    for (int head_dim : {64, 128, 256})
      for (DType dtype : {DType::F16, DType::BF16})
        for (bool causal : {false, true}) groups.push_back({arch, head_dim, dtype, causal});
  return groups;
}

INSTANTIATE_TEST_SUITE_P(AllGroups, CudaCompileAllConfigs, ::testing::ValuesIn(all_groups()),
                         [](const ::testing::TestParamInfo<CompileGroup>& info) {
                           return info.param.name();
                         });

// ---- the backward pass ------------------------------------------------------------------------

void print_backward_table(const std::vector<CompileOutcome>& outcomes,
                          const AttentionProblem& problem, const DeviceSpec& device) {
  std::printf("  %-18s %9s %9s %9s %9s %8s %6s\n", "config", "dkdv regs", "est", "dq regs", "est",
              "spill", "sec");
  for (const CompileOutcome& o : outcomes) {
    if (!o.ok) {
      std::printf("  %-18s FAILED\n", o.config.to_string().c_str());
      continue;
    }
    const BackwardResources use = backward_resources(o.config, problem, device);
    const bool separate = o.config.dq == DqMode::Separate;
    std::printf("  %-18s %9d %9d %9s %9s %8d %6.2f\n", o.config.to_string().c_str(),
                o.dkdv_report.registers, use.dkdv_registers,
                separate ? std::to_string(o.dq_report.registers).c_str() : "-",
                separate ? std::to_string(use.dq_registers).c_str() : "-",
                o.report.spill_store_bytes, o.seconds);
  }
  std::fflush(stdout);
}

class CudaCompileBackward : public ::testing::TestWithParam<CompileGroup> {};

TEST_P(CudaCompileBackward, EveryLegalConfigCompilesWithoutSpills) {
  const CompileGroup& group = GetParam();
  Result<DeviceSpec> device = known_device("sm" + std::to_string(group.arch));
  ASSERT_TRUE(device.ok()) << device.error().describe();
  // Not deterministic: both dQ modes are legal. The sizes are representative.
  const AttentionProblem problem =
      AttentionProblem::make(2, 16, 16, 4096, 4096, group.head_dim, group.dtype, group.causal)
          .with_pass(Pass::Backward);
  const std::vector<AttentionConfig> configs = legal_configs(problem, device.value());
  ASSERT_FALSE(configs.empty()) << "no legal backward config for " << group.name();
  const std::vector<CompileOutcome> outcomes = compile_all(problem, configs, group.arch);
  print_backward_table(outcomes, problem, device.value());
  for (const CompileOutcome& outcome : outcomes) {
    expect_clean(outcome, "bwd " + group.name());
    if (!outcome.ok) continue;
    // Each kernel the config launches was reported on (a missing entry would read as 0 spills).
    const std::string where = "bwd " + group.name() + " config " + outcome.config.to_string();
    EXPECT_GT(outcome.preprocess_report.registers, 0) << where << ":\n" << outcome.log;
    EXPECT_GT(outcome.dkdv_report.registers, 0) << where << ":\n" << outcome.log;
    EXPECT_GT(outcome.dq_report.registers, 0) << where << ":\n" << outcome.log;
    if (outcome.config.family == KernelFamily::Wgmma || outcome.config.family == KernelFamily::Ws) {
      // The wgmma and ws families' budgets keep every accumulator in registers: no spill at all,
      // in any of their kernels (a spill there means backward_config_sm90's or
      // backward_config_ws's register model is off).
      for (const cuda::PtxasReport* r :
           {&outcome.preprocess_report, &outcome.dkdv_report, &outcome.dq_report}) {
        EXPECT_EQ(r->spill_store_bytes, 0) << where << ": spill stores\n" << outcome.log;
        EXPECT_EQ(r->spill_load_bytes, 0) << where << ": spill loads\n" << outcome.log;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllGroups, CudaCompileBackward, ::testing::ValuesIn(all_groups()),
                         [](const ::testing::TestParamInfo<CompileGroup>& info) {
                           return info.param.name();
                         });

// A head dim that is not a power of two: the template pads it to padded_head_dim() (128).
class CudaCompilePaddedHeadDim : public ::testing::TestWithParam<int> {};

TEST_P(CudaCompilePaddedHeadDim, DefaultConfigOfHeadDim96Compiles) {
  const int arch = GetParam();
  Result<DeviceSpec> device = known_device("sm" + std::to_string(arch));
  ASSERT_TRUE(device.ok()) << device.error().describe();
  const auto problem = AttentionProblem::make(1, 8, 8, 1000, 1000, 96, DType::BF16, true);
  Result<AttentionConfig> config = default_config(problem, device.value());
  ASSERT_TRUE(config.ok()) << config.error().describe();
  const std::vector<CompileOutcome> outcomes = compile_all(problem, {config.value()}, arch);
  print_table(outcomes, problem);
  expect_clean(outcomes.front(), "sm" + std::to_string(arch) + "_d96_bf16_causal");
}

TEST_P(CudaCompilePaddedHeadDim, DefaultBackwardConfigOfHeadDim96Compiles) {
  const int arch = GetParam();
  Result<DeviceSpec> device = known_device("sm" + std::to_string(arch));
  ASSERT_TRUE(device.ok()) << device.error().describe();
  for (bool deterministic : {false, true}) {
    AttentionProblem problem = AttentionProblem::make(1, 8, 2, 1000, 1000, 96, DType::BF16, true)
                                   .with_pass(Pass::Backward);
    problem.deterministic = deterministic;
    Result<AttentionConfig> config = default_config(problem, device.value());
    ASSERT_TRUE(config.ok()) << config.error().describe();
    const std::vector<CompileOutcome> outcomes = compile_all(problem, {config.value()}, arch);
    print_backward_table(outcomes, problem, device.value());
    expect_clean(outcomes.front(), "bwd sm" + std::to_string(arch) + "_d96_bf16_causal");
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, CudaCompilePaddedHeadDim, ::testing::Values(80, 90),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "sm" + std::to_string(info.param);
                         });

// The -ws family's untuned tile for head dims that are not a multiple of 64 (zero-filled TMA
// columns), in each schedule: compiles clean for sm_90a.
TEST(CudaCompileWs, DefaultWsConfigOfPaddedHeadDimsCompiles) {
  Result<DeviceSpec> device = known_device("sm90");
  ASSERT_TRUE(device.ok()) << device.error().describe();
  for (int head_dim : {96, 200}) {
    const auto problem = AttentionProblem::make(1, 8, 8, 1000, 1000, head_dim, DType::BF16, true);
    Result<AttentionConfig> config = default_ws_config(problem, device.value());
    ASSERT_TRUE(config.ok()) << config.error().describe();
    std::vector<AttentionConfig> schedules;
    for (bool pingpong : {false, true})
      for (bool persistent : {false, true}) {
        AttentionConfig c = config.value();
        c.pingpong = pingpong;
        c.persistent = persistent;
        ASSERT_TRUE(check_config(c, problem, device.value()).ok()) << c.to_string();
        schedules.push_back(c);
      }
    const std::vector<CompileOutcome> outcomes = compile_all(problem, schedules, 90);
    print_table(outcomes, problem);
    for (const CompileOutcome& outcome : outcomes)
      expect_clean(outcome, "sm90_d" + std::to_string(head_dim) + "_bf16_causal");
  }
}

}  // namespace
}  // namespace flashjit
