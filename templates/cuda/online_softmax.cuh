// The online softmax's per-row steps, one copy for every CUDA forward family (mma.sync, wgmma,
// warp-specialized) and the decode kernel. A row's scores sit in the four lanes of a quad
// (accumulator fragments: lane holds rows lane/4 and lane/4 + 8); the softmax works in base 2 with
// the scale folded in (p = exp2(s * scale_log2 - m * scale_log2)), m in units of raw scores.
// Its end (the O stores of the mma and wgmma forwards) closes the file. The renderer places
// this after cuda/common.cuh.

namespace flashjit_kernel {

// A row's sum over the four lanes of its quad (every lane of the quad gets it).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// The running max row_max takes in a block whose scores' max over this lane is block_max: the
// block's max over the quad becomes the new row_max, correction = exp2((m_old - m_new) *
// scale_log2) is the factor O and l are rescaled by, and the result is m_new * scale_log2, what
// each score's exponent subtracts (0 for a row that has seen no key yet: max -inf, so that exp2
// gives 0, not NaN).
__device__ __forceinline__ float online_max_step(float& row_max, float block_max, float scale_log2,
                                                 float& correction) {
  block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
  block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
  const float max_scaled = flashjit_attention::scaled_row_max(block_max, scale_log2);
  correction = fast_exp2(row_max * scale_log2 - max_scaled);
  row_max = block_max;
  return max_scaled;
}

// As above, the block's max taken over this lane's scores of row `half` of an S in the wgmma
// accumulator layout (s[nt * 4 + 2 * half + {0, 1}]: key tile nt), starting from row_max.
template <int N>
__device__ __forceinline__ float online_max_step(float& row_max, const float (&s)[N], int half,
                                                 float scale_log2, float& correction) {
  float block_max = row_max;
#pragma unroll
  for (int nt = 0; nt < N / 4; ++nt)
    block_max = fmaxf(block_max, fmaxf(s[nt * 4 + 2 * half], s[nt * 4 + 2 * half + 1]));
  return online_max_step(row_max, block_max, scale_log2, correction);
}

// ---- the end of a forward: O out ----------------------------------------------------------------

// A warp's ROWS rows of O, staged in a shared tile of CHUNKS_PER_ROW 16-byte chunks per row, to
// global memory by 16-byte stores: tile row `row` (from row0; query m0 + row) to
// o + row * row_stride. Rows at or past seqlen_q - m0 and the tile's padding columns (past
// HEAD_DIM) are not written. ADDRESS: the (generic) address of element `col` of tile row `row`,
// an expression of those two names. (A macro for the reason cuda/warp_mma.cuh's loops are: as a
// function, the kernels' code around it was scheduled differently, and the plain kernels' CUBINs
// would have changed.)
#define FLASHJIT_WARP_STORE_ROWS(ROWS, CHUNKS_PER_ROW, HEAD_DIM, o, row_stride, lane, row0, m0, \
                                 seqlen_q, ADDRESS)                                             \
  _Pragma("unroll") for (int i = 0; i < ROWS * CHUNKS_PER_ROW / 32; ++i) {                      \
    const int copy = lane + i * 32;                                                             \
    const int row = row0 + copy / CHUNKS_PER_ROW;                                               \
    const int col = copy % CHUNKS_PER_ROW * 8;                                                  \
    if (m0 + row < seqlen_q && col < HEAD_DIM) {                                                \
      *reinterpret_cast<Vec16*>(o + row * row_stride + col) =                                   \
          *reinterpret_cast<const Vec16*>(ADDRESS);                                             \
    }                                                                                           \
  }

}  // namespace flashjit_kernel
