// Problem shapes the kernel tests run over, shared by the CUDA and HIP GPU tests and the host
// emulation of the HIP kernels: a single row, ragged tails, seqlen_q != seqlen_k both ways
// (causal rows that see no key), GQA, MQA, batches, BHSD and padded strides.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "generator/problem.hpp"

namespace flashjit::testing {

enum class Storage {
  kBshd,        // contiguous [batch, seq, heads, d]
  kBshdPadded,  // BSHD with padding after each head and each sequence row, different per tensor
  kBhsd,        // contiguous [batch, heads, seq, d]
};

struct Shape {
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  Storage storage = Storage::kBshd;

  std::string to_string() const;  // "(b2 hq4 hkv2 sq150 sk190 bshd-padded)"
};

// The GPU tests' shapes (15, up to 4097 rows).
const std::vector<Shape>& gpu_test_shapes();
// Small shapes for the host emulation of the HIP kernels (9, up to 130 rows), covering the same
// cases.
const std::vector<Shape>& emulation_shapes();

// BSHD strides with `head_pad` elements after each head's row, `seq_pad` after each sequence row
// and `batch_pad` after each batch (all multiples of 8, as validate() requires).
Strides padded_bshd(int64_t seqlen, int64_t heads, int head_dim, int head_pad, int seq_pad,
                    int batch_pad);

// The problem of `shape` for `pass`. kBshdPadded pads every tensor differently (for the backward
// dO, dQ, dK and dV too), so that a kernel using one tensor's strides for another fails.
AttentionProblem make_test_problem(const Shape& shape, int head_dim, DType dtype, bool causal,
                                   Pass pass = Pass::Forward);

}  // namespace flashjit::testing
