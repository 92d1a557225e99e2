// The trusted fp64 attention reference that kernels are verified against: half-precision
// conversions, random inputs, the reference itself and a comparison of a kernel's output with it.
// The tuner verifies every variant with it before timing; tests/support re-exports it.
//
// Inputs are stored as raw 16-bit patterns (std::vector<uint16_t>) in the problem's dtype and are
// read through the problem's strides, exactly as a kernel reads them; the reference works on the
// rounded inputs, so the only difference it measures is the kernel's arithmetic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "generator/problem.hpp"

namespace flashjit {

// Round-to-nearest-even conversions on bit patterns. NaN stays NaN (quiet), infinities and
// overflow give infinities; fp16 handles subnormals.
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);
float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float value);
float half_to_float(uint16_t bits, DType dtype);
uint16_t float_to_half(float value, DType dtype);

// The pattern o is filled with before a launch (0xFF bytes): a NaN in both fp16 and bf16.
inline constexpr uint16_t kPoisonBits = 0xFFFF;

struct HostInputs {
  std::vector<uint16_t> q;  // problem.q_span() elements
  std::vector<uint16_t> k;  // problem.kv_span() elements
  std::vector<uint16_t> v;  // problem.kv_span() elements
};

// Normal(0, 1) values rounded to the problem's dtype, over the whole span of every tensor
// (padding between strided rows too, so a kernel that reads padding gets garbage, not zeros).
HostInputs random_inputs(const AttentionProblem& problem, uint64_t seed);

struct Reference {
  std::vector<double> o;    // dense [batch, seqlen_q, heads_q, head_dim]
  std::vector<double> lse;  // [batch, heads_q, seqlen_q], natural log; +inf for a row with no key
};

// fp64 attention over the rounded inputs, multithreaded. A row with no visible key (causal with
// seqlen_q > seqlen_k) has o = 0 and lse = +inf.
Reference reference_attention(const AttentionProblem& problem, const HostInputs& inputs);

struct Comparison {
  double o_rel_error = 0;        // ||o - ref|| / ||ref|| (L2); ||o - ref|| when ref is all 0
  int64_t o_nan_count = 0;       // NaN or inf elements of o (poisoned ones included)
  double lse_max_abs_error = 0;  // over rows with finite reference lse; NaN lse counts as inf
  int64_t lse_mismatched_infinite = 0;  // rows where exactly one of ref and lse is +inf
  int64_t poisoned_left = 0;            // o elements still equal to kPoisonBits
  int64_t o_padding_written = 0;        // elements between strided o rows that were overwritten
  bool lse_checked = true;              // false when compare() was given no lse

  std::string to_string() const;
};

// Compares a kernel's output with the reference. `o_bits` is the whole o span
// (problem.o_span() elements, read through problem.o_strides) as copied back after a launch into
// a poisoned buffer; `lse` is [batch, heads_q, seqlen_q], or empty to skip the lse checks.
Comparison compare(const AttentionProblem& problem, const std::vector<uint16_t>& o_bits,
                   const std::vector<float>& lse, const Reference& reference);

// True when o is within `max_rel` relative L2 error, has no NaN/inf, nothing was left poisoned,
// no padding was written, and (when checked) lse agrees within `max_lse_abs` with matching
// infinities. A NaN error fails.
bool within_tolerance(const Comparison& comparison, double max_rel = 1e-2,
                      double max_lse_abs = 1e-3);

}  // namespace flashjit
