// The trusted fp64 attention reference that kernels are verified against: half-precision
// conversions, random inputs, the reference itself and a comparison of a kernel's output with it.
// The tuner verifies every variant with it before timing; tests/support re-exports it.
//
// Host tensors are raw storage in 16-bit words (std::vector<uint16_t>): one word per f16/bf16
// element, two per f32 element (little-endian, the low half first), so that one container serves
// every dtype. They are read through the problem's strides, exactly as a kernel reads them; the
// reference works on the rounded inputs, so the only difference it measures is the kernel's
// arithmetic.
#pragma once

#include <cstdint>
#include <functional>
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
// The 16-bit dtypes only (F16, BF16); element_value / set_element serve every dtype.
float half_to_float(uint16_t bits, DType dtype);
uint16_t float_to_half(float value, DType dtype);

// 16-bit words per element of `dtype` (1, or 2 for F32).
inline int storage_words(DType dtype) { return dtype_bytes(dtype) / 2; }
// Element `index` of raw storage, decoded to float.
float element_value(const uint16_t* storage, int64_t index, DType dtype);
// Stores `value` rounded to `dtype` (nearest even) as element `index` of raw storage.
void set_element(uint16_t* storage, int64_t index, float value, DType dtype);

// The word o is filled with before a launch (0xFF bytes): a NaN in f16, bf16 and f32 alike.
inline constexpr uint16_t kPoisonBits = 0xFFFF;

// Raw storage for `elements` elements of `dtype`, every word kPoisonBits.
inline std::vector<uint16_t> poisoned_storage(int64_t elements, DType dtype) {
  return std::vector<uint16_t>(static_cast<size_t>(elements * storage_words(dtype)), kPoisonBits);
}

struct HostInputs {
  std::vector<uint16_t> q;  // problem.q_span() elements (raw storage, see above)
  std::vector<uint16_t> k;  // problem.kv_span() elements
  std::vector<uint16_t> v;  // problem.kv_span() elements
  // Backward problems only: what the forward produced and the upstream gradient.
  std::vector<uint16_t> o;    // problem.o_span() elements: the fp64 forward, rounded to dtype
  std::vector<float> lse;     // [batch, heads_q, seqlen_q]: the fp64 forward's, in fp32
  std::vector<uint16_t> d_o;  // problem.do_span() elements, Normal(0, 1)
  // A paged K/V cache (problem.kv.paged()): the block table [batch, max_pages], int32.
  std::vector<int32_t> block_table;
  // Per-sequence key counts (problem.kv.seqlens_k): [batch], int32, each <= seqlen_k.
  std::vector<int32_t> seqlens_k;
  // ALiBi (problem.variant.alibi): the slope of each query head [heads_q], fp32.
  std::vector<float> alibi_slopes;
  // Packed variable-length documents (problem.variant.varlen): the row offsets [batch + 1] of
  // the documents in q/o and k/v, int32.
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
};

// Host versions of a problem's user expressions (Variant::score_mod, mask_mod) for the reference,
// which does not read C++ text itself: the caller states the same function, in fp64, or has it
// compiled from the expression (tuner/variant_functions.hpp, as the tuner's verification does).
// Without one, the reference of a problem that has the expression is all NaN (nothing can pass
// against it).
// score_mod_grad: d score_mod / d score at the same arguments (Variant::score_mod_grad), which the
// backward reference needs for a score_mod (without it the gradients are all NaN).
struct VariantFunctions {
  using ScoreFunction = std::function<double(double score, int64_t batch, int64_t head,
                                             int64_t q_idx, int64_t kv_idx)>;
  ScoreFunction score_mod;
  std::function<bool(int64_t batch, int64_t head, int64_t q_idx, int64_t kv_idx)> mask_mod;
  ScoreFunction score_mod_grad;
};

// Offsets cu [lengths.size() + 1] of documents of `lengths` rows packed one after the other.
std::vector<int32_t> cu_seqlens_of(const std::vector<int64_t>& lengths);
// Offsets of `docs` documents splitting `total` rows as evenly as `longest` rows each allow.
std::vector<int32_t> even_cu_seqlens(int64_t docs, int64_t total, int64_t longest);

// ALiBi's standard slopes, 2^(-8 (h + 1) / heads) for head h: every head's different.
std::vector<float> standard_alibi_slopes(int64_t heads);

// Normal(0, 1) values rounded to the problem's dtype, over the whole span of every tensor
// (padding between strided rows too, so a kernel that reads padding gets garbage, not zeros).
// A paged cache: each sequence's max_pages pages distinct and shuffled over the cache (when
// num_pages holds them all; else shuffled and reused); seqlens_k: seqlen_k for every sequence
// (callers that want other lengths set them: tests/support/decode_cases.hpp).
// ALiBi: standard_alibi_slopes(heads_q).
// Varlen: even_cu_seqlens of total_q / total_k over the batch's documents (callers that want
// other lengths set them, within the totals).
// For a backward problem also d_o (random) and o, lse from the fp64 forward of q, k, v (o's
// padding random too), as a forward kernel would have left them (a variant's forward: through
// `functions`, the host versions of its user expressions).
HostInputs random_inputs(const AttentionProblem& problem, uint64_t seed,
                         const VariantFunctions& functions = {});

// A backward problem's o (its rows; padding as it is) and lse from the fp64 forward of the
// inputs' q, k, v: what random_inputs does last, again after a caller changed the inputs (e.g.
// packed documents of other lengths).
void set_forward_outputs(const AttentionProblem& problem, HostInputs& inputs,
                         const VariantFunctions& functions = {});

struct Reference {
  std::vector<double> o;    // dense [batch, seqlen_q, heads_q, head_dim]
  std::vector<double> lse;  // [batch, heads_q, seqlen_q], natural log; +inf for a row with no key
  // Varlen (problem.variant.varlen): o is dense [rows, heads_q, head_dim] and lse the packed
  // [heads_q, len_q(b)] blocks of each document, over the rows = cu_seqlens_q[batch] rows that
  // belong to a document (rows past them must stay untouched: compare() counts them as padding).
  // Backward problems only: the exact gradients of the rounded inputs (P from the exact forward,
  // D = rowsum(dO * O) with the exact O), dense like o; dk, dv [batch, seqlen_k, heads_kv, d].
  std::vector<double> dq, dk, dv;
};

// The variant's score of key j for query row i (problem.variant; generator/problem.hpp defines
// it): -inf when row i does not see key j, else `score` (= scale * q . k) soft-capped, biased by
// ALiBi (`slope`: the head's) and through the user's score_mod. Plain problems: `score`, or
// -inf past the causal diagonal.
double variant_score(const AttentionProblem& problem, const VariantFunctions& functions,
                     int64_t batch, int64_t head, int64_t i, int64_t j, double score, double slope);

// d variant_score / d score for a key row i sees (the chain through the soft-cap,
// 1 - tanh^2(score / softcap), and the user's score_mod_grad at score_mod's input; ALiBi's bias
// does not depend on the score): what the backward multiplies dS by. 1 for a variant that does
// not change the scores; NaN for a score_mod without functions.score_mod_grad.
double variant_score_grad(const AttentionProblem& problem, const VariantFunctions& functions,
                          int64_t batch, int64_t head, int64_t i, int64_t j, double score,
                          double slope);

// fp64 attention over the rounded inputs, multithreaded. A row with no visible key (causal with
// seqlen_q > seqlen_k) has o = 0 and lse = +inf (and contributes no gradient). For a backward
// problem the gradients too (o and lse as for the forward).
// A paged cache or per-sequence lengths (problem.kv): each sequence's seqlens_k[b] keys are
// gathered (through the block table) and attended as a problem of their own; a sequence of 0
// keys has o = 0 and lse = +inf.
// Packed documents (problem.variant.varlen): each document alone (its rows sliced through
// inputs.cu_seqlens_q / _k, its index as the batch the user expressions see).
// A variant (problem.variant): scores through variant_score; a row whose every score is -inf has
// o = 0 and lse = +inf like a row with no key (and no gradient). The backward's dS is multiplied
// by variant_score_grad (hidden keys: none). `functions` must give the problem's user expressions
// (else NaN, see VariantFunctions). Packed documents' gradients: dense [rows, heads, d] over the
// documents' rows, like o (dk, dv over cu_seqlens_k[batch] key rows).
Reference reference_attention(const AttentionProblem& problem, const HostInputs& inputs,
                              const VariantFunctions& functions = {});

struct Comparison {
  double o_rel_error = 0;        // ||o - ref|| / ||ref|| (L2); ||o - ref|| when ref is all 0
  int64_t o_nan_count = 0;       // NaN or inf elements of o (poisoned ones included)
  double lse_max_abs_error = 0;  // over rows with finite reference lse; NaN lse counts as inf
  int64_t lse_mismatched_infinite = 0;  // rows where exactly one of ref and lse is +inf
  int64_t poisoned_left = 0;            // o elements still all kPoisonBits
  int64_t o_padding_written = 0;        // elements between strided o rows that were overwritten
  bool lse_checked = true;              // false when compare() was given no lse

  std::string to_string() const;
};

// Compares a kernel's output with the reference. `o_bits` is the whole o span
// (problem.o_span() elements of raw storage, read through problem.o_strides) as copied back after
// a launch into a poisoned buffer; `lse` is [batch, heads_q, seqlen_q], or empty to skip the lse
// checks.
Comparison compare(const AttentionProblem& problem, const std::vector<uint16_t>& o_bits,
                   const std::vector<float>& lse, const Reference& reference);

// One output tensor of a backward call against its reference: relative L2 error, non-finite
// elements, elements left poisoned, elements written between strided rows.
struct TensorComparison {
  double rel_error = 0;
  int64_t nan_count = 0;
  int64_t poisoned_left = 0;
  int64_t padding_written = 0;
};

struct GradientComparison {
  TensorComparison dq, dk, dv;
  double max_rel_error() const;  // NaN if any is NaN
  std::string to_string() const;
};

// Compares a backward call's dq, dk and dv (whole spans of raw storage through the problem's dq,
// dk and dv strides, copied back after a launch into poisoned buffers) with the reference.
GradientComparison compare_gradients(const AttentionProblem& problem,
                                     const std::vector<uint16_t>& dq_bits,
                                     const std::vector<uint16_t>& dk_bits,
                                     const std::vector<uint16_t>& dv_bits,
                                     const Reference& reference);

// The relative L2 error a correct backward kernel stays under, by storage type: bf16 1e-2, fp16
// 2e-3, fp32 2e-5. The gradients compound more roundings than the forward's output: P and dS
// are rounded to the storage type before the matrix products that make dV, dK and dQ (as
// FlashAttention does), and D = rowsum(dO * O) uses the rounded O. Measured worst cases over
// every legal config and test shape (2026-11-23): on an H100 (mma and wgmma families, seqlen up
// to 4097) bf16 2.9e-3, fp16 3.7e-4; on the CPU backend bf16 2.6e-3, fp16 3.0e-4, fp32 1.1e-6.
// The limits leave 3-5x of headroom (20x for fp32) while an indexing or masking defect (a
// missed key block, a wrong row, a GQA head not summed) lands far above them (tests/support/
// reference_test.cpp and the kernel tests' mutation checks).
double gradient_tolerance(DType dtype);

// True when every gradient is within `max_rel` relative L2 error, finite, fully written and no
// padding was written. A NaN error fails.
bool within_tolerance(const GradientComparison& comparison, double max_rel);

// True when o is within `max_rel` relative L2 error, has no NaN/inf, nothing was left poisoned,
// no padding was written, and (when checked) lse agrees within `max_lse_abs` with matching
// infinities. A NaN error fails.
bool within_tolerance(const Comparison& comparison, double max_rel = 1e-2,
                      double max_lse_abs = 1e-3);

}  // namespace flashjit
