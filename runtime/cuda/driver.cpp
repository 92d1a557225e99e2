// Loads the CUDA driver API with dlopen so that no flashjit binary links libcuda (a binary linked
// against the stub does not start on a machine without a driver).
#include "runtime/cuda/driver.hpp"

#include <dlfcn.h>

#include <initializer_list>
#include <string>

namespace flashjit::cuda {
namespace {

constexpr const char* kDriverLibrary = "libcuda.so.1";

// "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)", or the bare number when the
// driver cannot name the code (or is not loaded yet).
std::string describe_result(const Driver* table, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (table != nullptr && table->cuGetErrorName != nullptr) {
    if (table->cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  }
  if (table != nullptr && table->cuGetErrorString != nullptr) {
    if (table->cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
  }
  // cuGetErrorName fails when the driver itself is unusable (the link stub answers every call
  // with CUDA_ERROR_STUB_LIBRARY): name the codes seen at initialization here.
  if (name == nullptr) {
    switch (result) {
      case CUDA_ERROR_STUB_LIBRARY:
        name = "CUDA_ERROR_STUB_LIBRARY";
        break;
      case CUDA_ERROR_NO_DEVICE:
        name = "CUDA_ERROR_NO_DEVICE";
        break;
      case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
        name = "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
        break;
      case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
        name = "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
        break;
      default:
        break;
    }
  }
  std::string described = name != nullptr
                              ? std::string(name)
                              : std::string("CUresult ") + std::to_string(static_cast<int>(result));
  if (text != nullptr) described += std::string(" (") + text + ")";
  return described;
}

// Resolves the first of `symbols` that libcuda exports into `entry`. cuda.h #defines many API
// names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2); the struct member carries the
// versioned signature, so the versioned exported name must be listed first. Older names are
// fallbacks only where their signature is identical.
template <class Function>
Status resolve(void* library, Function*& entry, std::initializer_list<const char*> symbols) {
  for (const char* symbol : symbols) {
    if (void* address = dlsym(library, symbol)) {
      entry = reinterpret_cast<Function*>(address);
      return ok_status();
    }
  }
  return make_error(ErrorCode::NoDevice, std::string(kDriverLibrary) + " lacks the symbol " +
                                             *symbols.begin() +
                                             " (driver too old for this build of flashjit)");
}

Result<const Driver*> load_driver() {
  // RTLD_LOCAL: keep the driver's symbols out of the global namespace of the host process.
  void* library = dlopen(kDriverLibrary, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* reason = dlerror();
    return make_error(ErrorCode::NoDevice, std::string(kDriverLibrary) +
                                               " not found (no NVIDIA driver): " +
                                               (reason != nullptr ? reason : "unknown reason"));
  }
  // Never dlclose'd: the table lives for the whole process, and handles outlive any one caller.
  static Driver table{};
  FLASHJIT_TRY(resolve(library, table.cuInit, {"cuInit"}));
  FLASHJIT_TRY(resolve(library, table.cuDriverGetVersion, {"cuDriverGetVersion"}));
  FLASHJIT_TRY(resolve(library, table.cuGetErrorName, {"cuGetErrorName"}));
  FLASHJIT_TRY(resolve(library, table.cuGetErrorString, {"cuGetErrorString"}));
  FLASHJIT_TRY(resolve(library, table.cuDeviceGetCount, {"cuDeviceGetCount"}));
  FLASHJIT_TRY(resolve(library, table.cuDeviceGet, {"cuDeviceGet"}));
  FLASHJIT_TRY(resolve(library, table.cuDeviceGetName, {"cuDeviceGetName"}));
  FLASHJIT_TRY(resolve(library, table.cuDeviceGetAttribute, {"cuDeviceGetAttribute"}));
  FLASHJIT_TRY(resolve(library, table.cuDevicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"}));
  FLASHJIT_TRY(resolve(library, table.cuDevicePrimaryCtxRelease,
                       {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}));
  FLASHJIT_TRY(resolve(library, table.cuCtxSetCurrent, {"cuCtxSetCurrent"}));
  FLASHJIT_TRY(resolve(library, table.cuCtxGetCurrent, {"cuCtxGetCurrent"}));
  // The plain symbol: cuCtxSynchronize_v2 takes a context argument.
  FLASHJIT_TRY(resolve(library, table.cuCtxSynchronize, {"cuCtxSynchronize"}));
  FLASHJIT_TRY(resolve(library, table.cuModuleLoadData, {"cuModuleLoadData"}));
  FLASHJIT_TRY(resolve(library, table.cuModuleUnload, {"cuModuleUnload"}));
  FLASHJIT_TRY(resolve(library, table.cuModuleGetFunction, {"cuModuleGetFunction"}));
  FLASHJIT_TRY(resolve(library, table.cuFuncGetAttribute, {"cuFuncGetAttribute"}));
  FLASHJIT_TRY(resolve(library, table.cuFuncSetAttribute, {"cuFuncSetAttribute"}));
  FLASHJIT_TRY(resolve(library, table.cuLaunchKernel, {"cuLaunchKernel"}));
  FLASHJIT_TRY(resolve(library, table.cuMemAlloc, {"cuMemAlloc_v2"}));
  FLASHJIT_TRY(resolve(library, table.cuMemFree, {"cuMemFree_v2"}));
  FLASHJIT_TRY(resolve(library, table.cuMemcpyHtoD, {"cuMemcpyHtoD_v2"}));
  FLASHJIT_TRY(resolve(library, table.cuMemcpyDtoH, {"cuMemcpyDtoH_v2"}));
  FLASHJIT_TRY(resolve(library, table.cuMemsetD8, {"cuMemsetD8_v2"}));
  FLASHJIT_TRY(resolve(library, table.cuMemsetD32Async, {"cuMemsetD32Async"}));
  FLASHJIT_TRY(resolve(library, table.cuEventCreate, {"cuEventCreate"}));
  FLASHJIT_TRY(resolve(library, table.cuEventDestroy, {"cuEventDestroy_v2", "cuEventDestroy"}));
  FLASHJIT_TRY(resolve(library, table.cuEventRecord, {"cuEventRecord"}));
  FLASHJIT_TRY(resolve(library, table.cuEventSynchronize, {"cuEventSynchronize"}));
  // _v2 (driver >= 12.8) has the same signature; older drivers only export the plain name.
  FLASHJIT_TRY(
      resolve(library, table.cuEventElapsedTime, {"cuEventElapsedTime_v2", "cuEventElapsedTime"}));
  FLASHJIT_TRY(resolve(library, table.cuStreamSynchronize, {"cuStreamSynchronize"}));
  // Optional: a driver without it still runs every family but -ws (its launch says why).
  table.cuDeviceGetPCIBusId =
      reinterpret_cast<decltype(table.cuDeviceGetPCIBusId)>(dlsym(library, "cuDeviceGetPCIBusId"));
  table.cuTensorMapEncodeTiled = reinterpret_cast<decltype(table.cuTensorMapEncodeTiled)>(
      dlsym(library, "cuTensorMapEncodeTiled"));

  const CUresult init = table.cuInit(0);
  if (init != CUDA_SUCCESS) {
    return make_error(ErrorCode::NoDevice, "cuInit failed: " + describe_result(&table, init) +
                                               " (driver present but unusable, or no NVIDIA GPU)");
  }
  return static_cast<const Driver*>(&table);
}

}  // namespace

Result<const Driver*> driver() {
  // Function-local static: loaded exactly once, thread-safe (C++11 magic statics). A failure is
  // remembered too, so a machine without a driver pays for dlopen only once.
  static const Result<const Driver*> loaded = load_driver();
  return loaded;
}

Status check(CUresult result, const char* call, ErrorCode code) {
  if (result == CUDA_SUCCESS) return ok_status();
  const Result<const Driver*> table = driver();
  return make_error(code, std::string(call) + ": " +
                              describe_result(table.ok() ? table.value() : nullptr, result));
}

}  // namespace flashjit::cuda
