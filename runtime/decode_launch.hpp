// One call of a decode-family kernel (generator/decode_config.hpp), as every backend does it:
// the split count, the workspace of the partial results, the argument checks, the params and the
// launch shapes of generator/render_decode.hpp's contract. Nothing here depends on the device
// lengths (seqlens_k, block tables): a call's grids and workspace follow from the problem alone,
// so a captured CUDA graph can be replayed with new lengths and block tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "generator/config.hpp"
#include "generator/decode_config.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "runtime/backend.hpp"
#include "runtime/launch_params.hpp"
#include "runtime/workspace.hpp"
#include "templates/attention_params.h"

namespace flashjit {

// The fp32 partial results of a call with `splits` > 1, carved from one buffer:
//   partial_o   [splits, rows, head_dim]   rows = batch * heads_q * seqlen_q
//   partial_lse [splits, rows]             (kWorkspaceAlign-aligned after partial_o)
//   counters    int32 [tile_groups]        right after partial_lse (where the GPU kernel finds
//                                          them): the split counters of the fused combine
//                                          (templates/cuda/decode.cuh), one per (batch, kv head,
//                                          row tile); zero before a launch, zero after it
// bytes = 0 when splits == 1 (the split kernel writes o and lse itself). tile_groups = 0: no
// counters (the CPU combines in work items of its own).
struct DecodeWorkspace {
  int splits = 1;
  int64_t rows = 0;
  size_t partial_o_offset = 0, partial_lse_offset = 0, counters_offset = 0, counter_bytes = 0;
  size_t bytes = 0;
};

inline DecodeWorkspace decode_workspace(const AttentionProblem& problem, int splits,
                                        int64_t tile_groups = 0) {
  DecodeWorkspace w;
  w.splits = splits;
  w.rows = problem.batch * problem.heads_q * problem.seqlen_q;
  if (splits <= 1) return w;
  auto align = [](size_t bytes) {
    return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  };
  const size_t partials = static_cast<size_t>(splits) * static_cast<size_t>(w.rows);
  w.partial_lse_offset = align(partials * static_cast<size_t>(problem.head_dim) * sizeof(float));
  w.counters_offset = w.partial_lse_offset + partials * sizeof(float);
  w.counter_bytes = static_cast<size_t>(tile_groups) * sizeof(int32_t);
  w.bytes = w.counters_offset + w.counter_bytes;
  return w;
}

// The GPU kernels' workspace: with a split counter per (batch, kv head, row tile).
inline DecodeWorkspace gpu_decode_workspace(const AttentionProblem& problem,
                                            const AttentionConfig& config, int splits) {
  return decode_workspace(problem, splits,
                          decode_row_tiles(config, problem) * problem.heads_kv * problem.batch);
}

// check_attention_launch (the forward's pointers and sizes) plus the decode family's own: the
// block table (paged) and seqlens_k (when the problem says so) non-null and 4-byte aligned, a
// caller's workspace large enough and aligned when partials are needed.
inline Status check_decode_launch(const AttentionProblem& problem, const AttentionArgs& args,
                                  const ProblemSignature& signature, size_t pointer_alignment,
                                  const DecodeWorkspace& workspace) {
  FLASHJIT_TRY(check_attention_launch(problem, args, signature, pointer_alignment));
  auto check_int32 = [](const char* name, const int32_t* pointer, const char* what) -> Status {
    if (pointer == nullptr)
      return make_error(ErrorCode::InvalidArgument, std::string(name) + " is null: " + what);
    if (reinterpret_cast<uintptr_t>(pointer) % alignof(int32_t) != 0)
      return make_error(ErrorCode::InvalidArgument, std::string(name) + ": must be 4-byte aligned");
    return ok_status();
  };
  if (problem.kv.paged()) {
    FLASHJIT_TRY(check_int32("block_table", args.block_table,
                             "a paged K/V cache needs its int32 block table [batch, max_pages]"));
  }
  if (problem.kv.seqlens_k) {
    FLASHJIT_TRY(check_int32("seqlens_k", args.seqlens_k,
                             "the problem counts keys per sequence (int32 [batch])"));
  }
  if (workspace.bytes > 0 && args.workspace != nullptr) {
    if (args.workspace_bytes < workspace.bytes) {
      return make_error(ErrorCode::InvalidArgument,
                        "workspace_bytes = " + std::to_string(args.workspace_bytes) +
                            ": this decode call (" + std::to_string(workspace.splits) +
                            " splits) needs at least " + std::to_string(workspace.bytes) +
                            " (Kernel::workspace_bytes)");
    }
    if (reinterpret_cast<uintptr_t>(args.workspace) % kWorkspaceAlign != 0) {
      return make_error(ErrorCode::InvalidArgument,
                        "workspace: must be " + std::to_string(kWorkspaceAlign) + "-byte aligned");
    }
  }
  return ok_status();
}

// The decode fields of the params: the cache layout, lengths, the split count and the partials
// (`workspace` may be null when splits == 1).
inline void bind_decode(FlashjitAttentionParams& params, const AttentionProblem& problem,
                        const AttentionArgs& args, const DecodeWorkspace& layout, void* workspace) {
  params.block_table = problem.kv.paged() ? args.block_table : nullptr;
  params.seqlens_k = problem.kv.seqlens_k ? args.seqlens_k : nullptr;
  params.block_table_stride = problem.kv.max_pages;
  params.page_size = problem.kv.page_size;
  params.num_splits = layout.splits;
  auto* base = static_cast<unsigned char*>(workspace);
  params.partial_o =
      layout.bytes > 0 ? reinterpret_cast<float*>(base + layout.partial_o_offset) : nullptr;
  params.partial_lse =
      layout.bytes > 0 ? reinterpret_cast<float*>(base + layout.partial_lse_offset) : nullptr;
}

// The GPU launch of a call (render_decode.hpp's contract): the split kernel over (splits x row
// tiles, heads_kv, batch), which also combines the splits.
struct DecodeLaunch {
  DecodeWorkspace workspace;
  LaunchShape split;
};

inline DecodeLaunch decode_launch(const AttentionProblem& problem, const AttentionConfig& config,
                                  int splits, KernelShape split_block) {
  DecodeLaunch launch;
  launch.workspace = gpu_decode_workspace(problem, config, splits);
  launch.split =
      row_blocks_launch("group_size * seqlen_q", decode_packed_rows(problem), config.block_m,
                        "heads_kv", problem.heads_kv, problem.batch, split_block);
  launch.split.grid_x = decode_row_tiles(config, problem) * splits;
  return launch;
}

// One call of a loaded GPU decode kernel whose entry has `shapes[0]`: the checks, the grid
// within `limits`, the partials' workspace (args.workspace, else `cache`'s buffer for `stream`:
// the first call of a size allocates, so warm a kernel up before capturing it in a CUDA graph, or
// pass a workspace), zero(pointer, bytes) of the split counters unless they are known to be zero
// (the cache's buffer with the previous call's counter region: every call leaves its counters
// zero; a caller's workspace is zeroed every call), then enqueue(0, shape, params). `before`
// (optional): enqueued once the checks passed, before anything else (the table check kernel).
template <class Enqueue, class Zero, class Before = std::nullptr_t>
Status launch_gpu_decode(const AttentionProblem& problem, const AttentionArgs& args,
                         const ProblemSignature& signature, const AttentionConfig& config,
                         int splits, const std::vector<KernelShape>& shapes,
                         const GridLimits& limits, WorkspaceCache& cache, void* stream,
                         const Enqueue& enqueue, const Zero& zero, const Before& before = nullptr) {
  if (shapes.size() != 1) {
    return make_error(ErrorCode::InvalidArgument,
                      std::to_string(shapes.size()) + " entry shapes for a decode kernel (1)");
  }
  const DecodeLaunch launch = decode_launch(problem, config, splits, shapes[0]);
  const DecodeWorkspace& layout = launch.workspace;
  FLASHJIT_TRY(check_decode_launch(problem, args, signature, 16, layout));
  FLASHJIT_TRY(check_launch_shape(launch.split, limits));
  if constexpr (!std::is_same_v<Before, std::nullptr_t>) FLASHJIT_TRY(before());
  FlashjitAttentionParams params = make_launch_params(problem, args);
  void* workspace = args.workspace;
  const bool cached = layout.bytes > 0 && workspace == nullptr;
  if (cached) {
    Result<void*> buffer = cache.get(layout.bytes, stream);
    if (!buffer.ok()) return buffer.error();
    workspace = buffer.value();
  }
  bind_decode(params, problem, args, layout, workspace);
  if (layout.counter_bytes > 0) {
    void* counters = static_cast<unsigned char*>(workspace) + layout.counters_offset;
    if (!cached || !cache.same_region_as_last(stream, counters, layout.counter_bytes))
      FLASHJIT_TRY(zero(counters, layout.counter_bytes));
  }
  FLASHJIT_TRY(enqueue(size_t{0}, launch.split, params));
  if (cached && layout.counter_bytes > 0) {
    cache.remember_region(stream, static_cast<unsigned char*>(workspace) + layout.counters_offset,
                          layout.counter_bytes);
  }
  return ok_status();
}

}  // namespace flashjit
