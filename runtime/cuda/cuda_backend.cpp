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

Result<int> device_attribute(const Driver& driver, CUdevice device, CUdevice_attribute attribute,
                             const char* attribute_name) {
  int value = 0;
  Status status = check(driver.cuDeviceGetAttribute(&value, attribute, device), attribute_name,
                        ErrorCode::DriverError);
  if (!status.ok()) return status.error();
  return value;
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

// A CUDA kernel (gpu_backend.hpp's GpuKernel) whose forward entry may take tensor maps
// (KernelSource::tensor_maps: the -ws family), encoded for each launch from the launch's pointers
// and strides, and whose decode launches run the table check first when asked.
class CudaKernel final : public GpuKernel<CudaGpu> {
 public:
  CudaKernel(LoadedModule<CudaGpu> loaded, std::vector<KernelShape> shapes,
             ProblemSignature signature, AttentionConfig config, DeviceSpec device,
             bool tensor_maps, bool block_mask)
      : GpuKernel(std::move(loaded), std::move(shapes), std::move(signature), config,
                  std::move(device)),
        tensor_maps_(tensor_maps) {
    if (block_mask)
      block_masks_ = std::make_unique<BlockMaskCache>(
          &gpu().driver(), gpu().context(), this->device().arch, config.block_m, config.block_n);
  }
  ~CudaKernel() override {
    block_masks_.reset();  // its buffers and module first, in the context we still hold
    if (check_module_ != nullptr) gpu().unload_module(check_module_);
  }

  std::pair<int, int> block_mask_tile() const override {
    if (!block_masks_) return {0, 0};
    return {config().block_m, config().block_n};
  }

  Result<double> block_mask_build_ms(const AttentionProblem& problem, void* stream) const override {
    if (!block_masks_) return Kernel::block_mask_build_ms(problem, stream);
    FLASHJIT_TRY(validate(problem));
    FLASHJIT_TRY(gpu().make_current());
    return block_masks_->time_build(problem, static_cast<CUstream>(stream));
  }

 private:
  // The decode table check (runtime/table_check.hpp) on `stream`, before the decode kernel: one
  // block, no host sync. The first checked call compiles (once per process) and loads it: warm up
  // before capturing a CUDA graph, as for the workspace.
  Status before_decode(const AttentionProblem& problem, const AttentionArgs& args,
                       void* stream) const override {
    if (!table_check_enabled(args)) return ok_status();
    FLASHJIT_TRY(gpu().make_current());
    CUfunction function = nullptr;
    {
      std::lock_guard<std::mutex> lock(check_mutex_);
      if (check_function_ == nullptr) {
        Result<Binary> binary = table_check_binary(device().arch);
        if (!binary.ok()) return binary.error();
        CUmodule module = nullptr;
        FLASHJIT_TRY(check(gpu().driver().cuModuleLoadData(&module, binary->bytes.data()),
                           "cuModuleLoadData (decode table check)"));
        Status found = check(
            gpu().driver().cuModuleGetFunction(&check_function_, module, kDecodeTableCheckEntry),
            "cuModuleGetFunction (decode table check)");
        if (!found.ok()) {
          gpu().driver().cuModuleUnload(module);
          check_function_ = nullptr;
          return found;
        }
        check_module_ = module;
      }
      function = check_function_;
    }
    FlashjitDecodeTables tables = decode_tables_of(problem, args);
    void* kernel_args[] = {&tables};
    return check(gpu().driver().cuLaunchKernel(function, 1, 1, 1, kDecodeTableCheckThreads, 1, 1, 0,
                                               static_cast<CUstream>(stream), kernel_args, nullptr),
                 "cuLaunchKernel (decode table check)", ErrorCode::LaunchFailed);
  }

  // The params, the tensor maps where the entry takes them, then the block map where it reads
  // one (a forward's entry; the backward's dK/dV and dQ entries).
  Status enqueue(const AttentionProblem& problem, const AttentionArgs& args, size_t entry,
                 const LaunchShape& shape, FlashjitAttentionParams& params, void* stream,
                 LaunchState& state) const override {
    const bool takes_mask = block_masks_ && (!problem.is_backward() || entry != 0);
    // A mask_mod's block map: the caller's, else this kernel's for the shape (built on first
    // use), taken when the first entry that reads it is enqueued (after the launch's checks).
    if (takes_mask && !state.have_block_mask) {
      if (args.block_mask != nullptr) {
        FLASHJIT_TRY(check_block_mask(problem, *args.block_mask));
        state.block_mask = *args.block_mask;
      } else {
        FLASHJIT_TRY(gpu().make_current());
        Result<FlashjitBlockMask> built = block_masks_->get(problem, static_cast<CUstream>(stream));
        if (!built.ok()) return built.error();
        state.block_mask = built.value();
      }
      state.have_block_mask = true;
    }
    FlashjitForwardTensorMaps maps;
    // The backward's row kernels (entries 0 and 2) take the params only: the maps are for its
    // fused kernel (entry 1, the ws family).
    if (tensor_maps_ && (!problem.is_backward() || entry == 1))
      FLASHJIT_TRY(encode_forward_tensor_maps(gpu().driver(), params, problem, config(), &maps));
    // The block map after the maps when the entry takes those too.
    void* kernel_args[] = {&params,
                           takes_mask && !tensor_maps_ ? static_cast<void*>(&state.block_mask)
                                                       : static_cast<void*>(&maps),
                           &state.block_mask};
    return gpu().launch(function(entry), shape, kernel_args, stream);
  }

  // A user-built block map fits this kernel: its tile, the problem's tiles and maps.
  Status check_block_mask(const AttentionProblem& problem, const FlashjitBlockMask& map) const {
    const BlockMaskShape shape = block_mask_shape(problem, config().block_m, config().block_n);
    if (map.block_m == shape.block_m && map.block_n == shape.block_n &&
        map.q_tiles == shape.q_tiles() && map.k_tiles == shape.k_tiles() &&
        map.maps == shape.maps() && map.q_count != nullptr && map.q_list != nullptr &&
        map.k_count != nullptr && map.k_list != nullptr)
      return ok_status();
    return make_error(ErrorCode::InvalidArgument,
                      "block_mask of m" + std::to_string(map.block_m) + " n" +
                          std::to_string(map.block_n) + ", " + std::to_string(map.q_tiles) + " x " +
                          std::to_string(map.k_tiles) + " tiles, " + std::to_string(map.maps) +
                          " map(s): kernel " + config().to_string() + " needs the map of " +
                          shape.to_string() + " (build it at Kernel::block_mask_tile)");
  }

  const bool tensor_maps_;          // the entry takes (params, maps) rather than (params)
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
  FLASHJIT_TRY(check_device_ordinal(ordinal, count, "CUDA", "no CUDA device present"));
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
  Result<CudaGpu> gpu = CudaGpu::open(cu, device);
  if (!gpu.ok()) return gpu.error();
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(std::move(gpu.value()), std::move(spec.value())));
}

std::string CudaBackend::compiler_fingerprint() const {
  return nvrtc_version() + " sm_" + std::to_string(device().arch);
}

std::string CudaBackend::timing_device_id() const {
  char bus[64] = {};
  const Driver& cu = gpu().driver();
  if (cu.cuDeviceGetPCIBusId != nullptr &&
      cu.cuDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus) - 1, gpu().handle()) ==
          CUDA_SUCCESS) {
    return std::string("cuda pci ") + bus;
  }
  return fingerprint().to_string() + "|device " + std::to_string(gpu().handle());
}

DeviceFingerprint CudaBackend::fingerprint() const {
  int driver_version = 0;
  if (gpu().driver().cuDriverGetVersion(&driver_version) != CUDA_SUCCESS) driver_version = 0;
  return spec_fingerprint(device().arch, driver_version, nvrtc_version());
}

std::vector<KernelShape> CudaGpu::kernel_shapes(const ProblemSignature& signature,
                                                const AttentionConfig& config,
                                                const DeviceSpec& device) {
  const bool backward = signature.pass == Pass::Backward;
  const AttentionProblem problem = representative_problem(signature);
  if (config.family == KernelFamily::Decode) {
    const DecodeResources decode_use = decode_resources(config, problem);
    return {{decode_use.threads, decode_use.smem_bytes}};
  }
  // A persistent forward gets one CTA per SM slot of this device.
  const int persistent_ctas =
      !backward && config.persistent ? ws_persistent_ctas(config, problem, device) : 0;
  return entry_shapes(
      signature.pass,
      {config.threads(), backward ? 0 : smem_bytes(config, problem), persistent_ctas},
      backward_shapes(config,
                      {backward_dkdv_threads(config), backward_dkdv_smem_bytes(config, problem),
                       backward && config.family == KernelFamily::Ws
                           ? ws_backward_persistent_ctas(config, device)
                           : 0},
                      {backward_dq_threads(config), backward_dq_smem_bytes(config, problem)}));
}

std::shared_ptr<Kernel> CudaBackend::make_kernel(LoadedModule<CudaGpu> loaded,
                                                 std::vector<KernelShape> shapes,
                                                 const ProblemSignature& signature,
                                                 const AttentionConfig& config,
                                                 const KernelSource& source) const {
  return std::make_shared<CudaKernel>(std::move(loaded), std::move(shapes), signature, config,
                                      device(), source.tensor_maps, source.block_mask);
}

// CudaGpu: the driver calls, each checked (a failure names the call).

Result<Binary> CudaGpu::compile(const KernelSource& source, const DeviceSpec& device) const {
  return nvrtc_compile(source, device.arch);
}

int CudaGpu::decode_splits(const AttentionConfig& config, const AttentionProblem& problem,
                           const DeviceSpec& device) {
  return ::flashjit::decode_splits(config, problem, device);
}

Result<CudaGpu> CudaGpu::open(const Driver* driver, CUdevice device) {
  CUcontext context = nullptr;
  FLASHJIT_TRY(check(driver->cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain",
                     ErrorCode::NoDevice));
  return CudaGpu(driver, device, context);
}

CudaGpu::CudaGpu(CudaGpu&& other) noexcept
    : driver_(other.driver_),
      device_(other.device_),
      context_(std::exchange(other.context_, nullptr)) {}

CudaGpu::~CudaGpu() {
  if (context_ != nullptr) driver_->cuDevicePrimaryCtxRelease(device_);
}

Status CudaGpu::make_current() const {
  return check(driver_->cuCtxSetCurrent(context_), "cuCtxSetCurrent");
}

// cuMemAlloc on the primary context; the buffer holds a context reference of its own so that it
// may outlive whoever allocated it (the backend, a kernel).
Result<DeviceBuffer> CudaGpu::allocate(size_t bytes) const {
  if (bytes == 0) return DeviceBuffer();  // cuMemAlloc rejects 0; an empty buffer is the answer
  Result<CudaGpu> own = retain();
  if (!own.ok()) return own.error();
  CUdeviceptr pointer = 0;
  Status status = own->make_current();
  if (status.ok()) status = check(driver_->cuMemAlloc(&pointer, bytes), "cuMemAlloc");
  if (!status.ok()) {
    return make_error(status.error().code,
                      status.error().message + " (" + std::to_string(bytes) + " bytes)");
  }
  const Driver* cu = driver_;
  const CUdevice device = device_;
  const CUcontext owner = std::exchange(own->context_, nullptr);  // released by the buffer
  return DeviceBuffer(reinterpret_cast<void*>(pointer), bytes, [cu, device, owner](void* ptr) {
    if (cu->cuCtxSetCurrent(owner) == CUDA_SUCCESS) {
      cu->cuMemFree(reinterpret_cast<CUdeviceptr>(ptr));
    }
    cu->cuDevicePrimaryCtxRelease(device);
  });
}

Status CudaGpu::copy_to_device(void* dst, const void* src, size_t bytes) const {
  return check(driver_->cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes),
               "cuMemcpyHtoD");
}

Status CudaGpu::copy_to_host(void* dst, const void* src, size_t bytes) const {
  return check(driver_->cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes),
               "cuMemcpyDtoH");
}

Status CudaGpu::fill_bytes(void* dst, uint8_t value, size_t bytes) const {
  return check(driver_->cuMemsetD8(reinterpret_cast<CUdeviceptr>(dst), value, bytes), "cuMemsetD8");
}

Status CudaGpu::synchronize() const {
  return check(driver_->cuCtxSynchronize(), "cuCtxSynchronize", ErrorCode::LaunchFailed);
}

Status CudaGpu::stream_synchronize(void* stream) const {
  FLASHJIT_TRY(make_current());
  return check(driver_->cuStreamSynchronize(static_cast<CUstream>(stream)), "cuStreamSynchronize",
               ErrorCode::LaunchFailed);
}

Status CudaGpu::zero_async(void* pointer, size_t bytes, void* stream) const {
  FLASHJIT_TRY(make_current());
  return check(driver_->cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(pointer), 0,
                                         bytes / sizeof(int32_t), static_cast<CUstream>(stream)),
               "cuMemsetD32Async", ErrorCode::LaunchFailed);
}

Status CudaGpu::create_event(CUevent* event) const {
  return check(driver_->cuEventCreate(event, CU_EVENT_DEFAULT), "cuEventCreate");
}

Status CudaGpu::record_event(CUevent event) const {
  return check(driver_->cuEventRecord(event, nullptr), "cuEventRecord");
}

Status CudaGpu::wait_event(CUevent event) const {
  return check(driver_->cuEventSynchronize(event), "cuEventSynchronize", ErrorCode::LaunchFailed);
}

Status CudaGpu::elapsed_ms(float* ms, CUevent start, CUevent stop) const {
  return check(driver_->cuEventElapsedTime(ms, start, stop), "cuEventElapsedTime");
}

void CudaGpu::destroy_event(CUevent event) const { driver_->cuEventDestroy(event); }

Status CudaGpu::load_module(CUmodule* module, const void* image) const {
  return check(driver_->cuModuleLoadData(module, image), "cuModuleLoadData");
}

Status CudaGpu::get_function(CUfunction* function, CUmodule module, const char* name) const {
  return check(driver_->cuModuleGetFunction(function, module, name), "cuModuleGetFunction");
}

// Above 48 KiB a kernel must opt in to its dynamic shared memory; setting it always is harmless.
Status CudaGpu::prepare_function(CUfunction function, int smem_bytes) const {
  const Status status =
      check(driver_->cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        smem_bytes),
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  if (status.ok()) return status;
  return make_error(status.error().code,
                    status.error().message + " (" + std::to_string(smem_bytes) + " bytes)");
}

Status CudaGpu::function_attributes(CUfunction function, KernelInfo* info, int* max_threads) const {
  FLASHJIT_TRY(check(
      driver_->cuFuncGetAttribute(&info->regs_per_thread, CU_FUNC_ATTRIBUTE_NUM_REGS, function),
      "cuFuncGetAttribute(NUM_REGS)"));
  FLASHJIT_TRY(check(driver_->cuFuncGetAttribute(&info->local_bytes_per_thread,
                                                 CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, function),
                     "cuFuncGetAttribute(LOCAL_SIZE_BYTES)"));
  return check(
      driver_->cuFuncGetAttribute(max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function),
      "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)");
}

Status CudaGpu::launch(CUfunction function, const LaunchShape& shape, void** args,
                       void* stream) const {
  FLASHJIT_TRY(make_current());
  return check(
      driver_->cuLaunchKernel(
          function, static_cast<unsigned>(shape.grid_x), static_cast<unsigned>(shape.grid_y),
          static_cast<unsigned>(shape.grid_z), static_cast<unsigned>(shape.threads), 1, 1,
          static_cast<unsigned>(shape.smem_bytes), static_cast<CUstream>(stream), args, nullptr),
      "cuLaunchKernel", ErrorCode::LaunchFailed);
}

// Errors cannot be reported from a destructor; the context reference is ours, so it is alive.
void CudaGpu::unload_module(CUmodule module) const {
  if (module != nullptr && driver_->cuCtxSetCurrent(context_) == CUDA_SUCCESS)
    driver_->cuModuleUnload(module);
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
  FLASHJIT_TRY(gpu().make_current());
  Result<BlockMaskBuilder> builder =
      block_mask_builder(&gpu().driver(), gpu().context(), problem, device().arch);
  if (!builder.ok()) return builder.error();
  Result<double> ms = time_block_mask_build(&gpu().driver(), builder.value(), mask.shape, mask.map,
                                            static_cast<CUstream>(stream));
  if (!ms.ok()) return ms.error();
  mask.build_ms = ms.value();
  return mask;
}

}  // namespace flashjit::cuda
