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
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <thread>

#include "runtime/binary_cache.hpp"
#include "runtime/tuning_store.hpp"
#include "support/busy_processes.hpp"
#include "support/forwarding_backend.hpp"
#include "tuner/tuner.hpp"

#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.hpp"
#endif

namespace flashjit {
namespace {

namespace fs = std::filesystem;

#if FLASHJIT_HAVE_CPU_BACKEND

// The real backend, noting when the tuner first times something on it (a warm-up or a batch).
class TimingWatch final : public testing::ForwardingBackend {
 public:
  using Clock = std::chrono::steady_clock;
  using ForwardingBackend::ForwardingBackend;

  Result<double> time_ms(const std::function<Status()>& work, int repetitions) const override {
    Clock::rep expected = 0;
    first_.compare_exchange_strong(expected, Clock::now().time_since_epoch().count());
    return real().time_ms(work, repetitions);
  }
  bool timing_started() const { return first_ != 0; }
  double ms_since_first_timing() const {
    const Clock::time_point first{Clock::duration{first_.load()}};
    return std::chrono::duration<double, std::milli>(Clock::now() - first).count();
  }

 private:
  mutable std::atomic<Clock::rep> first_{0};
};

TEST(TunerCpuLoad, BusyCoresDuringTheFirstTimingsDoNotChangeTheChoice) {
  const fs::path dir =
      fs::temp_directory_path() / ("flashjit-cpu-load-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct RemoveAtExit {
    fs::path path;
    ~RemoveAtExit() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_at_exit{dir};
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

  auto tune_on = [&](const Backend& on, const std::string& db,
                     TuneOptions run_options) -> TuneReport {
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(dir / db);
    EXPECT_TRUE(store.ok()) << store.error().describe();
    Tuner tuner(on, &cache, store->get(), std::move(run_options));
    Result<TuneReport> report = tuner.tune(problem);
    EXPECT_TRUE(report.ok()) << report.error().describe();
    return report.ok() ? std::move(report.value()) : TuneReport{};
  };
  auto tune = [&](const std::string& db, const TuneOptions& run_options) {
    return tune_on(**backend, db, run_options);
  };
  // A first run compiles the kernels into the cache; the quiet reference run and the loaded one
  // then load them from there (neither compiles).
  tune("compile.db", options);
  // The host's own noise makes a quiet run's re-timed defaults disagree now and then (1 in 4
  // here): up to three tries.
  TuneReport quiet;
  for (int attempt = 0; attempt < 3 && (attempt == 0 || quiet.disturbed); ++attempt)
    quiet = tune("quiet" + std::to_string(attempt) + ".db", options);
  if (quiet.disturbed) {
    GTEST_SKIP() << "the host was busy through the quiet reference run: " << quiet.note;
  }
  ASSERT_TRUE(quiet.choice) << quiet.note;

  // A busy process per core from the start of the loaded run (its verification too) until
  // kHoldMs after its first timing (the default's warm-up) begins: the default's first batches
  // meet the load whatever the verification took, and the back-offs after them (10, 20, 40, 80,
  // 160 ms, within quiet_wait_ms) outlast it. A load of a fixed length (0.6 s, then 1.5x a quiet
  // run's time to its first timed config) ended before the timings twice on busy CI hosts: the
  // verification under the load took longer than the load.
  constexpr double kHoldMs = 300;
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  TimingWatch watched(**backend);
  testing_load::BusyProcesses load(cores, /*seconds=*/60);
  ASSERT_EQ(load.started(), cores);
  std::atomic<bool> finished{false};
  double held_ms = 0;
  std::thread stopper([&] {
    while (!finished && !watched.timing_started())
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    while (!finished && watched.ms_since_first_timing() < kHoldMs)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    held_ms = watched.ms_since_first_timing();
    load.stop();
  });
  const TuneReport loaded = tune_on(watched, "loaded.db", options);
  finished = true;
  stopper.join();
  ASSERT_TRUE(watched.timing_started()) << "the loaded run timed nothing";
  // Load only slows a timing down: a quiet reference well slower than the loaded run was itself
  // disturbed (a fresh-clone CI run once had 0.74 ms quiet against 0.40 ms loaded), so it is taken
  // again, now that the load is gone, up to twice; the fastest undisturbed one is the reference.
  // A loaded default well *slower* than the reference still fails below.
  for (int again = 0; again < 2 && loaded.default_ms < 0.75 * quiet.default_ms; ++again) {
    TuneReport retaken = tune("quiet-after" + std::to_string(again) + ".db", options);
    if (!retaken.disturbed && retaken.choice && retaken.default_ms < quiet.default_ms)
      quiet = std::move(retaken);
  }

  std::printf(
      "quiet run: default %.4f ms, chose %s; loaded run (load held %.0f ms into its timings): %d "
      "batches timed again, %s, default %.4f ms, chose %s\n",
      quiet.default_ms, quiet.choice->config.to_string().c_str(), held_ms, loaded.busy_batches,
      loaded.disturbed ? "disturbed" : "not disturbed", loaded.default_ms,
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
