// The kernels' one parameter block, filled from a problem and its pointers: shared by every
// backend, so the layout in templates/attention_params.h is filled in one place.
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "templates/attention_params.h"

namespace flashjit {

// What every GPU launch checks before enqueueing (the HIP backend; the CUDA backend has the same
// checks inline): a valid problem with the kernel's compiled-in signature, q, k, v, o non-null
// and 16-byte aligned (the kernels move 16- and 8-byte vectors), lse 4-byte aligned or null,
// sizes that fit the parameter block's 32-bit fields.
inline Status check_attention_launch(const AttentionProblem& problem, const AttentionArgs& args,
                                     const ProblemSignature& kernel_signature) {
  FLASHJIT_TRY(validate(problem));
  auto signature_text = [](const ProblemSignature& s) {
    std::string text = "d";
    text += std::to_string(s.head_dim);
    text += " ";
    text += to_string(s.dtype);
    text += s.causal ? " causal" : " non-causal";
    return text;
  };
  if (!(ProblemSignature::of(problem) == kernel_signature)) {
    return make_error(ErrorCode::InvalidArgument,
                      "problem signature " + signature_text(ProblemSignature::of(problem)) +
                          " does not match the kernel's " + signature_text(kernel_signature));
  }
  auto pointer_text = [](const void* pointer) {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(pointer));
    return std::string(buffer);
  };
  for (const auto& [name, pointer] : {std::pair<const char*, const void*>{"q", args.q},
                                      {"k", args.k},
                                      {"v", args.v},
                                      {"o", args.o}}) {
    if (pointer == nullptr) {
      return make_error(ErrorCode::InvalidArgument,
                        std::string(name) + " is null: q, k, v and o must be device pointers");
    }
    if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) {
      return make_error(
          ErrorCode::InvalidArgument,
          std::string(name) + " = " + pointer_text(pointer) + ": must be 16-byte aligned");
    }
  }
  if (reinterpret_cast<uintptr_t>(args.lse) % alignof(float) != 0) {
    return make_error(ErrorCode::InvalidArgument,
                      "lse = " + pointer_text(args.lse) + ": must be 4-byte aligned (or null)");
  }
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"batch", problem.batch},
                                    {"heads_q", problem.heads_q},
                                    {"heads_kv", problem.heads_kv},
                                    {"seqlen_q", problem.seqlen_q},
                                    {"seqlen_k", problem.seqlen_k}}) {
    if (value > INT32_MAX) {
      return make_error(
          ErrorCode::InvalidArgument,
          std::string(name) + " = " + std::to_string(value) + ": must be at most 2147483647");
    }
  }
  return ok_status();
}

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
