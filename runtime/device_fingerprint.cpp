// DeviceFingerprint::to_string: see runtime/device_fingerprint.hpp.
#include "runtime/device_fingerprint.hpp"

#include <cstdarg>
#include <cstdio>

namespace flashjit {
namespace {

// printf into a std::string.
__attribute__((format(printf, 1, 2))) std::string format(const char* pattern, ...) {
  va_list args, again;
  va_start(args, pattern);
  va_copy(again, args);
  const int size = std::vsnprintf(nullptr, 0, pattern, args);
  va_end(args);
  std::string out(static_cast<size_t>(size > 0 ? size : 0), '\0');
  std::vsnprintf(out.data(), out.size() + 1, pattern, again);
  va_end(again);
  return out;
}

}  // namespace

std::string DeviceFingerprint::to_string() const {
  if (backend == "cpu") {
    // "cpu|AMD EPYC|2cores|L2 1048576B|L3 33554432B|clang 14.0.6 ... avx512f avx2 fma f16c ..."
    return format("%s|%s|%dcores|L2 %dB|L3 %dB|%s", backend.c_str(), name.c_str(), sm_count,
                  smem_per_block_optin, l2_bytes, compiler.c_str());
  }
  // GPUs: "cuda|NVIDIA H200|sm90|132sm|232448B|52428800B|drv13000|nvrtc 13.0", or
  // "hip|AMD Instinct MI250X|gfx90a|110cu|65536B|8388608B|drv50221153|hiprtc 5.2.21153 ...":
  // for HIP arch holds the gfx processor's hex digits (gcn_arch_number), and the feature flags
  // of the target ID are in the compiler field.
  const bool hip = backend == "hip";
  const std::string arch_text =
      hip ? format("gfx%x", static_cast<unsigned>(arch)) : format("sm%d", arch);
  return format("%s|%s|%s|%d%s|%dB|%dB|drv%d|%s", backend.c_str(), name.c_str(), arch_text.c_str(),
                sm_count, hip ? "cu" : "sm", smem_per_block_optin, l2_bytes, driver_version,
                compiler.c_str());
}

}  // namespace flashjit
