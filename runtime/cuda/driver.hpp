// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1") so that every flashjit
// binary starts on machines without a GPU or driver. Only the entry points flashjit uses.
#pragma once

#include <cuda.h>

#include <string>

#include "generator/error.hpp"

namespace flashjit::cuda {

struct Driver {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext*);  // to restore a host's context (the Python module)
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncGetAttribute)(int*, CUfunction_attribute, CUfunction);
  CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
  CUresult (*cuEventCreate)(CUevent*, unsigned int);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuStreamSynchronize)(CUstream);
  // Optional (null when absent): the PCI bus id that names a GPU across processes, whatever
  // CUDA_VISIBLE_DEVICES numbers it (the tuners' timing lock).
  CUresult (*cuDeviceGetPCIBusId)(char*, int, CUdevice);
  // Optional (CUDA 12+ drivers; null when absent): TMA tensor maps for the -ws kernels.
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                     const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                     const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                     CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
};

// The process-wide driver table, loaded and cuInit'ed once. Error NoDevice when libcuda.so.1
// cannot be loaded or cuInit fails (the message says which and why).
Result<const Driver*> driver();

// Turns a CUresult into a Status naming the call: "cuModuleLoadData: CUDA_ERROR_INVALID_IMAGE
// (device kernel image is invalid)".
Status check(CUresult result, const char* call, ErrorCode code = ErrorCode::DriverError);

}  // namespace flashjit::cuda
