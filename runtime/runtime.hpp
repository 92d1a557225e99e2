// The public entry point: a Runtime serves ready attention kernels.
//
//   auto runtime = flashjit::Runtime::create();            // picks the CUDA device 0
//   auto problem = flashjit::AttentionProblem::make(2, 16, 16, 4096, 4096, 128,
//                                                   flashjit::DType::BF16, /*causal=*/true);
//   auto kernel = (*runtime)->attention(problem);          // compiled or loaded from the cache
//   (*kernel)->launch(problem, {q, k, v, o, lse}, stream);
//
// Config selection (attention(problem)), first match wins:
//   1. the in-memory selection for the problem's ProblemKey (one lookup per key per Runtime);
//   2. the exact key's choice in the user tuning DB, then in each system DB (in order);
//   3. tune_on_miss with a tune hook installed: the hook's config (it tunes and records it);
//   4. the nearest bucket's choice in the user DB, then in the system DBs;
//   5. default_config (the SRAM formula).
// Only rows of this device fingerprint and this build's generator version are used. A missing,
// unreadable or corrupt DB is skipped (logged with FLASHJIT_LOG=1), so attention() never fails
// for a valid problem because of a DB. Problems served by 4 or 5 are recorded in the user DB
// (record_misses) for `flashjit tune --recorded`.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "generator/config.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "runtime/binary_cache.hpp"
#include "runtime/device_fingerprint.hpp"
#include "runtime/tuning_store.hpp"

namespace flashjit {

// The user tuning DB when none is given: $FLASHJIT_DB, else $XDG_DATA_HOME/flashjit/tuning.db,
// else ~/.local/share/flashjit/tuning.db; nullopt when disabled (FLASHJIT_DB set to "" or
// "none") or when there is no home directory.
std::optional<std::filesystem::path> default_user_db();
// The folder of the tuning DBs shipped with this build (read-only system DBs): the path the build
// names relative to the folder of the binary holding the runtime (the shared library or Python
// module; for a program linked statically, the program itself): share/flashjit/tuning/ beside
// bin/ in an installed tree, tuning/ in the Python package. nullopt when it does not exist (a
// build tree, a program linked statically outside the prefix's bin/).
std::optional<std::filesystem::path> shipped_tuning_dir();
// The system DBs: $FLASHJIT_SYSTEM_DB split at ':' (empty parts dropped; "none": no system DB)
// when set, else shipped_tuning_dir() (when it exists). A folder stands for its *.db files.
std::vector<std::filesystem::path> default_system_dbs();
// True when the environment variable is set to a non-empty value other than "0".
bool env_flag(const char* name);
// $FLASHJIT_BACKEND if set and non-empty, else "auto".
std::string default_backend_name();

// True when this build has the CPU backend (LLVM/Clang 14 were found at build time).
bool have_cpu_backend();
// True when this build has the HIP backend (the ROCm headers were found at build time).
bool have_hip_backend();
// GPUs of `backend` ("cuda" or "hip"); 0 without a driver/runtime, or for other names.
int gpu_device_count(const std::string& backend);

// The backend `name` ("auto", "cuda", "hip", "cpu") resolves to: auto = CUDA if a CUDA device
// exists, else HIP if built in and AMD GPU 0 is one it supports, else the CPU if built in, else
// error NoDevice. Forced names are not probed here. Error InvalidArgument for other names;
// Unsupported for "cpu" or "hip" in a build without that backend.
Result<std::string> resolve_backend(const std::string& name);
// The backend itself: CUDA or HIP device `device`, or the host CPU.
Result<std::unique_ptr<Backend>> create_backend(const std::string& name, int device = 0);

struct RuntimeOptions {
  // "auto" (CUDA if a device exists, else an AMD GPU through HIP, else the CPU if built in),
  // "cuda", "hip" or "cpu". $FLASHJIT_BACKEND.
  std::string backend = default_backend_name();
  int device = 0;                                  // CUDA or HIP device ordinal
  std::optional<std::filesystem::path> cache_dir;  // default: BinaryCache::default_dir()
  bool use_disk_cache = true;
  // The read-write tuning DB, consulted first and written by record_misses and the tuner.
  // nullopt: default_user_db(); "" or "none": no user DB. Created (with its directory) if
  // missing; if it cannot be opened, the runtime goes on without it.
  std::optional<std::filesystem::path> user_db;
  // Read-only tuning DBs (shipped with the package or a system), consulted after the user DB, in
  // order; a folder stands for its *.db files in name order.
  std::vector<std::filesystem::path> system_dbs = default_system_dbs();
  // Call the tune hook (Runtime::set_tune_hook) on a miss of the exact key. $FLASHJIT_TUNE=1.
  bool tune_on_miss = env_flag("FLASHJIT_TUNE");
  // Record problems served by the nearest bucket or the default in the user DB.
  bool record_misses = true;
  // Log each selection (source, key, config) and each DB problem to stderr. $FLASHJIT_LOG=1.
  bool log = env_flag("FLASHJIT_LOG");
};

// How build_kernel got its binary.
enum class BuildPath { Compiled, FromDiskCache };

// Render -> binary cache or compile -> load, for one config. `path`, if given, says which.
Result<std::shared_ptr<Kernel>> build_kernel(const Backend& backend, const BinaryCache* cache,
                                             const AttentionProblem& problem,
                                             const AttentionConfig& config,
                                             BuildPath* path = nullptr);

// What a Runtime did so far: run-time compiles (NVRTC calls) and binary-cache loads.
struct RuntimeStats {
  int compiles = 0;
  int disk_cache_loads = 0;
};

class Runtime;

// Tunes `problem` on the runtime's backend and returns the config to serve (having recorded it
// in runtime.user_store(), if any). Installed by the tuner; the runtime never includes it. Called
// without the runtime's locks held, one call at a time; it may call
// runtime.attention(problem, config) but a nested attention(problem) does not tune again.
using TuneHook = std::function<Result<AttentionConfig>(Runtime&, const AttentionProblem&)>;

class Runtime {
 public:
  using TuneHook = flashjit::TuneHook;

  // The backend options.backend names (see resolve_backend). Error NoDevice when there is no
  // usable device of that kind (auto: no GPU and no CPU backend).
  static Result<std::unique_ptr<Runtime>> create(const RuntimeOptions& options = {});
  // A runtime over a given backend (tests, other backends).
  Runtime(std::unique_ptr<Backend> backend, const RuntimeOptions& options);

  ~Runtime();

  const Backend& backend() const { return *backend_; }
  RuntimeStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  const RuntimeOptions& options() const { return options_; }
  // The backend's fingerprint, taken once at construction.
  const DeviceFingerprint& fingerprint() const { return fingerprint_; }
  // The user tuning DB, or null when there is none (disabled or could not be opened).
  // TuningStore is thread-safe.
  TuningStore* user_store() { return user_store_.get(); }
  // The system DBs that could be opened, in order.
  const std::vector<std::unique_ptr<TuningStore>>& system_stores() const { return system_stores_; }

  // Installs (or, with an empty function, removes) the tune-on-miss hook. It is called only when
  // options().tune_on_miss is set.
  void set_tune_hook(TuneHook hook);

  // The kernel for `problem` with the selected config (see the top of this file). Thread-safe;
  // the selection and the kernel are kept in memory per ProblemKey, so a second call for the
  // same key costs a map lookup. Error only for an invalid problem or a failed compile of the
  // default config (a tuned config that fails to build falls back to the default).
  Result<std::shared_ptr<Kernel>> attention(const AttentionProblem& problem);
  // The kernel for `problem` with a given config; error InvalidArgument if it is not legal.
  Result<std::shared_ptr<Kernel>> attention(const AttentionProblem& problem,
                                            const AttentionConfig& config);

  // The backward pass of `problem` (whatever its pass field says): the kernels that take q, k,
  // v, o, lse and dO and write dq, dk and dv (AttentionArgs), selected as attention() selects:
  //   auto backward = problem.with_pass(flashjit::Pass::Backward);
  //   auto kernel = (*runtime)->attention_backward(problem);
  //   (*kernel)->launch(backward, {q, k, v, o, lse, d_o, dq, dk, dv}, stream);
  // problem.deterministic asks for configs whose dQ has no atomics (bitwise reproducible).
  Result<std::shared_ptr<Kernel>> attention_backward(const AttentionProblem& problem) {
    return attention(problem.with_pass(Pass::Backward));
  }

  // The config attention(problem) would use and where it comes from, without building a
  // kernel, recording a miss or calling the tune hook (for `flashjit show`, logging, tests).
  // Error only for an invalid problem (or a device too small for any config).
  Result<std::pair<AttentionConfig, ChoiceSource>> select_config(const AttentionProblem& problem);

 private:
  struct Selection {
    AttentionConfig config;
    ChoiceSource source = ChoiceSource::Default;
    std::string detail;  // "exact, user DB /path", "nearest d128 ... , system DB /path", ...
  };
  Result<Selection> select(const AttentionProblem& problem, bool allow_tune);
  void log(const std::string& line) const;

  std::unique_ptr<Backend> backend_;
  RuntimeOptions options_;
  DeviceFingerprint fingerprint_;
  std::optional<BinaryCache> cache_;
  std::unique_ptr<TuningStore> user_store_;
  std::vector<std::unique_ptr<TuningStore>> system_stores_;

  mutable std::mutex mutex_;  // guards kernels_, selected_ and stats_; held while building a kernel
  RuntimeStats stats_;
  std::map<std::string, std::shared_ptr<Kernel>> kernels_;   // key: signature + config
  std::map<std::string, std::shared_ptr<Kernel>> selected_;  // key: ProblemKey::to_string()

  std::mutex hook_mutex_;  // guards tune_hook_
  TuneHook tune_hook_;
  std::mutex tune_mutex_;  // one tune at a time
};

}  // namespace flashjit
