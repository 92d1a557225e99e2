// `flashjit report`: see cli/report_command.hpp.
#include "cli/report_command.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "cli/args.hpp"
#include "cli/svg.hpp"
#include "generator/render.hpp"
#include "runtime/runtime.hpp"
#include "runtime/tuning_store.hpp"
#include "tuner/json.hpp"

namespace flashjit::cli {
namespace {

namespace fs = std::filesystem;
using svg::escape;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

const Command& report_command() {
  static const Command kCommand{
      "report",
      "write one self-contained HTML report of a tuning DB (and a side-by-side run)",
      "Writes FILE.html: per problem key of the tuning DB, every measured config's speed (the\n"
      "chosen one and the default marked), the choice against the default and the configs that\n"
      "failed and why; with --side-by-side, the vs-peers summary, plots and table of a\n"
      "bench/side_by_side.py JSON (docs/perf/*.json). Inline SVG, no scripts, no network.",
      {{"db", "PATH", "the tuning DB (default: $FLASHJIT_DB, else the user DB)"},
       {"side-by-side", "FILE", "a bench/side_by_side.py JSON to add (vs-peers table, plots)"},
       {"out", "FILE", "the HTML file to write (required)"},
       {"help", "", "print this help and exit"}}};
  return kCommand;
}

std::string fmt(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// "fwd d128 bf16 ...", "bwd d128 ...", "bwd-det d128 ...".
std::string key_label(const ProblemKey& key) {
  if (key.pass != Pass::Forward) return key.to_string();
  return std::string(key.pass_name()) + " " + key.to_string();
}

// The CPU's speeds are in GFLOP/s (its rows store TFLOP/s like every device's).
bool is_cpu(const std::string& device) { return device.rfind("cpu|", 0) == 0; }

constexpr const char* kStyle = R"css(
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1300px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ccc; }
h3 { font-size: 15px; margin-top: 24px; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
td, th { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.stale { color: #a33; } .muted { color: #777; } pre { white-space: pre-wrap; margin: 0; }
.chosen { color: #d62728; font-weight: bold; } .default { color: #c0504d; }
)css";

// --- The tuning DB ----------------------------------------------------------------------------

struct KeyRows {
  std::string device;
  std::string generator;
  bool current = false;
  ProblemKey key;
  std::vector<TuningStore::ResultEntry> rows;
  std::optional<TuneChoice> choice;
};

std::string db_section(const fs::path& path, const std::vector<TuningStore::ResultEntry>& results,
                       const std::vector<TuningStore::Entry>& choices) {
  // Group the rows (already sorted by device, generator, key) and attach each key's choice.
  std::vector<KeyRows> groups;
  for (const TuningStore::ResultEntry& row : results) {
    if (groups.empty() || groups.back().device != row.device ||
        groups.back().generator != row.generator || !(groups.back().key == row.key)) {
      groups.push_back({row.device, row.generator, row.current, row.key, {}, std::nullopt});
    }
    groups.back().rows.push_back(row);
  }
  for (KeyRows& group : groups) {
    for (const TuningStore::Entry& entry : choices) {
      if (entry.device == group.device && entry.generator == group.generator &&
          entry.key == group.key) {
        group.choice = entry.choice;
      }
    }
  }
  // This build's rows first.
  std::stable_partition(groups.begin(), groups.end(), [](const KeyRows& g) { return g.current; });

  std::string out = "<h2>Tuning DB</h2>\n<p>" + escape(path.string()) + ": " +
                    std::to_string(groups.size()) + " problem keys, " +
                    std::to_string(results.size()) + " measured configs, " +
                    std::to_string(choices.size()) +
                    " choices. This build's generator: " + escape(generator_version()) +
                    " (rows of other generator versions are <span class=\"stale\">stale</span>: "
                    "never served).</p>\n";
  if (groups.empty()) return out + "<p class=\"muted\">No results in this DB.</p>\n";

  // The overview: one line per key.
  out +=
      "<table class=\"overview\"><tr><th>key</th><th>device</th><th>chosen</th><th>speed</th>"
      "<th>default</th><th>gain</th><th>timed</th><th>failed</th></tr>\n";
  for (size_t i = 0; i < groups.size(); ++i) {
    const KeyRows& g = groups[i];
    size_t timed = 0, failed = 0;
    double chosen_speed = 0;
    std::string default_name = "-";
    for (const auto& row : g.rows) {
      (row.result.status == TuneStatus::Timed ? timed : failed) += 1;
      if (row.result.is_default) default_name = row.result.config.to_string();
      if (g.choice && row.result.config == g.choice->config) chosen_speed = row.result.tflops;
    }
    const double scale = is_cpu(g.device) ? 1000 : 1;
    const std::string unit = is_cpu(g.device) ? " GFLOP/s" : " TFLOP/s";
    const bool gain = g.choice && g.choice->median_ms > 0 && g.choice->default_ms > 0;
    out += "<tr><td><a href=\"#key" + std::to_string(i) + "\">" + escape(key_label(g.key)) +
           "</a>" + (g.current ? "" : " <span class=\"stale\">(stale)</span>") + "</td><td>" +
           escape(g.device.substr(0, g.device.find('|', g.device.find('|') + 1))) + "</td><td>" +
           (g.choice ? escape(g.choice->config.to_string()) : "-") + "</td><td class=\"num\">" +
           (chosen_speed > 0 ? fmt("%.3g", chosen_speed * scale) + unit : "-") + "</td><td>" +
           escape(default_name) + "</td><td class=\"num\">" +
           (gain ? fmt("%.2fx", g.choice->default_ms / g.choice->median_ms) : "-") +
           "</td><td class=\"num\">" + std::to_string(timed) + "</td><td class=\"num\">" +
           std::to_string(failed) + "</td></tr>\n";
  }
  out += "</table>\n";

  // Per key: the landscape, the choice, the failures.
  for (size_t i = 0; i < groups.size(); ++i) {
    const KeyRows& g = groups[i];
    const double scale = is_cpu(g.device) ? 1000 : 1;
    out += "<section class=\"key\" id=\"key" + std::to_string(i) + "\">\n<h3>" +
           escape(key_label(g.key)) + (g.current ? "" : " <span class=\"stale\">(stale)</span>") +
           "</h3>\n<p class=\"muted\">device " + escape(g.device) + ", generator " +
           escape(g.generator) + "</p>\n";
    std::vector<const TuningStore::ResultEntry*> timed, failed;
    for (const auto& row : g.rows) {
      (row.result.status == TuneStatus::Timed ? timed : failed).push_back(&row);
    }
    std::stable_sort(timed.begin(), timed.end(),
                     [](auto* a, auto* b) { return a->result.tflops > b->result.tflops; });
    if (g.choice) {
      std::string line = "<p>Chosen: <span class=\"chosen\">" +
                         escape(g.choice->config.to_string()) + "</span>, " +
                         fmt("%.4g ms", g.choice->median_ms);
      if (g.choice->default_ms > 0 && g.choice->median_ms > 0) {
        line += "; the default " + fmt("%.4g ms", g.choice->default_ms) + ": gain " +
                fmt("%.3fx", g.choice->default_ms / g.choice->median_ms);
      }
      out += line + ".</p>\n";
    } else {
      out += "<p class=\"muted\">No choice recorded for this key (an interrupted tune).</p>\n";
    }
    std::vector<svg::Bar> bars;
    for (const auto* row : timed) {
      const bool chosen = g.choice && row->result.config == g.choice->config;
      std::string note = chosen ? "chosen" : "";
      if (row->result.is_default) note += note.empty() ? "default" : ", default";
      bars.push_back({row->result.config.to_string(), row->result.tflops * scale,
                      chosen                   ? svg::kChosen
                      : row->result.is_default ? svg::kDefault
                                               : svg::kOther,
                      note});
    }
    if (!bars.empty()) out += svg::bar_chart(bars, is_cpu(g.device) ? "GFLOP/s" : "TFLOP/s");
    if (!failed.empty()) {
      out += "<table class=\"failures\"><tr><th>config</th><th>status</th><th>why</th></tr>\n";
      for (const auto* row : failed) {
        out += "<tr><td>" + escape(row->result.config.to_string()) + "</td><td>" +
               escape(to_string(row->result.status)) + "</td><td><pre>" +
               escape(row->result.message) + "</pre></td></tr>\n";
      }
      out += "</table>\n";
    }
    out += "</section>\n";
  }
  return out;
}

// --- A side-by-side run -----------------------------------------------------------------------

// bench/side_by_side_report.py's implementations and passes, in its order and colors.
const std::vector<std::tuple<std::string, std::string, std::string>>& impls() {
  static const std::vector<std::tuple<std::string, std::string, std::string>> kImpls = {
      {"flashjit-tuned", "flashjit tuned", svg::kChosen},
      {"flashjit-default", "flashjit default", svg::kDefault},
      {"torch-flash", "torch SDPA flash", svg::kOther},
      {"cudnn", "torch SDPA cuDNN", svg::kFourth}};
  return kImpls;
}
const char* pass_title(const std::string& pass) {
  if (pass == "fwd") return "forward";
  if (pass == "bwd") return "backward";
  if (pass == "fwd+bwd") return "forward + backward";
  return "?";
}

// TFLOP/s of `impl` on `row`, or nullopt (no time, an error, a wrong result).
std::optional<double> tflops_of(const Json& row, const std::string& impl) {
  const Json& result = row["results"][impl];
  const double ms = result["ms"].number_or(0);
  if (!(ms > 0) || result["error"].kind != Json::Kind::Null ||
      (result["wrong"].kind == Json::Kind::Bool && result["wrong"].boolean)) {
    return std::nullopt;
  }
  return row["flops"].number_or(0) / (ms * 1e-3) / 1e12;
}

std::string ratio_cell(const Json& entry) {
  const double value = entry["geomean"].number_or(NAN);
  if (!std::isfinite(value)) return "<td class=\"num\">-</td>";
  return "<td class=\"num\">" + fmt("%.2fx", value) + " <span class=\"muted\">(" +
         fmt("%.0f", entry["shapes"].number_or(0)) + ")</span></td>";
}

Result<std::string> peers_section(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return make_error(ErrorCode::NotFound, "--side-by-side " + path.string() + ": no such file");
  }
  Result<Json> parsed = parse_json(read_file(path), "--side-by-side " + path.string());
  if (!parsed.ok()) return parsed.error();
  const Json& doc = *parsed;
  const Json& rows = doc["rows"];
  if (!doc.is_object() || !rows.is_array()) {
    return make_error(ErrorCode::InvalidArgument,
                      "--side-by-side " + path.string() +
                          ": not a bench/side_by_side.py JSON (needs 'rows': [...])");
  }
  const Json& meta = doc["meta"];
  std::string out = "<h2>Side by side: " + escape(meta["device"].text_or("?")) + "</h2>\n<p>" +
                    escape(path.string()) + "</p>\n<table class=\"meta\">";
  for (const char* field :
       {"device", "date", "commit", "torch", "cudnn", "generator", "fingerprint", "timing"}) {
    if (meta[field].is_string()) {
      out +=
          "<tr><th>" + std::string(field) + "</th><td>" + escape(meta[field].string) + "</td></tr>";
    }
  }
  out += "</table>\n";

  // Rows by pass (rows of older runs have no "pass": the forward), in report order.
  std::map<std::string, std::vector<const Json*>> by_pass;
  for (const Json& row : rows.items) by_pass[row["pass"].text_or("fwd")].push_back(&row);
  std::vector<std::string> passes;
  for (const char* pass : {"fwd", "bwd", "fwd+bwd"}) {
    if (by_pass.count(pass)) passes.push_back(pass);
  }

  // The summary as side_by_side.py computed it: per pass, or (older runs) one for the forward.
  const Json& summary = doc["summary"];
  out +=
      "<h3>Summary (geo-mean ratios of TFLOP/s, same run; shapes in parentheses)</h3>\n"
      "<table class=\"peers\"><tr><th>pass</th><th>ratio</th><th>bf16</th><th>fp16</th>"
      "<th>all</th><th>worst shape</th><th>best shape</th></tr>\n";
  for (const std::string& pass : passes) {
    const Json& per_pass = summary["ratios"].is_array() && pass == "fwd" ? summary : summary[pass];
    for (const Json& ratio : per_pass["ratios"].items) {
      out += "<tr><td>" + escape(pass) + "</td><td>" + escape(ratio["title"].text_or("?")) +
             "</td>" + ratio_cell(ratio["by_dtype"]["bf16"]) +
             ratio_cell(ratio["by_dtype"]["fp16"]) + ratio_cell(ratio["overall"]);
      for (const char* end : {"worst", "best"}) {
        const Json& shape = ratio[end];
        out += shape.is_object() ? "<td>" + escape(shape["shape"].text_or("?")) + " " +
                                       fmt("%.2fx", shape["ratio"].number_or(NAN)) + "</td>"
                                 : "<td>-</td>";
      }
      out += "</tr>\n";
    }
  }
  out += "</table>\n";

  // Per pass and dtype: TFLOP/s vs seqlen, one panel per (head dim, causal).
  for (const std::string& pass : passes) {
    std::set<std::string> dtypes;
    for (const Json* row : by_pass[pass]) dtypes.insert((*row)["dtype"].text_or("?"));
    for (const std::string& dtype : dtypes) {
      std::map<std::pair<bool, double>, svg::Panel> panels;  // (causal, d)
      for (const Json* row : by_pass[pass]) {
        if ((*row)["dtype"].text_or("?") != dtype) continue;
        const bool causal = (*row)["causal"].kind == Json::Kind::Bool && (*row)["causal"].boolean;
        const double d = (*row)["d"].number_or(0);
        svg::Panel& panel = panels[{causal, d}];
        panel.title = "d = " + fmt("%.0f", d) + (causal ? ", causal" : ", non-causal");
        for (const auto& [impl, name, color] : impls()) {
          std::optional<double> value = tflops_of(*row, impl);
          if (!value) continue;
          // Clang 14 cannot capture a structured binding in a lambda (C++20, P1091).
          const auto& series_name = name;
          auto series = std::find_if(panel.series.begin(), panel.series.end(),
                                     [&](const svg::Series& s) { return s.name == series_name; });
          if (series == panel.series.end()) {
            panel.series.push_back({name, color, {}});
            series = panel.series.end() - 1;
          }
          series->points.emplace_back((*row)["N"].number_or(0), *value);
        }
      }
      std::vector<svg::Panel> ordered;
      std::set<double> head_dims;
      for (auto& [where, panel] : panels) {
        ordered.push_back(std::move(panel));
        head_dims.insert(where.second);
      }
      out += "<h3>" + escape(dtype) + " " + pass_title(pass) + "</h3>\n";
      out += svg::line_panels(dtype + " " + pass_title(pass) + ", " + meta["device"].text_or("?"),
                              ordered, static_cast<int>(head_dims.size()), "seqlen", "TFLOP/s");
    }
  }

  // Every shape's numbers.
  out +=
      "<details><summary>Every shape (TFLOP/s)</summary>\n<table class=\"shapes\"><tr>"
      "<th>pass</th><th>dtype</th><th>d</th><th>causal</th><th>N</th>";
  for (const auto& [impl, name, color] : impls()) out += "<th>" + escape(name) + "</th>";
  out += "<th>tuned config</th></tr>\n";
  for (const std::string& pass : passes) {
    for (const Json* row : by_pass[pass]) {
      out += "<tr><td>" + escape(pass) + "</td><td>" + escape((*row)["dtype"].text_or("?")) +
             "</td><td class=\"num\">" + fmt("%.0f", (*row)["d"].number_or(0)) + "</td><td>" +
             ((*row)["causal"].boolean ? "yes" : "no") + "</td><td class=\"num\">" +
             fmt("%.0f", (*row)["N"].number_or(0)) + "</td>";
      for (const auto& [impl, name, color] : impls()) {
        std::optional<double> value = tflops_of(*row, impl);
        out += "<td class=\"num\">" + (value ? fmt("%.1f", *value) : std::string("-")) + "</td>";
      }
      out += "<td>" + escape((*row)["results"]["flashjit-tuned"]["config"].text_or("-")) +
             "</td></tr>\n";
    }
  }
  out += "</table></details>\n";
  return out;
}

int report(std::ostream& err, const Error& error) {
  err << "flashjit report: " << error.describe() << "\n";
  return error.code == ErrorCode::InvalidArgument ? kExitUsage : kExitFailed;
}

}  // namespace

int run_report_command(const std::vector<std::string>& args) {
  return run_report_command(args, std::cout, std::cerr);
}

int run_report_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const Command& command = report_command();
  if (std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    out << command_usage(command);
    return kExitOk;
  }
  Result<ParsedFlags> flags = parse_flags(command, args);
  if (!flags.ok()) return report(err, flags.error());
  const std::optional<std::string> html = flags->get("out");
  if (!html || html->empty()) {
    return report(err, make_error(ErrorCode::InvalidArgument, "--out FILE.html is required"));
  }
  const std::optional<std::string> peers = flags->get("side-by-side");

  std::string body;
  std::optional<fs::path> db;
  if (std::optional<std::string> given = flags->get("db")) {
    db = *given;
  } else if (std::optional<fs::path> user = default_user_db(); user && !peers) {
    db = *user;  // the user DB; with --side-by-side only when named
  }
  if (!db && !peers) {
    return report(err, make_error(ErrorCode::InvalidArgument,
                                  "no tuning DB (FLASHJIT_DB is 'none' or there is no home "
                                  "directory): pass --db PATH or --side-by-side FILE"));
  }
  if (db) {
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open_read_only(*db);
    if (!store.ok()) return report(err, store.error());
    Result<std::vector<TuningStore::ResultEntry>> results = (*store)->result_entries();
    if (!results.ok()) return report(err, results.error());
    Result<std::vector<TuningStore::Entry>> choices = (*store)->entries();
    if (!choices.ok()) return report(err, choices.error());
    body += db_section(*db, *results, *choices);
  }
  if (peers) {
    Result<std::string> section = peers_section(*peers);
    if (!section.ok()) return report(err, section.error());
    body += *section;
  }

  std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::ofstream file(*html, std::ios::binary | std::ios::trunc);
  file << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       << "<title>flashjit report</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n"
       << "<h1>flashjit report</h1>\n<p class=\"muted\">Written " << stamp
       << " by flashjit report (generator " << escape(generator_version()) << ").</p>\n"
       << body << "</body>\n</html>\n";
  file.close();
  if (!file) {
    return report(err, make_error(ErrorCode::IoError, "--out " + *html + ": cannot write"));
  }
  out << "wrote " << *html << "\n";
  return kExitOk;
}

}  // namespace flashjit::cli
