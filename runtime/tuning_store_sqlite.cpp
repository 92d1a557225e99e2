// The SQLite plumbing of the tuning store: see runtime/tuning_store_sqlite.hpp.
#include "runtime/tuning_store_sqlite.hpp"

#include <algorithm>
#include <system_error>
#include <thread>

namespace flashjit::tuning_db {
namespace fs = std::filesystem;

namespace {

bool is_busy(int rc) {
  const int primary = rc & 0xff;
  return primary == SQLITE_BUSY || primary == SQLITE_LOCKED;
}

// Backoff between retries of a busy lock: 1 ms doubling to 50 ms.
void backoff(int attempt) {
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, 1 << std::min(attempt, 6))));
}

}  // namespace

std::string read_only_uri(const fs::path& path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out = "file:";
  for (unsigned char c : fs::absolute(path).string()) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '/' || c == '-' || c == '_' || c == '.' || c == '~';
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  out += "?mode=ro";
  return out;
}

std::string Statement::text_at(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  if (text == nullptr) return {};
  return std::string(reinterpret_cast<const char*>(text),
                     static_cast<size_t>(sqlite3_column_bytes(stmt_, column)));
}

Database::~Database() {
  if (db != nullptr) sqlite3_close_v2(db);
}

Status Database::open(const fs::path& file, int flags) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(file, ec);
  const std::string name = ec ? file.string() : absolute.string();
  if (sqlite3_open_v2(name.c_str(), &db, flags | SQLITE_OPEN_URI, nullptr) != SQLITE_OK) {
    return error((flags & SQLITE_OPEN_READONLY) != 0 ? "open (read-only)" : "open");
  }
  if (sqlite3_busy_timeout(db, kBusyTimeoutMs) != SQLITE_OK) {
    return error("setting the busy timeout");
  }
  return ok_status();
}

Error Database::error(std::string_view what) const {
  std::string message = "tuning DB ";
  message += path.string();
  message += ": ";
  message += what;
  message += ": ";
  message += db != nullptr ? sqlite3_errmsg(db) : "out of memory";
  return make_error(ErrorCode::IoError, std::move(message));
}

Result<Statement> Database::prepare(std::string_view sql) const {
  sqlite3_stmt* stmt = nullptr;
  const int rc = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    std::string what = "preparing '";
    what += sql.substr(0, 60);
    what += "'";
    return error(what);
  }
  return Statement(stmt);
}

Status Database::bound(int rc) const {
  if (rc != SQLITE_OK) return error("binding a parameter");
  return ok_status();
}

Result<int> Database::step(Statement& stmt, std::string_view what) const {
  const auto start = std::chrono::steady_clock::now();
  for (int attempt = 0;; ++attempt) {
    const int rc = sqlite3_step(stmt.get());
    if (rc == SQLITE_ROW || rc == SQLITE_DONE) return rc;
    if (is_busy(rc) && std::chrono::steady_clock::now() - start < kBusyRetryLimit) {
      sqlite3_reset(stmt.get());
      backoff(attempt);
      continue;
    }
    return error(what);
  }
}

Status Database::run(Statement& stmt, std::string_view what) const {
  return each_row(stmt, what, [] {});
}

Status Database::exec(std::string_view sql, std::string_view what) const {
  const std::string text(sql);
  const auto start = std::chrono::steady_clock::now();
  for (int attempt = 0;; ++attempt) {
    const int rc = sqlite3_exec(db, text.c_str(), nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) return ok_status();
    if (is_busy(rc) && std::chrono::steady_clock::now() - start < kBusyRetryLimit) {
      backoff(attempt);
      continue;
    }
    return error(what);
  }
}

Result<std::optional<std::string>> Database::query_text(std::string_view sql,
                                                        std::string_view what) const {
  Result<Statement> stmt = prepare(sql);
  if (!stmt.ok()) return stmt.error();
  Result<int> rc = step(*stmt, what);
  if (!rc.ok()) return rc.error();
  if (rc.value() != SQLITE_ROW) return std::optional<std::string>();
  return std::optional<std::string>(stmt->text_at(0));
}

}  // namespace flashjit::tuning_db
