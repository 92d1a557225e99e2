// GPU correctness of the CUDA forward with attention variants (the mma family everywhere, the
// wgmma and -ws families on sm90): every legal config of d64 fp16 and d128 bf16 for each case of
// tests/support/variant_cases.hpp (of the -ws family: each tile in its plain schedule, and the
// default tile in all four), over the GPU test shapes (a single row, ragged tails,
// seqlen_q != seqlen_k both ways, GQA/MQA, padded strides, BHSD), against the fp64 reference with
// poisoned outputs; hidden key blocks set to NaN on a long-key shape (a window, and a window with
// a mask_mod); packed variable-length documents on the mma family. $FLASHJIT_TEST_FAMILIES ("mma",
// "wgmma", "ws") restricts the configs. Skips, with the reason, where there is no CUDA GPU
// (FLASHJIT_EXPECT_GPU=1 makes that a failure).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "runtime/runtime.hpp"
#include "support/attention_cases.hpp"
#include "support/device_run.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "support/variant_gpu_checks.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

constexpr double kMaxOutputRelError = 1e-2;
constexpr double kMaxLseAbsError = 1e-3;

// The configs to run for `problem`: the legal ones of the selected families, the -ws family's
// schedules (-pp, -persist: the same tile code, walked differently; the -ws emulation test runs
// them all with variants) only at the default tile.
std::vector<AttentionConfig> configs_to_run(const cuda::CudaBackend& backend,
                                            const AttentionProblem& problem) {
  const Result<AttentionConfig> chosen = backend.default_config(problem);
  std::vector<AttentionConfig> configs = ft::selected_families(backend.legal_configs(problem));
  std::erase_if(configs, [&](const AttentionConfig& c) {
    const bool same_tile = chosen.ok() && chosen->family == c.family &&
                           chosen->block_m == c.block_m && chosen->block_n == c.block_n &&
                           chosen->stages == c.stages;
    return c.family == KernelFamily::Ws && (c.pingpong || c.persistent) && !same_tile;
  });
  return configs;
}

class CudaVariant : public ::testing::TestWithParam<ft::VariantCase> {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_GPU(); }
};

TEST_P(CudaVariant, EveryLegalConfigMatchesTheReference) {
  const cuda::CudaBackend& backend = *ft::gpu_backend();
  ft::check_variant_on_every_config(
      backend, GetParam(), Pass::Forward,
      [&](const AttentionProblem& problem) { return configs_to_run(backend, problem); });
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaVariant, ::testing::ValuesIn(ft::variant_cases()),
                         [](const ::testing::TestParamInfo<ft::VariantCase>& info) {
                           return std::string(info.param.name);
                         });

// Key blocks a causal window hides from every query are never loaded (check_hidden_key_blocks;
// a mask_mod only hides more: the window's blocks are still all that is visited).
TEST(CudaVariantBlocks, HiddenKeyBlocksAreNeverLoaded) {
  FLASHJIT_REQUIRE_GPU();
  const cuda::CudaBackend& backend = *ft::gpu_backend();
  ft::check_hidden_key_blocks(backend, Pass::Forward, [&](const AttentionProblem& problem) {
    return configs_to_run(backend, problem);
  });
}

// Packed variable-length documents (varlen; the mma and, on sm90, the wgmma and -ws families):
// every legal config of d64 fp16 and d128 bf16 (-ws: each tile, and -pp / -persist of the
// default's, configs_to_run), causal or not, plain and with a window + softcap, over documents of
// 1, 17, ~1000 and ~4100 rows, empty ones, seqlen_q != seqlen_k both ways per document, GQA, with
// spare rows past the last document (poisoned o: each document row written, the spare rows
// untouched; the spare keys NaN: a tile whose loads reach past its document (mma, wgmma) or whose
// TMA boxes do (-ws: its masks and zeroed V rows keep them out) fails).
TEST(CudaVarlen, EveryLegalConfigMatchesTheReferencePerDocument) {
  FLASHJIT_REQUIRE_GPU();
  const cuda::CudaBackend& backend = *ft::gpu_backend();
  const std::vector<int64_t> q_lengths = {1, 17, 1000, 0, 5, 4100, 130};
  const std::vector<int64_t> k_lengths = {1, 40, 900, 3, 0, 4097, 300};
  const int64_t spare = 11;
  int64_t total_q = spare, total_k = spare, max_q = 1, max_k = 1;
  for (size_t b = 0; b < q_lengths.size(); ++b) {
    total_q += q_lengths[b];
    total_k += k_lengths[b];
    max_q = std::max(max_q, q_lengths[b]);
    max_k = std::max(max_k, k_lengths[b]);
  }
  Variant windowed;
  windowed.window_left = 100;
  windowed.softcap = 1.5f;
  for (auto [head_dim, dtype] : {std::pair{64, DType::F16}, std::pair{128, DType::BF16}})
    for (const bool causal : {false, true})
      for (const bool window : {false, true}) {
        AttentionProblem problem =
            AttentionProblem::make_varlen(static_cast<int64_t>(q_lengths.size()), 4, 2, max_q,
                                          max_k, total_q, total_k, head_dim, dtype, causal);
        if (window) {
          windowed.varlen = true;
          windowed.total_q = total_q;
          windowed.total_k = total_k;
          problem.variant = windowed;
        }
        ft::HostInputs inputs = ft::random_inputs(problem, 5);
        inputs.cu_seqlens_q = cu_seqlens_of(q_lengths);
        inputs.cu_seqlens_k = cu_seqlens_of(k_lengths);
        ft::poison_keys(problem, inputs, total_k - spare, total_k);
        const ft::Reference reference = ft::reference_attention(problem, inputs);
        Result<ft::DeviceTensors> tensors = ft::upload(backend, problem, inputs);
        ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
        const std::vector<AttentionConfig> configs = configs_to_run(backend, problem);
        ASSERT_FALSE(configs.empty());
        // NVRTC compiles dominate (tens of configs per problem): all of them on every core first.
        const std::vector<ft::BuiltKernel> kernels =
            ft::build_all(backend, nullptr, problem, configs);
        for (const ft::BuiltKernel& built : kernels) {
          const std::string where = problem.to_string() + " " + built.config.to_string();
          ASSERT_TRUE(built.kernel) << where << ": " << built.error;
          const ft::RunOutput out = ft::run_poisoned(backend, *built.kernel, problem, *tensors);
          ASSERT_TRUE(out.status.ok()) << where << ": " << out.status.error().describe();
          EXPECT_TRUE(ft::matches_reference(ft::compare(problem, out.o, out.lse, reference),
                                            kMaxOutputRelError, kMaxLseAbsError))
              << where;
        }
      }
}

}  // namespace
}  // namespace flashjit
