// Loads libamdhip64 (and hipRTC) with dlopen; see hip_api.hpp.
#include "runtime/hip/hip_api.hpp"

#include <dlfcn.h>

#include <cstring>
#include <string>

namespace flashjit::hip {
namespace {

// The unversioned name first (whatever ROCm is installed with its -dev package), then the
// runtime sonames of ROCm 7, 6 and 5.
constexpr const char* kHipLibraries[] = {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6",
                                         "libamdhip64.so.5"};
constexpr const char* kRtcLibraries[] = {"libhiprtc.so",     "libhiprtc.so.7",  "libhiprtc.so.6",
                                         "libhiprtc.so.5",   "libamdhip64.so",  "libamdhip64.so.7",
                                         "libamdhip64.so.6", "libamdhip64.so.5"};

struct Loaded {
  void* handle = nullptr;
  std::string name;
  std::string errors;  // dlerror of each failed name
};

template <size_t N>
Loaded open_first(const char* const (&names)[N], const char* needed_symbol) {
  Loaded loaded;
  for (const char* name : names) {
    // RTLD_LOCAL: keep ROCm's symbols out of the process' global namespace.
    void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* reason = dlerror();
      loaded.errors +=
          std::string(loaded.errors.empty() ? "" : "; ") + (reason != nullptr ? reason : name);
      continue;
    }
    if (needed_symbol != nullptr && dlsym(handle, needed_symbol) == nullptr) {
      loaded.errors +=
          std::string(loaded.errors.empty() ? "" : "; ") + name + " lacks " + needed_symbol;
      dlclose(handle);
      continue;
    }
    loaded.handle = handle;
    loaded.name = name;
    return loaded;
  }
  return loaded;
}

template <class Function>
Status resolve(void* library, const std::string& library_name, Function*& entry, const char* symbol,
               ErrorCode code) {
  if (void* address = dlsym(library, symbol)) {
    entry = reinterpret_cast<Function*>(address);
    return ok_status();
  }
  return make_error(code, library_name + " lacks the symbol " + symbol +
                              " (ROCm too old or too new for this build of flashjit)");
}

std::string describe(const Api* table, hipError_t result) {
  const char* name = table != nullptr ? table->hipGetErrorName(result) : nullptr;
  const char* text = table != nullptr ? table->hipGetErrorString(result) : nullptr;
  std::string out =
      name != nullptr ? name : "hipError_t " + std::to_string(static_cast<int>(result));
  if (text != nullptr && (name == nullptr || std::strcmp(text, name) != 0)) {
    out += " (";
    out += text;
    out += ")";
  }
  return out;
}

Result<const Api*> load_api() {
  Loaded loaded = open_first(kHipLibraries, "hipInit");
  if (loaded.handle == nullptr) {
    return make_error(ErrorCode::NoDevice,
                      "libamdhip64 not found (no ROCm HIP runtime): " + loaded.errors);
  }
  // Never dlclose'd: the table lives for the whole process.
  static Api table{};
  const ErrorCode code = ErrorCode::NoDevice;
  const std::string& lib = loaded.name;
  void* h = loaded.handle;
  FLASHJIT_TRY(resolve(h, lib, table.hipInit, "hipInit", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipDriverGetVersion, "hipDriverGetVersion", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipRuntimeGetVersion, "hipRuntimeGetVersion", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipGetErrorName, "hipGetErrorName", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipGetErrorString, "hipGetErrorString", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipGetDeviceCount, "hipGetDeviceCount", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipSetDevice, "hipSetDevice", code));
  // The plain name is the pre-6.0 layout in every ROCm (6.x keeps it for old binaries).
  FLASHJIT_TRY(resolve(h, lib, table.hipGetDeviceProperties, "hipGetDeviceProperties", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipDeviceSynchronize, "hipDeviceSynchronize", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipStreamSynchronize, "hipStreamSynchronize", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipModuleLoadData, "hipModuleLoadData", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipModuleUnload, "hipModuleUnload", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipModuleGetFunction, "hipModuleGetFunction", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipFuncGetAttribute, "hipFuncGetAttribute", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipModuleLaunchKernel, "hipModuleLaunchKernel", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipMalloc, "hipMalloc", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipFree, "hipFree", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipMemcpy, "hipMemcpy", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipMemset, "hipMemset", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipMemsetAsync, "hipMemsetAsync", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipEventCreate, "hipEventCreate", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipEventDestroy, "hipEventDestroy", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipEventRecord, "hipEventRecord", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipEventSynchronize, "hipEventSynchronize", code));
  FLASHJIT_TRY(resolve(h, lib, table.hipEventElapsedTime, "hipEventElapsedTime", code));

  const hipError_t init = table.hipInit(0);
  if (init != hipSuccess) {
    return make_error(ErrorCode::NoDevice, "hipInit failed: " + describe(&table, init) +
                                               " (ROCm runtime present, but no usable AMD GPU)");
  }
  return static_cast<const Api*>(&table);
}

Result<const Rtc*> load_rtc() {
  Loaded loaded = open_first(kRtcLibraries, "hiprtcCompileProgram");
  if (loaded.handle == nullptr) {
    return make_error(ErrorCode::Unsupported,
                      "hipRTC not found (install libamdhip64-dev, or ROCm): " + loaded.errors);
  }
  static Rtc table{};
  const ErrorCode code = ErrorCode::Unsupported;
  const std::string& lib = loaded.name;
  void* h = loaded.handle;
  FLASHJIT_TRY(resolve(h, lib, table.hiprtcVersion, "hiprtcVersion", code));
  FLASHJIT_TRY(resolve(h, lib, table.hiprtcGetErrorString, "hiprtcGetErrorString", code));
  FLASHJIT_TRY(resolve(h, lib, table.hiprtcCreateProgram, "hiprtcCreateProgram", code));
  FLASHJIT_TRY(resolve(h, lib, table.hiprtcCompileProgram, "hiprtcCompileProgram", code));
  FLASHJIT_TRY(resolve(h, lib, table.hiprtcGetProgramLogSize, "hiprtcGetProgramLogSize", code));
  FLASHJIT_TRY(resolve(h, lib, table.hiprtcGetProgramLog, "hiprtcGetProgramLog", code));
  FLASHJIT_TRY(resolve(h, lib, table.hiprtcGetCodeSize, "hiprtcGetCodeSize", code));
  FLASHJIT_TRY(resolve(h, lib, table.hiprtcGetCode, "hiprtcGetCode", code));
  FLASHJIT_TRY(resolve(h, lib, table.hiprtcDestroyProgram, "hiprtcDestroyProgram", code));
  table.library = lib;
  // The ROCm version, for cache keys and fingerprints: hipRuntimeGetVersion answers without a
  // device (libhiprtc does not have it; the HIP runtime of the same ROCm does).
  Loaded runtime = open_first(kHipLibraries, "hipRuntimeGetVersion");
  if (runtime.handle != nullptr) {
    auto version =
        reinterpret_cast<hipError_t (*)(int*)>(dlsym(runtime.handle, "hipRuntimeGetVersion"));
    int value = 0;
    if (version(&value) == hipSuccess) table.runtime_version = value;
  }
  return static_cast<const Rtc*>(&table);
}

}  // namespace

Result<const Api*> api() {
  // Loaded once (thread-safe magic static); a failure is remembered too.
  static const Result<const Api*> loaded = load_api();
  return loaded;
}

int device_count() {
  const Result<const Api*> loaded = api();
  if (!loaded.ok()) return 0;
  int count = 0;
  if (loaded.value()->hipGetDeviceCount(&count) != hipSuccess) return 0;
  return count;
}

Status check(hipError_t result, const char* call, ErrorCode code) {
  if (result == hipSuccess) return ok_status();
  const Result<const Api*> table = api();
  return make_error(
      code, std::string(call) + ": " + describe(table.ok() ? table.value() : nullptr, result));
}

Result<const Rtc*> rtc() {
  static const Result<const Rtc*> loaded = load_rtc();
  return loaded;
}

bool supported_processor(const std::string& processor) {
  return processor == "gfx90a" || processor == "gfx940" || processor == "gfx941" ||
         processor == "gfx942";
}

Result<DeviceSpec> device_spec_from_properties(const hipDeviceProp_t& p) {
  DeviceSpec spec;
  spec.name = std::string(p.name, strnlen(p.name, sizeof p.name));
  spec.gcn_arch = std::string(p.gcnArchName, strnlen(p.gcnArchName, sizeof p.gcnArchName));
  if (spec.gcn_arch.rfind("gfx", 0) != 0 || (p.warpSize != 32 && p.warpSize != 64) ||
      p.multiProcessorCount <= 0) {
    return make_error(ErrorCode::Unsupported,
                      "HIP device properties do not look like an AMD GPU's (gcnArchName '" +
                          spec.gcn_arch + "', warpSize " + std::to_string(p.warpSize) +
                          "): the HIP runtime's hipDeviceProp_t layout differs from the ROCm "
                          "headers this flashjit was built with");
  }
  spec.warp_size = p.warpSize;
  spec.sm_count = p.multiProcessorCount;
  spec.smem_per_block_optin = static_cast<int>(p.sharedMemPerBlock);
  spec.smem_per_sm = static_cast<int>(p.maxSharedMemoryPerMultiProcessor);
  if (spec.smem_per_sm < spec.smem_per_block_optin) spec.smem_per_sm = spec.smem_per_block_optin;
  // CDNA2/3: 4 SIMDs per CU, each with 512 registers per lane (VGPRs and AGPRs unified).
  spec.max_regs_per_thread = 512;
  spec.regs_per_sm = 512 * 64 * 4;
  spec.max_threads_per_sm = p.maxThreadsPerMultiProcessor;
  spec.max_threads_per_block = p.maxThreadsPerBlock;
  spec.l2_bytes = p.l2CacheSize;
  return spec;
}

}  // namespace flashjit::hip
