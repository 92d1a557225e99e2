// The wgmma backward for packed variable-length documents (the *_varlen entries of
// templates/cuda/attention_bwd_sm90.cuh, document_tile_view in templates/attention_variant.h) run
// on the host through the sm_90a emulator (tests/support/sm90_emulator.hpp; the preprocess and
// the convert on the host per document, as cuda/attention_bwd_common.cuh's *_varlen entries
// compute them) against the fp64 reference gradients per document
// (ft::check_varlen_backward_emulation's cases: documents of 1, 17, ~100 rows, empty ones,
// seqlen_q != seqlen_k both ways, GQA 2:2 and 4:1, causal with a sliding window, poisoned
// gradients and NaN spare rows and keys), in both dQ modes, register (RS) and shared-memory (SS)
// dK/dV. The variant compiled in is support/emulated_varlen.h: causal with a sliding window, or
// (this file built again as templates_cuda_backward_varlen_sm90_plain_emulation_test,
// FLASHJIT_EMULATED_VARLEN_NON_CAUSAL) the documents alone, not causal
// (templates_cuda_backward_varlen_ emulation_test and its plain build check the defines). The
// generator offers this family for varlen as for the other variants.
#include <gtest/gtest.h>

#include "generator/problem.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
// The order matters (as the renderer assembles the source):
// clang-format off
#include "templates/attention_params.h"
// (the emulated primitives before the templates)
#include "support/sm90_emulator.hpp"
#include "support/emulated_varlen.h"
// (tiles before the kernel)
#include "templates/cuda/sm90_tiles.cuh"
// (the kernel last)
#include "templates/cuda/attention_bwd_sm90.cuh"
#include "templates/cuda/attention_bwd_sm90_dq.cuh"
// clang-format on
#include "support/sm90_backward_emulation.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool BF16, bool ATOMIC>
void check() {
  constexpr bool kCausalWindow = FLASHJIT_EMULATED_VARLEN_CAUSAL_WINDOW;
  using K = flashjit_kernel::Sm90BwdTraits<HEAD_DIM, BLOCK_M, BLOCK_N, WARPS, STAGES, BF16,
                                           kCausalWindow, ATOMIC>;
  const AttentionConfig config{BLOCK_M,
                               BLOCK_N,
                               WARPS,
                               STAGES,
                               KernelFamily::Wgmma,
                               ATOMIC ? DqMode::Atomic : DqMode::Separate};
  ft::check_varlen_backward_emulation(
      BF16 ? DType::BF16 : DType::F16, HEAD_DIM, kCausalWindow,
      [&](const AttentionProblem& problem, const ft::HostInputs& inputs, ft::Gradients* out) {
        return ft::run_sm90_backward_gradients<K>(problem, config, inputs, out);
      });
}

TEST(CudaBackwardVarlenSm90Emulation, MatchesTheFp64ReferencePerDocument) {
  // One warpgroup (RS dK/dV), Atomic; two warpgroups sharing 64 keys (SS dK/dV), -det (the dQ
  // kernel); two warpgroups of 64 keys each, a padded head dim.
  check<64, 64, 64, 4, 2, true, true>();
  check<128, 64, 64, 8, 2, false, false>();
  check<96, 64, 128, 8, 2, true, false>();
}

}  // namespace
}  // namespace flashjit
