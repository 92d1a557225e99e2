// The HIP decode family (templates/hip/decode.hpp) on a real AMD GPU (MI200/MI300): the checks of
// tests/support/decode_gpu_checks.hpp, as the CUDA backend runs them (every legal tile of the
// d = 128 bf16 paged group and the untuned defaults of other groups against the fp64 reference,
// split counts 1, 3, auto and more than the keys' blocks; the split counters, zeroed with
// hipMemsetAsync, across changing workspace layouts and caller workspaces; the Runtime's default
// for a decode problem).
//
// Skips where there is no AMD GPU, which is everywhere this project has run so far (the template
// is compiled for gfx90a and emulated on the host in CI: tests/templates/hip_compile_test.cpp,
// hip_decode_emulation_test.cpp). With FLASHJIT_EXPECT_AMD_GPU=1 a missing GPU fails instead.
// Only in builds with the HIP backend.
#include <gtest/gtest.h>

#if FLASHJIT_HAVE_HIP_BACKEND

#include "generator/config.hpp"
#include "support/amd_gpu.hpp"
#include "support/decode_gpu_checks.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

class HipDecode : public ::testing::Test {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_AMD_GPU(); }
};

TEST_F(HipDecode, EveryLegalTileMatchesTheReference) {
  ft::check_every_legal_decode_tile(*ft::amd_backend());
}

TEST_F(HipDecode, DefaultsOfOtherGroupsMatchTheReference) {
  ft::check_decode_defaults(*ft::amd_backend());
}

TEST_F(HipDecode, SplitCountersHoldAcrossLayoutsAndCallerWorkspaces) {
  ft::check_decode_split_counters(*ft::amd_backend(), {16, 64, 4, 1, KernelFamily::Decode});
}

TEST_F(HipDecode, RuntimeServesTheDecodeFamily) { ft::check_runtime_serves_decode("hip"); }

}  // namespace
}  // namespace flashjit

#else

TEST(HipDecode, NotBuilt) { GTEST_SKIP() << "built without the HIP backend (no ROCm headers)"; }

#endif
