// The wgmma forward for packed variable-length documents (attention_forward_sm90_varlen in
// templates/cuda/attention_fwd_sm90.cuh, flashjit_variant::document_view in
// templates/attention_variant.h) run on the host through the sm_90a emulator
// (tests/support/sm90_emulator.hpp: wgmma with the documented operand layouts and late execution,
// cp.async with late copies) against the fp64 reference per document (ft::check_varlen_emulation's
// cases: documents of 1, 17, ~100 rows, empty ones, seqlen_q != seqlen_k both ways, GQA, causal
// with a sliding window, poisoned o and NaN spare keys). The variant compiled in is
// support/emulated_varlen.h (templates_cuda_varlen_emulation_test checks its defines).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "runtime/launch_params.hpp"
#include "support/forward_emulation.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
// The order matters (as the renderer assembles the source):
// clang-format off
#include "templates/attention_params.h"
// (the emulated primitives before the templates)
#include "support/sm90_emulator.hpp"
#include "support/emulated_varlen.h"
#include "templates/cuda/online_softmax.cuh"
// (tiles before the kernel)
#include "templates/cuda/sm90_tiles.cuh"
// (the kernel last)
#include "templates/cuda/attention_fwd_sm90.cuh"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

template <class K>
std::string run_forward(const AttentionProblem& problem, const ft::HostInputs& inputs,
                        std::vector<uint16_t>* o, std::vector<float>* lse) {
  AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), o->data(), lse->data()};
  args.cu_seqlens_q = inputs.cu_seqlens_q.data();
  args.cu_seqlens_k = inputs.cu_seqlens_k.data();
  const FlashjitAttentionParams params = make_launch_params(problem, args);
  const auto grid = ft::forward_grid<ft::Sm90Grid>(problem, K::kBlockM);
  ft::Sm90Options options;
  options.late_wgmma = true;  // P V of the previous block still in flight during the softmax
  return ft::emulate_sm90(
      grid, K::kThreads, K::kSmemBytes,
      [&] { flashjit_kernel::attention_forward_sm90_varlen<K>(params); }, options);
}

TEST(CudaVarlenSm90Emulation, MatchesTheFp64ReferencePerDocument) {
  // Sm90Traits<HEAD_DIM, BLOCK_M, BLOCK_N, WARPS, STAGES, IS_BF16, CAUSAL>: one warpgroup, n64,
  // 2 buffers; two warpgroups, n128, 3 buffers.
  ft::check_varlen_emulation(
      DType::BF16, 64, run_forward<flashjit_kernel::Sm90Traits<64, 64, 64, 4, 2, true, true>>);
  ft::check_varlen_emulation(
      DType::F16, 128, run_forward<flashjit_kernel::Sm90Traits<128, 128, 128, 8, 3, false, true>>);
}

}  // namespace
}  // namespace flashjit
