// The SQLite plumbing of the tuning store (internal to runtime/tuning_store*.cpp): a prepared
// statement, the connection with its checked-call helpers, and a write transaction.
//
// Concurrency (see also runtime/tuning_store.cpp):
// - busy_timeout makes SQLite wait for another writer's lock; on top of that BEGIN IMMEDIATE,
//   COMMIT and the setup are retried on SQLITE_BUSY / SQLITE_LOCKED for up to kBusyRetryLimit,
//   because a few lock paths (WAL recovery, journal-mode change) return BUSY without waiting.
// - Every write is one BEGIN IMMEDIATE ... COMMIT transaction (Transaction): the write lock is
//   taken up front, so a transaction never has to upgrade a read lock (which SQLite cannot wait
//   for).
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "generator/error.hpp"

namespace flashjit::tuning_db {

inline constexpr int kBusyTimeoutMs = 30000;
inline constexpr auto kBusyRetryLimit = std::chrono::seconds(120);

// "file:<percent-encoded absolute path>?mode=ro" for ATTACH (the connection accepts URIs).
std::string read_only_uri(const std::filesystem::path& path);

// A prepared statement, finalized on destruction.
class Statement {
 public:
  Statement() = default;
  explicit Statement(sqlite3_stmt* stmt) : stmt_(stmt) {}
  Statement(Statement&& other) noexcept : stmt_(std::exchange(other.stmt_, nullptr)) {}
  Statement& operator=(Statement&& other) noexcept {
    std::swap(stmt_, other.stmt_);
    return *this;
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  sqlite3_stmt* get() const { return stmt_; }

  int bind(int index, int64_t value) { return sqlite3_bind_int64(stmt_, index, value); }
  int bind(int index, double value) { return sqlite3_bind_double(stmt_, index, value); }
  int bind(int index, std::string_view value) {
    return sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()),
                             SQLITE_TRANSIENT);
  }

  int64_t int_at(int column) const { return sqlite3_column_int64(stmt_, column); }
  double double_at(int column) const { return sqlite3_column_double(stmt_, column); }
  std::string text_at(int column) const;

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

// The connection and the checked-call helpers every method uses. Errors are IoError
// "tuning DB <path>: <what>: <sqlite3_errmsg>".
struct Database {
  std::filesystem::path path;
  sqlite3* db = nullptr;
  bool read_only = false;
  std::mutex mutex;  // one connection, one statement at a time

  Database() = default;
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;
  ~Database();

  // Opens `path` (absolute, so that a relative name starting with "file:" is not a URI) with
  // SQLITE_OPEN_* `flags` | SQLITE_OPEN_URI and sets the busy timeout.
  Status open(const std::filesystem::path& file, int flags);

  Error error(std::string_view what) const;
  Result<Statement> prepare(std::string_view sql) const;
  // Checks a bind's return code.
  Status bound(int rc) const;
  // Steps once: SQLITE_ROW or SQLITE_DONE, retrying a busy lock (before any row was returned).
  Result<int> step(Statement& stmt, std::string_view what) const;
  // Runs a statement that returns no rows we need (DDL, INSERT, DELETE, BEGIN, COMMIT).
  Status run(Statement& stmt, std::string_view what) const;
  // Steps `stmt` to its end, calling row() at each row (which reads it from `stmt`).
  template <class Row>
  Status each_row(Statement& stmt, std::string_view what, const Row& row) const {
    for (;;) {
      Result<int> rc = step(stmt, what);
      if (!rc.ok()) return rc.error();
      if (rc.value() == SQLITE_DONE) return ok_status();
      row();
    }
  }
  // Runs one or more statements of fixed text, retrying a busy lock.
  Status exec(std::string_view sql, std::string_view what) const;
  // The first column of the first row of `sql` as text; nullopt when there is no row.
  Result<std::optional<std::string>> query_text(std::string_view sql, std::string_view what) const;
};

// One write transaction: BEGIN IMMEDIATE (retried while busy); rolled back unless committed.
class Transaction {
 public:
  explicit Transaction(const Database& db) : db_(db) {}
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  ~Transaction() {
    if (open_) sqlite3_exec(db_.db, "ROLLBACK", nullptr, nullptr, nullptr);
  }

  Status begin() {
    FLASHJIT_TRY(db_.exec("BEGIN IMMEDIATE", "BEGIN IMMEDIATE"));
    open_ = true;
    return ok_status();
  }
  Status commit() {
    FLASHJIT_TRY(db_.exec("COMMIT", "COMMIT"));
    open_ = false;
    return ok_status();
  }

 private:
  const Database& db_;
  bool open_ = false;
};

}  // namespace flashjit::tuning_db
