// Tiles of 16-bit rows on their way global memory -> registers -> LDS, and the LDS layouts the
// MFMA operand reads of the HIP templates expect; shared by hip/attention_fwd.hpp and
// hip/attention_bwd.hpp. Plain C++ over hip/primitives.hpp (the renderer places this after it),
// so that the host emulation runs it too.
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

  // Rows [row0, row0 + ROWS) of `src` (rows `stride` elements apart) into registers. Rows at or
  // past `rows` and columns past HEAD_DIM read as zero: padded scores are then 0 before masking
  // and products never touch garbage.
  static FLASHJIT_DEVICE void load(Vec16 (&regs)[kCopies], const u16* src, long long stride,
                                   int row0, int rows, int tid) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int copy = tid + i * THREADS;
      const int row = copy / kChunksPerRow;
      const int col = copy % kChunksPerRow * 8;
      // A value, not `valid ? *pointer : zero`: selecting between addresses would make the
      // compiler put `zero` in scratch memory and emit flat loads.
      regs[i] = Vec16{0u, 0u, 0u, 0u};
      if ((kEven || copy < kChunks) && row0 + row < rows && col < HEAD_DIM)
        regs[i] = *reinterpret_cast<const Vec16*>(src + (row0 + row) * stride + col);
    }
  }

  // The registers of load() into a row-major, swizzled tile (16-byte writes).
  static FLASHJIT_DEVICE void store_rows(unsigned char* tile, const Vec16 (&regs)[kCopies],
                                         int tid) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int copy = tid + i * THREADS;
      if (!kEven && copy >= kChunks) continue;
      const int row = copy / kChunksPerRow;
      const int chunk = copy % kChunksPerRow;
      *reinterpret_cast<Vec16*>(tile + RowSwizzle::offset(row, chunk * 16)) = regs[i];
    }
  }

  // The registers of load() into a transposed tile (2-byte writes): element e of a chunk lands
  // kTransposedRowBytes * e past element 0.
  static FLASHJIT_DEVICE void store_transposed(unsigned char* tile, const Vec16 (&regs)[kCopies],
                                               int tid) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int copy = tid + i * THREADS;
      if (!kEven && copy >= kChunks) continue;
      const int row = copy / kChunksPerRow;
      const int chunk = copy % kChunksPerRow;
      const u32 words[4] = {regs[i].x, regs[i].y, regs[i].z, regs[i].w};
      unsigned char* const column = tile + chunk * 8 * kTransposedRowBytes + row * 2;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        *reinterpret_cast<u16*>(column + e * kTransposedRowBytes) =
            static_cast<u16>(words[e / 2] >> (16 * (e % 2)));
      }
    }
  }
};

// The 4-element operand at element `element` of row `row` of a transposed (or any padded,
// unswizzled) tile with ROW_BYTES-byte rows: one 8-byte read.
template <int ROW_BYTES>
FLASHJIT_DEVICE Frag read_frag(const unsigned char* tile, int row, int element) {
  return *reinterpret_cast<const Frag*>(tile + row * ROW_BYTES + element * 2);
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

}  // namespace flashjit_hip
