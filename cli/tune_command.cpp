#include "cli/tune_command.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>

#include "generator/config.hpp"
#include "generator/render.hpp"
#include "runtime/binary_cache.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/runtime.hpp"
#include "runtime/tuning_store.hpp"
#include "tuner/tuner.hpp"

namespace flashjit::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// "--name = 'value': allowed". Built by appending (gcc 12 -Wrestrict on "literal" + string&&).
Error flag_error(std::string_view name, std::string_view value, std::string_view allowed) {
  std::string message("--");
  message.append(name);
  message += " = '";
  message.append(value);
  message += "': ";
  message.append(allowed);
  return make_error(ErrorCode::InvalidArgument, std::move(message));
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::string item;
  std::stringstream stream(text);
  while (std::getline(stream, item, separator)) items.push_back(item);
  if (!text.empty() && text.back() == separator) items.emplace_back();  // "1,2," -> empty item
  return items;
}

std::optional<int64_t> parse_integer(const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

// A comma-separated list of integers in [min_value, max_value]; `fallback` when absent.
Result<std::vector<int64_t>> integer_list_flag(const ParsedFlags& flags, std::string_view name,
                                               std::vector<int64_t> fallback, int64_t min_value,
                                               int64_t max_value) {
  std::optional<std::string> text = flags.get(name);
  if (!text) return fallback;
  std::vector<int64_t> values;
  for (const std::string& item : split(*text, ',')) {
    std::optional<int64_t> value = parse_integer(item);
    if (!value || *value < min_value || *value > max_value) {
      return flag_error(name, *text,
                        "expected comma-separated integers in [" + std::to_string(min_value) +
                            ", " + std::to_string(max_value) + "]");
    }
    if (std::find(values.begin(), values.end(), *value) == values.end()) values.push_back(*value);
  }
  if (values.empty()) return flag_error(name, *text, "expected at least one value");
  return values;
}

Result<double> positive_number_flag(const ParsedFlags& flags, std::string_view name,
                                    double fallback) {
  std::optional<std::string> text = flags.get(name);
  if (!text) return fallback;
  double value = 0;
  const char* end = text->data() + text->size();
  auto [ptr, ec] = std::from_chars(text->data(), end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value) || value <= 0) {
    return flag_error(name, *text, "must be a finite number > 0");
  }
  return value;
}

const std::vector<int64_t> kDefaultSeqlens = {512, 1024, 2048, 4096, 8192, 16384};
const std::vector<int64_t> kDefaultHeadDims = {64, 128, 256};

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

// "d128 bf16 causal N=4096 B=4 H=16" (Nq/Nk when they differ, H=q/kv for GQA).
std::string problem_label(const AttentionProblem& p) {
  std::string label = "d";
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

std::string json_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

// What one worker (one GPU) produced.
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

RateUnit rate_unit_for(const Backend& backend) {
  return backend.name() == "cpu" ? RateUnit{"GFLOP/s", 1000} : RateUnit{};
}

// Shared progress of all workers; printed on stderr.
class ProgressPrinter {
 public:
  ProgressPrinter(int workers, int total_steps, size_t total_problems, bool verbose, RateUnit unit)
      : unit_(unit),
        done_steps_(workers, 0),
        current_(workers),
        total_steps_(std::max(1, total_steps)),
        total_problems_(total_problems),
        verbose_(verbose),
        tty_(isatty(fileno(stderr)) != 0),
        start_(Clock::now()) {}

  void update(int worker, const TuneProgress& progress) {
    std::lock_guard<std::mutex> lock(mutex_);
    Worker& w = current_[worker];
    if (progress.phase == TuneProgress::Phase::Done) {
      done_steps_[worker] += progress.steps;
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
        case TuneProgress::Phase::Done:
          break;
      }
    }
    if (tty_) draw_bar();
  }

  void finish() {
    std::lock_guard<std::mutex> lock(mutex_);
    clear_line();
  }

  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  struct Worker {
    int step = 0;
    std::string label, activity;
  };

  int steps_done() const {
    int done = 0;
    for (size_t i = 0; i < done_steps_.size(); ++i) done += done_steps_[i] + current_[i].step;
    return std::min(done, total_steps_);
  }

  std::string eta() const {
    const int done = steps_done();
    if (done == 0) return "?";
    return format_duration(elapsed() * (total_steps_ - done) / done);
  }

  void clear_line() {
    if (tty_ && drawn_) std::fprintf(stderr, "\r\033[K");
    drawn_ = false;
  }

  void draw_bar() {
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

  void print_done_line(const TuneReport& report) {
    std::string line = "[" + std::to_string(problems_done_) + "/" +
                       std::to_string(total_problems_) + "] " + problem_label(report.problem) +
                       ": ";
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

  void print_table(const TuneReport& report) {
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
    std::fflush(stdout);
  }

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

bool write_json(const std::string& path, const std::vector<WorkerOutcome>& outcomes,
                double geomean_gain, double seconds) {
  std::ofstream out(path);
  out << "{\n  \"generator\": \"" << json_escape(generator_version()) << "\",\n"
      << "  \"geomean_gain\": " << json_number(geomean_gain) << ",\n"
      << "  \"seconds\": " << json_number(seconds) << ",\n  \"problems\": [";
  bool first = true;
  for (const WorkerOutcome& outcome : outcomes) {
    for (const TuneReport& r : outcome.reports) {
      const AttentionProblem& p = r.problem;
      out << (first ? "\n" : ",\n");
      first = false;
      out << "    {\"device\": \"" << json_escape(outcome.device) << "\", \"key\": \""
          << json_escape(r.key.to_string()) << "\", \"d\": " << p.head_dim << ", \"dtype\": \""
          << to_string(p.dtype) << "\", \"causal\": " << (p.causal ? "true" : "false")
          << ", \"batch\": " << p.batch << ", \"heads_q\": " << p.heads_q
          << ", \"heads_kv\": " << p.heads_kv << ", \"seqlen_q\": " << p.seqlen_q
          << ", \"seqlen_k\": " << p.seqlen_k << ",\n     \"default\": {\"config\": \""
          << r.default_config.to_string() << "\", \"ms\": " << json_number(r.default_ms)
          << ", \"tflops\": " << json_number(r.default_tflops()) << "}, \"chosen\": ";
      if (r.choice) {
        out << "{\"config\": \"" << r.choice->config.to_string()
            << "\", \"ms\": " << json_number(r.choice->median_ms)
            << ", \"tflops\": " << json_number(r.chosen_tflops()) << "}";
      } else {
        out << "null";
      }
      out << ", \"gain\": " << json_number(r.gain())
          << ", \"kept_default\": " << (r.kept_default ? "true" : "false")
          << ", \"noise_ms\": " << json_number(r.noise_ms)
          << ", \"resumed\": " << (r.resumed ? "true" : "false")
          << ", \"seconds\": " << json_number(r.seconds) << ", \"note\": \"" << json_escape(r.note)
          << "\",\n     \"results\": [";
      for (size_t i = 0; i < r.results.size(); ++i) {
        const TuneResult& c = r.results[i];
        out << (i ? ",\n" : "\n") << "       {\"config\": \"" << c.config.to_string()
            << "\", \"status\": \"" << to_string(c.status)
            << "\", \"median_ms\": " << json_number(c.median_ms)
            << ", \"min_ms\": " << json_number(c.min_ms)
            << ", \"max_ms\": " << json_number(c.max_ms) << ", \"repetitions\": " << c.repetitions
            << ", \"tflops\": " << json_number(c.tflops)
            << ", \"is_default\": " << (c.is_default ? "true" : "false") << ", \"message\": \""
            << json_escape(c.message) << "\"}";
      }
      out << "]}";
    }
  }
  out << "\n  ]\n}\n";
  return static_cast<bool>(out);
}

int usage_error(const Error& error) {
  std::cerr << "flashjit tune: " << error.describe() << "\n";
  return kExitUsage;
}

}  // namespace

const Command& tune_command() {
  static const Command kCommand = {
      "tune",
      "tune tile configs on the GPU(s) and write the tuning DB",
      "Compiles every legal config of each problem (in parallel), verifies each against an fp64\n"
      "reference, times the correct ones (CUDA events, inputs rotated past 2x L2, median of\n"
      "repeated batches), re-times the best against the default and records every result and\n"
      "the choice in the tuning DB. A config only replaces the default if it is faster by more\n"
      "than the measured noise. Results already in the DB for this device are not measured\n"
      "again (resume); --retune measures everything anew.\n"
      "The grid is every combination of --head-dims, --dtypes, --causal and --seqlens, with\n"
      "batch = --tokens / seqlen (or --batch) and heads = --hidden / head dim (or --heads);\n"
      "the default is the standard grid (36 bf16 problems); on the CPU (no GPU, or --backend cpu)\n"
      "it is a small one: d 64,128 x N 256,1024 x causal both, batch 1, 4 heads, bf16.",
      {
          {"head-dims", "LIST", "head dims, e.g. 64,128,256 (default 64,128,256)"},
          {"dtypes", "LIST", "bf16,fp16,fp32 (fp32: CPU backend only; default bf16)"},
          {"causal", "WHICH", "on, off or both (default both)"},
          {"seqlens", "LIST", "sequence lengths (default 512,1024,2048,4096,8192,16384)"},
          {"tokens", "N", "total tokens: batch = N / seqlen, at least 1 (default 16384)"},
          {"batch", "N", "fixed batch size instead of --tokens"},
          {"hidden", "N", "hidden size: heads = N / head dim, at least 1 (default 2048)"},
          {"heads", "N", "fixed query heads instead of --hidden"},
          {"kv-heads", "N", "key/value heads (GQA), dividing the query heads (default: equal)"},
          {"recorded", "", "tune the problems the runtime recorded as untuned in the DB"},
          {"db", "PATH", "tuning DB (default: $FLASHJIT_DB or ~/.local/share/flashjit/tuning.db)"},
          {"devices", "LIST", "CUDA devices to tune on, one worker each: 0,1 or all (default 0)"},
          {"backend", "B",
           "auto, cuda or cpu (default: $FLASHJIT_BACKEND or auto: CUDA if present, else CPU)"},
          {"shard", "I/N", "tune only problems whose index is I modulo N (array jobs)"},
          {"retune", "", "measure everything again, ignoring results already in the DB"},
          {"min-time-ms", "MS", "device time spent timing each config (default 80)"},
          {"retime-top", "N", "configs re-timed against the default (default 3)"},
          {"jobs", "N", "parallel compiles per device (default: CPU cores - 1)"},
          {"verbose", "", "print a table of every config of each problem"},
          {"json", "PATH", "also write the reports to PATH as JSON"},
          {"help", "", "print this help and exit"},
      }};
  return kCommand;
}

std::vector<AttentionProblem> cpu_default_problems() {
  std::vector<AttentionProblem> problems;
  for (int head_dim : {64, 128})
    for (int64_t seqlen : {256, 1024})
      for (bool causal : {false, true})
        problems.push_back(
            AttentionProblem::make(1, 4, 4, seqlen, seqlen, head_dim, DType::BF16, causal));
  return problems;
}

Result<std::vector<AttentionProblem>> tune_problems_from_flags(const ParsedFlags& flags) {
  auto head_dims =
      integer_list_flag(flags, "head-dims", kDefaultHeadDims, kMinHeadDim, kMaxHeadDim);
  FLASHJIT_TRY(head_dims);
  for (int64_t d : *head_dims) {
    if (d % 8 != 0) {
      return flag_error("head-dims", *flags.get("head-dims"),
                        "head dims must be multiples of 8 in [" + std::to_string(kMinHeadDim) +
                            ", " + std::to_string(kMaxHeadDim) + "]");
    }
  }

  std::vector<DType> dtypes;
  if (std::optional<std::string> text = flags.get("dtypes")) {
    for (const std::string& item : split(*text, ',')) {
      Result<DType> dtype = parse_dtype(item);
      if (!dtype.ok())
        return flag_error("dtypes", *text, "allowed: bf16, fp16, fp32 (comma-separated)");
      if (std::find(dtypes.begin(), dtypes.end(), *dtype) == dtypes.end()) dtypes.push_back(*dtype);
    }
    if (dtypes.empty())
      return flag_error("dtypes", *text, "allowed: bf16, fp16, fp32 (comma-separated)");
  } else {
    dtypes = {DType::BF16};
  }

  std::vector<bool> causal_values = {false, true};
  if (std::optional<std::string> text = flags.get("causal")) {
    if (*text == "both" || *text == "on,off" || *text == "off,on") {
      causal_values = {false, true};
    } else if (*text == "on") {
      causal_values = {true};
    } else if (*text == "off") {
      causal_values = {false};
    } else {
      return flag_error("causal", *text, "allowed: on, off, both");
    }
  }

  auto seqlens = integer_list_flag(flags, "seqlens", kDefaultSeqlens, 1, kMaxInt32);
  FLASHJIT_TRY(seqlens);

  if (flags.has("tokens") && flags.has("batch")) {
    return flag_error("batch", *flags.get("batch"), "give --tokens or --batch, not both");
  }
  if (flags.has("hidden") && flags.has("heads")) {
    return flag_error("heads", *flags.get("heads"), "give --hidden or --heads, not both");
  }
  auto tokens = integer_flag(flags, "tokens", kTuneDefaultTokens, 1, int64_t{1} << 40);
  FLASHJIT_TRY(tokens);
  auto batch = integer_flag(flags, "batch", 0, 1, kMaxInt32);
  FLASHJIT_TRY(batch);
  auto hidden = integer_flag(flags, "hidden", kTuneDefaultHidden, 1, int64_t{1} << 24);
  FLASHJIT_TRY(hidden);
  auto heads = integer_flag(flags, "heads", 0, 1, kMaxInt32);
  FLASHJIT_TRY(heads);
  auto kv_heads = integer_flag(flags, "kv-heads", 0, 1, kMaxInt32);
  FLASHJIT_TRY(kv_heads);

  std::vector<AttentionProblem> problems;
  for (DType dtype : dtypes) {
    for (int64_t d : *head_dims) {
      const int64_t heads_q = *heads > 0 ? *heads : std::max<int64_t>(1, *hidden / d);
      const int64_t heads_kv = *kv_heads > 0 ? *kv_heads : heads_q;
      if (heads_kv > heads_q || heads_q % heads_kv != 0) {
        return flag_error("kv-heads", *flags.get("kv-heads"),
                          "must divide the query heads (" + std::to_string(heads_q) +
                              " for head dim " + std::to_string(d) + ")");
      }
      for (bool causal : causal_values) {
        for (int64_t n : *seqlens) {
          const int64_t b = *batch > 0 ? *batch : std::max<int64_t>(1, *tokens / n);
          AttentionProblem problem = AttentionProblem::make(b, heads_q, heads_kv, n, n,
                                                            static_cast<int>(d), dtype, causal);
          Status valid = validate(problem);
          if (!valid.ok()) return valid.error();
          problems.push_back(problem);
        }
      }
    }
  }
  return problems;
}

Result<Shard> shard_from_flags(const ParsedFlags& flags) {
  std::optional<std::string> text = flags.get("shard");
  if (!text) return Shard{};
  const std::vector<std::string> parts = split(*text, '/');
  std::optional<int64_t> index, count;
  if (parts.size() == 2) {
    index = parse_integer(parts[0]);
    count = parse_integer(parts[1]);
  }
  if (!index || !count || *count < 1 || *count > 1000000 || *index < 0 || *index >= *count) {
    return flag_error("shard", *text, "expected I/N with 0 <= I < N, e.g. 0/4");
  }
  return Shard{static_cast<int>(*index), static_cast<int>(*count)};
}

std::vector<AttentionProblem> select_shard(const std::vector<AttentionProblem>& problems,
                                           const Shard& shard) {
  std::vector<AttentionProblem> selected;
  for (size_t i = 0; i < problems.size(); ++i) {
    if (static_cast<int64_t>(i % shard.count) == shard.index) selected.push_back(problems[i]);
  }
  return selected;
}

Result<std::vector<int>> devices_from_flags(const ParsedFlags& flags, int device_count) {
  std::optional<std::string> text = flags.get("devices");
  if (!text) return std::vector<int>{0};
  std::vector<int> devices;
  if (*text == "all") {
    for (int i = 0; i < device_count; ++i) devices.push_back(i);
    if (devices.empty()) return flag_error("devices", *text, "there is no CUDA device");
    return devices;
  }
  auto list = integer_list_flag(flags, "devices", {}, 0, 1023);
  FLASHJIT_TRY(list);
  for (int64_t ordinal : *list) {
    if (ordinal >= device_count) {
      return flag_error("devices", *text,
                        "device " + std::to_string(ordinal) + " does not exist (" +
                            std::to_string(device_count) + " CUDA device(s): 0.." +
                            std::to_string(device_count - 1) + ", or all)");
    }
    devices.push_back(static_cast<int>(ordinal));
  }
  return devices;
}

std::vector<std::vector<AttentionProblem>> split_for_workers(
    const std::vector<AttentionProblem>& problems, int workers) {
  workers = std::max(1, workers);
  std::vector<std::vector<AttentionProblem>> parts(static_cast<size_t>(workers));
  const size_t n = problems.size();
  for (size_t w = 0, begin = 0; w < parts.size(); ++w) {
    const size_t end = n * (w + 1) / parts.size();
    parts[w].assign(problems.begin() + begin, problems.begin() + end);
    begin = end;
  }
  return parts;
}

int run_tune_command(const std::vector<std::string>& args) {
  const Command& command = tune_command();
  if (std::find_if(args.begin(), args.end(), [](const std::string& arg) {
        return arg == "--help" || arg == "-h";
      }) != args.end()) {
    std::cout << command_usage(command);
    return kExitOk;
  }
  auto flags = parse_flags(command, args);
  if (!flags.ok()) return usage_error(flags.error());

  // Everything that needs no device first, so that a bad flag is reported as one.
  const bool recorded = flags->has("recorded");
  if (recorded) {
    for (const char* grid_flag : {"head-dims", "dtypes", "causal", "seqlens", "tokens", "batch",
                                  "hidden", "heads", "kv-heads"}) {
      if (flags->has(grid_flag)) {
        return usage_error(flag_error(grid_flag, *flags->get(grid_flag),
                                      "--recorded tunes the recorded problems; give no grid"));
      }
    }
  }
  std::vector<AttentionProblem> problems;
  if (!recorded) {
    auto grid = tune_problems_from_flags(*flags);
    if (!grid.ok()) return usage_error(grid.error());
    problems = std::move(grid.value());
  }
  auto shard = shard_from_flags(*flags);
  if (!shard.ok()) return usage_error(shard.error());
  TuneOptions options;
  auto min_time = positive_number_flag(*flags, "min-time-ms", options.min_time_ms);
  if (!min_time.ok()) return usage_error(min_time.error());
  options.min_time_ms = *min_time;
  auto retime_top = integer_flag(*flags, "retime-top", options.retime_top, 0, 64);
  if (!retime_top.ok()) return usage_error(retime_top.error());
  options.retime_top = static_cast<int>(*retime_top);
  auto jobs = integer_flag(*flags, "jobs", 0, 1, 1024);
  if (!jobs.ok()) return usage_error(jobs.error());
  options.max_compile_threads = static_cast<int>(*jobs);
  options.resume = !flags->has("retune");
  options.verbose = flags->has("verbose");

  // --backend: auto tunes on the GPU(s) if there is one, else on the CPU (where built in).
  auto backend_name = resolve_backend(flags->get("backend").value_or(default_backend_name()));
  if (!backend_name.ok()) {
    if (backend_name.error().code == ErrorCode::NoDevice) {
      std::cerr << "flashjit tune: no CUDA device: " << backend_name.error().message << "\n";
      return kExitUsage;
    }
    return usage_error(backend_name.error());
  }
  const bool on_cpu = *backend_name == "cpu";
  std::vector<int> device_list = {0};
  if (on_cpu) {
    if (flags->has("devices")) {
      return usage_error(flag_error("devices", *flags->get("devices"),
                                    "the CPU is one device; --devices is for CUDA"));
    }
    // The standard grid is far too big for a CPU: without grid flags, a small one.
    bool grid_given = false;
    for (const char* grid_flag : {"head-dims", "dtypes", "causal", "seqlens", "tokens", "batch",
                                  "hidden", "heads", "kv-heads"}) {
      grid_given = grid_given || flags->has(grid_flag);
    }
    if (!recorded && !grid_given) problems = cpu_default_problems();
  } else if (*backend_name == "hip") {
    const int device_count = gpu_device_count("hip");
    if (device_count == 0) {
      std::cerr << "flashjit tune: no AMD GPU (HIP) found\n";
      return kExitUsage;
    }
    auto devices = devices_from_flags(*flags, device_count);
    if (!devices.ok()) return usage_error(devices.error());
    device_list = *devices;
  } else {
    const int device_count = cuda::device_count();
    if (device_count == 0) {
      Result<DeviceSpec> device = cuda::query_device(0);
      std::cerr << "flashjit tune: no CUDA device: "
                << (device.ok() ? std::string("none found") : device.error().message) << "\n";
      return kExitUsage;
    }
    auto devices = devices_from_flags(*flags, device_count);
    if (!devices.ok()) return usage_error(devices.error());
    device_list = *devices;
  }
  const std::vector<int>* devices = &device_list;

  std::vector<std::unique_ptr<Backend>> backends;
  for (int ordinal : *devices) {
    auto backend = create_backend(*backend_name, ordinal);
    if (!backend.ok()) {
      std::cerr << "flashjit tune: device " << ordinal << ": " << backend.error().describe()
                << "\n";
      return backend.error().code == ErrorCode::NoDevice ? kExitUsage : kExitFailed;
    }
    backends.push_back(std::move(backend.value()));
  }

  // A grid the backend cannot run (fp32 on CUDA) is a usage error, named before anything runs.
  for (const AttentionProblem& problem : problems) {
    Status supported = backends.front()->check_problem(problem);
    if (!supported.ok()) return usage_error(supported.error());
  }

  std::optional<std::filesystem::path> db_path;
  if (std::optional<std::string> text = flags->get("db")) {
    db_path = *text;
  } else {
    db_path = default_user_db();
  }
  std::unique_ptr<TuningStore> store;
  if (db_path) {
    std::error_code ignored;
    if (db_path->has_parent_path())
      std::filesystem::create_directories(db_path->parent_path(), ignored);
    auto opened = TuningStore::open(*db_path);
    if (!opened.ok()) {
      std::cerr << "flashjit tune: " << opened.error().describe() << "\n";
      return kExitFailed;
    }
    store = std::move(opened.value());
  } else {
    std::cerr << "flashjit tune: warning: no tuning DB ($FLASHJIT_DB disables it, or there is no "
                 "home directory): results are not saved; pass --db PATH\n";
  }

  if (recorded) {
    if (!store) {
      return usage_error(
          make_error(ErrorCode::InvalidArgument, "--recorded needs a tuning DB (pass --db PATH)"));
    }
    auto listed = store->recorded_problems(backends.front()->fingerprint());
    if (!listed.ok()) {
      std::cerr << "flashjit tune: " << listed.error().describe() << "\n";
      return kExitFailed;
    }
    for (AttentionProblem& problem : listed.value()) {
      Status valid = backends.front()->check_problem(problem);
      if (valid.ok()) {
        problems.push_back(std::move(problem));
      } else {
        std::cerr << "flashjit tune: warning: skipping recorded " << problem.to_string() << ": "
                  << valid.error().message << "\n";
      }
    }
  }
  problems = select_shard(problems, *shard);
  if (problems.empty()) {
    std::cout << "flashjit tune: nothing to tune"
              << (recorded ? " (no recorded problems for this device)" : "") << "\n";
    return kExitOk;
  }

  const BinaryCache cache(BinaryCache::default_dir());
  const std::vector<std::vector<AttentionProblem>> parts =
      split_for_workers(problems, static_cast<int>(backends.size()));
  int total_steps = 0;
  for (size_t w = 0; w < parts.size(); ++w) {
    for (const AttentionProblem& p : parts[w]) {
      total_steps += static_cast<int>(backends[w]->legal_configs(p).size()) + 1;
    }
  }

  std::fprintf(stderr, "flashjit tune: %zu problem(s) on %zu device(s)", problems.size(),
               backends.size());
  if (shard->count > 1) std::fprintf(stderr, ", shard %d/%d", shard->index, shard->count);
  std::fprintf(stderr, ", DB %s\n", store ? store->path().c_str() : "(none)");
  for (const auto& backend : backends) {
    std::fprintf(stderr, "  %s\n", backend->fingerprint().to_string().c_str());
  }

  const RateUnit unit = rate_unit_for(*backends.front());
  ProgressPrinter printer(static_cast<int>(backends.size()), total_steps, problems.size(),
                          options.verbose, unit);
  std::vector<WorkerOutcome> outcomes(backends.size());
  std::vector<std::thread> workers;
  for (size_t w = 0; w < backends.size(); ++w) {
    workers.emplace_back([&, w] {
      TuneOptions worker_options = options;
      worker_options.on_progress = [&printer, w](const TuneProgress& progress) {
        printer.update(static_cast<int>(w), progress);
      };
      WorkerOutcome& outcome = outcomes[w];
      outcome.device = backends[w]->fingerprint().to_string();
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
  for (std::thread& worker : workers) worker.join();
  printer.finish();
  const double seconds = printer.elapsed();

  // The summary.
  int exit_status = kExitOk;
  std::printf("\n%-36s %-13s %9s  %-18s %9s %7s\n", "problem", "default", unit.name, "chosen",
              unit.name, "gain");
  double log_gain_sum = 0;
  int gains = 0;
  for (const WorkerOutcome& outcome : outcomes) {
    for (const TuneReport& r : outcome.reports) {
      const std::string label = problem_label(r.problem);
      if (!r.choice) {
        std::printf("%-36s %-13s %9.1f  %-18s %9s %7s  %s\n", label.c_str(),
                    r.default_config.to_string().c_str(), r.default_tflops() * unit.per_tflops, "-",
                    "-", "-", r.note.c_str());
        exit_status = kExitFailed;
        continue;
      }
      std::printf("%-36s %-13s %9.1f  %-18s %9.1f %6.3fx%s\n", label.c_str(),
                  r.default_config.to_string().c_str(), r.default_tflops() * unit.per_tflops,
                  r.choice->config.to_string().c_str(), r.chosen_tflops() * unit.per_tflops,
                  r.gain(), r.kept_default ? "  (default kept: within noise)" : "");
      if (r.default_ms > 0) {
        log_gain_sum += std::log(r.gain());
        ++gains;
      }
    }
  }
  const double geomean = gains > 0 ? std::exp(log_gain_sum / gains) : 1.0;
  std::printf("geo-mean gain %.3fx over %d problem(s); total time %s\n", geomean, gains,
              format_duration(seconds).c_str());
  for (size_t w = 0; w < outcomes.size(); ++w) {
    if (outcomes[w].error) {
      std::cerr << "flashjit tune: device " << (*devices)[w] << ": "
                << outcomes[w].error->describe() << "\n";
      exit_status = kExitFailed;
    }
  }

  if (std::optional<std::string> json = flags->get("json")) {
    if (!write_json(*json, outcomes, geomean, seconds)) {
      std::cerr << "flashjit tune: cannot write " << *json << "\n";
      exit_status = kExitFailed;
    }
  }
  return exit_status;
}

}  // namespace flashjit::cli
