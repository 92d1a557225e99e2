// Which output tiles (block_m query rows of one head of one batch) a CTA of the warp-specialized
// forward computes. The producer thread and every consumer thread walk the same sequence
// independently (it depends on the grid and the problem only), so no tile index is passed
// between them:
//
//   for (WsTile tile; scheduler.next(tile);) { ... }
//
// WsTileScheduler<CAUSAL, false>: one tile per CTA, from the grid (blockIdx.x = query block,
//   y = head, z = batch). Causal query blocks near the end see the most keys: they are launched
//   first so that the tail of the grid is short.
// WsTileScheduler<CAUSAL, true> (persistent): a grid of G CTAs, at most one per SM slot
//   (runtime: KernelShape::persistent_ctas), over a list of T = m_blocks x heads x batch tiles;
//   in round r, CTA c takes tile r G + c. The list:
//     non-causal  query block fastest, then head, then batch (the grid's order: CTAs in flight
//                 share the K and V of a few heads in L2);
//     causal      heaviest first: query blocks from the last (most keys) down, heads and batches
//                 within each; odd rounds are walked backwards (CTA c takes r G + G - 1 - c), so
//                 the CTA that took the heaviest tile of one round takes the lightest of the next
//                 (a static longest-processing-time order: the CTAs' totals differ by at most
//                 about the heaviest tile, where round-robin over launch order leaves whole
//                 waves of light tiles at the end).

namespace flashjit_kernel {

struct WsTile {
  int m_block;  // query block: rows [m_block * block_m, + block_m)
  int head;     // query head
  int batch;
#ifdef FLASHJIT_VARIANT
  // Where the tile's batch entry starts in the tensor maps: rows q_row + m0 of q and o, rows
  // k_row + n0 of k and v, batch coordinate map_batch. Packed documents (varlen: batch is the
  // document) are rows of one packed entry: their first rows (cu_seqlens) and 0; otherwise 0,
  // 0 and batch (WsVariantTileScheduler).
  int q_row;
  int k_row;
  int map_batch;
#endif
};

template <bool CAUSAL, bool PERSISTENT>
struct WsTileScheduler;

template <bool CAUSAL>
struct WsTileScheduler<CAUSAL, false> {
  bool done = false;

  __device__ __forceinline__ WsTileScheduler(const FlashjitAttentionParams&, int) {}

  __device__ __forceinline__ bool next(WsTile& t) {
    if (done) return false;
    done = true;
    t.m_block =
        CAUSAL ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
    t.head = static_cast<int>(blockIdx.y);
    t.batch = static_cast<int>(blockIdx.z);
    return true;
  }
};

template <bool CAUSAL>
struct WsTileScheduler<CAUSAL, true> {
  int m_blocks;  // query blocks per head
  int tiles;     // m_blocks x heads_q x batch
  int heads;
  int round = 0;  // the CTA's next round

  __device__ __forceinline__ WsTileScheduler(const FlashjitAttentionParams& p, int block_m) {
    m_blocks = (p.seqlen_q + block_m - 1) / block_m;
    heads = p.heads_q;
    tiles = m_blocks * p.heads_q * p.batch;
  }

  __device__ __forceinline__ bool next(WsTile& t) {
    const int ctas = static_cast<int>(gridDim.x), cta = static_cast<int>(blockIdx.x);
    const int slot = CAUSAL && round % 2 == 1 ? ctas - 1 - cta : cta;
    const int index = round * ctas + slot;
    ++round;
    if (index >= tiles) return false;  // and every later round's index is larger
    if (CAUSAL) {
      const int heads_batch = tiles / m_blocks;
      t.m_block = m_blocks - 1 - index / heads_batch;
      t.head = index % heads_batch % heads;
      t.batch = index % heads_batch / heads;
    } else {
      t.m_block = index % m_blocks;
      t.head = index / m_blocks % heads;
      t.batch = index / m_blocks / heads;
    }
    return true;
  }
};

#ifdef FLASHJIT_VARIANT
// An attention variant's tiles: the plain schedule's, each placed in the tensor maps (WsTile's
// q_row, k_row, map_batch). Packed documents (varlen): the grid is (m_block, head, document) over
// the longest document's query blocks; a CTA whose tile starts past its document's queries has
// none (neither the producer nor the consumers spend anything on it). Persistent: the
// specialization below.
template <bool CAUSAL, bool PERSISTENT>
struct WsVariantTileScheduler {
  WsTileScheduler<CAUSAL, PERSISTENT> list;
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int block_m;

  __device__ __forceinline__ WsVariantTileScheduler(const FlashjitAttentionParams& p, int block_m)
      : list(p, block_m),
        cu_seqlens_q(p.cu_seqlens_q),
        cu_seqlens_k(p.cu_seqlens_k),
        block_m(block_m) {}

  __device__ __forceinline__ bool next(WsTile& t) {
    while (list.next(t)) {
#if FLASHJIT_VARIANT_VARLEN
      t.q_row = cu_seqlens_q[t.batch];
      if (t.m_block * block_m >= cu_seqlens_q[t.batch + 1] - t.q_row) continue;  // past its end
      t.k_row = cu_seqlens_k[t.batch];
      t.map_batch = 0;
#else
      t.q_row = t.k_row = 0;
      t.map_batch = t.batch;
#endif
      return true;
    }
    return false;
  }
};

#if FLASHJIT_VARIANT_VARLEN
// Packed documents, persistent: the plain list without the tiles that start past their
// document's queries (so that every round's tiles are work, and the causal longest-processing-
// time order holds among them):
//   non-causal  document by document, each its heads x blocks(doc) tiles, query block fastest;
//   causal      query blocks from the longest document's last down; at each, the documents
//               that reach it in order, their heads fastest.
// CTA c takes tile r G + c of the list in round r (odd rounds backwards when causal), as the
// plain schedule does. The tiles a CTA takes only move forward in the list, so it finds each by
// moving a cursor over the (block, document) pairs: about m_blocks x documents steps in all.
template <bool CAUSAL>
struct WsVariantTileScheduler<CAUSAL, true> {
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int block_m, heads, docs;
  int round = 0;   // the CTA's next round
  int m_block;     // the cursor: a query block (causal) ...
  int doc = 0;     // ... and a document
  int before = 0;  // tiles of the list before the cursor

  __device__ __forceinline__ WsVariantTileScheduler(const FlashjitAttentionParams& p, int block_m)
      : cu_seqlens_q(p.cu_seqlens_q),
        cu_seqlens_k(p.cu_seqlens_k),
        block_m(block_m),
        heads(p.heads_q),
        docs(p.batch),
        m_block(CAUSAL ? (p.seqlen_q + block_m - 1) / block_m - 1 : 0) {}

  // Query blocks of document d (a negative length counts as 0).
  __device__ __forceinline__ int blocks_of(int d) const {
    const int len = cu_seqlens_q[d + 1] - cu_seqlens_q[d];
    return len > 0 ? (len + block_m - 1) / block_m : 0;
  }

  __device__ __forceinline__ bool next(WsTile& t) {
    const int ctas = static_cast<int>(gridDim.x), cta = static_cast<int>(blockIdx.x);
    const int slot = CAUSAL && round % 2 == 1 ? ctas - 1 - cta : cta;
    const int index = round * ctas + slot;
    ++round;
    if (CAUSAL) {
      for (;;) {
        if (m_block < 0) return false;   // past the list's end
        if (blocks_of(doc) > m_block) {  // the document reaches the block: `heads` tiles
          if (index < before + heads) break;
          before += heads;
        }
        if (++doc == docs) {
          doc = 0;
          --m_block;
        }
      }
      t.m_block = m_block;
      t.head = index - before;
    } else {
      int blocks = 0;
      for (; doc < docs; ++doc) {
        blocks = blocks_of(doc);
        if (index < before + heads * blocks) break;
        before += heads * blocks;
      }
      if (doc == docs) return false;
      t.m_block = (index - before) % blocks;
      t.head = (index - before) / blocks;
    }
    t.batch = doc;
    t.q_row = cu_seqlens_q[doc];
    t.k_row = cu_seqlens_k[doc];
    t.map_batch = 0;
    return true;
  }
};
#endif

#endif
}  // namespace flashjit_kernel
