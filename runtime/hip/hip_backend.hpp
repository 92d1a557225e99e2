// The HIP backend: AMD CDNA GPUs (MI200: gfx90a, MI300: gfx940-942). hipRTC compiles the HIP
// template in a worker process (hiprtc_compiler.hpp) to a code object for the device's target;
// the HIP runtime (libamdhip64, dlopen'ed) loads it with hipModuleLoadData and launches it with
// hipModuleLaunchKernel. The config space is generator/hip_config.hpp's (64 KiB LDS, wave64).
//
// Built only when CMake finds the ROCm headers (FLASHJIT_HIP_BACKEND); it has not been run on
// AMD hardware by this project yet (README, "AMD (HIP)").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.hpp"
#include "runtime/hip/hip_api.hpp"

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

class HipBackend final : public Backend {
 public:
  // Error NoDevice when there is no HIP runtime or `ordinal` is out of range; Unsupported for a
  // device the template does not support (not CDNA2/3: see supported_processor).
  static Result<std::unique_ptr<HipBackend>> create(int ordinal = 0);

  std::string name() const override { return "hip"; }
  const DeviceSpec& device() const override { return device_; }
  // "hiprtc 5.2.21153 gfx90a:sramecc+:xnack-"
  std::string compiler_fingerprint() const override;
  DeviceFingerprint fingerprint() const override;

  std::vector<AttentionConfig> legal_configs(const AttentionProblem& problem) const override;
  Result<AttentionConfig> default_config(const AttentionProblem& problem) const override;
  Status check_config(const AttentionConfig& config,
                      const AttentionProblem& problem) const override;
  std::string explain_plan(const AttentionProblem& problem) const override;

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

 private:
  HipBackend(const Api* api, int ordinal, DeviceSpec spec);
  Status make_current() const;

  const Api* api_;
  int ordinal_;
  DeviceSpec device_;
};

}  // namespace flashjit::hip
