// Rendering the decode family (generator/decode_config.hpp): its entry points and launch
// contract, and the sources for CUDA (templates/cuda/decode.cuh), HIP (templates/hip/decode.hpp)
// and the CPU (templates/cpu/decode.hpp). render_cuda_attention / render_hip_attention /
// render_cpu_attention forward here for configs of family Decode. The split count is a launch
// parameter (FlashjitAttentionParams:: num_splits), not part of the source: every split choice of
// one tile shares one binary.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"

namespace flashjit {

namespace template_files {
struct Family;
}

// The GPU entry point of a decode source, taking the FlashjitAttentionParams by value:
//   split    grid (num_splits * row tiles, heads_kv, batch), the split fastest; Config::kThreads
//            threads (decode_resources), its dynamic shared memory. Writes o and lse: directly
//            when num_splits == 1, else each CTA its partial_o and partial_lse, and the last
//            split CTA of each tile to finish merges the tile's rows (the split counters of
//            runtime/decode_launch.hpp's DecodeWorkspace: zero before the launch, zero after).
inline constexpr const char* kDecodeSplitEntry = "flashjit_decode_split";
// The CPU's, each extern "C" int entry(const FlashjitAttentionParams*, int begin, int end):
//   split    work items batch x heads_kv x row tiles x num_splits (the split fastest)
//   combine  rows batch x heads_q x seqlen_q (only when num_splits > 1)
inline constexpr const char* kCpuDecodeSplitEntry = "flashjit_decode_split_cpu";
inline constexpr const char* kCpuDecodeCombineEntry = "flashjit_decode_combine_cpu";

// Validate the problem and the config's template constraints (not the device budget).
Result<KernelSource> render_cuda_decode(const AttentionProblem& problem,
                                        const AttentionConfig& config);
Result<KernelSource> render_cpu_decode(const AttentionProblem& problem,
                                       const AttentionConfig& config);
// HIP (templates/hip/decode.hpp): the same entry and contract as CUDA's, Config::kThreads =
// waves * 64 threads, hip_decode_lds_bytes of dynamic LDS.
Result<KernelSource> render_hip_decode(const AttentionProblem& problem,
                                       const AttentionConfig& config);

namespace detail {
// render.cpp's: the shared assembly of a source, the CPU entry text and the GPU traits' leading
// arguments.
Result<KernelSource> assemble(const template_files::Family& family,
                              std::vector<std::string> entries, const char* kind,
                              const AttentionProblem& problem, const AttentionConfig& config,
                              const std::string& instantiation, bool block_mask = false);
std::string cpu_entry(const char* entry, const char* function);
// The leading arguments every CUDA and HIP traits template takes: "/*head_dim=*/128,
// /*block_m=*/64, /*block_n=*/64, /*warps=*/4, /*stages=*/2, /*bf16=*/true, /*causal=*/false"
// (`warps`: how the template names that knob, "warps" or HIP's "waves").
std::string gpu_tile_arguments(const AttentionProblem& problem, const AttentionConfig& config,
                               const char* warps = "warps");
}  // namespace detail

}  // namespace flashjit
