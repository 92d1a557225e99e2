// Every legal config of the wgmma family's backward pass (templates/cuda/attention_bwd_sm90.cuh)
// compiles with NVRTC for sm_90a, for d 64/128/256 x fp16/bf16 x causal x dQ mode, with no
// spilled register, no serialized wgmma (ptxas' C7510-C7515 notes) and the registers ptxas
// reports printed per kernel next to the budget's estimate. Needs no GPU (NVRTC only).
//
// One gtest per (head_dim, dtype, causal) group; its legal configs hold both dQ modes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <ostream>
#include <regex>
#include <string>
#include <vector>

#include "generator/backward_config_sm90.hpp"
#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/render.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "support/parallel.hpp"

namespace flashjit {
namespace {

using Clock = std::chrono::steady_clock;

// ptxas' report of one entry function of a compile log.
struct EntryReport {
  std::string entry;
  int registers = -1;
  int spill_store_bytes = -1;
  int spill_load_bytes = -1;
};

// The log holds, per entry: "Compiling entry function 'NAME' for 'sm_90a'", then the stack and
// spill line, then "Used N registers". Entries in log order.
std::vector<EntryReport> entry_reports(const std::string& log) {
  static const std::regex kEntry(R"(Compiling entry function '([A-Za-z0-9_]+)')");
  static const std::regex kSpill(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const std::regex kRegisters(R"(Used (\d+) registers)");
  std::vector<EntryReport> reports;
  std::vector<size_t> starts;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), kEntry); it != std::sregex_iterator();
       ++it) {
    reports.push_back({(*it)[1].str()});
    starts.push_back(static_cast<size_t>(it->position()));
  }
  for (size_t i = 0; i < reports.size(); ++i) {
    const size_t end = i + 1 < starts.size() ? starts[i + 1] : log.size();
    const std::string part = log.substr(starts[i], end - starts[i]);
    std::smatch match;
    if (std::regex_search(part, match, kSpill)) {
      reports[i].spill_store_bytes = std::stoi(match[1].str());
      reports[i].spill_load_bytes = std::stoi(match[2].str());
    }
    if (std::regex_search(part, match, kRegisters)) reports[i].registers = std::stoi(match[1]);
  }
  return reports;
}

const EntryReport* find_entry(const std::vector<EntryReport>& reports, const std::string& name) {
  for (const EntryReport& report : reports)
    if (report.entry == name) return &report;
  return nullptr;
}

struct CompileOutcome {
  AttentionConfig config;
  bool ok = false;
  std::string error;
  std::string log;
  std::vector<EntryReport> entries;
  double seconds = 0;
};

CompileOutcome compile_one(const AttentionProblem& problem, const AttentionConfig& config) {
  CompileOutcome outcome;
  outcome.config = config;
  const Clock::time_point start = Clock::now();
  Result<KernelSource> source = render_cuda_attention(problem, config);
  if (!source.ok()) {
    outcome.error = "render: " + source.error().describe();
    return outcome;
  }
  if (!source->arch_specific) {
    outcome.error = "render: the wgmma family's source must compile for sm_90a";
    return outcome;
  }
  Result<Binary> binary = cuda::nvrtc_compile(source.value(), 90);
  outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!binary.ok()) {
    outcome.error = binary.error().describe();
    return outcome;
  }
  outcome.ok = !binary->bytes.empty();
  if (!outcome.ok) outcome.error = "empty CUBIN";
  outcome.log = binary->compile_log;
  outcome.entries = entry_reports(outcome.log);
  return outcome;
}

struct Group {
  int head_dim;
  DType dtype;
  bool causal;

  std::string name() const {
    std::string name = "d";
    name += std::to_string(head_dim);
    name += "_";
    name += to_string(dtype);
    name += causal ? "_causal" : "_noncausal";
    return name;
  }
};

void PrintTo(const Group& group, std::ostream* out) { *out << group.name(); }

class CudaBwdSm90Compile : public ::testing::TestWithParam<Group> {};

TEST_P(CudaBwdSm90Compile, EveryLegalConfigCompilesWithoutSpillsOrSerializedWgmma) {
  const Group& group = GetParam();
  Result<DeviceSpec> device = known_device("sm90");
  ASSERT_TRUE(device.ok()) << device.error().describe();
  // Legality depends on the head dim, dtype and device only; the sizes are representative.
  const AttentionProblem problem =
      AttentionProblem::make(2, 16, 4, 4096, 4096, group.head_dim, group.dtype, group.causal)
          .with_pass(Pass::Backward);
  std::vector<AttentionConfig> configs;
  for (const AttentionConfig& c : wgmma_backward_candidates(problem))
    if (check_wgmma_backward_config(c, problem, device.value()).ok()) configs.push_back(c);
  ASSERT_FALSE(configs.empty()) << "no legal wgmma backward config for " << group.name();
  bool has_atomic = false, has_separate = false;
  for (const AttentionConfig& c : configs)
    (c.dq == DqMode::Atomic ? has_atomic : has_separate) = true;
  EXPECT_TRUE(has_atomic && has_separate) << group.name() << ": both dQ modes should be legal";

  const Clock::time_point start = Clock::now();
  const std::vector<CompileOutcome> outcomes = testing::parallel_map<CompileOutcome>(
      configs.size(), [&](size_t i) { return compile_one(problem, configs[i]); });
  std::printf("  %zu compiles: %.1f s wall on %u threads\n", outcomes.size(),
              std::chrono::duration<double>(Clock::now() - start).count(), testing::worker_count());
  std::printf("  %-22s %9s %11s %9s %11s %6s\n", "config", "dkdv regs", "(estimate)", "dq regs",
              "(estimate)", "sec");

  for (const CompileOutcome& o : outcomes) {
    const std::string where = group.name() + " config " + o.config.to_string();
    if (!o.ok) {
      ADD_FAILURE() << where << " failed to compile:\n" << o.error;
      continue;
    }
    // Three entries; the dQ one is the shared convert kernel for Atomic, the template's for
    // Separate.
    const EntryReport* dkdv = find_entry(o.entries, kBackwardDkDvEntry);
    const EntryReport* dq = find_entry(o.entries, kBackwardDqEntry);
    const EntryReport* pre = find_entry(o.entries, kBackwardPreprocessEntry);
    ASSERT_TRUE(dkdv && dq && pre) << where << ": ptxas reported " << o.entries.size()
                                   << " entries, not the backward's three:\n"
                                   << o.log;
    for (const EntryReport* e : {dkdv, dq, pre}) {
      EXPECT_GT(e->registers, 0) << where << " " << e->entry << ": no register report";
      EXPECT_EQ(e->spill_store_bytes, 0)
          << where << " " << e->entry << ": " << e->spill_store_bytes << " bytes of spill stores ("
          << e->registers << " registers)";
      EXPECT_EQ(e->spill_load_bytes, 0) << where << " " << e->entry << ": spill loads";
    }
    // ptxas serializes every wgmma of a kernel (a wait after each) when it cannot prove which
    // accumulators are in flight or runs out of registers for them: correct, but slow.
    EXPECT_EQ(o.log.find("wgmma.mma_async instructions are serialized"), std::string::npos)
        << where << ": ptxas serialized the wgmmas:\n"
        << o.log;
    const bool separate = o.config.dq == DqMode::Separate;
    char dq_estimate[16] = "-";
    if (separate)
      std::snprintf(dq_estimate, sizeof dq_estimate, "%d",
                    wgmma_backward_dq_registers(o.config, problem));
    std::printf("  %-22s %9d %11d %9d %11s %6.2f\n", o.config.to_string().c_str(), dkdv->registers,
                wgmma_backward_dkdv_registers(o.config, problem), dq->registers, dq_estimate,
                o.seconds);
  }
  std::fflush(stdout);
}

std::vector<Group> all_groups() {
  std::vector<Group> groups;
  for (int head_dim : {64, 128, 256})
    for (DType dtype : {DType::F16, DType::BF16})
      for (bool causal : {false, true}) groups.push_back({head_dim, dtype, causal});
  return groups;
}

INSTANTIATE_TEST_SUITE_P(AllGroups, CudaBwdSm90Compile, ::testing::ValuesIn(all_groups()),
                         [](const ::testing::TestParamInfo<Group>& info) {
                           return info.param.name();
                         });

// A head dim that is not a multiple of 64 (padded to 128 with zero-filled columns, never
// written back): the default config compiles clean too.
TEST(CudaBwdSm90CompilePadded, DefaultConfigOfHeadDim96Compiles) {
  Result<DeviceSpec> device = known_device("sm90");
  ASSERT_TRUE(device.ok()) << device.error().describe();
  const AttentionProblem problem =
      AttentionProblem::make(1, 8, 8, 1000, 1000, 96, DType::BF16, true).with_pass(Pass::Backward);
  Result<AttentionConfig> config = default_wgmma_backward_config(problem, device.value());
  ASSERT_TRUE(config.ok()) << config.error().describe();
  const CompileOutcome outcome = compile_one(problem, config.value());
  ASSERT_TRUE(outcome.ok) << outcome.error;
  for (const EntryReport& e : outcome.entries)
    EXPECT_EQ(e.spill_store_bytes, 0) << e.entry << ": spills (" << e.registers << " registers)";
  EXPECT_EQ(outcome.log.find("wgmma.mma_async instructions are serialized"), std::string::npos)
      << outcome.log;
}

}  // namespace
}  // namespace flashjit
