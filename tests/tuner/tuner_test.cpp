// The tuner's logic over a fake backend (no GPU; tests/support/fake_tuner_backend.hpp): failure
// statuses, the noise rule, resume and shared compiles; and one end-to-end tune on a real GPU
// (skipped without one). Contention and crashes: tuner_reliability_test.cpp.
//
// The fake "device" is host memory. A fake kernel computes attention with the fp64 reference for
// small problems (the verification launch) and does nothing for large ones; the fake time_ms
// runs the work once (to surface launch errors) and returns a per-config time with a chosen
// jitter, so that the decision rules can be tested exactly.
#include "tuner/tuner.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/fake_tuner_backend.hpp"
#include "support/gpu.hpp"
#include "tuner/reference.hpp"
#include "tuner/supervisor.hpp"

namespace flashjit {
namespace {

using namespace testing_fake;

TEST_F(TunerTest, FailedConfigsGetTheirStatusAndAreNeverChosen) {
  // The failing configs would be the fastest by far; the winner is a correct one.
  backend_.behaviors[others_[0].to_string()] = Behavior::CompileFails;
  backend_.behaviors[others_[1].to_string()] = Behavior::LaunchFails;
  backend_.behaviors[others_[2].to_string()] = Behavior::WrongResult;
  backend_.behaviors[others_[3].to_string()] = Behavior::NaN;
  for (int i = 0; i < 4; ++i) backend_.times[others_[i].to_string()] = 0.1;
  backend_.times[others_[4].to_string()] = 0.5;

  std::vector<TuneProgress::Phase> phases;
  TuneOptions options = fast_options();
  int timing_events = 0;
  options.on_progress = [&](const TuneProgress& progress) {
    if (progress.phase == TuneProgress::Phase::Timing) ++timing_events;
    phases.push_back(progress.phase);
  };
  Tuner tuner(backend_, nullptr, nullptr, options);
  Result<TuneReport> report = tuner.tune(problem_);
  ASSERT_TRUE(report.ok()) << report.error().describe();

  ASSERT_EQ(report->results.size(), configs_.size());
  for (size_t i = 0; i < configs_.size(); ++i) {
    EXPECT_EQ(report->results[i].config, configs_[i]) << "results follow legal_configs order";
  }
  EXPECT_EQ(report->result_of(others_[0])->status, TuneStatus::CompileFailed);
  EXPECT_EQ(report->result_of(others_[1])->status, TuneStatus::LaunchFailed);
  EXPECT_EQ(report->result_of(others_[2])->status, TuneStatus::WrongResult);
  EXPECT_EQ(report->result_of(others_[3])->status, TuneStatus::WrongResult);
  EXPECT_NE(report->result_of(others_[2])->message.find("o_rel_error"), std::string::npos)
      << report->result_of(others_[2])->message;
  for (size_t i = 4; i < others_.size(); ++i) {
    EXPECT_EQ(report->result_of(others_[i])->status, TuneStatus::Timed) << others_[i].to_string();
  }
  const TuneResult* def = report->result_of(default_);
  ASSERT_NE(def, nullptr);
  EXPECT_TRUE(def->is_default);
  EXPECT_EQ(def->status, TuneStatus::Timed);
  EXPECT_NEAR(def->median_ms, 1.0, 0.01);
  EXPECT_LE(def->min_ms, def->median_ms);
  EXPECT_GE(def->max_ms, def->median_ms);
  EXPECT_GT(def->repetitions, 0);
  EXPECT_GT(def->tflops, 0);

  ASSERT_TRUE(report->choice.has_value());
  EXPECT_EQ(report->choice->config, others_[4]);
  EXPECT_NEAR(report->choice->median_ms, 0.5, 0.01);
  EXPECT_NEAR(report->choice->default_ms, 1.0, 0.01);
  EXPECT_NEAR(report->gain(), 2.0, 0.05);
  EXPECT_FALSE(report->kept_default);
  EXPECT_EQ(report->default_config, default_);

  EXPECT_EQ(timing_events, static_cast<int>(configs_.size()));
  ASSERT_FALSE(phases.empty());
  EXPECT_EQ(phases.back(), TuneProgress::Phase::Done);
  EXPECT_NE(std::find(phases.begin(), phases.end(), TuneProgress::Phase::Retiming), phases.end());
}

TEST_F(TunerTest, SlowConfigsStopEarly) {
  backend_.default_ms = 10.0;  // every config but the default is 10x slower
  Tuner tuner(backend_, nullptr, nullptr, fast_options());
  Result<TuneReport> report = tuner.tune(problem_);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  const TuneResult* slow = report->result_of(others_.back());
  EXPECT_EQ(slow->status, TuneStatus::Timed);
  EXPECT_NE(slow->message.find("stopped early"), std::string::npos) << slow->message;
  ASSERT_TRUE(report->choice);
  EXPECT_EQ(report->choice->config, default_);
  EXPECT_FALSE(report->kept_default);  // nothing was faster
}

// Launches of 400 ms (a CPU's backward): 3 samples of every config and 3 re-timed rounds, not
// min_samples, once max_time_ms of device time is spent.
TEST_F(TunerTest, LongLaunchesStopAtThreeSamples) {
  backend_.default_ms = 400.0;
  backend_.times[default_.to_string()] = 400.0;
  backend_.jitter = 0;
  TuneOptions options = fast_options();
  options.max_time_ms = 1000;
  Tuner tuner(backend_, nullptr, nullptr, options);
  Result<TuneReport> report = tuner.tune(problem_);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  for (const TuneResult& result : report->results) {
    EXPECT_EQ(result.status, TuneStatus::Timed) << result.config.to_string();
    EXPECT_EQ(result.repetitions, 3) << result.config.to_string() << " " << result.message;
  }
  options.max_time_ms = 1e9;  // off: min_samples (5) and min_time_ms
  Tuner patient(backend_, nullptr, nullptr, options);
  report = patient.tune(problem_);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  EXPECT_GE(report->results.front().repetitions, 5);
}

TEST_F(TunerTest, WinnerWithinMinGainKeepsTheDefault) {
  backend_.times[others_[0].to_string()] = 0.995;  // 0.5% faster: below min_gain (1%)
  Tuner tuner(backend_, nullptr, nullptr, fast_options());
  Result<TuneReport> report = tuner.tune(problem_);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  ASSERT_TRUE(report->choice);
  EXPECT_EQ(report->choice->config, default_);
  EXPECT_TRUE(report->kept_default);
  EXPECT_NEAR(report->noise_ms, 0.01, 1e-3);
  EXPECT_DOUBLE_EQ(report->gain(), 1.0);
}

TEST_F(TunerTest, WinnerWithinMeasuredSpreadKeepsTheDefault) {
  backend_.jitter = 0.05;                         // samples alternate +-5%: IQR ~10% of median
  backend_.times[others_[0].to_string()] = 0.96;  // 4% faster: beyond min_gain, within noise
  Tuner tuner(backend_, nullptr, nullptr, fast_options());
  Result<TuneReport> report = tuner.tune(problem_);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  ASSERT_TRUE(report->choice);
  EXPECT_EQ(report->choice->config, default_);
  EXPECT_TRUE(report->kept_default);
  EXPECT_GT(report->noise_ms, 0.04);

  // The same margin with quiet measurements wins.
  FakeBackend quiet;
  quiet.times = backend_.times;
  Tuner quiet_tuner(quiet, nullptr, nullptr, fast_options());
  Result<TuneReport> quiet_report = quiet_tuner.tune(problem_);
  ASSERT_TRUE(quiet_report.ok()) << quiet_report.error().describe();
  ASSERT_TRUE(quiet_report->choice);
  EXPECT_EQ(quiet_report->choice->config, others_[0]);
  EXPECT_FALSE(quiet_report->kept_default);
}

TEST_F(TunerTest, FailedDefaultLetsTheFastestWin) {
  backend_.behaviors[default_.to_string()] = Behavior::WrongResult;
  backend_.times[others_[2].to_string()] = 1.5;
  Tuner tuner(backend_, nullptr, nullptr, fast_options());
  Result<TuneReport> report = tuner.tune(problem_);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  ASSERT_TRUE(report->choice);
  EXPECT_EQ(report->choice->config, others_[2]);
  EXPECT_EQ(report->default_ms, 0);
  EXPECT_DOUBLE_EQ(report->gain(), 1.0);
}

TEST_F(TunerTest, NoUsableConfigGivesNoChoice) {
  for (const AttentionConfig& config : configs_) {
    backend_.behaviors[config.to_string()] = Behavior::CompileFails;
  }
  Tuner tuner(backend_, nullptr, nullptr, fast_options());
  Result<TuneReport> report = tuner.tune(problem_);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  EXPECT_FALSE(report->choice.has_value());
  EXPECT_FALSE(report->note.empty());
}

TEST_F(TunerTest, LostDeviceStopsTheRun) {
  backend_.behaviors[others_[0].to_string()] = Behavior::LaunchFails;
  backend_.device_lost_after_launch_failure = true;
  Tuner tuner(backend_, nullptr, nullptr, fast_options());
  Result<TuneReport> report = tuner.tune(problem_);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.error().code, ErrorCode::DriverError);
  EXPECT_NE(report.error().message.find(others_[0].to_string()), std::string::npos)
      << report.error().message;
  EXPECT_TRUE(is_device_lost(report.error()));
}

TEST_F(TunerTest, ProblemsSharingKernelsCompileOnce) {
  Tuner tuner(backend_, nullptr, nullptr, fast_options());
  Result<std::vector<TuneReport>> reports =
      tuner.tune_all({test_problem(1024), test_problem(2048), test_problem(512)});
  ASSERT_TRUE(reports.ok()) << reports.error().describe();
  ASSERT_EQ(reports->size(), 3u);
  std::set<AttentionConfig> all;
  for (const AttentionProblem& p : {test_problem(1024), test_problem(2048), test_problem(512)}) {
    for (const AttentionConfig& c : legal_configs(p, backend_.device())) all.insert(c);
  }
  EXPECT_EQ(backend_.compiles, static_cast<int>(all.size()));
  for (const TuneReport& report : *reports) EXPECT_TRUE(report.choice.has_value());
}

TEST_F(TunerTest, InvalidProblemIsAnError) {
  Tuner tuner(backend_, nullptr, nullptr, fast_options());
  AttentionProblem bad = problem_;
  bad.head_dim = 100;
  Result<std::vector<TuneReport>> reports = tuner.tune_all({problem_, bad});
  ASSERT_FALSE(reports.ok());
  EXPECT_EQ(reports.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(reports.error().message.find("problem 1"), std::string::npos);
  EXPECT_EQ(backend_.compiles, 0) << "validated before anything runs";
}

// `flashjit tune --dtypes fp32` on a GPU: the CUDA template stores f16/bf16 only, and the tuner
// says so (typed, naming the dtype) before anything compiles, for one problem and for a grid.
TEST_F(TunerTest, Fp32OnTheCudaTemplateIsANamedError) {
  Tuner tuner(backend_, nullptr, nullptr, fast_options());
  AttentionProblem fp32 = problem_;
  fp32.dtype = DType::F32;
  Result<TuneReport> one = tuner.tune(fp32);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.error().code, ErrorCode::Unsupported);
  EXPECT_NE(one.error().message.find("dtype = f32: the CUDA backend supports f16 and bf16"),
            std::string::npos)
      << one.error().message;
  Result<std::vector<TuneReport>> grid = tuner.tune_all({problem_, fp32});
  ASSERT_FALSE(grid.ok());
  EXPECT_EQ(grid.error().code, ErrorCode::Unsupported);
  EXPECT_NE(grid.error().message.find("problem 1: dtype = f32"), std::string::npos)
      << grid.error().message;
  EXPECT_EQ(backend_.compiles, 0);
}

// On the CPU the compiler and the timed kernel share the cores: the tuner compiles everything
// first. (A GPU backend overlaps them: compiles run on the host while the GPU times.)
TEST_F(TunerTest, NoTimingWhileCompilingWhenCompilesShareTheDevice) {
  backend_.slow_compiles = true;
  {
    Tuner tuner(backend_, nullptr, nullptr, fast_options());
    ASSERT_TRUE(tuner.tune_all({problem_, test_problem(512)}).ok());
    EXPECT_GT(backend_.timed_while_compiling, 0) << "the GPU behaviour overlaps them";
  }
  backend_.shares_device = true;
  backend_.timed_while_compiling = 0;
  Tuner tuner(backend_, nullptr, nullptr, fast_options());
  Result<std::vector<TuneReport>> reports = tuner.tune_all({problem_, test_problem(512)});
  ASSERT_TRUE(reports.ok()) << reports.error().describe();
  ASSERT_TRUE((*reports)[0].choice.has_value());
  EXPECT_EQ(backend_.timed_while_compiling, 0);
}

TEST_F(TunerTest, RecordsEverythingAndResumes) {
  std::unique_ptr<TuningStore> store = open_store();
  ASSERT_NE(store, nullptr);
  backend_.behaviors[others_[1].to_string()] = Behavior::WrongResult;
  backend_.times[others_[2].to_string()] = 0.7;
  {
    Tuner tuner(backend_, nullptr, store.get(), fast_options());
    Result<TuneReport> report = tuner.tune(problem_);
    ASSERT_TRUE(report.ok()) << report.error().describe();
    EXPECT_FALSE(report->resumed);
  }
  const DeviceFingerprint fingerprint = backend_.fingerprint();
  const ProblemKey key = ProblemKey::of(problem_);
  Result<std::vector<TuneResult>> rows = store->results(fingerprint, key);
  ASSERT_TRUE(rows.ok()) << rows.error().describe();
  EXPECT_EQ(rows->size(), configs_.size());
  Result<std::optional<TuneChoice>> choice = store->choice(fingerprint, key);
  ASSERT_TRUE(choice.ok()) << choice.error().describe();
  ASSERT_TRUE(choice->has_value());
  EXPECT_EQ((*choice)->config, others_[2]);
  EXPECT_NEAR((*choice)->default_ms, 1.0, 0.01);

  // A second run measures nothing.
  const int compiles = backend_.compiles, launches = backend_.launches;
  Tuner again(backend_, nullptr, store.get(), fast_options());
  Result<TuneReport> resumed = again.tune(problem_);
  ASSERT_TRUE(resumed.ok()) << resumed.error().describe();
  EXPECT_TRUE(resumed->resumed);
  EXPECT_EQ(backend_.compiles, compiles);
  EXPECT_EQ(backend_.launches, launches);
  ASSERT_TRUE(resumed->choice);
  EXPECT_EQ(resumed->choice->config, others_[2]);
  EXPECT_EQ(resumed->result_of(others_[1])->status, TuneStatus::WrongResult);
  EXPECT_NEAR(resumed->default_ms, 1.0, 0.01);

  // Another problem of the same key (same buckets) is resumed too.
  Result<TuneReport> same_bucket = again.tune(test_problem(1000));
  ASSERT_TRUE(same_bucket.ok()) << same_bucket.error().describe();
  EXPECT_TRUE(same_bucket->resumed);

  // resume = false measures everything again.
  TuneOptions fresh = fast_options();
  fresh.resume = false;
  Tuner retune(backend_, nullptr, store.get(), fresh);
  Result<TuneReport> retuned = retune.tune(problem_);
  ASSERT_TRUE(retuned.ok()) << retuned.error().describe();
  EXPECT_FALSE(retuned->resumed);
  EXPECT_EQ(backend_.compiles, compiles + static_cast<int>(configs_.size()));
}

TEST_F(TunerTest, PartialResumeSkipsRecordedConfigs) {
  std::unique_ptr<TuningStore> store = open_store();
  ASSERT_NE(store, nullptr);
  const DeviceFingerprint fingerprint = backend_.fingerprint();
  const ProblemKey key = ProblemKey::of(problem_);
  // A killed earlier run left two rows and no choice.
  TuneResult timed;
  timed.config = others_[0];
  timed.status = TuneStatus::Timed;
  timed.median_ms = timed.min_ms = timed.max_ms = 5.0;
  timed.repetitions = 10;
  ASSERT_TRUE(store->record(fingerprint, key, timed).ok());
  TuneResult broken;
  broken.config = others_[1];
  broken.status = TuneStatus::CompileFailed;
  broken.message = "earlier run";
  ASSERT_TRUE(store->record(fingerprint, key, broken).ok());

  Tuner tuner(backend_, nullptr, store.get(), fast_options());
  Result<TuneReport> report = tuner.tune(problem_);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  EXPECT_FALSE(report->resumed);
  EXPECT_EQ(backend_.compiles, static_cast<int>(configs_.size()) - 2);
  EXPECT_DOUBLE_EQ(report->result_of(others_[0])->median_ms, 5.0);
  EXPECT_EQ(report->result_of(others_[1])->status, TuneStatus::CompileFailed);
  EXPECT_EQ(report->result_of(others_[1])->message, "earlier run");
  ASSERT_TRUE(report->choice);
  EXPECT_EQ(report->choice->config, default_);
  Result<std::optional<TuneChoice>> choice = store->choice(fingerprint, key);
  ASSERT_TRUE(choice.ok() && choice->has_value());
}

TEST_F(TunerTest, StepsCountConfigsAndTheRetime) {
  Tuner tuner(backend_, nullptr, nullptr, fast_options());
  EXPECT_EQ(tuner.steps(problem_), static_cast<int>(configs_.size()) + 1);
}

TEST_F(TunerTest, TuneOnMissServesAndRecordsTheChoice) {
  auto owned = std::make_unique<FakeBackend>();
  owned->times[default_.to_string()] = 1.0;
  owned->times[others_[3].to_string()] = 0.6;
  FakeBackend& backend = *owned;
  RuntimeOptions options;
  options.use_disk_cache = false;
  options.user_db = dir_ / "user.db";
  options.system_dbs = {};
  options.tune_on_miss = true;
  Runtime runtime(std::move(owned), options);
  install_tune_on_miss(runtime, fast_options());

  Result<std::shared_ptr<Kernel>> kernel = runtime.attention(problem_);
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  EXPECT_EQ((*kernel)->config(), others_[3]);
  ASSERT_NE(runtime.user_store(), nullptr);
  Result<std::optional<TuneChoice>> choice =
      runtime.user_store()->choice(backend.fingerprint(), ProblemKey::of(problem_));
  ASSERT_TRUE(choice.ok() && choice->has_value());
  EXPECT_EQ((*choice)->config, others_[3]);

  // The same key again: served from memory, nothing measured.
  const int launches = backend.launches;
  ASSERT_TRUE(runtime.attention(problem_).ok());
  EXPECT_EQ(backend.launches, launches);
}

// The backward pass goes through the same tuner, verified on its gradients: five backward
// configs (the first is the default), one with wrong gradients, one NaN; the fastest correct one
// wins and everything is stored under the backward key, beside the forward's.
TEST_F(TunerTest, BackwardConfigsAreVerifiedOnGradientsTimedAndStored) {
  const AttentionConfig a{64, 128, 8, 2}, b{64, 64, 4, 2};
  const AttentionConfig c{128, 128, 8, 2, KernelFamily::Mma, DqMode::Separate};
  const AttentionConfig wrong{32, 64, 4, 1}, nan{32, 128, 4, 1};
  backend_.backward_configs = {a, b, c, wrong, nan};
  backend_.behaviors[wrong.to_string()] = Behavior::WrongResult;
  backend_.behaviors[nan.to_string()] = Behavior::NaN;
  backend_.times[a.to_string()] = 2.0;
  backend_.times[b.to_string()] = 1.5;
  backend_.times[c.to_string()] = 1.0;
  backend_.times[wrong.to_string()] = 0.1;
  backend_.times[nan.to_string()] = 0.1;
  const AttentionProblem backward = problem_.with_pass(Pass::Backward);

  std::unique_ptr<TuningStore> store = open_store();
  Tuner tuner(backend_, nullptr, store.get(), fast_options());
  Result<std::vector<TuneReport>> reports = tuner.tune_all({problem_, backward});
  ASSERT_TRUE(reports.ok()) << reports.error().describe();
  const TuneReport& report = (*reports)[1];
  EXPECT_EQ(report.key.pass, Pass::Backward);
  ASSERT_TRUE(report.choice.has_value()) << report.note;
  EXPECT_EQ(report.choice->config, c);
  EXPECT_EQ(report.default_config, a);
  EXPECT_EQ(report.result_of(wrong)->status, TuneStatus::WrongResult);
  EXPECT_NE(report.result_of(wrong)->message.find("dq_rel_error"), std::string::npos)
      << report.result_of(wrong)->message;
  EXPECT_EQ(report.result_of(nan)->status, TuneStatus::WrongResult);
  EXPECT_EQ(report.result_of(b)->status, TuneStatus::Timed);
  // The backward's FLOPs are 2.5 times the forward's.
  EXPECT_NEAR(report.result_of(c)->tflops,
              backward.flops() / (report.result_of(c)->median_ms * 1e-3) / 1e12, 1e-9);
  EXPECT_DOUBLE_EQ(backward.flops(), 2.5 * problem_.flops());

  // Stored under its own key: the forward's choice is untouched.
  Result<std::optional<TuneChoice>> choice =
      store->choice(backend_.fingerprint(), ProblemKey::of(backward));
  ASSERT_TRUE(choice.ok() && choice->has_value());
  EXPECT_EQ((*choice)->config, c);
  Result<std::optional<TuneChoice>> forward =
      store->choice(backend_.fingerprint(), ProblemKey::of(problem_));
  ASSERT_TRUE(forward.ok() && forward->has_value());
  EXPECT_EQ((*forward)->config, (*reports)[0].choice->config);
}

// --- On a GPU
// -------------------------------------------------------------------------------------

TEST(TunerGpu, TunesOneSmallProblemEndToEnd) {
  FLASHJIT_REQUIRE_GPU();
  const Backend& backend = *::flashjit::testing::gpu_backend();
  const AttentionProblem problem =
      AttentionProblem::make(4, 16, 16, 1024, 1024, 64, DType::BF16, /*causal=*/false);
  TuneOptions options;
  options.min_time_ms = 30;
  Tuner tuner(backend, nullptr, nullptr, options);
  Result<TuneReport> report = tuner.tune(problem);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  ASSERT_TRUE(report->choice.has_value()) << report->note;
  EXPECT_TRUE(check_config(report->choice->config, problem, backend.device()).ok());
  const TuneResult* chosen = report->result_of(report->choice->config);
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(chosen->status, TuneStatus::Timed);
  EXPECT_GT(chosen->median_ms, 0);
  EXPECT_GT(report->default_ms, 0);
  EXPECT_GE(report->gain(), 1.0);
  for (const TuneResult& result : report->results) {
    // Every legal config of the shipped template should compile, launch and be correct.
    EXPECT_EQ(result.status, TuneStatus::Timed)
        << result.config.to_string() << ": " << result.message;
  }
  std::printf("tuned %s: %s %.4f ms (default %s %.4f ms), gain %.3fx, %.1f s\n",
              problem.to_string().c_str(), report->choice->config.to_string().c_str(),
              report->choice->median_ms, report->default_config.to_string().c_str(),
              report->default_ms, report->gain(), report->seconds);
}

}  // namespace
}  // namespace flashjit
