// The tensors of one attention call as the tuner sees them, per pass: which ones a kernel reads
// and writes, how large they are, how they are filled for timing, and how a kernel's outputs are
// checked against the fp64 reference. This is the one place that knows what an operation's call
// looks like; the tuner itself only compiles, verifies, times and chooses.
//
//   forward   reads q, k, v            writes o, lse
//   backward  reads q, k, v, o, lse, dO   writes dq, dk, dv   (+ the kernel's own workspace)
//   (forward with a paged K/V cache or per-sequence lengths also reads the int32 block table
//   and seqlens_k; with ALiBi, the fp32 slopes [heads_q])
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "tuner/reference.hpp"

namespace flashjit {

enum class TensorRole {
  Q,
  K,
  V,
  O,
  Lse,
  DO,
  DQ,
  DK,
  DV,
  BlockTable,
  SeqlensK,
  AlibiSlopes,
  CuSeqlensQ,
  CuSeqlensK
};
// "q", "k", ..., "do", "dq", "dk", "dv", "block_table", "seqlens_k", "alibi_slopes",
// "cu_seqlens_q", "cu_seqlens_k"
const char* to_string(TensorRole role);

struct TensorSpec {
  TensorRole role;
  size_t bytes = 0;
  bool output = false;  // written by the kernel (poisoned before a verification launch)
};

// The tensors `problem`'s pass reads and writes, in a fixed order, with their sizes.
std::vector<TensorSpec> tensor_specs(const AttentionProblem& problem);

// Whether `problem`'s call reads int32/fp32 tensors whose contents depend on its shape (a block
// table, seqlens_k, ALiBi slopes, cu_seqlens): timing inputs filled for another problem do not
// serve it.
bool has_index_tensors(const AttentionProblem& problem);

// The small problem that kernels of `problem`'s ProblemSignature and GQA ratio are verified on:
// `heads_kv` kv heads, `seqlen_q` queries, `seqlen_k` keys, the same head_dim, dtype, causal,
// pass, deterministic flag, variant and K/V layout. Batch 1; 3 sequences for a layout or varlen
// (so that per-sequence lengths and document boundaries are exercised): varlen as 3 packed
// documents of uneven lengths (the longest seqlen_q / seqlen_k); a paged cache of the same
// page_size with every sequence's pages distinct (random_inputs shuffles them).
AttentionProblem verification_problem(const AttentionProblem& problem, int64_t heads_kv,
                                      int64_t seqlen_q, int64_t seqlen_k);

// Device buffers for every tensor of one call and the AttentionArgs that point at them.
struct DeviceTensors {
  std::vector<std::pair<TensorRole, DeviceBuffer>> buffers;
  AttentionArgs args;
  const DeviceBuffer* find(TensorRole role) const;
};

// Allocates one buffer per spec (bytes as given: sets sized for a larger problem serve smaller
// ones) and binds them into args.
Result<DeviceTensors> allocate_tensors(const Backend& backend,
                                       const std::vector<TensorSpec>& specs);

// The tensors of `problem`'s call (tensor_specs) with the pass's inputs copied from `inputs`
// (q, k, v; for the backward also o, lse and d_o) and its outputs allocated, not yet written.
// An InvalidArgument names a host tensor whose size is not the problem's span.
Result<DeviceTensors> upload_inputs(const Backend& backend, const AttentionProblem& problem,
                                    const HostInputs& inputs);

// The outputs of one call copied back, whole spans of raw storage as compare() and
// compare_gradients() take them: forward o and lse, backward dq, dk and dv (the other pass's
// stay empty).
struct HostOutputs {
  std::vector<uint16_t> o;
  std::vector<float> lse;
  std::vector<uint16_t> dq, dk, dv;
};

// One checked launch of `kernel` on `tensors`: every output of `problem`'s pass poisoned (0xFF
// bytes: NaN in every dtype, so that an element the kernel forgot to write fails), the launch with
// `args` (usually tensors.args; a caller's workspace or a cleared pointer otherwise), a
// synchronize, the outputs copied back. A failed step stops the run: `failed` says which.
enum class RunStep { Poison, Launch, Synchronize, Download };
const char* to_string(RunStep step);  // "poison the outputs", "launch", ...
struct PoisonedRun {
  Status status;                     // ok, or the error of step `failed` (naming the tensor)
  RunStep failed = RunStep::Poison;  // meaningful when !status.ok()
  HostOutputs outputs;               // filled when status is ok
};
PoisonedRun launch_poisoned(const Backend& backend, const Kernel& kernel,
                            const AttentionProblem& problem, const DeviceTensors& tensors,
                            const AttentionArgs& args);

// Fills the inputs of `tensors` for timing `problem` with Normal(0, 1) data in the dtype (the
// backward's lse with log(seqlen_k) + 0.5, the log-sum-exp of seqlen_k standard normal scores,
// so that P = exp(s - lse) has realistic magnitudes). `seed` varies the data between sets.
Status fill_for_timing(const Backend& backend, const AttentionProblem& problem,
                       DeviceTensors& tensors, uint64_t seed);

// A small problem with known answers that kernels of one signature and GQA ratio are checked on:
// its inputs and fp64 reference on the host, its tensors on the device.
class Verification {
 public:
  // Inputs drawn with `seed` (seqlens_k: lengths seqlen_k, 2/3 and 1/3 of it over the
  // sequences, so that a kernel that reads past a sequence's length fails), the reference
  // computed (a user score_mod / mask_mod / score_mod_grad through `functions`, or where
  // `functions` lacks it, compiled from the expression: complete_variant_functions, whose errors
  // a bad expression or, without the CPU backend, no host C++ compiler gives), the inputs
  // uploaded.
  static Result<std::unique_ptr<Verification>> create(const Backend& backend,
                                                      const AttentionProblem& problem,
                                                      uint64_t seed,
                                                      const VariantFunctions& functions = {});
  const AttentionProblem& problem() const { return problem_; }

  struct Verdict {
    bool passed = false;
    bool launched = false;  // false: the launch (or its synchronize) failed; see `detail`
    std::string detail;     // the comparison ("o_rel_error=..."), or the launch error
  };
  // launch_poisoned on the uploaded inputs, then the outputs compared with the reference: o within
  // `max_rel` and lse within `max_lse_abs` (forward), every gradient within `max_grad_rel`
  // (backward; 0: gradient_tolerance(dtype)). An Error only when a device call other than the
  // launch fails.
  Result<Verdict> run(const Kernel& kernel, double max_rel, double max_lse_abs,
                      double max_grad_rel) const;

 private:
  Verification(const Backend& backend, AttentionProblem problem)
      : backend_(backend), problem_(std::move(problem)) {}
  const Backend& backend_;
  AttentionProblem problem_;
  HostInputs inputs_;
  Reference reference_;
  DeviceTensors tensors_;
};

}  // namespace flashjit
