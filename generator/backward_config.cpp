// TEMPORARY WIRING (branch bwd-sm90): dispatches the wgmma family to backward_config_sm90 so that
// its tests run; the mma family's budget is written on its own branch and the lead merges the two.
#include "generator/backward_config.hpp"

#include "generator/backward_config_sm90.hpp"

namespace flashjit {

namespace {
Error no_mma_yet(const DeviceSpec& device) {
  return make_error(
      ErrorCode::Unsupported,
      "the backward pass has no mma-family CUDA template yet (" + device.arch_name() + ")");
}
}  // namespace

Status check_backward_config(const AttentionConfig& config, const AttentionProblem& problem,
                             const DeviceSpec& device) {
  if (config.family == KernelFamily::Wgmma)
    return check_wgmma_backward_config(config, problem, device);
  return no_mma_yet(device);
}
std::vector<AttentionConfig> legal_backward_configs(const AttentionProblem& problem,
                                                    const DeviceSpec& device) {
  std::vector<AttentionConfig> configs;
  for (const AttentionConfig& c : wgmma_backward_candidates(problem))
    if (check_wgmma_backward_config(c, problem, device).ok()) configs.push_back(c);
  return configs;
}
Result<AttentionConfig> default_backward_config(const AttentionProblem& problem,
                                                const DeviceSpec& device) {
  if (device.arch == 90) return default_wgmma_backward_config(problem, device);
  return no_mma_yet(device);
}
std::string explain_backward_plan(const AttentionProblem& problem, const DeviceSpec& device) {
  return explain_wgmma_backward_plan(problem, device);
}
int backward_dkdv_threads(const AttentionConfig& config) {
  return config.family == KernelFamily::Wgmma ? wgmma_backward_dkdv_threads(config)
                                              : config.threads();
}
int backward_dq_threads(const AttentionConfig& config) {
  return config.family == KernelFamily::Wgmma ? wgmma_backward_dq_threads(config)
                                              : config.threads();
}
int backward_dkdv_smem_bytes(const AttentionConfig& config, const AttentionProblem& problem) {
  return config.family == KernelFamily::Wgmma ? wgmma_backward_dkdv_smem_bytes(config, problem) : 0;
}
int backward_dq_smem_bytes(const AttentionConfig& config, const AttentionProblem& problem) {
  return config.family == KernelFamily::Wgmma ? wgmma_backward_dq_smem_bytes(config, problem) : 0;
}

}  // namespace flashjit
