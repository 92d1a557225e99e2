// Fuzz target: the tuning DB's open / import / merge path (runtime/tuning_store*.cpp) on files
// nobody should trust: random and truncated SQLite files and text-form (.sql) files. Input: one
// byte (bit 0: the text form), then the file's bytes. Per input:
//   - binary: opened read-only (a shipped system DB) and read (entries, results, recorded
//     problems); then a copy opened read-write (migration) and written to;
//   - either form: merged (`flashjit db import` / `db merge`) into a good DB.
// Invariants: every call returns a value or an error with a message; a merge that fails leaves
// the good DB as it was (same choices and rows) and readable.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "fuzz_support.hpp"
#include "runtime/tuning_store.hpp"

using namespace flashjit;
using flashjit::fuzz::checked;
using flashjit::fuzz::require;
using flashjit::fuzz::require_message;
namespace fs = std::filesystem;

namespace {

DeviceFingerprint test_device() {
  DeviceFingerprint device;
  device.backend = "cuda";
  device.name = "Fuzz GPU";
  device.arch = 90;
  device.sm_count = 132;
  device.smem_per_block_optin = 232448;
  device.l2_bytes = 52428800;
  device.driver_version = 13000;
  device.compiler = "nvrtc 13.0";
  return device;
}

ProblemKey test_key(int64_t seqlen) {
  ProblemKey key;
  key.head_dim = 128;
  key.seqlen_q_bucket = key.seqlen_k_bucket = seqlen;
  key.batch_heads_bucket = 32;
  return key;
}

TuneResult timed(const AttentionConfig& config, double ms) {
  TuneResult result;
  result.config = config;
  result.median_ms = result.min_ms = result.max_ms = ms;
  result.repetitions = 10;
  result.tflops = 100 / ms;
  return result;
}

void remove_db(const fs::path& path) {
  std::error_code ignored;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"})
    fs::remove(path.string() + suffix, ignored);
}

void write_file(const fs::path& path, const std::string& bytes) {
  remove_db(path);
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A scratch folder for this process (tmpfs where there is one) and the bytes of a good DB: two
// keys of one device, their rows and choices, written by the store itself.
struct Setup {
  fs::path dir;
  std::string good;
  // The good DB, open across inputs: rewritten from `good` only after a merge that changed it
  // (a failed merge must leave it as it was: checked against `good_contents`).
  std::unique_ptr<TuningStore> store;
  bool changed = true;
  std::string good_contents;
  Setup() {
    const char* base = fs::is_directory("/dev/shm") ? "/dev/shm" : nullptr;
    std::string pattern =
        (base ? fs::path(base) : fs::temp_directory_path()).string() + "/flashjit-fuzz-db-XXXXXX";
    require(mkdtemp(pattern.data()) != nullptr, "cannot create a scratch folder " + pattern);
    dir = pattern;
    // The text form's scratch DB (merge_from) goes to $TMPDIR: here too, off the disk.
    setenv("TMPDIR", dir.c_str(), 1);
    const fs::path path = dir / "template.db";
    {
      auto store = TuningStore::open(path);
      require(store.ok(), "cannot create the good DB");
      for (int64_t seqlen : {1024, 4096}) {
        const AttentionConfig a{128, 64, 4, 2}, b{64, 64, 4, 2};
        require((*store)->record(test_device(), test_key(seqlen), timed(a, 1.0)).ok() &&
                    (*store)->record(test_device(), test_key(seqlen), timed(b, 2.0)).ok() &&
                    (*store)->choose(test_device(), test_key(seqlen), {a, 1.0, 2.0}).ok(),
                "cannot fill the good DB");
      }
    }
    good = read_file(path);
    remove_db(path);
  }
  ~Setup() {
    store.reset();
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

// What a DB holds, for comparing before and after a merge.
std::string contents(const TuningStore& store) {
  std::string text;
  const auto entries = store.entries();
  require(entries.ok(),
          "the good DB is unreadable: " + (entries.ok() ? "" : entries.error().message));
  for (const auto& entry : *entries) {
    text += entry.device + " " + entry.generator + " " + entry.key.to_string() + " " +
            entry.choice.config.to_string() + "\n";
  }
  const auto rows = store.result_entries();
  require(rows.ok(), "the good DB's rows are unreadable");
  for (const auto& row : *rows)
    text += row.key.to_string() + " " + row.result.config.to_string() + "\n";
  return text;
}

void read_everything(const TuningStore& store) {
  const auto entries = store.entries();
  if (!checked(entries, "entries")) return;
  const auto rows = store.result_entries();
  if (!checked(rows, "result_entries")) return;
  for (const auto& entry : *entries) (void)entry.key.to_string();
  (void)checked(store.recorded_problems(test_device()), "recorded_problems");
  (void)checked(store.choice(test_device(), test_key(1024)), "choice");
  (void)checked(store.nearest_choice(test_device(), test_key(2048)), "nearest_choice");
  (void)checked(store.results(test_device(), test_key(1024)), "results");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Setup setup;
  if (size == 0) return 0;
  const bool text = (data[0] & 1) != 0;
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const fs::path input = setup.dir / (text ? "input.sql" : "input.db");
  write_file(input, bytes);

  if (!text) {
    if (auto store = TuningStore::open_read_only(input); checked(store, "open_read_only")) {
      read_everything(**store);
    }
    // Read-write: a version-1 file is migrated in place, so on a copy.
    const fs::path copy = setup.dir / "copy.db";
    write_file(copy, bytes);
    if (auto store = TuningStore::open(copy); checked(store, "open")) {
      read_everything(**store);
      const AttentionConfig config{128, 64, 4, 2};
      (void)checked((*store)->record(test_device(), test_key(1024), timed(config, 1.0)), "record");
      (void)checked((*store)->choose(test_device(), test_key(1024), {config, 1.0, 1.0}), "choose");
    }
    remove_db(copy);
  }

  if (setup.changed) {
    const fs::path good = setup.dir / "good.db";
    setup.store.reset();
    write_file(good, setup.good);
    auto store = TuningStore::open(good);
    require(store.ok(), "the good DB does not open");
    setup.store = std::move(store.value());
    if (setup.good_contents.empty()) setup.good_contents = contents(*setup.store);
    setup.changed = false;
  }
  const Status merged = setup.store->merge_from(input);
  if (checked(merged, "merge_from")) {
    setup.changed = true;
    (void)checked(setup.store->entries(), "entries after a merge");
  } else {
    require(contents(*setup.store) == setup.good_contents,
            "a failed merge changed the DB: " + merged.error().message);
  }
  remove_db(input);
  return 0;
}
