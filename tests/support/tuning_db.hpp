// Tuning-DB helpers for tests: plain-SQL access to a DB file (to check what the store wrote, or
// to set up a file as another program would have), the devices a file holds, and the fixture
// written by older releases (tests/fixtures/tuning_db_v1.db and _v2.db, see
// tests/fixtures/README.md).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/device_fingerprint.hpp"

namespace flashjit::testing {

// Runs `sql` on the file with the plain SQLite API (creating the file if needed) and returns the
// first column of every row as text ("NULL" for a null); a failing statement is a test failure
// naming the SQL and SQLite's message.
std::vector<std::string> query(const std::filesystem::path& path, const std::string& sql);

// The devices table of a tuning DB as fingerprints (its columns are the fingerprint's parts).
std::vector<DeviceFingerprint> devices_of(const std::filesystem::path& path);

// tests/fixtures/tuning_db_v1.db in the source tree: a schema-version-1 DB written by
// `flashjit tune` and `flashjit run` of commit 9131e12 on the CPU backend. Copy it before
// opening it read-write (that migrates it).
std::filesystem::path tuning_db_v1_fixture();
// tests/fixtures/tuning_db_v2.db: a schema-version-2 DB (forward and backward rows, no K/V
// layout or variant columns) of the decode branch at commit 8af5e71. Copy it before opening it
// read-write.
std::filesystem::path tuning_db_v2_fixture();
// data/tuning in the source tree: the text form of the shipped tuning DBs (*.sql).
std::filesystem::path shipped_tuning_db_dir();

}  // namespace flashjit::testing
