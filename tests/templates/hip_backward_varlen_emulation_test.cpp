// The HIP backward for packed variable-length documents (templates/hip/attention_bwd.hpp: the
// *_variant dK/dV and dQ entries, the *_varlen row entries, document_tile_view in
// templates/attention_variant.h) run on the host through the emulation of its AMD primitives
// (tests/support/hip_emulator.hpp) against the fp64 reference gradients per document
// (ft::check_varlen_backward_emulation's cases: documents of 1, 17, ~100 rows, empty ones,
// seqlen_q != seqlen_k both ways, GQA 2:2 and 4:1, causal with a sliding window, poisoned
// gradients and NaN spare rows and keys), in both dQ modes, as
// tests/templates/cuda_backward_varlen_emulation_test.cpp does for the CUDA mma backward. The
// variant compiled in is support/emulated_varlen.h: causal with a sliding window, or (this file
// built again as templates_hip_backward_varlen_plain_emulation_test,
// FLASHJIT_EMULATED_VARLEN_NON_CAUSAL) the documents alone, not causal; the first test checks its
// defines and that the renderer calls the document entries.
#include <gtest/gtest.h>

#include <string>

#include "generator/device.hpp"
#include "generator/hip_config.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "generator/variant.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "templates/attention_params.h"
// clang-format off: the order matters (as the renderer assembles the source)
#include "support/emulated_varlen.h"
#include "support/hip_emulator.hpp"
#include "templates/hip/tiles.hpp"
// (the kernels last, in the renderer's order: the row kernels)
#include "templates/hip/attention_bwd_common.hpp"
// (the dK/dV and dQ kernels)
#include "templates/hip/attention_bwd.hpp"
// clang-format on
#include "support/hip_backward_emulation.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

constexpr bool kCausalWindow = FLASHJIT_EMULATED_VARLEN_CAUSAL_WINDOW;

TEST(HipBackwardVarlenEmulation, TheRendererCallsTheDocumentEntries) {
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
    AttentionConfig config{32, 64, 4, 1};
    config.dq = dq;
    AttentionProblem problem = p;
    problem.deterministic = dq == DqMode::Separate;
    const Status legal = check_hip_config(config, problem, known_device("gfx90a").value());
    EXPECT_TRUE(legal.ok()) << legal.error().describe();
    Result<KernelSource> source = render_hip_attention(problem, config);
    ASSERT_TRUE(source.ok()) << source.error().describe();
    EXPECT_NE(source->text.find(prelude), std::string::npos);
    for (const char* call :
         {"flashjit_hip::backward_preprocess_varlen<64, true>(params);",
          "flashjit_hip::attention_backward_dkdv_variant<Config>(params);",
          dq == DqMode::Atomic ? "flashjit_hip::backward_dq_convert_varlen<64, true>(params);"
                               : "flashjit_hip::attention_backward_dq_variant<Config>(params);"})
      EXPECT_NE(source->text.find(call), std::string::npos) << call;
  }
}

template <class K>
void check(DType dtype) {
  AttentionConfig config{K::kBlockM, K::kBlockN, K::kWaves, K::kStages};
  config.dq = K::kDqAtomic ? DqMode::Atomic : DqMode::Separate;
  ft::check_varlen_backward_emulation(
      dtype, K::kHeadDim, kCausalWindow,
      [&](const AttentionProblem& problem, const ft::HostInputs& inputs, ft::Gradients* out) {
        return ft::run_hip_backward<K>(problem, config, inputs, out);
      });
}

TEST(HipBackwardVarlenEmulation, MatchesTheFp64ReferencePerDocument) {
  // Atomic dQ, 2 buffers, 16 keys per wave; -det, 32 keys per wave, a padded head dim (72 -> 128);
  // -det with 8 waves and 64-row query blocks.
  constexpr bool kCausal = kCausalWindow;
  check<flashjit_hip::BwdTraits<64, 32, 64, 4, 2, true, kCausal, true>>(DType::BF16);
  check<flashjit_hip::BwdTraits<72, 32, 64, 2, 1, false, kCausal, false>>(DType::F16);
  check<flashjit_hip::BwdTraits<64, 64, 128, 8, 1, true, kCausal, false>>(DType::BF16);
}

}  // namespace
}  // namespace flashjit
