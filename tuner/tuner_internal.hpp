// The tuner's private pieces shared by tuner.cpp (the tuning loop) and tuner_kernels.cpp (the
// compile pool, verification and timing inputs): constants, small helpers and the Slot/Buffers
// state. Not part of the library's interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tuner/measure.hpp"
#include "tuner/tuner.hpp"

namespace flashjit::tuner_detail {

constexpr int64_t kVerifyHeadsKv = 2;
constexpr int64_t kVerifySeqlenQ = 257;
constexpr int64_t kVerifySeqlenK = 300;
constexpr uint64_t kVerifySeed = 0x5EED0001;
constexpr uint64_t kTimingSeed = 0x5EED0002;
constexpr size_t kMaxInputSets = 64;
constexpr int kAbandonAfterSamples = 3;
constexpr int kMinSamplesOfLongLaunches = 3;  // TuneOptions::max_time_ms
constexpr size_t kFallbackL2Bytes = size_t{50} << 20;

inline double tflops_of(const AttentionProblem& problem, double ms) {
  return ms > 0 ? problem.flops() / (ms * 1e-3) / 1e12 : 0;
}

inline std::string signature_key(const AttentionProblem& problem) {
  return ProblemSignature::of(problem).to_string();
}

inline std::string slot_key(const AttentionProblem& problem, const AttentionConfig& config) {
  std::string key = signature_key(problem);
  key += "-";
  key += config.to_string();
  return key;
}

inline TuneResult failed(const AttentionConfig& config, TuneStatus status, std::string message) {
  TuneResult result;
  result.config = config;
  result.status = status;
  result.message = std::move(message);
  return result;
}

// Appends `note` to `message`, separated by "; ".
inline void append_note(std::string& message, const std::string& note) {
  if (note.empty()) return;
  if (!message.empty()) message += "; ";
  message += note;
}

}  // namespace flashjit::tuner_detail

namespace flashjit {

// ---------------------------------------------------------------------------------------------
// State the tuner keeps between problems.

// One problem's tuning: what Tuner::tune_one's phases share.
struct Tuner::ProblemRun {
  explicit ProblemRun(const AttentionProblem& p) : problem(p) {}

  const AttentionProblem& problem;
  TuneReport report;
  std::vector<AttentionConfig> configs;            // legal, in the generator's order
  size_t default_index = 0;                        // of the default in configs
  std::vector<std::optional<TuneResult>> results;  // by config: from the store, or measured
  std::vector<std::vector<double>> samples;        // by config: this run's timed samples
  std::optional<TuneChoice> stored_choice;
  std::vector<AttentionArgs> sets;    // timing inputs, rotated between launches
  double batch_ms = 0;                // the length of one timed batch
  double best_ms = 0;                 // the fastest median so far (the abandon rule's yardstick)
  std::vector<size_t> retimed;        // configs the last re-time measured side by side
  std::unique_ptr<QuietTimer> timer;  // every timed batch of the problem (tuner/measure.hpp)
  // The final comparison of the winner with the default (Tuner::compare_with_default): their
  // samples, taken alternately (default first and last).
  struct Comparison {
    size_t candidate = 0;
    std::vector<double> default_samples, candidate_samples;
    bool failed = false;  // the winner failed to launch: the default stays
  };
  std::optional<Comparison> comparison;
  TuneProgress progress;
};

// One kernel: compiled by a pool thread, then loaded and verified by the tuning thread.
struct Tuner::Slot {
  AttentionProblem problem;  // the first problem that needed it (render input)
  AttentionConfig config;

  bool done = false;  // guarded by Tuner::mutex_; the fields below are the pool's until then
  std::optional<std::string> compile_error;
  KernelSource source;
  Binary binary;

  // Tuning thread only.
  bool load_tried = false;
  std::shared_ptr<Kernel> kernel;
  std::string load_error;
  std::map<int64_t, TuneResult> verified;  // by GQA ratio; status Timed means it passed
};

// Timing inputs: `sets` copies of one call's tensors (tuner/workload.hpp), each at least as large
// as `specs` says (the largest problem of this dtype and pass yet).
struct Tuner::Buffers {
  std::vector<DeviceTensors> sets;
  std::vector<TensorSpec> specs;
  DType dtype = DType::BF16;
  Pass pass = Pass::Forward;
  // The problem (AttentionProblem::to_string) whose index tensors (block table, seqlens_k, ALiBi
  // slopes, cu_seqlens: has_index_tensors) the sets hold; "" when they hold none. Another
  // problem's would point out of its tensors, so they are refilled for each such problem.
  std::string indices_of;
};

}  // namespace flashjit
