#include "tuner/run_report.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "generator/render.hpp"
#include "tuner/json.hpp"

namespace flashjit {
namespace {

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

const char* json_bool(bool value) { return value ? "true" : "false"; }

// Writes the fields a visit_*_fields gives (run_report.hpp) as JSON members, ", " between them
// (and before the first unless `first`).
class JsonMembers {
 public:
  explicit JsonMembers(std::ostream& out, bool first = true) : out_(out), first_(first) {}
  template <class T>
  void operator()(const char* name, const T& value) {
    out_ << (first_ ? "\"" : ", \"") << name << "\": ";
    first_ = false;
    if constexpr (std::is_same_v<T, std::string>) {
      out_ << '"' << json_escape(value) << '"';
    } else if constexpr (std::is_same_v<T, Pass> || std::is_same_v<T, DType>) {
      out_ << '"' << to_string(value) << '"';
    } else if constexpr (std::is_same_v<T, bool>) {
      out_ << json_bool(value);
    } else if constexpr (std::is_same_v<T, double>) {
      out_ << json_number(value);
    } else {
      static_assert(std::is_integral_v<T>);
      out_ << value;
    }
  }

 private:
  std::ostream& out_;
  bool first_;
};

// A visit_*_fields visitor over two rows: the second's member into the first's.
constexpr auto kCopy = [](const char*, auto& to, const auto& from) { to = from; };

}  // namespace

std::string TunedProblem::label() const {
  AttentionProblem problem;
  visit_problem_fields(kCopy, problem, *this);
  return problem_label(problem);
}

RateUnit TuneRunReport::unit() const {
  return backend == "cpu" ? RateUnit{"GFLOP/s", 1000} : RateUnit{};
}

TunedProblem tuned_problem(const std::string& device, const TuneReport& r) {
  const AttentionProblem& p = r.problem;
  TunedProblem row;
  row.device = device;
  row.key = r.key.to_string();
  visit_problem_fields(kCopy, row, p);
  row.deterministic = p.is_backward() && p.deterministic;
  row.default_config = {r.default_config.to_string(), r.default_ms, r.default_tflops()};
  if (r.choice)
    row.chosen = TunedTime{r.choice->config.to_string(), r.choice->median_ms, r.chosen_tflops()};
  row.gain = r.gain();
  visit_outcome_fields(kCopy, row, r);
  for (const TuneResult& c : r.results) {
    row.results.push_back({c.config.to_string(), to_string(c.status), c.median_ms, c.min_ms,
                           c.max_ms, c.repetitions, c.tflops, c.is_default, c.message});
  }
  return row;
}

TuneRunReport make_run_report(const std::vector<WorkerOutcome>& outcomes, double seconds) {
  TuneRunReport report;
  report.generator = generator_version();
  report.seconds = seconds;
  report.geomean_gain = gain_summary(outcomes).geomean;
  for (size_t w = 0; w < outcomes.size(); ++w) {
    for (const TuneReport& r : outcomes[w].reports) {
      report.problems.push_back(tuned_problem(outcomes[w].device, r));
    }
  }
  return report;
}

GainSummary gain_summary(const TuneRunReport& report, std::optional<Pass> pass) {
  double log_sum = 0;
  GainSummary summary;
  for (const TunedProblem& r : report.problems) {
    if (pass && r.pass != *pass) continue;
    if (!r.chosen || r.default_config.ms <= 0 || !(r.gain > 0)) continue;
    log_sum += std::log(r.gain);
    ++summary.problems;
  }
  if (summary.problems > 0) summary.geomean = std::exp(log_sum / summary.problems);
  return summary;
}

bool print_summary(const TuneRunReport& report, RateUnit unit) {
  bool all_chosen = true;
  bool passes[2] = {false, false};
  std::printf("\n%-40s %-18s %9s  %-18s %9s %7s\n", "problem", "default", unit.name, "chosen",
              unit.name, "gain");
  for (const TunedProblem& r : report.problems) {
    passes[r.pass == Pass::Backward ? 1 : 0] = true;
    const std::string label = r.label();
    const double default_rate = r.default_config.tflops;
    if (!r.chosen) {
      std::printf("%-40s %-18s %9.1f  %-18s %9s %7s  %s\n", label.c_str(),
                  r.default_config.config.c_str(), default_rate * unit.per_tflops, "-", "-", "-",
                  r.note.c_str());
      all_chosen = false;
      continue;
    }
    std::printf("%-40s %-18s %9.1f  %-18s %9.1f %6.3fx%s\n", label.c_str(),
                r.default_config.config.c_str(), default_rate * unit.per_tflops,
                r.chosen->config.c_str(), r.chosen->tflops * unit.per_tflops, r.gain,
                r.disturbed      ? "  (timings unstable: no new choice stored)"
                : r.kept_default ? "  (default kept: within noise)"
                                 : "");
  }
  const GainSummary all = gain_summary(report);
  std::printf("geo-mean gain %.3fx over %d problem(s)", all.geomean, all.problems);
  if (passes[0] && passes[1]) {
    const GainSummary forward = gain_summary(report, Pass::Forward);
    const GainSummary backward = gain_summary(report, Pass::Backward);
    std::printf(" (fwd %.3fx over %d, bwd %.3fx over %d)", forward.geomean, forward.problems,
                backward.geomean, backward.problems);
  }
  std::printf("; total time %s\n", format_duration(report.seconds).c_str());
  std::fflush(stdout);
  return all_chosen;
}

std::string run_report_json(const TuneRunReport& report, bool handoff) {
  std::ostringstream out;
  out << "{\n  \"generator\": \"" << json_escape(report.generator) << "\",\n"
      << "  \"geomean_gain\": " << json_number(report.geomean_gain) << ",\n"
      << "  \"seconds\": " << json_number(report.seconds) << ",\n";
  if (handoff) {
    out << "  \"status\": " << report.status << ",\n  \"message\": \""
        << json_escape(report.message)
        << "\",\n  \"nothing_to_tune\": " << json_bool(report.nothing_to_tune)
        << ",\n  \"backend\": \"" << json_escape(report.backend) << "\",\n  \"device_errors\": [";
    for (size_t i = 0; i < report.device_errors.size(); ++i) {
      out << (i ? ", \"" : "\"") << json_escape(report.device_errors[i]) << "\"";
    }
    out << "],\n";
  }
  out << "  \"problems\": [";
  bool first = true;
  for (const TunedProblem& r : report.problems) {
    out << (first ? "\n" : ",\n");
    first = false;
    out << "    {";
    JsonMembers head(out);
    head("device", r.device);
    head("key", r.key);
    visit_problem_fields(head, r);
    out << ",\n     \"default\": {";
    visit_time_fields(JsonMembers(out), r.default_config);
    out << "}, \"chosen\": ";
    if (r.chosen) {
      out << "{";
      visit_time_fields(JsonMembers(out), *r.chosen);
      out << "}";
    } else {
      out << "null";
    }
    JsonMembers outcome(out, false);
    outcome("gain", r.gain);
    visit_outcome_fields(outcome, r);
    out << ",\n     \"results\": [";
    for (size_t i = 0; i < r.results.size(); ++i) {
      out << (i ? ",\n" : "\n") << "       {";
      visit_config_fields(JsonMembers(out), r.results[i]);
      out << "}";
    }
    out << "]}";
  }
  out << "\n  ]\n}\n";
  return out.str();
}

bool write_run_report(const std::string& path, const TuneRunReport& report, bool handoff) {
  std::ofstream out(path);
  out << run_report_json(report, handoff);
  return static_cast<bool>(out);
}

namespace {

bool flag(const Json& value) { return value.kind == Json::Kind::Bool && value.boolean; }

// Reads the fields a visit_*_fields gives (run_report.hpp) from a JSON object into a fresh row: a
// member that is absent (or not a number) leaves the row's default; `ok` turns false on a pass
// or dtype that does not parse (or is absent).
struct JsonFields {
  const Json& object;
  bool ok = true;
  template <class T>
  void operator()(const char* name, T& value) {
    const Json& member = object[name];
    if constexpr (std::is_same_v<T, std::string>) {
      value = member.text_or("");
    } else if constexpr (std::is_same_v<T, Pass> || std::is_same_v<T, DType>) {
      Result<T> parsed = [&] {
        if constexpr (std::is_same_v<T, Pass>)
          return parse_pass(member.text_or(""));
        else
          return parse_dtype(member.text_or(""));
      }();
      if (parsed.ok())
        value = *parsed;
      else
        ok = false;
    } else if constexpr (std::is_same_v<T, bool>) {
      value = flag(member);
    } else {
      value = static_cast<T>(member.number_or(static_cast<double>(value)));
    }
  }
};

TunedTime tuned_time(const Json& value) {
  TunedTime time;
  visit_time_fields(JsonFields{value}, time);
  return time;
}

}  // namespace

Result<TuneRunReport> read_run_report(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::IoError, "cannot read the tuning report " + path);
  std::stringstream text;
  text << in.rdbuf();
  Result<Json> parsed = parse_json(text.str(), path);
  FLASHJIT_TRY(parsed);
  const Json& doc = *parsed;
  if (!doc.is_object() || !doc["problems"].is_array()) {
    return make_error(ErrorCode::InvalidArgument, path + ": not a tuning report");
  }
  TuneRunReport report;
  report.generator = doc["generator"].text_or("");
  report.geomean_gain = doc["geomean_gain"].number_or(1);
  report.seconds = doc["seconds"].number_or(0);
  report.status = static_cast<int>(doc["status"].number_or(0));
  report.message = doc["message"].text_or("");
  report.nothing_to_tune = flag(doc["nothing_to_tune"]);
  report.backend = doc["backend"].text_or("");
  for (const Json& error : doc["device_errors"].items) report.device_errors.push_back(error.string);
  for (const Json& p : doc["problems"].items) {
    TunedProblem row;
    JsonFields fields{p};
    fields("device", row.device);
    fields("key", row.key);
    visit_problem_fields(fields, row);
    if (!fields.ok) {
      return make_error(ErrorCode::InvalidArgument, path + ": a problem without pass or dtype");
    }
    row.default_config = tuned_time(p["default"]);
    if (p["chosen"].is_object()) row.chosen = tuned_time(p["chosen"]);
    fields("gain", row.gain);
    visit_outcome_fields(fields, row);
    for (const Json& c : p["results"].items) {
      visit_config_fields(JsonFields{c}, row.results.emplace_back());
    }
    report.problems.push_back(std::move(row));
  }
  return report;
}

}  // namespace flashjit
