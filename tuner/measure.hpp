// Measuring a kernel's time: the statistics the tuner decides with, a launcher that rotates over
// input sets (so that the inputs are not served from L2), and the warm-up that sizes a batch.
#pragma once

#include <functional>
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

}  // namespace flashjit
