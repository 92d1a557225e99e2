#include "tuner/supervisor.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace flashjit {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void say(const SupervisedRun& run, const std::string& text) {
  if (run.on_message) {
    run.on_message(text);
  } else {
    std::cerr << text << std::endl;
  }
}

// The signals a faulting kernel dies of (not an interrupt or a kill from outside).
bool fault_signal(int signal) {
  return signal == SIGSEGV || signal == SIGBUS || signal == SIGILL || signal == SIGFPE ||
         signal == SIGABRT || signal == SIGTRAP || signal == SIGSYS;
}

// Starts argv with `env` added to this process's environment; the child's pid.
Result<pid_t> start(const std::vector<std::string>& argv,
                    const std::vector<std::pair<std::string, std::string>>& env) {
  const pid_t pid = fork();
  if (pid < 0) {
    return make_error(ErrorCode::IoError,
                      std::string("cannot start the tuning worker: fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "flashjit: cannot run the tuning worker %s: %s\n", args[0],
                 std::strerror(errno));
    _exit(127);
  }
  return pid;
}

// The in-flight file as the supervisor last saw it: a change of contents or modification time is
// the worker's heartbeat.
struct Heartbeat {
  std::string contents;
  fs::file_time_type written{};
  std::chrono::steady_clock::time_point seen = std::chrono::steady_clock::now();

  // Seconds the current config has been in flight without a heartbeat (0 with nothing in flight).
  double stalled_seconds(const fs::path& inflight) {
    std::error_code error;
    const fs::file_time_type now_written = fs::last_write_time(inflight, error);
    std::string now_contents = read_all(inflight);
    const auto now = std::chrono::steady_clock::now();
    if (now_contents != contents || (!error && now_written != written)) {
      contents = std::move(now_contents);
      written = now_written;
      seen = now;
    }
    if (contents.empty()) return 0;
    return std::chrono::duration<double>(now - seen).count();
  }
};

// Waits for the worker; kills it when its in-flight config stalls past hang_seconds (> 0).
// The wait status, and whether it was killed for hanging.
Result<std::pair<int, bool>> wait_for(pid_t pid, const fs::path& inflight, double hang_seconds) {
  Heartbeat heartbeat;
  bool hung = false;
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, hang_seconds > 0 ? WNOHANG : 0);
    if (done == pid) return std::make_pair(status, hung);
    if (done < 0 && errno != EINTR) {
      return make_error(ErrorCode::IoError,
                        std::string("waiting for the tuning worker: ") + std::strerror(errno));
    }
    if (done == 0 && !hung && heartbeat.stalled_seconds(inflight) > hang_seconds) {
      hung = true;
      kill(pid, SIGKILL);
    }
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

Result<int> run_supervised(const SupervisedRun& run) {
  if (run.argv.empty()) {
    return make_error(ErrorCode::InvalidArgument, "run_supervised: no worker command");
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/flashjit-tune-XXXXXX";
  const char* made = mkdtemp(pattern.data());
  if (made == nullptr) {
    return make_error(ErrorCode::IoError, std::string("cannot make the tuning worker's folder: ") +
                                              std::strerror(errno));
  }
  const fs::path dir = made;
  const fs::path inflight = dir / "inflight", faults = dir / "faults";
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  } cleanup{dir};

  std::vector<std::pair<std::string, std::string>> env = {
      {"FLASHJIT_TUNE_WORKER", "1"},
      {"FLASHJIT_TUNE_INFLIGHT", inflight.string()},
      {"FLASHJIT_TUNE_FAULTS", faults.string()}};
  if (!run.report_path.empty()) env.push_back({"FLASHJIT_TUNE_REPORT", run.report_path});
  const size_t first_env_size = env.size();
  for (int restarts = 0;; ++restarts) {
    { std::ofstream(inflight, std::ios::trunc); }
    Result<pid_t> pid = start(run.argv, env);
    if (!pid.ok()) return pid.error();
    Result<std::pair<int, bool>> waited = wait_for(*pid, inflight, run.hang_seconds);
    if (!waited.ok()) return waited.error();
    const auto [status, hung] = *waited;
    std::string why;
    if (hung) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", run.hang_seconds);
      why = std::string("hung (no progress for ") + seconds + " s; killed)";
    } else if (WIFSIGNALED(status) && !fault_signal(WTERMSIG(status))) {
      return 128 + WTERMSIG(status);  // interrupted or killed from outside: not a kernel's fault
    } else if (WIFSIGNALED(status)) {
      why = std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
            strsignal(WTERMSIG(status)) + ")";
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == kExitWorkerLost) {
      why = "left its device unusable";
    } else {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    std::string line = read_all(inflight);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (line.empty()) {
      return make_error(ErrorCode::LaunchFailed,
                        "the tuning worker " + why + " with no config in flight: not restarted");
    }
    if (restarts >= run.max_restarts) {
      return make_error(ErrorCode::LaunchFailed,
                        "the tuning worker died " + std::to_string(restarts + 1) +
                            " times; the last " + why + " running " + line);
    }
    std::ofstream(faults, std::ios::app) << line << "\t" << why << "\n";
    const size_t tab = line.find('\t');
    say(run, "flashjit tune: the worker " + why + " while running " + line.substr(tab + 1) +
                 " on " + line.substr(0, tab) + "; recorded as failed, starting a new worker");
    if (env.size() == first_env_size) env.push_back({"FLASHJIT_TUNE_RESUME", "1"});
  }
}

bool apply_worker_environment(TuneOptions& options) {
  const char* worker = std::getenv("FLASHJIT_TUNE_WORKER");
  if (worker == nullptr || std::string(worker) != "1") return false;
  if (const char* path = std::getenv("FLASHJIT_TUNE_INFLIGHT")) options.inflight_path = path;
  if (const char* path = std::getenv("FLASHJIT_TUNE_FAULTS")) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      TuneOptions::Fault fault;
      if (std::getline(fields, fault.key, '\t') && std::getline(fields, fault.config, '\t')) {
        std::getline(fields, fault.why);
        options.faulted.push_back(std::move(fault));
      }
    }
  }
  if (const char* resume = std::getenv("FLASHJIT_TUNE_RESUME");
      resume && std::string(resume) == "1")
    options.resume = true;
  return true;
}

}  // namespace flashjit
