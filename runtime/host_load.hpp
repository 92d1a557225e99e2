// The host's load as a timing on its cores sees it: the CPU backend's DisturbanceProbe
// (runtime/backend.hpp). What it reads is how long this process's threads waited for a core while
// they could run: the scheduler's run-queue delay of each thread (Linux:
// /proc/self/task/<tid>/schedstat, its second field, in ns; kept by kernels built with
// CONFIG_SCHED_INFO, as Debian's and Ubuntu's are). Elsewhere, or where that file is missing,
// there is no probe (HostLoadProbe::create returns null) and the tuner falls back on its
// disturbance check of repeated medians alone.
//
// Why the run-queue delay rather than the CPU time others used (/proc/stat minus this process's
// own): it is exact per thread (nanoseconds, where /proc/stat counts 10 ms ticks, longer than a
// timed batch of 8 ms), and it counts only what the timing lost: another process running on a
// core while the timing's threads sleep, or on a core they do not use, delays none of them.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>

#include "runtime/backend.hpp"

namespace flashjit {

// What the scheduler says of one thread so far: its run-queue delay and how often it was put on
// a core (each wake-up or return after a preemption).
struct ThreadWaits {
  int64_t delay_ns = 0;
  int64_t slices = 0;
};

// The run-queue delay of each of this process's threads so far, by thread id; empty where the
// host does not say (not Linux, no schedstat).
std::map<long, ThreadWaits> thread_run_delays();

// A wake-up's own latency, not another process's doing (an idle vCPU woken by an IPI: tens of
// microseconds): this much of each slice's delay is not counted as disturbance.
inline constexpr int64_t kWakeupAllowanceNs = 50000;

// The share of `cores` x `wall_ns` that the threads waited for a core between two readings:
// each thread's delay since `before` (a thread not in it, or whose counters went back: a new
// thread reusing an id, from 0) less kWakeupAllowanceNs per slice, at most 1.
double disturbed_share_between(const std::map<long, ThreadWaits>& before,
                               const std::map<long, ThreadWaits>& after, double wall_ns, int cores);

class HostLoadProbe final : public DisturbanceProbe {
 public:
  // `cores`: the cores the timed work runs on (the CPU backend's pool threads). Null where
  // thread_run_delays() has nothing to say.
  static std::unique_ptr<HostLoadProbe> create(int cores);

  void start() override;
  // The threads' run-queue delay since start() (threads started since: all of theirs), less
  // kWakeupAllowanceNs per slice, as a share of the window's wall time times `cores`, at most 1.
  double disturbed_share() override;

 private:
  explicit HostLoadProbe(int cores) : cores_(cores) {}

  int cores_;
  std::map<long, ThreadWaits> start_waits_;
  std::chrono::steady_clock::time_point start_time_;
};

}  // namespace flashjit
