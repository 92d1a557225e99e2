#include "tuner/report.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "generator/render.hpp"
#include "tuner/run_report.hpp"

namespace flashjit {
std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const long total = std::lround(seconds);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof(text), "%ld:%02ld:%02ld", total / 3600, total / 60 % 60, total % 60);
  } else {
    std::snprintf(text, sizeof(text), "%ld:%02ld", total / 60, total % 60);
  }
  return text;
}

std::string problem_label(const AttentionProblem& p) {
  // Built by appending: gcc 12 warns falsely (-Wrestrict) on "literal" + std::string&&.
  std::string label;
  if (p.is_backward()) label += p.deterministic ? "bwd-det " : "bwd ";
  label += "d";
  label += std::to_string(p.head_dim);
  label += " ";
  label += to_string(p.dtype);
  label += p.causal ? " causal" : " full";
  label += " N=";
  label += std::to_string(p.seqlen_q);
  if (p.seqlen_k != p.seqlen_q) {
    label += "/";
    label += std::to_string(p.seqlen_k);
  }
  label += " B=";
  label += std::to_string(p.batch);
  label += " H=";
  label += std::to_string(p.heads_q);
  if (p.heads_kv != p.heads_q) {
    label += "/";
    label += std::to_string(p.heads_kv);
  }
  return label;
}

RateUnit rate_unit_for(const Backend& backend) {
  return backend.name() == "cpu" ? RateUnit{"GFLOP/s", 1000} : RateUnit{};
}

// --- progress -----------------------------------------------------------------------------------

ProgressPrinter::ProgressPrinter(int workers, int total_steps, size_t total_problems, bool verbose,
                                 RateUnit unit)
    : unit_(unit),
      done_steps_(static_cast<size_t>(workers), 0),
      current_(static_cast<size_t>(workers)),
      total_steps_(std::max(1, total_steps)),
      total_problems_(total_problems),
      verbose_(verbose),
      tty_(isatty(fileno(stderr)) != 0),
      start_(Clock::now()) {}

void ProgressPrinter::update(int worker, const TuneProgress& progress) {
  std::lock_guard<std::mutex> lock(mutex_);
  Worker& w = current_[static_cast<size_t>(worker)];
  if (progress.phase == TuneProgress::Phase::Done) {
    done_steps_[static_cast<size_t>(worker)] += progress.steps;
    w.step = 0;
    ++problems_done_;
    clear_line();
    if (verbose_) print_table(*progress.report);
    if (!tty_ || !verbose_) print_done_line(*progress.report);
    w.label.clear();
  } else {
    w.step = progress.step;
    w.label = problem_label(*progress.problem);
    switch (progress.phase) {
      case TuneProgress::Phase::Compiling:
        w.activity = "compiling " + std::to_string(progress.compiles_done) + "/" +
                     std::to_string(progress.compiles_queued);
        break;
      case TuneProgress::Phase::Timing:
        w.activity = "timed " + progress.result->config.to_string();
        break;
      case TuneProgress::Phase::Retiming:
        w.activity = "re-timing the best";
        break;
      case TuneProgress::Phase::Comparing:
        w.activity = "comparing the best with the default";
        break;
      case TuneProgress::Phase::Done:
        break;
    }
  }
  if (tty_) draw_bar();
}

void ProgressPrinter::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  clear_line();
}

double ProgressPrinter::elapsed() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

int ProgressPrinter::steps_done() const {
  int done = 0;
  for (size_t i = 0; i < done_steps_.size(); ++i) done += done_steps_[i] + current_[i].step;
  return std::min(done, total_steps_);
}

std::string ProgressPrinter::eta() const {
  const int done = steps_done();
  if (done == 0) return "?";
  return format_duration(elapsed() * (total_steps_ - done) / done);
}

void ProgressPrinter::clear_line() {
  if (tty_ && drawn_) std::fprintf(stderr, "\r\033[K");
  drawn_ = false;
}

void ProgressPrinter::draw_bar() {
  const auto now = Clock::now();
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  constexpr int kWidth = 24;
  const int done = steps_done();
  const int filled = kWidth * done / total_steps_;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  std::string activity;
  for (const Worker& w : current_) {
    if (w.label.empty()) continue;
    if (!activity.empty()) activity += " | ";
    activity += w.label + ": " + w.activity;
  }
  std::fprintf(stderr, "\r\033[K[%s] %3d%% %zu/%zu problems  %s elapsed  ETA %s  %s", bar.c_str(),
               100 * done / total_steps_, problems_done_, total_problems_,
               format_duration(elapsed()).c_str(), eta().c_str(), activity.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressPrinter::print_done_line(const TuneReport& report) {
  // Built by appending: gcc 12 warns falsely (-Wrestrict) on "literal" + std::string&&.
  std::string line = "[";
  line += std::to_string(problems_done_);
  line += "/";
  line += std::to_string(total_problems_);
  line += "] ";
  line += problem_label(report.problem);
  line += ": ";
  char numbers[160];
  if (report.choice) {
    std::snprintf(numbers, sizeof(numbers), "%s %.1f %s (default %s %.1f), gain %.3fx",
                  report.choice->config.to_string().c_str(),
                  report.chosen_tflops() * unit_.per_tflops, unit_.name,
                  report.default_config.to_string().c_str(),
                  report.default_tflops() * unit_.per_tflops, report.gain());
    line += numbers;
  } else {
    line += "no choice: " + report.note;
  }
  if (report.resumed) line += " (from the DB)";
  std::fprintf(stderr, "%s  [%.1f s, ETA %s]\n", line.c_str(), report.seconds, eta().c_str());
  std::fflush(stderr);
}

void ProgressPrinter::print_table(const TuneReport& report) {
  std::printf("%s  (key %s, %.1f s)\n", problem_label(report.problem).c_str(),
              report.key.to_string().c_str(), report.seconds);
  std::printf("  %-18s %-14s %10s %9s %8s %7s  %s\n", "config", "status", "median ms", unit_.name,
              "spread", "reps", "notes");
  for (const TuneResult& r : report.results) {
    std::string notes;
    if (r.is_default) notes += "default ";
    if (report.choice && report.choice->config == r.config) notes += "CHOSEN ";
    notes += r.message;
    if (r.status == TuneStatus::Timed) {
      const double spread = r.median_ms > 0 ? 100.0 * (r.max_ms - r.min_ms) / r.median_ms : 0;
      std::printf("  %-18s %-14s %10.4f %9.1f %7.1f%% %7d  %s\n", r.config.to_string().c_str(),
                  to_string(r.status), r.median_ms, r.tflops * unit_.per_tflops, spread,
                  r.repetitions, notes.c_str());
    } else {
      std::printf("  %-18s %-14s %10s %9s %8s %7s  %s\n", r.config.to_string().c_str(),
                  to_string(r.status), "-", "-", "-", "-", notes.c_str());
    }
  }
  if (report.kept_default) {
    std::printf("  default kept: the fastest was within the noise (%.4f ms)\n", report.noise_ms);
  }
  if (report.compared) {
    std::printf("  gain from the winner timed alternately with the default (noise %.4f ms)\n",
                report.noise_ms);
  }
  if (report.busy_batches > 0) {
    std::printf("  %d timed batches disturbed by other work on the device: timed again\n",
                report.busy_batches);
  }
  std::fflush(stdout);
}

// --- summary and JSON ---------------------------------------------------------------------------

GainSummary gain_summary(const std::vector<WorkerOutcome>& outcomes, std::optional<Pass> pass) {
  double log_sum = 0;
  GainSummary summary;
  for (const WorkerOutcome& outcome : outcomes) {
    for (const TuneReport& r : outcome.reports) {
      if (pass && r.problem.pass != *pass) continue;
      if (!r.choice || r.default_ms <= 0) continue;
      log_sum += std::log(r.gain());
      ++summary.problems;
    }
  }
  if (summary.problems > 0) summary.geomean = std::exp(log_sum / summary.problems);
  return summary;
}

bool print_summary(const std::vector<WorkerOutcome>& outcomes, RateUnit unit, double seconds) {
  return print_summary(make_run_report(outcomes, seconds), unit);
}

bool write_json_report(const std::string& path, const std::vector<WorkerOutcome>& outcomes,
                       double seconds) {
  return write_run_report(path, make_run_report(outcomes, seconds));
}

}  // namespace flashjit
