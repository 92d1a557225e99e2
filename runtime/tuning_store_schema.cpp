// The tuning store's schema and its migration: see runtime/tuning_store_schema.hpp. Keep
// docs/TUNING_DB.md in step (and bump kSchemaVersion, with a migration, on any incompatible
// change).
#include "runtime/tuning_store_schema.hpp"

#include <iterator>
#include <optional>
#include <string_view>
#include <vector>

namespace flashjit::tuning_db {
namespace {

// The problem's columns every keyed table starts with (after the device): the pass and flag, then
// what a kernel is compiled for; and the K/V layout and variant columns (version 3).
constexpr const char* kProblemColumnsSql = R"sql(
  pass               TEXT NOT NULL CHECK (pass IN ('fwd', 'bwd')),
  deterministic      INTEGER NOT NULL CHECK (deterministic = 0 OR (deterministic = 1 AND
                                                                    pass = 'bwd')),
  head_dim           INTEGER NOT NULL,
  dtype              TEXT NOT NULL,
  causal             INTEGER NOT NULL,)sql";
constexpr const char* kLayoutColumnsSql = R"sql(
  page_size          INTEGER NOT NULL DEFAULT 0,
  seqlens_k          INTEGER NOT NULL DEFAULT 0,
  variant            TEXT NOT NULL DEFAULT '',)sql";

// The key columns of results and choices, in their order: a device and generator's problem
// bucket (then the config: part of results' key, the value of choices). key_match and kKeyWhere
// name the same columns; the primary keys below are their prefix.
const std::string& key_columns_sql() {
  static const std::string sql = std::string(R"sql(
  device             TEXT NOT NULL,
  generator          TEXT NOT NULL,)sql") +
                                 kProblemColumnsSql + R"sql(
  group_size         INTEGER NOT NULL,
  seqlen_q_bucket    INTEGER NOT NULL,
  seqlen_k_bucket    INTEGER NOT NULL,
  batch_heads_bucket INTEGER NOT NULL,)sql" +
                                 kLayoutColumnsSql + R"sql(
  config             TEXT NOT NULL,)sql";
  return sql;
}
constexpr const char* kKeyPrimarySql = R"sql(
  PRIMARY KEY (device, generator, pass, deterministic, head_dim, dtype, causal, group_size,
               page_size, seqlens_k, variant, seqlen_q_bucket, seqlen_k_bucket,
               batch_heads_bucket)sql";

// Version 3. Idempotent: every statement is IF NOT EXISTS. docs/TUNING_DB.md describes each
// column. The pass and the deterministic flag lead the problem part of every key and the three
// buckets end it, so that the exact lookups and the nearest-bucket scan (same pass, flag,
// head_dim, dtype, causal, group_size, K/V layout and variant) use a prefix of the primary key.
const std::string& schema_sql() {
  static const std::string sql = std::string(R"sql(
CREATE TABLE IF NOT EXISTS meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
  device               TEXT PRIMARY KEY,
  backend              TEXT NOT NULL,
  name                 TEXT NOT NULL,
  arch                 INTEGER NOT NULL,
  sm_count             INTEGER NOT NULL,
  smem_per_block_optin INTEGER NOT NULL,
  l2_bytes             INTEGER NOT NULL,
  driver_version       INTEGER NOT NULL,
  compiler             TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results ()sql") +
                                 key_columns_sql() + R"sql(
  block_m            INTEGER NOT NULL,
  block_n            INTEGER NOT NULL,
  warps              INTEGER NOT NULL,
  stages             INTEGER NOT NULL,
  status             TEXT NOT NULL,
  median_ms          REAL NOT NULL DEFAULT 0,
  min_ms             REAL NOT NULL DEFAULT 0,
  max_ms             REAL NOT NULL DEFAULT 0,
  repetitions        INTEGER NOT NULL DEFAULT 0,
  tflops             REAL NOT NULL DEFAULT 0,
  is_default         INTEGER NOT NULL DEFAULT 0,
  message            TEXT NOT NULL DEFAULT '',
  recorded_at        TEXT NOT NULL,)sql" +
                                 kKeyPrimarySql + R"sql(, config)
);
CREATE TABLE IF NOT EXISTS choices ()sql" +
                                 key_columns_sql() + R"sql(
  median_ms          REAL NOT NULL DEFAULT 0,
  default_ms         REAL NOT NULL DEFAULT 0,
  chosen_at          TEXT NOT NULL,)sql" +
                                 kKeyPrimarySql + R"sql()
);
CREATE TABLE IF NOT EXISTS recorded_problems (
  device             TEXT NOT NULL,)sql" +
                                 kProblemColumnsSql + R"sql(
  batch              INTEGER NOT NULL,
  heads_q            INTEGER NOT NULL,
  heads_kv           INTEGER NOT NULL,
  seqlen_q           INTEGER NOT NULL,
  seqlen_k           INTEGER NOT NULL,)sql" +
                                 kLayoutColumnsSql + R"sql(
  variant_spec       TEXT NOT NULL DEFAULT '',
  uses               INTEGER NOT NULL DEFAULT 1,
  first_seen         TEXT NOT NULL,
  last_seen          TEXT NOT NULL,
  PRIMARY KEY (device, pass, deterministic, head_dim, dtype, causal, batch, heads_q, heads_kv,
               seqlen_q, seqlen_k, page_size, seqlens_k, variant)
);
CREATE INDEX IF NOT EXISTS results_by_generator ON results (generator);
CREATE INDEX IF NOT EXISTS choices_by_generator ON choices (generator);
CREATE VIEW IF NOT EXISTS best_configs AS
SELECT c.device, c.generator, c.pass, c.deterministic, c.head_dim, c.dtype, c.causal,
       c.group_size, c.seqlen_q_bucket, c.seqlen_k_bucket, c.batch_heads_bucket, c.page_size,
       c.seqlens_k, c.variant, c.config,
       c.median_ms, c.default_ms,
       CASE WHEN c.median_ms > 0 AND c.default_ms > 0 THEN c.default_ms / c.median_ms END
         AS speedup,
       r.min_ms, r.max_ms, r.repetitions, r.tflops, r.status, c.chosen_at
FROM choices AS c
LEFT JOIN results AS r
  ON )sql" + key_match("r", "c", true) +
                                 ";\n";
  return sql;
}

// The tables whose key gained the pass in version 2 and the K/V layout and variant in version 3
// (meta and devices did not change).
constexpr const char* kKeyedTables[] = {"results", "choices", "recorded_problems"};

// Version 1 or 2 -> 3, inside the open's transaction. The old tables are renamed aside (to
// <table>_v<version>) first so that schema_sql() (the one definition of the version-3 tables)
// creates the new ones; the view and the indexes that refer to the old tables are dropped
// before, so nothing is left pointing at them (and schema_sql() recreates both). Then every old
// row is copied (rows_as_current: the columns it lacks get their plain values) and the old
// tables are dropped.
std::string migration_from(int version) {
  const std::string suffix = "_v" + std::to_string(version);
  std::string sql =
      "DROP VIEW IF EXISTS best_configs;\n"
      "DROP INDEX IF EXISTS results_by_generator;\n"
      "DROP INDEX IF EXISTS choices_by_generator;\n";
  for (const char* table : kKeyedTables) {
    sql += "ALTER TABLE ";
    sql += table;
    sql += " RENAME TO ";
    sql += table;
    sql += suffix;
    sql += ";\n";
  }
  sql += schema_sql();
  const std::pair<const char*, const char*> copies[] = {{"results", kResultColumns},
                                                        {"choices", kChoiceColumns},
                                                        {"recorded_problems", kRecordedColumns}};
  for (const auto& [table, columns] : copies) {
    const std::string old_table = std::string(table) + suffix;
    sql += copy_rows_sql((std::string("INSERT INTO ") + table).c_str(), columns,
                         rows_as_current("main", old_table.c_str(), version));
    sql += ";\nDROP TABLE ";
    sql += old_table;
    sql += ";\n";
  }
  sql += "UPDATE meta SET value = '" + std::to_string(kSchemaVersion) +
         "' WHERE key = 'schema_version';\n";
  return sql;
}

// The text of schema_version in `schema`.meta; nullopt when the table or the row is missing.
Result<std::optional<std::string>> version_text(const Database& db, const char* schema) {
  std::string has_meta = "SELECT name FROM ";
  has_meta += schema;
  has_meta += ".sqlite_master WHERE type = 'table' AND name = 'meta'";
  Result<std::optional<std::string>> meta = db.query_text(has_meta, "reading the schema");
  if (!meta.ok() || !meta->has_value()) return meta;
  // The tables flashjit reads must be tables: a view under one of their names (a file made to
  // look like a tuning DB) could run any query, one that never ends included, on each read.
  std::string not_table = "SELECT type || ' ' || name FROM ";
  not_table += schema;
  not_table +=
      ".sqlite_master WHERE name IN ('meta', 'devices', 'results', 'choices', "
      "'recorded_problems') AND type <> 'table'";
  Result<std::optional<std::string>> odd = db.query_text(not_table, "reading the schema");
  if (!odd.ok()) return odd.error();
  if (odd->has_value()) {
    return make_error(ErrorCode::IoError,
                      "tuning DB " + db.path.string() + ": '" + **odd + "' is not a table");
  }
  // Nor a trigger: it would run statements of the file's author on every write it watches
  // (flashjit writes its user DB; a file it imports or merges from is only read, refused alike).
  std::string trigger = "SELECT name FROM ";
  trigger += schema;
  trigger += ".sqlite_master WHERE type = 'trigger'";
  Result<std::optional<std::string>> triggered = db.query_text(trigger, "reading the schema");
  if (!triggered.ok()) return triggered.error();
  if (triggered->has_value()) {
    return make_error(ErrorCode::IoError, "tuning DB " + db.path.string() + ": trigger '" +
                                              **triggered +
                                              "': a flashjit tuning database has no triggers");
  }
  std::string sql = "SELECT value FROM ";
  sql += schema;
  sql += ".meta WHERE key = 'schema_version'";
  return db.query_text(sql, "reading the schema version");
}

Error unsupported_version(const Database& db, std::string_view found) {
  std::string message = "tuning DB ";
  message += db.path.string();
  message += ": schema_version = '";
  message += found;
  message += "': this build reads schema versions 1 to ";
  message += std::to_string(kSchemaVersion);
  message += " (was it written by a newer flashjit?)";
  return make_error(ErrorCode::Unsupported, std::move(message));
}

}  // namespace

std::string key_match(const char* left, const char* right, bool with_config) {
  static constexpr const char* kNames[] = {"device",
                                           "generator",
                                           "pass",
                                           "deterministic",
                                           "head_dim",
                                           "dtype",
                                           "causal",
                                           "group_size",
                                           "seqlen_q_bucket",
                                           "seqlen_k_bucket",
                                           "batch_heads_bucket",
                                           "page_size",
                                           "seqlens_k",
                                           "variant"};
  std::vector<const char*> names(std::begin(kNames), std::end(kNames));
  if (with_config) names.push_back("config");
  std::string out;
  for (const char* name : names) {
    if (!out.empty()) out += " AND ";
    out += left;
    out += ".";
    out += name;
    out += " = ";
    out += right;
    out += ".";
    out += name;
  }
  return out;
}

std::string copy_rows_sql(const char* insert, const char* columns, const std::string& from) {
  std::string sql = insert;
  sql += " (";
  sql += columns;
  sql += ") SELECT ";
  sql += columns;
  sql += " FROM ";
  sql += from;
  return sql;
}

std::string rows_as_current(const char* schema, const char* table, int version) {
  std::string out;
  // `*` first: should the file become version 3 under a long-lived view (another process
  // migrates it), its own columns keep their names and the literals become "pass:1",
  // "variant:1", ... (SQLite makes result names unique), so reads stay right.
  if (version < kSchemaVersion) out += "(SELECT *, ";
  if (version == 1) out += "'fwd' AS pass, 0 AS deterministic, ";
  if (version < kSchemaVersion) {
    out += "0 AS page_size, 0 AS seqlens_k, '' AS variant, '' AS variant_spec FROM ";
  }
  out += schema;
  out += ".";
  out += table;
  if (version < kSchemaVersion) out += ")";
  return out;
}

Result<int> schema_version(const Database& db, const char* schema) {
  Result<std::optional<std::string>> version = version_text(db, schema);
  if (!version.ok()) {
    return make_error(ErrorCode::IoError,
                      version.error().message + " (not a flashjit tuning database?)");
  }
  if (!version->has_value()) {
    std::string message = "tuning DB ";
    message += db.path.string();
    message += ": no schema_version in its meta table (not a flashjit tuning database?)";
    return make_error(ErrorCode::IoError, std::move(message));
  }
  for (int known = 1; known <= kSchemaVersion; ++known)
    if (**version == std::to_string(known)) return known;
  return unsupported_version(db, **version);
}

Status prepare_for_writing(const Database& db) {
  Transaction transaction(db);
  FLASHJIT_TRY(transaction.begin());
  // Read under the write lock: a concurrent opener's migration is either complete or not begun.
  Result<std::optional<std::string>> version = version_text(db, "main");
  if (!version.ok()) return version.error();
  if (!version->has_value()) {
    FLASHJIT_TRY(db.exec(schema_sql(), "creating the schema"));
    std::string meta = "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '";
    meta += std::to_string(kSchemaVersion);
    meta += "')";
    FLASHJIT_TRY(db.exec(meta, "writing the schema version"));
  } else if (**version == "1" || **version == "2") {
    const std::string what =
        "migrating schema version " + **version + " to " + std::to_string(kSchemaVersion);
    FLASHJIT_TRY(db.exec(migration_from(std::stoi(**version)), what));
  } else if (**version == std::to_string(kSchemaVersion)) {
    FLASHJIT_TRY(db.exec(schema_sql(), "checking the schema"));  // a no-op: all IF NOT EXISTS
  } else {
    return unsupported_version(db, **version);  // rolled back: the file is unchanged
  }
  return transaction.commit();
}

Status serve_older_version(const Database& db, int version) {
  for (const char* table : kKeyedTables) {
    std::string sql = "CREATE TEMP VIEW ";
    sql += table;
    sql += " AS SELECT * FROM ";
    sql += rows_as_current("main", table, version);
    std::string what = "reading version-" + std::to_string(version) + " ";
    what += table;
    FLASHJIT_TRY(db.exec(sql, what));
  }
  return ok_status();
}

}  // namespace flashjit::tuning_db
