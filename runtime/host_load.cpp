#include "runtime/host_load.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#if defined(__linux__)
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#endif

namespace flashjit {

std::map<long, int64_t> thread_run_delays_ns() {
  std::map<long, int64_t> delays;
#if defined(__linux__)
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return delays;
  while (const dirent* entry = readdir(tasks)) {
    char* end = nullptr;
    const long tid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;  // "." and ".."
    // "<ns on a cpu> <ns waiting on a run queue> <timeslices>"
    const std::string path = std::string("/proc/self/task/") + entry->d_name + "/schedstat";
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // the thread ended meanwhile, or no CONFIG_SCHED_INFO
    char text[128];
    const ssize_t got = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (got <= 0) continue;
    text[got] = '\0';
    const char* cursor = text;
    std::strtoll(cursor, &end, 10);  // time on a cpu
    if (end == cursor) continue;
    cursor = end;
    const long long waited = std::strtoll(cursor, &end, 10);
    if (end == cursor) continue;
    delays[tid] = waited;
  }
  closedir(tasks);
#endif
  return delays;
}

std::unique_ptr<HostLoadProbe> HostLoadProbe::create(int cores) {
  if (thread_run_delays_ns().empty()) return nullptr;
  return std::unique_ptr<HostLoadProbe>(new HostLoadProbe(std::max(1, cores)));
}

void HostLoadProbe::start() {
  start_delays_ = thread_run_delays_ns();
  start_time_ = std::chrono::steady_clock::now();
}

double HostLoadProbe::disturbed_share() {
  const double wall_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start_time_)
          .count();
  int64_t waited = 0;
  for (const auto& [tid, delay] : thread_run_delays_ns()) {
    auto before = start_delays_.find(tid);
    // A thread id reused by a new thread since start() counts from 0.
    const int64_t from =
        before == start_delays_.end() || before->second > delay ? 0 : before->second;
    waited += delay - from;
  }
  if (wall_ns <= 0) return 0;
  return std::min(1.0, static_cast<double>(waited) / (wall_ns * cores_));
}

}  // namespace flashjit
