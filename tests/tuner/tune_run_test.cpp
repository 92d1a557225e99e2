// The typed tuning service (tuner/tune_run.hpp, tuner/run_report.hpp): a request's problems and
// its checks, the report's trip from a worker to its supervisor (write, read back, unchanged),
// and a small run on the CPU backend with its progress callbacks. About 10 s (the CPU run).
#include "tuner/tune_run.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "runtime/runtime.hpp"
#include "tuner/run_report.hpp"

namespace flashjit {
namespace {

std::string request_error(const TuneRequest& request) {
  Status status = check_request(request);
  return status.ok() ? std::string("ok") : status.error().message;
}

TEST(TuneRequestTest, BadRequestsNameTheField) {
  TuneRequest recorded;
  recorded.recorded = true;
  recorded.grid = ProblemGrid{};
  EXPECT_NE(request_error(recorded).find("recorded tunes the recorded problems"),
            std::string::npos);
  TuneRequest shard;
  shard.shard = {2, 2};
  EXPECT_NE(request_error(shard).find("shard = 2/2"), std::string::npos);
  TuneRequest deterministic;
  deterministic.deterministic = true;
  EXPECT_NE(request_error(deterministic).find("deterministic applies to the backward pass only"),
            std::string::npos);
  TuneRequest page;
  page.page_size = 20;
  EXPECT_NE(request_error(page).find("page_size = 20"), std::string::npos);
  TuneRequest backward_page;
  backward_page.passes = {Pass::Forward, Pass::Backward};
  backward_page.page_size = 16;
  EXPECT_NE(request_error(backward_page).find("forward pass only"), std::string::npos);
  TuneRequest dims;
  dims.grid = ProblemGrid{};
  dims.grid->head_dims = {12};
  EXPECT_NE(request_error(dims).find("head_dim = 12"), std::string::npos);
  TuneRequest devices;
  devices.devices = {0};
  devices.all_devices = true;
  EXPECT_NE(request_error(devices).find("devices"), std::string::npos);
  EXPECT_EQ(request_error(TuneRequest{}), "ok");
}

TEST(TuneRequestTest, DefaultGridDependsOnTheBackendAndVariantsApplyToEveryProblem) {
  TuneRequest request;
  request.passes = {Pass::Backward, Pass::Forward};
  auto gpu = request_problems(request, "cuda");
  ASSERT_TRUE(gpu.ok()) << gpu.error().describe();
  EXPECT_EQ(gpu->size(), 72u);                  // the standard grid, both passes
  EXPECT_EQ(gpu->front().pass, Pass::Forward);  // a shape's forward first
  ProblemGrid cpu_grid = cpu_default_grid();
  cpu_grid.passes = {Pass::Forward, Pass::Backward};
  auto expected = grid_problems(cpu_grid);
  ASSERT_TRUE(expected.ok());
  request.variant.softcap = 20.0f;
  auto cpu = request_problems(request, "cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.error().describe();
  ASSERT_EQ(cpu->size(), expected->size());
  for (size_t i = 0; i < cpu->size(); ++i) {
    EXPECT_EQ((*cpu)[i].head_dim, (*expected)[i].head_dim);
    EXPECT_EQ((*cpu)[i].seqlen_q, (*expected)[i].seqlen_q);
    EXPECT_EQ((*cpu)[i].pass, (*expected)[i].pass);
    ASSERT_TRUE((*cpu)[i].variant.softcap.has_value());
    EXPECT_EQ(*(*cpu)[i].variant.softcap, 20.0f);
  }
  TuneRequest paged;
  paged.page_size = 64;
  auto pages = request_problems(paged, "cuda");
  ASSERT_TRUE(pages.ok()) << pages.error().describe();
  for (const AttentionProblem& problem : *pages) EXPECT_EQ(problem.kv.page_size, 64);
}

TEST(TuneRunReportTest, TheWorkersReportComesBackUnchanged) {
  TuneRunReport report;
  report.status = 1;
  report.message = "a \"quoted\" message";
  report.device_errors = {"device 1: DriverError: lost"};
  report.backend = "cpu";
  report.generator = "0123456789abcdef";
  report.seconds = 12.5;
  report.geomean_gain = 1.25;
  TunedProblem row;
  row.device = "cpu|test";
  row.key = "bwd d64 f16 causal";
  row.pass = Pass::Backward;
  row.deterministic = true;
  row.head_dim = 64;
  row.dtype = DType::F16;
  row.causal = true;
  row.batch = 3;
  row.heads_q = 8;
  row.heads_kv = 2;
  row.seqlen_q = 257;
  row.seqlen_k = 300;
  row.default_config = {"m64n64w4s1", 2.0, 1.5};
  row.chosen = TunedTime{"m128n64w4s1", 1.6, 1.875};
  row.gain = 1.25;
  row.kept_default = false;
  row.busy_batches = 3;
  row.noise_ms = 0.01;
  row.seconds = 4.5;
  row.note = "a note";
  row.results.push_back({"m64n64w4s1", "timed", 2.0, 1.9, 2.1, 10, 1.5, true, ""});
  row.results.push_back({"m128n64w4s1", "wrong-result", 0, 0, 0, 0, 0, false, "o_rel=0.5"});
  report.problems.push_back(row);
  TunedProblem unchosen = row;
  unchosen.chosen.reset();
  unchosen.pass = Pass::Forward;
  unchosen.deterministic = false;
  report.problems.push_back(unchosen);

  const std::string path = (std::filesystem::temp_directory_path() /
                            ("flashjit-run-report-" + std::to_string(getpid()) + ".json"))
                               .string();
  ASSERT_TRUE(write_run_report(path, report, /*handoff=*/true));
  Result<TuneRunReport> read = read_run_report(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(read.ok()) << read.error().describe();
  EXPECT_EQ(run_report_json(*read, true), run_report_json(report, true));
  EXPECT_EQ(read->status, 1);
  EXPECT_EQ(read->message, report.message);
  EXPECT_EQ(read->device_errors, report.device_errors);
  ASSERT_EQ(read->problems.size(), 2u);
  EXPECT_EQ(read->problems[0].label(), "bwd-det d64 f16 causal N=257/300 B=3 H=8/2");
  EXPECT_FALSE(read->problems[1].chosen.has_value());
  EXPECT_EQ(read->problems[0].results[1].message, "o_rel=0.5");
  // The user-facing JSON has none of the hand-off fields.
  EXPECT_EQ(run_report_json(report).find("\n  \"status\""), std::string::npos);
  EXPECT_NE(run_report_json(report, true).find("\n  \"status\": 1"), std::string::npos);
  EXPECT_FALSE(read_run_report(path).ok());  // gone: an error, not an empty report
}

// A run in this process on the CPU backend: on_start once, a Done per problem, one row each.
TEST(TuneRunTest, TunesASmallCpuGridWithProgress) {
  if (!have_cpu_backend()) GTEST_SKIP() << "built without the CPU backend";
  const std::filesystem::path db = std::filesystem::temp_directory_path() /
                                   ("flashjit-tune-run-" + std::to_string(getpid()) + ".db");
  std::filesystem::remove(db);
  TuneRequest request;
  request.backend = "cpu";
  request.db = db;
  request.grid = ProblemGrid{};
  request.grid->dtypes = {DType::F32};
  request.grid->head_dims = {32};
  request.grid->causal = {false};
  request.grid->seqlens = {80};
  request.grid->batch = 1;
  request.grid->heads = 2;
  request.options.min_time_ms = 2;
  request.options.retime_top = 1;
  int starts = 0, done = 0;
  TuneRunStart seen;
  request.on_start = [&](const TuneRunStart& start) {
    ++starts;
    seen = start;
  };
  request.on_progress = [&](int device, const TuneProgress& progress) {
    EXPECT_EQ(device, 0);
    if (progress.phase == TuneProgress::Phase::Done) ++done;
  };
  const TuneRunReport report = run_tune(request);
  std::filesystem::remove(db);
  EXPECT_EQ(report.status, 0) << report.message;
  EXPECT_EQ(starts, 1);
  EXPECT_EQ(seen.problems, 1u);
  EXPECT_EQ(seen.db, db.string());
  EXPECT_EQ(done, 1);
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_TRUE(report.problems[0].chosen.has_value());
  EXPECT_EQ(report.backend, "cpu");
  EXPECT_EQ(report.unit().per_tflops, 1000);
}

}  // namespace
}  // namespace flashjit
