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
// prefix-LM, window + softcap + ALiBi (causal), a score_mod using the head, a mask_mod using
// the batch (causal).
std::vector<VariantCase> variant_cases();

}  // namespace flashjit::testing
