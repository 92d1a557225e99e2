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

std::vector<KernelShape> HipGpu::kernel_shapes(const ProblemSignature& signature,
                                               const AttentionConfig& config, const DeviceSpec&) {
  const AttentionProblem problem = representative_problem(signature);
  if (config.family == KernelFamily::Decode)
    return {{config.warps * kHipWaveSize, hip_decode_lds_bytes(config, problem)}};
  return entry_shapes(signature.pass,
                      {config.warps * kHipWaveSize,
                       signature.pass == Pass::Forward ? hip_lds_bytes(config, problem) : 0},
                      hip_backward_shapes(config, problem));
}

namespace {

// A HIP kernel (gpu_backend.hpp's GpuKernel): its entries take the params only.
class HipKernel final : public GpuKernel<HipGpu> {
 public:
  using GpuKernel::GpuKernel;

 private:
  // No HIP check kernel yet (issue 33): an explicit request is refused rather than ignored (a
  // debug build's default does not apply here).
  Status before_decode(const AttentionProblem&, const AttentionArgs& args, void*) const override {
    if (!table_check_requested(args)) return ok_status();
    return make_error(ErrorCode::Unsupported,
                      "check_tables / FLASHJIT_CHECK_TABLES=1: the decode table check is not "
                      "implemented on the HIP backend (CUDA and CPU have it)");
  }
};

}  // namespace

Result<std::vector<LaunchGrid>> launch_grids(const AttentionProblem& problem,
                                             const AttentionConfig& config,
                                             const DeviceSpec* device) {
  const std::vector<KernelShape> shapes =
      HipGpu::kernel_shapes(ProblemSignature::of(problem), config, DeviceSpec{});
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
    FLASHJIT_TRY(check_launch_shape(launch, HipGpu::kGridLimits));
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
  FLASHJIT_TRY(check_device_ordinal(ordinal, count, "HIP", "no AMD GPU present"));
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
      new HipBackend(HipGpu(api().value(), ordinal), std::move(spec.value())));
}

// generator/hip_config.hpp's space.
constexpr ConfigSpace<DeviceSpec> kHipConfigSpace{&legal_hip_configs, &default_hip_config,
                                                  &check_hip_config, &explain_hip_plan};

HipBackend::HipBackend(HipGpu gpu, DeviceSpec spec)
    : GpuBackend(gpu, std::move(spec), kHipConfigSpace) {}

std::string HipBackend::compiler_fingerprint() const {
  return hiprtc_version() + " " + device().gcn_arch;
}

DeviceFingerprint HipBackend::fingerprint() const {
  int driver_version = 0;
  if (gpu().api().hipDriverGetVersion(&driver_version) != hipSuccess) driver_version = 0;
  // The target's feature flags (xnack, sramecc) change the code: part of the compiler field.
  return spec_fingerprint(gcn_arch_number(device().gcn_arch), driver_version,
                          hiprtc_version() + " " + device().gcn_arch);
}

std::shared_ptr<Kernel> HipBackend::make_kernel(LoadedModule<HipGpu> loaded,
                                                std::vector<KernelShape> shapes,
                                                const ProblemSignature& signature,
                                                const AttentionConfig& config,
                                                const KernelSource&) const {
  return std::make_shared<HipKernel>(std::move(loaded), std::move(shapes), signature, config,
                                     device());
}

int HipGpu::decode_splits(const AttentionConfig& config, const AttentionProblem& problem,
                          const DeviceSpec& device) {
  return hip_decode_splits(config, problem, device);
}

}  // namespace flashjit::hip
