// The tuning store's schema (internal to runtime/tuning_store*.cpp): the current version's tables,
// the column lists the statements share, and the way older files are read.
//
// Version 2 (this build) keys every row by the pass ('fwd' | 'bwd') and the deterministic flag
// (0 | 1, 1 only for 'bwd') as well; version 1 (flashjit releases up to commit 9131e12) had
// forward rows only. docs/TUNING_DB.md documents both and the migration.
#pragma once

#include <string>

#include "generator/error.hpp"
#include "runtime/tuning_store_sqlite.hpp"

namespace flashjit::tuning_db {

inline constexpr int kSchemaVersion = 2;

// Column lists of the v2 tables, in their order (merge copies rows column by column).
inline constexpr const char* kResultColumns =
    "device, generator, pass, deterministic, head_dim, dtype, causal, group_size, "
    "seqlen_q_bucket, seqlen_k_bucket, batch_heads_bucket, config, block_m, block_n, warps, "
    "stages, status, median_ms, min_ms, max_ms, repetitions, tflops, is_default, message, "
    "recorded_at";
inline constexpr const char* kChoiceColumns =
    "device, generator, pass, deterministic, head_dim, dtype, causal, group_size, "
    "seqlen_q_bucket, seqlen_k_bucket, batch_heads_bucket, config, median_ms, default_ms, "
    "chosen_at";
inline constexpr const char* kRecordedColumns =
    "device, pass, deterministic, head_dim, dtype, causal, batch, heads_q, heads_kv, seqlen_q, "
    "seqlen_k, uses, first_seen, last_seen";
inline constexpr const char* kRecordedKey =
    "device, pass, deterministic, head_dim, dtype, causal, batch, heads_q, heads_kv, seqlen_q, "
    "seqlen_k";
inline constexpr const char* kDeviceColumns =
    "device, backend, name, arch, sm_count, smem_per_block_optin, l2_bytes, driver_version, "
    "compiler";
// The key of results and choices ("device = ? AND ... AND batch_heads_bucket = ?"): the order
// in which bind_key binds it.
inline constexpr const char* kKeyWhere =
    "device = ? AND generator = ? AND pass = ? AND deterministic = ? AND head_dim = ? AND "
    "dtype = ? AND causal = ? AND group_size = ? AND seqlen_q_bucket = ? AND "
    "seqlen_k_bucket = ? AND batch_heads_bucket = ?";

// "l.device = r.device AND ..." over the key columns of results/choices (+ config).
std::string key_match(const char* left, const char* right, bool with_config);

// For a read-write open, in one BEGIN IMMEDIATE transaction: creates the schema in a new (or
// empty) file; migrates a version-1 file to version 2 (every row kept, as pass 'fwd' and
// deterministic 0); leaves a version-2 file as it is. Any other version is Unsupported, and on
// any error the file is unchanged. Concurrent openers serialize on the transaction: the first
// migrates, the others find version 2.
Status prepare_for_writing(const Database& db);

// The schema version of `schema` ("main", or an attached "other"): 1 or 2. IoError when the file
// has no version (not a flashjit tuning database), Unsupported for a version this build does not
// read (a newer flashjit wrote it).
Result<int> schema_version(const Database& db, const char* schema);

// A version-1 file opened read-only (a shipped system DB): temporary views named results,
// choices and recorded_problems that show its rows as version-2 rows (pass 'fwd',
// deterministic 0). Unqualified names find the temp schema first, so every query of the store
// reads the file unchanged. The file is not written.
Status serve_version_1(const Database& db);

// The rows of `schema`.`table` (results, choices or recorded_problems) with the version-2
// columns, for a FROM clause: the table itself, or for a version-1 file a subquery that adds pass
// 'fwd' and deterministic 0.
std::string rows_as_version_2(const char* schema, const char* table, int version);

}  // namespace flashjit::tuning_db
