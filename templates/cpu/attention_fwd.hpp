// flashjit CPU attention forward: FlashAttention's algorithm on the host, compiled by Clang at run
// time with -O3 for the host CPU (every ISA feature it has: AVX2, AVX-512, FMA, AVX512_BF16).
//
// The vector lanes run along the query rows: 16 queries per f32x16, so that the online softmax
// (a max and a sum over keys for each query) is element-wise vector arithmetic, and both matrix
// products are register-tiled outer products with one operand broadcast from memory.
//
// One work item = (batch, head, block of kBlockM query rows). For each item:
//   Q^T <- the Q block, transposed (d x kBlockM)
//   O^T <- 0 (d x kBlockM);  m <- -inf;  l <- 0            (per query, base-2 units)
//   for each block of kBlockN keys (only up to the causal diagonal):
//     pack the block of K and V once (it is read kBlockM / 16 times; fp32: read in place)
//     S^T = K Q^T * scale * log2(e)        (tiles: kKeyTile keys x kQueryVecs query vectors)
//     mask the block that crosses the causal diagonal
//     m' = max(m, max_j S^T[j]);  P^T = exp2(S^T - m');  alpha = exp2(m - m')
//     l = l * alpha + sum_j P^T[j];  m = m'
//     O^T = O^T * alpha + V^T P^T          (tiles: kDimTile dims x kQueryVecs query vectors)
//   O = (O^T / l)^T in the storage type;  lse = (m + log2 l) * ln 2 (natural log).
// A row with no visible key (causal, seqlen_q > seqlen_k) gets O = 0 and lse = +inf.
//
// Two kinds of arithmetic, both accumulating in fp32:
//   fp32 FMAs (fp16 and fp32 storage; bf16 on a host without AVX512_BF16): Q^T, K, V converted to
//     fp32 when packed, Q^T pre-scaled by scale * log2(e); fp32 K and V are read in place
//     (a block of odd length excepted), not copied.
//   bf16 dot products (bf16 storage with AVX512_BF16, kDotBf16): vdpbf16ps multiplies pairs of
//     bf16 exactly and adds them in fp32, at twice the FMA's rate. Q and V are packed as bf16
//     pairs along the reduced axis, K is read in place, P is rounded to bf16 for P V (as
//     FlashAttention-2 does on the GPU), the scores are scaled in the softmax.
//
// The L1/L2 caches play the role of shared memory: the generator (generator/cpu_config.hpp) keeps
// the scratch of one work item (kScratchFloats below) within the L2 budget.
//
// Nothing is included: the host's aligned_alloc/free and log2f are resolved by the JIT from the
// process. The rendered source prepends attention_params.h and cpu/common.hpp (storage
// conversions, vectors, exp2, bf16 pairs) and appends one Traits instantiation. A problem with
// an attention variant gets templates/attention_variant.h (FLASHJIT_VARIANT) before them: its key
// blocks replace the causal range, and its scores and mask are applied per element.

namespace flashjit_cpu {

template <int HeadDim, int BlockM, int BlockN, int StorageType, bool Causal>
struct Traits {
  FLASHJIT_CPU_TRAITS_SHAPE(HeadDim, BlockM, BlockN, StorageType, Causal);
  static_assert(BlockM >= kLanes && BlockM <= 256 && BlockM % kLanes == 0,
                "block_m must be a multiple of 16 (the query lanes of a vector) in [16, 256]");
  static_assert(BlockN >= 16 && BlockN <= 256 && BlockN % 16 == 0,
                "block_n must be a multiple of 16 (the largest key tile) in [16, 256]");
  static_assert(StorageType == kF16 || StorageType == kBF16 || StorageType == kF32,
                "storage must be fp16, bf16 or fp32");

  // Register tiles, sized for the host's registers (common.hpp): kQueryVecs vectors of 16
  // queries times kKeyTile keys (S^T) or kDimTile head dims (O^T). AVX-512: 4 x 4 (16 zmm
  // accumulators); AVX2: 1 x 6 (12 ymm; f32x16 is two ymm); the rest of a block in tiles of 4
  // and 2 (for_each_tile).
  static constexpr int kQueryVecs = tile_lane_vectors(BlockM);
  static constexpr int kKeyTile = kTileVectors / kQueryVecs;
  static constexpr int kDimTile = tile_dims(kQueryVecs);
  static_assert(BlockM % (kQueryVecs * kLanes) == 0, "query groups must tile block_m");
  static_assert(kKeyTile % 2 == 0 && kDimTile % 2 == 0,
                "tiles must be even: the rest of a block is done in tiles of 2");

  // bf16 storage on a host with AVX512_BF16: both products as bf16 dot products (see
  // dot_bf16_pairs), P rounded to bf16 for P V as on the GPU. Otherwise fp32 FMAs.
  static constexpr bool kDotBf16 = StorageType == kBF16 && FLASHJIT_CPU_DOT_BF16;

  // Scratch of one work item in 4-byte words: Q^T, K, V, S^T (then P^T), O^T blocks; m, l and
  // alpha per query. (The bf16 dot products use less: Q and V as pairs, no K, P in place of S.)
  static constexpr i64 kScratchFloats = (i64)BlockM * HeadDim + 2 * (i64)BlockN * HeadDim +
                                        (i64)BlockM * BlockN + (i64)BlockM * HeadDim + 3 * BlockM;
};

template <class T>
struct Kernel {
  FLASHJIT_CPU_KERNEL_SHAPE(T);  // D, BM, BN, Element
  static constexpr int QV = T::kQueryVecs;
  static constexpr int KT = T::kKeyTile;
  static constexpr int DT = T::kDimTile;
  static constexpr bool kDot = T::kDotBf16;
  static constexpr int kGroup = QV * kLanes;  // queries of one register tile

  // Whether a key block of `cols` rows `row_stride` floats apart is read in place rather than
  // packed: fp32 storage and an even count (the S^T tiles cover the keys in pairs), except with
  // tiles of one query vector (AVX2: the V block is walked once per 16 queries) when the rows are
  // a multiple of 4 KiB apart, so that all of them fall in the same L1 sets (one core, d 128,
  // 8-32 heads in BSHD: 5-8% slower in place than packed there, 2-6% faster at other strides;
  // AVX-512's tiles of 4 query vectors gained 7% in place at every stride).
  static bool in_place(int cols, i64 row_stride) {
    return T::kStorage == kF32 && cols % 2 == 0 && (QV > 1 || row_stride % 1024 != 0);
  }

  // One work item: query rows [m_block * BM, +BM) of (batch b, head h).
  static void block(const FlashjitAttentionParams& p, int b, int h, int m_block, float* scratch) {
    // fp32 arithmetic: Q^T [D][BM] (scaled into log2 units), K [BN][D], V [BN][D].
    // bf16 dot products: Q pairs [D/2][BM] (unscaled), V pairs [BN/2][D]; K is read in place.
    float* const qt = scratch;
    u32* const qp = (u32*)scratch;
    float* const kb = qt + D * BM;
    float* const vb = kb + BN * D;
    u32* const vp = (u32*)kb;
    float* const st = vb + BN * D;        // [BN][BM]: scores, then probabilities
    u32* const pp = (u32*)st;             // [BN/2][BM]: bf16 pairs of probabilities, in place
    float* const ot = st + BN * BM;       // [D][BM], O accumulator
    float* const row_max = ot + D * BM;   // [BM]
    float* const row_sum = row_max + BM;  // [BM]
    float* const alpha = row_sum + BM;    // [BM], this block's rescale of O
    const float kNegInf = -__builtin_inff();

    const int q0 = m_block * BM;
    const int rows = min_int(BM, p.seqlen_q - q0);
    const int hk = h / p.group_size;
    const Element* q = (const Element*)p.q + b * p.q_batch_stride + h * p.q_head_stride;
    const Element* k = (const Element*)p.k + b * p.k_batch_stride + hk * p.k_head_stride;
    const Element* v = (const Element*)p.v + b * p.v_batch_stride + hk * p.v_head_stride;

    // Q, transposed; padding rows (past seqlen_q) are zero and their results discarded.
    for (int i = 0; i < BM; ++i) {
      const Element* q_row = q + (i64)(q0 + (i < rows ? i : 0)) * p.q_seq_stride;
      if constexpr (kDot) {
        for (int c = 0; c < D; c += 2) qp[(c / 2) * BM + i] = i < rows ? pair_at(q_row + c) : 0;
      } else {
        const float keep = i < rows ? p.scale_log2 : 0.0f;
        for (int c = 0; c < D; ++c) qt[c * BM + i] = to_float<T::kStorage>(q_row[c]) * keep;
      }
    }
    for (int x = 0; x < D * BM; ++x) ot[x] = 0.0f;
    for (int i = 0; i < BM; ++i) row_max[i] = kNegInf, row_sum[i] = 0.0f;

    // Causal (bottom-right aligned): query i sees key j iff j <= i + diag.
    const int diag = p.seqlen_k - p.seqlen_q;
    const int kv_end = key_end<T::kCausal>(p, q0, rows, diag);
    const i32x16 lane = lane_indices();

#ifdef FLASHJIT_VARIANT
    // The variant's key blocks (templates/attention_variant.h): hidden blocks are never packed.
    namespace fv = flashjit_variant;
    const fv::KeyBlocks key_blocks = fv::key_blocks(p, diag, q0, rows, BN);
    const float slope = fv::alibi_slope(p, h);
    (void)kv_end;
    for (int t = 0; t < key_blocks.count(); ++t) {
      const int n0 = key_blocks.at(t) * BN;
      // A block the mask_mod hides from every row of this one: skipped, found by asking it.
      if constexpr (fv::kMaskMod)
        if (!fv::block_seen(p, diag, b, h, q0, rows, n0, BN)) continue;
#else
    for (int n0 = 0; n0 < kv_end; n0 += BN) {
#endif
      const int cols = min_int(BN, p.seqlen_k - n0);
      const int key_pairs = (cols + 1) / 2;  // S^T's tiles cover 2 * key_pairs keys

      // S^T = K Q^T, after packing this block of K and V (rows past seqlen_k are zero, never
      // garbage: 0 * NaN would be NaN).
      const bool k_in_place = in_place(cols, p.k_seq_stride);
      const bool v_in_place = in_place(cols, p.v_seq_stride);
      if constexpr (kDot) {
        for (int jj = 0; jj < key_pairs; ++jj) {
          const u16* v0 = v + (i64)(n0 + 2 * jj) * p.v_seq_stride;
          const bool second = 2 * jj + 1 < cols;
          const u16* v1 = second ? v0 + p.v_seq_stride : v0;
          for (int c = 0; c < D; ++c) vp[jj * D + c] = v0[c] | (second ? (u32)v1[c] << 16 : 0u);
        }
        for_each_tile<KT>(2 * key_pairs, [&](int j0, auto tile) {
          constexpr int RT = decltype(tile)::value;
          const u16* k_rows[RT];  // keys past seqlen_k repeat the last one (scores unused)
          for (int a = 0; a < RT; ++a)
            k_rows[a] = k + (i64)(n0 + min_int(j0 + a, cols - 1)) * p.k_seq_stride;
          for (int g = 0; g < BM; g += kGroup)
            scores_tile_dot<D, BM, RT, QV>(k_rows, qp, st, j0, g);
        });
      } else {
        // fp32 storage: K and V read where they are (in_place), otherwise packed.
        if (!k_in_place || !v_in_place) {
          for (int j = 0; j < 2 * key_pairs; ++j) {
            const bool in = j < cols;
            const Element* k_row = k + (i64)(n0 + (in ? j : 0)) * p.k_seq_stride;
            const Element* v_row = v + (i64)(n0 + (in ? j : 0)) * p.v_seq_stride;
            const float keep = in ? 1.0f : 0.0f;
            if (!k_in_place) convert_row<T::kStorage, D>(k_row, kb + j * D, keep);
            if (!v_in_place) convert_row<T::kStorage, D>(v_row, vb + j * D, keep);
          }
        }
        // k_stride: an i64 (in place), or Int<D> (packed: the tile's offsets constants).
        auto scores = [&](const float* k_block, auto k_stride) __attribute__((always_inline)) {
          for (int g = 0; g < BM; g += kGroup)
            for_each_tile<KT>(2 * key_pairs, [&](int j0, auto tile) {
              scores_tile<D, BM, decltype(tile)::value, QV>(k_block, k_stride, qt, st, j0, g);
            });
        };
        if (k_in_place)
          scores((const float*)k + n0 * p.k_seq_stride, p.k_seq_stride);
        else
          scores(kb, Int<D>());
      }

      // Online softmax, 16 queries at a time, over the cols keys of the block (the loops stop at
      // cols, so keys past seqlen_k need no mask). Causal: mask the block that crosses the
      // diagonal. The dot-product path scales the scores here (its Q is not pre-scaled).
#ifdef FLASHJIT_VARIANT
      // The variant masks (causal included) and modifies the scores, per element, in the blocks
      // that need it.
      const bool crosses_diagonal = false;
      const bool all_visible = fv::block_fully_visible(p, diag, q0, rows, n0, cols);
      const bool variant_block = fv::kModifiesScores || !all_visible;
#else
      const bool crosses_diagonal = T::kCausal && n0 + cols - 1 > q0 + diag;
#endif
      for (int i = 0; i < BM; i += kLanes) {
        f32x16 block_max = kNegInf;
#ifdef FLASHJIT_VARIANT
        if (variant_block) {
          // st * to_score is the scaled score scale * q . k (the fp32 path's Q carries
          // scale * log2(e), the dot path's nothing); through the variant, back in log2 units.
          const float to_score = kDot ? p.scale : 0.6931471805599453f;
          for (int j = 0; j < cols; ++j) {
            float* scores = st + j * BM + i;
            for (int lane_index = 0; lane_index < kLanes; ++lane_index) {
              const int row = q0 + i + lane_index, key = n0 + j;
              const float score = fv::score(scores[lane_index] * to_score, slope, b, h, row, key,
                                            static_cast<float>(key - row));
              scores[lane_index] = all_visible || fv::visible(p, diag, b, h, row, key)
                                       ? score * 1.4426950408889634f
                                       : kNegInf;
            }
            block_max = vmax(block_max, load(scores));
          }
        } else
#endif
            if (crosses_diagonal || kDot) {
          // Query q0 + i + lane sees key n0 + j iff j <= q0 + i + lane + diag - n0.
          const i32x16 last = q0 + i + diag - n0 + lane;
          const float scale = kDot ? p.scale_log2 : 1.0f;
          for (int j = 0; j < cols; ++j) {
            f32x16 s = load(st + j * BM + i) * scale;
            if (crosses_diagonal) s = j <= last ? s : kNegInf;
            store(st + j * BM + i, s);
            block_max = vmax(block_max, s);
          }
        } else {
          for (int j = 0; j < cols; ++j) block_max = vmax(block_max, load(st + j * BM + i));
        }
        const f32x16 m_old = load(row_max + i);
        const f32x16 m_new = vmax(m_old, block_max);
        // Lanes that have seen no visible key yet keep P = 0, alpha = 0, l = 0, O = 0.
        const f32x16 m_safe = m_new == kNegInf ? 0.0f : m_new;
        const f32x16 rescale = exp2_nonpositive(m_old - m_safe);
        f32x16 sum = 0.0f;
        if constexpr (kDot) {
          // P in bf16 pairs (j, j + 1) for P V; l sums the fp32 values (as FlashAttention-2
          // does: the lse stays fp32-accurate however few keys a row has).
          for (int j = 0; j < cols; j += 2) {
            const f32x16 p0 = exp2_nonpositive(load(st + j * BM + i) - m_safe);
            const f32x16 p1 =
                j + 1 < cols ? exp2_nonpositive(load(st + (j + 1) * BM + i) - m_safe) : 0.0f;
            // Written over S^T rows that this loop has already read.
            store_pairs(pp + (j / 2) * BM + i, pack_bf16_pairs(p0, p1));
            sum += p0 + p1;
          }
        } else {
          for (int j = 0; j < cols; ++j) {
            const f32x16 pj = exp2_nonpositive(load(st + j * BM + i) - m_safe);
            store(st + j * BM + i, pj);
            sum += pj;
          }
        }
        store(row_sum + i, load(row_sum + i) * rescale + sum);
        store(row_max + i, m_new);
        store(alpha + i, rescale);
      }

      // O^T = O^T * alpha + V^T P^T.
      // v_stride: an i64 (in place), or Int<D> (packed).
      auto accumulate = [&](const float* v_block, auto v_stride) __attribute__((always_inline)) {
        for (int g = 0; g < BM; g += kGroup)
          for_each_tile<DT>(D, [&](int c0, auto tile) {
            constexpr int CT = decltype(tile)::value;
            if constexpr (kDot)
              accumulate_tile<1, BM, BM, CT, QV>(vp, Int<D>(), pp, ot, key_pairs, c0, g, alpha);
            else
              accumulate_tile<1, BM, BM, CT, QV>(v_block, v_stride, st, ot, cols, c0, g, alpha);
          });
      };
      if (v_in_place)
        accumulate((const float*)v + n0 * p.v_seq_stride, p.v_seq_stride);
      else
        accumulate(vb, Int<D>());
    }

    // O = acc / l in the storage type; lse in natural log.
    Element* o = (Element*)p.o + b * p.o_batch_stride + h * p.o_head_stride;
    for (int i = 0; i < rows; ++i) {
      Element* o_row = o + (i64)(q0 + i) * p.o_seq_stride;
      const float l = row_sum[i];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      for (int c = 0; c < D; ++c) o_row[c] = from_float<T::kStorage>(ot[c * BM + i] * inv);
      if (p.lse) {
        const float lse =
            l > 0.0f ? (row_max[i] + __builtin_log2f(l)) * 0.6931471805599453f : __builtin_inff();
        p.lse[((i64)b * p.heads_q + h) * p.seqlen_q + q0 + i] = lse;
      }
    }
  }

  // Work items [begin, end) of batch x heads_q x ceil(seqlen_q / BM), m_block fastest; causal:
  // the last (heaviest) query block of a head first. The host hands out chunks of consecutive
  // items in order (4 per thread, runtime/cpu/cpu_backend.cpp): when a head's items span two
  // chunks, its heavy chunk then starts before its light one, and the light ones even out the
  // end (ascending, 2 threads at 4 heads x 64 blocks lost 12%).
  // Returns 0, or 1 when the scratch could not be allocated.
  static int run(const FlashjitAttentionParams& p, int begin, int end) {
    float* scratch =
        (float*)aligned_alloc(64, (unsigned long)((T::kScratchFloats * 4 + 63) & ~63LL));
    if (!scratch) return 1;
    const int m_blocks = (p.seqlen_q + BM - 1) / BM;
    for (int w = begin; w < end; ++w) {
      const int m_block = T::kCausal ? m_blocks - 1 - w % m_blocks : w % m_blocks;
      const int head = (w / m_blocks) % p.heads_q;
      const int batch = w / m_blocks / p.heads_q;
#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_VARLEN
      // Packed documents: batch entry `batch` is document `batch`, run on its view of the params
      // (templates/attention_variant.h); tiles past its queries have nothing to do.
      FlashjitAttentionParams document = p;
      if (!flashjit_variant::document_view(document, batch, m_block * BM, (int)sizeof(Element)))
        continue;
      block(document, batch, head, m_block, scratch);
      continue;
#endif
#endif
      block(p, batch, head, m_block, scratch);
    }
    free(scratch);
    return 0;
  }
};

}  // namespace flashjit_cpu
