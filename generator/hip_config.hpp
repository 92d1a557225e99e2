// The HIP (AMD CDNA) template's config space and its LDS / register budget (pure: no device).
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

namespace flashjit {

// Values the HIP template accepts for each knob.
inline constexpr int kHipBlockMChoices[] = {32, 64, 128, 256};
inline constexpr int kHipBlockNChoices[] = {32, 64, 128};
inline constexpr int kHipWaveChoices[] = {1, 2, 4, 8};
inline constexpr int kHipStageChoices[] = {1, 2};

// Lanes per wavefront on CDNA; SIMDs per CU (each runs whole waves).
inline constexpr int kHipWaveSize = 64;
inline constexpr int kHipSimdsPerCu = 4;

// LDS of one workgroup: `stages` K tiles (block_n x padded_head_dim, XOR-swizzled) and `stages`
// transposed V tiles (padded_head_dim x (block_n + 4): 8 bytes of padding per row), 2-byte
// elements:
//   lds = stages * (block_n * dp + dp * (block_n + 4)) * 2,   dp = padded_head_dim
int hip_lds_bytes(const AttentionConfig& config, const AttentionProblem& problem);

// The least 32-bit registers (VGPRs + AGPRs) a lane needs: the fp32 O accumulator
// (rows_per_warp x d / 64 lanes), the fp32 S^T tile and its 16-bit P (rows_per_warp x block_n),
// Q kept as MFMA operands (rows_per_warp x d, 16-bit), the next K/V block in flight
// (2 x block_n x d / threads, 16-bit), plus a fixed allowance for addresses, loop state, softmax
// scalars and the K/V operands of one MFMA.
int hip_estimated_registers(const AttentionConfig& config, const AttentionProblem& problem);

// Registers a lane may use in a workgroup of `config.warps` waves: the waves share the CU's
// SIMDs, so 5..8 waves put two on one SIMD and halve each one's share of its register file.
int hip_register_budget(const AttentionConfig& config, const DeviceSpec& device);

struct HipResourceUse {
  int lds_bytes = 0;
  int regs_per_lane = 0;  // estimate; the compiler's count is in the code object
  int threads = 0;
  int blocks_per_cu = 0;  // occupancy bound from LDS, registers and waves (0: does not fit)
};
HipResourceUse hip_resource_use(const AttentionConfig& config, const AttentionProblem& problem,
                                const DeviceSpec& device);

// Why `config` is illegal for the HIP template on `device` (template constraints, then LDS, then
// registers), or ok. `device` must be an AMD device (DeviceSpec::is_amd()).
Status check_hip_config(const AttentionConfig& config, const AttentionProblem& problem,
                        const DeviceSpec& device);

// Every legal config, in a stable order (block_m, block_n, warps, stages ascending).
std::vector<AttentionConfig> legal_hip_configs(const AttentionProblem& problem,
                                               const DeviceSpec& device);

// The untuned default. FlashAttention's starting formula (Br = SRAM / (3 d 4)) assumes Q in
// SRAM and gives 42 rows at d = 128 on 64 KiB; this template keeps Q in registers, so the
// default is instead the shape of AMD's own FMHA forward kernels: 4 waves of 32 rows
// (block_m 128), block_n 64, preferring configs whose LDS lets two workgroups share a CU, then
// 2 stages; the closest legal config by that ranking. Error only if no config is legal.
Result<AttentionConfig> default_hip_config(const AttentionProblem& problem,
                                           const DeviceSpec& device);

// The budget arithmetic and the legal set, as `flashjit plan --arch gfx90a` prints it.
std::string explain_hip_plan(const AttentionProblem& problem, const DeviceSpec& device);

}  // namespace flashjit
