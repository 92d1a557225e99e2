// The backward pass's configs on the CUDA templates and the SRAM/register budget that decides
// which are legal for a problem on a device. config.hpp's check_config / legal_configs /
// default_config / explain_plan forward here for problems with pass == Pass::Backward.
//
// The backward pass is three kernels (templates/cuda/attention_bwd.cuh), launched in order:
//   preprocess  D = rowsum(dO * O) per query row (fp32 workspace); zeroes the dQ accumulator
//   dK/dV       one CTA per block of block_n keys of one (batch, kv head): K_j, V_j resident in
//               shared memory, dK_j, dV_j accumulating in registers; Q_i, dO_i (and LSE_i, D_i)
//               streamed in blocks of block_m rows, `stages` deep, over every query head of the
//               group. DqMode::Atomic: dQ_i += dS K_j with fp32 atomics into the workspace.
//   dQ          DqMode::Atomic: converts the fp32 accumulator to the storage type.
//               DqMode::Separate: one CTA per block of block_m query rows recomputes P and dP
//               over the key blocks and accumulates dQ in registers (deterministic).
#pragma once

#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

// Why `config` is illegal for the backward of `problem` on `device`, or ok.
Status check_backward_config(const AttentionConfig& config, const AttentionProblem& problem,
                             const DeviceSpec& device);
// Every legal backward config, in a stable order (AttentionConfig's ordering).
std::vector<AttentionConfig> legal_backward_configs(const AttentionProblem& problem,
                                                    const DeviceSpec& device);
// The untuned default among the legal ones; error if there is none.
Result<AttentionConfig> default_backward_config(const AttentionProblem& problem,
                                                const DeviceSpec& device);
// The budget arithmetic and the legal set, as `flashjit plan --pass bwd` prints it.
std::string explain_backward_plan(const AttentionProblem& problem, const DeviceSpec& device);

// The launch shape of the dK/dV kernel and of the dQ kernel (DqMode::Separate; for Atomic the
// last kernel is the convert, launched like the preprocess: render.hpp), per family: threads
// per CTA and dynamic shared memory in bytes.
int backward_dkdv_threads(const AttentionConfig& config);
int backward_dq_threads(const AttentionConfig& config);
int backward_dkdv_smem_bytes(const AttentionConfig& config, const AttentionProblem& problem);
int backward_dq_smem_bytes(const AttentionConfig& config, const AttentionProblem& problem);

}  // namespace flashjit
