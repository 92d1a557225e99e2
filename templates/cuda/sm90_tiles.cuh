// Shared-memory layout arithmetic of the Hopper templates: wgmma's matrix descriptors, the
// 128-byte swizzled tile layout they describe, and the cp.async loader that fills such tiles.
// Plain C++ over cuda/common.cuh's cp_async_16 (no PTX of its own), so that a host emulation can
// run it as it is. The renderer places this after cuda/wgmma.cuh.
//
// Tiles: a [ROWS, cols] tile of 16-bit elements (cols a multiple of 64) is cut into 64-column
// blocks; a block holds all ROWS rows, 128 bytes per row, and 16-byte chunk c of row r sits at
// chunk c ^ (r % 8): rows 8i..8i+7 form one 1024-byte swizzle atom. The tile must start on a
// 1024-byte boundary (the descriptors below assume base offset 0). The hardware applies the
// swizzle to address bits: bits [4, 7) ^= bits [7, 10).
//
// One such tile serves as either operand of a wgmma, in either role:
//   K-major   the contraction runs along the row (Q, K as stored for Q K^T; V, dO for V dO^T):
//             descriptor (tile + first_row * 128, leading 16 (unused), stride 1024); step k16 =
//             16 columns: (k / 64) * ROWS * 128 + (k % 64) / 16 * 32 bytes further on.
//   MN-major  the contraction runs down the rows (V for P V, dO for P^T dO, K for dS K; as A:
//             dS^T stored [keys, queries] for dS K): transpose flag 1, descriptor (tile +
//             first_col / 64 * ROWS * 128, leading ROWS * 128 = bytes between 64-column blocks,
//             stride 1024 = bytes between 8-row groups); step k16 = 16 rows = 2048 bytes.

namespace flashjit_kernel {

// ---- descriptors -------------------------------------------------------------------------------

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading-dimension byte
// offset, stride-dimension byte offset (all >> 4).
__device__ __forceinline__ u64 smem_descriptor(u32 address, u32 leading_bytes, u32 stride_bytes) {
  return static_cast<u64>((address & 0x3FFFF) >> 4) | static_cast<u64>(leading_bytes >> 4) << 16 |
         static_cast<u64>(stride_bytes >> 4) << 32 | 1ull << 62;
}
// The descriptor of the same matrix `bytes` further on (bytes % 16 == 0, stays below 256 KB).
__device__ __forceinline__ u64 advance(u64 descriptor, u32 bytes) {
  return descriptor + (bytes >> 4);
}

// ---- products over these tiles (wgmma.cuh's wrappers) ----------------------------------------

// d = A B^T over the padded head dim, one commit group (the forward's S = Q K^T, the backward's
// S^T = K Q^T and dP^T = V dO^T): A (64 rows) and B (N rows) both K-major in 64-column swizzled
// blocks of A_ROWS and B_ROWS rows (128 bytes a row), B at b_offset bytes past its descriptor (a
// pipeline buffer); 16 head-dim columns per k-step. d is a fresh accumulator: the first k-step is
// a *_first, nothing loop-carried into it.
template <int N, int HEAD_DIM_PADDED, int A_ROWS, int B_ROWS, bool IS_BF16>
__device__ __forceinline__ void wgmma_over_head_dim(float (&d)[N / 2], u64 a, u64 b, u32 b_offset) {
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM_PADDED / 16; ++kk) {
    const u32 a_step = (kk / 4) * (A_ROWS * 128) + (kk % 4) * 32;
    const u32 b_step = b_offset + (kk / 4) * (B_ROWS * 128) + (kk % 4) * 32;
    if (kk == 0)
      Wgmma<N, IS_BF16>::ss_first(d, advance(a, a_step), advance(b, b_step));
    else
      Wgmma<N, IS_BF16>::ss(d, advance(a, a_step), advance(b, b_step), 1);
  }
  wgmma_commit();
}

// d = A B over KEYS keys from key0 on, one commit group (the backward's dQ tile = dS K_j): A and
// B both MN-major over the keys (128 bytes a key), at a_offset and b_offset bytes past their
// descriptors. d is a fresh accumulator: the first k-step is a *_first.
template <int KEYS, int N, bool IS_BF16>
__device__ __forceinline__ void wgmma_over_keys(float (&d)[N / 2], u64 a, u32 a_offset, u64 b,
                                                u32 b_offset, int key0 = 0) {
#pragma unroll
  for (int s = 0; s < KEYS / 16; ++s) {  // 16 keys per k-step
    const int key = key0 + s * 16;
    const u64 a_step = advance(a, a_offset + key * 128);
    const u64 b_step = advance(b, b_offset + key * 128);
    if (s == 0)
      Wgmma<N, IS_BF16>::template ss_first<1, 1>(d, a_step, b_step);
    else
      Wgmma<N, IS_BF16>::template ss<1, 1>(d, a_step, b_step, 1);
  }
  wgmma_commit();
}

// O += P V: P from registers (p[t]: the A fragment of keys [16 t, 16 t + 16)), V through v_desc
// (MN-major, BLOCK_N rows, at v_offset bytes past the descriptor: a pipeline buffer), O in CHUNKS
// chunks of PV_CHUNK head-dim columns (one wgmma each). Committed as one wgmma group. The
// backward's dV += P^T dO and dK += dS^T Q from registers are the same product over the step's
// BLOCK_N queries.
template <int BLOCK_N, int PV_CHUNK, bool IS_BF16, int CHUNKS, int N>
__device__ __forceinline__ void wgmma_pv(float (&o)[CHUNKS][N], const u32 (&p)[BLOCK_N / 16][4],
                                         u64 v_desc, u32 v_offset = 0) {
#pragma unroll
  for (int t = 0; t < BLOCK_N / 16; ++t)  // 16 keys per step
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c)
      Wgmma<PV_CHUNK, IS_BF16>::rs(
          o[c], p[t],
          advance(v_desc, v_offset + t * 16 * 128 + c * (PV_CHUNK / 64) * BLOCK_N * 128), 1);
  wgmma_commit();
}

// ---- swizzled shared-memory tiles --------------------------------------------------------------

// Byte offset of (row, col) in a swizzled tile of ROWS rows (layout at the top of this file).
template <int ROWS>
__device__ __forceinline__ u32 wg_tile_offset(int row, int col) {
  return (col >> 6) * (ROWS * 128) + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4) +
         (col & 7) * 2;
}

// Starts the copy (cp.async, 16 bytes per copy) of ROWS global rows of HEAD_DIM elements (row r
// at source + r * row_stride) into a swizzled tile of COLS = HEAD_DIM rounded up to 64 columns,
// by the THREADS threads of the CTA. Rows at or past `valid_rows` and columns past the
// head dim are zero-filled.
template <int THREADS, int HEAD_DIM, int ROWS>
__device__ __forceinline__ void wg_load_tile_async(u32 tile, const u16* source,
                                                   long long row_stride, int valid_rows) {
  constexpr int kChunksPerRow = (HEAD_DIM + 63) / 64 * 8;
  constexpr int kCopies = ROWS * kChunksPerRow / THREADS;
  static_assert((ROWS * kChunksPerRow) % THREADS == 0, "tile copies split evenly over threads");
  if constexpr (THREADS % kChunksPerRow == 0 && (THREADS / kChunksPerRow) % 8 == 0) {
    // Each thread keeps one column and steps down the rows; the step keeps the swizzle phase.
    constexpr int kRowStep = THREADS / kChunksPerRow;
    const int row0 = threadIdx.x / kChunksPerRow;
    const int col = threadIdx.x % kChunksPerRow * 8;
    const u16* from = source + row0 * row_stride + col;
    const long long step = kRowStep * row_stride;
    const int rows_left = col < HEAD_DIM ? valid_rows - row0 : 0;
    const u32 to = tile + wg_tile_offset<ROWS>(row0, col);
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool valid = i * kRowStep < rows_left;
      cp_async_16(to + i * kRowStep * 128, valid ? from + i * step : source, valid ? 16 : 0);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int copy = threadIdx.x + i * THREADS;
      const int row = copy / kChunksPerRow;
      const int col = copy % kChunksPerRow * 8;
      const bool valid = row < valid_rows && col < HEAD_DIM;
      cp_async_16(tile + wg_tile_offset<ROWS>(row, col),
                  valid ? source + row * row_stride + col : source, valid ? 16 : 0);
    }
  }
}

}  // namespace flashjit_kernel
