// flashjit CPU attention backward: FlashAttention-2's backward pass on the host, compiled by Clang
// at run time for the host CPU like the forward (templates/cpu/attention_fwd.hpp).
//
// Three entry points, run one after the other over the thread pool, each over its own work items
// (generator/render.hpp):
//   preprocess  (batch, head, block of kBlockM queries): D = rowsum(dO * O) and lse * log2(e)
//               into the workspace rows (attention_params.h); rows past seqlen_q up to
//               seqlen_q_rounded get D = 0 and lse_log2 = +inf.
//   dK/dV       (batch, kv head, block of kBlockN keys):
//                 K^T, V^T <- the key block, transposed (d x kBlockN);  dK^T, dV^T <- 0
//                 for each query head h of the group, each block i of kBlockM queries that sees
//                 the key block (causal: from the diagonal on):
//                   S  = Q_i K^T                  (kBlockM x kBlockN, in log2 units)
//                   dP = dO_i V^T
//                   P  = exp2(S - lse_log2_i);  dS = P * (dP - D_i)    (masked: P = dS = 0)
//                   dV^T += dO_i^T P;  dK^T += Q_i^T dS
//                 dK = scale * dK^T^T, dV = dV^T^T in the storage type.
//   dQ          (batch, head, block of kBlockM queries):
//                 Q^T, dO^T <- the query block, transposed (d x kBlockM);  dQ^T <- 0
//                 for each block j of kBlockN keys that the queries see:
//                   S^T = K_j Q^T;  dP^T = V_j dO^T;  dS^T = P^T * (dP^T - D)
//                   dQ^T += K_j^T dS^T
//                 dQ = scale * dQ^T^T in the storage type.
// That is DqMode::Separate ("-det"): 7 matrix products, S and dP computed twice. The fused dQ
// (DqMode::Atomic on the CPU, kFusedDq) has 5, and no atomics either:
//   dK/dV       (batch, kv head, split s of dq_accum_splits): the key blocks s, s + splits, ...
//               of the pair, each as above plus, for every query block i it meets,
//                   dQ_i += dS K_j                (into split s's copy of dq_accum, fp32)
//               after zeroing that copy's rows of the group's heads: a work item owns every
//               dQ row of its (batch, kv head) that its key blocks touch.
//   dQ          (batch, head, block of kBlockM queries): dQ = scale * sum over s of dq_accum[s]
//               in split order, in the storage type.
// Either way no two cores ever write the same row, and the order of every sum is fixed: the
// gradients are bitwise reproducible (for one split count: the launcher's choice from the batch,
// the heads and its threads, runtime/cpu/cpu_backend.cpp).
//
// The vector lanes run along the rows of the block a work item owns (keys in dK/dV, queries in
// dQ), as the forward's run along its queries: the per-row softmax statistics of the other block
// are broadcast scalars or whole vectors. The fused dQ product runs its lanes along the head dim
// (dQ_i's rows are the streamed block's). All products are register-tiled outer products with one
// operand broadcast from memory, of two shapes:
//   scores_tile      out[r][x]  = sum_c a[r][c] * b^T[c][x]      (S, dP: reduce over head dims)
//   accumulate_tile  acc[c][x] += sum_r a(r, c) * y[r][x]        (dV, dK, dQ: reduce over rows)
// where x runs over the lanes and r over the reduced rows (a(r, c) through strides: dS read as
// dS^T for the fused dQ).
//
// Two kinds of arithmetic, both accumulating in fp32 (as the forward):
//   fp32 FMAs (fp16 and fp32 storage; bf16 on a host without AVX512_BF16): every operand
//     converted to fp32 when packed; the S operand owned by the work item (K^T, Q^T) pre-scaled
//     by scale * log2(e).
//   bf16 dot products (bf16 storage with AVX512_BF16, kDotBf16): vdpbf16ps over bf16 pairs along
//     the reduced axis. The streamed rows are read in place for S and dP; the owned block is
//     packed as pairs along the head dim; P and dS are rounded to bf16 before the products that
//     make dV, dK and dQ (as FlashAttention does on the GPU), with their partners (dO, Q, K)
//     packed as pairs along the rows (the fused dQ: dS as pairs along its keys, row by row, and
//     K as pairs of keys).
//
// Scratch per work item: kDkDvScratchFloats / kDqScratchFloats words, within the L2 budget of
// generator/cpu_config.hpp. The rendered source prepends attention_params.h and cpu/common.hpp,
// appends cpu/attention_bwd_dq.hpp (the dQ block of the Separate mode) and one BwdTraits
// instantiation with the three extern "C" entry points.

namespace flashjit_cpu {

template <int HeadDim, int BlockM, int BlockN, int StorageType, bool Causal, bool FusedDq>
struct BwdTraits {
  // kBlockM: queries per dQ work item / streamed block of dK/dV; kBlockN: keys per dK/dV block /
  // streamed block of dQ.
  FLASHJIT_CPU_TRAITS_SHAPE(HeadDim, BlockM, BlockN, StorageType, Causal);
  static constexpr bool kFusedDq = FusedDq;  // DqMode::Atomic: dQ accumulated by the dK/dV items
  static_assert(BlockM >= kLanes && 128 % BlockM == 0,
                "block_m must be 16, 32, 64 or 128: whole blocks of the workspace rows, which "
                "are padded to a multiple of 128");
  static_assert(BlockN >= kLanes && BlockN <= 256 && BlockN % kLanes == 0,
                "block_n must be a multiple of 16 (the key lanes of a vector) in [16, 256]");
  static_assert(StorageType == kF16 || StorageType == kBF16 || StorageType == kF32,
                "storage must be fp16, bf16 or fp32");

  static constexpr bool kDotBf16 = StorageType == kBF16 && FLASHJIT_CPU_DOT_BF16;

  // The fused dQ product's lanes: the head dim rounded up to whole vectors (K's rows are packed
  // with zeros past the head dim); its accumulator rows (dq_accum) are kDqAccumRow floats long,
  // the head dim rounded up to 64 (attention_params.h).
  static constexpr int kHeadDimLanes = (HeadDim + kLanes - 1) / kLanes * kLanes;
  static constexpr int kDqAccumRow = (HeadDim + 63) / 64 * 64;

  // Scratch in 4-byte words. dK/dV: K^T, V^T, dK^T, dV^T (d x BN); Q, dO (BM x d); S/P, dP/dS
  // (BM x BN); fused dQ: K (BN x kHeadDimLanes), and with the dot products dS as bf16 (BM x BN
  // halves). dQ: Q^T, dO^T, dQ^T (d x BM); K, V (BN x d); S^T, dP^T/dS^T (BN x BM). (The bf16
  // dot products use less elsewhere: the packed operands as pairs.)
  static constexpr i64 kDkDvScratchFloats =
      4 * (i64)HeadDim * BlockN + 2 * (i64)BlockM * HeadDim + 2 * (i64)BlockM * BlockN +
      (FusedDq ? (i64)BlockN * kHeadDimLanes + (kDotBf16 ? (i64)BlockM * BlockN / 2 : 0) : 0);
  static constexpr i64 kDqScratchFloats =
      3 * (i64)HeadDim * BlockM + 2 * (i64)BlockN * HeadDim + 2 * (i64)BlockN * BlockM;
};

template <class T>
struct Backward {
  FLASHJIT_CPU_KERNEL_SHAPE(T);  // D, BM, BN, Element
  static constexpr bool kDot = T::kDotBf16;

  // Register tiles of each work item, sized for the host's registers (common.hpp's
  // tile_lane_vectors, tile_dims): lane vectors of the owned block times streamed rows or head
  // dims; tiles whose rows or dims do not divide the block's are followed by tiles of 2
  // (for_each_tile).
  static constexpr int KV = tile_lane_vectors(BN);  // dK/dV: key vectors
  static constexpr int QV = tile_lane_vectors(BM);  // dQ: query vectors
  static constexpr int kKeyRows = kTileVectors / KV, kKeyDims = tile_dims(KV);
  static constexpr int kQueryRows = kTileVectors / QV, kQueryDims = tile_dims(QV);
  // The fused dQ product: lanes along the head dim (DL of them, DV vectors per tile: the most
  // that divide DL and leave an even number of rows per tile), rows of dQ_i in tiles of kDqRows;
  // accumulator rows DR floats apart. (d 96 on AVX-512: 6 vectors; 3 would leave tiles of 5
  // rows, so 2 of 8.)
  static constexpr int DL = T::kHeadDimLanes;
  static constexpr int DR = T::kDqAccumRow;
  static constexpr int head_dim_vectors() {
    int vectors = kTileLaneVectors;
    while ((DL / kLanes) % vectors != 0 || tile_dims(vectors) % 2 != 0) --vectors;
    return vectors;
  }
  static constexpr int DV = head_dim_vectors();
  static constexpr int kDqRows = tile_dims(DV);
  static_assert(BN % (KV * kLanes) == 0 && BM % (QV * kLanes) == 0, "lane tiles must tile");
  static_assert(kKeyRows % 2 == 0 && kKeyDims % 2 == 0 && kQueryRows % 2 == 0 &&
                    kQueryDims % 2 == 0 && kDqRows % 2 == 0,
                "tiles must be even: the rest of a block is done in tiles of 2");

  static constexpr float kLog2e = 1.4426950408889634f;

  // Workspace row of (batch b, query head h).
  static i64 workspace_row(const FlashjitAttentionParams& p, int b, int h) {
    return ((i64)b * p.heads_q + h) * p.seqlen_q_rounded;
  }

  // ---- preprocess: D = rowsum(dO * O), lse_log2 = lse * log2(e) ------------------------------

  static void preprocess_block(const FlashjitAttentionParams& p, int b, int h, int m_block) {
    const int q0 = m_block * BM;
    const int rows = min_int(BM, p.seqlen_q - q0);
    const Element* o = (const Element*)p.o + b * p.o_batch_stride + h * p.o_head_stride;
    const Element* d_o = (const Element*)p.d_o + b * p.do_batch_stride + h * p.do_head_stride;
    const float* lse = p.lse + ((i64)b * p.heads_q + h) * p.seqlen_q;
    const i64 row = workspace_row(p, b, h);
    for (int i = q0; i < q0 + rows; ++i) {
      const Element* o_row = o + (i64)i * p.o_seq_stride;
      const Element* do_row = d_o + (i64)i * p.do_seq_stride;
      float sum = 0.0f;
      for (int c = 0; c < D; ++c)
        sum += to_float<T::kStorage>(do_row[c]) * to_float<T::kStorage>(o_row[c]);
      p.delta[row + i] = sum;
      p.lse_log2[row + i] = lse[i] * kLog2e;  // +inf (a row with no key) stays +inf
    }
    // The last block pads the rows to seqlen_q_rounded: no probability, no gradient.
    if (q0 + rows == p.seqlen_q) {
      for (int i = p.seqlen_q; i < p.seqlen_q_rounded; ++i) {
        p.delta[row + i] = 0.0f;
        p.lse_log2[row + i] = __builtin_inff();
      }
    }
  }

  // ---- dK/dV: one block of BN keys of (batch b, kv head hk) ----------------------------------
  // With the fused dQ, dq_accum is the split's copy of the accumulator at (batch b, the group's
  // first head); else null.

  static void dkdv_block(const FlashjitAttentionParams& p, int b, int hk, int n_block,
                         float* scratch, float* dq_accum) {
    // fp32: K^T (scaled into log2 units), V^T [D][BN]; Q, dO [BM][D]; fused dQ: K [BN][DL].
    // bf16 dot products: K^T, V^T as pairs along d [D/2][BN]; Q, dO as pairs along the query
    // rows [BM/2][D] (for dK and dV; S and dP read Q and dO in place); fused dQ: K as pairs of
    // keys [BN/2][DL], dS rows as bf16 pairs along the keys [BM][BN/2].
    float* const kt = scratch;
    float* const vt = kt + D * BN;
    float* const dkt = vt + D * BN;  // [D][BN] accumulators
    float* const dvt = dkt + D * BN;
    float* const qa = dvt + D * BN;  // [BM][D]
    float* const da = qa + BM * D;
    float* const s = da + BM * D;   // [BM][BN]: S, then P (fp32 or bf16 pairs of rows)
    float* const dp = s + BM * BN;  // [BM][BN]: dP, then dS
    u32* const kp = (u32*)kt;
    u32* const vp = (u32*)vt;
    u32* const qp = (u32*)qa;
    u32* const dop = (u32*)da;
    u32* const pp = (u32*)s;
    u32* const dsp = (u32*)dp;
    float* const ka = dp + BM * BN;  // fused dQ
    u32* const kpj = (u32*)ka;
    u32* const dsr = (u32*)(ka + BN * DL);
    const float kNegInf = -__builtin_inff();

    const int n0 = n_block * BN;
    const int cols = min_int(BN, p.seqlen_k - n0);
    const Element* k = (const Element*)p.k + b * p.k_batch_stride + hk * p.k_head_stride;
    const Element* v = (const Element*)p.v + b * p.v_batch_stride + hk * p.v_head_stride;

    // K^T and V^T; keys past seqlen_k are zero (and masked below).
    for (int j = 0; j < BN; ++j) {
      const bool in = j < cols;
      const Element* k_row = k + (i64)(n0 + (in ? j : 0)) * p.k_seq_stride;
      const Element* v_row = v + (i64)(n0 + (in ? j : 0)) * p.v_seq_stride;
      if constexpr (kDot) {
        for (int c = 0; c < D; c += 2) {
          kp[(c / 2) * BN + j] = in ? pair_at(k_row + c) : 0u;
          vp[(c / 2) * BN + j] = in ? pair_at(v_row + c) : 0u;
        }
      } else {
        const float keep = in ? 1.0f : 0.0f;
        for (int c = 0; c < D; ++c) {
          kt[c * BN + j] = to_float<T::kStorage>(k_row[c]) * (keep * p.scale_log2);
          vt[c * BN + j] = to_float<T::kStorage>(v_row[c]) * keep;
        }
      }
    }
    for (int x = 0; x < D * BN; ++x) dkt[x] = 0.0f, dvt[x] = 0.0f;
    // Fused dQ: K as rows of DL lanes (zero past the head dim and past seqlen_k), unscaled.
    if constexpr (T::kFusedDq) {
      for (int jj = 0; jj < BN / 2; ++jj) {
        const Element* k_lo = k + (i64)(n0 + min_int(2 * jj, cols - 1)) * p.k_seq_stride;
        const Element* k_hi = k + (i64)(n0 + min_int(2 * jj + 1, cols - 1)) * p.k_seq_stride;
        const bool lo_in = 2 * jj < cols, hi_in = 2 * jj + 1 < cols;
        for (int c = 0; c < DL; ++c) {
          const bool in_d = c < D;
          const int cc = in_d ? c : 0;
          if constexpr (kDot) {
            kpj[jj * DL + c] =
                (lo_in && in_d ? (u32)k_lo[cc] : 0u) | (hi_in && in_d ? (u32)k_hi[cc] << 16 : 0u);
          } else {
            ka[2 * jj * DL + c] = lo_in && in_d ? to_float<T::kStorage>(k_lo[cc]) : 0.0f;
            ka[(2 * jj + 1) * DL + c] = hi_in && in_d ? to_float<T::kStorage>(k_hi[cc]) : 0.0f;
          }
        }
      }
    }

    // Causal (bottom-right aligned): query i sees key j iff j <= i + diag; the first query that
    // sees this block is n0 - diag.
    const int diag = p.seqlen_k - p.seqlen_q;
    const int m_first = T::kCausal ? (n0 - diag > 0 ? (n0 - diag) / BM : 0) : 0;
    const int m_blocks = (p.seqlen_q + BM - 1) / BM;
    const i32x16 lane = lane_indices();
#ifdef FLASHJIT_VARIANT
    // An attention variant (templates/attention_variant.h, before the rest; all its code is under
    // #ifdef FLASHJIT_VARIANT, so that plain kernels compile exactly as before) changes three
    // things, as in the forward: the dK/dV items visit only the query blocks whose rows may see
    // their key block (query_rows, here) and the dQ items only the key blocks their rows may see
    // (key_blocks); P is recomputed from the variant's scores (score_and_grad, visible()) and
    // the forward's lse in the blocks that need it; and dS = P (dP - D) is multiplied by
    // d score / d s (the soft-cap's 1 - tanh^2, the user's score_mod_grad). Masked entries have
    // P = dS = 0.
    namespace fv = flashjit_variant;
    const fv::QueryRows query_rows = fv::query_rows(p, diag, n0, cols);
    const int m_begin = query_rows.first / BM;
    const int m_end =
        query_rows.first < query_rows.last ? (query_rows.last + BM - 1) / BM : m_begin;
    (void)m_first, (void)lane;
#endif

    for (int h = hk * p.group_size; h < (hk + 1) * p.group_size; ++h) {
#ifdef FLASHJIT_VARIANT
      const float slope = fv::alibi_slope(p, h);
#endif
      const Element* q = (const Element*)p.q + b * p.q_batch_stride + h * p.q_head_stride;
      const Element* d_o = (const Element*)p.d_o + b * p.do_batch_stride + h * p.do_head_stride;
      const float* lse_log2 = p.lse_log2 + workspace_row(p, b, h);
      const float* delta = p.delta + workspace_row(p, b, h);
      float* const dq_head =
          T::kFusedDq ? dq_accum + (i64)(h - hk * p.group_size) * p.seqlen_q_rounded * DR : nullptr;

#ifdef FLASHJIT_VARIANT
      for (int m_block = m_begin; m_block < m_end; ++m_block) {
#else
      for (int m_block = m_first; m_block < m_blocks; ++m_block) {
#endif
        const int q0 = m_block * BM;
        const int rows = min_int(BM, p.seqlen_q - q0);
        const int padded_rows = (rows + 1) & ~1;  // the tiles' rows: an even count
#ifdef FLASHJIT_VARIANT
        // A query block whose rows the mask_mod shows none of these keys: skipped (dS = 0).
        if constexpr (fv::kMaskMod)
          if (!fv::block_seen(p, diag, b, h, q0, rows, n0, cols)) continue;
#endif

        // The next query block's rows of Q, dO (and dQ_i), which come from the L3 or memory
        // once per key block, asked for now: they arrive while this block is computed.
        if (m_block + 1 < m_blocks) {
          const int next = q0 + BM, next_rows = min_int(BM, p.seqlen_q - next);
          for (int i = next; i < next + next_rows; ++i) {
            prefetch(q + (i64)i * p.q_seq_stride, D * (int)sizeof(Element));
            prefetch(d_o + (i64)i * p.do_seq_stride, D * (int)sizeof(Element));
          }
          if constexpr (T::kFusedDq) prefetch(dq_head + (i64)next * DR, next_rows * DR * 4);
        }

        // S = Q K^T and dP = dO V^T (a row past seqlen_q: zero in fp32, the last row repeated in
        // place for the dot products; its lse_log2 is +inf, so P = dS = 0 there).
        if constexpr (kDot) {
          for (int ii = 0; ii < padded_rows / 2; ++ii) {
            const int i = 2 * ii;
            const u16* q_lo = q + (i64)(q0 + min_int(i, rows - 1)) * p.q_seq_stride;
            const u16* q_hi = q + (i64)(q0 + min_int(i + 1, rows - 1)) * p.q_seq_stride;
            const u16* d_lo = d_o + (i64)(q0 + min_int(i, rows - 1)) * p.do_seq_stride;
            const u16* d_hi = d_o + (i64)(q0 + min_int(i + 1, rows - 1)) * p.do_seq_stride;
            const u32 keep_lo = i < rows ? 0xffffu : 0u, keep_hi = i + 1 < rows ? 0xffffu : 0u;
            for (int c = 0; c < D; ++c) {
              qp[ii * D + c] = (q_lo[c] & keep_lo) | (u32)(q_hi[c] & keep_hi) << 16;
              dop[ii * D + c] = (d_lo[c] & keep_lo) | (u32)(d_hi[c] & keep_hi) << 16;
            }
          }
          for_each_tile<kKeyRows>(padded_rows, [&](int r0, auto tile) {
            constexpr int RT = decltype(tile)::value;
            const u16* q_rows[RT];
            const u16* d_rows[RT];
            for (int r = 0; r < RT; ++r) {
              const int i = q0 + min_int(r0 + r, rows - 1);
              q_rows[r] = q + (i64)i * p.q_seq_stride;
              d_rows[r] = d_o + (i64)i * p.do_seq_stride;
            }
            for (int g = 0; g < BN; g += KV * kLanes) {
              scores_tile_dot<D, BN, RT, KV>(q_rows, kp, s, r0, g);
              scores_tile_dot<D, BN, RT, KV>(d_rows, vp, dp, r0, g);
            }
          });
        } else {
          for (int i = 0; i < padded_rows; ++i) {
            const bool in = i < rows;
            const Element* q_row = q + (i64)(q0 + (in ? i : 0)) * p.q_seq_stride;
            const Element* do_row = d_o + (i64)(q0 + (in ? i : 0)) * p.do_seq_stride;
            const float keep = in ? 1.0f : 0.0f;
            convert_row<T::kStorage, D>(q_row, qa + i * D, keep);
            convert_row<T::kStorage, D>(do_row, da + i * D, keep);
          }
          // A column slice of K^T (V^T) stays in L1 while the rows of Q (dO) pass.
          for (int g = 0; g < BN; g += KV * kLanes)
            for_each_tile<kKeyRows>(padded_rows, [&](int r0, auto tile) {
              scores_tile<D, BN, decltype(tile)::value, KV>(qa, Int<D>(), kt, s, r0, g);
            });
          for (int g = 0; g < BN; g += KV * kLanes)
            for_each_tile<kKeyRows>(padded_rows, [&](int r0, auto tile) {
              scores_tile<D, BN, decltype(tile)::value, KV>(da, Int<D>(), vt, dp, r0, g);
            });
        }

        // P = exp2(S - lse_log2), dS = P (dP - D), a row at a time over the key lanes. Masked:
        // keys past seqlen_k, and (causal) keys past the row's diagonal, where this block
        // crosses it.
        const bool mask = cols < BN || (T::kCausal && n0 + BN - 1 > q0 + diag);
        const float scale = kDot ? p.scale_log2 : 1.0f;
#ifdef FLASHJIT_VARIANT
        // The variant masks (causal and keys past seqlen_k included) and modifies the scores per
        // element in the blocks that need it, as the forward did; dS gets the scores' derivative.
        const bool all_visible = fv::block_fully_visible(p, diag, q0, rows, n0, BN);
        const bool variant_block = fv::kModifiesScores || !all_visible;
        (void)mask;
#endif
        auto probabilities = [&](int i, int x, f32x16* pv, f32x16* dsv) {
          f32x16 sv = load(s + i * BN + x) * scale;
#ifdef FLASHJIT_VARIANT
          f32x16 grad = 1.0f;
          if (variant_block && fv::kVectorMask) {
            // The row's visible keys (row_keys) and ALiBi's bias over the 16 key lanes at once
            // (d score / d s is 1: grad stays 1, hidden keys get P = 0).
            const int row = q0 + i;
            const i32x16 key = n0 + x + lane;
            if (fv::kModifiesScores)
              sv += (slope * kLog2e) * __builtin_convertvector(key - row, f32x16);
            if (!all_visible) {
              const fv::RowKeys keys = fv::row_keys(p, diag, row);
              sv =
                  (key < keys.prefix_end) | ((key >= keys.begin) & (key < keys.end)) ? sv : kNegInf;
            }
          } else if (variant_block) {
            const int row = q0 + i;
            for (int l = 0; l < kLanes; ++l) {
              const int key = n0 + x + l;
              float g;
              const float score = fv::score_and_grad(sv[l] * 0.6931471805599453f, slope, b, h, row,
                                                     key, (float)(key - row), &g);
              const bool seen = all_visible || fv::visible(p, diag, b, h, row, key);
              sv[l] = seen ? score * kLog2e : kNegInf;
              grad[l] = seen ? g : 0.0f;
            }
          }
#else
          if (mask) {
            const int last = T::kCausal ? min_int(q0 + i + diag, p.seqlen_k - 1) : p.seqlen_k - 1;
            sv = n0 + x + lane <= last ? sv : kNegInf;
          }
#endif
          *pv = exp2_nonpositive(sv - lse_log2[q0 + i]);
#ifdef FLASHJIT_VARIANT
          *dsv = *pv * (load(dp + i * BN + x) - delta[q0 + i]) * grad;
#else
          *dsv = *pv * (load(dp + i * BN + x) - delta[q0 + i]);
#endif
        };
        if constexpr (kDot) {
          // Rows (i, i + 1) as bf16 pairs, written over S and dP rows this loop has read; for the
          // fused dQ also each row of dS as bf16 pairs of keys, 32 keys (x, x + 16) at a time.
          for (int i = 0; i < padded_rows; i += 2)
            for (int x = 0; x < BN; x += 2 * kLanes) {
              f32x16 pv[2][2], dsv[2][2];  // [row i, i + 1][keys x, x + 16]
              for (int r = 0; r < 2; ++r)
                for (int half = 0; half < 2; ++half)
                  probabilities(i + r, x + half * kLanes, &pv[r][half], &dsv[r][half]);
              for (int half = 0; half < 2; ++half) {
                const int at = (i / 2) * BN + x + half * kLanes;
                store_pairs(pp + at, pack_bf16_pairs(pv[0][half], pv[1][half]));
                store_pairs(dsp + at, pack_bf16_pairs(dsv[0][half], dsv[1][half]));
              }
              if constexpr (T::kFusedDq) {
                for (int r = 0; r < 2; ++r)
                  store_pairs(dsr + (i + r) * (BN / 2) + x / 2,
                              pack_bf16_row(dsv[r][0], dsv[r][1]));
              }
            }
        } else {
          // The padding row of an odd count too (P = dS = 0 there: its lse_log2 is +inf), for
          // the fused dQ's tiles of even rows.
          for (int i = 0; i < padded_rows; ++i)
            for (int x = 0; x < BN; x += kLanes) {
              f32x16 pv, dsv;
              probabilities(i, x, &pv, &dsv);
              store(s + i * BN + x, pv);
              store(dp + i * BN + x, dsv);
            }
        }

        // dV^T += dO^T P and dK^T += Q^T dS, over the rows of this query block. The head dims
        // outermost: a column slice of dO (Q) stays in L1 while the lanes of P (dS) pass.
        for_each_tile<kKeyDims>(D, [&](int c0, auto tile) {
          constexpr int CT = decltype(tile)::value;
          for (int g = 0; g < BN; g += KV * kLanes) {
            if constexpr (kDot) {
              accumulate_tile<1, BN, BN, CT, KV>(dop, Int<D>(), pp, dvt, padded_rows / 2, c0, g);
              accumulate_tile<1, BN, BN, CT, KV>(qp, Int<D>(), dsp, dkt, padded_rows / 2, c0, g);
            } else {
              accumulate_tile<1, BN, BN, CT, KV>(da, Int<D>(), s, dvt, rows, c0, g);
              accumulate_tile<1, BN, BN, CT, KV>(qa, Int<D>(), dp, dkt, rows, c0, g);
            }
          }
        });

        // Fused dQ: dQ_i += dS K over the keys of this block, the head dims in the lanes (a
        // column slice of K stays in L1 while the rows of dS pass).
        if constexpr (T::kFusedDq) {
          float* const dq_block = dq_head + (i64)q0 * DR;
          for (int g = 0; g < DL; g += DV * kLanes)
            for_each_tile<kDqRows>(padded_rows, [&](int i0, auto tile) {
              constexpr int RT = decltype(tile)::value;
              if constexpr (kDot)
                accumulate_tile<BN / 2, DL, DR, RT, DV>(dsr, Int<1>(), kpj, dq_block,
                                                        (cols + 1) / 2, i0, g);
              else
                accumulate_tile<BN, DL, DR, RT, DV>(dp, Int<1>(), ka, dq_block, cols, i0, g);
            });
        }
      }
    }

    // dK = scale * dK^T^T, dV = dV^T^T in the storage type.
    Element* dk = (Element*)p.dk + b * p.dk_batch_stride + hk * p.dk_head_stride;
    Element* dv = (Element*)p.dv + b * p.dv_batch_stride + hk * p.dv_head_stride;
    for (int j = 0; j < cols; ++j) {
      Element* dk_row = dk + (i64)(n0 + j) * p.dk_seq_stride;
      Element* dv_row = dv + (i64)(n0 + j) * p.dv_seq_stride;
      for (int c = 0; c < D; ++c) dk_row[c] = from_float<T::kStorage>(dkt[c * BN + j] * p.scale);
      for (int c = 0; c < D; ++c) dv_row[c] = from_float<T::kStorage>(dvt[c * BN + j]);
    }
  }

  // ---- dQ: one block of BM queries of (batch b, head h) ---------------------------------------
  // (DqMode::Separate; defined in cpu/attention_bwd_dq.hpp, which the renderer appends.)
  static void dq_block(const FlashjitAttentionParams& p, int b, int h, int m_block, float* scratch);

  // ---- fused dQ: a split of the key blocks, then the sum of the splits ------------------------

  // The key blocks s, s + splits, ... of (batch b, kv head hk), their dQ into copy s of
  // dq_accum, whose rows of the group's heads this work item zeroes first (it owns them).
  static void dkdv_split(const FlashjitAttentionParams& p, int b, int hk, int split,
                         float* scratch) {
    const i64 head_floats = (i64)p.seqlen_q_rounded * DR;
    float* const dq_accum =
        p.dq_accum +
        (((i64)split * p.batch + b) * p.heads_q + (i64)hk * p.group_size) * head_floats;
    for (i64 x = 0; x < p.group_size * head_floats; ++x) dq_accum[x] = 0.0f;
    const int n_blocks = (p.seqlen_k + BN - 1) / BN;
    for (int n_block = split; n_block < n_blocks; n_block += p.dq_accum_splits)
      dkdv_block(p, b, hk, n_block, scratch, dq_accum);
  }

  // dQ = scale * (dq_accum[0] + dq_accum[1] + ...) for BM queries of (batch b, head h).
  static void dq_sum_block(const FlashjitAttentionParams& p, int b, int h, int m_block) {
    const int q0 = m_block * BM;
    const int rows = min_int(BM, p.seqlen_q - q0);
    const i64 copy_floats = (i64)p.batch * p.heads_q * p.seqlen_q_rounded * DR;
    const float* accum = p.dq_accum + (workspace_row(p, b, h) + q0) * DR;
    Element* dq = (Element*)p.dq + b * p.dq_batch_stride + h * p.dq_head_stride;
    for (int i = 0; i < rows; ++i) {
      float sum[D];
      for (int c = 0; c < D; ++c) sum[c] = accum[i * DR + c];
      for (int split = 1; split < p.dq_accum_splits; ++split)
        for (int c = 0; c < D; ++c) sum[c] += accum[split * copy_floats + i * DR + c];
      Element* dq_row = dq + (i64)(q0 + i) * p.dq_seq_stride;
      for (int c = 0; c < D; ++c) dq_row[c] = from_float<T::kStorage>(sum[c] * p.scale);
    }
  }

  // ---- entry points: work items [begin, end), the block index fastest ----------------------

#ifdef FLASHJIT_VARIANT
  // Packed documents (FLASHJIT_VARIANT_VARLEN): `doc` becomes document b's view of the params
  // (templates/attention_variant.h, document_view: its rows of every tensor and its lengths,
  // batch index b of the workspace kept); false when its queries end at or before m0 (m0 < 0:
  // never). Other variants: the params as they are.
  static bool view(FlashjitAttentionParams& doc, int b, int m0) {
#if FLASHJIT_VARIANT_VARLEN
    return flashjit_variant::document_view(doc, b, m0, (int)sizeof(Element));
#else
    (void)doc, (void)b, (void)m0;
    return true;
#endif
  }

#endif
  // batch x heads_q x ceil(seqlen_q / BM).
  static int preprocess(const FlashjitAttentionParams& p, int begin, int end) {
    const int m_blocks = (p.seqlen_q + BM - 1) / BM;
#ifdef FLASHJIT_VARIANT
    for (int w = begin; w < end; ++w) {
      const int b = w / m_blocks / p.heads_q, h = (w / m_blocks) % p.heads_q, m = w % m_blocks;
      FlashjitAttentionParams doc = p;
      if (view(doc, b, m * BM)) preprocess_block(doc, b, h, m);
    }
#else
    for (int w = begin; w < end; ++w)
      preprocess_block(p, w / m_blocks / p.heads_q, (w / m_blocks) % p.heads_q, w % m_blocks);
#endif
    return 0;
  }

  // batch x heads_kv x ceil(seqlen_k / BN), or with the fused dQ batch x heads_kv x
  // dq_accum_splits. Returns 1 when the scratch could not be allocated.
  static int dkdv(const FlashjitAttentionParams& p, int begin, int end) {
    float* scratch =
        (float*)aligned_alloc(64, (unsigned long)((T::kDkDvScratchFloats * 4 + 63) & ~63LL));
    if (!scratch) return 1;
    const int n_blocks = (p.seqlen_k + BN - 1) / BN;
    const int splits = p.dq_accum_splits;
#ifdef FLASHJIT_VARIANT
    // (A document without queries still gets its dK = dV = 0 written.)
    for (int w = begin; w < end; ++w) {
      const int per = T::kFusedDq ? splits : n_blocks;
      const int b = w / per / p.heads_kv, hk = (w / per) % p.heads_kv, i = w % per;
      FlashjitAttentionParams doc = p;
      view(doc, b, -1);
      if constexpr (T::kFusedDq)
        dkdv_split(doc, b, hk, i, scratch);
      else if (i * BN < doc.seqlen_k)
        dkdv_block(doc, b, hk, i, scratch, nullptr);
    }
#else
    for (int w = begin; w < end; ++w) {
      if constexpr (T::kFusedDq)
        dkdv_split(p, w / splits / p.heads_kv, (w / splits) % p.heads_kv, w % splits, scratch);
      else
        dkdv_block(p, w / n_blocks / p.heads_kv, (w / n_blocks) % p.heads_kv, w % n_blocks, scratch,
                   nullptr);
    }
#endif
    free(scratch);
    return 0;
  }

  // batch x heads_q x ceil(seqlen_q / BM). Returns 1 when the scratch could not be allocated.
  static int dq(const FlashjitAttentionParams& p, int begin, int end) {
    const int m_blocks = (p.seqlen_q + BM - 1) / BM;
#ifdef FLASHJIT_VARIANT
    float* scratch = T::kFusedDq ? nullptr
                                 : (float*)aligned_alloc(
                                       64, (unsigned long)((T::kDqScratchFloats * 4 + 63) & ~63LL));
    if (!T::kFusedDq && !scratch) return 1;
    for (int w = begin; w < end; ++w) {
      const int b = w / m_blocks / p.heads_q, h = (w / m_blocks) % p.heads_q, m = w % m_blocks;
      FlashjitAttentionParams doc = p;
      if (!view(doc, b, m * BM)) continue;
      if constexpr (T::kFusedDq)
        dq_sum_block(doc, b, h, m);
      else
        dq_block(doc, b, h, m, scratch);
    }
    free(scratch);
#else
    if constexpr (T::kFusedDq) {
      for (int w = begin; w < end; ++w)
        dq_sum_block(p, w / m_blocks / p.heads_q, (w / m_blocks) % p.heads_q, w % m_blocks);
    } else {
      float* scratch =
          (float*)aligned_alloc(64, (unsigned long)((T::kDqScratchFloats * 4 + 63) & ~63LL));
      if (!scratch) return 1;
      for (int w = begin; w < end; ++w)
        dq_block(p, w / m_blocks / p.heads_q, (w / m_blocks) % p.heads_q, w % m_blocks, scratch);
      free(scratch);
    }
#endif
    return 0;
  }
};

}  // namespace flashjit_cpu
