#include "generator/config.hpp"

#include <algorithm>
#include <cstdio>
#include <regex>
#include <sstream>

#include "generator/backward_config.hpp"
#include "generator/decode_config.hpp"
#include "generator/forward_config_ws.hpp"
#include "generator/knobs.hpp"

namespace flashjit {

namespace {

constexpr int kMaxMTilesPerWarp = 2;  // 16-row MMA tiles a warp owns (template constraint)
// 16-byte K (or V) tile copies per thread: the template takes up to 16, but past 8 each copy's
// address and predicate push ptxas into large spills (seen: 280 B with m32n128w2 at d = 128).
constexpr int kMaxCopiesPerThread = 8;
// The wgmma family holds no K/V fragments in registers (wgmma reads shared memory), so more
// copies per thread fit where its loader steps down whole 8-row swizzle phases (one address
// and stride per thread): m64n128w4 at d = 128 compiles without spills. Where it does not (d =
// 256 with 128 threads), 16 copies spill ~270 B: the limit stays 8 there.
constexpr int kMaxCopiesPerThreadWgmma = 16;
// Registers a thread needs at the least beyond its fp32 accumulators: a fixed part (tile
// addresses, loop state, softmax scalars), the K and V fragments in flight, and per 16-row tile
// the Q and P fragments and m, l. A config is legal when this minimum fits the 255-register
// cap; near the cap ptxas may still spill a few values (the prefetch addresses, outside the MMA
// path): tests/templates/cuda_compile_test.cpp bounds that at kMaxSpillBytes, the tuner measures
// whether it matters, and docs/PERFORMANCE.md has the numbers.
constexpr int kRegisterAllowance = 32;
constexpr int kRegistersPerMTile = 8;
// Packed documents (wgmma): the document's view of the params (flashjit_variant::document_view)
// lives in registers for the whole kernel, where the plain kernel reads the params from the
// constant bank: m64n128w4s2-wgmma at d128 went from 217 registers to 250, and to 255 plus a
// spill with a window and softcap besides (NVRTC 13.0), so that tile is left out at d128.
constexpr int kVarlenRegistersWgmma = 24;

using knobs::contains;
using knobs::illegal;
using knobs::list;

}  // namespace

std::string AttentionConfig::to_string() const {
  const char* suffix = family == KernelFamily::Wgmma    ? "-wgmma"
                       : family == KernelFamily::Ws     ? "-ws"
                       : family == KernelFamily::Decode ? "-decode"
                                                        : "";
  return "m" + std::to_string(block_m) + "n" + std::to_string(block_n) + "w" +
         std::to_string(warps) + "s" + std::to_string(stages) + suffix + (pingpong ? "-pp" : "") +
         (persistent ? "-persist" : "") + (splits > 0 ? "-split" + std::to_string(splits) : "") +
         (dq == DqMode::Separate ? "-det" : "");
}

Result<AttentionConfig> AttentionConfig::parse(const std::string& text) {
  static const std::regex pattern(
      R"(m(\d{1,4})n(\d{1,4})w(\d{1,2})s(\d{1,2})(-wgmma|-ws(-pp)?(-persist)?|-decode)?(-split(\d{1,4}))?(-det)?)");
  std::smatch match;
  if (!std::regex_match(text, match, pattern)) {
    return make_error(
        ErrorCode::InvalidArgument,
        "config = '" + text +
            "': expected the form "
            "m<block_m>n<block_n>w<warps>s<stages>[-wgmma|-ws[-pp][-persist]|-decode[-split<N>]]"
            "[-det], e.g. m128n64w4s2, m128n128w8s2-wgmma, m128n128w12s2-ws, "
            "m128n128w12s2-ws-pp-persist, m16n64w4s3-decode(-split8) or (backward, separate dQ "
            "kernel) m64n128w8s2-det");
  }
  AttentionConfig c;
  c.block_m = std::stoi(match[1]);
  c.block_n = std::stoi(match[2]);
  c.warps = std::stoi(match[3]);
  c.stages = std::stoi(match[4]);
  c.family = !match[5].matched             ? KernelFamily::Mma
             : match[5].str() == "-wgmma"  ? KernelFamily::Wgmma
             : match[5].str() == "-decode" ? KernelFamily::Decode
                                           : KernelFamily::Ws;
  c.pingpong = match[6].matched;
  c.persistent = match[7].matched;
  if (match[8].matched) {
    if (c.family != KernelFamily::Decode)
      return make_error(ErrorCode::InvalidArgument,
                        "config = '" + text + "': -split<N> is a knob of the -decode family only");
    c.splits = std::stoi(match[9]);
    if (c.splits < 1)
      return make_error(ErrorCode::InvalidArgument,
                        "config = '" + text + "': -split<N> needs N >= 1 (no suffix: auto)");
  }
  c.dq = match[10].matched ? DqMode::Separate : DqMode::Atomic;
  return c;
}

int padded_head_dim(int head_dim) { return (head_dim + 63) / 64 * 64; }

int smem_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  if (c.family == KernelFamily::Ws) return ws_resources(c, p).smem_bytes;
  if (c.family == KernelFamily::Decode) return decode_resources(c, p).smem_bytes;
  const int tiles = (c.block_m + 2 * c.stages * c.block_n) * padded_head_dim(p.head_dim) * 2;
  return c.family == KernelFamily::Wgmma ? tiles + knobs::kSwizzleAtomAlign : tiles;
}

int user_expression_registers(const AttentionProblem& p) {
  return p.variant.score_mod.empty() && p.variant.mask_mod.empty() ? 0 : 48;
}

int estimated_registers(const AttentionConfig& c, const AttentionProblem& p) {
  if (c.family == KernelFamily::Ws) return ws_resources(c, p).consumer_estimate;
  if (c.family == KernelFamily::Decode) return decode_resources(c, p).registers;
  // A user score_mod / mask_mod runs per score with temporaries of its own: at d128 the tiles of
  // 32 rows per warp spilled with one (m128n64w4s2: 164 bytes with a mask_mod against 36 plain;
  // m64n32w2s2: 24 with a score_mod against 0), and so did the wgmma tile with the widest S
  // (m64n128w4s2-wgmma: 144 bytes with both and the built-in variants, against 0 plain), so
  // they are left out.
  const int expression = user_expression_registers(p);
  if (c.family == KernelFamily::Wgmma) {
    // Per thread of a warpgroup: O (64 x d / 128 threads) and S (64 x block_n / 128) in fp32,
    // P of two blocks in flight (16-bit pairs: block_n / 4 each), plus the same allowance.
    return padded_head_dim(p.head_dim) / 2 + c.block_n / 2 + c.block_n / 2 + kRegisterAllowance +
           kRegistersPerMTile + expression + (p.variant.varlen ? kVarlenRegistersWgmma : 0);
  }
  const int m_tiles = std::max(1, c.rows_per_warp() / 16);
  const int o_accumulator = m_tiles * 16 * padded_head_dim(p.head_dim) / 32;
  const int s_accumulator = m_tiles * 16 * c.block_n / 32;
  return o_accumulator + s_accumulator + kRegisterAllowance + kRegistersPerMTile * m_tiles +
         expression;
}

ResourceUse resource_use(const AttentionConfig& c, const AttentionProblem& p,
                         const DeviceSpec& device) {
  ResourceUse use;
  if (c.family == KernelFamily::Ws) {
    // Registers are set per warpgroup by setmaxnreg; the launch takes launch_registers each.
    const WsResources ws = ws_resources(c, p);
    use.smem_bytes = ws.smem_bytes;
    use.regs_per_thread = ws.consumer_estimate;
    use.threads = ws.threads;
    const int by_smem = device.smem_per_sm / (ws.smem_bytes + knobs::kSmemReservedPerCta);
    const int by_regs = device.regs_per_sm / std::max(1, ws.launch_registers * ws.threads);
    const int by_threads = device.max_threads_per_sm / std::max(1, ws.threads);
    use.ctas_per_sm = std::max(0, std::min({by_smem, by_regs, by_threads}));
    return use;
  }
  use.smem_bytes = smem_bytes(c, p);
  use.regs_per_thread = estimated_registers(c, p);
  use.threads = c.threads();
  // Registers are allocated per warp in units of 256 (8 per thread).
  const int regs_rounded = (use.regs_per_thread + 7) / 8 * 8;
  int by_smem = device.smem_per_sm / (use.smem_bytes + knobs::kSmemReservedPerCta);
  int by_regs = device.regs_per_sm / std::max(1, regs_rounded * use.threads);
  int by_threads = device.max_threads_per_sm / std::max(1, use.threads);
  use.ctas_per_sm = std::max(0, std::min({by_smem, by_regs, by_threads}));
  return use;
}

Status check_cuda_dtype(DType dtype) {
  if (dtype == DType::F16 || dtype == DType::BF16) return ok_status();
  return make_error(ErrorCode::Unsupported,
                    std::string("dtype = ") + to_string(dtype) +
                        ": the CUDA backend supports f16 and bf16 storage only (f32 runs on the "
                        "CPU backend: --backend cpu, FLASHJIT_BACKEND=cpu)");
}

Status check_ws_knobs(const AttentionConfig& c) {
  if (c.family == KernelFamily::Ws || (!c.pingpong && !c.persistent)) return ok_status();
  return illegal(c, std::string(c.pingpong ? "ping-pong (-pp)" : "persistent (-persist)") +
                        " is a knob of the -ws family only");
}

Status check_cuda_problem(const AttentionProblem& p) {
  FLASHJIT_TRY(validate(p));
  return check_cuda_dtype(p.dtype);
}

namespace {

// The wgmma family's template constraints (static_asserts in attention_fwd_sm90.cuh) and the
// architecture: wgmma exists on sm_90a only (not sm80/89, not sm100).
Status check_wgmma_shape(const AttentionConfig& c, const DeviceSpec& device) {
  if (device.arch != 90)
    return illegal(c, "wgmma kernels need sm90 (H100/H200); this device is " + device.arch_name());
  FLASHJIT_TRY(knobs::check_choice(c, "block_m", c.block_m, kWgmmaBlockMChoices,
                                   " (64 rows per warpgroup)"));
  FLASHJIT_TRY(knobs::check_choice(c, "block_n", c.block_n, kWgmmaBlockNChoices));
  if (c.warps != c.block_m / 16)
    return illegal(c, "warps = " + std::to_string(c.warps) +
                          ": the wgmma family has block_m / 16 = " +
                          std::to_string(c.block_m / 16) + " (one warpgroup per 64 rows)");
  FLASHJIT_TRY(knobs::check_choice(c, "stages", c.stages, kStageChoices));
  return ok_status();
}

}  // namespace

Status check_config(const AttentionConfig& c, const AttentionProblem& p, const DeviceSpec& device) {
  FLASHJIT_TRY(check_ws_knobs(c));
  if (p.is_backward()) return check_backward_config(c, p, device);
  if (c.dq != DqMode::Atomic)
    return illegal(c, "-det (a separate dQ kernel) exists in the backward pass only");
  if (Status dtype = check_cuda_dtype(p.dtype); !dtype.ok())
    return illegal(c, dtype.error().message);
  if (c.family == KernelFamily::Decode) return check_decode_config(c, p, device);
  if (needs_decode_family(p)) return illegal(c, decode_only_reason(p));
  if (c.splits != 0) return illegal(c, "-split<N> is a knob of the -decode family only");
  if (c.family == KernelFamily::Ws) return check_ws_config(c, p, device);
  if (c.family == KernelFamily::Wgmma) {
    FLASHJIT_TRY(check_wgmma_shape(c, device));
    // With a user mask_mod (per-element masking of every block, over the variant's block range)
    // ptxas serializes the kernel's wgmmas at every legal d128 tile (NVRTC 13.0; correct, but the
    // tensor cores idle): the -ws and mma families take such problems.
    if (!p.variant.mask_mod.empty())
      return illegal(c,
                     "a mask_mod makes ptxas serialize the wgmma family's tensor-core ops; the "
                     "-ws and mma families take it",
                     ErrorCode::Unsupported);
  } else {
    // Template constraints (mirrored by static_asserts in templates/cuda/attention_fwd.cuh).
    FLASHJIT_TRY(knobs::check_choice(c, "block_m", c.block_m, kBlockMChoices));
    FLASHJIT_TRY(knobs::check_choice(c, "block_n", c.block_n, kBlockNChoices));
    FLASHJIT_TRY(knobs::check_choice(c, "warps", c.warps, kWarpChoices));
    FLASHJIT_TRY(knobs::check_choice(c, "stages", c.stages, kStageChoices));
    if (c.block_m % (16 * c.warps) != 0 || c.rows_per_warp() / 16 > kMaxMTilesPerWarp)
      return illegal(c, "block_m / warps = " + std::to_string(c.block_m) + " / " +
                            std::to_string(c.warps) + " must be 16 or 32 rows per warp");
  }
  const int chunks_per_row = padded_head_dim(p.head_dim) / 8;  // 16-byte copies per row
  if ((c.block_n * chunks_per_row) % c.threads() != 0 ||
      (c.block_m * chunks_per_row) % c.threads() != 0)
    return illegal(
        c, "tile copies do not divide evenly over " + std::to_string(c.threads()) + " threads");
  const bool row_stepping_loader =
      c.threads() % chunks_per_row == 0 && (c.threads() / chunks_per_row) % 8 == 0;
  const int max_copies = c.family == KernelFamily::Wgmma && row_stepping_loader
                             ? kMaxCopiesPerThreadWgmma
                             : kMaxCopiesPerThread;
  if (c.block_n * chunks_per_row / c.threads() > max_copies)
    return illegal(c, std::to_string(c.block_n * chunks_per_row / c.threads()) +
                          " K/V tile copies per thread exceed " + std::to_string(max_copies) +
                          " (too few threads for the tile: registers would spill)");
  FLASHJIT_TRY(knobs::check_threads(c, c.threads(), device));
  // SRAM budget.
  FLASHJIT_TRY(knobs::check_memory(c, "shared memory", smem_bytes(c, p), device));
  // Register budget: more than the per-thread cap would spill to local memory.
  return knobs::check_registers(c, estimated_registers(c, p), c.threads(), device);
}

namespace {

// The wgmma and -ws families' variant hooks pass their NVRTC compile tests, host emulations and
// runtime_cuda_variant_test on an H100 (every variant on mma, wgmma and -ws configs vs the fp64
// reference): a variant problem is offered the same families as the plain one. Set to false to
// serve variants from the mma family alone (named configs of the others still render and run).
constexpr bool kSm90VariantsVerifiedOnGpu = true;

bool sm90_families_offered(const AttentionProblem& p, const DeviceSpec& device) {
  return device.arch == 90 && (kSm90VariantsVerifiedOnGpu || !p.variant.active());
}

}  // namespace

std::vector<AttentionConfig> legal_configs(const AttentionProblem& p, const DeviceSpec& device) {
  if (p.is_backward()) return legal_backward_configs(p, device);
  std::vector<AttentionConfig> configs =
      knobs::legal_tiles(kBlockMChoices, kBlockNChoices, kWarpChoices, kStageChoices,
                         [&](const AttentionConfig& c) { return check_config(c, p, device); });
  if (sm90_families_offered(p, device))
    for (int block_m : kWgmmaBlockMChoices)
      for (int block_n : kWgmmaBlockNChoices)
        for (int stages : kStageChoices) {
          AttentionConfig c{block_m, block_n, block_m / 16, stages, KernelFamily::Wgmma};
          if (check_config(c, p, device).ok()) configs.push_back(c);
        }
  if (sm90_families_offered(p, device))
    for (const AttentionConfig& c : ws_candidates())
      if (check_config(c, p, device).ok()) configs.push_back(c);
  if (is_decode_problem(p))
    for (const AttentionConfig& c : legal_decode_configs(p, device)) configs.push_back(c);
  return configs;
}

Result<AttentionConfig> default_config(const AttentionProblem& p, const DeviceSpec& device) {
  if (p.is_backward()) return default_backward_config(p, device);
  FLASHJIT_TRY(check_cuda_dtype(p.dtype));
  if (is_decode_problem(p)) return default_decode_config(p, device);
  // sm90: the -ws tile where it measured faster than the wgmma default (ws_is_default).
  if (sm90_families_offered(p, device))
    if (Result<AttentionConfig> ws = default_ws_config(p, device);
        ws.ok() && ws_is_default(*ws, p) && check_config(*ws, p, device).ok())
      return *ws;  // (check_config: a tile the problem cannot run, e.g. past the registers, not)
  // Otherwise the formula picks block_m within the device's best template family: wgmma where
  // the device has it (sm90), mma.sync elsewhere.
  std::vector<AttentionConfig> legal = legal_configs(p, device);
  const bool has_wgmma = std::any_of(legal.begin(), legal.end(), [](const AttentionConfig& c) {
    return c.family == KernelFamily::Wgmma;
  });
  const KernelFamily family = has_wgmma ? KernelFamily::Wgmma : KernelFamily::Mma;
  std::erase_if(legal, [&](const AttentionConfig& c) { return c.family != family; });
  if (legal.empty())
    return make_error(
        ErrorCode::Unsupported,
        "no legal config for head_dim = " + std::to_string(p.head_dim) + " on " + device.name);
  const int target = knobs::formula_block_m(p, device);
  // The largest legal block_m at or below the formula, else the smallest legal one.
  int block_m = 0;
  for (const AttentionConfig& c : legal)
    if (c.block_m <= target) block_m = std::max(block_m, c.block_m);
  if (block_m == 0) block_m = legal.front().block_m;
  // Among those: block_n 64 if legal (else the largest legal), most warps, 2 stages.
  auto rank = [](const AttentionConfig& c) {
    return std::make_tuple(c.block_n == 64, c.block_n, c.warps, c.stages == 2);
  };
  const AttentionConfig* best = nullptr;
  for (const AttentionConfig& c : legal)
    if (c.block_m == block_m && (!best || rank(c) > rank(*best))) best = &c;
  return *best;
}

std::string explain_plan(const AttentionProblem& p, const DeviceSpec& device) {
  if (p.is_backward()) return explain_backward_plan(p, device);
  if (is_decode_problem(p)) return explain_decode_plan(p, device);
  std::ostringstream out;
  const int d = p.head_dim, dp = padded_head_dim(d);
  knobs::plan_header(out, p, device);
  knobs::plan_formula(out, p, device);
  out << "\n";
  out << "Budget of this template (2-byte elements, head dim padded to " << dp << "):\n";
  out << "  smem  = (Br + 2 * stages * Bc) * " << dp
      << " * 2 B      <= " << device.smem_per_block_optin << " B per block\n";
  out << "  regs ~= 16 * m_tiles * (" << dp << " + Bc) / 32 + " << kRegisterAllowance << " + "
      << kRegistersPerMTile << " * m_tiles + Bc * " << dp / 8
      << " / threads   <= " << device.max_regs_per_thread << " per thread\n"
      << "          (fp32 O and S accumulators + fragments and addresses + K/V copies)\n";
  out << "  rows per warp = Br / warps in {16, 32}; Br in " << list(kBlockMChoices) << ", Bc in "
      << list(kBlockNChoices) << ", warps in " << list(kWarpChoices) << ", stages in "
      << list(kStageChoices) << "\n\n";
  out << "config        smem(B)  regs~  CTAs/SM  status\n";
  knobs::for_each_tile(
      kBlockMChoices, kBlockNChoices, kWarpChoices, kStageChoices, [&](const AttentionConfig& c) {
        if (c.block_m % (16 * c.warps) != 0 || c.rows_per_warp() / 16 > kMaxMTilesPerWarp)
          return;  // not a shape the template has; listing it would only add noise
        const ResourceUse use = resource_use(c, p, device);
        char line[256];
        std::snprintf(line, sizeof line, "%-12s %8d %6d %8d  %s\n", c.to_string().c_str(),
                      use.smem_bytes, use.regs_per_thread, use.ctas_per_sm,
                      knobs::verdict(check_config(c, p, device), c, false).c_str());
        out << line;
      });
  if (device.arch == 90) {
    out << "\nwgmma family (sm_90a; 64 query rows per warpgroup of 4 warps, S = Q K^T one wgmma "
           "m64n<Bc>k16 per 16 columns of d, P V from registers):\n";
    out << "  smem  = 1024 + (Br + 2 * stages * Bc) * " << dp
        << " * 2 B   <= " << device.smem_per_block_optin << " B per block\n";
    out << "  regs ~= " << dp / 2 << " (O) + Bc / 2 (S) + 2 * Bc / 4 (P of two blocks) + "
        << kRegisterAllowance + kRegistersPerMTile << "   <= " << device.max_regs_per_thread
        << " per thread\n\n";
    out << "config              smem(B)  regs~  CTAs/SM  status\n";
    for (int block_m : kWgmmaBlockMChoices)
      for (int block_n : kWgmmaBlockNChoices)
        for (int stages : kStageChoices) {
          AttentionConfig c{block_m, block_n, block_m / 16, stages, KernelFamily::Wgmma};
          Status status = check_config(c, p, device);
          ResourceUse use = resource_use(c, p, device);
          const std::string why = knobs::verdict(status, c, false);
          char line[256];
          std::snprintf(line, sizeof line, "%-18s %8d %6d %8d  %s\n", c.to_string().c_str(),
                        use.smem_bytes, use.regs_per_thread, use.ctas_per_sm, why.c_str());
          out << line;
        }
  }
  if (device.arch == 90) out << "\n" << explain_ws_plan(p, device);
  out << "\n";
  knobs::plan_footer(out, legal_configs(p, device).size(), default_config(p, device));
  return out.str();
}

}  // namespace flashjit
