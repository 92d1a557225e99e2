// DeviceFingerprint::to_string: see runtime/device_fingerprint.hpp.
#include "runtime/device_fingerprint.hpp"

#include <cstdio>

namespace flashjit {

std::string DeviceFingerprint::to_string() const {
  std::string out = backend;
  if (backend == "cpu") {
    // "cpu|AMD EPYC|2cores|L2 1048576B|L3 33554432B|clang 14.0.6 ... avx512f avx2 fma f16c ..."
    out += "|";
    out += name;
    out += "|";
    out += std::to_string(sm_count);
    out += "cores|L2 ";
    out += std::to_string(smem_per_block_optin);
    out += "B|L3 ";
    out += std::to_string(l2_bytes);
    out += "B|";
    out += compiler;
    return out;
  }
  // GPUs: "cuda|NVIDIA H200|sm90|132sm|232448B|52428800B|drv13000|nvrtc 13.0", or
  // "hip|AMD Instinct MI250X|gfx90a|110cu|65536B|8388608B|drv50221153|hiprtc 5.2.21153 ...":
  // for HIP arch holds the gfx processor's hex digits (gcn_arch_number), and the feature flags
  // of the target ID are in the compiler field.
  const bool hip = backend == "hip";
  std::string arch_text = "sm" + std::to_string(arch);
  if (hip) {
    char processor[16];
    std::snprintf(processor, sizeof processor, "gfx%x", static_cast<unsigned>(arch));
    arch_text = processor;
  }
  out += "|";
  out += name;
  out += "|";
  out += arch_text;
  out += "|";
  out += std::to_string(sm_count);
  out += hip ? "cu|" : "sm|";
  out += std::to_string(smem_per_block_optin);
  out += "B|";
  out += std::to_string(l2_bytes);
  out += "B|drv";
  out += std::to_string(driver_version);
  out += "|";
  out += compiler;
  return out;
}

}  // namespace flashjit
