// The kernels' one parameter block, filled from a problem and its pointers: shared by every
// backend, so the layout in templates/attention_params.h is filled in one place.
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "generator/config.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "runtime/backend.hpp"
#include "templates/attention_params.h"

namespace flashjit {

// The fp32 workspace of a backward launch, carved from one buffer (AttentionArgs::workspace or
// the kernel's own): delta and lse_log2 always, the dQ accumulator for DqMode::Atomic
// (`dq_accum_copies` of it one after the other: the CPU's key-block splits; 1 on the GPU). Rows
// are padded to a multiple of kBackwardRowAlign, the head dim of the accumulator to a multiple
// of 64: [batch, heads_q, seqlen_q_rounded] rows.
//
// Packed documents (problem.variant.varlen) on the GPU (`packed_documents`): the rows are packed
// by total_q instead of [num_docs, heads_q, round(max_seqlen_q)]: per query head
// seqlen_q_rounded = round(total_q) + kBackwardRowAlign * num_docs rows, document b's starting
// at document_workspace_row(cu_seqlens_q[b], b) (FlashAttention-2's varlen layout: aligned, with
// room for its rows rounded up; templates/attention_variant.h, document_tile_view, points the
// kernels' [doc, head, row] index there). The CPU backend keeps the per-document rows.
inline constexpr int64_t kBackwardRowAlign = 128;
inline constexpr size_t kWorkspaceAlign = 256;

inline int64_t round_to_row_blocks(int64_t rows) {
  return (rows + kBackwardRowAlign - 1) / kBackwardRowAlign * kBackwardRowAlign;
}

// Packed documents: the first workspace row (within each head's) of document `doc` whose queries
// start at packed row `cu_seqlens_q_doc`.
inline int64_t document_workspace_row(int64_t cu_seqlens_q_doc, int64_t doc) {
  return (cu_seqlens_q_doc + kBackwardRowAlign * doc) / kBackwardRowAlign * kBackwardRowAlign;
}

struct BackwardWorkspace {
  int64_t seqlen_q_rounded = 0;  // rows per (batch entry, head); packed documents: per head
  bool packed_documents = false;
  size_t delta_offset = 0, lse_offset = 0, dq_accum_offset = 0;  // bytes from the start
  size_t bytes = 0;                                              // total; 0 for the forward
  bool has_dq_accum = false;
  int dq_accum_copies = 0;  // 0 without a dQ accumulator

  // The row of (batch entry b, head h, row i): packed documents, `cu_seqlens_q` (host) places
  // document b.
  int64_t row(const AttentionProblem& p, const int32_t* cu_seqlens_q, int64_t b, int64_t h,
              int64_t i) const {
    if (packed_documents)
      return h * seqlen_q_rounded + document_workspace_row(cu_seqlens_q[b], b) + i;
    return (b * p.heads_q + h) * seqlen_q_rounded + i;
  }
};

inline BackwardWorkspace backward_workspace(const AttentionProblem& problem,
                                            const AttentionConfig& config, int dq_accum_copies = 1,
                                            bool packed_documents = true) {
  BackwardWorkspace w;
  if (!problem.is_backward()) return w;
  auto align = [](size_t bytes) {
    return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  };
  w.packed_documents = packed_documents && problem.variant.varlen;
  w.seqlen_q_rounded = w.packed_documents ? round_to_row_blocks(problem.variant.total_q) +
                                                kBackwardRowAlign * problem.batch
                                          : round_to_row_blocks(problem.seqlen_q);
  const size_t rows = static_cast<size_t>((w.packed_documents ? 1 : problem.batch) *
                                          problem.heads_q * w.seqlen_q_rounded);
  w.delta_offset = 0;
  w.lse_offset = align(rows * sizeof(float));
  w.dq_accum_offset = w.lse_offset + align(rows * sizeof(float));
  w.has_dq_accum = config.dq == DqMode::Atomic;
  w.dq_accum_copies = w.has_dq_accum ? dq_accum_copies : 0;
  w.bytes = w.dq_accum_offset + static_cast<size_t>(w.dq_accum_copies) * rows *
                                    static_cast<size_t>(padded_head_dim(problem.head_dim)) *
                                    sizeof(float);
  return w;
}

// What every GPU launch checks before enqueueing (CUDA and HIP): a valid problem with the
// kernel's compiled-in signature, the call's pointers non-null and 16-byte aligned (the kernels
// move 16- and 8-byte vectors), lse 4-byte aligned (or null, forward only), sizes that fit the
// parameter block's 32-bit fields; for the backward pass a given workspace large enough and
// 256-byte aligned.
inline Status check_attention_launch(const AttentionProblem& problem, const AttentionArgs& args,
                                     const ProblemSignature& kernel_signature,
                                     size_t pointer_alignment = 16, size_t workspace_needed = 0) {
  FLASHJIT_TRY(validate(problem));
  if (!(ProblemSignature::of(problem) == kernel_signature)) {
    return make_error(ErrorCode::InvalidArgument,
                      "problem signature " + ProblemSignature::of(problem).to_string() +
                          " does not match the kernel's " + kernel_signature.to_string());
  }
  auto pointer_text = [](const void* pointer) {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(pointer));
    return std::string(buffer);
  };
  const bool backward = problem.is_backward();
  std::vector<std::pair<const char*, const void*>> pointers = {
      {"q", args.q}, {"k", args.k}, {"v", args.v}, {"o", args.o}};
  if (backward) {
    pointers.insert(pointers.end(),
                    {{"do", args.d_o}, {"dq", args.dq}, {"dk", args.dk}, {"dv", args.dv}});
  }
  for (const auto& [name, pointer] : pointers) {
    if (pointer == nullptr) {
      return make_error(ErrorCode::InvalidArgument,
                        std::string(name) + " is null: " +
                            (backward ? "q, k, v, o, do, dq, dk and dv" : "q, k, v and o") +
                            " must be device pointers");
    }
    if (reinterpret_cast<uintptr_t>(pointer) % pointer_alignment != 0) {
      return make_error(ErrorCode::InvalidArgument,
                        std::string(name) + " = " + pointer_text(pointer) + ": must be " +
                            std::to_string(pointer_alignment) + "-byte aligned");
    }
  }
  if (backward && args.lse == nullptr) {
    return make_error(ErrorCode::InvalidArgument,
                      "lse is null: the backward pass needs the forward's log-sum-exp "
                      "([batch, heads_q, seqlen_q] fp32, from a forward call with lse)");
  }
  if (problem.variant.alibi &&
      (args.alibi_slopes == nullptr ||
       reinterpret_cast<uintptr_t>(args.alibi_slopes) % alignof(float) != 0)) {
    return make_error(
        ErrorCode::InvalidArgument,
        "alibi_slopes = " + pointer_text(args.alibi_slopes) +
            ": an ALiBi problem needs the fp32 slope of each query head ([heads_q] = " +
            std::to_string(problem.heads_q) + "), a 4-byte aligned device pointer");
  }
  if (problem.variant.varlen)
    for (const auto& [name, cu] :
         {std::pair<const char*, const int32_t*>{"cu_seqlens_q", args.cu_seqlens_q},
          {"cu_seqlens_k", args.cu_seqlens_k}})
      if (cu == nullptr || reinterpret_cast<uintptr_t>(cu) % alignof(int32_t) != 0)
        return make_error(ErrorCode::InvalidArgument,
                          std::string(name) + " = " + pointer_text(cu) +
                              ": packed variable-length documents need the int32 row offsets "
                              "of each document ([num_docs + 1] = " +
                              std::to_string(problem.batch + 1) +
                              "), a 4-byte aligned device pointer");
  if (reinterpret_cast<uintptr_t>(args.lse) % alignof(float) != 0) {
    return make_error(ErrorCode::InvalidArgument, "lse = " + pointer_text(args.lse) +
                                                      ": must be 4-byte aligned" +
                                                      (backward ? "" : " (or null)"));
  }
  if (backward && args.workspace != nullptr) {
    if (args.workspace_bytes < workspace_needed) {
      return make_error(ErrorCode::InvalidArgument,
                        "workspace_bytes = " + std::to_string(args.workspace_bytes) +
                            ": this backward call needs at least " +
                            std::to_string(workspace_needed) + " (Kernel::workspace_bytes)");
    }
    if (reinterpret_cast<uintptr_t>(args.workspace) % kWorkspaceAlign != 0) {
      return make_error(ErrorCode::InvalidArgument,
                        "workspace = " + pointer_text(args.workspace) + ": must be " +
                            std::to_string(kWorkspaceAlign) + "-byte aligned");
    }
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

// One tensor's pointer and strides into its params fields.
template <class Pointer>
inline void bind_tensor(Pointer& pointer, long long& batch_stride, long long& seq_stride,
                        long long& head_stride, Pointer value, const Strides& strides) {
  pointer = value;
  batch_stride = strides.batch;
  seq_stride = strides.seq;
  head_stride = strides.head;
}

// Assumes validate(problem) passed (sizes fit the int fields).
inline FlashjitAttentionParams make_launch_params(const AttentionProblem& problem,
                                                  const AttentionArgs& args) {
  FlashjitAttentionParams params{};
  bind_tensor(params.q, params.q_batch_stride, params.q_seq_stride, params.q_head_stride, args.q,
              problem.q_strides);
  bind_tensor(params.k, params.k_batch_stride, params.k_seq_stride, params.k_head_stride, args.k,
              problem.k_strides);
  bind_tensor(params.v, params.v_batch_stride, params.v_seq_stride, params.v_head_stride, args.v,
              problem.v_strides);
  bind_tensor(params.o, params.o_batch_stride, params.o_seq_stride, params.o_head_stride, args.o,
              problem.o_strides);
  params.lse = args.lse;
  params.batch = static_cast<int>(problem.batch);
  params.heads_q = static_cast<int>(problem.heads_q);
  params.heads_kv = static_cast<int>(problem.heads_kv);
  params.group_size = static_cast<int>(problem.group_size());
  params.seqlen_q = static_cast<int>(problem.seqlen_q);
  params.seqlen_k = static_cast<int>(problem.seqlen_k);
  params.scale = problem.scale();
  params.scale_log2 = params.scale * 1.4426950408889634f;  // log2(e): the kernels use exp2
  params.alibi_slopes = problem.variant.alibi ? args.alibi_slopes : nullptr;
  params.cu_seqlens_q = problem.variant.varlen ? args.cu_seqlens_q : nullptr;
  params.cu_seqlens_k = problem.variant.varlen ? args.cu_seqlens_k : nullptr;
  if (problem.is_backward()) {
    bind_tensor(params.d_o, params.do_batch_stride, params.do_seq_stride, params.do_head_stride,
                args.d_o, problem.do_strides);
    bind_tensor(params.dq, params.dq_batch_stride, params.dq_seq_stride, params.dq_head_stride,
                args.dq, problem.dq_strides);
    bind_tensor(params.dk, params.dk_batch_stride, params.dk_seq_stride, params.dk_head_stride,
                args.dk, problem.dk_strides);
    bind_tensor(params.dv, params.dv_batch_stride, params.dv_seq_stride, params.dv_head_stride,
                args.dv, problem.dv_strides);
  }
  return params;
}

// Points the backward fields of `params` into `workspace` (layout: backward_workspace).
inline void bind_workspace(FlashjitAttentionParams& params, const BackwardWorkspace& layout,
                           void* workspace) {
  auto* base = static_cast<unsigned char*>(workspace);
  params.delta = reinterpret_cast<float*>(base + layout.delta_offset);
  params.lse_log2 = reinterpret_cast<float*>(base + layout.lse_offset);
  params.dq_accum =
      layout.has_dq_accum ? reinterpret_cast<float*>(base + layout.dq_accum_offset) : nullptr;
  params.seqlen_q_rounded = static_cast<int>(layout.seqlen_q_rounded);
  params.dq_accum_splits = layout.dq_accum_copies;
}

// ---- launch shapes ------------------------------------------------------------------------------

// Grid and block of one kernel launch, and what the grid covers (for error messages): grid_x
// blocks of `rows_per_block` of the `rows` rows named `rows_name`, grid_y the `heads_name` heads,
// grid_z the batch.
struct LaunchShape {
  int64_t grid_x = 0, grid_y = 0, grid_z = 0;
  int threads = 0;
  int smem_bytes = 0;
  const char* rows_name = "seqlen_q";
  int64_t rows = 0;
  int64_t rows_per_block = 0;
  const char* heads_name = "heads_q";
  int64_t batch = 0;
};

// Blocks of `rows_per_block` rows over the heads and the batch.
inline LaunchShape row_blocks_launch(const char* rows_name, int64_t rows, int64_t rows_per_block,
                                     const char* heads_name, int64_t heads, int64_t batch,
                                     KernelShape block) {
  LaunchShape shape;
  shape.grid_x = (rows + rows_per_block - 1) / rows_per_block;
  shape.grid_y = heads;
  shape.grid_z = batch;
  shape.threads = block.threads;
  shape.smem_bytes = block.smem_bytes;
  shape.rows_name = rows_name;
  shape.rows = rows;
  shape.rows_per_block = rows_per_block;
  shape.heads_name = heads_name;
  shape.batch = batch;
  return shape;
}

// The forward's one launch: blocks of block_m query rows x heads_q x batch; a persistent kernel
// (block.persistent_ctas > 0) as many of those tiles as it has CTAs, at most, in grid x.
inline LaunchShape forward_launch(const AttentionProblem& problem, const AttentionConfig& config,
                                  KernelShape block) {
  LaunchShape shape = row_blocks_launch("seqlen_q", problem.seqlen_q, config.block_m, "heads_q",
                                        problem.heads_q, problem.batch, block);
  if (block.persistent_ctas > 0) {
    shape.grid_x =
        std::min<int64_t>(shape.grid_x * shape.grid_y * shape.grid_z, block.persistent_ctas);
    shape.grid_y = shape.grid_z = 1;
  }
  return shape;
}

// The launches of a backward call, in order (generator/render.hpp's contract), with the
// workspace they share: the row kernels over seqlen_q rounded up to kBackwardRowAlign, the dK/dV
// kernel over key blocks
// and kv heads, the dQ kernel (DqMode::Separate) over query blocks. Blocks from the family's
// BackwardShapes.
struct BackwardLaunch {
  BackwardWorkspace workspace;
  LaunchShape preprocess, dkdv, dq;
};

inline BackwardLaunch backward_launch(const AttentionProblem& problem,
                                      const AttentionConfig& config, const BackwardShapes& shapes) {
  BackwardLaunch launch;
  launch.workspace = backward_workspace(problem, config);
  // The row kernels: every row of each batch entry (document), padded.
  const int64_t rows = round_to_row_blocks(problem.seqlen_q);
  launch.preprocess = row_blocks_launch("seqlen_q", rows, kBackwardPreprocessRows, "heads_q",
                                        problem.heads_q, problem.batch, shapes.preprocess);
  launch.dkdv = row_blocks_launch("seqlen_k", problem.seqlen_k, config.block_n, "heads_kv",
                                  problem.heads_kv, problem.batch, shapes.dkdv);
  // A persistent dK/dV kernel (the ws family's "-persist"): at most one CTA per key tile, in x.
  if (shapes.dkdv.persistent_ctas > 0) {
    launch.dkdv.grid_x = std::min<int64_t>(
        launch.dkdv.grid_x * launch.dkdv.grid_y * launch.dkdv.grid_z, shapes.dkdv.persistent_ctas);
    launch.dkdv.grid_y = launch.dkdv.grid_z = 1;
  }
  launch.dq = config.dq == DqMode::Atomic
                  ? row_blocks_launch("seqlen_q", rows, kBackwardPreprocessRows, "heads_q",
                                      problem.heads_q, problem.batch, shapes.dq)
                  : row_blocks_launch("seqlen_q", problem.seqlen_q, config.block_m, "heads_q",
                                      problem.heads_q, problem.batch, shapes.dq);
  return launch;
}

// A backend's grid limits: blocks in x (and, where the hardware counts work-items rather than
// blocks, x blocks times threads), blocks in y and z.
struct GridLimits {
  const char* backend = "";  // "CUDA", "HIP": for messages
  int64_t max_x = 0;
  int64_t max_x_threads = 0;  // 0: no such limit
  int64_t max_yz = 0;
};

// Error InvalidArgument naming the problem size that makes `shape`'s grid exceed `limits`.
inline Status check_launch_shape(const LaunchShape& shape, const GridLimits& limits) {
  if (shape.grid_y > limits.max_yz) {
    return make_error(ErrorCode::InvalidArgument,
                      std::string(shape.heads_name) + " = " + std::to_string(shape.grid_y) +
                          ": must be at most " + std::to_string(limits.max_yz) + " (" +
                          limits.backend + " grid y)");
  }
  if (shape.grid_z > limits.max_yz) {
    return make_error(ErrorCode::InvalidArgument,
                      "batch = " + std::to_string(shape.batch) + ": must be at most " +
                          std::to_string(limits.max_yz) + " (" + limits.backend + " grid z)");
  }
  const bool too_many_blocks = shape.grid_x > limits.max_x;
  const bool too_many_threads =
      limits.max_x_threads > 0 && shape.grid_x * shape.threads > limits.max_x_threads;
  if (too_many_blocks || too_many_threads) {
    return make_error(ErrorCode::InvalidArgument,
                      std::string(shape.rows_name) + " = " + std::to_string(shape.rows) +
                          ": needs " + std::to_string(shape.grid_x) + " blocks of " +
                          std::to_string(shape.rows_per_block) + " rows (" +
                          std::to_string(shape.threads) + " threads each) in grid x; " +
                          limits.backend + " allows " +
                          (too_many_blocks ? std::to_string(limits.max_x) + " blocks"
                                           : std::to_string(limits.max_x_threads) + " work-items"));
  }
  return ok_status();
}

}  // namespace flashjit
