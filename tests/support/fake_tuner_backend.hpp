// A fake GPU backend for the tuner's tests (tests/tuner/*): the "device" is host memory; a fake
// kernel computes attention with the fp64 reference for small problems (the verification launch)
// and does nothing for large ones; the fake time_ms runs the work once (to surface launch errors)
// and returns a per-config time with a chosen jitter and disturbance, so that the decision rules
// can be tested exactly. Also the fast tuner options and the TunerTest fixture.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/tuning_store.hpp"
#include "support/gpu.hpp"
#include "tuner/reference.hpp"
#include "tuner/tuner.hpp"

namespace flashjit::testing_fake {

namespace fs = std::filesystem;

// Crash: the launch kills the process (as a CPU kernel's segfault would); Hang: the launch never
// returns (as a kernel stuck in a spin loop).
enum class Behavior { Good, CompileFails, LaunchFails, WrongResult, NaN, Crash, Hang };

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
  // With `busy` set, a probe that says `busy(batches timed so far)` of the device was taken by
  // other work during each batch (as the CPU backend's host-load probe does).
  std::unique_ptr<DisturbanceProbe> disturbance_probe() const override {
    struct Probe final : DisturbanceProbe {
      explicit Probe(const FakeBackend& backend) : backend(backend) {}
      void start() override {}
      double disturbed_share() override { return backend.busy(backend.timed_batches.load()); }
      const FakeBackend& backend;
    };
    if (!busy) return nullptr;
    return std::make_unique<Probe>(*this);
  }
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
  std::function<double(int)> busy;         // the probe's share, by batches timed so far

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

inline Status FakeKernel::launch(const AttentionProblem& problem, const AttentionArgs& args,
                                 void*) const {
  ++backend_.launches;
  const Behavior behavior = backend_.behavior(config_);
  if (behavior == Behavior::Crash) std::abort();
  while (behavior == Behavior::Hang) std::this_thread::sleep_for(std::chrono::seconds(1));
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
inline TuneOptions fast_options() {
  TuneOptions options;
  options.warmup_ms = 1;
  options.min_time_ms = 20;
  options.min_samples = 5;
  options.max_samples = 20;
  options.max_compile_threads = 2;
  return options;
}

inline AttentionProblem test_problem(int64_t seqlen = 1024, int head_dim = 64,
                                     bool causal = false) {
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

}  // namespace flashjit::testing_fake
