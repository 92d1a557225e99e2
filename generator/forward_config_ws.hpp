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

// Every point of the knob space (family Ws, warps = block_m / 16 + 4), in AttentionConfig's
// order; filter it with check_ws_config.
std::vector<AttentionConfig> ws_candidates();

// Why `config` (family Ws) is illegal for the forward of `problem` on `device`, or ok: the
// architecture (sm90 only), the template's constraints, threads, shared memory, then the
// consumers' registers after setmaxnreg.
Status check_ws_config(const AttentionConfig& config, const AttentionProblem& problem,
                       const DeviceSpec& device);

// The family's untuned tile per head dim (FlashAttention-3's choices within this knob space):
//   d <= 64   m192n128w16s2-ws   three consumer warpgroups
//   d <= 128  m128n128w12s2-ws   two
//   d <= 256  m128n64w12s2-ws    two (S and P of 128 keys do not fit beside O)
// else the first legal config. Error when no -ws config is legal (not sm90).
Result<AttentionConfig> default_ws_config(const AttentionProblem& problem,
                                          const DeviceSpec& device);

// The family's budget arithmetic and candidate table, for `flashjit plan` on sm90.
std::string explain_ws_plan(const AttentionProblem& problem, const DeviceSpec& device);

}  // namespace flashjit
