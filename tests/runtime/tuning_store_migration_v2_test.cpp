// Tuning DBs of schema version 2 (the fixture tests/fixtures/tuning_db_v2.db: forward and
// backward rows, no K/V layout or variant columns) opened by this build: migrated in place to
// version 3 by a read-write open (every row kept, as a plain row: page_size 0, seqlens_k 0,
// variant ''; once, also with concurrent openers in several processes; atomically), read as they
// are by a read-only open, merged into a version-3 DB. Variant and paged rows then live beside
// the plain ones under their own keys.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "generator/render.hpp"
#include "runtime/tuning_store.hpp"
#include "support/tuning_db.hpp"

namespace flashjit {
namespace {

namespace fs = std::filesystem;
using flashjit::testing::query;

// Every column of a version-2 table as one text per row: what must survive the migration
// unchanged (the version-3 tables have these columns too, plus page_size, seqlens_k, variant).
constexpr const char* kKeyText =
    "device || '|' || generator || '|' || pass || '|' || deterministic || '|' || head_dim || "
    "'|' || dtype || '|' || causal || '|' || group_size || '|' || seqlen_q_bucket || '|' || "
    "seqlen_k_bucket || '|' || batch_heads_bucket || '|' || config";
const std::string kResultsRow =
    std::string(kKeyText) +
    " || '|' || block_m || '|' || block_n || '|' || warps || '|' || stages || '|' || status || "
    "'|' || median_ms || '|' || min_ms || '|' || max_ms || '|' || repetitions || '|' || tflops "
    "|| '|' || is_default || '|' || message || '|' || recorded_at";
const std::string kChoicesRow =
    std::string(kKeyText) + " || '|' || median_ms || '|' || default_ms || '|' || chosen_at";
constexpr const char* kRecordedRow =
    "device || '|' || pass || '|' || deterministic || '|' || head_dim || '|' || dtype || '|' || "
    "causal || '|' || batch || '|' || heads_q || '|' || heads_kv || '|' || seqlen_q || '|' || "
    "seqlen_k || '|' || uses || '|' || first_seen || '|' || last_seen";

std::vector<std::string> dump(const fs::path& path, const std::string& row, const char* table,
                              const std::string& where = "") {
  std::string sql = "SELECT " + row + " FROM " + table;
  if (!where.empty()) sql += " WHERE " + where;
  return query(path, sql + " ORDER BY 1");
}

struct Contents {
  std::vector<std::string> results, choices, recorded, devices;
  bool operator==(const Contents&) const = default;
};

// The version-2 columns of every row; `where` selects (e.g. the plain rows of a version-3 file).
Contents contents_of(const fs::path& path, const std::string& where = "") {
  return {dump(path, kResultsRow, "results", where), dump(path, kChoicesRow, "choices", where),
          dump(path, kRecordedRow, "recorded_problems", where),
          dump(path, "device || '|' || backend || '|' || name || '|' || compiler", "devices")};
}

constexpr const char* kPlain = "page_size = 0 AND seqlens_k = 0 AND variant = ''";

std::string schema_version_of(const fs::path& path) {
  const std::vector<std::string> rows =
      query(path, "SELECT value FROM meta WHERE key = 'schema_version'");
  if (rows.size() == 1) return rows[0];
  std::string count = std::to_string(rows.size());
  count += " rows";
  return count;
}

// The fixture's forward d32 f16 N 64 key (its forward choice).
ProblemKey fixture_key() {
  ProblemKey key;
  key.head_dim = 32;
  key.dtype = DType::F16;
  key.causal = false;
  key.group_size = 1;
  key.seqlen_q_bucket = 64;
  key.seqlen_k_bucket = 64;
  key.batch_heads_bucket = 4;
  return key;
}

// The same shape with a window and soft-capping; and paged with per-sequence lengths.
ProblemKey windowed_key() {
  ProblemKey key = fixture_key();
  Variant variant;
  variant.window_left = 16;
  variant.window_right = 0;
  variant.softcap = 30.0f;
  key.variant = variant.key();
  return key;
}
ProblemKey paged_key() {
  ProblemKey key = fixture_key();
  key.page_size = 16;
  key.seqlens_k = true;
  return key;
}

TuneChoice choice_of(int block_m) {
  TuneChoice choice;
  choice.config = AttentionConfig{block_m, 32, 1, 1};
  choice.median_ms = 1.0;
  return choice;
}

// The fixture's rows carry another build's generator version: re-stamp them with this build's
// plain ones (plain SQL, works on either schema: both have a pass column).
void restamp_generator(const fs::path& path) {
  for (const char* table : {"results", "choices"})
    query(path, std::string("UPDATE ") + table + " SET generator = CASE WHEN pass = 'bwd' THEN '" +
                    generator_version_of("cpu|", Pass::Backward) + "' ELSE '" +
                    generator_version_of("cpu|", Pass::Forward) + "' END");
}

class TuningStoreMigrationV2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("flashjit-migration-v2-test-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_TRUE(fs::is_regular_file(testing::tuning_db_v2_fixture()))
        << testing::tuning_db_v2_fixture();
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  fs::path copy_fixture(const std::string& name = "v2.db") {
    const fs::path path = dir_ / name;
    fs::copy_file(testing::tuning_db_v2_fixture(), path);
    return path;
  }
  fs::path dir_;
};

TEST_F(TuningStoreMigrationV2Test, TheFixtureIsAVersion2DbWithRealContent) {
  const fs::path path = copy_fixture();
  EXPECT_EQ(schema_version_of(path), "2");
  EXPECT_FALSE(
      query(path, "SELECT name FROM pragma_table_info('results') WHERE name = 'pass'").empty());
  EXPECT_TRUE(
      query(path, "SELECT name FROM pragma_table_info('results') WHERE name = 'variant'").empty());
  const Contents before = contents_of(path);
  EXPECT_EQ(before.results.size(), 25u);
  EXPECT_EQ(before.choices.size(), 2u);
  EXPECT_EQ(before.recorded.size(), 3u);
  EXPECT_EQ(query(path, "SELECT DISTINCT pass FROM choices ORDER BY 1"),
            (std::vector<std::string>{"bwd", "fwd"}));
}

TEST_F(TuningStoreMigrationV2Test, ReadWriteOpenMigratesEveryRowAsPlain) {
  const fs::path path = copy_fixture();
  const Contents before = contents_of(path);
  Result<std::unique_ptr<TuningStore>> opened = TuningStore::open(path);
  ASSERT_TRUE(opened.ok()) << opened.error().describe();
  TuningStore& store = **opened;

  EXPECT_EQ(schema_version_of(path), "3");
  EXPECT_EQ(contents_of(path), before);  // no row lost, added or changed
  EXPECT_EQ(contents_of(path, kPlain), before);
  EXPECT_EQ(query(path, "SELECT count(*) FROM recorded_problems WHERE variant_spec = ''"),
            std::vector<std::string>{"3"});
  EXPECT_EQ(query(path, "PRAGMA integrity_check"), std::vector<std::string>{"ok"});
  EXPECT_TRUE(query(path, "SELECT name FROM sqlite_master WHERE name LIKE '%_v2'").empty());
  EXPECT_EQ(query(path, "SELECT count(*) FROM best_configs WHERE repetitions IS NULL"),
            std::vector<std::string>{"0"});  // every choice joins its results row

  const DeviceFingerprint device = testing::devices_of(path).at(0);
  Result<std::vector<AttentionProblem>> recorded = store.recorded_problems(device);
  ASSERT_TRUE(recorded.ok()) << recorded.error().describe();
  ASSERT_EQ(recorded->size(), 3u);
  for (const AttentionProblem& problem : *recorded) {
    EXPECT_FALSE(problem.variant.active()) << problem.to_string();
    EXPECT_FALSE(problem.kv.paged() || problem.kv.seqlens_k) << problem.to_string();
  }

  // The fixture's forward choice, once current; variant and paged keys of the same shape have
  // nothing until they are tuned, then each its own.
  restamp_generator(path);
  ASSERT_TRUE(store.choice(device, fixture_key())->has_value());
  const std::string fixture_config =
      store.choice(device, fixture_key())->value().config.to_string();
  EXPECT_FALSE(store.choice(device, windowed_key())->has_value());
  EXPECT_FALSE(store.nearest_choice(device, windowed_key())->has_value());
  EXPECT_FALSE(store.choice(device, paged_key())->has_value());
  ASSERT_TRUE(store.choose(device, windowed_key(), choice_of(16)).ok());
  ASSERT_TRUE(store.choose(device, paged_key(), choice_of(64)).ok());
  EXPECT_EQ(store.choice(device, windowed_key())->value().config, choice_of(16).config);
  EXPECT_EQ(store.choice(device, paged_key())->value().config, choice_of(64).config);
  EXPECT_EQ(store.choice(device, fixture_key())->value().config.to_string(), fixture_config);
  EXPECT_EQ(query(path, "SELECT generator FROM choices WHERE variant <> ''"),
            std::vector<std::string>{
                variant_generator_version_of(device.to_string(), windowed_key().pass)});

  // Reopening is a no-op: no DDL (SQLite's schema cookie stays), the same rows.
  const std::vector<std::string> cookie = query(path, "PRAGMA schema_version");
  const Contents migrated = contents_of(path);
  opened->reset();
  ASSERT_TRUE(TuningStore::open(path).ok());
  EXPECT_EQ(query(path, "PRAGMA schema_version"), cookie);
  EXPECT_EQ(contents_of(path), migrated);
}

// The previous release stamped every plain row of a backend with one hash of all its templates
// (legacy_row_versions_of), whatever the pass. The fixture as that release would have written it
// with this build's templates: opened read-write, its forward and backward rows are re-stamped
// with their pass's version and served; a second open changes nothing.
TEST_F(TuningStoreMigrationV2Test, PerBackendStampsOfTheSameTemplatesAreReStampedPerPass) {
  const fs::path path = copy_fixture();
  const DeviceFingerprint device = testing::devices_of(path).at(0);
  const std::string prefix = device.to_string().substr(0, device.to_string().find('|') + 1);
  const std::string legacy = legacy_row_versions_of(prefix).plain;
  for (const char* table : {"results", "choices"})
    query(path, std::string("UPDATE ") + table + " SET generator = '" + legacy + "'");
  const size_t results = contents_of(path).results.size();

  Result<std::unique_ptr<TuningStore>> opened = TuningStore::open(path);
  ASSERT_TRUE(opened.ok()) << opened.error().describe();
  for (Pass pass : {Pass::Forward, Pass::Backward})
    EXPECT_EQ(query(path, std::string("SELECT DISTINCT generator FROM choices WHERE pass = '") +
                              to_string(pass) + "'"),
              std::vector<std::string>{generator_version_of(prefix, pass)})
        << to_string(pass);
  EXPECT_EQ(query(path, "SELECT count(*) FROM results WHERE generator = '" + legacy + "'"),
            std::vector<std::string>{"0"});
  EXPECT_EQ(contents_of(path).results.size(), results);
  Result<std::vector<TuningStore::Entry>> entries = (*opened)->entries();
  ASSERT_TRUE(entries.ok()) << entries.error().describe();
  ASSERT_EQ(entries->size(), 2u);
  for (const TuningStore::Entry& entry : *entries) {
    EXPECT_TRUE(entry.current) << entry.key.to_string();
    EXPECT_TRUE((*opened)->choice(device, entry.key)->has_value()) << entry.key.to_string();
  }
  const Contents migrated = contents_of(path);
  opened->reset();
  ASSERT_TRUE(TuningStore::open(path).ok());
  EXPECT_EQ(contents_of(path), migrated);
}

TEST_F(TuningStoreMigrationV2Test, ReadOnlyOpenServesThePlainRowsWithoutMigrating) {
  const fs::path path = copy_fixture();
  restamp_generator(path);
  const Contents before = contents_of(path);
  const DeviceFingerprint device = testing::devices_of(path).at(0);

  Result<std::unique_ptr<TuningStore>> opened = TuningStore::open_read_only(path);
  ASSERT_TRUE(opened.ok()) << opened.error().describe();
  TuningStore& store = **opened;
  ASSERT_TRUE(store.choice(device, fixture_key())->has_value());
  EXPECT_FALSE(store.choice(device, windowed_key())->has_value());
  EXPECT_FALSE(store.nearest_choice(device, paged_key())->has_value());
  EXPECT_TRUE(store.results(device, windowed_key())->empty());
  Result<std::vector<TuningStore::Entry>> entries = store.entries();
  ASSERT_TRUE(entries.ok()) << entries.error().describe();
  ASSERT_EQ(entries->size(), 2u);
  for (const TuningStore::Entry& entry : *entries) {
    EXPECT_TRUE(entry.key.variant.empty());
    EXPECT_EQ(entry.key.page_size, 0);
    EXPECT_TRUE(entry.current);
  }
  EXPECT_EQ(store.result_entries()->size(), before.results.size());
  EXPECT_EQ(store.recorded_problems(device)->size(), before.recorded.size());

  // Writes fail; the file is untouched (still version 2).
  EXPECT_FALSE(store.choose(device, windowed_key(), choice_of(16)).ok());
  EXPECT_EQ(schema_version_of(path), "2");
  EXPECT_EQ(contents_of(path), before);

  // Another store migrates the file while this one is open and adds a variant choice: this one
  // keeps reading right (the version-3 columns win over the view's literals).
  Result<std::unique_ptr<TuningStore>> writer = TuningStore::open(path);
  ASSERT_TRUE(writer.ok()) << writer.error().describe();
  EXPECT_EQ(schema_version_of(path), "3");
  ASSERT_TRUE((*writer)->choose(device, windowed_key(), choice_of(16)).ok());
  ASSERT_TRUE(store.choice(device, windowed_key())->has_value());
  EXPECT_EQ(store.choice(device, windowed_key())->value().config, choice_of(16).config);
  EXPECT_TRUE(store.choice(device, fixture_key())->has_value());
  EXPECT_EQ(store.entries()->size(), 3u);
}

TEST_F(TuningStoreMigrationV2Test, MergeFromTheFixtureBringsPlainRows) {
  const fs::path fixture = copy_fixture();
  const Contents before = contents_of(fixture);
  const DeviceFingerprint device = testing::devices_of(fixture).at(0);
  const fs::path target = dir_ / "target.db";
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open(target);
  ASSERT_TRUE(store.ok()) << store.error().describe();
  ASSERT_TRUE((*store)->choose(device, windowed_key(), choice_of(16)).ok());
  for (int round = 0; round < 2; ++round) {  // merging twice changes nothing
    Status merged = (*store)->merge_from(fixture);
    ASSERT_TRUE(merged.ok()) << merged.error().describe();
    EXPECT_EQ(contents_of(target, kPlain), before);
    EXPECT_EQ(query(target, "SELECT count(*) FROM choices WHERE variant <> ''"),
              std::vector<std::string>{"1"});
  }
  EXPECT_EQ(schema_version_of(fixture), "2");
  EXPECT_EQ(contents_of(fixture), before);
}

TEST_F(TuningStoreMigrationV2Test, ConcurrentOpenersMigrateOnceAndLoseNoRow) {
  constexpr int kOpeners = 6;
  for (int round = 0; round < 2; ++round) {
    const fs::path path = copy_fixture("round" + std::to_string(round) + ".db");
    if (round > 0) {
      EXPECT_EQ(query(path, "PRAGMA journal_mode=WAL"), std::vector<std::string>{"wal"});
    }
    const Contents before = contents_of(path);
    const DeviceFingerprint device = testing::devices_of(path).at(0);
    int go[2];
    ASSERT_EQ(pipe(go), 0);
    std::vector<pid_t> children;
    for (int opener = 0; opener < kOpeners; ++opener) {
      const pid_t child = fork();
      ASSERT_GE(child, 0);
      if (child == 0) {
        close(go[1]);
        char byte = 0;
        (void)!read(go[0], &byte, 1);  // EOF when the parent closes its end: all start at once
        Result<std::unique_ptr<TuningStore>> store = TuningStore::open(path);
        if (!store.ok()) _exit(3);
        Result<std::vector<TuningStore::Entry>> entries = (*store)->entries();
        if (!entries.ok() || entries->size() < before.choices.size()) _exit(4);
        // A variant row of its own: the same shape, a window per opener.
        ProblemKey key = fixture_key();
        Variant variant;
        variant.window_left = 8 + opener;
        key.variant = variant.key();
        TuneResult result;
        result.config = AttentionConfig{16, 32, 1, 1};
        result.median_ms = 1.0 + opener;
        if (!(*store)->record(device, key, result).ok()) _exit(5);
        if (!(*store)->choose(device, key, choice_of(16)).ok()) _exit(6);
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
      EXPECT_EQ(WEXITSTATUS(status), 0)
          << "round " << round << ": an opener failed (3 open, 4 entries, 5 record, 6 choose)";
    }
    EXPECT_EQ(query(path, "PRAGMA integrity_check"), std::vector<std::string>{"ok"});
    EXPECT_EQ(schema_version_of(path), "3");
    // The fixture's rows exactly once, as plain rows, plus one variant row per opener.
    EXPECT_EQ(contents_of(path, kPlain), before);
    EXPECT_EQ(query(path, "SELECT count(DISTINCT variant) FROM choices WHERE variant <> ''"),
              std::vector<std::string>{std::to_string(kOpeners)});
    EXPECT_EQ(query(path, "SELECT count(*) FROM results WHERE variant <> ''"),
              std::vector<std::string>{std::to_string(kOpeners)});
  }
}

TEST_F(TuningStoreMigrationV2Test, AFailedMigrationLeavesTheVersion2FileIntact) {
  const fs::path path = copy_fixture();
  query(path, "CREATE TABLE results_v2 (x)");  // in the way of the migration's rename
  const Contents before = contents_of(path);
  Result<std::unique_ptr<TuningStore>> failed = TuningStore::open(path);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code, ErrorCode::IoError);
  EXPECT_NE(failed.error().message.find("migrating schema version 2 to 3"), std::string::npos)
      << failed.error().message;
  EXPECT_EQ(schema_version_of(path), "2");
  EXPECT_EQ(contents_of(path), before);
  EXPECT_TRUE(
      query(path, "SELECT name FROM pragma_table_info('choices') WHERE name = 'variant'").empty());
  query(path, "DROP TABLE results_v2");
  ASSERT_TRUE(TuningStore::open(path).ok());
  EXPECT_EQ(schema_version_of(path), "3");
  EXPECT_EQ(contents_of(path), before);
}

// The shipped DBs' text form (data/tuning/*.sql, version-2 text) imports as plain rows that stay
// current: variant code has a generator version of its own, so the plain one did not change.
TEST_F(TuningStoreMigrationV2Test, TheShippedVersion2TextImportsAsCurrentPlainRows) {
  int files = 0;
  for (const fs::directory_entry& file : fs::directory_iterator(testing::shipped_tuning_db_dir())) {
    if (file.path().extension() != ".sql") continue;
    ++files;
    SCOPED_TRACE(file.path().string());
    std::ifstream in(file.path());
    std::string header;
    std::getline(in, header);
    EXPECT_EQ(header, "-- flashjit tuning DB, text form; schema_version 2");
    const fs::path db = dir_ / (file.path().stem().string() + ".db");
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(db);
    ASSERT_TRUE(store.ok()) << store.error().describe();
    Status merged = (*store)->merge_from(file.path());
    ASSERT_TRUE(merged.ok()) << merged.error().describe();
    Result<std::vector<TuningStore::Entry>> entries = (*store)->entries();
    ASSERT_TRUE(entries.ok()) << entries.error().describe();
    EXPECT_GT(entries->size(), 10u);
    for (const TuningStore::Entry& entry : *entries) {
      EXPECT_TRUE(entry.current) << entry.key.to_string() << " " << entry.generator;
      EXPECT_TRUE(entry.key.variant.empty() && entry.key.page_size == 0 && !entry.key.seqlens_k);
    }
  }
  EXPECT_GE(files, 1);
}

}  // namespace
}  // namespace flashjit
