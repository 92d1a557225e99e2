#include "generator/backward_config.hpp"

namespace flashjit {

namespace {
Error not_yet(const DeviceSpec& device) {
  return make_error(ErrorCode::Unsupported,
                    "the backward pass has no CUDA template yet (" + device.arch_name() + ")");
}
}  // namespace

Status check_backward_config(const AttentionConfig&, const AttentionProblem&,
                             const DeviceSpec& device) {
  return not_yet(device);
}
std::vector<AttentionConfig> legal_backward_configs(const AttentionProblem&, const DeviceSpec&) {
  return {};
}
Result<AttentionConfig> default_backward_config(const AttentionProblem&, const DeviceSpec& device) {
  return not_yet(device);
}
std::string explain_backward_plan(const AttentionProblem&, const DeviceSpec& device) {
  return not_yet(device).message + "\n";
}
int backward_dkdv_threads(const AttentionConfig& config) { return config.threads(); }
int backward_dq_threads(const AttentionConfig& config) { return config.threads(); }
int backward_dkdv_smem_bytes(const AttentionConfig&, const AttentionProblem&) { return 0; }
int backward_dq_smem_bytes(const AttentionConfig&, const AttentionProblem&) { return 0; }

}  // namespace flashjit
