// The one backend interface: render, compile, load, launch, allocate, time.
// CUDA (NVRTC + driver API) and CPU (Clang/LLVM ORC JIT, optional at build time) implement it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "generator/block_mask.hpp"
#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "runtime/device_fingerprint.hpp"
#include "templates/attention_params.h"

namespace flashjit {

// A compiled artifact (CUBIN for CUDA).
struct Binary {
  std::vector<char> bytes;
  std::string compile_log;     // compiler output, may be empty
  double compile_seconds = 0;  // 0 when it came from the cache
  bool from_cache = false;
};

// What the loaded kernel really uses, as the driver reports it.
struct KernelInfo {
  int regs_per_thread = 0;
  int local_bytes_per_thread = 0;  // stack frame + spills; > 0 means slow local memory
  int dynamic_smem_bytes = 0;
  int threads_per_block = 0;
};

// Device pointers of one attention call. Shapes and strides come from the AttentionProblem.
//   forward   reads q, k, v; writes o and (if not null) lse.
//   backward  reads q, k, v, o, lse (required: the forward's log-sum-exp) and d_o; writes dq, dk
//             and dv. Its fp32 scratch (Kernel::workspace_bytes) is `workspace` when given, else
//             a buffer the kernel keeps per stream and reuses (allocated on first use, grown
//             when a larger problem needs it).
struct AttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;     // the forward's output; an input of the backward pass
  float* lse = nullptr;  // forward: may be null (then not written); backward: required input
  // Backward pass only.
  const void* d_o = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* workspace = nullptr;  // optional: at least workspace_bytes, 256-byte aligned
  size_t workspace_bytes = 0;
  // The decode family (forward): with problem.kv.paged(), the int32 block table [batch,
  // max_pages]; with problem.kv.seqlens_k, the int32 key count of each sequence [batch]. Device
  // pointers, read by the kernels (never by the host: a launch does not synchronize). A decode
  // launch with more than one split also uses `workspace` (else the kernel's own, per stream).
  const int32_t* block_table = nullptr;
  const int32_t* seqlens_k = nullptr;
  // ALiBi (problem.variant.alibi): the fp32 slope of each query head [heads_q], a device
  // pointer, 4-byte aligned; required then, ignored otherwise.
  const float* alibi_slopes = nullptr;
  // Packed variable-length documents (problem.variant.varlen): the int32 row offsets of the
  // documents in q/o and k/v, [batch + 1] each (cu[0] = 0, non-decreasing, each document at
  // most seqlen_q / seqlen_k rows, the last <= total_q / total_k). Device pointers, 4-byte
  // aligned, required then, ignored otherwise; the GPU backends do not read them on the host (not
  // checked there), the CPU backend checks them (check_cu_seqlens) before a launch.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  // The decode family: check block_table and seqlens_k before the kernel reads them (issue 33,
  // runtime/table_check.hpp): each length in [0, seqlen_k], each page a length uses in
  // [0, num_pages). On the CPU a host check (an InvalidArgument naming the first bad entry); on
  // CUDA a check kernel on the same stream just before the decode kernel (no host sync: a checked
  // call can be captured in a CUDA graph), which prints the first bad entry and traps (the call's
  // synchronization fails; the context is lost, as after any device fault). false: the default,
  // FLASHJIT_CHECK_TABLES=1 (on) / 0 (off), else on in debug builds of the library.
  bool check_tables = false;
  // A mask_mod's block map (issue 31; templates/attention_params.h, generator/block_mask.hpp),
  // built by the caller for this problem at the kernel's block_m x block_n
  // (Kernel::block_mask_tile): a host struct of device pointers, read at launch. Null: a kernel
  // that reads a map builds and caches its own per shape (Kernel::block_mask_build_ms times
  // that). Ignored by kernels that read none.
  const FlashjitBlockMask* block_mask = nullptr;
};

// The problem fields that are compiled into a kernel; everything else is a launch argument.
struct ProblemSignature {
  int head_dim = 0;
  DType dtype = DType::BF16;
  bool causal = false;
  Pass pass = Pass::Forward;
  // The K/V cache's layout (the decode family compiles it in): keys per page (0: contiguous) and
  // whether the key counts come per sequence from seqlens_k.
  int page_size = 0;
  bool seqlens_k = false;
  // The attention variant (Variant::key(): "" for plain attention), compiled in too.
  std::string variant;
  bool operator==(const ProblemSignature&) const = default;
  static ProblemSignature of(const AttentionProblem& problem) {
    return {problem.head_dim,     problem.dtype,        problem.causal,       problem.pass,
            problem.kv.page_size, problem.kv.seqlens_k, problem.variant.key()};
  }
  // "d128 bf16 causal" (forward), "bwd d128 bf16 non-causal", "d128 bf16 causal paged16"
  std::string to_string() const {
    std::string text = pass == Pass::Backward ? "bwd d" : "d";
    text += std::to_string(head_dim);
    text += " ";
    text += flashjit::to_string(dtype);
    text += causal ? " causal" : " non-causal";
    return text + layout_suffix(page_size, seqlens_k, variant);
  }
};

// A loaded attention kernel (one pass: the forward, or the backward's kernels together) for one
// signature and config. Thread-safe to launch.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const ProblemSignature& signature() const = 0;
  virtual const AttentionConfig& config() const = 0;
  // The main kernel's resources (the backward: its dK/dV kernel).
  virtual const KernelInfo& info() const = 0;
  // Validates the problem, checks it matches signature(), then enqueues the kernel(s) on
  // `stream` (the backend's native stream handle; nullptr = its default stream). Asynchronous.
  virtual Status launch(const AttentionProblem& problem, const AttentionArgs& args,
                        void* stream = nullptr) const = 0;
  // Whether the kernel reads a mask_mod's block map (generator/block_mask.hpp) and at which tile
  // (block_m, block_n): {0, 0} when it reads none.
  virtual std::pair<int, int> block_mask_tile() const { return {0, 0}; }
  // A bench hook: the device time in milliseconds of building `problem`'s block map on `stream`
  // (once more, into the kernel's cached map, waiting for it). Unsupported for kernels without.
  virtual Result<double> block_mask_build_ms(const AttentionProblem& problem,
                                             void* stream = nullptr) const {
    (void)problem, (void)stream;
    return make_error(ErrorCode::Unsupported, "this kernel reads no block map");
  }
  // Bytes of scratch a launch for `problem` needs (0 for the forward).
  virtual size_t workspace_bytes(const AttentionProblem& problem) const {
    (void)problem;
    return 0;
  }
};

// Memory on a backend's device, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* ptr, size_t bytes, std::function<void(void*)> release)
      : ptr_(ptr), bytes_(bytes), release_(std::move(release)) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    release_ = std::move(other.release_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void reset() {
    if (ptr_ && release_) release_(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  std::function<void(void*)> release_;
};

// A caller-built block map of a mask_mod (issue 31; Backend::build_block_mask): the map of
// problems of one block_mask_key and shape at one tile, in a device buffer of its own, reusable
// by every call and layer of that key and shape: pass &map as AttentionArgs::block_mask to a
// kernel whose block_mask_tile() is (shape.block_m, shape.block_n).
struct BlockMask {
  BlockMaskShape shape;
  std::string key;  // block_mask_key of the problem it was built for
  FlashjitBlockMask map{};
  double build_ms = 0;  // the build's device time (build_block_mask waits for it)
  DeviceBuffer buffer;
};

// What else ran on a device during a timing, as the device itself can tell (the CPU backend: the
// host's scheduler, runtime/host_load.hpp). start() opens a window (before a timed batch);
// disturbed_share() says which share of the device's capacity other work took since then: 0 for
// a quiet window, 1 when the timing got none of it (its threads waited for the cores the whole
// time).
class DisturbanceProbe {
 public:
  virtual ~DisturbanceProbe() = default;
  virtual void start() = 0;
  virtual double disturbed_share() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "cuda"
  virtual const DeviceSpec& device() const = 0;
  // Identifies compiler + target for cache keys: "nvrtc 13.0 sm_90".
  virtual std::string compiler_fingerprint() const = 0;
  // Identifies the machine for tuning results (device limits, driver and compiler versions).
  virtual DeviceFingerprint fingerprint() const = 0;

  // The backend's config space (each backend's template has its own budget): the legal configs
  // in a stable order, the untuned default, why one config is illegal, and the budget arithmetic
  // as `flashjit plan` prints it. CUDA: CudaTemplateBackend below.
  // Whether this backend's template can run `problem` at all: validate() plus the backend's own
  // limits (the CUDA template stores f16/bf16 only). The error names the value and what is allowed.
  virtual Status check_problem(const AttentionProblem& problem) const { return validate(problem); }
  virtual std::vector<AttentionConfig> legal_configs(const AttentionProblem& problem) const = 0;
  virtual Result<AttentionConfig> default_config(const AttentionProblem& problem) const = 0;
  virtual Status check_config(const AttentionConfig& config,
                              const AttentionProblem& problem) const = 0;
  virtual std::string explain_plan(const AttentionProblem& problem) const = 0;

  virtual Result<KernelSource> render(const AttentionProblem& problem,
                                      const AttentionConfig& config) const = 0;
  virtual Result<Binary> compile(const KernelSource& source) const = 0;
  virtual Result<std::shared_ptr<Kernel>> load(const Binary& binary, const KernelSource& source,
                                               const ProblemSignature& signature,
                                               const AttentionConfig& config) const = 0;

  virtual Result<DeviceBuffer> allocate(size_t bytes) const = 0;
  virtual Status copy_to_device(void* dst, const void* src, size_t bytes) const = 0;
  virtual Status copy_to_host(void* dst, const void* src, size_t bytes) const = 0;
  virtual Status fill_bytes(void* dst, uint8_t value, size_t bytes) const = 0;
  virtual Status synchronize() const = 0;

  // Device time of `work` (which enqueues on the default stream), in milliseconds, measured
  // with events around `repetitions` back-to-back calls and divided by `repetitions`.
  virtual Result<double> time_ms(const std::function<Status()>& work, int repetitions) const = 0;

  // Builds the block map of `problem`'s mask_mod (with its causal flag, window and prefix) at
  // `block_m` x `block_n` on `stream` and waits for it (BlockMask::build_ms). Unsupported on a
  // backend whose kernels read no map (the CPU and HIP backends: their kernels find a mask_mod's
  // hidden blocks themselves or mask per element).
  virtual Result<BlockMask> build_block_mask(const AttentionProblem& problem, int block_m,
                                             int block_n, void* stream = nullptr) const {
    (void)problem, (void)block_m, (void)block_n, (void)stream;
    return make_error(ErrorCode::Unsupported, "the " + name() + " backend reads no block maps");
  }

  // True when compiling takes the cores the kernels run on (the CPU backend): a tuner must then
  // finish its compiles before it times anything, or the timings measure the compiler too.
  virtual bool compiles_share_the_device() const { return false; }

  // The physical device this backend times on, one string per device of the machine: tuners in
  // different processes whose ids are equal take turns to time (tuner/device_lock.hpp). The
  // fingerprint by default (identical GPUs of one machine then share a turn); the CUDA backend
  // names the GPU's PCI bus, the CPU backend's fingerprint is the host's.
  virtual std::string timing_device_id() const { return fingerprint().to_string(); }

  // A probe of other work on the device during a timing (DisturbanceProbe), for the tuner to
  // discard the batches it disturbed; null when the backend cannot see that (a GPU: there the
  // tuner's disturbance check, tuner/tuner.hpp, compares repeated medians instead).
  virtual std::unique_ptr<DisturbanceProbe> disturbance_probe() const { return nullptr; }
};

// A generator's config space over a backend's target (the DeviceSpec of a GPU, the CpuSpec of the
// CPU): its legal configs in a stable order, the untuned default, why one config is illegal, the
// budget arithmetic as `flashjit plan` prints it, and (when not null) the problems its template
// can run beyond validate().
template <class Target>
struct ConfigSpace {
  std::vector<AttentionConfig> (*legal)(const AttentionProblem&, const Target&);
  Result<AttentionConfig> (*default_config)(const AttentionProblem&, const Target&);
  Status (*check)(const AttentionConfig&, const AttentionProblem&, const Target&);
  std::string (*explain)(const AttentionProblem&, const Target&);
  Status (*check_problem)(const AttentionProblem&) = nullptr;
};

// A backend whose config space is `space` over config_target().
template <class Target>
class ConfigSpaceBackend : public Backend {
 public:
  explicit ConfigSpaceBackend(const ConfigSpace<Target>& space) : space_(space) {}

  Status check_problem(const AttentionProblem& problem) const override {
    return space_.check_problem ? space_.check_problem(problem) : validate(problem);
  }
  std::vector<AttentionConfig> legal_configs(const AttentionProblem& problem) const override {
    return space_.legal(problem, config_target());
  }
  Result<AttentionConfig> default_config(const AttentionProblem& problem) const override {
    return space_.default_config(problem, config_target());
  }
  Status check_config(const AttentionConfig& config,
                      const AttentionProblem& problem) const override {
    return space_.check(config, problem, config_target());
  }
  std::string explain_plan(const AttentionProblem& problem) const override {
    return space_.explain(problem, config_target());
  }

 protected:
  virtual const Target& config_target() const = 0;

 private:
  const ConfigSpace<Target>& space_;
};

// generator/config.hpp's space: the CUDA template's (f16/bf16 storage only).
inline constexpr ConfigSpace<DeviceSpec> kCudaConfigSpace{
    &::flashjit::legal_configs, &::flashjit::default_config, &::flashjit::check_config,
    &::flashjit::explain_plan, &::flashjit::check_cuda_problem};

// A backend that runs the CUDA template: its config space is generator/config.hpp's on device().
// The CUDA backend and the tests' fake GPU backends derive from it.
class CudaTemplateBackend : public ConfigSpaceBackend<DeviceSpec> {
 public:
  CudaTemplateBackend() : ConfigSpaceBackend(kCudaConfigSpace) {}

 protected:
  const DeviceSpec& config_target() const override { return device(); }
};

}  // namespace flashjit
