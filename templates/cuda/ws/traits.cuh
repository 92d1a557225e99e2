// Compile-time shape of the warp-specialized Hopper forward (configs "-ws") and its shared
// memory. generator/forward_config_ws.cpp mirrors every number here (the budget); the emulation
// test checks that the two agree.
//
// A CTA is 1 + kConsumers warpgroups of 128 threads:
//   warpgroup 0      the producer: after setmaxnreg.dec to kProducerRegisters one thread issues
//                    every TMA load (Q once, then K and V blocks through two pipelines); the
//                    other threads exit.
//   warpgroups 1..C  consumers: after setmaxnreg.inc to kConsumerRegisters each owns 64 query
//                    rows end to end (S = Q K^T, online softmax, O += P V, epilogue).
// Registers: the launch gives every thread kLaunchRegisters (__launch_bounds__(kThreads,
// kCtasPerSm)); the producer gives back what the consumers take:
//   kProducerRegisters + kConsumers * kConsumerRegisters <= (1 + kConsumers) * kLaunchRegisters.
//
// Shared memory (tiles in wgmma's 128-byte swizzled layout, cuda/sm90_tiles.cuh, which is what
// a TMA box of 64 columns x rows with 128-byte swizzle writes; 1024-byte aligned):
//   Q      [kBlockM, kDp]               loaded once per tile; each consumer's 64 rows become its O
//                                       in the epilogue (written back with TMA stores)
//   K, V   kStages x [kBlockN, kDp]     each
//   mbarriers: Q full, Q empty, then K full[kStages], K empty, V full, V empty (8 bytes each)
//
// Scheduling knobs (config suffixes "-pp", "-persist"):
//   PINGPONG    the consumer warpgroups take turns issuing their GEMMs (ws/pingpong.cuh), so
//               that one's softmax runs under the others' GEMMs; 2 or 3 consumers.
//   PERSISTENT  one CTA per SM slot walks a list of tiles (ws/tile_scheduler.cuh); the Q tile's
//               buffer is released by the consumers' epilogue (Q empty) before the next Q load.

namespace flashjit_kernel {

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool IS_BF16, bool CAUSAL,
          bool PINGPONG = false, bool PERSISTENT = false>
struct WsTraits {
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kHeadDimPadded = (HEAD_DIM + 63) / 64 * 64;  // whole 64-column blocks
  static constexpr int kColumnBlocks = kHeadDimPadded / 64;         // TMA boxes per tile
  static constexpr int kBlockM = BLOCK_M;
  static constexpr int kBlockN = BLOCK_N;
  static constexpr int kStages = STAGES;
  static constexpr bool kIsBf16 = IS_BF16;
  static constexpr bool kCausal = CAUSAL;
  static constexpr bool kPingPong = PINGPONG;
  static constexpr bool kPersistent = PERSISTENT;

  static constexpr int kConsumers = BLOCK_M / 64;  // consumer warpgroups, 64 rows each
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kConsumerThreads = kConsumers * 128;
  // One consumer warpgroup: two CTAs per SM (half the registers each); more: one.
  static constexpr int kCtasPerSm = kConsumers == 1 ? 2 : 1;
  static constexpr int kLaunchRegisters = 65536 / (kCtasPerSm * kThreads) / 8 * 8;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters_ =
      ((1 + kConsumers) * kLaunchRegisters - kProducerRegisters) / kConsumers / 8 * 8;
  static constexpr int kConsumerRegisters = kConsumerRegisters_ < 240 ? kConsumerRegisters_ : 240;

  static constexpr int kNTiles = kBlockN / 8;  // 8-key column tiles of S
  // P V is issued in N-chunks of the head dim: one wgmma up to n128.
  static constexpr int kPvChunk = kHeadDimPadded % 128 == 0 ? 128 : 64;
  static constexpr int kPvChunks = kHeadDimPadded / kPvChunk;
  static constexpr int kQTileBytes = kBlockM * kHeadDimPadded * 2;
  static constexpr int kKvTileBytes = kBlockN * kHeadDimPadded * 2;
  static constexpr int kBarriers = 2 + 4 * kStages;
  // + 1024: the dynamic shared window is rounded up to a swizzle atom.
  static constexpr int kSmemBytes = 1024 + kQTileBytes + 2 * kStages * kKvTileBytes + 8 * kBarriers;

  static_assert(kHeadDim % 8 == 0 && kHeadDim >= 8 && kHeadDim <= 256,
                "head dim: a multiple of 8 in [8, 256]");
  static_assert(kBlockM == 64 || kBlockM == 128 || kBlockM == 192,
                "1, 2 or 3 consumer warpgroups of 64 rows");
  static_assert(WARPS == 4 * (1 + kConsumers), "a producer warpgroup and the consumers");
  static_assert(kBlockN == 64 || kBlockN == 128, "S = Q K^T is one m64n64 or m64n128 wgmma");
  static_assert(kStages >= 2 && kStages <= 4, "2 to 4 K and V buffers");
  static_assert(!kPingPong || kConsumers >= 2, "ping-pong takes turns between 2 or 3 consumers");
  static_assert(kBlockN <= 256 && kBlockM <= 256, "TMA boxes have at most 256 rows");
  static_assert(kConsumerRegisters >= kProducerRegisters && kConsumerRegisters % 8 == 0,
                "setmaxnreg counts are multiples of 8");
  static_assert(kProducerRegisters + kConsumers * kConsumerRegisters <=
                    (1 + kConsumers) * kLaunchRegisters,
                "the consumers take no more registers than the producer gives back");
};

// Shared-memory addresses (shared space) of one CTA's tiles and barriers.
template <class K>
struct WsShared {
  u32 q;        // [kBlockM, kDp]
  u32 k, v;     // kStages x [kBlockN, kDp] each
  u32 q_full;   // mbarrier: Q has landed (1 arrival + its bytes)
  u32 q_empty;  // mbarrier: the consumers' O stores have read the Q/O buffer (one per consumer)
  Pipeline<K::kStages> k_pipe, v_pipe;

  // `window`: the shared address of the dynamic shared memory (any alignment).
  __device__ __forceinline__ explicit WsShared(u32 window) {
    q = (window + 1023) & ~1023u;  // swizzle atoms start on 1024-byte boundaries
    k = q + K::kQTileBytes;
    v = k + K::kStages * K::kKvTileBytes;
    q_full = v + K::kStages * K::kKvTileBytes;
    q_empty = q_full + 8;
    k_pipe.full = q_empty + 8;
    k_pipe.empty = k_pipe.full + 8 * K::kStages;
    v_pipe.full = k_pipe.empty + 8 * K::kStages;
    v_pipe.empty = v_pipe.full + 8 * K::kStages;
  }

  // One thread, then fence_barrier_init() and a CTA barrier.
  __device__ __forceinline__ void init_barriers() const {
    mbarrier_init(q_full, 1);
    mbarrier_init(q_empty, K::kConsumers);
    k_pipe.init(K::kConsumerThreads);
    v_pipe.init(K::kConsumerThreads);
  }
};

}  // namespace flashjit_kernel
