// The online softmax of one consumer warpgroup's 64 query rows, over S blocks held as wgmma
// accumulators: per thread rows lane / 4 and lane / 4 + 8 of its warp's 16 ("half" 0 and 1),
// columns 8 nt + 2 (lane % 4) + {0, 1} of each 8-key tile nt, as s[4 nt + 2 half + {0, 1}]
// (cuda/wgmma.cuh). Base 2 with the scale folded into one FMA per score; the key range and
// masking rules are attention_common.h's.
//
// Per block j:  mask(S_j); correction = update(S_j)  (S_j <- exp2(...) in place, m and l updated)
//               ... the previous block's P V finishes ...
//               pack(S_j) -> P_j as wgmma A fragments; O *= correction (rescale)
// so that S_j's exponentials run while P_{j-1} V_{j-1} is on the tensor cores, and P needs one
// register set (FlashAttention-3's order).

namespace flashjit_kernel {

template <int BLOCK_N, bool IS_BF16, bool CAUSAL>
struct WsSoftmax {
  static constexpr int kNTiles = BLOCK_N / 8;

  float row_max[2];  // m per half, raw score units (-inf: no key seen yet)
  float row_sum[2];  // this thread's part of l (its quad holds the row)

  __device__ __forceinline__ void init() {
    row_max[0] = row_max[1] = minus_infinity();
    row_sum[0] = row_sum[1] = 0.f;
  }

  // Sets scores of keys past seqlen_k and (causal) above the diagonal to -inf, in the key block
  // [n0, n0 + BLOCK_N); rows: `row` (this thread's half 0) and row + 8. Blocks wholly inside the
  // range for every row from `first_row` on (the warpgroup's first) pay one test.
  __device__ __forceinline__ void mask(float (&s)[kNTiles * 4], const FlashjitAttentionParams& p,
                                       int diagonal, int first_row, int row, int n0) const {
    namespace fa = flashjit_attention;
    if (!fa::block_needs_mask<CAUSAL>(p, diagonal, first_row, n0, BLOCK_N)) return;
    const int col = n0 + 2 * (threadIdx.x % 4);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int limit = fa::last_key<CAUSAL>(p, diagonal, row + 8 * half) - col;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (nt * 8 + e > limit) s[nt * 4 + 2 * half + e] = minus_infinity();
    }
  }

#ifdef FLASHJIT_VARIANT
  // The attention variant's scores and mask (templates/attention_variant.h) in key block
  // [n0, n0 + BLOCK_N), instead of mask(): each score becomes the variant's score of
  // scale * q . k (update() then takes softmax_scale_log2(p)), hidden keys -inf. Blocks every
  // row of the warpgroup (64 from `first_row`) sees whole, with unmodified scores, pay one test.
  // map_full: a mask_mod's block map calls the tile full (every row of it sees every key).
  __device__ __forceinline__ void variant(float (&s)[kNTiles * 4], const FlashjitAttentionParams& p,
                                          int diagonal, int first_row, int row, int n0, int batch,
                                          int head, float slope, bool map_full = false) const {
    namespace fv = flashjit_variant;
    const bool all_visible =
        map_full || fv::block_fully_visible(p, diagonal, first_row, 64, n0, BLOCK_N);
    const int col = n0 + 2 * (threadIdx.x % 4);
    auto apply = [&](bool masked) {  // called with a constant: one loop per case
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float distance0 = static_cast<float>(col - row - 8 * half);  // key - row at nt, e 0
        // The row's visible keys relative to col (fv::row_keys): key col + c is visible iff
        // c < prefix_end || (begin <= c && c < end) (and the mask_mod): two compares per score
        // against the row's constants, as the plain causal mask's one.
        const fv::RowKeys keys = fv::row_keys(p, diagonal, row + 8 * half);
        const int prefix_end = keys.prefix_end - col, begin = keys.begin - col,
                  end = keys.end - col;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = nt * 8 + e, key = col + c;
            float& x = s[nt * 4 + 2 * half + e];
            if (fv::kModifiesScores)
              x = fv::score(x * p.scale, slope, batch, head, row + 8 * half, key,
                            distance0 + static_cast<float>(c));
            if (masked) {
              bool seen = (fv::kPrefix > 0 && c < prefix_end) | ((c >= begin) & (c < end));
#if FLASHJIT_VARIANT_MASK_MOD
              seen = seen && flashjit_variant::user_mask_mod(batch, head, row + 8 * half, key);
#endif
              if (!seen) x = minus_infinity();
            }
          }
      }
    };
    if (!all_visible)
      apply(true);
    else if (fv::kModifiesScores)
      apply(false);
  }
#endif

  // Folds S_j into m and l: s <- exp2(s * scale_log2 - m_new * scale_log2) in place;
  // correction[half] = exp2((m_old - m_new) * scale_log2), the factor O and l are rescaled by.
  __device__ __forceinline__ void update(float (&s)[kNTiles * 4], float scale_log2,
                                         float (&correction)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float max_scaled =
          online_max_step(row_max[half], s, half, scale_log2, correction[half]);
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[nt * 4 + 2 * half + e];
          x = fast_exp2(fmaf(x, scale_log2, -max_scaled));
          sum += x;
        }
      row_sum[half] = row_sum[half] * correction[half] + sum;
    }
  }

  // P (the exponentials in s) packed to 16 bits as the A fragments of P V: key tiles (2t, 2t + 1)
  // form k-step t's fragment {row, row + 8} x {tile 2t, 2t + 1}.
  __device__ __forceinline__ void pack(const float (&s)[kNTiles * 4],
                                       u32 (&p)[BLOCK_N / 16][4]) const {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        p[nt / 2][(nt % 2) * 2 + half] =
            pack2<IS_BF16>(s[nt * 4 + 2 * half], s[nt * 4 + 2 * half + 1]);
  }

  // O *= correction, per half (an O accumulator chunk has the layout of S).
  template <int N>
  __device__ __forceinline__ static void rescale(float (&o)[N], const float (&correction)[2]) {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] *= correction[(i / 2) % 2];
  }

  // The row's l over its quad (every lane of the quad gets it).
  __device__ __forceinline__ float row_total(int half) const { return quad_sum(row_sum[half]); }
};

}  // namespace flashjit_kernel
