// FlashAttention-2 backward for Hopper (sm_90a: H100, H200), wgmma family: every product on the
// tensor cores through warpgroup MMA, operands straight from swizzled shared memory (or P^T and
// dS^T from registers). The renderer prepends templates/attention_params.h,
// templates/attention_common.h (key range and masking rules), cuda/common.cuh, cuda/wgmma.cuh
// (wgmma and other sm90 PTX wrappers), cuda/sm90_tiles.cuh (descriptors, swizzled tiles) and
// cuda/attention_bwd_common.cuh (the preprocess and the Atomic mode's convert kernels, the bulk
// reduction's PTX), and appends
// one instantiation of Sm90BwdTraits with the entry points of render.hpp; NVRTC compiles it for
// sm_90a.
//
// The math (generator/problem.hpp), per key block j of one (batch, kv head), base 2 throughout:
//   P^T  = exp2(scale_log2 * K_j Q_i^T - lse_log2_i)       S^T and dP^T have keys as rows (M)
//   dP^T = V_j dO_i^T,   dS^T = P^T * (dP^T - delta_i)      delta_i = rowsum(dO_i * O_i)
//   dV_j += P^T dO_i,    dK_j += dS^T Q_i                   over every query block i and every
//                                                           query head of the GQA group
//   dQ_i += dS_i K_j                                        Atomic: fp32 adds into dq_accum
//   dK_j *= scale (epilogue); dQ's scale is applied by the convert (or the dQ kernel)
//
// dK/dV kernel: one CTA per block of kBlockN keys, kWarpgroups warpgroups of 128 threads. K_j and
// V_j stay in shared memory; Q_i, dO_i, lse_log2_i and delta_i stream through a kStages-deep
// cp.async pipeline. Warpgroup w owns key rows [64 * key_tile, + 64) of S^T and dP^T (M = 64)
// and query columns [query_part * kSdpN, + kSdpN):
//   kQuerySplit == 1 (kBlockN = 64 * kWarpgroups; d <= 128): w owns its 64 keys end to end:
//     all query columns of S^T, and all head-dim columns of dK_j, dV_j, accumulated in registers
//     from P^T and dS^T in registers (RS wgmmas).
//   kQuerySplit == 2 (kBlockN = 64, two warpgroups; d = 256, where one warpgroup cannot hold
//     64 x 256 of both dK and dV): the two share the 64 keys, each computing half the query
//     columns of S^T, dP^T; P^T and dS^T go to shared memory and each warpgroup accumulates
//     half the head-dim columns of dK_j and dV_j from there (SS wgmmas).
// clang-format off
//   load K_j, V_j; dK = dV = 0                       K, V: [kBlockN, d] -> shared, resident
//   for each query head h of the group, each query block i that sees key block j:
//     S^T = K_w Q_i^T; dP^T = V_w dO_i^T            two commit groups, in flight together
//     wait S^T: P^T = exp2(S^T * scale_log2 - lse)  (-inf where masked: edge blocks only)
//     wait dP^T: dS^T = P^T * (dP^T - delta)        P^T, dS^T rounded to 16 bits
//     dS^T (P^T too when shared) -> shared; barrier  Atomic, or keys shared by two warpgroups
//     dV += P^T dO_i; dK += dS^T Q_i                 RS, or SS when shared
//     Atomic: dQ tile = dS K_j (SS)                  in flight with dV and dK
//     wait all; Atomic: dQ tile -> shared (fp32)     (more tiles: issue, wait, stage)
//     Atomic: barrier; dq_accum += staged tiles      one bulk reduction per row (the L2 adds
//                                                    whole lines), waited for a step later
//   dK *= scale; dK, dV -> shared (over K, V) -> global, 16-byte stores through their strides
// clang-format on
//
// dQ kernel (DqMode::Separate, deterministic; cuda/attention_bwd_sm90_dq.cuh, which the renderer
// appends to this file): one CTA per block of kBlockM query rows (one
// warpgroup per 64 rows), Q_i and dO_i resident, K_j and V_j streamed: S = Q_i K_j^T and
// dP = dO_i V_j^T (rows = queries), P, dS as above, dQ_i += dS K_j (RS) in registers; epilogue
// dQ *= scale, 16-byte stores. Packed documents' entries of both kernels close that file.
//
// Every wgmma in a loop is unconditional, the first of each fresh accumulator is a *_first
// (nothing loop-carried into it), and every register a wgmma reads or writes asynchronously is
// pinned after the wait that covers it: ptxas would serialize the wgmmas otherwise (C7514/C7515).

namespace flashjit_kernel {

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool IS_BF16, bool CAUSAL,
          bool DQ_ATOMIC>
struct Sm90BwdTraits {
  // kHeadDimPadded: whole 64-column blocks.
  // kBlockM: query rows per step (dK/dV), per CTA (dQ kernel); kBlockN: keys per CTA (dK/dV), per
  // step (dQ kernel).
  FLASHJIT_TRAITS_SHAPE(HEAD_DIM, (HEAD_DIM + 63) / 64 * 64, BLOCK_M, BLOCK_N, WARPS, STAGES,
                        IS_BF16, CAUSAL);
  static constexpr bool kDqAtomic = DQ_ATOMIC;

  // ---- dK/dV kernel ----
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpgroups = kWarps / 4;
  static constexpr int kKeyTiles = kBlockN / 64;                  // 64-key row tiles of S^T
  static constexpr int kQuerySplit = kWarpgroups / kKeyTiles;     // warpgroups per key tile
  static constexpr int kSdpN = kBlockM / kQuerySplit;             // S^T columns per warpgroup
  static constexpr int kKvCols = kHeadDimPadded / kQuerySplit;    // dK/dV columns per warpgroup
  static constexpr bool kKvFromRegisters = kQuerySplit == 1;      // RS dV/dK, else SS via smem
  static constexpr int kKvChunk = kKvCols % 128 == 0 ? 128 : 64;  // N of one dV/dK wgmma
  static constexpr int kKvChunks = kKvCols / kKvChunk;
  // Atomic dQ: tiles of 64 query rows x kDqN columns, kDqTilesPerWarpgroup per warpgroup.
  static constexpr int kDqN = kHeadDimPadded % 128 == 0 && kHeadDimPadded >= 256 ? 128 : 64;
  static constexpr int kDqColTiles = kHeadDimPadded / kDqN;
  static constexpr int kDqTiles = kBlockM / 64 * kDqColTiles;
  static constexpr int kDqTilesPerWarpgroup = kDqTiles / kWarpgroups;
  // Staged in shared memory for the bulk reductions, rows kDqStageRowBytes apart (32 bytes of
  // padding put a half-warp's 8-byte stores on distinct banks).
  static constexpr int kDqStageRowBytes = kDqN * 4 + 32;
  static constexpr int kDqStageTileBytes = 64 * kDqStageRowBytes;
  static constexpr int kDqStageBytes = kDqAtomic ? kDqTiles * kDqStageTileBytes : 0;
  // Shared memory, every tile on a 1024-byte boundary (sizes are multiples of 1024).
  static constexpr int kKvTileBytes = kBlockN * kHeadDimPadded * 2;  // K_j or V_j
  static constexpr int kQTileBytes = kBlockM * kHeadDimPadded * 2;   // Q_i or dO_i, per stage
  static constexpr int kScoreTileBytes = kBlockN * kBlockM * 2;      // P^T or dS^T [keys, queries]
  static constexpr bool kDsInSmem = kDqAtomic || !kKvFromRegisters;
  static constexpr bool kPInSmem = !kKvFromRegisters;
  static constexpr int kStatBytes = kBlockM * 4;  // lse_log2 or delta of one step
  static constexpr int kSmemBytes =
      1024 + 2 * kKvTileBytes + 2 * kStages * kQTileBytes + (kDsInSmem ? kScoreTileBytes : 0) +
      (kPInSmem ? kScoreTileBytes : 0) + 2 * kStages * kStatBytes + kDqStageBytes;

  // ---- dQ kernel (DqMode::Separate) ----
  static constexpr int kDqWarpgroups = kBlockM / 64;
  static constexpr int kDqThreads = 128 * kDqWarpgroups;
  static constexpr int kDqChunk = kHeadDimPadded % 128 == 0 ? 128 : 64;  // N of one dQ wgmma
  static constexpr int kDqChunks = kHeadDimPadded / kDqChunk;
  static constexpr int kDqSmemBytes = 1024 + 2 * kQTileBytes + 2 * kStages * kKvTileBytes;

  static_assert(kBlockM == 64 || kBlockM == 128, "block_m: 64 or 128 query rows");
  static_assert(kBlockN == 64 || kBlockN == 128, "block_n: 64 or 128 keys");
  static_assert(kWarps == 4 || kWarps == 8, "one or two warpgroups");
  static_assert(kStages >= 2 && kStages <= 3, "2 or 3 Q/dO buffers");
  static_assert(kWarpgroups % kKeyTiles == 0 && (kQuerySplit == 1 || kQuerySplit == 2),
                "block_n = 64 per warpgroup, or 64 keys shared by two warpgroups");
  static_assert(kKvCols % 64 == 0, "split dK/dV columns: whole 64-column blocks (d = 256)");
  static_assert(kSdpN % 16 == 0, "S^T columns: whole 16-query k-steps");
  static_assert(!kDqAtomic || kDqTiles % kWarpgroups == 0, "dQ tiles split evenly");
};

// dV = dK = 0: a key block's fp32 accumulators, in CHUNKS wgmma chunks of N registers.
template <int CHUNKS, int N>
__device__ __forceinline__ void clear_kv(float (&dv)[CHUNKS][N], float (&dk)[CHUNKS][N]) {
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
    for (int i = 0; i < N; ++i) dv[c][i] = dk[c][i] = 0.f;
}
// wgmma.cuh's pin of dV and dK, chunk by chunk, after the wait that covers their wgmmas.
template <int CHUNKS, int N>
__device__ __forceinline__ void pin_kv(float (&dv)[CHUNKS][N], float (&dk)[CHUNKS][N]) {
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    pin(dv[c]);
    pin(dk[c]);
  }
}

// The 32-bit pairs of this thread's share of a 64 x N accumulator tile (wgmma layout, wgmma.cuh:
// rows row0 + 16 * (warp % 4) + lane / 4 (+ 8), columns col0 + 2 * (lane % 4) + 8 * t) into a
// swizzled shared tile of ROWS rows; pair(t, half) gives the value of tile t, row half.
template <int N, int ROWS, class Pair>
__device__ __forceinline__ void store_pairs(unsigned char* tile, int row0, int col0,
                                            const Pair& pair) {
  const int lane = threadIdx.x % 32;
  const int row = row0 + (threadIdx.x / 32 % 4) * 16 + lane / 4;
  const int col = col0 + 2 * (lane % 4);
#pragma unroll
  for (int t = 0; t < N / 8; ++t)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<u32*>(tile + wg_tile_offset<ROWS>(row + 8 * half, col + 8 * t)) =
          pair(t, half);
}

// One accumulator tile of 64 rows x N columns rounded to 16 bits (times `scale`) into a swizzled
// shared tile of ROWS rows at (row0 + this thread's rows, col0 + its columns).
template <int N, int ROWS, bool IS_BF16>
__device__ __forceinline__ void store_accumulator(unsigned char* tile, const float (&d)[N / 2],
                                                  int row0, int col0, float scale) {
  store_pairs<N, ROWS>(tile, row0, col0, [&](int t, int half) {
    return pack2<IS_BF16>(d[4 * t + 2 * half] * scale, d[4 * t + 2 * half + 1] * scale);
  });
}

// 16-bit A fragments (wgmma.cuh, rs) of a 64 x N accumulator: k-step s holds tiles 2s, 2s + 1.
template <int N, bool IS_BF16>
__device__ __forceinline__ void pack_fragments(u32 (&a)[N / 16][4], const float (&d)[N / 2]) {
#pragma unroll
  for (int t = 0; t < N / 8; ++t)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      a[t / 2][(t % 2) * 2 + half] = pack2<IS_BF16>(d[4 * t + 2 * half], d[4 * t + 2 * half + 1]);
}

// S^T (keys as rows: this thread's rows `key` (+ 8), columns `query` + 8 nt + e) into P^T =
// exp2(S^T * scale_log2 - lse_log2) in place, with keys past seqlen_k and (causal) above the
// diagonal at -inf, tested only where the block [m0, + block_m) x [n0, + block_n) crosses an
// edge; `lse` points at lse_log2 of this thread's first column (query rows past seqlen_q need no
// mask: their lse_log2 is +inf, so P = 0). The wgmma and ws backwards' plain path.
template <int N, bool CAUSAL>
__device__ __forceinline__ void scores_to_probabilities(float (&st)[N / 2],
                                                        const FlashjitAttentionParams& p,
                                                        int diagonal, int m0, int n0, int block_n,
                                                        int key, int query, const float* lse) {
  namespace fa = flashjit_attention;
  if (fa::block_needs_mask<CAUSAL>(p, diagonal, m0, n0, block_n)) {
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int last = fa::last_key<CAUSAL>(p, diagonal, query + 8 * nt + e);
#pragma unroll
        for (int half = 0; half < 2; ++half)
          if (key + 8 * half > last) st[4 * nt + 2 * half + e] = minus_infinity();
      }
  }
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) {
    const float2 l = *reinterpret_cast<const float2*>(lse + 8 * nt);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      st[4 * nt + 2 * half] = fast_exp2(fmaf(st[4 * nt + 2 * half], p.scale_log2, -l.x));
      st[4 * nt + 2 * half + 1] = fast_exp2(fmaf(st[4 * nt + 2 * half + 1], p.scale_log2, -l.y));
    }
  }
}

// dS^T = P^T * (dP^T - delta); P^T and dS^T rounded to 16 bits as A fragments, tile by tile (the
// fp32 values die as they are packed); `delta` points at this thread's first column's.
template <int N, bool IS_BF16>
__device__ __forceinline__ void probabilities_to_fragments(u32 (&pt)[N / 16][4],
                                                           u32 (&dst)[N / 16][4],
                                                           const float (&st)[N / 2],
                                                           const float (&dpt)[N / 2],
                                                           const float* delta) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) {
    const float2 d = *reinterpret_cast<const float2*>(delta + 8 * nt);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 4 * nt + 2 * half;
      const float ds0 = st[i] * (dpt[i] - d.x), ds1 = st[i + 1] * (dpt[i + 1] - d.y);
      pt[nt / 2][(nt % 2) * 2 + half] = pack2<IS_BF16>(st[i], st[i + 1]);
      dst[nt / 2][(nt % 2) * 2 + half] = pack2<IS_BF16>(ds0, ds1);
    }
  }
}

// The plain path of a step once S^T and then dP^T are issued (the last two wgmma groups): P^T as
// soon as S^T is in, dS^T once dP^T is, both as 16-bit A fragments (pt, dst). key, query: as
// scores_to_probabilities takes them; stats: the step's lse_log2 at this thread's first column
// (its delta BLOCK_M floats further on).
template <int N, int BLOCK_M, bool CAUSAL, bool IS_BF16>
__device__ __forceinline__ void scores_to_fragments(float (&st)[N / 2], float (&dpt)[N / 2],
                                                    u32 (&pt)[N / 16][4], u32 (&dst)[N / 16][4],
                                                    const FlashjitAttentionParams& p, int diagonal,
                                                    int m0, int n0, int block_n, int key, int query,
                                                    const float* stats) {
  wgmma_wait<1>();  // S^T
  pin(st);
  scores_to_probabilities<N, CAUSAL>(st, p, diagonal, m0, n0, block_n, key, query, stats);
  wgmma_wait<0>();  // dP^T
  pin(dpt);
  probabilities_to_fragments<N, IS_BF16>(pt, dst, st, dpt, stats + BLOCK_M);
}

// The same fragments into a swizzled [ROWS, *] shared tile at (row0 + rows, col0 + columns).
template <int N, int ROWS>
__device__ __forceinline__ void store_fragments(unsigned char* tile, const u32 (&a)[N / 16][4],
                                                int row0, int col0) {
  store_pairs<N, ROWS>(tile, row0, col0,
                       [&](int t, int half) { return a[t / 2][(t % 2) * 2 + half]; });
}

// ROWS rows of a swizzled shared tile to global memory (row r at out + r * row_stride), 16-byte
// stores by THREADS threads; rows at or past valid_rows and padding columns are not written.
template <int THREADS, int HEAD_DIM, int ROWS>
__device__ __forceinline__ void store_tile(u16* out, long long row_stride, int valid_rows,
                                           const unsigned char* tile) {
  constexpr int kChunksPerRow = (HEAD_DIM + 63) / 64 * 8;
  for (int copy = threadIdx.x; copy < ROWS * kChunksPerRow; copy += THREADS) {
    const int row = copy / kChunksPerRow, col = copy % kChunksPerRow * 8;
    if (row < valid_rows && col < HEAD_DIM)
      *reinterpret_cast<Vec16*>(out + row * row_stride + col) =
          *reinterpret_cast<const Vec16*>(tile + wg_tile_offset<ROWS>(row, col));
  }
}

// ---- the dK/dV kernel --------------------------------------------------------------------------

template <class K>
FLASHJIT_KERNEL_BODY(attention_backward_sm90_dkdv) {  // p (a variant: and its block map)
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kDp = K::kHeadDimPadded, kSdpN = K::kSdpN, kKvCols = K::kKvCols;
  constexpr int kKvChunk = K::kKvChunk, kKvChunks = K::kKvChunks, kDqN = K::kDqN;
  constexpr bool kBf16 = K::kIsBf16;

  // The launch's dynamic shared memory must hold the tiles (generator/backward_config_sm90.cpp
  // computes the same sum): trap rather than corrupt memory.
  if (dynamic_smem_bytes() < K::kSmemBytes) __trap();
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  const u32 base = (shared_address(shared_bytes) + 1023) & ~1023u;
  unsigned char* const smem = shared_bytes + (base - shared_address(shared_bytes));
  // Byte offsets from `base`:
  constexpr u32 kKTile = 0;                                     // K_j  [kBlockN, kDp]
  constexpr u32 kVTile = kKTile + K::kKvTileBytes;              // V_j  [kBlockN, kDp]
  constexpr u32 kQTiles = kVTile + K::kKvTileBytes;             // Q_i  kStages x [kBlockM, kDp]
  constexpr u32 kDoTiles = kQTiles + kStages * K::kQTileBytes;  // dO_i kStages x [kBlockM, kDp]
  constexpr u32 kDsTile = kDoTiles + kStages * K::kQTileBytes;  // dS^T [kBlockN, kBlockM]
  constexpr u32 kPTile = kDsTile + (K::kDsInSmem ? K::kScoreTileBytes : 0);  // P^T, same shape
  constexpr u32 kStats = kPTile + (K::kPInSmem ? K::kScoreTileBytes : 0);
  // kStats: kStages x {lse_log2[kBlockM], delta[kBlockM]} fp32
  constexpr u32 kDqStage = kStats + 2 * kStages * K::kStatBytes;  // Atomic: kDqTiles x [64, kDqN]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warpgroup = warp / 4;
  const int key_tile = warpgroup / K::kQuerySplit;    // this warpgroup's 64 keys of the block
  const int query_part = warpgroup % K::kQuerySplit;  // its S^T columns and dK/dV columns
  const int frag_row = (warp % 4) * 16 + lane / 4;    // accumulator row within the 64 (+ 8)
  const int frag_col = 2 * (lane % 4);                // accumulator column within 8 (+ 1)
  const int kv_head = blockIdx.y, batch = blockIdx.z;
  const int n0 = blockIdx.x * kBlockN;

  const u16* k = static_cast<const u16*>(p.k) + batch * p.k_batch_stride +
                 kv_head * p.k_head_stride + n0 * p.k_seq_stride;
  const u16* v = static_cast<const u16*>(p.v) + batch * p.v_batch_stride +
                 kv_head * p.v_head_stride + n0 * p.v_seq_stride;

  // The query blocks that see key block j: causal (bottom-right) row i sees key n0 iff
  // i >= n0 - diagonal, so they start at the block holding that row; every later one does too.
  namespace fa = flashjit_attention;
  const int diagonal = fa::diagonal(p);
#ifdef FLASHJIT_VARIANT
  // An attention variant (templates/attention_variant.h, rendered before this file; all its code
  // is under #ifdef FLASHJIT_VARIANT, so that plain kernels compile exactly as before): the query
  // blocks whose rows may see this key block (query_rows); per step, the scores per element, the
  // mask in blocks some row does not see whole, and dS times d score / d s (score_and_grad) where
  // that is not 1: then once both S^T and dP^T are in (no array of derivatives held across the
  // dP^T wgmma), else P^T while dP^T is in flight, as plain attention.
  namespace fv = flashjit_variant;
#if FLASHJIT_VARIANT_BLOCK_MASK
  // A mask_mod's block map: this key tile's non-empty query tiles (the transposed lists), head
  // after head of the group; step t is query_tiles.at(t), full tiles unmasked.
  const fv::GroupQueryTiles query_tiles(*block_mask, batch, kv_head * p.group_size, p.group_size,
                                        blockIdx.x);
  const int steps = query_tiles.steps;
  auto step_head = [&](int t) { return query_tiles.at(t).head; };
  auto step_m0 = [&](int t) { return query_tiles.at(t).tile * kBlockM; };
#else
  const fv::QueryRows query_rows = fv::query_rows(p, diagonal, n0, kBlockN);
  const int m_block_first = query_rows.first / kBlockM;
  const int m_blocks = query_rows.first < query_rows.last
                           ? (query_rows.last + kBlockM - 1) / kBlockM - m_block_first
                           : 0;
  const int steps = m_blocks * p.group_size;  // (query head, query block) pairs, block fastest
  auto step_head = [&](int t) { return kv_head * p.group_size + t / m_blocks; };
  auto step_m0 = [&](int t) { return (m_block_first + t % m_blocks) * kBlockM; };
#endif
#else
  const int m_blocks_total = (p.seqlen_q + kBlockM - 1) / kBlockM;
  int m_block_first = 0;
  if constexpr (K::kCausal) {
    const int first_row = n0 - diagonal;
    m_block_first = first_row <= 0 ? 0 : first_row / kBlockM;
    if (m_block_first > m_blocks_total) m_block_first = m_blocks_total;
  }
  const int m_blocks = m_blocks_total - m_block_first;
  const int steps = m_blocks * p.group_size;  // (query head, query block) pairs, block fastest
  auto step_head = [&](int t) { return kv_head * p.group_size + t / m_blocks; };
  auto step_m0 = [&](int t) { return (m_block_first + t % m_blocks) * kBlockM; };
#endif

  // Load group g carries step g's Q_i, dO_i, lse_log2_i, delta_i; group 0 also K_j and V_j.
  auto load_group = [&](int g) {
    if (g < steps) {
      const int head = step_head(g), m0 = step_m0(g), buffer = g % kStages;
      const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride +
                     head * p.q_head_stride + m0 * p.q_seq_stride;
      const u16* d_o = static_cast<const u16*>(p.d_o) + batch * p.do_batch_stride +
                       head * p.do_head_stride + m0 * p.do_seq_stride;
      wg_load_tile_async<K::kThreads, K::kHeadDim, kBlockM>(
          base + kQTiles + buffer * K::kQTileBytes, q, p.q_seq_stride, p.seqlen_q - m0);
      wg_load_tile_async<K::kThreads, K::kHeadDim, kBlockM>(
          base + kDoTiles + buffer * K::kQTileBytes, d_o, p.do_seq_stride, p.seqlen_q - m0);
      // lse_log2 and delta rows are padded to seqlen_q_rounded: whole blocks, no bounds.
      constexpr int kStatCopies = kBlockM / 4;  // 16-byte copies per vector
      if (threadIdx.x < 2 * kStatCopies) {
        const bool is_delta = threadIdx.x >= kStatCopies;
        const int c = threadIdx.x % kStatCopies;
        const long long row =
            (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0 + 4 * c;
        cp_async_16(base + kStats + (2 * buffer + is_delta) * K::kStatBytes + 16 * c,
                    (is_delta ? p.delta : p.lse_log2) + row, 16);
      }
    }
    cp_async_commit();
  };
  if (steps > 0) {
    wg_load_tile_async<K::kThreads, K::kHeadDim, kBlockN>(base + kKTile, k, p.k_seq_stride,
                                                          p.seqlen_k - n0);
    wg_load_tile_async<K::kThreads, K::kHeadDim, kBlockN>(base + kVTile, v, p.v_seq_stride,
                                                          p.seqlen_k - n0);
#pragma unroll
    for (int g = 0; g < kStages - 1; ++g) load_group(g);
  }

  // Descriptors (wgmma.cuh). S^T = K_w Q^T, dP^T = V_w dO^T: A = this warpgroup's 64 key rows,
  // B = its kSdpN query rows, both K-major over the head dim.
  const u64 k_rows = smem_descriptor(base + kKTile + key_tile * 64 * 128, 16, 1024);
  const u64 v_rows = smem_descriptor(base + kVTile + key_tile * 64 * 128, 16, 1024);
  const u64 q_rows = smem_descriptor(base + kQTiles + query_part * kSdpN * 128, 16, 1024);
  const u64 do_rows = smem_descriptor(base + kDoTiles + query_part * kSdpN * 128, 16, 1024);
  // dV += P^T dO, dK += dS^T Q: B = dO, Q MN-major over the queries, this warpgroup's columns.
  const u32 kv_col_block = query_part * (kKvCols / 64) * kBlockM * 128;
  const u64 do_cols = smem_descriptor(base + kDoTiles + kv_col_block, kBlockM * 128, 1024);
  const u64 q_cols = smem_descriptor(base + kQTiles + kv_col_block, kBlockM * 128, 1024);
  // (kQuerySplit == 2) A = P^T, dS^T from shared memory, K-major over the queries.
  const u64 pt_rows = smem_descriptor(base + kPTile + key_tile * 64 * 128, 16, 1024);
  const u64 dst_rows = smem_descriptor(base + kDsTile + key_tile * 64 * 128, 16, 1024);
  // dQ = dS K_j: A = dS, the MN-major view of dS^T; B = K_j MN-major over the keys.
  const u64 ds_cols = smem_descriptor(base + kDsTile, kBlockN * 128, 1024);
  const u64 k_cols = smem_descriptor(base + kKTile, kBlockN * 128, 1024);

  float dv[kKvChunks][kKvChunk / 2], dk[kKvChunks][kKvChunk / 2];  // fp32, 64 keys x kKvCols
  clear_kv(dv, dk);
  float st[kSdpN / 2], dpt[kSdpN / 2];        // S^T then P^T; dP^T then dS^T (fp32)
  u32 pt[kSdpN / 16][4], dst[kSdpN / 16][4];  // P^T, dS^T in 16 bits: A fragments
  float dq[kDqN / 2];                         // one dQ tile (Atomic)

  auto issue_sdp = [&](int buffer) {  // S^T = K_w Q_i^T, then dP^T = V_w dO_i^T
    const u32 rows = buffer * K::kQTileBytes;
    wgmma_over_head_dim<kSdpN, kDp, kBlockN, kBlockM, kBf16>(st, k_rows, q_rows, rows);
    wgmma_over_head_dim<kSdpN, kDp, kBlockN, kBlockM, kBf16>(dpt, v_rows, do_rows, rows);
  };
  // d[:, this warpgroup's columns] += A^T-rows x B over the kBlockM queries of the step: A from
  // registers (fragments) or from shared memory (descriptor a_rows), B = dO_i or Q_i MN-major.
  auto issue_kv = [&](float(&d)[kKvChunks][kKvChunk / 2], const u32(&a)[kSdpN / 16][4], u64 a_rows,
                      u64 b_cols, int buffer) {
    if constexpr (K::kKvFromRegisters) {
      wgmma_pv<kBlockM, kKvChunk, kBf16>(d, a, b_cols, buffer * K::kQTileBytes);
    } else {
#pragma unroll
      for (int s = 0; s < kBlockM / 16; ++s)  // 16 queries per step
#pragma unroll
        for (int c = 0; c < kKvChunks; ++c)
          Wgmma<kKvChunk, kBf16>::template ss<0, 1>(
              d[c], advance(a_rows, (s / 4) * (kBlockN * 128) + (s % 4) * 32),
              advance(b_cols,
                      buffer * K::kQTileBytes + s * 16 * 128 + c * (kKvChunk / 64) * kBlockM * 128),
              1);
      wgmma_commit();
    }
  };
  auto issue_dq = [&](int tile) {  // dQ tile = dS[64 rows of tile] K_j[:, its columns]
    const int mt = tile / K::kDqColTiles, nc = tile % K::kDqColTiles;
    wgmma_over_keys<kBlockN, kDqN, kBf16>(dq, ds_cols, mt * kBlockN * 128, k_cols,
                                          nc * (kDqN / 64) * kBlockN * 128);
  };
  // (Atomic) This thread's share of a dQ tile into the tile's staging rows, fp32.
  auto stage_dq = [&](int tile) {
    const u32 stage = base + kDqStage + tile * K::kDqStageTileBytes +
                      frag_row * K::kDqStageRowBytes + frag_col * 4;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int t = 0; t < kDqN / 8; ++t) {
        const u32 at = stage + 8 * half * K::kDqStageRowBytes + 32 * t;
        store_shared_u32(at, __float_as_uint(dq[4 * t + 2 * half]));
        store_shared_u32(at + 4, __float_as_uint(dq[4 * t + 2 * half + 1]));
      }
  };
  // (Atomic) dq_accum[rows, columns of tile] += the staged tiles of this warpgroup: its first 64
  // threads, one row each, one bulk group a step. Rows past seqlen_q (the last block's) add zeros
  // into the accumulator's padding rows.
  // (Recomputed at each use, not held through the loop: these kernels are at 255 registers.)
  auto dq_issuer = [] { return threadIdx.x % 128 < 64; };
  auto reduce_dq = [&](int head, int m0) {
    const int dq_row = threadIdx.x % 128;
#pragma unroll
    for (int i = 0; i < K::kDqTilesPerWarpgroup; ++i) {
      const int tile = warpgroup * K::kDqTilesPerWarpgroup + i;
      const int mt = tile / K::kDqColTiles, nc = tile % K::kDqColTiles;
      float* accum = p.dq_accum +
                     ((static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0 +
                      mt * 64 + dq_row) *
                         kDp +
                     nc * kDqN;
      bulk_reduce_add_f32(
          accum, base + kDqStage + tile * K::kDqStageTileBytes + dq_row * K::kDqStageRowBytes,
          kDqN * 4);
    }
    bulk_commit_group();
  };

  for (int t = 0; t < steps; ++t) {
    const int head = step_head(t), m0 = step_m0(t), buffer = t % kStages;
    cp_async_wait<kStages - 2>();  // this thread's copies of group t have landed
    fence_proxy_async();           // ... and are visible to wgmma
    // (Atomic) Step t - 1's bulk reductions have read their staging rows: free after the barrier.
    if constexpr (K::kDqAtomic)
      if (dq_issuer()) bulk_wait_group_read<0>();
    __syncthreads();              // everyone's have; every wgmma of step t - 1 is done
    load_group(t + kStages - 1);  // refill the buffer step t - 1 read

    wgmma_fence();
    issue_sdp(buffer);
#ifdef FLASHJIT_VARIANT
    const float* stats = reinterpret_cast<const float*>(smem + kStats + 2 * buffer * K::kStatBytes);
    const int stat_col = query_part * kSdpN + frag_col;
    {
      const float slope = fv::alibi_slope(p, head);
#if FLASHJIT_VARIANT_BLOCK_MASK
      const bool all_visible = query_tiles.at(t).full;  // the map's full tiles: no mask
#else
      const bool all_visible = fv::block_fully_visible(p, diagonal, m0, kBlockM, n0, kBlockN);
#endif
      const float scale_log2 = fv::softmax_scale_log2(p);
      const int key = n0 + key_tile * 64 + frag_row;  // + 8 half
      const int query = m0 + stat_col;                // + 8 nt + e
      // key - query as a float once: ALiBi's distance is then one add of a constant per score.
      const float distance0 = static_cast<float>(key - query);
      // P^T = exp2(score - lse) per score: the variant's score of scale * q . k, -inf where the
      // key is hidden. dS^T picks up g = d score / d s per score where it is not 1 (chain); else
      // P^T is formed while dP^T is still on the tensor cores, as for plain attention, and blocks
      // every row sees whole skip the mask test (masked a constant at each call: one loop per
      // case, no per-score test evaluated and discarded).
      auto scores = [&](bool masked, bool chain) {
#pragma unroll
        for (int nt = 0; nt < kSdpN / 8; ++nt) {
          const float2 lse = *reinterpret_cast<const float2*>(stats + stat_col + 8 * nt);
          const float2 delta =
              *reinterpret_cast<const float2*>(stats + kBlockM + stat_col + 8 * nt);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float ds[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int i = 4 * nt + 2 * half + e, row = query + 8 * nt + e, col = key + 8 * half;
              float score = st[i], g = 1.f;
              if (fv::kModifiesScores)
                score =
                    fv::score_and_grad(score * p.scale, slope, batch, head, row, col,
                                       distance0 + static_cast<float>(8 * half - 8 * nt - e), &g);
              if (masked && !fv::visible(p, diagonal, batch, head, row, col))
                score = minus_infinity();
              st[i] = fast_exp2(fmaf(score, scale_log2, -(e == 0 ? lse.x : lse.y)));
              if (chain) ds[e] = st[i] * (dpt[i] - (e == 0 ? delta.x : delta.y)) * g;
            }
            if (chain) {
              pt[nt / 2][(nt % 2) * 2 + half] =
                  pack2<kBf16>(st[4 * nt + 2 * half], st[4 * nt + 2 * half + 1]);
              dst[nt / 2][(nt % 2) * 2 + half] = pack2<kBf16>(ds[0], ds[1]);
            }
          }
        }
      };
      if constexpr (fv::kScoreGradIsOne) {
        wgmma_wait<1>();  // S^T
        pin(st);
        if (all_visible)
          scores(false, false);
        else
          scores(true, false);
        wgmma_wait<0>();  // dP^T
        pin(dpt);
        // dS^T as the plain path below forms it.
        probabilities_to_fragments<kSdpN, kBf16>(pt, dst, st, dpt, stats + kBlockM + stat_col);
      } else {
        wgmma_wait<0>();  // S^T and dP^T: g is not held across the wait
        pin(st);
        pin(dpt);
        scores(!all_visible, true);  // one loop: two spill at m128n64 (d 64)
      }
    }
#else
    // P^T = exp2(S^T * scale_log2 - lse), masked in blocks that cross an edge; then dS^T.
    const float* stats = reinterpret_cast<const float*>(smem + kStats + 2 * buffer * K::kStatBytes);
    const int stat_col = query_part * kSdpN + frag_col;
    scores_to_fragments<kSdpN, kBlockM, K::kCausal, kBf16>(st, dpt, pt, dst, p, diagonal, m0, n0,
                                                           kBlockN, n0 + key_tile * 64 + frag_row,
                                                           m0 + stat_col, stats + stat_col);
#endif
    const int score_row = key_tile * 64, score_col = query_part * kSdpN;
    if constexpr (K::kDsInSmem)
      store_fragments<kSdpN, kBlockN>(smem + kDsTile, dst, score_row, score_col);
    if constexpr (K::kPInSmem)
      store_fragments<kSdpN, kBlockN>(smem + kPTile, pt, score_row, score_col);
    if constexpr (K::kPInSmem || K::kDqAtomic) {
      fence_proxy_async();  // this thread's P^T / dS^T stores, visible to wgmma ...
      __syncthreads();      // ... once every thread's are there
    }
    wgmma_fence();  // pt, dst (written above) are ready for the tensor cores
    issue_kv(dv, pt, pt_rows, do_cols, buffer);  // dV += P^T dO_i
    if constexpr (K::kDqAtomic) {
      // dK, then the first dQ tile, all in flight together; the tile is staged after the wait.
      // Waiting for dK as well frees P^T and dS^T before the stores: with the stores overlapping
      // dK instead, ptxas spilled at block_m = 128 (with the red.global adds of before).
      issue_kv(dk, dst, dst_rows, q_cols, buffer);  // dK += dS^T Q_i
      issue_dq(warpgroup * K::kDqTilesPerWarpgroup);
      wgmma_wait<0>();
      pin(pt);
      pin(dst);
      pin(dq);
      stage_dq(warpgroup * K::kDqTilesPerWarpgroup);
#pragma unroll
      for (int i = 1; i < K::kDqTilesPerWarpgroup; ++i) {
        wgmma_fence();  // dq was read above
        issue_dq(warpgroup * K::kDqTilesPerWarpgroup + i);
        wgmma_wait<0>();
        pin(dq);
        stage_dq(warpgroup * K::kDqTilesPerWarpgroup + i);
      }
      fence_proxy_async();  // the staged rows, visible to the bulk reductions ...
      __syncthreads();      // ... once every thread's are there
      if (dq_issuer()) reduce_dq(head, m0);
    } else {
      issue_kv(dk, dst, dst_rows, q_cols, buffer);
    }
    wgmma_wait<0>();
    pin(pt);
    pin(dst);
    pin_kv(dv, dk);
  }
  if constexpr (K::kDqAtomic)
    if (dq_issuer()) bulk_wait_group<0>();  // the last step's adds are done before the CTA ends
  cp_async_wait<0>();
  __syncthreads();  // every wgmma read of K_j, V_j is done: their tiles take dK, dV

  // Epilogue: dK *= scale; both rounded into the K and V tiles, then 16-byte row stores.
  const int kv_row = key_tile * 64, kv_col = query_part * kKvCols;
#pragma unroll
  for (int c = 0; c < kKvChunks; ++c) {
    store_accumulator<kKvChunk, kBlockN, kBf16>(smem + kKTile, dk[c], kv_row, kv_col + c * kKvChunk,
                                                p.scale);
    store_accumulator<kKvChunk, kBlockN, kBf16>(smem + kVTile, dv[c], kv_row, kv_col + c * kKvChunk,
                                                1.f);
  }
  __syncthreads();
  u16* dk_out = static_cast<u16*>(p.dk) + batch * p.dk_batch_stride + kv_head * p.dk_head_stride +
                n0 * p.dk_seq_stride;
  u16* dv_out = static_cast<u16*>(p.dv) + batch * p.dv_batch_stride + kv_head * p.dv_head_stride +
                n0 * p.dv_seq_stride;
  store_tile<K::kThreads, K::kHeadDim, kBlockN>(dk_out, p.dk_seq_stride, p.seqlen_k - n0,
                                                smem + kKTile);
  store_tile<K::kThreads, K::kHeadDim, kBlockN>(dv_out, p.dv_seq_stride, p.seqlen_k - n0,
                                                smem + kVTile);
}

}  // namespace flashjit_kernel
