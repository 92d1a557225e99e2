// FlashAttention-2 forward for AMD CDNA (gfx90a MI200, gfx942 MI300) through the matrix cores
// (MFMA 16x16x16, bf16/fp16 in, fp32 accumulate). The renderer prepends attention_params.h,
// attention_common.h, hip/primitives.hpp (every AMD-specific operation: MFMA, lane shuffles,
// LDS, barriers, exp2) and hip/tiles.hpp (tile copies and LDS layouts), and appends one
// instantiation. This file is plain C++ over those names, so that
// tests/templates/hip_emulation_test.cpp can run it on the host against the fp64 reference.
//
// One workgroup of kWaves wavefronts (64 lanes) computes O for kBlockM query rows of one
// (batch, head); each wave owns kRowsPerWave = 16 * kMTiles rows end to end. The same online
// softmax as the CUDA template, computed transposed so that the MFMA result of one step is the
// operand of the next without any data movement:
//
//   Q -> registers, as MFMA B operands           once; Q never goes through LDS
//   m = -inf, l = 0, acc = 0                     per query row, fp32
//   for each K/V block j (kBlockN keys):         K_j and V_j^T in LDS (kStages buffers); block
//                                                j + 1 is loaded into registers meanwhile
//     S^T = K_j Q^T                              [kBlockN, kRowsPerWave] per wave: A = K rows
//     mask(S^T)                                  only blocks crossing seqlen_k or the diagonal
//     m'  = max(m, colmax(S^T))                  a query's scores are one column: 4 values per
//     P^T = exp2(S^T * scale_log2 - m' * ...)    lane, 4 lane groups -> 2 shuffles per max
//     l   = l * exp2((m - m') * scale_log2) + colsum(P^T)
//     O^T = O^T * exp2(...) + V_j^T P^T          P^T's D layout *is* the B operand layout
//   O = (O^T / l)^T, LSE = (m * scale_log2 + log2 l) * ln 2
//
// MFMA 16x16x16 layouts (primitives.hpp; l = lane, g = l / 16, r = l % 16, i = 0..3):
//   A[r][4g + i], B[4g + i][r], D[4g + i][r] in element / value i of lane l. Hence:
//   S^T = K Q^T: lane l reads K[key r][dims 4g..4g+3] (A) and holds Q[query r][dims 4g..4g+3]
//                (B), and gets S^T[keys 4g..4g+3][query r] (D): one query per lane.
//   O^T += V^T P^T: lane l reads V^T[dim r][keys 4g..4g+3] (A, from the transposed V tile) and
//                passes S^T's D values, packed to 16 bits, as B[keys 4g..4g+3][query r].
// LDS bank conflicts: the 8-byte operand reads of 16 rows must spread over all 32 banks. The K
// tile does it with an XOR swizzle of its 16-byte chunks (no padding); the V^T tile with 8 bytes
// of padding per row, which keeps its transposed 2-byte writes at compile-time offsets from one
// address per copy (a swizzle would need an address register per element).

namespace flashjit_hip {

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WAVES, int STAGES, bool IS_BF16, bool CAUSAL>
struct Traits : TileShape<HEAD_DIM, BLOCK_M, BLOCK_N, WAVES, STAGES, IS_BF16, CAUSAL> {
  typedef TileShape<HEAD_DIM, BLOCK_M, BLOCK_N, WAVES, STAGES, IS_BF16, CAUSAL> Shape;
  static constexpr int kRowsPerWave = BLOCK_M / WAVES;
  static constexpr int kMTiles = kRowsPerWave / 16;  // 16-query tiles per wave
  static constexpr int kNTiles = BLOCK_N / 16;       // 16-key tiles of S^T (P V k-steps)
  // K and V stream through LDS: K in rows, V transposed (hip/tiles.hpp).
  typedef TileCopy<BLOCK_N, HEAD_DIM, Shape::kHeadDimPadded, Shape::kThreads> KVCopy;
  static constexpr int kChunksPerRow = KVCopy::kChunksPerRow;     // 16-byte chunks of a K/V row
  static constexpr int kCopies = KVCopy::kCopies;                 // K (and V) chunks per thread
  static constexpr int kKRowBytes = KVCopy::kRowBytes;            // K tile: [kBlockN][d], swizzled
  static constexpr int kVRowBytes = KVCopy::kTransposedRowBytes;  // V^T tile: [d][kBlockN + 4]
  static constexpr int kKTileBytes = KVCopy::kTileBytes;
  static constexpr int kVTileBytes = KVCopy::kTransposedTileBytes;
  static constexpr int kStageBytes = kKTileBytes + kVTileBytes;
  static constexpr int kLdsBytes = STAGES * kStageBytes;  // generator: hip_lds_bytes

  static_assert(WAVES >= 1 && WAVES <= 8, "1 to 8 waves");
  static_assert(BLOCK_M % (16 * WAVES) == 0, "each wave owns whole 16-row MFMA tiles");
  static_assert(kMTiles == 1 || kMTiles == 2, "16 or 32 query rows per wave");
  static_assert(BLOCK_N == 32 || BLOCK_N == 64 || BLOCK_N == 128, "block_n: 32, 64 or 128");
  static_assert((BLOCK_N * kChunksPerRow) % Shape::kThreads == 0, "K/V tile copies split evenly");
  static_assert(kCopies >= 1 && kCopies <= 16, "at most 16 copies per thread per tile");
  static_assert(kLdsBytes <= 65536, "LDS: 64 KiB per workgroup on CDNA");
};

// ---- K/V: global -> registers -> LDS ----------------------------------------------------------

// Loads keys [n0, n0 + kBlockN) of K and V into registers (rows at or past seqlen_k and columns
// past the head dim as zero, so padded scores are 0 before masking and P x V never touches
// garbage).
template <class K>
FLASHJIT_DEVICE void load_kv(Vec16 (&k_regs)[K::kCopies], Vec16 (&v_regs)[K::kCopies], const u16* k,
                             const u16* v, long long k_stride, long long v_stride, int n0,
                             int seqlen_k, int tid) {
  K::KVCopy::load(k_regs, k, k_stride, n0, seqlen_k, tid);
  K::KVCopy::load(v_regs, v, v_stride, n0, seqlen_k, tid);
}

// ---- the kernel -------------------------------------------------------------------------------

// An attention variant (templates/attention_variant.h, rendered before this file; entered through
// the variant entry below, which sets p.scale_log2 to the variant's softmax factor) changes three
// things: the K/V blocks visited come from its key-block range (hidden blocks are never loaded),
// its mask replaces the causal one, and when it modifies the scores every score passes through it
// as scale * q . k.
template <class K>
FLASHJIT_DEVICE void attention_forward(const FlashjitAttentionParams& p) {
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kMTiles = K::kMTiles, kNTiles = K::kNTiles, kDTiles = K::kDTiles;
  typedef Swizzle<K::kKRowBytes> KSwizzle;

  unsigned char* const lds = lds_base();  // kStages x {K [kBlockN][d], V^T [d][kBlockN + 4]}

  // r: the operand row / result column of this lane; g: which 4 of the 16 k (or result rows) it
  // holds.
  const int tid = thread_index(), lane = lane_index(), wave = tid / K::kWaveSize;
  const int lane_row = lane % 16, lane_group = lane / 16;
  const int m_block = query_block<K>();
  const int head = block_index_y();
  const int batch = block_index_z();
  const int kv_head = head / p.group_size;
  const int m0 = m_block * kBlockM;
  const int wave_row0 = wave * K::kRowsPerWave;  // first row of this wave within the block

  FLASHJIT_FORWARD_TENSORS(p, batch, head, kv_head, m0);  // q, k, v, o, lse

  const int diagonal = fa::diagonal(p);  // causal: row i sees keys j <= i + diagonal
  // The t-th key block visited is key_blocks.at(t) (a variant's: of its range).
  const fa::KeyBlockRange<K::kCausal> key_blocks(p, diagonal, m0, kBlockM, kBlockN);
  const int n_blocks = key_blocks.count();
#ifdef FLASHJIT_VARIANT
  const float slope = fv::alibi_slope(p, head);
#endif

  // Q as B operands of S^T = K Q^T: q_frag[mt][kk] = Q[query mt*16 + r][dims kk*16 + 4g .. + 3].
  // Rows past seqlen_q and dims past the head dim are zero (their results are never stored).
  Frag q_frag[kMTiles][kDTiles];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    const int row = wave_row0 + mt * 16 + lane_row;
    load_row_operands<K>(q_frag[mt], q + row * p.q_seq_stride, m0 + row < p.seqlen_q, lane_group);
  }

  // Operand reads: byte offsets of this lane's (row r, dims/keys 4g) in a K or V^T tile. The
  // per-MFMA parts are compile-time constants: KSwizzle::advance (chunk 2 * step; lane_group / 2
  // is chunk bit 0), or plain offsets in the padded V^T tile.
  const int k_lane = KSwizzle::offset(lane_row, lane_group * 8);
  const int v_lane = lane_row * K::kVRowBytes + lane_group * 8;

  f32x4 acc[kMTiles][kDTiles];  // O^T: acc[mt][dt][i] = O[query mt*16 + r][dim dt*16 + 4g + i]
  float row_max[kMTiles];       // m of query mt*16 + r (the same in all 4 lane groups)
  float row_sum[kMTiles];       // l, this lane's partial over its keys (reduced at the end)
  init_accumulators(acc, row_max, row_sum);

  Vec16 k_next[K::kCopies];
  Vec16 v_next[K::kCopies];
  if (n_blocks > 0) {
    load_kv<K>(k_next, v_next, k, v, p.k_seq_stride, p.v_seq_stride, key_blocks.at(0) * kBlockN,
               p.seqlen_k, tid);
    store_kv<K>(lds, k_next, v_next, tid);
  }
  barrier();

  for (int j = 0; j < n_blocks; ++j) {
    const int stage = kStages == 2 ? (j & 1) : 0;
    const unsigned char* k_tile = lds + stage * K::kStageBytes;
    const unsigned char* v_tile = k_tile + K::kKTileBytes;
    const int n0 = key_blocks.at(j) * kBlockN;
    const bool more = j + 1 < n_blocks;
    // Block j + 1 travels from global memory while block j is computed.
    if (more) {
      load_kv<K>(k_next, v_next, k, v, p.k_seq_stride, p.v_seq_stride,
                 key_blocks.at(j + 1) * kBlockN, p.seqlen_k, tid);
    }

    // S^T = K Q^T: s[mt][nt][i] = S[query mt*16 + r][key n0 + nt*16 + 4g + i].
    f32x4 s[kMTiles][kNTiles];
    score_tiles<K, KSwizzle>(s, k_tile, k_lane, 0, q_frag);

#ifdef FLASHJIT_VARIANT
    // The variant's scores and mask, per element, in the blocks that need either: one loop per
    // case (the CUDA template found a single loop testing all_visible per score if-converted,
    // visible() paid in every block).
    const bool all_visible = fv::block_fully_visible(p, diagonal, m0, kBlockM, n0, kBlockN);
    auto apply = [&](bool masked) {  // called with a constant: one loop per case
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const int row = m0 + wave_row0 + mt * 16 + lane_row;
        // key - row at (nt, i) = (0, 0): one conversion per row and block (ALiBi's distance).
        const float distance0 = static_cast<float>(n0 + 4 * lane_group - row);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int key = n0 + nt * 16 + 4 * lane_group + i;
            float score = s[mt][nt][i];  // (a vector element binds to no reference)
            fa::apply_variant(score, p, diagonal, masked, slope, batch, head, row, key,
                              distance0 + static_cast<float>(nt * 16 + i));
            s[mt][nt][i] = score;
          }
      }
    };
    fa::apply_variant_block(all_visible, apply);
#else
    // Mask keys past seqlen_k and, when causal, past each row's diagonal.
    if (fa::block_needs_mask<K::kCausal>(p, diagonal, m0, n0, kBlockN)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const int row = m0 + wave_row0 + mt * 16 + lane_row;
        // Last visible key of this row, relative to this lane's first key of each tile.
        const int limit = fa::last_key<K::kCausal>(p, diagonal, row) - (n0 + 4 * lane_group);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (nt * 16 + i > limit) s[mt][nt][i] = -fa::infinity();
      }
    }
#endif

    // Online softmax, base 2; P^T packed to 16 bits as it is made: p_frag[mt][nt] is the B operand
    // of k-step nt of O^T += V^T P^T.
    Frag p_frag[kMTiles][kNTiles];
    online_softmax<K>(s, p, row_max, row_sum, acc, p_frag);
    accumulate_pv<K>(acc, p_frag, v_tile, v_lane);

    store_next_stage<K>(lds, stage, more, k_next, v_next, tid);
  }

  // Epilogue: O = acc / l straight from the accumulators (4 consecutive dims of one row per lane:
  // 8-byte stores), LSE from lane group 0. The row sums are reduced over the lane groups first,
  // by every lane (shuffles need the whole wave).
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    float sum = row_sum[mt];
    sum += shuffle_xor(sum, 16);
    sum += shuffle_xor(sum, 32);
    const float inverse = sum > 0.f ? 1.f / sum : 0.f;  // a row with no keys: O = 0
    const int row = wave_row0 + mt * 16 + lane_row;
    if (m0 + row < p.seqlen_q) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int col = dt * 16 + 4 * lane_group;
        if (col < K::kHeadDim) {
          Frag out;
          out.lo = pack2<K::kIsBf16>(acc[mt][dt][0] * inverse, acc[mt][dt][1] * inverse);
          out.hi = pack2<K::kIsBf16>(acc[mt][dt][2] * inverse, acc[mt][dt][3] * inverse);
          *reinterpret_cast<Frag*>(o + row * p.o_seq_stride + col) = out;
        }
      }
      if (lse && lane_group == 0) {
        lse[m0 + row] =
            fa::row_lse(row_max[mt], p.scale_log2, sum, [](float x) { return fast_log2(x); });
      }
    }
  }
}
#ifdef FLASHJIT_VARIANT

// The entry of every variant kernel: the kernel above on a copy of the params whose scale_log2 is
// the variant's softmax factor (flashjit_variant::softmax_scale_log2: log2(e) alone when score()
// takes the scaled scores; p.scale stays the problem's, which score() is given), so that its
// softmax and LSE need no branch of their own. Packed variable-length documents (varlen): the
// workgroup of (m_block, head, document block_index_z()) reads the document's offsets, returns
// when its tile starts past the document's queries, and runs on the document's view of the params
// (q, k, v, o, lse at its rows, its lengths as seqlen_q / seqlen_k): masks, the causal diagonal and
// the variant's band are per document, and no load or store crosses into another document.
template <class K>
FLASHJIT_DEVICE void attention_forward_variant(const FlashjitAttentionParams& params) {
  FlashjitAttentionParams p = variant_params(params);
#if FLASHJIT_VARIANT_VARLEN
  const int m_block = query_block<K>();
  if (!flashjit_variant::document_view(p, block_index_z(), m_block * K::kBlockM, 2)) return;
#endif
  attention_forward<K>(p);
}
#endif

}  // namespace flashjit_hip
