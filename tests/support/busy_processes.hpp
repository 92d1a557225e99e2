// A load generator for the timing tests: processes that spin on the host's cores beside a
// timing, as other engineers' builds or a starting tuner do on a shared host.
#pragma once

#include <sys/types.h>

#include <vector>

namespace flashjit::testing_load {

class BusyProcesses {
 public:
  // Forks `count` children, each spinning until stop() or for `seconds` at most.
  explicit BusyProcesses(int count, double seconds = 30);
  ~BusyProcesses() { stop(); }
  BusyProcesses(const BusyProcesses&) = delete;
  BusyProcesses& operator=(const BusyProcesses&) = delete;

  // Kills and reaps the children (each by its pid).
  void stop();
  int started() const { return static_cast<int>(pids_.size()); }

 private:
  std::vector<pid_t> pids_;
};

// Spins `threads` threads (the calling one among them) for `ms` milliseconds of wall time.
void spin_threads(int threads, double ms);

}  // namespace flashjit::testing_load
