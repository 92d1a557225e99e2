// Tuning DBs of schema version 1 (written by the previous release, commit 9131e12: the fixture
// tests/fixtures/tuning_db_v1.db) opened by this build: migrated in place to version 3 by a
// read-write open (every row kept, as a forward row; once, also with concurrent openers in
// several processes; atomically), read as they are by a read-only open, merged into a version-3
// DB. A newer version stays an error.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
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

// Every column of a version-1 table as one text per row: what must survive the migration
// unchanged (the version-2 tables have these columns too, plus pass and deterministic).
constexpr const char* kResultsRow =
    "device || '|' || generator || '|' || head_dim || '|' || dtype || '|' || causal || '|' || "
    "group_size || '|' || seqlen_q_bucket || '|' || seqlen_k_bucket || '|' || "
    "batch_heads_bucket || '|' || config || '|' || block_m || '|' || block_n || '|' || warps || "
    "'|' || stages || '|' || status || '|' || median_ms || '|' || min_ms || '|' || max_ms || '|' "
    "|| repetitions || '|' || tflops || '|' || is_default || '|' || message || '|' || "
    "recorded_at";
constexpr const char* kChoicesRow =
    "device || '|' || generator || '|' || head_dim || '|' || dtype || '|' || causal || '|' || "
    "group_size || '|' || seqlen_q_bucket || '|' || seqlen_k_bucket || '|' || "
    "batch_heads_bucket || '|' || config || '|' || median_ms || '|' || default_ms || '|' || "
    "chosen_at";
constexpr const char* kRecordedRow =
    "device || '|' || head_dim || '|' || dtype || '|' || causal || '|' || batch || '|' || "
    "heads_q || '|' || heads_kv || '|' || seqlen_q || '|' || seqlen_k || '|' || uses || '|' || "
    "first_seen || '|' || last_seen";
constexpr const char* kDevicesRow =
    "device || '|' || backend || '|' || name || '|' || arch || '|' || sm_count || '|' || "
    "smem_per_block_optin || '|' || l2_bytes || '|' || driver_version || '|' || compiler";

// The rows of `table` (as `row` texts, sorted), optionally only those matching `where`.
std::vector<std::string> dump(const fs::path& path, const char* row, const char* table,
                              const std::string& where = "") {
  std::string sql = "SELECT ";
  sql += row;
  sql += " FROM ";
  sql += table;
  if (!where.empty()) sql += " WHERE " + where;
  sql += " ORDER BY 1";
  return query(path, sql);
}

// What a DB file holds, read with plain SQL.
struct Contents {
  std::vector<std::string> results, choices, recorded, devices;
  bool operator==(const Contents&) const = default;
};

Contents contents_of(const fs::path& path) {
  return {dump(path, kResultsRow, "results"), dump(path, kChoicesRow, "choices"),
          dump(path, kRecordedRow, "recorded_problems"), dump(path, kDevicesRow, "devices")};
}

std::string schema_version_of(const fs::path& path) {
  const std::vector<std::string> rows =
      query(path, "SELECT value FROM meta WHERE key = 'schema_version'");
  return rows.size() == 1 ? rows[0] : "(" + std::to_string(rows.size()) + " rows)";
}

// The (pass, deterministic) pairs of a table, e.g. {"fwd 0"}.
std::vector<std::string> passes_in(const fs::path& path, const std::string& table) {
  return query(path, "SELECT DISTINCT pass || ' ' || deterministic FROM " + table + " ORDER BY 1");
}

// The choices of a v1 file with their keys, as (key, config) of this build.
struct FixtureChoice {
  ProblemKey key;
  std::string config;
};
std::vector<FixtureChoice> choices_in_v1(const fs::path& path) {
  std::vector<FixtureChoice> out;
  for (const std::string& row :
       query(path,
             "SELECT head_dim || ' ' || dtype || ' ' || causal || ' ' || group_size || ' ' || "
             "seqlen_q_bucket || ' ' || seqlen_k_bucket || ' ' || batch_heads_bucket || ' ' || "
             "config FROM choices ORDER BY 1")) {
    FixtureChoice choice;
    char dtype[16] = {};
    char config[64] = {};
    int causal = 0;
    long long group = 0, q = 0, k = 0, bh = 0;
    EXPECT_EQ(std::sscanf(row.c_str(), "%d %15s %d %lld %lld %lld %lld %63s", &choice.key.head_dim,
                          dtype, &causal, &group, &q, &k, &bh, config),
              8)
        << row;
    choice.key.dtype = parse_dtype(dtype).value();
    choice.key.causal = causal != 0;
    choice.key.group_size = group;
    choice.key.seqlen_q_bucket = q;
    choice.key.seqlen_k_bucket = k;
    choice.key.batch_heads_bucket = bh;
    choice.config = config;
    out.push_back(choice);
  }
  return out;
}

// The fixture's rows were written by another generator version (the templates changed since),
// so this build's staleness rule hides them from choice(). Tests that look a fixture key up
// re-stamp the rows with this build's version first (plain SQL; version-1 files have only
// forward rows and no pass column).
void restamp_generator(const fs::path& path) {
  const bool has_pass =
      !query(path, "SELECT 1 FROM pragma_table_info('choices') WHERE name = 'pass'").empty();
  for (const char* table : {"results", "choices"}) {
    query(path, std::string("UPDATE ") + table + " SET generator = '" + generator_version() + "'");
    for (const char* backend : {"cuda", "hip", "cpu"}) {
      const std::string prefix = std::string(backend) + "|";
      const std::string forward = "'" + generator_version_of(prefix, Pass::Forward) + "'";
      const std::string backward = "'" + generator_version_of(prefix, Pass::Backward) + "'";
      query(path,
            std::string("UPDATE ") + table + " SET generator = " +
                (has_pass ? "CASE WHEN pass = 'bwd' THEN " + backward + " ELSE " + forward + " END"
                          : forward) +
                " WHERE device LIKE '" + prefix + "%'");
    }
  }
}

class TuningStoreMigrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("flashjit-migration-test-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_TRUE(fs::is_regular_file(testing::tuning_db_v1_fixture()))
        << testing::tuning_db_v1_fixture();
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  // A fresh copy of the fixture (never open the committed file read-write).
  fs::path copy_fixture(const std::string& name = "v1.db") {
    const fs::path path = dir_ / name;
    fs::copy_file(testing::tuning_db_v1_fixture(), path);
    return path;
  }

  fs::path dir_;
};

TEST_F(TuningStoreMigrationTest, TheFixtureIsAVersion1DbWithRealContent) {
  const fs::path path = copy_fixture();
  EXPECT_EQ(schema_version_of(path), "1");
  // Version 1 has no pass column: the fixture really is the old schema.
  EXPECT_TRUE(
      query(path, "SELECT name FROM pragma_table_info('results') WHERE name = 'pass'").empty());
  const Contents before = contents_of(path);
  EXPECT_GE(before.results.size(), 40u);
  EXPECT_GE(before.choices.size(), 4u);
  EXPECT_GE(before.recorded.size(), 2u);
  ASSERT_EQ(before.devices.size(), 1u);
  ASSERT_EQ(testing::devices_of(path).size(), 1u);
  EXPECT_EQ(testing::devices_of(path)[0].backend, "cpu");
  EXPECT_EQ(query(path, "SELECT max(uses) FROM recorded_problems"), std::vector<std::string>{"2"});
}

TEST_F(TuningStoreMigrationTest, ReadWriteOpenMigratesEveryRowAsForward) {
  const fs::path path = copy_fixture();
  const Contents before = contents_of(path);
  const std::vector<FixtureChoice> fixture_choices = choices_in_v1(path);
  ASSERT_EQ(fixture_choices.size(), before.choices.size());

  Result<std::unique_ptr<TuningStore>> opened = TuningStore::open(path);
  ASSERT_TRUE(opened.ok()) << opened.error().describe();
  TuningStore& store = **opened;

  EXPECT_EQ(schema_version_of(path), "3");
  EXPECT_EQ(contents_of(path), before);  // no row lost, added or changed
  for (const char* table : {"results", "choices", "recorded_problems"}) {
    EXPECT_EQ(passes_in(path, table), std::vector<std::string>{"fwd 0"}) << table;
  }
  EXPECT_EQ(query(path, "PRAGMA integrity_check"), std::vector<std::string>{"ok"});
  EXPECT_EQ(query(path, "SELECT name FROM sqlite_master WHERE name LIKE '%_v1'"),
            std::vector<std::string>{});
  EXPECT_EQ(query(path, "SELECT count(*) FROM best_configs"),
            std::vector<std::string>{std::to_string(before.choices.size())});
  EXPECT_EQ(query(path, "SELECT count(*) FROM best_configs WHERE repetitions IS NULL"),
            std::vector<std::string>{"0"});  // every choice joins its results row

  // Through the store: every choice and result, as forward keys.
  Result<std::vector<TuningStore::Entry>> entries = store.entries();
  ASSERT_TRUE(entries.ok()) << entries.error().describe();
  ASSERT_EQ(entries->size(), before.choices.size());
  for (const TuningStore::Entry& entry : *entries) {
    EXPECT_EQ(entry.key.pass, Pass::Forward);
    EXPECT_FALSE(entry.key.deterministic);
    EXPECT_FALSE(entry.current);  // another generator version wrote them
  }
  EXPECT_EQ(store.result_entries()->size(), before.results.size());
  const std::vector<DeviceFingerprint> devices = testing::devices_of(path);
  ASSERT_EQ(devices.size(), 1u);
  const DeviceFingerprint& device = devices[0];
  Result<std::vector<AttentionProblem>> recorded = store.recorded_problems(device);
  ASSERT_TRUE(recorded.ok()) << recorded.error().describe();
  ASSERT_EQ(recorded->size(), before.recorded.size());
  for (const AttentionProblem& problem : *recorded) EXPECT_EQ(problem.pass, Pass::Forward);

  // choice() of a fixture key: hidden while its generator version is not this build's...
  const ProblemKey fixture_key = fixture_choices.front().key;
  EXPECT_FALSE(store.choice(device, fixture_key)->has_value());
  restamp_generator(path);
  // ...then the fixture's config, for every fixture key.
  for (const FixtureChoice& expected : fixture_choices) {
    Result<std::optional<TuneChoice>> found = store.choice(device, expected.key);
    ASSERT_TRUE(found.ok()) << found.error().describe();
    ASSERT_TRUE(found->has_value()) << expected.key.to_string();
    EXPECT_EQ((*found)->config.to_string(), expected.config) << expected.key.to_string();
    EXPECT_FALSE(store.results(device, expected.key)->empty());
  }

  // A backward row for the same key coexists with the forward one.
  ProblemKey backward_key = fixture_key;
  backward_key.pass = Pass::Backward;
  EXPECT_FALSE(store.choice(device, backward_key)->has_value());
  TuneResult result;
  result.config = AttentionConfig{16, 32, 1, 1};
  result.median_ms = 9.0;
  ASSERT_TRUE(store.record(device, backward_key, result).ok());
  TuneChoice choice;
  choice.config = AttentionConfig{16, 32, 1, 1};
  choice.median_ms = 9.0;
  ASSERT_TRUE(store.choose(device, backward_key, choice).ok());
  EXPECT_EQ(store.choice(device, backward_key)->value().config, choice.config);
  EXPECT_EQ(store.choice(device, fixture_key)->value().config.to_string(),
            fixture_choices.front().config);
  EXPECT_EQ(store.entries()->size(), before.choices.size() + 1);
  EXPECT_EQ(passes_in(path, "choices"), (std::vector<std::string>{"bwd 0", "fwd 0"}));

  // Reopening is a no-op: no DDL (SQLite's schema cookie stays), the same rows.
  const std::vector<std::string> cookie = query(path, "PRAGMA schema_version");
  const Contents migrated = contents_of(path);
  opened->reset();
  Result<std::unique_ptr<TuningStore>> again = TuningStore::open(path);
  ASSERT_TRUE(again.ok()) << again.error().describe();
  EXPECT_EQ(query(path, "PRAGMA schema_version"), cookie);
  EXPECT_EQ(contents_of(path), migrated);
  EXPECT_EQ(schema_version_of(path), "3");
  EXPECT_EQ((*again)->entries()->size(), before.choices.size() + 1);
}

// A file written before the generator versions were per backend carries the hash of every
// template (generator_version()) on its rows. Opened read-write by a build with the same
// templates, its rows are re-stamped with their backend's version and stay current; rows of
// other template versions stay stale. Set up from the previous release's fixture, re-stamped as
// that release would have written it with this build's templates.
TEST_F(TuningStoreMigrationTest, RowsOfTheAllTemplatesVersionAreReStampedPerBackend) {
  const fs::path path = copy_fixture();
  const std::vector<FixtureChoice> fixture_choices = choices_in_v1(path);
  ASSERT_GE(fixture_choices.size(), 2u);
  query(path, "UPDATE results SET generator = '" + generator_version() + "'");
  query(path, "UPDATE choices SET generator = '" + generator_version() + "'");
  // One choice of a third version: it must stay stale.
  query(path,
        "UPDATE choices SET generator = 'feedfacefeedface' WHERE rowid = (SELECT min(rowid) "
        "FROM choices)");
  const size_t results_before = contents_of(path).results.size();

  Result<std::unique_ptr<TuningStore>> opened = TuningStore::open(path);
  ASSERT_TRUE(opened.ok()) << opened.error().describe();
  TuningStore& store = **opened;
  const DeviceFingerprint device = testing::devices_of(path).at(0);
  const std::string version = generator_version_of(device.to_string(), Pass::Forward);
  ASSERT_NE(version, generator_version());
  EXPECT_EQ(query(path, "SELECT count(*) FROM results WHERE generator = '" + version + "'"),
            std::vector<std::string>{std::to_string(results_before)});
  Result<std::vector<TuningStore::Entry>> entries = store.entries();
  ASSERT_TRUE(entries.ok()) << entries.error().describe();
  ASSERT_EQ(entries->size(), fixture_choices.size());
  int current = 0;
  for (const TuningStore::Entry& entry : *entries) {
    current += entry.current;
    if (entry.current) {
      Result<std::optional<TuneChoice>> found = store.choice(device, entry.key);
      ASSERT_TRUE(found.ok() && found->has_value()) << entry.key.to_string();
    } else {
      EXPECT_EQ(entry.generator, "feedfacefeedface");
    }
  }
  EXPECT_EQ(current, static_cast<int>(fixture_choices.size()) - 1);

  // Idempotent: a second open changes nothing.
  const Contents after = contents_of(path);
  opened->reset();
  ASSERT_TRUE(TuningStore::open(path).ok());
  EXPECT_EQ(contents_of(path), after);
}

TEST_F(TuningStoreMigrationTest, ReadOnlyOpenServesTheForwardRowsWithoutMigrating) {
  const fs::path path = copy_fixture();
  restamp_generator(path);  // (still version 1: plain SQL on the old tables)
  const Contents before = contents_of(path);
  const std::vector<FixtureChoice> fixture_choices = choices_in_v1(path);
  const DeviceFingerprint device = testing::devices_of(path).at(0);

  Result<std::unique_ptr<TuningStore>> opened = TuningStore::open_read_only(path);
  ASSERT_TRUE(opened.ok()) << opened.error().describe();
  TuningStore& store = **opened;
  for (const FixtureChoice& expected : fixture_choices) {
    Result<std::optional<TuneChoice>> found = store.choice(device, expected.key);
    ASSERT_TRUE(found.ok()) << found.error().describe();
    ASSERT_TRUE(found->has_value()) << expected.key.to_string();
    EXPECT_EQ((*found)->config.to_string(), expected.config);
    // Forward rows only: the same shape as a backward key has nothing, exact or nearest.
    ProblemKey backward_key = expected.key;
    backward_key.pass = Pass::Backward;
    EXPECT_FALSE(store.choice(device, backward_key)->has_value());
    EXPECT_FALSE(store.nearest_choice(device, backward_key)->has_value());
    EXPECT_TRUE(store.results(device, backward_key)->empty());
  }
  // The nearest bucket of a fixture key's shape, one bucket up.
  ProblemKey near = fixture_choices.front().key;
  near.seqlen_q_bucket *= 2;
  Result<std::optional<std::pair<ProblemKey, TuneChoice>>> nearest =
      store.nearest_choice(device, near);
  ASSERT_TRUE(nearest.ok()) << nearest.error().describe();
  ASSERT_TRUE(nearest->has_value());
  EXPECT_EQ((*nearest)->first.pass, Pass::Forward);

  Result<std::vector<TuningStore::Entry>> entries = store.entries();
  ASSERT_TRUE(entries.ok()) << entries.error().describe();
  EXPECT_EQ(entries->size(), before.choices.size());
  for (const TuningStore::Entry& entry : *entries) EXPECT_EQ(entry.key.pass, Pass::Forward);
  EXPECT_EQ(store.result_entries()->size(), before.results.size());
  EXPECT_EQ(store.result_entries(fixture_choices.front().key)->empty(), false);
  Result<std::vector<AttentionProblem>> recorded = store.recorded_problems(device);
  ASSERT_TRUE(recorded.ok()) << recorded.error().describe();
  EXPECT_EQ(recorded->size(), before.recorded.size());

  // Writes fail cleanly; the file is untouched (still version 1).
  EXPECT_FALSE(store.choose(device, fixture_choices.front().key, TuneChoice{}).ok());
  EXPECT_EQ(schema_version_of(path), "1");
  EXPECT_EQ(contents_of(path), before);
  EXPECT_TRUE(
      query(path, "SELECT name FROM pragma_table_info('choices') WHERE name = 'pass'").empty());

  // Another process migrates the file while this store is open: it keeps reading right (the
  // version-2 pass column wins over the view's literal), backward rows included.
  Result<std::unique_ptr<TuningStore>> writer = TuningStore::open(path);
  ASSERT_TRUE(writer.ok()) << writer.error().describe();
  EXPECT_EQ(schema_version_of(path), "3");
  ProblemKey backward_key = fixture_choices.front().key;
  backward_key.pass = Pass::Backward;
  TuneChoice backward_choice;
  backward_choice.config = AttentionConfig{16, 32, 1, 1};
  ASSERT_TRUE((*writer)->choose(device, backward_key, backward_choice).ok());
  EXPECT_EQ(store.choice(device, fixture_choices.front().key)->value().config.to_string(),
            fixture_choices.front().config);
  ASSERT_TRUE(store.choice(device, backward_key)->has_value());
  EXPECT_EQ(store.choice(device, backward_key)->value().config, backward_choice.config);
  EXPECT_EQ(store.entries()->size(), before.choices.size() + 1);
}

TEST_F(TuningStoreMigrationTest, MergeFromTheFixtureBringsForwardRows) {
  const fs::path fixture = copy_fixture();
  const Contents before = contents_of(fixture);
  const std::vector<FixtureChoice> fixture_choices = choices_in_v1(fixture);
  const DeviceFingerprint device = testing::devices_of(fixture).at(0);
  const fs::path target = dir_ / "target.db";

  // The target already has a backward choice for a fixture key (same generator version).
  ProblemKey backward_key = fixture_choices.front().key;
  backward_key.pass = Pass::Backward;
  backward_key.deterministic = true;
  TuneChoice backward_choice;
  backward_choice.config = AttentionConfig{16, 32, 1, 1};
  backward_choice.config.dq = DqMode::Separate;
  {
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(target);
    ASSERT_TRUE(store.ok()) << store.error().describe();
    ASSERT_TRUE((*store)->choose(device, backward_key, backward_choice).ok());
  }
  query(target, "UPDATE choices SET generator = '" +
                    query(fixture, "SELECT generator FROM choices LIMIT 1").at(0) + "'");

  Result<std::unique_ptr<TuningStore>> store = TuningStore::open(target);
  ASSERT_TRUE(store.ok()) << store.error().describe();
  for (int round = 0; round < 2; ++round) {  // merging twice changes nothing
    Status merged = (*store)->merge_from(fixture);
    ASSERT_TRUE(merged.ok()) << merged.error().describe();
    EXPECT_EQ(query(target, "SELECT count(*) FROM choices WHERE pass = 'fwd'"),
              std::vector<std::string>{std::to_string(before.choices.size())});
    EXPECT_EQ(query(target, "SELECT count(*) FROM results WHERE pass = 'fwd'"),
              std::vector<std::string>{std::to_string(before.results.size())});
    EXPECT_EQ(passes_in(target, "recorded_problems"), std::vector<std::string>{"fwd 0"});
    EXPECT_EQ(passes_in(target, "choices"), (std::vector<std::string>{"bwd 1", "fwd 0"}));
    EXPECT_EQ((*store)->entries()->size(), before.choices.size() + 1);
    Result<std::vector<AttentionProblem>> recorded = (*store)->recorded_problems(device);
    ASSERT_TRUE(recorded.ok());
    EXPECT_EQ(recorded->size(), before.recorded.size());
  }
  // Every fixture row came in unchanged (the dumps read the version-1 columns).
  const Contents merged = contents_of(target);
  EXPECT_EQ(merged.results, before.results);
  EXPECT_EQ(merged.recorded, before.recorded);
  EXPECT_EQ(merged.devices, before.devices);
  EXPECT_EQ(merged.choices.size(), before.choices.size() + 1);
  // The merge only read the fixture: still version 1, unchanged.
  EXPECT_EQ(schema_version_of(fixture), "1");
  EXPECT_EQ(contents_of(fixture), before);
  // The backward choice and the fixture's forward one, side by side.
  restamp_generator(target);
  EXPECT_EQ((*store)->choice(device, backward_key)->value().config, backward_choice.config);
  EXPECT_EQ((*store)->choice(device, fixture_choices.front().key)->value().config.to_string(),
            fixture_choices.front().config);
}

TEST_F(TuningStoreMigrationTest, ConcurrentOpenersMigrateOnceAndLoseNoRow) {
  constexpr int kRounds = 3;
  constexpr int kOpeners = 6;
  for (int round = 0; round < kRounds; ++round) {
    const fs::path path = copy_fixture("round" + std::to_string(round) + ".db");
    // As a user DB is: in WAL mode (the committed fixture is a `db export`, journal_mode=DELETE).
    // Round 0 keeps the fixture's mode, so that the openers also race to switch it to WAL.
    if (round > 0) {
      EXPECT_EQ(query(path, "PRAGMA journal_mode=WAL"), std::vector<std::string>{"wal"});
    }
    const Contents before = contents_of(path);
    const DeviceFingerprint device = testing::devices_of(path).at(0);
    const ProblemKey fixture_key = choices_in_v1(path).at(0).key;

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
        // Every opener sees every fixture choice, then adds a backward row of its own.
        Result<std::vector<TuningStore::Entry>> entries = (*store)->entries();
        if (!entries.ok() || entries->size() < before.choices.size()) _exit(4);
        ProblemKey key = fixture_key;
        key.pass = Pass::Backward;
        key.batch_heads_bucket = int64_t{1} << (opener + 10);  // distinct per opener
        TuneResult result;
        result.config = AttentionConfig{16, 32, 1, 1};
        result.median_ms = 1.0 + opener;
        if (!(*store)->record(device, key, result).ok()) _exit(5);
        TuneChoice choice;
        choice.config = result.config;
        if (!(*store)->choose(device, key, choice).ok()) _exit(6);
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
    // The fixture's rows exactly once (the primary keys forbid duplicates, and the counts show
    // none was lost), plus one backward result and choice per opener.
    const std::string count = "SELECT count(*) FROM ";
    EXPECT_EQ(query(path, count + "results WHERE pass = 'fwd'"),
              std::vector<std::string>{std::to_string(before.results.size())});
    EXPECT_EQ(query(path, count + "results WHERE pass = 'bwd'"),
              std::vector<std::string>{std::to_string(kOpeners)});
    EXPECT_EQ(query(path, count + "choices WHERE pass = 'fwd'"),
              std::vector<std::string>{std::to_string(before.choices.size())});
    EXPECT_EQ(query(path, count + "choices WHERE pass = 'bwd'"),
              std::vector<std::string>{std::to_string(kOpeners)});
    const Contents after = contents_of(path);
    EXPECT_EQ(after.choices.size(), before.choices.size() + kOpeners);
    EXPECT_EQ(after.recorded, before.recorded);
    EXPECT_EQ(after.devices, before.devices);
    // The fixture's rows, unchanged, are the forward ones.
    EXPECT_EQ(dump(path, kResultsRow, "results", "pass = 'fwd'"), before.results);
    EXPECT_EQ(dump(path, kChoicesRow, "choices", "pass = 'fwd'"), before.choices);
  }
}

TEST_F(TuningStoreMigrationTest, AFailedMigrationLeavesTheVersion1FileIntact) {
  const fs::path path = copy_fixture();
  // An object in the way of the migration (the name it renames an old table to).
  query(path, "CREATE TABLE choices_v1 (x)");
  const Contents before = contents_of(path);
  Result<std::unique_ptr<TuningStore>> failed = TuningStore::open(path);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code, ErrorCode::IoError);
  EXPECT_NE(failed.error().message.find("migrating schema version 1 to 3"), std::string::npos)
      << failed.error().message;
  EXPECT_NE(failed.error().message.find(path.string()), std::string::npos);
  // Rolled back as a whole: version 1, every table and row as before.
  EXPECT_EQ(schema_version_of(path), "1");
  EXPECT_EQ(contents_of(path), before);
  EXPECT_TRUE(
      query(path, "SELECT name FROM pragma_table_info('results') WHERE name = 'pass'").empty());
  EXPECT_EQ(query(path, "SELECT count(*) FROM sqlite_master WHERE name = 'best_configs'"),
            std::vector<std::string>{"1"});
  // Out of the way, the next open migrates.
  query(path, "DROP TABLE choices_v1");
  Result<std::unique_ptr<TuningStore>> opened = TuningStore::open(path);
  ASSERT_TRUE(opened.ok()) << opened.error().describe();
  EXPECT_EQ(schema_version_of(path), "3");
  EXPECT_EQ(contents_of(path), before);
}

TEST_F(TuningStoreMigrationTest, ANewerVersionStaysAnErrorAndIsNotTouched) {
  const fs::path path = copy_fixture();
  query(path, "UPDATE meta SET value = '4' WHERE key = 'schema_version'");
  const Contents before = contents_of(path);
  const std::vector<std::string> cookie = query(path, "PRAGMA schema_version");

  Result<std::unique_ptr<TuningStore>> read_write = TuningStore::open(path);
  ASSERT_FALSE(read_write.ok());
  EXPECT_EQ(read_write.error().code, ErrorCode::Unsupported);
  EXPECT_NE(read_write.error().message.find("'4'"), std::string::npos)
      << read_write.error().message;
  EXPECT_NE(read_write.error().message.find("1 to 3"), std::string::npos)
      << read_write.error().message;
  Result<std::unique_ptr<TuningStore>> read_only = TuningStore::open_read_only(path);
  ASSERT_FALSE(read_only.ok());
  EXPECT_EQ(read_only.error().code, ErrorCode::Unsupported);

  Result<std::unique_ptr<TuningStore>> target = TuningStore::open(dir_ / "target.db");
  ASSERT_TRUE(target.ok()) << target.error().describe();
  Status merged = (*target)->merge_from(path);
  ASSERT_FALSE(merged.ok());
  EXPECT_EQ(merged.error().code, ErrorCode::Unsupported);
  EXPECT_NE(merged.error().message.find(path.string()), std::string::npos);
  EXPECT_TRUE((*target)->entries()->empty());

  EXPECT_EQ(schema_version_of(path), "4");
  EXPECT_EQ(query(path, "PRAGMA schema_version"), cookie);
  EXPECT_EQ(contents_of(path), before);
}

}  // namespace
}  // namespace flashjit
