// The kernels' one parameter block, filled from a problem and its pointers: shared by every
// backend, so the layout in templates/attention_params.h is filled in one place.
#pragma once

#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "templates/attention_params.h"

namespace flashjit {

// Assumes validate(problem) passed (sizes fit the int fields).
inline FlashjitAttentionParams make_launch_params(const AttentionProblem& problem,
                                                  const AttentionArgs& args) {
  FlashjitAttentionParams params{};
  params.q = args.q;
  params.k = args.k;
  params.v = args.v;
  params.o = args.o;
  params.lse = args.lse;
  params.q_batch_stride = problem.q_strides.batch;
  params.q_seq_stride = problem.q_strides.seq;
  params.q_head_stride = problem.q_strides.head;
  params.k_batch_stride = problem.k_strides.batch;
  params.k_seq_stride = problem.k_strides.seq;
  params.k_head_stride = problem.k_strides.head;
  params.v_batch_stride = problem.v_strides.batch;
  params.v_seq_stride = problem.v_strides.seq;
  params.v_head_stride = problem.v_strides.head;
  params.o_batch_stride = problem.o_strides.batch;
  params.o_seq_stride = problem.o_strides.seq;
  params.o_head_stride = problem.o_strides.head;
  params.batch = static_cast<int>(problem.batch);
  params.heads_q = static_cast<int>(problem.heads_q);
  params.heads_kv = static_cast<int>(problem.heads_kv);
  params.group_size = static_cast<int>(problem.group_size());
  params.seqlen_q = static_cast<int>(problem.seqlen_q);
  params.seqlen_k = static_cast<int>(problem.seqlen_k);
  params.scale = problem.scale();
  params.scale_log2 = params.scale * 1.4426950408889634f;  // log2(e): the kernels use exp2
  return params;
}

}  // namespace flashjit
