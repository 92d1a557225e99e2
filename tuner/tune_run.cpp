#include "tuner/tune_run.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <system_error>
#include <thread>

#include "runtime/binary_cache.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/runtime.hpp"
#include "runtime/tuning_store.hpp"
#include "tuner/supervisor.hpp"

namespace flashjit {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

Error invalid(std::string message) {
  return make_error(ErrorCode::InvalidArgument, std::move(message));
}

std::string join(const std::vector<int>& values) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) text += ",";
    text += std::to_string(values[i]);
  }
  return text;
}

TuneRunReport stopped(int status, std::string message) {
  TuneRunReport report;
  report.generator = generator_version();
  report.status = status;
  report.message = std::move(message);
  return report;
}

// The GPU ordinals of the request on a backend with `device_count` devices.
Result<std::vector<int>> device_list(const TuneRequest& request, int device_count,
                                     const std::string& kind) {
  if (request.all_devices) {
    std::vector<int> all;
    for (int i = 0; i < device_count; ++i) all.push_back(i);
    return all;
  }
  if (request.devices.empty()) return std::vector<int>{0};
  for (int ordinal : request.devices) {
    if (ordinal < 0 || ordinal >= device_count) {
      return invalid("devices = " + join(request.devices) + ": device " + std::to_string(ordinal) +
                     " does not exist (" + std::to_string(device_count) + " " + kind +
                     " device(s): 0.." + std::to_string(device_count - 1) + ", or all)");
    }
  }
  return request.devices;
}

// The tuning itself, in this process.
TuneRunReport tune_here(const TuneRequest& request, bool worker) {
  TuneOptions options = request.options;
  options.resume = !request.retune;
  apply_worker_environment(options);

  // The backend: auto tunes on the GPU(s) if there is one, else on the CPU (where built in).
  Result<std::string> backend_name = resolve_backend(request.backend);
  if (!backend_name.ok()) {
    if (backend_name.error().code == ErrorCode::NoDevice) {
      return stopped(kExitUsage, "no CUDA device: " + backend_name.error().message);
    }
    return stopped(kExitUsage, backend_name.error().describe());
  }
  const bool on_cpu = *backend_name == "cpu";
  std::vector<int> ordinals = {0};
  if (on_cpu) {
    if (!request.devices.empty() || request.all_devices) {
      return stopped(kExitUsage,
                     invalid("devices = " +
                             (request.all_devices ? std::string("all") : join(request.devices)) +
                             ": the CPU is one device; devices are for GPUs")
                         .describe());
    }
  } else if (*backend_name == "hip") {
    const int count = gpu_device_count("hip");
    if (count == 0) return stopped(kExitUsage, "no AMD GPU (HIP) found");
    Result<std::vector<int>> listed = device_list(request, count, "HIP");
    if (!listed.ok()) return stopped(kExitUsage, listed.error().describe());
    ordinals = *listed;
  } else {
    const int count = cuda::device_count();
    if (count == 0) {
      Result<DeviceSpec> device = cuda::query_device(0);
      return stopped(kExitUsage, "no CUDA device: " + (device.ok() ? std::string("none found")
                                                                   : device.error().message));
    }
    Result<std::vector<int>> listed = device_list(request, count, "CUDA");
    if (!listed.ok()) return stopped(kExitUsage, listed.error().describe());
    ordinals = *listed;
  }

  std::vector<AttentionProblem> problems;
  if (!request.recorded) {
    Result<std::vector<AttentionProblem>> expanded = request_problems(request, *backend_name);
    if (!expanded.ok()) return stopped(kExitUsage, expanded.error().describe());
    problems = std::move(expanded.value());
  }

  std::vector<std::unique_ptr<Backend>> backends;
  for (int ordinal : ordinals) {
    Result<std::unique_ptr<Backend>> backend = create_backend(*backend_name, ordinal);
    if (!backend.ok()) {
      return stopped(backend.error().code == ErrorCode::NoDevice ? kExitUsage : kExitFailed,
                     "device " + std::to_string(ordinal) + ": " + backend.error().describe());
    }
    backends.push_back(std::move(backend.value()));
  }
  // A grid the backend cannot run (fp32 on CUDA) is a bad request, named before anything runs.
  for (const AttentionProblem& problem : problems) {
    Status supported = backends.front()->check_problem(problem);
    if (!supported.ok()) return stopped(kExitUsage, supported.error().describe());
  }

  std::optional<std::filesystem::path> db_path =
      request.db ? std::optional<std::filesystem::path>(*request.db) : default_user_db();
  if (db_path && db_path->empty()) db_path.reset();
  std::unique_ptr<TuningStore> store;
  if (db_path) {
    std::error_code ignored;
    if (db_path->has_parent_path())
      std::filesystem::create_directories(db_path->parent_path(), ignored);
    Result<std::unique_ptr<TuningStore>> opened = TuningStore::open(*db_path);
    if (!opened.ok()) return stopped(kExitFailed, opened.error().describe());
    store = std::move(opened.value());
  } else if (!request.db) {
    std::fprintf(stderr,
                 "flashjit tune: warning: no tuning DB ($FLASHJIT_DB disables it, or there is no "
                 "home directory): results are not saved; pass --db PATH\n");
  }

  if (request.recorded) {
    if (!store) return stopped(kExitUsage, invalid("recorded: needs a tuning DB").describe());
    auto listed = store->recorded_problems(backends.front()->fingerprint());
    if (!listed.ok()) return stopped(kExitFailed, listed.error().describe());
    for (AttentionProblem& problem : listed.value()) {
      Status valid = backends.front()->check_problem(problem);
      if (valid.ok()) {
        problems.push_back(std::move(problem));
      } else {
        std::fprintf(stderr, "flashjit tune: warning: skipping recorded %s: %s\n",
                     problem.to_string().c_str(), valid.error().message.c_str());
      }
    }
  }
  problems = select_shard(problems, request.shard);
  TuneRunReport report = stopped(kExitOk, "");
  report.backend = *backend_name;
  if (problems.empty()) {
    report.nothing_to_tune = true;
    return report;
  }

  const BinaryCache cache(request.binary_cache.value_or(BinaryCache::default_dir()));
  const std::vector<std::vector<AttentionProblem>> parts =
      split_for_workers(problems, static_cast<int>(backends.size()));
  TuneRunStart start;
  start.problems = problems.size();
  start.shard = request.shard;
  start.db = store ? store->path().string() : std::string();
  start.unit = rate_unit_for(*backends.front());
  for (size_t w = 0; w < parts.size(); ++w) {
    start.devices.push_back(backends[w]->fingerprint().to_string());
    for (const AttentionProblem& p : parts[w]) {
      start.total_steps += static_cast<int>(backends[w]->legal_configs(p).size()) + 1;
    }
  }
  if (request.on_start) request.on_start(start);

  const auto began = std::chrono::steady_clock::now();
  std::vector<WorkerOutcome> outcomes(backends.size());
  std::vector<std::thread> threads;
  for (size_t w = 0; w < backends.size(); ++w) {
    threads.emplace_back([&, w] {
      TuneOptions worker_options = options;
      if (request.on_progress) {
        worker_options.on_progress = [&request, w](const TuneProgress& progress) {
          request.on_progress(static_cast<int>(w), progress);
        };
      }
      WorkerOutcome& outcome = outcomes[w];
      outcome.device = start.devices[w];
      if (parts[w].empty()) return;
      try {
        Tuner tuner(*backends[w], &cache, store.get(), worker_options);
        auto reports = tuner.tune_all(parts[w]);
        if (reports.ok()) {
          outcome.reports = std::move(reports.value());
        } else {
          outcome.error = reports.error();
        }
      } catch (const std::exception& error) {  // out of memory: report it, do not terminate
        outcome.error =
            make_error(ErrorCode::DriverError, std::string("internal error: ") + error.what());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();

  TuneRunReport done = make_run_report(outcomes, seconds);
  done.backend = report.backend;
  for (const TunedProblem& row : done.problems) {
    if (!row.chosen) done.status = kExitFailed;
  }
  for (size_t w = 0; w < outcomes.size(); ++w) {
    if (!outcomes[w].error) continue;
    done.device_errors.push_back("device " + std::to_string(ordinals[w]) + ": " +
                                 outcomes[w].error->describe());
    done.status = kExitFailed;
    // A worker whose device became unusable (a kernel fault): its supervisor starts a new one.
    if (worker && is_device_lost(*outcomes[w].error)) done.status = kExitWorkerLost;
  }
  return done;
}

// The parent's side of crash isolation: the worker under the supervisor, its report read back.
TuneRunReport tune_in_worker(const TuneRequest& request) {
  char pattern[] = "/tmp/flashjit-tune-report-XXXXXX";
  const int fd = mkstemp(pattern);
  if (fd < 0) return stopped(kExitFailed, "cannot create a file for the worker's report");
  close(fd);
  const std::string path = pattern;
  struct Remove {
    std::string path;
    ~Remove() { std::remove(path.c_str()); }
  } remove{path};

  SupervisedRun run;
  run.argv = request.worker_argv;
  run.hang_seconds = request.hang_seconds;
  run.report_path = path;
  Result<int> status = run_supervised(run);
  if (!status.ok()) return stopped(kExitFailed, status.error().describe());
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) == 0 || ec) {
    return stopped(
        *status == 0 ? kExitFailed : *status,
        "the tuning worker ended (status " + std::to_string(*status) + ") without a report");
  }
  Result<TuneRunReport> report = read_run_report(path);
  if (!report.ok()) return stopped(kExitFailed, report.error().describe());
  if (report->status == kExitOk && *status != 0) report->status = *status;
  return std::move(report.value());
}

}  // namespace

ProblemGrid standard_grid(const std::vector<Pass>& passes, bool deterministic) {
  ProblemGrid grid;
  grid.passes = passes;
  grid.deterministic = deterministic;
  return grid;
}

Result<std::vector<AttentionProblem>> request_problems(const TuneRequest& request,
                                                       const std::string& backend) {
  if (!request.problems.empty()) return request.problems;
  ProblemGrid grid;
  if (request.grid) {
    grid = *request.grid;
  } else {
    grid = backend == "cpu" ? cpu_default_grid() : ProblemGrid{};
    grid.passes = request.passes;
    grid.deterministic = request.deterministic;
  }
  if (grid.passes.empty()) return invalid("passes: give at least one (fwd, bwd)");
  const bool has_backward =
      std::find(grid.passes.begin(), grid.passes.end(), Pass::Backward) != grid.passes.end();
  if (grid.deterministic && !has_backward) {
    return invalid("deterministic applies to the backward pass only: add the backward pass");
  }
  std::sort(grid.passes.begin(), grid.passes.end());  // a shape's forward before its backward
  Result<std::vector<AttentionProblem>> problems = grid_problems(grid);
  FLASHJIT_TRY(problems);
  if (request.page_size != 0 && (request.page_size % 16 != 0 || request.page_size < kMinPageSize ||
                                 request.page_size > kMaxPageSize)) {
    return invalid("page_size = " + std::to_string(request.page_size) +
                   ": must be a multiple of 16 in [" + std::to_string(kMinPageSize) + ", " +
                   std::to_string(kMaxPageSize) + "]");
  }
  for (AttentionProblem& problem : *problems) {
    problem.variant = request.variant;
    if (request.page_size != 0) {
      if (problem.is_backward()) {
        return invalid("page_size applies to the forward pass only (a paged K/V cache)");
      }
      const int64_t pages_per_sequence =
          (problem.seqlen_k + request.page_size - 1) / request.page_size;
      problem = problem.with_paged_kv(request.page_size, problem.batch * pages_per_sequence);
    }
    Status valid = validate(problem);
    if (!valid.ok()) return valid.error();
  }
  return problems;
}

Status check_request(const TuneRequest& request) {
  if (request.recorded && (!request.problems.empty() || request.grid)) {
    return invalid("recorded tunes the recorded problems (each with its pass): give no grid");
  }
  if (request.shard.count < 1 || request.shard.index < 0 ||
      request.shard.index >= request.shard.count) {
    return invalid("shard = " + std::to_string(request.shard.index) + "/" +
                   std::to_string(request.shard.count) + ": expected I/N with 0 <= I < N");
  }
  if (request.all_devices && !request.devices.empty()) {
    return invalid("devices = " + join(request.devices) + ": give devices or all_devices");
  }
  if (!(request.hang_seconds >= 0)) {
    return invalid("hang_seconds = " + std::to_string(request.hang_seconds) + ": must be >= 0");
  }
  if (!(request.options.min_time_ms > 0)) {
    return invalid("min_time_ms = " + std::to_string(request.options.min_time_ms) +
                   ": must be > 0");
  }
  if (!request.recorded) {
    // The GPU grid's problems (the CPU's default grid is checked when the backend is known).
    Result<std::vector<AttentionProblem>> problems = request_problems(request, "cuda");
    if (!problems.ok()) return problems.error();
  }
  return ok_status();
}

bool in_tune_worker() {
  const char* worker = std::getenv("FLASHJIT_TUNE_WORKER");
  return worker != nullptr && std::string(worker) == "1";
}

TuneRunReport run_tune(const TuneRequest& request) {
  Status valid = check_request(request);
  if (!valid.ok()) return stopped(kExitUsage, valid.error().describe());
  const bool worker = in_tune_worker();
  if (!worker && !request.worker_argv.empty()) return tune_in_worker(request);
  TuneRunReport report;
  try {
    report = tune_here(request, worker);
  } catch (const std::exception& error) {
    report = stopped(kExitFailed, std::string("internal error: ") + error.what());
  }
  if (worker) {
    if (const char* path = std::getenv("FLASHJIT_TUNE_REPORT"); path && *path) {
      if (!write_run_report(path, report, /*handoff=*/true)) {
        std::fprintf(stderr, "flashjit tune: cannot write the report to %s\n", path);
        if (report.status == kExitOk) report.status = kExitFailed;
      }
    }
  }
  return report;
}

ConsoleProgress::ConsoleProgress(TuneRequest& request)
    : printer_(std::make_shared<std::unique_ptr<ProgressPrinter>>()) {
  const bool verbose = request.options.verbose;
  request.on_start = [printer = printer_, verbose](const TuneRunStart& start) {
    std::fprintf(stderr, "flashjit tune: %zu problem(s) on %zu device(s)", start.problems,
                 start.devices.size());
    if (start.shard.count > 1)
      std::fprintf(stderr, ", shard %d/%d", start.shard.index, start.shard.count);
    std::fprintf(stderr, ", DB %s\n", start.db.empty() ? "(none)" : start.db.c_str());
    for (const std::string& device : start.devices) std::fprintf(stderr, "  %s\n", device.c_str());
    *printer =
        std::make_unique<ProgressPrinter>(static_cast<int>(start.devices.size()), start.total_steps,
                                          start.problems, verbose, start.unit);
  };
  request.on_progress = [printer = printer_](int device, const TuneProgress& progress) {
    if (*printer) (*printer)->update(device, progress);
  };
}

void ConsoleProgress::finish() {
  if (*printer_) (*printer_)->finish();
}

}  // namespace flashjit
