#include "generator/hip_config.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <tuple>

#include "generator/decode_config.hpp"
#include "generator/knobs.hpp"

namespace flashjit {
namespace {

constexpr int kMaxMTilesPerWave = 2;  // 16-row MFMA tiles a wave owns (template constraint)
// Registers beyond the budgeted arrays: tile addresses, loop counters, row max / sum, the K and V
// operands of the MFMA in flight, masking temporaries.
constexpr int kRegisterAllowance = 48;
constexpr int kRegisterGranule = 8;  // CDNA2/3 allocate VGPRs in granules of 8 per lane
constexpr int kVRowPadding = 4;      // elements of padding per V^T row (bank conflicts)

using knobs::contains;
using knobs::illegal;
using knobs::list;

int hip_threads(const AttentionConfig& c) { return c.warps * kHipWaveSize; }

bool has_template_shape(const AttentionConfig& c) {
  return c.warps > 0 && c.block_m % (16 * c.warps) == 0 &&
         c.block_m / c.warps / 16 <= kMaxMTilesPerWave;
}

Status check_hip_dtype(const AttentionConfig& c, DType dtype) {
  if (dtype == DType::F16 || dtype == DType::BF16) return ok_status();
  return illegal(c, std::string("dtype = ") + to_string(dtype) +
                        ": the HIP templates support f16 and bf16 storage only (MFMA operands)");
}

// The backward's functions, defined with the backward's budget below.
Status check_hip_backward_config(const AttentionConfig& c, const AttentionProblem& p,
                                 const DeviceSpec& device);
namespace {

// Every backward tile and dQ mode of the choices, in the order of the legal configs.
std::vector<AttentionConfig> hip_backward_candidates() {
  std::vector<AttentionConfig> configs;
  knobs::for_each_tile(kHipBwdBlockMChoices, kHipBwdBlockNChoices, kHipBwdWaveChoices,
                       kHipStageChoices, [&](AttentionConfig c) {
                         for (DqMode dq : {DqMode::Atomic, DqMode::Separate}) {
                           c.dq = dq;
                           configs.push_back(c);
                         }
                       });
  return configs;
}

}  // namespace

std::vector<AttentionConfig> legal_hip_backward_configs(const AttentionProblem& p,
                                                        const DeviceSpec& device);
Result<AttentionConfig> default_hip_backward_config(const AttentionProblem& p,
                                                    const DeviceSpec& device);
std::string explain_hip_backward_plan(const AttentionProblem& p, const DeviceSpec& device);

}  // namespace

int hip_lds_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  const int dp = padded_head_dim(p.head_dim);
  return c.stages * (c.block_n * dp * 2 + dp * (c.block_n + kVRowPadding) * 2);
}

int hip_estimated_registers(const AttentionConfig& c, const AttentionProblem& p) {
  const int m_tiles = std::max(1, c.block_m / std::max(1, c.warps) / 16);
  const int dp = padded_head_dim(p.head_dim);
  const int o_accumulator = m_tiles * dp / 4;  // 16 rows x dp fp32 over 64 lanes, per tile
  const int s_accumulator = m_tiles * c.block_n / 4;
  const int p_packed = m_tiles * c.block_n / 8;
  const int q_operands = m_tiles * dp / 8;
  const int kv_in_flight = c.block_n * dp / std::max(1, hip_threads(c));  // 2 tiles x 2 B / 4 B
  return o_accumulator + s_accumulator + p_packed + q_operands + kv_in_flight + kRegisterAllowance +
         user_expression_registers(p);
}

int hip_wave_register_budget(int waves, const DeviceSpec& device) {
  const int simds = kHipSimdsPerCu;
  const int waves_per_simd = std::max(1, (waves + simds - 1) / simds);
  const int per_simd_lane = device.regs_per_sm / (simds * kHipWaveSize);
  return std::min(device.max_regs_per_thread, per_simd_lane / waves_per_simd);
}

int hip_register_budget(const AttentionConfig& c, const DeviceSpec& device) {
  return hip_wave_register_budget(c.warps, device);
}

HipResourceUse hip_resource_use(const AttentionConfig& c, const AttentionProblem& p,
                                const DeviceSpec& device) {
  HipResourceUse use;
  use.lds_bytes = hip_lds_bytes(c, p);
  use.regs_per_lane = hip_estimated_registers(c, p);
  use.threads = hip_threads(c);
  const int regs_rounded =
      (use.regs_per_lane + kRegisterGranule - 1) / kRegisterGranule * kRegisterGranule;
  const int per_simd_lane = device.regs_per_sm / (kHipSimdsPerCu * kHipWaveSize);
  const int waves_per_cu_by_regs = kHipSimdsPerCu * (per_simd_lane / std::max(1, regs_rounded));
  const int by_lds = use.lds_bytes > 0 ? device.smem_per_sm / use.lds_bytes : 0;
  const int by_regs = waves_per_cu_by_regs / std::max(1, c.warps);
  const int by_waves = device.max_threads_per_sm / std::max(1, use.threads);
  use.blocks_per_cu = std::max(0, std::min({by_lds, by_regs, by_waves}));
  return use;
}

Status check_hip_config(const AttentionConfig& c, const AttentionProblem& p,
                        const DeviceSpec& device) {
  FLASHJIT_TRY(check_ws_knobs(c));
  if (c.family == KernelFamily::Decode) return check_hip_decode_config(c, p, device);
  if (p.is_backward()) return check_hip_backward_config(c, p, device);
  FLASHJIT_TRY(check_hip_dtype(c, p.dtype));
  if (needs_decode_family(p)) return illegal(c, decode_only_reason(p));
  if (c.splits != 0) return illegal(c, "-split<N> is a knob of the -decode family only");
  if (c.dq != DqMode::Atomic)
    return illegal(c, "-det (a separate dQ kernel) exists in the backward pass only");
  // Template constraints (mirrored by static_asserts in templates/hip/attention_fwd.hpp).
  FLASHJIT_TRY(knobs::check_choice(c, "block_m", c.block_m, kHipBlockMChoices));
  FLASHJIT_TRY(knobs::check_choice(c, "block_n", c.block_n, kHipBlockNChoices));
  FLASHJIT_TRY(knobs::check_choice(c, "warps (wavefronts)", c.warps, kHipWaveChoices));
  FLASHJIT_TRY(knobs::check_choice(c, "stages (LDS buffers)", c.stages, kHipStageChoices));
  if (!has_template_shape(c))
    return illegal(c, "block_m / waves = " + std::to_string(c.block_m) + " / " +
                          std::to_string(c.warps) + " must be 16 or 32 rows per wave");
  const int threads = hip_threads(c);
  const int chunks_per_row = padded_head_dim(p.head_dim) / 8;  // 16-byte copies per row
  if ((c.block_n * chunks_per_row) % threads != 0)
    return illegal(
        c, "K/V tile copies do not divide evenly over " + std::to_string(threads) + " threads");
  if (c.block_n * chunks_per_row / threads > kHipMaxCopiesPerThread)
    return illegal(c, std::to_string(c.block_n * chunks_per_row / threads) +
                          " K/V tile copies per thread exceed " +
                          std::to_string(kHipMaxCopiesPerThread) +
                          " (too few threads for the tile: registers would spill)");
  FLASHJIT_TRY(knobs::check_threads(c, threads, device, "workgroup"));
  // LDS budget.
  FLASHJIT_TRY(knobs::check_memory(c, "LDS", hip_lds_bytes(c, p), device, "workgroup"));
  // Register budget: past it the compiler spills to scratch memory.
  const int accumulator = c.block_m / c.warps / 16 * padded_head_dim(p.head_dim) / 4;
  if (accumulator > kHipMaxAccumulatorPerLane)
    return illegal(c, "the O accumulator takes " + std::to_string(accumulator) +
                          " registers per lane, more than " +
                          std::to_string(kHipMaxAccumulatorPerLane) +
                          " (32 rows per wave at this head dim spill to scratch)");
  const int regs = hip_estimated_registers(c, p);
  const int budget = hip_register_budget(c, device);
  if (regs > budget)
    return illegal(c, "estimated " + std::to_string(regs) + " registers per lane exceed " +
                          std::to_string(budget) + " (" + std::to_string(c.warps) + " waves on " +
                          std::to_string(kHipSimdsPerCu) + " SIMDs)");
  return ok_status();
}

std::vector<AttentionConfig> legal_hip_configs(const AttentionProblem& p,
                                               const DeviceSpec& device) {
  if (p.is_backward()) return legal_hip_backward_configs(p, device);
  std::vector<AttentionConfig> configs =
      knobs::legal_tiles(kHipBlockMChoices, kHipBlockNChoices, kHipWaveChoices, kHipStageChoices,
                         [&](const AttentionConfig& c) { return check_hip_config(c, p, device); });
  if (is_decode_problem(p))
    for (const AttentionConfig& c : legal_hip_decode_configs(p, device)) configs.push_back(c);
  return configs;
}

Result<AttentionConfig> default_hip_config(const AttentionProblem& p, const DeviceSpec& device) {
  if (p.is_backward()) return default_hip_backward_config(p, device);
  if (is_decode_problem(p)) return default_hip_decode_config(p, device);
  const std::vector<AttentionConfig> legal = legal_hip_configs(p, device);
  if (legal.empty())
    return make_error(
        ErrorCode::Unsupported,
        "no legal HIP config for head_dim = " + std::to_string(p.head_dim) + " on " + device.name);
  auto rank = [&](const AttentionConfig& c) {
    const bool two_per_cu = 2 * hip_lds_bytes(c, p) <= device.smem_per_sm;
    return std::make_tuple(c.block_m == 128 && c.warps == 4, c.block_m == 128, c.block_n == 64,
                           two_per_cu, c.stages == 2, c.block_n, c.block_m, c.warps);
  };
  return knobs::best_config(legal, rank);
}

std::string explain_hip_plan(const AttentionProblem& p, const DeviceSpec& device) {
  if (p.is_backward()) return explain_hip_backward_plan(p, device);
  if (is_decode_problem(p)) return explain_hip_decode_plan(p, device);
  std::ostringstream out;
  const int d = p.head_dim, dp = padded_head_dim(d);
  knobs::plan_header(out, p, device);
  knobs::plan_formula(out, p, device);
  out << "  (assumes Q in SRAM; the HIP template keeps Q in registers, see the default below)\n\n";
  out << "Budget of the HIP template (MFMA 16x16x16, wave" << kHipWaveSize
      << ", 2-byte elements, head dim padded to " << dp << "):\n";
  out << "  LDS   = stages * (Bc * " << dp << " + " << dp << " * (Bc + " << kVRowPadding
      << ")) * 2 B   <= " << device.smem_per_block_optin
      << " B per workgroup (K and padded V^T tiles; Q in registers)\n";
  out << "  regs ~= m_tiles * (" << dp << "/4 + Bc/4 + Bc/8 + " << dp << "/8) + Bc * " << dp
      << " / threads + " << kRegisterAllowance
      << "   <= " << device.regs_per_sm / (kHipSimdsPerCu * kHipWaveSize)
      << " per lane (VGPRs + AGPRs), halved when 5-8 waves share the " << kHipSimdsPerCu
      << " SIMDs\n"
      << "          (fp32 O and S^T, 16-bit P and Q operands, next K/V block in flight)\n";
  out << "  O accumulator = Br / waves * " << dp << " / 64 <= " << kHipMaxAccumulatorPerLane
      << " per lane (measured: beyond it hipRTC spills)\n";
  out << "  rows per wave = Br / waves in {16, 32}; Br in " << list(kHipBlockMChoices) << ", Bc in "
      << list(kHipBlockNChoices) << ", waves in " << list(kHipWaveChoices)
      << ", stages (LDS buffers) in " << list(kHipStageChoices) << "\n\n";
  out << "config        LDS(B)  regs~  WGs/CU  status\n";
  knobs::for_each_tile(kHipBlockMChoices, kHipBlockNChoices, kHipWaveChoices, kHipStageChoices,
                       [&](const AttentionConfig& c) {
                         if (!has_template_shape(c)) return;  // not a shape the template has
                         const HipResourceUse use = hip_resource_use(c, p, device);
                         char line[256];
                         std::snprintf(
                             line, sizeof line, "%-12s %7d %6d %7d  %s\n", c.to_string().c_str(),
                             use.lds_bytes, use.regs_per_lane, use.blocks_per_cu,
                             knobs::verdict(check_hip_config(c, p, device), c, false).c_str());
                         out << line;
                       });
  out << "\n";
  knobs::plan_footer(out, legal_hip_configs(p, device).size(), default_hip_config(p, device));
  return out.str();
}

// ---- the backward pass ------------------------------------------------------------------------

namespace {

constexpr int kMaxKeyTilesPerWave = 2;  // 16-key MFMA tiles a wave of the dK/dV kernel owns
constexpr int kDsRowPadding = 4;        // elements of padding per dS / transposed row

bool has_backward_template_shape(const AttentionConfig& c) {
  return c.warps > 0 && c.block_n % (16 * c.warps) == 0 &&
         c.block_n / c.warps / 16 <= kMaxKeyTilesPerWave;
}

int key_tiles_per_wave(const AttentionConfig& c) {
  return std::max(1, c.block_n / std::max(1, c.warps) / 16);
}

// 16-byte copies per thread of one streamed tile: Q (and dO) in the dK/dV kernel, K (and V) in
// the dQ kernel.
int ceil_div(int a, int b) { return (a + b - 1) / std::max(1, b); }
int qdo_copies(const AttentionConfig& c, const AttentionProblem& p) {
  return ceil_div(c.block_m * padded_head_dim(p.head_dim) / 8, hip_threads(c));
}
int dq_kv_copies(const AttentionConfig& c, const AttentionProblem& p) {
  return ceil_div(c.block_n * padded_head_dim(p.head_dim) / 8, hip_bwd_dq_waves(c) * kHipWaveSize);
}

}  // namespace

int hip_bwd_dkdv_lds_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  const int dp = padded_head_dim(p.head_dim);
  const int streamed = c.stages * 2 * (c.block_m * dp + dp * (c.block_m + kDsRowPadding)) * 2;
  const int ds = c.dq == DqMode::Atomic ? c.block_m * (c.block_n + kDsRowPadding) * 2 : 0;
  return streamed + ds;
}

int hip_bwd_dq_lds_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  if (c.dq == DqMode::Atomic) return 0;
  const int dp = padded_head_dim(p.head_dim);
  return c.stages * (2 * c.block_n * dp + dp * (c.block_n + kDsRowPadding)) * 2;
}

int hip_bwd_dq_waves(const AttentionConfig& c) { return std::max(1, c.block_m / 16); }

int hip_bwd_dkdv_estimated_registers(const AttentionConfig& c, const AttentionProblem& p) {
  const int kt = key_tiles_per_wave(c);
  const int dt = padded_head_dim(p.head_dim) / 16;
  const int accumulators = 2 * kt * dt * 4;  // dK^T, dV^T
  const int kv_operands = 2 * kt * dt * 2;   // K, V rows
  const int scores = kt * (4 + 4 + 2 + 2);   // S, dP; P, dS packed
  const int read_ahead = 8 * dt;             // Q, dO, Q^T, dO^T operands of one query tile
  const int in_flight = 2 * qdo_copies(c, p) * 4;
  const int dq = c.dq == DqMode::Atomic ? c.block_n / 16 * ceil_div(dt, c.warps) * 2 + 4 : 0;
  return accumulators + kv_operands + scores + read_ahead + in_flight + dq + kRegisterAllowance +
         user_expression_registers(p);
}

int hip_bwd_dq_estimated_registers(const AttentionConfig& c, const AttentionProblem& p) {
  if (c.dq == DqMode::Atomic) return 0;
  const int dt = padded_head_dim(p.head_dim) / 16;
  const int nt = c.block_n / 16;
  const int accumulator = dt * 4;                    // dQ^T
  const int operands = 2 * dt * 2;                   // Q, dO rows
  const int scores = nt * (2 * (4 + 4) + 2);         // S^T, dP^T (twice); dS^T packed
  const int in_flight = 2 * dq_kv_copies(c, p) * 4;  // next K, V
  return accumulator + operands + scores + in_flight + kRegisterAllowance +
         user_expression_registers(p);
}

BackwardShapes hip_backward_shapes(const AttentionConfig& c, const AttentionProblem& p) {
  return backward_shapes(c, {hip_threads(c), hip_bwd_dkdv_lds_bytes(c, p)},
                         {hip_bwd_dq_waves(c) * kHipWaveSize, hip_bwd_dq_lds_bytes(c, p)});
}

namespace {

Status check_hip_backward_config(const AttentionConfig& c, const AttentionProblem& p,
                                 const DeviceSpec& device) {
  FLASHJIT_TRY(check_hip_dtype(c, p.dtype));
  if (p.deterministic && c.dq != DqMode::Separate)
    return illegal(c, "a deterministic backward needs a separate dQ kernel (a -det config)");
  // Template constraints (mirrored by static_asserts in templates/hip/attention_bwd.hpp).
  FLASHJIT_TRY(knobs::check_choice(c, "block_m", c.block_m, kHipBwdBlockMChoices, " (backward)"));
  FLASHJIT_TRY(knobs::check_choice(c, "block_n", c.block_n, kHipBwdBlockNChoices, " (backward)"));
  FLASHJIT_TRY(
      knobs::check_choice(c, "warps (wavefronts)", c.warps, kHipBwdWaveChoices, " (backward)"));
  FLASHJIT_TRY(knobs::check_choice(c, "stages (LDS buffers)", c.stages, kHipStageChoices));
  if (!has_backward_template_shape(c))
    return illegal(c, "block_n / waves = " + std::to_string(c.block_n) + " / " +
                          std::to_string(c.warps) + " must be 16 or 32 keys per wave");
  if (c.block_m * padded_head_dim(p.head_dim) < kHipBwdMinBlockElements)
    return illegal(c, "block_m * padded head dim = " + std::to_string(c.block_m) + " * " +
                          std::to_string(padded_head_dim(p.head_dim)) + " is under " +
                          std::to_string(kHipBwdMinBlockElements) +
                          " (too small a streamed block for its barriers)");
  if (qdo_copies(c, p) > kHipBwdMaxCopies)
    return illegal(c, std::to_string(qdo_copies(c, p)) + " Q/dO tile copies per thread exceed " +
                          std::to_string(kHipBwdMaxCopies) +
                          " (too few threads for the tile: registers would spill)");
  if (c.dq == DqMode::Separate && dq_kv_copies(c, p) > kHipBwdDqMaxCopies)
    return illegal(c, std::to_string(dq_kv_copies(c, p)) +
                          " K/V tile copies per thread of the dQ kernel (" +
                          std::to_string(hip_bwd_dq_waves(c)) + " waves) exceed " +
                          std::to_string(kHipBwdDqMaxCopies));
  const BackwardShapes shapes = hip_backward_shapes(c, p);
  for (const auto& [name, shape] :
       {std::pair<const char*, KernelShape>{"dK/dV", shapes.dkdv}, {"dQ", shapes.dq}}) {
    const std::string kernel = std::string("the ") + name + " kernel's ";
    FLASHJIT_TRY(knobs::check_threads(c, shape.threads, device, "workgroup", kernel));
    FLASHJIT_TRY(knobs::check_memory(c, kernel + "LDS", shape.smem_bytes, device, "workgroup"));
  }
  // Register budget of each kernel: past it the compiler spills to scratch memory.
  const int dkdv_regs = hip_bwd_dkdv_estimated_registers(c, p);
  const int dkdv_budget = hip_register_budget(c, device);
  if (dkdv_regs > dkdv_budget)
    return illegal(c, "the dK/dV kernel's estimated " + std::to_string(dkdv_regs) +
                          " registers per lane exceed " + std::to_string(dkdv_budget) + " (" +
                          std::to_string(c.warps) + " waves on " + std::to_string(kHipSimdsPerCu) +
                          " SIMDs)");
  const int dq_regs = hip_bwd_dq_estimated_registers(c, p);
  const int dq_budget = hip_wave_register_budget(hip_bwd_dq_waves(c), device);
  if (dq_regs > dq_budget)
    return illegal(c, "the dQ kernel's estimated " + std::to_string(dq_regs) +
                          " registers per lane exceed " + std::to_string(dq_budget));
  return ok_status();
}

std::vector<AttentionConfig> legal_hip_backward_configs(const AttentionProblem& p,
                                                        const DeviceSpec& device) {
  std::vector<AttentionConfig> configs;
  for (const AttentionConfig& c : hip_backward_candidates())
    if (check_hip_backward_config(c, p, device).ok()) configs.push_back(c);
  return configs;
}

Result<AttentionConfig> default_hip_backward_config(const AttentionProblem& p,
                                                    const DeviceSpec& device) {
  const std::vector<AttentionConfig> legal = legal_hip_backward_configs(p, device);
  if (legal.empty())
    return make_error(ErrorCode::Unsupported,
                      "no legal HIP backward config for head_dim = " + std::to_string(p.head_dim) +
                          " on " + device.name);
  // Atomic where allowed (one pass over the scores), 4 waves (one per SIMD), the most keys per
  // workgroup (Q and dO loaded once per block_n keys), then the largest streamed block, then
  // double buffering.
  auto rank = [&](const AttentionConfig& c) {
    return std::make_tuple(c.dq == DqMode::Atomic, c.warps == 4, c.block_n, c.block_m, c.stages,
                           -c.warps);
  };
  return knobs::best_config(legal, rank);
}

std::string explain_hip_backward_plan(const AttentionProblem& p, const DeviceSpec& device) {
  std::ostringstream out;
  const int dp = padded_head_dim(p.head_dim);
  knobs::plan_header(out, p, device);
  out << "Budget of the HIP backward (MFMA 16x16x16, wave" << kHipWaveSize
      << ", 2-byte elements, head dim padded to " << dp << "):\n";
  out << "  dK/dV kernel: Bn keys per workgroup, 16 or 32 per wave; Q, dO streamed in Bm rows\n";
  out << "    LDS  = stages * 2 * (Bm * " << dp << " + " << dp << " * (Bm + " << kDsRowPadding
      << ")) * 2 + [atomic dQ] Bm * (Bn + " << kDsRowPadding
      << ") * 2 B   <= " << device.smem_per_block_optin << " B\n";
  out << "    regs ~= keys/16 * (" << dp / 2 << " + " << dp / 4
      << " + 12) [dK, dV; K, V; scores] + " << dp / 2
      << " [operands read ahead] + in-flight Q/dO + [atomic] K^T operands + " << kRegisterAllowance
      << "\n";
  out << "  dQ kernel (-det): Bm / 16 waves of 16 query rows; K, V streamed in Bn rows\n";
  out << "    LDS  = stages * (2 * Bn * " << dp << " + " << dp << " * (Bn + " << kDsRowPadding
      << ")) * 2 B   <= " << device.smem_per_block_optin << " B\n";
  out << "  registers <= " << device.regs_per_sm / (kHipSimdsPerCu * kHipWaveSize)
      << " per lane (VGPRs + AGPRs), halved when 5-8 waves share the " << kHipSimdsPerCu
      << " SIMDs\n";
  out << "  Bm * " << dp << " >= " << kHipBwdMinBlockElements << "; Bm in "
      << list(kHipBwdBlockMChoices) << ", Bn in " << list(kHipBwdBlockNChoices) << ", waves in "
      << list(kHipBwdWaveChoices) << ", stages in " << list(kHipStageChoices)
      << "; dQ atomic, or -det (separate dQ kernel" << (p.deterministic ? ": required" : "")
      << ")\n\n";
  out << "config            LDS dK/dV  LDS dQ  regs~ dK/dV  regs~ dQ  status\n";
  for (const AttentionConfig& c : hip_backward_candidates()) {
    if (!has_backward_template_shape(c)) continue;  // not a shape the template has
    Status status = check_hip_backward_config(c, p, device);
    const std::string why = knobs::verdict(status, c, false);
    char line[320];
    std::snprintf(line, sizeof line, "%-16s %10d %7d %12d %9d  %s\n", c.to_string().c_str(),
                  hip_bwd_dkdv_lds_bytes(c, p), hip_bwd_dq_lds_bytes(c, p),
                  hip_bwd_dkdv_estimated_registers(c, p), hip_bwd_dq_estimated_registers(c, p),
                  why.c_str());
    out << line;
  }
  out << "\n";
  knobs::plan_footer(out, legal_hip_backward_configs(p, device).size(),
                     default_hip_backward_config(p, device));
  return out.str();
}

}  // namespace

}  // namespace flashjit
