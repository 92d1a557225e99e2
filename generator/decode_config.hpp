// The decode family: split-KV attention for decoding (seqlen_q 1..16 against a long K/V cache)
// and for reading a paged K/V cache (decode and chunked prefill). A kernel family of the forward
// pass (KernelFamily::Decode, configs "m16n64w4s3-decode", "m16n64w4s3-decode-split8"): the
// budget enumerates it beside the prefill families when the problem is a decode problem
// (is_decode_problem), so the tuner picks among prefill and decode configs by measurement with
// no code of its own; for a paged cache or per-sequence lengths it is the only family.
//
// The algorithm (flash-decoding), per (batch b, kv head hk):
//   rows      the group's G = heads_q / heads_kv query heads times the seqlen_q queries are the
//             R = G * seqlen_q rows of one tile ("GQA packing": K and V are read once per
//             group): packed row r is query position r / G of head hk * G + r % G. Tiles of
//             block_m rows (more than block_m rows: more tiles, each reading K/V again).
//   splits    the keys the rows see (seqlens_k[b], or seqlen_k; causal: up to the last row's
//             diagonal) in blocks of block_n, cut into `splits` ranges of whole blocks; one CTA
//             (CPU: one work item) per (range, row tile, hk, b) runs the online softmax over its
//             range and writes a partial O (fp32, normalized) and a partial LSE (base 2; -inf
//             for an empty range), unless splits == 1: then O and LSE directly.
//   combine   the ranges of each row merge by their LSE:
//               lse = log2(sum_s 2^lse_s),  O = sum_s 2^(lse_s - lse) O_s
//             into O in the storage type and the natural-log LSE (+inf, O = 0 for a row that
//             sees no key): on a GPU by the tile's last split CTA to finish (a counter per tile
//             in the workspace; one launch per call), on the CPU by work items of its own.
//   The partials live in a workspace: the caller's (AttentionArgs::workspace) or the kernel's
//   per-stream cache, sized by the problem (seqlen_k, not the device lengths), so a call
//   allocates nothing in the steady state and can be captured in a CUDA graph and replayed with
//   new block tables and lengths (runtime/decode_launch.hpp).
//
// The knobs, for this family:
//   block_m  packed rows per CTA: 16 or 32 (every warp holds all of them: m16n8k16 tiles)
//   block_n  keys per pipeline stage; the warps split each block: block_n / warps keys each
//            (a multiple of 16), merged through shared memory after the last block
//   warps    2, 4 or 8
//   stages   K/V blocks in flight (cp.async), 2..4
//   splits   key ranges per sequence, 1..kMaxDecodeSplits, or 0 = auto (decode_splits)
// On the CPU warps = stages = 1, block_m in {16, 32, 64} rows, block_n in {32..256} keys.
#pragma once

#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/cpu_config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

// Queries per sequence up to which a contiguous forward problem counts as decoding.
inline constexpr int kMaxDecodeSeqlenQ = 16;
// Keys from which a contiguous problem with few queries is enumerated as a decode problem (below
// it a decode problem is too small for split-KV to matter, and the prefill families cover it).
inline constexpr int kMinDecodeSeqlenK = 128;
inline constexpr int kMaxDecodeSplits = 128;

// The CUDA template's knob values (templates/cuda/decode.cuh's static_asserts).
inline constexpr int kDecodeBlockMChoices[] = {16, 32};
inline constexpr int kDecodeBlockNChoices[] = {32, 64, 128, 256};
inline constexpr int kDecodeWarpChoices[] = {2, 4, 8};
inline constexpr int kDecodeStageChoices[] = {2, 3, 4};
// The splits the enumeration tries besides auto (those up to the key blocks of the problem).
inline constexpr int kDecodeSplitChoices[] = {1, 2, 4, 8, 16, 32, 64, 128};
// The CPU template's (templates/cpu/decode.hpp).
inline constexpr int kCpuDecodeBlockMChoices[] = {16, 32, 64};
inline constexpr int kCpuDecodeBlockNChoices[] = {32, 64, 128, 256};

// A paged K/V cache or per-sequence lengths: only the decode family reads them.
bool needs_decode_family(const AttentionProblem& problem);
// Why a prefill family cannot run such a problem (for check_config's message).
std::string decode_only_reason(const AttentionProblem& problem);
// Forward problems the budget enumerates the decode family for (and whose untuned default is a
// decode config): needs_decode_family, or seqlen_q <= kMaxDecodeSeqlenQ with seqlen_k >=
// kMinDecodeSeqlenK.
bool is_decode_problem(const AttentionProblem& problem);

// R = group_size * seqlen_q packed rows per (batch, kv head); tiles of block_m; key blocks of
// block_n over seqlen_k (the launch's upper bound).
int64_t decode_packed_rows(const AttentionProblem& problem);
int64_t decode_row_tiles(const AttentionConfig& config, const AttentionProblem& problem);
int64_t decode_key_blocks(const AttentionConfig& config, const AttentionProblem& problem);

// The splits a launch of `config` uses: config.splits clamped to [1, key blocks], or for auto
// (0) as many CTAs (work items) as fill the `processors` SMs (cores) with `per_processor` each
// in one wave: floor(processors * per_processor / (batch * heads_kv * row tiles)), within [1,
// min(key blocks, kMaxDecodeSplits)], then evened out so that every range has the same number of
// blocks (ceil(blocks / ceil(blocks / splits))). Depends on the problem's sizes only (never on
// device lengths): a captured graph keeps its grid.
int decode_splits(const AttentionConfig& config, const AttentionProblem& problem, int processors,
                  int per_processor);
// CUDA: the SM count and one CTA per SM, two with a paged cache (decode_config.cpp: measured).
int decode_splits(const AttentionConfig& config, const AttentionProblem& problem,
                  const DeviceSpec& device);

// ---- CUDA (templates/cuda/decode.cuh) -------------------------------------------------------

struct DecodeResources {
  int threads = 0;
  int smem_bytes = 0;  // Q tile + max(stages K/V tiles, the warps' O/m/l for their merge)
  int registers = 0;   // estimate per thread
  int copies = 0;      // 16-byte K (or V) copies per thread per block
};
DecodeResources decode_resources(const AttentionConfig& config, const AttentionProblem& problem);

// Why `config` (family Decode) is illegal for `problem` on `device` (a CUDA GPU), or ok: the
// pass and problem kind, the template's constraints, shared memory, registers.
Status check_decode_config(const AttentionConfig& config, const AttentionProblem& problem,
                           const DeviceSpec& device);
// Every legal decode config: the legal tiles, each with auto splits and each split count of
// kDecodeSplitChoices up to the problem's key blocks.
std::vector<AttentionConfig> legal_decode_configs(const AttentionProblem& problem,
                                                  const DeviceSpec& device);
// The untuned default: block_m = 16 (32 when the packed rows need more than 16), block_n = 64,
// 4 warps, the most stages that leave room for 2 CTAs per SM (else the fewest), auto splits.
Result<AttentionConfig> default_decode_config(const AttentionProblem& problem,
                                              const DeviceSpec& device);
// The budget arithmetic and the legal tiles, as `flashjit plan` prints it for decode problems.
std::string explain_decode_plan(const AttentionProblem& problem, const DeviceSpec& device);

// ---- CPU (templates/cpu/decode.hpp) ---------------------------------------------------------

// fp32 scratch of one work item: 4 * (block_m*d [Q] + 2*block_n*d [K, V] + block_m*block_n [S]
// + block_m*d [O] + 2*block_m [m, l]).
int64_t cpu_decode_scratch_bytes(const AttentionConfig& config, const AttentionProblem& problem);
Status check_cpu_decode_config(const AttentionConfig& config, const AttentionProblem& problem,
                               const CpuSpec& cpu);
std::vector<AttentionConfig> legal_cpu_decode_configs(const AttentionProblem& problem,
                                                      const CpuSpec& cpu);
// block_m = the packed rows rounded up to a choice (at most 64), block_n = 128 if legal (the
// largest legal below otherwise), auto splits (per core: 2 work items).
Result<AttentionConfig> default_cpu_decode_config(const AttentionProblem& problem,
                                                  const CpuSpec& cpu);
// CPU auto splits: 2 work items per core.
int cpu_decode_splits(const AttentionConfig& config, const AttentionProblem& problem,
                      const CpuSpec& cpu);
std::string explain_cpu_decode_plan(const AttentionProblem& problem, const CpuSpec& cpu);

}  // namespace flashjit
