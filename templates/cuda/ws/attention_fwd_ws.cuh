// FlashAttention forward for Hopper (sm_90a) in FlashAttention-3's shape: a producer warpgroup
// loads Q, K and V with the tensor memory accelerator (TMA) into mbarrier pipelines, consumer
// warpgroups compute (wgmma from shared memory, P from registers, the softmax of one block
// overlapped with the P V of the previous one), and each writes its O tile back with TMA stores.
// Configs "m<block_m>n<block_n>w<warps>s<stages>-ws[-pp][-persist]": block_m = 64 per consumer
// warpgroup, warps = 4 (producer) + 4 per consumer, stages = depth of the K and V pipelines;
// -pp: the consumers take turns issuing their GEMMs (ping-pong); -persist: one CTA per SM slot
// walks a list of tiles (heaviest first when causal).
//
// The pieces, each readable alone (the renderer prepends them in this order, after
// attention_params.h, attention_common.h, cuda/common.cuh, cuda/wgmma.cuh, cuda/sm90_tiles.cuh
// and cuda/tma.cuh, and appends one instantiation taking the params and the tensor maps):
//   ws/pipeline.cuh        mbarrier ring between the producer and the consumers
//   ws/traits.cuh          the compile-time shape, registers per role, shared-memory layout
//   ws/tile_scheduler.cuh  which tiles a CTA computes
//   ws/pingpong.cuh        the consumers' turns at the tensor cores
//   ws/softmax.cuh         online softmax over wgmma accumulators
//   ws/mainloop.cuh        the producer's loads, the consumers' MMAs and softmax
//   ws/epilogue.cuh        normalization, LSE, TMA stores of O
//   ws/attention_fwd_ws.cuh  this kernel: roles, barrier setup, the pieces in order

namespace flashjit_kernel {

#ifdef FLASHJIT_VARIANT
// The params and causal diagonal that one tile of an attention variant runs on: the problem's;
// with packed documents (varlen), its document's view (flashjit_variant::document_view: the
// document's lengths, so its diagonal, masks and tails, and its o and lse), set per tile.
struct WsTileParams {
#if FLASHJIT_VARIANT_VARLEN
  FlashjitAttentionParams p;
  int diagonal;
  __device__ __forceinline__ WsTileParams(const FlashjitAttentionParams& problem, int)
      : p(problem), diagonal(0) {}
  // (The scheduler placed the tile before its document's end: document_view is true.)
  __device__ __forceinline__ void set(const FlashjitAttentionParams& problem, const WsTile& tile,
                                      int m0) {
    p = problem;
    flashjit_variant::document_view(p, tile.batch, m0, 2);
    diagonal = flashjit_attention::diagonal(p);
  }
#else
  const FlashjitAttentionParams& p;
  int diagonal;
  __device__ __forceinline__ WsTileParams(const FlashjitAttentionParams& problem, int diagonal)
      : p(problem), diagonal(diagonal) {}
#if FLASHJIT_VARIANT_BLOCK_MASK
  int batch = 0, head = 0;  // the tile's: its row of the block map
  __device__ __forceinline__ void set(const FlashjitAttentionParams&, const WsTile& tile, int) {
    batch = tile.batch;
    head = tile.head;
  }
#else
  __device__ __forceinline__ void set(const FlashjitAttentionParams&, const WsTile&, int) {}
#endif
#endif
};

#endif
template <class K>
#ifdef FLASHJIT_VARIANT
// A mask_mod's block map (FLASHJIT_VARIANT_BLOCK_MASK): the entry passes its kernel parameter.
__device__ __forceinline__ void attention_forward_ws(const FlashjitAttentionParams& p,
                                                     const FlashjitForwardTensorMaps& maps,
                                                     const FlashjitBlockMask* block_mask = 0) {
#else
__device__ __forceinline__ void attention_forward_ws(const FlashjitAttentionParams& p,
                                                     const FlashjitForwardTensorMaps& maps) {
#endif
  namespace fa = flashjit_attention;
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  if (dynamic_smem_bytes() < static_cast<u32>(K::kSmemBytes)) __trap();  // a launch bug
  const WsShared<K> smem(shared_address(shared_bytes));

  const int diagonal = fa::diagonal(p);
  const int warpgroup = threadIdx.x / 128;
  // The query block's key blocks (none for a causal block above a seqlen_q > seqlen_k
  // diagonal; an attention variant's: its range, ws/mainloop.cuh).
#ifdef FLASHJIT_VARIANT
  WsTileParams view(p, diagonal);  // the current tile's (each thread sets it for its tiles)
#endif
  auto key_blocks = [&](int m0) {
#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_BLOCK_MASK
    (void)view.p;  // the block map's row of the tile (view.set recorded its batch and head)
    return flashjit_variant::key_tiles_of(*block_mask, view.batch, view.head, m0 / K::kBlockM);
#else
    return flashjit_variant::key_blocks(view.p, view.diagonal, m0, K::kBlockM, K::kBlockN);
#endif
#else
    return WsKeyBlocks{fa::key_blocks<K::kCausal>(p, diagonal, m0, K::kBlockM, K::kBlockN)};
#endif
  };

  ws_init_barriers(smem, maps);  // no CTA-wide barrier after this point

#ifdef FLASHJIT_VARIANT
  WsVariantTileScheduler<K::kCausal, K::kPersistent> tiles(p, K::kBlockM);
#else
  WsTileScheduler<K::kCausal, K::kPersistent> tiles(p, K::kBlockM);
#endif
  // Each role walks the CTA's tiles; a tile's first query row, once a variant's view is set to it.
  auto start_tile = [&](const WsTile& tile) {
    const int m0 = tile.m_block * K::kBlockM;
#ifdef FLASHJIT_VARIANT
    view.set(p, tile, m0);
#endif
    return m0;
  };
  if (warpgroup == 0) {  // the producer
    setmaxnreg_dec<K::kProducerRegisters>();
    if (threadIdx.x == 0) {
      WsPositions<K> at;
      for (WsTile tile; tiles.next(tile);) {
        const int m0 = start_tile(tile);
        ws_load<K>(smem, maps, tile, m0, tile.head / p.group_size, key_blocks(m0), at);
      }
      ws_load_tail<K>(smem, at);
    }
  } else {  // a consumer
    setmaxnreg_inc<K::kConsumerRegisters>();
    const int consumer = warpgroup - 1;
    const WsTurns<K> turns{consumer};
    turns.init();
    WsPositions<K> at;
    for (WsTile tile; tiles.next(tile);) {
      const int m0 = start_tile(tile);
      const WsKeyBlocks blocks = key_blocks(m0);
      WsAccumulators<K> acc;
#ifdef FLASHJIT_VARIANT
      ws_consume<K>(view.p, smem, turns, consumer, tile, m0, blocks, view.diagonal, at, acc);
      ws_epilogue<K>(view.p, maps, smem, tile, consumer, m0, blocks.count(), acc);
#else
      ws_consume<K>(p, smem, turns, consumer, tile, m0, blocks, diagonal, at, acc);
      ws_epilogue<K>(p, maps, smem, tile, consumer, m0, blocks.count(), acc);
#endif
    }
  }
}

}  // namespace flashjit_kernel
