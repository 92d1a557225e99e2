// The CUDA backend: NVRTC + driver API on one device (its primary context).
#pragma once

#include <memory>
#include <utility>

#include "runtime/backend.hpp"
#include "runtime/cuda/driver.hpp"
#include "runtime/gpu_backend.hpp"

namespace flashjit::cuda {

// Number of CUDA devices; 0 when there is no driver or no device.
int device_count();

// Queries the device's limits (name, compute capability, SMs, shared memory, registers, L2).
Result<DeviceSpec> query_device(int ordinal);

// The driver API calls of the GPU host skeleton (runtime/gpu_backend.hpp) on one device's primary
// context: each handle holds a context reference of its own (the backend, each kernel), so that
// resources outliving the backend stay valid. Move-only.
class CudaGpu {
 public:
  using Module = CUmodule;
  using Function = CUfunction;
  using Event = CUevent;
  static constexpr const char* kApi = "CUDA";
  static constexpr const char* kMemory = "shared memory";
  // Grid y and z are limited to 65535 blocks (x to 2^31 - 1).
  static constexpr GridLimits kGridLimits{"CUDA", 2147483647, 0, 65535};
  static int decode_splits(const AttentionConfig& config, const AttentionProblem& problem,
                           const DeviceSpec& device);
  static constexpr auto render = &render_cuda_attention;
  // Threads and dynamic shared memory of each entry point of a kernel of `signature` with
  // `config` on `device` (render.hpp gives the backward's, render_decode.hpp the decode family's).
  static std::vector<KernelShape> kernel_shapes(const ProblemSignature& signature,
                                                const AttentionConfig& config,
                                                const DeviceSpec& device);
  Result<Binary> compile(const KernelSource& source, const DeviceSpec& device) const;

  // Retains the primary context of `device` (error NoDevice when the driver refuses).
  static Result<CudaGpu> open(const Driver* driver, CUdevice device);
  CudaGpu(CudaGpu&& other) noexcept;
  CudaGpu& operator=(CudaGpu&&) = delete;
  ~CudaGpu();
  Result<CudaGpu> retain() const { return open(driver_, device_); }

  const Driver& driver() const { return *driver_; }
  CUdevice handle() const { return device_; }
  CUcontext context() const { return context_; }

  Status make_current() const;
  Result<DeviceBuffer> allocate(size_t bytes) const;
  Status copy_to_device(void* dst, const void* src, size_t bytes) const;
  Status copy_to_host(void* dst, const void* src, size_t bytes) const;
  Status fill_bytes(void* dst, uint8_t value, size_t bytes) const;
  Status synchronize() const;
  Status stream_synchronize(void* stream) const;
  Status zero_async(void* pointer, size_t bytes, void* stream) const;
  Status create_event(CUevent* event) const;
  Status record_event(CUevent event) const;
  Status wait_event(CUevent event) const;
  Status elapsed_ms(float* ms, CUevent start, CUevent stop) const;
  void destroy_event(CUevent event) const;
  Status load_module(CUmodule* module, const void* image) const;
  Status get_function(CUfunction* function, CUmodule module, const char* name) const;
  Status prepare_function(CUfunction function, int smem_bytes) const;
  Status function_attributes(CUfunction function, KernelInfo* info, int* max_threads) const;
  Status launch(CUfunction function, const LaunchShape& shape, void** args, void* stream) const;
  void unload_module(CUmodule module) const;

 private:
  CudaGpu(const Driver* driver, CUdevice device, CUcontext context)
      : driver_(driver), device_(device), context_(context) {}

  const Driver* driver_;
  CUdevice device_;
  CUcontext context_;  // null once moved from
};

class CudaBackend final : public GpuBackend<CudaGpu, CudaTemplateBackend> {
 public:
  // Error NoDevice when there is no driver or `ordinal` is out of range; Unsupported for
  // compute capability below 8.0 (the template needs mma.sync bf16, cp.async, ldmatrix).
  static Result<std::unique_ptr<CudaBackend>> create(int ordinal = 0);

  std::string name() const override { return "cuda"; }
  std::string compiler_fingerprint() const override;
  DeviceFingerprint fingerprint() const override;
  // "cuda pci 0000:19:00.0" (the fingerprint and the device ordinal without cuDeviceGetPCIBusId).
  std::string timing_device_id() const override;
  Result<BlockMask> build_block_mask(const AttentionProblem& problem, int block_m, int block_n,
                                     void* stream = nullptr) const override;

 protected:
  std::shared_ptr<Kernel> make_kernel(LoadedModule<CudaGpu> loaded, std::vector<KernelShape> shapes,
                                      const ProblemSignature& signature,
                                      const AttentionConfig& config,
                                      const KernelSource& source) const override;

 private:
  CudaBackend(CudaGpu gpu, DeviceSpec spec) : GpuBackend(std::move(gpu), std::move(spec)) {}
};

}  // namespace flashjit::cuda
