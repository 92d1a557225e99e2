#include "support/device_run.hpp"

#include <string>
#include <utility>

namespace flashjit::testing {

RunOutput run_poisoned(const Backend& backend, const Kernel& kernel,
                       const AttentionProblem& problem, const DeviceTensors& tensors,
                       const AttentionArgs& args) {
  PoisonedRun run = ::flashjit::launch_poisoned(backend, kernel, problem, tensors, args);
  RunOutput out;
  static_cast<HostOutputs&>(out) = std::move(run.outputs);
  if (!run.status.ok()) {
    out.status = make_error(run.status.error().code,
                            std::string(to_string(run.failed)) + ": " + run.status.error().message);
    out.context_lost = run.failed != RunStep::Launch;
  }
  return out;
}

}  // namespace flashjit::testing
