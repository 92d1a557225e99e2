// Tile configurations of the attention forward kernel and the SRAM/register budget that
// decides which are legal for a problem on a device.
//
// One CTA owns block_m query rows; its `warps` warps own 16 * m_tiles rows each. K and V are
// streamed through shared memory in blocks of block_n rows, `stages` blocks deep.
//
// Three kernel families share these knobs:
//   mma    templates/cuda/attention_fwd.cuh, sm80 and newer: mma.sync + ldmatrix, 16 or 32 rows
//          per warp.
//   wgmma  templates/cuda/attention_fwd_sm90.cuh, sm90 (H100/H200, compiled for sm_90a):
//          warpgroup MMA from shared memory, 64 rows per warpgroup of 4 warps.
//   ws     templates/cuda/ws/, sm90a: warp-specialized (a TMA producer warpgroup, 64 rows per
//          consumer warpgroup, setmaxnreg); its budget is generator/forward_config_ws.hpp.
//   decode split-KV decoding for small seqlen_q and paged K/V caches (CUDA sm80+ and the CPU):
//          its knobs and budget are generator/decode_config.hpp's (block_m = packed query rows
//          of a GQA group, `splits` key ranges per sequence merged by a combine kernel).
#pragma once

#include <compare>
#include <string>
#include <tuple>
#include <vector>

#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

enum class KernelFamily { Mma, Wgmma, Ws, Decode };

// How the backward pass produces dQ (the forward pass has no dQ: always Atomic there, unprinted).
//   Atomic    the dK/dV kernel adds each key block's contribution to an fp32 workspace with
//             atomics; a last kernel converts it. One pass over the scores; the order of the
//             additions varies run to run.
//   Separate  a dQ kernel of its own loops over the key blocks of each query block and
//             recomputes P and dP: about 40% more arithmetic, no atomics, bitwise reproducible
//             (AttentionProblem::deterministic allows only these). Printed as a "-det" suffix.
enum class DqMode { Atomic, Separate };

// One kernel configuration. The knobs mean, per pass:
//   forward   block_m query rows per CTA, K/V streamed in blocks of block_n rows, `stages` deep;
//   backward  block_n key/value rows per CTA of the dK/dV kernel, Q and dO streamed in blocks
//             of block_m rows, `stages` deep (the dQ kernel of DqMode::Separate transposes the
//             roles: block_m query rows per CTA, K and V streamed in blocks of block_n).
struct AttentionConfig {
  int block_m = 128;  // Br: query rows per CTA (forward) or per streamed block (backward)
  int block_n = 64;   // Bc: key/value rows per pipeline stage (forward) or per CTA (backward)
  int warps = 4;      // warps per CTA
  int stages = 2;     // shared-memory pipeline depth of the streamed operand
  KernelFamily family = KernelFamily::Mma;
  DqMode dq = DqMode::Atomic;  // backward only
  // The -ws family's schedule (forward; no other family has these, check_ws_knobs):
  bool pingpong = false;    // consumer warpgroups take turns issuing their GEMMs: "-pp"
  bool persistent = false;  // one CTA per SM slot walks a list of tiles: "-persist"
  // The decode family only: key ranges per sequence (split-KV); 0 = auto, resolved per launch
  // from the SM (core) count and the problem (generator/decode_config.hpp: decode_splits).
  int splits = 0;

  bool operator==(const AttentionConfig&) const = default;
  // Family first, then the knobs: legal_configs lists the mma family, then the wgmma family.
  auto operator<=>(const AttentionConfig& other) const {
    return std::tie(family, block_m, block_n, warps, stages, pingpong, persistent, dq, splits) <=>
           std::tie(other.family, other.block_m, other.block_n, other.warps, other.stages,
                    other.pingpong, other.persistent, other.dq, other.splits);
  }

  int threads() const { return warps * 32; }
  int rows_per_warp() const { return block_m / warps; }
  // "m128n64w4s2" (mma), "m128n128w8s2-wgmma" (wgmma), "m128n128w12s2-ws" (ws; with its
  // schedule "m128n128w12s2-ws-pp", "-ws-persist", "-ws-pp-persist"), "m64n128w8s2-det"
  // (backward, DqMode::Separate), "m16n64w4s3-decode" (decode, auto splits),
  // "m16n64w4s3-decode-split8" (decode, 8 splits)
  std::string to_string() const;
  static Result<AttentionConfig> parse(const std::string& text);
};

// Values the template accepts for each knob (the enumeration's search space).
inline constexpr int kBlockMChoices[] = {32, 64, 128, 256};
inline constexpr int kBlockNChoices[] = {32, 64, 128};
inline constexpr int kWarpChoices[] = {2, 4, 8};
inline constexpr int kStageChoices[] = {2, 3};
// The wgmma family: block_m = 64 per warpgroup (warps = block_m / 16), S = Q K^T one wgmma wide.
inline constexpr int kWgmmaBlockMChoices[] = {64, 128};
inline constexpr int kWgmmaBlockNChoices[] = {64, 128};

// Head dim as laid out in shared memory: rounded up to 64 so that every row is a whole number of
// 128-byte swizzle groups. Padding columns are zero-filled and never written back.
int padded_head_dim(int head_dim);

struct ResourceUse {
  int smem_bytes = 0;       // dynamic shared memory per CTA
  int regs_per_thread = 0;  // estimate; the compiler's count is reported after compiling
  int threads = 0;
  int ctas_per_sm = 0;  // occupancy bound from smem, registers and threads (0: does not fit)
};

// Q tile + `stages` K and V tiles, 2-byte elements, padded head dim:
//   smem = (block_m + 2 * stages * block_n) * padded_head_dim * 2  (+ 1024 for wgmma and ws:
//   their tiles start on a 1024-byte swizzle-atom boundary; + the mbarriers for ws)
int smem_bytes(const AttentionConfig& config, const AttentionProblem& problem);
// The least registers a thread needs: fp32 accumulators (O: m_tiles*16 x d, S: m_tiles*16 x
// block_n, spread over 32 lanes) plus fragments, addresses and softmax state (ws: a consumer
// thread's, after setmaxnreg).
int estimated_registers(const AttentionConfig& config, const AttentionProblem& problem);
// What a user expression (score_mod, mask_mod; the backward's score_mod_grad) may add per thread
// or lane, in every family's budget: 48 with one, else 0. It runs per score with temporaries of
// its own; the tiles this leaves out spilled with one (the numbers are at each budget).
int user_expression_registers(const AttentionProblem& problem);
ResourceUse resource_use(const AttentionConfig& config, const AttentionProblem& problem,
                         const DeviceSpec& device);

// Whether the CUDA template can run `problem` at all: validate() plus its storage types, f16 and
// bf16 (check_cuda_dtype: error Unsupported naming the dtype; f32 runs on the CPU backend only).
Status check_cuda_dtype(DType dtype);
// Error unless the -ws schedule knobs (pingpong, persistent) are off or `config` is a -ws config
// (every backend's and pass's check starts with it).
Status check_ws_knobs(const AttentionConfig& config);
Status check_cuda_problem(const AttentionProblem& problem);

// The functions below serve either pass: for problem.pass == Backward they forward to the
// backward pass's budget (generator/backward_config.hpp).

// Why `config` is illegal for `problem` on `device` (the problem's dtype, template constraints,
// then shared memory, then registers), or ok.
Status check_config(const AttentionConfig& config, const AttentionProblem& problem,
                    const DeviceSpec& device);

// Every legal config, in a stable order (family, block_m, block_n, warps, stages ascending).
std::vector<AttentionConfig> legal_configs(const AttentionProblem& problem,
                                           const DeviceSpec& device);

// The untuned default. On sm90 the -ws family's tile (default_ws_config) wherever it measured
// faster than the wgmma family's default: every problem of padded head dim > 64, and at 64 the
// problems whose average tile has enough key blocks (ws_is_default, generator/
// forward_config_ws.hpp). Otherwise the starting formula Br = smem_per_block / (3 * d *
// sizeof(float)), within the device's best other family (wgmma on sm90, else mma): rounded down
// to the largest legal block_m (the smallest legal one if none is below); then block_n = 64 if
// legal, the most warps that are legal, and 2 stages.
// Error if the CUDA templates cannot store the dtype (check_cuda_dtype) or no config is legal
// (a device too small for this head dim).
Result<AttentionConfig> default_config(const AttentionProblem& problem, const DeviceSpec& device);

// Human-readable budget arithmetic and the legal set, as `flashjit plan` prints it.
std::string explain_plan(const AttentionProblem& problem, const DeviceSpec& device);

}  // namespace flashjit
