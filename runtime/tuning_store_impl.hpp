// What runtime/tuning_store.cpp and runtime/tuning_store_recorded.cpp share (internal): the
// store's connection and the helpers both write rows with.
#pragma once

#include <cstdint>
#include <string>

#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/device_fingerprint.hpp"
#include "runtime/tuning_store.hpp"
#include "runtime/tuning_store_sqlite.hpp"

namespace flashjit {

struct TuningStore::Impl : tuning_db::Database {};

namespace tuning_db {

// "now" in UTC with milliseconds; text of this one format sorts chronologically.
inline constexpr const char* kNowSql = "strftime('%Y-%m-%d %H:%M:%f','now')";

// The deterministic column: the flag of a backward key (a forward key has none).
inline int64_t deterministic_column(Pass pass, bool deterministic) {
  return pass == Pass::Backward && deterministic ? 1 : 0;
}

// Inserts the device's row unless present (inside the caller's transaction).
Status record_device(const Database& impl, const DeviceFingerprint& device);

}  // namespace tuning_db
}  // namespace flashjit
