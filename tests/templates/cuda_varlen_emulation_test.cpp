// The CUDA mma forward for packed variable-length documents (attention_forward_varlen in
// templates/cuda/attention_fwd.cuh, flashjit_variant::document_view in
// templates/attention_variant.h) run on the host through the device-primitive emulator
// (tests/support/cuda_emulator.hpp) against the fp64 reference per document
// (ft::check_varlen_emulation's cases: documents of 1, 17, ~100 rows, empty ones, seqlen_q !=
// seqlen_k both ways, GQA, causal with a sliding window, poisoned o and spare keys). The variant is
// compiled in (one per translation unit): the defines below are what the generator renders,
// which the first test checks.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "generator/variant.hpp"
#include "runtime/launch_params.hpp"
#include "support/forward_emulation.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "templates/attention_params.h"
// clang-format off: the order matters (as the renderer assembles the source)
#include "support/cuda_emulator.hpp"
#include "support/emulated_varlen.h"
#include "templates/cuda/online_softmax.cuh"
// (tiles before the kernel)
#include "templates/cuda/tiles.cuh"
#include "templates/cuda/warp_mma.cuh"
// (the kernel last)
#include "templates/cuda/attention_fwd.cuh"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

TEST(CudaVarlenEmulation, TheDefinesAreWhatTheGeneratorRenders) {
  const AttentionProblem p = ft::varlen_emulation_problem(DType::BF16, 64);
  const std::string prelude = render_variant_prelude(p).value();
  for (const char* line :
       {"#define FLASHJIT_VARIANT_CAUSAL 1\n", "#define FLASHJIT_VARIANT_WINDOW_LEFT (30)\n",
        "#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)\n", "#define FLASHJIT_VARIANT_PREFIX 0\n",
        "#define FLASHJIT_VARIANT_ALIBI 0\n", "#define FLASHJIT_VARIANT_SCORE_MOD 0\n",
        "#define FLASHJIT_VARIANT_MASK_MOD 0\n", "#define FLASHJIT_VARIANT_VARLEN 1\n"})
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
  EXPECT_EQ(prelude.find("\n#define FLASHJIT_VARIANT_SOFTCAP"), std::string::npos);
}

template <class K>
std::string run_forward(const AttentionProblem& problem, const ft::HostInputs& inputs,
                        std::vector<uint16_t>* o, std::vector<float>* lse) {
  AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), o->data(), lse->data()};
  args.cu_seqlens_q = inputs.cu_seqlens_q.data();
  args.cu_seqlens_k = inputs.cu_seqlens_k.data();
  const FlashjitAttentionParams params = make_launch_params(problem, args);
  ft::clear_globals();
  for (const std::vector<uint16_t>* tensor : {&inputs.q, &inputs.k, &inputs.v})
    ft::register_global(tensor->data(), tensor->size() * sizeof(uint16_t));
  const auto grid = ft::forward_grid<ft::CudaGrid>(problem, K::kBlockM);
  return ft::emulate_cuda(grid, K::kThreads, K::kSmemElements * 2,
                          [&] { flashjit_kernel::attention_forward_varlen<K>(params); });
}

TEST(CudaVarlenEmulation, MatchesTheFp64ReferencePerDocument) {
  ft::check_varlen_emulation(DType::BF16, 64,
                             run_forward<flashjit_kernel::Traits<64, 64, 32, 4, 2, true, true>>);
  ft::check_varlen_emulation(DType::F16, 128,
                             run_forward<flashjit_kernel::Traits<128, 128, 64, 4, 3, false, true>>);
}

}  // namespace
}  // namespace flashjit
