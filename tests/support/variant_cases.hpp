// Attention variant cases shared by the backends' variant tests (CPU, CUDA): each variant kind
// and combinations, with the host versions of their user expressions for the fp64 reference.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "tuner/reference.hpp"

namespace flashjit::testing {

struct VariantCase {
  const char* name;
  bool causal;
  Variant variant;
  VariantFunctions functions;  // the host versions of the user expressions
};

// Sliding window (causal; both sides; right only; empty windows), softcap, ALiBi (causal),
// prefix-LM, window + softcap + ALiBi (causal), a score_mod using the head, a nonlinear score_mod
// over a softcap, a mask_mod using the batch (causal). Each score_mod with its score_mod_grad.
std::vector<VariantCase> variant_cases();

// The variants the compile tests build (CUDA with NVRTC, HIP with hipRTC), by name: "window",
// "softcap_alibi", "prefix" (with a window), "score_mod", "mask_mod" alone, and "everything" (all
// of them at once, the score_mod calling tanh).
struct NamedVariant {
  const char* name;
  Variant variant;
};
std::vector<NamedVariant> compile_variants();
// compile_variants() for a backward problem: each score_mod with its derivative (d/ds of
// s - 0.1 |q - k| is 1, of s / 2 + tanh(s) is 1 / 2 + 1 - tanh(s)^2).
std::vector<NamedVariant> backward_compile_variants();

// The variant the CUDA and HIP host emulation tests compile in (tests/support/emulated_variant.h
// holds its rendered prelude): causal, window (40, -1), prefix 24, softcap 2, ALiBi, a score_mod
// using the distance, head and batch and, with_mask_mod, a mask_mod using all four indices.
VariantCase emulated_variant(bool with_mask_mod);
// Lines of what render_variant_prelude gives for emulated_variant(with_mask_mod) in a forward
// problem: the forward emulation tests check that they compile that in (support/emulated_variant.h
// with FLASHJIT_VARIANT_MASK_MOD as with_mask_mod).
std::vector<std::string> emulated_forward_prelude_lines(bool with_mask_mod);
// The same for emulated_variant(true) in a backward problem: the backward emulation tests check
// that they compile that in (support/emulated_variant.h with FLASHJIT_VARIANT_MASK_MOD and
// FLASHJIT_VARIANT_SCORE_MOD_GRAD 1).
std::vector<std::string> emulated_backward_prelude_lines();

// Sets keys [begin, end) of k and v to NaN in every batch and key/value head (packed documents:
// rows [begin, end) of the packed sequence): the keys of blocks no query sees, so that a kernel
// that loads such a block fails its comparison.
void poison_keys(const AttentionProblem& problem, HostInputs& inputs, int64_t begin, int64_t end);

// The CUDA varlen emulation tests (mma, wgmma, -ws): packed documents of 1, 17, ~100 rows, one of
// 300 among short ones, empty ones, seqlen_q != seqlen_k both ways, spare rows past the last
// document, under GQA 2:2 and 4:1, causal with the sliding window (30, -1) (the diagonal and the
// band per document) that those tests compile in (kVarlenEmulationWindowLeft), or (causal
// false: -ws's second build) non-causal without a window. `run` launches the emulated kernel on
// a problem: o comes poisoned, so every document row must be written and the spare rows left
// alone; the spare key rows are NaN, so a tile whose result takes in a key past its document
// fails. It returns the emulator's error ("" when it ran).
inline constexpr int kVarlenEmulationWindowLeft = 30;
using VarlenRun = std::function<std::string(const AttentionProblem&, const HostInputs&,
                                            std::vector<uint16_t>* o, std::vector<float>* lse)>;
// One problem of the cases above (the first: a single document of one row), for the defines check.
// causal false: the packed documents alone, not causal and without the window (the tests' second
// builds, support/emulated_varlen.h with FLASHJIT_EMULATED_VARLEN_NON_CAUSAL).
AttentionProblem varlen_emulation_problem(DType dtype, int head_dim, bool causal = true);
void check_varlen_emulation(DType dtype, int head_dim, const VarlenRun& run, bool causal = true);

// The CUDA backward varlen emulation tests (mma and wgmma): check_varlen_emulation's documents
// and GQA, the backward problem of each (causal with the window (30, -1), or with causal_window
// false the documents alone, not causal) against the fp64 reference gradients per document. `run`
// launches the emulated backward (preprocess, dK/dV, convert or dQ kernel) and returns the whole
// spans of dq, dk and dv, written into poisoned buffers: every document row must be written and the
// spare rows past the last document left alone. The spare rows of q, o and dO, their lse and the
// spare keys are NaN, so a tile that reads past its document fails. It returns the emulator's error
// ("" when it ran).
struct Gradients {  // a backward call's dq, dk, dv: whole spans of raw storage
  std::vector<uint16_t> dq, dk, dv;
};
using VarlenBackwardRun =
    std::function<std::string(const AttentionProblem&, const HostInputs&, Gradients* out)>;
void check_varlen_backward_emulation(DType dtype, int head_dim, bool causal_window,
                                     const VarlenBackwardRun& run);

}  // namespace flashjit::testing
