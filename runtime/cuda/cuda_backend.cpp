// The CUDA backend: NVRTC compiles, the driver API (dlopen'ed) loads and launches, on the primary
// context of one device. Every entry point makes that context current on the calling thread
// first, so a backend (and its kernels) can be used from any thread.
#include "runtime/cuda/cuda_backend.hpp"

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "generator/backward_config.hpp"
#include "generator/backward_config_ws.hpp"
#include "generator/config.hpp"
#include "generator/decode_config.hpp"
#include "generator/forward_config_ws.hpp"
#include "generator/render.hpp"
#include "runtime/cuda/block_mask.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "runtime/cuda/tensor_maps.hpp"
#include "runtime/decode_launch.hpp"
#include "runtime/gpu_launch.hpp"
#include "runtime/launch_params.hpp"
#include "runtime/table_check.hpp"
#include "runtime/workspace.hpp"
#include "templates/attention_params.h"

namespace flashjit::cuda {
namespace {

// Grid y and z are limited to 65535 blocks (x to 2^31 - 1).
constexpr GridLimits kGridLimits{"CUDA", 2147483647, 0, 65535};

// A problem with `signature`'s compiled-in fields: shared memory depends only on head_dim and the
// config, so this stands in for any problem the kernel will run.
AttentionProblem representative_problem(const ProblemSignature& signature) {
  AttentionProblem problem;
  problem.head_dim = signature.head_dim;
  problem.dtype = signature.dtype;
  problem.causal = signature.causal;
  problem.pass = signature.pass;
  problem.kv.page_size = signature.page_size;
  return problem;
}

Result<int> device_attribute(const Driver& driver, CUdevice device, CUdevice_attribute attribute,
                             const char* attribute_name) {
  int value = 0;
  Status status = check(driver.cuDeviceGetAttribute(&value, attribute, device), attribute_name,
                        ErrorCode::DriverError);
  if (!status.ok()) return status.error();
  return value;
}

// Retains the device's primary context: each owner of driver resources (backend, kernel, device
// buffer) holds its own reference, so that resources outliving the backend stay valid.
Result<CUcontext> retain_primary_context(const Driver& driver, CUdevice device) {
  CUcontext context = nullptr;
  FLASHJIT_TRY(check(driver.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain",
                     ErrorCode::NoDevice));
  return context;
}

// Destroys two events on every path out of time_ms.
class EventPair {
 public:
  explicit EventPair(const Driver& driver) : driver_(driver) {}
  ~EventPair() {
    if (start != nullptr) driver_.cuEventDestroy(start);
    if (stop != nullptr) driver_.cuEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;

  CUevent start = nullptr;
  CUevent stop = nullptr;

 private:
  const Driver& driver_;
};

// cuMemAlloc on `device`'s primary context; the buffer holds a context reference of its own so
// that it may outlive whoever allocated it (the backend, a kernel).
Result<DeviceBuffer> allocate_on(const Driver* cu, CUdevice device, size_t bytes) {
  if (bytes == 0) return DeviceBuffer();  // cuMemAlloc rejects 0; an empty buffer is the answer
  Result<CUcontext> context = retain_primary_context(*cu, device);
  if (!context.ok()) return context.error();
  const CUcontext owner = context.value();
  Status status = check(cu->cuCtxSetCurrent(owner), "cuCtxSetCurrent");
  CUdeviceptr pointer = 0;
  if (status.ok()) status = check(cu->cuMemAlloc(&pointer, bytes), "cuMemAlloc");
  if (!status.ok()) {
    cu->cuDevicePrimaryCtxRelease(device);
    return make_error(status.error().code,
                      status.error().message + " (" + std::to_string(bytes) + " bytes)");
  }
  return DeviceBuffer(reinterpret_cast<void*>(pointer), bytes, [cu, device, owner](void* ptr) {
    if (cu->cuCtxSetCurrent(owner) == CUDA_SUCCESS) {
      cu->cuMemFree(reinterpret_cast<CUdeviceptr>(ptr));
    }
    cu->cuDevicePrimaryCtxRelease(device);
  });
}

// The decode table check kernel (templates/checks/decode_tables.h) compiled for `arch`: once per
// process and architecture (each decode kernel loads it into its own module on first use).
Result<Binary> table_check_binary(int arch) {
  static std::mutex mutex;
  static std::map<int, Binary> binaries;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto found = binaries.find(arch); found != binaries.end()) return found->second;
  KernelSource source;
  source.entries = {kDecodeTableCheckEntry};
  source.text = decode_table_check_source();
  source.label = "decode table check";
  if (source.text.empty())
    return make_error(ErrorCode::Unsupported,
                      "checks/decode_tables.h is not embedded in this build");
  Result<Binary> binary = nvrtc_compile(source, arch);
  if (!binary.ok()) return binary.error();
  return binaries.emplace(arch, std::move(binary.value())).first->second;
}

// The kernels of one module: one for the forward, three for the backward (render.hpp names and
// shapes them). Thread-safe to launch: the only mutable state is the backward's workspace cache.
// A forward whose entry takes tensor maps (KernelSource::tensor_maps: the -ws family) gets them
// encoded for each launch from the launch's pointers and strides.
class CudaKernel final : public Kernel {
 public:
  CudaKernel(const Driver* driver, CUdevice device, CUcontext context, CUmodule module,
             std::vector<CUfunction> functions, std::vector<KernelShape> shapes,
             ProblemSignature signature, AttentionConfig config, KernelInfo info, bool tensor_maps,
             bool block_mask, DeviceSpec device_spec)
      : tensor_maps_(tensor_maps),
        device_spec_(std::move(device_spec)),
        driver_(driver),
        device_(device),
        context_(context),
        module_(module),
        functions_(std::move(functions)),
        shapes_(std::move(shapes)),
        signature_(signature),
        config_(config),
        info_(info),
        workspace_([driver, device](size_t bytes) { return allocate_on(driver, device, bytes); },
                   [driver, context](void* stream) -> Status {
                     FLASHJIT_TRY(check(driver->cuCtxSetCurrent(context), "cuCtxSetCurrent"));
                     return check(driver->cuStreamSynchronize(static_cast<CUstream>(stream)),
                                  "cuStreamSynchronize", ErrorCode::LaunchFailed);
                   }) {
    if (block_mask)
      block_masks_ = std::make_unique<BlockMaskCache>(driver, context, device_spec_.arch,
                                                      config.block_m, config.block_n);
  }

  ~CudaKernel() override {
    block_masks_.reset();  // its buffers and module first, in the context we still hold
    // Errors cannot be reported from a destructor; the context reference is ours, so it is alive.
    if (driver_->cuCtxSetCurrent(context_) == CUDA_SUCCESS) {
      driver_->cuModuleUnload(module_);
      if (check_module_ != nullptr) driver_->cuModuleUnload(check_module_);
    }
    driver_->cuDevicePrimaryCtxRelease(device_);
  }
  CudaKernel(const CudaKernel&) = delete;
  CudaKernel& operator=(const CudaKernel&) = delete;

  const ProblemSignature& signature() const override { return signature_; }
  const AttentionConfig& config() const override { return config_; }
  const KernelInfo& info() const override { return info_; }

  size_t workspace_bytes(const AttentionProblem& problem) const override {
    if (config_.family == KernelFamily::Decode)
      return gpu_decode_workspace(problem, config_, decode_splits(config_, problem, device_spec_))
          .bytes;
    return backward_workspace(problem, config_).bytes;
  }

  // The entries in order on `stream` (gpu_launch.hpp: checks, grids, the backward's workspace;
  // decode_launch.hpp for the decode family).
  Status launch(const AttentionProblem& problem, const AttentionArgs& args,
                void* stream) const override {
    if (config_.family == KernelFamily::Decode) {
      return launch_gpu_decode(
          problem, args, signature_, config_, decode_splits(config_, problem, device_spec_),
          shapes_, kGridLimits, workspace_, stream,
          [&](size_t entry, const LaunchShape& shape, FlashjitAttentionParams& params) -> Status {
            return enqueue(problem, entry, shape, params, stream);
          },
          [&](void* counters, size_t bytes) -> Status {
            FLASHJIT_TRY(check(driver_->cuCtxSetCurrent(context_), "cuCtxSetCurrent"));
            return check(
                driver_->cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(counters), 0,
                                          bytes / sizeof(int32_t), static_cast<CUstream>(stream)),
                "cuMemsetD32Async", ErrorCode::LaunchFailed);
          },
          [&]() -> Status {
            if (!table_check_enabled(args)) return ok_status();
            return enqueue_table_check(problem, args, stream);
          });
    }
    // A mask_mod's block map: the caller's, else this kernel's for the shape (built on first
    // use), taken when the first entry that reads it is enqueued (after the launch's checks).
    FlashjitBlockMask block_mask{};
    bool have_mask = false;
    return launch_gpu_kernel(
        problem, args, signature_, config_, shapes_, kGridLimits, workspace_, stream,
        [&](size_t entry, const LaunchShape& shape, FlashjitAttentionParams& params) -> Status {
          if (block_masks_ && !have_mask && (!problem.is_backward() || entry != 0)) {
            if (args.block_mask != nullptr) {
              FLASHJIT_TRY(check_block_mask(problem, *args.block_mask));
              block_mask = *args.block_mask;
            } else {
              FLASHJIT_TRY(check(driver_->cuCtxSetCurrent(context_), "cuCtxSetCurrent"));
              Result<FlashjitBlockMask> built =
                  block_masks_->get(problem, static_cast<CUstream>(stream));
              if (!built.ok()) return built.error();
              block_mask = built.value();
            }
            have_mask = true;
          }
          return enqueue(problem, entry, shape, params, stream, &block_mask);
        });
  }

  std::pair<int, int> block_mask_tile() const override {
    if (!block_masks_) return {0, 0};
    return {config_.block_m, config_.block_n};
  }

  Result<double> block_mask_build_ms(const AttentionProblem& problem, void* stream) const override {
    if (!block_masks_) return Kernel::block_mask_build_ms(problem, stream);
    FLASHJIT_TRY(validate(problem));
    return block_masks_->time_build(problem, static_cast<CUstream>(stream));
  }

 private:
  // The decode table check (runtime/table_check.hpp) on `stream`, before the decode kernel: one
  // block, no host sync. The first checked call compiles (once per process) and loads it: warm up
  // before capturing a CUDA graph, as for the workspace.
  Status enqueue_table_check(const AttentionProblem& problem, const AttentionArgs& args,
                             void* stream) const {
    FLASHJIT_TRY(check(driver_->cuCtxSetCurrent(context_), "cuCtxSetCurrent"));
    CUfunction function = nullptr;
    {
      std::lock_guard<std::mutex> lock(check_mutex_);
      if (check_function_ == nullptr) {
        Result<Binary> binary = table_check_binary(device_spec_.arch);
        if (!binary.ok()) return binary.error();
        CUmodule module = nullptr;
        FLASHJIT_TRY(check(driver_->cuModuleLoadData(&module, binary->bytes.data()),
                           "cuModuleLoadData (decode table check)"));
        Status found =
            check(driver_->cuModuleGetFunction(&check_function_, module, kDecodeTableCheckEntry),
                  "cuModuleGetFunction (decode table check)");
        if (!found.ok()) {
          driver_->cuModuleUnload(module);
          check_function_ = nullptr;
          return found;
        }
        check_module_ = module;
      }
      function = check_function_;
    }
    FlashjitDecodeTables tables = decode_tables_of(problem, args);
    void* kernel_args[] = {&tables};
    return check(driver_->cuLaunchKernel(function, 1, 1, 1, kDecodeTableCheckThreads, 1, 1, 0,
                                         static_cast<CUstream>(stream), kernel_args, nullptr),
                 "cuLaunchKernel (decode table check)", ErrorCode::LaunchFailed);
  }

  // Enqueues entry `entry` of a launch of `problem` with `shape` on `stream`.
  Status enqueue(const AttentionProblem& problem, size_t entry, const LaunchShape& shape,
                 FlashjitAttentionParams& params, void* stream,
                 FlashjitBlockMask* block_mask = nullptr) const {
    FLASHJIT_TRY(check(driver_->cuCtxSetCurrent(context_), "cuCtxSetCurrent"));
    FlashjitForwardTensorMaps maps;
    // The backward's row kernels (entries 0 and 2) take the params only: the maps are for its
    // fused kernel (entry 1, the ws family).
    if (tensor_maps_ && (!problem.is_backward() || entry == 1))
      FLASHJIT_TRY(encode_forward_tensor_maps(*driver_, params, problem, config_, &maps));
    // Then the block map (a forward's entry; the backward's dK/dV and dQ entries), after the maps
    // when the entry takes those too.
    const bool takes_mask = block_masks_ && (!problem.is_backward() || entry != 0);
    void* kernel_args[] = {
        &params,
        takes_mask && !tensor_maps_ ? static_cast<void*>(block_mask) : static_cast<void*>(&maps),
        block_mask};
    return check(driver_->cuLaunchKernel(functions_[entry], static_cast<unsigned>(shape.grid_x),
                                         static_cast<unsigned>(shape.grid_y),
                                         static_cast<unsigned>(shape.grid_z),
                                         static_cast<unsigned>(shape.threads), 1, 1,
                                         static_cast<unsigned>(shape.smem_bytes),
                                         static_cast<CUstream>(stream), kernel_args, nullptr),
                 "cuLaunchKernel", ErrorCode::LaunchFailed);
  }

  // A user-built block map fits this kernel: its tile, the problem's tiles and maps.
  Status check_block_mask(const AttentionProblem& problem, const FlashjitBlockMask& map) const {
    const BlockMaskShape shape = block_mask_shape(problem, config_.block_m, config_.block_n);
    if (map.block_m == shape.block_m && map.block_n == shape.block_n &&
        map.q_tiles == shape.q_tiles() && map.k_tiles == shape.k_tiles() &&
        map.maps == shape.maps() && map.q_count != nullptr && map.q_list != nullptr &&
        map.k_count != nullptr && map.k_list != nullptr)
      return ok_status();
    return make_error(ErrorCode::InvalidArgument,
                      "block_mask of m" + std::to_string(map.block_m) + " n" +
                          std::to_string(map.block_n) + ", " + std::to_string(map.q_tiles) + " x " +
                          std::to_string(map.k_tiles) + " tiles, " + std::to_string(map.maps) +
                          " map(s): kernel " + config_.to_string() + " needs the map of " +
                          shape.to_string() + " (build it at Kernel::block_mask_tile)");
  }

  const bool tensor_maps_;        // the entry takes (params, maps) rather than (params)
  const DeviceSpec device_spec_;  // the decode family's auto splits need the SM count
  const Driver* driver_;
  CUdevice device_;
  CUcontext context_;
  CUmodule module_;
  std::vector<CUfunction> functions_;
  std::vector<KernelShape> shapes_;  // per entry
  ProblemSignature signature_;
  AttentionConfig config_;
  KernelInfo info_;
  mutable WorkspaceCache workspace_;
  mutable std::mutex check_mutex_;  // the table check's module, loaded on first use
  mutable CUmodule check_module_ = nullptr;
  mutable CUfunction check_function_ = nullptr;
  std::unique_ptr<BlockMaskCache> block_masks_;  // a kernel that reads a block map: its maps
};

}  // namespace

int device_count() {
  const Result<const Driver*> loaded = driver();
  if (!loaded.ok()) return 0;
  int count = 0;
  if (loaded.value()->cuDeviceGetCount(&count) != CUDA_SUCCESS) return 0;
  return count;
}

Result<DeviceSpec> query_device(int ordinal) {
  Result<const Driver*> loaded = driver();
  if (!loaded.ok()) return loaded.error();
  const Driver& cu = *loaded.value();

  int count = 0;
  FLASHJIT_TRY(check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount", ErrorCode::NoDevice));
  if (ordinal < 0 || ordinal >= count) {
    return make_error(ErrorCode::NoDevice,
                      "CUDA device ordinal " + std::to_string(ordinal) + " out of range: " +
                          (count == 0 ? std::string("no CUDA device present")
                                      : std::to_string(count) + " device(s), valid 0.." +
                                            std::to_string(count - 1)));
  }
  CUdevice device = 0;
  FLASHJIT_TRY(check(cu.cuDeviceGet(&device, ordinal), "cuDeviceGet", ErrorCode::NoDevice));

  DeviceSpec spec;
  char name[256] = {};
  FLASHJIT_TRY(check(cu.cuDeviceGetName(name, static_cast<int>(sizeof(name)) - 1, device),
                     "cuDeviceGetName"));
  spec.name = name;

  // Each attribute read through one helper so that a failure names the attribute.
#define FLASHJIT_READ_ATTRIBUTE(variable, attribute)                          \
  Result<int> variable = device_attribute(cu, device, attribute, #attribute); \
  if (!variable.ok()) return variable.error();
  FLASHJIT_READ_ATTRIBUTE(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
  FLASHJIT_READ_ATTRIBUTE(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
  FLASHJIT_READ_ATTRIBUTE(sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
  FLASHJIT_READ_ATTRIBUTE(smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
  FLASHJIT_READ_ATTRIBUTE(smem_per_sm, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
  FLASHJIT_READ_ATTRIBUTE(regs_per_sm, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)
  FLASHJIT_READ_ATTRIBUTE(threads_per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
  FLASHJIT_READ_ATTRIBUTE(threads_per_block, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
  FLASHJIT_READ_ATTRIBUTE(l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
#undef FLASHJIT_READ_ATTRIBUTE

  spec.arch = major.value() * 10 + minor.value();
  spec.sm_count = sm_count.value();
  spec.smem_per_block_optin = smem_optin.value();
  spec.smem_per_sm = smem_per_sm.value();
  spec.regs_per_sm = regs_per_sm.value();
  spec.max_regs_per_thread = 255;  // every architecture since sm_35
  spec.max_threads_per_sm = threads_per_sm.value();
  spec.max_threads_per_block = threads_per_block.value();
  spec.l2_bytes = l2_bytes.value();
  return spec;
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int ordinal) {
  Result<DeviceSpec> spec = query_device(ordinal);
  if (!spec.ok()) return spec.error();
  if (spec->arch < 80) {
    return make_error(ErrorCode::Unsupported,
                      "device " + std::to_string(ordinal) + " (" + spec->name +
                          ") has compute capability " + std::to_string(spec->arch / 10) + "." +
                          std::to_string(spec->arch % 10) +
                          ": flashjit needs 8.0 or newer (mma.sync bf16, cp.async, ldmatrix)");
  }
  const Driver* cu = driver().value();  // query_device succeeded, so the driver is loaded
  CUdevice device = 0;
  FLASHJIT_TRY(check(cu->cuDeviceGet(&device, ordinal), "cuDeviceGet", ErrorCode::NoDevice));
  Result<CUcontext> context = retain_primary_context(*cu, device);
  if (!context.ok()) return context.error();
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(cu, device, context.value(), std::move(spec.value())));
}

CudaBackend::CudaBackend(const Driver* driver, CUdevice device, CUcontext context, DeviceSpec spec)
    : driver_(driver), device_handle_(device), context_(context), device_(std::move(spec)) {}

CudaBackend::~CudaBackend() { driver_->cuDevicePrimaryCtxRelease(device_handle_); }

Status CudaBackend::make_current() const {
  return check(driver_->cuCtxSetCurrent(context_), "cuCtxSetCurrent");
}

std::string CudaBackend::compiler_fingerprint() const {
  return nvrtc_version() + " sm_" + std::to_string(device_.arch);
}

std::string CudaBackend::timing_device_id() const {
  char bus[64] = {};
  if (driver_->cuDeviceGetPCIBusId != nullptr &&
      driver_->cuDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus) - 1, device_handle_) ==
          CUDA_SUCCESS) {
    return std::string("cuda pci ") + bus;
  }
  return fingerprint().to_string() + "|device " + std::to_string(device_handle_);
}

DeviceFingerprint CudaBackend::fingerprint() const {
  DeviceFingerprint fingerprint;
  fingerprint.backend = name();
  fingerprint.name = device_.name;
  fingerprint.arch = device_.arch;
  fingerprint.sm_count = device_.sm_count;
  fingerprint.smem_per_block_optin = device_.smem_per_block_optin;
  fingerprint.l2_bytes = device_.l2_bytes;
  int driver_version = 0;
  if (driver_->cuDriverGetVersion(&driver_version) != CUDA_SUCCESS) driver_version = 0;
  fingerprint.driver_version = driver_version;
  fingerprint.compiler = nvrtc_version();
  return fingerprint;
}

Result<KernelSource> CudaBackend::render(const AttentionProblem& problem,
                                         const AttentionConfig& config) const {
  return render_cuda_attention(problem, config);
}

Result<Binary> CudaBackend::compile(const KernelSource& source) const {
  return nvrtc_compile(source, device_.arch);
}

Result<std::shared_ptr<Kernel>> CudaBackend::load(const Binary& binary, const KernelSource& source,
                                                  const ProblemSignature& signature,
                                                  const AttentionConfig& config) const {
  if (binary.bytes.empty()) {
    return make_error(ErrorCode::InvalidArgument,
                      "empty binary for '" + source.label + "': nothing to load");
  }
  const bool backward = signature.pass == Pass::Backward;
  const bool decode = config.family == KernelFamily::Decode;
  if (decode) {
    if (source.entries.size() != 1)
      return make_error(ErrorCode::InvalidArgument,
                        "'" + source.label + "' defines " + std::to_string(source.entries.size()) +
                            " entry points; a CUDA decode kernel has 1 (split, which combines)");
  } else {
    FLASHJIT_TRY(check_entry_count(source, signature.pass));
  }
  FLASHJIT_TRY(make_current());

  // Per entry: threads per block and dynamic shared memory (render.hpp gives the backward's,
  // render_decode.hpp the decode family's).
  const AttentionProblem problem = representative_problem(signature);
  const DecodeResources decode_use = decode_resources(config, problem);
  // A persistent forward gets one CTA per SM slot of this device.
  const int persistent_ctas =
      !backward && config.persistent ? ws_persistent_ctas(config, problem, device_) : 0;
  const std::vector<KernelShape> shapes =
      decode ? std::vector<KernelShape>{{decode_use.threads, decode_use.smem_bytes}}
             : entry_shapes(
                   signature.pass,
                   {config.threads(), backward ? 0 : smem_bytes(config, problem), persistent_ctas},
                   backward_shapes(
                       config,
                       {backward_dkdv_threads(config), backward_dkdv_smem_bytes(config, problem),
                        backward && config.family == KernelFamily::Ws
                            ? ws_backward_persistent_ctas(config, device_)
                            : 0},
                       {backward_dq_threads(config), backward_dq_smem_bytes(config, problem)}));
  for (const KernelShape& shape : shapes) {
    const int smem = shape.smem_bytes;
    if (smem > device_.smem_per_block_optin) {
      return make_error(ErrorCode::InvalidArgument,
                        "config " + config.to_string() + " needs " + std::to_string(smem) +
                            " bytes of shared memory for " + signature.to_string() + "; " +
                            device_.name + " allows at most " +
                            std::to_string(device_.smem_per_block_optin));
    }
  }

  // The kernel holds its own context reference, released after its module is unloaded.
  Result<CUcontext> context = retain_primary_context(*driver_, device_handle_);
  if (!context.ok()) return context.error();
  CUmodule module = nullptr;
  // Cleans up on every error path below; disarmed once the kernel object owns both.
  auto fail = [&](Status status) -> Error {
    if (module != nullptr) driver_->cuModuleUnload(module);
    driver_->cuDevicePrimaryCtxRelease(device_handle_);
    return status.error();
  };

  Status status =
      check(driver_->cuModuleLoadData(&module, binary.bytes.data()), "cuModuleLoadData");
  if (!status.ok()) return fail(status);
  std::vector<CUfunction> functions;
  KernelInfo info;  // of the main kernel: the forward's, the backward's dK/dV kernel
  for (size_t e = 0; e < source.entries.size(); ++e) {
    const std::string& entry = source.entries[e];
    const int threads = shapes[e].threads, smem = shapes[e].smem_bytes;
    CUfunction function = nullptr;
    status = check(driver_->cuModuleGetFunction(&function, module, entry.c_str()),
                   "cuModuleGetFunction");
    if (!status.ok()) {
      return fail(
          make_error(status.error().code, status.error().message + " (entry '" + entry + "')"));
    }
    // Above 48 KiB a kernel must opt in to its dynamic shared memory; setting it always is
    // harmless.
    status = check(driver_->cuFuncSetAttribute(
                       function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                   "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    if (!status.ok()) {
      return fail(make_error(
          status.error().code,
          status.error().message + " (" + std::to_string(smem) + " bytes, entry '" + entry + "')"));
    }
    KernelInfo entry_info;
    entry_info.dynamic_smem_bytes = smem;
    entry_info.threads_per_block = threads;
    int max_threads = 0;
    status = check(driver_->cuFuncGetAttribute(&entry_info.regs_per_thread,
                                               CU_FUNC_ATTRIBUTE_NUM_REGS, function),
                   "cuFuncGetAttribute(NUM_REGS)");
    if (status.ok()) {
      status = check(driver_->cuFuncGetAttribute(&entry_info.local_bytes_per_thread,
                                                 CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, function),
                     "cuFuncGetAttribute(LOCAL_SIZE_BYTES)");
    }
    if (status.ok()) {
      status = check(driver_->cuFuncGetAttribute(&max_threads,
                                                 CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function),
                     "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)");
    }
    if (!status.ok()) return fail(status);
    // Too many registers for the block size would only show up as a launch failure later.
    if (max_threads < threads) {
      return fail(make_error(ErrorCode::Unsupported,
                             "'" + source.label + "' (entry '" + entry + "') uses " +
                                 std::to_string(entry_info.regs_per_thread) +
                                 " registers per thread, so at most " +
                                 std::to_string(max_threads) + " threads fit in a block; config " +
                                 config.to_string() + " needs " + std::to_string(threads)));
    }
    if (e == (backward ? 1 : 0)) info = entry_info;
    functions.push_back(function);
  }

  return std::shared_ptr<Kernel>(std::make_shared<CudaKernel>(
      driver_, device_handle_, context.value(), module, std::move(functions), shapes, signature,
      config, info, source.tensor_maps, source.block_mask, device_));
}

Result<DeviceBuffer> CudaBackend::allocate(size_t bytes) const {
  return allocate_on(driver_, device_handle_, bytes);
}

Status CudaBackend::copy_to_device(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return ok_status();
  FLASHJIT_TRY(make_current());
  return check(driver_->cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes),
               "cuMemcpyHtoD");
}

Status CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return ok_status();
  FLASHJIT_TRY(make_current());
  return check(driver_->cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes),
               "cuMemcpyDtoH");
}

Status CudaBackend::fill_bytes(void* dst, uint8_t value, size_t bytes) const {
  if (bytes == 0) return ok_status();
  FLASHJIT_TRY(make_current());
  return check(driver_->cuMemsetD8(reinterpret_cast<CUdeviceptr>(dst), value, bytes), "cuMemsetD8");
}

Status CudaBackend::synchronize() const {
  FLASHJIT_TRY(make_current());
  // Errors of earlier asynchronous launches surface here.
  return check(driver_->cuCtxSynchronize(), "cuCtxSynchronize", ErrorCode::LaunchFailed);
}

Result<double> CudaBackend::time_ms(const std::function<Status()>& work, int repetitions) const {
  if (repetitions < 1) {
    return make_error(ErrorCode::InvalidArgument,
                      "repetitions = " + std::to_string(repetitions) + ": must be at least 1");
  }
  FLASHJIT_TRY(make_current());
  EventPair events(*driver_);
  FLASHJIT_TRY(check(driver_->cuEventCreate(&events.start, CU_EVENT_DEFAULT), "cuEventCreate"));
  FLASHJIT_TRY(check(driver_->cuEventCreate(&events.stop, CU_EVENT_DEFAULT), "cuEventCreate"));
  FLASHJIT_TRY(check(driver_->cuEventRecord(events.start, nullptr), "cuEventRecord"));
  for (int i = 0; i < repetitions; ++i) FLASHJIT_TRY(work());
  FLASHJIT_TRY(check(driver_->cuEventRecord(events.stop, nullptr), "cuEventRecord"));
  FLASHJIT_TRY(check(driver_->cuEventSynchronize(events.stop), "cuEventSynchronize",
                     ErrorCode::LaunchFailed));
  float elapsed_ms = 0;
  FLASHJIT_TRY(check(driver_->cuEventElapsedTime(&elapsed_ms, events.start, events.stop),
                     "cuEventElapsedTime"));
  return static_cast<double>(elapsed_ms) / repetitions;
}

Result<BlockMask> CudaBackend::build_block_mask(const AttentionProblem& problem, int block_m,
                                                int block_n, void* stream) const {
  FLASHJIT_TRY(validate(problem));
  if (problem.variant.mask_mod.empty() || problem.variant.varlen)
    return make_error(ErrorCode::InvalidArgument,
                      problem.variant.varlen
                          ? "a block map of packed documents (varlen) is not supported"
                          : "a block map is built from a mask_mod: the problem has none");
  if (block_m < 1 || block_n < 1 || block_m > 1024 || block_n > 1024)
    return make_error(ErrorCode::InvalidArgument, "block_m = " + std::to_string(block_m) +
                                                      ", block_n = " + std::to_string(block_n) +
                                                      ": each must be in [1, 1024]");
  BlockMask mask;
  mask.shape = block_mask_shape(problem, block_m, block_n);
  mask.key = block_mask_key(problem);
  FLASHJIT_TRY(check_block_mask_shape(mask.shape));
  Result<DeviceBuffer> buffer = allocate(mask.shape.bytes());
  if (!buffer.ok()) return buffer.error();
  mask.buffer = std::move(buffer.value());
  mask.map = block_mask_view(mask.shape, mask.buffer.get());
  FLASHJIT_TRY(make_current());
  Result<BlockMaskBuilder> builder = block_mask_builder(driver_, context_, problem, device_.arch);
  if (!builder.ok()) return builder.error();
  Result<double> ms = time_block_mask_build(driver_, builder.value(), mask.shape, mask.map,
                                            static_cast<CUstream>(stream));
  if (!ms.ok()) return ms.error();
  mask.build_ms = ms.value();
  return mask;
}

}  // namespace flashjit::cuda
