// Runs a child process with its stdin fed from memory and its stdout and stderr captured, and
// reports how it ended: an exit status, a signal (a crash or an abort), or a timeout. The HIP
// backend runs every hipRTC compile this way (runtime/hip/hiprtc_compiler.hpp), because hipRTC
// aborts the whole process on some inputs; runtime/host_compiler.hpp runs the host's C++ compiler
// this way.
//
// Safe to call from many threads at once: the child is started with posix_spawn (no code of
// ours runs between fork and exec), every pipe end is close-on-exec (a child never holds another
// child's pipes open), and stdin is a socket written with MSG_NOSIGNAL (a child that exits
// without reading gives EPIPE, not a SIGPIPE that would kill the caller).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "generator/error.hpp"

namespace flashjit {

struct ProcessResult {
  int exit_code = -1;      // the exit status when the child exited; -1 otherwise
  int signal = 0;          // the signal that ended the child (SIGABRT for an abort); 0 otherwise
  bool timed_out = false;  // the child ran past the timeout and was killed with SIGKILL
  std::string out;         // everything it wrote to stdout
  std::string err;         // everything it wrote to stderr

  bool exited_ok() const { return exit_code == 0 && signal == 0 && !timed_out; }
  // "exit status 2", "killed by signal 6 (SIGABRT)", "timed out after 300 s and was killed".
  std::string how_it_ended(double timeout_seconds) const;
};

// Runs argv[0] (a path; PATH is not searched) with argv, the caller's environment, `input` on its
// stdin (then EOF), until it ends or `timeout_seconds` pass. Error IoError when the process
// cannot be started (no such file, not executable, out of resources); everything after the
// start, crashes included, is a ProcessResult.
Result<ProcessResult> run_process(const std::vector<std::string>& argv, std::string_view input,
                                  double timeout_seconds);

// "SIGABRT", "SIGSEGV", ... or "signal N".
std::string signal_name(int signal);

}  // namespace flashjit
