// The HIP attention forward on a real AMD GPU (MI200/MI300): every legal config of every
// (head_dim, dtype, causal) group of the standard set against the fp64 reference, over the shapes
// of the CUDA GPU test (a single row, ragged tails, seqlen_q != seqlen_k both ways, empty causal
// rows, GQA/MQA, batches, padded strides, BHSD), o and lse poisoned before each launch; then the
// Runtime end to end (attention() with its default config, then from the disk cache).
//
// Skips where there is no AMD GPU, which is everywhere this project has run so far: it is the
// test a user with an MI200/MI300X runs (README, "AMD (HIP)"). With FLASHJIT_EXPECT_AMD_GPU=1 a
// missing GPU fails instead. Only in builds with the HIP backend.
#include <gtest/gtest.h>

#if FLASHJIT_HAVE_HIP_BACKEND

#include <memory>
#include <string>
#include <vector>

#include "generator/hip_config.hpp"
#include "runtime/hip/hip_backend.hpp"
#include "runtime/runtime.hpp"
#include "support/all_configs.hpp"
#include "support/amd_gpu.hpp"
#include "support/attention_cases.hpp"
#include "support/device_run.hpp"
#include "support/reference.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// Every legal config of a group on every shape of the CUDA GPU test, with its tolerances (o 1e-2
// relative, lse 1e-3 absolute: tests/support/all_configs.hpp, tests/support/attention_cases.hpp).

class HipAttentionAllConfigs : public ::testing::TestWithParam<ft::ConfigGroup> {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_AMD_GPU(); }
};

TEST_P(HipAttentionAllConfigs, MatchesFp64Reference) {
  ft::check_all_configs(*ft::amd_backend(), GetParam(), {ft::gpu_test_shapes()});
}

INSTANTIATE_TEST_SUITE_P(AllGroups, HipAttentionAllConfigs,
                         ::testing::ValuesIn(ft::all_groups(Pass::Forward)),
                         [](const ::testing::TestParamInfo<ft::ConfigGroup>& info) {
                           return info.param.name();
                         });

// The Runtime on the HIP backend: the default config, compiled once, then from the disk cache in
// a second Runtime; a padded head dim.
TEST(HipAttentionRuntime, DefaultConfigThroughTheRuntimeAndTheDiskCache) {
  FLASHJIT_REQUIRE_AMD_GPU();
  ft::check_hip_runtime_and_disk_cache(Pass::Forward);
}

}  // namespace
}  // namespace flashjit

#else

TEST(HipAttention, NotBuilt) { GTEST_SKIP() << "built without the HIP backend (no ROCm headers)"; }

#endif
