// Measuring a kernel's time: the statistics the tuner decides with, a launcher that rotates over
// input sets (so that the inputs are not served from L2), and the warm-up that sizes a batch.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/backend.hpp"

namespace flashjit {

double median_of(std::vector<double> values);
// Linear interpolation between order statistics (values need not be sorted).
double quantile(std::vector<double> values, double q);
double interquartile_range(const std::vector<double>& values);

// Launches `kernel` on the timing sets in turn.
class Rotation {
 public:
  Rotation(const Kernel& kernel, const AttentionProblem& problem,
           const std::vector<AttentionArgs>& sets)
      : kernel_(kernel), problem_(problem), sets_(sets) {}
  Status operator()() {
    const AttentionArgs& args = sets_[next_++ % sets_.size()];
    return kernel_.launch(problem_, args);
  }

 private:
  const Kernel& kernel_;
  const AttentionProblem& problem_;
  const std::vector<AttentionArgs>& sets_;
  size_t next_ = 0;
};

struct Measurement {
  std::vector<double> samples;  // ms per launch, one per batch
  int reps = 1;                 // launches per batch
  bool abandoned = false;
};

// Launches per batch are capped at this.
inline constexpr int kMaxBatchReps = 100000;

// Warms up for `warmup_ms` and returns the launches per batch that make a batch last `batch_ms`
// (1, after that one launch, when the first launch lasts warmup_ms and 2 * batch_ms already).
Result<int> warm_up(const Backend& backend, const std::function<Status()>& work, double warmup_ms,
                    double batch_ms);

// Times batches on a backend that can see other work on its device (Backend::disturbance_probe;
// on others, plain backend.time_ms). A batch during which other work took more than `max_share`
// of the device is discarded and timed again after a back-off (10 ms, doubling up to 160 ms, back
// to 10 after a quiet batch), until the back-offs have used up `budget_ms` (one budget for the
// timer's life: a tuner's problem): from then on the timer takes every batch as it comes and
// gave_up() says that the device never got quiet. After each back-off, untimed launches for
// `rewarm_ms` come before the batch is timed again.
class QuietTimer {
 public:
  QuietTimer(const Backend& backend, double max_share, double budget_ms, double rewarm_ms);
  Result<double> time_ms(const std::function<Status()>& work, int repetitions);

  bool gave_up() const { return gave_up_; }
  int discarded() const { return discarded_; }
  double worst_share() const { return worst_share_; }  // of the discarded batches
  double waited_ms() const { return waited_ms_; }

 private:
  const Backend& backend_;
  std::unique_ptr<DisturbanceProbe> probe_;
  double max_share_;
  double budget_ms_;
  double rewarm_ms_;
  double backoff_ms_ = 0;
  double waited_ms_ = 0;
  int discarded_ = 0;
  double worst_share_ = 0;
  bool gave_up_ = false;
};

}  // namespace flashjit
