// What a TMA tile box looks like in shared memory, computed on the host from a tensor map's
// description (runtime/tensor_map_spec.hpp): the one statement of the box layout that both the
// hardware probe (tests/runtime/cuda/tma_probe_test.cpp, on an H100) and the emulator's self-test
// (tests/templates/cuda_fwd_ws_emulation_test.cpp) check against.
//
// A box of box[0] (64) columns x box[1] rows of 2-byte elements at coordinates c lands row after
// row, 128 bytes a row, with the 128-byte swizzle on the shared address: the 16-byte chunk j of
// row r is stored at chunk j ^ (r % 8) (the destination is 1024-byte aligned). Elements outside
// the tensor are zero.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/tensor_map_spec.hpp"

namespace flashjit::testing {

// The box's shared-memory image, as 16-bit words (box[0] * box[1] * box[2] * box[3] of them), for
// the tensor whose element (0, 0, 0, 0) is `tensor` (the map's strides address it).
std::vector<uint16_t> tma_box_image(const TensorMapSpec& spec, const int (&coords)[4],
                                    const uint16_t* tensor);

// The probes' tensor: [batch 2, seq 100, heads 3, d 96] BSHD bf16 with padding after each head
// row (8 elements), sequence row (16) and batch (8), at `base` (kTmaProbeElements elements): the
// head dim is not a multiple of 64 (a box at column 64 is half outside) and no stride is the
// dense one. Boxes of 64 columns x `box_rows` rows.
inline constexpr size_t kTmaProbeElements = 2 * (100 * (3 * 104 + 16) + 8);
TensorMapSpec tma_probe_spec(const void* base, int box_rows);

// The word index in a box image of element (row, col) of a 64-column box (2-D boxes).
inline int tma_box_index(int row, int col) {
  return row * 64 + (((col / 8) ^ (row % 8)) * 8) + col % 8;
}

}  // namespace flashjit::testing
