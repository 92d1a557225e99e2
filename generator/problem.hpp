// AttentionProblem: what one attention call computes, independent of any device.
//
// The forward pass (Pass::Forward):
//   O[b, s, h, :] = softmax(scale * Q[b, s, h, :] K[b, :, h / G, :]^T + mask) V[b, :, h / G, :]
//   LSE[b, h, s]  = log(sum_j exp(scale * q . k_j))   (natural log, fp32; +inf for a row with no
//   keys)
//
// with G = heads_q / heads_kv (GQA; MQA when heads_kv == 1). Causal masking is aligned
// bottom-right as in FlashAttention-2: query i sees key j iff j <= i + seqlen_k - seqlen_q.
//
// The backward pass (Pass::Backward) takes Q, K, V, O, dO and the forward's LSE and writes the
// gradients of a loss L with dO = dL/dO:
//   P  = exp(scale * Q K^T - LSE)           recomputed block by block, never stored
//   dV = P^T dO                             summed over the G query heads of a key/value head
//   dP = dO V^T,  D = rowsum(dO * O),  dS = P * (dP - D)
//   dQ = scale * dS K,   dK = scale * dS^T Q   (dK summed over the group like dV)
// dO has o's shape, dQ q's, dK and dV k's; each has strides of its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "generator/error.hpp"

namespace flashjit {

// Storage type of q, k, v and o (arithmetic is fp32 either way). F32 runs on the CPU backend
// only: the CUDA template takes F16 and BF16 (check_cuda_problem, generator/config.hpp).
enum class DType { F16, BF16, F32 };

const char* to_string(DType dtype);  // "f16", "bf16", "f32"
// "f16"/"fp16"/"float16"/"half", "bf16"/"bfloat16", "f32"/"fp32"/"float32"/"float"
Result<DType> parse_dtype(const std::string& text);
inline int dtype_bytes(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

// Memory layouts with a contiguous last (head-dim) axis.
enum class Layout {
  BSHD,  // [batch, seq, heads, head_dim]  (flash_attn convention)
  BHSD,  // [batch, heads, seq, head_dim]  (torch SDPA convention)
};

const char* to_string(Layout layout);

// Which computation of attention a problem asks for. Each pass is its own operation: its own
// configs, budget, templates and tuning-DB rows.
enum class Pass { Forward, Backward };

const char* to_string(Pass pass);  // "fwd", "bwd"
// "fwd"/"forward", "bwd"/"backward"; the error lists them.
Result<Pass> parse_pass(const std::string& text);

// Element strides of one 4-D tensor; the head_dim axis always has stride 1.
struct Strides {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head = 0;
  bool operator==(const Strides&) const = default;
};

Strides contiguous_strides(Layout layout, int64_t seqlen, int64_t heads, int64_t head_dim);

struct AttentionProblem {
  int64_t batch = 1;
  int64_t heads_q = 1;
  int64_t heads_kv = 1;
  int64_t seqlen_q = 1;
  int64_t seqlen_k = 1;
  int head_dim = 128;
  DType dtype = DType::BF16;
  bool causal = false;
  std::optional<float> softmax_scale;  // unset: 1 / sqrt(head_dim)
  Strides q_strides, k_strides, v_strides, o_strides;

  Pass pass = Pass::Forward;
  // Backward only: dQ from a kernel of its own that loops over the key blocks, instead of fp32
  // atomics into a workspace, so that the gradients are bitwise reproducible run to run. Only
  // configs with DqMode::Separate are legal then.
  bool deterministic = false;
  // Backward only: the strides of dO (like o), dQ (like q), dK and dV (like k).
  Strides do_strides, dq_strides, dk_strides, dv_strides;

  // A problem with all its tensors contiguous in `layout` (the gradients too).
  static AttentionProblem make(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q,
                               int64_t seqlen_k, int head_dim, DType dtype, bool causal,
                               Layout layout = Layout::BSHD);
  // The same problem for another pass (the gradient strides as they are).
  AttentionProblem with_pass(Pass other) const {
    AttentionProblem copy = *this;
    copy.pass = other;
    return copy;
  }

  bool is_backward() const { return pass == Pass::Backward; }
  float scale() const;
  int64_t group_size() const { return heads_q / heads_kv; }
  // FLOPs by the FlashAttention convention: forward 4 * B * Hq * Sq * Sk * d, halved when
  // causal (the exact count of unmasked pairs is not used, to compare with published numbers);
  // backward 2.5 times the forward (5 matrix products instead of 2).
  double flops() const;
  // Elements each tensor spans in memory (max offset + 1), for allocation and bounds checks.
  int64_t q_span() const;
  int64_t kv_span() const;  // K and V
  int64_t o_span() const;
  int64_t do_span() const;   // backward: dO
  int64_t dq_span() const;   // backward: dQ
  int64_t dkv_span() const;  // backward: dK and dV
  int64_t lse_elements() const { return batch * heads_q * seqlen_q; }

  std::string to_string() const;
};

// Smallest and largest head dims the templates accept; head_dim must be a multiple of 8.
inline constexpr int kMinHeadDim = 8;
inline constexpr int kMaxHeadDim = 256;

// Checks every field (for the backward pass the gradients' strides too); the error names the bad
// value and what is allowed.
Status validate(const AttentionProblem& problem);

}  // namespace flashjit
