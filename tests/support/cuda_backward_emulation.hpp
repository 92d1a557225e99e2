// The CUDA mma backward's launch sequence on the host emulator (tests/support/cuda_emulator.hpp),
// shared by the emulation tests of the plain templates and of the variants: include it after
// the templates (cuda/attention_bwd.cuh, cuda/attention_bwd_common.cuh), which it calls.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "generator/backward_config.hpp"
#include "generator/render.hpp"
#include "runtime/launch_params.hpp"
#include "support/cuda_emulator.hpp"
#include "support/emulated_entry.hpp"
#include "support/forward_emulation.hpp"  // kGuardElements
#include "support/reference.hpp"
#include "support/variant_cases.hpp"  // Gradients

// A translation unit that compiles in a mask_mod's block map (FLASHJIT_VARIANT_BLOCK_MASK 1) passes
// run_backward's map on to the dK/dV and dQ kernels, as the entries do.
#if defined(FLASHJIT_VARIANT_BLOCK_MASK) && FLASHJIT_VARIANT_BLOCK_MASK
#define FLASHJIT_EMULATED_BLOCK_MASK , block_mask
#else
#define FLASHJIT_EMULATED_BLOCK_MASK
#endif

namespace flashjit::testing {

// The inputs every emulated kernel may read (ALiBi's slopes too), registered with the emulator.
inline void register_inputs(const HostInputs& inputs) {
  clear_globals();
  for (const std::vector<uint16_t>* tensor :
       {&inputs.q, &inputs.k, &inputs.v, &inputs.o, &inputs.d_o})
    if (!tensor->empty()) register_global(tensor->data(), tensor->size() * sizeof(uint16_t));
  if (!inputs.alibi_slopes.empty())
    register_global(inputs.alibi_slopes.data(), inputs.alibi_slopes.size() * sizeof(float));
}

// The backward's launch sequence (render.hpp's contract, as runtime/cuda/cuda_backend.cpp
// launches it): preprocess, dK/dV, then the convert or the dQ kernel, over one workspace.
// Packed documents: the offsets from inputs.cu_seqlens_q / _k. `block_mask`: the map the kernels
// read where the translation unit compiles one in (FLASHJIT_EMULATED_BLOCK_MASK).
template <class K>
std::string run_backward(const AttentionProblem& problem, const AttentionConfig& config,
                         const HostInputs& inputs, Gradients* out,
                         const FlashjitBlockMask* block_mask = nullptr) {
  (void)block_mask;
  const BackwardWorkspace layout = backward_workspace(problem, config);
  std::vector<float> workspace(layout.bytes / sizeof(float) + 64,
                               std::numeric_limits<float>::quiet_NaN());
  std::vector<float> lse = inputs.lse;
  std::vector<uint16_t> dq(problem.dq_span() + kGuardElements, kPoisonBits);
  std::vector<uint16_t> dk(problem.dkv_span() + kGuardElements, kPoisonBits);
  std::vector<uint16_t> dv(problem.dkv_span() + kGuardElements, kPoisonBits);
  AttentionArgs args;
  args.q = inputs.q.data();
  args.k = inputs.k.data();
  args.v = inputs.v.data();
  args.o = const_cast<uint16_t*>(inputs.o.data());
  args.lse = lse.data();
  args.d_o = inputs.d_o.data();
  args.dq = dq.data();
  args.dk = dk.data();
  args.dv = dv.data();
  args.alibi_slopes = inputs.alibi_slopes.empty() ? nullptr : inputs.alibi_slopes.data();
  args.cu_seqlens_q = inputs.cu_seqlens_q.data();
  args.cu_seqlens_k = inputs.cu_seqlens_k.data();
  FlashjitAttentionParams params = make_launch_params(problem, args);
  // A 256-byte aligned start within the vector, as the runtime's allocations are.
  auto* base = reinterpret_cast<unsigned char*>(workspace.data());
  base += (256 - reinterpret_cast<uintptr_t>(base) % 256) % 256;
  bind_workspace(params, layout, base);
  register_inputs(inputs);
  register_global(base, layout.bytes);

  const int batch = static_cast<int>(problem.batch), heads_q = static_cast<int>(problem.heads_q);
  const CudaGrid rows{
      static_cast<int>(round_to_row_blocks(problem.seqlen_q) / kBackwardPreprocessRows), heads_q,
      batch};
  const bool bf16 = K::kIsBf16;
  constexpr int kD = K::kHeadDim;
  std::string error = emulate_cuda(rows, kBackwardPreprocessThreads, 16, [&] {
    if (bf16)
      flashjit_kernel::FLASHJIT_EMULATED_ENTRY(backward_preprocess)<kD, true>(params);
    else
      flashjit_kernel::FLASHJIT_EMULATED_ENTRY(backward_preprocess)<kD, false>(params);
  });
  if (!error.empty()) return "preprocess: " + error;
  const CudaGrid dkdv{static_cast<int>((problem.seqlen_k + K::kBlockN - 1) / K::kBlockN),
                      static_cast<int>(problem.heads_kv), batch};
  error = emulate_cuda(dkdv, K::kThreads, K::kSmemBytes, [&] {
    flashjit_kernel::FLASHJIT_EMULATED_ENTRY(attention_backward_dkdv)<K>(
        params FLASHJIT_EMULATED_BLOCK_MASK);
  });
  if (!error.empty()) return "dK/dV kernel: " + error;
  if (K::kDqAtomic) {
    error = emulate_cuda(rows, kBackwardPreprocessThreads, 16, [&] {
      if (bf16)
        flashjit_kernel::FLASHJIT_EMULATED_ENTRY(backward_dq_convert)<kD, true>(params);
      else
        flashjit_kernel::FLASHJIT_EMULATED_ENTRY(backward_dq_convert)<kD, false>(params);
    });
  } else {
    const CudaGrid queries{static_cast<int>((problem.seqlen_q + K::kBlockM - 1) / K::kBlockM),
                           heads_q, batch};
    error = emulate_cuda(queries, K::kDqThreads, K::kDqSmemBytes, [&] {
      flashjit_kernel::FLASHJIT_EMULATED_ENTRY(attention_backward_dq)<K>(
          params FLASHJIT_EMULATED_BLOCK_MASK);
    });
  }
  if (!error.empty()) return "dQ kernel: " + error;
  for (const auto* tensor : {&dq, &dk, &dv}) {
    for (size_t i = tensor->size() - kGuardElements; i < tensor->size(); ++i)
      if ((*tensor)[i] != kPoisonBits) return "a gradient written past its span";
  }
  out->dq.assign(dq.begin(), dq.end() - kGuardElements);
  out->dk.assign(dk.begin(), dk.end() - kGuardElements);
  out->dv.assign(dv.begin(), dv.end() - kGuardElements);
  return "";
}

}  // namespace flashjit::testing
