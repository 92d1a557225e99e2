#include "runtime/subprocess.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

extern char** environ;

namespace flashjit {
namespace {

// Closes a file descriptor on every path out of run_process.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

Error io_error(const std::string& what) {
  return make_error(ErrorCode::IoError, what + ": " + std::strerror(errno));
}

// Owns the spawn attributes and file actions.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attributes);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

}  // namespace

std::string signal_name(int signal) {
  switch (signal) {
    case SIGABRT:
      return "SIGABRT";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGILL:
      return "SIGILL";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGPIPE:
      return "SIGPIPE";
    default:
      return "signal " + std::to_string(signal);
  }
}

std::string ProcessResult::how_it_ended(double timeout_seconds) const {
  if (timed_out) {
    return "timed out after " + std::to_string(static_cast<long long>(std::ceil(timeout_seconds))) +
           " s and was killed";
  }
  if (signal != 0) {
    std::string text = "killed by signal ";
    text += std::to_string(signal);
    text += " (";
    text += signal_name(signal);
    text += ")";
    return text;
  }
  return "exit status " + std::to_string(exit_code);
}

Result<ProcessResult> run_process(const std::vector<std::string>& argv, std::string_view input,
                                  double timeout_seconds) {
  if (argv.empty() || argv[0].empty()) {
    return make_error(ErrorCode::InvalidArgument, "run_process: no program given");
  }
  // stdin: a socket pair, so that writes can say MSG_NOSIGNAL; stdout, stderr: pipes.
  int in_pair[2], out_pipe[2], err_pipe[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in_pair) != 0)
    return io_error("socketpair");
  Fd in_parent(in_pair[0]), in_child(in_pair[1]);
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return io_error("pipe2");
  Fd out_parent(out_pipe[0]), out_child(out_pipe[1]);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return io_error("pipe2");
  Fd err_parent(err_pipe[0]), err_child(err_pipe[1]);

  SpawnSetup setup;
  // dup2 onto 0, 1, 2 clears close-on-exec on those; every other descriptor of ours stays
  // close-on-exec, so the child inherits only its three.
  posix_spawn_file_actions_adddup2(&setup.actions, in_child.get(), 0);
  posix_spawn_file_actions_adddup2(&setup.actions, out_child.get(), 1);
  posix_spawn_file_actions_adddup2(&setup.actions, err_child.get(), 2);
  // A clean signal state: nothing blocked, SIGPIPE default (callers may ignore or block it).
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&setup.attributes, &empty);
  posix_spawnattr_setsigdefault(&setup.attributes, &defaults);
  posix_spawnattr_setflags(&setup.attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned =
      ::posix_spawn(&pid, argv[0].c_str(), &setup.actions, &setup.attributes, args.data(), environ);
  if (spawned != 0) {
    errno = spawned;
    return io_error("cannot start " + argv[0]);
  }
  in_child.reset();
  out_child.reset();
  err_child.reset();

  ProcessResult result;
  size_t written = 0;
  if (input.empty()) in_parent.reset();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (out_parent.get() >= 0 || err_parent.get() >= 0) {
    pollfd fds[3];
    int count = 0;
    if (in_parent.get() >= 0) fds[count++] = {in_parent.get(), POLLOUT, 0};
    if (out_parent.get() >= 0) fds[count++] = {out_parent.get(), POLLIN, 0};
    if (err_parent.get() >= 0) fds[count++] = {err_parent.get(), POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    const int ready = ::poll(fds, count, static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno != EINTR) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return io_error("poll");
    }
    for (int i = 0; i < count && ready > 0; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == in_parent.get()) {
        const ssize_t n = ::send(in_parent.get(), input.data() + written, input.size() - written,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) written += static_cast<size_t>(n);
        // Done, or the child stopped reading (EPIPE): either way it gets no more input.
        if (written == input.size() || (n < 0 && errno != EAGAIN && errno != EINTR))
          in_parent.reset();
        continue;
      }
      Fd& source = fds[i].fd == out_parent.get() ? out_parent : err_parent;
      std::string& sink = &source == &out_parent ? result.out : result.err;
      char buffer[65536];
      const ssize_t n = ::read(source.get(), buffer, sizeof buffer);
      if (n > 0) {
        sink.append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        source.reset();  // EOF: the child closed it (or exited)
      }
    }
  }
  in_parent.reset();
  // The child may have closed its outputs and still run: the deadline holds for the wait too.
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, result.timed_out ? 0 : WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return io_error("waitpid");
    if (done == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        result.timed_out = true;
        ::kill(pid, SIGKILL);
      } else {
        ::usleep(2000);
      }
    }
  }
  if (!result.timed_out) {
    if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  }
  return result;
}

}  // namespace flashjit
