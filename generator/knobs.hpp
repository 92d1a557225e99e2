// Helpers every config space's legality rules share (CUDA forward and backward families, HIP,
// CPU): membership of a knob value in its choices, the choices as text, and the error that names
// an illegal config and why; and the pieces of their `flashjit plan` texts (explain_*_plan) that
// read the same: the header, a config's verdict, the count of legal configs and the default.
#pragma once

#include <algorithm>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit::knobs {

// The sm90 families (wgmma, ws) start their tiles on a 128-byte-swizzle atom: their dynamic shared
// memory is rounded up to one (1024 B).
inline constexpr int kSwizzleAtomAlign = 1024;
// The shared memory the driver reserves per CTA on sm80+ (the CTAs-per-SM arithmetic).
inline constexpr int kSmemReservedPerCta = 1024;

template <class Range>
bool contains(const Range& range, int value) {
  return std::find(std::begin(range), std::end(range), value) != std::end(range);
}

// "{32, 64, 128}"
template <class Range>
std::string list(const Range& range) {
  std::string out;
  for (int v : range) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return "{" + out + "}";
}

// "config m64n128w8s2: <why>"
inline Status illegal(const AttentionConfig& config, const std::string& why,
                      ErrorCode code = ErrorCode::InvalidArgument) {
  return make_error(code, "config " + config.to_string() + ": " + why);
}

// Error InvalidArgument unless knob `name` of `config` (its `value`) is one of `choices`:
// "config m48n64w4s2: block_m = 48 not in {64, 128}" (then `note`, if any: " (backward)").
template <class Range>
Status check_choice(const AttentionConfig& config, const std::string& name, int value,
                    const Range& choices, const char* note = "") {
  if (contains(choices, value)) return ok_status();
  return illegal(config, name + " = " + std::to_string(value) + " not in " + list(choices) + note);
}

// The device's per-block limits every budget checks, each error naming the config, the value and
// the limit (generator/knobs.cpp). `per`: "block" (CUDA) or "workgroup" (HIP); `kernel`: what
// leads the message, for a config of several kernels ("the dQ kernel's ").
// "<kernel><threads> threads exceed the device's <max> per <per>"
Status check_threads(const AttentionConfig& config, int threads, const DeviceSpec& device,
                     const char* per = "block", const std::string& kernel = "");
// "<memory> <bytes> B exceeds the device's <max> B per <per>" (memory: "shared memory", "LDS",
// "dQ kernel: shared memory", ...)
Status check_memory(const AttentionConfig& config, const std::string& memory, int bytes,
                    const DeviceSpec& device, const char* per = "block");
// A CUDA kernel's estimated registers: "<kernel>estimated <regs> registers per thread exceed
// <max>", then (threads > 0) "<kernel>estimated <regs * threads> registers per CTA exceed the
// SM's <regs_per_sm>".
Status check_registers(const AttentionConfig& config, int regs, int threads,
                       const DeviceSpec& device, const std::string& kernel = "");

// Calls visit(config) for each tile of the choices, block_m outermost, then block_n, warps
// (waves), stages: the order of the legal configs.
template <class M, class N, class W, class S, class Visit>
void for_each_tile(const M& block_ms, const N& block_ns, const W& warps, const S& stages,
                   const Visit& visit) {
  for (int block_m : block_ms)
    for (int block_n : block_ns)
      for (int w : warps)
        for (int s : stages) visit(AttentionConfig{block_m, block_n, w, s});
}

// The tiles of the choices (in for_each_tile's order) that `check` (config -> Status) passes.
template <class M, class N, class W, class S, class Check>
std::vector<AttentionConfig> legal_tiles(const M& block_ms, const N& block_ns, const W& warps,
                                         const S& stages, const Check& check) {
  std::vector<AttentionConfig> legal;
  for_each_tile(block_ms, block_ns, warps, stages, [&](const AttentionConfig& c) {
    if (check(c).ok()) legal.push_back(c);
  });
  return legal;
}

// A plan row's status: "legal", or "illegal: <why>" (the error without its "config <name>: ";
// an error without that prefix as it is, unless `tag_every_error`).
inline std::string verdict(const Status& status, const AttentionConfig& config,
                           bool tag_every_error = true) {
  if (status.ok()) return "legal";
  const std::string& why = status.error().message;
  const std::string prefix = "config " + config.to_string() + ": ";
  if (why.rfind(prefix, 0) == 0) return "illegal: " + why.substr(prefix.size());
  return tag_every_error ? "illegal: " + why : why;
}

// A plan's first lines: the device (`label`: "device:  " for a GPU, "cpu:     " for the host's
// CpuSpec) and the problem.
inline void plan_header(std::ostream& out, const AttentionProblem& p, const char* label,
                        const std::string& device) {
  out << label << device << "\n";
  out << "problem: " << p.to_string() << "\n\n";
}
inline void plan_header(std::ostream& out, const AttentionProblem& p, const DeviceSpec& device) {
  plan_header(out, p, "device:  ", device.to_string());
}

// A device with no limits to speak of, for checking a config against its template's own
// constraints alone (the renderers' checks): NVIDIA `arch` (0, 80, 90), or with `gcn_arch` set
// ("gfx90a") an AMD device of 64-lane waves (hip_config.hpp's kHipWaveSize).
inline DeviceSpec unlimited_device(int arch, const std::string& gcn_arch = "") {
  DeviceSpec unlimited;
  unlimited.name = "(template constraints only)";
  unlimited.arch = arch;
  unlimited.gcn_arch = gcn_arch;
  if (!gcn_arch.empty()) unlimited.warp_size = 64;
  unlimited.smem_per_block_optin = unlimited.smem_per_sm = 1 << 30;
  unlimited.regs_per_sm = 1 << 30;
  unlimited.max_regs_per_thread = 1 << 30;
  unlimited.max_threads_per_sm = unlimited.max_threads_per_block = 1 << 30;
  return unlimited;
}

// FlashAttention's starting formula for the rows of a tile, Br = SRAM / (3 * d * sizeof(float)),
// on `device`; plan_formula prints it (two lines) as a forward plan's start.
inline int formula_block_m(const AttentionProblem& p, const DeviceSpec& device) {
  return device.smem_per_block_optin / (3 * p.head_dim * static_cast<int>(sizeof(float)));
}
inline void plan_formula(std::ostream& out, const AttentionProblem& p, const DeviceSpec& device) {
  out << "Starting formula (FlashAttention): Br = SRAM / (3 * d * sizeof(float))\n";
  out << "  = " << device.smem_per_block_optin << " / (3 * " << p.head_dim
      << " * 4) = " << formula_block_m(p, device) << " rows\n";
}

// A plan's last line: "<count> legal configs. Default (untuned): <config>" (or why there is none).
inline void plan_footer(std::ostream& out, size_t legal,
                        const Result<AttentionConfig>& default_config) {
  out << legal << " legal configs.";
  if (default_config.ok())
    out << " Default (untuned): " << default_config->to_string() << "\n";
  else
    out << " " << default_config.error().message << "\n";
}

// The config of `legal` (not empty) that `rank` ranks highest; the first of equals.
template <class Rank>
const AttentionConfig& best_config(const std::vector<AttentionConfig>& legal, const Rank& rank) {
  const AttentionConfig* best = &legal.front();
  for (const AttentionConfig& c : legal)
    if (rank(c) > rank(*best)) best = &c;
  return *best;
}

}  // namespace flashjit::knobs
