// Tuning-DB helpers for tests: see tuning_db.hpp.
#include "support/tuning_db.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

namespace flashjit::testing {

namespace fs = std::filesystem;

namespace {

// Runs `sql` and calls `row(stmt)` for every row.
template <typename Row>
void for_each_row(const fs::path& path, const std::string& sql, Row&& row) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr),
            SQLITE_OK)
      << path;
  sqlite3_busy_timeout(db, 10000);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK)
      << sql << ": " << sqlite3_errmsg(db);
  int rc = 0;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) row(stmt);
  EXPECT_EQ(rc, SQLITE_DONE) << sql << ": " << sqlite3_errmsg(db);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

std::string text_at(sqlite3_stmt* stmt, int column) {
  const unsigned char* text = sqlite3_column_text(stmt, column);
  return text ? reinterpret_cast<const char*>(text) : "NULL";
}

}  // namespace

std::vector<std::string> query(const fs::path& path, const std::string& sql) {
  std::vector<std::string> rows;
  for_each_row(path, sql, [&](sqlite3_stmt* stmt) { rows.push_back(text_at(stmt, 0)); });
  return rows;
}

std::vector<DeviceFingerprint> devices_of(const fs::path& path) {
  std::vector<DeviceFingerprint> devices;
  for_each_row(path,
               "SELECT backend, name, arch, sm_count, smem_per_block_optin, l2_bytes, "
               "driver_version, compiler, device FROM devices ORDER BY device",
               [&](sqlite3_stmt* stmt) {
                 DeviceFingerprint device;
                 device.backend = text_at(stmt, 0);
                 device.name = text_at(stmt, 1);
                 device.arch = sqlite3_column_int(stmt, 2);
                 device.sm_count = sqlite3_column_int(stmt, 3);
                 device.smem_per_block_optin = sqlite3_column_int(stmt, 4);
                 device.l2_bytes = sqlite3_column_int(stmt, 5);
                 device.driver_version = sqlite3_column_int(stmt, 6);
                 device.compiler = text_at(stmt, 7);
                 EXPECT_EQ(device.to_string(), text_at(stmt, 8))
                     << "the devices row does not print as its own key";
                 devices.push_back(device);
               });
  return devices;
}

fs::path tuning_db_v1_fixture() { return fs::path(FLASHJIT_TEST_FIXTURES_DIR) / "tuning_db_v1.db"; }
fs::path shipped_tuning_db_dir() {
  return fs::path(FLASHJIT_TEST_FIXTURES_DIR).parent_path().parent_path() / "data" / "tuning";
}
fs::path tuning_db_v2_fixture() { return fs::path(FLASHJIT_TEST_FIXTURES_DIR) / "tuning_db_v2.db"; }

}  // namespace flashjit::testing
