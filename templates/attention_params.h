// Launch parameters of the attention forward kernels. Plain C so that the same definition is
// compiled into the host library and prepended to every rendered kernel source (NVRTC, hipRTC,
// Clang): host and device agree on the layout by construction.
#ifndef FLASHJIT_ATTENTION_PARAMS_H
#define FLASHJIT_ATTENTION_PARAMS_H

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
};

#endif
