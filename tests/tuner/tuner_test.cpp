// The tuner's logic over a fake backend (no GPU): failure statuses, the noise rule, resume and
// shared compiles; and one end-to-end tune on a real GPU (skipped without one).
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

#include "support/gpu.hpp"
#include "tuner/reference.hpp"
#include "tuner/supervisor.hpp"

namespace flashjit {
namespace {

namespace fs = std::filesystem;

// Crash: the launch kills the process (as a CPU kernel's segfault would).
enum class Behavior { Good, CompileFails, LaunchFails, WrongResult, NaN, Crash };

class FakeBackend;

class FakeKernel final : public Kernel {
 public:
  FakeKernel(const FakeBackend& backend, ProblemSignature signature, AttentionConfig config)
      : backend_(backend), signature_(signature), config_(config) {}
  const ProblemSignature& signature() const override { return signature_; }
  const AttentionConfig& config() const override { return config_; }
  const KernelInfo& info() const override { return info_; }
  Status launch(const AttentionProblem& problem, const AttentionArgs& args,
                void* stream) const override;

 private:
  const FakeBackend& backend_;
  ProblemSignature signature_;
  AttentionConfig config_;
  KernelInfo info_;
};

class FakeBackend final : public CudaTemplateBackend {
 public:
  FakeBackend() : device_(known_device("sm90").value()) {
    device_.l2_bytes = 1 << 20;  // small, so that the timing sets stay small
  }

  std::string name() const override { return "fake"; }
  const DeviceSpec& device() const override { return device_; }
  std::string compiler_fingerprint() const override { return "fake 1.0 sm_90"; }
  DeviceFingerprint fingerprint() const override {
    DeviceFingerprint fingerprint;
    fingerprint.backend = "fake";
    fingerprint.name = "Fake GPU";
    fingerprint.arch = 90;
    fingerprint.compiler = "fake 1.0";
    return fingerprint;
  }

  Result<KernelSource> render(const AttentionProblem& problem,
                              const AttentionConfig& config) const override {
    KernelSource source;
    source.entries = {"fake_entry"};
    source.label = config.to_string();
    source.text = "d" + std::to_string(problem.head_dim) + " " + to_string(problem.dtype) +
                  (problem.causal ? " causal " : " ") + config.to_string();
    return source;
  }
  Result<Binary> compile(const KernelSource& source) const override {
    ++compiles;
    ++compiling;
    if (slow_compiles) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    --compiling;
    if (behavior(AttentionConfig::parse(source.label).value()) == Behavior::CompileFails) {
      return make_error(ErrorCode::CompileFailed, "fake compile failure");
    }
    Binary binary;
    binary.bytes.assign(source.text.begin(), source.text.end());
    return binary;
  }
  Result<std::shared_ptr<Kernel>> load(const Binary&, const KernelSource&,
                                       const ProblemSignature& signature,
                                       const AttentionConfig& config) const override {
    return std::shared_ptr<Kernel>(std::make_shared<FakeKernel>(*this, signature, config));
  }

  Result<DeviceBuffer> allocate(size_t bytes) const override {
    char* memory = new char[bytes];
    return DeviceBuffer(memory, bytes, [](void* p) { delete[] static_cast<char*>(p); });
  }
  Status copy_to_device(void* dst, const void* src, size_t bytes) const override {
    std::memcpy(dst, src, bytes);
    return ok_status();
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) const override {
    std::memcpy(dst, src, bytes);
    return ok_status();
  }
  Status fill_bytes(void* dst, uint8_t value, size_t bytes) const override {
    std::memset(dst, value, bytes);
    return ok_status();
  }
  Status synchronize() const override {
    if (device_lost) return make_error(ErrorCode::LaunchFailed, "fake: illegal address");
    return ok_status();
  }
  bool compiles_share_the_device() const override { return shares_device; }
  Result<double> time_ms(const std::function<Status()>& work, int repetitions) const override {
    EXPECT_GE(repetitions, 1);
    if (compiling > 0) ++timed_while_compiling;
    FLASHJIT_TRY(work());
    ++timed_batches;
    auto found = times.find(last_launched.to_string());
    const double base = found != times.end() ? found->second : default_ms;
    // Each config's samples alternate above and below its base: the spread is 2 * jitter.
    const double sign = (sample_counters[last_launched.to_string()]++ % 2 == 0) ? 1.0 : -1.0;
    // Another job on the device: a factor by the number of batches timed so far.
    const double disturbed = disturbance ? disturbance(timed_batches.load()) : 1.0;
    return base * (1.0 + sign * jitter) * disturbed;
  }

  // A backward config space of the test's choosing (the first is the default), instead of the
  // CUDA template's, when not empty.
  std::vector<AttentionConfig> backward_configs;
  std::vector<AttentionConfig> legal_configs(const AttentionProblem& problem) const override {
    if (problem.is_backward() && !backward_configs.empty()) return backward_configs;
    return CudaTemplateBackend::legal_configs(problem);
  }
  Result<AttentionConfig> default_config(const AttentionProblem& problem) const override {
    if (problem.is_backward() && !backward_configs.empty()) return backward_configs.front();
    return CudaTemplateBackend::default_config(problem);
  }
  Status check_config(const AttentionConfig& config,
                      const AttentionProblem& problem) const override {
    if (problem.is_backward() && !backward_configs.empty()) {
      if (std::find(backward_configs.begin(), backward_configs.end(), config) !=
          backward_configs.end())
        return ok_status();
      return make_error(ErrorCode::InvalidArgument, config.to_string() + ": not in the fake's set");
    }
    return CudaTemplateBackend::check_config(config, problem);
  }

  Behavior behavior(const AttentionConfig& config) const {
    auto found = behaviors.find(config.to_string());
    return found == behaviors.end() ? Behavior::Good : found->second;
  }

  std::map<std::string, Behavior> behaviors;  // by config.to_string()
  std::map<std::string, double> times;        // ms per launch, by config.to_string()
  double default_ms = 2.0;                    // configs not in `times`
  double jitter = 0.001;
  bool device_lost_after_launch_failure = false;
  bool shares_device = false;  // compiles_share_the_device(), as the CPU backend's
  bool slow_compiles = false;
  std::function<double(int)> disturbance;  // factor on every time, by batches timed so far

  mutable std::atomic<int> compiling{0};
  mutable std::atomic<int> timed_while_compiling{0};

  mutable bool device_lost = false;
  mutable AttentionConfig last_launched;
  mutable std::atomic<int> compiles{0};
  mutable std::atomic<int> launches{0};
  mutable std::atomic<int> timed_batches{0};
  mutable std::map<std::string, int> sample_counters;

 private:
  DeviceSpec device_;
};

Status FakeKernel::launch(const AttentionProblem& problem, const AttentionArgs& args, void*) const {
  ++backend_.launches;
  const Behavior behavior = backend_.behavior(config_);
  if (behavior == Behavior::Crash) std::abort();
  if (behavior == Behavior::LaunchFails) {
    if (backend_.device_lost_after_launch_failure) backend_.device_lost = true;
    return make_error(ErrorCode::LaunchFailed, "fake launch failure");
  }
  backend_.last_launched = config_;
  // Small problems (the verification launch) are computed; timing launches do nothing.
  if (problem.batch * problem.heads_q * problem.seqlen_q * problem.seqlen_k > 1000000) {
    return ok_status();
  }
  HostInputs inputs;
  auto read = [](const void* pointer, int64_t elements) {
    const uint16_t* bits = static_cast<const uint16_t*>(pointer);
    return std::vector<uint16_t>(bits, bits + elements);
  };
  inputs.q = read(args.q, problem.q_span());
  inputs.k = read(args.k, problem.kv_span());
  inputs.v = read(args.v, problem.kv_span());
  if (problem.is_backward()) {
    inputs.o = read(args.o, problem.o_span());
    inputs.d_o = read(args.d_o, problem.do_span());
    inputs.lse.assign(args.lse, args.lse + problem.lse_elements());
  }
  const Reference reference = reference_attention(problem, inputs);
  // Writes a dense [batch, seqlen, heads, d] reference through `strides` (the fake's results).
  auto write = [&](void* out, const std::vector<double>& dense, const Strides& strides,
                   int64_t seqlen, int64_t heads) {
    size_t index = 0;
    for (int64_t b = 0; b < problem.batch; ++b)
      for (int64_t s = 0; s < seqlen; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int c = 0; c < problem.head_dim; ++c, ++index) {
            double value = dense[index];
            if (behavior == Behavior::WrongResult) value += 0.25;
            if (behavior == Behavior::NaN && index == 7) value = std::nan("");
            static_cast<uint16_t*>(
                out)[b * strides.batch + s * strides.seq + h * strides.head + c] =
                float_to_half(static_cast<float>(value), problem.dtype);
          }
  };
  if (problem.is_backward()) {
    write(args.dq, reference.dq, problem.dq_strides, problem.seqlen_q, problem.heads_q);
    write(args.dk, reference.dk, problem.dk_strides, problem.seqlen_k, problem.heads_kv);
    write(args.dv, reference.dv, problem.dv_strides, problem.seqlen_k, problem.heads_kv);
    return ok_status();
  }
  uint16_t* o = static_cast<uint16_t*>(args.o);
  size_t index = 0;  // reference.o is dense [b, s, h, d]
  for (int64_t b = 0; b < problem.batch; ++b) {
    for (int64_t s = 0; s < problem.seqlen_q; ++s) {
      for (int64_t h = 0; h < problem.heads_q; ++h) {
        const int64_t base =
            b * problem.o_strides.batch + s * problem.o_strides.seq + h * problem.o_strides.head;
        for (int c = 0; c < problem.head_dim; ++c, ++index) {
          double value = reference.o[index];
          if (behavior == Behavior::WrongResult) value += 0.25;
          if (behavior == Behavior::NaN && index == 7) value = std::nan("");
          o[base + c] = float_to_half(static_cast<float>(value), problem.dtype);
        }
      }
    }
  }
  if (args.lse != nullptr) {
    for (size_t row = 0; row < reference.lse.size(); ++row) {
      args.lse[row] = static_cast<float>(reference.lse[row]);
    }
  }
  return ok_status();
}

// Fast settings: the fake's times are exact, so few samples do.
TuneOptions fast_options() {
  TuneOptions options;
  options.warmup_ms = 1;
  options.min_time_ms = 20;
  options.min_samples = 5;
  options.max_samples = 20;
  options.max_compile_threads = 2;
  return options;
}

AttentionProblem test_problem(int64_t seqlen = 1024, int head_dim = 64, bool causal = false) {
  return AttentionProblem::make(2, 4, 4, seqlen, seqlen, head_dim, DType::BF16, causal);
}

class TunerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    problem_ = test_problem();
    configs_ = legal_configs(problem_, backend_.device());
    default_ = default_config(problem_, backend_.device()).value();
    ASSERT_GE(configs_.size(), 6u) << "the tests need several legal configs";
    for (const AttentionConfig& config : configs_) {
      if (config != default_) others_.push_back(config);
    }
    backend_.times[default_.to_string()] = 1.0;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("flashjit-tuner-test-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::unique_ptr<TuningStore> open_store() {
    auto store = TuningStore::open(dir_ / "tuning.db");
    EXPECT_TRUE(store.ok()) << store.error().describe();
    return store.ok() ? std::move(store.value()) : nullptr;
  }

  FakeBackend backend_;
  AttentionProblem problem_;
  std::vector<AttentionConfig> configs_;
  AttentionConfig default_;
  std::vector<AttentionConfig> others_;  // legal configs but the default
  fs::path dir_;
};

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

// The config whose launch left the device unusable is in the store as failed, so that the run
// resumed in a new process (tuner/supervisor.hpp) does not launch it again.
TEST_F(TunerTest, LostDeviceRecordsTheConfigThatLostIt) {
  std::unique_ptr<TuningStore> store = open_store();
  ASSERT_NE(store, nullptr);
  backend_.behaviors[others_[0].to_string()] = Behavior::LaunchFails;
  backend_.device_lost_after_launch_failure = true;
  {
    Tuner tuner(backend_, nullptr, store.get(), fast_options());
    ASSERT_FALSE(tuner.tune(problem_).ok());
  }
  Result<std::vector<TuneResult>> rows =
      store->results(backend_.fingerprint(), ProblemKey::of(problem_));
  ASSERT_TRUE(rows.ok());
  bool found = false;
  for (const TuneResult& row : *rows) {
    if (row.config != others_[0]) continue;
    found = true;
    EXPECT_EQ(row.status, TuneStatus::LaunchFailed);
    EXPECT_NE(row.message.find("unusable"), std::string::npos) << row.message;
  }
  EXPECT_TRUE(found) << "the config that lost the device is not recorded";

  // A new process (a fresh backend) resumes without launching it.
  backend_.device_lost = false;
  backend_.device_lost_after_launch_failure = false;
  const int launches = backend_.launches;
  Tuner again(backend_, nullptr, store.get(), fast_options());
  Result<TuneReport> report = again.tune(problem_);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  EXPECT_EQ(report->result_of(others_[0])->status, TuneStatus::LaunchFailed);
  EXPECT_GT(backend_.launches, launches);
}

// The worker side of SupervisedRunSurvivesAKernelThatKillsItsProcess: runs only when that test
// starts this program as its worker (FLASHJIT_TUNER_TEST_DB set).
TEST(TunerWorker, TunesIntoTheStoreItIsGiven) {
  const char* db = std::getenv("FLASHJIT_TUNER_TEST_DB");
  const char* crash = std::getenv("FLASHJIT_TUNER_TEST_CRASH");
  if (db == nullptr || crash == nullptr) GTEST_SKIP() << "the worker of a supervisor test";
  FakeBackend backend;
  backend.behaviors[crash] = Behavior::Crash;
  TuneOptions options = fast_options();
  ASSERT_TRUE(apply_worker_environment(options)) << "not started as a tuning worker";
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open(db);
  ASSERT_TRUE(store.ok()) << store.error().describe();
  Tuner tuner(backend, nullptr, store->get(), options);
  Result<TuneReport> report = tuner.tune(test_problem());
  ASSERT_TRUE(report.ok()) << report.error().describe();
  ASSERT_TRUE(report->choice);
}

// A kernel that kills its process (here: abort() in a launch) does not end the run: the
// supervisor records it as failed and a new worker finishes the problem from the store.
TEST_F(TunerTest, SupervisedRunSurvivesAKernelThatKillsItsProcess) {
  const std::string crash = others_[1].to_string();
  const fs::path db = dir_ / "tuning.db";
  setenv("FLASHJIT_TUNER_TEST_DB", db.c_str(), 1);
  setenv("FLASHJIT_TUNER_TEST_CRASH", crash.c_str(), 1);
  SupervisedRun run;
  run.argv = {"/proc/self/exe", "--gtest_filter=TunerWorker.TunesIntoTheStoreItIsGiven"};
  std::vector<std::string> messages;
  run.on_message = [&](const std::string& m) { messages.push_back(m); };
  Result<int> status = run_supervised(run);
  unsetenv("FLASHJIT_TUNER_TEST_DB");
  unsetenv("FLASHJIT_TUNER_TEST_CRASH");
  ASSERT_TRUE(status.ok()) << status.error().describe();
  EXPECT_EQ(*status, 0) << "the second worker did not finish";
  ASSERT_EQ(messages.size(), 1u) << "one worker died, once";
  EXPECT_NE(messages[0].find("killed by signal " + std::to_string(SIGABRT)), std::string::npos)
      << messages[0];
  EXPECT_NE(messages[0].find(crash), std::string::npos) << messages[0];

  std::unique_ptr<TuningStore> store = open_store();
  ASSERT_NE(store, nullptr);
  const ProblemKey key = ProblemKey::of(test_problem());
  Result<std::vector<TuneResult>> rows = store->results(backend_.fingerprint(), key);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->size(), configs_.size()) << "a finished result was lost";
  for (const TuneResult& row : *rows) {
    if (row.config.to_string() == crash) {
      EXPECT_EQ(row.status, TuneStatus::LaunchFailed);
      EXPECT_NE(row.message.find("died"), std::string::npos) << row.message;
    } else {
      EXPECT_NE(row.status, TuneStatus::LaunchFailed) << row.config.to_string();
    }
  }
  Result<std::optional<TuneChoice>> choice = store->choice(backend_.fingerprint(), key);
  ASSERT_TRUE(choice.ok() && choice->has_value());
  EXPECT_NE((*choice)->config.to_string(), crash);

  // A worker that dies with nothing in flight is not restarted forever.
  SupervisedRun broken;
  broken.argv = {"/bin/sh", "-c", "kill -9 $$"};
  broken.on_message = [](const std::string&) {};
  Result<int> gave_up = run_supervised(broken);
  ASSERT_FALSE(gave_up.ok());
  EXPECT_NE(gave_up.error().message.find("no config in flight"), std::string::npos)
      << gave_up.error().message;
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

// The default is timed first and again in the re-time; a neighbour that slowed the first pass's
// default down makes them disagree: the re-time runs again, agrees with itself, and the decision
// comes from the quiet re-time (no 3x "gain" from the disturbed first measurement).
TEST_F(TunerTest, DisturbedFirstPassIsRetimedAndDecidedOnQuietTimings) {
  backend_.times[others_[0].to_string()] = 0.9;  // a real 10% win
  int default_batches = -1;
  backend_.disturbance = [&](int batch) {
    if (default_batches < 0 && backend_.last_launched == default_) return 3.0;  // first pass
    if (default_batches < 0) default_batches = batch;
    return 1.0;
  };
  TuneOptions options = fast_options();
  int retimes = 0;
  options.on_progress = [&](const TuneProgress& p) {
    if (p.phase == TuneProgress::Phase::Retiming) ++retimes;
  };
  std::vector<std::string> messages;
  options.on_message = [&](const std::string& m) { messages.push_back(m); };
  options.lock_dir = (dir_ / "locks").string();
  Tuner tuner(backend_, nullptr, nullptr, options);
  Result<TuneReport> report = tuner.tune(problem_);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  EXPECT_EQ(retimes, 2) << "the disagreeing default was not re-timed again";
  EXPECT_FALSE(report->disturbed) << report->note;
  ASSERT_TRUE(report->choice);
  EXPECT_EQ(report->choice->config, others_[0]);
  EXPECT_NEAR(report->default_ms, 1.0, 0.01) << "the decision used the disturbed first pass";
  EXPECT_NEAR(report->gain(), 1.0 / 0.9, 0.02);
  EXPECT_TRUE(messages.empty()) << messages.front();
}

// A device that never settles (every batch 3% slower than the last): no choice is taken from the
// noise. Without a stored choice the default is stored; with one, it stays. The disturbed rows
// are measured again by the next run.
TEST_F(TunerTest, UnstableTimingsKeepThePreviousChoice) {
  std::unique_ptr<TuningStore> store = open_store();
  ASSERT_NE(store, nullptr);
  backend_.times[others_[0].to_string()] = 0.8;
  TuneOptions options = fast_options();
  options.lock_dir = (dir_ / "locks").string();
  std::vector<std::string> messages;
  options.on_message = [&](const std::string& m) { messages.push_back(m); };
  options.resume = false;
  const ProblemKey key = ProblemKey::of(problem_);
  const DeviceFingerprint fingerprint = backend_.fingerprint();

  backend_.disturbance = [](int batch) { return std::pow(1.03, batch); };
  {
    Tuner tuner(backend_, nullptr, store.get(), options);
    Result<TuneReport> report = tuner.tune(problem_);
    ASSERT_TRUE(report.ok()) << report.error().describe();
    EXPECT_TRUE(report->disturbed);
    EXPECT_NE(report->note.find("timings unstable"), std::string::npos) << report->note;
    EXPECT_NE(report->note.find("the default is stored"), std::string::npos) << report->note;
    ASSERT_TRUE(report->choice);
    EXPECT_EQ(report->choice->config, default_) << "a choice taken from noise";
    Result<std::optional<TuneChoice>> stored = store->choice(fingerprint, key);
    ASSERT_TRUE(stored.ok() && stored->has_value());
    EXPECT_EQ((*stored)->config, default_) << "a choice from unstable timings was stored";
    Result<std::vector<TuneResult>> rows = store->results(fingerprint, key);
    ASSERT_TRUE(rows.ok());
    EXPECT_EQ(rows->size(), configs_.size()) << "the measured results are kept";
    int marked = 0;
    for (const TuneResult& row : *rows)
      marked += row.message.find("disturbed") != std::string::npos;
    EXPECT_GE(marked, 2);
    ASSERT_FALSE(messages.empty());
    EXPECT_NE(messages.back().find("timings unstable"), std::string::npos);
  }

  // A quiet run (resuming) measures the disturbed rows again and stores others_[0]; an unstable
  // run later keeps it.
  backend_.disturbance = nullptr;
  {
    TuneOptions resuming = options;
    resuming.resume = true;
    const int batches = backend_.timed_batches;
    Tuner tuner(backend_, nullptr, store.get(), resuming);
    Result<TuneReport> report = tuner.tune(problem_);
    ASSERT_TRUE(report.ok()) << report.error().describe();
    EXPECT_FALSE(report->disturbed) << report->note;
    EXPECT_FALSE(report->resumed) << "disturbed rows were taken as measured";
    EXPECT_GT(backend_.timed_batches, batches);
    ASSERT_TRUE(report->choice);
    EXPECT_EQ(report->choice->config, others_[0]);
  }
  backend_.times[others_[1].to_string()] = 0.5;  // what a disturbed run might think
  const int start = backend_.timed_batches;
  backend_.disturbance = [start](int batch) { return std::pow(1.03, batch - start); };
  {
    Tuner tuner(backend_, nullptr, store.get(), options);
    Result<TuneReport> report = tuner.tune(problem_);
    ASSERT_TRUE(report.ok()) << report.error().describe();
    EXPECT_TRUE(report->disturbed);
    ASSERT_TRUE(report->choice);
    EXPECT_EQ(report->choice->config, others_[0]) << "the stored choice was not kept";
    Result<std::optional<TuneChoice>> stored = store->choice(fingerprint, key);
    ASSERT_TRUE(stored.ok() && stored->has_value());
    EXPECT_EQ((*stored)->config, others_[0]);
  }
}

// Two tuners on one device take turns: the second waits while the first holds the device (here
// the test holds it) and says so.
TEST_F(TunerTest, TimingWaitsForTheDeviceAndSaysWhoHoldsIt) {
  const fs::path locks = dir_ / "locks";
  Result<DeviceLock> lock = DeviceLock::open(locks, backend_.timing_device_id());
  ASSERT_TRUE(lock.ok()) << lock.error().describe();
  Result<DeviceLock::Guard> held = lock->acquire();
  ASSERT_TRUE(held.ok() && held->held());

  TuneOptions options = fast_options();
  options.lock_dir = locks.string();
  std::mutex mutex;
  std::vector<std::string> messages;
  options.on_message = [&](const std::string& m) {
    std::lock_guard<std::mutex> guard(mutex);
    messages.push_back(m);
  };
  std::atomic<bool> done{false};
  std::thread tuning([&] {
    Tuner tuner(backend_, nullptr, nullptr, options);
    Result<TuneReport> report = tuner.tune(problem_);
    EXPECT_TRUE(report.ok());
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done) << "timed while the device was held";
  EXPECT_EQ(backend_.timed_batches, 0);
  held->release();
  tuning.join();
  EXPECT_TRUE(done);
  EXPECT_GT(backend_.timed_batches, 0);
  std::lock_guard<std::mutex> guard(mutex);
  ASSERT_FALSE(messages.empty());
  EXPECT_NE(messages.front().find("waiting for " + backend_.timing_device_id()), std::string::npos)
      << messages.front();
  EXPECT_NE(messages.front().find("pid " + std::to_string(getpid())), std::string::npos)
      << messages.front();
}

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
