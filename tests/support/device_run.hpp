// Running a loaded kernel on a GPU backend (CUDA or HIP: only the Backend interface is used) the
// way the GPU tests check it: inputs uploaded, outputs poisoned (0xFF bytes: NaN in every dtype)
// before each launch, results copied back for the fp64 comparison.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "tuner/reference.hpp"

namespace flashjit::testing {

// A problem's tensors on the device: the inputs of its pass uploaded (for the backward also o,
// lse and d_o), its outputs allocated (forward o and lse; backward dq, dk and dv).
struct DeviceTensors {
  DeviceBuffer q, k, v, o, lse;
  DeviceBuffer d_o, dq, dk, dv;  // backward only
};
Result<DeviceTensors> upload(const Backend& backend, const AttentionProblem& problem,
                             const HostInputs& inputs);

// Forward: poison o and lse, launch, synchronize, copy both back; an error says in which step.
Status run_forward_poisoned(const Backend& backend, const Kernel& kernel,
                            const AttentionProblem& problem, const DeviceTensors& tensors,
                            std::vector<uint16_t>* o, std::vector<float>* lse);

// Backward: poison dq, dk and dv, launch (with `workspace` when given, else the kernel's own),
// synchronize, copy the gradients back (whole spans, for compare_gradients).
struct HostGradients {
  std::vector<uint16_t> dq, dk, dv;
};
Status run_backward_poisoned(const Backend& backend, const Kernel& kernel,
                             const AttentionProblem& problem, const DeviceTensors& tensors,
                             HostGradients* gradients, void* workspace = nullptr,
                             size_t workspace_bytes = 0);

}  // namespace flashjit::testing
