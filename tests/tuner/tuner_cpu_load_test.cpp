// The CPU tuner beside outside load (issue 15, docs/RELIABILITY.md "Honest timings under
// contention"): busy processes that start with the run and spin on every core through its first
// timings (as other engineers' builds, or tuners starting up, do on a shared host). The CPU
// backend's host-load probe sees them: those batches are timed again once the cores are free, and
// the run stores the choice of a quiet run (or, if the host never got quiet, says the timings
// were disturbed and takes no choice from them). Skips without the CPU backend; ctest runs it
// alone (RUN_SERIAL).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "runtime/binary_cache.hpp"
#include "runtime/tuning_store.hpp"
#include "support/busy_processes.hpp"
#include "tuner/tuner.hpp"

#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.hpp"
#endif

namespace flashjit {
namespace {

namespace fs = std::filesystem;

#if FLASHJIT_HAVE_CPU_BACKEND

TEST(TunerCpuLoad, BusyCoresDuringTheFirstTimingsDoNotChangeTheChoice) {
  const fs::path dir =
      fs::temp_directory_path() / ("flashjit-cpu-load-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  Result<std::unique_ptr<cpu::CpuBackend>> backend = cpu::CpuBackend::create();
  ASSERT_TRUE(backend.ok()) << backend.error().describe();
  BinaryCache cache(dir / "cache");
  // The problem of concurrent_tune_cpu (bench/concurrent_tune.py), shorter samples.
  const AttentionProblem problem = AttentionProblem::make(1, 4, 4, 256, 256, 64, DType::F32, false);
  TuneOptions options;
  options.min_time_ms = 40;
  options.lock_dir = (dir / "locks").string();
  std::vector<std::string> messages;
  options.on_message = [&](const std::string& m) { messages.push_back(m); };

  auto tune = [&](const std::string& db, TuneOptions run_options) -> TuneReport {
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(dir / db);
    EXPECT_TRUE(store.ok()) << store.error().describe();
    Tuner tuner(**backend, &cache, store->get(), std::move(run_options));
    Result<TuneReport> report = tuner.tune(problem);
    EXPECT_TRUE(report.ok()) << report.error().describe();
    return report.ok() ? std::move(report.value()) : TuneReport{};
  };
  // A first run compiles the kernels into the cache; the quiet reference run and the loaded one
  // then load them from there (neither compiles). The quiet run's time to its first timed config
  // (the verification and that config's timings) is what the load below must cover.
  tune("compile.db", options);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point quiet_start = Clock::now();
  double first_timed_s = 0;
  TuneOptions quiet_options = options;
  quiet_options.on_progress = [&](const TuneProgress& progress) {
    if (progress.phase == TuneProgress::Phase::Timing && first_timed_s == 0)
      first_timed_s = std::chrono::duration<double>(Clock::now() - quiet_start).count();
  };
  const TuneReport quiet = tune("quiet.db", quiet_options);
  if (quiet.disturbed) {
    fs::remove_all(dir);
    GTEST_SKIP() << "the host was busy through the quiet reference run: " << quiet.note;
  }
  ASSERT_TRUE(quiet.choice) << quiet.note;
  ASSERT_GT(first_timed_s, 0);

  // A busy process per core from the start of the run for 1.5 times the quiet run's time to its
  // first timed config (the verification, then the first timings, slowed by the load), at least
  // 0.6 s. A fixed 0.6 s was once not enough on a busy CI host: the verification under the load
  // outlasted it and the timings met none of it. On this 2-core host, 1x still missed once in 6
  // runs (0-3 batches seen), 2x outlasted the back-offs' budget in 3 of 5 ("disturbed": no
  // choice checked), 1.5x saw 2-7 batches and was never disturbed in 5.
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  testing_load::BusyProcesses load(cores, std::max(0.6, 1.5 * first_timed_s));
  ASSERT_EQ(load.started(), cores);
  const TuneReport loaded = tune("loaded.db", options);
  load.stop();
  fs::remove_all(dir);

  std::printf(
      "quiet run: first config timed at %.2f s, default %.4f ms, chose %s; loaded run: %d "
      "batches timed again, %s, default %.4f ms, chose %s\n",
      first_timed_s, quiet.default_ms, quiet.choice->config.to_string().c_str(),
      loaded.busy_batches, loaded.disturbed ? "disturbed" : "not disturbed", loaded.default_ms,
      loaded.choice ? loaded.choice->config.to_string().c_str() : "-");
  EXPECT_GT(loaded.busy_batches, 0) << "the busy cores went unseen";
  ASSERT_TRUE(loaded.choice) << loaded.note;
  if (loaded.disturbed) return;  // no choice from the timings: the guarantee holds
  // The loaded run's default is the quiet run's within a shared host's drift (25%, as
  // concurrent_tune_cpu's rule), and its choice is the quiet run's or one the quiet run timed
  // within its noise (or 10%) of its choice.
  EXPECT_NEAR(loaded.default_ms, quiet.default_ms, 0.25 * quiet.default_ms)
      << "the default's time came from disturbed batches";
  if (loaded.choice->config != quiet.choice->config) {
    const TuneResult* same = quiet.result_of(loaded.choice->config);
    ASSERT_NE(same, nullptr);
    const double band = std::max(quiet.noise_ms, 0.10 * quiet.choice->median_ms);
    EXPECT_LE(same->median_ms - quiet.choice->median_ms, band)
        << "chose " << loaded.choice->config.to_string() << " (gain " << loaded.gain()
        << "x), which the quiet run timed at " << same->median_ms << " ms against its choice "
        << quiet.choice->config.to_string() << "'s " << quiet.choice->median_ms << " ms";
  }
}

#endif  // FLASHJIT_HAVE_CPU_BACKEND

}  // namespace
}  // namespace flashjit
