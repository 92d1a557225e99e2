// AttentionProblem: what one attention forward call computes, independent of any device.
//
//   O[b, s, h, :] = softmax(scale * Q[b, s, h, :] K[b, :, h / G, :]^T + mask) V[b, :, h / G, :]
//   LSE[b, h, s]  = log(sum_j exp(scale * q . k_j))   (natural log, fp32; +inf for a row with no
//   keys)
//
// with G = heads_q / heads_kv (GQA; MQA when heads_kv == 1). Causal masking is aligned
// bottom-right as in FlashAttention-2: query i sees key j iff j <= i + seqlen_k - seqlen_q.
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

  // A problem with all four tensors contiguous in `layout`.
  static AttentionProblem make(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q,
                               int64_t seqlen_k, int head_dim, DType dtype, bool causal,
                               Layout layout = Layout::BSHD);

  float scale() const;
  int64_t group_size() const { return heads_q / heads_kv; }
  // Forward FLOPs by the FlashAttention convention: 4 * B * Hq * Sq * Sk * d, halved when causal
  // (exact count of unmasked pairs is not used, to compare with published numbers).
  double flops() const;
  // Elements each tensor spans in memory (max offset + 1), for allocation and bounds checks.
  int64_t q_span() const;
  int64_t kv_span() const;  // K and V
  int64_t o_span() const;
  int64_t lse_elements() const { return batch * heads_q * seqlen_q; }

  std::string to_string() const;
};

// Smallest and largest head dims the templates accept; head_dim must be a multiple of 8.
inline constexpr int kMinHeadDim = 8;
inline constexpr int kMaxHeadDim = 256;

// Checks every field; the error names the bad value and what is allowed.
Status validate(const AttentionProblem& problem);

}  // namespace flashjit
