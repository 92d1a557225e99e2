// The tuner's kernels: the compile pool, loading and verification against the fp64 reference,
// the timing inputs, and the device-health check (tuner/tuner.hpp describes the whole).
#include <algorithm>
#include <exception>
#include <string_view>
#include <utility>

#include "tuner/measure.hpp"
#include "tuner/reference.hpp"
#include "tuner/tuner.hpp"
#include "tuner/tuner_internal.hpp"
#include "tuner/workload.hpp"

namespace flashjit {

using namespace tuner_detail;

int Tuner::steps(const AttentionProblem& problem) const {
  return static_cast<int>(backend_.legal_configs(problem).size()) + 1;
}

std::shared_ptr<Tuner::Slot> Tuner::slot(const AttentionProblem& problem,
                                         const AttentionConfig& config) {
  const std::string key = slot_key(problem, config);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto found = slots_.find(key); found != slots_.end()) return found->second;
  auto created = std::make_shared<Slot>();
  created->problem = problem;
  created->config = config;
  slots_.emplace(key, created);
  queue_.push_back(created);
  ++compiles_queued_;
  if (threads_.empty()) {
    int count = options_.max_compile_threads;
    // One hardware thread left for launching, unless timing waits for the compiles anyway.
    if (count <= 0)
      count = static_cast<int>(std::thread::hardware_concurrency()) -
              (backend_.compiles_share_the_device() ? 0 : 1);
    count = std::max(1, count);
    for (int i = 0; i < count; ++i) threads_.emplace_back([this] { compile_loop(); });
  }
  queue_cv_.notify_one();
  return created;
}

void Tuner::compile_loop() {
  for (;;) {
    std::shared_ptr<Slot> next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    compile(*next);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      next->done = true;
      ++compiles_done_;
    }
    done_cv_.notify_all();
  }
}

// Render, then the disk cache or the compiler. Runs on a pool thread; loads happen later on the
// tuning thread.
void Tuner::compile(Slot& slot) {
  try {
    Result<KernelSource> source = backend_.render(slot.problem, slot.config);
    if (!source.ok()) {
      slot.compile_error = "render: " + source.error().describe();
      return;
    }
    slot.source = std::move(source.value());
    std::string key;
    if (cache_ != nullptr) {
      key = BinaryCache::key(slot.source.text, backend_.compiler_fingerprint(), /*options=*/"");
      if (std::optional<std::vector<char>> cached = cache_->get(key)) {
        slot.binary.bytes = std::move(*cached);
        slot.binary.from_cache = true;
        return;
      }
    }
    Result<Binary> binary = backend_.compile(slot.source);
    if (!binary.ok()) {
      slot.compile_error = binary.error().describe();
      return;
    }
    if (cache_ != nullptr) {
      Status stored = cache_->put(key, binary->bytes);  // not fatal: read-only or full disk
      (void)stored;
    }
    slot.binary = std::move(binary.value());
  } catch (const std::exception& error) {
    slot.compile_error = std::string("internal error while compiling: ") + error.what();
  }
}

void Tuner::prefetch(const std::vector<AttentionProblem>& problems) {
  for (const AttentionProblem& problem : problems) {
    if (!backend_.check_problem(problem).ok()) continue;
    const std::vector<AttentionConfig> configs = backend_.legal_configs(problem);
    Result<AttentionConfig> default_cfg = backend_.default_config(problem);
    if (configs.empty() || !default_cfg.ok()) continue;

    // What the store already has: recorded configs need no compile (the default always does,
    // for the re-time), and a finished key needs nothing.
    std::vector<AttentionConfig> recorded;
    if (store_ != nullptr && options_.resume) {
      const ProblemKey key = ProblemKey::of(problem);
      Result<std::vector<TuneResult>> rows = store_->results(fingerprint_, key);
      if (rows.ok()) {
        for (const TuneResult& row : *rows) recorded.push_back(row.config);
      }
      Result<std::optional<TuneChoice>> choice = store_->choice(fingerprint_, key);
      const bool all_recorded = std::all_of(configs.begin(), configs.end(), [&](const auto& c) {
        return std::find(recorded.begin(), recorded.end(), c) != recorded.end();
      });
      if (choice.ok() && choice->has_value() && all_recorded) continue;
    }
    slot(problem, *default_cfg);
    for (const AttentionConfig& config : configs) {
      if (std::find(recorded.begin(), recorded.end(), config) == recorded.end()) {
        slot(problem, config);
      }
    }
  }
}

void Tuner::notify(TuneProgress progress) const {
  if (!options_.on_progress) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    progress.compiles_done = compiles_done_;
    progress.compiles_queued = compiles_queued_;
  }
  options_.on_progress(progress);
}

Status Tuner::record(const ProblemKey& key, const TuneResult& result) {
  if (store_ == nullptr) return ok_status();
  return store_->record(fingerprint_, key, result);
}

namespace {
constexpr std::string_view kDeviceLost = "the device stopped working after ";
}  // namespace

const char* const kDisturbedNote = "disturbed";

bool is_device_lost(const Error& error) {
  return error.message.compare(0, kDeviceLost.size(), kDeviceLost) == 0;
}

Status Tuner::device_health(const std::string& after) const {
  Status synced = backend_.synchronize();
  if (synced.ok()) return ok_status();
  std::string message(kDeviceLost);
  message += after;
  message += " (";
  message += synced.error().describe();
  message += "); finished results are in the store: run again to resume";
  return make_error(ErrorCode::DriverError, std::move(message));
}

// ---------------------------------------------------------------------------------------------
// Building and verifying one kernel.

void Tuner::wait_for_compiles() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return compiles_done_ == compiles_queued_; });
}

Result<TuneResult> Tuner::prepare_kernel(Slot& slot, const AttentionProblem& problem,
                                         const TuneProgress& progress, const ProblemKey& key) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!slot.done) {
      const int seen = compiles_done_;
      lock.unlock();
      TuneProgress waiting = progress;
      waiting.phase = TuneProgress::Phase::Compiling;
      notify(waiting);
      lock.lock();
      done_cv_.wait(lock, [&] { return slot.done || compiles_done_ != seen; });
    }
  }
  if (slot.compile_error) {
    return failed(slot.config, TuneStatus::CompileFailed, *slot.compile_error);
  }
  // Loading and verifying are work on the device, so they take its turn as timing does: on a GPU
  // the contexts of different processes time-slice, and another tuner's module loads, uploads and
  // verification launches landing in the batches this one times made its defaults 3-6% slower
  // than a lone run's and let near-ties pass for gains (H100, bench/concurrent_tune.py at
  // bf740d1). Compiles stay outside the turn (they do not touch the device, except on the CPU).
  // Nothing is in flight while it waits for the turn (waiting is not hanging: the supervisor).
  mark_inflight(key, nullptr);
  Result<DeviceLock::Guard> held = hold_device();
  if (!held.ok()) return held.error();
  mark_inflight(key, &slot.config);  // loading and verifying it launch it

  if (!slot.load_tried) {
    slot.load_tried = true;
    const ProblemSignature signature = ProblemSignature::of(slot.problem);
    Result<std::shared_ptr<Kernel>> kernel =
        backend_.load(slot.binary, slot.source, signature, slot.config);
    if (!kernel.ok() && slot.binary.from_cache) {
      // A cache entry the driver rejects: compile it afresh, as build_kernel does.
      Result<Binary> binary = backend_.compile(slot.source);
      if (binary.ok()) {
        if (cache_ != nullptr) {
          const std::string key =
              BinaryCache::key(slot.source.text, backend_.compiler_fingerprint(), "");
          Status stored = cache_->put(key, binary->bytes);
          (void)stored;
        }
        kernel = backend_.load(binary.value(), slot.source, signature, slot.config);
      } else {
        kernel = binary.error();
      }
    }
    if (kernel.ok()) {
      slot.kernel = std::move(kernel.value());
    } else {
      slot.load_error = "load: " + kernel.error().describe();
    }
    slot.binary = Binary();  // loaded (or useless): free the image
  }
  if (!slot.kernel) return failed(slot.config, TuneStatus::CompileFailed, slot.load_error);

  const int64_t group = problem.group_size();
  auto found = slot.verified.find(group);
  if (found == slot.verified.end()) {
    Result<TuneResult> verdict = verify(slot, problem);
    if (!verdict.ok()) return verdict.error();
    found = slot.verified.emplace(group, std::move(verdict.value())).first;
  }
  return found->second;
}

Result<TuneResult> Tuner::verify(Slot& slot, const AttentionProblem& problem) {
  const int64_t group = problem.group_size();
  std::string key = signature_key(problem);
  key += "-g";
  key += std::to_string(group);
  std::unique_ptr<Verification>& entry = verifications_[key];
  if (!entry) {
    const AttentionProblem small =
        verification_problem(problem, kVerifyHeadsKv, kVerifySeqlenQ, kVerifySeqlenK);
    Result<std::unique_ptr<Verification>> created =
        Verification::create(backend_, small, kVerifySeed, options_.variant_functions);
    if (!created.ok()) return created.error();
    entry = std::move(created.value());
  }
  const Verification& v = *entry;
  Result<Verification::Verdict> verdict =
      v.run(*slot.kernel, options_.max_rel_error, options_.max_lse_abs_error,
            options_.max_grad_rel_error);
  if (!verdict.ok()) return verdict.error();
  if (!verdict->launched) {
    FLASHJIT_TRY(device_health(slot.config.to_string() + " failed its verification launch"));
    return failed(slot.config, TuneStatus::LaunchFailed, "verification launch: " + verdict->detail);
  }
  if (!verdict->passed) {
    return failed(
        slot.config, TuneStatus::WrongResult,
        "verification vs fp64 reference on " + v.problem().to_string() + ": " + verdict->detail);
  }
  TuneResult passed;
  passed.config = slot.config;
  if (options_.verbose) {
    const KernelInfo& info = slot.kernel->info();
    passed.message = "regs " + std::to_string(info.regs_per_thread) + ", smem " +
                     std::to_string(info.dynamic_smem_bytes) + " B, local " +
                     std::to_string(info.local_bytes_per_thread) + " B; verified " +
                     verdict->detail;
  } else if (slot.kernel->info().local_bytes_per_thread > 0) {
    passed.message =
        "spills: " + std::to_string(slot.kernel->info().local_bytes_per_thread) + " B/thread local";
  }
  return passed;
}

// ---------------------------------------------------------------------------------------------
// Timing.

// Timing inputs for `problem`: enough sets that a round over them is at least twice the L2.
Status Tuner::ensure_buffers(const AttentionProblem& problem) {
  const DeviceSpec& device = backend_.device();
  const std::vector<TensorSpec> specs = tensor_specs(problem);
  size_t set_bytes = 0;
  for (const TensorSpec& spec : specs) set_bytes += spec.bytes;
  const size_t l2 = device.l2_bytes > 0 ? static_cast<size_t>(device.l2_bytes) : kFallbackL2Bytes;
  const size_t needed_sets =
      std::clamp<size_t>((2 * l2 + set_bytes - 1) / set_bytes, 1, kMaxInputSets);
  if (!buffers_) buffers_ = std::make_unique<Buffers>();
  Buffers& b = *buffers_;
  // Same dtype, pass and tensors (roles in order: a variant or layout adds some).
  bool same_kind = !b.sets.empty() && b.dtype == problem.dtype && b.pass == problem.pass &&
                   b.specs.size() == specs.size();
  for (size_t i = 0; same_kind && i < specs.size(); ++i)
    same_kind = b.specs[i].role == specs[i].role;
  bool fits = same_kind && b.sets.size() >= needed_sets;
  for (size_t i = 0; fits && i < specs.size(); ++i) fits = b.specs[i].bytes >= specs[i].bytes;
  const std::string indices = has_index_tensors(problem) ? problem.to_string() : "";
  if (fits && indices != b.indices_of) {
    // The sets fit, but their index tensors are another problem's: this one's, into every set.
    for (DeviceTensors& set : b.sets)
      FLASHJIT_TRY(fill_for_timing(backend_, problem, set, kTimingSeed));
    b.indices_of = indices;
  }
  if (fits) return ok_status();

  // Grow to the larger of what is held and what is needed (same dtype and pass), else replace.
  std::vector<TensorSpec> grown = specs;
  if (same_kind) {
    for (size_t i = 0; i < grown.size(); ++i)
      grown[i].bytes = std::max(grown[i].bytes, b.specs[i].bytes);
  }
  size_t big_set = 0;
  for (const TensorSpec& spec : grown) big_set += spec.bytes;
  const size_t set_count =
      std::clamp<size_t>((2 * l2 + big_set - 1) / big_set, needed_sets, kMaxInputSets);
  b.sets.clear();  // free before allocating anew; stays empty on failure: no stale sizes
  std::vector<DeviceTensors> sets;
  for (size_t i = 0; i < set_count; ++i) {
    Result<DeviceTensors> set = allocate_tensors(backend_, grown);
    if (!set.ok()) return set.error();
    FLASHJIT_TRY(fill_for_timing(backend_, problem, *set, kTimingSeed));
    sets.push_back(std::move(set.value()));
  }
  b.sets = std::move(sets);
  b.specs = std::move(grown);
  b.dtype = problem.dtype;
  b.pass = problem.pass;
  b.indices_of = indices;
  return ok_status();
}

}  // namespace flashjit
