// `flashjit tune` without a GPU: the grid built from flags (variant and page-size flags
// included), shards, devices, worker split, every bad flag reported as one line naming the flag
// (exit status 2), and a variant problem tuned on the CPU backend.
#include "cli/tune_command.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cli/db_command.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/runtime.hpp"
#include "runtime/tuning_store.hpp"

namespace flashjit::cli {
namespace {

Result<ParsedFlags> parse(std::vector<std::string> args) {
  return parse_flags(tune_command(), args);
}

Result<std::vector<AttentionProblem>> grid(std::vector<std::string> args) {
  auto flags = parse(std::move(args));
  if (!flags.ok()) return flags.error();
  return tune_problems_from_flags(*flags);
}

// The error message of building the grid from `args`; "" on success.
std::string grid_error(std::vector<std::string> args) {
  auto problems = grid(std::move(args));
  return problems.ok() ? "" : problems.error().message;
}

TEST(TuneGrid, DefaultIsTheStandardGrid) {
  auto problems = grid({});
  ASSERT_TRUE(problems.ok()) << problems.error().describe();
  ASSERT_EQ(problems->size(), 36u);
  const std::vector<int64_t> seqlens = {512, 1024, 2048, 4096, 8192, 16384};
  size_t i = 0;
  for (int d : {64, 128, 256}) {
    for (bool causal : {false, true}) {
      for (int64_t n : seqlens) {
        const AttentionProblem& p = (*problems)[i++];
        EXPECT_EQ(p.head_dim, d);
        EXPECT_EQ(p.causal, causal);
        EXPECT_EQ(p.dtype, DType::BF16);
        EXPECT_EQ(p.seqlen_q, n);
        EXPECT_EQ(p.seqlen_k, n);
        EXPECT_EQ(p.batch, 16384 / n);
        EXPECT_EQ(p.heads_q, 2048 / d);
        EXPECT_EQ(p.heads_kv, p.heads_q);
        EXPECT_EQ(p.q_strides, contiguous_strides(Layout::BSHD, n, p.heads_q, d));
      }
    }
  }
}

TEST(TuneGrid, FlagsSelectTheGrid) {
  auto problems = grid({"--head-dims", "128", "--dtypes", "bf16,fp16", "--causal", "on",
                        "--seqlens", "1024,4096", "--tokens", "8192", "--hidden", "4096"});
  ASSERT_TRUE(problems.ok()) << problems.error().describe();
  ASSERT_EQ(problems->size(), 4u);
  EXPECT_EQ((*problems)[0].dtype, DType::BF16);
  EXPECT_EQ((*problems)[2].dtype, DType::F16);
  for (const AttentionProblem& p : *problems) {
    EXPECT_TRUE(p.causal);
    EXPECT_EQ(p.head_dim, 128);
    EXPECT_EQ(p.heads_q, 32);
    EXPECT_EQ(p.batch, 8192 / p.seqlen_q);
  }
  EXPECT_EQ((*problems)[1].seqlen_q, 4096);

  auto fixed = grid({"--head-dims", "64", "--causal", "off", "--seqlens", "100000", "--batch", "3",
                     "--heads", "8", "--kv-heads", "2"});
  ASSERT_TRUE(fixed.ok()) << fixed.error().describe();
  ASSERT_EQ(fixed->size(), 1u);
  EXPECT_EQ((*fixed)[0].batch, 3);
  EXPECT_EQ((*fixed)[0].heads_q, 8);
  EXPECT_EQ((*fixed)[0].heads_kv, 2);
  EXPECT_FALSE((*fixed)[0].causal);

  // Fewer tokens than the sequence: batch 1. A head dim above the hidden size: 1 head.
  auto small = grid({"--head-dims", "256", "--seqlens", "4096", "--tokens", "1000", "--hidden",
                     "128", "--causal", "both"});
  ASSERT_TRUE(small.ok()) << small.error().describe();
  ASSERT_EQ(small->size(), 2u);
  EXPECT_EQ((*small)[0].batch, 1);
  EXPECT_EQ((*small)[0].heads_q, 1);

  // Duplicates are dropped.
  auto deduplicated = grid({"--head-dims", "64,64", "--seqlens", "512,512", "--causal", "on"});
  ASSERT_TRUE(deduplicated.ok());
  EXPECT_EQ(deduplicated->size(), 1u);
}

// The variant and K/V layout flags (as plan/show/run take them) apply to every problem.
TEST(TuneGrid, VariantAndPageSizeFlagsApplyToEveryProblem) {
  auto problems = grid({"--head-dims", "64", "--seqlens", "512,1024", "--causal", "on", "--window",
                        "128,0", "--softcap", "30", "--alibi", "--prefix", "4", "--score-mod",
                        "score * 2", "--mask-mod", "kv_idx != 3"});
  ASSERT_TRUE(problems.ok()) << problems.error().describe();
  ASSERT_EQ(problems->size(), 2u);
  for (const AttentionProblem& p : *problems) {
    EXPECT_EQ(p.variant.window_left, 128);
    EXPECT_EQ(p.variant.window_right, 0);
    EXPECT_EQ(p.variant.softcap, 30.0f);
    EXPECT_TRUE(p.variant.alibi);
    EXPECT_EQ(p.variant.prefix, 4);
    EXPECT_EQ(p.variant.score_mod, "score * 2");
    EXPECT_EQ(p.variant.mask_mod, "kv_idx != 3");
    EXPECT_EQ(ProblemKey::of(p).variant, p.variant.key());
  }
  auto paged = grid({"--head-dims", "128", "--seqlens", "1000", "--causal", "off", "--batch", "2",
                     "--page-size", "32"});
  ASSERT_TRUE(paged.ok()) << paged.error().describe();
  ASSERT_EQ(paged->size(), 1u);
  EXPECT_EQ((*paged)[0].kv.page_size, 32);
  EXPECT_TRUE((*paged)[0].kv.seqlens_k);
  EXPECT_EQ((*paged)[0].kv.num_pages, 2 * 32);
  EXPECT_TRUE(validate((*paged)[0]).ok());
  // The backward of a score_mod takes its derivative (--score-mod-grad).
  auto backward = grid({"--head-dims", "64", "--seqlens", "512", "--causal", "on", "--pass", "bwd",
                        "--score-mod", "score * 2", "--score-mod-grad", "2"});
  ASSERT_TRUE(backward.ok()) << backward.error().describe();
  ASSERT_EQ(backward->size(), 1u);
  EXPECT_EQ((*backward)[0].variant.score_mod_grad, "2");
  EXPECT_NE(grid_error({"--page-size", "20"}).find("--page-size = '20'"), std::string::npos);
  EXPECT_NE(grid_error({"--window", "x"}).find("--window = 'x'"), std::string::npos);
  EXPECT_NE(grid_error({"--pass", "bwd", "--page-size", "16"}).find("forward pass only"),
            std::string::npos);
}

TEST(TuneGrid, BadValuesNameTheFlag) {
  EXPECT_NE(grid_error({"--head-dims", "100"}).find("--head-dims = '100'"), std::string::npos);
  EXPECT_NE(grid_error({"--head-dims", "64,x"}).find("--head-dims = '64,x'"), std::string::npos);
  EXPECT_NE(grid_error({"--head-dims", "512"}).find("--head-dims"), std::string::npos);
  EXPECT_NE(grid_error({"--head-dims", ""}).find("--head-dims"), std::string::npos);
  EXPECT_NE(grid_error({"--dtypes", "fp8"}).find("--dtypes = 'fp8': allowed: bf16, fp16, fp32"),
            std::string::npos);
  EXPECT_NE(grid_error({"--dtypes", "bf16,"}).find("--dtypes"), std::string::npos);
  EXPECT_NE(grid_error({"--causal", "yes"}).find("--causal = 'yes': allowed: on, off, both"),
            std::string::npos);
  EXPECT_NE(grid_error({"--seqlens", "0"}).find("--seqlens = '0'"), std::string::npos);
  EXPECT_NE(grid_error({"--seqlens", "1,,2"}).find("--seqlens"), std::string::npos);
  EXPECT_NE(grid_error({"--tokens", "0"}).find("--tokens"), std::string::npos);
  EXPECT_NE(grid_error({"--tokens", "8", "--batch", "2"}).find("not both"), std::string::npos);
  EXPECT_NE(grid_error({"--hidden", "8", "--heads", "2"}).find("not both"), std::string::npos);
  EXPECT_NE(grid_error({"--kv-heads", "3"}).find("--kv-heads = '3': must divide"),
            std::string::npos);
  EXPECT_NE(grid_error({"--heads", "4", "--kv-heads", "8"}).find("--kv-heads"), std::string::npos);
  EXPECT_NE(grid_error({"--seqlen", "4"}).find("unknown flag --seqlen"), std::string::npos);
  EXPECT_NE(grid_error({"--verbose=1"}).find("--verbose"), std::string::npos);
}

TEST(TuneGrid, PassesMultiplyTheGrid) {
  auto both = grid({"--pass", "bwd,fwd", "--head-dims", "64,128", "--seqlens", "512,4096"});
  ASSERT_TRUE(both.ok()) << both.error().describe();
  ASSERT_EQ(both->size(), 16u);  // 2 head dims x 2 causal x 2 passes x 2 seqlens
  // A shape's forward, then its backward (forward first whatever the flag's order), seqlen
  // innermost: the problems sharing a kernel stay adjacent.
  const std::vector<std::pair<Pass, int64_t>> first = {
      {Pass::Forward, 512}, {Pass::Forward, 4096}, {Pass::Backward, 512}, {Pass::Backward, 4096}};
  for (size_t i = 0; i < first.size(); ++i) {
    const AttentionProblem& p = (*both)[i];
    EXPECT_EQ(p.pass, first[i].first) << i;
    EXPECT_EQ(p.seqlen_q, first[i].second) << i;
    EXPECT_EQ(p.head_dim, 64);
    EXPECT_FALSE(p.causal);
    EXPECT_FALSE(p.deterministic);
    EXPECT_EQ(p.dq_strides, p.q_strides);
    EXPECT_EQ(p.dk_strides, p.k_strides);
  }
  size_t backward = 0;
  for (const AttentionProblem& p : *both) backward += p.is_backward() ? 1 : 0;
  EXPECT_EQ(backward, 8u);

  auto only = grid({"--pass", "bwd", "--deterministic", "--head-dims", "128", "--causal", "on"});
  ASSERT_TRUE(only.ok()) << only.error().describe();
  ASSERT_EQ(only->size(), 6u);
  for (const AttentionProblem& p : *only) {
    EXPECT_EQ(p.pass, Pass::Backward);
    EXPECT_TRUE(p.deterministic);
  }
  // --deterministic marks the backward problems only.
  auto mixed = grid({"--pass", "fwd,bwd", "--deterministic", "--head-dims", "64", "--seqlens",
                     "1024", "--causal", "off"});
  ASSERT_TRUE(mixed.ok()) << mixed.error().describe();
  ASSERT_EQ(mixed->size(), 2u);
  EXPECT_FALSE((*mixed)[0].deterministic);
  EXPECT_TRUE((*mixed)[1].deterministic);

  // The default is the forward alone; duplicates are dropped.
  auto forward = grid({"--pass", "fwd,forward", "--head-dims", "64", "--seqlens", "512"});
  ASSERT_TRUE(forward.ok());
  ASSERT_EQ(forward->size(), 2u);
  for (const AttentionProblem& p : *forward) EXPECT_EQ(p.pass, Pass::Forward);
}

TEST(TuneGrid, CpuDefaultGridOverThePasses) {
  auto flags = parse({"--pass", "fwd,bwd"});
  ASSERT_TRUE(flags.ok());
  EXPECT_FALSE(grid_flags_given(*flags));  // --pass alone keeps the CPU's small grid
  auto problems = tune_problems_from_flags(*flags, cpu_default_grid());
  ASSERT_TRUE(problems.ok()) << problems.error().describe();
  ASSERT_EQ(problems->size(), 16u);  // d 64,128 x causal both x 2 passes x N 256,1024
  for (const AttentionProblem& p : *problems) {
    EXPECT_EQ(p.batch, 1);
    EXPECT_EQ(p.heads_q, 4);
    EXPECT_TRUE(p.seqlen_q == 256 || p.seqlen_q == 1024);
  }
  auto shaped = parse({"--head-dims", "64"});
  ASSERT_TRUE(shaped.ok());
  EXPECT_TRUE(grid_flags_given(*shaped));
  // A flag replaces its part of the base grid: --tokens a fixed batch, --hidden fixed heads.
  auto tokens = parse({"--tokens", "2048", "--hidden", "512"});
  ASSERT_TRUE(tokens.ok());
  auto retokened = tune_problems_from_flags(*tokens, cpu_default_grid());
  ASSERT_TRUE(retokened.ok()) << retokened.error().describe();
  EXPECT_EQ((*retokened)[0].batch, 2048 / 256);
  EXPECT_EQ((*retokened)[0].heads_q, 512 / 64);
}

TEST(TuneGrid, BadPassValuesNameTheFlag) {
  EXPECT_NE(grid_error({"--pass", "sideways"})
                .find("--pass = 'sideways': allowed: fwd, bwd (comma-separated)"),
            std::string::npos);
  EXPECT_NE(grid_error({"--pass", "fwd,"}).find("--pass = 'fwd,'"), std::string::npos);
  EXPECT_NE(grid_error({"--pass", ""}).find("--pass = ''"), std::string::npos);
  EXPECT_NE(grid_error({"--deterministic"})
                .find("--deterministic applies to the backward pass only: add --pass bwd"),
            std::string::npos);
  EXPECT_NE(grid_error({"--pass", "fwd", "--deterministic"}).find("--deterministic"),
            std::string::npos);
}

// Issue 33 (fuzz cli_flags): a grid with the backward pass and --score-mod but no
// --score-mod-grad is refused when the flags are checked, naming the flag, not by the tuner
// later; every problem a grid returns is valid.
TEST(TuneGrid, BackwardScoreModWithoutGradIsRefusedAtTheFlags) {
  const std::string both = grid_error({"--score-mod", "6$,128", "--seqlens", "512,1024", "--pass",
                                       "fwd,bwd", "--shard", "1/4", "--devices", "0,"});
  EXPECT_NE(both.find("--score-mod = '6$,128'"), std::string::npos) << both;
  EXPECT_NE(both.find("--score-mod-grad"), std::string::npos) << both;
  const std::string bwd = grid_error({"--pass", "bwd", "--score-mod", "score*0.5", "--head-dims",
                                      "64", "--seqlens", "128", "--dtypes", "fp16"});
  EXPECT_NE(bwd.find("--score-mod = 'score*0.5'"), std::string::npos) << bwd;
  // The forward pass alone takes a score_mod without its derivative; with it, both passes do.
  auto forward = grid({"--score-mod", "score*0.5", "--head-dims", "64", "--seqlens", "128"});
  ASSERT_TRUE(forward.ok()) << forward.error().describe();
  auto with_grad = grid({"--pass", "fwd,bwd", "--score-mod", "score*0.5", "--score-mod-grad", "0.5",
                         "--head-dims", "64", "--seqlens", "128,256"});
  ASSERT_TRUE(with_grad.ok()) << with_grad.error().describe();
  EXPECT_EQ(with_grad->size(), 8u);  // causal both x 2 passes x 2 seqlens
  for (const AttentionProblem& p : *with_grad) EXPECT_TRUE(validate(p).ok()) << p.to_string();
}

TEST(TuneShard, ParsesAndSelects) {
  auto flags = parse({"--shard", "1/3"});
  ASSERT_TRUE(flags.ok());
  auto shard = shard_from_flags(*flags);
  ASSERT_TRUE(shard.ok()) << shard.error().describe();
  EXPECT_EQ(shard->index, 1);
  EXPECT_EQ(shard->count, 3);

  auto none = parse({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(shard_from_flags(*none)->count, 1);

  for (const char* bad : {"3/3", "1/0", "-1/2", "a/b", "1", "1/2/3", "/2", ""}) {
    auto bad_flags = parse({"--shard", bad});
    ASSERT_TRUE(bad_flags.ok()) << bad;
    auto bad_shard = shard_from_flags(*bad_flags);
    ASSERT_FALSE(bad_shard.ok()) << bad;
    EXPECT_NE(bad_shard.error().message.find("--shard = '" + std::string(bad) + "'"),
              std::string::npos)
        << bad_shard.error().message;
  }

  auto all = grid({});
  ASSERT_TRUE(all.ok());
  std::set<std::string> seen;
  size_t total = 0;
  for (int i = 0; i < 5; ++i) {
    const std::vector<AttentionProblem> part = select_shard(*all, Shard{i, 5});
    total += part.size();
    for (size_t j = 0; j < part.size(); ++j) {
      EXPECT_EQ(part[j].to_string(), (*all)[j * 5 + i].to_string());
      seen.insert(part[j].to_string());
    }
  }
  EXPECT_EQ(total, all->size());
  EXPECT_EQ(seen.size(), all->size());
  EXPECT_EQ(select_shard(*all, Shard{0, 1}).size(), all->size());
}

TEST(TuneDevices, ParsesAndChecksOrdinals) {
  auto none = parse({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*devices_from_flags(*none, 1), std::vector<int>{0});

  auto two = parse({"--devices", "0,1"});
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*devices_from_flags(*two, 2), (std::vector<int>{0, 1}));
  auto missing = devices_from_flags(*two, 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("--devices = '0,1': device 1 does not exist"),
            std::string::npos)
      << missing.error().message;

  auto all = parse({"--devices", "all"});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*devices_from_flags(*all, 3), (std::vector<int>{0, 1, 2}));

  auto bad = parse({"--devices", "gpu0"});
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE(devices_from_flags(*bad, 2).ok());
}

TEST(TuneWorkers, SplitIsContiguousAndBalanced) {
  auto all = grid({});
  ASSERT_TRUE(all.ok());
  const auto parts = split_for_workers(*all, 4);
  ASSERT_EQ(parts.size(), 4u);
  size_t next = 0;
  for (const auto& part : parts) {
    EXPECT_EQ(part.size(), 9u);
    for (const AttentionProblem& p : part) EXPECT_EQ(p.to_string(), (*all)[next++].to_string());
  }
  const auto uneven = split_for_workers(std::vector<AttentionProblem>(5), 2);
  EXPECT_EQ(uneven[0].size() + uneven[1].size(), 5u);
  EXPECT_LE(uneven[0].size(), 3u);
  EXPECT_LE(uneven[1].size(), 3u);
  const auto few = split_for_workers(std::vector<AttentionProblem>(1), 3);
  ASSERT_EQ(few.size(), 3u);
  EXPECT_EQ(few[0].size() + few[1].size() + few[2].size(), 1u);
}

// Runs the command, returning its exit status and what it printed on stderr.
std::pair<int, std::string> run(std::vector<std::string> args) {
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  const int status = run_tune_command(args);
  (void)::testing::internal::GetCapturedStdout();
  return {status, ::testing::internal::GetCapturedStderr()};
}

TEST(TuneCommand, BadFlagsExitTwoWithOneLine) {
  const std::vector<std::vector<std::string>> cases = {
      {"--head-dims", "100"},
      {"--bogus"},
      {"--shard", "2/2"},
      {"--causal"},
      {"--min-time-ms", "-1"},
      {"--hang-timeout", "-1"},
      {"--no-isolate", "--hang-timeout", "soon"},
      {"--retime-top", "x"},
      {"--recorded", "--head-dims", "64"},
      {"--recorded", "--pass", "bwd"},
      {"--recorded", "--deterministic"},
      {"--pass", "sideways"},
      {"--deterministic"},
      {"positional"},
  };
  for (const auto& args : cases) {
    const auto [status, err] = run(args);
    EXPECT_EQ(status, 2) << args[0];
    EXPECT_EQ(err.rfind("flashjit tune: ", 0), 0u) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
  const auto [status, err] = run({"--head-dims", "100"});
  EXPECT_NE(err.find("--head-dims = '100'"), std::string::npos) << err;
  const auto [recorded_status, recorded_err] = run({"--recorded", "--pass", "bwd"});
  EXPECT_NE(recorded_err.find("--pass = 'bwd': --recorded tunes the recorded problems (each "
                              "with its pass)"),
            std::string::npos)
      << recorded_err;
}

TEST(TuneCommand, HelpExitsZero) {
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(run_tune_command({"--bogus", "--help"}), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("--shard"), std::string::npos) << out;
  EXPECT_NE(out.find("--devices"), std::string::npos) << out;
  EXPECT_NE(out.find("--pass LIST"), std::string::npos) << out;
  EXPECT_NE(out.find("--deterministic"), std::string::npos) << out;
}

// A fresh folder under the temp directory (named with `prefix` and the pid), removed at the end.
struct TempDir {
  explicit TempDir(const std::string& prefix)
      : path(std::filesystem::temp_directory_path() / (prefix + std::to_string(getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  std::filesystem::path path;
};

// `flashjit tune` on the CPU backend of one small f32 problem (d32, 80 tokens, 2 heads) into
// `db`, briefly timed, with `extra` flags.
std::vector<std::string> small_cpu_tune(const std::string& db, std::vector<std::string> extra) {
  std::vector<std::string> args = {"--backend",
                                   "cpu",
                                   "--no-isolate",
                                   "--db",
                                   db,
                                   "--head-dims",
                                   "32",
                                   "--dtypes",
                                   "fp32",
                                   "--seqlens",
                                   "80",
                                   "--batch",
                                   "1",
                                   "--heads",
                                   "2",
                                   "--min-time-ms",
                                   "3",
                                   "--retime-top",
                                   "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// `flashjit tune --window --softcap` on the CPU: the choice is stored under the variant key,
// and `flashjit db ls` names it.
TEST(TuneCommand, TunesAVariantProblemOnTheCpu) {
  if (!have_cpu_backend()) GTEST_SKIP() << "built without the CPU backend";
  const TempDir dir("flashjit-tune-variant-");
  const std::string db = (dir.path / "tuning.db").string();
  const auto [status, err] =
      run(small_cpu_tune(db, {"--causal", "on", "--window", "16,0", "--softcap", "20"}));
  EXPECT_EQ(status, 0) << err;
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open_read_only(db);
  ASSERT_TRUE(store.ok()) << store.error().describe();
  Result<std::vector<TuningStore::Entry>> entries = (*store)->entries();
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].key.variant, "window(16,0) softcap20");
  EXPECT_TRUE((*entries)[0].current);
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(run_db_command({"ls", "--db", db}), 0);
  const std::string listed = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(listed.find("d32 f32 causal g1 q128 k128 bh2 window(16,0) softcap20"),
            std::string::npos)
      << listed;
}

// `flashjit tune --score-mod --mask-mod` (and the backward with --score-mod-grad) on the CPU:
// the expressions' fp64 reference is compiled from their text (tuner/variant_functions), so
// the configs are verified and the choices stored under the variant keys.
TEST(TuneCommand, VerifiesUserExpressionsOnTheCpu) {
  if (!have_cpu_backend()) GTEST_SKIP() << "built without the CPU backend";
  const TempDir dir("flashjit-tune-expressions-");
  const std::string db = (dir.path / "tuning.db").string();
  const auto [status, err] =
      run(small_cpu_tune(db, {"--causal", "off", "--pass", "fwd,bwd", "--score-mod",
                              "score - 0.1f * abs(q_idx - kv_idx)", "--mask-mod",
                              "(q_idx / 16) >= (kv_idx / 16)", "--score-mod-grad", "1.0f"}));
  EXPECT_EQ(status, 0) << err;
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open_read_only(db);
  ASSERT_TRUE(store.ok()) << store.error().describe();
  Result<std::vector<TuningStore::Entry>> entries = (*store)->entries();
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 2u);  // the forward and the backward, each chose a verified config
  for (const TuningStore::Entry& entry : *entries) {
    EXPECT_NE(entry.key.variant.find("score_mod#"), std::string::npos) << entry.key.variant;
    EXPECT_NE(entry.key.variant.find("mask_mod#"), std::string::npos) << entry.key.variant;
    EXPECT_TRUE(entry.current);
  }
}

TEST(TuneCommand, NoDeviceExitsTwo) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  const auto [status, err] = run({"--backend", "cuda", "--head-dims", "64", "--seqlens", "512"});
  EXPECT_EQ(status, 2);
  EXPECT_EQ(err.rfind("flashjit tune: no CUDA device: ", 0), 0u) << err;
}

}  // namespace
}  // namespace flashjit::cli
