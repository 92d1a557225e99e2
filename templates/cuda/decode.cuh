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

// The keys of sequence `batch`: seqlens_k[batch], or seqlen_k for every sequence.
__device__ __forceinline__ int decode_sequence_keys(const FlashjitAttentionParams& p, int batch) {
  return p.seqlens_k ? p.seqlens_k[batch] : p.seqlen_k;
}

// Starts the copies of keys [n0, n0 + kBlockN) of (batch, kv_head) into the K and V tiles:
// keys at or past `len` (and the head dim's padding) are zero-filled and never read from global
// memory. Paged: each key's row through the block table (one lookup per copy, shared by K and V).
template <class K>
__device__ __forceinline__ void decode_load_kv(const FlashjitAttentionParams& p, u32 k_tile,
                                               u32 v_tile, int batch, int kv_head, int n0,
                                               int len) {
  constexpr int kDp = K::kHeadDimPadded;
  const u16* k = static_cast<const u16*>(p.k) + kv_head * p.k_head_stride;
  const u16* v = static_cast<const u16*>(p.v) + kv_head * p.v_head_stride;
  if constexpr (K::kPageSize == 0) {
    k += batch * p.k_batch_stride;
    v += batch * p.v_batch_stride;
  }
  const int* table = K::kPageSize > 0 ? p.block_table + batch * p.block_table_stride : 0;
#pragma unroll
  for (int i = 0; i < K::kKvCopies; ++i) {
    const int copy = threadIdx.x + i * K::kThreads;
    const int row = copy / K::kChunksPerRow;
    const int col = copy % K::kChunksPerRow * 8;
    const int key = n0 + row;
    const bool valid = key < len && col < K::kHeadDim;
    long long k_offset = 0, v_offset = 0;
    if (valid) {
      if constexpr (K::kPageSize > 0) {
        const long long page = table[key / K::kPageSize];
        const int in_page = key % K::kPageSize;
        k_offset = page * p.k_batch_stride + in_page * p.k_seq_stride + col;
        v_offset = page * p.v_batch_stride + in_page * p.v_seq_stride + col;
      } else {
        k_offset = key * p.k_seq_stride + col;
        v_offset = key * p.v_seq_stride + col;
      }
    }
    const u32 to = 2 * swizzled_offset<kDp>(row, col);
    cp_async_16(k_tile + to, k + k_offset, valid ? 16 : 0);
    cp_async_16(v_tile + to, v + v_offset, valid ? 16 : 0);
  }
}

// ---- the combine
// ---------------------------------------------------------------------------------

// Merges the num_splits partials of row (b * heads_q + h) * seqlen_q + s into o and lse, by the
// lanes of one warp:
//   M = max_s lse_s;  w_s = 2^(lse_s - M);  O = sum_s w_s O_s / sum_s w_s;
//   lse = (M + log2 sum_s w_s) ln 2;  a row no split saw a key of: O = 0, lse = +inf.
// It is a chain of memory round trips, so it keeps loads in flight: the lanes read 32 splits'
// LSEs at once, and each lane loads its columns of kSplitsInFlight splits' partial rows before it
// sums them (a split-by-split loop waited ~0.6 us per split). The partials were written by other
// CTAs of this launch: read through L2 (ld.global.cg), never from this SM's L1.
template <int HEAD_DIM, bool IS_BF16>
__device__ __forceinline__ void decode_combine_row(const FlashjitAttentionParams& p, long long row,
                                                   int lane) {
  constexpr int kPerLane = (HEAD_DIM + 31) / 32;  // columns lane + 32 i
  constexpr int kSplitsInFlight = 64 / kPerLane;  // 64 loads of partial O per lane
  const long long rows_total = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q;
  const float* lse_of = p.partial_lse + row;  // split s: lse_of[s * rows_total]
  const int splits = p.num_splits;

  float m = minus_infinity();
  for (int s = lane; s < splits; s += 32) m = fmaxf(m, __ldcg(lse_of + s * rows_total));
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  const bool any_key = m != minus_infinity();

  float sum = 0.f, acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.f;
  if (any_key) {
    for (int s = lane; s < splits; s += 32) sum += fast_exp2(__ldcg(lse_of + s * rows_total) - m);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    for (int s0 = 0; s0 < splits; s0 += kSplitsInFlight) {
      float weight[kSplitsInFlight], x[kSplitsInFlight][kPerLane];
#pragma unroll
      for (int u = 0; u < kSplitsInFlight; ++u) {
        const int s = s0 + u < splits ? s0 + u : splits - 1;  // past the last: weight 0
        weight[u] = s0 + u < splits ? __ldcg(lse_of + s * rows_total) : minus_infinity();
        const float* partial = p.partial_o + (s * rows_total + row) * HEAD_DIM;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i)
          x[u][i] = lane + 32 * i < HEAD_DIM ? __ldcg(partial + lane + 32 * i) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kSplitsInFlight; ++u) {
        const float w = fast_exp2(weight[u] - m);  // 0: an empty split, or one too small to count
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) acc[i] += w > 0.f ? w * x[u][i] : 0.f;
      }
    }
  }
  const float inverse = sum > 0.f ? 1.f / sum : 0.f;
  const int position = static_cast<int>(row % p.seqlen_q);
  const int head = static_cast<int>(row / p.seqlen_q % p.heads_q);
  const int batch = static_cast<int>(row / p.seqlen_q / p.heads_q);
  u16* out = static_cast<u16*>(p.o) + batch * p.o_batch_stride + position * p.o_seq_stride +
             head * p.o_head_stride;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (lane + 32 * i < HEAD_DIM)
      out[lane + 32 * i] = static_cast<u16>(pack2<IS_BF16>(acc[i] * inverse, 0.f) & 0xffffu);
  if (p.lse && lane == 0)
    p.lse[row] = sum > 0.f ? (m + fast_log2(sum)) * 0.6931471805599453f : plus_infinity();
}

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
  const int split = blockIdx.x % p.num_splits;
  const int tile = blockIdx.x / p.num_splits;
  const int kv_head = blockIdx.y;
  const int batch = blockIdx.z;
  const int group = p.group_size;
  const int packed_rows = group * p.seqlen_q;
  const int r0 = tile * kBlockM;  // first packed row of the tile
  const int len = decode_sequence_keys(p, batch);
  const int diagonal = len - p.seqlen_q;  // causal: position i sees keys j <= i + diagonal

  // This split's blocks of the keys the tile's rows see.
  const int last_row = (r0 + kBlockM < packed_rows ? r0 + kBlockM : packed_rows) - 1;
  int end = len;
  if (K::kCausal && last_row / group + diagonal + 1 < end) end = last_row / group + diagonal + 1;
  const int blocks = end > 0 ? (end + kBlockN - 1) / kBlockN : 0;
  const int per_split = (blocks + p.num_splits - 1) / p.num_splits;
  const int first_block = split * per_split;
  const int end_block = first_block + per_split < blocks ? first_block + per_split : blocks;
  const int n_blocks = end_block > first_block ? end_block - first_block : 0;

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

  // Merge the warps and write a row's 8 columns per item: o and lse, or this split's partials.
  const long long rows_total = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q;
  for (int item = threadIdx.x; item < kBlockM * K::kChunksPerRow; item += K::kThreads) {
    const int row = item / K::kChunksPerRow;
    const int col = item % K::kChunksPerRow * 8;
    const int r = r0 + row;
    if (r >= packed_rows || col >= K::kHeadDim) continue;
    float m = minus_infinity();
#pragma unroll
    for (int w = 0; w < K::kWarps; ++w) m = fmaxf(m, merge_ml[2 * (w * kBlockM + row)]);
    const float m_scaled = fa::scaled_row_max(m, p.scale_log2);
    float l = 0.f, o[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) o[c] = 0.f;
#pragma unroll
    for (int w = 0; w < K::kWarps; ++w) {
      const float weight =
          fast_exp2(merge_ml[2 * (w * kBlockM + row)] * p.scale_log2 - m_scaled);  // 0: no key
      l += weight * merge_ml[2 * (w * kBlockM + row) + 1];
      const float* o_w = merge_o + (w * kBlockM + row) * kDp + col;
#pragma unroll
      for (int c = 0; c < 8; ++c) o[c] += weight * o_w[c];
    }
    const float inverse = l > 0.f ? 1.f / l : 0.f;  // a row with no keys: O = 0
    const int position = r / group;
    const int head = kv_head * group + r % group;
    const long long out_row =
        (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q + position;
    if (p.num_splits == 1) {
      Vec16 packed;
      packed.x = pack2<K::kIsBf16>(o[0] * inverse, o[1] * inverse);
      packed.y = pack2<K::kIsBf16>(o[2] * inverse, o[3] * inverse);
      packed.z = pack2<K::kIsBf16>(o[4] * inverse, o[5] * inverse);
      packed.w = pack2<K::kIsBf16>(o[6] * inverse, o[7] * inverse);
      u16* out = static_cast<u16*>(p.o) + batch * p.o_batch_stride + position * p.o_seq_stride +
                 head * p.o_head_stride + col;
      *reinterpret_cast<Vec16*>(out) = packed;
      if (p.lse && col == 0)
        p.lse[out_row] = fa::row_lse(m, p.scale_log2, l, [](float x) { return fast_log2(x); });
    } else {
      float* partial = p.partial_o + (split * rows_total + out_row) * K::kHeadDim + col;
#pragma unroll
      for (int c = 0; c < 8; ++c) partial[c] = o[c] * inverse;
      if (col == 0)
        p.partial_lse[split * rows_total + out_row] =
            l > 0.f ? m_scaled + fast_log2(l) : minus_infinity();
    }
  }
  if (p.num_splits == 1) return;

  // Count this split in; the tile's last split merges the partials (threadFenceReduction's
  // pattern: every writer fences its partials before the count, the last reader fences after).
  __threadfence();
  __syncthreads();
  int* last_flag = reinterpret_cast<int*>(shared_bytes);  // the Q tile's bytes: free by now
  if (threadIdx.x == 0) {
    int* counter =
        reinterpret_cast<int*>(p.partial_lse + p.num_splits * rows_total) +
        (static_cast<long long>(batch) * gridDim.y + kv_head) * (gridDim.x / p.num_splits) + tile;
    const bool last = atomicAdd(counter, 1) == p.num_splits - 1;
    if (last) *counter = 0;  // every split has counted: ready for the next call
    *last_flag = last;
  }
  __syncthreads();
  if (!*last_flag) return;
  __threadfence();
  for (int row = warp; row < kBlockM; row += K::kWarps) {
    const int r = r0 + row;
    if (r >= packed_rows) break;  // warp-uniform
    const long long out_row =
        (static_cast<long long>(batch) * p.heads_q + kv_head * group + r % group) * p.seqlen_q +
        r / group;
    decode_combine_row<K::kHeadDim, K::kIsBf16>(p, out_row, lane);
  }
}

}  // namespace flashjit_kernel
