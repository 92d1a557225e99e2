// `flashjit db`: argument errors (exit 2, one line), failures (exit 1), an
// ls / show / export / import / merge / clear round trip on temporary DBs, the pass in the
// listings, and a DB of the previous release (schema version 1). No GPU needed.
#include "cli/db_command.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "runtime/tuning_store.hpp"
#include "support/tuning_db.hpp"

namespace flashjit::cli {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  int status = 0;
  std::string out;
  std::string err;
};

Outcome run(std::vector<std::string> args) {
  std::ostringstream out;
  std::ostringstream err;
  Outcome result;
  result.status = run_db_command(args, out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

DeviceFingerprint device() {
  DeviceFingerprint device;
  device.backend = "cuda";
  device.name = "Test GPU";
  device.arch = 90;
  device.sm_count = 132;
  device.smem_per_block_optin = 232448;
  device.l2_bytes = 52428800;
  device.driver_version = 13000;
  device.compiler = "nvrtc 13.0";
  return device;
}

// The key of `flashjit db show --seqlen N` (batch 2, heads 16, d128, bf16).
ProblemKey key_of_seqlen(int64_t seqlen) {
  return ProblemKey::of(AttentionProblem::make(2, 16, 16, seqlen, seqlen, 128, DType::BF16, false));
}

class DbCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("flashjit-db-command-test-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  // A DB with a choice (and two results) for the key of `seqlen`.
  void make_db(const fs::path& path, int64_t seqlen, const AttentionConfig& config) {
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(path);
    ASSERT_TRUE(store.ok()) << store.error().describe();
    TuneResult fast;
    fast.config = config;
    fast.median_ms = 1.0;
    fast.repetitions = 10;
    TuneResult slow;
    slow.config = AttentionConfig{128, 64, 8, 2};
    slow.median_ms = 1.5;
    slow.is_default = true;
    ASSERT_TRUE((*store)->record(device(), key_of_seqlen(seqlen), fast).ok());
    ASSERT_TRUE((*store)->record(device(), key_of_seqlen(seqlen), slow).ok());
    TuneChoice choice;
    choice.config = config;
    choice.median_ms = 1.0;
    choice.default_ms = 1.5;
    ASSERT_TRUE((*store)->choose(device(), key_of_seqlen(seqlen), choice).ok());
  }

  fs::path dir_;
};

TEST_F(DbCommandTest, UsageErrorsAreOneLineWithExitStatus2) {
  const std::string db = (dir_ / "x.db").string();
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"bogus"},
      {"ls", "extra"},
      {"ls", "--nope"},
      {"ls", "--db"},
      {"ls", "--all=yes"},
      {"export"},
      {"export", "a.db", "b.db"},
      {"import"},
      {"merge", "out.db"},
      {"clear", "--db", db, "--stale", "--stale"},
      {"show", "--db", db, "--head-dim", "100"},
      {"show", "--db", db, "--dtype", "fp8"},
  };
  for (const std::vector<std::string>& args : bad) {
    std::string joined;
    for (const std::string& arg : args) joined += arg + " ";
    Outcome result = run(args);
    EXPECT_EQ(result.status, 2) << joined << "-> " << result.err;
    EXPECT_TRUE(result.out.empty()) << joined;
    ASSERT_FALSE(result.err.empty()) << joined;
    EXPECT_EQ(result.err.find('\n'), result.err.size() - 1) << joined << "-> " << result.err;
    EXPECT_EQ(result.err.rfind("flashjit db", 0), 0u) << result.err;
  }
  EXPECT_NE(run({"ls", "--nope"}).err.find("--nope"), std::string::npos);
  EXPECT_NE(run({"bogus"}).err.find("'bogus'"), std::string::npos);
  EXPECT_NE(run({"show", "--db", db, "--head-dim", "100"}).err.find("--head-dim"),
            std::string::npos);
}

TEST_F(DbCommandTest, HelpTexts) {
  Outcome help = run({"--help"});
  EXPECT_EQ(help.status, 0);
  for (const char* sub : {"ls", "show", "export", "import", "merge", "clear"}) {
    EXPECT_NE(help.out.find(sub), std::string::npos) << sub;
    Outcome sub_help = run({sub, "--help"});
    EXPECT_EQ(sub_help.status, 0) << sub;
    EXPECT_NE(sub_help.out.find(std::string("usage: flashjit db ") + sub), std::string::npos);
  }
  EXPECT_NE(run({"show", "-h"}).out.find("--head-dim"), std::string::npos);
}

TEST_F(DbCommandTest, MissingOrCorruptDbIsAFailureWithExitStatus1) {
  const std::string missing = (dir_ / "missing.db").string();
  Outcome ls = run({"ls", "--db", missing});
  EXPECT_EQ(ls.status, 1);
  EXPECT_NE(ls.err.find(missing), std::string::npos) << ls.err;
  EXPECT_FALSE(fs::exists(missing));  // ls does not create a DB
  EXPECT_EQ(run({"clear", "--db", missing}).status, 1);
  EXPECT_EQ(run({"export", "--db", missing, (dir_ / "out.db").string()}).status, 1);

  const fs::path junk = dir_ / "junk.db";
  { std::ofstream(junk) << std::string(4096, 'j'); }
  EXPECT_EQ(run({"ls", "--db", junk.string()}).status, 1);
  EXPECT_EQ(run({"import", "--db", (dir_ / "user.db").string(), junk.string()}).status, 1);
}

TEST_F(DbCommandTest, LsShowExportImportMergeClearRoundTrip) {
  const fs::path a = dir_ / "a.db";
  const fs::path b = dir_ / "b.db";
  make_db(a, 1024, AttentionConfig{64, 64, 4, 2});
  make_db(b, 4096, AttentionConfig{128, 128, 8, 2});

  const fs::path merged = dir_ / "sub" / "merged.db";
  Outcome merge = run({"merge", merged.string(), a.string(), b.string()});
  ASSERT_EQ(merge.status, 0) << merge.err;
  EXPECT_NE(merge.out.find("2 choices"), std::string::npos) << merge.out;

  // --all: on a machine with a GPU, ls and show default to that GPU's rows.
  Outcome ls = run({"ls", "--db", merged.string(), "--all"});
  ASSERT_EQ(ls.status, 0) << ls.err;
  EXPECT_NE(ls.out.find(key_of_seqlen(1024).to_string()), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find(key_of_seqlen(4096).to_string()), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("m64n64w4s2"), std::string::npos);
  EXPECT_NE(ls.out.find("1.50x"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find(device().to_string()), std::string::npos);

  Outcome show = run({"show", "--db", merged.string(), "--seqlen", "1000", "--all"});
  ASSERT_EQ(show.status, 0) << show.err;
  EXPECT_NE(show.out.find("* m64n64w4s2"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("m128n64w8s2"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("default"), std::string::npos) << show.out;
  EXPECT_LT(show.out.find("m64n64w4s2"), show.out.find("m128n64w8s2"));  // fastest first
  Outcome none = run({"show", "--db", merged.string(), "--seqlen", "64"});
  ASSERT_EQ(none.status, 0);
  EXPECT_NE(none.out.find("no results"), std::string::npos);

  const fs::path exported = dir_ / "export.db";
  Outcome exp = run({"export", "--db", merged.string(), exported.string()});
  ASSERT_EQ(exp.status, 0) << exp.err;
  EXPECT_TRUE(fs::exists(exported));
  EXPECT_EQ(run({"export", "--db", merged.string(), exported.string()}).status, 2);  // exists

  const fs::path user = dir_ / "user.db";
  Outcome import = run({"import", "--db", user.string(), exported.string()});
  ASSERT_EQ(import.status, 0) << import.err;
  Outcome user_ls = run({"ls", "--db", user.string(), "--all"});
  ASSERT_EQ(user_ls.status, 0);
  EXPECT_NE(user_ls.out.find(key_of_seqlen(1024).to_string()), std::string::npos);
  EXPECT_NE(user_ls.out.find(key_of_seqlen(4096).to_string()), std::string::npos);

  // Nothing is stale: --stale deletes nothing; a plain clear deletes all.
  Outcome stale = run({"clear", "--db", user.string(), "--stale"});
  ASSERT_EQ(stale.status, 0) << stale.err;
  EXPECT_NE(stale.out.find("0 choices deleted, 2 left"), std::string::npos) << stale.out;
  Outcome clear = run({"clear", "--db", user.string()});
  ASSERT_EQ(clear.status, 0) << clear.err;
  EXPECT_NE(clear.out.find("2 choices deleted, 0 left"), std::string::npos) << clear.out;
  Outcome empty = run({"ls", "--db", user.string(), "--all"});
  ASSERT_EQ(empty.status, 0);
  EXPECT_NE(empty.out.find("0 of 0 choices"), std::string::npos) << empty.out;
}

std::string file_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The text form (export FILE.sql, what data/tuning/ keeps of the shipped DBs): one INSERT a row,
// read back by merge and import into the same rows, and nothing else is accepted.
TEST_F(DbCommandTest, TextFormRoundTripsEveryRowAndAcceptsNothingElse) {
  const fs::path a = dir_ / "a.db";
  make_db(a, 1024, AttentionConfig{64, 64, 4, 2});
  make_db(a, 4096, AttentionConfig{128, 128, 8, 2});
  {
    // A failure row whose message has a newline and a quote, as compile logs do.
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(a);
    ASSERT_TRUE(store.ok());
    TuneResult failed;
    failed.config = AttentionConfig{128, 128, 4, 3};
    failed.status = TuneStatus::CompileFailed;
    failed.message = "ptxas: line 1\nit's too big";
    ASSERT_TRUE((*store)->record(device(), key_of_seqlen(1024), failed).ok());
  }
  const fs::path text = dir_ / "a.sql";
  Outcome exported = run({"export", "--db", a.string(), text.string()});
  ASSERT_EQ(exported.status, 0) << exported.err;
  const std::string written = file_text(text);
  EXPECT_EQ(written.rfind("-- flashjit tuning DB, text form; schema_version 3\n", 0), 0u);
  size_t results = 0, choices = 0, devices = 0;
  std::istringstream lines(written);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("--", 0) == 0) continue;
    results += line.rfind("INSERT INTO results (", 0) == 0;
    choices += line.rfind("INSERT INTO choices (", 0) == 0;
    devices += line.rfind("INSERT INTO devices (", 0) == 0;
    EXPECT_EQ(line.substr(line.size() - 2), ");") << line;
  }
  EXPECT_EQ(results, 5u);  // two keys x (fast, slow) + the failure: one line each
  EXPECT_EQ(choices, 2u);
  EXPECT_EQ(devices, 1u);

  // Read back (merge, import), written again: the same text, so the same rows and values.
  const fs::path b = dir_ / "b.db";
  Outcome merged = run({"merge", b.string(), text.string()});
  ASSERT_EQ(merged.status, 0) << merged.err;
  EXPECT_NE(merged.out.find("2 choices"), std::string::npos) << merged.out;
  const fs::path again = dir_ / "again.sql";
  ASSERT_EQ(run({"export", "--db", b.string(), again.string()}).status, 0);
  EXPECT_EQ(file_text(again), written);
  EXPECT_EQ(flashjit::testing::query(b, "SELECT message FROM results WHERE status != 'timed'"),
            std::vector<std::string>{"ptxas: line 1\nit's too big"});
  const fs::path user = dir_ / "user.db";
  ASSERT_EQ(run({"import", "--db", user.string(), text.string()}).status, 0);
  EXPECT_EQ(flashjit::testing::query(user, "SELECT count(*) FROM results"),
            std::vector<std::string>{"5"});

  // Anything but the header, comments and one INSERT into devices/results/choices per line is
  // an error naming the file and line; another schema version is Unsupported.
  const std::string insert = written.substr(written.find("INSERT INTO choices ("));
  const std::string first_choice = insert.substr(0, insert.find('\n'));
  const std::string header = "-- flashjit tuning DB, text form; schema_version 2\n";
  const struct {
    std::string text;
    int status;
    const char* says;
  } bad[] = {
      {"INSERT INTO choices VALUES (1);\n", 2, ":1: not a text tuning DB"},
      {"-- flashjit tuning DB, text form; schema_version 4\n", 1, "schema_version 4"},
      {"-- flashjit tuning DB, text form; schema_version 1\n", 1, "versions 2 to 3"},
      {header + "DELETE FROM choices;\n", 2, ":2: expected a comment or one 'INSERT INTO"},
      {header + "-- fine\nINSERT INTO recorded_problems (device) VALUES ('x');\n", 2, ":3:"},
      {header + first_choice + " DELETE FROM devices WHERE (1);\n", 2,
       ":2: more than one statement"},
      {header + "INSERT INTO choices (device) VALUES ('x');\n", 2, ":2: NOT NULL"},
  };
  for (const auto& example : bad) {
    const fs::path file = dir_ / "bad.sql";
    std::ofstream(file) << example.text;
    Outcome result = run({"merge", (dir_ / "out.db").string(), file.string()});
    EXPECT_EQ(result.status, example.status) << example.text << result.err;
    EXPECT_NE(result.err.find(example.says), std::string::npos) << example.text << result.err;
    EXPECT_EQ(result.err.find('\n'), result.err.size() - 1) << result.err;
  }
  EXPECT_EQ(flashjit::testing::query(dir_ / "out.db", "SELECT count(*) FROM choices"),
            std::vector<std::string>{"0"});
  Outcome missing = run({"merge", (dir_ / "out.db").string(), (dir_ / "missing.sql").string()});
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("no such file"), std::string::npos) << missing.err;
}

// Files made to keep a reader busy forever (found while fuzzing the import path,
// tests/fuzz/tuning_db.cpp): an INSERT of the text form that selects from a recursive query
// without end, and a DB whose results table is a view over one. Each is an error within a
// bounded time; the DB merged into keeps its rows.
TEST_F(DbCommandTest, FilesThatWouldNeverFinishAreErrors) {
  const fs::path out = dir_ / "out.db";
  make_db(out, 1024, AttentionConfig{64, 64, 4, 2});
  const auto rows = [&] { return flashjit::testing::query(out, "SELECT count(*) FROM results"); };
  const std::vector<std::string> before = rows();

  const fs::path text = dir_ / "forever.sql";
  std::ofstream(text)
      << "-- flashjit tuning DB, text form; schema_version 2\n"
      << "INSERT INTO devices (device, backend, name, arch, sm_count, smem_per_block_optin, "
         "l2_bytes, driver_version, compiler) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT "
         "x + 1 FROM c) SELECT 'd' || x, 'cuda', 'n', 90, 1, 1, 1, 1, 'c' FROM c WHERE (x < 0);\n";
  Outcome endless = run({"merge", out.string(), text.string()});
  EXPECT_EQ(endless.status, 2) << endless.err;
  EXPECT_NE(endless.err.find(":2: the statement ran past"), std::string::npos) << endless.err;

  const fs::path view = dir_ / "view.db";
  make_db(view, 4096, AttentionConfig{128, 64, 4, 2});
  flashjit::testing::query(view, "ALTER TABLE results RENAME TO results_real");
  flashjit::testing::query(view,
                           "CREATE VIEW results AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
                           "SELECT x + 1 FROM c) SELECT * FROM results_real WHERE (SELECT "
                           "count(*) FROM c) > 0");
  Outcome merged = run({"merge", out.string(), view.string()});
  EXPECT_EQ(merged.status, 1) << merged.err;
  EXPECT_NE(merged.err.find("'view results' is not a table"), std::string::npos) << merged.err;
  Outcome listed = run({"ls", "--db", view.string()});
  EXPECT_EQ(listed.status, 1) << listed.err;
  EXPECT_NE(listed.err.find("'view results' is not a table"), std::string::npos) << listed.err;
  EXPECT_EQ(rows(), before);
}

// A file with a trigger (which would run its author's statements on the writes it watches) is
// refused by every path that opens it: merged from, listed, opened as the user DB to write.
TEST_F(DbCommandTest, FilesWithTriggersAreRefused) {
  const fs::path out = dir_ / "out.db";
  make_db(out, 1024, AttentionConfig{64, 64, 4, 2});
  const auto rows = [&] { return flashjit::testing::query(out, "SELECT count(*) FROM results"); };
  const std::vector<std::string> before = rows();
  const fs::path triggered = dir_ / "triggered.db";
  make_db(triggered, 4096, AttentionConfig{128, 64, 4, 2});
  flashjit::testing::query(triggered,
                           "CREATE TRIGGER wipe AFTER INSERT ON choices BEGIN DELETE FROM "
                           "results; END");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"merge", out.string(), triggered.string()},
        std::vector<std::string>{"ls", "--db", triggered.string()}}) {
    Outcome outcome = run(args);
    EXPECT_NE(outcome.status, 0) << args[0];
    EXPECT_NE(outcome.err.find("trigger 'wipe'"), std::string::npos) << outcome.err;
  }
  Result<std::unique_ptr<TuningStore>> opened = TuningStore::open(triggered);
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.error().message.find("trigger 'wipe'"), std::string::npos)
      << opened.error().message;
  EXPECT_EQ(rows(), before);
}

TEST_F(DbCommandTest, ListingsNameThePass) {
  const fs::path path = dir_ / "passes.db";
  make_db(path, 1024, AttentionConfig{64, 64, 4, 2});  // forward
  {
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(path);
    ASSERT_TRUE(store.ok()) << store.error().describe();
    ProblemKey backward = key_of_seqlen(1024);
    backward.pass = Pass::Backward;
    ProblemKey deterministic = backward;
    deterministic.deterministic = true;
    TuneResult result;
    result.config = AttentionConfig{32, 128, 8, 2};
    result.median_ms = 3.0;
    ASSERT_TRUE((*store)->record(device(), backward, result).ok());
    TuneChoice choice;
    choice.config = result.config;
    choice.median_ms = 3.0;
    ASSERT_TRUE((*store)->choose(device(), backward, choice).ok());
    choice.config.dq = DqMode::Separate;
    ASSERT_TRUE((*store)->choose(device(), deterministic, choice).ok());
  }
  Outcome ls = run({"ls", "--db", path.string(), "--all"});
  ASSERT_EQ(ls.status, 0) << ls.err;
  EXPECT_NE(ls.out.find("3 of 3 choices (1 fwd, 1 bwd, 1 bwd-det)"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("fwd d128 bf16 noncausal g1 q1024 k1024 bh32"), std::string::npos)
      << ls.out;
  EXPECT_NE(ls.out.find("  bwd d128 bf16 noncausal g1 q1024 k1024 bh32"), std::string::npos)
      << ls.out;
  EXPECT_NE(ls.out.find("bwd-det d128 bf16 noncausal g1 q1024 k1024 bh32"), std::string::npos)
      << ls.out;
  EXPECT_NE(ls.out.find("m32n128w8s2-det"), std::string::npos) << ls.out;

  // show: the forward key (the problem flags' pass) and only its rows.
  Outcome show = run({"show", "--db", path.string(), "--seqlen", "1000", "--all"});
  ASSERT_EQ(show.status, 0) << show.err;
  EXPECT_NE(show.out.find("key fwd d128 bf16 noncausal g1 q1024 k1024 bh32"), std::string::npos)
      << show.out;
  EXPECT_NE(show.out.find("* m64n64w4s2"), std::string::npos) << show.out;
  EXPECT_EQ(show.out.find("m32n128w8s2"), std::string::npos) << show.out;  // a backward row

  Outcome exported = run({"export", "--db", path.string(), (dir_ / "out.db").string()});
  ASSERT_EQ(exported.status, 0) << exported.err;
  EXPECT_NE(exported.out.find(": 3 choices (1 fwd, 1 bwd, 1 bwd-det)"), std::string::npos)
      << exported.out;
}

TEST_F(DbCommandTest, ADbOfThePreviousReleaseIsListedMergedAndImported) {
  const fs::path v1 = dir_ / "v1.db";
  fs::copy_file(testing::tuning_db_v1_fixture(), v1);
  const size_t choices = std::stoul(testing::query(v1, "SELECT count(*) FROM choices").at(0));
  ASSERT_GT(choices, 0u);
  const std::string summary =
      std::to_string(choices) + " choices (" + std::to_string(choices) + " fwd)";

  // ls opens it read-only: listed as forward keys, left at version 1.
  Outcome ls = run({"ls", "--db", v1.string(), "--all"});
  ASSERT_EQ(ls.status, 0) << ls.err;
  EXPECT_NE(ls.out.find(std::to_string(choices) + " of " + summary), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("  fwd d64 bf16 causal g2 q256 k256 bh4"), std::string::npos) << ls.out;
  EXPECT_EQ(testing::query(v1, "SELECT value FROM meta WHERE key = 'schema_version'"),
            std::vector<std::string>{"1"});

  const fs::path merged = dir_ / "merged.db";
  make_db(merged, 1024, AttentionConfig{64, 64, 4, 2});
  Outcome merge = run({"merge", merged.string(), v1.string()});
  ASSERT_EQ(merge.status, 0) << merge.err;
  const std::string merged_summary =
      std::to_string(choices + 1) + " choices (" + std::to_string(choices + 1) + " fwd)";
  EXPECT_NE(merge.out.find(merged_summary), std::string::npos) << merge.out;
  EXPECT_EQ(testing::query(merged, "SELECT DISTINCT pass || ' ' || deterministic FROM choices"),
            std::vector<std::string>{"fwd 0"});
  EXPECT_EQ(testing::query(merged, "SELECT value FROM meta WHERE key = 'schema_version'"),
            std::vector<std::string>{"3"});

  const fs::path user = dir_ / "user.db";
  Outcome import = run({"import", "--db", user.string(), v1.string()});
  ASSERT_EQ(import.status, 0) << import.err;
  EXPECT_NE(import.out.find(summary), std::string::npos) << import.out;
  EXPECT_EQ(testing::query(v1, "SELECT value FROM meta WHERE key = 'schema_version'"),
            std::vector<std::string>{"1"});  // only read
}

TEST_F(DbCommandTest, DefaultDbComesFromTheEnvironment) {
  const fs::path a = dir_ / "env.db";
  make_db(a, 1024, AttentionConfig{64, 64, 4, 2});
  const char* saved = getenv("FLASHJIT_DB");
  const std::string saved_value = saved ? saved : "";
  setenv("FLASHJIT_DB", a.c_str(), 1);
  Outcome ls = run({"ls", "--all"});
  setenv("FLASHJIT_DB", "none", 1);
  Outcome disabled = run({"ls"});
  if (saved) {
    setenv("FLASHJIT_DB", saved_value.c_str(), 1);
  } else {
    unsetenv("FLASHJIT_DB");
  }
  ASSERT_EQ(ls.status, 0) << ls.err;
  EXPECT_NE(ls.out.find(a.string()), std::string::npos);
  EXPECT_EQ(disabled.status, 2);
  EXPECT_NE(disabled.err.find("--db"), std::string::npos) << disabled.err;
}

}  // namespace
}  // namespace flashjit::cli
