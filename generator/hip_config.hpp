// The HIP (AMD CDNA) templates' config space and their LDS / register budget (pure: no device).
// check_hip_config, legal_hip_configs, default_hip_config and explain_hip_plan serve both passes:
// the forward below, the backward (problem.pass == Backward) at the end of this file.
//
// AttentionConfig is reused with the same meaning as on NVIDIA, except that `warps` counts
// wavefronts of 64 lanes: a workgroup of `warps` waves owns block_m query rows, each wave 16 or
// 32 of them end to end (rows_per_warp), and streams K and V through LDS in blocks of block_n
// keys. `stages` is the number of LDS buffers for K/V: 1 (load the next block into registers
// while computing, then write it over the current one: two barriers per block) or 2 (write it
// into the other buffer: one barrier per block). Q never goes through LDS: each wave keeps its
// own query rows in registers as MFMA operands (templates/hip/attention_fwd.hpp).
#pragma once

#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"

namespace flashjit {

// Values the HIP template accepts for each knob.
inline constexpr int kHipBlockMChoices[] = {32, 64, 128, 256};
inline constexpr int kHipBlockNChoices[] = {32, 64, 128};
inline constexpr int kHipWaveChoices[] = {1, 2, 4, 8};
inline constexpr int kHipStageChoices[] = {1, 2};

// Lanes per wavefront on CDNA; SIMDs per CU (each runs whole waves).
inline constexpr int kHipWaveSize = 64;
inline constexpr int kHipSimdsPerCu = 4;
// 16-byte K (and V) copies per thread per block (the forward and decode templates): the next
// block waits in registers while the current one is computed, so more copies cost registers one
// for one (and the template's unrolled copy loops grow).
inline constexpr int kHipMaxCopiesPerThread = 8;
// The fp32 O accumulator of one lane (rows x padded d / 64) may take at most this many
// registers. An empirical cap, from hipRTC's (ROCm 5.2) reports for gfx90a: with 32 rows per
// wave at d = 256 (128 accumulator registers) every block size spilled to scratch even with all
// 512 registers of a SIMD, while d = 192 (96) fit. The estimates cannot see why (the compiler
// keeps more in flight than the template holds); tests/templates/hip_compile_test.cpp checks
// that no legal config spills.
inline constexpr int kHipMaxAccumulatorPerLane = 96;

// LDS of one workgroup: `stages` K tiles (block_n x padded_head_dim, XOR-swizzled) and `stages`
// transposed V tiles (padded_head_dim x (block_n + 4): 8 bytes of padding per row), 2-byte
// elements:
//   lds = stages * (block_n * dp + dp * (block_n + 4)) * 2,   dp = padded_head_dim
int hip_lds_bytes(const AttentionConfig& config, const AttentionProblem& problem);

// The least 32-bit registers (VGPRs + AGPRs) a lane needs: the fp32 O accumulator
// (rows_per_warp x d / 64 lanes), the fp32 S^T tile and its 16-bit P (rows_per_warp x block_n),
// Q kept as MFMA operands (rows_per_warp x d, 16-bit), the next K/V block in flight
// (2 x block_n x d / threads, 16-bit), plus a fixed allowance for addresses, loop state, softmax
// scalars and the K/V operands of one MFMA; with a user score_mod / mask_mod, its allowance too.
int hip_estimated_registers(const AttentionConfig& config, const AttentionProblem& problem);

// Registers a lane may use in a workgroup of `waves` waves (`config.warps`): the waves share the
// CU's SIMDs, so 5..8 waves put two on one SIMD and halve each one's share of its register file.
int hip_wave_register_budget(int waves, const DeviceSpec& device);
int hip_register_budget(const AttentionConfig& config, const DeviceSpec& device);

struct HipResourceUse {
  int lds_bytes = 0;
  int regs_per_lane = 0;  // estimate; the compiler's count is in the code object
  int threads = 0;
  int blocks_per_cu = 0;  // occupancy bound from LDS, registers and waves (0: does not fit)
};
HipResourceUse hip_resource_use(const AttentionConfig& config, const AttentionProblem& problem,
                                const DeviceSpec& device);

// Why `config` is illegal for the HIP template of the problem's pass on `device` (the dtype,
// template constraints, then LDS, then registers), or ok. `device` must be an AMD device
// (DeviceSpec::is_amd()).
Status check_hip_config(const AttentionConfig& config, const AttentionProblem& problem,
                        const DeviceSpec& device);

// Every legal config, in a stable order (block_m, block_n, warps, stages ascending; for the
// backward then dq: Atomic before Separate).
std::vector<AttentionConfig> legal_hip_configs(const AttentionProblem& problem,
                                               const DeviceSpec& device);

// The untuned default (the backward's: below). FlashAttention's starting formula (Br = SRAM / (3 d
// 4)) assumes Q in SRAM and gives 42 rows at d = 128 on 64 KiB; this template keeps Q in registers,
// so the default is instead the shape of AMD's own FMHA forward kernels: 4 waves of 32 rows
// (block_m 128), block_n 64, preferring configs whose LDS lets two workgroups share a CU, then
// 2 stages; the closest legal config by that ranking. Error only if no config is legal.
Result<AttentionConfig> default_hip_config(const AttentionProblem& problem,
                                           const DeviceSpec& device);

// The budget arithmetic and the legal set, as `flashjit plan --arch gfx90a` prints it.
std::string explain_hip_plan(const AttentionProblem& problem, const DeviceSpec& device);

// ---- the backward pass (templates/hip/attention_bwd.hpp)
// -----------------------------------------
//
// The knobs (config.hpp): the dK/dV kernel's workgroup owns block_n keys of one (batch, kv head),
// `warps` waves of 16 or 32 keys each, dK and dV in registers; Q and dO stream through `stages`
// LDS buffers in blocks of block_m rows, each stored twice (rows, and transposed for the
// products over queries). dq = Atomic: the dK/dV kernel also adds dS K to an fp32 accumulator
// with atomics (dS through an LDS tile), a last kernel converts it; Separate ("-det"): a dQ
// kernel of block_m / 16 waves of 16 query rows streams K and V in blocks of block_n through
// `stages` LDS buffers (K also transposed) and recomputes P and dP. A deterministic problem allows
// Separate only.
inline constexpr int kHipBwdBlockMChoices[] = {16, 32, 64};
inline constexpr int kHipBwdBlockNChoices[] = {32, 64, 128};
// At least 2 waves: the Q and dO a workgroup stages through LDS serve all its waves' keys, and a
// wave of its own would stage every block for 16 or 32 keys only (the template takes 1 too).
inline constexpr int kHipBwdWaveChoices[] = {2, 4, 8};
// 16-byte copies per thread of one streamed tile: Q/dO in the dK/dV kernel (as the forward's
// K/V), K/V in the dQ kernel, whose one wave of 16 rows must copy a 32 x 256 block at d = 256.
inline constexpr int kHipBwdMaxCopies = 8;
inline constexpr int kHipBwdDqMaxCopies = 16;
// Elements of one streamed Q (or dO) block at least: each block costs the dK/dV kernel one or two
// barriers, which a 16-row block of a 64-dim head (2 KiB) does not pay for. Block_m 16 is for
// head dims of 128 and more.
inline constexpr int kHipBwdMinBlockElements = 2048;

// LDS of the dK/dV kernel: per stage Q and dO, each in rows (block_m x dp, swizzled) and
// transposed (dp x (block_m + 4)); Atomic adds the dS tile (block_m x (block_n + 4)), 2 bytes each:
//   lds = stages * 2 * (Bm * dp + dp * (Bm + 4)) * 2 + [Atomic] Bm * (Bn + 4) * 2
int hip_bwd_dkdv_lds_bytes(const AttentionConfig& config, const AttentionProblem& problem);
// LDS of the dQ kernel (Separate; 0 for Atomic): per stage K and V in rows and K transposed:
//   lds = stages * (2 * Bn * dp + dp * (Bn + 4)) * 2
int hip_bwd_dq_lds_bytes(const AttentionConfig& config, const AttentionProblem& problem);
// Waves of the dQ kernel: one per 16 query rows of block_m.
int hip_bwd_dq_waves(const AttentionConfig& config);

// The registers a lane of each kernel needs, estimated (as hip_estimated_registers; hipRTC's
// counts are in tests/templates/hip_compile_test.cpp's tables):
//   dK/dV  fp32 dK^T and dV^T (2 x keys_per_wave x dp / 64), K and V rows as 16-bit operands
//          (2 x keys_per_wave x dp / 128), one query tile's S, dP (fp32) and P, dS (16-bit), its
//          Q and dO operands read ahead from LDS (rows and transposed: 8 dp / 16), the next Q
//          and dO block in flight, Atomic: K^T operands of dQ = dS K for the wave's dims and a
//          dQ tile; plus the fixed allowance
//   dQ     fp32 dQ^T (16 x dp / 64), Q and dO operands (2 x 16 x dp / 128), S^T, dP^T, dS^T of one
//          key block (and S^T, dP^T once more: hipRTC overlaps blocks), the next K and V block in
//          flight; plus the allowance
int hip_bwd_dkdv_estimated_registers(const AttentionConfig& config,
                                     const AttentionProblem& problem);
int hip_bwd_dq_estimated_registers(const AttentionConfig& config, const AttentionProblem& problem);

// Threads and LDS of the backward's entry points (render.hpp's launch contract).
BackwardShapes hip_backward_shapes(const AttentionConfig& config, const AttentionProblem& problem);

}  // namespace flashjit
