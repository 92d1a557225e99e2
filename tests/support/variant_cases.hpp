// Attention variant cases shared by the backends' variant tests (CPU, CUDA): each variant kind
// and combinations, with the host versions of their user expressions for the fp64 reference.
#pragma once

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

// The variant the CUDA host emulation tests compile in (tests/support/emulated_variant.h holds its
// rendered prelude): causal, window (40, -1), prefix 24, softcap 2, ALiBi, a score_mod using the
// distance, head and batch and, with_mask_mod, a mask_mod using all four indices.
VariantCase emulated_variant(bool with_mask_mod);

// Sets keys [begin, end) of k and v to NaN in every key/value head: the keys of blocks no query
// sees, so that a kernel that loads such a block fails its comparison.
void poison_keys(const AttentionProblem& problem, HostInputs& inputs, int64_t begin, int64_t end);

}  // namespace flashjit::testing
