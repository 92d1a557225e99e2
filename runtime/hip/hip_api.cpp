// Loads libamdhip64 (and hipRTC) with dlopen; see hip_api.hpp.
#include "runtime/hip/hip_api.hpp"

#include <dlfcn.h>

#include <cstring>
#include <string>
#include <utility>

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

// Resolves the entries of a table from the first of `libraries` that has `needed_symbol`
// (error `code`, `what` naming the library, when none has).
class Resolver {
 public:
  template <size_t N>
  Resolver(const char* const (&libraries)[N], const char* needed_symbol, ErrorCode code,
           const char* what)
      : loaded_(open_first(libraries, needed_symbol)), code_(code), what_(what) {}

  Status found() const {
    if (loaded_.handle != nullptr) return ok_status();
    return make_error(code_, std::string(what_) + ": " + loaded_.errors);
  }
  const std::string& library() const { return loaded_.name; }

  // Each (entry, symbol) pair in turn, stopping at the first symbol the library lacks.
  Status all() const { return ok_status(); }
  template <class Function, class Symbol, class... Rest>
  Status all(Function*& entry, const Symbol& symbol, Rest&&... rest) const {
    FLASHJIT_TRY((*this)(entry, symbol));
    return all(std::forward<Rest>(rest)...);
  }

  template <class Function>
  Status operator()(Function*& entry, const char* symbol) const {
    if (void* address = dlsym(loaded_.handle, symbol)) {
      entry = reinterpret_cast<Function*>(address);
      return ok_status();
    }
    return make_error(code_, loaded_.name + " lacks the symbol " + symbol +
                                 " (ROCm too old or too new for this build of flashjit)");
  }

 private:
  Loaded loaded_;
  ErrorCode code_;
  const char* what_;
};

// `table`'s member `entry` and its name, for Resolver::all.
#define FLASHJIT_ENTRY(entry) table.entry, #entry

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
  const Resolver resolve(kHipLibraries, "hipInit", ErrorCode::NoDevice,
                         "libamdhip64 not found (no ROCm HIP runtime)");
  FLASHJIT_TRY(resolve.found());
  // Never dlclose'd: the table lives for the whole process. hipGetDeviceProperties: the plain
  // name is the pre-6.0 layout in every ROCm (6.x keeps it for old binaries).
  static Api table{};
  FLASHJIT_TRY(
      resolve.all(FLASHJIT_ENTRY(hipInit), FLASHJIT_ENTRY(hipDriverGetVersion),
                  FLASHJIT_ENTRY(hipRuntimeGetVersion), FLASHJIT_ENTRY(hipGetErrorName),
                  FLASHJIT_ENTRY(hipGetErrorString), FLASHJIT_ENTRY(hipGetDeviceCount),
                  FLASHJIT_ENTRY(hipSetDevice), FLASHJIT_ENTRY(hipGetDeviceProperties),
                  FLASHJIT_ENTRY(hipDeviceSynchronize), FLASHJIT_ENTRY(hipStreamSynchronize),
                  FLASHJIT_ENTRY(hipModuleLoadData), FLASHJIT_ENTRY(hipModuleUnload),
                  FLASHJIT_ENTRY(hipModuleGetFunction), FLASHJIT_ENTRY(hipFuncGetAttribute),
                  FLASHJIT_ENTRY(hipModuleLaunchKernel), FLASHJIT_ENTRY(hipMalloc),
                  FLASHJIT_ENTRY(hipFree), FLASHJIT_ENTRY(hipMemcpy), FLASHJIT_ENTRY(hipMemset),
                  FLASHJIT_ENTRY(hipMemsetAsync), FLASHJIT_ENTRY(hipEventCreate),
                  FLASHJIT_ENTRY(hipEventDestroy), FLASHJIT_ENTRY(hipEventRecord),
                  FLASHJIT_ENTRY(hipEventSynchronize), FLASHJIT_ENTRY(hipEventElapsedTime)));

  const hipError_t init = table.hipInit(0);
  if (init != hipSuccess) {
    return make_error(ErrorCode::NoDevice, "hipInit failed: " + describe(&table, init) +
                                               " (ROCm runtime present, but no usable AMD GPU)");
  }
  return static_cast<const Api*>(&table);
}

Result<const Rtc*> load_rtc() {
  const Resolver resolve(kRtcLibraries, "hiprtcCompileProgram", ErrorCode::Unsupported,
                         "hipRTC not found (install libamdhip64-dev, or ROCm)");
  FLASHJIT_TRY(resolve.found());
  static Rtc table{};
  FLASHJIT_TRY(resolve.all(FLASHJIT_ENTRY(hiprtcVersion), FLASHJIT_ENTRY(hiprtcGetErrorString),
                           FLASHJIT_ENTRY(hiprtcCreateProgram),
                           FLASHJIT_ENTRY(hiprtcCompileProgram),
                           FLASHJIT_ENTRY(hiprtcGetProgramLogSize),
                           FLASHJIT_ENTRY(hiprtcGetProgramLog), FLASHJIT_ENTRY(hiprtcGetCodeSize),
                           FLASHJIT_ENTRY(hiprtcGetCode), FLASHJIT_ENTRY(hiprtcDestroyProgram)));
  table.library = resolve.library();
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
