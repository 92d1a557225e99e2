// The HIP forward for packed variable-length documents (attention_forward_variant in
// templates/hip/attention_fwd.hpp, flashjit_variant::document_view in
// templates/attention_variant.h) run on the host through the emulation of its AMD primitives
// (tests/support/hip_emulator.hpp) against the fp64 reference per document
// (ft::check_varlen_emulation's cases: documents of 1, 17, ~100 rows, empty ones, seqlen_q !=
// seqlen_k both ways, GQA, causal with a sliding window, poisoned o and spare keys), as
// tests/templates/cuda_varlen_emulation_test.cpp does for the CUDA mma forward. The variant is
// compiled in (support/emulated_varlen.h: what the generator renders, which the first test checks).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "generator/device.hpp"
#include "generator/hip_config.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "generator/variant.hpp"
#include "runtime/launch_params.hpp"
#include "support/forward_emulation.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "templates/attention_params.h"
// clang-format off: the order matters (as the renderer assembles the source)
#include "support/emulated_varlen.h"
#include "support/hip_emulator.hpp"
#include "templates/hip/tiles.hpp"
// (the kernel last)
#include "templates/hip/attention_fwd.hpp"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

TEST(HipVarlenEmulation, TheDefinesAreWhatTheGeneratorRenders) {
  const AttentionProblem p = ft::varlen_emulation_problem(DType::BF16, 64);
  const std::string prelude = render_variant_prelude(p).value();
  for (const char* line :
       {"#define FLASHJIT_VARIANT_CAUSAL 1\n", "#define FLASHJIT_VARIANT_WINDOW_LEFT (30)\n",
        "#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)\n", "#define FLASHJIT_VARIANT_PREFIX 0\n",
        "#define FLASHJIT_VARIANT_ALIBI 0\n", "#define FLASHJIT_VARIANT_SCORE_MOD 0\n",
        "#define FLASHJIT_VARIANT_MASK_MOD 0\n", "#define FLASHJIT_VARIANT_VARLEN 1\n"})
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
  EXPECT_EQ(prelude.find("\n#define FLASHJIT_VARIANT_SOFTCAP"), std::string::npos);
  // The generator offers HIP configs for it, whose source enters through the variant's entry.
  const AttentionConfig config = default_hip_config(p, known_device("gfx90a").value()).value();
  const std::string source = render_hip_attention(p, config).value().text;
  EXPECT_NE(source.find(prelude), std::string::npos);
  EXPECT_NE(source.find("flashjit_hip::attention_forward_variant<Config>(params);"),
            std::string::npos);
}

template <class K>
std::string run_forward(const AttentionProblem& problem, const ft::HostInputs& inputs,
                        std::vector<uint16_t>* o, std::vector<float>* lse) {
  AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), o->data(), lse->data()};
  args.cu_seqlens_q = inputs.cu_seqlens_q.data();
  args.cu_seqlens_k = inputs.cu_seqlens_k.data();
  const FlashjitAttentionParams params = make_launch_params(problem, args);
  const auto grid = ft::forward_grid<ft::HipGrid>(problem, K::kBlockM);
  return ft::emulate_hip(grid, K::kThreads, K::kLdsBytes,
                         [&] { flashjit_hip::attention_forward_variant<K>(params); });
}

TEST(HipVarlenEmulation, MatchesTheFp64ReferencePerDocument) {
  ft::check_varlen_emulation(DType::BF16, 64,
                             run_forward<flashjit_hip::Traits<64, 64, 32, 2, 2, true, true>>);
  ft::check_varlen_emulation(DType::F16, 128,
                             run_forward<flashjit_hip::Traits<128, 128, 64, 4, 1, false, true>>);
}

}  // namespace
}  // namespace flashjit
