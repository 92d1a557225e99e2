// The HIP backend: hipRTC (in a worker process) compiles, the HIP runtime (dlopen'ed) loads and
// launches. Every entry point selects the backend's device on the calling thread first (HIP's
// current device is per thread), so a backend and its kernels can be used from any thread.
#include "runtime/hip/hip_backend.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "generator/decode_config.hpp"
#include "generator/hip_config.hpp"
#include "generator/render.hpp"
#include "runtime/decode_launch.hpp"
#include "runtime/gpu_launch.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"
#include "runtime/launch_params.hpp"
#include "runtime/table_check.hpp"
#include "runtime/workspace.hpp"
#include "templates/attention_params.h"

namespace flashjit::hip {
namespace {

// HIP's grid limits: y and z are kept to CUDA's 65535 blocks (what HIP reports as maxGridSize on
// CDNA is larger, but nothing here needs more); x times the block size must fit 32 bits, since
// AMD dispatch packets count work-items, not workgroups.
constexpr GridLimits kGridLimits{"HIP", 4294967295ll, 4294967295ll, 65535};

// A problem with `signature`'s compiled-in fields: LDS depends only on head_dim, the pass and the
// config.
AttentionProblem representative_problem(const ProblemSignature& signature) {
  AttentionProblem problem;
  problem.head_dim = signature.head_dim;
  problem.dtype = signature.dtype;
  problem.causal = signature.causal;
  problem.pass = signature.pass;
  return problem;
}

// Threads and LDS of each entry point of a kernel of `signature` with `config` (a decode kernel:
// its one entry, render_decode.hpp).
std::vector<KernelShape> hip_entry_shapes(const ProblemSignature& signature,
                                          const AttentionConfig& config) {
  const AttentionProblem problem = representative_problem(signature);
  if (config.family == KernelFamily::Decode)
    return {{config.warps * kHipWaveSize, hip_decode_lds_bytes(config, problem)}};
  return entry_shapes(signature.pass,
                      {config.warps * kHipWaveSize,
                       signature.pass == Pass::Forward ? hip_lds_bytes(config, problem) : 0},
                      hip_backward_shapes(config, problem));
}

// hipMalloc on device `ordinal`, freed by the buffer (after selecting the device again).
Result<DeviceBuffer> allocate_on(const Api* hip, int ordinal, size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  FLASHJIT_TRY(check(hip->hipSetDevice(ordinal), "hipSetDevice"));
  void* pointer = nullptr;
  const Status status = check(hip->hipMalloc(&pointer, bytes), "hipMalloc");
  if (!status.ok()) {
    return make_error(status.error().code,
                      status.error().message + " (" + std::to_string(bytes) + " bytes)");
  }
  return DeviceBuffer(pointer, bytes, [hip, ordinal](void* ptr) {
    if (hip->hipSetDevice(ordinal) == hipSuccess) (void)hip->hipFree(ptr);
  });
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

// The kernels of one module: one for the forward and for decode, three for the backward
// (render.hpp and render_decode.hpp name and shape them). Thread-safe to launch: the only mutable
// state is the workspace cache (the backward's, decode's partials).
class HipKernel final : public Kernel {
 public:
  HipKernel(const Api* api, int ordinal, const DeviceSpec& device, hipModule_t module,
            std::vector<hipFunction_t> functions, std::vector<KernelShape> shapes,
            ProblemSignature signature, AttentionConfig config, KernelInfo info)
      : api_(api),
        ordinal_(ordinal),
        device_(device),
        module_(module),
        functions_(std::move(functions)),
        shapes_(std::move(shapes)),
        signature_(signature),
        config_(config),
        info_(info),
        workspace_([api, ordinal](size_t bytes) { return allocate_on(api, ordinal, bytes); },
                   [api, ordinal](void* stream) -> Status {
                     FLASHJIT_TRY(check(api->hipSetDevice(ordinal), "hipSetDevice"));
                     return check(api->hipStreamSynchronize(static_cast<hipStream_t>(stream)),
                                  "hipStreamSynchronize", ErrorCode::LaunchFailed);
                   }) {}
  ~HipKernel() override {
    // Errors cannot be reported from a destructor.
    if (api_->hipSetDevice(ordinal_) == hipSuccess) (void)api_->hipModuleUnload(module_);
  }
  HipKernel(const HipKernel&) = delete;
  HipKernel& operator=(const HipKernel&) = delete;

  const ProblemSignature& signature() const override { return signature_; }
  const AttentionConfig& config() const override { return config_; }
  const KernelInfo& info() const override { return info_; }

  size_t workspace_bytes(const AttentionProblem& problem) const override {
    if (config_.family == KernelFamily::Decode)
      return gpu_decode_workspace(problem, config_, hip_decode_splits(config_, problem, device_))
          .bytes;
    return backward_workspace(problem, config_).bytes;
  }

  // The entries in order on `stream` (gpu_launch.hpp: checks, grids, the backward's workspace;
  // decode_launch.hpp for the decode family, its split counters zeroed with hipMemsetAsync).
  Status launch(const AttentionProblem& problem, const AttentionArgs& args,
                void* stream) const override {
    auto enqueue = [&](size_t entry, const LaunchShape& shape,
                       FlashjitAttentionParams& params) -> Status {
      FLASHJIT_TRY(check(api_->hipSetDevice(ordinal_), "hipSetDevice"));
      void* kernel_args[] = {&params};
      return check(
          api_->hipModuleLaunchKernel(
              functions_[entry], static_cast<unsigned>(shape.grid_x),
              static_cast<unsigned>(shape.grid_y), static_cast<unsigned>(shape.grid_z),
              static_cast<unsigned>(shape.threads), 1, 1, static_cast<unsigned>(shape.smem_bytes),
              static_cast<hipStream_t>(stream), kernel_args, nullptr),
          "hipModuleLaunchKernel", ErrorCode::LaunchFailed);
    };
    if (config_.family == KernelFamily::Decode) {
      // No HIP check kernel yet (issue 33): an explicit request is refused rather than ignored
      // (a debug build's default does not apply here).
      if (table_check_requested(args))
        return make_error(ErrorCode::Unsupported,
                          "check_tables / FLASHJIT_CHECK_TABLES=1: the decode table check is not "
                          "implemented on the HIP backend (CUDA and CPU have it)");
      return launch_gpu_decode(
          problem, args, signature_, config_, hip_decode_splits(config_, problem, device_), shapes_,
          kGridLimits, workspace_, stream, enqueue, [&](void* counters, size_t bytes) -> Status {
            FLASHJIT_TRY(check(api_->hipSetDevice(ordinal_), "hipSetDevice"));
            return check(api_->hipMemsetAsync(counters, 0, bytes, static_cast<hipStream_t>(stream)),
                         "hipMemsetAsync", ErrorCode::LaunchFailed);
          });
    }
    return launch_gpu_kernel(problem, args, signature_, config_, shapes_, kGridLimits, workspace_,
                             stream, enqueue);
  }

 private:
  const Api* api_;
  int ordinal_;
  const DeviceSpec device_;  // the decode family's auto splits need the CU count
  hipModule_t module_;
  std::vector<hipFunction_t> functions_;
  std::vector<KernelShape> shapes_;  // per entry
  ProblemSignature signature_;
  AttentionConfig config_;
  KernelInfo info_;
  mutable WorkspaceCache workspace_;
};

}  // namespace

Result<std::vector<LaunchGrid>> launch_grids(const AttentionProblem& problem,
                                             const AttentionConfig& config,
                                             const DeviceSpec* device) {
  const std::vector<KernelShape> shapes = hip_entry_shapes(ProblemSignature::of(problem), config);
  std::vector<LaunchShape> launches;
  if (config.family == KernelFamily::Decode) {
    if (device == nullptr && config.splits == 0)
      return make_error(ErrorCode::InvalidArgument,
                        "config " + config.to_string() +
                            ": auto splits depend on the device's CU count (pass the device)");
    const int splits =
        device ? hip_decode_splits(config, problem, *device) : decode_splits(config, problem, 1, 1);
    launches = {decode_launch(problem, config, splits, shapes[0]).split};
  } else if (problem.is_backward()) {
    const BackwardLaunch launch =
        backward_launch(problem, config, BackwardShapes{shapes[0], shapes[1], shapes[2]});
    launches = {launch.preprocess, launch.dkdv, launch.dq};
  } else {
    launches = {forward_launch(problem, config, shapes[0])};
  }
  std::vector<LaunchGrid> grids;
  for (const LaunchShape& launch : launches) {
    FLASHJIT_TRY(check_launch_shape(launch, kGridLimits));
    grids.push_back({static_cast<unsigned>(launch.grid_x), static_cast<unsigned>(launch.grid_y),
                     static_cast<unsigned>(launch.grid_z), static_cast<unsigned>(launch.threads),
                     static_cast<unsigned>(launch.smem_bytes)});
  }
  return grids;
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
  if (config.family == KernelFamily::Decode) {
    if (source.entries.size() != 1)
      return make_error(ErrorCode::InvalidArgument,
                        "'" + source.label + "' defines " + std::to_string(source.entries.size()) +
                            " entry points; a HIP decode kernel has 1 (split, which combines)");
  } else {
    FLASHJIT_TRY(check_entry_count(source, signature.pass));
  }
  const std::vector<KernelShape> shapes = hip_entry_shapes(signature, config);
  for (const KernelShape& shape : shapes) {
    if (shape.smem_bytes > device_.smem_per_block_optin) {
      return make_error(ErrorCode::InvalidArgument,
                        "config " + config.to_string() + " needs " +
                            std::to_string(shape.smem_bytes) + " bytes of LDS for " +
                            signature.to_string() + "; " + device_.name + " allows at most " +
                            std::to_string(device_.smem_per_block_optin));
    }
  }
  FLASHJIT_TRY(make_current());
  hipModule_t module = nullptr;
  FLASHJIT_TRY(check(api_->hipModuleLoadData(&module, binary.bytes.data()), "hipModuleLoadData"));
  auto fail = [&](const Status& status) -> Error {
    (void)api_->hipModuleUnload(module);
    return status.error();
  };
  std::vector<hipFunction_t> functions;
  KernelInfo info;  // of the main entry: the forward's, the backward's dK/dV kernel
  for (size_t e = 0; e < source.entries.size(); ++e) {
    const std::string& entry = source.entries[e];
    hipFunction_t function = nullptr;
    Status status =
        check(api_->hipModuleGetFunction(&function, module, entry.c_str()), "hipModuleGetFunction");
    if (!status.ok()) {
      return fail(
          make_error(status.error().code, status.error().message + " (entry '" + entry + "')"));
    }
    KernelInfo entry_info;
    entry_info.dynamic_smem_bytes = shapes[e].smem_bytes;
    entry_info.threads_per_block = shapes[e].threads;
    int max_threads = 0;
    status = check(api_->hipFuncGetAttribute(&entry_info.regs_per_thread,
                                             HIP_FUNC_ATTRIBUTE_NUM_REGS, function),
                   "hipFuncGetAttribute(NUM_REGS)");
    if (status.ok()) {
      status = check(api_->hipFuncGetAttribute(&entry_info.local_bytes_per_thread,
                                               HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, function),
                     "hipFuncGetAttribute(LOCAL_SIZE_BYTES)");
    }
    if (status.ok()) {
      status = check(api_->hipFuncGetAttribute(&max_threads,
                                               HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function),
                     "hipFuncGetAttribute(MAX_THREADS_PER_BLOCK)");
    }
    if (!status.ok()) return fail(status);
    if (max_threads > 0 && max_threads < entry_info.threads_per_block) {
      return fail(make_error(ErrorCode::Unsupported,
                             "'" + source.label + "' (entry '" + entry + "') runs at most " +
                                 std::to_string(max_threads) + " threads per workgroup; config " +
                                 config.to_string() + " needs " +
                                 std::to_string(entry_info.threads_per_block)));
    }
    if (e == (signature.pass == Pass::Backward ? 1u : 0u)) info = entry_info;
    functions.push_back(function);
  }
  return std::shared_ptr<Kernel>(std::make_shared<HipKernel>(
      api_, ordinal_, device_, module, std::move(functions), shapes, signature, config, info));
}

Result<DeviceBuffer> HipBackend::allocate(size_t bytes) const {
  return allocate_on(api_, ordinal_, bytes);
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
