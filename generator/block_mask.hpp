// The block map of a mask_mod (issue 31): per (query tile, key tile) of a config's block_m x
// block_n whether the tile is empty, partial or full (FlashjitBlockMask,
// templates/attention_params.h), so that the CUDA kernels visit only the non-empty key tiles of a
// query tile (and, in the backward's dK/dV order, the non-empty query tiles of a key tile) and
// skip the per-element mask in the full ones. Pure: the shape and byte layout of a map, which
// kernels read one, and the source of the generated kernels that build it on the device
// (templates/cuda/block_mask.cuh); runtime/cuda/block_mask.hpp compiles and launches them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "generator/config.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"

namespace flashjit {

// Entry points of the rendered builder, launched in this order.
inline constexpr const char* kBlockMaskStatesEntry = "flashjit_block_mask_states";
inline constexpr const char* kBlockMaskListsEntry = "flashjit_block_mask_lists";
// The builder's block (templates/cuda/block_mask.cuh: kBlockMaskThreads, kBlockMaskWarps).
inline constexpr int kBlockMaskThreads = 128;
inline constexpr int kBlockMaskWarps = 4;

// Whether an identifier of the expression is `batch` or `head`: then the map is per (batch,
// head); else one map serves every batch entry and head.
bool mask_mod_uses_batch_or_head(const std::string& expression);

// The shape of one problem's map at a tile size, and its byte layout in one device buffer:
// q_count, q_list, k_count, k_list (int32), then the states (bytes), each 256-byte aligned.
struct BlockMaskShape {
  int64_t seqlen_q = 0, seqlen_k = 0;
  int64_t batch = 1, heads_q = 1;
  int block_m = 0, block_n = 0;
  bool per_head = false;

  int64_t q_tiles() const { return (seqlen_q + block_m - 1) / block_m; }
  int64_t k_tiles() const { return (seqlen_k + block_n - 1) / block_n; }
  int64_t maps() const { return per_head ? batch * heads_q : 1; }
  size_t q_count_offset() const { return 0; }
  size_t q_list_offset() const;
  size_t k_count_offset() const;
  size_t k_list_offset() const;
  size_t states_offset() const;
  size_t bytes() const;
  // "q 8192 k 8192 m128 n128 (one map)" / "... (per batch, head: 32 maps)"
  std::string to_string() const;
  bool operator==(const BlockMaskShape&) const = default;
};

// The map `problem` needs at `block_m` x `block_n` (per_head from its mask_mod; batch and heads_q
// 1 without: one map for any).
BlockMaskShape block_mask_shape(const AttentionProblem& problem, int block_m, int block_n);

// What decides a map's contents besides its shape: the causal flag, the window, the prefix and
// the mask_mod (its text), e.g. "causal window(-1,-1) prefix0 mask_mod:(q_idx / 2048) == ...".
// Two problems with equal keys and shapes have equal maps.
std::string block_mask_key(const AttentionProblem& problem);

// Whether the kernel of `config` for `problem` reads a block map: a CUDA family that takes one
// (the mma and -ws forwards, the mma and wgmma backwards; the wgmma forward refuses mask_mods,
// generator/config.cpp; the -ws backward runs plain attention only), a problem with a mask_mod, not
// packed documents (their maps would be per document). Such a kernel's entries take the map as a
// second parameter (KernelSource::block_mask); every other kernel is rendered exactly as before.
bool block_mask_applies(const AttentionProblem& problem, const AttentionConfig& config);

// The builder's source for `problem` (any pass; it needs a mask_mod): attention_params.h, the
// variant's prelude, attention_common.h and cuda/block_mask.cuh, and the two entries
// (kBlockMaskStatesEntry taking the params and the map, kBlockMaskListsEntry the map). One
// source serves every shape and tile size of the problem's block_mask_key.
Result<KernelSource> render_block_mask_builder(const AttentionProblem& problem);

}  // namespace flashjit
