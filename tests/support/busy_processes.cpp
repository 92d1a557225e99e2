#include "support/busy_processes.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <thread>
#include <vector>

namespace flashjit::testing_load {
namespace {

double now_seconds() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe: the forked child uses it
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

}  // namespace

BusyProcesses::BusyProcesses(int count, double seconds) {
  for (int i = 0; i < count; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {  // the child of a threaded parent: only async-signal-safe calls
      const double end = now_seconds() + seconds;
      volatile unsigned long spins = 0;
      while (now_seconds() < end) spins = spins + 1;
      _exit(0);
    }
    if (pid > 0) pids_.push_back(pid);
  }
}

void BusyProcesses::stop() {
  for (pid_t pid : pids_) kill(pid, SIGKILL);
  for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  pids_.clear();
}

void spin_threads(int threads, double ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
  auto spin = [end] {
    volatile unsigned long spins = 0;
    while (std::chrono::steady_clock::now() < end) spins = spins + 1;
  };
  std::vector<std::thread> others;
  for (int t = 1; t < threads; ++t) others.emplace_back(spin);
  spin();
  for (std::thread& thread : others) thread.join();
}

}  // namespace flashjit::testing_load
