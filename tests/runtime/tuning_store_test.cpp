// The tuning store (SQLite): schema, round trips, buckets, the pass in the key, nearest selection,
// staleness, merge, read-only and corrupt files, durability across kill -9 and concurrent writer
// processes. Version-1 files (migration, read-only, merge): tuning_store_migration_test.cpp;
// version-2 files: tuning_store_migration_v2_test.cpp; variant and K/V layout keys:
// tuning_store_variant_test.cpp.
#include "runtime/tuning_store.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "generator/device.hpp"
#include "generator/render.hpp"
#include "support/tuning_db.hpp"

namespace flashjit {
namespace {

namespace fs = std::filesystem;

DeviceFingerprint fingerprint(int driver_version = 13000) {
  DeviceFingerprint device;
  device.backend = "cuda";
  device.name = "Test GPU";
  device.arch = 90;
  device.sm_count = 132;
  device.smem_per_block_optin = 232448;
  device.l2_bytes = 52428800;
  device.driver_version = driver_version;
  device.compiler = "nvrtc 13.0";
  return device;
}

ProblemKey key(int64_t q = 4096, int64_t k = 4096, int64_t bh = 32, int head_dim = 128,
               DType dtype = DType::BF16, bool causal = false, int64_t group = 1) {
  ProblemKey key;
  key.head_dim = head_dim;
  key.dtype = dtype;
  key.causal = causal;
  key.group_size = group;
  key.seqlen_q_bucket = q;
  key.seqlen_k_bucket = k;
  key.batch_heads_bucket = bh;
  return key;
}

// The same shape as a backward (deterministic: with a separate dQ kernel) key.
ProblemKey backward(ProblemKey key, bool deterministic = false) {
  key.pass = Pass::Backward;
  key.deterministic = deterministic;
  return key;
}

AttentionConfig config(int block_m, int block_n = 64, int warps = 4, int stages = 2) {
  return AttentionConfig{block_m, block_n, warps, stages};
}

// A backward config with DqMode::Separate ("...-det").
AttentionConfig separate_dq(AttentionConfig config) {
  config.dq = DqMode::Separate;
  return config;
}

TuneResult timed(const AttentionConfig& config, double ms) {
  TuneResult result;
  result.config = config;
  result.status = TuneStatus::Timed;
  result.median_ms = ms;
  result.min_ms = ms * 0.9;
  result.max_ms = ms * 1.1;
  result.repetitions = 10;
  result.tflops = 100 / ms;
  return result;
}

TuneChoice chose(const AttentionConfig& config, double ms = 1.0, double default_ms = 2.0) {
  TuneChoice choice;
  choice.config = config;
  choice.median_ms = ms;
  choice.default_ms = default_ms;
  return choice;
}

using flashjit::testing::query;

std::unique_ptr<TuningStore> open_store(const fs::path& path) {
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open(path);
  EXPECT_TRUE(store.ok()) << store.error().describe();
  return store.ok() ? std::move(store.value()) : nullptr;
}

class TuningStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("flashjit-store-test-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  fs::path dir_;
};

TEST(TuningStoreKeys, SizeBucketIsTheNextPowerOfTwo) {
  EXPECT_EQ(size_bucket(0), 1);
  EXPECT_EQ(size_bucket(1), 1);
  EXPECT_EQ(size_bucket(2), 2);
  EXPECT_EQ(size_bucket(3), 4);
  EXPECT_EQ(size_bucket(1000), 1024);
  EXPECT_EQ(size_bucket(1024), 1024);
  EXPECT_EQ(size_bucket(1025), 2048);
  EXPECT_EQ(size_bucket(int64_t{1} << 40), int64_t{1} << 40);
}

TEST(TuningStoreKeys, ProblemKeyOfAProblem) {
  const AttentionProblem problem =
      AttentionProblem::make(3, 16, 4, 1000, 3000, 96, DType::F16, /*causal=*/true);
  const ProblemKey k = ProblemKey::of(problem);
  EXPECT_EQ(k.head_dim, 96);
  EXPECT_EQ(k.dtype, DType::F16);
  EXPECT_TRUE(k.causal);
  EXPECT_EQ(k.group_size, 4);
  EXPECT_EQ(k.seqlen_q_bucket, 1024);
  EXPECT_EQ(k.seqlen_k_bucket, 4096);
  EXPECT_EQ(k.batch_heads_bucket, 64);  // 3 * 16 = 48 -> 64
  EXPECT_EQ(k.to_string(), "d96 f16 causal g4 q1024 k4096 bh64");
  EXPECT_EQ(key().to_string(), "d128 bf16 noncausal g1 q4096 k4096 bh32");
}

TEST(TuningStoreKeys, ProblemKeyOfABackwardProblem) {
  AttentionProblem problem =
      AttentionProblem::make(3, 16, 4, 1000, 3000, 96, DType::F16, true).with_pass(Pass::Backward);
  ProblemKey k = ProblemKey::of(problem);
  EXPECT_EQ(k.pass, Pass::Backward);
  EXPECT_FALSE(k.deterministic);
  EXPECT_STREQ(k.pass_name(), "bwd");
  EXPECT_EQ(k.to_string(), "bwd d96 f16 causal g4 q1024 k4096 bh64");
  problem.deterministic = true;
  k = ProblemKey::of(problem);
  EXPECT_TRUE(k.deterministic);
  EXPECT_STREQ(k.pass_name(), "bwd-det");
  EXPECT_EQ(k.to_string(), "bwd-det d96 f16 causal g4 q1024 k4096 bh64");
  // The flag means nothing for the forward pass: not part of a forward key.
  k = ProblemKey::of(problem.with_pass(Pass::Forward));
  EXPECT_EQ(k.pass, Pass::Forward);
  EXPECT_FALSE(k.deterministic);
  EXPECT_STREQ(k.pass_name(), "fwd");
  EXPECT_EQ(k.to_string(), "d96 f16 causal g4 q1024 k4096 bh64");
}

TEST(TuningStoreKeys, FingerprintAndStatusStrings) {
  EXPECT_EQ(fingerprint().to_string(),
            "cuda|Test GPU|sm90|132sm|232448B|52428800B|drv13000|nvrtc 13.0");
  DeviceFingerprint amd;
  amd.backend = "hip";
  amd.name = "AMD Instinct MI250X";
  amd.arch = gcn_arch_number("gfx90a:sramecc+:xnack-");
  amd.sm_count = 110;
  amd.smem_per_block_optin = 65536;
  amd.l2_bytes = 8 << 20;
  amd.driver_version = 50221153;
  amd.compiler = "hiprtc 5.2.21153 gfx90a:sramecc+:xnack-";
  EXPECT_EQ(amd.to_string(),
            "hip|AMD Instinct MI250X|gfx90a|110cu|65536B|8388608B|drv50221153|"
            "hiprtc 5.2.21153 gfx90a:sramecc+:xnack-");
  EXPECT_STREQ(to_string(TuneStatus::Timed), "timed");
  EXPECT_STREQ(to_string(TuneStatus::CompileFailed), "compile-failed");
  EXPECT_STREQ(to_string(TuneStatus::LaunchFailed), "launch-failed");
  EXPECT_STREQ(to_string(TuneStatus::WrongResult), "wrong-result");
}

TEST_F(TuningStoreTest, SchemaIsReadableWithPlainSqlite) {
  const fs::path path = dir_ / "tuning.db";
  {
    auto store = open_store(path);
    ASSERT_TRUE(store);
    EXPECT_EQ(store->path(), path);
    ASSERT_TRUE(store->record(fingerprint(), key(), timed(config(128), 1.5)).ok());
    ASSERT_TRUE(store->record(fingerprint(), key(), timed(config(64), 1.0)).ok());
    ASSERT_TRUE(store->choose(fingerprint(), key(), chose(config(64), 1.0, 1.5)).ok());
  }
  // Opening again is idempotent (CREATE ... IF NOT EXISTS) and keeps the rows.
  ASSERT_TRUE(open_store(path));

  const std::vector<std::string> tables =
      query(path, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name");
  const std::set<std::string> table_set(tables.begin(), tables.end());
  for (const char* table : {"meta", "devices", "results", "choices", "recorded_problems"}) {
    EXPECT_TRUE(table_set.count(table)) << table;
  }
  EXPECT_EQ(query(path, "SELECT name FROM sqlite_master WHERE type = 'view'"),
            std::vector<std::string>{"best_configs"});
  EXPECT_EQ(query(path, "SELECT value FROM meta WHERE key = 'schema_version'"),
            std::vector<std::string>{"3"});
  EXPECT_EQ(query(path, "PRAGMA journal_mode"), std::vector<std::string>{"wal"});

  EXPECT_EQ(query(path, "SELECT count(*) FROM results"), std::vector<std::string>{"2"});
  EXPECT_EQ(query(path,
                  "SELECT config || ' ' || status || ' ' || generator FROM results "
                  "WHERE head_dim = 128 AND dtype = 'bf16' AND causal = 0 ORDER BY median_ms"),
            (std::vector<std::string>{
                "m64n64w4s2 timed " + generator_version_of("cuda|", Pass::Forward),
                "m128n64w4s2 timed " + generator_version_of("cuda|", Pass::Forward)}));
  EXPECT_EQ(query(path,
                  "SELECT config || ' ' || printf('%.2f', speedup) || ' ' || repetitions "
                  "FROM best_configs"),
            std::vector<std::string>{"m64n64w4s2 1.50 10"});
  EXPECT_EQ(query(path, "SELECT name || ' ' || arch || ' ' || driver_version FROM devices"),
            std::vector<std::string>{"Test GPU 90 13000"});
}

TEST_F(TuningStoreTest, RecordChooseResultsChoiceRoundTrip) {
  auto store = open_store(dir_ / "tuning.db");
  ASSERT_TRUE(store);
  const DeviceFingerprint device = fingerprint();

  TuneResult failed;
  failed.config = config(256, 128, 8, 3);
  failed.status = TuneStatus::CompileFailed;
  failed.message = "ptxas: too many registers";
  TuneResult slow = timed(config(128), 2.0);
  slow.is_default = true;
  ASSERT_TRUE(store->record(device, key(), failed).ok());
  ASSERT_TRUE(store->record(device, key(), slow).ok());
  ASSERT_TRUE(store->record(device, key(), timed(config(64), 3.0)).ok());
  // Same config again: replaced, not duplicated.
  ASSERT_TRUE(store->record(device, key(), timed(config(64), 1.0)).ok());

  Result<std::vector<TuneResult>> rows = store->results(device, key());
  ASSERT_TRUE(rows.ok()) << rows.error().describe();
  ASSERT_EQ(rows->size(), 3u);
  // Timed first, fastest first; failures last.
  EXPECT_EQ((*rows)[0].config, config(64));
  EXPECT_DOUBLE_EQ((*rows)[0].median_ms, 1.0);
  EXPECT_EQ((*rows)[1].config, config(128));
  EXPECT_TRUE((*rows)[1].is_default);
  EXPECT_DOUBLE_EQ((*rows)[1].min_ms, 1.8);
  EXPECT_DOUBLE_EQ((*rows)[1].max_ms, 2.2);
  EXPECT_EQ((*rows)[1].repetitions, 10);
  EXPECT_DOUBLE_EQ((*rows)[1].tflops, 50.0);
  EXPECT_EQ((*rows)[2].status, TuneStatus::CompileFailed);
  EXPECT_EQ((*rows)[2].message, "ptxas: too many registers");

  Result<std::optional<TuneChoice>> none = store->choice(device, key());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(store->choose(device, key(), chose(config(64), 1.0, 2.0)).ok());
  ASSERT_TRUE(store->choose(device, key(), chose(config(128), 2.0, 2.0)).ok());  // replaces
  Result<std::optional<TuneChoice>> choice = store->choice(device, key());
  ASSERT_TRUE(choice.ok()) << choice.error().describe();
  ASSERT_TRUE(choice->has_value());
  EXPECT_EQ((*choice)->config, config(128));
  EXPECT_DOUBLE_EQ((*choice)->default_ms, 2.0);

  // Another key has nothing.
  EXPECT_TRUE(store->results(device, key(1024))->empty());
  EXPECT_FALSE(store->choice(device, key(1024))->has_value());

  Result<std::vector<TuningStore::Entry>> entries = store->entries();
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].device, device.to_string());
  EXPECT_EQ((*entries)[0].generator, generator_version_of(device.to_string(), Pass::Forward));
  EXPECT_EQ((*entries)[0].key, key());
  EXPECT_TRUE((*entries)[0].current);

  Result<std::vector<TuningStore::ResultEntry>> all = store->result_entries();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);
  EXPECT_FALSE((*all)[0].recorded_at.empty());
  EXPECT_EQ(store->result_entries(key(1024))->size(), 0u);
}

TEST_F(TuningStoreTest, NearestChoicePrefersCloseBucketsThenLargerOnes) {
  auto store = open_store(dir_ / "tuning.db");
  ASSERT_TRUE(store);
  const DeviceFingerprint device = fingerprint();
  ASSERT_TRUE(store->choose(device, key(1024, 1024, 32), chose(config(64))).ok());
  ASSERT_TRUE(store->choose(device, key(4096, 4096, 32), chose(config(128))).ok());

  auto nearest = [&](const ProblemKey& k) {
    Result<std::optional<std::pair<ProblemKey, TuneChoice>>> found =
        store->nearest_choice(device, k);
    EXPECT_TRUE(found.ok()) << found.error().describe();
    return found.ok() ? found.value() : std::nullopt;
  };
  // Exact key: distance 0.
  ASSERT_TRUE(nearest(key(1024, 1024, 32)));
  EXPECT_EQ(nearest(key(1024, 1024, 32))->first, key(1024, 1024, 32));
  // 2048/2048 is 2 steps from both: the tie goes to the larger buckets.
  ASSERT_TRUE(nearest(key(2048, 2048, 32)));
  EXPECT_EQ(nearest(key(2048, 2048, 32))->first, key(4096, 4096, 32));
  EXPECT_EQ(nearest(key(2048, 2048, 32))->second.config, config(128));
  // Closer to the small one.
  EXPECT_EQ(nearest(key(512, 1024, 32))->first, key(1024, 1024, 32));
  EXPECT_EQ(nearest(key(1024, 1024, 8))->first, key(1024, 1024, 32));
  // Far beyond both: the large one.
  EXPECT_EQ(nearest(key(65536, 65536, 4096))->first, key(4096, 4096, 32));

  // Never across head_dim, dtype, causal or GQA group.
  EXPECT_FALSE(nearest(key(4096, 4096, 32, /*head_dim=*/64)));
  EXPECT_FALSE(nearest(key(4096, 4096, 32, 128, DType::F16)));
  EXPECT_FALSE(nearest(key(4096, 4096, 32, 128, DType::BF16, /*causal=*/true)));
  EXPECT_FALSE(nearest(key(4096, 4096, 32, 128, DType::BF16, false, /*group=*/4)));
  // Nor across devices.
  Result<std::optional<std::pair<ProblemKey, TuneChoice>>> other =
      store->nearest_choice(fingerprint(12080), key());
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
}

TEST_F(TuningStoreTest, RowsOfAnotherDeviceOrGeneratorAreNotUsed) {
  const fs::path path = dir_ / "tuning.db";
  auto store = open_store(path);
  ASSERT_TRUE(store);
  const DeviceFingerprint device = fingerprint();
  const DeviceFingerprint new_driver = fingerprint(13010);
  ASSERT_TRUE(store->record(device, key(), timed(config(64), 1.0)).ok());
  ASSERT_TRUE(store->choose(device, key(), chose(config(64))).ok());
  // Another driver (or compiler) is another fingerprint: nothing is found for it.
  EXPECT_FALSE(store->choice(new_driver, key())->has_value());
  EXPECT_FALSE(store->nearest_choice(new_driver, key())->has_value());
  EXPECT_TRUE(store->results(new_driver, key())->empty());

  // Rows of an older generator version (as an older build wrote them) are kept but not used.
  ASSERT_TRUE(store->choose(device, key(1024), chose(config(128))).ok());
  query(path, "UPDATE choices SET generator = 'old-generator' WHERE seqlen_q_bucket = 4096");
  query(path, "UPDATE results SET generator = 'old-generator'");
  EXPECT_FALSE(store->choice(device, key())->has_value());
  EXPECT_TRUE(store->results(device, key())->empty());
  // The nearest is the current row at q1024, not the stale exact one.
  EXPECT_EQ(store->nearest_choice(device, key())->value().first, key(1024));

  Result<std::vector<TuningStore::Entry>> entries = store->entries();
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 2u);
  int stale = 0;
  for (const auto& entry : *entries) stale += entry.current ? 0 : 1;
  EXPECT_EQ(stale, 1);

  ASSERT_TRUE(store->clear(/*stale_only=*/true).ok());
  entries = store->entries();
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_TRUE((*entries)[0].current);
  EXPECT_TRUE(store->result_entries()->empty());

  ASSERT_TRUE(
      store->record_miss(device, AttentionProblem::make(1, 8, 8, 100, 100, 64, DType::BF16, false))
          .ok());
  ASSERT_TRUE(store->clear(/*stale_only=*/false).ok());
  EXPECT_TRUE(store->entries()->empty());
  EXPECT_TRUE(store->recorded_problems(device)->empty());
}

TEST_F(TuningStoreTest, MergeTakesNewerRowsAndAddsMissingOnes) {
  const fs::path a_path = dir_ / "a.db";
  const fs::path b_path = dir_ / "b.db";
  const DeviceFingerprint device = fingerprint();
  {
    auto a = open_store(a_path);
    auto b = open_store(b_path);
    ASSERT_TRUE(a && b);
    ASSERT_TRUE(a->choose(device, key(1024), chose(config(64))).ok());  // older than b's
    ASSERT_TRUE(a->choose(device, key(2048), chose(config(64))).ok());  // newer than b's
    ASSERT_TRUE(a->choose(device, key(8192), chose(config(64))).ok());  // only in a
    ASSERT_TRUE(b->choose(device, key(1024), chose(config(128))).ok());
    ASSERT_TRUE(b->choose(device, key(2048), chose(config(128))).ok());
    ASSERT_TRUE(b->choose(device, key(4096), chose(config(128))).ok());  // only in b
    ASSERT_TRUE(b->record(device, key(4096), timed(config(128), 1.0)).ok());
    ASSERT_TRUE(
        b->record_miss(device, AttentionProblem::make(2, 8, 8, 300, 300, 64, DType::BF16, true))
            .ok());
  }
  query(a_path,
        "UPDATE choices SET chosen_at = '2026-01-01 00:00:00.000' "
        "WHERE seqlen_q_bucket = 1024");
  query(a_path,
        "UPDATE choices SET chosen_at = '2030-01-01 00:00:00.000' "
        "WHERE seqlen_q_bucket = 2048");

  auto a = open_store(a_path);
  ASSERT_TRUE(a);
  Status merged = a->merge_from(b_path);
  ASSERT_TRUE(merged.ok()) << merged.error().describe();
  EXPECT_EQ(a->choice(device, key(1024))->value().config, config(128));  // b's is newer
  EXPECT_EQ(a->choice(device, key(2048))->value().config, config(64));   // a's is newer
  EXPECT_EQ(a->choice(device, key(8192))->value().config, config(64));
  EXPECT_EQ(a->choice(device, key(4096))->value().config, config(128));
  EXPECT_EQ(a->results(device, key(4096))->size(), 1u);
  EXPECT_EQ(a->recorded_problems(device)->size(), 1u);
  // Merging again changes nothing.
  ASSERT_TRUE(a->merge_from(b_path).ok());
  EXPECT_EQ(a->entries()->size(), 4u);
  EXPECT_EQ(a->recorded_problems(device)->size(), 1u);

  Status missing = a->merge_from(dir_ / "missing.db");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::NotFound);
  EXPECT_NE(missing.error().message.find("missing.db"), std::string::npos);
  Status self = a->merge_from(a_path);
  ASSERT_FALSE(self.ok());
  EXPECT_EQ(self.error().code, ErrorCode::InvalidArgument);
  { std::ofstream(dir_ / "junk.db") << std::string(4096, 'x'); }
  Status junk = a->merge_from(dir_ / "junk.db");
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.error().message.find("junk.db"), std::string::npos) << junk.error().message;
  // A failed merge leaves the DB usable.
  EXPECT_EQ(a->entries()->size(), 4u);
  ASSERT_TRUE(a->choose(device, key(16384), chose(config(64))).ok());
}

TEST_F(TuningStoreTest, ReadOnlyDbReadsAndRejectsWritesCleanly) {
  const fs::path path = dir_ / "system.db";
  Result<std::unique_ptr<TuningStore>> missing = TuningStore::open_read_only(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::NotFound);
  EXPECT_NE(missing.error().message.find(path.string()), std::string::npos);
  {
    auto store = open_store(path);
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->choose(fingerprint(), key(), chose(config(64))).ok());
  }
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open_read_only(path);
  ASSERT_TRUE(store.ok()) << store.error().describe();
  EXPECT_EQ((*store)->choice(fingerprint(), key())->value().config, config(64));
  Status write = (*store)->choose(fingerprint(), key(), chose(config(128)));
  ASSERT_FALSE(write.ok());
  EXPECT_EQ(write.error().code, ErrorCode::IoError);
  EXPECT_NE(write.error().message.find(path.string()), std::string::npos);
  EXPECT_NE(write.error().message.find("readonly"), std::string::npos) << write.error().message;
  EXPECT_FALSE((*store)->record(fingerprint(), key(), timed(config(128), 1.0)).ok());
  EXPECT_FALSE((*store)->clear(false).ok());
  // Still readable, unchanged.
  EXPECT_EQ((*store)->choice(fingerprint(), key())->value().config, config(64));
}

TEST_F(TuningStoreTest, CorruptOrForeignFileIsAnErrorNotACrash) {
  const fs::path junk = dir_ / "junk.db";
  { std::ofstream(junk) << std::string(8192, '\x5a'); }
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open(junk);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, ErrorCode::IoError);
  EXPECT_NE(store.error().message.find(junk.string()), std::string::npos);
  Result<std::unique_ptr<TuningStore>> read_only = TuningStore::open_read_only(junk);
  ASSERT_FALSE(read_only.ok());
  EXPECT_NE(read_only.error().message.find(junk.string()), std::string::npos);

  // A valid SQLite file that is not a tuning DB.
  const fs::path foreign = dir_ / "foreign.db";
  query(foreign, "CREATE TABLE other (x)");
  Result<std::unique_ptr<TuningStore>> other = TuningStore::open_read_only(foreign);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message.find("not a flashjit tuning database"), std::string::npos)
      << other.error().message;

  // A newer schema version is refused, not misread.
  const fs::path newer = dir_ / "newer.db";
  ASSERT_TRUE(open_store(newer));
  query(newer, "UPDATE meta SET value = '99' WHERE key = 'schema_version'");
  Result<std::unique_ptr<TuningStore>> refused = TuningStore::open(newer);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::Unsupported);
  EXPECT_NE(refused.error().message.find("'99'"), std::string::npos);

  // A directory where the file should be.
  Result<std::unique_ptr<TuningStore>> dir = TuningStore::open(dir_);
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.error().code, ErrorCode::IoError);
}

TEST_F(TuningStoreTest, RecordedProblemsCountUses) {
  auto store = open_store(dir_ / "tuning.db");
  ASSERT_TRUE(store);
  const AttentionProblem once = AttentionProblem::make(1, 8, 8, 100, 200, 64, DType::F16, true);
  const AttentionProblem twice =
      AttentionProblem::make(2, 16, 4, 3000, 3000, 128, DType::BF16, false);
  ASSERT_TRUE(store->record_miss(fingerprint(), once).ok());
  ASSERT_TRUE(store->record_miss(fingerprint(), twice).ok());
  ASSERT_TRUE(store->record_miss(fingerprint(), twice).ok());
  Result<std::vector<AttentionProblem>> problems = store->recorded_problems(fingerprint());
  ASSERT_TRUE(problems.ok()) << problems.error().describe();
  ASSERT_EQ(problems->size(), 2u);
  EXPECT_EQ((*problems)[0].to_string(), twice.to_string());  // most used first
  EXPECT_EQ((*problems)[1].to_string(), once.to_string());
  EXPECT_TRUE(store->recorded_problems(fingerprint(1))->empty());
}

TEST_F(TuningStoreTest, ExportIsASelfContainedReadOnlyCopy) {
  const fs::path path = dir_ / "tuning.db";
  const fs::path copy = dir_ / "copy.db";
  auto store = open_store(path);
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->choose(fingerprint(), key(), chose(config(64))).ok());
  Status exported = store->export_to(copy);
  ASSERT_TRUE(exported.ok()) << exported.error().describe();
  EXPECT_EQ(query(copy, "PRAGMA journal_mode"), std::vector<std::string>{"delete"});
  Result<std::unique_ptr<TuningStore>> read = TuningStore::open_read_only(copy);
  ASSERT_TRUE(read.ok()) << read.error().describe();
  EXPECT_EQ((*read)->choice(fingerprint(), key())->value().config, config(64));
  Status again = store->export_to(copy);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, ErrorCode::InvalidArgument);
}

TEST_F(TuningStoreTest, ThePassAndTheDeterministicFlagArePartOfTheKey) {
  const fs::path path = dir_ / "tuning.db";
  auto store = open_store(path);
  ASSERT_TRUE(store);
  const DeviceFingerprint device = fingerprint();
  const ProblemKey fwd = key();
  const ProblemKey bwd = backward(key());
  const ProblemKey bwd_det = backward(key(), /*deterministic=*/true);
  // The same shape and config in every pass: three rows, not one replaced twice.
  ASSERT_TRUE(store->record(device, fwd, timed(config(64), 1.0)).ok());
  ASSERT_TRUE(store->record(device, bwd, timed(config(64), 3.0)).ok());
  ASSERT_TRUE(store->record(device, bwd, timed(config(128), 2.5)).ok());
  ASSERT_TRUE(store->record(device, bwd_det, timed(separate_dq(config(64)), 4.0)).ok());
  ASSERT_TRUE(store->choose(device, fwd, chose(config(64), 1.0, 1.0)).ok());
  ASSERT_TRUE(store->choose(device, bwd, chose(config(128), 2.5, 3.0)).ok());
  ASSERT_TRUE(store->choose(device, bwd_det, chose(separate_dq(config(64)), 4.0, 4.0)).ok());

  ASSERT_EQ(store->results(device, fwd)->size(), 1u);
  EXPECT_DOUBLE_EQ(store->results(device, fwd)->front().median_ms, 1.0);
  ASSERT_EQ(store->results(device, bwd)->size(), 2u);
  EXPECT_EQ(store->results(device, bwd)->front().config, config(128));  // fastest first
  ASSERT_EQ(store->results(device, bwd_det)->size(), 1u);
  EXPECT_EQ(store->results(device, bwd_det)->front().config, separate_dq(config(64)));
  EXPECT_EQ(store->choice(device, fwd)->value().config, config(64));
  EXPECT_EQ(store->choice(device, bwd)->value().config, config(128));
  EXPECT_DOUBLE_EQ(store->choice(device, bwd)->value().default_ms, 3.0);
  EXPECT_EQ(store->choice(device, bwd_det)->value().config, separate_dq(config(64)));

  // A forward key with the flag set is the forward key (the flag is backward only).
  ProblemKey flagged = fwd;
  flagged.deterministic = true;
  EXPECT_EQ(store->choice(device, flagged)->value().config, config(64));
  ASSERT_TRUE(store->record(device, flagged, timed(config(64), 0.5)).ok());
  EXPECT_EQ(store->results(device, fwd)->size(), 1u);
  EXPECT_DOUBLE_EQ(store->results(device, fwd)->front().median_ms, 0.5);

  Result<std::vector<TuningStore::Entry>> entries = store->entries();
  ASSERT_TRUE(entries.ok()) << entries.error().describe();
  ASSERT_EQ(entries->size(), 3u);
  std::set<std::string> listed;
  for (const TuningStore::Entry& entry : *entries) {
    listed.insert(entry.key.to_string() + " " + entry.choice.config.to_string());
  }
  EXPECT_EQ(listed, (std::set<std::string>{fwd.to_string() + " m64n64w4s2",
                                           bwd.to_string() + " m128n64w4s2",
                                           bwd_det.to_string() + " m64n64w4s2-det"}));
  Result<std::vector<TuningStore::ResultEntry>> rows = store->result_entries();
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->size(), 4u);
  EXPECT_EQ(store->result_entries(fwd)->size(), 1u);
  EXPECT_EQ(store->result_entries(bwd)->size(), 2u);
  ASSERT_EQ(store->result_entries(bwd_det)->size(), 1u);
  EXPECT_EQ(store->result_entries(bwd_det)->front().key, bwd_det);

  // In the file: the pass and the flag as columns, and the view joins on them (a join without
  // them would pair the forward choice with the backward m64n64w4s2 row too).
  EXPECT_EQ(
      query(path,
            "SELECT pass || ' ' || deterministic || ' ' || config FROM choices "
            "ORDER BY pass, deterministic"),
      (std::vector<std::string>{"bwd 0 m128n64w4s2", "bwd 1 m64n64w4s2-det", "fwd 0 m64n64w4s2"}));
  EXPECT_EQ(query(path,
                  "SELECT pass || ' ' || deterministic || ' ' || config || ' ' || median_ms || "
                  "' ' || min_ms FROM best_configs ORDER BY pass, deterministic"),
            (std::vector<std::string>{"bwd 0 m128n64w4s2 2.5 2.25", "bwd 1 m64n64w4s2-det 4.0 3.6",
                                      "fwd 0 m64n64w4s2 1.0 0.45"}));
}

TEST_F(TuningStoreTest, NearestChoiceStaysWithinThePassAndTheFlag) {
  auto store = open_store(dir_ / "tuning.db");
  ASSERT_TRUE(store);
  const DeviceFingerprint device = fingerprint();
  auto nearest = [&](const ProblemKey& k) {
    Result<std::optional<std::pair<ProblemKey, TuneChoice>>> found =
        store->nearest_choice(device, k);
    EXPECT_TRUE(found.ok()) << found.error().describe();
    return found.ok() ? found.value() : std::nullopt;
  };
  ASSERT_TRUE(store->choose(device, key(1024, 1024, 32), chose(config(64))).ok());
  EXPECT_FALSE(nearest(backward(key())));  // forward choices never serve a backward key
  ASSERT_TRUE(store->choose(device, backward(key(1024, 1024, 32)), chose(config(128))).ok());
  ASSERT_TRUE(nearest(backward(key())));
  EXPECT_EQ(nearest(backward(key()))->first, backward(key(1024, 1024, 32)));
  EXPECT_EQ(nearest(backward(key()))->second.config, config(128));
  EXPECT_FALSE(nearest(backward(key(), /*deterministic=*/true)));
  ASSERT_TRUE(
      store->choose(device, backward(key(16384, 16384, 32), true), chose(separate_dq(config(32))))
          .ok());
  ASSERT_TRUE(nearest(backward(key(), true)));
  EXPECT_EQ(nearest(backward(key(), true))->first, backward(key(16384, 16384, 32), true));
  EXPECT_EQ(nearest(backward(key(), true))->second.config, separate_dq(config(32)));
  // The forward key still finds the forward choice only.
  EXPECT_EQ(nearest(key())->first, key(1024, 1024, 32));
  EXPECT_EQ(nearest(key())->second.config, config(64));
}

TEST_F(TuningStoreTest, RecordedProblemsKeepTheirPassAndFlag) {
  const fs::path path = dir_ / "tuning.db";
  auto store = open_store(path);
  ASSERT_TRUE(store);
  const AttentionProblem forward =
      AttentionProblem::make(2, 16, 4, 1000, 17, 128, DType::BF16, /*causal=*/true);
  const AttentionProblem bwd = forward.with_pass(Pass::Backward);
  AttentionProblem bwd_det = bwd;
  bwd_det.deterministic = true;
  AttentionProblem flagged_forward = forward;  // the flag is not part of a forward problem
  flagged_forward.deterministic = true;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(store->record_miss(fingerprint(), bwd_det).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->record_miss(fingerprint(), bwd).ok());
  ASSERT_TRUE(store->record_miss(fingerprint(), forward).ok());
  ASSERT_TRUE(store->record_miss(fingerprint(), flagged_forward).ok());

  EXPECT_EQ(query(path,
                  "SELECT pass || ' ' || deterministic || ' ' || uses FROM recorded_problems "
                  "ORDER BY uses DESC"),
            (std::vector<std::string>{"bwd 1 4", "bwd 0 3", "fwd 0 2"}));
  Result<std::vector<AttentionProblem>> problems = store->recorded_problems(fingerprint());
  ASSERT_TRUE(problems.ok()) << problems.error().describe();
  ASSERT_EQ(problems->size(), 3u);
  EXPECT_EQ((*problems)[0].pass, Pass::Backward);
  EXPECT_TRUE((*problems)[0].deterministic);
  EXPECT_EQ((*problems)[0].to_string(), bwd_det.to_string());
  EXPECT_EQ((*problems)[1].pass, Pass::Backward);
  EXPECT_FALSE((*problems)[1].deterministic);
  EXPECT_EQ((*problems)[1].to_string(), bwd.to_string());
  EXPECT_EQ((*problems)[2].pass, Pass::Forward);
  EXPECT_FALSE((*problems)[2].deterministic);
  EXPECT_EQ((*problems)[2].to_string(), forward.to_string());
  // The replayed problems key like the originals.
  EXPECT_EQ(ProblemKey::of((*problems)[0]), ProblemKey::of(bwd_det));
  EXPECT_EQ(ProblemKey::of((*problems)[1]), ProblemKey::of(bwd));
}

TEST_F(TuningStoreTest, MergeKeepsThePass) {
  const fs::path a_path = dir_ / "a.db";
  const fs::path b_path = dir_ / "b.db";
  const DeviceFingerprint device = fingerprint();
  const AttentionProblem problem = AttentionProblem::make(1, 8, 8, 300, 300, 64, DType::BF16, true);
  {
    auto b = open_store(b_path);
    ASSERT_TRUE(b);
    ASSERT_TRUE(b->choose(device, backward(key()), chose(config(128))).ok());
    ASSERT_TRUE(b->choose(device, backward(key(), true), chose(separate_dq(config(32)))).ok());
    ASSERT_TRUE(b->record(device, backward(key()), timed(config(128), 2.0)).ok());
    ASSERT_TRUE(b->record_miss(device, problem.with_pass(Pass::Backward)).ok());
  }
  {
    // Written after b's rows: a's forward rows of the same shape (and config) are newer, which
    // must not block b's backward rows (another key).
    auto a = open_store(a_path);
    ASSERT_TRUE(a);
    ASSERT_TRUE(a->choose(device, key(), chose(config(64))).ok());
    ASSERT_TRUE(a->record(device, key(), timed(config(128), 1.0)).ok());
    ASSERT_TRUE(a->record_miss(device, problem).ok());
  }
  auto a = open_store(a_path);
  ASSERT_TRUE(a);
  for (int round = 0; round < 2; ++round) {  // merging twice changes nothing
    Status merged = a->merge_from(b_path);
    ASSERT_TRUE(merged.ok()) << merged.error().describe();
    EXPECT_EQ(a->entries()->size(), 3u);
    EXPECT_EQ(a->choice(device, key())->value().config, config(64));
    EXPECT_EQ(a->choice(device, backward(key()))->value().config, config(128));
    EXPECT_EQ(a->choice(device, backward(key(), true))->value().config, separate_dq(config(32)));
    ASSERT_EQ(a->results(device, key())->size(), 1u);
    EXPECT_DOUBLE_EQ(a->results(device, key())->front().median_ms, 1.0);
    ASSERT_EQ(a->results(device, backward(key()))->size(), 1u);
    EXPECT_DOUBLE_EQ(a->results(device, backward(key()))->front().median_ms, 2.0);
    Result<std::vector<AttentionProblem>> problems = a->recorded_problems(device);
    ASSERT_TRUE(problems.ok());
    ASSERT_EQ(problems->size(), 2u);
    std::set<std::string> replayed;
    for (const AttentionProblem& p : *problems) replayed.insert(p.to_string());
    EXPECT_EQ(replayed, (std::set<std::string>{problem.to_string(),
                                               problem.with_pass(Pass::Backward).to_string()}));
  }
}

// A key per row index, so that every row of a writer is distinct.
ProblemKey indexed_key(int writer, int index) { return key(index + 1, writer + 1, 32); }

TEST_F(TuningStoreTest, KilledWriterLosesNoCommittedRowAndTheRunResumes) {
  const fs::path path = dir_ / "tuning.db";
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fds[0]);
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(path);
    if (!store.ok()) _exit(3);
    for (int i = 0; i < 1000000; ++i) {
      if (!(*store)->record(fingerprint(), indexed_key(0, i), timed(config(64), 1.0)).ok()) {
        _exit(4);
      }
      // Reported only after record() returned: the row is committed.
      if (write(pipe_fds[1], &i, sizeof i) != static_cast<ssize_t>(sizeof i)) _exit(5);
    }
    _exit(0);
  }
  close(pipe_fds[1]);
  std::vector<int> committed;
  int index = 0;
  while (committed.size() < 300 && read(pipe_fds[0], &index, sizeof index) == sizeof index) {
    committed.push_back(index);
  }
  ASSERT_EQ(kill(child, SIGKILL), 0);
  while (read(pipe_fds[0], &index, sizeof index) == sizeof index) committed.push_back(index);
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited early with " << WEXITSTATUS(status);
  ASSERT_GE(committed.size(), 300u);

  EXPECT_EQ(query(path, "PRAGMA integrity_check"), std::vector<std::string>{"ok"});
  auto store = open_store(path);
  ASSERT_TRUE(store);
  for (int i : committed) {
    Result<std::vector<TuneResult>> rows = store->results(fingerprint(), indexed_key(0, i));
    ASSERT_TRUE(rows.ok()) << rows.error().describe();
    ASSERT_EQ(rows->size(), 1u) << "row " << i << " was reported committed but is missing";
  }
  // Resume: the next rows go in after the ones already there.
  const int next = committed.back() + 1;
  ASSERT_TRUE(store->record(fingerprint(), indexed_key(0, next), timed(config(64), 1.0)).ok());
  EXPECT_GE(store->result_entries()->size(), committed.size() + 1);
}

TEST_F(TuningStoreTest, FourConcurrentWriterProcessesLoseNoRow) {
  const fs::path path = dir_ / "tuning.db";  // created by the writers themselves, concurrently
  constexpr int kWriters = 4;
  constexpr int kRows = 200;
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> children;
  for (int writer = 0; writer < kWriters; ++writer) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(go[1]);
      char byte = 0;
      (void)!read(go[0], &byte, 1);  // EOF when the parent closes its end: all start at once
      Result<std::unique_ptr<TuningStore>> store = TuningStore::open(path);
      if (!store.ok()) _exit(3);
      for (int i = 0; i < kRows; ++i) {
        const ProblemKey k = indexed_key(writer, i);
        if (!(*store)->record(fingerprint(), k, timed(config(64), 1.0 + i)).ok()) _exit(4);
        if (i % 10 == 0 && !(*store)->choose(fingerprint(), k, chose(config(64))).ok()) _exit(5);
        if (i % 25 == 0 && !(*store)->choice(fingerprint(), k).ok()) _exit(6);
      }
      _exit(0);
    }
    children.push_back(child);
  }
  close(go[0]);
  close(go[1]);
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "a writer failed (3 open, 4 record, 5 choose, 6 read)";
  }
  EXPECT_EQ(query(path, "PRAGMA integrity_check"), std::vector<std::string>{"ok"});
  auto store = open_store(path);
  ASSERT_TRUE(store);
  Result<std::vector<TuningStore::ResultEntry>> rows = store->result_entries();
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->size(), static_cast<size_t>(kWriters * kRows));
  EXPECT_EQ(store->entries()->size(), static_cast<size_t>(kWriters * kRows / 10));
}

}  // namespace
}  // namespace flashjit
