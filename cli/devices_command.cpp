// `flashjit devices` (cli/devices_command.hpp).
#include "cli/devices_command.hpp"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "generator/device.hpp"
#include "runtime/cpu/cpu_info.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/clang_jit.hpp"
#include "runtime/cpu/cpu_backend.hpp"
#endif
#if FLASHJIT_HAVE_HIP_BACKEND
#include "runtime/hip/hip_backend.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"
#endif

namespace flashjit::cli {
namespace {

void print_device(const DeviceSpec& device) {
  auto b = [](int value) { return std::to_string(value) + " B"; };
  const std::vector<std::pair<const char*, std::string>> rows =
      device.is_amd()
          ? std::vector<std::pair<const char*,
                                  std::string>>{{"target", device.gcn_arch},
                                                {"CUs", std::to_string(device.sm_count)},
                                                {"wavefront", std::to_string(device.warp_size)},
                                                {"LDS per workgroup",
                                                 b(device.smem_per_block_optin)},
                                                {"LDS per CU", b(device.smem_per_sm)},
                                                {"max regs per lane",
                                                 std::to_string(device.max_regs_per_thread) +
                                                     " (VGPRs + AGPRs)"},
                                                {"max threads per CU",
                                                 std::to_string(device.max_threads_per_sm)},
                                                {"max threads per block",
                                                 std::to_string(device.max_threads_per_block)},
                                                {"L2", b(device.l2_bytes)}}
          : std::vector<std::pair<const char*, std::string>>{
                {"arch", device.arch_name()},
                {"SMs", std::to_string(device.sm_count)},
                {"smem per block opt-in", b(device.smem_per_block_optin)},
                {"smem per SM", b(device.smem_per_sm)},
                {"registers per SM", std::to_string(device.regs_per_sm)},
                {"max regs per thread", std::to_string(device.max_regs_per_thread)},
                {"max threads per SM", std::to_string(device.max_threads_per_sm)},
                {"max threads per block", std::to_string(device.max_threads_per_block)},
                {"L2", b(device.l2_bytes)}};
  std::printf("%s\n", device.name.c_str());
  for (const auto& [label, value] : rows) std::printf("  %-21s %s\n", label, value.c_str());
}

// "<what> <n>: " and each of `count` devices (query(n)), with the fingerprint its backend
// (create(n)) stores tuning results under (docs/TUNING_DB.md); a backend that cannot be created:
// "<unusable>: <why>", or nothing when `unusable` is null.
template <class Query, class Create>
void print_devices(const char* what, int count, const Query& query, const Create& create,
                   const char* unusable) {
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    auto device = query(ordinal);
    if (!device.ok()) {
      std::printf("%s %d: %s\n", what, ordinal, device.error().describe().c_str());
      continue;
    }
    std::printf("%s %d: ", what, ordinal);
    print_device(*device);
    if (auto backend = create(ordinal); backend.ok())
      std::printf("  fingerprint: %s\n", (*backend)->fingerprint().to_string().c_str());
    else if (unusable != nullptr)
      std::printf("  %s: %s\n", unusable, backend.error().describe().c_str());
  }
}

}  // namespace

int run_devices() {
  int count = cuda::device_count();
  if (count == 0) {
    std::printf("no CUDA device (%s)\n", no_device_reason().c_str());
  }
  // A backend that cannot be created prints nothing more (the device line said why).
  print_devices("device", count, cuda::query_device, cuda::CudaBackend::create, nullptr);
  std::printf("compiler: %s\n\n", cuda::nvrtc_version().c_str());
#if FLASHJIT_HAVE_HIP_BACKEND
  const int amd_count = hip::device_count();
  if (amd_count == 0) {
    Result<DeviceSpec> amd = hip::query_device(0);
    std::printf("no AMD GPU (%s)\n", amd.ok() ? "none found" : amd.error().message.c_str());
  }
  print_devices("AMD device", amd_count, hip::query_device, hip::HipBackend::create,
                "HIP backend unusable");
  std::printf("compiler: %s\n\n", hip::hiprtc_version().c_str());
#else
  std::printf("no HIP backend in this build (ROCm headers not found)\n\n");
#endif
  const CpuSpec host = cpu::host_cpu();
  std::printf("cpu: %s\n", host.to_string().c_str());
#if FLASHJIT_HAVE_CPU_BACKEND
  if (auto backend = cpu::CpuBackend::create(host); backend.ok()) {
    std::printf("  fingerprint: %s\n", (*backend)->fingerprint().to_string().c_str());
    std::printf("  target: %s %s\n", cpu::host_target().triple.c_str(),
                cpu::host_target().cpu.c_str());
  } else {
    std::printf("  CPU backend unusable: %s\n", backend.error().describe().c_str());
  }
#else
  std::printf("  no CPU backend in this build (LLVM/Clang 14 not found)\n");
#endif
  std::printf("\n");
  std::printf("table architectures (--arch):\n");
  for (const std::string& arch : known_archs()) {
    auto device = known_device(arch);
    if (device.ok()) std::printf("  %s\n", device->to_string().c_str());
  }
  return 0;
}

std::string no_device_reason() {
  auto device = cuda::query_device(0);
  return device.ok() ? "device 0 is present" : device.error().message;
}

}  // namespace flashjit::cli
