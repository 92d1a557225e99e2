// The mainloop of the warp-specialized forward: what the producer loads and what each consumer
// warpgroup computes, over the n key blocks of one tile (attention_common.h's key_blocks).
//
// clang-format off
//   producer (one thread)                     consumer warpgroup c (64 query rows)
//   K_0   (waits for its buffer's release)
//   Q -> q_full (after Q empty: the previous  wait q_full
//     tile's O stores have read the buffer)
//                                             wait K_0; S = Q K_0^T; release K_0; softmax -> P_0
//   for j = 1 .. n-1:                         for j = 1 .. n-1:
//     K_j   (waits for its buffer's release)    wait K_j; take the turn (-pp); issue S_j = Q K_j^T
//     V_j-1                                     wait V_j-1; issue O += P_j-1 V_j-1; pass the turn
//                                               wait S_j; release K_j; mask, exp2 of S_j, m, l
//                                               wait P V; release V_j-1; P_j = S_j; O *= corr.
//   V_n-1                                     wait V_n-1; O += P_n-1 V_n-1; release V_n-1
// clang-format on
//
// The consumer loop issues S_j and P_{j-1} V_{j-1} back to back and waits for S_j only: S_j's
// softmax runs on the CUDA cores while P_{j-1} V_{j-1} runs on the tensor cores. Its first (no
// P V yet) and last (no S) iterations are peeled, so every wgmma in the loop is unconditional
// (ptxas serializes all wgmmas of a kernel where a branch leaves it unsure which accumulators
// are in flight). The producer loads K one block ahead of V: K_j is needed before V_{j-1}.
// With ping-pong (ws/pingpong.cuh) the consumers take turns issuing the loop's GEMMs.
//
// The pipelines' positions and the Q rounds carry over from tile to tile (a persistent CTA walks
// several): WsPositions hold them. A tile with no key (causal, seqlen_q > seqlen_k) loads
// nothing and counts no Q round.
//
// The key blocks of a tile come as a WsKeyBlocks: count() of them, the t-th visited being block
// at(t). Plain attention visits blocks 0 .. n-1; an attention variant (FLASHJIT_VARIANT,
// templates/attention_variant.h) its key-block range (hidden blocks are never loaded), its mask
// and scores replacing the causal mask (as in the mma and wgmma families).

namespace flashjit_kernel {

#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_BLOCK_MASK
// A mask_mod's block map: the tile's non-empty key tiles, and which are full.
using WsKeyBlocks = flashjit_variant::BlockList;
#else
using WsKeyBlocks = flashjit_variant::KeyBlocks;
#endif
#else
struct WsKeyBlocks {
  int n;
  __device__ __forceinline__ int count() const { return n; }
  __device__ __forceinline__ int at(int t) const { return t; }
};
#endif

// A role's position (the producer's loads, or a consumer's reads): the next buffer of each
// pipeline, and the Q tiles loaded (or consumed) so far.
template <class K>
struct WsPositions {
  PipelineState<K::kStages> k, v;
  int q_rounds = 0;
};

// The producer: every TMA load of one tile, in the order the consumers use them. `kv_head` is
// the K/V head of the tile's query head (GQA).
template <class K>
__device__ __forceinline__ void ws_load(const WsShared<K>& smem,
                                        const FlashjitForwardTensorMaps& maps, const WsTile& tile,
                                        int m0, int kv_head, const WsKeyBlocks& blocks,
                                        WsPositions<K>& at) {
  const int n_blocks = blocks.count();
  if (n_blocks == 0) return;  // no key: the consumers write O = 0 without waiting for anything
  // Block `block` of K or V into the next buffer of its pipeline.
  auto load = [&](const Pipeline<K::kStages>& pipe, PipelineState<K::kStages>& state, u32 tiles,
                  const FlashjitTensorMap* map, int block) {
    pipe.producer_acquire(state, K::kKvTileBytes);
    const u32 tile_address = tiles + state.index * K::kKvTileBytes;
#pragma unroll
    for (int c = 0; c < K::kColumnBlocks; ++c)
#ifdef FLASHJIT_VARIANT
      tma_load_4d(tile_address + c * K::kBlockN * 128, map, pipe.full_barrier(state.index), c * 64,
                  tile.k_row + block * K::kBlockN, kv_head, tile.map_batch);
#else
      tma_load_4d(tile_address + c * K::kBlockN * 128, map, pipe.full_barrier(state.index), c * 64,
                  block * K::kBlockN, kv_head, tile.batch);
#endif
    state.advance();
  };
  load(smem.k_pipe, at.k, smem.k, &maps.k, blocks.at(0));  // K_0 first: no wait for the epilogue
  // Q: one box of 64 columns x kBlockM rows per 64-column block of the tile, once the previous
  // tile's O stores have read the buffer (Q empty's round q_rounds - 1).
  if (at.q_rounds > 0) mbarrier_wait(smem.q_empty, (at.q_rounds - 1) & 1);
  mbarrier_arrive_expect_tx(smem.q_full, K::kQTileBytes);
#pragma unroll
  for (int c = 0; c < K::kColumnBlocks; ++c)
#ifdef FLASHJIT_VARIANT
    tma_load_4d(smem.q + c * K::kBlockM * 128, &maps.q, smem.q_full, c * 64, tile.q_row + m0,
                tile.head, tile.map_batch);
#else
    tma_load_4d(smem.q + c * K::kBlockM * 128, &maps.q, smem.q_full, c * 64, m0, tile.head,
                tile.batch);
#endif
  ++at.q_rounds;
  for (int j = 1; j < n_blocks; ++j) {
    load(smem.k_pipe, at.k, smem.k, &maps.k, blocks.at(j));
    load(smem.v_pipe, at.v, smem.v, &maps.v, blocks.at(j - 1));
  }
  load(smem.v_pipe, at.v, smem.v, &maps.v, blocks.at(n_blocks - 1));
}

// The producer, after its last tile: waits until the consumers released every buffer (the
// CTA's loads have all landed and been read before the producing thread exits).
template <class K>
__device__ __forceinline__ void ws_load_tail(const WsShared<K>& smem, const WsPositions<K>& at) {
  smem.k_pipe.producer_tail(at.k);
  smem.v_pipe.producer_tail(at.v);
}
#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_VARLEN

// Named barrier id of the consumers together (ws/epilogue.cuh takes 1 .. 3, ws/pingpong.cuh's
// turns 4 .. 6).
constexpr int kWsConsumersBarrier = 7;

// Sets rows [first_row, kBlockN) of the K/V buffer at `tile` (all its 64-column blocks) to 0 and
// makes the zeros visible to every consumer's wgmmas: the consumers' threads share the stores
// (a row's 128 bytes in a column block are contiguous whatever the swizzle), fence them
// (fence.proxy.async) and meet at kWsConsumersBarrier. Called by every consumer thread with the
// same first_row (the tile's), before any reads the buffer: every consumer waited for its
// earlier wgmmas, and the buffer is not reloaded before all of them release it. Nothing when
// first_row >= kBlockN.
template <class K>
__device__ __forceinline__ void ws_zero_rows_from(u32 tile, int first_row) {
  if (first_row >= K::kBlockN) return;
  constexpr int kWordsPerRow = 128 / 4;
  const int words = (K::kBlockN - first_row) * kWordsPerRow;
  const u32 rows = tile + first_row * 128;
  for (int i = static_cast<int>(threadIdx.x) - 128; i < K::kColumnBlocks * words;
       i += K::kConsumerThreads)
    store_shared_u32(rows + (i / words) * (K::kBlockN * 128) + (i % words) * 4, 0u);
  fence_proxy_async();
  named_barrier_sync(kWsConsumersBarrier, K::kConsumerThreads);
}

#endif
#endif

// One consumer warpgroup's accumulators after the mainloop: O (unnormalized, fp32) and the
// softmax state (m, l) of its rows.
template <class K>
struct WsAccumulators {
  float o[K::kPvChunks][K::kPvChunk / 2];  // O: [16 rows of this warp, kDp]
  WsSoftmax<K::kBlockN, K::kIsBf16, K::kCausal> softmax;
};

// Consumer warpgroup `consumer` (0-based; its rows start at m0 + 64 consumer), one tile.
template <class K>
__device__ __forceinline__ void ws_consume(const FlashjitAttentionParams& p,
                                           const WsShared<K>& smem, const WsTurns<K>& turns,
                                           int consumer, const WsTile& tile, int m0,
                                           const WsKeyBlocks& blocks, int diagonal,
                                           WsPositions<K>& at, WsAccumulators<K>& out) {
  const int n_blocks = blocks.count();
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kDp = K::kHeadDimPadded;
  constexpr int kPvChunk = K::kPvChunk, kPvChunks = K::kPvChunks;
  const int warp = (threadIdx.x / 32) % 4;  // within the warpgroup
  const int first_row = m0 + consumer * 64;
  const int row = first_row + warp * 16 + (threadIdx.x % 32) / 4;  // this thread's half 0

#pragma unroll
  for (int c = 0; c < kPvChunks; ++c)
#pragma unroll
    for (int i = 0; i < kPvChunk / 2; ++i) out.o[c][i] = 0.f;
  out.softmax.init();
  if (n_blocks == 0) return;

  // Descriptors of this warpgroup's 64 Q rows and of K/V buffer 0.
  const u64 q_desc = smem_descriptor(smem.q + consumer * 64 * 128, 16, 1024);
  const u64 k_desc0 = smem_descriptor(smem.k, 16, 1024);
  const u64 v_desc0 = smem_descriptor(smem.v, kBlockN * 128, 1024);

  float s[K::kNTiles * 4];      // S_j: [16 rows, kBlockN] fp32, then its exponentials
  u32 p_frag[kBlockN / 16][4];  // P_{j-1}: A fragments per 16-key step
  float correction[2];
  PipelineState<K::kStages>& k_read = at.k;  // carried over from the previous tile
  PipelineState<K::kStages>& v_read = at.v;

  auto issue_s = [&](int stage) {  // S = Q K^T from buffer `stage`
    // (The buffer's offset in the descriptor: as attention_fwd_sm90.cuh's.)
    wgmma_over_head_dim<kBlockN, kDp, kBlockM, kBlockN, K::kIsBf16>(
        s, q_desc, advance(k_desc0, stage * K::kKvTileBytes), 0);
  };
  auto issue_pv = [&](int stage) {  // O += P V from buffer `stage`
    wgmma_pv<kBlockN, kPvChunk, K::kIsBf16>(out.o, p_frag,
                                            advance(v_desc0, stage * K::kKvTileBytes));
  };
#ifdef FLASHJIT_VARIANT
  const float slope = flashjit_variant::alibi_slope(p, tile.head);
  auto softmax = [&](int j) {  // S_j -> the variant's scores, masked; exponentials; m, l; corr.
#if FLASHJIT_VARIANT_BLOCK_MASK
    out.softmax.variant(s, p, diagonal, first_row, row, blocks.at(j) * kBlockN, tile.batch,
                        tile.head, slope, blocks.full(j));
#else
    out.softmax.variant(s, p, diagonal, first_row, row, blocks.at(j) * kBlockN, tile.batch,
                        tile.head, slope);
#endif
    out.softmax.update(s, flashjit_variant::softmax_scale_log2(p), correction);
  };
#else
  (void)tile;
  auto softmax = [&](int j) {  // S_j -> its exponentials; m, l; correction
    out.softmax.mask(s, p, diagonal, first_row, row, j * kBlockN);
    out.softmax.update(s, p.scale_log2, correction);
  };
#endif

  mbarrier_wait(smem.q_full, at.q_rounds & 1);
  ++at.q_rounds;
  smem.k_pipe.consumer_wait(k_read);  // S_0
  wgmma_fence();
  issue_s(k_read.index);
  wgmma_wait<0>();
  pin(s);
  smem.k_pipe.consumer_release(k_read);
  k_read.advance();
  softmax(0);
  out.softmax.pack(s, p_frag);          // O is 0: nothing to rescale
  for (int j = 1; j < n_blocks; ++j) {  // S_j with P_{j-1} V_{j-1} in flight
    smem.k_pipe.consumer_wait(k_read);
    turns.take();
    wgmma_fence();  // O (rescaled) and P_{j-1} (packed) are ready for the tensor cores
    issue_s(k_read.index);
    smem.v_pipe.consumer_wait(v_read);
    wgmma_fence();  // (ptxas inserts this fence itself after the wait loop otherwise)
    issue_pv(v_read.index);
    turns.pass();
    wgmma_wait<1>();  // S_j is done; P_{j-1} V_{j-1} may still run
    pin(s);
    smem.k_pipe.consumer_release(k_read);
    k_read.advance();
    softmax(j);
    wgmma_wait<0>();  // P_{j-1} V_{j-1} is done: O holds blocks < j at the old max
    pin(p_frag);
#pragma unroll
    for (int c = 0; c < kPvChunks; ++c) pin(out.o[c]);
    smem.v_pipe.consumer_release(v_read);
    v_read.advance();
    out.softmax.pack(s, p_frag);
#pragma unroll
    for (int c = 0; c < kPvChunks; ++c) out.softmax.rescale(out.o[c], correction);
  }
  smem.v_pipe.consumer_wait(v_read);  // P_{n-1} V_{n-1}
#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_VARLEN
  // Packed documents: the rows of this block past the document's keys are the next document's
  // (or rows past the last one: anything, NaN included), loaded whole by the TMA box. Their
  // scores are masked to -inf (P = 0), but 0 * NaN is NaN: they become 0 before P V reads them.
  // Only the last block visited can hold such rows (the blocks come in increasing order and
  // none starts past seqlen_k).
  ws_zero_rows_from<K>(smem.v + v_read.index * K::kKvTileBytes,
                       p.seqlen_k - blocks.at(n_blocks - 1) * kBlockN);
#endif
#endif
  wgmma_fence();
  issue_pv(v_read.index);
  wgmma_wait<0>();
  pin(p_frag);
#pragma unroll
  for (int c = 0; c < kPvChunks; ++c) pin(out.o[c]);
  smem.v_pipe.consumer_release(v_read);
  v_read.advance();
}

}  // namespace flashjit_kernel
