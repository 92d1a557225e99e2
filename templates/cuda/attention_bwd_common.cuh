// The backward pass's row kernels, shared by every CUDA backward family (mma, wgmma). The
// renderer places this after templates/attention_params.h, templates/attention_common.h and
// cuda/common.cuh, before the family's dK/dV and dQ template.
//
//   backward_preprocess   per query row i (padding rows up to seqlen_q_rounded too):
//                           delta[i]    = rowsum(dO_i * O_i)      (0 past seqlen_q)
//                           lse_log2[i] = lse[i] * log2(e)        (+inf past seqlen_q)
//                           dq_accum[i] = 0                       (when it is not null)
//   backward_dq_convert   DqMode::Atomic's last kernel: dQ_i = scale * dq_accum[i], in the
//                         storage type, through the dq strides.
//
// Both run kBackwardRows rows per CTA of kBackwardThreads threads (render.hpp's
// kBackwardPreprocessRows / kBackwardPreprocessThreads): each warp owns kBackwardRows / 4 rows
// and walks them one at a time, its lanes covering the row's 16-byte chunks.

namespace flashjit_kernel {

constexpr int kBackwardRows = 128;
constexpr int kBackwardThreads = 128;

// Eight 16-bit elements (one 16-byte vector) to floats.
template <bool IS_BF16>
__device__ __forceinline__ void unpack8(const Vec16& v, float (&out)[8]) {
  unpack2<IS_BF16>(v.x, out[0], out[1]);
  unpack2<IS_BF16>(v.y, out[2], out[3]);
  unpack2<IS_BF16>(v.z, out[4], out[5]);
  unpack2<IS_BF16>(v.w, out[6], out[7]);
}

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

template <int HEAD_DIM, bool IS_BF16>
__device__ __forceinline__ void backward_preprocess(const FlashjitAttentionParams& p) {
  constexpr int kChunks = HEAD_DIM / 8;                  // 16-byte chunks of a row
  constexpr int kPaddedDim = (HEAD_DIM + 63) / 64 * 64;  // dq_accum's row length
  constexpr int kRowsPerWarp = kBackwardRows / (kBackwardThreads / 32);
  static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM <= 256, "head dim: a multiple of 8 up to 256");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int head = blockIdx.y, batch = blockIdx.z;
  FLASHJIT_PREPROCESS_TENSORS(p, batch, head);  // row_base, o, d_o, lse

  const int row0 = blockIdx.x * kBackwardRows + warp * kRowsPerWarp;
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = row0 + r;
    float dot = 0.f;
    if (row < p.seqlen_q) {
      for (int c = lane; c < kChunks; c += 32) {
        float a[8], b[8];
        unpack8<IS_BF16>(*reinterpret_cast<const Vec16*>(o + row * p.o_seq_stride + c * 8), a);
        unpack8<IS_BF16>(*reinterpret_cast<const Vec16*>(d_o + row * p.do_seq_stride + c * 8), b);
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(a[e], b[e], dot);
      }
    }
    dot = warp_sum(dot);
    if (lane == 0) {
      p.delta[row_base + row] = row < p.seqlen_q ? dot : 0.f;
      p.lse_log2[row_base + row] =
          row < p.seqlen_q ? lse[row] * 1.4426950408889634f : plus_infinity();
    }
  }
  if (p.dq_accum != 0) {
    // The CTA's rows of the accumulator are contiguous: kBackwardRows * kPaddedDim floats.
    float4* accum = reinterpret_cast<float4*>(p.dq_accum +
                                              (row_base + blockIdx.x * kBackwardRows) * kPaddedDim);
    constexpr int kVectors = kBackwardRows * kPaddedDim / 4;
    for (int i = threadIdx.x; i < kVectors; i += kBackwardThreads)
      accum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

template <int HEAD_DIM, bool IS_BF16>
__device__ __forceinline__ void backward_dq_convert(const FlashjitAttentionParams& p) {
  constexpr int kChunks = HEAD_DIM / 8;
  constexpr int kPaddedDim = (HEAD_DIM + 63) / 64 * 64;
  const int head = blockIdx.y, batch = blockIdx.z;
  const long long row_base =
      (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q_rounded;
  u16* dq = static_cast<u16*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride;
  const int row0 = blockIdx.x * kBackwardRows;
  // One 16-byte output chunk per thread per step: consecutive threads take consecutive chunks.
  for (int i = threadIdx.x; i < kBackwardRows * kChunks; i += kBackwardThreads) {
    const int row = row0 + i / kChunks, c = i % kChunks;
    if (row >= p.seqlen_q) break;  // rows only grow with i
    const float4* from =
        reinterpret_cast<const float4*>(p.dq_accum + (row_base + row) * kPaddedDim + c * 8);
    const float4 a = from[0], b = from[1];
    Vec16 out;
    out.x = pack2<IS_BF16>(a.x * p.scale, a.y * p.scale);
    out.y = pack2<IS_BF16>(a.z * p.scale, a.w * p.scale);
    out.z = pack2<IS_BF16>(b.x * p.scale, b.y * p.scale);
    out.w = pack2<IS_BF16>(b.z * p.scale, b.w * p.scale);
    *reinterpret_cast<Vec16*>(dq + row * p.dq_seq_stride + c * 8) = out;
  }
}

#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_VARLEN
// Packed variable-length documents (FA2's varlen), as the forward's attention_forward_varlen:
// every backward kernel has a *_varlen entry (these two, and at the end of each family's
// template) that the renderer calls instead. The CTA of (block, head, document blockIdx.z) turns
// the params into the document's view (templates/attention_variant.h, document_tile_view: q, k,
// v, o, lse, dO, dQ, dK, dV at its rows, its lengths as seqlen_q / seqlen_k), so that masks, the
// causal diagonal and the variant's band are per document and no load or store crosses into
// another document. The workspace is packed by document (runtime/launch_params.hpp,
// backward_workspace): each document's rows of each head are its own, padded to a multiple of
// 128, and document_tile_view points the kernels' [document, head, row] index at them. The row
// kernels' CTAs past the document's rows exit.
template <int HEAD_DIM, bool IS_BF16>
FLASHJIT_DOCUMENT_ENTRY(backward_preprocess_varlen,
                        document_tile_view(document, blockIdx.z, (blockIdx.x * kBackwardRows), -1,
                                           2, (HEAD_DIM + 63) / 64 * 64),
                        backward_preprocess<HEAD_DIM, IS_BF16>)
template <int HEAD_DIM, bool IS_BF16>
FLASHJIT_DOCUMENT_ENTRY(backward_dq_convert_varlen,
                        document_tile_view(document, blockIdx.z, (blockIdx.x * kBackwardRows), -1,
                                           2, (HEAD_DIM + 63) / 64 * 64),
                        backward_dq_convert<HEAD_DIM, IS_BF16>)
#endif
#endif

#if __CUDA_ARCH__ >= 900
// ---- sm90: the bulk dQ reduction of the wgmma and ws backwards ---------------------------------
// (bulk_commit_group and bulk_wait_group_read come from cuda/tma.cuh in the ws family and from
// cuda/bulk_group.cuh, the same two wrappers, in the wgmma family: tma.cuh's text keys the
// forward's tuning rows, so the wgmma backward does not assemble it.)

// fp32 destination[0 .. bytes / 4) += the shared-memory words at `source`, asynchronously (the
// L2 adds whole lines): part of this thread's open bulk group. bytes, source and destination are
// multiples of 16.
__device__ __forceinline__ void bulk_reduce_add_f32(float* destination, u32 source, u32 bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   destination),
               "r"(source), "r"(bytes)
               : "memory");
}
// Until at most PENDING of this thread's bulk groups are incomplete (their writes done).
template <int PENDING>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(PENDING) : "memory");
}
#endif
}  // namespace flashjit_kernel
