// Attention variants (issue 17): sliding window, soft-capping, ALiBi, prefix-LM and the user's
// score_mod / mask_mod, as every forward template applies them: which keys a query row sees,
// what its scores become, and which key blocks a tile of query rows must visit at all.
// AttentionProblem::variant (generator/problem.hpp) defines the semantics; tuner/reference.cpp
// is the fp64 oracle of the same definition.
//
// The renderer (generator/variant.cpp) includes this file only for a problem with a variant, after
// attention_params.h, preceded by the variant's constants:
//   #define FLASHJIT_VARIANT 1
//   #define FLASHJIT_VARIANT_CAUSAL 0|1         the problem's causal flag
//   #define FLASHJIT_VARIANT_WINDOW_LEFT  L     -1: unbounded
//   #define FLASHJIT_VARIANT_WINDOW_RIGHT R     -1: unbounded
//   #define FLASHJIT_VARIANT_PREFIX P           keys [0, P) visible to all (0: none)
//   #define FLASHJIT_VARIANT_SOFTCAP C          only when soft-capping (a float literal)
//   #define FLASHJIT_VARIANT_ALIBI 0|1
//   #define FLASHJIT_VARIANT_SCORE_MOD 0|1      a user score_mod follows this file
//   #define FLASHJIT_VARIANT_SCORE_MOD_GRAD 0|1 its derivative too (backward problems only)
//   #define FLASHJIT_VARIANT_MASK_MOD 0|1       a user mask_mod follows this file
//   #define FLASHJIT_VARIANT_VARLEN 0|1         packed variable-length documents (cu_seqlens)
// and followed by the user's expressions as the bodies of user_score_mod / user_mask_mod (and
// user_score_mod_grad).
// Plain attention renders none of this: its kernels are exactly those of before variants.
//
// Scalar code only, so that it means the same under NVRTC, Clang (the CPU backend) and a host
// compiler (the templates' emulation tests).
#ifndef FLASHJIT_ATTENTION_VARIANT_H
#define FLASHJIT_ATTENTION_VARIANT_H

namespace flashjit_variant {

// ---- what a user expression may call (the expressions are compiled in this namespace) -------

FLASHJIT_DEVICE int abs(int x) { return x < 0 ? -x : x; }
FLASHJIT_DEVICE long long abs(long long x) { return x < 0 ? -x : x; }
template <class A, class B>
FLASHJIT_DEVICE auto min(A a, B b) -> decltype(a + b) {
  return a < b ? a : b;
}
template <class A, class B>
FLASHJIT_DEVICE auto max(A a, B b) -> decltype(a + b) {
  return a < b ? b : a;
}
// The device math library's functions under NVRTC and hipRTC (there a __builtin_tanhf is a call
// to a tanhf that no device library defines: the link fails); the builtins elsewhere.
#if defined(__CUDACC__) || defined(__HIP__)
#define FLASHJIT_VARIANT_MATH(name, f32, f64)              \
  FLASHJIT_DEVICE float name(float x) { return ::f32(x); } \
  FLASHJIT_DEVICE double name(double x) { return ::f64(x); }
#else
#define FLASHJIT_VARIANT_MATH(name, f32, f64)                        \
  FLASHJIT_DEVICE float name(float x) { return __builtin_##f32(x); } \
  FLASHJIT_DEVICE double name(double x) { return __builtin_##f64(x); }
#endif
FLASHJIT_VARIANT_MATH(abs, fabsf, fabs)
FLASHJIT_VARIANT_MATH(tanh, tanhf, tanh)
FLASHJIT_VARIANT_MATH(exp, expf, exp)
FLASHJIT_VARIANT_MATH(exp2, exp2f, exp2)
FLASHJIT_VARIANT_MATH(log, logf, log)
FLASHJIT_VARIANT_MATH(log2, log2f, log2)
FLASHJIT_VARIANT_MATH(sqrt, sqrtf, sqrt)
FLASHJIT_VARIANT_MATH(floor, floorf, floor)
#undef FLASHJIT_VARIANT_MATH

// The user's expressions, defined after this file (generator/variant.cpp renders them).
#if FLASHJIT_VARIANT_SCORE_MOD
FLASHJIT_DEVICE float user_score_mod(float score, int batch, int head, int q_idx, int kv_idx);
#endif
#if FLASHJIT_VARIANT_MASK_MOD
FLASHJIT_DEVICE bool user_mask_mod(int batch, int head, int q_idx, int kv_idx);
#endif
#if FLASHJIT_VARIANT_SCORE_MOD_GRAD
FLASHJIT_DEVICE float user_score_mod_grad(float score, int batch, int head, int q_idx, int kv_idx);
#endif

// ---- the variant --------------------------------------------------------------------------------

constexpr int kLeft = FLASHJIT_VARIANT_WINDOW_LEFT;  // -1: unbounded
// Causal caps the window's right side at the diagonal.
constexpr int kRight = FLASHJIT_VARIANT_CAUSAL ? 0 : FLASHJIT_VARIANT_WINDOW_RIGHT;
constexpr int kPrefix = FLASHJIT_VARIANT_PREFIX;
// Something changes the scores (else only the visible set changes).
#if defined(FLASHJIT_VARIANT_SOFTCAP) || FLASHJIT_VARIANT_ALIBI || FLASHJIT_VARIANT_SCORE_MOD
constexpr bool kModifiesScores = true;
#else
constexpr bool kModifiesScores = false;
#endif
// d score / d s is 1 (no soft-cap, no score_mod; ALiBi's bias does not depend on s): a backward
// kernel's dS needs no chain factor, so it may form P before dP is in, as plain attention does.
#if defined(FLASHJIT_VARIANT_SOFTCAP) || FLASHJIT_VARIANT_SCORE_MOD
[[maybe_unused]] constexpr bool kScoreGradIsOne = false;
#else
[[maybe_unused]] constexpr bool kScoreGradIsOne = true;
#endif

// Neither a soft-cap, a score_mod nor a mask_mod: what a variant does to a score is a mask from
// the row's keys (row_keys) and at most ALiBi's bias, so the CPU kernels apply it 16 lanes at a
// time instead of per score (the backward kernels; the forward measured no gain from it).
#if defined(FLASHJIT_VARIANT_SOFTCAP) || FLASHJIT_VARIANT_SCORE_MOD || FLASHJIT_VARIANT_MASK_MOD
[[maybe_unused]] constexpr bool kVectorMask = false;
#else
[[maybe_unused]] constexpr bool kVectorMask = true;
#endif

// A user mask_mod (blocks it hides whole are found by asking it: block_seen below).
[[maybe_unused]] constexpr bool kMaskMod = FLASHJIT_VARIANT_MASK_MOD != 0;

// The kernel reads the mask_mod's block map (FlashjitBlockMask, templates/attention_params.h):
// rendered 1 by the CUDA families that take it (generator/block_mask.hpp, block_mask_applies);
// their key blocks and full blocks come from it instead of KeyBlocks / block_fully_visible.
#ifndef FLASHJIT_VARIANT_BLOCK_MASK
#define FLASHJIT_VARIANT_BLOCK_MASK 0
#endif

FLASHJIT_DEVICE int clamp_key(long long key, int seqlen_k) {
  return key < 0 ? 0 : key > seqlen_k ? seqlen_k : static_cast<int>(key);
}

// The band of keys [band_begin, band_end) that query row `row` sees by causal and the window,
// clamped to [0, seqlen_k] (empty when begin >= end); diagonal = seqlen_k - seqlen_q. Both ends
// grow with the row.
FLASHJIT_DEVICE int band_begin(int seqlen_k, int diagonal, int row) {
  return kLeft < 0 ? 0 : clamp_key(static_cast<long long>(row) + diagonal - kLeft, seqlen_k);
}
FLASHJIT_DEVICE int band_end(int seqlen_k, int diagonal, int row) {
  return kRight < 0 ? seqlen_k
                    : clamp_key(static_cast<long long>(row) + diagonal + kRight + 1, seqlen_k);
}

// Whether query row `row` sees key `key` (any key index; false past seqlen_k). Per score in the
// mma and wgmma families' masked blocks; the -ws family hoists the row's part (row_keys below):
// there short-circuit evaluation compiled to a branch per score (1,120 instructions in the
// masked loop of m128n128w12s2-ws, against 139 for the plain causal mask). Made branch-free
// with & and |, the mma and wgmma tiles spilled (24 B at sm80 m128n128w8s2, 12 B at
// m64n128w4s2-wgmma, window + softcap + ALiBi).
FLASHJIT_DEVICE bool visible(const FlashjitAttentionParams& p, int diagonal, int batch, int head,
                             int row, int key) {
  bool seen = key < p.seqlen_k && (key < kPrefix || (key >= band_begin(p.seqlen_k, diagonal, row) &&
                                                     key < band_end(p.seqlen_k, diagonal, row)));
#if FLASHJIT_VARIANT_MASK_MOD
  seen = seen && user_mask_mod(batch, head, row, key);
#else
  (void)batch, (void)head;
#endif
  return seen;
}

// The keys row `row` sees apart from a mask_mod: [0, prefix_end) and [begin, end), each within
// [0, seqlen_k] (prefix_end 0 without a prefix): visible() is, for key >= 0, key < prefix_end ||
// (begin <= key && key < end), and then the mask_mod. For a loop over a row's keys that hoists
// them: two compares per key against constants of the row.
struct RowKeys {
  int prefix_end;
  int begin;
  int end;
};

FLASHJIT_DEVICE RowKeys row_keys(const FlashjitAttentionParams& p, int diagonal, int row) {
  return RowKeys{kPrefix < p.seqlen_k ? kPrefix : p.seqlen_k, band_begin(p.seqlen_k, diagonal, row),
                 band_end(p.seqlen_k, diagonal, row)};
}

// The softmax's base-2 factor: modified scores are scaled scores already (score() takes
// scale * q . k), so log2(e) alone; unmodified ones are raw q . k, so the problem's
// scale * log2(e).
FLASHJIT_DEVICE float softmax_scale_log2(const FlashjitAttentionParams& p) {
  return kModifiesScores ? 1.4426950408889634f : p.scale_log2;
}

// The ALiBi slope of a head (0 without ALiBi): load it once per tile, pass it to score().
FLASHJIT_DEVICE float alibi_slope(const FlashjitAttentionParams& p, int head) {
#if FLASHJIT_VARIANT_ALIBI
  return p.alibi_slopes[head];
#else
  (void)p, (void)head;
  return 0.f;
#endif
}

// The soft-cap's tanh: on NVIDIA GPUs (sm_75+) the one-instruction tanh.approx.f32 (relative
// error about 2^-11, far below the bf16/fp16 rounding of the P that multiplies V), where tanhf
// costs two MUFU operations and a dozen FMAs per score; elsewhere tanhf.
FLASHJIT_DEVICE float softcap_tanh(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return tanh(x);
#endif
}

// A visible key's score from the scaled score s = scale * q . k: soft-capped, ALiBi's bias added,
// then the user's score_mod. distance is key - row as a float: the GPU loops form it as one
// conversion per row and block plus the column's constant offset, so that ALiBi costs an FFMA
// per score rather than an int-to-float conversion (quarter rate, like the exponential's MUFU).
// With GRAD (the backward's score_and_grad below), *grad gets its derivative d score / d s, the
// chain factor of dS: the soft-cap's 1 - tanh^2(s / C) (from the same tanh), times the user's
// score_mod_grad at score_mod's input (ALiBi's bias does not depend on s); without, grad is
// unused and the derivative's arithmetic dead.
template <bool GRAD>
FLASHJIT_DEVICE float modified_score(float s, float slope, int batch, int head, int row, int key,
                                     float distance, float* grad) {
  float g = 1.f;
#ifdef FLASHJIT_VARIANT_SOFTCAP
  const float t = softcap_tanh(s * (1.f / FLASHJIT_VARIANT_SOFTCAP));
  s = FLASHJIT_VARIANT_SOFTCAP * t;
  g = 1.f - t * t;
#endif
#if FLASHJIT_VARIANT_ALIBI
  s += slope * distance;
#else
  (void)slope, (void)distance;
#endif
#if FLASHJIT_VARIANT_SCORE_MOD
#if FLASHJIT_VARIANT_SCORE_MOD_GRAD
  if (GRAD) g *= user_score_mod_grad(s, batch, head, row, key);
#endif
  s = user_score_mod(s, batch, head, row, key);
#else
  (void)batch, (void)head, (void)row, (void)key;
#endif
  if (GRAD) *grad = g;
  return s;
}

FLASHJIT_DEVICE float score(float s, float slope, int batch, int head, int row, int key,
                            float distance) {
  return modified_score<false>(s, slope, batch, head, row, key, distance, 0);
}

#if !FLASHJIT_VARIANT_SCORE_MOD || FLASHJIT_VARIANT_SCORE_MOD_GRAD
// The backward's score(): returns score(s, ...) and sets *grad to d score / d s. Only where the
// score_mod's derivative is given (a backward problem with a score_mod must have it).
FLASHJIT_DEVICE float score_and_grad(float s, float slope, int batch, int head, int row, int key,
                                     float distance, float* grad) {
  return modified_score<true>(s, slope, batch, head, row, key, distance, grad);
}
#endif

// Whether any row of [m0, m0 + rows) sees any key of [n0, n0 + cols): visible() asked for every
// key of a row (the band and prefix, then the mask_mod where they show the key), row after row
// until one sees a key. A mask_mod has no block rule of its own (KeyBlocks below): a kernel that
// can afford BM x BN tests per block (the CPU's: the mask's integer work against the block's
// 4 x d FMAs per score) skips the blocks it hides whole.
FLASHJIT_DEVICE bool block_seen(const FlashjitAttentionParams& p, int diagonal, int batch, int head,
                                int m0, int rows, int n0, int cols) {
  const int key_end = n0 + cols < p.seqlen_k ? n0 + cols : p.seqlen_k;
  for (int row = m0; row < m0 + rows; ++row) {
    const RowKeys keys = row_keys(p, diagonal, row);
    // A row's keys without an early exit (an OR over them, which the compiler may vectorize: a
    // block hidden whole is tested whole), then the next row.
    bool seen = false;
    for (int key = n0; key < key_end; ++key) {
      const bool shown = key < keys.prefix_end || (keys.begin <= key && key < keys.end);
#if FLASHJIT_VARIANT_MASK_MOD
      seen |= shown && user_mask_mod(batch, head, row, key);
#else
      seen |= shown;
#endif
    }
    if (seen) return true;
  }
  (void)batch, (void)head;
  return false;
}

// The key blocks a tile of query rows [m0, m0 + block_m) visits, in order: the prefix's blocks
// [0, prefix_end) then the band's [band_first, band_last) (disjoint, the band starting at or
// after prefix_end). Every other block is hidden from every row of the tile and never loaded.
// A user mask_mod only hides more (visible() ands it in): its blocks are the same, each masked
// per element (block_fully_visible is false), since nothing is known of where it hides keys.
struct KeyBlocks {
  int prefix_end;
  int band_first;
  int band_last;
  FLASHJIT_DEVICE int count() const { return prefix_end + band_last - band_first; }
  // The t-th block visited, t in [0, count()).
  FLASHJIT_DEVICE int at(int t) const { return t < prefix_end ? t : band_first + t - prefix_end; }
};

FLASHJIT_DEVICE KeyBlocks key_blocks(const FlashjitAttentionParams& p, int diagonal, int m0,
                                     int block_m, int block_n) {
  const int prefix_keys = kPrefix < p.seqlen_k ? kPrefix : p.seqlen_k;
  const int prefix_end = (prefix_keys + block_n - 1) / block_n;
  // The band of the tile's first row starts first, its last row's ends last (rows past
  // seqlen_q included: their results are discarded).
  const int begin = band_begin(p.seqlen_k, diagonal, m0);
  const int end = band_end(p.seqlen_k, diagonal, m0 + block_m - 1);
  int first = begin / block_n;
  int last = begin < end ? (end + block_n - 1) / block_n : first;
  if (first < prefix_end) first = prefix_end;
  if (last < first) last = first;
  return KeyBlocks{prefix_end, first, last};
}

// The query rows [first, last) that may see a key of block [n0, n0 + block_n) (keys < seqlen_k):
// the backward's dK/dV loop visits only their query blocks. Every row when the block holds a
// prefix key; else the rows whose band reaches the block: row i's band holds key j iff
// j - diagonal - right <= i <= j - diagonal + left. A user mask_mod only hides more.
struct QueryRows {
  int first;
  int last;
};

FLASHJIT_DEVICE QueryRows query_rows(const FlashjitAttentionParams& p, int diagonal, int n0,
                                     int block_n) {
  if (n0 < kPrefix) return QueryRows{0, p.seqlen_q};
  const int last_key = (n0 + block_n < p.seqlen_k ? n0 + block_n : p.seqlen_k) - 1;
  const long long first = kRight < 0 ? 0 : static_cast<long long>(n0) - diagonal - kRight;
  const long long last =
      kLeft < 0 ? p.seqlen_q : static_cast<long long>(last_key) - diagonal + kLeft + 1;
  const int f = first < 0 ? 0 : first > p.seqlen_q ? p.seqlen_q : static_cast<int>(first);
  const int l = last < f ? f : last > p.seqlen_q ? p.seqlen_q : static_cast<int>(last);
  return QueryRows{f, l};
}

// True when every row of the tile sees every key of block [n0, n0 + block_n): no per-element
// mask needed (the scores may still be modified).
FLASHJIT_DEVICE bool block_fully_visible(const FlashjitAttentionParams& p, int diagonal, int m0,
                                         int block_m, int n0, int block_n) {
#if FLASHJIT_VARIANT_MASK_MOD
  (void)p, (void)diagonal, (void)m0, (void)block_m, (void)n0, (void)block_n;
  return false;
#else
  // Branch-free and in 32 bits: the GPU kernels test it once per key block, where the early
  // returns and band_begin / band_end's 64-bit clamps cost the -ws tile ~35 instructions a block,
  // against the plain causal test's few. With the block inside the keys (n0 >= 0, n1 <=
  // seqlen_k), band_begin(last row) <= n0 iff last row + diagonal - n0 <= kLeft, and n1 <=
  // band_end(m0) iff n1 - 1 - (m0 + diagonal) <= kRight (the clamps change neither side).
  const int n1 = n0 + block_n;
  const bool left = kLeft < 0 || m0 + block_m - 1 + diagonal - n0 <= kLeft;
  const bool right = kRight < 0 || n1 - 1 - (m0 + diagonal) <= kRight;
  return (n1 <= p.seqlen_k) & ((kPrefix > 0 && n1 <= kPrefix) | (left & right));
#endif
}

#if FLASHJIT_VARIANT_BLOCK_MASK
// The non-empty tiles of one query tile's row of the block map (the key tiles it visits, in
// increasing order) or of one key tile's column (the query tiles, for the backward's dK/dV), and
// whether each is full (every row sees every key: no per-element mask).
// count() and at(t) as KeyBlocks' (the -ws family's WsKeyBlocks is either).
struct BlockList {
  const int* entries;
  int n;
  FLASHJIT_DEVICE int count() const { return n; }
  FLASHJIT_DEVICE int at(int t) const { return entries[t] >> 1; }
  FLASHJIT_DEVICE bool full(int t) const { return (entries[t] & 1) != 0; }
};

// The map of (batch, head): its own when the mask_mod names either, else the one map.
FLASHJIT_DEVICE long long block_map_of(const FlashjitBlockMask& m, int batch, int head) {
  return m.per_head ? static_cast<long long>(batch) * m.heads_q + head : 0;
}

FLASHJIT_DEVICE BlockList key_tiles_of(const FlashjitBlockMask& m, int batch, int head,
                                       int q_tile) {
  const long long row = block_map_of(m, batch, head) * m.q_tiles + q_tile;
  return BlockList{m.q_list + row * m.k_tiles, m.q_count[row]};
}

FLASHJIT_DEVICE BlockList query_tiles_of(const FlashjitBlockMask& m, int batch, int head,
                                         int k_tile) {
  const long long column = block_map_of(m, batch, head) * m.k_tiles + k_tile;
  return BlockList{m.k_list + column * m.q_tiles, m.k_count[column]};
}

// A backward dK/dV CTA's steps over the query heads of its group (GQA) and their non-empty query
// tiles of key tile `k_tile`: head after head, each head's tiles in increasing order. One map:
// every head has the same tiles (the step's head and tile by division); a map per head: the
// step is found head by head (a group's few counts).
struct GroupStep {
  int head;
  int tile;
  bool full;
};
struct GroupQueryTiles {
  const FlashjitBlockMask* m;
  int batch, first_head, group, k_tile;
  int steps;
  FLASHJIT_DEVICE GroupQueryTiles(const FlashjitBlockMask& map, int batch_, int first_head_,
                                  int group_, int k_tile_)
      : m(&map), batch(batch_), first_head(first_head_), group(group_), k_tile(k_tile_) {
    steps = 0;
    if (!map.per_head) {
      steps = query_tiles_of(map, batch, first_head, k_tile).count() * group;
    } else {
      for (int h = 0; h < group; ++h)
        steps += query_tiles_of(map, batch, first_head + h, k_tile).count();
    }
  }
  FLASHJIT_DEVICE GroupStep at(int t) const {
    if (!m->per_head) {
      const BlockList tiles = query_tiles_of(*m, batch, first_head, k_tile);
      const int i = t % tiles.count();
      return GroupStep{first_head + t / tiles.count(), tiles.at(i), tiles.full(i)};
    }
    int head = first_head;
    BlockList tiles = query_tiles_of(*m, batch, head, k_tile);
    while (t >= tiles.count()) {
      t -= tiles.count();
      tiles = query_tiles_of(*m, batch, ++head, k_tile);
    }
    return GroupStep{head, tiles.at(t), tiles.full(t)};
  }
};
#endif

#if FLASHJIT_VARIANT_VARLEN
// Packed variable-length documents: turns `p` into document `doc`'s view of the params, as if the
// document were a batch entry of its own: q, k, v, o start at its first rows (cu_seqlens[doc]
// rows in, through the seq strides; `element_bytes` per element), seqlen_q / seqlen_k are its
// lengths, and lse points so that the kernels' [batch, heads_q, seqlen_q] index of entry `doc`
// lands in its packed [heads_q, len_q] block at heads_q * cu_seqlens_q[doc]. Everything after
// (masks, the causal diagonal, the window's band, tails) is then per document unchanged; the
// batch index a kernel passes to a mask_mod or score_mod stays `doc`. False when the tile of
// query rows starting at m0 is past the document's end (nothing to compute or write). The
// offsets are not checked (device data: generator/problem.hpp, Variant::varlen); a negative
// length counts as 0. A backward's dO, dQ, dK and dV (d_o not null) move with q and k; m0 < 0:
// never past the end (a backward's dK/dV items run for a document without queries too).
FLASHJIT_DEVICE bool document_view(FlashjitAttentionParams& p, int doc, int m0, int element_bytes) {
  const int q_begin = p.cu_seqlens_q[doc];
  const int k_begin = p.cu_seqlens_k[doc];
  const int len_q = p.cu_seqlens_q[doc + 1] - q_begin;
  int len_k = p.cu_seqlens_k[doc + 1] - k_begin;
  if (m0 >= len_q) return false;
  if (len_k < 0) len_k = 0;
  const long long q_offset = static_cast<long long>(q_begin) * element_bytes;
  const long long k_offset = static_cast<long long>(k_begin) * element_bytes;
  p.q = static_cast<const char*>(p.q) + q_offset * p.q_seq_stride;
  p.o = static_cast<char*>(p.o) + q_offset * p.o_seq_stride;
  p.k = static_cast<const char*>(p.k) + k_offset * p.k_seq_stride;
  p.v = static_cast<const char*>(p.v) + k_offset * p.v_seq_stride;
  p.q_batch_stride = p.o_batch_stride = p.k_batch_stride = p.v_batch_stride = 0;
  if (p.d_o) {  // the backward's: dO and dQ rows like q's, dK and dV rows like k's
    p.d_o = static_cast<const char*>(p.d_o) + q_offset * p.do_seq_stride;
    p.dq = static_cast<char*>(p.dq) + q_offset * p.dq_seq_stride;
    p.dk = static_cast<char*>(p.dk) + k_offset * p.dk_seq_stride;
    p.dv = static_cast<char*>(p.dv) + k_offset * p.dv_seq_stride;
    p.do_batch_stride = p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = 0;
  }
  if (p.lse)
    p.lse += static_cast<long long>(p.heads_q) * q_begin -
             static_cast<long long>(doc) * p.heads_q * len_q;
  p.seqlen_q = len_q;
  p.seqlen_k = len_k;
  return true;
}

// A GPU backward kernel's CTA on packed documents: document_view for the CTA whose query rows
// start at m0 (< 0: it has none, a dK/dV CTA) and whose keys start at n0 (< 0: none, a row or dQ
// CTA); false when either starts past the document's (nothing to read or write). The workspace
// (delta, lse_log2, dq_accum: `accum_row_floats` per row) is packed by document
// (runtime/launch_params.hpp, backward_workspace: seqlen_q_rounded rows per head, document doc's
// at (cu_seqlens_q[doc] + 128 doc) rounded down to 128): its pointers move so that the kernels'
// index (doc * heads_q + head) * seqlen_q_rounded + row lands on the document's rows of the head.
FLASHJIT_DEVICE bool document_tile_view(FlashjitAttentionParams& p, int doc, int m0, int n0,
                                        int element_bytes, int accum_row_floats) {
  const long long first_row = (p.cu_seqlens_q[doc] + 128LL * doc) / 128 * 128;
  const long long shift = first_row - static_cast<long long>(doc) * p.heads_q * p.seqlen_q_rounded;
  p.delta += shift;
  p.lse_log2 += shift;
  if (p.dq_accum) p.dq_accum += shift * accum_row_floats;
  return document_view(p, doc, m0, element_bytes) && n0 < p.seqlen_k;
}
#endif

}  // namespace flashjit_variant

#endif
