#include "generator/decode_config.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <optional>
#include <span>
#include <sstream>
#include <tuple>

#include "generator/hip_config.hpp"
#include "generator/knobs.hpp"

namespace flashjit {

namespace {

using knobs::contains;
using knobs::illegal;
using knobs::list;

constexpr int kRegisterAllowance = 32;  // addresses, loop state, softmax scalars
constexpr int kRegistersPerMTile = 8;   // m, l and the fragment rows of a 16-row tile
// 16-byte K (or V) copies per thread per block: 8 (past that the unrolled copies' addresses
// spill: 4 B at m16n128w2s2, d = 64 on sm80), or what 16 keys per warp need at the head dim
// (padded d / 16: 16 at d = 256).
int max_copies_per_thread(int padded_head_dim) { return std::max(8, padded_head_dim / 16); }
// Auto splits aim at one wave of kSplitsCtasPerSm CTAs per SM. Measured on an H100 (GQA 32:8,
// d 128, bf16, m16n64w4s3, docs/PERFORMANCE.md): contiguous K/V, the splits that make ~128 CTAs
// were the fastest of 1..32 at every batch (1: 16, 2: 8, 4: 4, 8: 2, 16: 1); 256 CTAs were 2-10%
// slower (shorter CTAs, more partials to combine), 288 or 384 (a partial second wave) slower
// still. A paged cache (a block-table load before each page's copies) needs the second CTA per
// SM to hide that latency: at one it read 80-88% of the contiguous bandwidth, at two 87-98%.
constexpr int kSplitsCtasPerSm = 1;
constexpr int kSplitsCtasPerSmPaged = 2;

std::string str(int64_t v) { return std::to_string(v); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What every backend's decode template refuses alike: another family, the backward pass,
// variants, too many queries on a contiguous cache.
Status check_decode_problem(const AttentionConfig& c, const AttentionProblem& p) {
  if (c.family != KernelFamily::Decode) return illegal(c, "not a -decode config");
  if (p.is_backward()) return illegal(c, "the -decode family is a forward kernel");
  if (p.variant.active())
    return illegal(c, "the -decode family has no attention variants (" + p.variant.key() + ") yet",
                   ErrorCode::Unsupported);
  if (!needs_decode_family(p) && p.seqlen_q > kMaxDecodeSeqlenQ)
    return illegal(c, "seqlen_q = " + str(p.seqlen_q) + ": -decode configs take at most " +
                          str(kMaxDecodeSeqlenQ) +
                          " queries per sequence on a contiguous K/V cache (paged: any)");
  return ok_status();
}

// A GPU decode template's tile choices, and how its messages name them.
struct DecodeTileChoices {
  std::span<const int> block_m, block_n, warps, stages;
  const char* block_m_note;  // what block_m counts
  const char* warps_name;    // "warps", "warps (wavefronts)"
  const char* stages_name;   // "stages", "stages (LDS buffers)"
};
constexpr DecodeTileChoices kCudaDecodeTiles{kDecodeBlockMChoices,
                                             kDecodeBlockNChoices,
                                             kDecodeWarpChoices,
                                             kDecodeStageChoices,
                                             " (packed query rows per CTA)",
                                             "warps",
                                             "stages"};
constexpr DecodeTileChoices kHipDecodeTiles{kHipDecodeBlockMChoices,
                                            kHipDecodeBlockNChoices,
                                            kHipDecodeWaveChoices,
                                            kHipStageChoices,
                                            " (packed query rows per workgroup)",
                                            "warps (wavefronts)",
                                            "stages (LDS buffers)"};

// The knobs no decode template has, and the split count's range.
Status check_decode_knobs(const AttentionConfig& c) {
  if (c.dq != DqMode::Atomic) return illegal(c, "-det exists in the backward pass only");
  if (c.pingpong || c.persistent) return illegal(c, "-pp and -persist are knobs of -ws only");
  if (c.splits < 0 || c.splits > kMaxDecodeSplits)
    return illegal(c, "splits = " + str(c.splits) + ": must be 0 (auto) or in [1, " +
                          str(kMaxDecodeSplits) + "]");
  return ok_status();
}

// Those, and a GPU template's tile among `tiles`.
Status check_decode_knobs(const AttentionConfig& c, const DecodeTileChoices& tiles) {
  FLASHJIT_TRY(check_decode_knobs(c));
  FLASHJIT_TRY(knobs::check_choice(c, "block_m", c.block_m, tiles.block_m, tiles.block_m_note));
  FLASHJIT_TRY(knobs::check_choice(c, "block_n", c.block_n, tiles.block_n));
  FLASHJIT_TRY(knobs::check_choice(c, tiles.warps_name, c.warps, tiles.warps));
  return knobs::check_choice(c, tiles.stages_name, c.stages, tiles.stages);
}

// The tiles of `tiles` (splits = auto) in AttentionConfig order.
std::vector<AttentionConfig> decode_tiles(const DecodeTileChoices& tiles) {
  std::vector<AttentionConfig> out;
  knobs::for_each_tile(tiles.block_m, tiles.block_n, tiles.warps, tiles.stages,
                       [&](AttentionConfig c) {
                         c.family = KernelFamily::Decode;
                         out.push_back(c);
                       });
  return out;
}

}  // namespace

bool needs_decode_family(const AttentionProblem& p) { return p.kv.paged() || p.kv.seqlens_k; }

std::string decode_only_reason(const AttentionProblem& p) {
  return std::string(p.kv.paged() ? "a paged K/V cache" : "per-sequence key counts (seqlens_k)") +
         " is read by the -decode family only (e.g. m16n64w4s3-decode)";
}

bool is_decode_problem(const AttentionProblem& p) {
  if (p.is_backward() || p.variant.active()) return false;  // variants: the prefill families
  return needs_decode_family(p) ||
         (p.seqlen_q <= kMaxDecodeSeqlenQ && p.seqlen_k >= kMinDecodeSeqlenK);
}

int64_t decode_packed_rows(const AttentionProblem& p) { return p.group_size() * p.seqlen_q; }

int64_t decode_row_tiles(const AttentionConfig& c, const AttentionProblem& p) {
  return ceil_div(decode_packed_rows(p), c.block_m);
}

int64_t decode_key_blocks(const AttentionConfig& c, const AttentionProblem& p) {
  return ceil_div(p.seqlen_k, c.block_n);
}

int decode_splits(const AttentionConfig& c, const AttentionProblem& p, int processors,
                  int per_processor) {
  const int64_t blocks = std::max<int64_t>(1, decode_key_blocks(c, p));
  if (c.splits > 0) return static_cast<int>(std::min<int64_t>(c.splits, blocks));
  const int64_t tiles = p.batch * p.heads_kv * decode_row_tiles(c, p);
  // Whole waves: as many splits as fit the slots (processors x per_processor) in one wave. A
  // partial second wave (ceil) would run its CTAs after the first at a fraction of the device's
  // bandwidth: 288 CTAs on 264 slots take nearly two CTA lifetimes, 256 take one.
  const int64_t wanted = std::max<int64_t>(
      1, int64_t{std::max(1, processors)} * per_processor / std::max<int64_t>(1, tiles));
  const int64_t splits =
      std::clamp<int64_t>(wanted, 1, std::min<int64_t>(blocks, kMaxDecodeSplits));
  // Even ranges: as many splits as needed for ceil(blocks / splits) blocks each.
  return static_cast<int>(ceil_div(blocks, ceil_div(blocks, splits)));
}

int decode_splits(const AttentionConfig& c, const AttentionProblem& p, const DeviceSpec& device) {
  return decode_splits(c, p, device.sm_count,
                       p.kv.paged() ? kSplitsCtasPerSmPaged : kSplitsCtasPerSm);
}

// ---- CUDA ---------------------------------------------------------------------------------------

DecodeResources decode_resources(const AttentionConfig& c, const AttentionProblem& p) {
  DecodeResources r;
  const int dp = padded_head_dim(p.head_dim);
  const int m_tiles = std::max(1, c.block_m / 16);
  const int warp_keys = c.block_n / std::max(1, c.warps);
  r.threads = c.warps * 32;
  r.copies = c.block_n * (dp / 8) / std::max(1, r.threads);
  const int q_tile = c.block_m * dp * 2;
  const int kv_tiles = 2 * c.stages * c.block_n * dp * 2;
  const int merge = c.warps * c.block_m * (dp + 2) * 4;  // each warp's O, m and l in fp32
  r.smem_bytes = q_tile + std::max(kv_tiles, merge);
  // O and S accumulators, P packed, the allowance, and a 64-bit address per paged copy.
  r.registers = m_tiles * dp / 2 + m_tiles * warp_keys / 2 + m_tiles * warp_keys / 4 +
                kRegisterAllowance + kRegistersPerMTile * m_tiles +
                (p.kv.paged() ? 2 * r.copies : 0);
  return r;
}

Status check_decode_config(const AttentionConfig& c, const AttentionProblem& p,
                           const DeviceSpec& device) {
  FLASHJIT_TRY(check_decode_problem(c, p));
  if (device.is_amd() || device.is_cpu())
    return illegal(c,
                   "this is the CUDA budget: the HIP decode template's is check_hip_decode_config");
  if (device.arch < 80)
    return illegal(c, "the -decode family needs sm80 or newer (mma.sync bf16, cp.async)");
  FLASHJIT_TRY(check_decode_knobs(c, kCudaDecodeTiles));
  const int warp_keys = c.block_n / c.warps;
  if (warp_keys % 16 != 0)
    return illegal(c, "block_n / warps = " + str(warp_keys) +
                          " keys per warp: must be a multiple of 16 (P feeds P V in k-steps "
                          "of 16)");
  const DecodeResources r = decode_resources(c, p);
  const int chunks = c.block_n * (padded_head_dim(p.head_dim) / 8);
  if (chunks % r.threads != 0)
    return illegal(c, "K/V tile copies do not divide evenly over " + str(r.threads) + " threads");
  const int max_copies = max_copies_per_thread(padded_head_dim(p.head_dim));
  if (r.copies > max_copies)
    return illegal(c, str(r.copies) + " K/V tile copies per thread exceed " + str(max_copies) +
                          " (too few threads for the tile)");
  FLASHJIT_TRY(knobs::check_threads(c, r.threads, device));
  FLASHJIT_TRY(knobs::check_memory(c, "shared memory", r.smem_bytes, device));
  return knobs::check_registers(c, r.registers, 0, device);  // the per-thread cap alone
}

namespace {

// block_m 32 only when the packed rows need more than 16 (else half its rows are padding).
bool useful_block_m(const AttentionConfig& c, const AttentionProblem& p) {
  return c.block_m == 16 || decode_packed_rows(p) > 16;
}

// The tile with auto splits, then each explicit split count up to the key blocks.
void append_splits(const AttentionConfig& tile, const AttentionProblem& p,
                   std::vector<AttentionConfig>& out) {
  out.push_back(tile);
  const int64_t blocks = decode_key_blocks(tile, p);
  for (int s : kDecodeSplitChoices) {
    if (s > blocks) break;
    AttentionConfig c = tile;
    c.splits = s;
    out.push_back(c);
  }
}

// The useful tiles of `tiles` that `check` accepts, each with its split counts.
template <class Check>
std::vector<AttentionConfig> legal_tiles_with_splits(const std::vector<AttentionConfig>& tiles,
                                                     const AttentionProblem& p,
                                                     const Check& check) {
  std::vector<AttentionConfig> out;
  for (const AttentionConfig& tile : tiles)
    if (useful_block_m(tile, p) && check(tile).ok()) append_splits(tile, p, out);
  return out;
}

// A GPU decode plan's first lines: the device, the problem, its packed rows.
void decode_plan_header(std::ostream& out, const AttentionProblem& p, const DeviceSpec& device) {
  knobs::plan_header(out, p, device);
  out << "Decode (split-KV, flash-decoding): " << p.group_size() << " query heads x " << p.seqlen_q
      << " queries = " << decode_packed_rows(p)
      << " packed rows per (batch, kv head); K/V read once per group.\n";
}

// A GPU decode plan's last line: the legal count, beside the prefill `prefill` unless the problem
// needs the decode family, and the default with its splits on the device.
void decode_plan_footer(std::ostream& out, const AttentionProblem& p, size_t legal,
                        const char* prefill, const Result<AttentionConfig>& def, int splits) {
  out << "\n" << legal << " legal -decode configs (tiles x splits)";
  if (!needs_decode_family(p)) out << ", beside the prefill " << prefill << " (tuned together)";
  out << ".";
  if (def.ok())
    out << " Default (untuned): " << def->to_string() << " (splits " << splits << " here)\n";
  else
    out << " " << def.error().message << "\n";
}

}  // namespace

std::vector<AttentionConfig> legal_decode_configs(const AttentionProblem& p,
                                                  const DeviceSpec& device) {
  return legal_tiles_with_splits(
      decode_tiles(kCudaDecodeTiles), p,
      [&](const AttentionConfig& tile) { return check_decode_config(tile, p, device); });
}

Result<AttentionConfig> default_decode_config(const AttentionProblem& p, const DeviceSpec& device) {
  const int block_m = decode_packed_rows(p) > 16 ? 32 : 16;
  // Two CTAs per SM when the smem allows (room for a CTA of the next call or the combine): the
  // most stages that leave room for a second CTA, else the fewest.
  auto two_per_sm = [&](const AttentionConfig& c) {
    return 2 * (decode_resources(c, p).smem_bytes + 1024) <= device.smem_per_sm;
  };
  auto rank = [&](const AttentionConfig& c) {
    return std::make_tuple(c.block_m == block_m, two_per_sm(c),
                           two_per_sm(c) ? c.stages : -c.stages);
  };
  const AttentionConfig* best = nullptr;
  const std::vector<AttentionConfig> tiles = decode_tiles(kCudaDecodeTiles);
  for (const AttentionConfig& c : tiles) {
    if (c.block_n != 64 || c.warps != 4) continue;
    if (!check_decode_config(c, p, device).ok()) continue;
    if (!best || rank(c) > rank(*best)) best = &c;
  }
  if (best) return *best;
  for (const AttentionConfig& c : tiles)
    if (check_decode_config(c, p, device).ok()) return c;
  return make_error(ErrorCode::Unsupported, "no legal -decode config for head_dim = " +
                                                str(p.head_dim) + " on " + device.name);
}

std::string explain_decode_plan(const AttentionProblem& p, const DeviceSpec& device) {
  std::ostringstream out;
  const int dp = padded_head_dim(p.head_dim);
  decode_plan_header(out, p, device);
  out << "Budget of templates/cuda/decode.cuh (2-byte elements, head dim padded to " << dp
      << "):\n";
  out << "  smem  = Bm * " << dp << " * 2 + max(2 * stages * Bc * " << dp << " * 2, warps * Bm * "
      << dp + 2 << " * 4) B   <= " << device.smem_per_block_optin << " B per block\n";
  out << "  regs ~= m_tiles * (" << dp / 2 << " + 3 * Bc / warps / 4) + " << kRegisterAllowance
      << " + " << kRegistersPerMTile << " * m_tiles"
      << (p.kv.paged() ? " + 2 * copies (page addresses)" : "")
      << "   <= " << device.max_regs_per_thread << " per thread\n";
  out << "  Bm in " << list(kDecodeBlockMChoices) << ", Bc in " << list(kDecodeBlockNChoices)
      << ", warps in " << list(kDecodeWarpChoices) << " (Bc / warps keys each, a multiple of 16)"
      << ", stages in " << list(kDecodeStageChoices) << "\n";
  out << "  splits: auto = floor(" << device.sm_count << " SMs * "
      << (p.kv.paged() ? kSplitsCtasPerSmPaged : kSplitsCtasPerSm)
      << " / (batch * heads_kv * row tiles)) within [1, key blocks], or one of "
      << list(kDecodeSplitChoices) << "\n\n";
  out << "config                   smem(B)  regs~  splits(auto)  status\n";
  for (const AttentionConfig& c : decode_tiles(kCudaDecodeTiles)) {
    if (!useful_block_m(c, p)) continue;
    const Status status = check_decode_config(c, p, device);
    const DecodeResources r = decode_resources(c, p);
    char line[512];
    std::snprintf(line, sizeof line, "%-24s %7d %6d %13d  %s\n", c.to_string().c_str(),
                  r.smem_bytes, r.registers, decode_splits(c, p, device),
                  knobs::verdict(status, c).c_str());
    out << line;
  }
  const Result<AttentionConfig> def = default_decode_config(p, device);
  decode_plan_footer(out, p, legal_decode_configs(p, device).size(), "families'", def,
                     def.ok() ? decode_splits(*def, p, device) : 0);
  return out.str();
}

// ---- HIP ----------------------------------------------------------------------------------------

namespace {

constexpr int kHipRegisterAllowance = 48;  // as the forward's (hip_config.cpp)
constexpr int kHipVRowPadding = 4;         // elements of padding per V^T row (hip/tiles.hpp)
// Auto splits: workgroups per CU in one wave. Not measured (no AMD GPU has run the template):
// the paged CUDA figure, whose second CTA per SM hid the block-table loads.
constexpr int kHipSplitsPerCu = 2;

int hip_decode_copies(const AttentionConfig& c, const AttentionProblem& p) {
  return c.block_n * (padded_head_dim(p.head_dim) / 8) / std::max(1, c.warps * kHipWaveSize);
}

}  // namespace

int hip_decode_lds_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  const int dp = padded_head_dim(p.head_dim);
  const int kv = c.stages * (c.block_n * dp + dp * (c.block_n + kHipVRowPadding)) * 2;
  const int merge = c.warps * c.block_m * (dp + 2) * 4;
  return std::max(kv, merge);
}

int hip_decode_estimated_registers(const AttentionConfig& c, const AttentionProblem& p) {
  const int m_tiles = std::max(1, c.block_m / 16);
  const int dp = padded_head_dim(p.head_dim);
  const int wave_keys = c.block_n / std::max(1, c.warps);
  const int copies = hip_decode_copies(c, p);
  return m_tiles * (dp / 4 + wave_keys / 4 + wave_keys / 8 + dp / 8) + 2 * copies * 4 +
         (p.kv.paged() ? 2 * copies : 0) + kHipRegisterAllowance;
}

int hip_decode_splits(const AttentionConfig& c, const AttentionProblem& p,
                      const DeviceSpec& device) {
  return decode_splits(c, p, device.sm_count, kHipSplitsPerCu);
}

Status check_hip_decode_config(const AttentionConfig& c, const AttentionProblem& p,
                               const DeviceSpec& device) {
  FLASHJIT_TRY(check_decode_problem(c, p));
  if (!device.is_amd())
    return illegal(c, "this is the HIP budget: " + device.name + " is not an AMD GPU");
  if (p.dtype != DType::F16 && p.dtype != DType::BF16)
    return illegal(c, std::string("dtype = ") + to_string(p.dtype) +
                          ": the HIP templates support f16 and bf16 storage only (MFMA operands)");
  FLASHJIT_TRY(check_decode_knobs(c, kHipDecodeTiles));
  if ((c.block_n / c.warps) % 16 != 0)
    return illegal(c, "block_n / waves = " + str(c.block_n / c.warps) +
                          " keys per wave: must be a multiple of 16 (MFMA tiles)");
  const int accumulator = c.block_m / 16 * padded_head_dim(p.head_dim) / 4;
  if (accumulator > kHipMaxAccumulatorPerLane)
    return illegal(c, "the O accumulator takes " + str(accumulator) +
                          " registers per lane, more than " + str(kHipMaxAccumulatorPerLane) +
                          " (32 rows at this head dim spill to scratch)");
  const int threads = c.warps * kHipWaveSize;
  if (c.block_n * (padded_head_dim(p.head_dim) / 8) % threads != 0)
    return illegal(c, "K/V tile copies do not divide evenly over " + str(threads) + " threads");
  const int copies = hip_decode_copies(c, p);
  if (copies > kHipMaxCopiesPerThread)
    return illegal(c, str(copies) + " K/V tile copies per thread exceed " +
                          str(kHipMaxCopiesPerThread) +
                          " (too few threads for the tile: registers would spill)");
  FLASHJIT_TRY(knobs::check_threads(c, threads, device, "workgroup"));
  FLASHJIT_TRY(knobs::check_memory(c, "LDS", hip_decode_lds_bytes(c, p), device, "workgroup"));
  const int regs = hip_decode_estimated_registers(c, p);
  const int budget = hip_wave_register_budget(c.warps, device);
  if (regs > budget)
    return illegal(c, "estimated " + str(regs) + " registers per lane exceed " + str(budget) +
                          " (" + str(c.warps) + " waves on " + str(kHipSimdsPerCu) + " SIMDs)");
  return ok_status();
}

std::vector<AttentionConfig> legal_hip_decode_configs(const AttentionProblem& p,
                                                      const DeviceSpec& device) {
  return legal_tiles_with_splits(
      decode_tiles(kHipDecodeTiles), p,
      [&](const AttentionConfig& tile) { return check_hip_decode_config(tile, p, device); });
}

Result<AttentionConfig> default_hip_decode_config(const AttentionProblem& p,
                                                  const DeviceSpec& device) {
  const int block_m = decode_packed_rows(p) > 16 ? 32 : 16;
  // Not measured (no AMD GPU has run it): room for a second workgroup per CU first (a
  // memory-bound kernel hides its load latency with more waves in flight), then the most waves,
  // block_n 64, the most stages.
  auto rank = [&](const AttentionConfig& c) {
    const bool two_per_cu = 2 * hip_decode_lds_bytes(c, p) <= device.smem_per_sm;
    return std::make_tuple(c.block_m == block_m, two_per_cu, c.warps, c.block_n == 64, c.stages);
  };
  std::optional<AttentionConfig> best;
  for (const AttentionConfig& c : decode_tiles(kHipDecodeTiles))
    if (check_hip_decode_config(c, p, device).ok() && (!best || rank(c) > rank(*best))) best = c;
  if (!best)
    return make_error(ErrorCode::Unsupported, "no legal HIP -decode config for head_dim = " +
                                                  str(p.head_dim) + " on " + device.name);
  return *best;
}

std::string explain_hip_decode_plan(const AttentionProblem& p, const DeviceSpec& device) {
  std::ostringstream out;
  const int dp = padded_head_dim(p.head_dim);
  decode_plan_header(out, p, device);
  out << "Budget of templates/hip/decode.hpp (MFMA 16x16x16, wave" << kHipWaveSize
      << ", 2-byte elements, head dim padded to " << dp << "):\n";
  out << "  LDS   = max(stages * (Bc * " << dp << " + " << dp << " * (Bc + " << kHipVRowPadding
      << ")) * 2, waves * Bm * " << dp + 2 << " * 4) B   <= " << device.smem_per_block_optin
      << " B per workgroup\n";
  out << "  regs ~= Bm/16 * (" << dp / 4 << " + 3 * Bc / waves / 8 + " << dp / 8 << ") + 8 * copies"
      << (p.kv.paged() ? " + 2 * copies (page addresses)" : "") << " + " << kHipRegisterAllowance
      << "   <= " << device.regs_per_sm / (kHipSimdsPerCu * kHipWaveSize)
      << " per lane, halved past 4 waves\n";
  out << "  Bm in " << list(kHipDecodeBlockMChoices) << ", Bc in " << list(kHipDecodeBlockNChoices)
      << ", waves in " << list(kHipDecodeWaveChoices)
      << " (Bc / waves keys each, a multiple of 16), stages in " << list(kHipStageChoices) << "\n";
  out << "  splits: auto = floor(" << device.sm_count << " CUs * " << kHipSplitsPerCu
      << " / (batch * heads_kv * row tiles)) within [1, key blocks], or one of "
      << list(kDecodeSplitChoices) << "\n\n";
  out << "config                   LDS(B)  regs~  splits(auto)  status\n";
  for (const AttentionConfig& c : decode_tiles(kHipDecodeTiles)) {
    if (!useful_block_m(c, p)) continue;
    char line[512];
    std::snprintf(line, sizeof line, "%-24s %7d %6d %13d  %s\n", c.to_string().c_str(),
                  hip_decode_lds_bytes(c, p), hip_decode_estimated_registers(c, p),
                  hip_decode_splits(c, p, device),
                  knobs::verdict(check_hip_decode_config(c, p, device), c).c_str());
    out << line;
  }
  const Result<AttentionConfig> def = default_hip_decode_config(p, device);
  decode_plan_footer(out, p, legal_hip_decode_configs(p, device).size(), "configs", def,
                     def.ok() ? hip_decode_splits(*def, p, device) : 0);
  return out.str();
}

// ---- CPU ----------------------------------------------------------------------------------------

int64_t cpu_decode_scratch_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  const int64_t d = p.head_dim, m = c.block_m, n = c.block_n;
  return 4 * (m * d + 2 * n * d + m * n + m * d + 2 * m);
}

Status check_cpu_decode_config(const AttentionConfig& c, const AttentionProblem& p,
                               const CpuSpec& cpu) {
  FLASHJIT_TRY(check_decode_problem(c, p));
  FLASHJIT_TRY(check_decode_knobs(c));
  if (!contains(kCpuDecodeBlockMChoices, c.block_m))
    return illegal(c, "block_m = " + str(c.block_m) + ": the CPU decode template takes one of " +
                          list(kCpuDecodeBlockMChoices) + " (packed query rows per work item)");
  if (!contains(kCpuDecodeBlockNChoices, c.block_n))
    return illegal(c, "block_n = " + str(c.block_n) + ": the CPU decode template takes one of " +
                          list(kCpuDecodeBlockNChoices));
  if (c.warps != 1 || c.stages != 1)
    return illegal(c, "warps = " + str(c.warps) + ", stages = " + str(c.stages) +
                          ": must be 1 on the CPU (one work item per core, no pipeline)");
  const int64_t bytes = cpu_decode_scratch_bytes(c, p);
  if (bytes > cpu.l2_bytes)
    return illegal(c, "working set " + str(bytes) + " B exceeds the L2 (" + str(cpu.l2_bytes) +
                          " B per core)");
  return ok_status();
}

namespace {

// block_m: the packed rows rounded up to a choice (the largest choice for more rows).
int cpu_block_m_for(const AttentionProblem& p) {
  const int64_t rows = decode_packed_rows(p);
  for (int m : kCpuDecodeBlockMChoices)
    if (rows <= m) return m;
  return kCpuDecodeBlockMChoices[std::size(kCpuDecodeBlockMChoices) - 1];
}

}  // namespace

std::vector<AttentionConfig> legal_cpu_decode_configs(const AttentionProblem& p,
                                                      const CpuSpec& cpu) {
  std::vector<AttentionConfig> out;
  // block_m: the one that fits the packed rows (a larger one only adds padding rows).
  const int m = cpu_block_m_for(p);
  for (int n : kCpuDecodeBlockNChoices) {
    AttentionConfig c{m, n, 1, 1, KernelFamily::Decode};
    if (check_cpu_decode_config(c, p, cpu).ok()) append_splits(c, p, out);
  }
  return out;
}

Result<AttentionConfig> default_cpu_decode_config(const AttentionProblem& p, const CpuSpec& cpu) {
  const int m = cpu_block_m_for(p);
  std::optional<AttentionConfig> best;
  for (int n : kCpuDecodeBlockNChoices) {
    AttentionConfig c{m, n, 1, 1, KernelFamily::Decode};
    if (check_cpu_decode_config(c, p, cpu).ok() && (!best || n <= 128)) best = c;
  }
  if (!best)
    return make_error(ErrorCode::Unsupported,
                      "no CPU -decode config fits head_dim = " + str(p.head_dim) + " in an L2 of " +
                          str(cpu.l2_bytes) + " B");
  return *best;
}

int cpu_decode_splits(const AttentionConfig& c, const AttentionProblem& p, const CpuSpec& cpu) {
  return decode_splits(c, p, cpu.cores, 2);
}

std::string explain_cpu_decode_plan(const AttentionProblem& p, const CpuSpec& cpu) {
  std::ostringstream out;
  knobs::plan_header(out, p, "cpu:     ", cpu.to_string());
  out << "Decode (split-KV) on the CPU: work items (split, row tile of Bm packed rows, kv head, "
         "batch); "
      << decode_packed_rows(p) << " packed rows per (batch, kv head).\n";
  out << "  scratch = 4 * (2 * Bm * d + 2 * Bc * d + Bm * Bc + 2 * Bm) B <= L2 (" << cpu.l2_bytes
      << " B)\n";
  out << "  splits: auto = floor(" << cpu.cores
      << " cores * 2 / (batch * heads_kv * row tiles)) within [1, key blocks]\n\n";
  for (int n : kCpuDecodeBlockNChoices) {
    AttentionConfig c{cpu_block_m_for(p), n, 1, 1, KernelFamily::Decode};
    char line[512];
    std::snprintf(line, sizeof line, "%-22s %9lld B  splits(auto) %4d  %s\n", c.to_string().c_str(),
                  static_cast<long long>(cpu_decode_scratch_bytes(c, p)),
                  cpu_decode_splits(c, p, cpu),
                  knobs::verdict(check_cpu_decode_config(c, p, cpu), c).c_str());
    out << line;
  }
  const auto legal = legal_cpu_decode_configs(p, cpu);
  out << "\n" << legal.size() << " legal -decode configs (tiles x splits).";
  if (auto def = default_cpu_decode_config(p, cpu); def.ok())
    out << " Default (untuned): " << def->to_string() << "\n";
  else
    out << " " << def.error().message << "\n";
  return out.str();
}

}  // namespace flashjit
