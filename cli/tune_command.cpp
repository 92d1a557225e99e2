#include "cli/tune_command.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>

#include "runtime/runtime.hpp"
#include "tuner/grid.hpp"
#include "tuner/tune_run.hpp"

namespace flashjit::cli {
namespace {

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

// A finite number > 0 (>= 0 with zero_allowed).
Result<double> number_flag(const ParsedFlags& flags, std::string_view name, double fallback,
                           bool zero_allowed = false) {
  std::optional<std::string> text = flags.get(name);
  if (!text) return fallback;
  double value = 0;
  const char* end = text->data() + text->size();
  auto [ptr, ec] = std::from_chars(text->data(), end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value) || value < 0 ||
      (value == 0 && !zero_allowed)) {
    return flag_error(
        name, *text, zero_allowed ? "must be a finite number >= 0" : "must be a finite number > 0");
  }
  return value;
}

// `flashjit tune --hang-timeout`'s default: no single load, verification or timed batch of a
// working kernel comes near it.
constexpr double kDefaultHangSeconds = 120;

int usage_error(const Error& error) {
  std::cerr << "flashjit tune: " << error.describe() << "\n";
  return kExitUsage;
}

// The flags that shape the problems of the grid (not the passes): --recorded excludes them, and
// on the CPU without any of them the grid is the small cpu_default_grid().
constexpr const char* kShapeFlags[] = {"head-dims", "dtypes", "causal", "seqlens", "tokens",
                                       "batch",     "hidden", "heads",  "kv-heads"};

// The grid's flags, the variant flags (as plan, show and run take them: args.cpp), the run's.
std::vector<Flag> tune_flags() {
  std::vector<Flag> flags = {
      {"pass", "LIST", "fwd, bwd or fwd,bwd: the passes to tune (default fwd)"},
      {"deterministic", "",
       "backward problems: bitwise reproducible gradients (separate dQ kernel configs only)"},
      {"head-dims", "LIST", "head dims, e.g. 64,128,256 (default 64,128,256)"},
      {"dtypes", "LIST", "bf16,fp16,fp32 (fp32: CPU backend only; default bf16)"},
      {"causal", "WHICH", "on, off or both (default both)"},
      {"seqlens", "LIST", "sequence lengths (default 512,1024,2048,4096,8192,16384)"},
      {"tokens", "N", "total tokens: batch = N / seqlen, at least 1 (default 16384)"},
      {"batch", "N", "fixed batch size instead of --tokens"},
      {"hidden", "N", "hidden size: heads = N / head dim, at least 1 (default 2048)"},
      {"heads", "N", "fixed query heads instead of --hidden"},
      {"kv-heads", "N", "key/value heads (GQA), dividing the query heads (default: equal)"},
  };
  for (const Flag& flag : variant_flags()) flags.push_back(flag);
  flags.insert(
      flags.end(),
      {
          {"page-size", "N", "forward problems read K/V from a paged cache of N keys a page"},
          {"recorded", "",
           "tune the problems the runtime recorded as untuned in the DB (each with its pass)"},
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
          {"no-isolate", "",
           "tune in this process (a kernel that faults then ends the run; default: in a worker "
           "process, started anew when a kernel kills it)"},
          {"hang-timeout", "S",
           "a config in flight this long without progress is a hung kernel: its worker is "
           "killed, the config recorded as failed, the run goes on (default 120; 0: never)"},
          {"help", "", "print this help and exit"},
      });
  return flags;
}

}  // namespace

const Command& tune_command() {
  static const Command kCommand = {
      "tune", "tune tile configs on the GPU(s) and write the tuning DB",
      "Compiles every legal config of each problem (in parallel), verifies each against an fp64\n"
      "reference, times the correct ones (CUDA events, inputs rotated past 2x L2, median of\n"
      "repeated batches), re-times the best against the default and records every result and\n"
      "the choice in the tuning DB. A config only replaces the default if it is faster by more\n"
      "than the measured noise. Results already in the DB for this device are not measured\n"
      "again (resume); --retune measures everything anew.\n"
      "The grid is every combination of --pass, --head-dims, --dtypes, --causal and --seqlens,\n"
      "with batch = --tokens / seqlen (or --batch) and heads = --hidden / head dim (or --heads);\n"
      "the default is the standard grid (36 bf16 forward problems; --pass fwd,bwd: 72, each\n"
      "shape's backward tuned after its forward); on the CPU (no GPU, or --backend cpu) it is a\n"
      "small one: d 64,128 x N 256,1024 x causal both, batch 1, 4 heads, bf16.\n"
      "A --score-mod or --mask-mod is verified against the fp64 reference, which compiles it for\n"
      "the host: the CPU backend's Clang JIT, else the host's C++ compiler.",
      tune_flags()};
  return kCommand;
}

bool grid_flags_given(const ParsedFlags& flags) {
  for (const char* name : kShapeFlags) {
    if (flags.has(name)) return true;
  }
  return false;
}

Result<ProblemGrid> grid_from_flags(const ParsedFlags& flags, const ProblemGrid& base) {
  ProblemGrid grid = base;
  if (std::optional<std::string> text = flags.get("pass")) {
    grid.passes.clear();
    for (const std::string& item : split(*text, ',')) {
      Result<Pass> pass = parse_pass(item);
      if (!pass.ok()) return flag_error("pass", *text, "allowed: fwd, bwd (comma-separated)");
      if (std::find(grid.passes.begin(), grid.passes.end(), *pass) == grid.passes.end())
        grid.passes.push_back(*pass);
    }
    if (grid.passes.empty())
      return flag_error("pass", *text, "allowed: fwd, bwd (comma-separated)");
    // Forward first, whatever the order given: a shape's forward is tuned before its backward.
    std::sort(grid.passes.begin(), grid.passes.end());
  }
  if (flags.has("deterministic")) {
    if (std::find(grid.passes.begin(), grid.passes.end(), Pass::Backward) == grid.passes.end()) {
      return make_error(ErrorCode::InvalidArgument,
                        "--deterministic applies to the backward pass only: add --pass bwd (or "
                        "--pass fwd,bwd)");
    }
    grid.deterministic = true;
  }

  std::vector<int64_t> base_dims(grid.head_dims.begin(), grid.head_dims.end());
  auto head_dims = integer_list_flag(flags, "head-dims", base_dims, kMinHeadDim, kMaxHeadDim);
  FLASHJIT_TRY(head_dims);
  grid.head_dims.clear();
  for (int64_t d : *head_dims) {
    if (d % 8 != 0) {
      return flag_error("head-dims", *flags.get("head-dims"),
                        "head dims must be multiples of 8 in [" + std::to_string(kMinHeadDim) +
                            ", " + std::to_string(kMaxHeadDim) + "]");
    }
    grid.head_dims.push_back(static_cast<int>(d));
  }

  if (std::optional<std::string> text = flags.get("dtypes")) {
    grid.dtypes.clear();
    for (const std::string& item : split(*text, ',')) {
      Result<DType> dtype = parse_dtype(item);
      if (!dtype.ok())
        return flag_error("dtypes", *text, "allowed: bf16, fp16, fp32 (comma-separated)");
      if (std::find(grid.dtypes.begin(), grid.dtypes.end(), *dtype) == grid.dtypes.end())
        grid.dtypes.push_back(*dtype);
    }
    if (grid.dtypes.empty())
      return flag_error("dtypes", *text, "allowed: bf16, fp16, fp32 (comma-separated)");
  }

  if (std::optional<std::string> text = flags.get("causal")) {
    if (*text == "both" || *text == "on,off" || *text == "off,on") {
      grid.causal = {false, true};
    } else if (*text == "on") {
      grid.causal = {true};
    } else if (*text == "off") {
      grid.causal = {false};
    } else {
      return flag_error("causal", *text, "allowed: on, off, both");
    }
  }

  auto seqlens = integer_list_flag(flags, "seqlens", grid.seqlens, 1, kMaxInt32);
  FLASHJIT_TRY(seqlens);
  grid.seqlens = *seqlens;

  if (flags.has("tokens") && flags.has("batch")) {
    return flag_error("batch", *flags.get("batch"), "give --tokens or --batch, not both");
  }
  if (flags.has("hidden") && flags.has("heads")) {
    return flag_error("heads", *flags.get("heads"), "give --hidden or --heads, not both");
  }
  auto tokens = integer_flag(flags, "tokens", grid.tokens, 1, int64_t{1} << 40);
  FLASHJIT_TRY(tokens);
  auto batch = integer_flag(flags, "batch", 0, 1, kMaxInt32);
  FLASHJIT_TRY(batch);
  auto hidden = integer_flag(flags, "hidden", grid.hidden, 1, int64_t{1} << 24);
  FLASHJIT_TRY(hidden);
  auto heads = integer_flag(flags, "heads", 0, 1, kMaxInt32);
  FLASHJIT_TRY(heads);
  auto kv_heads = integer_flag(flags, "kv-heads", grid.kv_heads, 1, kMaxInt32);
  FLASHJIT_TRY(kv_heads);
  // --tokens replaces a fixed batch of the base grid and --batch a token budget; likewise the
  // heads.
  if (flags.has("tokens")) grid.batch = 0;
  if (flags.has("batch")) grid.batch = *batch;
  grid.tokens = *tokens;
  if (flags.has("hidden")) grid.heads = 0;
  if (flags.has("heads")) grid.heads = *heads;
  grid.hidden = *hidden;
  grid.kv_heads = *kv_heads;
  for (int d : grid.head_dims) {
    const int64_t heads_q = grid_heads(grid, d);
    const int64_t heads_kv = grid_kv_heads(grid, d);
    if (heads_kv > heads_q || heads_q % heads_kv != 0) {
      return flag_error("kv-heads", flags.get("kv-heads").value_or(std::to_string(heads_kv)),
                        "must divide the query heads (" + std::to_string(heads_q) +
                            " for head dim " + std::to_string(d) + ")");
    }
  }
  return grid;
}

Result<std::vector<AttentionProblem>> tune_problems_from_flags(const ParsedFlags& flags,
                                                               const ProblemGrid& base) {
  Result<ProblemGrid> grid = grid_from_flags(flags, base);
  FLASHJIT_TRY(grid);
  Result<std::vector<AttentionProblem>> problems = grid_problems(*grid);
  FLASHJIT_TRY(problems);
  // The variant and K/V layout flags (as plan/show/run take them) apply to every problem.
  // Each problem is validated here, once the flags are applied, so that a grid the flags
  // cannot tune (e.g. --pass bwd with --score-mod but no --score-mod-grad) is refused when the
  // flags are checked, not by the tuner later.
  for (AttentionProblem& problem : *problems) {
    FLASHJIT_TRY(apply_variant_flags(flags, problem.variant));
    FLASHJIT_TRY(apply_page_size_flag(flags, problem));
    if (Status valid = validate(problem); !valid.ok()) {
      if (problem.pass == Pass::Backward && !problem.variant.score_mod.empty() &&
          problem.variant.score_mod_grad.empty()) {
        return flag_error("score-mod", *flags.get("score-mod"),
                          "a grid with the backward pass (--pass bwd) needs --score-mod-grad "
                          "EXPR, the derivative d score_mod / d score");
      }
      return make_error(valid.error().code,
                        "tune grid problem " + problem.to_string() + ": " + valid.error().message);
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

namespace {
std::vector<std::string>& worker_command() {
  static std::vector<std::string> command;
  return command;
}
}  // namespace

void set_worker_command(std::vector<std::string> command) { worker_command() = std::move(command); }

void set_worker_executable(std::string path) { set_worker_command({std::move(path)}); }

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

  // Flags -> request, everything that needs no device first, so that a bad flag is reported as
  // one (named as the flag).
  TuneRequest request;
  request.recorded = flags->has("recorded");
  if (request.recorded) {
    // Recorded problems carry their own pass and shape.
    for (const char* grid_flag : {"pass", "deterministic", "head-dims", "dtypes", "causal",
                                  "seqlens", "tokens", "batch", "hidden", "heads", "kv-heads"}) {
      if (!flags->has(grid_flag)) continue;
      const std::string why =
          "--recorded tunes the recorded problems (each with its pass); give "
          "no grid";
      const std::string value = *flags->get(grid_flag);
      return usage_error(value.empty() ? make_error(ErrorCode::InvalidArgument,
                                                    "--" + std::string(grid_flag) + ": " + why)
                                       : flag_error(grid_flag, value, why));
    }
  } else {
    auto problems = tune_problems_from_flags(*flags);
    if (!problems.ok()) return usage_error(problems.error());
    Result<ProblemGrid> grid = grid_from_flags(*flags);
    if (!grid.ok()) return usage_error(grid.error());
    // Without a flag that shapes the problems, the backend's default grid (the CPU's is small).
    if (grid_flags_given(*flags)) {
      request.grid = *grid;
    } else {
      request.passes = grid->passes;
      request.deterministic = grid->deterministic;
    }
    Status variant = apply_variant_flags(*flags, request.variant);
    if (!variant.ok()) return usage_error(variant.error());
    auto page_size = integer_flag(*flags, "page-size", 0, kMinPageSize, kMaxPageSize);
    if (!page_size.ok()) return usage_error(page_size.error());
    request.page_size = static_cast<int>(*page_size);
  }
  auto shard = shard_from_flags(*flags);
  if (!shard.ok()) return usage_error(shard.error());
  request.shard = *shard;
  auto min_time = number_flag(*flags, "min-time-ms", request.options.min_time_ms);
  if (!min_time.ok()) return usage_error(min_time.error());
  request.options.min_time_ms = *min_time;
  auto retime_top = integer_flag(*flags, "retime-top", request.options.retime_top, 0, 64);
  if (!retime_top.ok()) return usage_error(retime_top.error());
  request.options.retime_top = static_cast<int>(*retime_top);
  auto jobs = integer_flag(*flags, "jobs", 0, 1, 1024);
  if (!jobs.ok()) return usage_error(jobs.error());
  request.options.max_compile_threads = static_cast<int>(*jobs);
  request.retune = flags->has("retune");
  request.options.verbose = flags->has("verbose");
  auto hang = number_flag(*flags, "hang-timeout", kDefaultHangSeconds, /*zero_allowed=*/true);
  if (!hang.ok()) return usage_error(hang.error());
  request.hang_seconds = *hang;
  request.backend = flags->get("backend").value_or(default_backend_name());
  if (std::optional<std::string> devices = flags->get("devices")) {
    if (*devices == "all") {
      request.all_devices = true;
    } else {
      auto list = integer_list_flag(*flags, "devices", {}, 0, 1023);
      if (!list.ok()) return usage_error(list.error());
      for (int64_t ordinal : *list) request.devices.push_back(static_cast<int>(ordinal));
    }
  }
  if (std::optional<std::string> db = flags->get("db")) request.db = *db;
  if (!flags->has("no-isolate") && !worker_command().empty()) {
    // Crash isolation: the same command in a worker process, restarted when a kernel kills it.
    request.worker_argv = worker_command();
    request.worker_argv.push_back("tune");
    request.worker_argv.insert(request.worker_argv.end(), args.begin(), args.end());
  }

  ConsoleProgress console(request);
  const TuneRunReport report = run_tune(request);
  console.finish();
  if (in_tune_worker()) return report.status;  // its supervisor prints the report

  if (!report.message.empty()) std::cerr << "flashjit tune: " << report.message << "\n";
  if (report.nothing_to_tune) {
    std::cout << "flashjit tune: nothing to tune"
              << (request.recorded ? " (no recorded problems for this device)" : "") << "\n";
    return report.status;
  }
  if (!report.message.empty() && report.problems.empty()) return report.status;

  int exit_status = print_summary(report, report.unit()) ? report.status : kExitFailed;
  for (const std::string& error : report.device_errors) {
    std::cerr << "flashjit tune: " << error << "\n";
  }
  if (std::optional<std::string> json = flags->get("json")) {
    if (!write_run_report(*json, report)) {
      std::cerr << "flashjit tune: cannot write " << *json << "\n";
      exit_status = kExitFailed;
    }
  }
  return exit_status;
}

}  // namespace flashjit::cli
