// The warp steps of the CUDA mma.sync attention loops, one copy shared by the prefill forward
// (cuda/attention_fwd.cuh) and the decode split kernel (cuda/decode.cuh): S = Q K^T, the online
// softmax step (base 2) that turns S into P, and O += P V. A warp owns MT 16-row tiles of
// queries and NT 8-column tiles of keys; accumulators use the m16n8 fragment layout (lane holds
// rows lane/4 and lane/4 + 8, columns 2 * (lane % 4) + {0, 1}). Shared tiles are cuda/tiles.cuh's,
// DP elements per row; the per-row steps are cuda/online_softmax.cuh's. The renderer places this
// after cuda/tiles.cuh.

namespace flashjit_kernel {

// The online softmax's state before the first key block: acc (O, fp32) = 0, the running max
// row_max = -inf (no key seen), this lane's partial sum row_sum = 0.
template <int MT, int DT>
__device__ __forceinline__ void warp_softmax_init(float (&acc)[MT][DT][4], float (&row_max)[MT][2],
                                                  float (&row_sum)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][dt][e] = 0.f;
    row_max[mt][0] = row_max[mt][1] = minus_infinity();
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
}

// d[mt][2j], d[mt][2j + 1] += a[mt] b for each of the warp's MT row tiles: b, one ldmatrix.x4 of
// B, holds two 8-column tiles (b[0], b[1] and b[2], b[3]); a[mt] the A fragment of row tile mt.
// The inner step of both products below (a macro as they are).
#define FLASHJIT_WARP_MMA_PAIR(IS_BF16, MT, d, j, a, b)        \
  _Pragma("unroll") for (int mt = 0; mt < MT; ++mt) {          \
    mma_16x8x16<IS_BF16>(d[mt][2 * j], a[mt], b[0], b[1]);     \
    mma_16x8x16<IS_BF16>(d[mt][2 * j + 1], a[mt], b[2], b[3]); \
  }

// s = Q K^T over the head dim (s: float[MT][NT][4], declared by the caller): q_lane, k_lane are
// the lane's byte offsets into the Q tile (A operand) and the K tile (B operand) at shared
// addresses q_tile, k_tile, before the per-fragment constants. (The two loops are macros, not
// functions: as functions, ptxas scheduled the prefill kernel differently, and the plain kernels'
// CUBINs, which the shipped tuning rows describe, would have changed. A macro expands to the
// statements each kernel spelled out before.)
#define FLASHJIT_WARP_SCORES(DP, IS_BF16, MT, NT, s, q_tile, q_lane, k_tile, k_lane)     \
  _Pragma("unroll") for (int mt = 0; mt < MT; ++mt)                                      \
      _Pragma("unroll") for (int nt = 0; nt < NT; ++nt)                                  \
          _Pragma("unroll") for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;              \
  _Pragma("unroll") for (int kk = 0; kk < DP / 16; ++kk) {                               \
    u32 q_frag[MT][4];                                                                   \
    _Pragma("unroll") for (int mt = 0; mt < MT; ++mt)                                    \
        ldmatrix_x4(q_frag[mt], q_tile + swizzled_step<DP>(q_lane, mt * 16, 2 * kk));    \
    _Pragma("unroll") for (int np = 0; np < NT / 2; ++np) { /* two 8-key tiles per x4 */ \
      u32 k_frag[4];                                                                     \
      ldmatrix_x4(k_frag, k_tile + swizzled_step<DP>(k_lane, np * 16, 2 * kk));          \
      FLASHJIT_WARP_MMA_PAIR(IS_BF16, MT, s, np, q_frag, k_frag)                         \
    }                                                                                    \
  }

// Online softmax, base 2, scale folded into one FMA per score: the running max (row_max, in units
// of raw scores) and this lane's partial sum (row_sum; reduced over the quad at the end) take in
// the block's scores s, acc is rescaled, and P is packed to 16 bits as soon as it exists (the fp32
// scores die here, which halves what stays live through P V). p_packed[mt][nt][half]: columns
// 2 * (lane % 4) + {0, 1} of rows lane/4 + 8 * half.
template <bool IS_BF16, int MT, int NT, int DT>
__device__ __forceinline__ void online_softmax_step(const float (&s)[MT][NT][4],
                                                    float (&row_max)[MT][2],
                                                    float (&row_sum)[MT][2],
                                                    float (&acc)[MT][DT][4],
                                                    u32 (&p_packed)[MT][NT][2], float scale_log2) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float block_max = row_max[mt][half];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        block_max = fmaxf(block_max, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
      float correction;
      const float max_scaled =
          online_max_step(row_max[mt][half], block_max, scale_log2, correction);
      row_sum[mt][half] *= correction;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        acc[mt][dt][2 * half] *= correction;
        acc[mt][dt][2 * half + 1] *= correction;
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float p0 = fast_exp2(fmaf(s[mt][nt][2 * half], scale_log2, -max_scaled));
        const float p1 = fast_exp2(fmaf(s[mt][nt][2 * half + 1], scale_log2, -max_scaled));
        row_sum[mt][half] += p0 + p1;
        p_packed[mt][nt][half] = pack2<IS_BF16>(p0, p1);
      }
    }
}

// acc += P V over NT / 2 k-steps of 16 keys (acc: float[MT][DT][4]; p_packed: u32[MT][NT][2]):
// the P of key tiles (2t, 2t+1) is exactly the A fragment of k-step t. v_lane: the lane's byte
// offset into the V tile at shared address v_tile, read through .trans. (A macro for the reason
// FLASHJIT_WARP_SCORES is one.)
#define FLASHJIT_WARP_PV(DP, IS_BF16, MT, NT, DT, acc, p_packed, v_tile, v_lane)           \
  _Pragma("unroll") for (int t = 0; t < NT / 2; ++t) {                                     \
    u32 p_frag[MT][4];                                                                     \
    _Pragma("unroll") for (int mt = 0; mt < MT; ++mt) {                                    \
      p_frag[mt][0] = p_packed[mt][2 * t][0];                                              \
      p_frag[mt][1] = p_packed[mt][2 * t][1];                                              \
      p_frag[mt][2] = p_packed[mt][2 * t + 1][0];                                          \
      p_frag[mt][3] = p_packed[mt][2 * t + 1][1];                                          \
    }                                                                                      \
    _Pragma("unroll") for (int dp = 0; dp < DT / 2; ++dp) { /* two V tiles per x4.trans */ \
      u32 v_frag[4];                                                                       \
      ldmatrix_x4_trans(v_frag, v_tile + swizzled_step<DP>(v_lane, t * 16, 2 * dp));       \
      FLASHJIT_WARP_MMA_PAIR(IS_BF16, MT, acc, dp, p_frag, v_frag)                         \
    }                                                                                      \
  }

}  // namespace flashjit_kernel
