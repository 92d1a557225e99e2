// Launch parameters of the attention kernels (forward and backward). Plain C so that the same
// definition is compiled into the host library and prepended to every rendered kernel source
// (NVRTC, hipRTC, Clang): host and device agree on the layout by construction.
#ifndef FLASHJIT_ATTENTION_PARAMS_H
#define FLASHJIT_ATTENTION_PARAMS_H

// How the scalar helpers of the templates that follow (attention_common.h, attention_variant.h)
// are declared: device functions under NVRTC and hipRTC, inline functions under Clang (the CPU
// backend) and a host compiler (the host library, the templates' emulation tests).
#ifndef FLASHJIT_DEVICE
#if defined(__CUDACC__) || defined(__HIP__)
#define FLASHJIT_DEVICE __device__ __forceinline__
#else
#define FLASHJIT_DEVICE inline
#endif
#endif

struct FlashjitAttentionParams {
  const void* q;  // [batch, seqlen_q, heads_q, head_dim] through the q strides
  const void* k;  // [batch, seqlen_k, heads_kv, head_dim] through the k strides
  const void* v;  // like k
  void* o;        // like q
  float* lse;     // [batch, heads_q, seqlen_q], contiguous, natural log

  // Element strides (the head_dim axis has stride 1).
  long long q_batch_stride, q_seq_stride, q_head_stride;
  long long k_batch_stride, k_seq_stride, k_head_stride;
  long long v_batch_stride, v_seq_stride, v_head_stride;
  long long o_batch_stride, o_seq_stride, o_head_stride;

  int batch;
  int heads_q;
  int heads_kv;
  int group_size;  // heads_q / heads_kv
  int seqlen_q;
  int seqlen_k;
  float scale;       // softmax scale, applied to q . k
  float scale_log2;  // scale * log2(e): the kernel works in base 2

  // ---- the backward pass only (the forward kernels ignore these) ----
  // Inputs: q, k, v, o and lse above (lse as the forward wrote it: natural log, +inf for a row
  // with no key), and d_o. Outputs: dq, dk, dv in the storage type.
  const void* d_o;  // like o, through the do strides
  void* dq;         // like q, through the dq strides
  void* dk;         // like k, through the dk strides
  void* dv;         // like v, through the dv strides
  long long do_batch_stride, do_seq_stride, do_head_stride;
  long long dq_batch_stride, dq_seq_stride, dq_head_stride;
  long long dk_batch_stride, dk_seq_stride, dk_head_stride;
  long long dv_batch_stride, dv_seq_stride, dv_head_stride;
  // Workspace (fp32, carved from one buffer by the runtime; rows padded to seqlen_q_rounded, a
  // multiple of 128, so that whole blocks of rows are read and written without bounds checks):
  float* delta;     // [batch, heads_q, seqlen_q_rounded]: D = rowsum(dO * O); 0 past seqlen_q
  float* lse_log2;  // [batch, heads_q, seqlen_q_rounded]: lse * log2(e); +inf past seqlen_q
  // [batch, heads_q, seqlen_q_rounded, head_dim_padded] (head dim rounded up to 64):
  // DqMode::Atomic's dQ accumulator, zeroed by the preprocess kernel; null for Separate. On the
  // CPU, dq_accum_splits copies of it one after the other, one per split of the key blocks
  // (templates/cpu/attention_bwd.hpp), each zeroed and filled by the work items that own it.
  float* dq_accum;
  int seqlen_q_rounded;
  int dq_accum_splits;  // copies of dq_accum: 1 on the GPU, 0 when dq_accum is null

  // ---- the decode family only (split-KV, paged K/V; generator/decode_config.hpp) ----
  // Paged K/V: k and v are [num_pages, page_size, heads_kv, head_dim] through the k and v
  // strides (batch stride = page stride); key j of sequence b is row j % page_size of page
  // block_table[b * block_table_stride + j / page_size]. Null: contiguous k and v.
  const int* block_table;
  const int* seqlens_k;  // [batch]: keys of each sequence (<= seqlen_k); null: seqlen_k each
  long long block_table_stride;  // max_pages
  int page_size;                 // 0: contiguous
  int num_splits;                // key ranges per sequence; 1: O and lse written directly
  // num_splits > 1 (workspace, fp32, rows = (b * heads_q + h) * seqlen_q + s):
  float* partial_o;    // [num_splits, rows, head_dim]: each range's normalized O
  float* partial_lse;  // [num_splits, rows]: each range's LSE in base 2 (-inf: no key)

  // ---- attention variants (templates/attention_variant.h) ----
  // Plain kernels never read these fields, and the generator version that plain tuning rows are
  // keyed by leaves the lines between the two markers out (plain_kernel_text in
  // generator/render.cpp), so that a new variant field does not stale them. They stay the
  // struct's last fields: no field a plain kernel reads moves when one is added.
  // FLASHJIT_VARIANT_FIELDS_BEGIN
  const float* alibi_slopes;  // ALiBi: fp32 [heads_q]; null without ALiBi
  // Packed variable-length documents (Variant::varlen): int32 [batch + 1] row offsets of each
  // document in the packed q/o and k/v (cu[0] = 0, non-decreasing); null otherwise. The kernels
  // turn them into one document's view of these params (flashjit_variant::document_view).
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  // FLASHJIT_VARIANT_FIELDS_END
};
// FLASHJIT_VARIANT_FIELDS_BEGIN
// A mask_mod's block map (issue 31; generator/block_mask.hpp builds its layout, the generated
// kernel of templates/cuda/block_mask.cuh fills it on the device): per (query tile of block_m
// rows, key tile of block_n keys) whether no row of the tile sees a key of the tile (empty:
// never loaded), every row sees every key (full: no per-element mask) or neither (partial), as
// the variant's visible() says (mask_mod, causal, window, prefix, keys < seqlen_k; rows past
// seqlen_q do not count). The kernels of a problem with a mask_mod whose family reads it take it
// as a second kernel parameter; plain kernels never see this type. One map for every (batch,
// head) unless the mask_mod names `batch` or `head` (per_head: maps = batch * heads_q, map
// batch * heads_q + head). Entries of the lists: (tile << 1) | full.
struct FlashjitBlockMask {
  int* q_count;  // [maps, q_tiles]: non-empty key tiles of each query tile
  int* q_list;   // [maps, q_tiles, k_tiles]: those key tiles in increasing order, then unused
  int* k_count;  // [maps, k_tiles]: non-empty query tiles of each key tile
  int* k_list;   // [maps, k_tiles, q_tiles]: those query tiles in increasing order
  unsigned char* states;  // [maps, q_tiles, k_tiles]: 0 empty, 1 partial, 2 full
  int q_tiles, k_tiles;   // ceil(seqlen_q / block_m), ceil(seqlen_k / block_n)
  int block_m, block_n;
  int maps;      // per_head ? batch * heads_q : 1
  int per_head;  // 1: a map per (batch, head); 0: one map
  int heads_q;
};
// FLASHJIT_VARIANT_FIELDS_END

// The warp-specialized Hopper forward (configs "-ws", templates/cuda/ws/) takes a second
// parameter block after FlashjitAttentionParams: the TMA tensor maps of q, k, v and o (each a
// CUtensorMap: 128 opaque bytes, 128-byte aligned as cuda.h declares it), encoded on the host for
// each launch from the same pointers and strides (runtime/tensor_map_spec.hpp describes the maps,
// the CUDA backend encodes them with the driver).
struct FlashjitTensorMap {
  alignas(128) unsigned long long opaque[16];
};
struct FlashjitForwardTensorMaps {
  FlashjitTensorMap q, k, v, o;
};

#endif
