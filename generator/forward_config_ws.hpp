// The warp-specialized Hopper forward (sm_90a: H100, H200; configs "-ws",
// templates/cuda/ws/): its knob space, the legality rules (the template's static_asserts, shared
// memory, registers after setmaxnreg), its launch shape, its default and its part of
// `flashjit plan`. generator/config.cpp dispatches here for configs with family ==
// KernelFamily::Ws. Every number mirrors WsTraits (templates/cuda/ws/traits.cuh).
//
// The knobs, for this family:
//   block_m  query rows per CTA: 64 per consumer warpgroup (1, 2 or 3 of them)
//   block_n  keys per K/V block: S = Q K^T is one m64n<block_n> wgmma per 16 head-dim columns
//   warps    4 (the producer warpgroup) + 4 per consumer warpgroup: block_m / 16 + 4
//   stages   depth of the K and of the V pipeline (TMA loads in flight ahead of the consumers)
// and the schedule (templates/cuda/ws/pingpong.cuh, tile_scheduler.cuh), each on or off:
//   pingpong    "-pp": the consumer warpgroups take turns issuing their GEMMs (2 or 3 of them)
//   persistent  "-persist": a grid of one CTA per SM slot (ws_persistent_ctas) walks the tiles,
//               heaviest first when causal
// Both change neither shared memory nor registers: every legal tile is legal with each
// schedule it can run (ping-pong needs two consumers).
#pragma once

#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

// Values the template accepts for each knob (the enumeration's search space).
inline constexpr int kWsBlockMChoices[] = {64, 128, 192};
inline constexpr int kWsBlockNChoices[] = {64, 128};
inline constexpr int kWsStageChoices[] = {2, 3, 4};

// What one CTA of a -ws config uses.
struct WsResources {
  int consumers = 0;         // consumer warpgroups: block_m / 64
  int threads = 0;           // 128 * (1 + consumers)
  int ctas_per_sm = 0;       // what the launch bounds ask for: 2 with one consumer, else 1
  int smem_bytes = 0;        // dynamic shared memory: 1024 + Q + 2 * stages * K/V tiles + mbarriers
  int launch_registers = 0;  // per thread at launch: 65536 / (ctas_per_sm * threads), to 8
  int producer_registers = 0;  // after setmaxnreg.dec
  int consumer_registers = 0;  // after setmaxnreg.inc: what the producer gives back, at most 240
  int consumer_estimate = 0;   // registers a consumer thread needs at the least
};

WsResources ws_resources(const AttentionConfig& config, const AttentionProblem& problem);

// Every point of the knob space (family Ws, warps = block_m / 16 + 4, each tile in each schedule:
// plain, -pp, -persist, -pp-persist), in AttentionConfig's order; filter it with
// check_ws_config.
std::vector<AttentionConfig> ws_candidates();

// The grid of a persistent config (runtime: KernelShape::persistent_ctas): one CTA per SM slot,
// the device's SMs times the CTAs of this config that fit on one (resource_use); at most the
// tiles (the launch caps it there).
int ws_persistent_ctas(const AttentionConfig& config, const AttentionProblem& problem,
                       const DeviceSpec& device);

// Why `config` (family Ws) is illegal for the forward of `problem` on `device`, or ok: the
// architecture (sm90 only), the template's constraints (ping-pong: 2 or 3 consumers), threads,
// shared memory, then the consumers' registers after setmaxnreg.
Status check_ws_config(const AttentionConfig& config, const AttentionProblem& problem,
                       const DeviceSpec& device);

// The family's untuned tile per head dim (FlashAttention-3's choices within this knob space):
//   d <= 64   m192n128w16s2-ws   three consumer warpgroups
//   d <= 128  m128n128w12s2-ws   two
//   d <= 256  m128n64w12s2-ws    two (S and P of 128 keys do not fit beside O)
// no ping-pong, one CTA per tile (the schedule measured on an H100; the tuner weighs the
// others); else the first legal config. Error when no -ws config is legal (not sm90).
Result<AttentionConfig> default_ws_config(const AttentionProblem& problem,
                                          const DeviceSpec& device);

// Key blocks (block_n keys each) the average query tile of `config` computes for `problem`:
// attention_common.h's key_blocks over every query block of block_m rows (causal tiles near the
// top see fewer keys, tiles above a seqlen_q > seqlen_k diagonal none).
double mean_key_blocks(const AttentionConfig& config, const AttentionProblem& problem);

// sm90's untuned default is the -ws tile wherever it measured faster than the wgmma family's
// default (H100, bf16, 36 shapes, docs/PERFORMANCE.md "Stage 1 measured"):
//   padded head dim > 64  always (1.15x-1.54x at every shape, N 512 to 16k, causal or not);
//   padded head dim 64    when the average tile computes at least kWsMinMeanKeyBlocksD64 key
//                         blocks: there the softmax is half the work per block that it is at
//                         d = 128, so the parts of a tile no overlap covers (Q and first K
//                         waits, the peeled first S and last P V, the epilogue) weigh ~1/n.
//                         Measured: 4 and 5.3 blocks (N 512, causal 1024) 0.96x and 0.83x;
//                         8 and 9.2 (N 1024, causal 2048) 1.05x and 1.02x; 16 and more
//                         1.12x-1.33x.
inline constexpr double kWsMinMeanKeyBlocksD64 = 8;
// Whether `ws` (a -ws config, default_ws_config's) is sm90's default for `problem` by that rule.
bool ws_is_default(const AttentionConfig& ws, const AttentionProblem& problem);

// The family's budget arithmetic and candidate table, for `flashjit plan` on sm90.
std::string explain_ws_plan(const AttentionProblem& problem, const DeviceSpec& device);

}  // namespace flashjit
