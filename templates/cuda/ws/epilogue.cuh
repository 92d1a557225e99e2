// The epilogue of one consumer warpgroup of the warp-specialized forward, one tile: O = acc / l
// in the storage type into the warpgroup's own 64 rows of the Q tile (only its own wgmmas read
// those rows, all waited for), then one thread writes them back with TMA stores (one box of 64
// columns x 64 rows per 64-column block; rows past seqlen_q and columns past the head dim are
// outside the tensor map and not written) and, once the stores have read the buffer, releases
// it to the producer's next Q load (Q empty). LSE (natural log, +inf for a row with no key) from
// each row's quad leader.
//
// A tile with no key (n_blocks == 0: no Q was loaded, and the buffer may hold the next tile's Q
// in flight) writes its zeros straight to global memory instead and releases nothing.
//
// Shared stores are generic-proxy writes and the TMA store reads through the async proxy: each
// writing thread fences (fence.proxy.async), then the warpgroup meets at a named barrier before
// the store is issued.

namespace flashjit_kernel {

// Named barrier ids of the forward (0 is __syncthreads): the epilogue of consumer c uses 1 + c
// (ws/pingpong.cuh's turns 4 and up).
constexpr int kWsEpilogueBarrier = 1;

// O = 0 for the warpgroup's 64 rows of the tile, 16 bytes per store, rows past seqlen_q not
// written.
template <class K>
__device__ __forceinline__ void ws_store_zeros(const FlashjitAttentionParams& p, const WsTile& tile,
                                               int first_row) {
  constexpr int kChunks = K::kHeadDim / 8;  // 16-byte chunks per row
  u16* o = static_cast<u16*>(p.o) + tile.batch * p.o_batch_stride + tile.head * p.o_head_stride;
  for (int i = threadIdx.x % 128; i < 64 * kChunks; i += 128) {
    const int row = first_row + i / kChunks;
    if (row < p.seqlen_q)
      *reinterpret_cast<Vec16*>(o + row * p.o_seq_stride + (i % kChunks) * 8) = Vec16{0, 0, 0, 0};
  }
}

#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_VARLEN
// Packed documents: the warpgroup's 64 rows of O from the staging tile (the Q buffer) to global
// memory, 16 bytes per load and store, rows past seqlen_q (the document's) not written: a TMA
// store of the 64-row box would write them into the next document. `p` is the document's view.
template <class K>
__device__ __forceinline__ void ws_store_rows(const FlashjitAttentionParams& p,
                                              const WsShared<K>& smem, const WsTile& tile,
                                              int consumer, int first_row) {
  constexpr int kChunks = K::kHeadDim / 8;  // 16-byte chunks per row
  u16* o = static_cast<u16*>(p.o) + tile.batch * p.o_batch_stride + tile.head * p.o_head_stride;
  for (int i = threadIdx.x % 128; i < 64 * kChunks; i += 128) {
    const int r = i / kChunks, col = (i % kChunks) * 8;
    if (first_row + r < p.seqlen_q)
      *reinterpret_cast<Vec16*>(o + (first_row + r) * p.o_seq_stride + col) =
          load_shared_vec16(smem.q + wg_tile_offset<K::kBlockM>(consumer * 64 + r, col));
  }
}

#endif
#endif
template <class K>
__device__ __forceinline__ void ws_epilogue(const FlashjitAttentionParams& p,
                                            const FlashjitForwardTensorMaps& maps,
                                            const WsShared<K>& smem, const WsTile& tile,
                                            int consumer, int m0, int n_blocks,
                                            WsAccumulators<K>& acc) {
  constexpr int kPvChunk = K::kPvChunk, kPvChunks = K::kPvChunks;
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  const int tile_row0 = consumer * 64 + warp * 16 + lane / 4;  // half 0's row within the tile
  float* lse =
      p.lse ? p.lse + (static_cast<long long>(tile.batch) * p.heads_q + tile.head) * p.seqlen_q : 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = tile_row0 + 8 * half;
    const float sum = acc.softmax.row_total(half);
    if (lse && lane % 4 == 0 && m0 + row < p.seqlen_q) {
#ifdef FLASHJIT_VARIANT
      const float scale_log2 = flashjit_variant::softmax_scale_log2(p);
#else
      const float scale_log2 = p.scale_log2;
#endif
      lse[m0 + row] = flashjit_attention::row_lse(acc.softmax.row_max[half], scale_log2, sum,
                                                  [](float x) { return fast_log2(x); });
    }
    if (n_blocks == 0) continue;
    const float inverse = sum > 0.f ? 1.f / sum : 0.f;  // a row with no keys: O = 0
#pragma unroll
    for (int c = 0; c < kPvChunks; ++c)
#pragma unroll
      for (int dt = 0; dt < kPvChunk / 8; ++dt) {
        const u32 packed = pack2<K::kIsBf16>(acc.o[c][dt * 4 + 2 * half] * inverse,
                                             acc.o[c][dt * 4 + 2 * half + 1] * inverse);
        const int col = c * kPvChunk + dt * 8 + 2 * (lane % 4);
        store_shared_u32(smem.q + wg_tile_offset<K::kBlockM>(row, col), packed);
      }
  }
  if (n_blocks == 0) return ws_store_zeros<K>(p, tile, m0 + consumer * 64);
#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_VARLEN
  // Packed documents: stores bounded by the document (ws_store_rows) instead of the TMA store;
  // the buffer is released once every thread of the warpgroup has read its chunks.
  named_barrier_sync(kWsEpilogueBarrier + consumer, 128);  // the warpgroup's O is in the buffer
  ws_store_rows<K>(p, smem, tile, consumer, m0 + consumer * 64);
  fence_proxy_async();  // the reads above, before the next Q load (async proxy) overwrites them
  named_barrier_sync(kWsEpilogueBarrier + consumer, 128);
  if (threadIdx.x % 128 == 0) mbarrier_arrive(smem.q_empty);
  return;
#endif
#endif
  fence_proxy_async();  // this thread's O stores, visible to the TMA store
  named_barrier_sync(kWsEpilogueBarrier + consumer, 128);
  if (threadIdx.x % 128 == 0) {
#pragma unroll
    for (int c = 0; c < K::kColumnBlocks; ++c)
      tma_store_4d(&maps.o, smem.q + c * K::kBlockM * 128 + consumer * 64 * 128, c * 64,
                   m0 + consumer * 64, tile.head, tile.batch);
    bulk_commit_group();
    bulk_wait_group_read<0>();  // the buffer is read: the CTA may exit, the next Q may land
    mbarrier_arrive(smem.q_empty);
  }
}

}  // namespace flashjit_kernel
