// Tuning a grid of problems (or a list, or the recorded ones) on one or more devices into the
// tuning DB: the typed service under `flashjit tune` (cli/tune_command.cpp: flags -> request,
// report -> table / JSON) and flashjit.tune() (python/src/tools.cpp: kwargs -> request,
// report -> dict), and the way a C++ program tunes (examples/cpp_tune).
//
//   flashjit::TuneRequest request;
//   request.backend = "cpu";
//   request.grid = flashjit::cpu_default_grid();
//   request.grid->head_dims = {64};
//   request.db = "tuning.db";
//   flashjit::TuneRunReport report = flashjit::run_tune(request);
//   // report.status: 0 every problem got a choice; report.problems: one row each
//
// What run_tune does: expands the problems (below), resolves the backend and devices, opens
// the DB, keeps the shard, splits the problems over the devices (one tuning thread each, with
// its own Tuner) and collects their reports. Progress goes to the request's callbacks, on the
// tuning threads.
//
// Crash isolation: with request.worker_argv set, run_tune starts that program as a worker
// process under the supervisor (tuner/supervisor.hpp) and returns the report the worker hands
// back. The worker must call run_tune with the same request: in the worker (FLASHJIT_TUNE_WORKER
// in its environment) run_tune tunes in-process and writes its report where the supervisor
// reads it ($FLASHJIT_TUNE_REPORT). `flashjit tune` re-runs itself; flashjit.tune() runs
// `python -m flashjit tune-worker <its arguments>`.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "tuner/grid.hpp"
#include "tuner/run_report.hpp"
#include "tuner/tuner.hpp"

namespace flashjit {

// What run_tune knows before it tunes: passed to TuneRequest::on_start.
struct TuneRunStart {
  size_t problems = 0;
  std::vector<std::string> devices;  // fingerprints, one per tuning thread
  int total_steps = 0;               // progress steps of all problems (Tuner::steps)
  Shard shard;
  std::string db;  // the DB's path; empty: none
  RateUnit unit;
};

struct TuneRequest {
  // The problems, from the first of these that is given:
  //   problems   a list of problems (a C++ caller's own; nothing below applies to them);
  //   recorded   the problems the runtime recorded as untuned in the DB (each with its pass);
  //   grid       a grid (tuner/grid.hpp);
  //   otherwise  the backend's default grid: standard_grid() on a GPU, cpu_default_grid() on
  //              the CPU, over `passes` and `deterministic`.
  // Every grid problem (given or default) gets `variant` (window, softcap, ALiBi, prefix, the
  // user expressions score_mod / mask_mod / score_mod_grad) and, with page_size > 0, a paged K/V
  // cache of page_size keys a page (forward problems only).
  std::vector<AttentionProblem> problems;
  bool recorded = false;
  std::optional<ProblemGrid> grid;
  std::vector<Pass> passes = {Pass::Forward};
  bool deterministic = false;
  Variant variant;
  int page_size = 0;

  std::string backend = "auto";  // auto (a GPU if present, else the CPU), cuda, hip or cpu
  std::vector<int> devices;      // GPU ordinals, one tuning thread each; empty: device 0
  bool all_devices = false;      // every GPU of the backend (devices must be empty)
  Shard shard;                   // tune only problems whose index is shard.index mod shard.count
  // The tuning DB: nullopt: default_user_db() ($FLASHJIT_DB or ~/.local/share/...); "": none.
  std::optional<std::filesystem::path> db;
  std::optional<std::filesystem::path> binary_cache;  // nullopt: BinaryCache::default_dir()

  // The time budget and the tuner's knobs: options.min_time_ms (device time per config),
  // retime_top, max_compile_threads (jobs), verbose; options.resume is !retune.
  TuneOptions options;
  bool retune = false;

  // Crash isolation (above): the worker's program and arguments; empty: tune in this process.
  std::vector<std::string> worker_argv;
  double hang_seconds = 120;  // a config in flight this long is a hung kernel (0: no deadline)

  // Called once the devices are open and the problems known (not when there is nothing to tune),
  // then with every step of every device's tuner (device = its index in TuneRunStart::devices).
  // In the isolated case they are called in the worker process (see console_progress).
  std::function<void(const TuneRunStart&)> on_start;
  std::function<void(int device, const TuneProgress&)> on_progress;
};

// The standard GPU grid (tuner/grid.hpp ProblemGrid{}) over `passes` and `deterministic`.
ProblemGrid standard_grid(const std::vector<Pass>& passes, bool deterministic);

// The problems a request names for a backend ("cpu" picks the CPU's default grid), before the
// shard: errors (InvalidArgument) name the request's field. Not for recorded requests.
Result<std::vector<AttentionProblem>> request_problems(const TuneRequest& request,
                                                       const std::string& backend);

// Everything about a request that needs no device: InvalidArgument naming the field.
Status check_request(const TuneRequest& request);

// Tunes what the request names; see above. Never throws for a device or DB failure: the report's
// status and message say what went wrong.
TuneRunReport run_tune(const TuneRequest& request);

// True in a tuning worker process (FLASHJIT_TUNE_WORKER=1): run_tune hands its report to the
// supervisor, so the caller prints no summary.
bool in_tune_worker();

// The console's progress, as `flashjit tune` shows it: the run's header on stderr, a progress
// bar or a line per finished problem, with verbose a table of every config on stdout
// (ProgressPrinter). Sets request.on_start / on_progress; call finish() after run_tune.
class ConsoleProgress {
 public:
  explicit ConsoleProgress(TuneRequest& request);
  void finish();

 private:
  std::shared_ptr<std::unique_ptr<ProgressPrinter>> printer_;
};

}  // namespace flashjit
