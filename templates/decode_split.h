// The split-KV steps both GPU decode kernels (cuda/decode.cuh, hip/decode.hpp) take the same way,
// written once against a thin portability layer: a kernel passes a type Gpu with
//   kLanes           threads of a warp (CUDA: 32) or a wave (HIP: 64)
//   kCombineLoads    partial-O loads a lane keeps in flight while it combines a row
//   Vec16, Float4    16-byte vectors of 8 packed 16-bit elements and of 4 floats
//   shuffle_xor(x, mask)   butterfly exchange within the warp / wave
//   load_l2(pointer)       a float written by another block of this launch (CUDA: through L2)
//   fmax(a, b), exp2(x), log2(x)   (exp2(-inf) = 0; log2 of a positive sum)
//   pack2<IS_BF16>(lo, hi) two floats rounded to 16 bits, lo in the low half
//   fence(), barrier(), atomic_add(counter, value)   device-scope fence, block barrier, atomic
// The rest is the kernels' own: their traits K (kBlockM, kHeadDim, kChunksPerRow, kThreads,
// kIsBf16) and where their units (warps or waves) left the partial rows of a tile.
//
// Tile rows are packed (batch b, kv head hk): packed row r is position r / G of query head
// hk * G + r % G (G = group_size). Split s of a tile takes the s-th share of the key blocks its
// rows see; with more than one split, each writes its normalized O and its lse (base 2) to the
// workspace, and the tile's last split to arrive combines them (combine_row).
#ifndef FLASHJIT_DECODE_SPLIT_H
#define FLASHJIT_DECODE_SPLIT_H

namespace flashjit_decode {

// Where a block's work lies, from its grid coordinates (x: row tiles x splits, split fastest;
// y: kv heads; z: batch): split `split` of the tile of block_m packed rows from r0, over the key
// blocks [first_block, first_block + n_blocks) of block_n keys, its share of those the tile's
// rows see (len keys: the sequence's, at most seqlen_k; causal: position i sees keys
// j <= i + diagonal).
struct Work {
  int split, tile, kv_head, batch, r0;
  int len, diagonal, first_block, n_blocks;
};
template <bool CAUSAL>
FLASHJIT_DEVICE Work work_at(const FlashjitAttentionParams& p, int x, int y, int z, int block_m,
                             int block_n) {
  Work w;
  w.split = x % p.num_splits;
  w.tile = x / p.num_splits;
  w.kv_head = y;
  w.batch = z;
  w.r0 = w.tile * block_m;
  // Not `seqlens_k ? seqlens_k[b] : seqlen_k`: hipRTC turns a select between two loads into a
  // load through a selected address, which puts the kernel argument in scratch memory.
  w.len = p.seqlen_k;
  if (p.seqlens_k) {
    const int keys = p.seqlens_k[w.batch];
    if (keys < w.len) w.len = keys;
  }
  w.diagonal = w.len - p.seqlen_q;
  const int group = p.group_size;
  const int packed_rows = group * p.seqlen_q;
  const int last_row = (w.r0 + block_m < packed_rows ? w.r0 + block_m : packed_rows) - 1;
  int end = w.len;
  if (CAUSAL && last_row / group + w.diagonal + 1 < end) end = last_row / group + w.diagonal + 1;
  const int blocks = end > 0 ? (end + block_n - 1) / block_n : 0;
  const int per_split = (blocks + p.num_splits - 1) / p.num_splits;
  w.first_block = w.split * per_split;
  const int end_block = w.first_block + per_split < blocks ? w.first_block + per_split : blocks;
  w.n_blocks = end_block > w.first_block ? end_block - w.first_block : 0;
  return w;
}

// The K and V of (batch, kv head): contiguous, the batch's rows; paged (PAGE_SIZE > 0), the
// cache's, key j of the sequence in page table[j / PAGE_SIZE] of the batch's block table.
template <int PAGE_SIZE>
struct KvSource {
  const unsigned short* k;
  const unsigned short* v;
  const int* table;

  FLASHJIT_DEVICE KvSource(const FlashjitAttentionParams& p, int batch, int kv_head)
      : k(static_cast<const unsigned short*>(p.k) + kv_head * p.k_head_stride +
          (PAGE_SIZE == 0 ? batch * p.k_batch_stride : 0)),
        v(static_cast<const unsigned short*>(p.v) + kv_head * p.v_head_stride +
          (PAGE_SIZE == 0 ? batch * p.v_batch_stride : 0)),
        table(PAGE_SIZE > 0 ? p.block_table + batch * p.block_table_stride : 0) {}

  // Element offsets from k and v of column `col` of key `key` (one table lookup for both).
  FLASHJIT_DEVICE void offsets(const FlashjitAttentionParams& p, int key, int col,
                               long long& k_offset, long long& v_offset) const {
    if constexpr (PAGE_SIZE > 0) {
      const long long page = table[key / PAGE_SIZE];
      const int in_page = key % PAGE_SIZE;
      k_offset = page * p.k_batch_stride + in_page * p.k_seq_stride + col;
      v_offset = page * p.v_batch_stride + in_page * p.v_seq_stride + col;
    } else {
      k_offset = key * p.k_seq_stride + col;
      v_offset = key * p.v_seq_stride + col;
    }
  }
};

// The output row (b * heads_q + h) * seqlen_q + position of packed row r of (batch, kv_head).
FLASHJIT_DEVICE long long output_row(const FlashjitAttentionParams& p, int batch, int kv_head,
                                     int r) {
  const int group = p.group_size;
  return (static_cast<long long>(batch) * p.heads_q + kv_head * group + r % group) * p.seqlen_q +
         r / group;
}

// Merges the UNITS units' partial rows of the tile and writes each row's 8 columns per item: O
// and the lse (one split), or this split's normalized partials and lse (base 2). merge_o:
// [unit][row][d_padded] unnormalized O; merge_ml: [unit][row] pairs (m, l) of the row's running
// max (unscaled scores) and sum.
template <class Gpu, class K, int UNITS>
FLASHJIT_DEVICE void store_merged_rows(const FlashjitAttentionParams& p, const float* merge_o,
                                       const float* merge_ml, int tid, int r0, int batch,
                                       int kv_head, int split) {
  namespace fa = flashjit_attention;
  constexpr int kBlockM = K::kBlockM, kDp = K::kHeadDimPadded;
  const int packed_rows = p.group_size * p.seqlen_q;
  const long long rows_total = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q;
  for (int item = tid; item < kBlockM * K::kChunksPerRow; item += K::kThreads) {
    const int row = item / K::kChunksPerRow;
    const int col = item % K::kChunksPerRow * 8;
    const int r = r0 + row;
    if (r >= packed_rows || col >= K::kHeadDim) continue;
    float m = -fa::infinity();
#pragma unroll
    for (int w = 0; w < UNITS; ++w) m = Gpu::fmax(m, merge_ml[2 * (w * kBlockM + row)]);
    const float m_scaled = fa::scaled_row_max(m, p.scale_log2);
    float l = 0.f, o[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) o[c] = 0.f;
#pragma unroll
    for (int w = 0; w < UNITS; ++w) {
      const float weight =
          Gpu::exp2(merge_ml[2 * (w * kBlockM + row)] * p.scale_log2 - m_scaled);  // 0: no key
      l += weight * merge_ml[2 * (w * kBlockM + row) + 1];
      const float* o_w = merge_o + (w * kBlockM + row) * kDp + col;
#pragma unroll
      for (int c = 0; c < 8; ++c) o[c] += weight * o_w[c];
    }
    const float inverse = l > 0.f ? 1.f / l : 0.f;  // a row with no keys: O = 0
    const long long out_row = output_row(p, batch, kv_head, r);
    if (p.num_splits == 1) {
      typename Gpu::Vec16 packed;
      packed.x = Gpu::template pack2<K::kIsBf16>(o[0] * inverse, o[1] * inverse);
      packed.y = Gpu::template pack2<K::kIsBf16>(o[2] * inverse, o[3] * inverse);
      packed.z = Gpu::template pack2<K::kIsBf16>(o[4] * inverse, o[5] * inverse);
      packed.w = Gpu::template pack2<K::kIsBf16>(o[6] * inverse, o[7] * inverse);
      const int position = r / p.group_size, head = kv_head * p.group_size + r % p.group_size;
      unsigned short* out = static_cast<unsigned short*>(p.o) + batch * p.o_batch_stride +
                            position * p.o_seq_stride + head * p.o_head_stride + col;
      *reinterpret_cast<typename Gpu::Vec16*>(out) = packed;
      if (p.lse && col == 0)
        p.lse[out_row] = fa::row_lse(m, p.scale_log2, l, [](float x) { return Gpu::log2(x); });
    } else {
      typedef typename Gpu::Float4 Float4;
      float* partial = p.partial_o + (split * rows_total + out_row) * K::kHeadDim + col;
      *reinterpret_cast<Float4*>(partial) =
          Float4{o[0] * inverse, o[1] * inverse, o[2] * inverse, o[3] * inverse};
      *reinterpret_cast<Float4*>(partial + 4) =
          Float4{o[4] * inverse, o[5] * inverse, o[6] * inverse, o[7] * inverse};
      if (col == 0)
        p.partial_lse[split * rows_total + out_row] =
            l > 0.f ? m_scaled + Gpu::log2(l) : -fa::infinity();
    }
  }
}

// Merges the num_splits partials of row (b * heads_q + h) * seqlen_q + s into o and lse, by the
// lanes of one warp / wave (every lane must call it):
//   M = max_s lse_s;  w_s = 2^(lse_s - M);  O = sum_s w_s O_s / sum_s w_s;
//   lse = (M + log2 sum_s w_s) ln 2;  a row no split saw a key of: O = 0, lse = +inf.
// It is a chain of memory round trips, so it keeps loads in flight: the lanes read kLanes splits'
// LSEs at once, and each lane loads its columns of kSplitsInFlight splits' partial rows before it
// sums them (a split-by-split loop waited ~0.6 us per split on an H100). Loads are from valid
// addresses only, values selected after (HIP: a select between a load and a constant becomes one
// between addresses, with the constant in scratch memory): past the last split the weight is 0,
// past the head dim a column is never stored.
template <class Gpu, int HEAD_DIM, bool IS_BF16>
FLASHJIT_DEVICE void combine_row(const FlashjitAttentionParams& p, long long row, int lane) {
  namespace fa = flashjit_attention;
  constexpr int kLanes = Gpu::kLanes;
  constexpr int kPerLane = (HEAD_DIM + kLanes - 1) / kLanes;  // columns lane + kLanes i
  constexpr int kSplitsInFlight = Gpu::kCombineLoads / kPerLane;
  const long long rows_total = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q;
  const float* lse_of = p.partial_lse + row;  // split s: lse_of[s * rows_total]
  const int splits = p.num_splits;

  float m = -fa::infinity();
  for (int s = lane; s < splits; s += kLanes)
    m = Gpu::fmax(m, Gpu::load_l2(lse_of + s * rows_total));
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    m = Gpu::fmax(m, Gpu::shuffle_xor(m, offset));
  const bool any_key = m != -fa::infinity();  // the same in every lane

  float sum = 0.f, acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.f;
  if (any_key) {
    for (int s = lane; s < splits; s += kLanes)
      sum += Gpu::exp2(Gpu::load_l2(lse_of + s * rows_total) - m);
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) sum += Gpu::shuffle_xor(sum, offset);
    for (int s0 = 0; s0 < splits; s0 += kSplitsInFlight) {
      float weight[kSplitsInFlight], x[kSplitsInFlight][kPerLane];
#pragma unroll
      for (int u = 0; u < kSplitsInFlight; ++u) {
        const int s = s0 + u < splits ? s0 + u : splits - 1;
        const float lse = Gpu::load_l2(lse_of + s * rows_total);
        weight[u] = s0 + u < splits ? lse : -fa::infinity();
        const float* partial = p.partial_o + (s * rows_total + row) * HEAD_DIM;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i)
          x[u][i] = Gpu::load_l2(partial +
                                 (lane + kLanes * i < HEAD_DIM ? lane + kLanes * i : HEAD_DIM - 1));
      }
#pragma unroll
      for (int u = 0; u < kSplitsInFlight; ++u) {
        const float w = Gpu::exp2(weight[u] - m);  // 0: an empty split, or one too small to count
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) acc[i] += w > 0.f ? w * x[u][i] : 0.f;
      }
    }
  }
  const float inverse = sum > 0.f ? 1.f / sum : 0.f;
  const int position = static_cast<int>(row % p.seqlen_q);
  const int head = static_cast<int>(row / p.seqlen_q % p.heads_q);
  const int batch = static_cast<int>(row / p.seqlen_q / p.heads_q);
  unsigned short* out = static_cast<unsigned short*>(p.o) + batch * p.o_batch_stride +
                        position * p.o_seq_stride + head * p.o_head_stride;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (lane + kLanes * i < HEAD_DIM)
      out[lane + kLanes * i] = static_cast<unsigned short>(
          Gpu::template pack2<IS_BF16>(acc[i] * inverse, 0.f) & 0xffffu);
  if (p.lse && lane == 0)
    p.lse[row] = sum > 0.f ? (m + Gpu::log2(sum)) * 0.6931471805599453f : fa::infinity();
}

// After store_merged_rows with num_splits > 1: counts this split in, and the tile's last split
// to arrive combines the partials of its rows, unit u taking rows u, u + UNITS, ... Every
// writer's fence comes before its count and the last one's after it, so that the last split
// sees every partial (threadFenceReduction's pattern). `flag` is a word of shared memory no
// thread reads any more; the counter (one per tile, after the partial lse in the workspace) is
// back to 0 when the call ends, so a CUDA graph replays the call as it is.
template <class Gpu, class K, int UNITS>
FLASHJIT_DEVICE void count_split_and_combine(const FlashjitAttentionParams& p, int* flag, int tid,
                                             int unit, int lane, int r0, int batch, int kv_head,
                                             int tile, int tiles) {
  const long long rows_total = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q;
  Gpu::fence();
  Gpu::barrier();  // every thread's partials are out
  if (tid == 0) {
    int* counter = reinterpret_cast<int*>(p.partial_lse + p.num_splits * rows_total) +
                   (static_cast<long long>(batch) * p.heads_kv + kv_head) * tiles + tile;
    const bool last = Gpu::atomic_add(counter, 1) == p.num_splits - 1;
    if (last) *counter = 0;  // every split has counted: ready for the next call
    *flag = last;
  }
  Gpu::barrier();
  if (!*flag) return;
  Gpu::fence();
  const int packed_rows = p.group_size * p.seqlen_q;
  for (int row = unit; row < K::kBlockM; row += UNITS) {
    const int r = r0 + row;
    if (r >= packed_rows) break;  // uniform over the unit
    combine_row<Gpu, K::kHeadDim, K::kIsBf16>(p, output_row(p, batch, kv_head, r), lane);
  }
}

}  // namespace flashjit_decode

#endif  // FLASHJIT_DECODE_SPLIT_H
