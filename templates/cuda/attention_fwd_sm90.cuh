// FlashAttention forward for Hopper (sm_90a: H100, H200): warpgroup MMA (wgmma) reading Q, K
// and V straight from shared memory, P from registers. The renderer prepends
// templates/attention_params.h, templates/attention_common.h (key range, masking and LSE rules),
// cuda/common.cuh, cuda/wgmma.cuh (wgmma wrappers) and cuda/sm90_tiles.cuh (swizzled tiles),
// and appends one instantiation; NVRTC compiles it for sm_90a (wgmma exists on sm_90a only).
//
// One CTA computes O for kBlockM = 64 * kWarpgroups query rows of one (batch, head). Each
// warpgroup (4 warps, 128 threads) owns 64 rows end to end; each warp 16 of them.
//
// clang-format off
//   load Q tile                               Q: [kBlockM, d] -> shared (wgmma layout, below)
//   m = -inf, l = 0, O = 0                    per row, fp32, in registers
//   S = Q K_0^T                               issued, waited
//   for j = 0 .. n-1:
//     issue S' = Q K_{j+1}^T  (if j+1 < n)     async on the tensor cores ...
//     issue O += P_{j-1} V_{j-1} (if j > 0)    ... both in flight
//     softmax of S_j -> P_j, m, l             CUDA cores, overlapped with the two MMAs above
//     wait; O *= exp2(m_old - m_new)           (the P V of block j-1 used the old max)
//   O += P_{n-1} V_{n-1}; O /= l; LSE
// clang-format on
//
// The loop below runs that schedule one block shifted: iteration j issues S_j and P_{j-1} V_{j-1}
// together, then does S_j's softmax while P_{j-1} V_{j-1} runs. K_j and V_{j-1} are read in the
// same iteration, so each load group carries {K_j, V_{j-1}} and K and V keep kStages buffers each.
//
// Shared tiles use wgmma's 128-byte swizzled layout (cuda/sm90_tiles.cuh):
// Q and K are K-major operands as stored; V, stored the same way, is the N-major ("transposed")
// B operand of P V.
//
// An attention variant (FLASHJIT_VARIANT: templates/attention_variant.h, rendered before this
// file) changes what it changes in the mma family (cuda/attention_fwd.cuh), through the same
// functions: the j-th block visited is the variant's key_blocks.at(j) (hidden blocks are never
// loaded), its mask replaces the causal one in softmax(), and when it modifies the scores every
// score passes through it as scale * q . k (the softmax then works with log2(e) alone).

namespace flashjit_kernel {

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool IS_BF16, bool CAUSAL>
struct Sm90Traits {
  // kHeadDimPadded: whole 64-column blocks.
  FLASHJIT_TRAITS_SHAPE(HEAD_DIM, (HEAD_DIM + 63) / 64 * 64, BLOCK_M, BLOCK_N, WARPS, STAGES,
                        IS_BF16, CAUSAL);

  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpgroups = kWarps / 4;
  static constexpr int kNTiles = kBlockN / 8;               // 8-key column tiles of S
  static constexpr int kChunksPerRow = kHeadDimPadded / 8;  // 16-byte chunks per row
  // P V is issued in N-chunks of the head dim: one wgmma up to n128.
  static constexpr int kPvChunk = kHeadDimPadded % 128 == 0 ? 128 : 64;
  static constexpr int kPvChunks = kHeadDimPadded / kPvChunk;
  static constexpr int kQTileBytes = kBlockM * kHeadDimPadded * 2;
  static constexpr int kKvTileBytes = kBlockN * kHeadDimPadded * 2;
  // + 1024: the dynamic shared window is rounded up to a swizzle atom.
  static constexpr int kSmemBytes = 1024 + kQTileBytes + 2 * kStages * kKvTileBytes;

  static_assert(kWarps % 4 == 0 && kBlockM == 16 * kWarps, "64 query rows per warpgroup");
  static_assert(kBlockN == 64 || kBlockN == 128, "S = Q K^T is one m64n64 or m64n128 wgmma");
  static_assert(kStages >= 2 && kStages <= 3, "2 or 3 K and V buffers");
  static_assert((kBlockN * kChunksPerRow) % kThreads == 0, "K/V tile copies split evenly");
  static_assert((kBlockM * kChunksPerRow) % kThreads == 0, "Q tile copies split evenly");
  static_assert((16 * kChunksPerRow) % 32 == 0, "O row copies split over a warp");
};

// ---- the kernel --------------------------------------------------------------------------------

template <class K>
__device__ __forceinline__ void attention_forward_sm90(const FlashjitAttentionParams& p) {
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kNTiles = K::kNTiles, kDp = K::kHeadDimPadded;
  constexpr int kPvChunk = K::kPvChunk, kPvChunks = K::kPvChunks;

  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  // Swizzle atoms start on 1024-byte boundaries; the descriptors assume it (base offset 0).
  const u32 q_tile = (shared_address(shared_bytes) + 1023) & ~1023u;  // [kBlockM, kDp]
  const u32 k_tiles = q_tile + K::kQTileBytes;                        // kStages x [kBlockN, kDp]
  const u32 v_tiles = k_tiles + kStages * K::kKvTileBytes;            // kStages x [kBlockN, kDp]
  unsigned char* q_tile_pointer = shared_bytes + (q_tile - shared_address(shared_bytes));

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warpgroup = warp / 4;
  // Causal rows near the end see the most keys: launch them first so the tail is short.
  const int m_block = K::kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / p.group_size;
  const int m0 = m_block * kBlockM;
  const int warp_row0 = warp * 16;  // first row of this warp within the block

  FLASHJIT_FORWARD_TENSORS(p, batch, head, kv_head, m0);  // q, k, v, o, lse

  // Causal, bottom-right aligned: row i sees keys j <= i + diagonal (attention_common.h).
  namespace fa = flashjit_attention;
  const int diagonal = fa::diagonal(p);
#ifdef FLASHJIT_VARIANT
  namespace fv = flashjit_variant;
  // The variant's key blocks: the t-th block visited is key_blocks.at(t).
  const fv::KeyBlocks key_blocks = fv::key_blocks(p, diagonal, m0, kBlockM, kBlockN);
  const int n_blocks = key_blocks.count();
#define FLASHJIT_KEY_BLOCK(t) key_blocks.at(t)
  const float slope = fv::alibi_slope(p, head);
  // Modified scores are scaled scores: the softmax's factor is log2(e) alone.
  const float variant_scale_log2 = fv::kModifiesScores ? 1.4426950408889634f : p.scale_log2;
#define FLASHJIT_SCALE_LOG2 variant_scale_log2
#else
  const int n_blocks = fa::key_blocks<K::kCausal>(p, diagonal, m0, kBlockM, kBlockN);
#define FLASHJIT_KEY_BLOCK(t) (t)
// (Macros, as in the mma family: plain kernels compile exactly as before variants.)
#define FLASHJIT_SCALE_LOG2 p.scale_log2
#endif

  // Accumulator layout (per warp, as mma.sync m16n8 tiles): lane holds rows lane/4 and
  // lane/4 + 8, columns 2 * (lane % 4) + {0, 1} of each 8-column tile.
  const int frag_row = lane / 4;
  const int frag_col = 2 * (lane % 4);

  // Descriptors of this warpgroup's 64 Q rows and of K/V buffer 0.
  const u64 q_desc = smem_descriptor(q_tile + warpgroup * 64 * 128, 16, 1024);
  const u64 k_desc0 = smem_descriptor(k_tiles, 16, 1024);
  const u64 v_desc0 = smem_descriptor(v_tiles, kBlockN * 128, 1024);

  float acc[kPvChunks][kPvChunk / 2];  // O: [16 rows of this warp, kDp], fp32
  float s[kNTiles * 4];                // S: [16 rows, kBlockN], fp32
  u32 p_prev[kBlockN / 16][4];         // P of the previous block: A fragments per 16-key step
  float row_max[2], row_sum[2];        // m (raw score units) and this lane's partial l
#pragma unroll
  for (int c = 0; c < kPvChunks; ++c)
#pragma unroll
    for (int i = 0; i < kPvChunk / 2; ++i) acc[c][i] = 0.f;
#pragma unroll
  for (int t = 0; t < kBlockN / 16; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) p_prev[t][e] = 0u;
  row_max[0] = row_max[1] = minus_infinity();
  row_sum[0] = row_sum[1] = 0.f;

  // Load group g carries K_g and V_{g-1} (what iteration g reads); group 0 also carries Q.
  auto load_group = [&](int g) {
    if (g < n_blocks) {
      const int n0 = FLASHJIT_KEY_BLOCK(g) * kBlockN;
      wg_load_tile_async<K::kThreads, K::kHeadDim, kBlockN>(
          k_tiles + (g % kStages) * K::kKvTileBytes, k + n0 * p.k_seq_stride, p.k_seq_stride,
          p.seqlen_k - n0);
    }
    if (g >= 1 && g - 1 < n_blocks) {
      const int n0 = FLASHJIT_KEY_BLOCK(g - 1) * kBlockN;
      wg_load_tile_async<K::kThreads, K::kHeadDim, kBlockN>(
          v_tiles + ((g - 1) % kStages) * K::kKvTileBytes, v + n0 * p.v_seq_stride, p.v_seq_stride,
          p.seqlen_k - n0);
    }
    cp_async_commit();
  };
  if (n_blocks > 0) {
    wg_load_tile_async<K::kThreads, K::kHeadDim, kBlockM>(q_tile, q, p.q_seq_stride,
                                                          p.seqlen_q - m0);
#pragma unroll
    for (int g = 0; g < kStages - 1; ++g) load_group(g);
  }

  // Iteration j reads K_j (S_j = Q K_j^T) and V_{j-1} (O += P_{j-1} V_{j-1}). Its first
  // (j = 0: no P V yet) and last (j = n: no S) are peeled off, so that every wgmma below is
  // unconditional: ptxas serializes all wgmmas of a kernel where a branch leaves it unsure which
  // accumulators are in flight.
  auto wait_for_group = [&](int j) {
    cp_async_wait<kStages - 2>();  // this thread's copies of group j have landed
    fence_proxy_async();           // ... and are visible to wgmma
    __syncthreads();               // everyone's have; every wgmma of iteration j - 1 is done
    // Refill: K_{j+S-1} replaces K_{j-1}, V_{j+S-2} replaces V_{j-2}; both were read last time.
    load_group(j + kStages - 1);
  };
  auto issue_s = [&](int j) {  // S = Q K_j^T
    // (The buffer's offset in the descriptor, not in b_offset: the plain kernels compile as when
    // this loop was the forward's own.)
    wgmma_over_head_dim<kBlockN, kDp, kBlockM, kBlockN, K::kIsBf16>(
        s, q_desc, advance(k_desc0, (j % kStages) * K::kKvTileBytes), 0);
  };
  auto issue_pv = [&](int j) {  // O += P_j V_j
    wgmma_pv<kBlockN, kPvChunk, K::kIsBf16>(acc, p_prev,
                                            advance(v_desc0, (j % kStages) * K::kKvTileBytes));
  };
  // Mask S_j, fold it into m and l, write P_j to p_next; returns the rescale factor of O per half.
  u32 p_next[kBlockN / 16][4];
  float correction[2];
  auto softmax = [&](int j) {
    const int n0 = FLASHJIT_KEY_BLOCK(j) * kBlockN;
#ifdef FLASHJIT_VARIANT
    // The variant's scores and mask, per element, in the blocks that need either. (One loop: the
    // mma and -ws families' two, masked and not, spilled here with softcap + ALiBi at m64n128.)
    const bool all_visible = fv::block_fully_visible(p, diagonal, m0, kBlockM, n0, kBlockN);
    if (fv::kModifiesScores || !all_visible) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + warp_row0 + frag_row + half * 8;
        const float distance0 = static_cast<float>(n0 + frag_col - row);  // key - row at nt, e 0
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = n0 + nt * 8 + frag_col + e;
            float& score = s[nt * 4 + 2 * half + e];
            if (fv::kModifiesScores)
              score = fv::score(score * p.scale, slope, batch, head, row, key,
                                distance0 + static_cast<float>(nt * 8 + e));
            if (!all_visible && !fv::visible(p, diagonal, batch, head, row, key))
              score = minus_infinity();
          }
      }
    }
#else
    // Keys past seqlen_k and, when causal, above the diagonal: only blocks crossing an edge.
    if (fa::block_needs_mask<K::kCausal>(p, diagonal, m0, n0, kBlockN)) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + warp_row0 + frag_row + half * 8;
        const int limit = fa::last_key<K::kCausal>(p, diagonal, row) - (n0 + frag_col);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (nt * 8 + e > limit) s[nt * 4 + 2 * half + e] = minus_infinity();
      }
    }
#endif
    // Online softmax, base 2, scale folded into one FMA per score; P packed to 16 bits.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float max_scaled =
          online_max_step(row_max[half], s, half, FLASHJIT_SCALE_LOG2, correction[half]);
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const float p0 = fast_exp2(fmaf(s[nt * 4 + 2 * half], FLASHJIT_SCALE_LOG2, -max_scaled));
        const float p1 =
            fast_exp2(fmaf(s[nt * 4 + 2 * half + 1], FLASHJIT_SCALE_LOG2, -max_scaled));
        sum += p0 + p1;
        // Key tiles (2t, 2t + 1) form k-step t's A fragment: {row, row + 8} x {tile 2t, 2t + 1}.
        p_next[nt / 2][(nt % 2) * 2 + half] = pack2<K::kIsBf16>(p0, p1);
      }
      row_sum[half] = row_sum[half] * correction[half] + sum;
    }
  };
  auto rescale_and_advance = [&] {  // O *= correction (P V of the old max is done); P_prev = P
#pragma unroll
    for (int c = 0; c < kPvChunks; ++c)
#pragma unroll
      for (int i = 0; i < kPvChunk / 2; ++i) acc[c][i] *= correction[(i / 2) % 2];
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) p_prev[t][e] = p_next[t][e];
  };

  if (n_blocks > 0) {
    wait_for_group(0);  // S_0
    wgmma_fence();
    issue_s(0);
    wgmma_wait<0>();
    pin(s);
    softmax(0);
    rescale_and_advance();
    for (int j = 1; j < n_blocks; ++j) {  // S_j with P_{j-1} V_{j-1} in flight
      wait_for_group(j);
      wgmma_fence();  // acc (rescaled) and p_prev (written) are ready for the tensor cores
      issue_s(j);
      issue_pv(j - 1);
      wgmma_wait<1>();  // S_j is done; P_{j-1} V_{j-1} may still run
      pin(s);
      softmax(j);
      wgmma_wait<0>();  // P_{j-1} V_{j-1} is done: acc holds blocks < j at the old max
      pin(p_prev);
#pragma unroll
      for (int c = 0; c < kPvChunks; ++c) pin(acc[c]);
      rescale_and_advance();
    }
    wait_for_group(n_blocks);  // P_{n-1} V_{n-1}
    wgmma_fence();
    issue_pv(n_blocks - 1);
    wgmma_wait<0>();
    pin(p_prev);
#pragma unroll
    for (int c = 0; c < kPvChunks; ++c) pin(acc[c]);
  }
  cp_async_wait<0>();

  // Epilogue: O = acc / l into this warp's own rows of the Q tile (only its warpgroup's wgmmas
  // read those rows, all finished), then 16-byte coalesced stores. LSE from the quad leaders.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float sum = quad_sum(row_sum[half]);
    const float inverse = sum > 0.f ? 1.f / sum : 0.f;  // a row with no keys: O = 0
    const int row = warp_row0 + frag_row + half * 8;
#pragma unroll
    for (int c = 0; c < kPvChunks; ++c)
#pragma unroll
      for (int dt = 0; dt < kPvChunk / 8; ++dt) {
        const u32 packed = pack2<K::kIsBf16>(acc[c][dt * 4 + 2 * half] * inverse,
                                             acc[c][dt * 4 + 2 * half + 1] * inverse);
        const int col = c * kPvChunk + dt * 8 + frag_col;
        *reinterpret_cast<u32*>(q_tile_pointer + wg_tile_offset<kBlockM>(row, col)) = packed;
      }
    if (lse && lane % 4 == 0 && m0 + row < p.seqlen_q) {
      lse[m0 + row] = fa::row_lse(row_max[half], FLASHJIT_SCALE_LOG2, sum,
                                  [](float x) { return fast_log2(x); });
    }
  }
  __syncwarp();
  FLASHJIT_WARP_STORE_ROWS(16, K::kChunksPerRow, K::kHeadDim, o, p.o_seq_stride, lane, warp_row0,
                           m0, p.seqlen_q, q_tile_pointer + wg_tile_offset<kBlockM>(row, col));
#undef FLASHJIT_KEY_BLOCK
#undef FLASHJIT_SCALE_LOG2
}

#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_VARLEN
// Packed variable-length documents, as the mma family's attention_forward_varlen: the CTA of
// (m_block, head, document blockIdx.z) runs the kernel above on the document's view of the params
// (every load and store is a cp.async or a plain access bounded by the document's lengths, so
// none crosses into another document).
FLASHJIT_FORWARD_DOCUMENT_ENTRY(attention_forward_sm90)
#endif
#endif
}  // namespace flashjit_kernel
