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

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "generator/hip_config.hpp"
#include "runtime/binary_cache.hpp"
#include "runtime/hip/hip_backend.hpp"
#include "runtime/runtime.hpp"
#include "support/amd_gpu.hpp"
#include "support/attention_cases.hpp"
#include "support/device_run.hpp"
#include "support/parallel.hpp"
#include "support/reference.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

constexpr double kMaxOutputRelError = 1e-2;
constexpr double kMaxLseAbsError = 1e-3;
constexpr int kMaxFailuresPerGroup = 30;

// ---- shapes: tests/support/attention_cases.hpp (the CUDA GPU test's)
// -----------------------------------

using ft::Shape;
using ft::Storage;

const std::vector<Shape>& test_shapes() { return ft::gpu_test_shapes(); }

using ft::make_problem;  // forward problems

// ---- every legal config of a group on every shape ----------------------------------------------

struct Group {
  int head_dim;
  DType dtype;
  bool causal;
  std::string name() const {
    std::string text = "d";
    text += std::to_string(head_dim);
    text += "_";
    text += to_string(dtype);
    text += causal ? "_causal" : "_noncausal";
    return text;
  }
};

void PrintTo(const Group& group, std::ostream* out) { *out << group.name(); }

class HipAttentionAllConfigs : public ::testing::TestWithParam<Group> {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_AMD_GPU(); }
};

TEST_P(HipAttentionAllConfigs, MatchesFp64Reference) {
  const Group& group = GetParam();
  const hip::HipBackend& backend = *ft::amd_backend();
  const AttentionProblem group_problem =
      AttentionProblem::make(1, 2, 2, 128, 128, group.head_dim, group.dtype, group.causal);
  const std::vector<AttentionConfig> configs = backend.legal_configs(group_problem);
  ASSERT_FALSE(configs.empty()) << group.name() << " on " << backend.device().to_string();

  // Built concurrently: each compile is its own hipRTC worker process.
  struct Built {
    AttentionConfig config;
    std::shared_ptr<Kernel> kernel;
    std::string error;
  };
  const std::vector<Built> built = ft::parallel_map<Built>(configs.size(), [&](size_t i) {
    Built b{configs[i], nullptr, ""};
    Result<std::shared_ptr<Kernel>> kernel =
        build_kernel(backend, nullptr, group_problem, b.config);
    if (kernel.ok()) {
      b.kernel = kernel.value();
    } else {
      b.error = kernel.error().describe();
    }
    return b;
  });
  int failures = 0;
  for (const Built& b : built) {
    if (!b.kernel) {
      ADD_FAILURE() << group.name() << " " << b.config.to_string() << ": build failed: " << b.error;
      ++failures;
    }
  }
  std::map<AttentionConfig, double> worst;
  const std::vector<Shape>& shapes = test_shapes();
  for (size_t s = 0; s < shapes.size(); ++s) {
    const AttentionProblem problem =
        make_problem(shapes[s], group.head_dim, group.dtype, group.causal);
    const std::string shape_context = group.name() + " shape=" + shapes[s].to_string();
    ASSERT_TRUE(validate(problem).ok()) << shape_context;
    const ft::HostInputs inputs = ft::random_inputs(problem, 1000 + s);
    const ft::Reference reference = ft::reference_attention(problem, inputs);
    Result<ft::DeviceTensors> tensors = ft::upload(backend, problem, inputs);
    ASSERT_TRUE(tensors.ok()) << shape_context << ": " << tensors.error().describe();
    for (const Built& b : built) {
      if (!b.kernel) continue;
      const std::string context = shape_context + " config=" + b.config.to_string();
      const ft::RunOutput out = ft::run_poisoned(backend, *b.kernel, problem, tensors.value());
      if (!out.status.ok()) {
        ADD_FAILURE() << context << ": " << out.status.error().describe();
        if (++failures >= kMaxFailuresPerGroup) FAIL() << "stopping " << group.name();
        continue;
      }
      const ft::Comparison comparison = ft::compare(problem, out.o, out.lse, reference);
      worst[b.config] = std::max(worst[b.config], comparison.o_rel_error);
      const ::testing::AssertionResult matches =
          ft::matches_reference(comparison, kMaxOutputRelError, kMaxLseAbsError);
      EXPECT_TRUE(matches) << context;
      if (!matches && ++failures >= kMaxFailuresPerGroup) FAIL() << "stopping " << group.name();
    }
  }
  std::printf("  %-16s %5s %6s %10s\n", "config", "regs", "local", "max o rel");
  for (const Built& b : built) {
    if (!b.kernel) continue;
    std::printf("  %-16s %5d %6d %10.2e\n", b.config.to_string().c_str(),
                b.kernel->info().regs_per_thread, b.kernel->info().local_bytes_per_thread,
                worst[b.config]);
  }
  std::fflush(stdout);
}

std::vector<Group> all_groups() {
  std::vector<Group> groups;
  for (int head_dim : {64, 128, 256})
    for (DType dtype : {DType::F16, DType::BF16})
      for (bool causal : {false, true}) groups.push_back({head_dim, dtype, causal});
  return groups;
}

INSTANTIATE_TEST_SUITE_P(AllGroups, HipAttentionAllConfigs, ::testing::ValuesIn(all_groups()),
                         [](const ::testing::TestParamInfo<Group>& info) {
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
