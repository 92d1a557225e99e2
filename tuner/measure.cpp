#include "tuner/measure.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

namespace flashjit {

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// Linear interpolation between order statistics (values need not be sorted).
double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double position = q * static_cast<double>(values.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(values.size() - 1, below + 1);
  const double fraction = position - static_cast<double>(below);
  return values[below] + fraction * (values[above] - values[below]);
}

double interquartile_range(const std::vector<double>& values) {
  return quantile(values, 0.75) - quantile(values, 0.25);
}

// Warms up for `warmup_ms` and returns the launches per batch that make a batch last `batch_ms`.
Result<int> warm_up(const Backend& backend, const std::function<Status()>& work, double warmup_ms,
                    double batch_ms) {
  // The first launch may be slow (module upload, clocks): estimate again from each batch until
  // warmup_ms of device time has passed.
  Result<double> first = backend.time_ms(work, 1);
  if (!first.ok()) return first.error();
  double per_launch = std::max(first.value(), 1e-4);
  double warmed_ms = first.value();
  // One launch that already lasts the warm-up and two batches (a CPU kernel on a large problem:
  // 0.1-1 s) is warm-up enough: a batch is one launch either way, and a second untimed launch
  // would cost as much as a sample.
  if (warmed_ms >= warmup_ms && per_launch >= 2 * batch_ms) return 1;
  for (int round = 0; round < 8 && (round == 0 || warmed_ms < warmup_ms); ++round) {
    const int reps = static_cast<int>(
        std::clamp(std::ceil(std::max(warmup_ms - warmed_ms, per_launch) / per_launch), 1.0,
                   double{kMaxBatchReps}));
    Result<double> warm = backend.time_ms(work, reps);
    if (!warm.ok()) return warm.error();
    per_launch = std::max(warm.value(), 1e-4);
    warmed_ms += warm.value() * reps;
  }
  return static_cast<int>(
      std::clamp(std::round(batch_ms / per_launch), 1.0, double{kMaxBatchReps}));
}

QuietTimer::QuietTimer(const Backend& backend, double max_share, double budget_ms, double rewarm_ms)
    : backend_(backend),
      probe_(backend.disturbance_probe()),
      max_share_(max_share),
      budget_ms_(budget_ms),
      rewarm_ms_(rewarm_ms) {}

Result<double> QuietTimer::time_ms(const std::function<Status()>& work, int repetitions) {
  constexpr double kFirstBackoffMs = 10, kLongestBackoffMs = 160;
  for (;;) {
    if (probe_ && !gave_up_) probe_->start();
    Result<double> ms = backend_.time_ms(work, repetitions);
    if (!ms.ok() || !probe_ || gave_up_) return ms;
    const double share = probe_->disturbed_share();
    if (share <= max_share_) {
      backoff_ms_ = 0;
      return ms;
    }
    ++discarded_;
    worst_share_ = std::max(worst_share_, share);
    backoff_ms_ = std::clamp(2 * backoff_ms_, kFirstBackoffMs, kLongestBackoffMs);
    if (waited_ms_ + backoff_ms_ > budget_ms_) {
      gave_up_ = true;  // this batch stands; the caller reports the timings disturbed
      return ms;
    }
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(backoff_ms_));
    waited_ms_ += backoff_ms_;
    // The cores went idle during the sleep: untimed launches for rewarm_ms first (at the
    // disturbed batch's time per launch, which errs short). Without them, on a 2-core VM after
    // a load the pool's two threads woke on one core and stayed there through the short batches
    // between sleeps: every batch 2x slow and disturbed until the budget ran out.
    const int rewarm = static_cast<int>(
        std::clamp(std::ceil(rewarm_ms_ / std::max(ms.value(), 1e-4)), 1.0, double{kMaxBatchReps}));
    Result<double> warm = backend_.time_ms(work, std::max(rewarm, repetitions));
    if (!warm.ok()) return warm;
  }
}

}  // namespace flashjit
