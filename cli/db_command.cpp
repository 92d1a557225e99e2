// `flashjit db`: see cli/db_command.hpp.
#include "cli/db_command.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/args.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/runtime.hpp"
#include "runtime/tuning_store.hpp"

namespace flashjit::cli {
namespace {

namespace fs = std::filesystem;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

const Flag kDbFlag{"db", "PATH", "the tuning DB (default: $FLASHJIT_DB, else the user DB)"};
const Flag kAllFlag{"all", "", "every row: all devices and generator versions (stale marked)"};
const Flag kStaleFlag{"stale", "", "only rows of other generator versions"};
const Flag kHelpFlag{"help", "", "print this help and exit"};

// One `db` subcommand: its flags (as a cli::Command for parse_flags) and its positionals.
struct Subcommand {
  Command command;
  std::string_view positionals;  // "FILE", "OUT IN [IN...]", "" for none
  size_t min_positionals = 0;
  size_t max_positionals = 0;  // SIZE_MAX: any number
};

// The problem flags of `plan` (--batch ... --layout), without its device flags.
std::vector<Flag> problem_flags() {
  std::vector<Flag> flags;
  if (const Command* plan = find_command("plan")) {
    for (const Flag& flag : plan->flags) {
      if (flag.name != "arch" && flag.name != "device" && flag.name != "help") {
        flags.push_back(flag);
      }
    }
  }
  return flags;
}

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> kSubcommands = [] {
    std::vector<Flag> show_flags = problem_flags();
    show_flags.push_back(kDbFlag);
    show_flags.push_back(kAllFlag);
    show_flags.push_back(kHelpFlag);
    return std::vector<Subcommand>{
        {{"ls",
          "list the chosen config per key",
          "Lists the chosen config of every key (named with its pass: fwd, bwd or bwd-det):\n"
          "this machine's rows of the current generator version when there is a GPU, else\n"
          "every device's current rows. --all lists every row, with stale rows (another\n"
          "generator version) marked.",
          {kDbFlag, kAllFlag, kHelpFlag}},
         "",
         0,
         0},
        {{"show", "print every measured config of one problem's key",
          "Prints every results row of the problem's key (its pass; exact head dim, dtype,\n"
          "causal, GQA ratio; seqlens and batch*heads in power-of-two buckets), fastest first;\n"
          "'*' marks the chosen config. Without --all: this machine's rows (all devices'\n"
          "without a GPU) of the current generator version.",
          std::move(show_flags)},
         "",
         0,
         0},
        {{"export",
          "write a consistent single-file copy of the DB",
          "Writes a consistent copy of the DB to FILE (VACUUM INTO), in rollback-journal mode\n"
          "so that it can be shipped and opened read-only (FLASHJIT_SYSTEM_DB). A FILE ending\n"
          "in .sql gets the text form instead: the rows of devices, results and choices as\n"
          "one INSERT a line, sorted by key (what data/tuning/ keeps of the shipped DBs; merge\n"
          "or import reads it back). FILE must not exist.",
          {kDbFlag, kHelpFlag}},
         "FILE",
         1,
         1},
        {{"import",
          "merge a DB file into the user DB",
          "Copies every row of FILE into the DB (--db, default the user DB); on a conflict the\n"
          "newer row wins. A DB of schema version 1 (older releases) comes in as forward rows;\n"
          "a FILE ending in .sql is read as the text form (db export FILE.sql).",
          {kDbFlag, kHelpFlag}},
         "FILE",
         1,
         1},
        {{"merge",
          "merge DB files into OUT",
          "Copies every row of each IN into OUT (created if missing); on a conflict the newer\n"
          "row wins. A DB of schema version 1 (older releases) comes in as forward rows; an IN\n"
          "ending in .sql is read as the text form (db export FILE.sql). Shards of an array\n"
          "job (flashjit tune --shard I/N) merge into one DB this way.",
          {kHelpFlag}},
         "OUT IN [IN...]",
         2,
         SIZE_MAX},
        {{"clear",
          "delete rows from the DB",
          "Deletes every row of the DB, or with --stale only the rows of other generator\n"
          "versions (which are never used for selection).",
          {kDbFlag, kStaleFlag, kHelpFlag}},
         "",
         0,
         0},
    };
  }();
  return kSubcommands;
}

std::string subcommand_usage(const Subcommand& sub) {
  std::string out = "usage: flashjit db ";
  out += sub.command.name;
  out += " [flags]";
  if (!sub.positionals.empty()) {
    out += " ";
    out += sub.positionals;
  }
  out += "\n\n";
  out += sub.command.details;
  out += "\n\nflags:\n";
  for (const Flag& flag : sub.command.flags) {
    std::string left = "--";
    left += flag.name;
    if (!flag.is_switch()) {
      left += " ";
      left += flag.metavar;
    }
    if (left.size() < 18) left.resize(18, ' ');
    out += "  ";
    out += left;
    out += "  ";
    out += flag.help;
    out += "\n";
  }
  return out;
}

struct Invocation {
  const Subcommand* sub = nullptr;
  ParsedFlags flags;
  std::vector<std::string> positionals;
};

// Splits flags from positionals, then parses the flags with parse_flags.
Result<Invocation> parse(const std::vector<std::string>& args) {
  Invocation invocation;
  if (args.empty()) {
    return make_error(ErrorCode::InvalidArgument,
                      "missing subcommand: ls, show, export, import, merge or clear; see "
                      "flashjit db --help");
  }
  for (const Subcommand& sub : subcommands()) {
    if (sub.command.name == args[0]) invocation.sub = &sub;
  }
  if (invocation.sub == nullptr) {
    std::string message = "unknown subcommand '";
    message += args[0];
    message += "'; allowed: ls, show, export, import, merge, clear";
    return make_error(ErrorCode::InvalidArgument, std::move(message));
  }
  const Command& command = invocation.sub->command;
  std::vector<std::string> flag_args;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const bool is_flag = arg == "-h" || (arg.size() > 2 && arg.compare(0, 2, "--") == 0);
    if (!is_flag) {
      invocation.positionals.push_back(arg);
      continue;
    }
    flag_args.push_back(arg);
    // A value flag without "=value" takes the next argument as its value.
    if (arg.find('=') != std::string::npos || arg == "-h") continue;
    const std::string_view name = std::string_view(arg).substr(2);
    for (const Flag& flag : command.flags) {
      if (flag.name == name && !flag.is_switch() && i + 1 < args.size()) {
        flag_args.push_back(args[++i]);
      }
    }
  }
  Result<ParsedFlags> flags = parse_flags(command, flag_args);
  if (!flags.ok()) return flags.error();
  invocation.flags = std::move(flags.value());
  if (invocation.flags.has("help")) return invocation;

  const size_t count = invocation.positionals.size();
  if (count < invocation.sub->min_positionals || count > invocation.sub->max_positionals) {
    std::string message = "flashjit db ";
    message += command.name;
    if (invocation.sub->positionals.empty()) {
      message += " takes no arguments, got '";
      message += invocation.positionals.front();
      message += "'";
    } else {
      message += " needs ";
      message += invocation.sub->positionals;
      message += ", got ";
      message += std::to_string(count);
      message += count == 1 ? " argument" : " arguments";
    }
    message += "; see flashjit db ";
    message += command.name;
    message += " --help";
    return make_error(ErrorCode::InvalidArgument, std::move(message));
  }
  return invocation;
}

// --db, else the default user DB.
Result<fs::path> db_path(const ParsedFlags& flags) {
  if (std::optional<std::string> path = flags.get("db")) {
    if (path->empty()) return make_error(ErrorCode::InvalidArgument, "--db = '': needs a path");
    return fs::path(*path);
  }
  std::optional<fs::path> path = default_user_db();
  if (!path) {
    return make_error(ErrorCode::InvalidArgument,
                      "no user tuning DB (FLASHJIT_DB is 'none' or empty, or there is no home "
                      "directory): pass --db PATH");
  }
  return *path;
}

// This machine's fingerprint (device 0) when there is a usable CUDA GPU.
std::optional<std::string> this_device() {
  if (cuda::device_count() <= 0) return std::nullopt;
  Result<std::unique_ptr<cuda::CudaBackend>> backend = cuda::CudaBackend::create(0);
  if (!backend.ok()) return std::nullopt;
  return (*backend)->fingerprint().to_string();
}

std::string number(double value, const char* format = "%.4f") {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

// `text` left-aligned in `width` columns, and at least one space after it when it is longer.
std::string padded(std::string text, size_t width) {
  text.resize(std::max(width, text.size() + 1), ' ');
  return text;
}

std::string speedup(const TuneChoice& choice) {
  if (choice.median_ms <= 0 || choice.default_ms <= 0) return "-";
  return number(choice.default_ms / choice.median_ms, "%.2fx");
}

// The key with its pass always named: "fwd d128 bf16 ...", "bwd d128 ...", "bwd-det d128 ...".
std::string key_label(const ProblemKey& key) {
  if (key.pass != Pass::Forward) return key.to_string();  // already starts with the pass
  std::string label = key.pass_name();
  label += " ";
  label += key.to_string();
  return label;
}

// "3 fwd, 1 bwd, 1 bwd-det": how many of `entries` are of each pass (those present).
std::string pass_counts(const std::vector<TuningStore::Entry>& entries) {
  std::map<std::string, size_t> counts;
  for (const TuningStore::Entry& entry : entries) ++counts[entry.key.pass_name()];
  std::string out;
  for (const char* pass : {"fwd", "bwd", "bwd-det"}) {
    auto found = counts.find(pass);
    if (found == counts.end()) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(found->second);
    out += " ";
    out += pass;
  }
  return out;
}

// "5 choices (3 fwd, 2 bwd)".
std::string choice_summary(const std::vector<TuningStore::Entry>& entries) {
  std::string out = std::to_string(entries.size());
  out += " choices";
  if (!entries.empty()) {
    out += " (";
    out += pass_counts(entries);
    out += ")";
  }
  return out;
}

int report(std::ostream& err, std::string_view sub, const Error& error) {
  err << "flashjit db";
  if (!sub.empty()) err << " " << sub;
  err << ": " << error.describe() << "\n";
  return error.code == ErrorCode::InvalidArgument ? kExitUsage : kExitFailed;
}

int run_ls(const Invocation& in, std::ostream& out, std::ostream& err) {
  Result<fs::path> path = db_path(in.flags);
  if (!path.ok()) return report(err, "ls", path.error());
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open_read_only(*path);
  if (!store.ok()) return report(err, "ls", store.error());
  Result<std::vector<TuningStore::Entry>> entries = (*store)->entries();
  if (!entries.ok()) return report(err, "ls", entries.error());

  const bool all = in.flags.has("all");
  const std::optional<std::string> device = all ? std::nullopt : this_device();
  std::vector<TuningStore::Entry> shown;
  for (const TuningStore::Entry& entry : *entries) {
    if (!all && !entry.current) continue;
    if (device && entry.device != *device) continue;
    shown.push_back(entry);
  }
  std::stable_sort(shown.begin(), shown.end(),
                   [](const auto& a, const auto& b) { return a.device < b.device; });
  out << "tuning DB " << path->string() << ": " << shown.size() << " of " << entries->size()
      << " choices";
  if (!shown.empty()) out << " (" << pass_counts(shown) << ")";
  if (device) out << " (this machine's)";
  if (!all) out << " (current generators: " << backend_generator_versions() << ")";
  out << "\n";
  std::string last_device;
  for (const TuningStore::Entry& entry : shown) {
    if (entry.device != last_device || &entry == &shown.front()) {
      out << "device " << entry.device << "\n";
      out << "  " << padded("key", 48) << padded("config", 28) << padded("median_ms", 12)
          << padded("default_ms", 12) << padded("speedup", 9) << "generator\n";
      last_device = entry.device;
    }
    out << "  " << padded(key_label(entry.key), 48) << padded(entry.choice.config.to_string(), 28)
        << padded(number(entry.choice.median_ms), 12) << padded(number(entry.choice.default_ms), 12)
        << padded(speedup(entry.choice), 9) << entry.generator << (entry.current ? "" : " (stale)")
        << "\n";
  }
  return kExitOk;
}

int run_show(const Invocation& in, std::ostream& out, std::ostream& err) {
  Result<AttentionProblem> problem = problem_from_flags(in.flags);
  if (!problem.ok()) return report(err, "show", problem.error());
  Result<fs::path> path = db_path(in.flags);
  if (!path.ok()) return report(err, "show", path.error());
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open_read_only(*path);
  if (!store.ok()) return report(err, "show", store.error());
  const ProblemKey key = ProblemKey::of(*problem);
  Result<std::vector<TuningStore::ResultEntry>> rows = (*store)->result_entries(key);
  if (!rows.ok()) return report(err, "show", rows.error());
  Result<std::vector<TuningStore::Entry>> choices = (*store)->entries();
  if (!choices.ok()) return report(err, "show", choices.error());

  // The chosen config per (device, generator) of this key.
  std::map<std::pair<std::string, std::string>, AttentionConfig> chosen;
  for (const TuningStore::Entry& entry : *choices) {
    if (entry.key == key) chosen[{entry.device, entry.generator}] = entry.choice.config;
  }
  const bool all = in.flags.has("all");
  const std::optional<std::string> device = all ? std::nullopt : this_device();

  out << "key " << key_label(key) << " (" << problem->to_string() << ") in " << path->string()
      << "\n";
  size_t shown = 0;
  std::string last_group;
  for (const TuningStore::ResultEntry& row : *rows) {
    if (!all && !row.current) continue;
    if (device && row.device != *device) continue;
    const std::string group = row.device + "\n" + row.generator;
    if (group != last_group) {
      out << "device " << row.device << ", generator " << row.generator
          << (row.current ? "" : " (stale)") << "\n";
      out << "    " << padded("config", 28) << padded("status", 16) << padded("median_ms", 12)
          << padded("min_ms", 12) << padded("max_ms", 12) << padded("reps", 6)
          << padded("TFLOP/s", 9) << "notes\n";
      last_group = group;
    }
    auto choice = chosen.find({row.device, row.generator});
    const bool is_chosen = choice != chosen.end() && choice->second == row.result.config;
    std::string notes;
    if (row.result.is_default) notes += "default";
    if (!row.result.message.empty()) {
      if (!notes.empty()) notes += "; ";
      notes += row.result.message;
    }
    out << "  " << (is_chosen ? "* " : "  ") << padded(row.result.config.to_string(), 28)
        << padded(to_string(row.result.status), 16) << padded(number(row.result.median_ms), 12)
        << padded(number(row.result.min_ms), 12) << padded(number(row.result.max_ms), 12)
        << padded(std::to_string(row.result.repetitions), 6)
        << padded(number(row.result.tflops, "%.1f"), 9) << notes << "\n";
    ++shown;
  }
  if (shown == 0) out << "no results for this key\n";
  return kExitOk;
}

int run_export(const Invocation& in, std::ostream& out, std::ostream& err) {
  Result<fs::path> path = db_path(in.flags);
  if (!path.ok()) return report(err, "export", path.error());
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open_read_only(*path);
  if (!store.ok()) return report(err, "export", store.error());
  const fs::path file = in.positionals[0];
  Status exported = (*store)->export_to(file);
  if (!exported.ok()) return report(err, "export", exported.error());
  Result<std::vector<TuningStore::Entry>> entries = (*store)->entries();
  if (!entries.ok()) return report(err, "export", entries.error());
  out << "exported " << path->string() << " to " << file.string() << ": "
      << choice_summary(*entries) << "\n";
  return kExitOk;
}

// Merges `inputs` into the DB at `target` (created if missing).
int merge_into(std::string_view sub, const fs::path& target, const std::vector<fs::path>& inputs,
               std::ostream& out, std::ostream& err) {
  std::error_code ignored;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ignored);
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open(target);
  if (!store.ok()) return report(err, sub, store.error());
  for (const fs::path& input : inputs) {
    Status merged = (*store)->merge_from(input);
    if (!merged.ok()) return report(err, sub, merged.error());
  }
  Result<std::vector<TuningStore::Entry>> entries = (*store)->entries();
  if (!entries.ok()) return report(err, sub, entries.error());
  out << "merged " << inputs.size() << (inputs.size() == 1 ? " DB" : " DBs") << " into "
      << target.string() << ": " << choice_summary(*entries) << "\n";
  return kExitOk;
}

int run_import(const Invocation& in, std::ostream& out, std::ostream& err) {
  Result<fs::path> path = db_path(in.flags);
  if (!path.ok()) return report(err, "import", path.error());
  return merge_into("import", *path, {fs::path(in.positionals[0])}, out, err);
}

int run_merge(const Invocation& in, std::ostream& out, std::ostream& err) {
  std::vector<fs::path> inputs(in.positionals.begin() + 1, in.positionals.end());
  return merge_into("merge", in.positionals[0], inputs, out, err);
}

int run_clear(const Invocation& in, std::ostream& out, std::ostream& err) {
  Result<fs::path> path = db_path(in.flags);
  if (!path.ok()) return report(err, "clear", path.error());
  std::error_code ec;
  if (!fs::exists(*path, ec)) {
    std::string message = "tuning DB ";
    message += path->string();
    message += ": no such file";
    return report(err, "clear", make_error(ErrorCode::NotFound, std::move(message)));
  }
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open(*path);
  if (!store.ok()) return report(err, "clear", store.error());
  Result<std::vector<TuningStore::Entry>> before = (*store)->entries();
  if (!before.ok()) return report(err, "clear", before.error());
  const bool stale = in.flags.has("stale");
  Status cleared = (*store)->clear(stale);
  if (!cleared.ok()) return report(err, "clear", cleared.error());
  Result<std::vector<TuningStore::Entry>> after = (*store)->entries();
  if (!after.ok()) return report(err, "clear", after.error());
  out << "cleared " << (stale ? "stale rows of " : "") << path->string() << ": "
      << before->size() - after->size() << " choices deleted, " << after->size() << " left\n";
  return kExitOk;
}

}  // namespace

std::string db_usage() {
  std::string out =
      "usage: flashjit db <subcommand> [flags] [arguments]\n"
      "       flashjit db <subcommand> --help\n\n"
      "Tuning databases (SQLite; schema in docs/TUNING_DB.md). --db defaults to the user DB:\n"
      "$FLASHJIT_DB, else $XDG_DATA_HOME/flashjit/tuning.db or ~/.local/share/flashjit/"
      "tuning.db.\n\nsubcommands:\n";
  for (const Subcommand& sub : subcommands()) {
    std::string name(sub.command.name);
    name.resize(8, ' ');
    out += "  ";
    out += name;
    out += sub.command.summary;
    if (!sub.positionals.empty()) {
      out += " (";
      out += sub.positionals;
      out += ")";
    }
    out += "\n";
  }
  return out;
}

int run_db_command(const std::vector<std::string>& args) {
  return run_db_command(args, std::cout, std::cerr);
}

int run_db_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h" || args[0] == "help")) {
    out << db_usage();
    return kExitOk;
  }
  Result<Invocation> in = parse(args);
  if (!in.ok()) return report(err, "", in.error());
  if (in->flags.has("help")) {
    out << subcommand_usage(*in->sub);
    return kExitOk;
  }
  const std::string_view name = in->sub->command.name;
  if (name == "ls") return run_ls(*in, out, err);
  if (name == "show") return run_show(*in, out, err);
  if (name == "export") return run_export(*in, out, err);
  if (name == "import") return run_import(*in, out, err);
  if (name == "merge") return run_merge(*in, out, err);
  return run_clear(*in, out, err);
}

}  // namespace flashjit::cli
