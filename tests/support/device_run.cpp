#include "support/device_run.hpp"

#include <string>
#include <utility>

#include "support/reference.hpp"

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

::testing::AssertionResult run_matches_reference(const AttentionProblem& problem,
                                                 const RunOutput& out, const Reference& reference) {
  if (!out.status.ok()) return ::testing::AssertionFailure() << out.status.error().describe();
  if (!problem.is_backward()) return matches_reference(compare(problem, out.o, out.lse, reference));
  const GradientComparison comparison =
      compare_gradients(problem, out.dq, out.dk, out.dv, reference);
  if (within_tolerance(comparison, gradient_tolerance(problem.dtype)))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << comparison.to_string();
}

}  // namespace flashjit::testing
