#include "generator/render_decode.hpp"

#include <sstream>

#include "generator/cpu_config.hpp"
#include "generator/decode_config.hpp"
#include "generator/hip_config.hpp"
#include "generator/knobs.hpp"
#include "generator/template_files.hpp"

namespace flashjit {

namespace {

// The tile without its split count: what the source depends on (and its label shows).
AttentionConfig tile_of(const AttentionConfig& config) {
  AttentionConfig tile = config;
  tile.splits = 0;
  return tile;
}

const char* bool_text(bool value) { return value ? "true" : "false"; }

// The GPU decode source's instantiation: namespace `ns`'s DecodeTraits (CUDA's and HIP's take the
// same arguments; `warps` counts waves on HIP) and the split entry over `params`, the entry's
// parameter.
std::string gpu_instantiation(const char* ns, const char* params, const AttentionProblem& problem,
                              const AttentionConfig& config) {
  std::ostringstream text;
  text << "typedef " << ns << "::DecodeTraits<" << detail::gpu_tile_arguments(problem, config)
       << ", /*page_size=*/" << problem.kv.page_size << "> Config;\n"
       << "extern \"C\" __global__ void __launch_bounds__(Config::kThreads)\n"
       << kDecodeSplitEntry << "(" << params << ") {\n"
       << "  " << ns << "::decode_split<Config>(params);\n}\n";
  return text.str();
}

}  // namespace

Result<KernelSource> render_cuda_decode(const AttentionProblem& problem,
                                        const AttentionConfig& config) {
  FLASHJIT_TRY(validate(problem));
  FLASHJIT_TRY(check_cuda_dtype(problem.dtype));
  // A CUDA device with no limits to speak of: only the template's own constraints can fail.
  FLASHJIT_TRY(check_decode_config(config, problem, knobs::unlimited_device(80)));
  return detail::assemble(
      template_files::kCudaDecode, {kDecodeSplitEntry}, "decode", problem, tile_of(config),
      gpu_instantiation("flashjit_kernel", "const __grid_constant__ FlashjitAttentionParams params",
                        problem, config));
}

Result<KernelSource> render_hip_decode(const AttentionProblem& problem,
                                       const AttentionConfig& config) {
  FLASHJIT_TRY(validate(problem));
  // An AMD device with no limits to speak of: only the template's own constraints can fail.
  FLASHJIT_TRY(check_hip_decode_config(config, problem, knobs::unlimited_device(0, "gfx90a")));
  return detail::assemble(
      template_files::kHipDecode, {kDecodeSplitEntry}, "decode_hip", problem, tile_of(config),
      gpu_instantiation("flashjit_hip", "FlashjitAttentionParams params", problem, config));
}

Result<KernelSource> render_cpu_decode(const AttentionProblem& problem,
                                       const AttentionConfig& config) {
  FLASHJIT_TRY(validate(problem));
  // only the template's own constraints can fail
  FLASHJIT_TRY(check_cpu_decode_config(config, problem, unlimited_cpu()));
  std::ostringstream instantiation;
  instantiation << "typedef flashjit_cpu::DecodeTraits</*head_dim=*/" << problem.head_dim
                << ", /*block_m=*/" << config.block_m << ", /*block_n=*/" << config.block_n
                << ", /*storage=*/"
                << (problem.dtype == DType::BF16  ? "flashjit_cpu::kBF16"
                    : problem.dtype == DType::F32 ? "flashjit_cpu::kF32"
                                                  : "flashjit_cpu::kF16")
                << ", /*causal=*/" << bool_text(problem.causal) << ", /*page_size=*/"
                << problem.kv.page_size << "> Config;\n"
                << detail::cpu_entry(kCpuDecodeSplitEntry, "Decode<Config>::run")
                << detail::cpu_entry(kCpuDecodeCombineEntry, "Decode<Config>::combine");
  return detail::assemble(template_files::kCpuDecode,
                          {kCpuDecodeSplitEntry, kCpuDecodeCombineEntry}, "decode_cpu", problem,
                          tile_of(config), instantiation.str());
}

}  // namespace flashjit
