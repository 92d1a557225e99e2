// Crash isolation on a real GPU (issue 15, docs/RELIABILITY.md): a kernel that writes to an
// illegal address, one that traps and one that never finishes, each inside a supervised tuning
// run on the CUDA backend. The first two poison their CUDA context (every later call fails), the
// third hangs its launch; in each case the worker is lost, the supervisor records the config as
// failed and a new worker (a fresh context) finishes the problem from the DB.
//
// The faulting kernels are the real template's source for one config with a fault put at the top
// of the kernel's body (FaultingBackend::render below): what the tuner sees is a kernel that
// compiles, loads and then faults in its first launch, as a broken template would.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tuning_store.hpp"
#include "support/forwarding_backend.hpp"
#include "support/gpu.hpp"
#include "tuner/supervisor.hpp"
#include "tuner/tuner.hpp"

namespace flashjit {
namespace {

namespace fs = std::filesystem;

// The statement put at the top of the faulting kernel, run by one thread of the first block.
std::string fault_statement(const std::string& kind) {
  if (kind == "address") return "*reinterpret_cast<volatile int*>(0x10) = 1;";
  if (kind == "trap") return "__trap();";
  // The sleep is what keeps the loop: an empty endless loop may be deleted (forward progress).
  if (kind == "hang") return "for (;;) asm volatile(\"nanosleep.u32 100000;\");";
  return "";
}

// The CUDA backend, its config space cut to the default and three others (so that each run is
// quick), with one of them rendered with a fault.
class FaultingBackend final : public testing::ForwardingBackend {
 public:
  FaultingBackend(const Backend& real, std::string faulty, std::string kind)
      : ForwardingBackend(real), faulty_(std::move(faulty)), kind_(std::move(kind)) {}

  std::vector<AttentionConfig> legal_configs(const AttentionProblem& problem) const override {
    return configs_of(real(), problem);
  }
  Result<KernelSource> render(const AttentionProblem& problem,
                              const AttentionConfig& config) const override {
    Result<KernelSource> source = real().render(problem, config);
    if (!source.ok() || config.to_string() != faulty_) return source;
    // The first '{' after __global__ opens the kernel's body.
    const size_t global = source->text.find("__global__");
    const size_t body = source->text.find('{', global);
    if (global == std::string::npos || body == std::string::npos) {
      return make_error(ErrorCode::CompileFailed, "no kernel body in " + source->label);
    }
    source->text.insert(body + 1, "\n  if (blockIdx.x == 0 && threadIdx.x == 0) { " +
                                      fault_statement(kind_) + " }\n");
    return source;
  }

  // The default and the first three other legal configs (mma family first in the CUDA order).
  static std::vector<AttentionConfig> configs_of(const Backend& backend,
                                                 const AttentionProblem& problem) {
    const AttentionConfig fallback = backend.default_config(problem).value();
    std::vector<AttentionConfig> configs = {fallback};
    for (const AttentionConfig& config : backend.legal_configs(problem)) {
      if (configs.size() == 4) break;
      if (config != fallback) configs.push_back(config);
    }
    return configs;
  }

 private:
  std::string faulty_, kind_;
};

AttentionProblem fault_problem() {
  return AttentionProblem::make(2, 8, 8, 512, 512, 64, DType::BF16, /*causal=*/false);
}

// The worker side of SupervisedRunSurvivesFaultingGpuKernels: runs only when that test starts
// this program as its worker (FLASHJIT_GPU_FAULT_DB set).
TEST(GpuFaultWorker, TunesWithOneFaultingConfig) {
  const char* db = std::getenv("FLASHJIT_GPU_FAULT_DB");
  const char* faulty = std::getenv("FLASHJIT_GPU_FAULT_CONFIG");
  const char* kind = std::getenv("FLASHJIT_GPU_FAULT_KIND");
  if (db == nullptr || faulty == nullptr || kind == nullptr) {
    GTEST_SKIP() << "the worker of a GPU crash-isolation test";
  }
  FLASHJIT_REQUIRE_GPU();
  FaultingBackend backend(*::flashjit::testing::gpu_backend(), faulty, kind);
  TuneOptions options;
  options.min_time_ms = 10;
  ASSERT_TRUE(apply_worker_environment(options)) << "not started as a tuning worker";
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open(db);
  ASSERT_TRUE(store.ok()) << store.error().describe();
  Tuner tuner(backend, nullptr, store->get(), options);
  Result<TuneReport> report = tuner.tune(fault_problem());
  // As `flashjit tune` does: a worker whose device is unusable exits for a new one.
  if (!report.ok() && is_device_lost(report.error())) std::_Exit(kExitWorkerLost);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  ASSERT_TRUE(report->choice);
}

TEST(GpuFault, SupervisedRunSurvivesFaultingGpuKernels) {
  FLASHJIT_REQUIRE_GPU();
  const Backend& gpu = *::flashjit::testing::gpu_backend();
  const AttentionProblem problem = fault_problem();
  const std::vector<AttentionConfig> configs = FaultingBackend::configs_of(gpu, problem);
  ASSERT_EQ(configs.size(), 4u);
  const std::string faulty = configs[2].to_string();
  const fs::path dir =
      fs::temp_directory_path() / ("flashjit-gpu-fault-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);

  for (const std::string kind : {"address", "trap", "hang"}) {
    SCOPED_TRACE(kind);
    const fs::path db = dir / (kind + ".db");
    setenv("FLASHJIT_GPU_FAULT_DB", db.c_str(), 1);
    setenv("FLASHJIT_GPU_FAULT_CONFIG", faulty.c_str(), 1);
    setenv("FLASHJIT_GPU_FAULT_KIND", kind.c_str(), 1);
    SupervisedRun run;
    run.argv = {"/proc/self/exe", "--gtest_filter=GpuFaultWorker.TunesWithOneFaultingConfig"};
    run.hang_seconds = 10;
    std::vector<std::string> messages;
    run.on_message = [&](const std::string& m) { messages.push_back(m); };
    const auto start = std::chrono::steady_clock::now();
    Result<int> status = run_supervised(run);
    std::printf("%s: %.1f s, %s\n", kind.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                messages.empty() ? "no restart" : messages[0].c_str());
    ASSERT_TRUE(status.ok()) << status.error().describe();
    EXPECT_EQ(*status, 0) << "the second worker did not finish";
    ASSERT_EQ(messages.size(), 1u) << "one worker lost, once";
    EXPECT_NE(messages[0].find(faulty), std::string::npos) << messages[0];
    EXPECT_NE(messages[0].find(kind == "hang" ? "hung" : "left its device unusable"),
              std::string::npos)
        << messages[0];

    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(db);
    ASSERT_TRUE(store.ok()) << store.error().describe();
    Result<std::vector<TuneResult>> rows =
        (*store)->results(gpu.fingerprint(), ProblemKey::of(problem));
    ASSERT_TRUE(rows.ok()) << rows.error().describe();
    EXPECT_EQ(rows->size(), configs.size()) << "a finished result was lost";
    for (const TuneResult& row : *rows) {
      if (row.config.to_string() == faulty) {
        EXPECT_EQ(row.status, TuneStatus::LaunchFailed) << row.message;
      } else {
        EXPECT_EQ(row.status, TuneStatus::Timed) << row.config.to_string() << ": " << row.message;
      }
    }
    Result<std::optional<TuneChoice>> choice =
        (*store)->choice(gpu.fingerprint(), ProblemKey::of(problem));
    ASSERT_TRUE(choice.ok() && choice->has_value());
    EXPECT_NE((*choice)->config.to_string(), faulty);
  }
  unsetenv("FLASHJIT_GPU_FAULT_DB");
  unsetenv("FLASHJIT_GPU_FAULT_CONFIG");
  unsetenv("FLASHJIT_GPU_FAULT_KIND");
  std::error_code ignored;
  fs::remove_all(dir, ignored);
}

}  // namespace
}  // namespace flashjit
