// A host emulation of the AMD device primitives that the HIP templates (hip/attention_fwd.hpp,
// hip/attention_bwd.hpp, hip/decode.hpp, hip/tiles.hpp) are written against (the names of
// templates/hip/primitives.hpp), so that the HIP kernel bodies run on the CPU and their outputs
// are compared with the fp64 reference where no AMD GPU exists.
//
// Every thread of a workgroup is a coroutine (ucontext) on the calling thread. A wave's 64 lanes
// run one after another up to their next wave-wide operation (an MFMA or a lane shuffle); when all
// 64 have arrived at the same one, it is computed for the whole wave from the operands each lane
// left, as the hardware does, and the lanes go on. Workgroup barriers wait for every wave. Lanes
// that reach different wave-wide operations (divergence) or a barrier that not every thread
// reaches are reported as errors, not hangs.
//
// What this checks: the kernel's indexing, LDS layout and swizzles, the MFMA operand and result
// layouts as primitives.hpp documents them (AMD's matrix instruction calculator), masking, the
// online softmax, GQA, strides and LSE; for the backward also the workspace and the dQ atomics
// (plain adds here: one lane runs at a time, workgroups one after another); for decode the split
// counters (the last workgroup to count is the last one run; fences are no-ops). What it cannot
// check: that the hardware matches that documentation, the compiler, timing, and races between
// waves (or between workgroups' atomics) that this schedule happens to order (waves run in turn,
// alternating direction at each barrier). LDS starts as NaN bytes so that a read of anything not
// written first poisons the output.
//
// Include after templates/attention_params.h, before templates/attention_common.h,
// templates/hip/tiles.hpp and the kernel template.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "tuner/reference.hpp"

namespace flashjit::testing {

struct HipGrid {
  int x = 1, y = 1, z = 1;
};

// Runs `kernel` once per thread of every workgroup of `grid` (`threads` per workgroup, whole waves
// of 64), each workgroup with `lds_bytes` of LDS. Returns "" on success, else what went wrong.
// Not reentrant; one emulation at a time per thread.
std::string emulate_hip(HipGrid grid, int threads, int lds_bytes,
                        const std::function<void()>& kernel);

namespace hip_emulator {
// Used by the primitives below while emulate_hip runs.
int thread_index();
int block_index(int axis);  // 0: x, 1: y, 2: z
int grid_size_x();
unsigned char* lds();
void barrier();
float shuffle_xor(float value, int mask);
// D = A B + C of one 16x16x16 MFMA for the calling lane (see primitives.hpp for the layouts).
void mfma_16x16x16(bool bf16, const uint32_t a[2], const uint32_t b[2], const float c[4],
                   float d[4]);
}  // namespace hip_emulator

}  // namespace flashjit::testing

namespace flashjit_hip {

typedef std::uint16_t u16;
typedef std::uint32_t u32;
typedef std::uint64_t u64;
typedef float f32x4 __attribute__((vector_size(16)));

inline int thread_index() { return flashjit::testing::hip_emulator::thread_index(); }
inline int lane_index() { return thread_index() & 63; }
inline int block_index_x() { return flashjit::testing::hip_emulator::block_index(0); }
inline int block_index_y() { return flashjit::testing::hip_emulator::block_index(1); }
inline int block_index_z() { return flashjit::testing::hip_emulator::block_index(2); }
inline int grid_size_x() { return flashjit::testing::hip_emulator::grid_size_x(); }
inline unsigned char* lds_base() { return flashjit::testing::hip_emulator::lds(); }
inline void barrier() { flashjit::testing::hip_emulator::barrier(); }
inline float shuffle_xor(float value, int mask) {
  return flashjit::testing::hip_emulator::shuffle_xor(value, mask);
}

template <bool IS_BF16>
inline f32x4 mfma_16x16x16(u32 a_lo, u32 a_hi, u32 b_lo, u32 b_hi, f32x4 c) {
  const uint32_t a[2] = {a_lo, a_hi};
  const uint32_t b[2] = {b_lo, b_hi};
  const float c_in[4] = {c[0], c[1], c[2], c[3]};
  float d[4];
  flashjit::testing::hip_emulator::mfma_16x16x16(IS_BF16, a, b, c_in, d);
  return f32x4{d[0], d[1], d[2], d[3]};
}

// Lanes run one at a time, so an atomic add is a plain one.
inline void atomic_add(float* address, float value) { *address += value; }
inline int atomic_fetch_add(int* address, int value) {
  const int old_value = *address;
  *address += value;
  return old_value;
}
// Workgroups run one after another, and lanes one at a time: every write is seen by later reads.
inline void memory_fence() {}

template <bool IS_BF16>
inline float to_float(u16 bits) {
  return IS_BF16 ? flashjit::bf16_to_float(bits) : flashjit::fp16_to_float(bits);
}

inline float fast_exp2(float x) { return std::exp2(x); }
inline float fast_log2(float x) { return std::log2(x); }

template <bool IS_BF16>
inline u32 pack2(float low, float high) {
  const u32 lo = IS_BF16 ? flashjit::float_to_bf16(low) : flashjit::float_to_fp16(low);
  const u32 hi = IS_BF16 ? flashjit::float_to_bf16(high) : flashjit::float_to_fp16(high);
  return lo | (hi << 16);
}

}  // namespace flashjit_hip
