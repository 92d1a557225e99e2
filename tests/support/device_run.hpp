// Running a loaded kernel on a GPU backend (CUDA or HIP: only the Backend interface is used) the
// way the GPU tests check it, over tuner/workload.hpp's tensors of a call (the ones the tuner
// verifies with): inputs uploaded, outputs poisoned (0xFF bytes: NaN in every dtype) before each
// launch, results copied back for the fp64 comparison.
//
//   Result<ft::DeviceTensors> tensors = ft::upload(backend, problem, inputs);
//   ft::RunOutput out = ft::run_poisoned(backend, kernel, problem, *tensors);
//   ASSERT_TRUE(out.status.ok()) << out.status.error().describe();   // "launch: ..."
//   compare(problem, out.o, out.lse, reference);   // or compare_gradients(.., out.dq, ..)
#pragma once

#include <gtest/gtest.h>

#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "tuner/reference.hpp"
#include "tuner/workload.hpp"

namespace flashjit::testing {

// A problem's tensors on the device (find(TensorRole::...) for one, .args for all): the inputs of
// its pass uploaded (for the backward also o, lse and d_o), its outputs allocated (forward o and
// lse; backward dq, dk and dv).
using ::flashjit::DeviceTensors;
using ::flashjit::HostOutputs;
using ::flashjit::TensorRole;
inline Result<DeviceTensors> upload(const Backend& backend, const AttentionProblem& problem,
                                    const HostInputs& inputs) {
  return upload_inputs(backend, problem, inputs);
}

// One poisoned run (tuner/workload.hpp's launch_poisoned) as the tests report it: the outputs of
// the pass (whole spans, for compare / compare_gradients), or an error that starts with the step
// that failed ("launch: ...", "synchronize: ...").
struct RunOutput : HostOutputs {
  Status status;
  // A step after the launch was accepted failed (or the poisoning before it: a sticky error of an
  // earlier launch): the context may be unusable, every later call in this process may fail too.
  bool context_lost = false;
};
// With `args` (a caller's workspace, a cleared pointer), or with tensors.args.
RunOutput run_poisoned(const Backend& backend, const Kernel& kernel,
                       const AttentionProblem& problem, const DeviceTensors& tensors,
                       const AttentionArgs& args);
inline RunOutput run_poisoned(const Backend& backend, const Kernel& kernel,
                              const AttentionProblem& problem, const DeviceTensors& tensors) {
  return run_poisoned(backend, kernel, problem, tensors, tensors.args);
}

// A run judged against the fp64 reference as the GPU tests judge it: its status ok, then o and lse
// within matches_reference's default tolerances (forward), or dq, dk and dv within
// gradient_tolerance(dtype) (backward). The failure message says which and by how much.
::testing::AssertionResult run_matches_reference(const AttentionProblem& problem,
                                                 const RunOutput& out, const Reference& reference);

}  // namespace flashjit::testing
