// The wgmma family's backward pass (sm_90a: H100, H200; templates/cuda/attention_bwd_sm90.cuh):
// its knob space, the legality rules (the template's static_asserts, shared memory, registers),
// its launch shapes and its part of `flashjit plan --pass bwd`. generator/backward_config.cpp
// dispatches here for configs with family == KernelFamily::Wgmma.
//
// The knobs, for this family:
//   block_n  keys per CTA of the dK/dV kernel: 64 per warpgroup (each owns its 64 keys and all
//            head-dim columns of dK, dV), or 64 shared by two warpgroups that split the query
//            columns of S^T and the head-dim columns of dK, dV (for d = 256)
//   block_m  query rows per pipeline step (dK/dV kernel) and per CTA of the dQ kernel (64 per
//            warpgroup there)
//   warps    4 or 8 (one or two warpgroups) in the dK/dV kernel
//   stages   depth of the Q / dO (dK/dV kernel) and K / V (dQ kernel) cp.async pipelines
//   dq       Atomic (fp32 red.global.add into the workspace) or Separate (the dQ kernel)
#pragma once

#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

// Values the template accepts for each knob (the enumeration's search space).
inline constexpr int kWgmmaBwdBlockMChoices[] = {64, 128};
inline constexpr int kWgmmaBwdBlockNChoices[] = {64, 128};
inline constexpr int kWgmmaBwdWarpChoices[] = {4, 8};
inline constexpr int kWgmmaBwdStageChoices[] = {2, 3};

// Every point of the knob space (family Wgmma), in AttentionConfig's order; filter it with
// check_wgmma_backward_config. Only Separate configs when the problem is deterministic.
std::vector<AttentionConfig> wgmma_backward_candidates(const AttentionProblem& problem);

// Why `config` (family Wgmma) is illegal for the backward of `problem` on `device`, or ok: the
// architecture (sm90 only), the dtype, deterministic => Separate, the template's constraints,
// shared memory of each kernel (with the 1024-byte swizzle-atom alignment), then registers.
Status check_wgmma_backward_config(const AttentionConfig& config, const AttentionProblem& problem,
                                   const DeviceSpec& device);

// Launch shapes: threads per CTA and dynamic shared memory (bytes) of the dK/dV kernel and of
// the DqMode::Separate dQ kernel (the Atomic mode's convert is the shared row kernel).
int wgmma_backward_dkdv_threads(const AttentionConfig& config);
int wgmma_backward_dq_threads(const AttentionConfig& config);
int wgmma_backward_dkdv_smem_bytes(const AttentionConfig& config, const AttentionProblem& problem);
int wgmma_backward_dq_smem_bytes(const AttentionConfig& config, const AttentionProblem& problem);

// Registers per thread the template needs at the least (fp32 accumulators live at once plus an
// allowance), calibrated against ptxas: every config at or under 255 compiles without spills.
int wgmma_backward_dkdv_registers(const AttentionConfig& config, const AttentionProblem& problem);
int wgmma_backward_dq_registers(const AttentionConfig& config, const AttentionProblem& problem);

// The untuned default on sm90, always with dQ from its own kernel (-det: no atomics; measured
// faster than the atomic mode at every shape of the bf16 grid on an H100, see the .cpp):
//   d <= 64   m128n64w4s2-det   one warpgroup of 64 keys, 128 queries per step (two CTAs per SM)
//   d <= 128  m64n64w4s2-det    one warpgroup of 64 keys, 64 queries per step: the tuned winner
//                               at every d = 128 shape (more CTAs per SM than two warpgroups)
//   d = 256   m64n64w8s2-det    two warpgroups sharing 64 keys (dK, dV split by columns): the
//                               only shape whose accumulators fit
// else the first legal config. Error when no wgmma config is legal (not sm90, or a head dim in
// (128, 192] with no shape).
Result<AttentionConfig> default_wgmma_backward_config(const AttentionProblem& problem,
                                                      const DeviceSpec& device);

// The family's budget arithmetic and candidate table, for `flashjit plan --pass bwd`.
std::string explain_wgmma_backward_plan(const AttentionProblem& problem, const DeviceSpec& device);

}  // namespace flashjit
