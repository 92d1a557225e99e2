// The `flashjit` binary's backward pass: --pass and --deterministic on plan, show, compile and run
// (usage errors, the backward's plan, source, compile table and timings) and `tune --pass
// fwd,bwd` on the CPU (the JSON names each problem's pass). The commands that need a backward
// template skip, naming the missing one, while a backend answers "no ... template yet"; the
// GPU run skips without a CUDA GPU (FLASHJIT_EXPECT_GPU=1 turns that into a failure).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/command.hpp"
#include "support/gpu.hpp"

namespace {

using Outcome = flashjit::testing::CommandOutcome;

// A fresh kernel cache and no tuning DB: what a command serves does not depend on the machine.
const std::string& hermetic_environment() {
  static const std::string env = [] {
    const std::filesystem::path cache = std::filesystem::temp_directory_path() /
                                        ("flashjit-cli-bwd-cache-" + std::to_string(getpid()));
    return "FLASHJIT_DB=none FLASHJIT_CACHE_DIR=" + cache.string() + " ";
  }();
  return env;
}

Outcome flashjit(const std::string& args) {
  return flashjit::testing::run_command(hermetic_environment() + FLASHJIT_CLI_PATH + " " + args);
}

int lines(const std::string& text) {
  int count = 0;
  for (char c : text) count += c == '\n';
  return count;
}

// True when the command failed because the backend has no backward template yet (another
// branch writes it): the test skips with the message then.
bool template_missing(const Outcome& outcome) {
  return outcome.status != 0 && outcome.output.find("template yet") != std::string::npos;
}

#define SKIP_IF_TEMPLATE_MISSING(outcome)                                                  \
  do {                                                                                     \
    if (template_missing(outcome)) GTEST_SKIP() << "not merged yet: " << (outcome).output; \
  } while (0)

TEST(BackwardCommands, BadPassOrDeterministicIsAOneLineUsageError) {
  for (const char* command : {"plan", "show", "compile", "run"}) {
    const Outcome bad = flashjit(std::string(command) + " --pass sideways");
    EXPECT_EQ(bad.status, 2) << command << ": " << bad.output;
    EXPECT_EQ(lines(bad.output), 1) << bad.output;
    EXPECT_NE(bad.output.find("--pass = 'sideways': allowed: fwd, bwd"), std::string::npos)
        << bad.output;
    const Outcome forward_only = flashjit(std::string(command) + " --deterministic");
    EXPECT_EQ(forward_only.status, 2) << command << ": " << forward_only.output;
    EXPECT_EQ(lines(forward_only.output), 1) << forward_only.output;
    EXPECT_NE(forward_only.output.find("--deterministic applies to the backward pass only"),
              std::string::npos)
        << forward_only.output;
  }
  const Outcome help = flashjit("run --help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.output.find("--pass P"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("--deterministic"), std::string::npos) << help.output;
}

TEST(BackwardCommands, PlanPrintsTheBackwardsBudget) {
  for (const char* where : {"--arch sm80", "--arch sm90", "--arch gfx90a", "--arch cpu"}) {
    const std::string problem = std::string(where) + " --head-dim 128 --causal";
    const Outcome forward = flashjit("plan " + problem);
    const Outcome backward = flashjit("plan " + problem + " --pass bwd");
    ASSERT_EQ(forward.status, 0) << forward.output;
    ASSERT_EQ(backward.status, 0) << where << ": " << backward.output;
    EXPECT_NE(backward.output, forward.output) << where;
    const Outcome deterministic = flashjit("plan " + problem + " --pass bwd --deterministic");
    EXPECT_EQ(deterministic.status, 0) << where << ": " << deterministic.output;
  }
}

TEST(BackwardCommands, ShowPrintsTheBackwardsEntryPoints) {
  const Outcome cuda = flashjit("show --pass bwd --arch sm80 --head-dim 128 --causal");
  SKIP_IF_TEMPLATE_MISSING(cuda);
  ASSERT_EQ(cuda.status, 0) << cuda.output.substr(0, 2000);
  EXPECT_NE(cuda.output.find("| entries flashjit_attention_bwd_preprocess, "
                             "flashjit_attention_bwd_dkdv, flashjit_attention_bwd_dq"),
            std::string::npos)
      << cuda.output.substr(0, 2000);
  EXPECT_NE(cuda.output.find("attention_backward(batch=2"), std::string::npos);
  for (const char* entry : {"void __launch_bounds__(flashjit_kernel::kBackwardThreads)\n"
                            "flashjit_attention_bwd_preprocess(",
                            "flashjit_attention_bwd_dkdv(", "flashjit_attention_bwd_dq("}) {
    EXPECT_NE(cuda.output.find(entry), std::string::npos) << entry;
  }
  const Outcome forward = flashjit("show --arch sm80 --head-dim 128 --causal");
  ASSERT_EQ(forward.status, 0);
  EXPECT_NE(forward.output.find("| entry flashjit_attention_fwd\n"), std::string::npos);
  EXPECT_EQ(forward.output.find("flashjit_attention_bwd"), std::string::npos);
}

TEST(BackwardCommands, ShowOnTheCpuBackend) {
#if FLASHJIT_HAVE_CPU_BACKEND
  const Outcome cpu = flashjit("show --pass bwd --backend cpu --head-dim 64 --seqlen 256");
  SKIP_IF_TEMPLATE_MISSING(cpu);
  ASSERT_EQ(cpu.status, 0) << cpu.output.substr(0, 2000);
  EXPECT_NE(cpu.output.find("| entries flashjit_attention_bwd_preprocess_cpu, "
                            "flashjit_attention_bwd_dkdv_cpu, flashjit_attention_bwd_dq_cpu"),
            std::string::npos)
      << cpu.output.substr(0, 2000);
#else
  GTEST_SKIP() << "this build has no CPU backend";
#endif
}

TEST(BackwardCommands, CompileReportsTheBackwardsKernels) {
  const Outcome compiled = flashjit("compile --pass bwd --arch sm80 --head-dim 64 --jobs 1");
  SKIP_IF_TEMPLATE_MISSING(compiled);
  ASSERT_EQ(compiled.status, 0) << compiled.output;
  EXPECT_NE(compiled.output.find("compiling 1 config(s) for attention_backward("),
            std::string::npos)
      << compiled.output;
  EXPECT_NE(compiled.output.find("dK/dV smem"), std::string::npos) << compiled.output;
  EXPECT_NE(compiled.output.find("  ok\n"), std::string::npos) << compiled.output;
  // --deterministic: the default is a config with a separate dQ kernel (its shared memory shown).
  const Outcome deterministic =
      flashjit("compile --pass bwd --deterministic --arch sm80 --head-dim 64 --jobs 1");
  ASSERT_EQ(deterministic.status, 0) << deterministic.output;
  EXPECT_NE(deterministic.output.find("-det "), std::string::npos) << deterministic.output;
}

// `run --pass bwd` prints the backward's time and rate, then the forward's and forward +
// backward's; the rates follow the 2.5x / 3.5x convention.
void expect_backward_run(const Outcome& run) {
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("problem  attention_backward("), std::string::npos) << run.output;
  for (const char* line : {"\ntime     median ", "\nspeed    ", "(the backward: 2.5x",
                           "\nforward  median ", "\nfwd+bwd  median ", "\nworkspace "}) {
    EXPECT_NE(run.output.find(line), std::string::npos) << line << "\n" << run.output;
  }
}

TEST(BackwardCommands, RunTimesTheBackwardOnTheCpu) {
#if FLASHJIT_HAVE_CPU_BACKEND
  const std::string problem =
      " --backend cpu --batch 1 --heads 4 --kv-heads 2 --seqlen-q 100 --seqlen-k 130 "
      "--head-dim 64 --causal --reps 3";
  const Outcome run = flashjit("run --pass bwd" + problem);
  SKIP_IF_TEMPLATE_MISSING(run);
  expect_backward_run(run);
  EXPECT_NE(run.output.find("GFLOP/s"), std::string::npos);
  expect_backward_run(flashjit("run --pass bwd --deterministic --dtype fp32" + problem));
#else
  GTEST_SKIP() << "this build has no CPU backend";
#endif
}

// An attention variant's backward (ALiBi's slopes reach the forward and the backward launch); a
// score_mod without --score-mod-grad is a one-line error naming it.
TEST(BackwardCommands, RunTimesAVariantsBackwardOnTheCpu) {
#if FLASHJIT_HAVE_CPU_BACKEND
  const std::string problem =
      " --backend cpu --batch 1 --heads 4 --kv-heads 2 --seqlen 100 --head-dim 64 --causal "
      "--reps 3 --window 32,0 --softcap 30 --alibi --score-mod 'score * 0.5f'";
  const Outcome run = flashjit("run --pass bwd --score-mod-grad 0.5f" + problem);
  expect_backward_run(run);
  EXPECT_NE(run.output.find("score_mod_grad#"), std::string::npos) << run.output;
  const Outcome missing = flashjit("run --pass bwd" + problem);
  EXPECT_NE(missing.status, 0);
  EXPECT_EQ(lines(missing.output), 1) << missing.output;
  EXPECT_NE(missing.output.find("needs score_mod_grad"), std::string::npos) << missing.output;
#else
  GTEST_SKIP() << "this build has no CPU backend";
#endif
}

TEST(BackwardCommands, RunTimesTheBackwardOnTheGpu) {
  FLASHJIT_REQUIRE_GPU();
  const Outcome run =
      flashjit("run --pass bwd --backend cuda --seqlen 2048 --head-dim 128 --reps 5");
  SKIP_IF_TEMPLATE_MISSING(run);
  expect_backward_run(run);
  EXPECT_NE(run.output.find("TFLOP/s"), std::string::npos);
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(BackwardCommands, TuneBothPassesOnTheCpu) {
#if FLASHJIT_HAVE_CPU_BACKEND
  const Outcome probe = flashjit("show --pass bwd --backend cpu --head-dim 64");
  SKIP_IF_TEMPLATE_MISSING(probe);
  const std::filesystem::path folder = std::filesystem::temp_directory_path() /
                                       ("flashjit-cli-bwd-tune-" + std::to_string(getpid()));
  std::filesystem::create_directories(folder);
  const Outcome tuned = flashjit(
      "tune --backend cpu --pass fwd,bwd --head-dims 64 --seqlens 80 --causal on --batch 1 "
      "--heads 2 --dtypes fp16 --min-time-ms 2 --retime-top 1 --db " +
      (folder / "tuning.db").string() + " --json " + (folder / "tune.json").string());
  const std::string json = read(folder / "tune.json");
  std::filesystem::remove_all(folder);
  ASSERT_EQ(tuned.status, 0) << tuned.output;
  EXPECT_NE(tuned.output.find("bwd d64 f16 causal N=80 B=1 H=2"), std::string::npos)
      << tuned.output;
  EXPECT_NE(tuned.output.find("(fwd "), std::string::npos) << tuned.output;  // gains per pass
  EXPECT_NE(json.find("\"pass\": \"fwd\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"pass\": \"bwd\""), std::string::npos) << json;
#else
  GTEST_SKIP() << "this build has no CPU backend";
#endif
}

}  // namespace
