// Rendering: one (problem, config) -> one self-contained kernel source for a backend.
// Pure text work; no device or compiler is touched here.
#pragma once

#include <string>

#include "generator/config.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

struct KernelSource {
  std::string entry;  // extern "C" name of the kernel function
  std::string text;   // the whole translation unit: params struct, template, instantiation
  std::string label;  // "attention_fwd d128 bf16 causal m128n64w4s2", for logs and errors
  // Compile for the architecture-specific target (sm_90a rather than sm_90): the source uses
  // instructions (wgmma) that exist only there.
  bool arch_specific = false;
};

// Name of the entry point every rendered attention forward source defines.
inline constexpr const char* kAttentionForwardEntry = "flashjit_attention_fwd";

// CUDA forward kernel: the mma family (sm80+, templates/cuda/attention_fwd.cuh) or the wgmma
// family (sm90a, attention_fwd_sm90.cuh), both after templates/cuda/common.cuh. Validates the
// problem and the config's template constraints (not the device budget: check_config's job).
Result<KernelSource> render_cuda_attention(const AttentionProblem& problem,
                                           const AttentionConfig& config);

// HIP (AMD CDNA: gfx90a, gfx942; MFMA builtins) forward kernel, for hipRTC
// (templates/hip/attention_fwd.hpp). The same entry name as the CUDA kernel, taking
// FlashjitAttentionParams by value; launch with block (warps * 64) threads and
// hip_lds_bytes(config, problem) bytes of dynamic LDS. Validates the problem and the config's
// template constraints (not the device budget: check_hip_config's job).
Result<KernelSource> render_hip_attention(const AttentionProblem& problem,
                                          const AttentionConfig& config);

// Name of the entry point every rendered CPU attention forward source defines:
//   extern "C" int flashjit_attention_fwd_cpu(const FlashjitAttentionParams* params,
//                                             int work_begin, int work_end);
// It computes work items [work_begin, work_end) of batch x heads_q x ceil(seqlen_q / block_m)
// (the query block fastest) and returns 0, or 1 when its scratch could not be allocated.
inline constexpr const char* kCpuAttentionForwardEntry = "flashjit_attention_fwd_cpu";

// C++ (host CPU, Clang) forward kernel (templates/cpu/attention_fwd.hpp). Validates the problem
// and the config's template constraints (not the cache budget: check_cpu_config's job).
Result<KernelSource> render_cpu_attention(const AttentionProblem& problem,
                                          const AttentionConfig& config);

// Changes whenever a template or the generator's output changes: part of binary-cache and
// tuning-database keys. A hash of the embedded template texts plus a manual epoch.
const std::string& generator_version();

}  // namespace flashjit
