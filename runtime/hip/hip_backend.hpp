// The HIP backend: AMD CDNA GPUs (MI200: gfx90a, MI300: gfx940-942). hipRTC compiles the HIP
// template in a worker process (hiprtc_compiler.hpp) to a code object for the device's target;
// the HIP runtime (libamdhip64, dlopen'ed) loads it with hipModuleLoadData and launches it with
// hipModuleLaunchKernel. The config space is generator/hip_config.hpp's (64 KiB LDS, wave64).
//
// Built only when CMake finds the ROCm headers (FLASHJIT_HIP_BACKEND); it has not been run on
// AMD hardware by this project yet (README, "AMD (HIP)").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.hpp"
#include "runtime/gpu_backend.hpp"
#include "runtime/hip/hip_api.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"

namespace flashjit::hip {

// The limits of AMD device `ordinal` as HIP reports them. Error NoDevice when there is no HIP
// runtime or no such device.
Result<DeviceSpec> query_device(int ordinal);

// The grids of one call's launches for `config`, in order (the forward: x query blocks, y heads,
// z batch; the backward: its three entries, generator/render.hpp; decode: its split kernel,
// generator/render_decode.hpp, with the splits on `device`, or without one the config's explicit
// splits), and whether HIP can run them: error InvalidArgument naming the problem size that is
// too large.
struct LaunchGrid {
  unsigned x = 0, y = 0, z = 0;
  unsigned threads = 0;  // per workgroup
  unsigned lds_bytes = 0;
};
Result<std::vector<LaunchGrid>> launch_grids(const AttentionProblem& problem,
                                             const AttentionConfig& config,
                                             const DeviceSpec* device = nullptr);

// The HIP runtime calls of the GPU host skeleton (runtime/gpu_backend.hpp) on device `ordinal`
// (selected on the calling thread first: HIP's current device is per thread), each checked: a
// failure names the call.
class HipGpu {
 public:
  using Module = hipModule_t;
  using Function = hipFunction_t;
  using Event = hipEvent_t;
  static constexpr auto render = &render_hip_attention;
  static constexpr const char* kApi = "HIP";
  static constexpr const char* kMemory = "LDS";
  // y and z are kept to CUDA's 65535 blocks (what HIP reports as maxGridSize on CDNA is larger,
  // but nothing here needs more); x times the block size must fit 32 bits, since AMD dispatch
  // packets count work-items, not workgroups.
  static constexpr GridLimits kGridLimits{"HIP", 4294967295ll, 4294967295ll, 65535};
  static int decode_splits(const AttentionConfig& config, const AttentionProblem& problem,
                           const DeviceSpec& device);
  // Threads and LDS of each entry point of a kernel of `signature` with `config` (a decode
  // kernel: its one entry, render_decode.hpp).
  static std::vector<KernelShape> kernel_shapes(const ProblemSignature& signature,
                                                const AttentionConfig& config, const DeviceSpec&);

  HipGpu(const Api* api, int ordinal) : api_(api), ordinal_(ordinal) {}
  Result<HipGpu> retain() const { return *this; }
  const Api& api() const { return *api_; }

  Result<Binary> compile(const KernelSource& source, const DeviceSpec& device) const {
    return hiprtc_compile(source, device.gcn_arch);
  }
  Status make_current() const { return check(api_->hipSetDevice(ordinal_), "hipSetDevice"); }
  // hipMalloc, freed by the buffer (after selecting the device again).
  Result<DeviceBuffer> allocate(size_t bytes) const {
    if (bytes == 0) return DeviceBuffer();
    FLASHJIT_TRY(make_current());
    void* pointer = nullptr;
    const Status status = check(api_->hipMalloc(&pointer, bytes), "hipMalloc");
    if (!status.ok())
      return make_error(status.error().code,
                        status.error().message + " (" + std::to_string(bytes) + " bytes)");
    return DeviceBuffer(pointer, bytes, [hip = api_, ordinal = ordinal_](void* ptr) {
      if (hip->hipSetDevice(ordinal) == hipSuccess) (void)hip->hipFree(ptr);
    });
  }
  Status copy_to_device(void* dst, const void* src, size_t bytes) const {
    return check(api_->hipMemcpy(dst, src, bytes, hipMemcpyHostToDevice), "hipMemcpy(HtoD)");
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) const {
    return check(api_->hipMemcpy(dst, src, bytes, hipMemcpyDeviceToHost), "hipMemcpy(DtoH)");
  }
  Status fill_bytes(void* dst, uint8_t value, size_t bytes) const {
    return check(api_->hipMemset(dst, value, bytes), "hipMemset");
  }
  Status synchronize() const {
    return check(api_->hipDeviceSynchronize(), "hipDeviceSynchronize", ErrorCode::LaunchFailed);
  }
  Status stream_synchronize(void* stream) const {
    FLASHJIT_TRY(make_current());
    return check(api_->hipStreamSynchronize(static_cast<hipStream_t>(stream)),
                 "hipStreamSynchronize", ErrorCode::LaunchFailed);
  }
  Status zero_async(void* pointer, size_t bytes, void* stream) const {
    FLASHJIT_TRY(make_current());
    return check(api_->hipMemsetAsync(pointer, 0, bytes, static_cast<hipStream_t>(stream)),
                 "hipMemsetAsync", ErrorCode::LaunchFailed);
  }
  Status create_event(hipEvent_t* event) const {
    return check(api_->hipEventCreate(event), "hipEventCreate");
  }
  Status record_event(hipEvent_t event) const {
    return check(api_->hipEventRecord(event, nullptr), "hipEventRecord");
  }
  Status wait_event(hipEvent_t event) const {
    return check(api_->hipEventSynchronize(event), "hipEventSynchronize", ErrorCode::LaunchFailed);
  }
  Status elapsed_ms(float* ms, hipEvent_t start, hipEvent_t stop) const {
    return check(api_->hipEventElapsedTime(ms, start, stop), "hipEventElapsedTime");
  }
  void destroy_event(hipEvent_t event) const { (void)api_->hipEventDestroy(event); }
  Status load_module(hipModule_t* module, const void* image) const {
    return check(api_->hipModuleLoadData(module, image), "hipModuleLoadData");
  }
  Status get_function(hipFunction_t* function, hipModule_t module, const char* name) const {
    return check(api_->hipModuleGetFunction(function, module, name), "hipModuleGetFunction");
  }
  Status prepare_function(hipFunction_t, int) const { return ok_status(); }
  Status function_attributes(hipFunction_t function, KernelInfo* info, int* max_threads) const {
    static constexpr struct {
      hipFunction_attribute attribute;
      const char* call;
    } kReads[] = {
        {HIP_FUNC_ATTRIBUTE_NUM_REGS, "hipFuncGetAttribute(NUM_REGS)"},
        {HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, "hipFuncGetAttribute(LOCAL_SIZE_BYTES)"},
        {HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "hipFuncGetAttribute(MAX_THREADS_PER_BLOCK)"}};
    int* values[] = {&info->regs_per_thread, &info->local_bytes_per_thread, max_threads};
    for (int i = 0; i < 3; ++i)
      FLASHJIT_TRY(check(api_->hipFuncGetAttribute(values[i], kReads[i].attribute, function),
                         kReads[i].call));
    return ok_status();
  }
  Status launch(hipFunction_t function, const LaunchShape& shape, void** args, void* stream) const {
    FLASHJIT_TRY(make_current());
    return check(api_->hipModuleLaunchKernel(function, static_cast<unsigned>(shape.grid_x),
                                             static_cast<unsigned>(shape.grid_y),
                                             static_cast<unsigned>(shape.grid_z),
                                             static_cast<unsigned>(shape.threads), 1, 1,
                                             static_cast<unsigned>(shape.smem_bytes),
                                             static_cast<hipStream_t>(stream), args, nullptr),
                 "hipModuleLaunchKernel", ErrorCode::LaunchFailed);
  }
  // Errors cannot be reported from a destructor.
  void unload_module(hipModule_t module) const {
    if (module != nullptr && api_->hipSetDevice(ordinal_) == hipSuccess)
      (void)api_->hipModuleUnload(module);
  }

 private:
  const Api* api_;
  int ordinal_;
};

class HipBackend final : public GpuBackend<HipGpu, ConfigSpaceBackend<DeviceSpec>> {
 public:
  // Error NoDevice when there is no HIP runtime or `ordinal` is out of range; Unsupported for a
  // device the template does not support (not CDNA2/3: see supported_processor).
  static Result<std::unique_ptr<HipBackend>> create(int ordinal = 0);

  std::string name() const override { return "hip"; }
  // "hiprtc 5.2.21153 gfx90a:sramecc+:xnack-"
  std::string compiler_fingerprint() const override;
  DeviceFingerprint fingerprint() const override;

 protected:
  const DeviceSpec& config_target() const override { return device(); }
  std::shared_ptr<Kernel> make_kernel(LoadedModule<HipGpu> loaded, std::vector<KernelShape> shapes,
                                      const ProblemSignature& signature,
                                      const AttentionConfig& config,
                                      const KernelSource& source) const override;

 private:
  HipBackend(HipGpu gpu, DeviceSpec spec);
};

}  // namespace flashjit::hip
