// tuner/report.hpp: labels, the summary's geo-means per pass and the JSON report name the pass of
// every problem. Synthetic reports: no device.
#include "tuner/report.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace flashjit {
namespace {

TEST(TuneReportText, LabelsNameThePass) {
  AttentionProblem p = AttentionProblem::make(4, 16, 4, 4096, 2048, 128, DType::BF16, true);
  EXPECT_EQ(problem_label(p), "d128 bf16 causal N=4096/2048 B=4 H=16/4");
  p.pass = Pass::Backward;
  EXPECT_EQ(problem_label(p), "bwd d128 bf16 causal N=4096/2048 B=4 H=16/4");
  p.deterministic = true;
  EXPECT_EQ(problem_label(p), "bwd-det d128 bf16 causal N=4096/2048 B=4 H=16/4");
  EXPECT_EQ(format_duration(3725), "1:02:05");
  EXPECT_EQ(format_duration(65), "1:05");
  EXPECT_EQ(format_duration(-1), "?");
}

// A report for `problem` whose default took `default_ms` and whose choice `chosen_ms`.
TuneReport report_of(const AttentionProblem& problem, double default_ms, double chosen_ms) {
  TuneReport report;
  report.problem = problem;
  report.key = ProblemKey::of(problem);
  report.default_config = AttentionConfig{};
  report.default_ms = default_ms;
  TuneResult timed;
  timed.config = AttentionConfig{64, 128, 8, 2};
  timed.median_ms = chosen_ms;
  report.results.push_back(timed);
  report.choice = TuneChoice{timed.config, chosen_ms, default_ms};
  return report;
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(TuneReportText, GainsPerPassAndJson) {
  AttentionProblem forward = AttentionProblem::make(1, 8, 8, 512, 512, 64, DType::F16, false);
  AttentionProblem backward = forward.with_pass(Pass::Backward);
  backward.deterministic = true;
  WorkerOutcome outcome;
  outcome.device = "cuda|fake";
  outcome.reports = {report_of(forward, 2.0, 1.0), report_of(backward, 4.0, 4.0)};
  TuneReport unchosen = report_of(backward, 1.0, 1.0);
  unchosen.choice.reset();
  unchosen.note = "no config could be timed";
  const std::vector<WorkerOutcome> outcomes = {outcome};

  EXPECT_DOUBLE_EQ(gain_summary(outcomes).geomean, std::sqrt(2.0));
  EXPECT_EQ(gain_summary(outcomes).problems, 2);
  EXPECT_DOUBLE_EQ(gain_summary(outcomes, Pass::Forward).geomean, 2.0);
  EXPECT_DOUBLE_EQ(gain_summary(outcomes, Pass::Backward).geomean, 1.0);

  ::testing::internal::CaptureStdout();
  EXPECT_TRUE(print_summary(outcomes, RateUnit{}, 12));
  const std::string table = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(table.find("bwd-det d64 f16 full N=512 B=1 H=8"), std::string::npos) << table;
  EXPECT_NE(table.find("geo-mean gain 1.414x over 2 problem(s) (fwd 2.000x over 1, bwd 1.000x "
                       "over 1)"),
            std::string::npos)
      << table;
  std::vector<WorkerOutcome> with_failure = outcomes;
  with_failure[0].reports.push_back(unchosen);
  ::testing::internal::CaptureStdout();
  EXPECT_FALSE(print_summary(with_failure, RateUnit{}, 12));
  EXPECT_NE(::testing::internal::GetCapturedStdout().find("no config could be timed"),
            std::string::npos);

  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("flashjit-report-test-" + std::to_string(::getpid()) + ".json");
  ASSERT_TRUE(write_json_report(path.string(), outcomes, 12));
  const std::string json = read(path);
  std::filesystem::remove(path);
  EXPECT_NE(json.find("\"pass\": \"fwd\", \"deterministic\": false, \"d\": 64"), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"key\": \"bwd-det d64 f16"), std::string::npos) << json;
  EXPECT_NE(json.find("\"pass\": \"bwd\", \"deterministic\": true, \"d\": 64"), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"geomean_gain\": 1.41421"), std::string::npos) << json;
  EXPECT_NE(json.find("\"chosen\": {\"config\": \"m64n128w8s2\", \"ms\": 1"), std::string::npos);
  EXPECT_FALSE(write_json_report("/nonexistent-folder/x.json", outcomes, 1));
}

}  // namespace
}  // namespace flashjit
