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

#include <filesystem>
#include <memory>
#include <random>
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
  std::random_device entropy;
  const std::filesystem::path cache_dir =
      std::filesystem::temp_directory_path() /
      ("flashjit-hip-test-cache-" + std::to_string(entropy()) + std::to_string(entropy()));
  RuntimeOptions options;
  options.backend = "hip";
  options.user_db = "none";
  options.cache_dir = cache_dir;
  for (int pass = 0; pass < 2; ++pass) {
    Result<std::unique_ptr<Runtime>> runtime = Runtime::create(options);
    ASSERT_TRUE(runtime.ok()) << runtime.error().describe();
    const Backend& backend = (*runtime)->backend();
    EXPECT_EQ(backend.name(), "hip");
    for (int head_dim : {96, 128}) {
      const auto problem = AttentionProblem::make(2, 4, 2, 257, 300, head_dim, DType::BF16, true);
      Result<std::shared_ptr<Kernel>> kernel = (*runtime)->attention(problem);
      ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
      const ft::HostInputs inputs = ft::random_inputs(problem, 5);
      Result<ft::DeviceTensors> tensors = ft::upload(backend, problem, inputs);
      ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
      const ft::RunOutput out = ft::run_poisoned(backend, **kernel, problem, tensors.value());
      ASSERT_TRUE(out.status.ok()) << out.status.error().describe();
      EXPECT_TRUE(ft::matches_reference(
          ft::compare(problem, out.o, out.lse, ft::reference_attention(problem, inputs))))
          << "d" << head_dim << " " << (*kernel)->config().to_string() << " pass " << pass;
    }
    const RuntimeStats stats = (*runtime)->stats();
    EXPECT_EQ(stats.compiles, pass == 0 ? 2 : 0);
    EXPECT_EQ(stats.disk_cache_loads, pass == 0 ? 0 : 2);
  }
  std::error_code ignored;
  std::filesystem::remove_all(cache_dir, ignored);
}

}  // namespace
}  // namespace flashjit

#else

TEST(HipAttention, NotBuilt) { GTEST_SKIP() << "built without the HIP backend (no ROCm headers)"; }

#endif
