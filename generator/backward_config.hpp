// The backward pass's configs on the CUDA templates and the SRAM/register budget that decides
// which are legal for a problem on a device. config.hpp's check_config / legal_configs /
// default_config / explain_plan forward here for problems with pass == Pass::Backward.
//
// The backward pass is three kernels (templates/cuda/attention_bwd.cuh), launched in order:
//   preprocess  D = rowsum(dO * O) per query row (fp32 workspace); zeroes the dQ accumulator
//   dK/dV       one CTA per block of block_n keys of one (batch, kv head): K_j, V_j resident in
//               shared memory, dK_j, dV_j accumulating in registers; Q_i, dO_i (and LSE_i, D_i)
//               streamed in blocks of block_m rows, `stages` deep, over every query head of the
//               group. DqMode::Atomic: dQ_i += dS K_j with fp32 atomics into the workspace.
//   dQ          DqMode::Atomic: converts the fp32 accumulator to the storage type.
//               DqMode::Separate: one CTA per block of block_m query rows recomputes P and dP
//               over the key blocks and accumulates dQ in registers (deterministic).
//
// Each kernel family (KernelFamily) has its own knob space, template constraints, budget and
// launch shapes, behind one table of functions (BackwardFamily in backward_config.cpp); the
// functions below dispatch on config.family. The mma family (sm80 and newer, mma.sync) is the
// one in this file; the wgmma family (sm90a) plugs in beside it.
//
// The mma family's budget (templates/cuda/attention_bwd.cuh):
//   d_pad   the head dim in shared memory: 64, 128 or 256 (a power of two >= the head dim)
//   smem    dK/dV kernel: K_j, V_j + stages x (Q_i, dO_i) + P, dS (16-bit) + stages x (lse_log2_i,
//           D_i) (fp32) = 4 * block_n * d_pad + 4 * stages * block_m * d_pad
//           + 4 * block_m * block_n + 8 * stages * block_m bytes;
//           dQ kernel (Separate): Q_i, dO_i + stages x (K_j, V_j) + dS
//           = 4 * block_m * d_pad + 4 * stages * block_n * d_pad + 2 * block_m * block_n bytes
//   regs    each product's output block is split over the warps (32 rows per warp where the
//           columns split evenly, else 16); per thread: dK + dV (fp32) + max(S + dP, the
//           Atomic mode's dQ chunk) + one k-step of B fragments (dK/dV columns / 4) + 40, and
//           for the dQ kernel dQ + S + dP + dQ columns / 4 + 40; at most 255, and threads *
//           registers within the SM's register file. Calibrated with ptxas: every legal config
//           of sm80/sm90 spills at most 48 bytes (tests/templates/cuda_compile_test.cpp)
#pragma once

#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

// The mma family's knob values (the template's static_asserts accept these).
inline constexpr int kBackwardBlockMChoices[] = {32, 64, 128};  // query rows per streamed block
inline constexpr int kBackwardBlockNChoices[] = {32, 64, 128};  // keys per dK/dV CTA
inline constexpr int kBackwardWarpChoices[] = {4, 8};
inline constexpr int kBackwardStageChoices[] = {1, 2};  // buffers of the streamed operands
inline constexpr DqMode kBackwardDqChoices[] = {DqMode::Atomic, DqMode::Separate};

// The head dim as the mma family lays it out in shared memory: 64, 128 or 256, the smallest that
// holds head_dim (each warp's share of a row must be a power of two: the template's swizzle
// arithmetic). The dQ accumulator in the workspace keeps padded_head_dim (a multiple of 64).
int backward_padded_head_dim(int head_dim);

// How the mma family splits one product's [rows, cols] output over `warps` warps: warps_m along
// the rows, warps_n along the columns (templates/cuda/attention_bwd.cuh's WarpTiling). valid is
// false when the template has no such split (its static_asserts would fail).
struct BackwardWarpTiling {
  int warps_m = 0, warps_n = 0;
  int rows = 0, cols = 0;  // per warp
  bool valid = false;
};
BackwardWarpTiling backward_warp_tiling(int rows, int cols, int warps);

// The resources of one backward config: both kernels' launch shapes and register estimates.
struct BackwardResources {
  int dkdv_threads = 0, dkdv_smem_bytes = 0, dkdv_registers = 0;
  int dq_threads = 0, dq_smem_bytes = 0, dq_registers = 0;  // DqMode::Separate's dQ kernel
  int ctas_per_sm = 0;  // of the dK/dV kernel: occupancy bound (0: does not fit)
};
// For a config of a known family (the mma family today); zeros for an unknown one.
BackwardResources backward_resources(const AttentionConfig& config, const AttentionProblem& problem,
                                     const DeviceSpec& device);

// Why `config` cannot be rendered for the backward of `problem` on any device (the dtype, the
// family, deterministic => Separate, the knob values and the template's other constraints), or
// ok. The renderer's check.
Status check_backward_template(const AttentionConfig& config, const AttentionProblem& problem);
// Why `config` is illegal for the backward of `problem` on `device`: check_backward_template,
// then shared memory, the smaller knob values where larger ones fit (stages = 1 where 2 fit,
// block_n = 32 where 64 fits: they exist for the devices where those do not), registers; or ok.
Status check_backward_config(const AttentionConfig& config, const AttentionProblem& problem,
                             const DeviceSpec& device);
// Every legal backward config, in a stable order (AttentionConfig's ordering).
std::vector<AttentionConfig> legal_backward_configs(const AttentionProblem& problem,
                                                    const DeviceSpec& device);
// The untuned default among the legal ones (the mma family), by the formula
//   8 warps; block_n = min(128, 16384 / d_pad) (dK and dV then hold 2 * block_n * d_pad / 256
//   <= 128 fp32 registers per thread); then block_m and stages: the first legal of
//   (128, 2), (64, 2), (64, 1), (32, 2), (32, 1); block_n halves while none is; 4 warps if no
//   8-warp config is legal; DqMode::Atomic unless the problem is deterministic.
// On an H100 or A100 this gives m128n128w8s2 at d <= 64, m64n128w8s2 at d 65-128, and
// m64n64w8s2 (H100) / m64n64w8s1 (A100) at d 129-256: FlashAttention-2's tile shapes.
// Error if the CUDA templates cannot store the dtype or no config is legal.
Result<AttentionConfig> default_backward_config(const AttentionProblem& problem,
                                                const DeviceSpec& device);
// The budget arithmetic and the legal set, as `flashjit plan --pass bwd` prints it.
std::string explain_backward_plan(const AttentionProblem& problem, const DeviceSpec& device);

// The launch shape of the dK/dV kernel and of the dQ kernel (DqMode::Separate; for Atomic the
// last kernel is the convert, launched like the preprocess: render.hpp), per family: threads
// per CTA and dynamic shared memory in bytes.
int backward_dkdv_threads(const AttentionConfig& config);
int backward_dq_threads(const AttentionConfig& config);
int backward_dkdv_smem_bytes(const AttentionConfig& config, const AttentionProblem& problem);
int backward_dq_smem_bytes(const AttentionConfig& config, const AttentionProblem& problem);

}  // namespace flashjit
