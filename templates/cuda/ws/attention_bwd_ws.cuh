// FlashAttention backward for Hopper (sm_90a) in FlashAttention-3's shape: ONE kernel computes
// dK, dV and dQ. A producer warp loads Q, dO (TMA) and lse_log2, delta (generic copies) of each
// query step into an mbarrier pipeline while K_j and V_j stay resident; two consumer warpgroups
// (after setmaxnreg) compute the five products by wgmma; a dQ-writer warp adds each step's dQ
// tile (staged in shared memory by the consumers) into the fp32 workspace with bulk reductions,
// off the consumers' path. The preprocess (delta, lse_log2, zeroed dq_accum) and the convert
// (dq = scale * dq_accum) are cuda/attention_bwd_common.cuh's row kernels. Configs
// "m<block_m>n<block_n>w<warps>s<stages>-ws" (backward): block_n = 64 per consumer warpgroup,
// warps = 4 (producer) + 4 per consumer, stages = depth of the Q/dO pipeline.
//
// The math is the wgmma family's (cuda/attention_bwd_sm90.cuh, whose tile helpers this uses),
// per key block j of one (batch, kv head), base 2:
//   P^T = exp2(scale_log2 * K_j Q_i^T - lse_log2_i),  dS^T = P^T * (V_j dO_i^T - delta_i)
//   dV_j += P^T dO_i,  dK_j += dS^T Q_i,  dq_accum_i += dS K_j
//
// clang-format off
//   producer (40 registers)             consumer warpgroup c (64 keys)        dQ writer (warp 1)
//   K_j, V_j -> kv_full (once)           wait kv_full
//   for each step t (query head,         for each step t:                      for each step t:
//       query block i):                    wait full[s]
//     wait empty[s]                        S^T = K_c Q_i^T; dP^T = V_c dO_i^T
//     lse_log2_i, delta_i -> stats[s]      P^T, dS^T (registers, 16-bit)
//       (warp 2)
//     Q_i, dO_i -> full[s] (TMA, thread 0) dS^T -> dS[t % 2]; consumers' barrier
//                                          dV += P^T dO_i; dK += dS^T Q_i (RS)
//                                          dQ tile = dS K_j[:, cols of c] (SS;
//                                            d <= 64: c's keys' share, summed by the writer)
//                                          wait all; release s
//                                          wait dq_empty; stage dQ; dq_full ->  wait dq_full
//                                                                               bulk-add rows
//                                                                               wait reads; dq_empty
//                                        dK *= scale; dK, dV -> shared (over K, V) -> global
//                                        (16-byte stores), per consumer; kv_empty
// clang-format on
//
// "-persist": one CTA per SM walks a list of key tiles (WsBwdTileScheduler), every role keeping
// its position (pipeline stage and phase, dQ rounds, K/V loads) from tile to tile; the producer
// loads a tile's K_j, V_j only after kv_empty says the consumers' epilogue has read the last.
//
// dS^T is double-buffered: a consumer writes step t's into buffer t % 2 after the consumers'
// barrier of step t - 1, which each consumer reaches only after waiting for its step t - 2 dQ
// wgmmas, the last readers of that buffer. The staged dQ rows are single-buffered: dq_empty
// (the writer's reads of step t - 1 done) gates their rewrite at step t.
//
// Not in this family (yet): attention variants, packed documents, a deterministic dQ, head dims
// past 128; the budget (generator/backward_config_ws.cpp) leaves those problems to the others.

namespace flashjit_kernel {

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool IS_BF16, bool CAUSAL,
          bool DQ_ATOMIC, bool PERSISTENT = false, bool PINGPONG = false>
struct WsBwdTraits {
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kHeadDimPadded = (HEAD_DIM + 63) / 64 * 64;  // whole 64-column blocks
  static constexpr int kColumnBlocks = kHeadDimPadded / 64;         // TMA boxes per tile
  static constexpr int kBlockM = BLOCK_M;                           // query rows per step
  static constexpr int kBlockN = BLOCK_N;                           // keys per CTA
  static constexpr int kWarps = WARPS;
  static constexpr int kStages = STAGES;
  static constexpr bool kIsBf16 = IS_BF16;
  static constexpr bool kCausal = CAUSAL;
  static constexpr bool kDqAtomic = DQ_ATOMIC;
  static constexpr bool kPersistent = PERSISTENT;  // "-persist": one CTA per SM walks key tiles
  static constexpr bool kPingPong = PINGPONG;  // "-pp": consumers take turns at S^T, dP^T (below)

  static constexpr int kConsumers = kBlockN / 64;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kConsumerThreads = kConsumers * 128;
  // One CTA per SM; the producer warpgroup gives its registers to the consumers.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = 40;  // 24 and 32 spilled (NVRTC 13.0)
  static constexpr int kConsumerRegisters_ =
      ((1 + kConsumers) * kLaunchRegisters - kProducerRegisters) / kConsumers / 8 * 8;
  static constexpr int kConsumerRegisters = kConsumerRegisters_ < 240 ? kConsumerRegisters_ : 240;

  static constexpr int kSdpN = kBlockM;  // S^T columns per consumer: every query of the step
  static constexpr int kKvChunk = kHeadDimPadded % 128 == 0 ? 128 : 64;  // N of a dV/dK wgmma
  static constexpr int kKvChunks = kHeadDimPadded / kKvChunk;
  // dQ tiles of 64 query rows x 64 columns: one per consumer and step (head dims 65..128: the
  // consumer's 64 columns, over every key of the CTA), or (head dims up to 64: one tile a step;
  // block_m 128 would give each consumer one, but its S^T and dP^T spill) each consumer's share
  // of the one tile, over its own 64 keys: consumer 0 stages its share, consumer 1 adds its own
  // onto it (a hand-off barrier between them). (Taking turns at the whole tile put the dQ wgmmas
  // on a divergent path: ptxas serialized them all. Summing two staged shares in the dQ writer
  // warp, on 40 registers, made it the critical path: 5x slower.)
  static constexpr int kDqN = 64;
  static constexpr int kDqColTiles = kHeadDimPadded / kDqN;
  static constexpr int kDqTiles = kBlockM / 64 * kDqColTiles;
  static constexpr bool kDqSplitKeys = kDqTiles == 1 && kConsumers == 2;
  static constexpr int kDqKeys = kDqSplitKeys ? 64 : kBlockN;  // the dQ wgmmas' K extent
  // The staged dQ rows, contiguous like dq_accum's (one bulk reduction per tile; unpadded, a
  // warp's 8-byte stores of 8 rows meet on the same banks: 8-way conflicts, ~1k cycles a step).
  static constexpr int kDqStageRowBytes = kHeadDimPadded * 4;
  static constexpr int kDqStageBytes = kBlockM * kDqStageRowBytes;

  static constexpr int kKvTileBytes = kBlockN * kHeadDimPadded * 2;  // K_j or V_j
  static constexpr int kQTileBytes = kBlockM * kHeadDimPadded * 2;   // Q_i or dO_i, per stage
  static constexpr int kScoreTileBytes = kBlockN * kBlockM * 2;      // dS^T [keys, queries]
  static constexpr int kStatBytes = kBlockM * 4;                     // lse_log2 or delta
  // kv_full, kv_empty, full[kStages], empty[kStages], dq_full, dq_empty; -pp: ds_ready[2][2]
  static constexpr int kBarriers = 4 + 2 * kStages + (kPingPong ? 4 : 0);
  // + 1024: the dynamic window is rounded up to a swizzle atom (the tiles first, all multiples
  // of 1024 bytes; then the staged dQ rows, the stats and the barriers).
  static constexpr int kSmemBytes = 1024 + 2 * kKvTileBytes + 2 * kStages * kQTileBytes +
                                    2 * kScoreTileBytes + kDqStageBytes + 2 * kStages * kStatBytes +
                                    8 * kBarriers;

  static_assert(kHeadDim % 8 == 0 && kHeadDim >= 8 && kHeadDim <= 128,
                "head dim: a multiple of 8 in [8, 128] (dK and dV of 64 keys in registers)");
  static_assert(kBlockM == 64 || kBlockM == 128, "block_m: 64 or 128 query rows per step");
  static_assert(kBlockN == 128, "block_n: two consumer warpgroups of 64 keys");
  static_assert(kWarps == 4 * (1 + kConsumers), "a producer warpgroup and the consumers");
  static_assert(kStages >= 2 && kStages <= 3, "2 or 3 Q/dO buffers");
  static_assert(kDqAtomic, "dQ by bulk reductions (no deterministic mode in this family yet)");
  static_assert(
      kDqTiles == kConsumers || kDqSplitKeys,
      "one dQ tile of 64 x 64 per consumer and step, or each consumer's keys' share of one");
  static_assert(kConsumerRegisters >= kProducerRegisters && kConsumerRegisters % 8 == 0,
                "setmaxnreg counts are multiples of 8");
};

// Shared-memory addresses (shared space) of one CTA's tiles and barriers.
template <class K>
struct WsBwdShared {
  u32 k, v;      // [kBlockN, kDp] each, resident
  u32 q, d_o;    // kStages x [kBlockM, kDp] each
  u32 ds;        // 2 x [kBlockN, kBlockM]: dS^T of steps t % 2
  u32 dq_stage;  // [kBlockM] rows of kDqStageRowBytes
  u32 stats;     // kStages x {lse_log2[kBlockM], delta[kBlockM]} fp32
  u32 kv_full;   // mbarrier: K_j and V_j have landed
  u32 kv_empty;  // mbarrier: the consumers' epilogue has read the K/V tiles (kConsumerThreads)
  u32 dq_full;   // mbarrier: every consumer staged its dQ tiles (kConsumerThreads arrivals)
  u32 dq_empty;  // mbarrier: the writer's reductions have read them (32 arrivals)
  Pipeline<K::kStages> pipe;  // Q_i, dO_i (TMA bytes, 1 arrival) and the stats (32 arrivals)
  u32 ds_ready;  // -pp: mbarriers [consumer][buffer]: the consumer's dS^T rows of a step are in

  __device__ __forceinline__ explicit WsBwdShared(u32 window) {
    k = (window + 1023) & ~1023u;  // swizzle atoms start on 1024-byte boundaries
    v = k + K::kKvTileBytes;
    q = v + K::kKvTileBytes;
    d_o = q + K::kStages * K::kQTileBytes;
    ds = d_o + K::kStages * K::kQTileBytes;
    dq_stage = ds + 2 * K::kScoreTileBytes;
    stats = dq_stage + K::kDqStageBytes;
    kv_full = stats + 2 * K::kStages * K::kStatBytes;
    kv_empty = kv_full + 8;
    dq_full = kv_empty + 8;
    dq_empty = dq_full + 8;
    pipe.full = dq_empty + 8;
    pipe.empty = pipe.full + 8 * K::kStages;
    ds_ready = pipe.empty + 8 * K::kStages;
  }
  __device__ __forceinline__ u32 ds_ready_barrier(int consumer, int buffer) const {
    return ds_ready + 8 * (2 * consumer + buffer);
  }

  // One thread, then fence_barrier_init() and a CTA barrier.
  __device__ __forceinline__ void init_barriers() const {
    mbarrier_init(kv_full, 1);
    mbarrier_init(kv_empty, K::kConsumerThreads);
    mbarrier_init(dq_full, K::kConsumerThreads);
    mbarrier_init(dq_empty, 32);
#pragma unroll
    for (int s = 0; s < K::kStages; ++s) {
      mbarrier_init(pipe.full_barrier(s), 33);  // the TMA thread's expect_tx, the stats warp
      mbarrier_init(pipe.empty_barrier(s), K::kConsumerThreads);
    }
    if constexpr (K::kPingPong)
#pragma unroll
      for (int b = 0; b < 4; ++b) mbarrier_init(ds_ready + 8 * b, 128);
  }
};

// The (query head, query block) steps of one key block: every query head of the GQA group, and
// the query blocks that see the block (causal, bottom-right: from the block holding row
// n0 - diagonal), block fastest. The producer, the consumers and the dQ writer walk the same list.
template <class K>
struct WsBwdSteps {
  int m_block_first = 0, m_blocks = 0, kv_head = 0;
  int group_size = 1;
  __device__ __forceinline__ WsBwdSteps(const FlashjitAttentionParams& p, int diagonal, int n0,
                                        int kv_head_) {
    const int m_blocks_total = (p.seqlen_q + K::kBlockM - 1) / K::kBlockM;
    if constexpr (K::kCausal) {
      const int first_row = n0 - diagonal;
      m_block_first = first_row <= 0 ? 0 : first_row / K::kBlockM;
      if (m_block_first > m_blocks_total) m_block_first = m_blocks_total;
    }
    m_blocks = m_blocks_total - m_block_first;
    kv_head = kv_head_;
    group_size = p.group_size;
  }
  __device__ __forceinline__ int count() const { return m_blocks * group_size; }
  __device__ __forceinline__ int head(int t) const { return kv_head * group_size + t / m_blocks; }
  __device__ __forceinline__ int m0(int t) const {
    return (m_block_first + t % m_blocks) * K::kBlockM;
  }
};

// One key tile: keys [n_block * kBlockN, + kBlockN) of one kv head of one batch entry.
struct WsBwdTile {
  int n_block, kv_head, batch;
};

// Which key tiles a CTA computes; every role walks the same sequence independently (it depends
// on the grid and the problem only):   for (WsBwdTile tile; tiles.next(p, tile);) { ... }
//   PERSISTENT false: one tile per CTA, from the grid (x = key block, y = kv head, z = batch);
//     causal key blocks near the start are seen by the most query blocks and launch first.
//   PERSISTENT true: a grid of G CTAs (one per SM) over the T = n_blocks x heads_kv x batch
//     tiles; in round r, CTA c takes tile r G + c of the list: non-causal key block fastest (CTAs
//     in flight read the Q, dO of the same heads); causal heaviest first (key blocks from the
//     first up, heads and batches within each), odd rounds walked backwards so that the CTA that
//     took a round's heaviest tile takes the next round's lightest (a static longest-processing-
//     time order, as the -ws forward's tile scheduler does).
template <bool CAUSAL, bool PERSISTENT, int BLOCK_N>
struct WsBwdTileScheduler;

template <bool CAUSAL, int BLOCK_N>
struct WsBwdTileScheduler<CAUSAL, false, BLOCK_N> {
  bool done = false;
  __device__ __forceinline__ bool next(const FlashjitAttentionParams&, WsBwdTile& t) {
    if (done) return false;
    done = true;
    t = {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
    return true;
  }
};

template <bool CAUSAL, int BLOCK_N>
struct WsBwdTileScheduler<CAUSAL, true, BLOCK_N> {
  int round = 0;  // the CTA's next round; the list's sizes are read from the params each time
  __device__ __forceinline__ bool next(const FlashjitAttentionParams& p, WsBwdTile& t) {
    const int n_blocks = (p.seqlen_k + BLOCK_N - 1) / BLOCK_N;
    const int heads_batch = p.heads_kv * p.batch;
    const int ctas = static_cast<int>(gridDim.x), cta = static_cast<int>(blockIdx.x);
    const int slot = CAUSAL && round % 2 == 1 ? ctas - 1 - cta : cta;
    const int index = round * ctas + slot;
    ++round;
    if (index >= n_blocks * heads_batch) return false;  // and every later round's index is larger
    if (CAUSAL)
      t = {index / heads_batch, index % heads_batch % p.heads_kv, index % heads_batch / p.heads_kv};
    else
      t = {index % n_blocks, index / n_blocks % p.heads_kv, index / n_blocks / p.heads_kv};
    return true;
  }
};

// ---- the producer: K_j, V_j once, then Q_i, dO_i (TMA: one thread of warp 0) and lse_log2_i,
// delta_i (generic copies: warp 2) per step; full[s] takes 1 + 32 arrivals ----------------------

// Every buffer released before the producing thread exits (its loads landed and were read).
template <class K>
__device__ __forceinline__ void ws_bwd_producer_tail(const WsBwdShared<K>& smem,
                                                     PipelineState<K::kStages> at) {
#pragma unroll
  for (int s = 0; s < K::kStages; ++s) {
    mbarrier_wait(smem.pipe.empty_barrier(at.index), at.phase ^ 1);
    at.advance();
  }
}

// The TMA thread's position across tiles: the Q/dO pipeline, the tiles seen (kv_empty's rounds).
template <class K>
struct WsBwdLoads {
  PipelineState<K::kStages> at;
  int tiles = 0;
};

template <class K>
__device__ __forceinline__ void ws_bwd_load_tiles(const FlashjitForwardTensorMaps& maps,
                                                  const WsBwdShared<K>& smem,
                                                  const WsBwdSteps<K>& steps, const WsBwdTile& tile,
                                                  WsBwdLoads<K>& pos) {
  // The K/V tiles are free: the consumers' epilogue of the previous tile has read them.
  mbarrier_wait(smem.kv_empty, (pos.tiles & 1) ^ 1);
  ++pos.tiles;
  const int n = steps.count();
  if (n == 0) return;  // no query sees the tile: the consumers write dK = dV = 0
  const int n0 = tile.n_block * K::kBlockN;
  mbarrier_arrive_expect_tx(smem.kv_full, 2 * K::kKvTileBytes);
#pragma unroll
  for (int c = 0; c < K::kColumnBlocks; ++c) {
    tma_load_4d(smem.k + c * K::kBlockN * 128, &maps.k, smem.kv_full, c * 64, n0, tile.kv_head,
                tile.batch);
    tma_load_4d(smem.v + c * K::kBlockN * 128, &maps.v, smem.kv_full, c * 64, n0, tile.kv_head,
                tile.batch);
  }
  PipelineState<K::kStages>& at = pos.at;
  for (int t = 0; t < n; ++t) {
    const int head = steps.head(t), m0 = steps.m0(t);
    mbarrier_wait(smem.pipe.empty_barrier(at.index), at.phase ^ 1);
    const u32 full = smem.pipe.full_barrier(at.index);
    mbarrier_arrive_expect_tx(full, 2 * K::kQTileBytes);
    const u32 q = smem.q + at.index * K::kQTileBytes, d_o = smem.d_o + at.index * K::kQTileBytes;
#pragma unroll
    for (int c = 0; c < K::kColumnBlocks; ++c) {
      tma_load_4d(q + c * K::kBlockM * 128, &maps.q, full, c * 64, m0, head, tile.batch);
      tma_load_4d(d_o + c * K::kBlockM * 128, &maps.o, full, c * 64, m0, head, tile.batch);
    }
    at.advance();
  }
}

template <class K>
__device__ __forceinline__ void ws_bwd_load_stats(const FlashjitAttentionParams& p,
                                                  const WsBwdShared<K>& smem,
                                                  const WsBwdSteps<K>& steps, int batch,
                                                  PipelineState<K::kStages>& at) {
  const int lane = threadIdx.x % 32;
  const int n = steps.count();
  for (int t = 0; t < n; ++t) {
    mbarrier_wait(smem.pipe.empty_barrier(at.index), at.phase ^ 1);
    // lse_log2 and delta rows are padded to seqlen_q_rounded: whole blocks, no bounds. 16 bytes
    // a copy: lane l copies 16-byte chunk l (and l + 32, ...) of lse_log2 then delta.
    const long long row =
        (static_cast<long long>(batch) * p.heads_q + steps.head(t)) * p.seqlen_q_rounded +
        steps.m0(t);
    constexpr int kCopies = K::kBlockM / 4;  // per vector
#pragma unroll
    for (int i = 0; i < (2 * kCopies + 31) / 32; ++i) {
      const int copy = lane + 32 * i;
      if (copy < 2 * kCopies) {
        const bool is_delta = copy >= kCopies;
        const int c = copy % kCopies;
        const Vec16 value =
            *reinterpret_cast<const Vec16*>((is_delta ? p.delta : p.lse_log2) + row + 4 * c);
        const u32 at_stat = smem.stats + (2 * at.index + is_delta) * K::kStatBytes + 16 * c;
        store_shared_u32(at_stat, value.x);
        store_shared_u32(at_stat + 4, value.y);
        store_shared_u32(at_stat + 8, value.z);
        store_shared_u32(at_stat + 12, value.w);
      }
    }
    mbarrier_arrive(smem.pipe.full_barrier(at.index));
    at.advance();
  }
}

// ---- the dQ writer: each step's staged rows added into dq_accum ---------------------------------

template <class K>
__device__ __forceinline__ void ws_bwd_write_dq(const FlashjitAttentionParams& p,
                                                const WsBwdShared<K>& smem,
                                                const WsBwdSteps<K>& steps, int batch, int& step) {
  const int lane = threadIdx.x % 32;
  const int n = steps.count();
  for (int t = 0; t < n; ++t, ++step) {
    mbarrier_wait(smem.dq_full, step & 1);  // (step: the CTA's steps over all its tiles)
    float* const accum = p.dq_accum + ((static_cast<long long>(batch) * p.heads_q + steps.head(t)) *
                                           p.seqlen_q_rounded +
                                       steps.m0(t)) *
                                          K::kHeadDimPadded;
    // One bulk reduction of the whole tile: the staged rows are contiguous, as the rows of
    // dq_accum are (per-row reductions, 64 a step, measured the same time per step at d 64 as
    // at d 128: the bulk-copy unit's per-operation cost). Rows past seqlen_q (the last
    // block's) add zeros into the accumulator's padding rows.
    if (lane == 0) {
      bulk_reduce_add_f32(accum, smem.dq_stage, K::kDqStageBytes);
      bulk_commit_group();
      bulk_wait_group_read<0>();  // the staged rows are read: the consumers may stage the next
    }
    __syncwarp();
    mbarrier_arrive(smem.dq_empty);
  }
}

// ---- the consumers ------------------------------------------------------------------------------

// A consumer's position across tiles: the Q/dO pipeline, its steps over all tiles (the dS^T
// buffer and the dq_empty/dq_full rounds), the K/V loads waited for.
template <class K>
struct WsBwdReads {
  PipelineState<K::kStages> at;
  int step = 0;
  int kv_loads = 0;
};

template <class K>
__device__ __forceinline__ void ws_bwd_consume(const FlashjitAttentionParams& p,
                                               const WsBwdShared<K>& smem,
                                               const WsBwdSteps<K>& steps, const WsBwdTile& tile,
                                               int consumer, int diagonal,
                                               unsigned char* window_base, WsBwdReads<K>& pos) {
  const WsTurns<K> turns{consumer};
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kDp = K::kHeadDimPadded;
  constexpr int kSdpN = K::kSdpN, kKvChunk = K::kKvChunk, kKvChunks = K::kKvChunks;
  constexpr int kDqN = K::kDqN;
  constexpr bool kBf16 = K::kIsBf16;
  // Named barriers (0 is __syncthreads): 1 the consumers' meeting, 2 .. 3 each consumer's own,
  // 4 .. 5 the -pp turns (ws/pingpong.cuh's kWsTurnBarrier + consumer), 6 the dQ hand-off.
  constexpr int kConsumersBarrier = 1;  // named barrier of the consumer warpgroups
  // Split keys: consumer 0's dQ share staged, consumer 1 may add (arrive 0, sync 1). Consumer 0
  // arrives for step t + 1 only after dq_empty of step t, which needs consumer 1's dq_full
  // arrival of step t, after its sync: the barrier never holds two arrivals of consumer 0.
  constexpr int kDqHandOffBarrier = 6;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int frag_row = (warp % 4) * 16 + lane / 4;  // accumulator row within the 64 (+ 8)
  const int frag_col = 2 * (lane % 4);              // accumulator column within 8 (+ 1)
  const int n = steps.count();
  const int n0 = tile.n_block * kBlockN;

  float dv[kKvChunks][kKvChunk / 2], dk[kKvChunks][kKvChunk / 2];  // fp32, 64 keys x kDp
  clear_kv(dv, dk);
  float st[kSdpN / 2], dpt[kSdpN / 2];        // S^T then P^T; dP^T then dS^T (fp32)
  u32 pt[kSdpN / 16][4], dst[kSdpN / 16][4];  // P^T, dS^T in 16 bits: A fragments
  float dq[kDqN / 2];                         // one dQ tile

  auto issue_kv = [&](float(&d)[kKvChunks][kKvChunk / 2], const u32(&a)[kSdpN / 16][4], u64 b_cols,
                      int buffer) {  // d += A^T-rows x B over the step's queries
    wgmma_pv<kBlockM, kKvChunk, kBf16>(d, a, b_cols, buffer * K::kQTileBytes);
  };
  // dQ tile = dS[64 rows of tile, keys] K_j[keys, cols]: every key of the CTA, or (split keys)
  // this consumer's 64.
  const int dq_key0 = K::kDqSplitKeys ? consumer * 64 : 0;
  auto issue_dq = [&](int tile, int ds_buffer, u64 ds_cols, u64 k_cols) {
    const int mt = tile / K::kDqColTiles, nc = tile % K::kDqColTiles;
    wgmma_over_keys<K::kDqKeys, kDqN, kBf16>(dq, ds_cols,
                                             ds_buffer * K::kScoreTileBytes + mt * kBlockN * 128,
                                             k_cols, nc * kBlockN * 128, dq_key0);
  };
  auto stage_dq = [&](int tile) {  // this thread's share of a dQ tile into its staged rows, fp32
    const int mt = tile / K::kDqColTiles, nc = tile % K::kDqColTiles;
    const u32 stage =
        smem.dq_stage + (mt * 64 + frag_row) * K::kDqStageRowBytes + (nc * kDqN + frag_col) * 4;
    // Split keys: consumer 1 adds its share onto consumer 0's, element for element (the same
    // fragment positions), once consumer 0 has passed the hand-off barrier.
    const bool add = K::kDqSplitKeys && consumer == 1;
    if (add) named_barrier_sync(kDqHandOffBarrier, K::kConsumerThreads);
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int t = 0; t < kDqN / 8; ++t) {
        const u32 at = stage + 8 * half * K::kDqStageRowBytes + 32 * t;
        float x = dq[4 * t + 2 * half], y = dq[4 * t + 2 * half + 1];
        if (add) {
          x += load_shared_f32(at);
          y += load_shared_f32(at + 4);
        }
        store_shared_u32(at, __float_as_uint(x));
        store_shared_u32(at + 4, __float_as_uint(y));
      }
    if (K::kDqSplitKeys && consumer == 0)
      named_barrier_arrive(kDqHandOffBarrier, K::kConsumerThreads);
  };

  if (n > 0) mbarrier_wait(smem.kv_full, pos.kv_loads++ & 1);
  PipelineState<K::kStages>& at = pos.at;
  for (int t = 0; t < n; ++t, ++pos.step) {
    const int m0 = steps.m0(t), buffer = at.index, ds_buffer = pos.step & 1;
    const int dq_tile = K::kDqSplitKeys ? 0 : consumer;
    // Descriptors (wgmma.cuh), formed again each step from an opaque copy of the window's
    // address: held across the loop instead, they spilled once the tile loop (-persist) was
    // around it. S^T = K_c Q^T, dP^T = V_c dO^T: A = this consumer's 64 key rows, B = the step's
    // kBlockM query rows, both K-major over the head dim.
    u32 k_tile = smem.k;
    asm volatile("" : "+r"(k_tile));
    const u32 v_tile = k_tile + (smem.v - smem.k), q_tile = k_tile + (smem.q - smem.k);
    const u32 do_tile = k_tile + (smem.d_o - smem.k), ds_tile = k_tile + (smem.ds - smem.k);
    const u64 k_rows = smem_descriptor(k_tile + consumer * 64 * 128, 16, 1024);
    const u64 v_rows = smem_descriptor(v_tile + consumer * 64 * 128, 16, 1024);
    const u64 q_rows = smem_descriptor(q_tile, 16, 1024);
    const u64 do_rows = smem_descriptor(do_tile, 16, 1024);
    // dV += P^T dO, dK += dS^T Q: B = dO, Q MN-major over the queries.
    const u64 do_cols = smem_descriptor(do_tile, kBlockM * 128, 1024);
    const u64 q_cols = smem_descriptor(q_tile, kBlockM * 128, 1024);
    // dQ = dS K_j: A = dS, the MN-major view of dS^T; B = K_j MN-major over the keys.
    const u64 ds_cols = smem_descriptor(ds_tile, kBlockN * 128, 1024);
    const u64 k_cols = smem_descriptor(k_tile, kBlockN * 128, 1024);
    smem.pipe.consumer_wait(at);  // Q_i, dO_i, the stats of step t
    turns.take();                 // -pp: the other consumer has issued its S^T, dP^T
    wgmma_fence();
    wgmma_over_head_dim<kSdpN, kDp, kBlockN, kBlockM, kBf16>(st, k_rows, q_rows,
                                                             buffer * K::kQTileBytes);
    wgmma_over_head_dim<kSdpN, kDp, kBlockN, kBlockM, kBf16>(dpt, v_rows, do_rows,
                                                             buffer * K::kQTileBytes);
    turns.pass();
    // P^T = exp2(S^T * scale_log2 - lse), masked in blocks that cross an edge; then dS^T
    // (cuda/attention_bwd_sm90.cuh's plain path).
    const float* stats = reinterpret_cast<const float*>(window_base + (smem.stats - smem.k) +
                                                        2 * buffer * K::kStatBytes);
    scores_to_fragments<kSdpN, kBlockM, K::kCausal, kBf16>(st, dpt, pt, dst, p, diagonal, m0, n0,
                                                           kBlockN, n0 + consumer * 64 + frag_row,
                                                           m0 + frag_col, stats + frag_col);
    // dS^T of every consumer's keys in shared memory before any dQ tile reads it.
    store_fragments<kSdpN, kBlockN>(
        window_base + (smem.ds - smem.k) + ds_buffer * K::kScoreTileBytes, dst, consumer * 64, 0);
    fence_proxy_async();
    if constexpr (K::kDqSplitKeys) {
      // d <= 64: this consumer's dQ share reads its own dS^T rows only: its warpgroup's barrier.
      named_barrier_sync(2 + consumer, 128);
      wgmma_fence();
      issue_kv(dv, pt, do_cols, buffer);
      issue_kv(dk, dst, q_cols, buffer);
      issue_dq(dq_tile, ds_buffer, ds_cols, k_cols);
    } else if constexpr (!K::kPingPong) {
      named_barrier_sync(kConsumersBarrier, K::kConsumerThreads);
      // (Issuing dV before this barrier and staging the dQ tile while dK runs measured 3-5%
      // slower on an H200 at 25d4de2: bench/device_run.sh bwd-ws; docs/PERFORMANCE.md.)
      wgmma_fence();                      // pt, dst (written above) are ready for the tensor cores
      issue_kv(dv, pt, do_cols, buffer);  // dV += P^T dO_i
      issue_kv(dk, dst, q_cols, buffer);  // dK += dS^T Q_i
      issue_dq(dq_tile, ds_buffer, ds_cols, k_cols);  // dQ tile = dS K_j[:, this consumer's cols]
    } else {
      // -pp: no meeting point. This consumer's rows are announced, dV and dK (its own data) go
      // first, and dQ waits for both consumers' rows of this step's buffer.
      mbarrier_arrive(smem.ds_ready_barrier(consumer, ds_buffer));
      wgmma_fence();
      issue_kv(dv, pt, do_cols, buffer);
      issue_kv(dk, dst, q_cols, buffer);
      const int phase = (pos.step >> 1) & 1;  // the buffer's uses so far
      mbarrier_wait(smem.ds_ready_barrier(0, ds_buffer), phase);
      mbarrier_wait(smem.ds_ready_barrier(1, ds_buffer), phase);
      issue_dq(dq_tile, ds_buffer, ds_cols, k_cols);
    }
    wgmma_wait<0>();
    pin(pt);
    pin(dst);
    pin(dq);
    pin_kv(dv, dk);
    smem.pipe.consumer_release(at);  // Q_i, dO_i and the stats are read
    at.advance();
    mbarrier_wait(smem.dq_empty, (pos.step & 1) ^ 1);  // the writer has read the last rows
    stage_dq(dq_tile);
    fence_proxy_async();  // the staged rows, visible to the bulk reductions
    mbarrier_arrive(smem.dq_full);
  }

  // Epilogue: every consumer's dQ wgmmas (which read all of K_j) are done before K_j's tile
  // takes dK; dK *= scale; both rounded into the K and V tiles (this consumer's 64 rows), then
  // 16-byte row stores of those rows.
  named_barrier_sync(kConsumersBarrier, K::kConsumerThreads);
  unsigned char* const k_tile = window_base;
  unsigned char* const v_tile = window_base + (smem.v - smem.k);
#pragma unroll
  for (int c = 0; c < kKvChunks; ++c) {
    store_accumulator<kKvChunk, kBlockN, kBf16>(k_tile, dk[c], consumer * 64, c * kKvChunk,
                                                p.scale);
    store_accumulator<kKvChunk, kBlockN, kBf16>(v_tile, dv[c], consumer * 64, c * kKvChunk, 1.f);
  }
  named_barrier_sync(2 + consumer, 128);  // this warpgroup's rows are in
  u16* dk_out = static_cast<u16*>(p.dk) + tile.batch * p.dk_batch_stride +
                tile.kv_head * p.dk_head_stride + n0 * p.dk_seq_stride;
  u16* dv_out = static_cast<u16*>(p.dv) + tile.batch * p.dv_batch_stride +
                tile.kv_head * p.dv_head_stride + n0 * p.dv_seq_stride;
  constexpr int kChunksPerRow = kDp / 8;
  const int valid_rows = p.seqlen_k - n0;
  for (int copy = threadIdx.x % 128; copy < 64 * kChunksPerRow; copy += 128) {
    const int row = consumer * 64 + copy / kChunksPerRow, col = copy % kChunksPerRow * 8;
    if (row < valid_rows && col < K::kHeadDim) {
      *reinterpret_cast<Vec16*>(dk_out + row * p.dk_seq_stride + col) =
          *reinterpret_cast<const Vec16*>(k_tile + wg_tile_offset<kBlockN>(row, col));
      *reinterpret_cast<Vec16*>(dv_out + row * p.dv_seq_stride + col) =
          *reinterpret_cast<const Vec16*>(v_tile + wg_tile_offset<kBlockN>(row, col));
    }
  }
  mbarrier_arrive(smem.kv_empty);  // this thread's reads of the K/V tiles are done
}

// ---- the kernel: roles, barrier setup, the pieces in order -----------------------------------

template <class K>
__device__ __forceinline__ void attention_backward_ws_dkdv(const FlashjitAttentionParams& p,
                                                           const FlashjitForwardTensorMaps& maps) {
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  if (dynamic_smem_bytes() < static_cast<u32>(K::kSmemBytes)) __trap();  // a launch bug
  const WsBwdShared<K> smem(shared_address(shared_bytes));
  unsigned char* const window_base = shared_bytes + (smem.k - shared_address(shared_bytes));

  const int diagonal = flashjit_attention::diagonal(p);
  const int warpgroup = threadIdx.x / 128;

  ws_init_barriers(smem, maps);  // no CTA-wide barrier after this point

  WsBwdTileScheduler<K::kCausal, K::kPersistent, K::kBlockN> tiles;
  auto steps_of = [&](const WsBwdTile& tile) {
    return WsBwdSteps<K>(p, diagonal, tile.n_block * K::kBlockN, tile.kv_head);
  };
  if (warpgroup == 0) {  // the producer warpgroup: TMA (thread 0), dQ writer, stats (warp 2)
    setmaxnreg_dec<K::kProducerRegisters>();
    const int warp = threadIdx.x / 32;
    if (threadIdx.x == 0) {
      WsBwdLoads<K> pos;
      for (WsBwdTile tile; tiles.next(p, tile);)
        ws_bwd_load_tiles<K>(maps, smem, steps_of(tile), tile, pos);
      ws_bwd_producer_tail<K>(smem, pos.at);
    } else if (warp == 1) {
      int step = 0;
      for (WsBwdTile tile; tiles.next(p, tile);)
        ws_bwd_write_dq<K>(p, smem, steps_of(tile), tile.batch, step);
      bulk_wait_group<0>();  // the adds are done before the CTA ends
    } else if (warp == 2) {
      PipelineState<K::kStages> at;
      for (WsBwdTile tile; tiles.next(p, tile);)
        ws_bwd_load_stats<K>(p, smem, steps_of(tile), tile.batch, at);
      ws_bwd_producer_tail<K>(smem, at);
    }
  } else {
    setmaxnreg_inc<K::kConsumerRegisters>();
    WsTurns<K>{warpgroup - 1}.init();
    WsBwdReads<K> pos;
    for (WsBwdTile tile; tiles.next(p, tile);)
      ws_bwd_consume<K>(p, smem, steps_of(tile), tile, warpgroup - 1, diagonal, window_base, pos);
  }
}

}  // namespace flashjit_kernel
