// Tiles of 16-bit rows on their way global memory -> registers -> LDS, and the LDS layouts the
// MFMA operand reads of the HIP templates expect; shared by hip/attention_fwd.hpp,
// hip/attention_bwd.hpp and hip/decode.hpp, with the steps of the forward's key loop that the
// forward and decode kernels share (at the end). Plain C++ over hip/primitives.hpp (the renderer
// places this after it) and attention_common.h, so that the host emulation runs it too.
//
// A tile is ROWS rows of HEAD_DIM elements (zero-padded to HEAD_DIM_PADDED, a multiple of 64),
// copied in 16-byte chunks of 8 elements: chunk c of the tile in row-major order is copy
// c / THREADS of thread c % THREADS, so that consecutive threads read consecutive 16 bytes. In
// LDS it is stored in one or both of two layouts:
//   rows        [ROWS][HEAD_DIM_PADDED], the 16-byte chunks XOR-swizzled (Swizzle below): an MFMA
//               operand of 4 consecutive elements of one row is one 8-byte read;
//   transposed  [HEAD_DIM_PADDED][ROWS + 4] (8 bytes of padding per row against bank
//               conflicts): an operand of 4 consecutive rows of one column is one 8-byte read.
//               Written with 2-byte stores at compile-time offsets from one address per copy.

namespace flashjit_hip {

// The names every HIP kernel body uses for the rules all GPU templates share (attention_common.h)
// and, for a problem with a variant, for attention_variant.h (rendered before both).
namespace fa = flashjit_attention;
#ifdef FLASHJIT_VARIANT
namespace fv = flashjit_variant;
#endif

// What every HIP kernel's traits start from (Traits, BwdTraits, DecodeTraits): the GPU traits'
// shape (FLASHJIT_TRAITS_SHAPE, attention_common.h; head dim padded to whole swizzle groups, its
// kWarps are the workgroup's waves), the waves under their own name, the threads of 64-lane
// waves and the 16-dim tiles of a head-dim row.
template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WAVES, int STAGES, bool IS_BF16, bool CAUSAL>
struct TileShape {
  FLASHJIT_TRAITS_SHAPE(HEAD_DIM, (HEAD_DIM + 63) / 64 * 64, BLOCK_M, BLOCK_N, WAVES, STAGES,
                        IS_BF16, CAUSAL);
  static constexpr int kWaves = WAVES;
  static constexpr int kWaveSize = 64;
  static constexpr int kThreads = WAVES * kWaveSize;
  static constexpr int kDTiles = kHeadDimPadded / 16;  // 16-dim tiles of a head-dim row
  static_assert(STAGES == 1 || STAGES == 2, "1 or 2 LDS buffers for the streamed blocks");
};

struct alignas(16) Vec16 {  // one 16-byte vector: 8 elements
  u32 x, y, z, w;
};
struct alignas(8) Frag {  // 4 16-bit elements: one lane's A or B operand of one MFMA
  u32 lo, hi;
};
struct alignas(16) Float4 {  // 4 fp32 values: one 16-byte vector
  float x, y, z, w;
};

// Byte offset of byte `byte` of row `row` in a tile of ROW_BYTES-byte rows whose 16-byte chunks
// are XOR-swizzled by a phase that differs for each of the 8 rows sharing the banks: a 128-byte
// bank line holds one row (ROW_BYTES >= 128) or 128 / ROW_BYTES rows (64: two per line).
template <int ROW_BYTES>
struct Swizzle {
  static constexpr int kChunks = ROW_BYTES / 16;
  static constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;
  static constexpr int kPhases = kChunks >= 8 ? 8 : kChunks;
  static_assert(ROW_BYTES % 64 == 0, "rows of at least 4 chunks");

  static FLASHJIT_DEVICE int offset(int row, int byte) {
    const int phase = (row / kRowsPerLine) % kPhases;
    return row * ROW_BYTES + (((byte >> 4) ^ phase) << 4) + (byte & 15);
  }
  // offset(row0 + row_add, byte0 + 16 * chunk_add) from lane_offset = offset(row0, byte0), with
  // row_add a multiple of 16 (the phase repeats) and the chunk bits of byte0 below the phase
  // range disjoint from chunk_add's: one add and one XOR of compile-time constants once the
  // operand loops are unrolled, instead of the swizzle per read.
  static FLASHJIT_DEVICE int advance(int lane_offset, int row_add, int chunk_add) {
    return (lane_offset + row_add * ROW_BYTES + (chunk_add & ~(kPhases - 1)) * 16) ^
           ((chunk_add & (kPhases - 1)) << 4);
  }
};

template <int ROWS, int HEAD_DIM, int HEAD_DIM_PADDED, int THREADS>
struct TileCopy {
  static constexpr int kChunksPerRow = HEAD_DIM_PADDED / 8;
  static constexpr int kChunks = ROWS * kChunksPerRow;
  static constexpr int kCopies = (kChunks + THREADS - 1) / THREADS;  // per thread
  static constexpr bool kEven = kChunks % THREADS == 0;  // else the last copy is partial
  static constexpr int kRowBytes = HEAD_DIM_PADDED * 2;
  static constexpr int kTileBytes = ROWS * kRowBytes;
  static constexpr int kTransposedRowBytes = (ROWS + 4) * 2;
  static constexpr int kTransposedTileBytes = HEAD_DIM_PADDED * kTransposedRowBytes;
  typedef Swizzle<kRowBytes> RowSwizzle;

  static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM <= HEAD_DIM_PADDED, "whole 16-byte chunks");
  static_assert(HEAD_DIM_PADDED % 64 == 0, "whole swizzle groups");
  static_assert(ROWS % 16 == 0, "whole 16-row MFMA tiles");

  // f(i, row, chunk) for each copy i of thread `tid` that lies in the tile (the last one may not,
  // when the chunks do not split evenly): 16-byte chunk `chunk` of row `row`.
  template <class F>
  static FLASHJIT_DEVICE void for_each_copy(int tid, F f) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int copy = tid + i * THREADS;
      if (kEven || copy < kChunks) f(i, copy / kChunksPerRow, copy % kChunksPerRow);
    }
  }

  // Rows [row0, row0 + ROWS) of `src` (rows `stride` elements apart) into registers. Rows at or
  // past `rows` and columns past HEAD_DIM read as zero: padded scores are then 0 before masking
  // and products never touch garbage.
  static FLASHJIT_DEVICE void load(Vec16 (&regs)[kCopies], const u16* src, long long stride,
                                   int row0, int rows, int tid) {
    // A value, not `valid ? *pointer : zero`: selecting between addresses would make the
    // compiler put `zero` in scratch memory and emit flat loads.
#pragma unroll
    for (int i = 0; i < kCopies; ++i) regs[i] = Vec16{0u, 0u, 0u, 0u};
    for_each_copy(tid, [&](int i, int row, int chunk) {
      if (row0 + row < rows && chunk * 8 < HEAD_DIM)
        regs[i] = *reinterpret_cast<const Vec16*>(src + (row0 + row) * stride + chunk * 8);
    });
  }

  // The registers of load() into a row-major, swizzled tile (16-byte writes).
  static FLASHJIT_DEVICE void store_rows(unsigned char* tile, const Vec16 (&regs)[kCopies],
                                         int tid) {
    for_each_copy(tid, [&](int i, int row, int chunk) {
      *reinterpret_cast<Vec16*>(tile + RowSwizzle::offset(row, chunk * 16)) = regs[i];
    });
  }

  // The registers of load() into a transposed tile (2-byte writes): element e of a chunk lands
  // kTransposedRowBytes * e past element 0.
  static FLASHJIT_DEVICE void store_transposed(unsigned char* tile, const Vec16 (&regs)[kCopies],
                                               int tid) {
    for_each_copy(tid, [&](int i, int row, int chunk) {
      const u32 words[4] = {regs[i].x, regs[i].y, regs[i].z, regs[i].w};
      unsigned char* const column = tile + chunk * 8 * kTransposedRowBytes + row * 2;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        *reinterpret_cast<u16*>(column + e * kTransposedRowBytes) =
            static_cast<u16>(words[e / 2] >> (16 * (e % 2)));
      }
    });
  }
};

// The query block of this workgroup: causal rows near the end see the most keys, so they are
// launched first and the tail is short.
template <class K>
FLASHJIT_DEVICE int query_block() {
  return K::kCausal ? grid_size_x() - 1 - block_index_x() : block_index_x();
}

#ifdef FLASHJIT_VARIANT
// The params a variant entry runs its kernel on: the problem's, with scale_log2 the variant's
// softmax factor (flashjit_variant::softmax_scale_log2: log2(e) alone when score() takes the
// scaled scores; p.scale stays the problem's, which score() is given), so that the kernels'
// softmax and LSE need no branch of their own.
FLASHJIT_DEVICE FlashjitAttentionParams variant_params(const FlashjitAttentionParams& params) {
  FlashjitAttentionParams p = params;
  p.scale_log2 = flashjit_variant::softmax_scale_log2(params);
  return p;
}
#endif

// The 4-element operand at element `element` of row `row` of a transposed (or any padded,
// unswizzled) tile with ROW_BYTES-byte rows: one 8-byte read.
template <int ROW_BYTES>
FLASHJIT_DEVICE Frag read_frag(const unsigned char* tile, int row, int element) {
  return *reinterpret_cast<const Frag*>(tile + row * ROW_BYTES + element * 2);
}

// The 16-bit operands of one row of a tensor (16 rows: one per lane_row) for this lane:
// frag[kk] = row[dims kk*16 + 4g .. + 3], zero for a row that is not `in` (past the tensor's rows)
// and past the head dim: the A or B operand of a product over the head dim that stays in
// registers (the forward's and decode's Q, the backward's K, V, Q, dO).
template <class K>
FLASHJIT_DEVICE void load_row_operands(Frag (&frag)[K::kDTiles], const u16* row, bool in,
                                       int lane_group) {
#pragma unroll
  for (int kk = 0; kk < K::kDTiles; ++kk) {
    const int col = kk * 16 + 4 * lane_group;
    frag[kk] = Frag{0u, 0u};
    if (in && col < K::kHeadDim) frag[kk] = *reinterpret_cast<const Frag*>(row + col);
  }
}

// Element i (0..3) of a packed 4-element operand, as 16 bits.
FLASHJIT_DEVICE u16 frag_element(const Frag& frag, int i) {
  return static_cast<u16>((i < 2 ? frag.lo : frag.hi) >> (16 * (i % 2)));
}

// Four floats rounded to the storage type and packed as one operand (elements 0..3).
template <bool IS_BF16>
FLASHJIT_DEVICE Frag pack4(float e0, float e1, float e2, float e3) {
  return Frag{pack2<IS_BF16>(e0, e1), pack2<IS_BF16>(e2, e3)};
}

// ---- the forward's key loop, shared by hip/attention_fwd.hpp and hip/decode.hpp ---------------
// Transposed: S^T = K Q^T and O^T += V^T P^T, so that P^T leaves the score MFMAs already laid out
// as the B operand of the next (no LDS round trip). Per lane (r = lane % 16, g = lane / 16):
// s[mt][nt][i] is the score of query (row) mt*16 + r and key nt*16 + 4g + i of the wave's keys;
// acc[mt][dt][i] is O[query mt*16 + r][dim dt*16 + 4g + i]; row_max, row_sum: m and this lane's
// partial l of query mt*16 + r.

// Writes a block's K/V registers (K::KVCopy::load) into the LDS stage at `stage`: K row-major
// ([key][dim], 16-byte writes), V transposed after it ([dim][key], 2-byte writes) so that the
// P V operand reads are 8-byte reads.
template <class K>
FLASHJIT_DEVICE void store_kv(unsigned char* stage, const Vec16 (&k_regs)[K::kCopies],
                              const Vec16 (&v_regs)[K::kCopies], int tid) {
  K::KVCopy::store_rows(stage, k_regs, tid);
  K::KVCopy::store_transposed(stage + K::kKTileBytes, v_regs, tid);
}

// After block j's reads (from LDS stage `stage`): block j + 1's registers into LDS when there is
// one (`more`), then the barrier that publishes them. With one buffer, once every wave is done
// reading block j from it; with two, into the buffer block j - 1 used (every wave passed the
// barrier after reading it).
template <class K>
FLASHJIT_DEVICE void store_next_stage(unsigned char* lds, int stage, bool more,
                                      const Vec16 (&k_regs)[K::kCopies],
                                      const Vec16 (&v_regs)[K::kCopies], int tid) {
  if (K::kStages == 1) barrier();
  if (more)
    store_kv<K>(lds + (K::kStages == 2 ? (stage ^ 1) : 0) * K::kStageBytes, k_regs, v_regs, tid);
  barrier();
}

// Before the first key block: O^T = 0, m = -inf, l = 0.
template <int M_TILES, int D_TILES>
FLASHJIT_DEVICE void init_accumulators(f32x4 (&acc)[M_TILES][D_TILES], float (&row_max)[M_TILES],
                                       float (&row_sum)[M_TILES]) {
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
    for (int dt = 0; dt < D_TILES; ++dt) acc[mt][dt] = f32x4{0.f, 0.f, 0.f, 0.f};
    row_max[mt] = -flashjit_attention::infinity();
    row_sum[mt] = 0.f;
  }
}

// S^T = K Q^T over the keys [key0, key0 + 16 * N_TILES) of the swizzled K tile (k_lane: this
// lane's offset in it, KSwizzle::offset(r, 8g)), Q as B operands q_frag[mt][kk] = Q[query mt*16 +
// r][dims kk*16 + 4g .. + 3]. (Any product over the head dim of LDS rows by register rows: the
// backward's S = Q K^T and dP = dO V^T, streamed Q / dO rows by a wave's K / V.)
template <class K, class KSwizzle, int M_TILES, int N_TILES, int D_TILES>
FLASHJIT_DEVICE void score_tiles(f32x4 (&s)[M_TILES][N_TILES], const unsigned char* k_tile,
                                 int k_lane, int key0, const Frag (&q_frag)[M_TILES][D_TILES]) {
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt) s[mt][nt] = f32x4{0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int kk = 0; kk < D_TILES; ++kk) {
#pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt) {
      const Frag k_frag = *reinterpret_cast<const Frag*>(
          k_tile + KSwizzle::advance(k_lane, key0 + nt * 16, 2 * kk));
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) {
        s[mt][nt] = mfma_16x16x16<K::kIsBf16>(k_frag.lo, k_frag.hi, q_frag[mt][kk].lo,
                                              q_frag[mt][kk].hi, s[mt][nt]);
      }
    }
  }
}

// Online softmax of one block of (masked) scores, base 2: the new row maxima (a query's scores
// are spread over the 4 lane groups: lanes r, r+16, r+32, r+48), O and l rescaled, P^T packed to
// 16 bits as it is made: p_frag[mt][nt] is the B operand of k-step nt of O^T += V^T P^T.
template <class K, int M_TILES, int N_TILES, int D_TILES>
FLASHJIT_DEVICE void online_softmax(const f32x4 (&s)[M_TILES][N_TILES],
                                    const FlashjitAttentionParams& p, float (&row_max)[M_TILES],
                                    float (&row_sum)[M_TILES], f32x4 (&acc)[M_TILES][D_TILES],
                                    Frag (&p_frag)[M_TILES][N_TILES]) {
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt) {
    float block_max = row_max[mt];
#pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) block_max = __builtin_fmaxf(block_max, s[mt][nt][i]);
    block_max = __builtin_fmaxf(block_max, shuffle_xor(block_max, 16));
    block_max = __builtin_fmaxf(block_max, shuffle_xor(block_max, 32));
    const float max_scaled = flashjit_attention::scaled_row_max(block_max, p.scale_log2);
    const float correction = fast_exp2(row_max[mt] * p.scale_log2 - max_scaled);
    row_max[mt] = block_max;
    row_sum[mt] *= correction;
#pragma unroll
    for (int dt = 0; dt < D_TILES; ++dt) acc[mt][dt] *= correction;
#pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt) {
      float e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        e[i] = fast_exp2(__builtin_fmaf(s[mt][nt][i], p.scale_log2, -max_scaled));
      row_sum[mt] += (e[0] + e[1]) + (e[2] + e[3]);
      p_frag[mt][nt].lo = pack2<K::kIsBf16>(e[0], e[1]);
      p_frag[mt][nt].hi = pack2<K::kIsBf16>(e[2], e[3]);
    }
  }
}

// O^T += V^T P^T: acc[mt][dt] += V^T[dims dt*16..][keys nt*16..] P^T[keys nt*16..][queries], the
// V^T operands from the padded tile at this lane's offset v_lane (r * kVRowBytes + 8g, plus the
// wave's first key).
template <class K, int M_TILES, int N_TILES, int D_TILES>
FLASHJIT_DEVICE void accumulate_pv(f32x4 (&acc)[M_TILES][D_TILES],
                                   const Frag (&p_frag)[M_TILES][N_TILES],
                                   const unsigned char* v_tile, int v_lane) {
#pragma unroll
  for (int nt = 0; nt < N_TILES; ++nt) {
#pragma unroll
    for (int dt = 0; dt < D_TILES; ++dt) {
      const Frag v_frag =
          *reinterpret_cast<const Frag*>(v_tile + v_lane + dt * 16 * K::kVRowBytes + nt * 32);
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) {
        acc[mt][dt] = mfma_16x16x16<K::kIsBf16>(v_frag.lo, v_frag.hi, p_frag[mt][nt].lo,
                                                p_frag[mt][nt].hi, acc[mt][dt]);
      }
    }
  }
}

}  // namespace flashjit_hip
