#include "generator/backward_config.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "generator/backward_config_sm90.hpp"
#include "generator/backward_config_ws.hpp"
#include "generator/knobs.hpp"

namespace flashjit {

namespace {

// Registers a thread of the mma family's kernels needs beyond its fp32 accumulators: the A and B
// fragments in flight, the per-lane tile offsets, lse_log2 and D of its rows, loop state and the
// copy addresses. Calibrated against ptxas (tests/templates/cuda_compile_test.cpp prints both):
// a config is legal when the estimate fits the 255-register cap.
constexpr int kBackwardRegisterAllowance = 40;

using knobs::contains;
using knobs::illegal;
using knobs::list;

// ---- the mma family (templates/cuda/attention_bwd.cuh) -------------------------------------

// The template's three warp tilings and what they cost.
struct MmaShape {
  int d_pad = 0;
  BackwardWarpTiling sdp, dkv,
      dq;                      // S/dP/dS [block_m, block_n], dK/dV [block_n, d], dQ [block_m, d]
  int score_registers = 0;     // S + dP, fp32
  int dkv_registers = 0;       // dK + dV, fp32
  int dq_chunk_registers = 0;  // Atomic: one column chunk of dS K_j
  int dq_registers = 0;        // Separate's dQ kernel: its whole dQ block
  int dkdv_registers = 0, dq_kernel_registers = 0;
  int dkdv_smem = 0, dq_smem = 0;
};

MmaShape mma_shape(const AttentionConfig& c, const AttentionProblem& p) {
  MmaShape s;
  s.d_pad = backward_padded_head_dim(p.head_dim);
  s.sdp = backward_warp_tiling(c.block_m, c.block_n, c.warps);
  s.dkv = backward_warp_tiling(c.block_n, s.d_pad, c.warps);
  s.dq = backward_warp_tiling(c.block_m, s.d_pad, c.warps);
  // An [r, c] fp32 block over a warp's 32 lanes: r * c / 32 registers per lane.
  s.score_registers = 2 * s.sdp.rows * s.sdp.cols / 32;
  s.dkv_registers = 2 * s.dkv.rows * s.dkv.cols / 32;
  s.dq_registers = s.dq.rows * s.dq.cols / 32;
  // BwdTraits::kDqChunk: as many columns as S and dP held (at least 32 registers' worth).
  if (s.dq.rows > 0) {
    const int chunk_cols = std::min(s.dq.cols, std::max(32, s.score_registers) * 32 / s.dq.rows);
    s.dq_chunk_registers = s.dq.rows * chunk_cols / 32;
  }
  // Plus the B fragments of one k-step of the widest product ptxas keeps ahead of its MMAs
  // (cols / 16 ldmatrix.x4 of 4 registers each) and the allowance.
  s.dkdv_registers = s.dkv_registers +
                     (c.dq == DqMode::Atomic ? std::max(s.score_registers, s.dq_chunk_registers)
                                             : s.score_registers) +
                     s.dkv.cols / 4 + kBackwardRegisterAllowance;
  s.dq_kernel_registers =
      s.dq_registers + s.score_registers + s.dq.cols / 4 + kBackwardRegisterAllowance;
  // BwdTraits::kSmemBytes and kDqSmemBytes.
  s.dkdv_smem = 4 * c.block_n * s.d_pad + 4 * c.stages * c.block_m * s.d_pad +
                4 * c.block_m * c.block_n + 8 * c.stages * c.block_m;
  s.dq_smem =
      4 * c.block_m * s.d_pad + 4 * c.stages * c.block_n * s.d_pad + 2 * c.block_m * c.block_n;
  return s;
}

std::vector<AttentionConfig> mma_candidates(const AttentionProblem&) {
  std::vector<AttentionConfig> configs;
  for (int block_m : kBackwardBlockMChoices)
    for (int block_n : kBackwardBlockNChoices)
      for (int warps : kBackwardWarpChoices)
        for (int stages : kBackwardStageChoices)
          for (DqMode dq : kBackwardDqChoices)
            configs.push_back({block_m, block_n, warps, stages, KernelFamily::Mma, dq});
  return configs;
}

// The template's static_asserts, in words. Only these can fail on the renderer's "unlimited"
// device (arch 0, no limits).
Status check_mma_template(const AttentionConfig& c, const MmaShape& s) {
  FLASHJIT_TRY(knobs::check_choice(c, "block_m", c.block_m, kBackwardBlockMChoices));
  FLASHJIT_TRY(knobs::check_choice(c, "block_n", c.block_n, kBackwardBlockNChoices));
  FLASHJIT_TRY(knobs::check_choice(c, "warps", c.warps, kBackwardWarpChoices));
  FLASHJIT_TRY(knobs::check_choice(c, "stages", c.stages, kBackwardStageChoices));
  const struct {
    const char* what;
    const BackwardWarpTiling& tiling;
    int rows, cols;
  } products[] = {{"S/dP [block_m, block_n]", s.sdp, c.block_m, c.block_n},
                  {"dK/dV [block_n, d_pad]", s.dkv, c.block_n, s.d_pad},
                  {"dQ [block_m, d_pad]", s.dq, c.block_m, s.d_pad}};
  for (const auto& product : products) {
    if (!product.tiling.valid) {
      return illegal(c, std::string(product.what) + " = [" + std::to_string(product.rows) + ", " +
                            std::to_string(product.cols) + "] does not split over " +
                            std::to_string(c.warps) +
                            " warps into blocks of 16 or 32 rows and a power of two >= 16 "
                            "columns");
    }
  }
  return ok_status();
}

Status check_mma_shape(const AttentionConfig& c, const AttentionProblem& p) {
  return check_mma_template(c, mma_shape(c, p));
}

// Shared memory of each kernel the config launches.
Status check_mma_smem(const AttentionConfig& c, const MmaShape& s, const DeviceSpec& device) {
  FLASHJIT_TRY(knobs::check_memory(c, "dK/dV kernel: shared memory", s.dkdv_smem, device));
  if (c.dq == DqMode::Separate)
    FLASHJIT_TRY(knobs::check_memory(c, "dQ kernel: shared memory", s.dq_smem, device));
  return ok_status();
}

Status check_mma(const AttentionConfig& c, const AttentionProblem& p, const DeviceSpec& device) {
  const MmaShape s = mma_shape(c, p);
  FLASHJIT_TRY(check_mma_template(c, s));
  FLASHJIT_TRY(knobs::check_threads(c, c.threads(), device));
  FLASHJIT_TRY(check_mma_smem(c, s, device));
  // The smaller knob values exist for the devices where the larger do not fit: one buffer
  // exposes every Q_i/dO_i load, and 32 keys per CTA reload Q and dO twice as often as 64.
  // Where the larger fits they only slow the search down.
  if (c.stages == 1) {
    AttentionConfig two = c;
    two.stages = 2;
    if (check_mma_smem(two, mma_shape(two, p), device).ok())
      return illegal(c, "stages = 1: 2 stages fit in shared memory (" +
                            std::to_string(mma_shape(two, p).dkdv_smem) +
                            " B); one buffer is for the devices where they do not");
  }
  if (c.block_n == 32) {
    AttentionConfig wider = c;
    wider.block_n = 64;
    if (check_mma_shape(wider, p).ok() && check_mma_smem(wider, mma_shape(wider, p), device).ok())
      return illegal(c,
                     "block_n = 32: block_n = 64 fits in shared memory; 32 is for the "
                     "devices where it does not");
  }
  // Registers: more than the per-thread cap would spill to local memory.
  FLASHJIT_TRY(knobs::check_registers(c, s.dkdv_registers, c.threads(), device, "dK/dV kernel: "));
  if (c.dq == DqMode::Separate)
    FLASHJIT_TRY(
        knobs::check_registers(c, s.dq_kernel_registers, c.threads(), device, "dQ kernel: "));
  return ok_status();
}

int mma_threads(const AttentionConfig& c) { return c.threads(); }
int mma_dkdv_smem(const AttentionConfig& c, const AttentionProblem& p) {
  return mma_shape(c, p).dkdv_smem;
}
int mma_dq_smem(const AttentionConfig& c, const AttentionProblem& p) {
  return mma_shape(c, p).dq_smem;
}

std::string explain_mma(const AttentionProblem& p, const DeviceSpec& device);

// ---- the families ----------------------------------------------------------------------------

// One kernel family of the backward pass: its knob space, legality (template constraints and
// budget) and launch shapes. A family's entry is all the dispatch below needs.
struct BackwardFamily {
  KernelFamily family;
  const char* name;
  std::vector<AttentionConfig> (*candidates)(const AttentionProblem& problem);
  // The template's own constraints (what its static_asserts check), for any device.
  Status (*check_template)(const AttentionConfig& config, const AttentionProblem& problem);
  // The template's constraints and the device's budget.
  Status (*check)(const AttentionConfig& config, const AttentionProblem& problem,
                  const DeviceSpec& device);
  int (*dkdv_threads)(const AttentionConfig& config);
  int (*dq_threads)(const AttentionConfig& config);
  int (*dkdv_smem_bytes)(const AttentionConfig& config, const AttentionProblem& problem);
  int (*dq_smem_bytes)(const AttentionConfig& config, const AttentionProblem& problem);
  std::string (*explain)(const AttentionProblem& problem, const DeviceSpec& device);
};

// A device with no limits but the architecture the sm90a families' instructions need: their
// budgets on it are their templates' constraints alone.
const DeviceSpec& unlimited_sm90() {
  static const DeviceSpec device = knobs::unlimited_device(90);
  return device;
}
Status check_wgmma_template(const AttentionConfig& c, const AttentionProblem& p) {
  return check_wgmma_backward_config(c, p, unlimited_sm90());
}
Status check_ws_template(const AttentionConfig& c, const AttentionProblem& p) {
  return check_ws_backward_config(c, p, unlimited_sm90());
}

// The ws family has no dQ kernel of its own: its last entry is the convert row kernel, whose
// shape backward_shapes (render.hpp) supplies; these are never launched with.
int ws_dq_threads(const AttentionConfig&) { return 128; }
int ws_dq_smem(const AttentionConfig&, const AttentionProblem&) { return 0; }

// The families with a backward template: mma (sm80+), wgmma (sm90a,
// generator/backward_config_sm90.hpp) and ws (sm90a, one fused kernel,
// generator/backward_config_ws.hpp).
constexpr BackwardFamily kFamilies[] = {
    {KernelFamily::Mma, "mma", mma_candidates, check_mma_shape, check_mma, mma_threads, mma_threads,
     mma_dkdv_smem, mma_dq_smem, explain_mma},
    {KernelFamily::Wgmma, "wgmma", wgmma_backward_candidates, check_wgmma_template,
     check_wgmma_backward_config, wgmma_backward_dkdv_threads, wgmma_backward_dq_threads,
     wgmma_backward_dkdv_smem_bytes, wgmma_backward_dq_smem_bytes, explain_wgmma_backward_plan},
    {KernelFamily::Ws, "ws", ws_backward_candidates, check_ws_template, check_ws_backward_config,
     ws_backward_dkdv_threads, ws_dq_threads, ws_backward_dkdv_smem_bytes, ws_dq_smem,
     explain_ws_backward_plan},
};

const BackwardFamily* family_of(const AttentionConfig& config) {
  for (const BackwardFamily& family : kFamilies)
    if (family.family == config.family) return &family;
  return nullptr;
}

std::string explain_mma(const AttentionProblem& p, const DeviceSpec& device) {
  std::ostringstream out;
  const int d = p.head_dim, dp = backward_padded_head_dim(d);
  out << "mma family (sm80+: mma.sync m16n8k16, ldmatrix, cp.async; "
         "templates/cuda/attention_bwd.cuh)\n";
  out << "Budget (2-byte elements, head dim " << d << " padded to " << dp
      << " in shared memory):\n";
  out << "  smem dK/dV = (2 * Bc + 2 * stages * Br) * " << dp
      << " * 2 B    K_j, V_j resident; Q_i, dO_i streamed\n"
      << "             + 2 * Br * Bc * 2 B + 2 * stages * Br * 4 B   P, dS; lse_log2_i, D_i\n"
      << "  smem dQ    = (2 * Br + 2 * stages * Bc) * " << dp
      << " * 2 B + Br * Bc * 2 B   (-det: the dQ kernel)\n"
      << "             both <= " << device.smem_per_block_optin << " B per block\n";
  out << "  regs dK/dV ~= 2 * Bc * " << dp
      << " / threads + max(2 * Br * Bc / threads, dQ chunk) + dKV cols / 4 + "
      << kBackwardRegisterAllowance << "\n"
      << "               (fp32 dK, dV; S, dP or a chunk of dS K_j; one k-step of B fragments; "
         "addresses, A fragments, loop state)\n"
      << "  regs dQ    ~= Br * " << dp << " / threads + 2 * Br * Bc / threads + dQ cols / 4 + "
      << kBackwardRegisterAllowance << "   (-det)\n"
      << "             both <= " << device.max_regs_per_thread << " per thread (32-row warp "
      << "blocks; the exact split is the template's)\n";
  out << "  Br in " << list(kBackwardBlockMChoices) << ", Bc in " << list(kBackwardBlockNChoices)
      << ", warps in " << list(kBackwardWarpChoices) << ", stages in "
      << list(kBackwardStageChoices) << ", dQ atomic or -det\n\n";
  out << "config              smem dKdV  smem dQ  regs dKdV  regs dQ  CTAs/SM  status\n";
  for (const AttentionConfig& c : mma_candidates(p)) {
    const MmaShape s = mma_shape(c, p);
    if (!check_mma_template(c, s).ok()) continue;             // not a shape the template has: noise
    if (p.deterministic && c.dq == DqMode::Atomic) continue;  // listed as one line below
    const Status status = check_backward_config(c, p, device);
    const BackwardResources use = backward_resources(c, p, device);
    const bool separate = c.dq == DqMode::Separate;
    char line[320];
    std::snprintf(line, sizeof line, "%-18s %10d %8s %10d %8s %8d  %s\n", c.to_string().c_str(),
                  use.dkdv_smem_bytes, separate ? std::to_string(use.dq_smem_bytes).c_str() : "-",
                  use.dkdv_registers, separate ? std::to_string(use.dq_registers).c_str() : "-",
                  use.ctas_per_sm, knobs::verdict(status, c).c_str());
    out << line;
  }
  if (p.deterministic)
    out << "(deterministic problem: only -det configs, a dQ kernel without atomics, are legal)\n";
  return out.str();
}

}  // namespace

int backward_padded_head_dim(int head_dim) {
  return head_dim <= 64 ? 64 : (head_dim <= 128 ? 128 : 256);
}

BackwardWarpTiling backward_warp_tiling(int rows, int cols, int warps) {
  // templates/cuda/attention_bwd.cuh, bwd_warps_along_rows and WarpTiling's static_asserts.
  BackwardWarpTiling t;
  if (warps <= 0 || rows <= 0 || cols <= 0) return t;
  const int tall = std::clamp(rows / 32, 1, warps);
  t.warps_m = cols % (16 * (warps / tall)) == 0 ? tall : std::min(rows / 16, warps);
  if (t.warps_m <= 0 || warps % t.warps_m != 0) return t;
  t.warps_n = warps / t.warps_m;
  t.rows = rows / t.warps_m;
  t.cols = cols / t.warps_n;
  const bool power_of_two = t.cols > 0 && (t.cols & (t.cols - 1)) == 0;
  t.valid = t.rows * t.warps_m == rows && t.cols * t.warps_n == cols &&
            (t.rows == 16 || t.rows == 32) && t.cols % 16 == 0 && power_of_two;
  return t;
}

BackwardResources backward_resources(const AttentionConfig& c, const AttentionProblem& p,
                                     const DeviceSpec& device) {
  BackwardResources use;
  if (c.family == KernelFamily::Wgmma) {
    use.dkdv_threads = wgmma_backward_dkdv_threads(c);
    use.dq_threads = wgmma_backward_dq_threads(c);
    use.dkdv_smem_bytes = wgmma_backward_dkdv_smem_bytes(c, p);
    use.dq_smem_bytes = wgmma_backward_dq_smem_bytes(c, p);
    use.dkdv_registers = wgmma_backward_dkdv_registers(c, p);
    use.dq_registers = wgmma_backward_dq_registers(c, p);
  } else if (c.family == KernelFamily::Ws) {
    use.dkdv_threads = ws_backward_dkdv_threads(c);
    use.dq_threads = ws_dq_threads(c);
    use.dkdv_smem_bytes = ws_backward_dkdv_smem_bytes(c, p);
    // Per thread at launch (__launch_bounds__(threads, 1)); setmaxnreg then moves the
    // producer's to the consumers (ws_backward_consumer_register_limit).
    use.dkdv_registers = 65536 / use.dkdv_threads / 8 * 8;
  } else {
    const MmaShape s = mma_shape(c, p);
    use.dkdv_threads = use.dq_threads = c.threads();
    use.dkdv_smem_bytes = s.dkdv_smem;
    use.dq_smem_bytes = s.dq_smem;
    use.dkdv_registers = s.dkdv_registers;
    use.dq_registers = s.dq_kernel_registers;
  }
  // Registers are allocated per warp in units of 256 (8 per thread).
  const int regs_rounded = (use.dkdv_registers + 7) / 8 * 8;
  const int by_smem = device.smem_per_sm / (use.dkdv_smem_bytes + knobs::kSmemReservedPerCta);
  const int by_regs = device.regs_per_sm / std::max(1, regs_rounded * use.dkdv_threads);
  const int by_threads = device.max_threads_per_sm / std::max(1, use.dkdv_threads);
  use.ctas_per_sm = std::max(0, std::min({by_smem, by_regs, by_threads}));
  return use;
}

namespace {

// What every family checks first: the dtype, that the family has a template, deterministic.
Result<const BackwardFamily*> check_common(const AttentionConfig& c, const AttentionProblem& p) {
  if (Status knobs = check_ws_knobs(c); !knobs.ok()) return knobs.error();
  if (Status dtype = check_cuda_dtype(p.dtype); !dtype.ok())
    return illegal(c, dtype.error().message, ErrorCode::Unsupported).error();
  const BackwardFamily* family = family_of(c);
  if (family == nullptr) return illegal(c, "unknown kernel family", ErrorCode::Unsupported).error();
  if (p.deterministic && c.dq != DqMode::Separate) {
    return illegal(c,
                   "the problem is deterministic: dQ atomics add in a different order every "
                   "run; only -det configs (a separate dQ kernel) are legal")
        .error();
  }
  return family;
}

}  // namespace

Status check_backward_template(const AttentionConfig& c, const AttentionProblem& p) {
  Result<const BackwardFamily*> family = check_common(c, p);
  if (!family.ok()) return family.error();
  return family.value()->check_template(c, p);
}

Status check_backward_config(const AttentionConfig& c, const AttentionProblem& p,
                             const DeviceSpec& device) {
  Result<const BackwardFamily*> family = check_common(c, p);
  if (!family.ok()) return family.error();
  return family.value()->check(c, p, device);
}

std::vector<AttentionConfig> legal_backward_configs(const AttentionProblem& p,
                                                    const DeviceSpec& device) {
  std::vector<AttentionConfig> configs;
  if (!check_cuda_dtype(p.dtype).ok()) return configs;
  for (const BackwardFamily& family : kFamilies)
    for (const AttentionConfig& c : family.candidates(p))
      if (check_backward_config(c, p, device).ok()) configs.push_back(c);
  std::sort(configs.begin(), configs.end());
  return configs;
}

Result<AttentionConfig> default_backward_config(const AttentionProblem& p,
                                                const DeviceSpec& device) {
  FLASHJIT_TRY(check_cuda_dtype(p.dtype));
  // The device's best family first, as for the forward: wgmma on sm90 where it has a tile for
  // the head dim, the mma family's formula below otherwise.
  if (device.arch == 90) {
    // The ws family's fused kernel where it takes the problem (plain attention, d 65..128, not
    // deterministic): 1.26-1.30x the wgmma -det default at d 128 on an H200. At d <= 64 its
    // tiles are legal for the tuner but measured slower than the wgmma -det tile
    // (docs/PERFORMANCE.md).
    if (p.head_dim > 64)
      if (Result<AttentionConfig> ws = default_ws_backward_config(p, device); ws.ok()) return ws;
    Result<AttentionConfig> wgmma = default_wgmma_backward_config(p, device);
    if (wgmma.ok() && check_backward_config(*wgmma, p, device).ok()) return wgmma;
  }
  const DqMode dq = p.deterministic ? DqMode::Separate : DqMode::Atomic;
  const int d_pad = backward_padded_head_dim(p.head_dim);
  constexpr int kShapes[][2] = {{128, 2}, {64, 2}, {64, 1}, {32, 2}, {32, 1}};  // block_m, stages
  for (int warps : {8, 4})
    for (int block_n = std::min(128, 16384 / d_pad); block_n >= 32; block_n /= 2)
      for (const auto& [block_m, stages] : kShapes) {
        const AttentionConfig c{block_m, block_n, warps, stages, KernelFamily::Mma, dq};
        if (check_backward_config(c, p, device).ok()) return c;
      }
  return make_error(ErrorCode::Unsupported, "no legal backward config for head_dim = " +
                                                std::to_string(p.head_dim) + " on " + device.name);
}

std::string explain_backward_plan(const AttentionProblem& p, const DeviceSpec& device) {
  std::ostringstream out;
  knobs::plan_header(out, p, device);
  if (Status dtype = check_cuda_dtype(p.dtype); !dtype.ok())
    return out.str() + dtype.error().message + "\n";
  const int d_pad = backward_padded_head_dim(p.head_dim);
  out << "Kernels: preprocess (D = rowsum(dO * O), lse_log2), dK/dV (one CTA per Bc keys of a kv "
         "head, over every query head of its group), then the dQ convert (atomic dQ) or a dQ "
         "kernel (-det: one CTA per Br query rows, no atomics, bitwise reproducible).\n\n";
  if (device.arch == 90)
    out << "Default on sm90: the ws family's fused kernel where it takes the problem, else the "
           "wgmma family's tile for the head dim (below) where it is legal, else the mma family's "
           "starting formula.\n";
  out << "Starting formula: 8 warps; Bc = min(128, 16384 / d_pad) = min(128, 16384 / " << d_pad
      << ") = " << std::min(128, 16384 / d_pad)
      << " keys (dK, dV: 2 * Bc * d_pad / 256 <= 128 fp32 registers per thread);\n"
      << "  then (Br, stages) = the first legal of (128, 2), (64, 2), (64, 1), (32, 2), (32, 1); "
         "Bc halves while none is; "
      << (p.deterministic ? "-det (deterministic problem)" : "atomic dQ") << ".\n\n";
  for (const BackwardFamily& family : kFamilies) {
    if (family.family != KernelFamily::Mma && device.arch != 90) continue;  // sm90a only
    out << family.explain(p, device) << "\n";
  }
  knobs::plan_footer(out, legal_backward_configs(p, device).size(),
                     default_backward_config(p, device));
  return out.str();
}

int backward_dkdv_threads(const AttentionConfig& c) {
  const BackwardFamily* family = family_of(c);
  return family ? family->dkdv_threads(c) : c.threads();
}
int backward_dq_threads(const AttentionConfig& c) {
  const BackwardFamily* family = family_of(c);
  return family ? family->dq_threads(c) : c.threads();
}
int backward_dkdv_smem_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  const BackwardFamily* family = family_of(c);
  return family ? family->dkdv_smem_bytes(c, p) : 0;
}
int backward_dq_smem_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  const BackwardFamily* family = family_of(c);
  return family ? family->dq_smem_bytes(c, p) : 0;
}

}  // namespace flashjit
