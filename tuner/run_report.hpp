// The typed report of a tuning run (tuner/tune_run.hpp): one row per tuned problem, as the JSON
// report (`flashjit tune --json`, flashjit.tune()'s dict) has it, the geo-mean gains, and how the
// run ended. The rows are plain values (no AttentionProblem), so that a report survives the trip
// from a worker process to its supervisor (write_run_report / read_run_report) unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "tuner/report.hpp"

namespace flashjit {

// One config's measurement ("results" of a JSON row).
struct TunedConfig {
  std::string config;  // AttentionConfig::to_string()
  std::string status;  // to_string(TuneStatus): "timed", "compile-failed", ...
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int repetitions = 0;
  double tflops = 0;
  bool is_default = false;
  std::string message;
};

// A config with its time ("default" and "chosen" of a JSON row).
struct TunedTime {
  std::string config;
  double ms = 0;
  double tflops = 0;
};

// One tuned problem.
struct TunedProblem {
  std::string device;  // the fingerprint of the device it was tuned on
  std::string key;     // ProblemKey::to_string()
  Pass pass = Pass::Forward;
  bool deterministic = false;
  int head_dim = 0;
  DType dtype = DType::BF16;
  bool causal = false;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0;
  TunedTime default_config;
  std::optional<TunedTime> chosen;  // empty: no config could be timed (see note)
  double gain = 1;                  // default ms / chosen ms; 1 when either is unknown
  bool kept_default = false, disturbed = false, resumed = false;
  bool compared = false;  // the gain is from the winner timed alternately with the default
  int busy_batches = 0;
  double noise_ms = 0;
  double seconds = 0;
  std::string note;
  std::vector<TunedConfig> results;  // every legal config

  std::string label() const;  // problem_label(): "bwd d128 bf16 causal N=4096 B=4 H=16"
};

// The fields of a row by the names the JSON report and Python's dict give them, in their order:
// one list for the writers (run_report_json, python/src/tune.cpp), the reader (read_run_report)
// and the copies from the tuner's TuneReport (tuned_problem). visit(name, row.member...) over
// one or more rows (const or not) that have the members, each a std::string, bool, int,
// int64_t, double, Pass or DType. A TunedProblem's row in the JSON report: "device", "key", the
// problem fields (an AttentionProblem's too), "default" and "chosen" (TunedTime), "gain", the
// outcome fields (a TuneReport's too), "results" (TunedConfig).
template <class Visit, class... Rows>
void visit_problem_fields(Visit&& visit, Rows&... rows) {
  visit("pass", rows.pass...);
  visit("deterministic", rows.deterministic...);
  visit("d", rows.head_dim...);
  visit("dtype", rows.dtype...);
  visit("causal", rows.causal...);
  visit("batch", rows.batch...);
  visit("heads_q", rows.heads_q...);
  visit("heads_kv", rows.heads_kv...);
  visit("seqlen_q", rows.seqlen_q...);
  visit("seqlen_k", rows.seqlen_k...);
}
template <class Visit, class... Rows>
void visit_outcome_fields(Visit&& visit, Rows&... rows) {
  visit("kept_default", rows.kept_default...);
  visit("compared", rows.compared...);
  visit("disturbed", rows.disturbed...);
  visit("busy_batches", rows.busy_batches...);
  visit("noise_ms", rows.noise_ms...);
  visit("resumed", rows.resumed...);
  visit("seconds", rows.seconds...);
  visit("note", rows.note...);
}
template <class Visit, class Time>  // Time: [const] TunedTime
void visit_time_fields(Visit&& visit, Time& time) {
  visit("config", time.config);
  visit("ms", time.ms);
  visit("tflops", time.tflops);
}
template <class Visit, class Config>  // Config: [const] TunedConfig
void visit_config_fields(Visit&& visit, Config& config) {
  visit("config", config.config);
  visit("status", config.status);
  visit("median_ms", config.median_ms);
  visit("min_ms", config.min_ms);
  visit("max_ms", config.max_ms);
  visit("repetitions", config.repetitions);
  visit("tflops", config.tflops);
  visit("is_default", config.is_default);
  visit("message", config.message);
}

struct TuneRunReport {
  // 0: every problem got a choice; 1: a device, DB or worker failure, or a problem without a
  // choice; 2: a bad request (InvalidArgument) or no device of the kind asked for; in a worker
  // process, kExitWorkerLost (tuner/supervisor.hpp) when its device became unusable.
  int status = 0;
  // Why the run stopped before tuning (status 1 or 2), as `flashjit tune` prints it after
  // "flashjit tune: " ("InvalidArgument: ...", "no CUDA device: ..."); empty otherwise.
  std::string message;
  // Failures of single devices during the run ("device 1: DriverError: ..."): status 1.
  std::vector<std::string> device_errors;
  bool nothing_to_tune = false;  // no problem left (an empty shard, no recorded problem)
  std::string backend;           // "cuda", "hip" or "cpu"
  std::string generator;         // generator_version()
  double seconds = 0;            // wall time of the tuning
  double geomean_gain = 1;       // over the problems whose default was timed
  std::vector<TunedProblem> problems;

  // The printed tables' throughput unit: GFLOP/s for the CPU backend, else TFLOP/s.
  RateUnit unit() const;
};

// The rows of `outcomes` (every report of every worker, in order), their geo-mean gain and
// `seconds`; status 1 with device_errors for the workers that failed.
TuneRunReport make_run_report(const std::vector<WorkerOutcome>& outcomes, double seconds);
TunedProblem tuned_problem(const std::string& device, const TuneReport& report);

// The geo-mean gain over the rows of `pass` (nullopt: all) that have a choice and a timed default.
GainSummary gain_summary(const TuneRunReport& report, std::optional<Pass> pass = std::nullopt);

// The closing table on stdout (a row per problem: default and chosen config, rates, gain), then
// the geo-mean gain overall and per pass when the run had more than one. False when some
// problem got no choice. `unit`: usually report.unit().
bool print_summary(const TuneRunReport& report, RateUnit unit);

// The JSON report ({"generator", "geomean_gain", "seconds", "problems": [...]}, see
// tuner/report.hpp write_json_report). With `handoff`, also the fields a supervisor needs back
// from its worker ("status", "message", "device_errors", "nothing_to_tune", "backend").
std::string run_report_json(const TuneRunReport& report, bool handoff = false);
// run_report_json to `path`; false when the file cannot be written.
bool write_run_report(const std::string& path, const TuneRunReport& report, bool handoff = false);
// A report written by write_run_report (InvalidArgument naming the path on a malformed file).
Result<TuneRunReport> read_run_report(const std::string& path);

}  // namespace flashjit
