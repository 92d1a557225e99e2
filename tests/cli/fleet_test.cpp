// Fleet tuning (examples/slurm/tune.sbatch + merge.sbatch; examples/k8s/tune-job.yaml runs the
// same commands): the array job's N tasks run here as N local processes of the script itself
// (SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT set by hand; CPU backend, a tiny grid), then the
// merge script. The merged DB must hold exactly the keys (and the measured configs per key) of
// one full run of the same grid, each shard a disjoint, non-empty part of it. About 40 s (the
// full run compiles the 16 legal configs once; the shards load them from the shared cache).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime.hpp"
#include "support/command.hpp"
#include "support/tuning_db.hpp"

namespace {

namespace fs = std::filesystem;
using flashjit::testing::CommandOutcome;
using flashjit::testing::query;
using flashjit::testing::run_command;

constexpr int kShards = 3;
// 4 forward problems (seqlen buckets 16..128): shards of 2, 1 and 1 problems.
constexpr const char* kGrid =
    "--backend cpu --head-dims 16 --dtypes fp32 --seqlens 16,32,64,128 --causal off --batch 1 "
    "--heads 2 --min-time-ms 2 --jobs 2";

std::string quoted(const fs::path& path) {
  std::string text = "'";  // appended: gcc 12 warns falsely (-Wrestrict) on "'" + std::string&&
  text += path.string();
  text += "'";
  return text;
}

// Every choice's key, and every results row's key + config, as sorted text.
std::set<std::string> keys_of(const fs::path& db, const char* table) {
  const std::string key =
      "device || '|' || generator || '|' || pass || '|' || deterministic || '|' || head_dim || "
      "'|' || dtype || '|' || causal || '|' || group_size || '|' || seqlen_q_bucket || '|' || "
      "seqlen_k_bucket || '|' || batch_heads_bucket";
  const std::string column = std::string(table) == "results" ? key + " || '|' || config" : key;
  const std::vector<std::string> rows = query(db, "SELECT " + column + " FROM " + table);
  return {rows.begin(), rows.end()};
}

TEST(FleetTest, ShardsOfAnArrayJobMergeIntoTheKeysOfOneFullRun) {
  if (!flashjit::have_cpu_backend()) GTEST_SKIP() << "built without the CPU backend";
  const fs::path dir =
      fs::temp_directory_path() / ("flashjit-fleet-test-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "tmp");
  const fs::path out = dir / "out";
  const fs::path scripts = fs::path(FLASHJIT_SOURCE_DIR) / "examples" / "slurm";
  const std::string env =
      "env -u FLASHJIT_SYSTEM_DB FLASHJIT_DB=none FLASHJIT_CACHE_DIR=" + quoted(dir / "cache") +
      " TMPDIR=" + quoted(dir / "tmp") + " FLASHJIT_LOCK_DIR=" + quoted(dir / "locks") +
      " OUT_DIR=" + quoted(out) + " FLASHJIT=" + FLASHJIT_CLI_PATH + " FLASHJIT_TUNE_ARGS='" +
      kGrid + "' ";

  const fs::path full = dir / "full.db";
  const CommandOutcome single =
      run_command(env + FLASHJIT_CLI_PATH + " tune --db " + quoted(full) + " " + kGrid);
  ASSERT_EQ(single.status, 0) << single.output;

  std::vector<CommandOutcome> tasks(kShards);
  std::vector<std::thread> threads;
  for (int i = 0; i < kShards; ++i) {
    threads.emplace_back([&, i] {
      tasks[i] =
          run_command(env + "SLURM_ARRAY_JOB_ID=42 SLURM_ARRAY_TASK_ID=" + std::to_string(i) +
                      " SLURM_ARRAY_TASK_COUNT=" + std::to_string(kShards) + " bash " +
                      quoted(scripts / "tune.sbatch"));
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<std::string> union_of_shards;
  for (int i = 0; i < kShards; ++i) {
    ASSERT_EQ(tasks[i].status, 0) << "shard " << i << ": " << tasks[i].output;
    const fs::path shard = out / ("shard-" + std::to_string(i) + ".db");
    ASSERT_TRUE(fs::is_regular_file(shard)) << shard;
    EXPECT_FALSE(fs::exists(out / ("shard-" + std::to_string(i) + ".db.part")));
    EXPECT_TRUE(fs::is_regular_file(out / ("shard-" + std::to_string(i) + ".json")));
    const std::set<std::string> keys = keys_of(shard, "choices");
    EXPECT_FALSE(keys.empty()) << "shard " << i << " tuned nothing";
    for (const std::string& key : keys) {
      EXPECT_TRUE(union_of_shards.insert(key).second) << "in two shards: " << key;
    }
  }
  // The node-local DBs are gone: only the exported shards remain.
  EXPECT_TRUE(fs::is_empty(dir / "tmp"));

  const CommandOutcome missing = run_command(env + "SHARDS=" + std::to_string(kShards + 1) +
                                             " bash " + quoted(scripts / "merge.sbatch"));
  EXPECT_EQ(missing.status, 1) << missing.output;
  EXPECT_NE(missing.output.find("missing in " + out.string() + ": shard-3.db"), std::string::npos)
      << missing.output;
  const CommandOutcome merged = run_command(env + "SHARDS=" + std::to_string(kShards) + " bash " +
                                            quoted(scripts / "merge.sbatch"));
  ASSERT_EQ(merged.status, 0) << merged.output;

  const std::set<std::string> full_keys = keys_of(full, "choices");
  EXPECT_EQ(full_keys.size(), 4u);
  EXPECT_EQ(union_of_shards, full_keys);
  EXPECT_EQ(keys_of(out / "tuning.db", "choices"), full_keys);
  EXPECT_EQ(keys_of(out / "tuning.db", "results"), keys_of(full, "results"));
  // The text form holds the same: built back into a DB, the same keys.
  const fs::path rebuilt = dir / "rebuilt.db";
  const CommandOutcome from_text = run_command(std::string(FLASHJIT_CLI_PATH) + " db merge " +
                                               quoted(rebuilt) + " " + quoted(out / "tuning.sql"));
  ASSERT_EQ(from_text.status, 0) << from_text.output;
  EXPECT_EQ(keys_of(rebuilt, "choices"), full_keys);
  fs::remove_all(dir);
}

}  // namespace
