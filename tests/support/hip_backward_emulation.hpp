// The HIP backward's launch sequence on the host emulator (tests/support/hip_emulator.hpp),
// shared by the emulation tests of the plain template and of the variants: include it after
// templates/hip/attention_bwd_common.hpp and attention_bwd.hpp, which it calls. Launched as the
// runtime launches it (runtime/launch_params.hpp's backward_launch with generator/hip_config.hpp's
// shapes, the workspace bound by bind_workspace); the dK/dV and dQ kernels through the entries the
// renderer picks (generator/render.cpp: a variant compiled in enters through the *_variant ones,
// packed documents' row kernels through the *_varlen ones; their offsets from inputs.cu_seqlens_*).
// Outputs and the workspace are poisoned (NaN) first, with guard words after every buffer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/hip_config.hpp"
#include "generator/problem.hpp"
#include "runtime/launch_params.hpp"
#include "support/attention_cases.hpp"
#include "support/hip_emulator.hpp"
#include "support/variant_cases.hpp"  // Gradients

#ifdef FLASHJIT_VARIANT
#define FLASHJIT_HIP_BACKWARD_ENTRY(name) name##_variant
#else
#define FLASHJIT_HIP_BACKWARD_ENTRY(name) name
#endif
#if defined(FLASHJIT_VARIANT) && FLASHJIT_VARIANT_VARLEN
#define FLASHJIT_HIP_BACKWARD_ROW_ENTRY(name) name##_varlen
#else
#define FLASHJIT_HIP_BACKWARD_ROW_ENTRY(name) name
#endif

namespace flashjit::testing {

// What a test may break on purpose, to show that the comparison catches it.
enum class HipBackwardFault { kNone, kSkipDqKernel, kShiftLse };

// Runs the three kernels of config K for `problem`; fills the gradients (whole spans, poisoned
// first). Returns "" or what went wrong.
template <class K>
std::string run_hip_backward(const AttentionProblem& problem, const AttentionConfig& config,
                             const HostInputs& inputs, Gradients* out,
                             HipBackwardFault fault = HipBackwardFault::kNone) {
  constexpr size_t kGuardWords = 64;  // words after each output and the workspace
  constexpr uint16_t kGuardBits = 0x7E57;
  std::vector<uint16_t> dq(problem.dq_span() + kGuardWords, kPoisonBits);
  std::vector<uint16_t> dk(problem.dkv_span() + kGuardWords, kPoisonBits);
  std::vector<uint16_t> dv(problem.dkv_span() + kGuardWords, kPoisonBits);
  for (std::vector<uint16_t>* buffer : {&dq, &dk, &dv})
    std::fill(buffer->end() - kGuardWords, buffer->end(), kGuardBits);
  std::vector<float> lse = inputs.lse;
  if (fault == HipBackwardFault::kShiftLse)
    for (float& value : lse) value += 0.05f;

  const BackwardLaunch launch =
      backward_launch(problem, config, hip_backward_shapes(config, problem));
  // The workspace as NaN bytes: a kernel reading what the preprocess should have written gets NaN.
  std::vector<float> workspace(launch.workspace.bytes / sizeof(float) + kGuardWords);
  std::memset(workspace.data(), 0xFF, launch.workspace.bytes);
  std::fill(workspace.end() - kGuardWords, workspace.end(), 1.5f);

  AttentionArgs args;
  args.q = inputs.q.data();
  args.k = inputs.k.data();
  args.v = inputs.v.data();
  args.o = const_cast<uint16_t*>(inputs.o.data());  // an input of the backward pass
  args.lse = lse.data();
  args.d_o = inputs.d_o.data();
  args.dq = dq.data();
  args.dk = dk.data();
  args.dv = dv.data();
  args.alibi_slopes = inputs.alibi_slopes.empty() ? nullptr : inputs.alibi_slopes.data();
  args.cu_seqlens_q = inputs.cu_seqlens_q.data();
  args.cu_seqlens_k = inputs.cu_seqlens_k.data();
  FlashjitAttentionParams params = make_launch_params(problem, args);
  bind_workspace(params, launch.workspace, workspace.data());

  // The launch shapes the runtime uses must be the template's own.
  if (launch.dkdv.threads != K::kThreads || launch.dkdv.smem_bytes != K::kLdsBytes)
    return "dK/dV shape " + std::to_string(launch.dkdv.threads) + " threads, " +
           std::to_string(launch.dkdv.smem_bytes) + " B differs from the template's";
  const bool atomic = config.dq == DqMode::Atomic;
  if (!atomic && (launch.dq.threads != K::kDqThreads || launch.dq.smem_bytes != K::kDqLdsBytes))
    return "dQ shape differs from the template's";
  if (launch.preprocess.threads != flashjit_hip::kBackwardThreads ||
      (atomic && launch.dq.threads != flashjit_hip::kBackwardThreads))
    return "row kernels' threads differ from the template's";

  auto run = [](const LaunchShape& shape, const std::function<void()>& kernel) {
    HipGrid grid;
    grid.x = static_cast<int>(shape.grid_x);
    grid.y = static_cast<int>(shape.grid_y);
    grid.z = static_cast<int>(shape.grid_z);
    return emulate_hip(grid, shape.threads, shape.smem_bytes, kernel);
  };
  std::string error = run(launch.preprocess, [&] {
    flashjit_hip::FLASHJIT_HIP_BACKWARD_ROW_ENTRY(backward_preprocess)<K::kHeadDim, K::kIsBf16>(
        params);
  });
  if (!error.empty()) return "preprocess: " + error;
  error = run(launch.dkdv, [&] {
    flashjit_hip::FLASHJIT_HIP_BACKWARD_ENTRY(attention_backward_dkdv)<K>(params);
  });
  if (!error.empty()) return "dK/dV: " + error;
  if (fault != HipBackwardFault::kSkipDqKernel) {
    error = atomic ? run(launch.dq,
                         [&] {
                           flashjit_hip::FLASHJIT_HIP_BACKWARD_ROW_ENTRY(
                               backward_dq_convert)<K::kHeadDim, K::kIsBf16>(params);
                         })
                   : run(launch.dq, [&] {
                       flashjit_hip::FLASHJIT_HIP_BACKWARD_ENTRY(attention_backward_dq)<K>(params);
                     });
    if (!error.empty()) return "dQ: " + error;
  }

  for (const std::vector<uint16_t>* buffer : {&dq, &dk, &dv})
    for (auto it = buffer->end() - kGuardWords; it != buffer->end(); ++it)
      if (*it != kGuardBits) return "a gradient written past its span";
  for (auto it = workspace.end() - kGuardWords; it != workspace.end(); ++it)
    if (*it != 1.5f)
      return "the workspace written past its " + std::to_string(launch.workspace.bytes) + " bytes";
  out->dq.assign(dq.begin(), dq.end() - kGuardWords);
  out->dk.assign(dk.begin(), dk.end() - kGuardWords);
  out->dv.assign(dv.begin(), dv.end() - kGuardWords);
  return "";
}

}  // namespace flashjit::testing
