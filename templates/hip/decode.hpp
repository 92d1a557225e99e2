// flashjit decode for AMD CDNA (gfx90a MI200, gfx942 MI300): split-KV (flash-decoding) with GQA
// packing over a contiguous or paged K/V cache. The algorithm, its knobs and the launch contract
// are CUDA's (generator/decode_config.hpp, generator/render_decode.hpp, templates/cuda/decode.cuh):
// one entry, the split kernel, whose last workgroup per row tile merges the splits (the int32
// counters right after partial_lse, runtime/decode_launch.hpp's DecodeWorkspace). The renderer
// prepends attention_params.h, attention_common.h, hip/primitives.hpp and hip/tiles.hpp and
// appends one instantiation; this file is plain C++ over their names, so that
// tests/templates/hip_decode_emulation_test.cpp runs it on the host against the fp64 reference.
//
// Matrix cores (MFMA 16x16x16), not plain FMA: the forward's transposed formulation
// (hip/attention_fwd.hpp) carries over unchanged, with its K (swizzled rows) and V^T LDS tiles of
// hip/tiles.hpp, and a tile of 16 packed rows is exactly one MFMA's 16 columns. FMA over 64 lanes
// would need the K/V block in LDS all the same (each key is read by every row) and would spend
// 16x the issue slots per score; the kernel is memory-bound either way, and the MFMA keeps the
// waves' ALU time far below the time their 16-byte loads take.
//
// One workgroup = (split, tile of kBlockM packed rows, kv head hk, batch b); packed row r is query
// position r / G of query head hk * G + r % G, so the group's heads share every K/V block. Every
// wave holds all kBlockM rows (Q as MFMA B operands in registers) and takes kWaveKeys of each
// block's keys:
//
// clang-format off
//   len  = min(seqlens_k[b], seqlen_k) (or seqlen_k);  end = len, causal: min(len, last row's position + len - seqlen_q + 1)
//   this split's key blocks: [split * per, min((split + 1) * per, blocks)),  per = ceil(blocks / num_splits)
//   for each K/V block j of the split:  K_j rows, V_j^T in LDS (kStages buffers; block j + 1 is
//                                       loaded into registers meanwhile, 16-byte loads; paged:
//                                       each key row through the block table)
//     wave w takes keys [w * kWaveKeys, +kWaveKeys) of the block:
//     S_w^T = K_w Q^T, masked (len, causal per row); online softmax (m_w, l_w); O_w^T += V_w^T P_w^T
//   merge the waves (LDS):              m = max_w m_w;  l = sum_w l_w 2^(m_w - m);  O = sum_w O_w 2^(m_w - m) / l
//   num_splits == 1: o, lse;  else partial_o = O (fp32), partial_lse = m + log2 l (base 2; -inf: no key)
//   num_splits > 1:  count this split in (the tile's counter); the tile's last split to finish
//                    merges every split's partials of the tile's rows into o, lse (one wave per
//                    row) and sets the counter back to 0 for the next call
// clang-format on
//
// The partials of other workgroups are read after an agent-scope acquire fence (memory_fence),
// which on CDNA invalidates this CU's L1: the loads see what the other CUs wrote through L2.
// Keys at or past len are never read (zero in registers and LDS, masked in S), so block-table
// entries past a sequence's pages may hold anything.

namespace flashjit_hip {

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WAVES, int STAGES, bool IS_BF16, bool CAUSAL,
          int PAGE_SIZE>
struct DecodeTraits : TileShape<HEAD_DIM, BLOCK_M, BLOCK_N, WAVES, STAGES, IS_BF16, CAUSAL> {
  typedef TileShape<HEAD_DIM, BLOCK_M, BLOCK_N, WAVES, STAGES, IS_BF16, CAUSAL> Shape;
  static constexpr int kPageSize = PAGE_SIZE;         // 0: contiguous K/V
  static constexpr int kMTiles = BLOCK_M / 16;        // 16-row tiles (every wave: all rows)
  static constexpr int kWaveKeys = BLOCK_N / WAVES;   // keys of a block per wave
  static constexpr int kWaveNTiles = kWaveKeys / 16;  // 16-key tiles of a wave's S^T
  typedef TileCopy<BLOCK_N, HEAD_DIM, Shape::kHeadDimPadded, Shape::kThreads> KVCopy;
  static constexpr int kChunksPerRow = KVCopy::kChunksPerRow;
  static constexpr int kCopies = KVCopy::kCopies;                 // K (and V) chunks per thread
  static constexpr int kKRowBytes = KVCopy::kRowBytes;            // K tile: [kBlockN][d], swizzled
  static constexpr int kVRowBytes = KVCopy::kTransposedRowBytes;  // V^T tile: [d][kBlockN + 4]
  static constexpr int kKTileBytes = KVCopy::kTileBytes;
  static constexpr int kStageBytes = kKTileBytes + KVCopy::kTransposedTileBytes;
  static constexpr int kKvBytes = STAGES * kStageBytes;
  // After the last block the K/V buffers hold each wave's O (fp32) and m, l for the merge.
  static constexpr int kMergeOFloats = WAVES * BLOCK_M * Shape::kHeadDimPadded;
  static constexpr int kMergeBytes = (kMergeOFloats + 2 * WAVES * BLOCK_M) * 4;
  // generator: hip_decode_lds_bytes
  static constexpr int kLdsBytes = kKvBytes > kMergeBytes ? kKvBytes : kMergeBytes;

  static_assert(BLOCK_M == 16 || BLOCK_M == 32, "16 or 32 packed rows per workgroup");
  static_assert(WAVES == 1 || WAVES == 2 || WAVES == 4, "1, 2 or 4 waves");
  static_assert(kWaveKeys % 16 == 0, "each wave takes whole 16-key MFMA tiles of a block");
  static_assert((BLOCK_N * kChunksPerRow) % Shape::kThreads == 0, "K/V tile copies split evenly");
  static_assert(kLdsBytes <= 65536, "LDS: 64 KiB per workgroup on CDNA");
  static_assert(PAGE_SIZE == 0 || (PAGE_SIZE % 16 == 0 && PAGE_SIZE >= 16 && PAGE_SIZE <= 256),
                "page size: 0 (contiguous) or a multiple of 16 in [16, 256]");
};

// Keys [n0, n0 + kBlockN) of one (batch, kv head) of K and V into registers, 16 bytes per copy
// (hip/tiles.hpp's chunk order; paged, one table lookup per copy, shared by K and V). Keys at or
// past `len` and the head dim's padding are zero and never read.
template <class K>
FLASHJIT_DEVICE void decode_load_kv(Vec16 (&k_regs)[K::kCopies], Vec16 (&v_regs)[K::kCopies],
                                    const FlashjitAttentionParams& p,
                                    const flashjit_decode::KvSource<K::kPageSize>& kv, int n0,
                                    int len, int tid) {
#pragma unroll
  for (int i = 0; i < K::kCopies; ++i) {
    const int copy = tid + i * K::kThreads;
    const int row = copy / K::kChunksPerRow;
    const int col = copy % K::kChunksPerRow * 8;
    const int key = n0 + row;
    k_regs[i] = Vec16{0u, 0u, 0u, 0u};
    v_regs[i] = Vec16{0u, 0u, 0u, 0u};
    if (key < len && col < K::kHeadDim) {
      long long k_offset, v_offset;
      kv.offsets(p, key, col, k_offset, v_offset);
      k_regs[i] = *reinterpret_cast<const Vec16*>(kv.k + k_offset);
      v_regs[i] = *reinterpret_cast<const Vec16*>(kv.v + v_offset);
    }
  }
}

// ---- decode_split.h's portability layer on CDNA ----------------------------------------------

struct DecodeGpu {
  static constexpr int kLanes = 64;
  static constexpr int kCombineLoads = 16;  // partial-O loads a lane keeps in flight
  typedef flashjit_hip::Vec16 Vec16;
  typedef flashjit_hip::Float4 Float4;
  static FLASHJIT_DEVICE float shuffle_xor(float x, int mask) {
    return flashjit_hip::shuffle_xor(x, mask);
  }
  // Other workgroups' partials are read after an agent-scope acquire fence (memory_fence), which
  // on CDNA invalidates this CU's L1: a plain load sees them.
  static FLASHJIT_DEVICE float load_l2(const float* x) { return *x; }
  static FLASHJIT_DEVICE float fmax(float a, float b) { return __builtin_fmaxf(a, b); }
  static FLASHJIT_DEVICE float exp2(float x) { return fast_exp2(x); }
  static FLASHJIT_DEVICE float log2(float x) { return fast_log2(x); }
  template <bool IS_BF16>
  static FLASHJIT_DEVICE u32 pack2(float low, float high) {
    return flashjit_hip::pack2<IS_BF16>(low, high);
  }
  static FLASHJIT_DEVICE void fence() { memory_fence(); }
  static FLASHJIT_DEVICE void barrier() { flashjit_hip::barrier(); }
  static FLASHJIT_DEVICE int atomic_add(int* counter, int value) {
    return atomic_fetch_add(counter, value);
  }
};

// ---- the split kernel -------------------------------------------------------------------------

template <class K>
FLASHJIT_DEVICE void decode_split(const FlashjitAttentionParams& p) {
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kMTiles = K::kMTiles, kWaveNTiles = K::kWaveNTiles, kDTiles = K::kDTiles;
  constexpr int kDp = K::kHeadDimPadded;
  typedef Swizzle<K::kKRowBytes> KSwizzle;

  unsigned char* const lds = lds_base();  // kStages x {K [kBlockN][d], V^T [d][kBlockN + 4]}

  // r: the operand row / result column of this lane; g: which 4 of the 16 k (or result rows) it
  // holds.
  const int tid = thread_index(), lane = lane_index(), wave = tid / K::kWaveSize;
  const int lane_row = lane % 16, lane_group = lane / 16;
  // This workgroup's split, row tile, kv head and batch, and the split's key blocks.
  const flashjit_decode::Work work = flashjit_decode::work_at<K::kCausal>(
      p, block_index_x(), block_index_y(), block_index_z(), kBlockM, kBlockN);
  const int split = work.split, tile = work.tile, kv_head = work.kv_head, batch = work.batch;
  const int r0 = work.r0, len = work.len, diagonal = work.diagonal;
  const int first_block = work.first_block, n_blocks = work.n_blocks;
  const int group = p.group_size, packed_rows = group * p.seqlen_q;

  const flashjit_decode::KvSource<K::kPageSize> kv(p, batch, kv_head);

  // Q as B operands of S^T = K Q^T: q_frag[mt][kk] = Q[packed row r0 + mt*16 + r][dims kk*16 +
  // 4g .. + 3], gathered (packed row r: position r / G of head hk * G + r % G). Rows past the
  // packed rows and dims past the head dim are zero (their results are never stored).
  const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride;
  Frag q_frag[kMTiles][kDTiles];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    const int r = r0 + mt * 16 + lane_row;
    load_row_operands<K>(
        q_frag[mt],
        q + (r / group) * p.q_seq_stride + (kv_head * group + r % group) * p.q_head_stride,
        r < packed_rows, lane_group);
  }

  // This wave's keys of a block, and this lane's operand offsets in the K and V^T tiles.
  const int wave_key0 = wave * K::kWaveKeys;
  const int k_lane = KSwizzle::offset(lane_row, lane_group * 8);
  const int v_lane = lane_row * K::kVRowBytes + lane_group * 8 + wave_key0 * 2;

  f32x4 acc[kMTiles][kDTiles];  // O^T: acc[mt][dt][i] = O[row mt*16 + r][dim dt*16 + 4g + i]
  float row_max[kMTiles];       // m of row mt*16 + r (the same in all 4 lane groups)
  float row_sum[kMTiles];       // l, this lane's partial over its keys (reduced at the end)
  init_accumulators(acc, row_max, row_sum);

  Vec16 k_next[K::kCopies];
  Vec16 v_next[K::kCopies];
  if (n_blocks > 0) {
    decode_load_kv<K>(k_next, v_next, p, kv, first_block * kBlockN, len, tid);
    store_kv<K>(lds, k_next, v_next, tid);
  }
  barrier();

  for (int j = 0; j < n_blocks; ++j) {
    const int stage = kStages == 2 ? (j & 1) : 0;
    const unsigned char* k_tile = lds + stage * K::kStageBytes;
    const unsigned char* v_tile = k_tile + K::kKTileBytes;
    const int n0 = (first_block + j) * kBlockN;
    const bool more = j + 1 < n_blocks;
    // Block j + 1 travels from global memory while block j is computed.
    if (more) decode_load_kv<K>(k_next, v_next, p, kv, n0 + kBlockN, len, tid);

    // S_w^T = K_w Q^T: s[mt][nt][i] = S[row mt*16 + r][key n0 + wave_key0 + nt*16 + 4g + i].
    f32x4 s[kMTiles][kWaveNTiles];
    score_tiles<K, KSwizzle>(s, k_tile, k_lane, wave_key0, q_frag);

    // Mask keys at or past len and, when causal, past each row's diagonal: only blocks that
    // reach one of those edges pay for it.
    if (n0 + kBlockN > len || (K::kCausal && n0 + kBlockN - 1 > r0 / group + diagonal)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const int r = r0 + mt * 16 + lane_row;
        int last = len - 1;  // the row's last visible key
        if (K::kCausal && r / group + diagonal < last) last = r / group + diagonal;
        const int limit = last - (n0 + wave_key0 + 4 * lane_group);
#pragma unroll
        for (int nt = 0; nt < kWaveNTiles; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (nt * 16 + i > limit) s[mt][nt][i] = -fa::infinity();
      }
    }

    // Online softmax, base 2 (tiles.hpp, as the forward's); O_w^T += V_w^T P_w^T over this
    // wave's keys.
    Frag p_frag[kMTiles][kWaveNTiles];
    online_softmax<K>(s, p, row_max, row_sum, acc, p_frag);
    accumulate_pv<K>(acc, p_frag, v_tile, v_lane);

    store_next_stage<K>(lds, stage, more, k_next, v_next, tid);
  }

  // Every wave is past its last read of the K/V buffers: they hold the merge now. Each wave's O
  // (unnormalized) [wave][row][d_padded] floats, then [wave][row] pairs (m, l); the row sums are
  // reduced over the lane groups first, by every lane (shuffles need the whole wave).
  float* merge_o = reinterpret_cast<float*>(lds);
  float* merge_ml = merge_o + K::kMergeOFloats;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    float sum = row_sum[mt];
    sum += shuffle_xor(sum, 16);
    sum += shuffle_xor(sum, 32);
    const int row = mt * 16 + lane_row;
    float* o_row = merge_o + (wave * kBlockM + row) * kDp + 4 * lane_group;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      *reinterpret_cast<Float4*>(o_row + dt * 16) =
          Float4{acc[mt][dt][0], acc[mt][dt][1], acc[mt][dt][2], acc[mt][dt][3]};
    }
    if (lane_group == 0) {
      merge_ml[2 * (wave * kBlockM + row)] = row_max[mt];
      merge_ml[2 * (wave * kBlockM + row) + 1] = sum;
    }
  }
  barrier();

  // Merge the waves and write a row's 8 columns per item: o and lse, or this split's partials;
  // with several splits, the tile's last one combines them (decode_split.h). The merge's LDS
  // bytes are read by no one after the count's barrier: a word of them holds the flag.
  flashjit_decode::store_merged_rows<DecodeGpu, K, K::kWaves>(p, merge_o, merge_ml, tid, r0, batch,
                                                              kv_head, split);
  if (p.num_splits == 1) return;
  flashjit_decode::count_split_and_combine<DecodeGpu, K, K::kWaves>(
      p, reinterpret_cast<int*>(lds), tid, wave, lane, r0, batch, kv_head, tile,
      grid_size_x() / p.num_splits);
}

}  // namespace flashjit_hip
