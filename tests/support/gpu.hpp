// GPU access for tests: one CudaBackend per process, created on first use, and a macro that
// skips a test (with the reason) where there is no usable CUDA GPU.
//
//   TEST(CudaAttention, Something) {
//     FLASHJIT_REQUIRE_GPU();
//     const flashjit::cuda::CudaBackend& backend = *flashjit::testing::gpu_backend();
//     ...
//   }
//
// With FLASHJIT_EXPECT_GPU=1 in the environment (set by bench/device_run.sh on the GPU machine)
// a missing GPU is a failure instead of a skip, so GPU tests cannot silently pass there.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "runtime/cuda/cuda_backend.hpp"

namespace flashjit::testing {

// The process-wide backend on device 0, or null when none could be created.
std::shared_ptr<cuda::CudaBackend> gpu_backend();
// Why gpu_backend() is null ("NoDevice: dlopen(libcuda.so.1) failed: ..."); empty when it is not.
const std::string& gpu_unavailable_reason();
// True when FLASHJIT_EXPECT_GPU is set to a non-empty value other than "0".
bool gpu_expected();

}  // namespace flashjit::testing

// Usable in a TEST body or a fixture's SetUp (a function returning void).
#define FLASHJIT_REQUIRE_GPU()                                                          \
  do {                                                                                  \
    if (!::flashjit::testing::gpu_backend()) {                                          \
      if (::flashjit::testing::gpu_expected()) {                                        \
        FAIL() << "FLASHJIT_EXPECT_GPU is set but there is no CUDA GPU: "               \
               << ::flashjit::testing::gpu_unavailable_reason();                        \
      }                                                                                 \
      GTEST_SKIP() << "no CUDA GPU: " << ::flashjit::testing::gpu_unavailable_reason(); \
    }                                                                                   \
  } while (0)
