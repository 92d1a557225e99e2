// The wgmma backward's launch sequence on the host (tests/support/sm90_emulator.hpp): the
// preprocess and the Atomic mode's convert on the host as cuda/attention_bwd_common.cuh defines
// them, the template's dK/dV and dQ kernels emulated; shared by the emulation tests of the plain
// template and of the variants. Include it after templates/cuda/attention_bwd_sm90.cuh.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "generator/backward_config_sm90.hpp"
#include "runtime/launch_params.hpp"
#include "support/emulated_entry.hpp"
#include "support/sm90_emulator.hpp"
#include "support/variant_cases.hpp"  // Gradients
#include "support/variant_emulation.hpp"
#include "tuner/reference.hpp"

// A translation unit that compiles in a mask_mod's block map (FLASHJIT_VARIANT_BLOCK_MASK 1) passes
// run_sm90_backward_gradients' map on to the dK/dV and dQ kernels, as the entries do.
#if defined(FLASHJIT_VARIANT_BLOCK_MASK) && FLASHJIT_VARIANT_BLOCK_MASK
#define FLASHJIT_EMULATED_SM90_BLOCK_MASK , block_mask
#else
#define FLASHJIT_EMULATED_SM90_BLOCK_MASK
#endif

namespace flashjit::testing {

inline int64_t storage_offset(const Strides& s, int64_t b, int64_t row, int64_t h) {
  return b * s.batch + row * s.seq + h * s.head;
}

struct Sm90BackwardOutcome {
  std::string error;  // emulation error
  GradientComparison comparison;
};

// One backward call of `config` on `problem`: host preprocess, then kernels(params) (the
// emulated dK/dV and dQ kernels, with the workspace bound: returns the emulator's error or ""),
// then the host convert (DqMode::Atomic). The gradients' whole spans (poisoned before) into
// `gradients`; the error, "" when it ran.
template <class Kernels>
std::string run_backward_around_host_rows(const AttentionProblem& p, const AttentionConfig& config,
                                          const HostInputs& in, Gradients* gradients,
                                          const Kernels& kernels) {
  std::string error;
  std::vector<uint16_t> dq = poisoned_storage(p.dq_span(), p.dtype);
  std::vector<uint16_t> dk = poisoned_storage(p.dkv_span(), p.dtype);
  std::vector<uint16_t> dv = poisoned_storage(p.dkv_span(), p.dtype);
  std::vector<float> lse = in.lse;
  AttentionArgs args;
  args.q = in.q.data();
  args.k = in.k.data();
  args.v = in.v.data();
  args.o = const_cast<uint16_t*>(in.o.data());
  args.lse = lse.data();
  args.d_o = in.d_o.data();
  args.dq = dq.data();
  args.dk = dk.data();
  args.dv = dv.data();
  args.alibi_slopes = in.alibi_slopes.empty() ? nullptr : in.alibi_slopes.data();
  args.cu_seqlens_q = in.cu_seqlens_q.data();
  args.cu_seqlens_k = in.cu_seqlens_k.data();
  FlashjitAttentionParams params = make_launch_params(p, args);
  const BackwardWorkspace layout = backward_workspace(p, config);
  std::vector<unsigned char> workspace(layout.bytes + kWorkspaceAlign, 0xFF);
  void* aligned =
      workspace.data() +
      (kWorkspaceAlign - reinterpret_cast<uintptr_t>(workspace.data()) % kWorkspaceAlign);
  bind_workspace(params, layout, aligned);

  // Entry b's rows: packed documents (p.variant.varlen) start at their offset, with their own
  // length, and their lse is the packed [heads_q, len] block at heads_q * offset.
  auto first_row = [&](int64_t b) { return p.variant.varlen ? in.cu_seqlens_q[b] : int64_t{0}; };
  auto rows = [&](int64_t b) {
    return p.variant.varlen ? in.cu_seqlens_q[b + 1] - in.cu_seqlens_q[b] : p.seqlen_q;
  };
  auto lse_at = [&](int64_t b, int64_t h, int64_t row) {
    return p.variant.varlen ? p.heads_q * first_row(b) + h * rows(b) + row
                            : (b * p.heads_q + h) * p.seqlen_q + row;
  };
  // The preprocess, as cuda/attention_bwd_common.cuh defines it (per document: its own rows,
  // padded to the workspace's blocks of 128, where the workspace layout puts them).
  const int dp = padded_head_dim(p.head_dim);
  const int32_t* cu_seqlens_q = in.cu_seqlens_q.data();
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t row = 0; row < round_to_row_blocks(rows(b)); ++row) {
        const int64_t at = layout.row(p, cu_seqlens_q, b, h, row);
        const bool valid = row < rows(b);
        float dot = 0;
        if (valid)
          for (int c = 0; c < p.head_dim; ++c)
            dot = std::fma(
                element_value(in.o.data(),
                              storage_offset(p.o_strides, b, first_row(b) + row, h) + c, p.dtype),
                element_value(in.d_o.data(),
                              storage_offset(p.do_strides, b, first_row(b) + row, h) + c, p.dtype),
                dot);
        params.delta[at] = valid ? dot : 0.f;
        params.lse_log2[at] = valid ? lse[lse_at(b, h, row)] * 1.4426950408889634f : HUGE_VALF;
        if (params.dq_accum)
          for (int c = 0; c < dp; ++c) params.dq_accum[at * dp + c] = 0.f;
      }

  error = kernels(params);
  if (!error.empty()) return error;
  if (config.dq == DqMode::Atomic) {
    // The convert, as cuda/attention_bwd_common.cuh defines it: dq = scale * dq_accum.
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t row = 0; row < rows(b); ++row)
          for (int c = 0; c < p.head_dim; ++c) {
            const int64_t at = layout.row(p, cu_seqlens_q, b, h, row) * dp + c;
            set_element(dq.data(), storage_offset(p.dq_strides, b, first_row(b) + row, h) + c,
                        params.dq_accum[at] * params.scale, p.dtype);
          }
  }
  *gradients = Gradients{std::move(dq), std::move(dk), std::move(dv)};
  return "";
}

// One backward call of the wgmma family's config K on `problem`: host preprocess, emulated
// kernels, host convert (run_backward_around_host_rows).
template <class K>
std::string run_sm90_backward_gradients(const AttentionProblem& p, const AttentionConfig& config,
                                        const HostInputs& in, Gradients* gradients,
                                        const FlashjitBlockMask* block_mask = nullptr) {
  (void)block_mask;
  return run_backward_around_host_rows(
      p, config, in, gradients, [&](FlashjitAttentionParams& params) -> std::string {
        const Sm90Grid dkdv_grid{
            static_cast<int>((p.seqlen_k + config.block_n - 1) / config.block_n),
            static_cast<int>(p.heads_kv), static_cast<int>(p.batch)};
        std::string error = emulate_sm90(
            dkdv_grid, wgmma_backward_dkdv_threads(config),
            wgmma_backward_dkdv_smem_bytes(config, p), [&] {
              flashjit_kernel::FLASHJIT_EMULATED_ENTRY(attention_backward_sm90_dkdv)<K>(
                  params FLASHJIT_EMULATED_SM90_BLOCK_MASK);
            });
        if (!error.empty()) return "dK/dV kernel: " + error;
        if (config.dq == DqMode::Separate) {
          const Sm90Grid dq_grid{
              static_cast<int>((p.seqlen_q + config.block_m - 1) / config.block_m),
              static_cast<int>(p.heads_q), static_cast<int>(p.batch)};
          error = emulate_sm90(
              dq_grid, wgmma_backward_dq_threads(config), wgmma_backward_dq_smem_bytes(config, p),
              [&] {
                flashjit_kernel::FLASHJIT_EMULATED_ENTRY(attention_backward_sm90_dq)<K>(
                    params FLASHJIT_EMULATED_SM90_BLOCK_MASK);
              });
          if (!error.empty()) return "dQ kernel: " + error;
        }
        return "";
      });
}

// run_sm90_backward_gradients, its gradients compared with `ref`.
template <class K>
Sm90BackwardOutcome run_sm90_backward(const AttentionProblem& p, const AttentionConfig& config,
                                      const HostInputs& in, const Reference& ref) {
  Sm90BackwardOutcome out;
  Gradients gradients;
  out.error = run_sm90_backward_gradients<K>(p, config, in, &gradients);
  if (out.error.empty())
    out.comparison = compare_gradients(p, gradients.dq, gradients.dk, gradients.dv, ref);
  return out;
}

// The wgmma-family config of traits K (the knobs the renderer instantiates them from).
template <class K>
AttentionConfig sm90_backward_config() {
  return AttentionConfig{K::kBlockM,          K::kBlockN,
                         K::kWarps,           K::kStages,
                         KernelFamily::Wgmma, K::kDqAtomic ? DqMode::Atomic : DqMode::Separate};
}

// A variant emulation test's check of traits K (compiled with that variant's prelude): both
// kernels on the variant's cases against the fp64 reference gradients
// (check_variant_backward_emulation).
template <class K>
void check_sm90_variant_backward(const VariantCase& variant, uint64_t seed) {
  const AttentionConfig config = sm90_backward_config<K>();
  SCOPED_TRACE(config.to_string());
  check_variant_backward_emulation(
      variant, K::kIsBf16 ? DType::BF16 : DType::F16, K::kHeadDim, K::kBlockN, seed,
      [&](const AttentionProblem& problem, const HostInputs& inputs, Gradients* out) {
        return run_sm90_backward_gradients<K>(problem, config, inputs, out);
      });
}

}  // namespace flashjit::testing
