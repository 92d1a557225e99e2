#include "generator/cpu_config.hpp"

#include <algorithm>
#include <cstdio>
#include <span>
#include <sstream>

#include "generator/decode_config.hpp"
#include "generator/knobs.hpp"

namespace flashjit {
namespace {

std::string list(std::span<const int> values) {
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  return out + "}";
}

std::string kib(int64_t bytes) { return std::to_string(bytes / 1024) + " KiB"; }

bool contains(std::span<const int> values, int value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

std::span<const int> cpu_block_m_choices(const AttentionProblem& p) {
  if (p.is_backward()) return kCpuBackwardBlockMChoices;
  return kCpuBlockMChoices;
}
std::span<const int> cpu_block_n_choices(const AttentionProblem& p) {
  if (p.is_backward()) return kCpuBackwardBlockNChoices;
  return kCpuBlockNChoices;
}
const char* pass_note(const AttentionProblem& p) { return p.is_backward() ? " (backward)" : ""; }

// The CPU config of (block_m, block_n, dq): warps = stages = 1 (the forward's dq: Atomic).
AttentionConfig cpu_config(int block_m, int block_n, DqMode dq = DqMode::Atomic) {
  AttentionConfig c{block_m, block_n, 1, 1};
  c.dq = dq;
  return c;
}

// The backward's dQ modes in order of preference (legal_cpu_configs takes the first that fits).
constexpr DqMode kCpuBackwardDqModes[] = {DqMode::Atomic, DqMode::Separate};

}  // namespace

std::string CpuSpec::isa() const {
  std::string out;
  for (const auto& [present, name] : {std::pair<bool, const char*>{avx512f, "avx512f"},
                                      {avx512bf16, "avx512bf16"},
                                      {avx2, "avx2"},
                                      {fma, "fma"},
                                      {f16c, "f16c"}}) {
    if (!present) continue;
    if (!out.empty()) out += " ";
    out += name;
  }
  return out.empty() ? "baseline" : out;
}

std::string CpuSpec::to_string() const {
  std::string out = model;
  out += " (";
  out += std::to_string(cores);
  out += cores == 1 ? " core, L1d " : " cores, L1d ";
  out += kib(l1d_bytes);
  out += ", L2 ";
  out += kib(l2_bytes);
  out += ", L3 ";
  out += kib(l3_bytes);
  out += ", ";
  out += isa();
  out += ")";
  return out;
}

CpuSpec known_cpu() {
  CpuSpec cpu;
  cpu.model = "x86-64 (table)";
  cpu.cores = 4;
  cpu.l1d_bytes = 32 << 10;
  cpu.l2_bytes = 1 << 20;
  cpu.l3_bytes = 32 << 20;
  cpu.avx2 = cpu.fma = cpu.f16c = true;
  return cpu;
}

CpuSpec unlimited_cpu() {
  CpuSpec unlimited;
  unlimited.l1d_bytes = unlimited.l2_bytes = int64_t{1} << 40;
  return unlimited;
}

DeviceSpec cpu_device_spec(const CpuSpec& cpu) {
  DeviceSpec spec;
  spec.name = cpu.model;
  spec.arch = 0;
  spec.sm_count = cpu.cores;
  const int64_t int_max = 0x7fffffff;
  spec.smem_per_block_optin = static_cast<int>(std::min(cpu.l2_bytes, int_max));
  spec.smem_per_sm = spec.smem_per_block_optin;
  spec.regs_per_sm = 0;
  spec.max_regs_per_thread = 0;
  spec.max_threads_per_sm = 1;
  spec.max_threads_per_block = 1;
  spec.l2_bytes =
      static_cast<int>(std::min(cpu.l3_bytes > 0 ? cpu.l3_bytes : cpu.l2_bytes, int_max));
  return spec;
}

int64_t cpu_working_set_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  const int64_t d = p.head_dim, m = c.block_m, n = c.block_n;
  return 4 * (m * d + 2 * n * d + m * n + m * d + 3 * m);
}

int64_t cpu_kv_block_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  return 8 * static_cast<int64_t>(c.block_n) * p.head_dim;
}

int64_t cpu_score_block_bytes(const AttentionConfig& c) {
  return 4 * static_cast<int64_t>(c.block_m) * c.block_n;
}

int cpu_vector_registers(const CpuSpec& cpu) { return cpu.avx512f ? 32 : 16; }

int cpu_vector_lanes(const CpuSpec& cpu) { return cpu.avx512f ? 16 : cpu.avx2 ? 8 : 4; }

int cpu_tile_queries(const CpuSpec& cpu) { return cpu.avx512f ? 64 : 16; }

bool cpu_forward_candidate(const AttentionConfig& c, const CpuSpec& cpu) {
  return c.block_m >= kCpuMinCandidateBlockM && cpu_score_block_bytes(c) <= cpu.l1d_bytes;
}

int64_t cpu_backward_dkdv_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  const int64_t d = p.head_dim, m = c.block_m, n = c.block_n;
  const int64_t fused =
      c.dq == DqMode::Atomic ? n * ((d + 15) / 16 * 16) + m * ((d + 63) / 64 * 64) : 0;
  return 4 * (4 * n * d + 2 * m * d + 2 * m * n + fused);
}

int64_t cpu_backward_dq_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  if (c.dq == DqMode::Atomic) return 0;
  const int64_t d = p.head_dim, m = c.block_m, n = c.block_n;
  return 4 * (3 * m * d + 2 * n * d + 2 * n * m);
}

int64_t cpu_backward_working_set_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  return std::max(cpu_backward_dkdv_bytes(c, p), cpu_backward_dq_bytes(c, p));
}

int64_t cpu_backward_score_bytes(const AttentionConfig& c) {
  return 8 * static_cast<int64_t>(c.block_m) * c.block_n;
}

int64_t cpu_scratch_bytes(const AttentionConfig& c, const AttentionProblem& p) {
  if (c.family == KernelFamily::Decode) return cpu_decode_scratch_bytes(c, p);
  return p.is_backward() ? cpu_backward_working_set_bytes(c, p) : cpu_working_set_bytes(c, p);
}

int cpu_backward_dq_splits(const AttentionConfig& c, const AttentionProblem& p, int threads) {
  if (c.dq != DqMode::Atomic || threads <= 1) return 1;
  const int64_t items = p.batch * p.heads_kv;
  const int64_t wanted = kCpuBackwardItemsPerThread * static_cast<int64_t>(threads);
  if (items >= wanted) return 1;
  const int64_t splits = (wanted + items - 1) / items;
  const int64_t key_blocks = (p.seqlen_k + c.block_n - 1) / c.block_n;
  return static_cast<int>(std::max<int64_t>(1, std::min(splits, key_blocks)));
}

Status check_cpu_config(const AttentionConfig& c, const AttentionProblem& p, const CpuSpec& cpu) {
  // The decode family (split-KV, paged K/V) has a budget of its own: generator/decode_config.hpp.
  if (c.family == KernelFamily::Decode) return check_cpu_decode_config(c, p, cpu);
  const std::string prefix = "config " + c.to_string() + ": ";
  if (needs_decode_family(p))
    return make_error(ErrorCode::InvalidArgument, prefix + decode_only_reason(p));
  const std::span<const int> m_choices = cpu_block_m_choices(p), n_choices = cpu_block_n_choices(p);
  if (!contains(m_choices, c.block_m)) {
    return make_error(ErrorCode::InvalidArgument,
                      prefix + "block_m = " + std::to_string(c.block_m) +
                          ": the CPU template takes one of " + list(m_choices) + pass_note(p));
  }
  if (!contains(n_choices, c.block_n)) {
    return make_error(ErrorCode::InvalidArgument,
                      prefix + "block_n = " + std::to_string(c.block_n) +
                          ": the CPU template takes one of " + list(n_choices) + pass_note(p));
  }
  if (c.warps != 1 || c.stages != 1) {
    return make_error(ErrorCode::InvalidArgument,
                      prefix + "warps = " + std::to_string(c.warps) +
                          ", stages = " + std::to_string(c.stages) +
                          ": must be 1 on the CPU (one work item per core, no pipeline)");
  }
  if (p.head_dim < kMinHeadDim || p.head_dim > kMaxHeadDim || p.head_dim % 8 != 0) {
    return make_error(ErrorCode::InvalidArgument, prefix +
                                                      "head_dim = " + std::to_string(p.head_dim) +
                                                      ": must be a multiple of 8 in [8, 256]");
  }
  if (c.family != KernelFamily::Mma) {
    return make_error(ErrorCode::InvalidArgument,
                      prefix + (c.family == KernelFamily::Ws ? "-ws" : "-wgmma") +
                          " is a CUDA (sm90) family: the CPU has one template");
  }
  if (c.pingpong || c.persistent) {
    return make_error(ErrorCode::InvalidArgument,
                      prefix + "-pp and -persist are knobs of the CUDA -ws family");
  }
  if (!p.is_backward() && c.dq != DqMode::Atomic) {
    return make_error(ErrorCode::InvalidArgument,
                      prefix + "-det (a separate dQ pass) exists in the backward pass only");
  }
  const int64_t bytes = cpu_scratch_bytes(c, p);
  if (bytes > cpu.l2_bytes) {
    return make_error(ErrorCode::InvalidArgument,
                      prefix + "working set " + std::to_string(bytes) + " B exceeds the L2 (" +
                          std::to_string(cpu.l2_bytes) + " B per core)");
  }
  return ok_status();
}

std::vector<AttentionConfig> legal_cpu_configs(const AttentionProblem& p, const CpuSpec& cpu) {
  std::vector<AttentionConfig> out;
  const std::span<const DqMode> dq_modes =
      p.is_backward() ? std::span<const DqMode>(kCpuBackwardDqModes)
                      : std::span<const DqMode>(kCpuBackwardDqModes).first(1);
  for (int m : cpu_block_m_choices(p))
    for (int n : cpu_block_n_choices(p))
      for (DqMode dq : dq_modes) {  // the first mode that fits: -det only without the fused dQ
        const AttentionConfig c = cpu_config(m, n, dq);
        if (check_cpu_config(c, p, cpu).ok()) {
          out.push_back(c);
          break;
        }
      }
  // The forward's candidates: those that suit the caches (all that fit, where none does).
  if (!p.is_backward()) {
    std::vector<AttentionConfig> candidates;
    for (const AttentionConfig& c : out)
      if (cpu_forward_candidate(c, cpu)) candidates.push_back(c);
    if (!candidates.empty()) out = std::move(candidates);
  }
  if (is_decode_problem(p))
    for (const AttentionConfig& c : legal_cpu_decode_configs(p, cpu)) out.push_back(c);
  return out;
}

namespace {

// block_n with the S^T block (4 * block_m * block_n bytes) within half the L1d.
int64_t target_block_n(int block_m, const CpuSpec& cpu) {
  return cpu.l1d_bytes / 2 / (4 * static_cast<int64_t>(block_m));
}

// Backward: block_m with both score blocks (8 * block_m * block_n bytes) within the L1d.
int64_t backward_target_block_m(int block_n, const CpuSpec& cpu) {
  return cpu.l1d_bytes / (8 * static_cast<int64_t>(block_n));
}

// The values of `knob` among the `legal` configs (those whose `where` knob is `value`, if given).
std::vector<int> knob_values(const std::vector<AttentionConfig>& legal, int AttentionConfig::*knob,
                             int AttentionConfig::*where = nullptr, int value = 0) {
  std::vector<int> values;
  for (const AttentionConfig& c : legal)
    if (where == nullptr || c.*where == value) values.push_back(c.*knob);
  return values;
}

// The largest choice <= target among `legal` (the smallest if none is below).
int round_down(std::span<const int> choices, int64_t target, const std::vector<int>& legal) {
  int best = -1;
  for (int value : choices) {
    if (std::find(legal.begin(), legal.end(), value) == legal.end()) continue;
    if (value <= target) best = value;
    if (best < 0) best = value;  // smallest legal, kept unless a value <= target follows
  }
  return best;
}

}  // namespace

Result<AttentionConfig> default_cpu_config(const AttentionProblem& p, const CpuSpec& cpu) {
  if (is_decode_problem(p)) return default_cpu_decode_config(p, cpu);
  const std::vector<AttentionConfig> legal = legal_cpu_configs(p, cpu);
  if (legal.empty()) {
    return make_error(ErrorCode::Unsupported,
                      "no CPU config fits head_dim = " + std::to_string(p.head_dim) +
                          " in an L2 of " + std::to_string(cpu.l2_bytes) + " B");
  }
  constexpr auto kBlockM = &AttentionConfig::block_m;
  constexpr auto kBlockN = &AttentionConfig::block_n;
  if (p.is_backward()) {
    const int block_n =
        round_down(kCpuBackwardBlockNChoices, kCpuTileQueries, knob_values(legal, kBlockN));
    const int block_m = round_down(kCpuBackwardBlockMChoices, backward_target_block_m(block_n, cpu),
                                   knob_values(legal, kBlockM, kBlockN, block_n));
    // The fused dQ where it fits the L2, else -det (the legal set has one of the two).
    for (const AttentionConfig& c : legal)
      if (c.block_m == block_m && c.block_n == block_n) return c;
    return legal.front();  // not reached: block_m was picked among block_n's legal configs
  }
  const int block_m = round_down(kCpuBlockMChoices, kCpuTileQueries, knob_values(legal, kBlockM));
  const int block_n = round_down(kCpuBlockNChoices, target_block_n(block_m, cpu),
                                 knob_values(legal, kBlockN, kBlockM, block_m));
  return cpu_config(block_m, block_n);
}

namespace {

// "illegal: <why>" without the "config <name>: " prefix, or "legal".
std::string verdict(const AttentionConfig& c, const AttentionProblem& p, const CpuSpec& cpu) {
  return knobs::verdict(check_cpu_config(c, p, cpu), c);
}

std::string legal_summary(const AttentionProblem& p, const CpuSpec& cpu) {
  std::ostringstream out;
  out << "\n";
  knobs::plan_footer(out, legal_cpu_configs(p, cpu).size(), default_cpu_config(p, cpu));
  return out.str();
}

std::string explain_cpu_backward_plan(const AttentionProblem& p, const CpuSpec& cpu) {
  std::ostringstream out;
  knobs::plan_header(out, p, "cpu:     ", cpu.to_string());
  out << "Caches as SRAM, backward: a dK/dV block (Bc keys) keeps K^T, V^T and the dK^T, dV^T\n"
         "accumulators while Q and dO stream past in blocks of Br rows. The dQ, two ways, neither\n"
         "with atomics (no two cores write one row; bitwise reproducible):\n"
         "  fused (no suffix): a dK/dV work item takes every splits-th key block of (batch, kv\n"
         "    head) and adds dQ_i += dS K into its own fp32 copy of the dQ accumulator; a dQ work\n"
         "    item sums the copies. 5 products. Splits: enough for "
      << kCpuBackwardItemsPerThread
      << " dK/dV work items per core\n"
         "    (this problem on "
      << cpu.cores << " cores, Bc = 64: "
      << cpu_backward_dq_splits(cpu_config(64, 64, DqMode::Atomic), p, cpu.cores)
      << ").\n"
         "  -det: a dK/dV work item per key block; a dQ work item (batch, head, Br queries) keeps\n"
         "    Q^T, dO^T and dQ^T while K and V stream past, recomputing S and dP: 7 products;\n"
         "    a tuning candidate only where the fused item exceeds the L2.\n"
         "A work item's working set must fit the core's L2 ("
      << cpu.l2_bytes
      << " B); the two score blocks\n"
         "of a dK/dV block, swept once per tile of head dims, should fit the L1d ("
      << cpu.l1d_bytes << " B).\n\n";
  const AttentionConfig tile = cpu_config(kCpuTileQueries, kCpuTileQueries);
  out << "Default (untuned):\n";
  out << "  Bc = " << kCpuTileQueries << " (the keys of one register tile: 4 vectors x 16 lanes)\n";
  out << "  Br = L1d / (8 Bc) = " << cpu.l1d_bytes << " / (8 * " << tile.block_n
      << ") = " << backward_target_block_m(tile.block_n, cpu) << "\n";
  out << "  each rounded down to a legal choice (Bc first); the fused dQ where it fits\n\n";
  out << "Budget of this template (fp32 working set per work item):\n";
  out << "  dK/dV: 4 * (4*Bc*d [K^T, V^T, dK^T, dV^T] + 2*Br*d [Q, dO] + 2*Br*Bc [S, dP])\n";
  out << "         + fused: 4 * (Bc*dl [K] + Br*dr [dQ_i]), dl = d to 16, dr = d to 64\n";
  out << "  dQ:    -det: 4 * (3*Br*d [Q^T, dO^T, dQ^T] + 2*Bc*d [K, V] + 2*Bc*Br [S^T, dP^T])\n";
  out << "  L2:    max(dK/dV, dQ) <= " << cpu.l2_bytes << " B\n";
  out << "  L1d:   8 * Br * Bc [S, dP blocks] <= " << cpu.l1d_bytes
      << " B (preferred, not required)\n";
  out << "  Br in " << list(kCpuBackwardBlockMChoices) << ", Bc in "
      << list(kCpuBackwardBlockNChoices) << "; warps = stages = 1 (unused on the CPU)\n\n";
  out << "config            dK/dV(B)     dQ(B)  scores(B)  in L1d  status\n";
  for (int m : kCpuBackwardBlockMChoices)
    for (int n : kCpuBackwardBlockNChoices)
      for (DqMode dq : kCpuBackwardDqModes) {
        const AttentionConfig c = cpu_config(m, n, dq);
        const int64_t scores = cpu_backward_score_bytes(c);
        std::string status = verdict(c, p, cpu);
        if (dq == DqMode::Separate && status == "legal" &&
            check_cpu_config(cpu_config(m, n, DqMode::Atomic), p, cpu).ok())
          status = "legal, no candidate (the fused dQ fits)";
        char line[320];
        std::snprintf(line, sizeof line, "%-16s %9lld %9lld  %9lld  %6s  %s\n",
                      c.to_string().c_str(), static_cast<long long>(cpu_backward_dkdv_bytes(c, p)),
                      static_cast<long long>(cpu_backward_dq_bytes(c, p)),
                      static_cast<long long>(scores), scores <= cpu.l1d_bytes ? "yes" : "no",
                      status.c_str());
        out << line;
      }
  out << legal_summary(p, cpu);
  return out.str();
}

}  // namespace

std::string explain_cpu_plan(const AttentionProblem& p, const CpuSpec& cpu) {
  if (p.is_backward()) return explain_cpu_backward_plan(p, cpu);
  if (is_decode_problem(p)) return explain_cpu_decode_plan(p, cpu);
  std::ostringstream out;
  knobs::plan_header(out, p, "cpu:     ", cpu.to_string());
  out << "Caches as SRAM: one work item (batch, head, Br query rows) runs on one core; its\n"
         "scratch must fit the core's L2 ("
      << cpu.l2_bytes
      << " B), and the S^T block, which P V sweeps once\n"
         "per tile of head dims, should fit half the L1d ("
      << cpu.l1d_bytes << " B).\n\n";
  out << "Registers: " << cpu_vector_registers(cpu) << " vector registers of "
      << cpu_vector_lanes(cpu) << " fp32 lanes; a register tile covers " << cpu_tile_queries(cpu)
      << " queries (lanes) x "
      << (cpu.avx512f ? 4
          : cpu.avx2  ? 6
                      : 2)
      << " keys or head dims.\n\n";
  const int64_t bn = target_block_n(kCpuTileQueries, cpu);
  out << "Default (untuned):\n";
  out << "  Br = " << kCpuTileQueries
      << " (each packed K/V element feeds 4 * Br FLOPs of the tiles)\n";
  out << "  Bc = (L1d / 2) / (4 Br) = " << cpu.l1d_bytes / 2 << " / (4 * " << kCpuTileQueries
      << ") = " << bn << "\n";
  out << "  each rounded down to a legal choice (Br first)\n\n";
  out << "Budget of this template (fp32 scratch per work item):\n";
  out << "  L2:  4 * (Br*d [Q^T] + 2*Bc*d [K, V] + Br*Bc [S^T] + Br*d [O^T] + 3*Br [m, l, alpha]) "
         "<= "
      << cpu.l2_bytes << " B\n";
  out << "  L1d: 4 * Br * Bc [S^T block] <= " << cpu.l1d_bytes / 2
      << " B (half the L1d; preferred, not required)\n";
  out << "  Br in " << list(kCpuBlockMChoices) << ", Bc in " << list(kCpuBlockNChoices)
      << "; warps = stages = 1 (unused on the CPU)\n\n";
  out << "config        L2 set(B)  K/V blk(B)  S^T blk(B)  in L1d/2  status\n";
  for (int m : kCpuBlockMChoices)
    for (int n : kCpuBlockNChoices) {
      const AttentionConfig c = cpu_config(m, n);
      std::string why = verdict(c, p, cpu);
      if (why == "legal" && !cpu_forward_candidate(c, cpu))
        why = "legal, no candidate (Br < " + std::to_string(kCpuMinCandidateBlockM) +
              " or S^T block over the L1d)";
      const int64_t scores = cpu_score_block_bytes(c);
      char line[256];
      std::snprintf(line, sizeof line, "%-12s %10lld  %10lld  %10lld  %8s  %s\n",
                    c.to_string().c_str(), static_cast<long long>(cpu_working_set_bytes(c, p)),
                    static_cast<long long>(cpu_kv_block_bytes(c, p)),
                    static_cast<long long>(scores), scores <= cpu.l1d_bytes / 2 ? "yes" : "no",
                    why.c_str());
      out << line;
    }
  out << legal_summary(p, cpu);
  return out.str();
}

}  // namespace flashjit
