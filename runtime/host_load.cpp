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

std::map<long, ThreadWaits> thread_run_delays() {
  std::map<long, ThreadWaits> waits;
#if defined(__linux__)
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return waits;
  while (const dirent* entry = readdir(tasks)) {
    char* end = nullptr;
    const long tid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;  // "." and ".."
    // "<ns on a cpu> <ns waiting on a run queue> <slices on a cpu>"
    const std::string path = std::string("/proc/self/task/") + entry->d_name + "/schedstat";
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // the thread ended meanwhile, or no CONFIG_SCHED_INFO
    char text[128];
    const ssize_t got = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (got <= 0) continue;
    text[got] = '\0';
    long long fields[3];
    const char* cursor = text;
    bool parsed = true;
    for (long long& field : fields) {
      field = std::strtoll(cursor, &end, 10);
      parsed = parsed && end != cursor;
      cursor = end;
    }
    if (parsed) waits[tid] = ThreadWaits{fields[1], fields[2]};
  }
  closedir(tasks);
#endif
  return waits;
}

std::unique_ptr<HostLoadProbe> HostLoadProbe::create(int cores) {
  if (thread_run_delays().empty()) return nullptr;
  return std::unique_ptr<HostLoadProbe>(new HostLoadProbe(std::max(1, cores)));
}

void HostLoadProbe::start() {
  start_waits_ = thread_run_delays();
  start_time_ = std::chrono::steady_clock::now();
}

double disturbed_share_between(const std::map<long, ThreadWaits>& before,
                               const std::map<long, ThreadWaits>& after, double wall_ns,
                               int cores) {
  int64_t waited = 0;
  for (const auto& [tid, now] : after) {
    auto then = before.find(tid);
    const bool same = then != before.end() && then->second.delay_ns <= now.delay_ns &&
                      then->second.slices <= now.slices;
    const ThreadWaits from = same ? then->second : ThreadWaits{};
    const int64_t slices = now.slices - from.slices;
    waited += std::max<int64_t>(0, now.delay_ns - from.delay_ns - slices * kWakeupAllowanceNs);
  }
  if (wall_ns <= 0 || cores < 1) return 0;
  return std::min(1.0, static_cast<double>(waited) / (wall_ns * cores));
}

double HostLoadProbe::disturbed_share() {
  const double wall_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start_time_)
          .count();
  return disturbed_share_between(start_waits_, thread_run_delays(), wall_ns, cores_);
}

}  // namespace flashjit
