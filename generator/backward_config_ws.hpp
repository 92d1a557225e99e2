// The warp-specialized backward family (sm_90a: H100, H200;
// templates/cuda/ws/attention_bwd_ws.cuh): one kernel computes dK, dV and dQ (a producer warp's TMA
// loads, two consumer warpgroups, a dQ-writer warp's bulk reductions), between the shared
// preprocess and convert row kernels. Its knob space, legality rules (the template's
// static_asserts, shared memory, registers), launch shapes and its part of `flashjit plan --pass
// bwd`. generator/backward_config.cpp dispatches here for backward configs with family ==
// KernelFamily::Ws.
//
// The knobs, for this family:
//   block_n  keys per CTA: 64 per consumer warpgroup, two consumers (128)
//   block_m  query rows per step of the Q/dO pipeline (64 or 128)
//   warps    4 (producer warpgroup) + 4 per consumer: 12
//   stages   depth of the Q/dO (and lse/delta) pipeline: 2 or 3
//   dq       Atomic only (bulk reductions into the fp32 workspace; no -det yet)
//   -persist one CTA per SM walks the key tiles (heaviest first when causal) instead of one CTA
//            per tile
// Problems it does not take (plain attention only, head dim <= 128, not deterministic) fall
// back to the wgmma and mma families.
#pragma once

#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

inline constexpr int kWsBwdBlockMChoices[] = {64, 128};
inline constexpr int kWsBwdBlockNChoices[] = {128};
inline constexpr int kWsBwdWarpChoices[] = {12};
inline constexpr int kWsBwdStageChoices[] = {2, 3};

// Every point of the knob space (family Ws) for a problem the family takes (none otherwise);
// filter with check_ws_backward_config.
std::vector<AttentionConfig> ws_backward_candidates(const AttentionProblem& problem);

// Why `config` (family Ws) is illegal for the backward of `problem` on `device`, or ok: sm90,
// the dtype, plain attention only, not deterministic, head dim <= 128, the template's knobs,
// shared memory (with the 1024-byte swizzle-atom alignment), the consumers' registers.
Status check_ws_backward_config(const AttentionConfig& config, const AttentionProblem& problem,
                                const DeviceSpec& device);

// Launch shape of the fused kernel (the dK/dV entry): threads and dynamic shared memory. The
// dQ entry is the convert row kernel (backward_shapes).
// A -persist config's CTAs: one per SM of `device` (the fused kernel takes a whole SM).
int ws_backward_persistent_ctas(const AttentionConfig& config, const DeviceSpec& device);
int ws_backward_dkdv_threads(const AttentionConfig& config);
int ws_backward_dkdv_smem_bytes(const AttentionConfig& config, const AttentionProblem& problem);
// Registers a consumer thread needs at the least (estimate, calibrated with ptxas 13.0), and
// what setmaxnreg gives it (WsBwdTraits::kConsumerRegisters).
int ws_backward_consumer_registers(const AttentionConfig& config, const AttentionProblem& problem);
int ws_backward_consumer_register_limit(const AttentionConfig& config);

// The family's default where it takes the problem: m64n128w12s2-ws, with -persist when causal
// (the static heaviest-first order evens out the key tiles' unequal work), if legal on `device`;
// error Unsupported otherwise (the caller falls back to the wgmma family's default).
Result<AttentionConfig> default_ws_backward_config(const AttentionProblem& problem,
                                                   const DeviceSpec& device);

// The family's budget arithmetic and candidate table, for `flashjit plan --pass bwd`.
std::string explain_ws_backward_plan(const AttentionProblem& problem, const DeviceSpec& device);

}  // namespace flashjit
