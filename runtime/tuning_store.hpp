// The tuning database (SQLite): measured configs per device and problem, and the chosen one.
//
// Users run `flashjit tune` per machine and ship the file to identical machines. Rows are keyed by
// a device fingerprint, the generator version and a problem key (the pass: forward, backward or
// deterministic backward; exact head dim, dtype, causal, GQA ratio; seqlens and batch*heads in
// power-of-two buckets; the K/V cache layout and the attention variant). Rows whose fingerprint or
// generator version differs from the caller's are kept but never used for selection.
//
// Durability: WAL mode, one transaction per recorded result, busy timeout: a killed tuner loses no
// finished result, and several tuner processes may write one file at once.
// The schema (version 3; version-1 and -2 files of older releases are migrated when opened
// read-write and read as plain rows when opened read-only) is documented in docs/TUNING_DB.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/device_fingerprint.hpp"

namespace flashjit {

// DeviceFingerprint (what identifies "an identical machine") is in runtime/device_fingerprint.hpp.

// Power-of-two bucket of a positive size: the smallest 2^k >= value (1 -> 1, 1000 -> 1024).
int64_t size_bucket(int64_t value);

// The part of a problem that tuning results are keyed by.
struct ProblemKey {
  Pass pass = Pass::Forward;
  bool deterministic = false;  // backward only (AttentionProblem::deterministic)
  int head_dim = 0;
  DType dtype = DType::BF16;
  bool causal = false;
  int64_t group_size = 1;          // heads_q / heads_kv
  int64_t seqlen_q_bucket = 0;     // size_bucket(seqlen_q)
  int64_t seqlen_k_bucket = 0;     // size_bucket(seqlen_k)
  int64_t batch_heads_bucket = 0;  // size_bucket(batch * heads_q)
  // The K/V cache layout (AttentionProblem::kv): keys per page (0: contiguous), per-sequence
  // lengths. Matched exactly, the nearest-bucket scan included.
  int page_size = 0;
  bool seqlens_k = false;
  // The attention variant (Variant::key(); "" for plain attention), matched exactly.
  std::string variant;

  // The generator version the key's rows on `device` are stamped with and checked against
  // (generator/render.hpp): variant_generator_version_of(device, pass) for a variant,
  // decode_generator_version_of(device) for a key a decode config may serve (may_run_decode),
  // generator_version_of(device, pass) for the other plain keys; so that a change to variant
  // code stales only variant rows, a change to the backward's templates only backward rows, and
  // a change to decode kernels only the keys they may serve.
  const std::string& generator_version(std::string_view device) const;
  // A plain forward key with a paged cache, per-sequence lengths or at most kMaxDecodeSeqlenQ
  // queries (its bucket): the problems is_decode_problem may give -decode configs (whatever their
  // seqlen_k, which the bucket does not pin down).
  bool may_run_decode() const;

  static ProblemKey of(const AttentionProblem& problem);
  // "fwd", "bwd" or "bwd-det": which operation the key's rows are for.
  const char* pass_name() const;
  // "d128 bf16 causal g1 q4096 k4096 bh64" (forward), "bwd d128 ..." / "bwd-det d128 ..."
  std::string to_string() const;
  bool operator==(const ProblemKey&) const = default;
};

enum class TuneStatus { Timed, CompileFailed, LaunchFailed, WrongResult };
const char* to_string(TuneStatus status);  // "timed", "compile-failed", ...

// One measured (or failed) config for one key.
struct TuneResult {
  AttentionConfig config;
  TuneStatus status = TuneStatus::Timed;
  double median_ms = 0;  // Timed only
  double min_ms = 0;
  double max_ms = 0;
  int repetitions = 0;
  double tflops = 0;
  bool is_default = false;  // the SRAM-formula default config
  std::string message;      // why it failed, or notes
};

// The tuner's decision for one key: the config to serve and what it measured.
struct TuneChoice {
  AttentionConfig config;
  double median_ms = 0;
  double default_ms = 0;  // the default config's median on the same key (0 if unknown)
};

// How attention() found its config.
enum class ChoiceSource { Exact, NearestBucket, Default };

class TuningStore {
 public:
  // Opens (creating if needed) a read-write database. A version-1 or -2 file (an older
  // release's) is migrated to version 3 in place, in one transaction, its rows becoming plain
  // (version 1: forward) rows; a newer version is Unsupported. IoError names the path and
  // SQLite's message.
  static Result<std::unique_ptr<TuningStore>> open(const std::filesystem::path& path);
  // Opens a read-only database (a shipped system DB); NotFound if the file does not exist. A
  // version-1 or -2 file is read as it is (its rows are plain rows), not migrated.
  static Result<std::unique_ptr<TuningStore>> open_read_only(const std::filesystem::path& path);
  ~TuningStore();

  const std::filesystem::path& path() const;

  // Inserts or replaces the row for (device, key.generator_version(device), key, result.config), in
  // its own transaction: once this returns ok, the row survives a kill -9.
  Status record(const DeviceFingerprint& device, const ProblemKey& key, const TuneResult& result);
  // Inserts or replaces the choice for (device, generator version, key).
  Status choose(const DeviceFingerprint& device, const ProblemKey& key, const TuneChoice& choice);

  // All rows for this device + the key's current generator version + key (resume: skip configs
  // present).
  Result<std::vector<TuneResult>> results(const DeviceFingerprint& device,
                                          const ProblemKey& key) const;
  // The choice for exactly this key, if any.
  Result<std::optional<TuneChoice>> choice(const DeviceFingerprint& device,
                                           const ProblemKey& key) const;
  // The choice of the nearest key with the same pass, deterministic flag, head_dim, dtype, causal,
  // group_size, K/V layout and variant: distance is the sum of |log2| differences of the three
  // buckets; ties go to the larger buckets.
  Result<std::optional<std::pair<ProblemKey, TuneChoice>>> nearest_choice(
      const DeviceFingerprint& device, const ProblemKey& key) const;

  // For `flashjit db ...`: every choice (all devices and versions, newest first), and maintenance.
  struct Entry {
    std::string device;     // DeviceFingerprint::to_string()
    std::string generator;  // generator version
    ProblemKey key;
    TuneChoice choice;
    bool current = false;  // generator == key.generator_version(device)
  };
  Result<std::vector<Entry>> entries() const;
  // Copies every row and choice of `other` into this DB (newer rows win on conflict), then
  // re-stamps rows of an older scheme's stamp as open() does. `other` is a tuning DB file, or its
  // text form when its name ends in ".sql" (export_to).
  Status merge_from(const std::filesystem::path& other);
  // Deletes everything, or only rows not from this build's generator version of their kind
  // (ProblemKey::generator_version; stale == true).
  Status clear(bool stale_only);

  // --- Added for the runtime and `flashjit db` (not in the first draft of this header). ---

  // Every results row, all devices and versions (`key` set: only that key), sorted by device,
  // generator, key, then timed rows by median. For `flashjit db show`.
  struct ResultEntry {
    std::string device;     // DeviceFingerprint::to_string()
    std::string generator;  // generator version
    ProblemKey key;
    TuneResult result;
    std::string recorded_at;  // UTC, "2026-11-22 10:31:07.123"
    bool current = false;     // generator == key.generator_version(device)
  };
  Result<std::vector<ResultEntry>> result_entries(
      const std::optional<ProblemKey>& key = std::nullopt) const;

  // Notes that `problem` was served untuned (nearest bucket or default) on `device`, so that
  // `flashjit tune --recorded` can tune it later: one row per pass, deterministic flag, exact
  // problem shape, K/V layout and variant (BSHD strides are assumed for the replay), with a use
  // count (runtime/tuning_store_recorded.cpp).
  Status record_miss(const DeviceFingerprint& device, const AttentionProblem& problem);
  // The recorded problems of `device`, most used first, with their pass, deterministic flag,
  // K/V layout (a paged cache: batch * pages-per-sequence pages) and variant (varlen: the recorded
  // totals), in BSHD layout with the default scale.
  Result<std::vector<AttentionProblem>> recorded_problems(const DeviceFingerprint& device) const;

  // A consistent single-file copy (VACUUM INTO, then journal_mode=DELETE so that the copy can
  // be shipped and opened read-only); for a name ending in ".sql" the text form instead (the
  // rows of devices, results and choices as one INSERT a line, sorted by key: what the
  // repository keeps of the shipped DBs, runtime/tuning_store_text.hpp). InvalidArgument if
  // `file` exists.
  Status export_to(const std::filesystem::path& file) const;

 private:
  struct Impl;
  explicit TuningStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashjit
