// The tuning database on SQLite (C API). The schema (version 3, and how version-1 and -2 files
// are migrated or read) is in runtime/tuning_store_schema.{hpp,cpp} and docs/TUNING_DB.md; the
// statement, connection and transaction helpers in runtime/tuning_store_sqlite.{hpp,cpp}.
//
// Durability and concurrency:
// - journal_mode=WAL + synchronous=NORMAL: a transaction is in the WAL file (in the OS page cache)
//   once COMMIT returns, so it survives the writing process being killed (kill -9, a crash);
//   only a power loss or OS crash may lose the last few transactions (never corrupts the file).
// - Every write is one BEGIN IMMEDIATE ... COMMIT transaction, retried while busy (Transaction).
// - One sqlite3 connection per TuningStore, guarded by a mutex: a store is thread-safe.
#include "runtime/tuning_store.hpp"

#include <sqlite3.h>
#include <unistd.h>

#include <bit>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include "generator/decode_config.hpp"
#include "generator/enum_names.hpp"
#include "generator/render.hpp"
#include "runtime/tuning_store_impl.hpp"
#include "runtime/tuning_store_schema.hpp"
#include "runtime/tuning_store_sqlite.hpp"
#include "runtime/tuning_store_text.hpp"

namespace flashjit {
namespace fs = std::filesystem;
using tuning_db::Database;
using tuning_db::deterministic_column;
using tuning_db::kNowSql;
using tuning_db::Statement;
using tuning_db::Transaction;

// --- Plain helpers of the header ---------------------------------------------------------------

int64_t size_bucket(int64_t value) {
  if (value <= 1) return 1;
  return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(value)));
}

ProblemKey ProblemKey::of(const AttentionProblem& problem) {
  ProblemKey key;
  key.pass = problem.pass;
  key.deterministic = problem.is_backward() && problem.deterministic;
  key.head_dim = problem.head_dim;
  key.dtype = problem.dtype;
  key.causal = problem.causal;
  key.group_size = problem.heads_kv > 0 ? problem.group_size() : 1;
  key.seqlen_q_bucket = size_bucket(problem.seqlen_q);
  key.seqlen_k_bucket = size_bucket(problem.seqlen_k);
  key.batch_heads_bucket = size_bucket(problem.batch * problem.heads_q);
  key.page_size = problem.kv.page_size;
  key.seqlens_k = problem.kv.seqlens_k;
  key.variant = problem.variant.key();
  return key;
}

const char* ProblemKey::pass_name() const {
  if (pass == Pass::Forward) return "fwd";
  return deterministic ? "bwd-det" : "bwd";
}

std::string ProblemKey::to_string() const {
  std::string out;
  if (pass == Pass::Backward) {
    out += pass_name();
    out += " ";
  }
  out += "d";
  out += std::to_string(head_dim);
  out += " ";
  out += flashjit::to_string(dtype);
  out += causal ? " causal g" : " noncausal g";
  out += std::to_string(group_size);
  out += " q";
  out += std::to_string(seqlen_q_bucket);
  out += " k";
  out += std::to_string(seqlen_k_bucket);
  out += " bh";
  out += std::to_string(batch_heads_bucket);
  return out + layout_suffix(page_size, seqlens_k, variant);
}

const char* to_string(TuneStatus status) {
  return enum_name(status, {"timed", "compile-failed", "launch-failed", "wrong-result"}, "unknown");
}

bool ProblemKey::may_run_decode() const {
  return pass == Pass::Forward && variant.empty() &&
         (page_size > 0 || seqlens_k || seqlen_q_bucket <= kMaxDecodeSeqlenQ);
}

const std::string& ProblemKey::generator_version(std::string_view device) const {
  if (!variant.empty()) return variant_generator_version_of(device, pass);
  return may_run_decode() ? decode_generator_version_of(device)
                          : generator_version_of(device, pass);
}

namespace {

TuneStatus parse_status(std::string_view text) {
  if (text == "compile-failed") return TuneStatus::CompileFailed;
  if (text == "launch-failed") return TuneStatus::LaunchFailed;
  if (text == "wrong-result") return TuneStatus::WrongResult;
  return TuneStatus::Timed;
}

// Binds the key columns of kKeyWhere (with_buckets) or kKeyWhereButBuckets starting at `index`;
// returns the next free index. The generator version is the key's (ProblemKey::generator_version).
// Binds `key`'s problem fields (kProblemKeyColumns, the buckets only `with_buckets`) from
// parameter `index` on; the next index.
Result<int> bind_problem_key(const Database& impl, Statement& stmt, int index,
                             const ProblemKey& key, bool with_buckets = true) {
  FLASHJIT_TRY(impl.bound(stmt.bind(index++, std::string_view(to_string(key.pass)))));
  FLASHJIT_TRY(impl.bound(stmt.bind(index++, deterministic_column(key.pass, key.deterministic))));
  FLASHJIT_TRY(impl.bound(stmt.bind(index++, int64_t{key.head_dim})));
  FLASHJIT_TRY(impl.bound(stmt.bind(index++, std::string_view(to_string(key.dtype)))));
  FLASHJIT_TRY(impl.bound(stmt.bind(index++, int64_t{key.causal ? 1 : 0})));
  FLASHJIT_TRY(impl.bound(stmt.bind(index++, key.group_size)));
  if (with_buckets) {
    FLASHJIT_TRY(impl.bound(stmt.bind(index++, key.seqlen_q_bucket)));
    FLASHJIT_TRY(impl.bound(stmt.bind(index++, key.seqlen_k_bucket)));
    FLASHJIT_TRY(impl.bound(stmt.bind(index++, key.batch_heads_bucket)));
  }
  FLASHJIT_TRY(impl.bound(stmt.bind(index++, int64_t{key.page_size})));
  FLASHJIT_TRY(impl.bound(stmt.bind(index++, int64_t{key.seqlens_k ? 1 : 0})));
  FLASHJIT_TRY(impl.bound(stmt.bind(index++, key.variant)));
  return index;
}

// Binds the device, the generator version `key` is current under there, and `key`'s problem.
Result<int> bind_key(const Database& impl, Statement& stmt, int index, const std::string& device,
                     const ProblemKey& key, bool with_buckets = true) {
  FLASHJIT_TRY(impl.bound(stmt.bind(index++, device)));
  FLASHJIT_TRY(impl.bound(stmt.bind(index++, std::string_view(key.generator_version(device)))));
  return bind_problem_key(impl, stmt, index, key, with_buckets);
}

// "<select> WHERE <the key's columns> <order>" prepared with the device's and `key`'s parameters
// bound (bind_key; the buckets only `with_buckets`).
Result<Statement> prepare_for_key(const Database& impl, const char* select,
                                  const DeviceFingerprint& device, const ProblemKey& key,
                                  const char* order = "", bool with_buckets = true) {
  std::string sql = select;
  sql += " WHERE ";
  sql += with_buckets ? tuning_db::kKeyWhere : tuning_db::kKeyWhereButBuckets;
  sql += order;
  Result<Statement> stmt = impl.prepare(sql);
  if (!stmt.ok()) return stmt.error();
  Result<int> bound = bind_key(impl, *stmt, 1, device.to_string(), key, with_buckets);
  if (!bound.ok()) return bound.error();
  return stmt;
}

// Inserts or replaces the row of `key` and `config` in `table` (`columns`: the key's, the
// config's name, `values` in order, the time stamp last: now), with `device`'s row, in one
// transaction.
template <class... Values>
Status upsert_row(const Database& impl, const char* table, const char* columns,
                  const DeviceFingerprint& device, const ProblemKey& key,
                  const AttentionConfig& config, const char* what, const Values&... values) {
  std::string sql = "INSERT OR REPLACE INTO ";
  sql += table;
  sql += " (";
  sql += columns;
  sql += ") VALUES (";
  for (const char* c = columns; *c != '\0'; ++c)
    if (*c == ',') sql += "?, ";
  sql += kNowSql;
  sql += ")";
  Result<Statement> stmt = impl.prepare(sql);
  if (!stmt.ok()) return stmt.error();
  Result<int> next = bind_key(impl, *stmt, 1, device.to_string(), key);
  if (!next.ok()) return next.error();
  int i = next.value();
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, config.to_string())));
  Status bound = ok_status();
  ((bound = bound.ok() ? impl.bound(stmt->bind(i++, values)) : bound), ...);
  FLASHJIT_TRY(bound);
  Transaction transaction(impl);
  FLASHJIT_TRY(transaction.begin());
  FLASHJIT_TRY(tuning_db::record_device(impl, device));
  FLASHJIT_TRY(impl.run(*stmt, what));
  return transaction.commit();
}

// The result of columns config, status, median_ms, min_ms, max_ms, repetitions, tflops,
// is_default, message from `column` on; nullopt for a config this build cannot parse (a
// hand-edited row).
std::optional<TuneResult> result_at(const Statement& stmt, int column) {
  Result<AttentionConfig> config = AttentionConfig::parse(stmt.text_at(column));
  if (!config.ok()) return std::nullopt;
  TuneResult row;
  row.config = config.value();
  row.status = parse_status(stmt.text_at(column + 1));
  row.median_ms = stmt.double_at(column + 2);
  row.min_ms = stmt.double_at(column + 3);
  row.max_ms = stmt.double_at(column + 4);
  row.repetitions = static_cast<int>(stmt.int_at(column + 5));
  row.tflops = stmt.double_at(column + 6);
  row.is_default = stmt.int_at(column + 7) != 0;
  row.message = stmt.text_at(column + 8);
  return row;
}

// The choice of `config` and columns median_ms, default_ms from `column` on.
TuneChoice choice_at(const Statement& stmt, const AttentionConfig& config, int column) {
  TuneChoice choice;
  choice.config = config;
  choice.median_ms = stmt.double_at(column);
  choice.default_ms = stmt.double_at(column + 1);
  return choice;
}

// Error NotFound unless `path` is a file: "tuning DB <path>: no such file".
Status check_is_file(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return ok_status();
  std::string message = "tuning DB ";
  message += path.string();
  message += ": no such file";
  return make_error(ErrorCode::NotFound, std::move(message));
}

// Reads a ProblemKey from the columns of kProblemKeyColumns starting at `column`; nullopt for a
// pass this build does not know (a hand-edited row).
std::optional<ProblemKey> key_at(const Statement& stmt, int column) {
  Result<Pass> pass = parse_pass(stmt.text_at(column));
  if (!pass.ok()) return std::nullopt;
  ProblemKey key;
  key.pass = pass.value();
  key.deterministic = deterministic_column(key.pass, stmt.int_at(column + 1) != 0) != 0;
  key.head_dim = static_cast<int>(stmt.int_at(column + 2));
  Result<DType> dtype = parse_dtype(stmt.text_at(column + 3));
  key.dtype = dtype.ok() ? dtype.value() : DType::BF16;
  key.causal = stmt.int_at(column + 4) != 0;
  key.group_size = stmt.int_at(column + 5);
  key.seqlen_q_bucket = stmt.int_at(column + 6);
  key.seqlen_k_bucket = stmt.int_at(column + 7);
  key.batch_heads_bucket = stmt.int_at(column + 8);
  key.page_size = static_cast<int>(stmt.int_at(column + 9));
  key.seqlens_k = stmt.int_at(column + 10) != 0;
  key.variant = stmt.text_at(column + 11);
  return key;
}

// log2 of a bucket (floor, for robustness against hand-edited rows).
int log2_of(int64_t bucket) {
  return bucket <= 1 ? 0 : std::bit_width(static_cast<uint64_t>(bucket)) - 1;
}

}  // namespace

Status tuning_db::record_device(const Database& impl, const DeviceFingerprint& device) {
  std::string sql = "INSERT OR IGNORE INTO devices (";
  sql += tuning_db::kDeviceColumns;
  sql += ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";
  Result<Statement> stmt = impl.prepare(sql);
  if (!stmt.ok()) return stmt.error();
  FLASHJIT_TRY(impl.bound(stmt->bind(1, device.to_string())));
  FLASHJIT_TRY(impl.bound(stmt->bind(2, device.backend)));
  FLASHJIT_TRY(impl.bound(stmt->bind(3, device.name)));
  FLASHJIT_TRY(impl.bound(stmt->bind(4, int64_t{device.arch})));
  FLASHJIT_TRY(impl.bound(stmt->bind(5, int64_t{device.sm_count})));
  FLASHJIT_TRY(impl.bound(stmt->bind(6, int64_t{device.smem_per_block_optin})));
  FLASHJIT_TRY(impl.bound(stmt->bind(7, int64_t{device.l2_bytes})));
  FLASHJIT_TRY(impl.bound(stmt->bind(8, int64_t{device.driver_version})));
  FLASHJIT_TRY(impl.bound(stmt->bind(9, device.compiler)));
  return impl.run(*stmt, "recording the device");
}

// --- TuningStore ---------------------------------------------------------------------------------

TuningStore::TuningStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TuningStore::~TuningStore() = default;

const fs::path& TuningStore::path() const { return impl_->path; }

namespace {

// ProblemKey::may_run_decode as an SQL condition on a results or choices row.
std::string may_run_decode_sql() {
  return "(pass = 'fwd' AND variant = '' AND (page_size > 0 OR seqlens_k != 0 OR "
         "seqlen_q_bucket <= " +
         std::to_string(kMaxDecodeSeqlenQ) + "))";
}

// The generator version a results or choices row of a device of `backend` should carry
// (ProblemKey::generator_version) as an SQL expression with 5 parameters, bound by
// bind_row_versions.
std::string row_version_sql() {
  return "(CASE WHEN variant != '' THEN (CASE WHEN pass = 'bwd' THEN ? ELSE ? END) WHEN " +
         may_run_decode_sql() + " THEN ? WHEN pass = 'bwd' THEN ? ELSE ? END)";
}

Status bind_row_versions(const Database& impl, Statement& stmt, int first,
                         const std::string& prefix) {
  const std::string* versions[] = {
      &variant_generator_version_of(prefix, Pass::Backward),
      &variant_generator_version_of(prefix, Pass::Forward), &decode_generator_version_of(prefix),
      &generator_version_of(prefix, Pass::Backward), &generator_version_of(prefix, Pass::Forward)};
  for (int i = 0; i < 5; ++i)
    FLASHJIT_TRY(impl.bound(stmt.bind(first + i, std::string_view(*versions[i]))));
  return ok_status();
}

// Rows stamped by an older scheme with a hash of this build's templates, re-stamped with the
// version of their backend, kind and pass (ProblemKey::generator_version) so they stay current:
//   generator_version()              plain rows written before the versions were per backend
//                                    (the hash of every template);
//   legacy_row_versions_of(b)        rows written before the versions were per pass (the hash of
//                                    every template of the backend for the row's kind: plain
//                                    prefill, variant or decode; generator/render.hpp).
// Equal hashes mean the same templates, so the rows' kernels are this build's. A row whose
// re-stamped twin already exists stays as it is (stale). One transaction; idempotent.
Status restamp_same_templates(const Database& impl) {
  Transaction transaction(impl);
  FLASHJIT_TRY(transaction.begin());
  for (const char* table : {"results", "choices"}) {
    for (std::string_view backend : kTemplateBackends) {
      const std::string prefix = std::string(backend) + "|";
      const LegacyRowVersions& legacy = legacy_row_versions_of(prefix);
      // Plain rows under any old plain stamp; variant rows under the old variant stamp.
      std::string sql = "UPDATE OR IGNORE ";
      sql += table;
      sql += " SET generator = " + row_version_sql() +
             " WHERE substr(device, 1, ?) = ? AND ((variant = '' AND generator IN (?, ?, ?)) OR "
             "(variant != '' AND generator = ?))";
      Result<Statement> stmt = impl.prepare(sql);
      if (!stmt.ok()) return stmt.error();
      FLASHJIT_TRY(bind_row_versions(impl, *stmt, 1, prefix));
      FLASHJIT_TRY(impl.bound(stmt->bind(6, static_cast<int64_t>(prefix.size()))));
      FLASHJIT_TRY(impl.bound(stmt->bind(7, std::string_view(prefix))));
      FLASHJIT_TRY(impl.bound(stmt->bind(8, std::string_view(generator_version()))));
      FLASHJIT_TRY(impl.bound(stmt->bind(9, std::string_view(legacy.plain))));
      FLASHJIT_TRY(impl.bound(stmt->bind(10, std::string_view(legacy.decode))));
      FLASHJIT_TRY(impl.bound(stmt->bind(11, std::string_view(legacy.variant))));
      FLASHJIT_TRY(impl.run(*stmt, "re-stamping rows with their backend's generator version"));
    }
  }
  return transaction.commit();
}

}  // namespace

Result<std::unique_ptr<TuningStore>> TuningStore::open(const fs::path& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  FLASHJIT_TRY(impl->open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE));
  // WAL + NORMAL: durable against a killed process (see the top of this file).
  FLASHJIT_TRY(impl->exec("PRAGMA journal_mode=WAL", "setting journal_mode=WAL"));
  FLASHJIT_TRY(impl->exec("PRAGMA synchronous=NORMAL", "setting synchronous=NORMAL"));
  // Creates the schema, or migrates a version-1 file in place (one transaction).
  FLASHJIT_TRY(tuning_db::prepare_for_writing(*impl));
  FLASHJIT_TRY(restamp_same_templates(*impl));
  return std::unique_ptr<TuningStore>(new TuningStore(std::move(impl)));
}

Result<std::unique_ptr<TuningStore>> TuningStore::open_read_only(const fs::path& path) {
  FLASHJIT_TRY(check_is_file(path));
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->read_only = true;
  FLASHJIT_TRY(impl->open(path, SQLITE_OPEN_READONLY));
  Result<int> version = tuning_db::schema_version(*impl, "main");
  if (!version.ok()) return version.error();
  // An older file (a system DB shipped by an older release) is served as it is: its rows are
  // plain rows (and forward rows, version 1). It is never migrated here (that would need a write).
  if (version.value() < tuning_db::kSchemaVersion)
    FLASHJIT_TRY(tuning_db::serve_older_version(*impl, version.value()));
  return std::unique_ptr<TuningStore>(new TuningStore(std::move(impl)));
}

Status TuningStore::record(const DeviceFingerprint& device, const ProblemKey& key,
                           const TuneResult& result) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const AttentionConfig& c = result.config;
  return upsert_row(*impl_, "results", tuning_db::kResultColumns, device, key, c,
                    "recording a result", int64_t{c.block_m}, int64_t{c.block_n}, int64_t{c.warps},
                    int64_t{c.stages}, std::string_view(to_string(result.status)), result.median_ms,
                    result.min_ms, result.max_ms, int64_t{result.repetitions}, result.tflops,
                    int64_t{result.is_default ? 1 : 0}, std::string_view(result.message));
}

Status TuningStore::choose(const DeviceFingerprint& device, const ProblemKey& key,
                           const TuneChoice& choice) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return upsert_row(*impl_, "choices", tuning_db::kChoiceColumns, device, key, choice.config,
                    "recording a choice", choice.median_ms, choice.default_ms);
}

Result<std::vector<TuneResult>> TuningStore::results(const DeviceFingerprint& device,
                                                     const ProblemKey& key) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Result<Statement> stmt = prepare_for_key(
      *impl_,
      "SELECT config, status, median_ms, min_ms, max_ms, repetitions, tflops, is_default, "
      "message FROM results",
      device, key, " ORDER BY status != 'timed', median_ms, config");
  if (!stmt.ok()) return stmt.error();
  std::vector<TuneResult> rows;
  FLASHJIT_TRY(impl_->each_row(*stmt, "reading results", [&] {
    if (std::optional<TuneResult> row = result_at(*stmt, 0)) rows.push_back(std::move(*row));
  }));
  return rows;
}

Result<std::optional<TuneChoice>> TuningStore::choice(const DeviceFingerprint& device,
                                                      const ProblemKey& key) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& impl = *impl_;
  Result<Statement> stmt =
      prepare_for_key(impl, "SELECT config, median_ms, default_ms FROM choices", device, key);
  if (!stmt.ok()) return stmt.error();
  Result<int> rc = impl.step(*stmt, "reading a choice");
  if (!rc.ok()) return rc.error();
  if (rc.value() == SQLITE_DONE) return std::optional<TuneChoice>();
  const std::string text = stmt->text_at(0);
  Result<AttentionConfig> config = AttentionConfig::parse(text);
  if (!config.ok()) {
    std::string message = "tuning DB ";
    message += impl.path.string();
    message += ": choice for ";
    message += key.to_string();
    message += " has config '";
    message += text;
    message += "': not a config (expected e.g. m128n64w4s2)";
    return make_error(ErrorCode::IoError, std::move(message));
  }
  return std::optional<TuneChoice>(choice_at(*stmt, config.value(), 1));
}

Result<std::optional<std::pair<ProblemKey, TuneChoice>>> TuningStore::nearest_choice(
    const DeviceFingerprint& device, const ProblemKey& key) const {
  using Found = std::optional<std::pair<ProblemKey, TuneChoice>>;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& impl = *impl_;
  Result<Statement> stmt = prepare_for_key(
      impl,
      "SELECT seqlen_q_bucket, seqlen_k_bucket, batch_heads_bucket, config, median_ms, "
      "default_ms FROM choices",
      device, key, "", /*with_buckets=*/false);
  if (!stmt.ok()) return stmt.error();

  const int q = log2_of(key.seqlen_q_bucket);
  const int k = log2_of(key.seqlen_k_bucket);
  const int bh = log2_of(key.batch_heads_bucket);
  // Rank: smaller distance first; on a tie, larger buckets (sum of log2, then q, k, bh).
  using Rank = std::tuple<int, int, int, int, int>;
  std::optional<Rank> best_rank;
  Found best;
  FLASHJIT_TRY(impl.each_row(*stmt, "reading choices", [&] {
    Result<AttentionConfig> config = AttentionConfig::parse(stmt->text_at(3));
    if (!config.ok()) return;
    ProblemKey candidate = key;  // same pass, flag, head_dim, dtype, causal, group, layout, variant
    candidate.deterministic = deterministic_column(key.pass, key.deterministic) != 0;
    candidate.seqlen_q_bucket = stmt->int_at(0);
    candidate.seqlen_k_bucket = stmt->int_at(1);
    candidate.batch_heads_bucket = stmt->int_at(2);
    const int cq = log2_of(candidate.seqlen_q_bucket);
    const int ck = log2_of(candidate.seqlen_k_bucket);
    const int cbh = log2_of(candidate.batch_heads_bucket);
    const int distance = std::abs(cq - q) + std::abs(ck - k) + std::abs(cbh - bh);
    const Rank rank{distance, -(cq + ck + cbh), -cq, -ck, -cbh};
    if (best_rank && !(rank < *best_rank)) return;
    best_rank = rank;
    best = std::make_pair(candidate, choice_at(*stmt, config.value(), 4));
  }));
  return best;
}

Result<std::vector<TuningStore::Entry>> TuningStore::entries() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& impl = *impl_;
  std::string sql = "SELECT device, generator, ";
  sql += tuning_db::kProblemKeyColumns;
  sql += ", config, median_ms, default_ms FROM choices ORDER BY chosen_at DESC, device, ";
  sql += tuning_db::kProblemKeyColumns;
  Result<Statement> stmt = impl.prepare(sql);
  if (!stmt.ok()) return stmt.error();
  std::vector<Entry> entries;
  FLASHJIT_TRY(impl.each_row(*stmt, "reading choices", [&] {
    Result<AttentionConfig> config = AttentionConfig::parse(stmt->text_at(14));
    std::optional<ProblemKey> key = key_at(*stmt, 2);
    if (!config.ok() || !key) return;
    Entry entry;
    entry.device = stmt->text_at(0);
    entry.generator = stmt->text_at(1);
    entry.key = *key;
    entry.choice = choice_at(*stmt, config.value(), 15);
    entry.current = entry.generator == entry.key.generator_version(entry.device);
    entries.push_back(std::move(entry));
  }));
  return entries;
}

Result<std::vector<TuningStore::ResultEntry>> TuningStore::result_entries(
    const std::optional<ProblemKey>& key) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& impl = *impl_;
  std::string sql = "SELECT device, generator, ";
  sql += tuning_db::kProblemKeyColumns;
  sql +=
      ", config, status, median_ms, min_ms, max_ms, repetitions, tflops, is_default, message, "
      "recorded_at FROM results";
  if (key) {
    sql +=
        " WHERE pass = ? AND deterministic = ? AND head_dim = ? AND dtype = ? AND causal = ? "
        "AND group_size = ? AND seqlen_q_bucket = ? AND seqlen_k_bucket = ? AND "
        "batch_heads_bucket = ? AND page_size = ? AND seqlens_k = ? AND variant = ?";
  }
  sql += " ORDER BY device, generator, ";
  sql += tuning_db::kProblemKeyColumns;
  sql += ", status != 'timed', median_ms, config";
  Result<Statement> stmt = impl.prepare(sql);
  if (!stmt.ok()) return stmt.error();
  if (key) {
    Result<int> bound = bind_problem_key(impl, *stmt, 1, *key);
    if (!bound.ok()) return bound.error();
  }
  std::vector<ResultEntry> rows;
  FLASHJIT_TRY(impl.each_row(*stmt, "reading results", [&] {
    std::optional<TuneResult> result = result_at(*stmt, 14);
    std::optional<ProblemKey> row_key = key_at(*stmt, 2);
    if (!result || !row_key) return;
    ResultEntry row;
    row.device = stmt->text_at(0);
    row.generator = stmt->text_at(1);
    row.key = *row_key;
    row.result = std::move(*result);
    row.recorded_at = stmt->text_at(23);
    row.current = row.generator == row.key.generator_version(row.device);
    rows.push_back(std::move(row));
  }));
  return rows;
}

Status TuningStore::merge_from(const fs::path& other) {
  if (tuning_db::is_text_db(other)) {
    // The text form: its rows into a scratch DB (a fresh version-3 file), merged from there.
    std::error_code ec;
    std::string name = (fs::temp_directory_path(ec) / "flashjit-text-db-XXXXXX").string();
    const int fd = mkstemp(name.data());
    if (fd < 0) {
      return make_error(ErrorCode::IoError,
                        "merging " + other.string() + ": cannot create a scratch file " + name);
    }
    close(fd);
    struct Remove {
      fs::path path;
      ~Remove() {
        std::error_code ignored;
        for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(path.string() + suffix, ignored);
      }
    } remove{name};
    {
      Result<std::unique_ptr<TuningStore>> scratch = TuningStore::open(name);
      if (!scratch.ok()) return scratch.error();
      FLASHJIT_TRY(tuning_db::read_text(*(*scratch)->impl_, other));
    }
    return merge_from(name);
  }
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Impl& impl = *impl_;
  FLASHJIT_TRY(check_is_file(other));
  std::error_code ec;
  if (fs::equivalent(other, impl.path, ec)) {
    std::string message = "cannot merge tuning DB ";
    message += other.string();
    message += " into itself";
    return make_error(ErrorCode::InvalidArgument, std::move(message));
  }
  {
    Result<Statement> attach = impl.prepare("ATTACH DATABASE ? AS other");
    if (!attach.ok()) return attach.error();
    FLASHJIT_TRY(impl.bound(attach->bind(1, tuning_db::read_only_uri(other))));
    std::string what = "attaching ";
    what += other.string();
    FLASHJIT_TRY(impl.run(*attach, what));
  }
  // Detached on every path out (after the transaction has ended).
  struct Detach {
    const Impl& impl;
    ~Detach() { sqlite3_exec(impl.db, "DETACH DATABASE other", nullptr, nullptr, nullptr); }
  } detach{impl};

  // An older file (an older release's) merges too: its rows come in as plain (forward) rows.
  Result<int> version = tuning_db::schema_version(impl, "other");
  if (!version.ok()) {
    std::string message = version.error().message;
    message += " (merging ";
    message += other.string();
    message += ")";
    return make_error(version.error().code, std::move(message));
  }
  auto rows_of = [&](const char* table) {
    return tuning_db::rows_as_current("other", table, version.value());
  };

  // Rows of `other` that are newer than (or absent from) ours replace ours.
  std::string results = tuning_db::copy_rows_sql("INSERT OR REPLACE INTO main.results",
                                                 tuning_db::kResultColumns, rows_of("results"));
  results += " AS o WHERE NOT EXISTS (SELECT 1 FROM main.results AS m WHERE ";
  results += tuning_db::key_match("m", "o", /*with_config=*/true);
  results += " AND m.recorded_at >= o.recorded_at)";

  std::string choices = tuning_db::copy_rows_sql("INSERT OR REPLACE INTO main.choices",
                                                 tuning_db::kChoiceColumns, rows_of("choices"));
  choices += " AS o WHERE NOT EXISTS (SELECT 1 FROM main.choices AS m WHERE ";
  choices += tuning_db::key_match("m", "o", /*with_config=*/false);
  choices += " AND m.chosen_at >= o.chosen_at)";

  const std::string devices = tuning_db::copy_rows_sql("INSERT OR IGNORE INTO main.devices",
                                                       tuning_db::kDeviceColumns, "other.devices");

  // "WHERE true" keeps the upsert's ON CONFLICT from parsing as a join constraint.
  std::string recorded =
      tuning_db::copy_rows_sql("INSERT INTO main.recorded_problems", tuning_db::kRecordedColumns,
                               rows_of("recorded_problems"));
  recorded += " WHERE true ON CONFLICT (";
  recorded += tuning_db::kRecordedKey;
  recorded +=
      ") DO UPDATE SET uses = max(uses, excluded.uses), first_seen = min(first_seen, "
      "excluded.first_seen), last_seen = max(last_seen, excluded.last_seen)";

  Transaction transaction(impl);
  FLASHJIT_TRY(transaction.begin());
  FLASHJIT_TRY(impl.exec(devices, "merging devices"));
  FLASHJIT_TRY(impl.exec(results, "merging results"));
  FLASHJIT_TRY(impl.exec(choices, "merging choices"));
  FLASHJIT_TRY(impl.exec(recorded, "merging recorded problems"));
  FLASHJIT_TRY(transaction.commit());
  // Rows the other file carries under an older scheme's stamp of this build's templates (a
  // shipped .sql written before the versions were per pass) are current here as on open().
  return restamp_same_templates(impl);
}

Status TuningStore::clear(bool stale_only) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& impl = *impl_;
  Transaction transaction(impl);
  FLASHJIT_TRY(transaction.begin());
  if (stale_only) {
    // Stale: not the generator version of the row's backend, kind (plain, decode or variant) and
    // pass (ProblemKey::generator_version).
    for (const char* table : {"results", "choices"}) {
      for (std::string_view backend : kTemplateBackends) {
        std::string sql = "DELETE FROM ";
        sql += table;
        sql += " WHERE substr(device, 1, ?) = ? AND generator != " + row_version_sql();
        Result<Statement> stmt = impl.prepare(sql);
        if (!stmt.ok()) return stmt.error();
        const std::string prefix = std::string(backend) + "|";
        FLASHJIT_TRY(impl.bound(stmt->bind(1, static_cast<int64_t>(prefix.size()))));
        FLASHJIT_TRY(impl.bound(stmt->bind(2, std::string_view(prefix))));
        FLASHJIT_TRY(bind_row_versions(impl, *stmt, 3, prefix));
        FLASHJIT_TRY(impl.run(*stmt, "deleting stale rows"));
      }
      std::string sql = "DELETE FROM ";
      sql += table;
      sql +=
          " WHERE substr(device, 1, 5) != 'cuda|' AND substr(device, 1, 4) NOT IN ('hip|', "
          "'cpu|') AND generator != ?";
      Result<Statement> stmt = impl.prepare(sql);
      if (!stmt.ok()) return stmt.error();
      FLASHJIT_TRY(impl.bound(stmt->bind(1, std::string_view(generator_version()))));
      FLASHJIT_TRY(impl.run(*stmt, "deleting stale rows"));
    }
  } else {
    FLASHJIT_TRY(
        impl.exec("DELETE FROM results; DELETE FROM choices; DELETE FROM recorded_problems; "
                  "DELETE FROM devices;",
                  "deleting all rows"));
  }
  return transaction.commit();
}

Status TuningStore::export_to(const fs::path& file) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& impl = *impl_;
  std::error_code ec;
  if (fs::exists(file, ec)) {
    std::string message = "export target ";
    message += file.string();
    message += " exists: give a new file name";
    return make_error(ErrorCode::InvalidArgument, std::move(message));
  }
  if (tuning_db::is_text_db(file)) return tuning_db::write_text(impl, file);
  {
    Result<Statement> stmt = impl.prepare("VACUUM INTO ?");
    if (!stmt.ok()) return stmt.error();
    FLASHJIT_TRY(impl.bound(stmt->bind(1, fs::absolute(file, ec).string())));
    std::string what = "exporting to ";
    what += file.string();
    FLASHJIT_TRY(impl.run(*stmt, what));
  }
  // The copy as one self-contained file (no -wal/-shm needed), so that it opens read-only.
  sqlite3* copy = nullptr;
  int rc = sqlite3_open_v2(file.c_str(), &copy, SQLITE_OPEN_READWRITE, nullptr);
  if (rc == SQLITE_OK) {
    rc = sqlite3_exec(copy, "PRAGMA journal_mode=DELETE", nullptr, nullptr, nullptr);
  }
  if (rc != SQLITE_OK) {
    std::string message = "tuning DB ";
    message += file.string();
    message += ": setting journal_mode=DELETE on the export: ";
    message += copy != nullptr ? sqlite3_errmsg(copy) : "out of memory";
    sqlite3_close_v2(copy);
    return make_error(ErrorCode::IoError, std::move(message));
  }
  sqlite3_close_v2(copy);
  return ok_status();
}

}  // namespace flashjit
