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
//
// The K/V cache (KvCache, forward only): K and V either contiguous tensors as above, or pages of
// a paged cache (vLLM / FlashInfer layout): k, v [num_pages, page_size, heads_kv, head_dim] and
// an int32 block table [batch, max_pages] naming the page of each block of page_size keys of a
// sequence; key j of sequence b is row j % page_size of page block_table[b][j / page_size].
// Paged or not, the keys of sequence b may be counted per sequence by an int32 device tensor
// seqlens_k [batch] (required for a paged cache): then sequence b has seqlens_k[b] keys, at most
// problem.seqlen_k (which sizes the launch: grids and workspace depend on seqlen_k, never on the
// device lengths, so that a call can be captured in a CUDA graph and replayed with new lengths
// and block tables), and causal masking is bottom-right per sequence: query i sees key j iff
// j <= i + seqlens_k[b] - seqlen_q (chunked prefill appends seqlen_q queries to a cache).
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

// A dense tensor's strides. A product past int64 saturates at the largest multiple of 8 (no
// overflow, whatever the extents): validate() then rejects the span ("strides span more than 2^62
// elements").
Strides contiguous_strides(Layout layout, int64_t seqlen, int64_t heads, int64_t head_dim);

// How K and V are stored and how many keys each sequence has (see the top of this file).
struct KvCache {
  // Keys per page, a multiple of 16 in [kMinPageSize, kMaxPageSize]; 0: K and V are contiguous
  // tensors through the k and v strides. Paged: k_strides/v_strides.batch is the stride of a
  // page, .seq of a key within a page, .head of a kv head.
  int page_size = 0;
  int64_t num_pages = 0;  // paged: pages in k and v (each [num_pages, page_size, heads_kv, d])
  int64_t max_pages = 0;  // paged: block-table columns (row stride of the [batch, max_pages] table)
  // Per-sequence key counts from the device tensor seqlens_k [batch] (AttentionArgs::seqlens_k),
  // each in [0, seqlen_k]. Required when paged.
  bool seqlens_k = false;

  bool paged() const { return page_size > 0; }
  // Keys the layout holds per sequence: max_pages * page_size when paged.
  int64_t capacity() const { return max_pages * page_size; }
  bool operator==(const KvCache&) const = default;
};

inline constexpr int kMinPageSize = 16;
inline constexpr int kMaxPageSize = 256;

// How the runtime's problem texts (ProblemSignature, the tuning store's ProblemKey) end: the
// compiled-in K/V layout and variant, " paged16 seqlens_k <variant key>", each part only when set.
std::string layout_suffix(int page_size, bool seqlens_k, const std::string& variant);

// Attention variants (issue 17; forward, and backward on the CPU and the CUDA mma family): what
// changes which keys a query sees and what its scores are. All default: plain attention (active()
// is false), whose kernels are exactly those of before variants existed. Indices are 0-based
// positions in the sequence (q_idx in [0, seqlen_q), kv_idx in [0, seqlen_k)); `score` is the
// scaled score scale * q . k.
//
// Which keys query i sees (diagonal = seqlen_k - seqlen_q, bottom-right aligned as causal):
//   visible(i, j) = j < prefix
//                   || (causal => j <= i + diagonal)
//                      && (left  == -1 || j >= i + diagonal - left)
//                      && (right == -1 || j <= i + diagonal + right)
//   and then also mask_mod(batch, head, i, j) when a mask_mod is given.
// The score of a visible key, in this order:
//   s = scale * q . k;  s = softcap * tanh(s / softcap);  s += slopes[head] * (j - i);
//   s = score_mod(s, batch, head, i, j)
// A row that sees no key (or whose every score is -inf) has o = 0 and lse = +inf.
struct Variant {
  // Sliding window around the diagonal: keys up to `window_left` before and `window_right` after
  // it; -1: that side unbounded. Causal additionally caps the right side at 0.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Soft-capping of the scores (Gemma 2: 50 for attention); unset: none. Must be > 0, finite.
  std::optional<float> softcap;
  // ALiBi: a per-head slope (float32 [heads_q], AttentionArgs::alibi_slopes), the bias
  // slope * (kv_idx - q_idx) added to each score.
  bool alibi = false;
  // Prefix-LM: keys [0, prefix) are visible to every query (whatever causal and the window say).
  int64_t prefix = 0;
  // User expressions, rendered into the kernel source (empty: none). score_mod: a float
  // expression over (score, batch, head, q_idx, kv_idx), e.g. "score - 0.1f * abs(q_idx -
  // kv_idx)"; mask_mod: a bool expression over (batch, head, q_idx, kv_idx), e.g.
  // "(q_idx / 64) == (kv_idx / 64)". One C++ expression each: validate() refuses ';', braces,
  // '#', comments, quotes, backslashes, unbalanced parentheses and `return` before anything is
  // compiled. Available in them: abs, min, max, tanh, exp, exp2, log, log2, sqrt, floor
  // (templates/attention_variant.h).
  std::string score_mod;
  std::string mask_mod;
  // The backward of a score_mod: d score_mod / d score, a float expression over the same
  // variables (`score` is score_mod's input), e.g. "1.0f" for "score - 0.1f * abs(q_idx -
  // kv_idx)". Required by a backward problem with a score_mod (the error names it); only with a
  // score_mod; rendered into backward kernels only (part of key() all the same).
  std::string score_mod_grad;
  // Packed variable-length documents (flash_attn's varlen convention, issue 17): q and o are
  // (total_q, heads_q, d), k and v (total_k, heads_kv, d), through the seq and head strides (the
  // batch strides must be 0); document b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1])
  // and see only its own keys [cu_seqlens_k[b], cu_seqlens_k[b + 1]) (AttentionArgs: int32
  // [batch + 1] offsets, cu[0] = 0, non-decreasing). The problem's batch is the number of
  // documents and seqlen_q / seqlen_k the longest document's lengths (max_seqlen_q / _k: they size
  // the launch); every index above (q_idx, kv_idx, batch, the causal diagonal and the window) is
  // per document, as if each were a batch entry of its own. lse is packed too: document b's
  // [heads_q, len_q(b)] block starts at element heads_q * cu_seqlens_q[b] (lse_elements():
  // heads_q * total_q). The offsets are device data: the GPU kernels do not check them (a
  // document longer than seqlen_q has its rows past seqlen_q left unwritten; offsets past
  // total_q / total_k read and write out of bounds); the CPU backend checks them
  // (check_cu_seqlens) before a launch.
  bool varlen = false;
  // Rows of the packed tensors (q.shape[0], k.shape[0]): not compiled in (not part of key()),
  // for spans and bounds only.
  int64_t total_q = 0;
  int64_t total_k = 0;

  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  // Anything set at all: false for plain attention.
  bool active() const {
    return has_window() || softcap.has_value() || alibi || prefix > 0 || !score_mod.empty() ||
           !mask_mod.empty() || !score_mod_grad.empty() || varlen;
  }
  // "" for plain attention; else what is compiled into the kernel, e.g. "window(128,0) softcap50
  // alibi prefix16 score_mod#0123456789abcdef mask_mod#... varlen" (a user expression by a
  // 64-bit hash of its text): part of ProblemSignature and of the tuning key.
  std::string key() const;
  bool operator==(const Variant&) const = default;
};

// Longest user expression accepted (characters).
inline constexpr size_t kMaxVariantExpression = 4096;

// Why `expression` is not one C++ expression we accept (see Variant::score_mod), quoting it;
// `what` names it in the message ("score_mod", "mask_mod").
Status check_variant_expression(const char* what, const std::string& expression);

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

  // Forward only: a paged K/V cache and/or per-sequence key counts (default: neither). Only the
  // decode family (generator/decode_config.hpp) reads them.
  KvCache kv;

  // Forward only (stage 1): sliding window, soft-capping, ALiBi, prefix-LM, user score/mask mods.
  Variant variant;

  // A problem with all its tensors contiguous in `layout` (the gradients too).
  static AttentionProblem make(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q,
                               int64_t seqlen_k, int head_dim, DType dtype, bool causal,
                               Layout layout = Layout::BSHD);
  // The same problem reading K and V from a paged cache of `num_pages` contiguous pages of
  // `page_size` keys ([num_pages, page_size, heads_kv, head_dim]), a block table of
  // ceil(seqlen_k / page_size) columns and per-sequence lengths (seqlens_k).
  AttentionProblem with_paged_kv(int page_size, int64_t num_pages) const;
  // Packed variable-length documents (Variant::varlen): `num_docs` documents of at most
  // max_seqlen_q queries and max_seqlen_k keys, packed into q, o (total_q, heads_q, head_dim)
  // and k, v (total_k, heads_kv, head_dim), contiguous.
  static AttentionProblem make_varlen(int64_t num_docs, int64_t heads_q, int64_t heads_kv,
                                      int64_t max_seqlen_q, int64_t max_seqlen_k, int64_t total_q,
                                      int64_t total_k, int head_dim, DType dtype, bool causal);
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
  // backward 2.5 times the forward (5 matrix products instead of 2). Varlen: as if every
  // document had the longest lengths (an upper bound: the lengths are launch data).
  double flops() const;
  // Elements each tensor spans in memory (max offset + 1), for allocation and bounds checks.
  int64_t q_span() const;
  int64_t kv_span() const;  // K and V (paged: the whole cache)
  int64_t o_span() const;
  int64_t do_span() const;   // backward: dO
  int64_t dq_span() const;   // backward: dQ
  int64_t dkv_span() const;  // backward: dK and dV
  // [batch, heads_q, seqlen_q]; varlen: heads_q * total_q (see Variant::varlen).
  int64_t lse_elements() const {
    return variant.varlen ? heads_q * variant.total_q : batch * heads_q * seqlen_q;
  }
  // Paged: the block table's elements (batch * max_pages); 0 otherwise.
  int64_t block_table_elements() const { return kv.paged() ? batch * kv.max_pages : 0; }

  std::string to_string() const;
};

// Smallest and largest head dims the templates accept; head_dim must be a multiple of 8.
inline constexpr int kMinHeadDim = 8;
inline constexpr int kMaxHeadDim = 256;

// Checks every field (for the backward pass the gradients' strides too); the error names the bad
// value and what is allowed.
Status validate(const AttentionProblem& problem);

// Why host offsets `cu` (int32 [num_docs + 1], named `name`: "cu_seqlens_q") do not describe
// documents of at most `max_seqlen` rows packed into `total` rows: cu[0] must be 0, the offsets
// non-decreasing, each document at most max_seqlen long, cu[num_docs] <= total. The error names
// the first bad entry.
Status check_cu_seqlens(const char* name, const int32_t* cu, int64_t num_docs, int64_t max_seqlen,
                        int64_t total);

}  // namespace flashjit
