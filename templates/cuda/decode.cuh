// flashjit decode for NVIDIA sm80+ (A100 .. H100/H200): split-KV (flash-decoding) with GQA
// packing over a contiguous or paged K/V cache, tensor cores via mma.sync m16n8k16. The
// algorithm and its knobs are generator/decode_config.hpp's; the launch contract is
// generator/render_decode.hpp's. The renderer prepends templates/attention_params.h,
// templates/attention_common.h, cuda/common.cuh and cuda/tiles.cuh, and appends one
// instantiation.
//
// One CTA = (split, tile of kBlockM packed rows, kv head hk, batch b); packed row r is query
// position r / G of query head hk * G + r % G, so the group's heads share every K/V block:
//
// clang-format off
//   len  = seqlens_k[b] (or seqlen_k);  end = len, causal: min(len, last row's position + len - seqlen_q + 1)
//   this split's key blocks: [split * per, min((split + 1) * per, blocks)),  per = ceil(blocks / num_splits)
//   load Q tile (gathered rows)         Q: [kBlockM, d] -> shared
//   for each K/V block j of the split:  K_j, V_j: [kBlockN, d] through kStages buffers (cp.async;
//                                       paged: each key's row through the block table)
//     warp w takes keys [w * kWarpKeys, +kWarpKeys) of the block:
//     S_w = Q K_w^T, masked (len, causal per row); online softmax (m_w, l_w); O_w += P_w V_w
//   merge the warps (shared memory):    m = max_w m_w;  l = sum_w l_w 2^(m_w - m);  O = sum_w O_w 2^(m_w - m) / l
//   num_splits == 1: o, lse;  else partial_o = O (fp32), partial_lse = m + log2 l (base 2; -inf: no key)
//   num_splits > 1:  count this split in (the tile's counter); the tile's last split to finish
//                    merges every split's partials of the tile's rows into o, lse (one warp per
//                    row) and sets the counter back to 0 for the next call
// clang-format on
//
// One launch per call: the combine runs in the tail of the split kernel, not as a second kernel
// (whose launch and ramp cost ~5 us of a ~20 us call at batch 1, 8k keys). The counters are the
// workspace's (runtime/decode_launch.hpp, DecodeWorkspace): int32 [batch, heads_kv, row tiles]
// right after partial_lse, zero before the call (the runtime zeroes them when it cannot know they
// are) and zero again after it, so a CUDA graph replays the call as it is.
//
// Keys at or past len are never read (zero-filled in shared memory, masked in S), so block-table
// entries past a sequence's pages may hold anything.

namespace flashjit_kernel {

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool IS_BF16, bool CAUSAL,
          int PAGE_SIZE>
struct DecodeTraits {
  // kHeadDimPadded: whole swizzle groups.
  FLASHJIT_TRAITS_SHAPE(HEAD_DIM, (HEAD_DIM + 63) / 64 * 64, BLOCK_M, BLOCK_N, WARPS, STAGES,
                        IS_BF16, CAUSAL);
  static constexpr int kPageSize = PAGE_SIZE;  // 0: contiguous K/V

  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = kBlockM / 16;        // 16-row MMA tiles (every warp: all rows)
  static constexpr int kWarpKeys = kBlockN / kWarps;  // keys of a block per warp
  static constexpr int kNTiles = kWarpKeys / 8;       // 8-column tiles of a warp's S
  static constexpr int kDTiles = kHeadDimPadded / 8;  // 8-column tiles of O
  static constexpr int kChunksPerRow = kHeadDimPadded / 8;
  static constexpr int kRowBytes = kHeadDimPadded * 2;
  static constexpr int kKvCopies = kBlockN * kChunksPerRow / kThreads;  // per thread, K and V each
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kKvBytes = 2 * kStages * kBlockN * kRowBytes;
  // After the last block the K/V buffers hold each warp's O (fp32) and m, l for the merge.
  static constexpr int kMergeOFloats = kWarps * kBlockM * kHeadDimPadded;
  static constexpr int kMergeBytes = (kMergeOFloats + 2 * kWarps * kBlockM) * 4;
  static constexpr int kSmemBytes = kQBytes + (kKvBytes > kMergeBytes ? kKvBytes : kMergeBytes);

  static_assert(kBlockM == 16 || kBlockM == 32, "16 or 32 packed rows per CTA");
  static_assert(kWarps == 2 || kWarps == 4 || kWarps == 8, "2, 4 or 8 warps");
  static_assert(kWarpKeys % 16 == 0, "P feeds P V in k-steps of 16 keys per warp");
  static_assert(kStages >= 2 && kStages <= 4, "2 to 4 K/V pipeline stages");
  static_assert((kBlockN * kChunksPerRow) % kThreads == 0, "K/V tile copies split evenly");
  static_assert(kPageSize == 0 || (kPageSize % 16 == 0 && kPageSize >= 16 && kPageSize <= 256),
                "page size: 0 (contiguous) or a multiple of 16 in [16, 256]");
};

// Starts the copies of keys [n0, n0 + kBlockN) of (batch, kv_head) into the K and V tiles:
// keys at or past `len` (and the head dim's padding) are zero-filled and never read from global
// memory. Paged: each key's row through the block table (one lookup per copy, shared by K and V).
template <class K>
__device__ __forceinline__ void decode_load_kv(const FlashjitAttentionParams& p, u32 k_tile,
                                               u32 v_tile, int batch, int kv_head, int n0,
                                               int len) {
  constexpr int kDp = K::kHeadDimPadded;
  const flashjit_decode::KvSource<K::kPageSize> kv(p, batch, kv_head);
#pragma unroll
  for (int i = 0; i < K::kKvCopies; ++i) {
    const int copy = threadIdx.x + i * K::kThreads;
    const int row = copy / K::kChunksPerRow;
    const int col = copy % K::kChunksPerRow * 8;
    const int key = n0 + row;
    const bool valid = key < len && col < K::kHeadDim;
    long long k_offset = 0, v_offset = 0;
    if (valid) kv.offsets(p, key, col, k_offset, v_offset);
    const u32 to = 2 * swizzled_offset<kDp>(row, col);
    cp_async_16(k_tile + to, kv.k + k_offset, valid ? 16 : 0);
    cp_async_16(v_tile + to, kv.v + v_offset, valid ? 16 : 0);
  }
}

// ---- decode_split.h's portability layer on CUDA ------------------------------------------------

struct DecodeGpu {
  static constexpr int kLanes = 32;
  static constexpr int kCombineLoads = 64;  // partial-O loads a lane keeps in flight
  typedef flashjit_kernel::Vec16 Vec16;
  typedef float4 Float4;
  static __device__ __forceinline__ float shuffle_xor(float x, int mask) {
    return __shfl_xor_sync(0xffffffffu, x, mask);
  }
  // The partials were written by other CTAs of this launch: read through L2 (ld.global.cg),
  // never from this SM's L1.
  static __device__ __forceinline__ float load_l2(const float* x) { return __ldcg(x); }
  static __device__ __forceinline__ float fmax(float a, float b) { return fmaxf(a, b); }
  static __device__ __forceinline__ float exp2(float x) { return fast_exp2(x); }
  static __device__ __forceinline__ float log2(float x) { return fast_log2(x); }
  template <bool IS_BF16>
  static __device__ __forceinline__ u32 pack2(float low, float high) {
    return flashjit_kernel::pack2<IS_BF16>(low, high);
  }
  static __device__ __forceinline__ void fence() { __threadfence(); }
  static __device__ __forceinline__ void barrier() { __syncthreads(); }
  static __device__ __forceinline__ int atomic_add(int* counter, int value) {
    return atomicAdd(counter, value);
  }
};

// ---- the split kernel ---------------------------------------------------------------------------

template <class K>
__device__ __forceinline__ void decode_split(const FlashjitAttentionParams& p) {
  namespace fa = flashjit_attention;
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kMTiles = K::kMTiles, kNTiles = K::kNTiles, kDTiles = K::kDTiles;
  constexpr int kDp = K::kHeadDimPadded;
  constexpr int kTileBytes = kBlockN * K::kRowBytes;

  unsigned char* shared_bytes = dynamic_shared_memory();
  const u32 q_tile = shared_address(shared_bytes);  // [kBlockM, d_padded]
  const u32 kv_tiles = q_tile + K::kQBytes;         // kStages x {K, V}: [kBlockN, d_padded]

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  // This CTA's split, row tile, kv head and batch, and the split's key blocks.
  const flashjit_decode::Work work =
      flashjit_decode::work_at<K::kCausal>(p, blockIdx.x, blockIdx.y, blockIdx.z, kBlockM, kBlockN);
  const int split = work.split, tile = work.tile, kv_head = work.kv_head, batch = work.batch;
  const int r0 = work.r0, len = work.len, diagonal = work.diagonal;
  const int first_block = work.first_block, n_blocks = work.n_blocks;
  const int group = p.group_size, packed_rows = group * p.seqlen_q;

  // Fragment layout of an m16n8 accumulator: lane holds rows lane/4 and lane/4 + 8, columns
  // 2 * (lane % 4) + {0, 1}. Byte offsets of what each lane addresses in its ldmatrix calls: Q as
  // the A operand, this warp's keys of K as B, of V as B through .trans.
  const int frag_row = lane / 4;
  const int frag_col = 2 * (lane % 4);
  const int warp_key0 = warp * K::kWarpKeys;
  const u32 q_lane = 2 * swizzled_offset<kDp>(lane % 16, lane / 16 * 8);
  const u32 k_lane =
      2 * swizzled_offset<kDp>(warp_key0 + lane / 16 * 8 + lane % 8, (lane / 8) % 2 * 8);
  const u32 v_lane =
      2 * swizzled_offset<kDp>(warp_key0 + (lane / 8) % 2 * 8 + lane % 8, lane / 16 * 8);

  float acc[kMTiles][kDTiles][4];  // this warp's O, fp32
  float row_max[kMTiles][2];       // m, in units of raw scores
  float row_sum[kMTiles][2];       // l, this lane's partial (reduced over the quad at the end)
  warp_softmax_init(acc, row_max, row_sum);

  if (n_blocks > 0) {
    // Prologue: the Q rows (gathered: packed row r is position r / G of head hk * G + r % G)
    // and the first kStages - 1 K/V blocks in flight, one commit group per block.
    const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride;
    for (int copy = threadIdx.x; copy < kBlockM * K::kChunksPerRow; copy += K::kThreads) {
      const int row = copy / K::kChunksPerRow;
      const int col = copy % K::kChunksPerRow * 8;
      const int r = r0 + row;
      const bool valid = r < packed_rows && col < K::kHeadDim;
      const long long offset = valid ? (r / group) * p.q_seq_stride +
                                           (kv_head * group + r % group) * p.q_head_stride + col
                                     : 0;
      cp_async_16(q_tile + 2 * swizzled_offset<kDp>(row, col), q + offset, valid ? 16 : 0);
    }
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_blocks) {
        const u32 k_tile = kv_tiles + (2 * s) * kTileBytes;
        decode_load_kv<K>(p, k_tile, k_tile + kTileBytes, batch, kv_head,
                          (first_block + s) * kBlockN, len);
      }
      cp_async_commit();
    }
  }

  for (int j = 0; j < n_blocks; ++j) {
    cp_async_wait<kStages - 2>();  // this thread's copies of block j (and Q) have landed
    __syncthreads();               // everyone's have; everyone is done with block j - 1's buffer
    {
      const int next = j + kStages - 1;  // refill the buffer block j - 1 used
      if (next < n_blocks) {
        const u32 k_tile = kv_tiles + 2 * (next % kStages) * kTileBytes;
        decode_load_kv<K>(p, k_tile, k_tile + kTileBytes, batch, kv_head,
                          (first_block + next) * kBlockN, len);
      }
      cp_async_commit();
    }
    const u32 k_tile = kv_tiles + 2 * (j % kStages) * kTileBytes;
    const u32 v_tile = k_tile + kTileBytes;
    const int n0 = (first_block + j) * kBlockN;

    // S = Q K_w^T: [kBlockM, kWarpKeys] per warp.
    float s[kMTiles][kNTiles][4];
    FLASHJIT_WARP_SCORES(kDp, K::kIsBf16, kMTiles, kNTiles, s, q_tile, q_lane, k_tile, k_lane);

    // Mask keys at or past len and, when causal, past each row's diagonal: only blocks that
    // reach one of those edges pay for it.
    if (n0 + kBlockN > len || (K::kCausal && n0 + kBlockN - 1 > r0 / group + diagonal)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = r0 + mt * 16 + frag_row + half * 8;
          int last = len - 1;  // the row's last visible key
          if (K::kCausal && row / group + diagonal < last) last = row / group + diagonal;
          const int limit = last - (n0 + warp_key0 + frag_col);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (nt * 8 + e > limit) s[mt][nt][2 * half + e] = minus_infinity();
        }
    }

    // Online softmax (base 2), then O_w += P_w V_w (cuda/warp_mma.cuh, as the prefill kernel).
    u32 p_packed[kMTiles][kNTiles][2];
    online_softmax_step<K::kIsBf16>(s, row_max, row_sum, acc, p_packed, p.scale_log2);
    FLASHJIT_WARP_PV(kDp, K::kIsBf16, kMTiles, kNTiles, kDTiles, acc, p_packed, v_tile, v_lane);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the K/V buffers: they hold the merge now

  // Each warp's O (unnormalized), m and l into the K/V buffers: [warp][row][d_padded] floats,
  // then [warp][row] pairs (m, l).
  float* merge_o = reinterpret_cast<float*>(shared_bytes + K::kQBytes);
  float* merge_ml = merge_o + K::kMergeOFloats;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = quad_sum(row_sum[mt][half]);
      const int row = mt * 16 + frag_row + half * 8;
      float* o_row = merge_o + (warp * kBlockM + row) * kDp;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        o_row[dt * 8 + frag_col] = acc[mt][dt][2 * half];
        o_row[dt * 8 + frag_col + 1] = acc[mt][dt][2 * half + 1];
      }
      if (lane % 4 == 0) {
        merge_ml[2 * (warp * kBlockM + row)] = row_max[mt][half];
        merge_ml[2 * (warp * kBlockM + row) + 1] = sum;
      }
    }
  __syncthreads();

  // Merge the warps and write a row's 8 columns per item: o and lse, or this split's partials;
  // with several splits, the tile's last one combines them (decode_split.h). The Q tile's bytes
  // are free by then: a word of them holds the flag.
  flashjit_decode::store_merged_rows<DecodeGpu, K, K::kWarps>(p, merge_o, merge_ml, threadIdx.x, r0,
                                                              batch, kv_head, split);
  if (p.num_splits == 1) return;
  flashjit_decode::count_split_and_combine<DecodeGpu, K, K::kWarps>(
      p, reinterpret_cast<int*>(shared_bytes), threadIdx.x, warp, lane, r0, batch, kv_head, tile,
      gridDim.x / p.num_splits);
}

}  // namespace flashjit_kernel
