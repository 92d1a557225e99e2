// The HIP backend: hipRTC (in a worker process) compiles, the HIP runtime (dlopen'ed) loads and
// launches. Every entry point selects the backend's device on the calling thread first (HIP's
// current device is per thread), so a backend and its kernels can be used from any thread.
#include "runtime/hip/hip_backend.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "generator/hip_config.hpp"
#include "generator/render.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"
#include "runtime/launch_params.hpp"
#include "templates/attention_params.h"

namespace flashjit::hip {
namespace {

// HIP's grid limits: y and z are kept to CUDA's 65535 blocks (what HIP reports as maxGridSize on
// CDNA is larger, but nothing here needs more); x times the block size must fit 32 bits, since
// AMD dispatch packets count work-items, not workgroups.
constexpr int64_t kMaxGridYZ = 65535;
constexpr int64_t kMaxWorkItemsX = 4294967295ll;

// A problem with `signature`'s compiled-in fields: LDS depends only on head_dim and the config.
AttentionProblem representative_problem(const ProblemSignature& signature) {
  AttentionProblem problem;
  problem.head_dim = signature.head_dim;
  problem.dtype = signature.dtype;
  problem.causal = signature.causal;
  return problem;
}

// Destroys two events on every path out of time_ms.
class EventPair {
 public:
  explicit EventPair(const Api& api) : api_(api) {}
  ~EventPair() {
    if (start != nullptr) (void)api_.hipEventDestroy(start);
    if (stop != nullptr) (void)api_.hipEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  hipEvent_t start = nullptr;
  hipEvent_t stop = nullptr;

 private:
  const Api& api_;
};

class HipKernel final : public Kernel {
 public:
  HipKernel(const Api* api, int ordinal, hipModule_t module, hipFunction_t function,
            ProblemSignature signature, AttentionConfig config, KernelInfo info)
      : api_(api),
        ordinal_(ordinal),
        module_(module),
        function_(function),
        signature_(signature),
        config_(config),
        info_(info) {}
  ~HipKernel() override {
    // Errors cannot be reported from a destructor.
    if (api_->hipSetDevice(ordinal_) == hipSuccess) (void)api_->hipModuleUnload(module_);
  }
  HipKernel(const HipKernel&) = delete;
  HipKernel& operator=(const HipKernel&) = delete;

  const ProblemSignature& signature() const override { return signature_; }
  const AttentionConfig& config() const override { return config_; }
  const KernelInfo& info() const override { return info_; }

  Status launch(const AttentionProblem& problem, const AttentionArgs& args,
                void* stream) const override {
    FLASHJIT_TRY(check_attention_launch(problem, args, signature_));
    Result<LaunchGrid> grid = launch_grid(problem, config_);
    if (!grid.ok()) return grid.error();
    FlashjitAttentionParams params = make_launch_params(problem, args);
    FLASHJIT_TRY(check(api_->hipSetDevice(ordinal_), "hipSetDevice"));
    void* kernel_args[] = {&params};
    return check(
        api_->hipModuleLaunchKernel(function_, grid->x, grid->y, grid->z, grid->threads, 1, 1,
                                    static_cast<unsigned>(info_.dynamic_smem_bytes),
                                    static_cast<hipStream_t>(stream), kernel_args, nullptr),
        "hipModuleLaunchKernel", ErrorCode::LaunchFailed);
  }

 private:
  const Api* api_;
  int ordinal_;
  hipModule_t module_;
  hipFunction_t function_;
  ProblemSignature signature_;
  AttentionConfig config_;
  KernelInfo info_;
};

}  // namespace

Result<LaunchGrid> launch_grid(const AttentionProblem& problem, const AttentionConfig& config) {
  LaunchGrid grid;
  const int64_t threads = int64_t{config.warps} * 64;
  const int64_t x = (problem.seqlen_q + config.block_m - 1) / config.block_m;
  if (problem.heads_q > kMaxGridYZ) {
    return make_error(ErrorCode::InvalidArgument, "heads_q = " + std::to_string(problem.heads_q) +
                                                      ": must be at most 65535 (grid y)");
  }
  if (problem.batch > kMaxGridYZ) {
    return make_error(ErrorCode::InvalidArgument, "batch = " + std::to_string(problem.batch) +
                                                      ": must be at most 65535 (grid z)");
  }
  if (x * threads > kMaxWorkItemsX) {
    return make_error(ErrorCode::InvalidArgument,
                      "seqlen_q = " + std::to_string(problem.seqlen_q) + ": needs " +
                          std::to_string(x) + " workgroups of " + std::to_string(threads) +
                          " threads in x, more than 2^32 - 1 work-items");
  }
  grid.x = static_cast<unsigned>(x);
  grid.y = static_cast<unsigned>(problem.heads_q);
  grid.z = static_cast<unsigned>(problem.batch);
  grid.threads = static_cast<unsigned>(threads);
  return grid;
}

Result<DeviceSpec> query_device(int ordinal) {
  Result<const Api*> loaded = api();
  if (!loaded.ok()) return loaded.error();
  const Api& hip = *loaded.value();
  int count = 0;
  FLASHJIT_TRY(check(hip.hipGetDeviceCount(&count), "hipGetDeviceCount", ErrorCode::NoDevice));
  if (ordinal < 0 || ordinal >= count) {
    return make_error(ErrorCode::NoDevice,
                      "HIP device ordinal " + std::to_string(ordinal) + " out of range: " +
                          (count == 0 ? std::string("no AMD GPU present")
                                      : std::to_string(count) + " device(s), valid 0.." +
                                            std::to_string(count - 1)));
  }
  // Room beyond the struct this build knows: a newer runtime's pre-6.0 layout may be longer.
  std::vector<unsigned char> storage(sizeof(hipDeviceProp_t) + 64 * 1024, 0);
  auto* properties = reinterpret_cast<hipDeviceProp_t*>(storage.data());
  FLASHJIT_TRY(check(hip.hipGetDeviceProperties(properties, ordinal), "hipGetDeviceProperties"));
  return device_spec_from_properties(*properties);
}

Result<std::unique_ptr<HipBackend>> HipBackend::create(int ordinal) {
  Result<DeviceSpec> spec = query_device(ordinal);
  if (!spec.ok()) return spec.error();
  const std::string processor = gcn_processor(spec->gcn_arch);
  if (!supported_processor(processor)) {
    return make_error(ErrorCode::Unsupported,
                      "HIP device " + std::to_string(ordinal) + " (" + spec->name + ", " +
                          spec->gcn_arch +
                          ") is not supported: the HIP template needs CDNA2/3 (gfx90a, gfx940, "
                          "gfx941, gfx942: bf16 MFMA, 64 KiB LDS, wave64)");
  }
  return std::unique_ptr<HipBackend>(
      new HipBackend(api().value(), ordinal, std::move(spec.value())));
}

HipBackend::HipBackend(const Api* api, int ordinal, DeviceSpec spec)
    : api_(api), ordinal_(ordinal), device_(std::move(spec)) {}

Status HipBackend::make_current() const {
  return check(api_->hipSetDevice(ordinal_), "hipSetDevice");
}

std::string HipBackend::compiler_fingerprint() const {
  return hiprtc_version() + " " + device_.gcn_arch;
}

DeviceFingerprint HipBackend::fingerprint() const {
  DeviceFingerprint fingerprint;
  fingerprint.backend = name();
  fingerprint.name = device_.name;
  fingerprint.arch = gcn_arch_number(device_.gcn_arch);
  fingerprint.sm_count = device_.sm_count;
  fingerprint.smem_per_block_optin = device_.smem_per_block_optin;
  fingerprint.l2_bytes = device_.l2_bytes;
  int driver_version = 0;
  if (api_->hipDriverGetVersion(&driver_version) != hipSuccess) driver_version = 0;
  fingerprint.driver_version = driver_version;
  // The target's feature flags (xnack, sramecc) change the code: part of the compiler field.
  fingerprint.compiler = hiprtc_version() + " " + device_.gcn_arch;
  return fingerprint;
}

std::vector<AttentionConfig> HipBackend::legal_configs(const AttentionProblem& problem) const {
  return legal_hip_configs(problem, device_);
}
Result<AttentionConfig> HipBackend::default_config(const AttentionProblem& problem) const {
  return default_hip_config(problem, device_);
}
Status HipBackend::check_config(const AttentionConfig& config,
                                const AttentionProblem& problem) const {
  return check_hip_config(config, problem, device_);
}
std::string HipBackend::explain_plan(const AttentionProblem& problem) const {
  return explain_hip_plan(problem, device_);
}

Result<KernelSource> HipBackend::render(const AttentionProblem& problem,
                                        const AttentionConfig& config) const {
  return render_hip_attention(problem, config);
}

Result<Binary> HipBackend::compile(const KernelSource& source) const {
  return hiprtc_compile(source, device_.gcn_arch);
}

Result<std::shared_ptr<Kernel>> HipBackend::load(const Binary& binary, const KernelSource& source,
                                                 const ProblemSignature& signature,
                                                 const AttentionConfig& config) const {
  if (binary.bytes.empty()) {
    return make_error(ErrorCode::InvalidArgument,
                      "empty binary for '" + source.label + "': nothing to load");
  }
  const int lds = hip_lds_bytes(config, representative_problem(signature));
  if (lds > device_.smem_per_block_optin) {
    return make_error(ErrorCode::InvalidArgument, "config " + config.to_string() + " needs " +
                                                      std::to_string(lds) + " bytes of LDS for d" +
                                                      std::to_string(signature.head_dim) + "; " +
                                                      device_.name + " allows at most " +
                                                      std::to_string(device_.smem_per_block_optin));
  }
  FLASHJIT_TRY(make_current());
  hipModule_t module = nullptr;
  FLASHJIT_TRY(check(api_->hipModuleLoadData(&module, binary.bytes.data()), "hipModuleLoadData"));
  auto fail = [&](const Status& status) -> Error {
    (void)api_->hipModuleUnload(module);
    return status.error();
  };
  hipFunction_t function = nullptr;
  Status status = check(api_->hipModuleGetFunction(&function, module, source.entry().c_str()),
                        "hipModuleGetFunction");
  if (!status.ok()) {
    return fail(make_error(status.error().code,
                           status.error().message + " (entry '" + source.entry() + "')"));
  }
  KernelInfo info;
  info.dynamic_smem_bytes = lds;
  info.threads_per_block = config.warps * 64;
  int max_threads = 0;
  status =
      check(api_->hipFuncGetAttribute(&info.regs_per_thread, HIP_FUNC_ATTRIBUTE_NUM_REGS, function),
            "hipFuncGetAttribute(NUM_REGS)");
  if (status.ok()) {
    status = check(api_->hipFuncGetAttribute(&info.local_bytes_per_thread,
                                             HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, function),
                   "hipFuncGetAttribute(LOCAL_SIZE_BYTES)");
  }
  if (status.ok()) {
    status = check(
        api_->hipFuncGetAttribute(&max_threads, HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function),
        "hipFuncGetAttribute(MAX_THREADS_PER_BLOCK)");
  }
  if (!status.ok()) return fail(status);
  if (max_threads > 0 && max_threads < info.threads_per_block) {
    return fail(make_error(ErrorCode::Unsupported,
                           "'" + source.label + "' runs at most " + std::to_string(max_threads) +
                               " threads per workgroup; config " + config.to_string() + " needs " +
                               std::to_string(info.threads_per_block)));
  }
  return std::shared_ptr<Kernel>(
      std::make_shared<HipKernel>(api_, ordinal_, module, function, signature, config, info));
}

Result<DeviceBuffer> HipBackend::allocate(size_t bytes) const {
  if (bytes == 0) return DeviceBuffer();
  FLASHJIT_TRY(make_current());
  void* pointer = nullptr;
  const Status status = check(api_->hipMalloc(&pointer, bytes), "hipMalloc");
  if (!status.ok()) {
    return make_error(status.error().code,
                      status.error().message + " (" + std::to_string(bytes) + " bytes)");
  }
  const Api* hip = api_;
  const int ordinal = ordinal_;
  return DeviceBuffer(pointer, bytes, [hip, ordinal](void* ptr) {
    if (hip->hipSetDevice(ordinal) == hipSuccess) (void)hip->hipFree(ptr);
  });
}

Status HipBackend::copy_to_device(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return ok_status();
  FLASHJIT_TRY(make_current());
  return check(api_->hipMemcpy(dst, src, bytes, hipMemcpyHostToDevice), "hipMemcpy(HtoD)");
}

Status HipBackend::copy_to_host(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return ok_status();
  FLASHJIT_TRY(make_current());
  return check(api_->hipMemcpy(dst, src, bytes, hipMemcpyDeviceToHost), "hipMemcpy(DtoH)");
}

Status HipBackend::fill_bytes(void* dst, uint8_t value, size_t bytes) const {
  if (bytes == 0) return ok_status();
  FLASHJIT_TRY(make_current());
  return check(api_->hipMemset(dst, value, bytes), "hipMemset");
}

Status HipBackend::synchronize() const {
  FLASHJIT_TRY(make_current());
  return check(api_->hipDeviceSynchronize(), "hipDeviceSynchronize", ErrorCode::LaunchFailed);
}

Result<double> HipBackend::time_ms(const std::function<Status()>& work, int repetitions) const {
  if (repetitions < 1) {
    return make_error(ErrorCode::InvalidArgument,
                      "repetitions = " + std::to_string(repetitions) + ": must be at least 1");
  }
  FLASHJIT_TRY(make_current());
  EventPair events(*api_);
  FLASHJIT_TRY(check(api_->hipEventCreate(&events.start), "hipEventCreate"));
  FLASHJIT_TRY(check(api_->hipEventCreate(&events.stop), "hipEventCreate"));
  FLASHJIT_TRY(check(api_->hipEventRecord(events.start, nullptr), "hipEventRecord"));
  for (int i = 0; i < repetitions; ++i) FLASHJIT_TRY(work());
  FLASHJIT_TRY(check(api_->hipEventRecord(events.stop, nullptr), "hipEventRecord"));
  FLASHJIT_TRY(check(api_->hipEventSynchronize(events.stop), "hipEventSynchronize",
                     ErrorCode::LaunchFailed));
  float elapsed_ms = 0;
  FLASHJIT_TRY(check(api_->hipEventElapsedTime(&elapsed_ms, events.start, events.stop),
                     "hipEventElapsedTime"));
  return static_cast<double>(elapsed_ms) / repetitions;
}

}  // namespace flashjit::hip
