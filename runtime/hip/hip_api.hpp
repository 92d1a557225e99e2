// The HIP runtime and hipRTC, loaded at run time with dlopen so that every flashjit binary starts
// (and behaves as before) on machines without ROCm. Only the entry points flashjit uses. Types
// come from the ROCm headers found at build time (Debian 12: ROCm 5.2); the entry points chosen
// keep their ABI across ROCm 5 and 6 (hipGetDeviceProperties: the exported pre-6.0 layout).
#pragma once

#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>

#include <string>

#include "generator/device.hpp"
#include "generator/error.hpp"

namespace flashjit::hip {

struct Api {
  hipError_t (*hipInit)(unsigned int);
  hipError_t (*hipDriverGetVersion)(int*);
  hipError_t (*hipRuntimeGetVersion)(int*);
  const char* (*hipGetErrorName)(hipError_t);
  const char* (*hipGetErrorString)(hipError_t);
  hipError_t (*hipGetDeviceCount)(int*);
  hipError_t (*hipSetDevice)(int);
  // The pre-ROCm-6 layout, which ROCm 6 still exports under this name (the ROCm 6 headers map the
  // name to hipGetDevicePropertiesR0600); read through device_spec_from_properties.
  hipError_t (*hipGetDeviceProperties)(hipDeviceProp_t*, int);
  hipError_t (*hipDeviceSynchronize)();
  hipError_t (*hipStreamSynchronize)(hipStream_t);
  hipError_t (*hipModuleLoadData)(hipModule_t*, const void*);
  hipError_t (*hipModuleUnload)(hipModule_t);
  hipError_t (*hipModuleGetFunction)(hipFunction_t*, hipModule_t, const char*);
  hipError_t (*hipFuncGetAttribute)(int*, hipFunction_attribute, hipFunction_t);
  hipError_t (*hipModuleLaunchKernel)(hipFunction_t, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, unsigned, unsigned, hipStream_t, void**, void**);
  hipError_t (*hipMalloc)(void**, size_t);
  hipError_t (*hipFree)(void*);
  hipError_t (*hipMemcpy)(void*, const void*, size_t, hipMemcpyKind);
  hipError_t (*hipMemset)(void*, int, size_t);
  hipError_t (*hipMemsetAsync)(void*, int, size_t, hipStream_t);
  hipError_t (*hipEventCreate)(hipEvent_t*);
  hipError_t (*hipEventDestroy)(hipEvent_t);
  hipError_t (*hipEventRecord)(hipEvent_t, hipStream_t);
  hipError_t (*hipEventSynchronize)(hipEvent_t);
  hipError_t (*hipEventElapsedTime)(float*, hipEvent_t, hipEvent_t);
};

// The process-wide HIP runtime, loaded and hipInit'ed once. Error NoDevice when libamdhip64
// cannot be loaded or hipInit fails (no AMD GPU or driver); the message says which.
Result<const Api*> api();

// Number of AMD GPUs HIP sees; 0 when there is no runtime or no device.
int device_count();

// "hipModuleLoadData: hipErrorInvalidImage (invalid kernel file)".
Status check(hipError_t result, const char* call, ErrorCode code = ErrorCode::DriverError);

// hipRTC. ROCm 5.2 exports it from libamdhip64; later releases from libhiprtc.
struct Rtc {
  hiprtcResult (*hiprtcVersion)(int*, int*);
  const char* (*hiprtcGetErrorString)(hiprtcResult);
  hiprtcResult (*hiprtcCreateProgram)(hiprtcProgram*, const char*, const char*, int, const char**,
                                      const char**);
  hiprtcResult (*hiprtcCompileProgram)(hiprtcProgram, int, const char**);
  hiprtcResult (*hiprtcGetProgramLogSize)(hiprtcProgram, size_t*);
  hiprtcResult (*hiprtcGetProgramLog)(hiprtcProgram, char*);
  hiprtcResult (*hiprtcGetCodeSize)(hiprtcProgram, size_t*);
  hiprtcResult (*hiprtcGetCode)(hiprtcProgram, char*);
  hiprtcResult (*hiprtcDestroyProgram)(hiprtcProgram*);
  std::string library;      // the file it came from, for messages
  int runtime_version = 0;  // hipRuntimeGetVersion of the ROCm it belongs to (no device needed)
};

// hipRTC, loaded once (no device needed). Error Unsupported when no library has it. Only the
// compile worker (flashjit-hiprtc-worker) calls hipRTC: see runtime/hip/hiprtc_compiler.hpp.
Result<const Rtc*> rtc();

// The limits of an AMD device from HIP's properties: name, target ID (gcnArchName), CUs, LDS,
// wavefront size, threads, L2. HIP's regsPerBlock does not describe CDNA's unified VGPR/AGPR
// file, so registers come from the architecture (512 per lane, 4 SIMDs per CU). Error
// Unsupported when the properties do not look like an AMD GPU's (a struct layout this build
// does not know).
Result<DeviceSpec> device_spec_from_properties(const hipDeviceProp_t& properties);

// Processors the HIP template supports: CDNA2/3 (bf16 MFMA _1k, 64 KiB LDS): gfx90a, gfx940,
// gfx941, gfx942.
bool supported_processor(const std::string& processor);

}  // namespace flashjit::hip
