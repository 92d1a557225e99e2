// The CPU backend: the C++ template (templates/cpu/attention_fwd.hpp) compiled in-process by
// Clang/LLVM 14 for the host CPU, loaded by ORC LLJIT, run on a thread pool over the work items
// (batch x heads x query blocks). The backward pass (templates/cpu/attention_bwd.hpp) is three
// entry points of one source, run in order over the pool with an fp32 workspace (the caller's
// AttentionArgs::workspace, else one the kernel keeps: runtime/workspace.hpp). Built only where
// LLVM/Clang 14 are found (FLASHJIT_HAVE_CPU_BACKEND).
//
// "Device" memory is host memory: allocate() is a 256-byte aligned host allocation, copies are
// memcpy, launches are synchronous (the stream argument only keys a backward kernel's workspace),
// time_ms is wall-clock (std::chrono::steady_clock). device() maps the CPU onto a DeviceSpec as
// cpu_device_spec() says.
#pragma once

#include <memory>

#include "generator/cpu_config.hpp"
#include "runtime/backend.hpp"

namespace flashjit::cpu {

class ThreadPool;

class CpuBackend final : public ConfigSpaceBackend<CpuSpec> {
 public:
  // The host CPU (host_cpu()); threads = its logical cores.
  static Result<std::unique_ptr<CpuBackend>> create();
  // A given spec (tests); the pool runs spec.cores threads.
  static Result<std::unique_ptr<CpuBackend>> create(const CpuSpec& spec);
  ~CpuBackend() override;

  const CpuSpec& cpu() const { return cpu_; }

  std::string name() const override { return "cpu"; }
  const DeviceSpec& device() const override { return device_; }
  std::string compiler_fingerprint() const override;
  DeviceFingerprint fingerprint() const override;

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
  Status synchronize() const override { return ok_status(); }
  Result<double> time_ms(const std::function<Status()>& work, int repetitions) const override;
  // Clang runs on the same cores as the kernels.
  bool compiles_share_the_device() const override { return true; }
  // The host's scheduler: how long the timing's threads waited for the pool's cores
  // (runtime/host_load.hpp; null where the host does not say).
  std::unique_ptr<DisturbanceProbe> disturbance_probe() const override;

 protected:
  // generator/cpu_config.hpp's space on cpu().
  const CpuSpec& config_target() const override { return cpu_; }

 private:
  explicit CpuBackend(const CpuSpec& spec);

  CpuSpec cpu_;
  DeviceSpec device_;
  std::shared_ptr<ThreadPool> pool_;
};

}  // namespace flashjit::cpu
