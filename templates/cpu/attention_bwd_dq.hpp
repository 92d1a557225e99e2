// The CPU backward's dQ kernel (DqMode::Separate, "-det"), a member of flashjit_cpu::Backward in
// templates/cpu/attention_bwd.hpp, which this file follows in the rendered source: one block of
// kBlockM queries of (batch b, head h), S and dP recomputed per key block (the algorithm is at
// the top of that file).

namespace flashjit_cpu {

template <class T>
void Backward<T>::dq_block(const FlashjitAttentionParams& p, int b, int h, int m_block,
                           float* scratch) {
  // fp32: Q^T (scaled into log2 units), dO^T [D][BM]; K, V [BN][D].
  // bf16 dot products: Q^T, dO^T as pairs along d [D/2][BM]; K as pairs along the keys
  // [BN/2][D] (for dQ; S and dP read K and V in place).
  float* const qt = scratch;
  float* const dt = qt + D * BM;
  float* const dqt = dt + D * BM;  // [D][BM] accumulator
  float* const ka = dqt + D * BM;  // [BN][D]
  float* const va = ka + BN * D;
  float* const st = va + BN * D;    // [BN][BM]: S^T
  float* const dpt = st + BN * BM;  // [BN][BM]: dP^T, then dS^T (fp32 or bf16 pairs of keys)
  u32* const qp = (u32*)qt;
  u32* const dop = (u32*)dt;
  u32* const kp = (u32*)ka;
  u32* const dsp = (u32*)dpt;
  const float kNegInf = -__builtin_inff();

  const int q0 = m_block * BM;
  const int rows = min_int(BM, p.seqlen_q - q0);
  const int hk = h / p.group_size;
  const Element* q = (const Element*)p.q + b * p.q_batch_stride + h * p.q_head_stride;
  const Element* d_o = (const Element*)p.d_o + b * p.do_batch_stride + h * p.do_head_stride;
  const Element* k = (const Element*)p.k + b * p.k_batch_stride + hk * p.k_head_stride;
  const Element* v = (const Element*)p.v + b * p.v_batch_stride + hk * p.v_head_stride;
  const float* lse_log2 = p.lse_log2 + workspace_row(p, b, h) + q0;
  const float* delta = p.delta + workspace_row(p, b, h) + q0;

  // Q^T and dO^T; padding rows (past seqlen_q) are zero, their lse_log2 +inf: P = dS = 0.
  for (int i = 0; i < BM; ++i) {
    const bool in = i < rows;
    const Element* q_row = q + (i64)(q0 + (in ? i : 0)) * p.q_seq_stride;
    const Element* do_row = d_o + (i64)(q0 + (in ? i : 0)) * p.do_seq_stride;
    if constexpr (kDot) {
      for (int c = 0; c < D; c += 2) {
        qp[(c / 2) * BM + i] = in ? pair_at(q_row + c) : 0u;
        dop[(c / 2) * BM + i] = in ? pair_at(do_row + c) : 0u;
      }
    } else {
      const float keep = in ? 1.0f : 0.0f;
      for (int c = 0; c < D; ++c) {
        qt[c * BM + i] = to_float<T::kStorage>(q_row[c]) * (keep * p.scale_log2);
        dt[c * BM + i] = to_float<T::kStorage>(do_row[c]) * keep;
      }
    }
  }
  for (int x = 0; x < D * BM; ++x) dqt[x] = 0.0f;

  const int diag = p.seqlen_k - p.seqlen_q;
  const int kv_end = key_end<T::kCausal>(p, q0, rows, diag);
  const i32x16 lane = lane_indices();

#ifdef FLASHJIT_VARIANT
  // The variant's key blocks (templates/attention_variant.h), as the forward's: hidden blocks
  // are never packed.
  namespace fv = flashjit_variant;
  const fv::KeyBlocks key_blocks = fv::key_blocks(p, diag, q0, rows, BN);
  const float slope = fv::alibi_slope(p, h);
  // Each row's visible keys (row_keys), by lanes of 16 rows: the mask where kVectorMask.
  i32x16 band_begin[BM / kLanes], band_end[BM / kLanes];
  if constexpr (fv::kVectorMask)
    for (int i = 0; i < BM; ++i) {
      const fv::RowKeys keys = fv::row_keys(p, diag, q0 + i);
      band_begin[i / kLanes][i % kLanes] = keys.begin;
      band_end[i / kLanes][i % kLanes] = keys.end;
    }
  const int prefix_end = fv::row_keys(p, diag, q0).prefix_end;
  (void)kv_end, (void)lane, (void)prefix_end;
  for (int t = 0; t < key_blocks.count(); ++t) {
    const int n0 = key_blocks.at(t) * BN;
    // A key block the mask_mod hides from every row of this one: skipped (dS = 0).
    if constexpr (fv::kMaskMod)
      if (!fv::block_seen(p, diag, b, h, q0, rows, n0, BN)) continue;
#else
  for (int n0 = 0; n0 < kv_end; n0 += BN) {
#endif
    const int cols = min_int(BN, p.seqlen_k - n0);
    const int key_pairs = (cols + 1) / 2;  // the tiles' rows: 2 * key_pairs

    // S^T = K Q^T and dP^T = V dO^T over an even count of keys (a key past seqlen_k: zero in
    // fp32, the last key repeated in place for the dot products; its dS is never used).
    if constexpr (kDot) {
      for (int jj = 0; jj < key_pairs; ++jj) {
        const u16* k0 = k + (i64)(n0 + 2 * jj) * p.k_seq_stride;
        const bool second = 2 * jj + 1 < cols;
        const u16* k1 = second ? k0 + p.k_seq_stride : k0;
        for (int c = 0; c < D; ++c) kp[jj * D + c] = k0[c] | (second ? (u32)k1[c] << 16 : 0u);
      }
      for_each_tile<kQueryRows>(2 * key_pairs, [&](int r0, auto tile) {
        constexpr int RT = decltype(tile)::value;
        const u16* k_rows[RT];
        const u16* v_rows[RT];
        for (int r = 0; r < RT; ++r) {
          const int j = n0 + min_int(r0 + r, cols - 1);
          k_rows[r] = k + (i64)j * p.k_seq_stride;
          v_rows[r] = v + (i64)j * p.v_seq_stride;
        }
        for (int g = 0; g < BM; g += QV * kLanes) {
          scores_tile_dot<D, BM, RT, QV>(k_rows, qp, st, r0, g);
          scores_tile_dot<D, BM, RT, QV>(v_rows, dop, dpt, r0, g);
        }
      });
    } else {
      for (int j = 0; j < 2 * key_pairs; ++j) {
        const bool in = j < cols;
        const Element* k_row = k + (i64)(n0 + (in ? j : 0)) * p.k_seq_stride;
        const Element* v_row = v + (i64)(n0 + (in ? j : 0)) * p.v_seq_stride;
        const float keep = in ? 1.0f : 0.0f;
        convert_row<T::kStorage, D>(k_row, ka + j * D, keep);
        convert_row<T::kStorage, D>(v_row, va + j * D, keep);
      }
      for (int g = 0; g < BM; g += QV * kLanes)
        for_each_tile<kQueryRows>(2 * key_pairs, [&](int r0, auto tile) {
          scores_tile<D, BM, decltype(tile)::value, QV>(ka, Int<D>(), qt, st, r0, g);
        });
      for (int g = 0; g < BM; g += QV * kLanes)
        for_each_tile<kQueryRows>(2 * key_pairs, [&](int r0, auto tile) {
          scores_tile<D, BM, decltype(tile)::value, QV>(va, Int<D>(), dt, dpt, r0, g);
        });
    }

    // dS^T = P^T (dP^T - D), a key at a time over the query lanes; (causal) masked where the
    // block crosses the diagonal. The loops stop at cols: keys past seqlen_k get no dS.
    const bool crosses_diagonal = T::kCausal && n0 + cols - 1 > q0 + diag;
    const float scale = kDot ? p.scale_log2 : 1.0f;
#ifdef FLASHJIT_VARIANT
    // The variant per element where the block needs it (as dK/dV's probabilities).
    const bool all_visible = fv::block_fully_visible(p, diag, q0, rows, n0, cols);
    const bool variant_block = fv::kModifiesScores || !all_visible;
    (void)crosses_diagonal;
#endif
    auto gradient = [&](int j, int x) {
      f32x16 sv = load(st + j * BM + x) * scale;
#ifdef FLASHJIT_VARIANT
      f32x16 grad = 1.0f;
      if (variant_block && fv::kVectorMask) {
        // As dK/dV's: the 16 row lanes' visible keys (row_keys, once per query block) against
        // this key, and ALiBi's bias.
        const int key = n0 + j;
        if (fv::kModifiesScores)
          sv += (slope * kLog2e) * __builtin_convertvector(key - (q0 + x + lane), f32x16);
        if (!all_visible && key >= prefix_end)
          sv = (key >= band_begin[x / kLanes]) & (key < band_end[x / kLanes]) ? sv : kNegInf;
      } else if (variant_block) {
        const int key = n0 + j;
        for (int l = 0; l < kLanes; ++l) {
          const int row = q0 + x + l;
          float g;
          const float score = fv::score_and_grad(sv[l] * 0.6931471805599453f, slope, b, h, row, key,
                                                 (float)(key - row), &g);
          const bool seen = all_visible || fv::visible(p, diag, b, h, row, key);
          sv[l] = seen ? score * kLog2e : kNegInf;
          grad[l] = seen ? g : 0.0f;
        }
      }
#else
      if (crosses_diagonal) {
        // Query q0 + x + lane sees key n0 + j iff n0 + j <= q0 + x + lane + diag.
        sv = n0 + j - q0 - x - diag <= lane ? sv : kNegInf;
      }
#endif
      const f32x16 pv = exp2_nonpositive(sv - load(lse_log2 + x));
#ifdef FLASHJIT_VARIANT
      return pv * (load(dpt + j * BM + x) - load(delta + x)) * grad;
#else
      return pv * (load(dpt + j * BM + x) - load(delta + x));
#endif
    };
    if constexpr (kDot) {
      // Keys (j, j + 1) as bf16 pairs, written over dP^T rows this loop has read.
      for (int j = 0; j < cols; j += 2)
        for (int x = 0; x < BM; x += kLanes) {
          const f32x16 ds0 = gradient(j, x);
          const f32x16 ds1 = j + 1 < cols ? gradient(j + 1, x) : 0.0f;
          store_pairs(dsp + (j / 2) * BM + x, pack_bf16_pairs(ds0, ds1));
        }
    } else {
      for (int j = 0; j < cols; ++j)
        for (int x = 0; x < BM; x += kLanes) store(dpt + j * BM + x, gradient(j, x));
    }

    // dQ^T += K^T dS^T over the keys of this block (the head dims outermost, as for dK).
    for_each_tile<kQueryDims>(D, [&](int c0, auto tile) {
      constexpr int CT = decltype(tile)::value;
      for (int g = 0; g < BM; g += QV * kLanes) {
        if constexpr (kDot)
          accumulate_tile<1, BM, BM, CT, QV>(kp, Int<D>(), dsp, dqt, key_pairs, c0, g);
        else
          accumulate_tile<1, BM, BM, CT, QV>(ka, Int<D>(), dpt, dqt, cols, c0, g);
      }
    });
  }

  // dQ = scale * dQ^T^T in the storage type (rows with no visible key: 0).
  Element* dq = (Element*)p.dq + b * p.dq_batch_stride + h * p.dq_head_stride;
  for (int i = 0; i < rows; ++i) {
    Element* dq_row = dq + (i64)(q0 + i) * p.dq_seq_stride;
    for (int c = 0; c < D; ++c) dq_row[c] = from_float<T::kStorage>(dqt[c * BM + i] * p.scale);
  }
}

}  // namespace flashjit_cpu
