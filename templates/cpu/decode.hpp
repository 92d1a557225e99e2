// flashjit CPU decode (split-KV, paged K/V): the decode family's algorithm
// (generator/decode_config.hpp) on the host, compiled by Clang at run time like
// cpu/attention_fwd.hpp. For few query rows the vector lanes run along the head dim (a row is
// one dot product per key, then an axpy of V), not along the queries as in the prefill template.
//
// One work item = (split s, tile of kBlockM packed rows, kv head hk, batch b); packed row r is
// query position r / G of query head hk * G + r % G (G = group_size), so the K/V rows a block
// converts serve every query head of the group:
//   len = seqlens_k[b] (or seqlen_k);  keys [0, end): end = len, causal: the last row's diagonal
//   the split's keys: blocks of kBlockN over [0, end), ranges of ceil(blocks / num_splits)
//   Q <- the tile's rows * scale * log2(e);  O <- 0;  m <- -inf;  l <- 0        (fp32, base 2)
//   for each block of keys in the range:
//     K, V <- the block's rows (paged: through the block table), in fp32
//     per row: S = Q_r K^T (masked: causal, per row)
//              m' = max(m, max S);  alpha = 2^(m - m');  P = 2^(S - m')
//              l = l * alpha + sum P;  O_r = O_r * alpha + P V;  m = m'
//   num_splits == 1: o = O / l in the storage type, lse = (m + log2 l) ln 2 (+inf, O = 0: no key)
//   else:            partial_o[s] = O / l (fp32), partial_lse[s] = m + log2 l (-inf: no key)
// The combine entry then merges the splits of each row by their LSE (combine below).
//
// Nothing is included (see cpu/common.hpp); the rendered source prepends attention_params.h and
// cpu/common.hpp and appends one DecodeTraits instantiation and the two entry points.

namespace flashjit_cpu {

template <int HeadDim, int BlockM, int BlockN, int StorageType, bool Causal, int PageSize>
struct DecodeTraits {
  FLASHJIT_CPU_TRAITS_SHAPE(HeadDim, BlockM, BlockN, StorageType, Causal);
  static constexpr int kPageSize = PageSize;  // 0: contiguous K/V
  static_assert(BlockM >= 1 && BlockM <= 64, "block_m: packed rows per work item, at most 64");
  static_assert(BlockN >= 16 && BlockN <= 256 && BlockN % 16 == 0,
                "block_n must be a multiple of 16 in [16, 256]");
  static_assert(PageSize == 0 || (PageSize >= 16 && PageSize <= 256 && PageSize % 16 == 0),
                "page size: 0 (contiguous) or a multiple of 16 in [16, 256]");
  // Scratch of one work item in floats: Q, K, V, S, O blocks; m and l per row.
  static constexpr i64 kScratchFloats =
      2 * (i64)BlockM * HeadDim + 2 * (i64)BlockN * HeadDim + (i64)BlockM * BlockN + 2 * BlockM;
};

template <class T>
struct Decode {
  FLASHJIT_CPU_KERNEL_SHAPE(T);  // D, BM, BN, Element
  typedef float f32x8 __attribute__((ext_vector_type(8)));

  static f32x8 load8(const float* p) { return load<f32x8>(p); }

  // sum_c a[c] b[c] over the head dim, 8 lanes at a time.
  static float dot(const float* __restrict a, const float* __restrict b) {
    f32x8 acc = 0.0f;
    for (int c = 0; c < D; c += 8) acc += load8(a + c) * load8(b + c);
    return acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
  }

  static int sequence_keys(const FlashjitAttentionParams& p, int b) {
    return p.seqlens_k ? p.seqlens_k[b] : p.seqlen_k;
  }

  // Row of key j of sequence b, kv head hk, in k or v (their strides given): through the block
  // table when paged.
  static const Element* key_row(const void* base, i64 batch_stride, i64 seq_stride, i64 head_stride,
                                const FlashjitAttentionParams& p, int b, int hk, int j) {
    const Element* tensor = (const Element*)base + hk * head_stride;
    if constexpr (T::kPageSize > 0) {
      const i64 page = p.block_table[b * p.block_table_stride + j / T::kPageSize];
      return tensor + page * batch_stride + (i64)(j % T::kPageSize) * seq_stride;
    } else {
      return tensor + b * batch_stride + (i64)j * seq_stride;
    }
  }

  // One work item (see the top of the file).
  static void item(const FlashjitAttentionParams& p, int b, int hk, int tile, int split,
                   float* scratch) {
    float* const qs = scratch;           // [BM][D], scaled into log2 units
    float* const kb = qs + BM * D;       // [BN][D]
    float* const vb = kb + BN * D;       // [BN][D]
    float* const sb = vb + BN * D;       // [BM][BN]
    float* const ob = sb + BM * BN;      // [BM][D]
    float* const row_max = ob + BM * D;  // [BM]
    float* const row_sum = row_max + BM;
    const float kNegInf = -__builtin_inff();

    const int group = p.group_size;
    const int packed = group * p.seqlen_q;
    const int r0 = tile * BM;
    const int rows = min_int(BM, packed - r0);
    const int len = sequence_keys(p, b);
    const int diag = len - p.seqlen_q;  // causal: query position i sees keys j <= i + diag

    // Q rows (packed row r: position (r0 + r) / G of head hk * G + (r0 + r) % G).
    for (int r = 0; r < rows; ++r) {
      const int position = (r0 + r) / group, head = hk * group + (r0 + r) % group;
      const Element* q_row = (const Element*)p.q + b * p.q_batch_stride +
                             position * p.q_seq_stride + head * p.q_head_stride;
      for (int c = 0; c < D; ++c) qs[r * D + c] = to_float<T::kStorage>(q_row[c]) * p.scale_log2;
      for (int c = 0; c < D; ++c) ob[r * D + c] = 0.0f;
      row_max[r] = kNegInf, row_sum[r] = 0.0f;
    }

    // This split's keys: whole blocks of the keys the tile's rows see.
    int end = len;
    if (T::kCausal) end = min_int(end, (r0 + rows - 1) / group + diag + 1);
    const int blocks = end > 0 ? (end + BN - 1) / BN : 0;
    const int per_split = (blocks + p.num_splits - 1) / p.num_splits;
    const int begin = split * per_split * BN;
    end = min_int(end, (split + 1) * per_split * BN);

    for (int n0 = begin; n0 < end; n0 += BN) {
      const int cols = min_int(BN, end - n0);
      for (int j = 0; j < cols; ++j) {
        const Element* k_row =
            key_row(p.k, p.k_batch_stride, p.k_seq_stride, p.k_head_stride, p, b, hk, n0 + j);
        const Element* v_row =
            key_row(p.v, p.v_batch_stride, p.v_seq_stride, p.v_head_stride, p, b, hk, n0 + j);
        convert_row<T::kStorage, D>(k_row, kb + j * D, 1.0f);
        convert_row<T::kStorage, D>(v_row, vb + j * D, 1.0f);
      }
      for (int r = 0; r < rows; ++r) {
        // The last visible key of this row, relative to n0.
        const int last = T::kCausal ? (r0 + r) / group + diag - n0 : cols - 1;
        float* const s = sb + r * BN;
        float block_max = kNegInf;
        for (int j = 0; j < cols; ++j) {
          s[j] = j <= last ? dot(qs + r * D, kb + j * D) : kNegInf;
          block_max = block_max > s[j] ? block_max : s[j];
        }
        if (block_max == kNegInf) continue;  // no key of this block is visible to the row
        const float m_new = row_max[r] > block_max ? row_max[r] : block_max;
        const float alpha = __builtin_exp2f(row_max[r] - m_new);  // 0 for the first keys
        float sum = 0.0f;
        float* const o_row = ob + r * D;
        for (int c = 0; c < D; c += 8) store(o_row + c, load8(o_row + c) * alpha);
        for (int j = 0; j < cols; ++j) {
          const float pj = __builtin_exp2f(s[j] - m_new);  // 0 for masked keys
          sum += pj;
          for (int c = 0; c < D; c += 8)
            store(o_row + c, load8(o_row + c) + pj * load8(vb + j * D + c));
        }
        row_sum[r] = row_sum[r] * alpha + sum;
        row_max[r] = m_new;
      }
    }

    // Outputs of row r: o (num_splits == 1) or this split's partials.
    for (int r = 0; r < rows; ++r) {
      const int position = (r0 + r) / group, head = hk * group + (r0 + r) % group;
      const i64 row = ((i64)b * p.heads_q + head) * p.seqlen_q + position;
      const float l = row_sum[r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const float lse2 = l > 0.0f ? row_max[r] + __builtin_log2f(l) : kNegInf;
      if (p.num_splits == 1) {
        Element* o_row = (Element*)p.o + b * p.o_batch_stride + position * p.o_seq_stride +
                         head * p.o_head_stride;
        for (int c = 0; c < D; ++c) o_row[c] = from_float<T::kStorage>(ob[r * D + c] * inv);
        if (p.lse) p.lse[row] = l > 0.0f ? lse2 * 0.6931471805599453f : __builtin_inff();
      } else {
        const i64 rows_total = (i64)p.batch * p.heads_q * p.seqlen_q;
        float* partial = p.partial_o + ((i64)split * rows_total + row) * D;
        for (int c = 0; c < D; ++c) partial[c] = ob[r * D + c] * inv;
        p.partial_lse[(i64)split * rows_total + row] = lse2;
      }
    }
  }

  // Work items [begin, end) of batch x heads_kv x row tiles x num_splits, the split fastest.
  // Returns 0, or 1 when the scratch could not be allocated.
  static int run(const FlashjitAttentionParams& p, int begin, int end) {
    float* scratch =
        (float*)aligned_alloc(64, (unsigned long)((T::kScratchFloats * 4 + 63) & ~63LL));
    if (!scratch) return 1;
    const int tiles = (p.group_size * p.seqlen_q + BM - 1) / BM;
    for (int w = begin; w < end; ++w) {
      const int split = w % p.num_splits;
      const int tile = (w / p.num_splits) % tiles;
      const int hk = (w / p.num_splits / tiles) % p.heads_kv;
      const int b = w / p.num_splits / tiles / p.heads_kv;
      item(p, b, hk, tile, split, scratch);
    }
    free(scratch);
    return 0;
  }

  // Rows [begin, end) of batch x heads_q x seqlen_q (row = (b * heads_q + h) * seqlen_q + s):
  //   M = max_s lse_s;  w_s = 2^(lse_s - M);  O = sum_s w_s O_s / sum_s w_s;
  //   lse = (M + log2 sum_s w_s) ln 2;  a row no split saw a key of: O = 0, lse = +inf.
  static int combine(const FlashjitAttentionParams& p, int begin, int end) {
    const i64 rows_total = (i64)p.batch * p.heads_q * p.seqlen_q;
    const float kNegInf = -__builtin_inff();
    for (int row = begin; row < end; ++row) {
      const int position = row % p.seqlen_q;
      const int head = (row / p.seqlen_q) % p.heads_q;
      const int b = row / p.seqlen_q / p.heads_q;
      float m = kNegInf;
      for (int s = 0; s < p.num_splits; ++s) {
        const float lse_s = p.partial_lse[(i64)s * rows_total + row];
        m = m > lse_s ? m : lse_s;
      }
      float acc[D];
      for (int c = 0; c < D; ++c) acc[c] = 0.0f;
      float sum = 0.0f;
      if (m != kNegInf) {
        for (int s = 0; s < p.num_splits; ++s) {
          const float w = __builtin_exp2f(p.partial_lse[(i64)s * rows_total + row] - m);
          if (w == 0.0f) continue;  // an empty split: its O is not read
          const float* partial = p.partial_o + ((i64)s * rows_total + row) * D;
          for (int c = 0; c < D; ++c) acc[c] += w * partial[c];
          sum += w;
        }
      }
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      Element* o_row =
          (Element*)p.o + b * p.o_batch_stride + position * p.o_seq_stride + head * p.o_head_stride;
      for (int c = 0; c < D; ++c) o_row[c] = from_float<T::kStorage>(acc[c] * inv);
      if (p.lse)
        p.lse[row] =
            sum > 0.0f ? (m + __builtin_log2f(sum)) * 0.6931471805599453f : __builtin_inff();
    }
    return 0;
  }
};

}  // namespace flashjit_cpu
