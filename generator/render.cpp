#include "generator/render.hpp"

#include <cstdint>
#include <cstdio>
#include <sstream>

#include "generator/cpu_config.hpp"
#include "templates/embedded.hpp"

namespace flashjit {

namespace {

// Bump when the generator's output changes in a way the template texts do not show.
constexpr int kGeneratorEpoch = 1;

uint64_t fnv1a(std::string_view text, uint64_t hash = 1469598103934665603ull) {
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

// Preconditions the template states as static_asserts, checked here first so that a bad
// config is a clear error instead of a compile log.
Status check_template_constraints(const AttentionProblem& problem, const AttentionConfig& config) {
  // A device with no limits to speak of: only the template's own constraints can fail.
  DeviceSpec unlimited;
  unlimited.name = "(template constraints only)";
  unlimited.smem_per_block_optin = unlimited.smem_per_sm = 1 << 30;
  unlimited.regs_per_sm = 1 << 30;
  unlimited.max_regs_per_thread = 1 << 30;
  unlimited.max_threads_per_sm = unlimited.max_threads_per_block = 1 << 30;
  return check_config(config, problem, unlimited);
}

}  // namespace

const std::string& generator_version() {
  static const std::string version = [] {
    uint64_t hash = fnv1a("epoch " + std::to_string(kGeneratorEpoch));
    int count = 0;
    const std::string_view* paths = templates::paths(&count);
    for (int i = 0; i < count; ++i) {
      hash = fnv1a(paths[i], hash);
      hash = fnv1a(templates::text(paths[i]), hash);
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
    return std::string(hex);
  }();
  return version;
}

namespace {

// The parts every backend's source shares: a header line naming what it is, the params struct,
// the template text, then the backend's own instantiation.
Result<KernelSource> assemble(const char* template_path, const char* entry, const char* kind,
                              const AttentionProblem& problem, const AttentionConfig& config,
                              const std::string& instantiation) {
  const std::string_view params = templates::text("attention_params.h");
  const std::string_view kernel = templates::text(template_path);
  if (params.empty() || kernel.empty())
    return make_error(ErrorCode::Unsupported,
                      std::string(template_path) + " is not embedded in this build");
  KernelSource source;
  source.entry = entry;
  source.label = std::string(kind) + " d" + std::to_string(problem.head_dim) + " " +
                 to_string(problem.dtype) + (problem.causal ? " causal " : " ") +
                 config.to_string();
  std::ostringstream text;
  text << "// flashjit " << source.label << " (generator " << generator_version() << ")\n"
       << params << "\n"
       << kernel << "\n"
       << "// ---- instantiation ----\n"
       << instantiation;
  source.text = text.str();
  return source;
}

}  // namespace

Result<KernelSource> render_cuda_attention(const AttentionProblem& problem,
                                           const AttentionConfig& config) {
  FLASHJIT_TRY(validate(problem));
  FLASHJIT_TRY(check_template_constraints(problem, config));
  std::ostringstream instantiation;
  instantiation << "typedef flashjit_kernel::Traits</*head_dim=*/" << problem.head_dim
                << ", /*block_m=*/" << config.block_m << ", /*block_n=*/" << config.block_n
                << ", /*warps=*/" << config.warps << ", /*stages=*/" << config.stages
                << ", /*bf16=*/" << (problem.dtype == DType::BF16 ? "true" : "false")
                << ", /*causal=*/" << (problem.causal ? "true" : "false") << "> Config;\n"
                << "extern \"C\" __global__ void __launch_bounds__(Config::kThreads, 1)\n"
                << kAttentionForwardEntry
                << "(const __grid_constant__ FlashjitAttentionParams params) {\n"
                << "  flashjit_kernel::attention_forward<Config>(params);\n"
                << "}\n";
  return assemble("cuda/attention_fwd.cuh", kAttentionForwardEntry, "attention_fwd", problem,
                  config, instantiation.str());
}

Result<KernelSource> render_cpu_attention(const AttentionProblem& problem,
                                          const AttentionConfig& config) {
  FLASHJIT_TRY(validate(problem));
  // A CPU with no cache limit to speak of: only the template's own constraints can fail.
  CpuSpec unlimited;
  unlimited.l1d_bytes = unlimited.l2_bytes = int64_t{1} << 40;
  FLASHJIT_TRY(check_cpu_config(config, problem, unlimited));
  std::ostringstream instantiation;
  instantiation << "typedef flashjit_cpu::Traits</*head_dim=*/" << problem.head_dim
                << ", /*block_m=*/" << config.block_m << ", /*block_n=*/" << config.block_n
                << ", /*storage=*/"
                << (problem.dtype == DType::BF16  ? "flashjit_cpu::kBF16"
                    : problem.dtype == DType::F32 ? "flashjit_cpu::kF32"
                                                  : "flashjit_cpu::kF16")
                << ", /*causal=*/" << (problem.causal ? "true" : "false") << "> Config;\n"
                << "extern \"C\" int " << kCpuAttentionForwardEntry
                << "(const FlashjitAttentionParams* params, int work_begin, int work_end) {\n"
                << "  return flashjit_cpu::Kernel<Config>::run(*params, work_begin, work_end);\n"
                << "}\n";
  return assemble("cpu/attention_fwd.hpp", kCpuAttentionForwardEntry, "attention_fwd_cpu", problem,
                  config, instantiation.str());
}

}  // namespace flashjit
