// How a tuning run reports (`flashjit tune`, and through it the Python module's tune()): a
// progress bar and one line per finished problem on stderr, per-config tables on stdout
// (verbose), the closing summary table, and the JSON report (--json). Every record names the
// problem's pass: a label "bwd d128 bf16 causal N=4096 B=4 H=16" ("bwd-det" for deterministic
// backward problems, nothing for the forward), and "pass"/"deterministic" fields in the JSON.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "tuner/tuner.hpp"

namespace flashjit {

// "d128 bf16 causal N=4096 B=4 H=16" (forward), "bwd d128 ..." / "bwd-det d128 ..." (backward);
// N=q/k when the sequence lengths differ, H=q/kv for GQA.
std::string problem_label(const AttentionProblem& problem);

// "m:ss" or "h:mm:ss"; "?" for a negative or absurd value.
std::string format_duration(double seconds);

// What one worker (one device) produced.
struct WorkerOutcome {
  std::string device;  // fingerprint
  std::vector<TuneReport> reports;
  std::optional<Error> error;
};

// Throughput unit of the printed tables: TFLOP/s on GPUs, GFLOP/s on the CPU backend (whose
// rates would print as 0.0 TFLOP/s).
struct RateUnit {
  const char* name = "TFLOP/s";
  double per_tflops = 1;  // printed value = TFLOP/s * per_tflops
};
RateUnit rate_unit_for(const Backend& backend);

// Shared progress of all workers, printed on stderr: a bar redrawn in place on a terminal, a
// line per finished problem otherwise (and always without --verbose); with verbose a table of
// every config of each finished problem on stdout. Thread-safe.
class ProgressPrinter {
 public:
  ProgressPrinter(int workers, int total_steps, size_t total_problems, bool verbose, RateUnit unit);

  void update(int worker, const TuneProgress& progress);
  void finish();  // clears the bar
  double elapsed() const;

 private:
  struct Worker {
    int step = 0;
    std::string label, activity;
  };
  using Clock = std::chrono::steady_clock;

  int steps_done() const;
  std::string eta() const;
  void clear_line();
  void draw_bar();
  void print_done_line(const TuneReport& report);
  void print_table(const TuneReport& report);

  const RateUnit unit_;
  std::mutex mutex_;
  std::vector<int> done_steps_;
  std::vector<Worker> current_;
  int total_steps_;
  size_t total_problems_;
  size_t problems_done_ = 0;
  bool verbose_;
  bool tty_;
  bool drawn_ = false;
  Clock::time_point start_;
  Clock::time_point last_draw_;
};

// The geo-mean gain (default time / chosen time) over the problems whose default was timed.
struct GainSummary {
  double geomean = 1.0;
  int problems = 0;
};
GainSummary gain_summary(const std::vector<WorkerOutcome>& outcomes,
                         std::optional<Pass> pass = std::nullopt);  // nullopt: every pass

// Prints the closing table on stdout (a row per problem: default and chosen config, rates,
// gain), then the geo-mean gain overall and per pass when the run had more than one. Returns
// false when some problem got no choice.
bool print_summary(const std::vector<WorkerOutcome>& outcomes, RateUnit unit, double seconds);

// Writes every report as JSON to `path` ({"generator", "geomean_gain", "seconds", "problems":
// [{"device", "key", "pass", "deterministic", "d", "dtype", "causal", sizes, "default",
// "chosen", "gain", ..., "results": [...]}]}). False when the file cannot be written.
bool write_json_report(const std::string& path, const std::vector<WorkerOutcome>& outcomes,
                       double seconds);

}  // namespace flashjit
