// FlashAttention-2 backward for NVIDIA sm80+ (A100, RTX 30/40, H100/H200), tensor cores via
// mma.sync m16n8k16. The renderer prepends templates/attention_params.h,
// templates/attention_common.h (key ranges, masking), cuda/common.cuh (PTX wrappers),
// cuda/tiles.cuh (swizzled shared-memory tiles) and cuda/attention_bwd_common.cuh (the
// preprocess and the Atomic mode's convert), and appends one instantiation of BwdTraits with
// the entry points of generator/render.hpp's launch contract.
//
// The dK/dV kernel: one CTA per block of kBlockN keys of one (batch, kv head).
//
// clang-format off
//   load K_j, V_j                        [kBlockN, d] -> shared, resident
//   dK = dV = 0                          [kBlockN, d] fp32, in registers
//   for each query head h of the group, each query block i that sees a key of block j:
//     (Q_i, dO_i, lse_log2_i, D_i)       streamed through kStages shared buffers
//     S   = Q_i K_j^T                    [kBlockM, kBlockN] fp32 registers
//     P   = exp2(S * scale_log2 - lse_log2_i)   masked (-inf -> 0) only in blocks on an edge
//     dP  = dO_i V_j^T
//     dS  = P * (dP - D_i)
//     P, dS -> shared, rounded to the storage type
//     dV += P^T dO_i                     [kBlockN, d]
//     dK += dS^T Q_i
//     (Atomic) dq_accum_i += dS K_j      fp32 reductions into the workspace, unscaled
//   dK *= scale; dK, dV -> global through shared memory, 16-byte stores
// clang-format on
//
// The dQ kernel of DqMode::Separate: one CTA per block of kBlockM query rows of one (batch,
// head); Q_i, dO_i resident, (K_j, V_j) streamed; per key block S, P, dP and dS as above, then
// dQ += dS K_j in registers; dQ *= scale, written like dK. No atomics: bitwise reproducible.
//
// Each product has its own warp tiling (WarpTiling below): S, dP and dS are split over the warps
// as [kBlockM, kBlockN] blocks, dK and dV as [kBlockN, d], dQ as [kBlockM, d]. P and dS go
// through shared memory because the products that consume them need them transposed (P^T,
// dS^T: ldmatrix .trans) or split differently over the warps. Every operand is read from a
// swizzled tile (cuda/tiles.cuh) with ldmatrix; each lane keeps one byte offset per operand and
// adds compile-time constants per fragment. That arithmetic needs each warp's share of a row to
// be a power of two, so the head dim is padded to 64, 128 or 256 in shared memory.

namespace flashjit_kernel {

// How a product's [ROWS, COLS] output is split over WARPS warps: kWarpsM along the rows times
// kWarpsN along the columns, each warp owning a [kRows, kCols] block. 32-row blocks (two MMA
// row tiles: every B fragment loaded feeds two MMAs) where the columns still split into whole
// 16-column pairs of MMA tiles, else 16-row blocks. generator/backward_config.cpp mirrors this
// (bwd_warps_along_rows) for its register estimate and legality rules.
__host__ __device__ constexpr int bwd_warps_along_rows(int rows, int cols, int warps) {
  const int tall = rows / 32 < 1 ? 1 : (rows / 32 < warps ? rows / 32 : warps);
  if (cols % (16 * (warps / tall)) == 0) return tall;
  return rows / 16 < warps ? rows / 16 : warps;
}

template <int ROWS, int COLS, int WARPS>
struct WarpTiling {
  static constexpr int kWarpsM = bwd_warps_along_rows(ROWS, COLS, WARPS);
  static constexpr int kWarpsN = WARPS / kWarpsM;
  static constexpr int kRows = ROWS / kWarpsM;  // per warp
  static constexpr int kCols = COLS / kWarpsN;
  static constexpr int kMTiles = kRows / 16;  // 16-row MMA tiles per warp
  static constexpr int kNTiles = kCols / 8;   // 8-column MMA tiles per warp
  static_assert(kWarpsM * kWarpsN == WARPS && kRows * kWarpsM == ROWS && kCols * kWarpsN == COLS,
                "the warps split the block evenly");
  static_assert(kMTiles == 1 || kMTiles == 2, "16 or 32 rows per warp");
  static_assert(kCols % 16 == 0 && (kCols & (kCols - 1)) == 0,
                "a power of two >= 16 columns per warp (ldmatrix.x4 pairs, swizzle arithmetic)");
  // The first row and column of the block warp `warp` owns.
  static __device__ __forceinline__ int row0(int warp) { return warp % kWarpsM * kRows; }
  static __device__ __forceinline__ int col0(int warp) { return warp / kWarpsM * kCols; }
};

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool IS_BF16, bool CAUSAL,
          bool DQ_ATOMIC>
struct BwdTraits {
  static constexpr int kHeadDim = HEAD_DIM;
  // In shared memory: a power of two >= 64 (see the top of this file).
  static constexpr int kHeadDimPadded = HEAD_DIM <= 64 ? 64 : (HEAD_DIM <= 128 ? 128 : 256);
  // Row length of the dQ accumulator: the workspace's (templates/attention_params.h).
  static constexpr int kDqAccumDim = (HEAD_DIM + 63) / 64 * 64;
  static constexpr int kBlockM = BLOCK_M;
  static constexpr int kBlockN = BLOCK_N;
  static constexpr int kWarps = WARPS;
  static constexpr int kStages = STAGES;
  static constexpr bool kIsBf16 = IS_BF16;
  static constexpr bool kCausal = CAUSAL;
  static constexpr bool kDqAtomic = DQ_ATOMIC;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kDqThreads = kThreads;  // the Separate mode's dQ kernel

  using Sdp = WarpTiling<kBlockM, kBlockN, kWarps>;         // S, P, dP, dS
  using Dkv = WarpTiling<kBlockN, kHeadDimPadded, kWarps>;  // dK, dV
  using Dq = WarpTiling<kBlockM, kHeadDimPadded, kWarps>;   // dQ
  // Columns of dQ per pass of the dK/dV kernel's dS K_j product (Atomic): its fp32 block is
  // live only after S and dP died, so it takes at most their registers (and at least 32).
  static constexpr int kScoreRegisters = 2 * Sdp::kRows * Sdp::kCols / 32;
  static constexpr int kDqChunkLimit =
      (kScoreRegisters > 32 ? kScoreRegisters : 32) * 32 / Dq::kRows;
  static constexpr int kDqChunk = kDqChunkLimit < Dq::kCols ? kDqChunkLimit : Dq::kCols;

  // Shared memory (bytes; every tile starts at a multiple of 128).
  static constexpr int kRowBytes = kHeadDimPadded * 2;
  static constexpr int kKvTileBytes = kBlockN * kRowBytes;       // K_j or V_j
  static constexpr int kQTileBytes = kBlockM * kRowBytes;        // Q_i or dO_i
  static constexpr int kScoreTileBytes = kBlockM * kBlockN * 2;  // P or dS, 16-bit
  static constexpr int kStatsBytes = kBlockM * 4;                // lse_log2_i or D_i, fp32
  // The dK/dV kernel: K | V | kStages x (Q, dO) | P | dS | kStages x (lse_log2, D).
  static constexpr int kQOffset = 2 * kKvTileBytes;
  static constexpr int kPOffset = kQOffset + kStages * 2 * kQTileBytes;
  static constexpr int kDsOffset = kPOffset + kScoreTileBytes;
  static constexpr int kStatsOffset = kDsOffset + kScoreTileBytes;
  static constexpr int kSmemBytes = kStatsOffset + kStages * 2 * kStatsBytes;
  // The dQ kernel: Q | dO | kStages x (K, V) | dS.
  static constexpr int kDqKvOffset = 2 * kQTileBytes;
  static constexpr int kDqDsOffset = kDqKvOffset + kStages * 2 * kKvTileBytes;
  static constexpr int kDqSmemBytes = kDqDsOffset + kScoreTileBytes;

  static_assert(kHeadDim % 8 == 0 && kHeadDim >= 8 && kHeadDim <= 256,
                "head dim: a multiple of 8 in [8, 256]");
  static_assert(kBlockM == 32 || kBlockM == 64 || kBlockM == 128,
                "block_m divides the workspace's 128-row padding");
  static_assert(kBlockN == 32 || kBlockN == 64 || kBlockN == 128, "block_n: 32, 64 or 128");
  static_assert(kWarps == 4 || kWarps == 8, "4 or 8 warps");
  static_assert(kStages == 1 || kStages == 2, "1 or 2 buffers of the streamed operands");
  static_assert((kBlockM * kHeadDimPadded / 8) % kThreads == 0 &&
                    (kBlockN * kHeadDimPadded / 8) % kThreads == 0,
                "tile copies split evenly over the threads");
  static_assert(kBlockM / 2 <= kThreads, "one 16-byte copy per thread loads lse_log2_i and D_i");
  static_assert(Dq::kCols % kDqChunk == 0 && kDqChunk % 16 == 0, "whole dQ column chunks");
};

// ---- warp-level products over swizzled shared tiles --------------------------------------------

// Byte offset, in a swizzled tile with ROW elements per row, of the row and column a lane
// addresses in an ldmatrix.x4 that reads 16 rows from (row0, col0), two 8-column halves:
//   A operand from a tile [M, K] (rows are A's rows), or B through .trans from a tile [K, N].
template <int ROW>
__device__ __forceinline__ u32 lane_rows16(int row0, int col0) {
  const int lane = threadIdx.x % 32;
  return 2 * swizzled_offset<ROW>(row0 + lane % 16, col0 + lane / 16 * 8);
}
// ... that reads two 8-row groups at (row0, col0) and (row0 + 8, col0), 16 columns each:
//   B operand from a tile [N, K] (rows are B's columns), or A through .trans from a tile [K, M].
template <int ROW>
__device__ __forceinline__ u32 lane_pairs(int row0, int col0) {
  const int lane = threadIdx.x % 32;
  return 2 * swizzled_offset<ROW>(row0 + lane / 16 * 8 + lane % 8, col0 + (lane / 8) % 2 * 8);
}

// acc[MT][NT] += A B for one warp: A [16 MT, 16 KSTEPS] and B [16 KSTEPS, 8 NT], fp32 accumulate.
//   A_KM false: A is stored as a tile [M, K] at a_tile (a_lane from lane_rows16);
//        true:  A^T is stored, a tile [K, M] (a_lane from lane_pairs, ldmatrix .trans).
//   B_KN false: B^T is stored, a tile [N, K] (b_lane from lane_pairs);
//        true:  B is stored, a tile [K, N] (b_lane from lane_rows16, ldmatrix .trans).
// b_chunk0 offsets B's columns (B_KN) by whole 16-byte chunks (a constant once unrolled).
template <bool IS_BF16, int MT, int NT, int KSTEPS, bool A_KM, bool B_KN, int A_ROW, int B_ROW>
__device__ __forceinline__ void warp_mma(float (&acc)[MT][NT][4], u32 a_tile, u32 a_lane,
                                         u32 b_tile, u32 b_lane, int b_chunk0 = 0) {
  static_assert(NT % 2 == 0, "B fragments come in pairs of 8-column tiles");
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    u32 a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (A_KM) {
        ldmatrix_x4_trans(a[mt], a_tile + swizzled_step<A_ROW>(a_lane, 16 * ks, 2 * mt));
      } else {
        ldmatrix_x4(a[mt], a_tile + swizzled_step<A_ROW>(a_lane, 16 * mt, 2 * ks));
      }
    }
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      u32 b[4];  // b[0], b[1]: tile 2 np; b[2], b[3]: tile 2 np + 1
      if constexpr (B_KN) {
        ldmatrix_x4_trans(b, b_tile + swizzled_step<B_ROW>(b_lane, 16 * ks, b_chunk0 + 2 * np));
      } else {
        ldmatrix_x4(b, b_tile + swizzled_step<B_ROW>(b_lane, 16 * np, 2 * ks));
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16x8x16<IS_BF16>(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_16x8x16<IS_BF16>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

template <int MT, int NT>
__device__ __forceinline__ void clear(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
}

// Writes a warp's fp32 accumulator block, times `scale`, rounded to the storage type, into a
// swizzled tile of ROW elements per row at (row0, col0). Fragment layout of an m16n8
// accumulator: lane holds rows lane / 4 and lane / 4 + 8, columns 2 * (lane % 4) + {0, 1}.
template <bool IS_BF16, int ROW, int MT, int NT>
__device__ __forceinline__ void store_fragments(u32 tile, const float (&acc)[MT][NT][4], int row0,
                                                int col0, float scale) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int row = row0 + mt * 16 + lane / 4 + half * 8;
        const int col = col0 + nt * 8 + 2 * (lane % 4);
        store_shared_u32(
            tile + 2 * swizzled_offset<ROW>(row, col),
            pack2<IS_BF16>(acc[mt][nt][2 * half] * scale, acc[mt][nt][2 * half + 1] * scale));
      }
}

// ---- the cp.async pipeline of the streamed operands ---------------------------------------------

// Both kernels stream one operand set per step (dK/dV: Q_i, dO_i, lse_log2_i, D_i; dQ: K_j, V_j)
// through STAGES shared buffers: load(t, buffer) starts step t's copies into buffer t % STAGES,
// one commit group per step. With two buffers step t + 1's copies fly while step t computes;
// with one they start once step t is done reading its operands.
//   pipeline_prologue<kStages>(steps, load);
//   for (t = 0; t < steps; ++t) {
//     pipeline_begin_step<kStages>(t, steps, load);    // step t's operands are in shared memory
//     ... the products that read them ...
//     pipeline_end_reads<kStages>(t, steps, load);
//     ... the rest of step t ...
//   }
template <int STAGES, class Load>
__device__ __forceinline__ void pipeline_prologue(int steps, const Load& load) {
#pragma unroll
  for (int s = 0; s < (STAGES > 1 ? STAGES - 1 : 1); ++s) {
    if (s < steps) load(s, s);
    cp_async_commit();
  }
}
// This thread's copies of step t have landed; after the barrier everyone's have, and every
// thread is done with step t - 1 (its buffer and whatever else the step wrote to shared memory);
// with two buffers, step t + 1's copies start into the one step t - 1 used.
template <int STAGES, class Load>
__device__ __forceinline__ void pipeline_begin_step(int t, int steps, const Load& load) {
  if constexpr (STAGES == 1) {
    cp_async_wait<0>();
  } else {
    cp_async_wait<STAGES - 2>();
  }
  __syncthreads();
  if constexpr (STAGES > 1) {
    const int next = t + STAGES - 1;
    if (next < steps) load(next, next % STAGES);
    cp_async_commit();
  }
}
// With one buffer: once every thread is done reading step t's operands, step t + 1's copies
// start over them.
template <int STAGES, class Load>
__device__ __forceinline__ void pipeline_end_reads(int t, int steps, const Load& load) {
  if constexpr (STAGES == 1) {
    __syncthreads();
    if (t + 1 < steps) load(t + 1, 0);
    cp_async_commit();
  }
}

// ---- one (query block, key block) pair: S, P, dP, dS --------------------------------------------

// On the Sdp tiling, for query rows [m0, m0 + kBlockM) against keys [n0, n0 + kBlockN):
//   S = Q K^T, P = exp2(S * scale_log2 - lse_log2) (masked where the block crosses the seqlen_k
//   edge or the causal diagonal), dP = dO V^T, dS = P * (dP - D);
// then dS (and P when STORE_P) rounded to the storage type into their [kBlockM, kBlockN] tiles.
// lse_log2 and delta hold the values of this lane's rows (Sdp::row0 + 16 mt + lane / 4 + 8 half).
// Rows past seqlen_q need no mask: their lse_log2 is +inf (P = 0) and their dO is zero-filled.
#ifdef FLASHJIT_VARIANT
// An attention variant (FLASHJIT_VARIANT: templates/attention_variant.h, rendered before this
// file; the variant code is all under #ifdef FLASHJIT_VARIANT, so that plain kernels compile
// exactly as before): the dK/dV kernel visits the query blocks whose rows may see its keys
// (query_rows), the dQ kernel the key blocks its rows may see (key_blocks); scores_to_shared
// applies the scores and the mask per element in the blocks that need either, as the forward
// does, recomputing P against the forward's lse, and multiplies dS by d score / d s
// (score_and_grad: the soft-cap's 1 - tanh^2, the user's score_mod_grad); batch and head for the
// user's expressions, slope for ALiBi.
template <class K, bool STORE_P>
__device__ __forceinline__ void scores_to_shared(const FlashjitAttentionParams& p, int diagonal,
                                                 int m0, int n0, u32 q_tile, u32 do_tile,
                                                 u32 k_tile, u32 v_tile, u32 p_tile, u32 ds_tile,
                                                 const float (&lse_log2)[K::Sdp::kMTiles][2],
                                                 const float (&delta)[K::Sdp::kMTiles][2],
                                                 int batch, int head, float slope,
                                                 bool map_full = false) {
  namespace fv = flashjit_variant;
#else
template <class K, bool STORE_P>
__device__ __forceinline__ void scores_to_shared(const FlashjitAttentionParams& p, int diagonal,
                                                 int m0, int n0, u32 q_tile, u32 do_tile,
                                                 u32 k_tile, u32 v_tile, u32 p_tile, u32 ds_tile,
                                                 const float (&lse_log2)[K::Sdp::kMTiles][2],
                                                 const float (&delta)[K::Sdp::kMTiles][2]) {
#endif
  namespace fa = flashjit_attention;
  using T = typename K::Sdp;
  constexpr int kDp = K::kHeadDimPadded;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int row0 = T::row0(warp), col0 = T::col0(warp);
  const u32 rows_lane = lane_rows16<kDp>(row0, 0);  // Q_i and dO_i rows of this warp (A)
  const u32 keys_lane = lane_pairs<kDp>(col0, 0);   // K_j and V_j rows of this warp (B^T)

  float s[T::kMTiles][T::kNTiles][4];
  clear(s);
  warp_mma<K::kIsBf16, T::kMTiles, T::kNTiles, kDp / 16, false, false, kDp, kDp>(
      s, q_tile, rows_lane, k_tile, keys_lane);
#ifdef FLASHJIT_VARIANT
  // grad: d score / d (scale * q . k) where the variant modifies the scores (else unused).
  float grad[T::kMTiles][T::kNTiles][4];
  // (map_full: a mask_mod's block map calls the tile full.)
  const bool all_visible =
      map_full || fv::block_fully_visible(p, diagonal, m0, K::kBlockM, n0, K::kBlockN);
  if (!all_visible || fv::kModifiesScores) {
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + row0 + mt * 16 + lane / 4 + half * 8;
        const int key0 = n0 + col0 + 2 * (lane % 4);  // this lane's key at nt, e = 0
#pragma unroll
        for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = key0 + nt * 8 + e;
            float& score = s[mt][nt][2 * half + e];
            float g = 1.f;
            if (fv::kModifiesScores)
              score = fv::score_and_grad(score * p.scale, slope, batch, head, row, key,
                                         static_cast<float>(key - row), &g);
            if (!all_visible && !fv::visible(p, diagonal, batch, head, row, key)) {
              score = minus_infinity();
              g = 0.f;
            }
            grad[mt][nt][2 * half + e] = g;
          }
      }
  }
  // P, in place (modified scores are scaled scores: log2(e) alone).
  const float scale_log2 = fv::kModifiesScores ? 1.4426950408889634f : p.scale_log2;
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[mt][nt][e] = fast_exp2(fmaf(s[mt][nt][e], scale_log2, -lse_log2[mt][e / 2]));
#else
  if (fa::block_needs_mask<K::kCausal>(p, diagonal, m0, n0, K::kBlockN)) {
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // Last visible key of this fragment row, relative to this lane's first column.
        const int row = m0 + row0 + mt * 16 + lane / 4 + half * 8;
        const int limit = fa::last_key<K::kCausal>(p, diagonal, row) - (n0 + col0 + 2 * (lane % 4));
#pragma unroll
        for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (nt * 8 + e > limit) s[mt][nt][2 * half + e] = minus_infinity();
      }
  }
  // P, in place: exp2(-inf) = 0 for masked scores and for rows with lse +inf.
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[mt][nt][e] = fast_exp2(fmaf(s[mt][nt][e], p.scale_log2, -lse_log2[mt][e / 2]));
#endif

  float dp[T::kMTiles][T::kNTiles][4];
  clear(dp);
  warp_mma<K::kIsBf16, T::kMTiles, T::kNTiles, kDp / 16, false, false, kDp, kDp>(
      dp, do_tile, rows_lane, v_tile, keys_lane);
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < T::kNTiles; ++nt) {
        const float* pr = &s[mt][nt][2 * half];
        const float* dpr = &dp[mt][nt][2 * half];
        const u32 offset = 2 * swizzled_offset<K::kBlockN>(row0 + mt * 16 + lane / 4 + half * 8,
                                                           col0 + nt * 8 + 2 * (lane % 4));
        if constexpr (STORE_P) store_shared_u32(p_tile + offset, pack2<K::kIsBf16>(pr[0], pr[1]));
#ifdef FLASHJIT_VARIANT
        float ds0 = pr[0] * (dpr[0] - delta[mt][half]), ds1 = pr[1] * (dpr[1] - delta[mt][half]);
        if (fv::kModifiesScores) {
          ds0 *= grad[mt][nt][2 * half];
          ds1 *= grad[mt][nt][2 * half + 1];
        }
        store_shared_u32(ds_tile + offset, pack2<K::kIsBf16>(ds0, ds1));
#else
        store_shared_u32(ds_tile + offset, pack2<K::kIsBf16>(pr[0] * (dpr[0] - delta[mt][half]),
                                                             pr[1] * (dpr[1] - delta[mt][half])));
#endif
      }
}

// ---- the dK/dV kernel --------------------------------------------------------------------------

template <class K>
FLASHJIT_KERNEL_BODY(attention_backward_dkdv) {  // p (a variant: and its block map)
  namespace fa = flashjit_attention;
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kDp = K::kHeadDimPadded, kThreads = K::kThreads;
  using Sdp = typename K::Sdp;
  using Dkv = typename K::Dkv;
  using Dq = typename K::Dq;

  const u32 smem = shared_address(dynamic_shared_memory());
  const u32 k_tile = smem, v_tile = smem + K::kKvTileBytes;
  const u32 p_tile = smem + K::kPOffset, ds_tile = smem + K::kDsOffset;
  // Stage s: Q_i at q_tile(s), dO_i one tile after; lse_log2_i at stats(s), D_i one block after.
  auto q_tile = [&](int stage) { return smem + K::kQOffset + stage * 2 * K::kQTileBytes; };
  auto stats = [&](int stage) { return smem + K::kStatsOffset + stage * 2 * K::kStatsBytes; };

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n_block = blockIdx.x, kv_head = blockIdx.y, batch = blockIdx.z;
  const int n0 = n_block * kBlockN;
  const int diagonal = fa::diagonal(p);
  // Query blocks [m_begin, m_end) of every head of the group see keys of this block: one step
  // per (head, query block), the query block fastest.
#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_BLOCK_MASK
  // The block map's non-empty query tiles of this key tile (its transposed lists), head after
  // head of the group: step t is query_tiles.at(t).
  const flashjit_variant::GroupQueryTiles query_tiles(*block_mask, batch, kv_head * p.group_size,
                                                      p.group_size, n_block);
  const int steps = query_tiles.steps;
#else
  // The variant's query rows that may see this block (templates/attention_variant.h).
  const flashjit_variant::QueryRows query_rows =
      flashjit_variant::query_rows(p, diagonal, n0, kBlockN);
  const int m_begin = query_rows.first / kBlockM;
  const int m_end =
      query_rows.first < query_rows.last ? (query_rows.last + kBlockM - 1) / kBlockM : m_begin;
  const int m_count = m_end > m_begin ? m_end - m_begin : 0;
  const int steps = m_count * p.group_size;
#endif
#else
  const int m_begin = fa::first_query_block<K::kCausal>(diagonal, n0, kBlockM);
  const int m_end = fa::query_blocks(p, kBlockM);
  const int m_count = m_end > m_begin ? m_end - m_begin : 0;
  const int steps = m_count * p.group_size;
#endif

  const u16* k = static_cast<const u16*>(p.k) + batch * p.k_batch_stride +
                 kv_head * p.k_head_stride + n0 * p.k_seq_stride;
  const u16* v = static_cast<const u16*>(p.v) + batch * p.v_batch_stride +
                 kv_head * p.v_head_stride + n0 * p.v_seq_stride;

  // Step t's query head and the first row of its query tile.
  auto step_tile = [&](int t, int& head, int& m0) {
#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_BLOCK_MASK
    const flashjit_variant::GroupStep step = query_tiles.at(t);
    head = step.head;
    m0 = step.tile * kBlockM;
#else
    head = kv_head * p.group_size + t / m_count;
    m0 = (m_begin + t % m_count) * kBlockM;
#endif
#else
    head = kv_head * p.group_size + t / m_count;
    m0 = (m_begin + t % m_count) * kBlockM;
#endif
  };
  // Starts the copies of step t's Q_i, dO_i, lse_log2_i and D_i into buffer `stage`.
  auto load_step = [&](int t, int stage) {
    int head, m0;
    step_tile(t, head, m0);
    const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride +
                   head * p.q_head_stride + m0 * p.q_seq_stride;
    const u16* d_o = static_cast<const u16*>(p.d_o) + batch * p.do_batch_stride +
                     head * p.do_head_stride + m0 * p.do_seq_stride;
    load_tile_async<kThreads, kBlockM, kDp, K::kHeadDim>(q_tile(stage), q, p.q_seq_stride,
                                                         p.seqlen_q - m0);
    load_tile_async<kThreads, kBlockM, kDp, K::kHeadDim>(q_tile(stage) + K::kQTileBytes, d_o,
                                                         p.do_seq_stride, p.seqlen_q - m0);
    // The workspace rows are padded to a multiple of 128 >= m0 + kBlockM: no bounds to check.
    const long long row_base =
        (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0;
    constexpr int kVectors = kBlockM / 4;  // 16-byte vectors per block of one statistic
    if (threadIdx.x < kVectors) {
      cp_async_16(stats(stage) + 16 * threadIdx.x, p.lse_log2 + row_base + 4 * threadIdx.x, 16);
    } else if (threadIdx.x < 2 * kVectors) {
      const int i = threadIdx.x - kVectors;
      cp_async_16(stats(stage) + K::kStatsBytes + 16 * i, p.delta + row_base + 4 * i, 16);
    }
  };

  float dk[Dkv::kMTiles][Dkv::kNTiles][4], dv[Dkv::kMTiles][Dkv::kNTiles][4];
  clear(dk);
  clear(dv);

  if (steps > 0) {
    // Prologue: K_j, V_j and the first max(1, kStages - 1) steps, one commit group per step.
    load_tile_async<kThreads, kBlockN, kDp, K::kHeadDim>(k_tile, k, p.k_seq_stride,
                                                         p.seqlen_k - n0);
    load_tile_async<kThreads, kBlockN, kDp, K::kHeadDim>(v_tile, v, p.v_seq_stride,
                                                         p.seqlen_k - n0);
    pipeline_prologue<kStages>(steps, load_step);
  }

  // Per lane: the P^T / dS^T (A) and dO_i / Q_i (B) offsets of dV and dK; dS (A) and K_j (B)
  // of the Atomic mode's dQ.
  const u32 kv_rows_lane = lane_pairs<kBlockN>(0, Dkv::row0(warp));
  const u32 kv_cols_lane = lane_rows16<kDp>(0, Dkv::col0(warp));
  const u32 dq_rows_lane = lane_rows16<kBlockN>(Dq::row0(warp), 0);
  const u32 dq_cols_lane = lane_rows16<kDp>(0, Dq::col0(warp));

  for (int t = 0; t < steps; ++t) {
    const int stage = t % kStages;
    pipeline_begin_step<kStages>(t, steps, load_step);  // and everyone is done with P, dS of t - 1
    int head, m0;
    step_tile(t, head, m0);
    const u32 q_i = q_tile(stage), do_i = q_i + K::kQTileBytes;

    float lse_log2[Sdp::kMTiles][2], delta[Sdp::kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < Sdp::kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = Sdp::row0(warp) + mt * 16 + lane / 4 + half * 8;
        lse_log2[mt][half] = load_shared_f32(stats(stage) + 4 * row);
        delta[mt][half] = load_shared_f32(stats(stage) + K::kStatsBytes + 4 * row);
      }
#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_BLOCK_MASK
    scores_to_shared<K, true>(p, diagonal, m0, n0, q_i, do_i, k_tile, v_tile, p_tile, ds_tile,
                              lse_log2, delta, batch, head, flashjit_variant::alibi_slope(p, head),
                              query_tiles.at(t).full);
#else
    scores_to_shared<K, true>(p, diagonal, m0, n0, q_i, do_i, k_tile, v_tile, p_tile, ds_tile,
                              lse_log2, delta, batch, head, flashjit_variant::alibi_slope(p, head));
#endif
#else
    scores_to_shared<K, true>(p, diagonal, m0, n0, q_i, do_i, k_tile, v_tile, p_tile, ds_tile,
                              lse_log2, delta);
#endif
    __syncthreads();  // P and dS complete

    // dV += P^T dO_i, dK += dS^T Q_i: [kBlockN, d], contracting the kBlockM query rows.
    warp_mma<K::kIsBf16, Dkv::kMTiles, Dkv::kNTiles, kBlockM / 16, true, true, kBlockN, kDp>(
        dv, p_tile, kv_rows_lane, do_i, kv_cols_lane);
    warp_mma<K::kIsBf16, Dkv::kMTiles, Dkv::kNTiles, kBlockM / 16, true, true, kBlockN, kDp>(
        dk, ds_tile, kv_rows_lane, q_i, kv_cols_lane);

    pipeline_end_reads<kStages>(t, steps, load_step);  // Q_i, dO_i

    if constexpr (K::kDqAtomic) {
      // dq_accum_i += dS K_j, in chunks of kDqChunk columns (unscaled: the convert scales).
      float* accum =
          p.dq_accum +
          ((static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0) *
              K::kDqAccumDim;
#pragma unroll
      for (int chunk = 0; chunk < Dq::kCols / K::kDqChunk; ++chunk) {
        float dq[Dq::kMTiles][K::kDqChunk / 8][4];
        clear(dq);
        warp_mma<K::kIsBf16, Dq::kMTiles, K::kDqChunk / 8, kBlockN / 16, false, true, kBlockN, kDp>(
            dq, ds_tile, dq_rows_lane, k_tile, dq_cols_lane, chunk * K::kDqChunk / 8);
#pragma unroll
        for (int mt = 0; mt < Dq::kMTiles; ++mt)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = Dq::row0(warp) + mt * 16 + lane / 4 + half * 8;
            if (m0 + row >= p.seqlen_q) continue;
#pragma unroll
            for (int nt = 0; nt < K::kDqChunk / 8; ++nt) {
              const int col = Dq::col0(warp) + chunk * K::kDqChunk + nt * 8 + 2 * (lane % 4);
              if (col < K::kHeadDim) {
                reduce_add_f32x2(accum + row * K::kDqAccumDim + col, dq[mt][nt][2 * half],
                                 dq[mt][nt][2 * half + 1]);
              }
            }
          }
      }
    }
  }

  // Epilogue: dK * scale and dV into the K and V tiles (no longer read), then 16-byte stores.
  cp_async_wait<0>();
  __syncthreads();
  store_fragments<K::kIsBf16, kDp>(k_tile, dk, Dkv::row0(warp), Dkv::col0(warp), p.scale);
  store_fragments<K::kIsBf16, kDp>(v_tile, dv, Dkv::row0(warp), Dkv::col0(warp), 1.f);
  __syncthreads();
  u16* dk_out = static_cast<u16*>(p.dk) + batch * p.dk_batch_stride + kv_head * p.dk_head_stride +
                n0 * p.dk_seq_stride;
  u16* dv_out = static_cast<u16*>(p.dv) + batch * p.dv_batch_stride + kv_head * p.dv_head_stride +
                n0 * p.dv_seq_stride;
  store_tile<kThreads, kBlockN, kDp, K::kHeadDim>(k_tile, dk_out, p.dk_seq_stride, p.seqlen_k - n0);
  store_tile<kThreads, kBlockN, kDp, K::kHeadDim>(v_tile, dv_out, p.dv_seq_stride, p.seqlen_k - n0);
}

// ---- the dQ kernel (DqMode::Separate) -----------------------------------------------------------

template <class K>
FLASHJIT_KERNEL_BODY(attention_backward_dq) {  // p (a variant: and its block map)
  namespace fa = flashjit_attention;
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kDp = K::kHeadDimPadded, kThreads = K::kDqThreads;
  using Sdp = typename K::Sdp;
  using Dq = typename K::Dq;

  const u32 smem = shared_address(dynamic_shared_memory());
  const u32 q_tile = smem, do_tile = smem + K::kQTileBytes, ds_tile = smem + K::kDqDsOffset;
  // Stage s: K_j at k_tile(s), V_j one tile after.
  auto k_tile = [&](int stage) { return smem + K::kDqKvOffset + stage * 2 * K::kKvTileBytes; };

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Causal rows near the end see the most keys: launch them first so the tail is short.
  const int m_block = K::kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / p.group_size;
  const int m0 = m_block * kBlockM;
  const int diagonal = fa::diagonal(p);
#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_BLOCK_MASK
  // The block map's non-empty key tiles of this query tile: step j visits key_blocks.at(j).
  const flashjit_variant::BlockList key_blocks =
      flashjit_variant::key_tiles_of(*block_mask, batch, head, m_block);
#else
  // The variant's key blocks: step j visits block key_blocks.at(j).
  const flashjit_variant::KeyBlocks key_blocks =
      flashjit_variant::key_blocks(p, diagonal, m0, kBlockM, kBlockN);
#endif
  const int n_blocks = key_blocks.count();
  const float slope = flashjit_variant::alibi_slope(p, head);
#else
  const int n_blocks = fa::key_blocks<K::kCausal>(p, diagonal, m0, kBlockM, kBlockN);
#endif

  const u16* k =
      static_cast<const u16*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
  const u16* v =
      static_cast<const u16*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
#ifdef FLASHJIT_VARIANT
  auto load_keys = [&](int t, int stage) {
    const int n0 = key_blocks.at(t) * kBlockN;
    load_tile_async<kThreads, kBlockN, kDp, K::kHeadDim>(k_tile(stage), k + n0 * p.k_seq_stride,
                                                         p.k_seq_stride, p.seqlen_k - n0);
    load_tile_async<kThreads, kBlockN, kDp, K::kHeadDim>(
        k_tile(stage) + K::kKvTileBytes, v + n0 * p.v_seq_stride, p.v_seq_stride, p.seqlen_k - n0);
  };
#else
  auto load_keys = [&](int j, int stage) {
    load_tile_async<kThreads, kBlockN, kDp, K::kHeadDim>(
        k_tile(stage), k + j * kBlockN * p.k_seq_stride, p.k_seq_stride, p.seqlen_k - j * kBlockN);
    load_tile_async<kThreads, kBlockN, kDp, K::kHeadDim>(k_tile(stage) + K::kKvTileBytes,
                                                         v + j * kBlockN * p.v_seq_stride,
                                                         p.v_seq_stride, p.seqlen_k - j * kBlockN);
  };
#endif

  // lse_log2 and D of this lane's rows (workspace rows are padded: no bounds to check).
  const long long row_base =
      (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0;
  float lse_log2[Sdp::kMTiles][2], delta[Sdp::kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < Sdp::kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = Sdp::row0(warp) + mt * 16 + lane / 4 + half * 8;
      lse_log2[mt][half] = p.lse_log2[row_base + row];
      delta[mt][half] = p.delta[row_base + row];
    }

  float dq[Dq::kMTiles][Dq::kNTiles][4];
  clear(dq);
  if (n_blocks > 0) {
    // Prologue: Q_i, dO_i and the first max(1, kStages - 1) key blocks, one group per block.
    const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride +
                   head * p.q_head_stride + m0 * p.q_seq_stride;
    const u16* d_o = static_cast<const u16*>(p.d_o) + batch * p.do_batch_stride +
                     head * p.do_head_stride + m0 * p.do_seq_stride;
    load_tile_async<kThreads, kBlockM, kDp, K::kHeadDim>(q_tile, q, p.q_seq_stride,
                                                         p.seqlen_q - m0);
    load_tile_async<kThreads, kBlockM, kDp, K::kHeadDim>(do_tile, d_o, p.do_seq_stride,
                                                         p.seqlen_q - m0);
    pipeline_prologue<kStages>(n_blocks, load_keys);
  }

  const u32 ds_lane = lane_rows16<kBlockN>(Dq::row0(warp), 0);  // dS rows of this warp (A)
  const u32 k_lane = lane_rows16<kDp>(0, Dq::col0(warp));       // K_j columns (B, .trans)
  for (int j = 0; j < n_blocks; ++j) {
    const int stage = j % kStages;
    pipeline_begin_step<kStages>(j, n_blocks, load_keys);  // and everyone is done with dS of j - 1
    const u32 k_j = k_tile(stage), v_j = k_j + K::kKvTileBytes;
#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_BLOCK_MASK
    scores_to_shared<K, false>(p, diagonal, m0, key_blocks.at(j) * kBlockN, q_tile, do_tile, k_j,
                               v_j, 0, ds_tile, lse_log2, delta, batch, head, slope,
                               key_blocks.full(j));
#else
    scores_to_shared<K, false>(p, diagonal, m0, key_blocks.at(j) * kBlockN, q_tile, do_tile, k_j,
                               v_j, 0, ds_tile, lse_log2, delta, batch, head, slope);
#endif
#else
    scores_to_shared<K, false>(p, diagonal, m0, j * kBlockN, q_tile, do_tile, k_j, v_j, 0, ds_tile,
                               lse_log2, delta);
#endif
    __syncthreads();  // dS complete
    // dQ += dS K_j: [kBlockM, d], contracting the kBlockN keys.
    warp_mma<K::kIsBf16, Dq::kMTiles, Dq::kNTiles, kBlockN / 16, false, true, kBlockN, kDp>(
        dq, ds_tile, ds_lane, k_j, k_lane);
    pipeline_end_reads<kStages>(j, n_blocks, load_keys);  // K_j, V_j
  }

  // Epilogue: dQ * scale into the Q tile (no longer read), then 16-byte stores. Rows that saw no
  // key (and blocks with none) write zeros.
  cp_async_wait<0>();
  __syncthreads();
  store_fragments<K::kIsBf16, kDp>(q_tile, dq, Dq::row0(warp), Dq::col0(warp), p.scale);
  __syncthreads();
  u16* dq_out = static_cast<u16*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride +
                m0 * p.dq_seq_stride;
  store_tile<kThreads, kBlockM, kDp, K::kHeadDim>(q_tile, dq_out, p.dq_seq_stride, p.seqlen_q - m0);
}

#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_VARLEN
// Packed variable-length documents: the kernels above on the document's view of the params
// (templates/attention_variant.h, document_tile_view; the workspace as
// cuda/attention_bwd_common.cuh says). A dK/dV CTA runs for a document without queries too (its
// dK = dV = 0 are written) and exits when its keys start past the document's; a dQ CTA exits when
// its query rows (m_block as the kernel computes it) start past the document's.
FLASHJIT_BACKWARD_DOCUMENT_ENTRIES(attention_backward, K::kDqAccumDim)
#endif
#endif
}  // namespace flashjit_kernel
