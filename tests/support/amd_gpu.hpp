// AMD GPU access for tests (the HIP backend's counterpart of gpu.hpp): one HipBackend per process,
// created on first use, and a macro that skips a test (with the reason) where there is no usable
// AMD GPU, which is everywhere this project has run so far.
//
//   TEST(HipSomething, Works) {
//     FLASHJIT_REQUIRE_AMD_GPU();
//     const flashjit::hip::HipBackend& backend = *flashjit::testing::amd_backend();
//     ...
//   }
//
// With FLASHJIT_EXPECT_AMD_GPU=1 in the environment a missing GPU is a failure instead of a skip.
// Only in builds with the HIP backend (FLASHJIT_HAVE_HIP_BACKEND).
#pragma once

#if FLASHJIT_HAVE_HIP_BACKEND

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "runtime/hip/hip_backend.hpp"
#include "runtime/runtime.hpp"

namespace flashjit::testing {

// The process-wide backend on HIP device 0, or null when none could be created.
std::shared_ptr<hip::HipBackend> amd_backend();
// Why amd_backend() is null; empty when it is not.
const std::string& amd_unavailable_reason();
// True when FLASHJIT_EXPECT_AMD_GPU is set to a non-empty value other than "0".
bool amd_gpu_expected();

// The Runtime on the HIP backend end to end (the forward's and the backward's GPU tests): on a
// fresh cache directory, twice (the second time a new Runtime: from the disk cache), the problem
// of `pass` (batch 2, 4:2 heads, 257 x 300, bf16, causal) with head dims 96 (padded) and 128
// served with its default config (attention() or attention_backward(), no tuning DB), checked by
// `expect_kernel`, run with poisoned outputs and compared with the fp64 reference (o and lse, or
// the gradients within gradient_tolerance). Then the Runtime's stats: 2 compiles and no disk load
// the first time, the reverse the second.
void check_hip_runtime_and_disk_cache(Pass pass,
                                      const std::function<void(const Kernel&)>& expect_kernel = {});

}  // namespace flashjit::testing

// Usable in a TEST body or a fixture's SetUp (a function returning void).
#define FLASHJIT_REQUIRE_AMD_GPU()                                                            \
  do {                                                                                        \
    if (!::flashjit::testing::amd_backend()) {                                                \
      if (::flashjit::testing::amd_gpu_expected()) {                                          \
        FAIL() << "FLASHJIT_EXPECT_AMD_GPU is set but: "                                      \
               << ::flashjit::testing::amd_unavailable_reason();                              \
      }                                                                                       \
      GTEST_SKIP() << "no usable AMD GPU: " << ::flashjit::testing::amd_unavailable_reason(); \
    }                                                                                         \
  } while (0)

#endif
