// FlashAttention-2 backward for AMD CDNA (gfx90a MI200, gfx942 MI300) through the matrix cores
// (MFMA 16x16x16, bf16/fp16 in, fp32 accumulate). The renderer prepends attention_params.h,
// attention_common.h, hip/primitives.hpp, hip/tiles.hpp and hip/attention_bwd_common.hpp (the row
// kernels, backward_preprocess and backward_dq_convert, with their *_varlen entries) and appends
// the instantiation of the three entry points of generator/render.hpp's launch contract:
//
//   preprocess  backward_preprocess      D = rowsum(dO * O), lse_log2 = lse * log2(e) per query
//                                        row into the workspace (padding rows: 0, +inf); zeroes
//                                        the dQ accumulator (DqMode::Atomic)
//   dkdv        attention_backward_dkdv  dK, dV of one block of keys; Atomic: dQ += dS K into the
//                                        fp32 accumulator (without the softmax scale)
//   dq          backward_dq_convert      Atomic: dQ = scale * accumulator, in the storage type
//               attention_backward_dq    Separate: dQ of one block of query rows, recomputing P
//                                        and dP over its key blocks (no atomics: deterministic)
//
// The math (generator/problem.hpp): P = exp(scale S - LSE), dV = P^T dO, dP = dO V^T,
// dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q; P and dS are rounded to the storage type
// before their products. Plain C++ over the primitives, so that the host emulation
// (tests/templates/hip_backward_emulation_test.cpp) runs it against the fp64 reference.
//
// MFMA 16x16x16 layouts (primitives.hpp; l = lane, g = l / 16, r = l % 16, i = 0..3): lane l
// holds A[r][4g + i], B[4g + i][r] and gets D[4g + i][r]. So the operand of a lane is always 4
// consecutive elements along the reduction (k) axis; a result in D layout is, unchanged, the B
// operand of a product whose k axis is its row axis. Every product is oriented so that its
// operands are 8-byte reads of an LDS tile (hip/tiles.hpp) or registers, and the scores' D layout
// feeds the next products with no data movement:
//
//   dK/dV kernel (one wave owns 16 or 32 keys; Q, dO stream through LDS in rows and transposed)
//     S     = Q K^T     A: Q rows (LDS)     B: K rows (registers)   D: S[query 4g+i][key r]
//     dP    = dO V^T    A: dO rows (LDS)    B: V rows (registers)   D: dP, the same layout
//     dV^T += dO^T P    A: dO^T (LDS)       B: P (S's D layout)     D: dV^T[dim 4g+i][key r]
//     dK^T += Q^T dS    A: Q^T (LDS)        B: dS                   D: dK^T, the same layout
//     dQ    = dS K      A: dS rows (LDS)    B: K^T (registers)      D: dQ[query 4g+i][dim r]
//   dQ kernel (one wave owns 16 queries; K, V stream through LDS)
//     S^T   = K Q^T     A: K rows (LDS)     B: Q rows (registers)   D: S^T[key 4g+i][query r]
//     dP^T  = V dO^T    A: V rows (LDS)     B: dO rows (registers)  D: dP^T, the same layout
//     dQ^T += K^T dS^T  A: K^T (LDS)        B: dS^T (D layout)      D: dQ^T[dim 4g+i][query r]
//
// dS's D layout in the dK/dV kernel is that of dS, but dQ = dS K needs it as an A operand (dS
// rows): it goes through an LDS tile [block_m][block_n + 4] (2-byte writes, 8-byte reads), in
// which each wave then computes dQ for a share of the head dim over all keys of the block.

namespace flashjit_hip {

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WAVES, int STAGES, bool IS_BF16, bool CAUSAL,
          bool DQ_ATOMIC>
struct BwdTraits : TileShape<HEAD_DIM, BLOCK_M, BLOCK_N, WAVES, STAGES, IS_BF16, CAUSAL> {
  typedef TileShape<HEAD_DIM, BLOCK_M, BLOCK_N, WAVES, STAGES, IS_BF16, CAUSAL> Shape;
  static constexpr bool kDqAtomic = DQ_ATOMIC;

  // ---- the dK/dV kernel: kWaves waves share kBlockN keys; Q and dO stream in kBlockM rows
  static constexpr int kKeysPerWave = BLOCK_N / WAVES;
  static constexpr int kKTiles = kKeysPerWave / 16;  // 16-key tiles per wave
  static constexpr int kMTiles = BLOCK_M / 16;       // 16-query tiles per streamed block
  static constexpr int kNTiles = BLOCK_N / 16;       // 16-key tiles per block (dQ's k-steps)
  // dQ = dS K: wave w computes the dim tiles w, w + kWaves, ...
  static constexpr int kDqDimTilesPerWave = (Shape::kDTiles + WAVES - 1) / WAVES;
  typedef TileCopy<BLOCK_M, HEAD_DIM, Shape::kHeadDimPadded, Shape::kThreads> QCopy;  // Q, dO
  static constexpr int kQTileBytes = QCopy::kTileBytes;                 // [kBlockM][d], swizzled
  static constexpr int kQtTileBytes = QCopy::kTransposedTileBytes;      // [d][kBlockM + 4]
  static constexpr int kStageBytes = 2 * (kQTileBytes + kQtTileBytes);  // Q, Q^T, dO, dO^T
  static constexpr int kDsRowBytes = (BLOCK_N + 4) * 2;
  static constexpr int kDsTileBytes = kDqAtomic ? BLOCK_M * kDsRowBytes : 0;  // dS [m][n + 4]
  static constexpr int kLdsBytes = STAGES * kStageBytes + kDsTileBytes;       // hip_bwd_lds_bytes

  // ---- the dQ kernel (DqMode::Separate): kBlockM / 16 waves of 16 query rows; K and V stream
  // in kBlockN rows, K both in rows and transposed
  static constexpr int kDqWaves = BLOCK_M / 16;
  static constexpr int kDqThreads = kDqWaves * Shape::kWaveSize;
  typedef TileCopy<BLOCK_N, HEAD_DIM, Shape::kHeadDimPadded, kDqThreads> KCopy;  // K and V
  static constexpr int kDqStageBytes = 2 * KCopy::kTileBytes + KCopy::kTransposedTileBytes;
  static constexpr int kDqLdsBytes = kDqAtomic ? 0 : STAGES * kDqStageBytes;

  static_assert(WAVES >= 1 && WAVES <= 8, "1 to 8 waves");
  static_assert(BLOCK_N % (16 * WAVES) == 0, "each wave owns whole 16-key MFMA tiles");
  static_assert(kKTiles == 1 || kKTiles == 2, "16 or 32 keys per wave");
  static_assert(BLOCK_M == 16 || BLOCK_M == 32 || BLOCK_M == 64, "block_m: 16, 32 or 64");
  static_assert(BLOCK_N == 32 || BLOCK_N == 64 || BLOCK_N == 128, "block_n: 32, 64 or 128");
  static_assert(QCopy::kCopies <= 8, "at most 8 Q/dO copies per thread per tile");
  static_assert(kDqAtomic || KCopy::kCopies <= 16, "at most 16 K/V copies per thread per tile");
  static_assert(kLdsBytes <= 65536 && kDqLdsBytes <= 65536, "LDS: 64 KiB per workgroup on CDNA");
};

#ifdef FLASHJIT_VARIANT
// ---- attention variants (templates/attention_variant.h, rendered before this file) ----------

// P of one score s = q . k of a variant, as the CUDA mma backward recomputes it: the score
// modified as the forward modifies it (score_and_grad, from the scaled score), hidden where the
// block is not all visible (visible()), exp2(score * scale_log2 - lse_log2) with the variant
// entry's scale_log2; *ds = P (dP - D) times d score / d s (the soft-cap's 1 - tanh^2, the user's
// score_mod_grad) where the variant modifies the scores.
FLASHJIT_DEVICE float variant_probability(const FlashjitAttentionParams& p, int diagonal,
                                          bool all_visible, float s, float lse_log2,
                                          float dp_minus_delta, float slope, int batch, int head,
                                          int row, int key, float* ds) {
  float g = 1.f;
  if (fv::kModifiesScores)
    s = fv::score_and_grad(s * p.scale, slope, batch, head, row, key, static_cast<float>(key - row),
                           &g);
  if (!all_visible && !fv::visible(p, diagonal, batch, head, row, key)) {
    s = -flashjit_attention::infinity();
    g = 0.f;
  }
  const float pr = flashjit_attention::recomputed_probability(s, p.scale_log2, lse_log2,
                                                              [](float x) { return fast_exp2(x); });
  *ds = fv::kModifiesScores ? pr * dp_minus_delta * g : pr * dp_minus_delta;
  return pr;
}

#endif
// ---- the dK/dV kernel ---------------------------------------------------------------------------

// One wave's part of the dK/dV kernel: workgroup (x: key block, y: kv head, z: batch).
//
//   K_j, V_j (this wave's keys) -> registers, once; dK_j = dV_j = 0
//   for each query head h of the group, each query block i seen by a key of block j:
//     Q_i, dO_i -> LDS in rows and transposed (kStages buffers; block i + 1 loaded into registers
//                  meanwhile, as the forward does with K/V)
//     for each 16-row tile of the block:
//       S = Q K^T, mask, P = exp2(S scale_log2 - lse_log2)     (recomputed_probability)
//       dP = dO V^T, dS = P (dP - D)
//       dV^T += dO^T P, dK^T += Q^T dS                          (P, dS rounded to 16 bits)
//       Atomic: dS -> LDS tile
//     Atomic: dQ_i += dS K_j (all keys of the block; waves split the head dim), fp32 atomics
//   dK = scale dK_j, dV = dV_j (summed over the group's query heads)
// A variant (entered through its entry below): the query blocks whose rows may see a key of this
// block (query_rows); variant_probability gives P and dS.
template <class K>
FLASHJIT_DEVICE void attention_backward_dkdv(const FlashjitAttentionParams& p) {
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kKTiles = K::kKTiles, kDTiles = K::kDTiles, kNTiles = K::kNTiles;
  typedef typename K::QCopy QCopy;
  typedef typename QCopy::RowSwizzle QSwizzle;
  constexpr int kQtRowBytes = QCopy::kTransposedRowBytes;

  // kStages x {Q [m][d], Q^T [d][m + 4], dO [m][d], dO^T [d][m + 4]}, then (Atomic) dS [m][n + 4]
  unsigned char* const lds = lds_base();
  unsigned char* const ds_tile = lds + kStages * K::kStageBytes;

  const int tid = thread_index(), lane = lane_index(), wave = tid / K::kWaveSize;
  const int lane_row = lane % 16, lane_group = lane / 16;  // r, g
  const int kv_head = block_index_y(), batch = block_index_z();
  const int n0 = block_index_x() * kBlockN;
  const int wave_key0 = wave * K::kKeysPerWave;  // first key of this wave within the block

  const u16* k = static_cast<const u16*>(p.k) + batch * p.k_batch_stride +
                 kv_head * p.k_head_stride + n0 * p.k_seq_stride;
  const u16* v = static_cast<const u16*>(p.v) + batch * p.v_batch_stride +
                 kv_head * p.v_head_stride + n0 * p.v_seq_stride;
  const int keys = p.seqlen_k - n0;  // keys of this block that exist (rows past it are zero)

  // This wave's keys as B operands of S = Q K^T and dP = dO V^T:
  // k_frag[kt][kk] = K[key wave_key0 + kt*16 + r][dims kk*16 + 4g .. + 3], v_frag likewise.
  Frag k_frag[kKTiles][kDTiles], v_frag[kKTiles][kDTiles];
#pragma unroll
  for (int kt = 0; kt < kKTiles; ++kt) {
    const int key = wave_key0 + kt * 16 + lane_row;
    load_row_operands<K>(k_frag[kt], k + key * p.k_seq_stride, key < keys, lane_group);
    load_row_operands<K>(v_frag[kt], v + key * p.v_seq_stride, key < keys, lane_group);
  }
  // Atomic: K as the B operand of dQ = dS K for this wave's dim tiles dt = wave + t * kWaves:
  // kt_frag[nt][t] = K[keys nt*16 + 4g .. + 3][dim dt*16 + r] (zero past seqlen_k, the head dim).
  constexpr int kDqNTiles = K::kDqAtomic ? kNTiles : 1;
  constexpr int kDqDimTiles = K::kDqAtomic ? K::kDqDimTilesPerWave : 1;
  Frag kt_frag[kDqNTiles][kDqDimTiles];
  if (K::kDqAtomic) {
#pragma unroll
    for (int nt = 0; nt < kDqNTiles; ++nt)
#pragma unroll
      for (int t = 0; t < kDqDimTiles; ++t) {
        const int dim = (wave + t * K::kWaves) * 16 + lane_row;
        u16 e[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = nt * 16 + 4 * lane_group + i;
          if (key < keys && dim < K::kHeadDim) e[i] = k[key * p.k_seq_stride + dim];
        }
        kt_frag[nt][t] =
            Frag{e[0] | (static_cast<u32>(e[1]) << 16), e[2] | (static_cast<u32>(e[3]) << 16)};
      }
  }

  // dV^T and dK^T of this wave's keys: acc[kt][dt][i] = dV[key wave_key0 + kt*16 + r]
  // [dim dt*16 + 4g + i] (dK likewise, without the scale until the end).
  f32x4 dv_acc[kKTiles][kDTiles], dk_acc[kKTiles][kDTiles];
#pragma unroll
  for (int kt = 0; kt < kKTiles; ++kt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      dv_acc[kt][dt] = f32x4{0.f, 0.f, 0.f, 0.f};
      dk_acc[kt][dt] = f32x4{0.f, 0.f, 0.f, 0.f};
    }

  // The steps: every query head of the group x the query blocks that see a key of this block.
  const int diagonal = fa::diagonal(p);  // causal: row i sees keys j <= i + diagonal
#ifdef FLASHJIT_VARIANT
  const fv::QueryRows query_rows = fv::query_rows(p, diagonal, n0, kBlockN);
  const int m_first = query_rows.first / kBlockM;
  const int m_last =
      query_rows.first < query_rows.last ? (query_rows.last + kBlockM - 1) / kBlockM : m_first;
#else
  const int m_first = fa::first_query_block<K::kCausal>(diagonal, n0, kBlockM);
  const int m_last = (p.seqlen_q + kBlockM - 1) / kBlockM;
#endif
  const int m_blocks = m_last > m_first ? m_last - m_first : 0;
  const int steps = p.group_size * m_blocks;
  auto step_head = [&](int step) { return kv_head * p.group_size + step / m_blocks; };
  auto step_m0 = [&](int step) { return (m_first + step % m_blocks) * kBlockM; };

  Vec16 q_next[QCopy::kCopies], do_next[QCopy::kCopies];
  auto load_step = [&](int step) {
    const int head = step_head(step), m0 = step_m0(step);
    QCopy::load(q_next,
                static_cast<const u16*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride,
                p.q_seq_stride, m0, p.seqlen_q, tid);
    QCopy::load(
        do_next,
        static_cast<const u16*>(p.d_o) + batch * p.do_batch_stride + head * p.do_head_stride,
        p.do_seq_stride, m0, p.seqlen_q, tid);
  };
  auto store_step = [&](unsigned char* stage) {
    QCopy::store_rows(stage, q_next, tid);
    QCopy::store_transposed(stage + K::kQTileBytes, q_next, tid);
    QCopy::store_rows(stage + K::kQTileBytes + K::kQtTileBytes, do_next, tid);
    QCopy::store_transposed(stage + 2 * K::kQTileBytes + K::kQtTileBytes, do_next, tid);
  };

  // Operand reads: this lane's row r, elements 4g.. of a row-major tile (QSwizzle::advance per
  // MFMA), of a transposed tile (row dim dt*16 + r, queries mt*16 + 4g) and of the dS tile.
  const int q_lane = QSwizzle::offset(lane_row, lane_group * 8);

  if (steps > 0) {
    load_step(0);
    store_step(lds);
  }
  barrier();

  for (int step = 0; step < steps; ++step) {
    const int stage = kStages == 2 ? (step & 1) : 0;
    const unsigned char* q_tile = lds + stage * K::kStageBytes;
    const unsigned char* qt_tile = q_tile + K::kQTileBytes;
    const unsigned char* do_tile = qt_tile + K::kQtTileBytes;
    const unsigned char* dot_tile = do_tile + K::kQTileBytes;
    const bool more = step + 1 < steps;
    if (more) load_step(step + 1);  // travels from global memory while this block is computed

    const int head = step_head(step), m0 = step_m0(step);
    const long long row_base =
        (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0;
#ifdef FLASHJIT_VARIANT
    const bool all_visible = fv::block_fully_visible(p, diagonal, m0, kBlockM, n0, kBlockN);
    const float slope = fv::alibi_slope(p, head);
#else
    const bool masked = fa::block_needs_mask<K::kCausal>(p, diagonal, m0, n0, kBlockN);
#endif
    const int m_tiles =
        (p.seqlen_q - m0 + 15) / 16 < K::kMTiles ? (p.seqlen_q - m0 + 15) / 16 : K::kMTiles;
    for (int mt = 0; mt < m_tiles; ++mt) {
      // lse_log2 and D of rows m0 + mt*16 + 4g + i: the rows of this lane's scores.
      const Float4 lse4 =
          *reinterpret_cast<const Float4*>(p.lse_log2 + row_base + mt * 16 + 4 * lane_group);
      const Float4 delta4 =
          *reinterpret_cast<const Float4*>(p.delta + row_base + mt * 16 + 4 * lane_group);
      const float lse_row[4] = {lse4.x, lse4.y, lse4.z, lse4.w};
      const float delta_row[4] = {delta4.x, delta4.y, delta4.z, delta4.w};

      // S = Q K^T, dP = dO V^T: s[kt][0][i] = S[query m0 + mt*16 + 4g + i][key wave_key0 + kt*16 +
      // r]: the forward's score_tiles (hip/tiles.hpp) with the 16 streamed rows as A and this
      // wave's keys as B (one product after the other: hipRTC then keeps fewer operands read
      // ahead).
      f32x4 s[kKTiles][1], dp[kKTiles][1];
      score_tiles<K, QSwizzle>(s, q_tile, q_lane, mt * 16, k_frag);
      score_tiles<K, QSwizzle>(dp, do_tile, q_lane, mt * 16, v_frag);

#ifndef FLASHJIT_VARIANT
      // Mask keys past seqlen_k and, when causal, past each row's diagonal.
      if (masked) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = m0 + mt * 16 + 4 * lane_group + i;
          const int limit =
              fa::last_key<K::kCausal>(p, diagonal, row) - (n0 + wave_key0 + lane_row);
#pragma unroll
          for (int kt = 0; kt < kKTiles; ++kt)
            if (kt * 16 > limit) s[kt][0][i] = -fa::infinity();
        }
      }
#endif

      // P and dS (a variant's: of its scores, variant_probability), rounded to 16 bits as they
      // are made: in D layout they are the B operands of dV^T += dO^T P and dK^T += Q^T dS (k =
      // the tile's 16 queries).
      Frag p_frag[kKTiles], ds_frag[kKTiles];
#pragma unroll
      for (int kt = 0; kt < kKTiles; ++kt) {
        float pr[4], ds[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#ifdef FLASHJIT_VARIANT
          pr[i] = variant_probability(p, diagonal, all_visible, s[kt][0][i], lse_row[i],
                                      dp[kt][0][i] - delta_row[i], slope, batch, head,
                                      m0 + mt * 16 + 4 * lane_group + i,
                                      n0 + wave_key0 + kt * 16 + lane_row, &ds[i]);
#else
          pr[i] = fa::recomputed_probability(s[kt][0][i], p.scale_log2, lse_row[i],
                                             [](float x) { return fast_exp2(x); });
          ds[i] = pr[i] * (dp[kt][0][i] - delta_row[i]);
#endif
        }
        p_frag[kt] = pack4<K::kIsBf16>(pr[0], pr[1], pr[2], pr[3]);
        ds_frag[kt] = pack4<K::kIsBf16>(ds[0], ds[1], ds[2], ds[3]);
      }

      // dV^T += dO^T P, dK^T += Q^T dS: A = dO^T / Q^T [dims dt*16 + r][queries mt*16 + 4g ..].
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const Frag dot_a =
            read_frag<kQtRowBytes>(dot_tile, dt * 16 + lane_row, mt * 16 + 4 * lane_group);
        const Frag qt_a =
            read_frag<kQtRowBytes>(qt_tile, dt * 16 + lane_row, mt * 16 + 4 * lane_group);
#pragma unroll
        for (int kt = 0; kt < kKTiles; ++kt) {
          dv_acc[kt][dt] = mfma_16x16x16<K::kIsBf16>(dot_a.lo, dot_a.hi, p_frag[kt].lo,
                                                     p_frag[kt].hi, dv_acc[kt][dt]);
          dk_acc[kt][dt] = mfma_16x16x16<K::kIsBf16>(qt_a.lo, qt_a.hi, ds_frag[kt].lo,
                                                     ds_frag[kt].hi, dk_acc[kt][dt]);
        }
      }

      // Atomic: dS into its LDS tile, dS[query mt*16 + 4g + i][key wave_key0 + kt*16 + r].
      if (K::kDqAtomic) {
#pragma unroll
        for (int kt = 0; kt < kKTiles; ++kt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            *reinterpret_cast<u16*>(ds_tile + (mt * 16 + 4 * lane_group + i) * K::kDsRowBytes +
                                    (wave_key0 + kt * 16 + lane_row) * 2) =
                frag_element(ds_frag[kt], i);
          }
      }
    }

    if (K::kDqAtomic) {
      // Every wave's dS is in the tile (and every read of this stage's Q and dO is done).
      barrier();
      // dQ_i += dS K_j: acc[i] = dQ[query mt*16 + 4g + i][dim dt*16 + r] over the block's keys,
      // added to the fp32 accumulator (rows padded to seqlen_q_rounded, dims to the padded head
      // dim: no bounds to check).
      float* accum = p.dq_accum + row_base * K::kHeadDimPadded;
      for (int mt = 0; mt < m_tiles; ++mt) {
#pragma unroll
        for (int t = 0; t < kDqDimTiles; ++t) {
          const int dt = wave + t * K::kWaves;
          if (dt >= kDTiles) break;  // the same for the whole wave
          f32x4 acc = f32x4{0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int nt = 0; nt < kDqNTiles; ++nt) {
            const Frag ds_a =
                read_frag<K::kDsRowBytes>(ds_tile, mt * 16 + lane_row, nt * 16 + 4 * lane_group);
            acc = mfma_16x16x16<K::kIsBf16>(ds_a.lo, ds_a.hi, kt_frag[nt][t].lo, kt_frag[nt][t].hi,
                                            acc);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            atomic_add(
                accum + (mt * 16 + 4 * lane_group + i) * K::kHeadDimPadded + dt * 16 + lane_row,
                acc[i]);
          }
        }
      }
    } else if (kStages == 1) {
      barrier();  // everyone is done reading the buffer block i + 1 goes into
    }
    // Block i + 1 into LDS: with two buffers into the one block i - 1 used (everyone passed the
    // barrier after reading it). The dS tile is next written after the barrier below.
    if (more) store_step(lds + (kStages == 2 ? (stage ^ 1) : 0) * K::kStageBytes);
    barrier();
  }

  // Epilogue: dK = scale * dK^T^T and dV from the accumulators, 4 consecutive dims of one key
  // per lane (8-byte stores).
  u16* dk = static_cast<u16*>(p.dk) + batch * p.dk_batch_stride + kv_head * p.dk_head_stride +
            n0 * p.dk_seq_stride;
  u16* dv = static_cast<u16*>(p.dv) + batch * p.dv_batch_stride + kv_head * p.dv_head_stride +
            n0 * p.dv_seq_stride;
#pragma unroll
  for (int kt = 0; kt < kKTiles; ++kt) {
    const int key = wave_key0 + kt * 16 + lane_row;
    if (key >= keys) continue;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      const int col = dt * 16 + 4 * lane_group;
      if (col >= K::kHeadDim) continue;
      const f32x4 a = dk_acc[kt][dt] * p.scale;
      *reinterpret_cast<Frag*>(dk + key * p.dk_seq_stride + col) =
          pack4<K::kIsBf16>(a[0], a[1], a[2], a[3]);
      const f32x4 b = dv_acc[kt][dt];
      *reinterpret_cast<Frag*>(dv + key * p.dv_seq_stride + col) =
          pack4<K::kIsBf16>(b[0], b[1], b[2], b[3]);
    }
  }
}

// ---- the dQ kernel (DqMode::Separate) -----------------------------------------------------------

// dQ of kBlockM query rows of one (batch, head): workgroup (x: query block, y: head, z: batch),
// kDqWaves waves of 16 rows each. The forward's loop with two score products and dQ in place of
// O, and no online softmax (P comes from the forward's LSE):
//
//   Q, dO (this wave's rows) -> registers; lse_log2, D of this lane's row; dQ^T = 0
//   for each key block j the rows see:        K_j (rows and transposed), V_j in LDS
//     S^T = K_j Q^T, mask, P^T = exp2(S^T scale_log2 - lse_log2)
//     dP^T = V_j dO^T, dS^T = P^T (dP^T - D)  (rounded to 16 bits)
//     dQ^T += K_j^T dS^T
//   dQ = scale * dQ^T^T
// A variant (entered through its entry below): the key blocks of its range (hidden blocks are
// never loaded); variant_probability gives P and dS.
template <class K>
FLASHJIT_DEVICE void attention_backward_dq(const FlashjitAttentionParams& p) {
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kNTiles = K::kNTiles, kDTiles = K::kDTiles;
  typedef typename K::KCopy KCopy;
  typedef typename KCopy::RowSwizzle KSwizzle;
  constexpr int kKtRowBytes = KCopy::kTransposedRowBytes;

  unsigned char* const lds = lds_base();  // kStages x {K [n][d], V [n][d], K^T [d][n + 4]}

  const int tid = thread_index(), lane = lane_index(), wave = tid / K::kWaveSize;
  const int lane_row = lane % 16, lane_group = lane / 16;
  // Causal rows near the end see the most keys: launch them first so the tail is short.
  const int m_block = query_block<K>();
  const int head = block_index_y(), batch = block_index_z();
  const int kv_head = head / p.group_size;
  const int m0 = m_block * kBlockM;
  const int row = m0 + wave * 16 + lane_row;  // the query of this lane's results

  const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const u16* d_o =
      static_cast<const u16*>(p.d_o) + batch * p.do_batch_stride + head * p.do_head_stride;
  const u16* k =
      static_cast<const u16*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
  const u16* v =
      static_cast<const u16*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
  const long long row_base =
      (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q_rounded;
  // The workspace's rows are padded to seqlen_q_rounded: +inf and 0 past seqlen_q.
  const float lse_log2 = p.lse_log2[row_base + row];
  const float delta = p.delta[row_base + row];

  // This lane's query as the B operand of S^T = K Q^T and dP^T = V dO^T.
  Frag q_frag[kDTiles], do_frag[kDTiles];
  load_row_operands<K>(q_frag, q + row * p.q_seq_stride, row < p.seqlen_q, lane_group);
  load_row_operands<K>(do_frag, d_o + row * p.do_seq_stride, row < p.seqlen_q, lane_group);

  f32x4 dq_acc[kDTiles];  // dQ^T: dq_acc[dt][i] = dQ[query row][dim dt*16 + 4g + i]
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) dq_acc[dt] = f32x4{0.f, 0.f, 0.f, 0.f};

  const int diagonal = fa::diagonal(p);
  // The t-th key block visited is key_blocks.at(t) (a variant's: of its range), as the forward's.
  const fa::KeyBlockRange<K::kCausal> key_blocks(p, diagonal, m0, kBlockM, kBlockN);
  const int n_blocks = key_blocks.count();
#ifdef FLASHJIT_VARIANT
  const float slope = fv::alibi_slope(p, head);
#endif
  Vec16 k_next[KCopy::kCopies], v_next[KCopy::kCopies];
  auto store_block = [&](unsigned char* stage) {
    KCopy::store_rows(stage, k_next, tid);
    KCopy::store_rows(stage + KCopy::kTileBytes, v_next, tid);
    KCopy::store_transposed(stage + 2 * KCopy::kTileBytes, k_next, tid);
  };
  const int k_lane = KSwizzle::offset(lane_row, lane_group * 8);

  if (n_blocks > 0) {
    const int first = key_blocks.at(0) * kBlockN;
    KCopy::load(k_next, k, p.k_seq_stride, first, p.seqlen_k, tid);
    KCopy::load(v_next, v, p.v_seq_stride, first, p.seqlen_k, tid);
    store_block(lds);
  }
  barrier();

  for (int j = 0; j < n_blocks; ++j) {
    const int stage = kStages == 2 ? (j & 1) : 0;
    const unsigned char* k_tile = lds + stage * K::kDqStageBytes;
    const unsigned char* v_tile = k_tile + KCopy::kTileBytes;
    const unsigned char* kt_tile = v_tile + KCopy::kTileBytes;
    const int n0 = key_blocks.at(j) * kBlockN;
    const bool more = j + 1 < n_blocks;
    if (more) {
      const int next = key_blocks.at(j + 1) * kBlockN;
      KCopy::load(k_next, k, p.k_seq_stride, next, p.seqlen_k, tid);
      KCopy::load(v_next, v, p.v_seq_stride, next, p.seqlen_k, tid);
    }

    // S^T = K Q^T, dP^T = V dO^T: s[nt][i] = S[query row][key n0 + nt*16 + 4g + i]. (The two
    // products interleaved: one after the other through score_tiles, as the dK/dV kernel's, the
    // d 256 m16n32w2s1-det dQ kernel spilled 28 VGPRs.)
    f32x4 s[kNTiles], dp[kNTiles];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      s[nt] = f32x4{0.f, 0.f, 0.f, 0.f};
      dp[nt] = f32x4{0.f, 0.f, 0.f, 0.f};
    }
#pragma unroll
    for (int kk = 0; kk < kDTiles; ++kk) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int offset = KSwizzle::advance(k_lane, nt * 16, 2 * kk);
        const Frag k_a = *reinterpret_cast<const Frag*>(k_tile + offset);
        const Frag v_a = *reinterpret_cast<const Frag*>(v_tile + offset);
        s[nt] = mfma_16x16x16<K::kIsBf16>(k_a.lo, k_a.hi, q_frag[kk].lo, q_frag[kk].hi, s[nt]);
        dp[nt] = mfma_16x16x16<K::kIsBf16>(v_a.lo, v_a.hi, do_frag[kk].lo, do_frag[kk].hi, dp[nt]);
      }
    }

#ifdef FLASHJIT_VARIANT
    const bool all_visible = fv::block_fully_visible(p, diagonal, m0, kBlockM, n0, kBlockN);
#else
    // Mask keys past seqlen_k and, when causal, past the row's diagonal.
    if (fa::block_needs_mask<K::kCausal>(p, diagonal, m0, n0, kBlockN)) {
      const int limit = fa::last_key<K::kCausal>(p, diagonal, row) - (n0 + 4 * lane_group);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (nt * 16 + i > limit) s[nt][i] = -fa::infinity();
    }
#endif

    // P^T and dS^T (a variant's: of its scores, variant_probability); dS^T rounded to 16 bits is,
    // in D layout, the B operand of dQ^T += K^T dS^T.
    Frag ds_frag[kNTiles];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      float ds[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#ifdef FLASHJIT_VARIANT
        variant_probability(p, diagonal, all_visible, s[nt][i], lse_log2, dp[nt][i] - delta, slope,
                            batch, head, row, n0 + nt * 16 + 4 * lane_group + i, &ds[i]);
#else
        const float pr = fa::recomputed_probability(s[nt][i], p.scale_log2, lse_log2,
                                                    [](float x) { return fast_exp2(x); });
        ds[i] = pr * (dp[nt][i] - delta);
#endif
      }
      ds_frag[nt] = pack4<K::kIsBf16>(ds[0], ds[1], ds[2], ds[3]);
    }

    // dQ^T += K^T dS^T: A = K^T[dims dt*16 + r][keys nt*16 + 4g ..].
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const Frag kt_a =
            read_frag<kKtRowBytes>(kt_tile, dt * 16 + lane_row, nt * 16 + 4 * lane_group);
        dq_acc[dt] =
            mfma_16x16x16<K::kIsBf16>(kt_a.lo, kt_a.hi, ds_frag[nt].lo, ds_frag[nt].hi, dq_acc[dt]);
      }
    }

    if (kStages == 1) barrier();
    if (more) store_block(lds + (kStages == 2 ? (stage ^ 1) : 0) * K::kDqStageBytes);
    barrier();
  }

  // Epilogue: dQ = scale * dQ^T^T, 4 consecutive dims of this lane's row (8-byte stores).
  if (row < p.seqlen_q) {
    u16* dq = static_cast<u16*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride +
              row * p.dq_seq_stride;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      const int col = dt * 16 + 4 * lane_group;
      if (col >= K::kHeadDim) continue;
      const f32x4 a = dq_acc[dt] * p.scale;
      *reinterpret_cast<Frag*>(dq + col) = pack4<K::kIsBf16>(a[0], a[1], a[2], a[3]);
    }
  }
}
#ifdef FLASHJIT_VARIANT

// The variant entries of the dK/dV and dQ kernels: the kernels on params whose scale_log2 is the
// variant's softmax factor (softmax_scale_log2: log2(e) alone when score() takes scaled scores),
// as attention_forward_variant. Packed documents (varlen), as the CUDA backward's *_varlen
// entries: each workgroup runs on its document's view (document_tile_view; the workspace packed
// by document, runtime/launch_params.hpp), a dK/dV one for a document without queries too
// (dK = dV = 0) but not past its keys, a dQ or row one (the *_varlen row entries of
// hip/attention_bwd_common.hpp) not past its query rows.
template <class K>
FLASHJIT_DEVICE void attention_backward_dkdv_variant(const FlashjitAttentionParams& params) {
  FlashjitAttentionParams p = variant_params(params);
#if FLASHJIT_VARIANT_VARLEN
  if (!flashjit_variant::document_tile_view(p, block_index_z(), -1, block_index_x() * K::kBlockN, 2,
                                            K::kHeadDimPadded))
    return;
#endif
  attention_backward_dkdv<K>(p);
}

template <class K>
FLASHJIT_DEVICE void attention_backward_dq_variant(const FlashjitAttentionParams& params) {
  FlashjitAttentionParams p = variant_params(params);
#if FLASHJIT_VARIANT_VARLEN
  const int m_block = query_block<K>();
  if (!flashjit_variant::document_tile_view(p, block_index_z(), m_block * K::kBlockM, -1, 2,
                                            K::kHeadDimPadded))
    return;
#endif
  attention_backward_dq<K>(p);
}
#endif

}  // namespace flashjit_hip
