#include "runtime/cpu/cpu_backend.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "generator/render.hpp"
#include "runtime/cpu/clang_jit.hpp"
#include "runtime/cpu/cpu_decode_kernel.hpp"
#include "runtime/cpu/cpu_info.hpp"
#include "runtime/host_load.hpp"
#include "runtime/launch_params.hpp"
#include "runtime/workspace.hpp"
#include "templates/attention_params.h"

namespace flashjit::cpu {

// A fixed set of worker threads; parallel_for runs task(i) for i in [0, count) on them and on the
// calling thread, and returns when all are done. One parallel_for at a time.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  void parallel_for(int count, const std::function<void(int)>& task) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    if (workers_.empty() || count <= 1) {
      for (int i = 0; i < count; ++i) task(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = &task;
      count_ = count;
      next_ = 0;
      busy_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return busy_ == 0; });
    task_ = nullptr;
  }

 private:
  void drain() {
    for (int i = next_++; i < count_; i = next_++) (*task_)(i);
  }
  void work() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_ == 0) done_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* task_ = nullptr;
  int count_ = 0;
  std::atomic<int> next_{0};
  int busy_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

namespace {

std::string signature_text(const ProblemSignature& signature) { return signature.to_string(); }

// Packed documents' offsets (host arrays on the CPU, aligned): every one checked, forward and
// backward.
Status check_host_cu_seqlens(const AttentionProblem& problem, const AttentionArgs& args) {
  const Variant& v = problem.variant;
  FLASHJIT_TRY(check_cu_seqlens("cu_seqlens_q", args.cu_seqlens_q, problem.batch, problem.seqlen_q,
                                v.total_q));
  return check_cu_seqlens("cu_seqlens_k", args.cu_seqlens_k, problem.batch, problem.seqlen_k,
                          v.total_k);
}

// Runs entry(params, begin, end) over work items [0, items) on the pool, in chunks of consecutive
// items, 4 per thread so that causal imbalance evens out; each chunk is one call (one scratch
// allocation). False when an entry returned non-zero (its scratch could not be allocated).
bool run_work_items(ThreadPool& pool, EntryFunction entry, const FlashjitAttentionParams& params,
                    int64_t items) {
  if (items <= 0) return true;
  const int64_t chunks_wanted = static_cast<int64_t>(pool.threads()) * 4;
  const int64_t chunk = std::max<int64_t>(1, (items + chunks_wanted - 1) / chunks_wanted);
  const int chunks = static_cast<int>((items + chunk - 1) / chunk);
  std::atomic<int> failures{0};
  pool.parallel_for(chunks, [&](int c) {
    const int64_t begin = c * chunk;
    const int64_t end = std::min(items, begin + chunk);
    if (entry(&params, static_cast<int>(begin), static_cast<int>(end)) != 0) ++failures;
  });
  return failures == 0;
}

class CpuKernel final : public CpuKernelBase {
 public:
  CpuKernel(std::unique_ptr<JitModule> module, EntryFunction entry,
            std::shared_ptr<ThreadPool> pool, ProblemSignature signature, AttentionConfig config,
            KernelInfo info)
      : CpuKernelBase(std::move(module), {entry}, std::move(signature), config, info),
        pool_(std::move(pool)) {}

  // Synchronous: returns when the output is written. `stream` is ignored.
  Status launch(const AttentionProblem& problem, const AttentionArgs& args, void*) const override {
    FLASHJIT_TRY(validate(problem));
    const ProblemSignature problem_signature = ProblemSignature::of(problem);
    if (!(problem_signature == signature_)) {
      return make_error(ErrorCode::InvalidArgument,
                        "problem signature " + signature_text(problem_signature) +
                            " does not match the kernel's " + signature_text(signature_));
    }
    for (const auto& [name, pointer] : {std::pair<const char*, const void*>{"q", args.q},
                                        {"k", args.k},
                                        {"v", args.v},
                                        {"o", args.o}}) {
      if (pointer == nullptr) {
        return make_error(ErrorCode::InvalidArgument,
                          std::string(name) + " is null: q, k, v and o must be host pointers");
      }
      const int element_bytes = dtype_bytes(problem.dtype);
      if (reinterpret_cast<uintptr_t>(pointer) % element_bytes != 0) {
        return make_error(ErrorCode::InvalidArgument,
                          std::string(name) + ": must be " + std::to_string(element_bytes) +
                              "-byte aligned (" + to_string(problem.dtype) + " elements)");
      }
    }
    if (reinterpret_cast<uintptr_t>(args.lse) % alignof(float) != 0) {
      return make_error(ErrorCode::InvalidArgument, "lse: must be 4-byte aligned (or null)");
    }
    if (problem.variant.alibi &&
        (args.alibi_slopes == nullptr || reinterpret_cast<uintptr_t>(args.alibi_slopes) % 4 != 0)) {
      return make_error(ErrorCode::InvalidArgument,
                        "alibi_slopes: an ALiBi problem needs the fp32 slope of each query head "
                        "([heads_q] = " +
                            std::to_string(problem.heads_q) + "), a 4-byte aligned host pointer");
    }
    if (problem.variant.varlen) {  // host arrays here: every offset checked
      for (const auto& [name, cu] :
           {std::pair<const char*, const int32_t*>{"cu_seqlens_q", args.cu_seqlens_q},
            {"cu_seqlens_k", args.cu_seqlens_k}})
        if (reinterpret_cast<uintptr_t>(cu) % alignof(int32_t) != 0)
          return make_error(ErrorCode::InvalidArgument,
                            std::string(name) + ": must be 4-byte aligned (int32 offsets)");
      FLASHJIT_TRY(check_host_cu_seqlens(problem, args));
    }
    const int64_t m_blocks = (problem.seqlen_q + config_.block_m - 1) / config_.block_m;
    const int64_t items = problem.batch * problem.heads_q * m_blocks;
    if (items > INT32_MAX || problem.seqlen_q > INT32_MAX || problem.seqlen_k > INT32_MAX) {
      return make_error(ErrorCode::InvalidArgument,
                        problem.to_string() + ": " + std::to_string(items) +
                            " work items; the CPU kernel takes at most 2^31 - 1");
    }
    if (items <= 0) return ok_status();

    FlashjitAttentionParams params = make_launch_params(problem, args);
    if (!run_work_items(*pool_, entries_[0], params, items)) {
      return make_error(ErrorCode::LaunchFailed, "the CPU kernel could not allocate its scratch (" +
                                                     std::to_string(info_.dynamic_smem_bytes) +
                                                     " B per thread)");
    }
    return ok_status();
  }

 private:
  std::shared_ptr<ThreadPool> pool_;
};

// The backward pass: the three entry points of one source (render.hpp's kCpuBackward*Entry, in
// launch order) run one after the other over the pool, sharing one fp32 workspace (delta,
// lse_log2 and for the fused dQ, DqMode::Atomic, one dQ accumulator per split of the key blocks:
// runtime/launch_params.hpp's layout, the GPU's with dq_accum_copies = the split count).
class CpuBackwardKernel final : public CpuKernelBase {
 public:
  CpuBackwardKernel(std::unique_ptr<JitModule> module, std::vector<EntryFunction> entries,
                    std::shared_ptr<ThreadPool> pool, ProblemSignature signature,
                    AttentionConfig config, KernelInfo info)
      : CpuKernelBase(std::move(module), std::move(entries), std::move(signature), config, info),
        pool_(std::move(pool)) {}

  size_t workspace_bytes(const AttentionProblem& problem) const override {
    return layout(problem).bytes;
  }

  // Synchronous: returns when dq, dk and dv are written. `stream` only keys the kernel's own
  // workspace. Launches that use the kernel's own workspace run one at a time (the pool runs one
  // phase at a time anyway); with a caller's workspace they only queue for the pool.
  Status launch(const AttentionProblem& problem, const AttentionArgs& args,
                void* stream) const override {
    const BackwardWorkspace layout = this->layout(problem);
    FLASHJIT_TRY(check_attention_launch(
        problem, args, signature_, static_cast<size_t>(dtype_bytes(problem.dtype)), layout.bytes));
    if (problem.variant.varlen) FLASHJIT_TRY(check_host_cu_seqlens(problem, args));
    const int64_t m_blocks = (problem.seqlen_q + config_.block_m - 1) / config_.block_m;
    const int64_t n_blocks = (problem.seqlen_k + config_.block_n - 1) / config_.block_n;
    const int64_t query_items = problem.batch * problem.heads_q * m_blocks;
    // The fused dQ: a dK/dV work item per (batch, kv head, split); -det: per key block.
    const int64_t key_items = problem.batch * problem.heads_kv *
                              (layout.has_dq_accum ? layout.dq_accum_copies : n_blocks);
    const int64_t rows = problem.batch * problem.heads_q * layout.seqlen_q_rounded;
    if (query_items > INT32_MAX || key_items > INT32_MAX || rows > INT64_MAX / 4) {
      return make_error(ErrorCode::InvalidArgument,
                        problem.to_string() + ": " + std::to_string(query_items) + " dQ and " +
                            std::to_string(key_items) +
                            " dK/dV work items; the CPU kernels take at most 2^31 - 1");
    }
    FlashjitAttentionParams params = make_launch_params(problem, args);
    if (args.workspace != nullptr) {
      bind_workspace(params, layout, args.workspace);
      return run_phases(params, query_items, key_items);
    }
    std::lock_guard<std::mutex> lock(own_workspace_mutex_);
    Result<void*> workspace = workspace_.get(layout.bytes, stream);
    if (!workspace.ok()) return workspace.error();
    bind_workspace(params, layout, workspace.value());
    return run_phases(params, query_items, key_items);
  }

 private:
  BackwardWorkspace layout(const AttentionProblem& problem) const {
    return backward_workspace(problem, config_,
                              cpu_backward_dq_splits(config_, problem, pool_->threads()),
                              /*packed_documents=*/false);  // templates/cpu: per document
  }

  Status run_phases(const FlashjitAttentionParams& params, int64_t query_items,
                    int64_t key_items) const {
    const char* names[] = {"preprocess", "dK/dV", "dQ"};
    const int64_t items[] = {query_items, key_items, query_items};
    for (int phase = 0; phase < 3; ++phase) {
      if (!run_work_items(*pool_, entries_[phase], params, items[phase])) {
        return make_error(ErrorCode::LaunchFailed,
                          std::string("the CPU backward's ") + names[phase] +
                              " phase could not allocate its scratch (up to " +
                              std::to_string(info_.dynamic_smem_bytes) + " B per thread)");
      }
    }
    return ok_status();
  }

  std::shared_ptr<ThreadPool> pool_;  // entries_: preprocess, dK/dV, dQ
};

}  // namespace

constexpr ConfigSpace<CpuSpec> kCpuConfigSpace{&legal_cpu_configs, &default_cpu_config,
                                               &check_cpu_config, &explain_cpu_plan};

CpuBackend::CpuBackend(const CpuSpec& spec)
    : ConfigSpaceBackend(kCpuConfigSpace),
      cpu_(spec),
      device_(cpu_device_spec(spec)),
      pool_(std::make_shared<ThreadPool>(std::max(1, spec.cores))) {}

CpuBackend::~CpuBackend() = default;

Result<std::unique_ptr<CpuBackend>> CpuBackend::create() { return create(host_cpu()); }

Result<std::unique_ptr<CpuBackend>> CpuBackend::create(const CpuSpec& spec) {
  if (spec.cores < 1 || spec.l2_bytes <= 0) {
    return make_error(ErrorCode::InvalidArgument,
                      "cpu spec " + spec.to_string() + ": needs at least 1 core and an L2 size");
  }
  // Fails early (NoDevice) if LLVM has no target for this host.
  if (host_target().triple.empty()) {
    return make_error(ErrorCode::NoDevice, "LLVM does not know the host's target");
  }
  // A FLASHJIT_CPU_ISA cap must name a level, and one this host runs.
  const Result<std::optional<CpuIsa>> cap = isa_cap();
  if (!cap.ok()) return cap.error();
  if (cap->has_value() && !host_runs(**cap)) {
    return make_error(ErrorCode::InvalidArgument,
                      std::string("FLASHJIT_CPU_ISA=") + to_string(**cap) +
                          ": this host cannot run that level (it has: " + host_cpu().isa() + ")");
  }
  return std::unique_ptr<CpuBackend>(new CpuBackend(spec));
}

std::string CpuBackend::compiler_fingerprint() const { return compiler_identity(); }

DeviceFingerprint CpuBackend::fingerprint() const {
  DeviceFingerprint fp;
  fp.backend = "cpu";
  fp.name = cpu_.model;
  fp.arch = 0;
  fp.sm_count = cpu_.cores;
  fp.smem_per_block_optin = device_.smem_per_block_optin;  // L2 per core
  fp.l2_bytes = device_.l2_bytes;                          // L3 (last level)
  fp.driver_version = 0;
  fp.compiler = compiler_identity();
  fp.compiler += " ";
  fp.compiler += cpu_.isa();
  fp.compiler += " L1d ";
  fp.compiler += std::to_string(cpu_.l1d_bytes);
  fp.compiler += "B";
  return fp;
}

Result<KernelSource> CpuBackend::render(const AttentionProblem& problem,
                                        const AttentionConfig& config) const {
  return render_cpu_attention(problem, config);
}

Result<Binary> CpuBackend::compile(const KernelSource& source) const {
  // "attention_bwd_cpu d128 bf16 ..." -> attention_bwd_cpu.cpp in clang's diagnostics.
  const std::string file_name = source.label.substr(0, source.label.find(' ')) + ".cpp";
  Result<ClangOutput> output = compile_cpp(source.text, file_name, EmitKind::Object);
  if (!output.ok()) {
    return make_error(output.error().code, source.label + ": " + output.error().message);
  }
  Binary binary;
  binary.bytes = std::move(output->bytes);
  binary.compile_log = std::move(output->log);
  binary.compile_seconds = output->seconds;
  return binary;
}

Result<std::shared_ptr<Kernel>> CpuBackend::load(const Binary& binary, const KernelSource& source,
                                                 const ProblemSignature& signature,
                                                 const AttentionConfig& config) const {
  Result<std::unique_ptr<JitModule>> module = JitModule::load(binary.bytes, source.label);
  if (!module.ok()) return module.error();
  std::vector<EntryFunction> entries;
  for (const std::string& name : source.entries) {
    Result<void*> entry = (*module)->lookup(name);
    if (!entry.ok()) {
      return make_error(ErrorCode::CompileFailed, source.label + ": " + entry.error().message);
    }
    entries.push_back(reinterpret_cast<EntryFunction>(entry.value()));
  }
  const bool backward = signature.pass == Pass::Backward;
  const bool decode = config.family == KernelFamily::Decode;
  if (entries.size() != (backward ? 3u : decode ? 2u : 1u)) {
    return make_error(ErrorCode::InvalidArgument,
                      source.label + ": " + std::to_string(entries.size()) +
                          " entry points for a " + signature.to_string() + " kernel; expected " +
                          (backward ? "3 (preprocess, dK/dV, dQ)"
                           : decode ? "2 (split, combine)"
                                    : "1"));
  }
  AttentionProblem representative;
  representative.head_dim = signature.head_dim;
  representative.pass = signature.pass;
  representative.kv.page_size = signature.page_size;
  KernelInfo info;
  info.dynamic_smem_bytes =
      static_cast<int>(cpu_scratch_bytes(config, representative));  // scratch per thread
  info.threads_per_block = 1;
  if (decode) {
    std::shared_ptr<ThreadPool> pool = pool_;
    WorkRunner runner = [pool](EntryFunction entry, const FlashjitAttentionParams& params,
                               int64_t items) {
      return run_work_items(*pool, entry, params, items);
    };
    return make_cpu_decode_kernel(std::move(module.value()), std::move(entries), std::move(runner),
                                  cpu_, signature, config, info);
  }
  if (backward) {
    return std::shared_ptr<Kernel>(std::make_shared<CpuBackwardKernel>(
        std::move(module.value()), std::move(entries), pool_, signature, config, info));
  }
  return std::shared_ptr<Kernel>(std::make_shared<CpuKernel>(
      std::move(module.value()), entries.front(), pool_, signature, config, info));
}

Result<DeviceBuffer> CpuBackend::allocate(size_t bytes) const { return host_allocation(bytes); }

Status CpuBackend::copy_to_device(void* dst, const void* src, size_t bytes) const {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return ok_status();
}
Status CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) const {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return ok_status();
}
Status CpuBackend::fill_bytes(void* dst, uint8_t value, size_t bytes) const {
  if (bytes > 0) std::memset(dst, value, bytes);
  return ok_status();
}

Result<double> CpuBackend::time_ms(const std::function<Status()>& work, int repetitions) const {
  if (repetitions < 1) {
    return make_error(ErrorCode::InvalidArgument,
                      "repetitions = " + std::to_string(repetitions) + ": must be at least 1");
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repetitions; ++i) FLASHJIT_TRY(work());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return ms / repetitions;
}

std::unique_ptr<DisturbanceProbe> CpuBackend::disturbance_probe() const {
  return HostLoadProbe::create(pool_->threads());
}

}  // namespace flashjit::cpu
