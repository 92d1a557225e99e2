// DeviceFingerprint: what identifies "an identical machine" for tuning results. Every backend
// reports its own (Backend::fingerprint()); the tuning store keys its rows by to_string().
#pragma once

#include <string>

namespace flashjit {

struct DeviceFingerprint {
  std::string backend;  // "cuda"
  std::string name;     // "NVIDIA H200" (informational, part of the key)
  int arch = 0;         // 90
  int sm_count = 0;
  int smem_per_block_optin = 0;
  int l2_bytes = 0;
  int driver_version = 0;  // cuDriverGetVersion, e.g. 13000
  std::string compiler;    // "nvrtc 13.0"

  // One line, stable: "cuda|NVIDIA H200|sm90|132sm|232448B|52428800B|drv13000|nvrtc 13.0".
  // The CPU backend (backend "cpu": sm_count = cores, smem_per_block_optin = L2, l2_bytes = L3,
  // compiler = clang version, target, ISA features and L1d) prints
  // "cpu|AMD EPYC|2cores|L2 1048576B|L3 33554432B|clang 14.0.6 ...". The HIP backend (arch =
  // the gfx processor's hex digits, sm_count = CUs, compiler = hipRTC version + target ID) prints
  // "hip|AMD Instinct MI250X|gfx90a|110cu|65536B|8388608B|drv50221153|hiprtc 5.2.21153 gfx90a:...".
  // Defined in runtime/device_fingerprint.cpp.
  std::string to_string() const;
  bool operator==(const DeviceFingerprint&) const = default;
};

}  // namespace flashjit
