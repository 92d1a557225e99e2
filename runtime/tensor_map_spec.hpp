// The TMA tensor maps of a -ws forward launch (templates/cuda/ws/), described without the driver:
// what runtime/cuda/tensor_maps.cpp encodes with cuTensorMapEncodeTiled, and what the host
// emulation (tests/support/sm90_emulator.hpp) reads. One description, so that both see the same
// dimensions, strides and boxes.
//
// Each of q, k, v, o is a 4-D tensor (innermost first): head_dim x seqlen x heads x batch, with
// the problem's element strides in bytes. A box is 64 columns (128 bytes: the 128-byte swizzle
// span, one 64-column block of the kernel's tiles) by `rows` rows of one head of one batch; the
// kernel loads (stores) a tile as padded_head_dim / 64 boxes at column offsets 0, 64, ...
//   q  box rows = block_m (one load per column block fills the whole Q tile)
//   k, v  box rows = block_n
//   o  box rows = 64 (each consumer warpgroup stores its own 64 rows)
// Elements outside the tensor (rows past seqlen, columns past head_dim) are zero-filled by loads
// and skipped by stores; a load counts the whole box's bytes on its mbarrier either way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "generator/config.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "templates/attention_params.h"

namespace flashjit {

// Every map: 4 dimensions, no interleave, 128-byte swizzle, L2 promotion 256 B, zero OOB fill.
inline constexpr int kTensorMapBoxColumns = 64;
inline constexpr int kTensorMapOutputRows = 64;

struct TensorMapSpec {
  const char* tensor = "";         // "q", "k", "v" or "o", for messages
  const void* base = nullptr;      // global address of element (0, 0, 0, 0)
  DType dtype = DType::BF16;       // bf16 or f16 (2-byte elements)
  uint64_t dims[4] = {};           // head_dim, seqlen, heads, batch
  uint64_t strides_bytes[3] = {};  // of dims 1..3: the seq, head and batch strides in bytes
  uint32_t box[4] = {};            // kTensorMapBoxColumns, rows, 1, 1
};

struct ForwardTensorMapSpecs {
  TensorMapSpec q, k, v, o;
};

// The driver's documented limits: dims in [1, 2^32], strides multiples of 16 below 2^40 bytes,
// box dims in [1, 256] with the inner one 16..128 bytes, a 16-byte aligned base. Error
// InvalidArgument naming the tensor, the axis and the value.
inline Status check_tensor_map_spec(const TensorMapSpec& s) {
  static const char* const kAxes[4] = {"head_dim", "seq", "head", "batch"};
  auto bad = [&](const std::string& what) {
    return Status(make_error(ErrorCode::InvalidArgument,
                             std::string("TMA tensor map of ") + s.tensor + ": " + what));
  };
  if (reinterpret_cast<uintptr_t>(s.base) % 16 != 0 || s.base == nullptr)
    return bad("the base address must be non-null and 16-byte aligned");
  for (int i = 0; i < 4; ++i)
    if (s.dims[i] < 1 || s.dims[i] > (uint64_t{1} << 32))
      return bad(std::string(kAxes[i]) + " extent " + std::to_string(s.dims[i]) +
                 " outside [1, 2^32]");
  for (int i = 0; i < 3; ++i)
    if (s.strides_bytes[i] % 16 != 0 || s.strides_bytes[i] >= (uint64_t{1} << 40))
      return bad(std::string(kAxes[i + 1]) + " stride " + std::to_string(s.strides_bytes[i]) +
                 " bytes: must be a multiple of 16 below 2^40");
  for (int i = 0; i < 4; ++i)
    if (s.box[i] < 1 || s.box[i] > 256)
      return bad("box " + std::to_string(s.box[i]) + " along " + kAxes[i] + " outside [1, 256]");
  if (s.box[0] * 2 % 16 != 0 || s.box[0] * 2 > 128)
    return bad("the box's inner extent must be 16..128 bytes (the 128-byte swizzle span)");
  return ok_status();
}

// The maps of a -ws forward launch of `problem` with `params` (make_launch_params) for a kernel
// of `config`. An axis of extent 1 gets a stride the driver accepts whatever the caller's (its
// coordinate is always 0). Packed documents (Variant::varlen): one batch entry of total_q (q, o)
// and total_k (k, v) rows; the kernel places each document at its first row (cu_seqlens), and
// only rows past the totals are outside the tensors. Error as check_tensor_map_spec.
// The maps of a ws backward launch (templates/cuda/ws/attention_bwd_ws.cuh): q, k, v as the
// forward's (q box rows = block_m, k and v = block_n) and dO in the `o` slot with box rows =
// block_m (the kernel loads it as it loads Q). Plain attention only (the family's budget).
inline Result<ForwardTensorMapSpecs> backward_tensor_map_specs(
    const FlashjitAttentionParams& params, const AttentionProblem& problem,
    const AttentionConfig& config);

inline Result<ForwardTensorMapSpecs> forward_tensor_map_specs(const FlashjitAttentionParams& params,
                                                              const AttentionProblem& problem,
                                                              const AttentionConfig& config) {
  const bool packed = problem.variant.varlen;
  const int64_t batch = packed ? 1 : params.batch;
  auto make = [&](const char* tensor, const void* base, int64_t seqlen, int64_t heads,
                  long long seq_stride, long long head_stride, long long batch_stride,
                  int box_rows) {
    TensorMapSpec s;
    s.tensor = tensor;
    s.base = base;
    s.dtype = problem.dtype;
    const int64_t extents[3] = {seqlen, heads, batch};
    const long long strides[3] = {seq_stride, head_stride, batch_stride};
    s.dims[0] = static_cast<uint64_t>(problem.head_dim);
    // For an axis of extent 1 any stride addresses the same elements: use the largest of the
    // others (a multiple of 16 bytes, as validate() makes every stride one).
    uint64_t largest = 16;
    for (int i = 0; i < 3; ++i)
      if (extents[i] > 1 && strides[i] > 0)
        largest = std::max<uint64_t>(largest, static_cast<uint64_t>(strides[i]) * 2);
    for (int i = 0; i < 3; ++i) {
      s.dims[i + 1] = static_cast<uint64_t>(extents[i]);
      s.strides_bytes[i] =
          extents[i] == 1 ? largest : static_cast<uint64_t>(std::max(strides[i], 0ll)) * 2;
    }
    s.box[0] = kTensorMapBoxColumns;
    s.box[1] = static_cast<uint32_t>(box_rows);
    s.box[2] = s.box[3] = 1;
    return s;
  };
  const int64_t rows_q = packed ? problem.variant.total_q : params.seqlen_q;
  const int64_t rows_k = packed ? problem.variant.total_k : params.seqlen_k;
  ForwardTensorMapSpecs specs;
  specs.q = make("q", params.q, rows_q, params.heads_q, params.q_seq_stride, params.q_head_stride,
                 params.q_batch_stride, config.block_m);
  specs.k = make("k", params.k, rows_k, params.heads_kv, params.k_seq_stride, params.k_head_stride,
                 params.k_batch_stride, config.block_n);
  specs.v = make("v", params.v, rows_k, params.heads_kv, params.v_seq_stride, params.v_head_stride,
                 params.v_batch_stride, config.block_n);
  specs.o = make("o", params.o, rows_q, params.heads_q, params.o_seq_stride, params.o_head_stride,
                 params.o_batch_stride, kTensorMapOutputRows);
  for (const TensorMapSpec* s : {&specs.q, &specs.k, &specs.v, &specs.o})
    FLASHJIT_TRY(check_tensor_map_spec(*s));
  return specs;
}

inline Result<ForwardTensorMapSpecs> backward_tensor_map_specs(
    const FlashjitAttentionParams& params, const AttentionProblem& problem,
    const AttentionConfig& config) {
  // The forward's maps of a problem whose `o` is dO (its strides and box rows of block_m).
  FlashjitAttentionParams as_forward = params;
  as_forward.o = const_cast<void*>(params.d_o);
  as_forward.o_seq_stride = params.do_seq_stride;
  as_forward.o_head_stride = params.do_head_stride;
  as_forward.o_batch_stride = params.do_batch_stride;
  Result<ForwardTensorMapSpecs> specs = forward_tensor_map_specs(as_forward, problem, config);
  if (!specs.ok()) return specs;
  specs->o.tensor = "do";
  specs->o.box[1] = static_cast<uint32_t>(config.block_m);
  FLASHJIT_TRY(check_tensor_map_spec(specs->o));
  return specs;
}

}  // namespace flashjit
