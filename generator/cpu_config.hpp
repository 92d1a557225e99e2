// The CPU template's config space and cache budget (pure: no I/O; the runtime reads the machine's
// CpuSpec from sysfs and /proc/cpuinfo, runtime/cpu/cpu_info.hpp).
//
// On the CPU one work item (batch, head, block_m query rows) runs on one core, and its caches play
// the role of shared memory: the fp32 scratch of a work item must fit the core's L2, and the K/V
// block (the part re-read for every query row tile) should fit L1d. AttentionConfig is reused:
// block_m and block_n mean what they mean on the GPU; warps and stages have no meaning on the CPU
// and must be 1 (printed as "m64n64w1s1").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

struct CpuSpec {
  std::string model;      // "AMD EPYC 9B45", from /proc/cpuinfo "model name"
  int cores = 1;          // online logical CPUs the thread pool uses
  int64_t l1d_bytes = 0;  // per core
  int64_t l2_bytes = 0;   // per core
  int64_t l3_bytes = 0;   // shared; 0 when there is none
  bool avx2 = false;
  bool avx512f = false;
  bool avx512bf16 = false;  // vdpbf16ps: the CPU template's bf16 dot products
  bool fma = false;
  bool f16c = false;

  // "avx512f avx512bf16 avx2 fma f16c" (present features only; "baseline" when none).
  std::string isa() const;
  // "AMD EPYC (2 cores, L1d 48 KiB, L2 1024 KiB, L3 32768 KiB, avx512f avx2 fma f16c)"
  std::string to_string() const;
};

// A representative x86-64 core (4 cores, 32 KiB L1d, 1 MiB L2, 32 MiB L3, AVX2 + FMA), for tests
// and for `flashjit plan --arch cpu` when the machine cannot be read.
CpuSpec known_cpu();

// A CPU with no cache limits to speak of, for checking a config against its template's own
// constraints alone (the renderers' checks; knobs::unlimited_device for the GPUs).
CpuSpec unlimited_cpu();

// The DeviceSpec a CPU backend reports (device()): name = model, arch = 0, sm_count = cores,
// smem_per_block_optin = smem_per_sm = L2 (the per-work-item budget), regs and threads unused
// (1), l2_bytes = the last-level cache (L3, else L2: what the tuner rotates its inputs past).
DeviceSpec cpu_device_spec(const CpuSpec& cpu);

// Block sizes the CPU template accepts (multiples of its 16 query lanes and 16-key tiles).
inline constexpr int kCpuBlockMChoices[] = {16, 32, 64, 128};
inline constexpr int kCpuBlockNChoices[] = {32, 64, 128, 256};

// fp32 scratch of one work item, in bytes:
//   4 * (block_m*d [Q^T] + 2*block_n*d [K, V] + block_m*block_n [S^T] + block_m*d [O^T]
//        + 3*block_m [row max, row sum, rescale])
int64_t cpu_working_set_bytes(const AttentionConfig& config, const AttentionProblem& problem);
// The K and V blocks in fp32: 8 * block_n * d bytes.
int64_t cpu_kv_block_bytes(const AttentionConfig& config, const AttentionProblem& problem);
// The S^T (then P^T) block in fp32: 4 * block_m * block_n bytes. P V sweeps it once per tile of
// head dims, so the default keeps it within half the L1d.
int64_t cpu_score_block_bytes(const AttentionConfig& config);

// The default block_m of the forward and block_n of the backward: 64 queries (keys), one register
// tile of 4 x 16 lanes with AVX-512 and 4 of 16 with AVX2, each packed K/V element (Q/dO row)
// used by 4 * 64 FLOPs of the tiles.
inline constexpr int kCpuTileQueries = 64;

// The host's register file as the CPU templates use it (templates/cpu/common.hpp picks the same
// from the compiler's target macros): 32 vector registers of 16 fp32 lanes with AVX-512, 16 of 8
// with AVX2, 16 of 4 otherwise (SSE).
int cpu_vector_registers(const CpuSpec& cpu);
int cpu_vector_lanes(const CpuSpec& cpu);
// The queries of one register tile (the lanes of its accumulators): 64 with AVX-512 (4 zmm x 4
// keys or head dims, 16 accumulators), 16 with AVX2 (2 ymm x 6 keys or dims, 12 ymm
// accumulators: the 6 x 16 tile of an AVX2 GEMM kernel, + 2 + 1 operands), 16 with SSE (4 xmm x
// 2).
int cpu_tile_queries(const CpuSpec& cpu);
// The forward's smallest tuning candidate block_m: each packed K/V element feeds 4 * block_m
// FLOPs of the tiles, so block_m = 16 (a whole AVX2 tile) spends as much on packing as on ~4
// FLOPs per element; 32 and up.
inline constexpr int kCpuMinCandidateBlockM = 32;
// Whether the forward `config` is a tuning candidate on `cpu` (legal_cpu_configs): block_m >=
// kCpuMinCandidateBlockM and the S^T block (cpu_score_block_bytes) within the L1d (P V sweeps it
// once per tile of head dims). check_cpu_config accepts the others too.
bool cpu_forward_candidate(const AttentionConfig& config, const CpuSpec& cpu);

// ---- the backward pass (problem.pass == Backward; templates/cpu/attention_bwd.hpp) ----------
//
// Three phases over the thread pool: a preprocess (D = rowsum(dO * O), lse in log2 units), then
// the dK/dV work items (K^T, V^T and the dK^T, dV^T accumulators of a block of block_n keys stay
// in the core's caches while Q and dO stream past in blocks of block_m rows, over every query
// head of the GQA group), then the dQ work items (batch, head, block_m queries). The knob
// AttentionConfig::dq picks how dQ is made; neither way uses atomics, both are bitwise
// reproducible (the order of every sum is fixed), so both serve deterministic problems too:
//   DqMode::Separate ("-det")  a dK/dV work item per (batch, kv head, key block); the dQ work
//       item keeps Q^T, dO^T and dQ^T while K and V stream past, recomputing S and dP: 7 matrix
//       products where the FLOP convention counts 5.
//   DqMode::Atomic (no suffix; "atomic" names the GPU's way, not this one's)  the fused dQ: a
//       dK/dV work item per (batch, kv head, split): the key blocks split, split + splits, ...
//       of that pair, adding dQ_i += dS K_j for every query block it meets into its own fp32
//       copy of the workspace's dQ accumulator (it owns every row there); the dQ work item sums
//       the copies in order. 5 products. The split count is the launcher's
//       (cpu_backward_dq_splits): 1 when batch x heads_kv keeps every core busy, more where it
//       does not, so the fused dQ suits every problem size; the workspace holds one
//       accumulator per split (4 bytes per dQ element each).

// The backward template's block sizes: block_m divides the workspace rows' padding of 128 (whole
// blocks of delta and lse_log2); 16 is left out (the dQ work item's lanes are its block_m
// queries: 16 fill one vector, a quarter of an AVX-512 register tile), and so is block_n = 256
// (the dK/dV item's two score blocks, 8 * block_m * 256 bytes, fit no L1d).
inline constexpr int kCpuBackwardBlockMChoices[] = {32, 64, 128};
inline constexpr int kCpuBackwardBlockNChoices[] = {32, 64, 128};

// fp32 working set of one dK/dV work item, in bytes:
//   4 * (4*block_n*d [K^T, V^T, dK^T, dV^T] + 2*block_m*d [Q, dO] + 2*block_m*block_n [S/P, dP/dS])
// and for the fused dQ (DqMode::Atomic) 4 * (block_n*dl [K] + block_m*dr [the dQ_i rows of the
// accumulator]) more, dl = d rounded up to 16 (the product's lanes), dr = d rounded up to 64 (the
// accumulator's rows).
int64_t cpu_backward_dkdv_bytes(const AttentionConfig& config, const AttentionProblem& problem);
// fp32 scratch of one dQ work item, in bytes:
//   4 * (3*block_m*d [Q^T, dO^T, dQ^T] + 2*block_n*d [K, V] + 2*block_n*block_m [S^T, dP^T/dS^T])
// for DqMode::Separate; 0 for the fused dQ (its dQ work item only sums the accumulators).
int64_t cpu_backward_dq_bytes(const AttentionConfig& config, const AttentionProblem& problem);
// The larger of the two: what one core's L2 must hold (each phase allocates its own).
int64_t cpu_backward_working_set_bytes(const AttentionConfig& config,
                                       const AttentionProblem& problem);
// The two score blocks of a dK/dV work item (S then P, dP then dS), 8 * block_m * block_n bytes:
// the dV and dK products sweep them once per tile of head dims, so the default keeps them within
// the L1d.
int64_t cpu_backward_score_bytes(const AttentionConfig& config);

// The scratch a work item of `config` allocates per thread (the forward's, or the larger of the
// backward's two phases), by the problem's pass.
int64_t cpu_scratch_bytes(const AttentionConfig& config, const AttentionProblem& problem);

// The fused dQ's split count for `threads` cores (the launcher's choice; 1 for DqMode::Separate):
// with p = batch * heads_kv pairs, enough splits for kCpuBackwardItemsPerThread dK/dV work items
// per thread, ceil(4 * threads / p) (1 when p is that many already), at most
// ceil(seqlen_k / block_n), the key blocks to split. The pool hands the items out as threads
// free up, so that a core slowed by other load (a shared host) leaves a tail of at most ~1/4 of
// its share, where one item per thread would leave all of it. A split costs a copy of the
// group's dQ accumulator rows (zeroed, then read by the dQ items): ~8 bytes per dQ element
// against ~10 d FLOPs per (query, key) pair.
inline constexpr int kCpuBackwardItemsPerThread = 4;
int cpu_backward_dq_splits(const AttentionConfig& config, const AttentionProblem& problem,
                           int threads);

// Why `config` is illegal for the CPU template (knob values, then the L2 budget), or ok. Either
// pass (problem.pass); the backward takes either DqMode, the forward DqMode::Atomic (unprinted).
Status check_cpu_config(const AttentionConfig& config, const AttentionProblem& problem,
                        const CpuSpec& cpu);
// The legal configs (the tuner's candidates), block_m then block_n ascending. Forward: those
// cpu_forward_candidate keeps (9 of 16 with a 32 KiB L1d). Backward: per block
// pair the fused dQ, or -det where the fused one does not fit the L2 (check_cpu_config accepts
// -det for every block pair that fits: 7 products instead of 5, slower wherever both fit, so
// not a candidate; docs/PERFORMANCE.md).
std::vector<AttentionConfig> legal_cpu_configs(const AttentionProblem& problem, const CpuSpec& cpu);
// The untuned default: block_m = kCpuTileQueries (one register tile of queries, every column of
// Q^T reused over whole key blocks); block_n = the largest with the S^T block within half the L1d:
// (L1d / 2) / (4 block_m). Each rounded down to the largest legal choice (block_m first; the
// smallest if none is below). Error only if no config fits. (FlashAttention's GPU formula with
// the L2 as SRAM gave m128n256 at d = 128, 2x slower than this on a Zen 5 core.)
//
// Backward: block_n = kCpuTileQueries (the dK/dV work item's lanes are its keys: one register
// tile of 4 vectors x 16 keys); block_m = the largest with both score blocks within the L1d:
// L1d / (8 block_n). Each rounded down as for the forward (block_n first); the fused dQ where it
// fits the L2, else -det (whichever legal_cpu_configs lists for the pair).
Result<AttentionConfig> default_cpu_config(const AttentionProblem& problem, const CpuSpec& cpu);
// The budget arithmetic and the legal set, as `flashjit plan --backend cpu` prints it (either
// pass).
std::string explain_cpu_plan(const AttentionProblem& problem, const CpuSpec& cpu);

}  // namespace flashjit
