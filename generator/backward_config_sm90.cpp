#include "generator/backward_config_sm90.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "generator/knobs.hpp"

namespace flashjit {

namespace {

// Registers beyond the fp32 accumulators: tile addresses, descriptors, loop state, lse/delta.
// Calibrated against ptxas (CUDA 13.0): the legal set compiles at <= 255 registers with no
// spills, and the shapes this rejects spill hundreds of bytes or serialize their wgmmas
// (docs/perf/backward-sm90-notes.md has the table).
constexpr int kRegisterAllowance = 16;

using knobs::contains;
using knobs::illegal;
using knobs::list;

// The template's derived shape (Sm90BwdTraits in templates/cuda/attention_bwd_sm90.cuh).
struct Shape {
  int dp = 0;                   // head dim padded to 64
  int warpgroups = 0;           // of the dK/dV kernel
  int key_tiles = 0;            // 64-key row tiles of S^T: block_n / 64
  int query_split = 0;          // warpgroups sharing one key tile
  int sdp_n = 0;                // S^T columns per warpgroup: block_m / query_split
  int kv_cols = 0;              // dK/dV columns per warpgroup: dp / query_split
  int dq_n = 0;                 // columns of one Atomic dQ tile
  int dq_tiles = 0;             // Atomic dQ tiles per step: block_m / 64 x dp / dq_n
  bool scores_in_smem = false;  // P^T (and dS^T) through shared memory: query_split == 2
};

// Columns of one Atomic dQ tile at padded head dim `dp` (the template's kDqN).
int dq_tile_columns(int dp) { return dp % 128 == 0 && dp >= 256 ? 128 : 64; }

Shape shape_of(const AttentionConfig& c, const AttentionProblem& p) {
  Shape s;
  s.dp = padded_head_dim(p.head_dim);
  s.warpgroups = std::max(1, c.warps / 4);
  s.key_tiles = std::max(1, c.block_n / 64);
  s.query_split = std::max(1, s.warpgroups / s.key_tiles);
  s.sdp_n = c.block_m / s.query_split;
  s.kv_cols = s.dp / s.query_split;
  s.dq_n = dq_tile_columns(s.dp);
  s.dq_tiles = c.block_m / 64 * (s.dp / s.dq_n);
  s.scores_in_smem = s.query_split != 1;
  return s;
}

// The template's static_asserts, in its words.
Status check_template(const AttentionConfig& c, const AttentionProblem& p) {
  FLASHJIT_TRY(knobs::check_choice(c, "block_m", c.block_m, kWgmmaBwdBlockMChoices,
                                   " (query rows per step)"));
  FLASHJIT_TRY(
      knobs::check_choice(c, "block_n", c.block_n, kWgmmaBwdBlockNChoices, " (keys per CTA)"));
  FLASHJIT_TRY(
      knobs::check_choice(c, "warps", c.warps, kWgmmaBwdWarpChoices, " (one or two warpgroups)"));
  FLASHJIT_TRY(knobs::check_choice(c, "stages", c.stages, kWgmmaBwdStageChoices));
  const Shape s = shape_of(c, p);
  if (s.warpgroups % s.key_tiles != 0 || s.query_split > 2)
    return illegal(c, "block_n = " + std::to_string(c.block_n) + " with " +
                          std::to_string(s.warpgroups) +
                          " warpgroup(s): the template has 64 keys per warpgroup (block_n = 64 "
                          "* warps / 4) or 64 keys shared by two warpgroups");
  if (s.kv_cols % 64 != 0)
    return illegal(c, "two warpgroups sharing 64 keys split dK/dV's " + std::to_string(s.dp) +
                          " head-dim columns into whole 64-column blocks: padded head dim must "
                          "be a multiple of 128");
  if (c.dq == DqMode::Atomic && s.dq_tiles % s.warpgroups != 0)
    return illegal(c, std::to_string(s.dq_tiles) + " dQ tile(s) of 64 x " + std::to_string(s.dq_n) +
                          " per step do not split over " + std::to_string(s.warpgroups) +
                          " warpgroups");
  return ok_status();
}

}  // namespace

int wgmma_backward_dkdv_threads(const AttentionConfig& config) { return config.warps * 32; }

int wgmma_backward_dq_threads(const AttentionConfig& config) {
  return 128 * std::max(1, config.block_m / 64);
}

int wgmma_backward_dkdv_smem_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  const Shape s = shape_of(c, p);
  const int kv_tile = c.block_n * s.dp * 2, q_tile = c.block_m * s.dp * 2;
  const int score_tile = c.block_n * c.block_m * 2;
  const bool ds_in_smem = c.dq == DqMode::Atomic || s.scores_in_smem;
  // Atomic: the dQ tiles staged for the bulk reductions, rows padded by 32 bytes.
  const int dq_stage = c.dq == DqMode::Atomic ? s.dq_tiles * 64 * (s.dq_n * 4 + 32) : 0;
  return knobs::kSwizzleAtomAlign + 2 * kv_tile + 2 * c.stages * q_tile +
         (ds_in_smem ? score_tile : 0) + (s.scores_in_smem ? score_tile : 0) +
         2 * c.stages * c.block_m * 4 + dq_stage;
}

int wgmma_backward_dq_smem_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  const int dp = padded_head_dim(p.head_dim);
  return knobs::kSwizzleAtomAlign + 2 * c.block_m * dp * 2 + 2 * c.stages * c.block_n * dp * 2;
}

int wgmma_backward_dkdv_registers(const AttentionConfig& c, const AttentionProblem& p) {
  const Shape s = shape_of(c, p);
  // dK and dV (64 keys x kv_cols each over 128 threads), S^T and dP^T (64 x sdp_n each), one
  // Atomic dQ tile (64 x dq_n).
  return s.kv_cols + s.sdp_n + (c.dq == DqMode::Atomic ? s.dq_n / 2 : 0) + kRegisterAllowance;
}

int wgmma_backward_dq_registers(const AttentionConfig& c, const AttentionProblem& p) {
  // dQ (64 rows x dp over 128 threads), S and dP (64 x block_n each), a user expression's
  // temporaries (a mask_mod spilled 72 B at d 128 m64n128-det: 255 registers against 222 plain).
  return padded_head_dim(p.head_dim) / 2 + c.block_n + kRegisterAllowance +
         user_expression_registers(p);
}

std::vector<AttentionConfig> wgmma_backward_candidates(const AttentionProblem& problem) {
  std::vector<AttentionConfig> configs;
  knobs::for_each_tile(kWgmmaBwdBlockMChoices, kWgmmaBwdBlockNChoices, kWgmmaBwdWarpChoices,
                       kWgmmaBwdStageChoices, [&](AttentionConfig c) {
                         c.family = KernelFamily::Wgmma;
                         for (DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
                           if (problem.deterministic && dq == DqMode::Atomic) continue;
                           c.dq = dq;
                           configs.push_back(c);
                         }
                       });
  std::sort(configs.begin(), configs.end());
  return configs;
}

Status check_wgmma_backward_config(const AttentionConfig& c, const AttentionProblem& p,
                                   const DeviceSpec& device) {
  if (c.family != KernelFamily::Wgmma)
    return illegal(c, "not a wgmma config (the wgmma family's budget was asked)");
  if (device.arch != 90)
    return illegal(c, "wgmma kernels need sm90 (H100/H200); this device is " + device.arch_name());
  if (Status dtype = check_cuda_dtype(p.dtype); !dtype.ok())
    return illegal(c, dtype.error().message);
  if (p.deterministic && c.dq != DqMode::Separate)
    return illegal(c,
                   "the problem is deterministic: only a separate dQ kernel (-det) gives "
                   "reproducible gradients (fp32 atomics add in a varying order)");
  FLASHJIT_TRY(check_template(c, p));
  const int dkdv_threads = wgmma_backward_dkdv_threads(c);
  const int dq_threads = wgmma_backward_dq_threads(c);
  FLASHJIT_TRY(knobs::check_threads(c, std::max(dkdv_threads, dq_threads), device));
  // SRAM budget of each kernel.
  FLASHJIT_TRY(knobs::check_memory(c, "dK/dV kernel shared memory",
                                   wgmma_backward_dkdv_smem_bytes(c, p), device));
  if (c.dq == DqMode::Separate)
    FLASHJIT_TRY(knobs::check_memory(c, "dQ kernel shared memory",
                                     wgmma_backward_dq_smem_bytes(c, p), device));
  // Register budget: past the per-thread cap ptxas spills or serializes the wgmmas.
  FLASHJIT_TRY(knobs::check_registers(c, wgmma_backward_dkdv_registers(c, p), dkdv_threads, device,
                                      "dK/dV kernel: "));
  // Measured, beyond the estimate: Atomic shapes at the 255-register edge that spill (ptxas 13.0,
  // templates_cuda_compile_test): two warpgroups of 64 keys with 128 query columns each
  // (m128n128w8, 8-40 bytes at d <= 64, whatever the stats' loads), and with the dQ tiles staged
  // for the bulk reductions m64n128w8 at 3 stages (d 128: 4 bytes; 255 registers and none at 2)
  // and m128n64w4 (d 64: 4-16 bytes, 28 with softcap + ALiBi).
  struct Spill {
    int warps, block_m, block_n, stages, dp;  // 0: any
  };
  static constexpr Spill kAtomicSpills[] = {
      {8, 128, 128, 0, 0}, {8, 64, 128, 3, 128}, {4, 128, 64, 0, 64}};
  if (c.dq == DqMode::Atomic && device.max_regs_per_thread <= 255) {
    const int dp = padded_head_dim(p.head_dim);
    for (const Spill& spill : kAtomicSpills)
      if (c.warps == spill.warps && c.block_m == spill.block_m && c.block_n == spill.block_n &&
          (spill.stages == 0 || c.stages == spill.stages) && (spill.dp == 0 || dp == spill.dp))
        return illegal(c,
                       "dK/dV kernel: an Atomic dQ tile at this shape spills at 255 registers "
                       "(measured with ptxas 13.0)");
  }
  if (c.dq == DqMode::Separate)
    FLASHJIT_TRY(knobs::check_registers(c, wgmma_backward_dq_registers(c, p), dq_threads, device,
                                        "dQ kernel: "));
  return ok_status();
}

Result<AttentionConfig> default_wgmma_backward_config(const AttentionProblem& p,
                                                      const DeviceSpec& device) {
  // dQ from its own kernel, also when the problem does not ask for determinism: the atomic
  // mode adds every key block's dS K_j into the fp32 workspace, (seqlen_k / Bc) x the size of dQ
  // in red.global traffic (at N = 16k, d = 64: ~1 GB per head), which costs more than the dQ
  // kernel's recomputed S and dP. Measured on an H100 (docs/PERFORMANCE.md): every tuned shape of
  // the bf16 grid chose a -det config, 1.04-1.45x the atomic default's speed.
  const int dp = padded_head_dim(p.head_dim);
  const DqMode dq = DqMode::Separate;
  AttentionConfig preferred{128, 64, 4, 2, KernelFamily::Wgmma, dq};
  if (dp > 64) preferred = {64, 64, 4, 2, KernelFamily::Wgmma, dq};
  if (dp > 128) preferred = {64, 64, 8, 2, KernelFamily::Wgmma, dq};
  if (check_wgmma_backward_config(preferred, p, device).ok()) return preferred;
  for (const AttentionConfig& c : wgmma_backward_candidates(p))
    if (check_wgmma_backward_config(c, p, device).ok()) return c;
  return make_error(ErrorCode::Unsupported,
                    "no legal wgmma backward config for head_dim = " + std::to_string(p.head_dim) +
                        " on " + device.name +
                        " (sm90 only; padded head dims 64, 128 and 256 have shapes)");
}

std::string explain_wgmma_backward_plan(const AttentionProblem& p, const DeviceSpec& device) {
  std::ostringstream out;
  const int dp = padded_head_dim(p.head_dim);
  out << "wgmma family (sm_90a; FlashAttention-2's backward with warpgroup MMA, "
         "templates/cuda/attention_bwd_sm90.cuh):\n"
      << "  dK/dV kernel: one CTA per Bc keys; warpgroup w holds 64 keys of S^T = K Q^T and\n"
      << "  dP^T = V dO^T (Br query columns, or Br / 2 when two warpgroups share 64 keys) and\n"
      << "  accumulates dK, dV (" << dp
      << " columns, or half when shared) over the Q/dO blocks of every\n"
      << "  query head of the group; dQ by fp32 bulk reductions of shared-memory tiles into\n"
      << "  dq_accum (Atomic) or a dQ kernel (-det).\n"
      << "  smem dK/dV = 1024 + 2 * Bc * " << dp << " * 2 (K, V) + 2 * stages * Br * " << dp
      << " * 2 (Q, dO)\n"
      << "               + Bc * Br * 2 (dS^T: Atomic or shared keys) + Bc * Br * 2 (P^T: "
         "shared keys)\n"
      << "               + 2 * stages * Br * 4 (lse, delta) + Br * "
      << 4 * dp + 32 * (dp / dq_tile_columns(dp))
      << " (dQ tiles staged, rows padded: Atomic)   <= " << device.smem_per_block_optin << " B\n"
      << "  smem dQ    = 1024 + 2 * Br * " << dp << " * 2 (Q, dO) + 2 * stages * Bc * " << dp
      << " * 2 (K, V)   <= " << device.smem_per_block_optin << " B\n"
      << "  regs dK/dV ~= dK+dV columns (" << dp << " or " << dp / 2
      << ") + S^T columns (Br or Br / 2) + dQ tile / 2 (Atomic) + " << kRegisterAllowance
      << "   <= " << device.max_regs_per_thread << "\n"
      << "  regs dQ    ~= " << dp / 2 << " (dQ) + Bc (S, dP) + " << kRegisterAllowance
      << (user_expression_registers(p) > 0
              ? " + " + std::to_string(user_expression_registers(p)) + " (user expression)"
              : std::string())
      << "   <= " << device.max_regs_per_thread << "  (no setmaxnreg: no producer warps)\n\n";
  out << "config                 threads  smem dK/dV  smem dQ  regs~  CTAs/SM  status\n";
  for (const AttentionConfig& c : wgmma_backward_candidates(p)) {
    const Status status = check_wgmma_backward_config(c, p, device);
    const std::string why = knobs::verdict(status, c, false);
    const int dkdv_smem = wgmma_backward_dkdv_smem_bytes(c, p);
    const int dq_smem = c.dq == DqMode::Separate ? wgmma_backward_dq_smem_bytes(c, p) : 0;
    // dK/dV CTAs per SM, by shared memory and by (estimated, rounded to 8) registers.
    const int regs_rounded = (wgmma_backward_dkdv_registers(c, p) + 7) / 8 * 8;
    const int ctas = std::min(device.smem_per_sm / (dkdv_smem + knobs::kSmemReservedPerCta),
                              device.regs_per_sm / (regs_rounded * wgmma_backward_dkdv_threads(c)));
    char regs[32];
    if (c.dq == DqMode::Separate)
      std::snprintf(regs, sizeof regs, "%d/%d", wgmma_backward_dkdv_registers(c, p),
                    wgmma_backward_dq_registers(c, p));
    else
      std::snprintf(regs, sizeof regs, "%d", wgmma_backward_dkdv_registers(c, p));
    char line[512];
    std::snprintf(line, sizeof line, "%-22s %7d %11d %8d %6s %8d  %s\n", c.to_string().c_str(),
                  wgmma_backward_dkdv_threads(c), dkdv_smem, dq_smem, regs, ctas, why.c_str());
    out << line;
  }
  if (Result<AttentionConfig> def = default_wgmma_backward_config(p, device); def.ok())
    out << "Proposed wgmma default: " << def->to_string() << "\n";
  else
    out << def.error().message << "\n";
  return out.str();
}

}  // namespace flashjit
