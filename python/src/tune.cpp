#include "tune.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "runtimes.hpp"
#include "tuner/tune_run.hpp"

namespace flashjit::python {
namespace {

// spec[name] as T, or nullopt when absent or None.
template <class T>
std::optional<T> get(const nb::dict& spec, const char* name) {
  if (!spec.contains(name)) return std::nullopt;
  nb::handle value = spec[name];
  if (value.is_none()) return std::nullopt;
  T converted;
  if (!nb::try_cast(value, converted)) {
    raise(ErrorCode::InvalidArgument, std::string(name) + " = " +
                                          nb::cast<std::string>(nb::repr(value)) +
                                          ": not the expected type");
  }
  return converted;
}

template <class T>
T get_or(const nb::dict& spec, const char* name, T fallback) {
  return get<T>(spec, name).value_or(std::move(fallback));
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (size_t i = 0; i < items.size(); ++i) text += (i ? "," : "") + items[i];
  return text;
}

// The grid of the keyword arguments, as `flashjit tune`'s flags build it (cli/tune_command.cpp
// grid_from_flags); nullopt when none of them shapes the problems (the backend's default grid).
std::optional<ProblemGrid> grid_of(const nb::dict& spec, TuneRequest& request) {
  const char* shape[] = {"head_dims", "dtypes", "causal", "seqlens", "tokens",
                         "batch",     "hidden", "heads",  "kv_heads"};
  bool given = false;
  for (const char* name : shape) given = given || (spec.contains(name) && !spec[name].is_none());
  if (!given) return std::nullopt;
  ProblemGrid grid;
  grid.passes = request.passes;
  grid.deterministic = request.deterministic;
  if (auto dims = get<std::vector<int>>(spec, "head_dims")) grid.head_dims = *dims;
  if (auto dtypes = get<std::vector<std::string>>(spec, "dtypes")) {
    grid.dtypes.clear();
    for (const std::string& name : *dtypes) {
      Result<DType> dtype = parse_dtype(name);
      if (!dtype.ok()) {
        raise(ErrorCode::InvalidArgument,
              "dtypes = '" + join(*dtypes) + "': allowed: bf16, fp16, fp32");
      }
      grid.dtypes.push_back(*dtype);
    }
  }
  if (auto causal = get<std::string>(spec, "causal")) {
    if (*causal == "both") {
      grid.causal = {false, true};
    } else if (*causal == "on" || *causal == "off") {
      grid.causal = {*causal == "on"};
    } else {
      raise(ErrorCode::InvalidArgument, "causal = '" + *causal + "': allowed: True, False, 'both'");
    }
  }
  if (auto seqlens = get<std::vector<int64_t>>(spec, "seqlens")) grid.seqlens = *seqlens;
  auto tokens = get<int64_t>(spec, "tokens");
  auto batch = get<int64_t>(spec, "batch");
  auto hidden = get<int64_t>(spec, "hidden");
  auto heads = get<int64_t>(spec, "heads");
  if (tokens && batch) raise(ErrorCode::InvalidArgument, "give tokens or batch, not both");
  if (hidden && heads) raise(ErrorCode::InvalidArgument, "give hidden or heads, not both");
  for (auto [name, value] : {std::pair{"tokens", tokens}, std::pair{"batch", batch},
                             std::pair{"hidden", hidden}, std::pair{"heads", heads}}) {
    if (value && *value < 1) {
      raise(ErrorCode::InvalidArgument,
            std::string(name) + " = " + std::to_string(*value) + ": must be at least 1");
    }
  }
  if (tokens) grid.tokens = *tokens;
  if (batch) grid.batch = *batch;
  if (hidden) grid.hidden = *hidden;
  if (heads) grid.heads = *heads;
  if (auto kv_heads = get<int64_t>(spec, "kv_heads")) {
    if (*kv_heads < 1) {
      raise(ErrorCode::InvalidArgument,
            "kv_heads = " + std::to_string(*kv_heads) + ": must be at least 1");
    }
    grid.kv_heads = *kv_heads;
  }
  return grid;
}

TuneRequest request_of(const nb::dict& spec) {
  TuneRequest request;
  request.passes.clear();
  const std::vector<std::string> passes = get_or(spec, "passes", std::vector<std::string>{"fwd"});
  for (const std::string& name : passes) {
    Result<Pass> pass = parse_pass(name);
    if (!pass.ok()) {
      raise(ErrorCode::InvalidArgument, "passes = '" + join(passes) + "': allowed: fwd, bwd");
    }
    if (std::find(request.passes.begin(), request.passes.end(), *pass) == request.passes.end())
      request.passes.push_back(*pass);
  }
  if (request.passes.empty()) {
    raise(ErrorCode::InvalidArgument, "passes: give at least one of fwd, bwd");
  }
  request.deterministic = get_or(spec, "deterministic", false);
  request.recorded = get_or(spec, "recorded", false);
  request.grid = grid_of(spec, request);
  if (request.recorded &&
      (request.grid || passes != std::vector<std::string>{"fwd"} || request.deterministic)) {
    raise(ErrorCode::InvalidArgument,
          "recorded tunes the recorded problems (each with its pass): give no grid, passes or "
          "deterministic");
  }
  request.variant.score_mod = get_or(spec, "score_mod", std::string());
  request.variant.mask_mod = get_or(spec, "mask_mod", std::string());
  request.variant.score_mod_grad = get_or(spec, "score_mod_grad", std::string());
  if (auto db = get<std::string>(spec, "db")) request.db = *db;
  request.backend = get_or(spec, "backend", default_backend_name());
  if (auto devices = get<std::vector<int>>(spec, "devices")) request.devices = *devices;
  request.all_devices = get_or(spec, "all_devices", false);
  if (auto shard = get<std::vector<int>>(spec, "shard")) {
    if (shard->size() != 2) {
      raise(ErrorCode::InvalidArgument, "shard: expected (index, count) or 'I/N'");
    }
    request.shard = {(*shard)[0], (*shard)[1]};
  }
  request.retune = get_or(spec, "retune", false);
  if (auto min_time = get<double>(spec, "min_time_ms")) request.options.min_time_ms = *min_time;
  if (auto top = get<int>(spec, "retime_top")) {
    if (*top < 0 || *top > 64) {
      raise(ErrorCode::InvalidArgument,
            "retime_top = " + std::to_string(*top) + ": must be in [0, 64]");
    }
    request.options.retime_top = *top;
  }
  if (auto jobs = get<int>(spec, "jobs")) {
    if (*jobs < 1) {
      raise(ErrorCode::InvalidArgument, "jobs = " + std::to_string(*jobs) + ": must be >= 1");
    }
    request.options.max_compile_threads = *jobs;
  }
  request.options.verbose = get_or(spec, "verbose", false);
  request.worker_argv = get_or(spec, "worker", std::vector<std::string>());
  return request;
}

nb::object number(double value) {
  if (!std::isfinite(value)) return nb::none();
  return nb::float_(value);
}

// Sets dict[name] for each field a visit_*_fields gives (tuner/run_report.hpp), as the JSON
// report has it: a pass or dtype by its name, a number that is not finite as None.
struct DictFields {
  nb::dict& dict;
  template <class T>
  void operator()(const char* name, const T& value) {
    if constexpr (std::is_same_v<T, double>)
      dict[name] = number(value);
    else if constexpr (std::is_same_v<T, Pass> || std::is_same_v<T, DType>)
      dict[name] = to_string(value);
    else
      dict[name] = value;
  }
};

nb::dict time_dict(const TunedTime& time) {
  nb::dict entry;
  visit_time_fields(DictFields{entry}, time);
  return entry;
}

// The report as `flashjit tune --json` writes it (tuner/run_report.hpp run_report_json).
nb::dict report_dict(const TuneRunReport& report) {
  nb::dict out;
  out["generator"] = report.generator;
  out["geomean_gain"] = number(report.geomean_gain);
  out["seconds"] = number(report.seconds);
  nb::list problems;
  for (const TunedProblem& r : report.problems) {
    nb::dict p;
    p["device"] = r.device;
    p["key"] = r.key;
    visit_problem_fields(DictFields{p}, r);
    p["default"] = time_dict(r.default_config);
    p["chosen"] = r.chosen ? nb::object(time_dict(*r.chosen)) : nb::none();
    p["gain"] = number(r.gain);
    visit_outcome_fields(DictFields{p}, r);
    nb::list results;
    for (const TunedConfig& c : r.results) {
      nb::dict result;
      visit_config_fields(DictFields{result}, c);
      results.append(result);
    }
    p["results"] = results;
    problems.append(p);
  }
  out["problems"] = problems;
  return out;
}

}  // namespace

nb::tuple tune(const nb::dict& spec) {
  TuneRequest request = request_of(spec);
  TuneRunReport report;
  {
    nb::gil_scoped_release release;
    CudaContextGuard guard(true);
    std::fflush(stdout);
    ConsoleProgress console(request);
    report = run_tune(request);
    console.finish();
    if (!in_tune_worker()) {
      if (report.nothing_to_tune) {
        std::printf("flashjit tune: nothing to tune%s\n",
                    request.recorded ? " (no recorded problems for this device)" : "");
      } else if (!report.problems.empty()) {
        print_summary(report, report.unit());
      }
    }
    std::fflush(stdout);
    std::fflush(stderr);
  }
  runtimes().clear();  // attention() serves the new results
  std::string message = report.message;
  for (const std::string& error : report.device_errors)
    message += (message.empty() ? "" : "\n") + error;
  if (report.status != 0 && message.empty()) {
    for (const TunedProblem& row : report.problems) {
      if (row.chosen) continue;
      message += (message.empty() ? "" : "\n") + row.label() + ": no config chosen: " + row.note;
    }
  }
  return nb::make_tuple(report.status, message, report_dict(report));
}

}  // namespace flashjit::python
