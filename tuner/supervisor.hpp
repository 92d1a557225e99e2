// Crash isolation for tuning runs (issue 15): a candidate kernel that faults can take its process
// down (a CPU kernel's SIGSEGV) or leave its CUDA context unusable (an illegal address). The
// tuner then records the config as LaunchFailed where it still can and stops; run_supervised()
// runs the tuning in a worker process and starts a fresh one when it dies, so the run goes on and
// no finished result is lost (every result is in the DB as it is measured; the new worker
// resumes from it).
//
// The worker (the same program, with FLASHJIT_TUNE_WORKER=1 in its environment) writes the
// config it is about to launch to FLASHJIT_TUNE_INFLIGHT ("<key>\t<config>"). When the worker
// dies of a fault signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS; an interrupt
// or a kill from outside ends the run with 128 + the signal), or exits with kExitWorkerLost (a
// device it cannot use any more), the supervisor appends that config to FLASHJIT_TUNE_FAULTS
// ("<key>\t<config>\t<why>") and starts a new worker with FLASHJIT_TUNE_RESUME=1; the new worker
// records each listed config as LaunchFailed without launching it (TuneOptions::faulted) and
// resumes the rest.
//
// A kernel that hangs: the worker writes the in-flight file only while it loads, verifies or
// times a config (never while it waits for a compile or the device's lock), and again before each
// timed batch, so the file's contents and modification time are its heartbeat. When a config has
// been in flight for hang_seconds without a new write, the supervisor kills the worker (SIGKILL:
// the driver tears down its context and the hung kernel with it), records the config as failed
// ("hung: ...") and starts a new worker, as for a fault.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "generator/error.hpp"
#include "tuner/tuner.hpp"

namespace flashjit {

// The exit code of a worker whose device cannot be used any more: restart it.
constexpr int kExitWorkerLost = 75;

struct SupervisedRun {
  std::vector<std::string> argv;  // the worker: argv[0] is the executable's path
  int max_restarts = 16;          // workers started after the first, at most
  double hang_seconds = 0;        // a config in flight this long without a heartbeat: killed
                                  // (0: no deadline)
  std::function<void(const std::string&)> on_message;  // null: stderr
  // Where the worker writes its report for this process ($FLASHJIT_TUNE_REPORT in its
  // environment: tuner/tune_run.hpp); empty: not set.
  std::string report_path;
};

// Runs the worker until it exits on its own: its exit code, or an error when it could not be
// started, died without a config in flight, or died more than max_restarts times.
Result<int> run_supervised(const SupervisedRun& run);

// In a worker (FLASHJIT_TUNE_WORKER=1): fills options.inflight_path, options.faulted and, on a
// restart, options.resume from the environment the supervisor set. True in a worker.
bool apply_worker_environment(TuneOptions& options);

}  // namespace flashjit
