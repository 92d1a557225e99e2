// The CUDA mma backward for packed variable-length documents (the *_varlen entries of
// templates/cuda/attention_bwd.cuh and cuda/attention_bwd_common.cuh, document_tile_view in
// templates/attention_variant.h) run on the host through the device-primitive emulator
// (tests/support/cuda_emulator.hpp) against the fp64 reference gradients per document
// (ft::check_varlen_backward_emulation's cases: documents of 1, 17, ~100 rows, empty ones,
// seqlen_q != seqlen_k both ways, GQA 2:2 and 4:1, causal with a sliding window, poisoned
// gradients and NaN spare rows and keys), in both dQ modes. The variant compiled in is
// support/emulated_varlen.h: causal with a sliding window, or (this file built again as
// templates_cuda_backward_varlen_plain_emulation_test, FLASHJIT_EMULATED_VARLEN_NON_CAUSAL) the
// documents alone, not causal; the first test checks its defines and that the renderer calls the
// *_varlen entries.
#include <gtest/gtest.h>

#include <string>

#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "generator/variant.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "templates/attention_params.h"
// clang-format off: the order matters (as the renderer assembles the source)
#include "support/cuda_emulator.hpp"
#include "support/emulated_varlen.h"
// (tiles before the kernels)
#include "templates/cuda/tiles.cuh"
// (the kernels last)
#include "templates/cuda/attention_bwd.cuh"
#include "templates/cuda/attention_bwd_common.cuh"
// clang-format on
#include "support/cuda_backward_emulation.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

constexpr bool kCausalWindow = FLASHJIT_EMULATED_VARLEN_CAUSAL_WINDOW;

TEST(CudaBackwardVarlenEmulation, TheRendererCallsTheVarlenEntries) {
  const AttentionProblem p =
      ft::varlen_emulation_problem(DType::BF16, 64, kCausalWindow).with_pass(Pass::Backward);
  const std::string prelude = render_variant_prelude(p).value();
  for (const std::string& line :
       {std::string("#define FLASHJIT_VARIANT_CAUSAL ") + (kCausalWindow ? "1\n" : "0\n"),
        std::string("#define FLASHJIT_VARIANT_WINDOW_LEFT ") +
            (kCausalWindow ? "(30)\n" : "(-1)\n"),
        std::string("#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)\n"),
        std::string("#define FLASHJIT_VARIANT_VARLEN 1\n")})
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
  for (const DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
    const AttentionConfig config{64, 64, 4, 2, KernelFamily::Mma, dq};
    Result<KernelSource> source = render_cuda_attention_backward(p, config);
    ASSERT_TRUE(source.ok()) << source.error().describe();
    for (const char* call :
         {"flashjit_kernel::backward_preprocess_varlen<64, true>(params);",
          "flashjit_kernel::attention_backward_dkdv_varlen<Config>(params);",
          dq == DqMode::Atomic ? "flashjit_kernel::backward_dq_convert_varlen<64, true>(params);"
                               : "flashjit_kernel::attention_backward_dq_varlen<Config>(params);"})
      EXPECT_NE(source->text.find(call), std::string::npos) << call;
  }
}

template <class K>
void check(DType dtype) {
  const AttentionConfig config{K::kBlockM,        K::kBlockN,
                               K::kWarps,         K::kStages,
                               KernelFamily::Mma, K::kDqAtomic ? DqMode::Atomic : DqMode::Separate};
  ft::check_varlen_backward_emulation(
      dtype, K::kHeadDim, kCausalWindow,
      [&](const AttentionProblem& problem, const ft::HostInputs& inputs, ft::Gradients* out) {
        return ft::run_backward<K>(problem, config, inputs, out);
      });
}

TEST(CudaBackwardVarlenEmulation, MatchesTheFp64ReferencePerDocument) {
  // Atomic dQ, 32-row warp blocks; -det with 4 warps, one buffer, block_n 32; a padded head dim.
  constexpr bool kCausal = kCausalWindow;
  check<flashjit_kernel::BwdTraits<64, 64, 64, 4, 2, true, kCausal, true>>(DType::BF16);
  check<flashjit_kernel::BwdTraits<64, 32, 32, 4, 1, false, kCausal, false>>(DType::F16);
  check<flashjit_kernel::BwdTraits<72, 64, 128, 8, 2, true, kCausal, false>>(DType::BF16);
}

}  // namespace
}  // namespace flashjit
