#include "generator/forward_config_ws.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "generator/knobs.hpp"
// attention_common.h (the kernels' key ranges) needs the params struct first.
// clang-format off
#include "templates/attention_params.h"
#include "templates/attention_common.h"
// clang-format on

namespace flashjit {

namespace {

using knobs::contains;
using knobs::illegal;
using knobs::list;

constexpr int kRegistersPerSm = 65536;  // sm90; setmaxnreg moves registers within this
constexpr int kProducerRegisters = 24;  // the least setmaxnreg allows: one thread issues TMA
constexpr int kMaxConsumerRegisters = 240;
// Registers a consumer thread needs beyond its fp32 O and S accumulators and its P fragments:
// descriptors, pipeline states, softmax state, addresses.
constexpr int kRegisterAllowance = 32;

// WsTraits' static_asserts, in its words.
Status check_template(const AttentionConfig& c, const AttentionProblem& p) {
  if (!contains(kWsBlockMChoices, c.block_m))
    return illegal(c, "block_m = " + std::to_string(c.block_m) + " not in " +
                          list(kWsBlockMChoices) + " (64 rows per consumer warpgroup)");
  if (!contains(kWsBlockNChoices, c.block_n))
    return illegal(c,
                   "block_n = " + std::to_string(c.block_n) + " not in " + list(kWsBlockNChoices));
  if (c.warps != c.block_m / 16 + 4)
    return illegal(
        c, "warps = " + std::to_string(c.warps) +
               ": the -ws family has block_m / 16 + 4 = " + std::to_string(c.block_m / 16 + 4) +
               " (a producer warpgroup and one consumer warpgroup per 64 rows)");
  if (!contains(kWsStageChoices, c.stages))
    return illegal(c, "stages = " + std::to_string(c.stages) + " not in " + list(kWsStageChoices));
  if (c.pingpong && c.block_m < 128)
    return illegal(c, "ping-pong (-pp) takes turns between 2 or 3 consumer warpgroups; block_m = " +
                          std::to_string(c.block_m) + " has one");
  if (p.head_dim % 8 != 0 || p.head_dim > 256)
    return illegal(c, "head_dim = " + std::to_string(p.head_dim) + ": a multiple of 8 up to 256");
  return ok_status();
}

}  // namespace

WsResources ws_resources(const AttentionConfig& c, const AttentionProblem& p) {
  WsResources r;
  const int dp = padded_head_dim(p.head_dim);
  r.consumers = std::max(1, c.block_m / 64);
  r.threads = 128 * (1 + r.consumers);
  r.ctas_per_sm = r.consumers == 1 ? 2 : 1;
  const int barriers = 2 + 4 * c.stages;
  r.smem_bytes = knobs::kSwizzleAtomAlign + c.block_m * dp * 2 + 2 * c.stages * c.block_n * dp * 2 +
                 8 * barriers;
  r.launch_registers = kRegistersPerSm / (r.ctas_per_sm * r.threads) / 8 * 8;
  r.producer_registers = kProducerRegisters;
  r.consumer_registers =
      std::min(kMaxConsumerRegisters,
               ((1 + r.consumers) * r.launch_registers - kProducerRegisters) / r.consumers / 8 * 8);
  // O (64 x dp fp32 over 128 threads), S (64 x block_n fp32), P (64 x block_n 16-bit).
  r.consumer_estimate =
      dp / 2 + c.block_n / 2 + c.block_n / 4 + kRegisterAllowance + user_expression_registers(p);
  return r;
}

std::vector<AttentionConfig> ws_candidates() {
  std::vector<AttentionConfig> configs;
  for (int block_m : kWsBlockMChoices)
    for (int block_n : kWsBlockNChoices)
      for (int stages : kWsStageChoices)
        for (bool pingpong : {false, true})
          for (bool persistent : {false, true}) {
            AttentionConfig c{block_m, block_n, block_m / 16 + 4, stages, KernelFamily::Ws};
            c.pingpong = pingpong;
            c.persistent = persistent;
            configs.push_back(c);
          }
  return configs;
}

int ws_persistent_ctas(const AttentionConfig& c, const AttentionProblem& p,
                       const DeviceSpec& device) {
  return device.sm_count * std::max(1, resource_use(c, p, device).ctas_per_sm);
}

Status check_ws_config(const AttentionConfig& c, const AttentionProblem& p,
                       const DeviceSpec& device) {
  if (c.family != KernelFamily::Ws)
    return illegal(c, "not a -ws config (the -ws family's budget was asked)");
  if (device.arch != 90)
    return illegal(c,
                   "-ws kernels (TMA, wgmma, setmaxnreg) need sm90 (H100/H200); this device is " +
                       device.arch_name());
  FLASHJIT_TRY(check_template(c, p));
  const WsResources r = ws_resources(c, p);
  FLASHJIT_TRY(knobs::check_threads(c, r.threads, device));
  FLASHJIT_TRY(knobs::check_memory(c, "shared memory", r.smem_bytes, device));
  if (r.consumer_estimate > std::min(r.consumer_registers, device.max_regs_per_thread))
    return illegal(c, "a consumer thread needs ~" + std::to_string(r.consumer_estimate) +
                          " registers; setmaxnreg gives it " +
                          std::to_string(r.consumer_registers) + " (" +
                          std::to_string(r.consumers) + " consumer warpgroup(s), " +
                          std::to_string(r.launch_registers) + " per thread at launch)");
  if (r.launch_registers * r.threads > device.regs_per_sm)
    return illegal(c, std::to_string(r.launch_registers * r.threads) +
                          " registers per CTA exceed the SM's " +
                          std::to_string(device.regs_per_sm));
  return ok_status();
}

Result<AttentionConfig> default_ws_config(const AttentionProblem& p, const DeviceSpec& device) {
  const int dp = padded_head_dim(p.head_dim);
  AttentionConfig preferred{192, 128, 16, 2, KernelFamily::Ws};
  if (dp > 64) preferred = {128, 128, 12, 2, KernelFamily::Ws};
  if (dp > 128) preferred = {128, 64, 12, 2, KernelFamily::Ws};
  if (check_ws_config(preferred, p, device).ok()) return preferred;
  for (const AttentionConfig& c : ws_candidates())
    if (check_ws_config(c, p, device).ok()) return c;
  return make_error(ErrorCode::Unsupported,
                    "no legal -ws config for head_dim = " + std::to_string(p.head_dim) + " on " +
                        device.name + " (sm90 only)");
}

double mean_key_blocks(const AttentionConfig& c, const AttentionProblem& p) {
  FlashjitAttentionParams params{};
  params.seqlen_q = static_cast<int>(p.seqlen_q);
  params.seqlen_k = static_cast<int>(p.seqlen_k);
  const int diagonal = flashjit_attention::diagonal(params);
  const int m_blocks = static_cast<int>((p.seqlen_q + c.block_m - 1) / c.block_m);
  long long blocks = 0;
  for (int m = 0; m < m_blocks; ++m)
    blocks += p.causal ? flashjit_attention::key_blocks<true>(params, diagonal, m * c.block_m,
                                                              c.block_m, c.block_n)
                       : flashjit_attention::key_blocks<false>(params, diagonal, m * c.block_m,
                                                               c.block_m, c.block_n);
  return m_blocks > 0 ? static_cast<double>(blocks) / m_blocks : 0.0;
}

bool ws_is_default(const AttentionConfig& ws, const AttentionProblem& p) {
  return padded_head_dim(p.head_dim) > 64 || mean_key_blocks(ws, p) >= kWsMinMeanKeyBlocksD64;
}

std::string explain_ws_plan(const AttentionProblem& p, const DeviceSpec& device) {
  std::ostringstream out;
  const int dp = padded_head_dim(p.head_dim);
  out << "-ws family (sm_90a, FlashAttention-3's shape: a producer warpgroup loads Q, K, V with "
         "TMA into mbarrier pipelines; 64 query rows per consumer warpgroup; setmaxnreg moves "
         "registers from the producer to the consumers; templates/cuda/ws/):\n"
      << "  smem  = 1024 + Br * " << dp << " * 2 (Q, then O) + 2 * stages * Bc * " << dp
      << " * 2 (K, V) + 8 * (2 + 4 * stages) (mbarriers)   <= " << device.smem_per_block_optin
      << " B\n"
      << "  regs: launch = 65536 / (CTAs/SM * threads) (2 CTAs/SM with one consumer warpgroup); "
         "the producer drops to "
      << kProducerRegisters << ", the consumers take the rest (at most " << kMaxConsumerRegisters
      << ")\n"
      << "  consumer needs ~" << dp / 2 << " (O) + Bc / 2 (S) + Bc / 4 (P) + " << kRegisterAllowance
      << "\n\n";
  out << "  schedule: each legal tile also as -pp (consumers take turns at the tensor cores; 2 or "
         "3 "
         "consumers), -persist (a grid of "
      << device.sm_count << " SMs x the CTAs that fit, walking the tiles"
      << (p.causal ? ", heaviest first" : "") << ") and -pp-persist: same budget\n\n";
  out << "config              threads  smem(B)  launch  consumer  need  status\n";
  for (const AttentionConfig& c : ws_candidates()) {
    if (c.pingpong || c.persistent) continue;  // the same budget as the tile's
    const Status status = check_ws_config(c, p, device);
    const WsResources r = ws_resources(c, p);
    std::string why = status.ok() ? "legal" : status.error().message;
    const std::string prefix = "config " + c.to_string() + ": ";
    if (why.rfind(prefix, 0) == 0) why = "illegal: " + why.substr(prefix.size());
    char line[512];
    std::snprintf(line, sizeof line, "%-19s %7d %8d %7d %9d %5d  %s\n", c.to_string().c_str(),
                  r.threads, r.smem_bytes, r.launch_registers, r.consumer_registers,
                  r.consumer_estimate, why.c_str());
    out << line;
  }
  if (Result<AttentionConfig> def = default_ws_config(p, device); def.ok()) {
    char blocks[64];
    std::snprintf(blocks, sizeof blocks, "%.1f", mean_key_blocks(*def, p));
    out << "-ws tile: " << def->to_string() << " (" << blocks
        << " key blocks per tile on average); "
        << (ws_is_default(*def, p) ? "sm90's default" : "not the default")
        << (dp > 64 ? " (padded head dim > 64: -ws at any size)\n"
                    : " (padded head dim 64: -ws from " +
                          std::to_string(static_cast<int>(kWsMinMeanKeyBlocksD64)) +
                          " key blocks per tile)\n");
  } else
    out << def.error().message << "\n";
  return out.str();
}

}  // namespace flashjit
