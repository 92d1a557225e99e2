// A backend that passes every call to another one: the tests derive from it to change one step
// of a real backend (render a fault into one config, note when the tuner starts timing) and keep
// the rest as it is.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.hpp"

namespace flashjit::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(const Backend& real) : real_(real) {}

  std::string name() const override { return real_.name(); }
  const DeviceSpec& device() const override { return real_.device(); }
  std::string compiler_fingerprint() const override { return real_.compiler_fingerprint(); }
  DeviceFingerprint fingerprint() const override { return real_.fingerprint(); }
  Status check_problem(const AttentionProblem& p) const override { return real_.check_problem(p); }
  std::vector<AttentionConfig> legal_configs(const AttentionProblem& problem) const override {
    return real_.legal_configs(problem);
  }
  Result<AttentionConfig> default_config(const AttentionProblem& problem) const override {
    return real_.default_config(problem);
  }
  Status check_config(const AttentionConfig& c, const AttentionProblem& p) const override {
    return real_.check_config(c, p);
  }
  std::string explain_plan(const AttentionProblem& p) const override {
    return real_.explain_plan(p);
  }
  Result<KernelSource> render(const AttentionProblem& problem,
                              const AttentionConfig& config) const override {
    return real_.render(problem, config);
  }
  Result<Binary> compile(const KernelSource& source) const override {
    return real_.compile(source);
  }
  Result<std::shared_ptr<Kernel>> load(const Binary& binary, const KernelSource& source,
                                       const ProblemSignature& signature,
                                       const AttentionConfig& config) const override {
    return real_.load(binary, source, signature, config);
  }
  Result<DeviceBuffer> allocate(size_t bytes) const override { return real_.allocate(bytes); }
  Status copy_to_device(void* dst, const void* src, size_t bytes) const override {
    return real_.copy_to_device(dst, src, bytes);
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) const override {
    return real_.copy_to_host(dst, src, bytes);
  }
  Status fill_bytes(void* dst, uint8_t value, size_t bytes) const override {
    return real_.fill_bytes(dst, value, bytes);
  }
  Status synchronize() const override { return real_.synchronize(); }
  Result<double> time_ms(const std::function<Status()>& work, int repetitions) const override {
    return real_.time_ms(work, repetitions);
  }
  bool compiles_share_the_device() const override { return real_.compiles_share_the_device(); }
  std::string timing_device_id() const override { return real_.timing_device_id(); }
  std::unique_ptr<DisturbanceProbe> disturbance_probe() const override {
    return real_.disturbance_probe();
  }

 protected:
  const Backend& real() const { return real_; }

 private:
  const Backend& real_;
};

}  // namespace flashjit::testing
