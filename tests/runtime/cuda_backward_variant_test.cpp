// GPU correctness of the CUDA backward with attention variants: every legal backward config (the
// mma family, both dQ modes, and on sm90 the wgmma family too) of d64 fp16 and d128 bf16 for each
// case of tests/support/variant_cases.hpp, over the GPU test shapes (a single row, ragged tails,
// seqlen_q != seqlen_k both ways, rows that see no key, GQA/MQA, padded strides, BHSD), against
// the fp64 reference gradients with poisoned outputs; key blocks hidden from every query set to
// NaN on a long-key shape (a window, and a window with a mask_mod); packed variable-length
// documents (varlen) per document. Skips, with the reason, where there is no CUDA GPU
// (FLASHJIT_EXPECT_GPU=1 makes that a failure).
#include <gtest/gtest.h>

#include <algorithm>
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
#include "support/variant_gpu_checks.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

using Built = std::optional<Result<std::shared_ptr<Kernel>>>;

// A kernel of `config` for `problem` rendered, compiled and loaded by name: the generator need
// not offer it for the problem (the plain problem's wgmma tiles for packed documents).
Built build_by_name(const cuda::CudaBackend& backend, const AttentionProblem& problem,
                    const AttentionConfig& config) {
  Result<KernelSource> source = backend.render(problem, config);
  if (!source.ok()) return Built(source.error());
  Result<Binary> binary = backend.compile(*source);
  if (!binary.ok()) return Built(binary.error());
  return Built(backend.load(*binary, *source, ProblemSignature::of(problem), config));
}

class CudaBackwardVariant : public ::testing::TestWithParam<ft::VariantCase> {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_GPU(); }
};

TEST_P(CudaBackwardVariant, EveryLegalConfigMatchesTheReference) {
  const cuda::CudaBackend& backend = *ft::gpu_backend();
  ft::check_variant_on_every_config(backend, GetParam(), Pass::Backward,
                                    [&](const AttentionProblem& problem) {
                                      return ft::selected_families(backend.legal_configs(problem));
                                    });
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
  ft::check_hidden_key_blocks(backend, Pass::Backward, [&](const AttentionProblem& problem) {
    return ft::selected_families(backend.legal_configs(problem));
  });
}

// Packed variable-length documents (varlen): every legal backward config (the mma family, both
// dQ modes, and on sm90 the wgmma family) and, on sm90, every other wgmma config of the plain
// problem by name, d64 fp16 and d128 bf16, causal or not,
// plain and with a window + softcap, over documents of 1, 17, ~1000 and ~1100 rows, empty ones,
// seqlen_q != seqlen_k both ways per document, GQA, with spare rows past the last document: each
// document's gradients against the fp64 reference of that document alone; dq, dk and dv poisoned
// (every document row written, the spare rows untouched); the spare rows of q, o, dO and the
// spare keys NaN (a tile that reads past its document fails).
TEST(CudaBackwardVarlen, EveryConfigMatchesTheReferencePerDocument) {
  FLASHJIT_REQUIRE_GPU();
  const cuda::CudaBackend& backend = *ft::gpu_backend();
  const std::vector<int64_t> q_lengths = {1, 17, 1000, 0, 5, 1100, 130};
  const std::vector<int64_t> k_lengths = {1, 40, 900, 3, 0, 1097, 300};
  const int64_t spare = 11;
  int64_t total_q = spare, total_k = spare, max_q = 1, max_k = 1;
  for (size_t b = 0; b < q_lengths.size(); ++b) {
    total_q += q_lengths[b];
    total_k += k_lengths[b];
    max_q = std::max(max_q, q_lengths[b]);
    max_k = std::max(max_k, k_lengths[b]);
  }
  const int64_t rows_q = total_q - spare, rows_k = total_k - spare;
  for (auto [head_dim, dtype] : {std::pair{64, DType::F16}, std::pair{128, DType::BF16}})
    for (const bool causal : {false, true})
      for (const bool window : {false, true}) {
        AttentionProblem problem =
            AttentionProblem::make_varlen(static_cast<int64_t>(q_lengths.size()), 4, 2, max_q,
                                          max_k, total_q, total_k, head_dim, dtype, causal)
                .with_pass(Pass::Backward);
        if (window) {
          problem.variant.window_left = 100;
          problem.variant.softcap = 1.5f;
        }
        ft::HostInputs inputs = ft::random_inputs(problem, 5);
        inputs.cu_seqlens_q = cu_seqlens_of(q_lengths);
        inputs.cu_seqlens_k = cu_seqlens_of(k_lengths);
        set_forward_outputs(problem, inputs);
        ft::poison_keys(problem, inputs, rows_k, total_k);
        for (int64_t row = rows_q; row < total_q; ++row)
          for (int64_t h = 0; h < problem.heads_q; ++h)
            for (int col = 0; col < head_dim; ++col) {
              const int64_t at = row * problem.q_strides.seq + h * problem.q_strides.head + col;
              for (std::vector<uint16_t>* tensor : {&inputs.q, &inputs.o, &inputs.d_o})
                ft::set_element(tensor->data(), at, NAN, dtype);
            }
        const ft::Reference reference = ft::reference_attention(problem, inputs);
        Result<ft::DeviceTensors> tensors = ft::upload(backend, problem, inputs);
        ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
        std::vector<AttentionConfig> configs =
            ft::selected_families(backend.legal_configs(problem));
        if (backend.device().arch == 90) {  // the plain problem's wgmma tiles, by name
          for (const AttentionConfig& c : ft::selected_families(backend.legal_configs(
                   AttentionProblem::make(1, 4, 2, max_q, max_k, head_dim, dtype, causal)
                       .with_pass(Pass::Backward))))
            if (c.family == KernelFamily::Wgmma &&
                std::find(configs.begin(), configs.end(), c) == configs.end())
              configs.push_back(c);
        }
        if (configs.empty()) GTEST_SKIP() << "no config of the selected families";
        const std::vector<Built> kernels = ft::parallel_map<Built>(
            configs.size(), [&](size_t i) { return build_by_name(backend, problem, configs[i]); });
        for (size_t i = 0; i < configs.size(); ++i) {
          const std::string where = problem.to_string() + " " + configs[i].to_string();
          ASSERT_TRUE(kernels[i]->ok()) << where << ": " << kernels[i]->error().describe();
          const ft::RunOutput out = ft::run_poisoned(backend, ***kernels[i], problem, *tensors);
          EXPECT_TRUE(ft::run_matches_reference(problem, out, reference)) << where;
          auto untouched = [](const std::vector<uint16_t>& tensor, int64_t from) {
            return std::all_of(tensor.begin() + from, tensor.end(),
                               [](uint16_t bits) { return bits == ft::kPoisonBits; });
          };
          EXPECT_TRUE(untouched(out.dq, rows_q * problem.dq_strides.seq)) << where << ": dq";
          EXPECT_TRUE(untouched(out.dk, rows_k * problem.dk_strides.seq)) << where << ": dk";
          EXPECT_TRUE(untouched(out.dv, rows_k * problem.dv_strides.seq)) << where << ": dv";
        }
      }
}

}  // namespace
}  // namespace flashjit
