// GPU checks of the block maps of a mask_mod (issue 31): the generated builder on the device
// against a host evaluation of the mask on every element (masks that empty whole rows and whole
// tiles, hide nothing, hide everything, differ per head; sizes 1, 17, 1000, 4096), and the kernels
// that read a map against the fp64 reference with those masks: the map each kernel builds and
// caches itself (a second call reusing it) and a caller's map (Backend::build_block_mask) passed
// as AttentionArgs::block_mask, refused when built at another tile; forward and backward, one
// config per family that reads a map (its default where the backend's default is of it;
// $FLASHJIT_TEST_FAMILIES selects families, as in the other variant tests). Skips, with
// the reason, where there is no CUDA GPU (FLASHJIT_EXPECT_GPU=1 makes that a failure).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "generator/block_mask.hpp"
#include "generator/config.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/runtime.hpp"
#include "support/attention_cases.hpp"
#include "support/block_mask_cases.hpp"
#include "support/device_run.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

AttentionProblem mask_problem(int mask_case, const ft::Shape& shape, int head_dim, DType dtype,
                              bool causal, Pass pass = Pass::Forward) {
  AttentionProblem p = ft::make_problem(shape, head_dim, dtype, causal, pass);
  p.variant.mask_mod = ft::block_mask_case_expression(mask_case);
  return p;
}

VariantFunctions mask_functions(int mask_case) {
  VariantFunctions functions;
  functions.mask_mod = [mask_case](int64_t b, int64_t h, int64_t i, int64_t j) {
    return ft::block_mask_case_mask(mask_case, b, h, i, j);
  };
  return functions;
}

class CudaBlockMask : public ::testing::Test {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_GPU(); }
};

TEST_F(CudaBlockMask, TheBuilderMatchesTheHostEvaluation) {
  const cuda::CudaBackend& backend = *ft::gpu_backend();
  struct Size {
    int64_t q, k;
  };
  for (int mask_case = 0; mask_case < ft::kMaskCases; ++mask_case)
    for (bool causal : {false, true})
      for (Size size :
           {Size{1, 1}, Size{17, 1000}, Size{1000, 17}, Size{1000, 1000}, Size{4096, 4096}})
        for (auto [block_m, block_n] :
             {std::pair{128, 64}, std::pair{64, 128}, std::pair{16, 48}}) {
          const AttentionProblem problem =
              mask_problem(mask_case, ft::Shape{2, 3, 3, size.q, size.k}, 128, DType::BF16, causal);
          Result<BlockMask> built = backend.build_block_mask(problem, block_m, block_n);
          ASSERT_TRUE(built.ok()) << built.error().describe();
          SCOPED_TRACE(std::string(ft::block_mask_case_name(mask_case)) +
                       (causal ? " causal " : " ") + built->shape.to_string());
          EXPECT_EQ(built->shape.per_head, mask_case == ft::kPerHead);
          EXPECT_GE(built->build_ms, 0.0);
          ft::HostBlockMask host = ft::host_block_mask(built->shape);
          ASSERT_TRUE(
              backend.copy_to_host(host.storage.data(), built->buffer.get(), built->shape.bytes())
                  .ok());
          const int64_t diagonal = size.k - size.q;
          EXPECT_EQ(ft::compare_block_mask(
                        host, ft::expected_states(built->shape,
                                                  [&](int64_t b, int64_t h, int64_t i, int64_t j) {
                                                    return (!causal || j <= i + diagonal) &&
                                                           ft::block_mask_case_mask(mask_case, b, h,
                                                                                    i, j);
                                                  })),
                    "");
        }
}

// The configs of `problem` that read a map: per family, the backend's default when of that
// family, else the family's first legal config ($FLASHJIT_TEST_FAMILIES selects families).
std::vector<AttentionConfig> configs_reading_a_map(const cuda::CudaBackend& backend,
                                                   const AttentionProblem& problem) {
  const Result<AttentionConfig> chosen = backend.default_config(problem);
  std::vector<AttentionConfig> picked;
  for (const AttentionConfig& c : ft::selected_families(backend.legal_configs(problem))) {
    if (!block_mask_applies(problem, c)) continue;
    const bool is_default = chosen.ok() && chosen->to_string() == c.to_string();
    auto same_family = [&](const AttentionConfig& p) { return p.family == c.family; };
    auto found = std::find_if(picked.begin(), picked.end(), same_family);
    if (found == picked.end())
      picked.push_back(c);
    else if (is_default)
      *found = c;
  }
  return picked;
}

// For each mask case, forward and backward, on shapes with ragged tails, GQA and
// seqlen_q != seqlen_k, against the fp64 reference: the kernel's own map (twice: the second call
// reuses it) and a caller's; a caller's map of another tile is refused.
TEST_F(CudaBlockMask, KernelsReadingTheMapMatchTheReference) {
  const cuda::CudaBackend& backend = *ft::gpu_backend();
  int checked = 0;
  for (Pass pass : {Pass::Forward, Pass::Backward})
    for (int mask_case = 0; mask_case < ft::kMaskCases; ++mask_case)
      for (const ft::Shape& shape : {ft::Shape{2, 4, 2, 1000, 1000}, ft::Shape{1, 2, 1, 333, 1500},
                                     ft::Shape{1, 2, 2, 1, 17}}) {
        const AttentionProblem problem =
            mask_problem(mask_case, shape, 128, DType::BF16, true, pass);
        const VariantFunctions functions = mask_functions(mask_case);
        const HostInputs inputs = ft::random_inputs(problem, 7 + mask_case, functions);
        const Reference reference = reference_attention(problem, inputs, functions);
        Result<DeviceTensors> tensors = ft::upload(backend, problem, inputs);
        ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
        for (const AttentionConfig& config : configs_reading_a_map(backend, problem)) {
          SCOPED_TRACE(std::string(ft::block_mask_case_name(mask_case)) + " " + shape.to_string() +
                       " " + to_string(pass) + " " + config.to_string());
          Result<std::shared_ptr<Kernel>> kernel = build_kernel(backend, nullptr, problem, config);
          ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
          ASSERT_EQ((*kernel)->block_mask_tile(), std::make_pair(config.block_m, config.block_n));
          for (int call = 0; call < 2; ++call)
            EXPECT_TRUE(ft::run_matches_reference(
                problem, ft::run_poisoned(backend, **kernel, problem, *tensors), reference))
                << "call " << call;
          Result<double> ms = (*kernel)->block_mask_build_ms(problem);
          ASSERT_TRUE(ms.ok()) << ms.error().describe();
          Result<BlockMask> mine =
              backend.build_block_mask(problem, config.block_m, config.block_n);
          ASSERT_TRUE(mine.ok()) << mine.error().describe();
          AttentionArgs args = tensors->args;
          args.block_mask = &mine->map;
          EXPECT_TRUE(ft::run_matches_reference(
              problem, ft::run_poisoned(backend, **kernel, problem, *tensors, args), reference));
          Result<BlockMask> other =
              backend.build_block_mask(problem, config.block_m, config.block_n * 2);
          ASSERT_TRUE(other.ok());
          args.block_mask = &other->map;
          const ft::RunOutput refused =
              ft::run_poisoned(backend, **kernel, problem, *tensors, args);
          ASSERT_FALSE(refused.status.ok());
          EXPECT_NE(refused.status.error().message.find("block_mask of"), std::string::npos)
              << refused.status.error().message;
          ++checked;
        }
      }
  EXPECT_GT(checked, 0) << "no selected config reads a block map";
}

TEST_F(CudaBlockMask, BuildingWithoutAMaskModIsAnError) {
  const cuda::CudaBackend& backend = *ft::gpu_backend();
  AttentionProblem plain = AttentionProblem::make(1, 1, 1, 64, 64, 64, DType::BF16, true);
  Result<BlockMask> built = backend.build_block_mask(plain, 128, 64);
  ASSERT_FALSE(built.ok());
  EXPECT_NE(built.error().message.find("mask_mod"), std::string::npos);
  AttentionProblem masked = plain;
  masked.variant.mask_mod = "q_idx >= kv_idx";
  built = backend.build_block_mask(masked, 0, 64);
  ASSERT_FALSE(built.ok());
  EXPECT_NE(built.error().message.find("block_m = 0"), std::string::npos);
}

}  // namespace
}  // namespace flashjit
