// A program tuning with an installed flashjit (the tuner, flashjit::tuner): a small grid on the
// CPU backend (fp32, head dim 32, 80 tokens, causal off and on, 2 heads) into the tuning DB named
// by argv[1], then the runtime opened on that DB serves each problem's tuned config.
// Prints a row per problem (default, chosen, gain) and exits 0 when every problem got a choice
// that the runtime serves, 1 otherwise.
#include <cstdio>

#include "runtime/runtime.hpp"
#include "tuner/tune_run.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cpp_tune DB\n");
    return 1;
  }
  flashjit::TuneRequest request;
  request.backend = "cpu";
  request.db = argv[1];
  flashjit::ProblemGrid grid;
  grid.dtypes = {flashjit::DType::F32};
  grid.head_dims = {32};
  grid.causal = {false, true};
  grid.seqlens = {80};
  grid.batch = 1;
  grid.heads = 2;
  request.grid = grid;
  request.options.min_time_ms = 3;  // the time budget per config: brief, for an example
  request.options.retime_top = 1;
  int finished = 0;
  request.on_progress = [&finished](int, const flashjit::TuneProgress& progress) {
    if (progress.phase == flashjit::TuneProgress::Phase::Done) ++finished;
  };

  const flashjit::TuneRunReport report = flashjit::run_tune(request);
  if (report.status != 0) {
    std::fprintf(stderr, "cpp_tune: status %d: %s\n", report.status, report.message.c_str());
    return 1;
  }
  std::printf("%zu problem(s) tuned (%d reported done) in %.1f s, geo-mean gain %.3fx\n",
              report.problems.size(), finished, report.seconds, report.geomean_gain);

  flashjit::RuntimeOptions options;
  options.backend = "cpu";
  options.user_db = argv[1];
  auto runtime = flashjit::Runtime::create(options);
  if (!runtime.ok()) {
    std::fprintf(stderr, "cpp_tune: %s\n", runtime.error().describe().c_str());
    return 1;
  }
  int served = 0;
  for (const flashjit::TunedProblem& row : report.problems) {
    const auto problem =
        flashjit::AttentionProblem::make(row.batch, row.heads_q, row.heads_kv, row.seqlen_q,
                                         row.seqlen_k, row.head_dim, row.dtype, row.causal);
    auto selected = (*runtime)->select_config(problem);
    const bool exact = selected.ok() && row.chosen &&
                       selected->second == flashjit::ChoiceSource::Exact &&
                       selected->first.to_string() == row.chosen->config;
    served += exact ? 1 : 0;
    std::printf("%-34s default %-14s chosen %-14s gain %.3fx  %s\n", row.label().c_str(),
                row.default_config.config.c_str(), row.chosen ? row.chosen->config.c_str() : "-",
                row.gain, exact ? "served" : "NOT served");
  }
  return served == static_cast<int>(report.problems.size()) && served > 0 ? 0 : 1;
}
