// The HIP backward pass's row kernels, as cuda/attention_bwd_common.cuh is the CUDA families'.
// The renderer places this after attention_params.h, attention_common.h, hip/primitives.hpp and
// hip/tiles.hpp, before hip/attention_bwd.hpp (whose header comment tells the launch contract):
//
//   backward_preprocess   per query row i (padding rows up to seqlen_q_rounded too):
//                           delta[i]    = rowsum(dO_i * O_i)      (0 past seqlen_q)
//                           lse_log2[i] = lse[i] * log2(e)        (+inf past seqlen_q)
//                           dq_accum[i] = 0                       (when it is not null)
//   backward_dq_convert   DqMode::Atomic's last kernel: dQ_i = scale * dq_accum[i], in the
//                         storage type, through the dq strides.
//
// Plain C++ over the primitives, so that the host emulation
// (tests/templates/hip_backward_emulation_test.cpp) runs them too.

namespace flashjit_hip {

// The preprocess / convert kernels: kBackwardRows query rows per workgroup of kBackwardThreads
// (render.hpp's kBackwardPreprocessRows / kBackwardPreprocessThreads).
constexpr int kBackwardRows = 128;
constexpr int kBackwardThreads = 128;

// ---- preprocess and convert: rows of the workspace ----------------------------------------------

// delta, lse_log2 of rows [x * kBackwardRows, (x + 1) * kBackwardRows) of (batch z, head y), and
// their dq_accum rows zeroed when it is not null. Each wave walks its rows kRowsPerStep at a
// time: kLanesPerRow lanes per row, each reading 4 elements (8 bytes) of O and dO, summed over
// the row's lanes with shuffles.
template <int HEAD_DIM, bool IS_BF16>
FLASHJIT_DEVICE void backward_preprocess(const FlashjitAttentionParams& p) {
  constexpr int kPieces = HEAD_DIM / 4;  // 8-byte pieces of a row
  constexpr int kLanesPerRow = kPieces <= 2    ? 2
                               : kPieces <= 4  ? 4
                               : kPieces <= 8  ? 8
                               : kPieces <= 16 ? 16
                               : kPieces <= 32 ? 32
                                               : 64;
  constexpr int kRowsPerStep = 64 / kLanesPerRow;
  constexpr int kRowsPerWave = kBackwardRows / (kBackwardThreads / 64);
  constexpr int kPaddedDim = (HEAD_DIM + 63) / 64 * 64;  // dq_accum's row length
  static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM <= 256, "head dim: a multiple of 8 up to 256");
  static_assert(kRowsPerWave % kRowsPerStep == 0, "whole steps per wave");

  const int tid = thread_index(), lane = lane_index(), wave = tid / 64;
  const int head = block_index_y(), batch = block_index_z();
  FLASHJIT_PREPROCESS_TENSORS(p, batch, head);  // row_base, o, d_o, lse
  const int piece = lane % kLanesPerRow;

  const int wave_row0 = block_index_x() * kBackwardRows + wave * kRowsPerWave;
  for (int step = 0; step < kRowsPerWave; step += kRowsPerStep) {
    const int row = wave_row0 + step + lane / kLanesPerRow;
    float dot = 0.f;
    if (row < p.seqlen_q && piece < kPieces) {
      const Frag a = *reinterpret_cast<const Frag*>(o + row * p.o_seq_stride + piece * 4);
      const Frag b = *reinterpret_cast<const Frag*>(d_o + row * p.do_seq_stride + piece * 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        dot += to_float<IS_BF16>(frag_element(a, i)) * to_float<IS_BF16>(frag_element(b, i));
      }
    }
#pragma unroll
    for (int mask = kLanesPerRow / 2; mask > 0; mask /= 2) dot += shuffle_xor(dot, mask);
    if (piece == 0) {
      p.delta[row_base + row] = row < p.seqlen_q ? dot : 0.f;
      p.lse_log2[row_base + row] = row < p.seqlen_q ? fa::lse_to_log2(lse[row]) : fa::infinity();
    }
  }
  if (p.dq_accum != 0) {
    // The workgroup's rows of the accumulator are contiguous: kBackwardRows * kPaddedDim floats.
    Vec16* accum = reinterpret_cast<Vec16*>(
        p.dq_accum + (row_base + block_index_x() * kBackwardRows) * kPaddedDim);
    for (int i = tid; i < kBackwardRows * kPaddedDim / 4; i += kBackwardThreads)
      accum[i] = Vec16{0u, 0u, 0u, 0u};
  }
}

// DqMode::Atomic's last kernel: dQ = scale * dq_accum for rows [x * kBackwardRows, ...) of
// (batch z, head y), one 16-byte output chunk per thread per step.
template <int HEAD_DIM, bool IS_BF16>
FLASHJIT_DEVICE void backward_dq_convert(const FlashjitAttentionParams& p) {
  constexpr int kChunks = HEAD_DIM / 8;
  constexpr int kPaddedDim = (HEAD_DIM + 63) / 64 * 64;
  const int head = block_index_y(), batch = block_index_z();
  const long long row_base =
      (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q_rounded;
  u16* dq = static_cast<u16*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride;
  const int row0 = block_index_x() * kBackwardRows;
  for (int i = thread_index(); i < kBackwardRows * kChunks; i += kBackwardThreads) {
    const int row = row0 + i / kChunks, c = i % kChunks;
    if (row >= p.seqlen_q) break;  // rows only grow with i
    const Float4* from =
        reinterpret_cast<const Float4*>(p.dq_accum + (row_base + row) * kPaddedDim + c * 8);
    const Float4 a = from[0], b = from[1];
    const float s = p.scale;
    Vec16 out;
    out.x = pack2<IS_BF16>(a.x * s, a.y * s);
    out.y = pack2<IS_BF16>(a.z * s, a.w * s);
    out.z = pack2<IS_BF16>(b.x * s, b.y * s);
    out.w = pack2<IS_BF16>(b.z * s, b.w * s);
    *reinterpret_cast<Vec16*>(dq + row * p.dq_seq_stride + c * 8) = out;
  }
}

#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_VARLEN
// The row kernels of packed documents (the renderer's *_varlen row entries): each workgroup on
// its document's view (document_tile_view; the workspace packed by document), none past the
// document's rows. document_rows makes p that view; false when the workgroup's rows start past
// the document's.
template <int HEAD_DIM>
FLASHJIT_DEVICE bool document_rows(FlashjitAttentionParams& p) {
  return flashjit_variant::document_tile_view(p, block_index_z(), block_index_x() * kBackwardRows,
                                              -1, 2, (HEAD_DIM + 63) / 64 * 64);
}

template <int HEAD_DIM, bool IS_BF16>
FLASHJIT_DEVICE void backward_preprocess_varlen(const FlashjitAttentionParams& params) {
  FlashjitAttentionParams p = params;
  if (document_rows<HEAD_DIM>(p)) backward_preprocess<HEAD_DIM, IS_BF16>(p);
}

template <int HEAD_DIM, bool IS_BF16>
FLASHJIT_DEVICE void backward_dq_convert_varlen(const FlashjitAttentionParams& params) {
  FlashjitAttentionParams p = params;
  if (document_rows<HEAD_DIM>(p)) backward_dq_convert<HEAD_DIM, IS_BF16>(p);
}
#endif
#endif

}  // namespace flashjit_hip
