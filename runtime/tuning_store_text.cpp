// The text form of a tuning DB: see runtime/tuning_store_text.hpp.
#include "runtime/tuning_store_text.hpp"

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#include "runtime/tuning_store_schema.hpp"

namespace flashjit::tuning_db {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kHeader = "-- flashjit tuning DB, text form; schema_version ";

// The tables of the text form, in file order, with their columns and sort order (primary key).
struct Table {
  const char* name;
  const char* columns;
  const char* order;
};
// The primary key's order (plain rows, all page_size 0, seqlens_k 0 and variant '', keep the
// order of version 2).
constexpr const char* kKeyOrder =
    "device, generator, pass, deterministic, head_dim, dtype, causal, group_size, page_size, "
    "seqlens_k, variant, seqlen_q_bucket, seqlen_k_bucket, batch_heads_bucket";
// The oldest text form this build reads: version 2's lines name their columns, and the columns
// version 3 added (page_size, seqlens_k, variant) take their defaults, those of a plain row.
constexpr int kOldestTextVersion = 2;
const Table kTables[] = {
    {"devices", kDeviceColumns, "device"},
    {"results", kResultColumns, nullptr},  // key order + config
    {"choices", kChoiceColumns, kKeyOrder},
};

std::string order_of(const Table& table) {
  if (table.order != nullptr) return table.order;
  std::string order = kKeyOrder;
  order += ", config";
  return order;
}

// A SQL literal of column `i` of the current row: integers and reals exactly (%.17g), text quoted
// with newlines as char(10) / char(13) so that a row stays on one line.
std::string literal(sqlite3_stmt* stmt, int i) {
  char number[40];
  switch (sqlite3_column_type(stmt, i)) {
    case SQLITE_INTEGER:
      std::snprintf(number, sizeof number, "%" PRId64,
                    static_cast<int64_t>(sqlite3_column_int64(stmt, i)));
      return number;
    case SQLITE_FLOAT:
      std::snprintf(number, sizeof number, "%.17g", sqlite3_column_double(stmt, i));
      return number;
    case SQLITE_NULL:
      return "NULL";
    default: {
      const unsigned char* text = sqlite3_column_text(stmt, i);
      const std::string_view value(reinterpret_cast<const char*>(text),
                                   static_cast<size_t>(sqlite3_column_bytes(stmt, i)));
      std::string out = "'";
      for (char c : value) {
        if (c == '\'') {
          out += "''";
        } else if (c == '\n') {
          out += "' || char(10) || '";
        } else if (c == '\r') {
          out += "' || char(13) || '";
        } else {
          out += c;
        }
      }
      out += "'";
      return out;
    }
  }
}

Error line_error(const fs::path& file, size_t line, std::string_view what) {
  std::string message = "text tuning DB ";
  message += file.string();
  message += ":";
  message += std::to_string(line);
  message += ": ";
  message.append(what);
  return make_error(ErrorCode::InvalidArgument, std::move(message));
}

}  // namespace

bool is_text_db(const fs::path& path) { return path.extension() == ".sql"; }

Status write_text(const Database& db, const fs::path& file) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) {
    return make_error(ErrorCode::IoError, "text tuning DB " + file.string() + ": cannot write");
  }
  out << kHeader << kSchemaVersion << "\n"
      << "-- The rows of devices, results and choices (docs/TUNING_DB.md), one per line, sorted\n"
      << "-- by key. Build a DB from it: flashjit db merge OUT.db FILE.sql\n";
  for (const Table& table : kTables) {
    std::string sql = "SELECT ";
    sql += table.columns;
    sql += " FROM ";
    sql += table.name;
    sql += " ORDER BY ";
    sql += order_of(table);
    Result<Statement> stmt = db.prepare(sql);
    if (!stmt.ok()) return stmt.error();
    const int columns = sqlite3_column_count(stmt->get());
    while (true) {
      Result<int> rc = db.step(*stmt, "reading rows to export");
      if (!rc.ok()) return rc.error();
      if (*rc != SQLITE_ROW) break;
      out << "INSERT INTO " << table.name << " (" << table.columns << ") VALUES (";
      for (int i = 0; i < columns; ++i) out << (i ? ", " : "") << literal(stmt->get(), i);
      out << ");\n";
    }
  }
  out.close();
  if (!out) {
    return make_error(ErrorCode::IoError, "text tuning DB " + file.string() + ": write failed");
  }
  return ok_status();
}

namespace {

// A line of the text form is one INSERT of literals: at most 98 SQLite VM instructions in the
// shipped files (data/tuning/*.sql, 9,074 lines, SQLite 3.40). Any INSERT passes the line check,
// though, including one that selects from a recursive CTE that never ends; SQLite interrupts a
// statement past this many instructions (the line's error then says so): 1 million, 10,000
// times what a line needs and ~20 ms of a core (10 million until issue 33: ~0.2 s per bad line,
// ~1 s under ASan, a third of the tuning_db fuzz target's time went to such inputs).
constexpr int kProgressStep = 1000;       // instructions between progress callbacks
constexpr int kMaxProgressSteps = 1'000;  // 1 million instructions per line

struct LineBudget {
  int steps = 0;
  static int tick(void* self) {
    return ++static_cast<LineBudget*>(self)->steps > kMaxProgressSteps;
  }
};

// Installs the budget on `db` for the life of this object.
class ProgressGuard {
 public:
  ProgressGuard(sqlite3* db, LineBudget& budget) : db_(db) {
    sqlite3_progress_handler(db_, kProgressStep, &LineBudget::tick, &budget);
  }
  ~ProgressGuard() { sqlite3_progress_handler(db_, 0, nullptr, nullptr); }
  ProgressGuard(const ProgressGuard&) = delete;
  ProgressGuard& operator=(const ProgressGuard&) = delete;

 private:
  sqlite3* db_;
};

}  // namespace

Status read_text(const Database& db, const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::error_code ec;
    return make_error(fs::exists(file, ec) ? ErrorCode::IoError : ErrorCode::NotFound,
                      "text tuning DB " + file.string() +
                          (fs::exists(file, ec) ? ": cannot read" : ": no such file"));
  }
  std::string line;
  size_t number = 0;
  if (!std::getline(in, line) || line.compare(0, kHeader.size(), kHeader) != 0) {
    return line_error(
        file, 1,
        "not a text tuning DB (the first line must start with '" + std::string(kHeader) + "')");
  }
  ++number;
  const std::string version = line.substr(kHeader.size());
  bool known_version = false;
  for (int v = kOldestTextVersion; v <= kSchemaVersion; ++v)
    known_version = known_version || version == std::to_string(v);
  if (!known_version) {
    return make_error(ErrorCode::Unsupported,
                      "text tuning DB " + file.string() + ": schema_version " + version +
                          "; this build reads versions " + std::to_string(kOldestTextVersion) +
                          " to " + std::to_string(kSchemaVersion));
  }
  Transaction transaction(db);
  FLASHJIT_TRY(transaction.begin());
  LineBudget budget;
  const ProgressGuard guard(db.db, budget);
  while (std::getline(in, line)) {
    budget.steps = 0;
    ++number;
    if (line.empty() || line.compare(0, 2, "--") == 0) continue;
    bool known = false;
    for (const Table& table : kTables) {
      const std::string prefix = std::string("INSERT INTO ") + table.name + " (";
      known = known || line.compare(0, prefix.size(), prefix) == 0;
    }
    if (!known || line.size() < 2 || line.compare(line.size() - 2, 2, ");") != 0) {
      return line_error(file, number,
                        "expected a comment or one 'INSERT INTO devices|results|choices (...) "
                        "VALUES (...);' on one line");
    }
    sqlite3_stmt* raw = nullptr;
    const char* tail = nullptr;
    const int rc =
        sqlite3_prepare_v2(db.db, line.c_str(), static_cast<int>(line.size()), &raw, &tail);
    Statement stmt(raw);
    if (rc != SQLITE_OK) return line_error(file, number, sqlite3_errmsg(db.db));
    if (tail != nullptr && std::string_view(tail).find_first_not_of(" \t") != std::string::npos) {
      return line_error(file, number, "more than one statement on the line");
    }
    if (sqlite3_step(stmt.get()) != SQLITE_DONE) {
      if (budget.steps > kMaxProgressSteps) {
        return line_error(file, number,
                          "the statement ran past " +
                              std::to_string(int64_t{kMaxProgressSteps} * kProgressStep) +
                              " SQLite instructions (one INSERT of values is expected)");
      }
      return line_error(file, number, sqlite3_errmsg(db.db));
    }
  }
  return transaction.commit();
}

}  // namespace flashjit::tuning_db
