// The tuning store's schema (internal to runtime/tuning_store*.cpp): the current version's tables,
// the column lists the statements share, and the way older files are read.
//
// Version 3 (this build) keys every row by the K/V cache layout (page_size, seqlens_k) and the
// attention variant (Variant::key(), '' for plain attention) as well; version 2 keyed rows by the
// pass ('fwd' | 'bwd') and the deterministic flag (0 | 1, 1 only for 'bwd') but had plain,
// contiguous problems only; version 1 (flashjit releases up to commit 9131e12) had forward rows
// only. docs/TUNING_DB.md documents them and the migrations.
#pragma once

#include <string>

#include "generator/error.hpp"
#include "runtime/tuning_store_sqlite.hpp"

namespace flashjit::tuning_db {

inline constexpr int kSchemaVersion = 3;

// Column lists of the v3 tables, in their order (merge copies rows column by column).
inline constexpr const char* kResultColumns =
    "device, generator, pass, deterministic, head_dim, dtype, causal, group_size, "
    "seqlen_q_bucket, seqlen_k_bucket, batch_heads_bucket, page_size, seqlens_k, variant, "
    "config, block_m, block_n, warps, stages, status, median_ms, min_ms, max_ms, repetitions, "
    "tflops, is_default, message, recorded_at";
inline constexpr const char* kChoiceColumns =
    "device, generator, pass, deterministic, head_dim, dtype, causal, group_size, "
    "seqlen_q_bucket, seqlen_k_bucket, batch_heads_bucket, page_size, seqlens_k, variant, "
    "config, median_ms, default_ms, chosen_at";
// The problem part of a results/choices key, in the order key_at (tuning_store.cpp) reads it.
inline constexpr const char* kProblemKeyColumns =
    "pass, deterministic, head_dim, dtype, causal, group_size, seqlen_q_bucket, seqlen_k_bucket, "
    "batch_heads_bucket, page_size, seqlens_k, variant";
// recorded_problems: `variant` is the key (Variant::key()), `variant_spec` the whole variant
// (user expressions as written, varlen totals: tuning_store_recorded.cpp) that a replay needs.
inline constexpr const char* kRecordedColumns =
    "device, pass, deterministic, head_dim, dtype, causal, batch, heads_q, heads_kv, seqlen_q, "
    "seqlen_k, page_size, seqlens_k, variant, variant_spec, uses, first_seen, last_seen";
inline constexpr const char* kRecordedKey =
    "device, pass, deterministic, head_dim, dtype, causal, batch, heads_q, heads_kv, seqlen_q, "
    "seqlen_k, page_size, seqlens_k, variant";
inline constexpr const char* kDeviceColumns =
    "device, backend, name, arch, sm_count, smem_per_block_optin, l2_bytes, driver_version, "
    "compiler";
// The key of results and choices ("device = ? AND ... AND variant = ?"): the order in which
// bind_key binds it.
inline constexpr const char* kKeyWhere =
    "device = ? AND generator = ? AND pass = ? AND deterministic = ? AND head_dim = ? AND "
    "dtype = ? AND causal = ? AND group_size = ? AND seqlen_q_bucket = ? AND "
    "seqlen_k_bucket = ? AND batch_heads_bucket = ? AND page_size = ? AND seqlens_k = ? AND "
    "variant = ?";
// The same without the three buckets (the nearest-bucket scan): device, generator, pass,
// deterministic, head_dim, dtype, causal, group_size, page_size, seqlens_k, variant.
inline constexpr const char* kKeyWhereButBuckets =
    "device = ? AND generator = ? AND pass = ? AND deterministic = ? AND head_dim = ? AND "
    "dtype = ? AND causal = ? AND group_size = ? AND page_size = ? AND seqlens_k = ? AND "
    "variant = ?";

// "l.device = r.device AND ..." over the key columns of results/choices (+ config).
std::string key_match(const char* left, const char* right, bool with_config);

// For a read-write open, in one BEGIN IMMEDIATE transaction: creates the schema in a new (or
// empty) file; migrates a version-1 or version-2 file to version 3 (every row kept; a version-1
// row as pass 'fwd' and deterministic 0; every row as contiguous K/V without seqlens_k and no
// variant: page_size 0, seqlens_k 0, variant ''); leaves a version-3 file as it is. Any other
// version is Unsupported, and on any error the file is unchanged. Concurrent openers serialize on
// the transaction: the first migrates, the others find version 3.
Status prepare_for_writing(const Database& db);

// The schema version of `schema` ("main", or an attached "other"): 1, 2 or 3. IoError when the
// file has no version (not a flashjit tuning database), Unsupported for a version this build does
// not read (a newer flashjit wrote it).
Result<int> schema_version(const Database& db, const char* schema);

// An older (version-1 or -2) file opened read-only (a shipped system DB): temporary views named
// results, choices and recorded_problems that show its rows as version-3 rows
// (rows_as_current). Unqualified names find the temp schema first, so every query of the store
// reads the file unchanged. The file is not written.
Status serve_older_version(const Database& db, int version);

// The rows of `schema`.`table` (results, choices or recorded_problems) with the version-3
// columns, for a FROM clause: the table itself, or for an older file a subquery that adds the
// columns it lacks (version 1: pass 'fwd' and deterministic 0; both: page_size 0, seqlens_k 0,
// variant '', variant_spec '').
std::string rows_as_current(const char* schema, const char* table, int version);
// "<insert> (<columns>) SELECT <columns> FROM <from>": copies rows between tables alike.
std::string copy_rows_sql(const char* insert, const char* columns, const std::string& from);

}  // namespace flashjit::tuning_db
