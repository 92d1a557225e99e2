// The CUDA backend: NVRTC + driver API on one device (its primary context).
#pragma once

#include <memory>

#include "runtime/backend.hpp"
#include "runtime/cuda/driver.hpp"

namespace flashjit::cuda {

// Number of CUDA devices; 0 when there is no driver or no device.
int device_count();

// Queries the device's limits (name, compute capability, SMs, shared memory, registers, L2).
Result<DeviceSpec> query_device(int ordinal);

class CudaBackend final : public CudaTemplateBackend {
 public:
  // Error NoDevice when there is no driver or `ordinal` is out of range; Unsupported for
  // compute capability below 8.0 (the template needs mma.sync bf16, cp.async, ldmatrix).
  static Result<std::unique_ptr<CudaBackend>> create(int ordinal = 0);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  const DeviceSpec& device() const override { return device_; }
  std::string compiler_fingerprint() const override;
  DeviceFingerprint fingerprint() const override;
  // "cuda pci 0000:19:00.0" (the fingerprint and the device ordinal without cuDeviceGetPCIBusId).
  std::string timing_device_id() const override;

  Result<KernelSource> render(const AttentionProblem& problem,
                              const AttentionConfig& config) const override;
  Result<Binary> compile(const KernelSource& source) const override;
  Result<std::shared_ptr<Kernel>> load(const Binary& binary, const KernelSource& source,
                                       const ProblemSignature& signature,
                                       const AttentionConfig& config) const override;

  Result<DeviceBuffer> allocate(size_t bytes) const override;
  Status copy_to_device(void* dst, const void* src, size_t bytes) const override;
  Status copy_to_host(void* dst, const void* src, size_t bytes) const override;
  Status fill_bytes(void* dst, uint8_t value, size_t bytes) const override;
  Status synchronize() const override;
  Result<double> time_ms(const std::function<Status()>& work, int repetitions) const override;
  Result<BlockMask> build_block_mask(const AttentionProblem& problem, int block_m, int block_n,
                                     void* stream = nullptr) const override;

 private:
  CudaBackend(const Driver* driver, CUdevice device, CUcontext context, DeviceSpec spec);
  Status make_current() const;

  const Driver* driver_;
  CUdevice device_handle_;
  CUcontext context_;
  DeviceSpec device_;
};

}  // namespace flashjit::cuda
