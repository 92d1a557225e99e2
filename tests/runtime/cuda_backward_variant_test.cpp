// GPU correctness of the CUDA backward with attention variants: every legal backward config (the
// mma family, both dQ modes, and on sm90 the wgmma family too) of d64 fp16 and d128 bf16 for each
// case of tests/support/variant_cases.hpp, over the GPU test shapes (a single row, ragged tails,
// seqlen_q != seqlen_k both ways, rows that see no key, GQA/MQA, padded strides, BHSD), against
// the fp64 reference gradients with poisoned outputs; key blocks hidden from every query set to
// NaN on a long-key shape (a window, and a window with a mask_mod). Skips, with the reason, where
// there is no CUDA GPU (FLASHJIT_EXPECT_GPU=1 makes that a failure).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "runtime/runtime.hpp"
#include "support/attention_cases.hpp"
#include "support/device_run.hpp"
#include "support/gpu.hpp"
#include "support/parallel.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

::testing::AssertionResult matches(const AttentionProblem& problem, const ft::RunOutput& out,
                                   const ft::Reference& reference) {
  if (!out.status.ok()) return ::testing::AssertionFailure() << out.status.error().describe();
  const GradientComparison comparison =
      compare_gradients(problem, out.dq, out.dk, out.dv, reference);
  if (within_tolerance(comparison, gradient_tolerance(problem.dtype)))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << comparison.to_string();
}

class CudaBackwardVariant : public ::testing::TestWithParam<ft::VariantCase> {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_GPU(); }
};

TEST_P(CudaBackwardVariant, EveryLegalConfigMatchesTheReference) {
  const ft::VariantCase& c = GetParam();
  const cuda::CudaBackend& backend = *ft::gpu_backend();
  for (auto [head_dim, dtype] : {std::pair{64, DType::F16}, std::pair{128, DType::BF16}}) {
    AttentionProblem probe =
        ft::make_problem(ft::gpu_test_shapes()[0], head_dim, dtype, c.causal, Pass::Backward);
    probe.variant = c.variant;
    const std::vector<AttentionConfig> configs =
        ft::selected_families(backend.legal_configs(probe));
    if (configs.empty()) GTEST_SKIP() << "no config of the selected families";
    using Built = std::optional<Result<std::shared_ptr<Kernel>>>;
    const std::vector<Built> kernels = ft::parallel_map<Built>(configs.size(), [&](size_t i) {
      return Built(build_kernel(backend, nullptr, probe, configs[i]));
    });
    uint64_t seed = 1;
    for (const ft::Shape& shape : ft::gpu_test_shapes()) {
      AttentionProblem problem = ft::make_problem(shape, head_dim, dtype, c.causal, Pass::Backward);
      problem.variant = c.variant;
      const ft::HostInputs inputs = ft::random_inputs(problem, seed++, c.functions);
      const ft::Reference reference = ft::reference_attention(problem, inputs, c.functions);
      Result<ft::DeviceTensors> tensors = ft::upload(backend, problem, inputs);
      ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
      for (size_t i = 0; i < configs.size(); ++i) {
        const std::string where = std::string(c.name) + " d" + std::to_string(head_dim) + " " +
                                  to_string(dtype) + " " + configs[i].to_string() + " " +
                                  shape.to_string();
        ASSERT_TRUE(kernels[i]->ok()) << where << ": " << kernels[i]->error().describe();
        EXPECT_TRUE(matches(problem, ft::run_poisoned(backend, ***kernels[i], problem, *tensors),
                            reference))
            << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaBackwardVariant, ::testing::ValuesIn(ft::variant_cases()),
                         [](const ::testing::TestParamInfo<ft::VariantCase>& info) {
                           return std::string(info.param.name);
                         });

// Key blocks a causal window hides from every query are never used by either kernel: seqlen_q
// 64, seqlen_k 4096 (diagonal 4032), window 32: no query sees a key below 4000, so keys
// [0, 3840) (whole blocks of every block_n) are NaN; dK and dV there must be 0 and dQ finite. The
// same with a user mask_mod and the window.
TEST(CudaBackwardVariantBlocks, HiddenKeyBlocksAreNeverUsed) {
  FLASHJIT_REQUIRE_GPU();
  const cuda::CudaBackend& backend = *ft::gpu_backend();
  for (const bool mask_mod : {false, true}) {
    SCOPED_TRACE(mask_mod ? "window + mask_mod" : "window");
    AttentionProblem problem =
        AttentionProblem::make(2, 4, 2, 64, 4096, 128, DType::BF16, true).with_pass(Pass::Backward);
    problem.variant.window_left = 32;
    problem.variant.window_right = 0;
    VariantFunctions functions;
    if (mask_mod) {
      problem.variant.mask_mod = "(q_idx + kv_idx) % 3 != 0";
      functions.mask_mod = [](int64_t, int64_t, int64_t i, int64_t j) { return (i + j) % 3 != 0; };
    }
    ft::HostInputs inputs = ft::random_inputs(problem, 3, functions);
    for (int64_t b = 0; b < problem.batch; ++b)
      for (int64_t j = 0; j < 3840; ++j)
        for (int64_t h = 0; h < problem.heads_kv; ++h)
          for (int col = 0; col < problem.head_dim; ++col) {
            const int64_t at = b * problem.k_strides.batch + j * problem.k_strides.seq +
                               h * problem.k_strides.head + col;
            ft::set_element(inputs.k.data(), at, NAN, problem.dtype);
            ft::set_element(inputs.v.data(), at, NAN, problem.dtype);
          }
    const ft::Reference reference = ft::reference_attention(problem, inputs, functions);
    Result<ft::DeviceTensors> tensors = ft::upload(backend, problem, inputs);
    ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
    for (const AttentionConfig& config : ft::selected_families(backend.legal_configs(problem))) {
      Result<std::shared_ptr<Kernel>> kernel = build_kernel(backend, nullptr, problem, config);
      ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
      EXPECT_TRUE(
          matches(problem, ft::run_poisoned(backend, **kernel, problem, *tensors), reference))
          << config.to_string();
    }
  }
}

}  // namespace
}  // namespace flashjit
