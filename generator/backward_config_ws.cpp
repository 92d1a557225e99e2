#include "generator/backward_config_ws.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "generator/knobs.hpp"

namespace flashjit {

namespace {

using knobs::contains;
using knobs::illegal;
using knobs::list;

constexpr int kProducerRegisters = 40;  // WsBwdTraits::kProducerRegisters
// Registers of a consumer beyond its fp32 accumulators: descriptors, addresses, loop state.
constexpr int kRegisterAllowance = 24;

// The template's derived shape (WsBwdTraits).
struct Shape {
  int dp = 0;         // head dim padded to 64
  int consumers = 0;  // block_n / 64
  int dq_tiles = 0;   // 64 x 64 dQ tiles per step
  // One dQ tile per consumer, or (head dims up to 64 at block_m 64) one tile, each consumer
  // computing its keys' share (consumer 1 adds its share onto consumer 0's staged one).
  bool dq_split_keys() const { return dq_tiles == 1 && consumers == 2; }
  bool dq_fits() const { return dq_tiles == consumers || dq_split_keys(); }
};

Shape shape_of(const AttentionConfig& c, const AttentionProblem& p) {
  Shape s;
  s.dp = padded_head_dim(p.head_dim);
  s.consumers = std::max(1, c.block_n / 64);
  s.dq_tiles = c.block_m / 64 * (s.dp / 64);
  return s;
}

// Why the family does not take `p` at all ("" when it does).
std::string problem_not_taken(const AttentionProblem& p) {
  if (p.variant.active())
    return "attention variants and packed documents are not in the ws backward family yet (" +
           p.variant.key() + ")";
  if (p.deterministic)
    return "the problem is deterministic: the ws backward adds dQ with fp32 bulk reductions in a "
           "varying order (no -det mode yet)";
  if (p.head_dim > 128)
    return "head_dim = " + std::to_string(p.head_dim) +
           ": dK and dV of 64 keys fit a consumer's registers up to 128";
  return "";
}

Status check_template(const AttentionConfig& c, const AttentionProblem& p) {
  if (!contains(kWsBwdBlockMChoices, c.block_m))
    return illegal(c, "block_m = " + std::to_string(c.block_m) + " not in " +
                          list(kWsBwdBlockMChoices) + " (query rows per step)");
  if (!contains(kWsBwdBlockNChoices, c.block_n))
    return illegal(c, "block_n = " + std::to_string(c.block_n) + " not in " +
                          list(kWsBwdBlockNChoices) + " (two consumer warpgroups of 64 keys)");
  if (!contains(kWsBwdWarpChoices, c.warps))
    return illegal(c, "warps = " + std::to_string(c.warps) + " not in " + list(kWsBwdWarpChoices) +
                          " (a producer warpgroup and two consumers)");
  if (!contains(kWsBwdStageChoices, c.stages))
    return illegal(c,
                   "stages = " + std::to_string(c.stages) + " not in " + list(kWsBwdStageChoices));
  if (c.dq != DqMode::Atomic)
    return illegal(c, "the ws backward has no separate dQ kernel (-det): dQ by bulk reductions");
  const Shape s = shape_of(c, p);
  if (!s.dq_fits())
    return illegal(c, std::to_string(s.dq_tiles) + " dQ tile(s) of 64 x 64 per step for " +
                          std::to_string(s.consumers) +
                          " consumer warpgroups: the template has one per consumer (block_m = 64 "
                          "at head dims 65..128, block_m = 128 up to 64) or one that each computes "
                          "its keys' share of (block_m = 64 up to 64)");
  return ok_status();
}

}  // namespace

int ws_backward_dkdv_threads(const AttentionConfig& config) { return config.warps * 32; }

int ws_backward_persistent_ctas(const AttentionConfig& config, const DeviceSpec& device) {
  return config.persistent ? device.sm_count : 0;
}

int ws_backward_dkdv_smem_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  const Shape s = shape_of(c, p);
  const int kv_tile = c.block_n * s.dp * 2, q_tile = c.block_m * s.dp * 2;
  const int score_tile = c.block_n * c.block_m * 2;
  const int dq_stage = c.block_m * s.dp * 4;
  const int barriers = 8 * (4 + 2 * c.stages + (c.pingpong ? 4 : 0));
  return knobs::kSwizzleAtomAlign + 2 * kv_tile + 2 * c.stages * q_tile + 2 * score_tile +
         dq_stage + 2 * c.stages * c.block_m * 4 + barriers;
}

int ws_backward_consumer_registers(const AttentionConfig& c, const AttentionProblem& p) {
  const Shape s = shape_of(c, p);
  // dK and dV (64 keys x dp each over 128 threads: dp), S^T and dP^T (64 x block_m each, fp32:
  // block_m) while their 16-bit fragments are packed, plus the allowance. Calibrated with ptxas
  // 13.0: d 128 at block_m 64 compiles at setmaxnreg's 232 without spills (232 here); d 64 at
  // block_m 128 spills 80-100 bytes (248 here); d 64 at block_m 64 (168 here) does not. -pp
  // with -persist (the turns and the tile loop's state together) spilled 8 bytes at d 128 (240
  // here); -pp alone did not.
  const int schedule = c.pingpong && c.persistent ? 8 : 0;
  return s.dp + c.block_m + c.block_m / 4 + kRegisterAllowance + schedule;
}

int ws_backward_consumer_register_limit(const AttentionConfig& c) {
  const int threads = ws_backward_dkdv_threads(c);
  const int consumers = std::max(1, c.warps / 4 - 1);
  const int launch = 65536 / threads / 8 * 8;
  const int limit = ((1 + consumers) * launch - kProducerRegisters) / consumers / 8 * 8;
  return std::min(limit, 240);
}

std::vector<AttentionConfig> ws_backward_candidates(const AttentionProblem& problem) {
  std::vector<AttentionConfig> configs;
  if (!problem_not_taken(problem).empty()) return configs;
  knobs::for_each_tile(kWsBwdBlockMChoices, kWsBwdBlockNChoices, kWsBwdWarpChoices,
                       kWsBwdStageChoices, [&](AttentionConfig c) {
                         c.family = KernelFamily::Ws;
                         for (bool persistent : {false, true})
                           for (bool pingpong : {false, true}) {
                             c.persistent = persistent;
                             c.pingpong = pingpong;
                             configs.push_back(c);
                           }
                       });
  std::sort(configs.begin(), configs.end());
  return configs;
}

Status check_ws_backward_config(const AttentionConfig& c, const AttentionProblem& p,
                                const DeviceSpec& device) {
  if (c.family != KernelFamily::Ws)
    return illegal(c, "not a ws config (the ws backward family's budget was asked)");
  if (device.arch != 90)
    return illegal(c, "ws kernels need sm90 (H100/H200: wgmma, TMA, setmaxnreg); this device is " +
                          device.arch_name());
  if (Status dtype = check_cuda_dtype(p.dtype); !dtype.ok())
    return illegal(c, dtype.error().message);
  if (const std::string why = problem_not_taken(p); !why.empty())
    return illegal(c, why, ErrorCode::Unsupported);
  FLASHJIT_TRY(check_template(c, p));
  FLASHJIT_TRY(knobs::check_threads(c, ws_backward_dkdv_threads(c), device));
  FLASHJIT_TRY(knobs::check_memory(c, "shared memory", ws_backward_dkdv_smem_bytes(c, p), device));
  const int regs = ws_backward_consumer_registers(c, p);
  const int limit = std::min(ws_backward_consumer_register_limit(c), device.max_regs_per_thread);
  if (regs > limit)
    return illegal(c, "consumer warpgroups: estimated " + std::to_string(regs) +
                          " registers per thread exceed the " + std::to_string(limit) +
                          " setmaxnreg gives them");
  return ok_status();
}

Result<AttentionConfig> default_ws_backward_config(const AttentionProblem& p,
                                                   const DeviceSpec& device) {
  AttentionConfig preferred{64, 128, 12, 2, KernelFamily::Ws, DqMode::Atomic};
  preferred.persistent = p.causal;
  const Status legal = check_ws_backward_config(preferred, p, device);
  if (!legal.ok()) return legal.error();
  return preferred;
}

std::string explain_ws_backward_plan(const AttentionProblem& p, const DeviceSpec& device) {
  std::ostringstream out;
  const int dp = padded_head_dim(p.head_dim);
  out << "ws family (sm_90a; one fused kernel for dK, dV and dQ, FlashAttention-3's shape,\n"
         "templates/cuda/ws/attention_bwd_ws.cuh):\n"
      << "  producer warp: K, V once (TMA), then Q, dO (TMA) and lse, delta per step through a\n"
      << "  stages-deep mbarrier pipeline; two consumer warpgroups of 64 keys (setmaxnreg): S^T,\n"
      << "  dP^T, dV += P^T dO, dK += dS^T Q, dQ tiles = dS K; a dQ-writer warp bulk-adds the\n"
      << "  staged dQ rows into the fp32 workspace. -persist: one CTA per SM walks the key tiles\n"
      << "  (heaviest first when causal). -pp: the consumers take turns issuing S^T and dP^T and\n"
      << "  announce their dS^T rows by mbarriers instead of meeting each step, so that one's\n"
      << "  softmax runs under the other's products.\n"
      << "  smem = 1024 + 2 * 128 * " << dp << " * 2 (K, V) + 2 * stages * Br * " << dp
      << " * 2 (Q, dO) + 2 * 128 * Br * 2 (dS^T x2)\n"
      << "         + Br * " << dp * 4 << " (dQ rows staged) + 2 * stages * Br * 4 (lse, delta)"
      << " + barriers   <= " << device.smem_per_block_optin << " B\n"
      << "  regs (consumer) ~= " << dp << " (dK, dV) + Br + Br / 4 (S^T, dP^T, fragments) + "
      << kRegisterAllowance << "   <= setmaxnreg's share\n";
  if (const std::string why = problem_not_taken(p); !why.empty()) {
    out << "  Not for this problem: " << why << "\n\n";
    return out.str();
  }
  out << "\nconfig                 threads   smem  regs~  limit  status\n";
  for (const AttentionConfig& c : ws_backward_candidates(p)) {
    const Status status = check_ws_backward_config(c, p, device);
    std::string why = status.ok() ? "legal" : status.error().message;
    const std::string prefix = "config " + c.to_string() + ": ";
    if (why.rfind(prefix, 0) == 0) why = "illegal: " + why.substr(prefix.size());
    char line[512];
    std::snprintf(line, sizeof line, "%-22s %7d %6d %6d %6d  %s\n", c.to_string().c_str(),
                  ws_backward_dkdv_threads(c), ws_backward_dkdv_smem_bytes(c, p),
                  ws_backward_consumer_registers(c, p), ws_backward_consumer_register_limit(c),
                  why.c_str());
    out << line;
  }
  if (Result<AttentionConfig> def = default_ws_backward_config(p, device); def.ok())
    out << "Proposed ws default: " << def->to_string() << "\n";
  out << "\n";
  return out.str();
}

}  // namespace flashjit
