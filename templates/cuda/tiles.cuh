// Shared-memory tiles of 16-bit elements, as the CUDA mma.sync templates (forward and backward)
// lay them out: row-major, ROW_ELEMENTS elements per row, 16-byte chunks XOR-swizzled by the
// row. Rows of a multiple of 64 elements (whole 128-byte groups) XOR the low three bits of the
// chunk with (row % 8); rows of 32 elements (64 bytes, two rows per 128-byte group) XOR the low
// two bits with (row / 2 % 4). Either way an ldmatrix read of 8 consecutive rows (starting at a
// multiple of 8) at one logical chunk, or a fragment store to them, touches 8 distinct bank
// groups. Tiles are filled from global memory with cp.async, 16 bytes per copy, and written back
// 16 bytes per thread. The renderer places this after cuda/common.cuh.

namespace flashjit_kernel {

template <int ROW_ELEMENTS>
struct Swizzle {
  static_assert(ROW_ELEMENTS == 32 || ROW_ELEMENTS % 64 == 0,
                "rows of 32 elements or of whole 128-byte groups");
  static constexpr int kMask = ROW_ELEMENTS == 32 ? 3 : 7;  // the chunk bits it flips
  static __device__ __forceinline__ int phase(int row) {
    return ROW_ELEMENTS == 32 ? (row >> 1) & 3 : row & 7;  // equal for rows 8 apart
  }
};

// Element offset of (row, col) in a swizzled tile with ROW_ELEMENTS elements per row.
template <int ROW_ELEMENTS>
__device__ __forceinline__ int swizzled_offset(int row, int col) {
  const int chunk = (col >> 3) ^ Swizzle<ROW_ELEMENTS>::phase(row);
  return row * ROW_ELEMENTS + (chunk << 3) + (col & 7);
}

// Byte offset of (lane_row + row_add, lane_chunk + chunk_add) given `lane_offset`, the byte offset
// of (lane_row, lane_chunk). Needs row_add % 8 == 0 (same swizzle phase) and the swizzled bits of
// lane_chunk and chunk_add disjoint (so that adding them carries nothing out of those bits): the
// swizzle then splits into an add and an XOR of constants, and the per-lane part stays in one
// register instead of one register per fragment. The adds are compile-time constants once the
// fragment loops are unrolled.
template <int ROW_ELEMENTS>
__device__ __forceinline__ u32 swizzled_step(u32 lane_offset, int row_add, int chunk_add) {
  constexpr int kMask = Swizzle<ROW_ELEMENTS>::kMask;
  return (lane_offset + row_add * (ROW_ELEMENTS * 2) + (chunk_add & ~kMask) * 16) ^
         ((chunk_add & kMask) << 4);
}

// Starts the copy of ROWS global rows (row r at source + r * row_stride, COLS elements each)
// into a shared tile of ROW_ELEMENTS per row at shared address `tile`, over THREADS threads.
// Rows at or past `valid_rows` and columns past COLS are zero-filled. When the threads cover
// whole rows, each thread keeps one column and steps down the rows: one base pointer and one
// stride in registers instead of one 64-bit address per copy.
template <int THREADS, int ROWS, int ROW_ELEMENTS, int COLS>
__device__ __forceinline__ void load_tile_async(u32 tile, const u16* source, long long row_stride,
                                                int valid_rows) {
  constexpr int kChunksPerRow = ROW_ELEMENTS / 8;
  constexpr int kRowBytes = ROW_ELEMENTS * 2;
  constexpr int kCopies = ROWS * kChunksPerRow / THREADS;
  static_assert((ROWS * kChunksPerRow) % THREADS == 0, "tile copies split evenly over the threads");
  static_assert(COLS % 8 == 0 && COLS <= ROW_ELEMENTS, "whole 16-byte chunks within the row");
  if constexpr (THREADS % kChunksPerRow == 0) {
    constexpr int kRowStep = THREADS / kChunksPerRow;
    const int row0 = threadIdx.x / kChunksPerRow;
    const int col = threadIdx.x % kChunksPerRow * 8;
    const u16* from = source + row0 * row_stride + col;
    const long long step = kRowStep * row_stride;
    const int rows_left = col < COLS ? valid_rows - row0 : 0;
    const u32 to = tile + 2 * swizzled_offset<ROW_ELEMENTS>(row0, col);
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      // kRowStep is a multiple of 8 when the tile has >= 8 rows per step, so the swizzle phase
      // of the row repeats; otherwise recompute the offset.
      const u32 to_i = kRowStep % 8 == 0
                           ? to + i * kRowStep * kRowBytes
                           : tile + 2 * swizzled_offset<ROW_ELEMENTS>(row0 + i * kRowStep, col);
      const bool valid = i * kRowStep < rows_left;
      cp_async_16(to_i, valid ? from + i * step : source, valid ? 16 : 0);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int copy = threadIdx.x + i * THREADS;
      const int row = copy / kChunksPerRow;
      const int col = copy % kChunksPerRow * 8;
      const bool valid = row < valid_rows && col < COLS;
      cp_async_16(tile + 2 * swizzled_offset<ROW_ELEMENTS>(row, col),
                  valid ? source + row * row_stride + col : source, valid ? 16 : 0);
    }
  }
}

// Writes rows [0, valid_rows) of a shared tile (ROWS rows of ROW_ELEMENTS, at shared address
// `tile`), COLS elements each, to global rows at destination + r * row_stride: 16 bytes per
// store, consecutive threads on consecutive chunks of a row. Every thread of the block calls it
// after a barrier that follows the last write to the tile.
template <int THREADS, int ROWS, int ROW_ELEMENTS, int COLS>
__device__ __forceinline__ void store_tile(u32 tile, u16* destination, long long row_stride,
                                           int valid_rows) {
  constexpr int kChunksPerRow = COLS / 8;  // only the chunks that are written back
  static_assert(COLS % 8 == 0 && COLS <= ROW_ELEMENTS, "whole 16-byte chunks within the row");
  for (int copy = threadIdx.x; copy < ROWS * kChunksPerRow; copy += THREADS) {
    const int row = copy / kChunksPerRow;
    const int col = copy % kChunksPerRow * 8;
    if (row >= valid_rows) break;  // rows only grow with copy
    *reinterpret_cast<Vec16*>(destination + row * row_stride + col) =
        load_shared_vec16(tile + 2 * swizzled_offset<ROW_ELEMENTS>(row, col));
  }
}

}  // namespace flashjit_kernel
