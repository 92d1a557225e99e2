// A host emulation of the CUDA device primitives the mma.sync templates are written against
// (templates/cuda/common.cuh's names, and the CUDA built-ins threadIdx, blockIdx, gridDim,
// __syncthreads, __syncwarp, __shfl_xor_sync), so that a template's kernel body (cuda/tiles.cuh,
// cuda/attention_fwd.cuh, cuda/attention_bwd_common.cuh, cuda/attention_bwd.cuh) runs on the CPU
// and its output is compared with the fp64 reference where no GPU exists.
//
// Every thread of a block is a coroutine (ucontext) on the calling thread. A warp's 32 lanes run
// one after another up to their next warp-wide operation (ldmatrix, mma.sync, a shuffle,
// __syncwarp); when all 32 have arrived at the same one, it is computed for the whole warp from
// the operands each lane left, with the fragment layouts of the PTX ISA (mma.m16n8k16 .row.col,
// ldmatrix .x4 with and without .trans), and the lanes go on. __syncthreads waits for every warp.
// Divergent warps and barriers that not every thread reaches are errors, not hangs.
//
// Shared memory is checked byte by byte: reading bytes nobody wrote, reading what a cp.async
// brought in before the issuing thread waited for its group, reading what another warp wrote
// (or a cp.async of another warp landed) without a __syncthreads in between, and writing or
// issuing a cp.async over bytes another warp read or wrote since the last __syncthreads are all
// errors. A cp.async lands only when its thread waits for its group (cp_async_wait), so a
// missing wait reads stale bytes. Global reads by cp.async and the dQ reductions must fall in a
// registered buffer (register_global). Shared memory starts as 0xFF bytes (NaN in fp16/bf16).
//
// What this checks: indexing, tile layouts and swizzles, the MMA and ldmatrix fragment layouts as
// the PTX ISA documents them, masking, the pipelines' waits and barriers under one schedule plus
// the race rules above. What it cannot check: the hardware, the compiler, timing, and memory
// accesses the templates make through plain C++ pointers (global loads and stores: the tests
// check those through guard regions and poisoned outputs).
//
// Include after templates/attention_params.h, before templates/attention_common.h and the
// kernel templates. Not reentrant; one emulation at a time per process.
#pragma once

#include <math.h>  // fmaf, fmaxf in the global namespace, as CUDA has them

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace flashjit::testing {

struct CudaGrid {
  int x = 1, y = 1, z = 1;
};

// Runs `kernel` once per thread of every block of `grid` (`threads` per block, whole warps),
// each block with `smem_bytes` of dynamic shared memory. Returns "" on success, else what went
// wrong (the first error, with the block).
std::string emulate_cuda(CudaGrid grid, int threads, int smem_bytes,
                         const std::function<void()>& kernel);

// Global memory a kernel may read with cp.async or reduce into: [begin, begin + bytes). Cleared
// by clear_globals(); checked during emulate_cuda.
void register_global(const void* begin, size_t bytes);
void clear_globals();

namespace cuda_emulator {
// Used by the primitives below while emulate_cuda runs.
unsigned char* shared_base();
void barrier();
void sync_warp();
float shuffle_xor(float value, int mask);
void ldmatrix(uint32_t (&r)[4], uint32_t address, bool transposed);
void mma(bool bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
void cp_async(uint32_t destination, const void* source, int source_bytes);
void cp_async_commit();
void cp_async_wait(int pending_groups);
void shared_read(uint32_t address, int bytes);   // race checks of a read of shared memory
void shared_write(uint32_t address, int bytes);  // ... and of a write
void reduce_add(float* address, float value);
float to_float(uint16_t bits, bool bf16);
uint16_t from_float(float value, bool bf16);
}  // namespace cuda_emulator

}  // namespace flashjit::testing

// ---- the CUDA built-ins the templates use ---------------------------------------------------

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __align__(n) alignas(n)
#define __grid_constant__

struct FlashjitEmulatedDim3 {
  unsigned x = 0, y = 0, z = 0;
};
// Set by the emulator for the lane it resumes.
inline FlashjitEmulatedDim3 threadIdx, blockIdx, gridDim;

inline void __syncthreads() { flashjit::testing::cuda_emulator::barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { flashjit::testing::cuda_emulator::sync_warp(); }
inline float __shfl_xor_sync(unsigned, float value, int mask) {
  return flashjit::testing::cuda_emulator::shuffle_xor(value, mask);
}
inline float __int_as_float(int bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
inline float __uint_as_float(unsigned bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
// Every thread of the emulation runs on one host thread, one at a time: these are trivially
// atomic, fences order nothing that is not ordered already, and there is no L1 to bypass.
inline int atomicAdd(int* address, int value) {
  const int old = *address;
  *address = old + value;
  return old;
}
inline void __threadfence() {}
inline float __ldcg(const float* address) { return *address; }
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// ---- templates/cuda/common.cuh, emulated -----------------------------------------------------

namespace flashjit_kernel {

typedef std::uint16_t u16;
typedef std::uint32_t u32;
typedef std::uint64_t u64;

struct alignas(16) Vec16 {
  u32 x, y, z, w;
};

namespace emu = flashjit::testing::cuda_emulator;

inline unsigned char* dynamic_shared_memory() { return emu::shared_base(); }
inline u32 shared_address(const void* pointer) {
  return static_cast<u32>(static_cast<const unsigned char*>(pointer) - emu::shared_base());
}
inline void cp_async_16(u32 destination, const void* source, int source_bytes) {
  emu::cp_async(destination, source, source_bytes);
}
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int PENDING>
inline void cp_async_wait() {
  emu::cp_async_wait(PENDING);
}
inline void ldmatrix_x4(u32 (&r)[4], u32 address) { emu::ldmatrix(r, address, false); }
inline void ldmatrix_x4_trans(u32 (&r)[4], u32 address) { emu::ldmatrix(r, address, true); }

inline float load_shared_f32(u32 address) {
  emu::shared_read(address, 4);
  float value;
  std::memcpy(&value, emu::shared_base() + address, 4);
  return value;
}
inline void store_shared_u32(u32 address, u32 value) {
  emu::shared_write(address, 4);
  std::memcpy(emu::shared_base() + address, &value, 4);
}
inline Vec16 load_shared_vec16(u32 address) {
  emu::shared_read(address, 16);
  Vec16 v;
  std::memcpy(&v, emu::shared_base() + address, 16);
  return v;
}
inline void reduce_add_f32x2(float* address, float a, float b) {
  emu::reduce_add(address, a);
  emu::reduce_add(address + 1, b);
}

template <bool IS_BF16>
inline void mma_16x8x16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  emu::mma(IS_BF16, d, a, b0, b1);
}
template <bool IS_BF16>
inline u32 pack2(float low, float high) {
  return static_cast<u32>(emu::from_float(low, IS_BF16)) |
         (static_cast<u32>(emu::from_float(high, IS_BF16)) << 16);
}
template <bool IS_BF16>
inline void unpack2(u32 packed, float& low, float& high) {
  low = emu::to_float(static_cast<u16>(packed & 0xffffu), IS_BF16);
  high = emu::to_float(static_cast<u16>(packed >> 16), IS_BF16);
}
inline float fast_exp2(float x) { return __builtin_exp2f(x); }
inline float fast_log2(float x) { return __builtin_log2f(x); }
inline float minus_infinity() { return -__builtin_huge_valf(); }
inline float plus_infinity() { return __builtin_huge_valf(); }

}  // namespace flashjit_kernel
