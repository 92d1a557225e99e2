// The tuner: for each problem, every legal config is compiled (on a thread pool), verified against
// the fp64 reference, timed on the device, the best few are re-timed against the default, and
// every result and the choice go to the tuning store as they are measured.
//
//   auto backend = flashjit::cuda::CudaBackend::create(0);
//   flashjit::BinaryCache cache(flashjit::BinaryCache::default_dir());
//   auto store = flashjit::TuningStore::open(path);
//   flashjit::Tuner tuner(**backend, &cache, store->get(), {});
//   auto reports = tuner.tune_all(problems);    // Result<std::vector<TuneReport>>
//
// Compiles: a kernel depends only on (head_dim, dtype, causal, config), so problems that differ in
// sizes share their compiles. tune_all() queues every compile up front, in problem order, and the
// pool compiles while the calling thread verifies and times earlier problems; kernels are loaded
// and launched on the calling thread only.
//
// Verification, once per kernel and GQA ratio: batch 1, heads_kv 2 (heads_q = 2 * ratio),
// seqlen_q 257, seqlen_k 300 (odd sizes, partial tiles), the problem's causal flag and pass; the
// outputs (forward: o, lse; backward: dq, dk, dv) are poisoned before the launch and compared with
// the fp64 reference (tuner/workload.hpp, tuner/reference.hpp).
//
// Every pass goes through the same steps: the tuner knows an operation only through the
// backend's legal_configs/default_config/render and tuner/workload.hpp's tensors of a call.
//
// Timing (device time by the backend's events): a warm-up of warmup_ms, then samples, each the
// mean of a batch of back-to-back launches (~min_time_ms / min_samples of device time), until at
// least min_samples samples and min_time_ms in all, or 3 samples and max_time_ms in all (a launch
// of a third of a second or more: a CPU's backward, whose samples need no batching to average
// the noise out); the median is the result, min and max the spread. Launches rotate over enough
// input sets that the working set is at least 2x the L2. A config whose median after 3 samples is
// abandon_factor times the best so far stops early.
//
// Decision: the top retime_top configs and the default are re-timed interleaved (round-robin
// batches, so that drift hits all alike). The fastest replaces the default only if it is faster by
// more than the noise: max(min_gain * default median, the interquartile range of either's
// re-timed samples). Otherwise the default is chosen. A winner that passes is then compared with
// the default once more from timings taken close together (issue 33): the default's batches and
// the winner's alternate, the default first and last (D C D ... C D, compare_rounds of the
// winner's), and the gain is that of their medians; a gain within the spread of those repeats
// (max(min_gain * default median, the range of either's samples)) is a tie that keeps the
// default. The choice's median and default_ms (and so TuneReport::gain) are the comparison's.
//
// Every config gets a TuneStatus: CompileFailed (render, compile or load), LaunchFailed,
// WrongResult, or Timed. A failed config never stops the run and is never chosen. Errors returned
// by tune()/tune_all() are fatal ones only: an invalid problem, a device that stopped working
// (a kernel fault leaves the CUDA context unusable), a store that cannot be written.
//
// One timer per device (tuner/device_lock.hpp): each config's timing and the re-time take the
// device's lock, so tuners in other processes on the same device (Backend::timing_device_id) do
// not time at the same moment; compiles and verification stay parallel. A tuner that must wait
// says so (options.on_message: "waiting for <device>: held by pid N").
//
// Disturbance check: the default is timed first and again in the re-time. When the two medians
// differ by more than the noise (max(disturbance_tolerance x the first, either's interquartile
// range)), something else used the device: the re-time runs again, and the decision is taken from
// it if it agrees with the previous re-time. If it still does not, the timings are unstable: the
// results are recorded with the note "disturbed" (the next run measures them again), the previous
// stored choice is kept (or the default is stored as the choice) and TuneReport::disturbed is set.
// A backend that sees other work on its device (Backend::disturbance_probe: the CPU, whose cores
// other processes share) says so for every timed batch: a disturbed batch is discarded and timed
// again after a back-off (TuneOptions::max_disturbed_share, quiet_wait_ms); when the device does
// not get quiet within the wait, the problem's timings are unstable in the same way.
//
// Resume (options.resume, with a store): configs already recorded for (device, generator version,
// key) are not measured again; a key that has a choice and a row for every legal config is taken
// from the store as it is (TuneReport::resumed).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "generator/config.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "runtime/binary_cache.hpp"
#include "runtime/runtime.hpp"
#include "runtime/tuning_store.hpp"
#include "tuner/device_lock.hpp"
#include "tuner/workload.hpp"

namespace flashjit {

struct TuneReport;

// Where a tune_all() (or tune()) run is; passed to TuneOptions::on_progress on the tuning thread.
// Pointers are valid during the callback only.
struct TuneProgress {
  enum class Phase {
    Compiling,  // waiting for compiles the next config needs
    Timing,     // a config was measured, failed or taken from the store: see `result`
    Retiming,   // the top configs and the default are being re-timed
    Comparing,  // the winner and the default are timed alternately (the gain's timings)
    Done,       // the problem is finished: see `report`
  };
  Phase phase = Phase::Compiling;
  const AttentionProblem* problem = nullptr;
  size_t problem_index = 0;  // within this tune_all() call
  size_t problem_count = 1;
  int step = 0;   // steps of this problem done: one per legal config, and one for the re-time
  int steps = 0;  // Tuner::steps(problem)
  int compiles_done = 0;  // over the tuner's life (cache hits included)
  int compiles_queued = 0;
  const TuneResult* result = nullptr;  // Timing
  const TuneReport* report = nullptr;  // Done
};

struct TuneOptions {
  int max_compile_threads = 0;      // 0: hardware threads - 1 (one left for launching; all of
                                    // them where compiles share the device), at least 1
  double warmup_ms = 25;            // device time of untimed launches before a config's samples
  double min_time_ms = 80;          // device time of a config's samples, at least
  int min_samples = 10;             // samples of a config, at least
  int max_samples = 200;            // samples of a config, at most
  double max_time_ms = 1000;        // device time after which 3 samples of a config suffice
                                    // (long launches, a CPU's: the noise is in the sample)
  double abandon_factor = 1.5;      // stop a config after 3 samples at this multiple of the best
  int retime_top = 3;               // configs re-timed against the default at the end
  double min_gain = 0.01;           // fraction a winner must beat the default by, at least
  int compare_rounds = 3;           // the winner's batches in the final comparison with the
                                    // default (each between two of the default's), at least 1
  double max_rel_error = 1e-2;      // verification: relative L2 error of o
  double max_lse_abs_error = 1e-3;  // verification: absolute error of the log-sum-exp
  double max_grad_rel_error = 0;    // backward verification: each gradient's relative L2 error
                                    // (0: gradient_tolerance(dtype), tuner/reference.hpp)
  bool resume = true;               // skip what the store already has for this device
  bool verbose = false;  // results' messages also carry registers, spills and verification errors
  bool serialize_timing = true;         // take the device's timing lock (tuner/device_lock.hpp)
  std::string lock_dir;                 // its folder; empty: DeviceLock::default_dir()
  double disturbance_tolerance = 0.05;  // the default's two medians may differ by this fraction
  int max_retimes = 2;                  // re-time rounds when the default's medians disagree
  // Where the backend sees other work on its device (Backend::disturbance_probe: the CPU), a
  // timed batch during which other work took more than this share of it is timed again after a
  // back-off, for at most quiet_wait_ms of back-offs per problem; after that the problem's
  // timings are disturbed (tuner/measure.hpp QuietTimer).
  double max_disturbed_share = 0.05;
  double quiet_wait_ms = 3000;
  // Crash isolation (tuner/supervisor.hpp): where to write the config being launched
  // ("<key>\t<config>"; empty: nowhere), and the configs a previous worker died running, recorded
  // as LaunchFailed without a launch.
  std::string inflight_path;
  struct Fault {
    std::string key;     // ProblemKey::to_string()
    std::string config;  // AttentionConfig::to_string()
    std::string why;     // "killed by signal 11 (Segmentation fault)"
  };
  std::vector<Fault> faulted;
  // Host (fp64) versions of a variant problem's user score_mod / mask_mod / score_mod_grad for
  // verification (tuner/reference.hpp). Optional: an expression with no function here is
  // compiled for the host (tuner/variant_functions.hpp: the CPU backend's Clang JIT, else the
  // host's C++ compiler; Unsupported when neither is there).
  VariantFunctions variant_functions;
  std::function<void(const TuneProgress&)> on_progress;
  // Waiting for the device, a lock that cannot be used, unstable timings; null: stderr.
  std::function<void(const std::string&)> on_message;
};

// The outcome of tuning one problem.
struct TuneReport {
  AttentionProblem problem;
  ProblemKey key;
  std::vector<TuneResult> results;   // every legal config, in legal_configs() order
  std::optional<TuneChoice> choice;  // empty when no config could be timed
  AttentionConfig default_config;
  double default_ms = 0;      // the default's (re-timed) median; 0 when it was not timed
  double noise_ms = 0;        // the margin a winner had to beat the default by
  bool compared = false;      // the gain is from the final comparison's alternating timings
  bool kept_default = false;  // a faster config was within the noise, so the default stays
  bool resumed = false;       // taken from the store without measuring anything
  bool disturbed = false;     // the default's re-timed medians never agreed, or the device never
                              // got quiet (busy_batches): no choice from them
  int busy_batches = 0;       // timed batches discarded (and timed again) because other work
                              // used the device (Backend::disturbance_probe)
  double seconds = 0;         // wall time spent on this problem
  std::string note;           // why there is no choice, or other remarks

  double default_tflops() const;  // 0 when the default was not timed
  double chosen_tflops() const;   // 0 without a choice
  double gain() const;            // default_ms / chosen ms; 1 when either is unknown
  const TuneResult* result_of(const AttentionConfig& config) const;
};

class Tuner {
 public:
  // `cache` and `store` may be null (no disk cache; nothing recorded, nothing resumed). All three
  // must outlive the tuner. The tuner launches on `backend` from the calling thread only.
  Tuner(const Backend& backend, const BinaryCache* cache, TuningStore* store,
        TuneOptions options = {});
  ~Tuner();
  Tuner(const Tuner&) = delete;
  Tuner& operator=(const Tuner&) = delete;

  Result<TuneReport> tune(const AttentionProblem& problem);
  // Tunes the problems in order; a problem that gets no choice does not stop the others.
  Result<std::vector<TuneReport>> tune_all(const std::vector<AttentionProblem>& problems);

  // Queues the compiles `problems` will need (tune and tune_all do this themselves). Lets a caller
  // start compiling while it does something else (on a device whose compiles share it, the CPU,
  // those compiles run before this tuner holds the device: see holding_device_for_run).
  void prefetch(const std::vector<AttentionProblem>& problems);

  // Progress steps of one problem: its legal configs + 1 (the re-time).
  int steps(const AttentionProblem& problem) const;

  const DeviceFingerprint& fingerprint() const { return fingerprint_; }

 private:
  struct Slot;
  struct Buffers;

  struct ProblemRun;

  // tune_all's work (under holding_device_for_run).
  Result<std::vector<TuneReport>> tune_problems(const std::vector<AttentionProblem>& problems);
  // One problem: the phases below, in order (tuner.cpp).
  Result<TuneReport> tune_one(const AttentionProblem& problem, size_t index, size_t count);
  Status load_stored(ProblemRun& run);
  bool resumed(ProblemRun& run) const;
  Status first_pass(ProblemRun& run);
  Status measure(ProblemRun& run, size_t index);
  std::vector<size_t> retime_candidates(const ProblemRun& run) const;
  Status retime(ProblemRun& run, const std::vector<size_t>& candidates);
  Status retime_until_stable(ProblemRun& run, const std::vector<size_t>& candidates);
  // Unstable timings: no choice from them, every timing noted "disturbed" (why: the report's note).
  Status mark_disturbed(ProblemRun& run, const std::string& why);
  // The re-timed winner (decide's rule; none when the default wins or the timings are
  // disturbed), then its alternating comparison with the default (run.comparison).
  std::optional<size_t> winner(const ProblemRun& run) const;
  Status compare_with_default(ProblemRun& run, size_t candidate);
  Status decide(ProblemRun& run);

  std::shared_ptr<Slot> slot(const AttentionProblem& problem, const AttentionConfig& config);
  void compile_loop();
  void compile(Slot& slot);
  // Waits for the slot's compile, loads and verifies it for the problem's GQA ratio. Returns the
  // failure as a TuneResult status (Timed = usable); an Error only when the device is unusable.
  // Blocks until every queued compile has finished (backends whose compiles share the device).
  void wait_for_compiles();
  // The config is marked in flight (mark_inflight) from the end of the compile wait on: the caller
  // clears the mark before it waits for anything else (compiles, the device's lock).
  Result<TuneResult> prepare_kernel(Slot& slot, const AttentionProblem& problem,
                                    const TuneProgress& progress, const ProblemKey& key);
  Result<TuneResult> verify(Slot& slot, const AttentionProblem& problem);
  Status ensure_buffers(const AttentionProblem& problem);
  Status device_health(const std::string& after) const;
  Status record(const ProblemKey& key, const TuneResult& result);
  void notify(TuneProgress progress) const;
  void message(const std::string& text) const;
  // Writes "<key>\t<config>" to options.inflight_path (config null: empties it). Marked only
  // while the config's kernel is loaded, verified or timed (never while waiting for a compile or
  // the device's lock): each write is also the worker's heartbeat for the supervisor's deadline.
  void mark_inflight(const ProblemKey& key, const AttentionConfig* config) const;
  const TuneOptions::Fault* fault_of(const ProblemKey& key, const AttentionConfig& config) const;
  // Holds the device for a timing phase (an empty Guard when timing is not serialized, or when
  // the whole run holds it already).
  Result<DeviceLock::Guard> hold_device() const;
  // Runs `body` (a whole tune() or tune_all()) holding the device when its compiles and
  // verification run on it too (the CPU: another tuner's compiles would take the cores this one
  // times on, and its timing would slow this one's compiles): concurrent CPU tuners take turns
  // run by run; GPU tuners share the device and take turns for their timing phases only.
  template <class Body>
  auto holding_device_for_run(const Body& body) -> decltype(body());

  const Backend& backend_;
  const BinaryCache* cache_;
  TuningStore* store_;
  TuneOptions options_;
  DeviceFingerprint fingerprint_;
  std::optional<DeviceLock> device_lock_;  // when options.serialize_timing and it could be opened
  mutable std::set<long> holders_named_;   // the holders a "waiting for" message has named
  bool run_holds_device_ = false;          // inside holding_device_for_run's hold

  // Compile pool: slots keyed by signature + config; a queue of slots to compile.
  mutable std::mutex mutex_;
  std::condition_variable queue_cv_;  // work queued, or stopping
  std::condition_variable done_cv_;   // a compile finished
  std::map<std::string, std::shared_ptr<Slot>> slots_;
  std::deque<std::shared_ptr<Slot>> queue_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
  int compiles_done_ = 0;
  int compiles_queued_ = 0;

  // Calling-thread state.
  std::unique_ptr<Buffers> buffers_;
  std::map<std::string, std::unique_ptr<Verification>> verifications_;
};

// Installs the tune-on-miss hook on `runtime` (Runtime::set_tune_hook; it runs only when
// RuntimeOptions::tune_on_miss is set): a problem whose exact key has no choice is tuned on the
// runtime's backend with `options`, recorded in runtime.user_store() (if any) and served with the
// chosen config. One Tuner is kept for the runtime's life, so later misses reuse its compiles.
void install_tune_on_miss(Runtime& runtime, TuneOptions options = {});

// True for the fatal error of tune()/tune_all() after which the device cannot be used in this
// process (a kernel fault): a new process can go on (tuner/supervisor.hpp).
bool is_device_lost(const Error& error);

// The note on results measured while the device was disturbed (resume measures them again).
extern const char* const kDisturbedNote;

}  // namespace flashjit
