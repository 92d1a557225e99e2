// The wgmma backward's dQ kernel (DqMode::Separate, the -det configs): S and dP recomputed per key
// block, dQ_i += dS K_j in registers. The renderer places it after cuda/attention_bwd_sm90.cuh,
// whose traits (Sm90BwdTraits), tile helpers and conventions it uses; the algorithm is described
// at the top of that file.

namespace flashjit_kernel {

// ---- the dQ kernel (DqMode::Separate) ----------------------------------------------------------

template <class K>
FLASHJIT_KERNEL_BODY(attention_backward_sm90_dq) {  // p (a variant: and its block map)
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kDp = K::kHeadDimPadded, kDqChunk = K::kDqChunk, kDqChunks = K::kDqChunks;
  constexpr int kThreads = K::kDqThreads;
  constexpr bool kBf16 = K::kIsBf16;

  if (dynamic_smem_bytes() < K::kDqSmemBytes) __trap();
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  const u32 base = (shared_address(shared_bytes) + 1023) & ~1023u;
  constexpr u32 kQTile = 0;                                     // Q_i  [kBlockM, kDp]
  constexpr u32 kDoTile = kQTile + K::kQTileBytes;              // dO_i [kBlockM, kDp]
  constexpr u32 kKTiles = kDoTile + K::kQTileBytes;             // K_j  kStages x [kBlockN, kDp]
  constexpr u32 kVTiles = kKTiles + kStages * K::kKvTileBytes;  // V_j  kStages x [kBlockN, kDp]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warpgroup = warp / 4;
  const int frag_col = 2 * (lane % 4);
  // Causal rows near the end see the most keys: launch them first so the tail is short.
  const int m_block = K::kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / p.group_size;
  const int m0 = m_block * kBlockM;
  const int row = m0 + warp * 16 + lane / 4;  // this thread's rows: row, row + 8

  const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                 m0 * p.q_seq_stride;
  const u16* d_o = static_cast<const u16*>(p.d_o) + batch * p.do_batch_stride +
                   head * p.do_head_stride + m0 * p.do_seq_stride;
  const u16* k =
      static_cast<const u16*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
  const u16* v =
      static_cast<const u16*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;

  namespace fa = flashjit_attention;
  const int diagonal = fa::diagonal(p);
#ifdef FLASHJIT_VARIANT
  // An attention variant: the key blocks its rows may see (key_blocks), the scores and the mask
  // per element, dS times d score / d s (as the dK/dV kernel).
  namespace fv = flashjit_variant;
#if FLASHJIT_VARIANT_BLOCK_MASK
  // A mask_mod's block map: this query tile's non-empty key tiles, full ones unmasked.
  const fv::BlockList key_blocks = fv::key_tiles_of(*block_mask, batch, head, m_block);
#else
  const fv::KeyBlocks key_blocks = fv::key_blocks(p, diagonal, m0, kBlockM, kBlockN);
#endif
  const int n_blocks = key_blocks.count();
  const float slope = fv::alibi_slope(p, head);
#else
  const int n_blocks = fa::key_blocks<K::kCausal>(p, diagonal, m0, kBlockM, kBlockN);
#endif

  // Rows are padded to seqlen_q_rounded (>= m0 + kBlockM): no bounds checks.
  const long long stat_row =
      (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q_rounded + row;
  const float lse[2] = {p.lse_log2[stat_row], p.lse_log2[stat_row + 8]};
  const float delta[2] = {p.delta[stat_row], p.delta[stat_row + 8]};

#ifdef FLASHJIT_VARIANT
  auto load_group = [&](int g) {  // the g-th key block visited; group 0 also Q_i and dO_i
    if (g < n_blocks) {
      const int buffer = g % kStages, n0 = key_blocks.at(g) * kBlockN;
      wg_load_tile_async<kThreads, K::kHeadDim, kBlockN>(base + kKTiles + buffer * K::kKvTileBytes,
                                                         k + n0 * p.k_seq_stride, p.k_seq_stride,
                                                         p.seqlen_k - n0);
      wg_load_tile_async<kThreads, K::kHeadDim, kBlockN>(base + kVTiles + buffer * K::kKvTileBytes,
                                                         v + n0 * p.v_seq_stride, p.v_seq_stride,
                                                         p.seqlen_k - n0);
    }
    cp_async_commit();
  };
#else
  auto load_group = [&](int g) {  // K_g and V_g; group 0 also Q_i and dO_i
    if (g < n_blocks) {
      const int buffer = g % kStages;
      wg_load_tile_async<kThreads, K::kHeadDim, kBlockN>(base + kKTiles + buffer * K::kKvTileBytes,
                                                         k + g * kBlockN * p.k_seq_stride,
                                                         p.k_seq_stride, p.seqlen_k - g * kBlockN);
      wg_load_tile_async<kThreads, K::kHeadDim, kBlockN>(base + kVTiles + buffer * K::kKvTileBytes,
                                                         v + g * kBlockN * p.v_seq_stride,
                                                         p.v_seq_stride, p.seqlen_k - g * kBlockN);
    }
    cp_async_commit();
  };
#endif
  if (n_blocks > 0) {
    wg_load_tile_async<kThreads, K::kHeadDim, kBlockM>(base + kQTile, q, p.q_seq_stride,
                                                       p.seqlen_q - m0);
    wg_load_tile_async<kThreads, K::kHeadDim, kBlockM>(base + kDoTile, d_o, p.do_seq_stride,
                                                       p.seqlen_q - m0);
#pragma unroll
    for (int g = 0; g < kStages - 1; ++g) load_group(g);
  }

  // S = Q_i K_j^T, dP = dO_i V_j^T: A = this warpgroup's 64 rows, B = the key rows, K-major.
  // dQ += dS K_j: A = dS from registers, B = K_j MN-major over the keys.
  const u64 q_rows = smem_descriptor(base + kQTile + warpgroup * 64 * 128, 16, 1024);
  const u64 do_rows = smem_descriptor(base + kDoTile + warpgroup * 64 * 128, 16, 1024);
  const u64 k_rows = smem_descriptor(base + kKTiles, 16, 1024);
  const u64 v_rows = smem_descriptor(base + kVTiles, 16, 1024);
  const u64 k_cols = smem_descriptor(base + kKTiles, kBlockN * 128, 1024);

  float dq[kDqChunks][kDqChunk / 2];  // fp32, 64 rows x kDp
#pragma unroll
  for (int c = 0; c < kDqChunks; ++c)
#pragma unroll
    for (int i = 0; i < kDqChunk / 2; ++i) dq[c][i] = 0.f;
  float s[kBlockN / 2], dp[kBlockN / 2];  // S then P; dP then dS (fp32)
  u32 ds[kBlockN / 16][4];                // dS in 16 bits: A fragments

  for (int j = 0; j < n_blocks; ++j) {
    const int buffer = j % kStages;
    cp_async_wait<kStages - 2>();
    fence_proxy_async();
    __syncthreads();  // K_j, V_j landed everywhere; every wgmma of step j - 1 is done
    load_group(j + kStages - 1);

    wgmma_fence();
    const u32 kv = buffer * K::kKvTileBytes;
    wgmma_over_head_dim<kBlockN, kDp, kBlockM, kBlockN, kBf16>(s, q_rows, k_rows, kv);    // S
    wgmma_over_head_dim<kBlockN, kDp, kBlockM, kBlockN, kBf16>(dp, do_rows, v_rows, kv);  // dP
    wgmma_wait<1>();                                                                      // S
    pin(s);
#ifdef FLASHJIT_VARIANT
    {
      const int n0 = key_blocks.at(j) * kBlockN;
#if FLASHJIT_VARIANT_BLOCK_MASK
      const bool all_visible = key_blocks.full(j);  // the map's full tiles: no mask
#else
      const bool all_visible = fv::block_fully_visible(p, diagonal, m0, kBlockM, n0, kBlockN);
#endif
      const float scale_log2 = fv::softmax_scale_log2(p);
      const int key0 = n0 + frag_col;  // this thread's key at nt, e = 0
      // key - row as a float once: ALiBi's distance is then one add of a constant per score.
      const float distance0 = static_cast<float>(key0 - row);
      // As the dK/dV kernel: P = exp2(score - lse) (hidden keys -inf; blocks every row sees whole
      // without the mask test), and either dS = P (dP - delta) after the wait for dP, or, with a
      // chain factor g = d score / d s (chain), P and dS per score once dP is in.
      auto scores = [&](bool masked, bool chain) {
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int i = 4 * nt + 2 * half + e, r = row + 8 * half, key = key0 + nt * 8 + e;
              float score = s[i], g = 1.f;
              if (fv::kModifiesScores)
                score =
                    fv::score_and_grad(score * p.scale, slope, batch, head, r, key,
                                       distance0 + static_cast<float>(nt * 8 + e - 8 * half), &g);
              if (masked && !fv::visible(p, diagonal, batch, head, r, key))
                score = minus_infinity();
              s[i] = fast_exp2(fmaf(score, scale_log2, -lse[half]));
              if (chain) dp[i] = s[i] * (dp[i] - delta[half]) * g;
            }
      };
      if constexpr (fv::kScoreGradIsOne) {
        if (all_visible)
          scores(false, false);
        else
          scores(true, false);
        wgmma_wait<0>();  // dP
        pin(dp);
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            dp[4 * nt + i] = s[4 * nt + i] * (dp[4 * nt + i] - delta[i / 2]);
      } else {
        wgmma_wait<0>();  // and dP: g is not held across the wait
        pin(dp);
        scores(!all_visible, true);  // one loop: two spill at m128n64 (d 64)
      }
    }
#else
    const int n0 = j * kBlockN;
    if (fa::block_needs_mask<K::kCausal>(p, diagonal, m0, n0, kBlockN)) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int limit = fa::last_key<K::kCausal>(p, diagonal, row + 8 * half) - (n0 + frag_col);
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (nt * 8 + e > limit) s[nt * 4 + 2 * half + e] = minus_infinity();
      }
    }
#pragma unroll
    for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        s[4 * nt + i] = fast_exp2(fmaf(s[4 * nt + i], p.scale_log2, -lse[i / 2]));
    wgmma_wait<0>();  // dP
    pin(dp);
#pragma unroll
    for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) dp[4 * nt + i] = s[4 * nt + i] * (dp[4 * nt + i] - delta[i / 2]);
#endif
    pack_fragments<kBlockN, kBf16>(ds, dp);
    wgmma_fence();  // ds (written above) and dq are ready for the tensor cores
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t)  // 16 keys per step
#pragma unroll
      for (int c = 0; c < kDqChunks; ++c)
        Wgmma<kDqChunk, kBf16>::rs(
            dq[c], ds[t], advance(k_cols, kv + t * 16 * 128 + c * (kDqChunk / 64) * kBlockN * 128),
            1);
    wgmma_commit();
    wgmma_wait<0>();
    pin(ds);
#pragma unroll
    for (int c = 0; c < kDqChunks; ++c) pin(dq[c]);
  }
  cp_async_wait<0>();

  // Epilogue: dQ * scale into this warp's own rows of the Q tile (only its warpgroup's wgmmas
  // read those rows, all finished), then 16-byte row stores.
  unsigned char* const smem = shared_bytes + (base - shared_address(shared_bytes));
#pragma unroll
  for (int c = 0; c < kDqChunks; ++c)
    store_accumulator<kDqChunk, kBlockM, kBf16>(smem + kQTile, dq[c], warpgroup * 64, c * kDqChunk,
                                                p.scale);
  __syncthreads();
  u16* dq_out = static_cast<u16*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride +
                m0 * p.dq_seq_stride;
  store_tile<kThreads, K::kHeadDim, kBlockM>(dq_out, p.dq_seq_stride, p.seqlen_q - m0,
                                             smem + kQTile);
}

#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_VARLEN
// Packed variable-length documents: the family's two kernels (the dK/dV kernel of
// cuda/attention_bwd_sm90.cuh, the dQ kernel above) on the document's view of the params
// (templates/attention_variant.h, document_tile_view; the workspace as
// cuda/attention_bwd_common.cuh says). A dK/dV CTA runs for a document without queries too (its
// dK = dV = 0 are written) and exits when its keys start past the document's; a dQ CTA exits when
// its query rows start past the document's.
FLASHJIT_BACKWARD_DOCUMENT_ENTRIES(attention_backward_sm90, K::kHeadDimPadded)
#endif
#endif
}  // namespace flashjit_kernel
