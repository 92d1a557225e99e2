// What every GPU attention template computes the same way, whatever its vendor: which keys a
// block of query rows sees and which query rows a block of keys is seen by (seqlen_k edge, causal
// mask aligned bottom-right), which blocks need masking, the conventions of the softmax state and
// the log-sum-exp output, and how the backward pass recomputes P from it.
// Scalar code only, so that it means the same thing under NVRTC, hipRTC and a host compiler
// (the HIP template's host emulation test). The renderer prepends attention_params.h.
#ifndef FLASHJIT_ATTENTION_COMMON_H
#define FLASHJIT_ATTENTION_COMMON_H

// The signature of a GPU kernel body over the params p (the __device__ function an entry
// calls): a variant's body also takes a mask_mod's block map (FLASHJIT_VARIANT_BLOCK_MASK), which
// its entry passes as a kernel parameter; a plain body takes the params alone.
#ifdef FLASHJIT_VARIANT
#define FLASHJIT_KERNEL_BODY(name)                            \
  FLASHJIT_DEVICE void name(const FlashjitAttentionParams& p, \
                            const FlashjitBlockMask* block_mask = 0)
#else
#define FLASHJIT_KERNEL_BODY(name) FLASHJIT_DEVICE void name(const FlashjitAttentionParams& p)
#endif

// Packed variable-length documents (FA2's varlen): a GPU kernel body's entry that the renderer
// calls instead of the body. FLASHJIT_DOCUMENT_ENTRY(name, VIEW, body) defines name(params),
// which copies the params into `document`, turns it into the CTA's document's view with VIEW
// (templates/attention_variant.h: document_view, or a backward's document_tile_view, whose
// workspace is packed by document, called on `document` and blockIdx.z; false when the CTA's
// rows or keys start past the document's) and runs body on it: masks, the causal diagonal and
// the variant's band are per document, and no load or store crosses into another document.
#define FLASHJIT_DOCUMENT_ENTRY(name, VIEW, ...)                     \
  FLASHJIT_DEVICE void name(const FlashjitAttentionParams& params) { \
    FlashjitAttentionParams document = params;                       \
    if (flashjit_variant::VIEW) __VA_ARGS__(document);               \
  }
// The query block a CTA of a GPU kernel over query blocks computes: causal rows near the end see
// the most keys, so they are launched first (the tail is short).
#define FLASHJIT_QUERY_BLOCK(CAUSAL) ((CAUSAL) ? gridDim.x - 1 - blockIdx.x : blockIdx.x)
// The entries over traits K of a forward body NAME<K> (NAME##_varlen: a CTA's query rows start
// at its query block's first), and of a backward family's dK/dV and dQ bodies PREFIX##_dkdv<K>
// and PREFIX##_dq<K> (a dK/dV CTA's keys start at blockIdx.x * kBlockN, a dQ CTA's rows at its
// query block's first; workspace rows of ACCUM_ROW_FLOATS floats).
#define FLASHJIT_FORWARD_DOCUMENT_ENTRY(NAME)                                                \
  template <class K>                                                                         \
  FLASHJIT_DOCUMENT_ENTRY(                                                                   \
      NAME##_varlen,                                                                         \
      document_view(document, blockIdx.z, FLASHJIT_QUERY_BLOCK(K::kCausal) * K::kBlockM, 2), \
      NAME<K>)
#define FLASHJIT_BACKWARD_DOCUMENT_ENTRIES(PREFIX, ACCUM_ROW_FLOATS)                              \
  template <class K>                                                                              \
  FLASHJIT_DOCUMENT_ENTRY(PREFIX##_dkdv_varlen,                                                   \
                          document_tile_view(document, blockIdx.z, -1, (blockIdx.x * K::kBlockN), \
                                             2, ACCUM_ROW_FLOATS),                                \
                          PREFIX##_dkdv<K>)                                                       \
  template <class K>                                                                              \
  FLASHJIT_DOCUMENT_ENTRY(                                                                        \
      PREFIX##_dq_varlen,                                                                         \
      document_tile_view(document, blockIdx.z, FLASHJIT_QUERY_BLOCK(K::kCausal) * K::kBlockM, -1, \
                         2, ACCUM_ROW_FLOATS),                                                    \
      PREFIX##_dq<K>)

// The first members of a GPU kernel's traits: its tile shape's template parameters as constants,
// the head dim padded as the kernel lays out its tiles (PADDED), and the head-dim rule they all
// check. (In this order: NVRTC emits a traits struct's constants as symbols in declaration order,
// so the plain kernels' CUBINs stay as they were before this macro.)
#define FLASHJIT_TRAITS_SHAPE(HEAD_DIM, PADDED, BLOCK_M, BLOCK_N, WARPS, STAGES, IS_BF16, CAUSAL) \
  static constexpr int kHeadDim = HEAD_DIM;                                                       \
  static constexpr int kHeadDimPadded = PADDED;                                                   \
  static constexpr int kBlockM = BLOCK_M;                                                         \
  static constexpr int kBlockN = BLOCK_N;                                                         \
  static constexpr int kWarps = WARPS;                                                            \
  static constexpr int kStages = STAGES;                                                          \
  static constexpr bool kIsBf16 = IS_BF16;                                                        \
  static constexpr bool kCausal = CAUSAL;                                                         \
  static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM >= 8 && HEAD_DIM <= 256,                            \
                "head dim: a multiple of 8 in [8, 256]")

// The tensors of a forward tile of query rows [m0, ...) of (batch, head), whose keys are those of
// kv head kv_head, in the kernel's 16-bit storage type u16: q and o from row m0, k and v from
// key 0, lse the head's row (null when the problem writes none). Declares q, k, v, o and lse.
// (A macro, as the two above: the CUDA and HIP forwards' plain kernels compile as before it.)
#define FLASHJIT_FORWARD_TENSORS(p, batch, head, kv_head, m0)                              \
  const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride +                 \
                 head * p.q_head_stride + m0 * p.q_seq_stride;                             \
  const u16* k =                                                                           \
      static_cast<const u16*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride; \
  const u16* v =                                                                           \
      static_cast<const u16*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride; \
  u16* o = static_cast<u16*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +    \
           m0 * p.o_seq_stride;                                                            \
  float* lse = p.lse ? p.lse + (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q : 0

// The backward preprocess's rows of (batch, head): row_base, the head's first workspace row
// (delta, lse_log2: seqlen_q_rounded rows per head), o and d_o (u16, from row 0) and the
// forward's lse. Declares row_base, o, d_o and lse. (A macro likewise: CUDA's and HIP's
// backward_preprocess.)
#define FLASHJIT_PREPROCESS_TENSORS(p, batch, head)                                                \
  const long long row_base =                                                                       \
      (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q_rounded;                     \
  const u16* o = static_cast<const u16*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride; \
  const u16* d_o =                                                                                 \
      static_cast<const u16*>(p.d_o) + batch * p.do_batch_stride + head * p.do_head_stride;        \
  const float* lse = p.lse + (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q

namespace flashjit_attention {

// +inf and -inf: NVRTC has no __builtin_huge_valf (nor INFINITY without <cmath>).
#if defined(__CUDACC__)
FLASHJIT_DEVICE float infinity() { return __int_as_float(0x7f800000); }
FLASHJIT_DEVICE float minus_infinity() { return __int_as_float(0xff800000); }
#else
FLASHJIT_DEVICE float infinity() { return __builtin_huge_valf(); }
FLASHJIT_DEVICE float minus_infinity() { return -__builtin_huge_valf(); }
#endif

// Causal masking is aligned bottom-right (FlashAttention-2): query row i sees key j iff
// j <= i + diagonal, diagonal = seqlen_k - seqlen_q. With seqlen_q > seqlen_k the first rows see
// no key at all. The functions below take the diagonal so that a kernel computes it once.
FLASHJIT_DEVICE int diagonal(const FlashjitAttentionParams& p) { return p.seqlen_k - p.seqlen_q; }

// Key blocks of `block_n` keys that any of the query rows [m0, m0 + block_m) sees.
template <bool CAUSAL>
FLASHJIT_DEVICE int key_blocks(const FlashjitAttentionParams& p, int diagonal, int m0, int block_m,
                               int block_n) {
  const int causal_end = m0 + block_m + diagonal;  // one past the last row's last key
  const int end = CAUSAL && causal_end < p.seqlen_k ? causal_end : p.seqlen_k;
  return end > 0 ? (end + block_n - 1) / block_n : 0;
}

// The key blocks a tile of query rows [m0, m0 + block_m) visits, in order: the t-th is at(t), for
// t < count(). Plain attention: blocks [0, key_blocks<CAUSAL>); a variant: its key-block range
// (attention_variant.h's KeyBlocks: hidden blocks are never loaded). The HIP forward's and dQ
// kernel's key loop.
template <bool CAUSAL>
struct KeyBlockRange {
#ifdef FLASHJIT_VARIANT
  flashjit_variant::KeyBlocks blocks;
  FLASHJIT_DEVICE KeyBlockRange(const FlashjitAttentionParams& p, int diagonal, int m0, int block_m,
                                int block_n)
      : blocks(flashjit_variant::key_blocks(p, diagonal, m0, block_m, block_n)) {}
  FLASHJIT_DEVICE int count() const { return blocks.count(); }
  FLASHJIT_DEVICE int at(int t) const { return blocks.at(t); }
#else
  int blocks;
  FLASHJIT_DEVICE KeyBlockRange(const FlashjitAttentionParams& p, int diagonal, int m0, int block_m,
                                int block_n)
      : blocks(key_blocks<CAUSAL>(p, diagonal, m0, block_m, block_n)) {}
  FLASHJIT_DEVICE int count() const { return blocks; }
  FLASHJIT_DEVICE int at(int t) const { return t; }
#endif
};

// True when some score of the key block [n0, n0 + block_n) x rows [m0, ...) must be masked:
// the block crosses seqlen_k or, when causal, the diagonal of the block's first row. Blocks
// wholly inside pay nothing for masking.
template <bool CAUSAL>
FLASHJIT_DEVICE bool block_needs_mask(const FlashjitAttentionParams& p, int diagonal, int m0,
                                      int n0, int block_n) {
  return n0 + block_n > p.seqlen_k || (CAUSAL && n0 + block_n - 1 > m0 + diagonal);
}

// The last key query row `row` sees (negative when it sees none).
template <bool CAUSAL>
FLASHJIT_DEVICE int last_key(const FlashjitAttentionParams& p, int diagonal, int row) {
  const int causal_last = row + diagonal;
  return CAUSAL && causal_last < p.seqlen_k - 1 ? causal_last : p.seqlen_k - 1;
}

// The backward pass walks the other way: a block of keys [n0, n0 + block_n) meets the query rows
// that see any of its keys, in blocks of block_m rows. Blocks [first_query_block, query_blocks)
// do; the earlier ones see none of these keys (causal), so they contribute nothing. The count
// may be 0 (then the key block's gradients are zero).
FLASHJIT_DEVICE int query_blocks(const FlashjitAttentionParams& p, int block_m) {
  return (p.seqlen_q + block_m - 1) / block_m;
}
template <bool CAUSAL>
FLASHJIT_DEVICE int first_query_block(int diagonal, int n0, int block_m) {
  // Row i sees key n0 iff n0 <= i + diagonal: the first such row is n0 - diagonal.
  const int first_row = n0 - diagonal;
  return CAUSAL && first_row > 0 ? first_row / block_m : 0;
}

// The online softmax works in base 2 on raw scores s with the scale folded in:
// p = exp2(s * scale_log2 - max_scaled). A row whose max is still -inf (no key seen yet)
// subtracts 0 instead, so that exp2(-inf - 0) = 0 rather than NaN.
FLASHJIT_DEVICE float scaled_row_max(float row_max, float scale_log2) {
  return row_max == -infinity() ? 0.f : row_max * scale_log2;
}

// Natural-log LSE of a row from its raw-score max and its sum of exp2 terms; +inf for a row that
// saw no key (FlashAttention's convention: exp(s - lse) = 0). `log2` is the kernel's log2,
// evaluated only for a positive sum.
template <class Log2>
FLASHJIT_DEVICE float row_lse(float row_max, float scale_log2, float sum, Log2 log2) {
  return sum > 0.f ? (row_max * scale_log2 + log2(sum)) * 0.6931471805599453f : infinity();
}

#ifdef FLASHJIT_VARIANT
// A forward kernel's score s = q . k of (row, key) through the variant (attention_variant.h), in
// place: modified where the variant modifies scores (score() of the scaled score; distance = key -
// row, see score()), -inf where the block is `masked` (not all visible) and the row does not see
// the key. The CUDA mma and the HIP forwards' per-element loop.
FLASHJIT_DEVICE void apply_variant(float& s, const FlashjitAttentionParams& p, int diagonal,
                                   bool masked, float slope, int batch, int head, int row, int key,
                                   float distance) {
  namespace fv = flashjit_variant;
  if (fv::kModifiesScores) s = fv::score(s * p.scale, slope, batch, head, row, key, distance);
  if (masked && !fv::visible(p, diagonal, batch, head, row, key)) s = minus_infinity();
}

// Which key blocks go through apply_variant, and how: apply(masked) called with a constant (one
// loop per case) where the block is not all visible (masked) or, all visible, where the variant
// modifies the scores (unmasked); not at all for an all-visible block of an unmodified score.
template <class Apply>
FLASHJIT_DEVICE void apply_variant_block(bool all_visible, Apply apply) {
  if (!all_visible)
    apply(true);
  else if (flashjit_variant::kModifiesScores)
    apply(false);
}
#endif

// ---- the backward pass ----

// The forward's natural-log LSE of a row in the workspace's base 2 (lse_log2); +inf stays +inf.
FLASHJIT_DEVICE float lse_to_log2(float lse) { return lse * 1.4426950408889634f; }

// P = exp(scale * s - lse), recomputed in base 2 from a raw score and the row's lse_log2. It is
// 0 for a masked score (s = -inf) and for rows with lse_log2 = +inf: rows that see no key and
// the workspace's padding rows past seqlen_q, whose scores are finite (zero-padded operands).
template <class Exp2>
FLASHJIT_DEVICE float recomputed_probability(float s, float scale_log2, float lse_log2, Exp2 exp2) {
  return exp2(s * scale_log2 - lse_log2);
}

}  // namespace flashjit_attention

#endif
