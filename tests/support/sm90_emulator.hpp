// A host emulation of the sm_90a primitives that the wgmma family's backward template
// (templates/cuda/attention_bwd_sm90.cuh, over cuda/sm90_tiles.cuh) is written against: the
// names of cuda/common.cuh and cuda/wgmma.cuh, so that the kernel body runs on the CPU and its
// gradients are compared with the fp64 reference where no H100 exists.
//
// Every thread of a CTA is a coroutine (ucontext) on the calling thread. Warpgroups run in turn
// (alternating order at each CTA barrier), each thread until it reaches a CTA barrier or a wgmma
// wait; a warpgroup's 128 threads meet at the wait, which then at once executes their pending
// wgmma groups (all but the newest N, as wgmma.wait_group N does) from
// the operands the threads issued: shared memory through the descriptors as the tile layout in
// cuda/sm90_tiles.cuh documents it (128-byte swizzle on address bits, K-major and MN-major),
// A fragments and accumulators through the registers each thread named, read and written at the
// wait, not at the issue. cp.async copies land at cp.async.wait_group, not at the issue. Shared
// memory starts as 0xFF bytes (NaN) at a base address that is not 1024-aligned, and bytes past
// the launch's dynamic shared memory must stay untouched.
//
// What this checks: indexing, tile layouts and swizzles, descriptors and the wgmma operand and
// accumulator layouts as documented, the pipeline's buffer reuse against late copies and late
// wgmmas, masking, GQA, strides, the workspace layout, the dynamic shared memory size. What it
// cannot check: that the hardware matches the documented layouts (tests/runtime/cuda/
// wgmma_probe_test.cpp does, on an H100), ptxas, timing, and races between warpgroups that this
// schedule happens to order.
//
// Include after templates/attention_params.h and templates/attention_common.h, before
// templates/cuda/sm90_tiles.cuh and the template.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "tuner/reference.hpp"

namespace flashjit::testing {

struct Sm90Grid {
  int x = 1, y = 1, z = 1;
};
struct Sm90Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

// Runs `kernel` once per thread of every CTA of `grid` (`threads` per CTA, whole warpgroups of
// 128) with `smem_bytes` of dynamic shared memory. "" on success, else what went wrong. Not
// reentrant.
std::string emulate_sm90(Sm90Grid grid, int threads, int smem_bytes,
                         const std::function<void()>& kernel);

namespace sm90_emulator {
// Used by the primitives below while emulate_sm90 runs.
Sm90Dim3 thread_idx();
Sm90Dim3 block_idx();
Sm90Dim3 grid_dim();
void barrier();
void trap();
uint32_t shared_address(const void* pointer);
uint32_t dynamic_smem_bytes();
void cp_async_16(uint32_t destination, const void* source, int source_bytes);
void cp_async_commit();
void cp_async_wait(int pending);
void wgmma_commit();
void wgmma_wait(int pending);
void wgmma_ss(int n, bool bf16, float* d, uint64_t a, uint64_t b, bool accumulate, int trans_a,
              int trans_b);
void wgmma_rs(int n, bool bf16, float* d, const uint32_t* a, uint64_t b, bool accumulate,
              int trans_b);
void red_add_v2(float* address, float a, float b);
}  // namespace sm90_emulator

}  // namespace flashjit::testing

#define __device__
#define __forceinline__ inline
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define __syncthreads() ::flashjit::testing::sm90_emulator::barrier()
#define __trap() ::flashjit::testing::sm90_emulator::trap()
#define threadIdx (::flashjit::testing::sm90_emulator::thread_idx())
#define blockIdx (::flashjit::testing::sm90_emulator::block_idx())
#define gridDim (::flashjit::testing::sm90_emulator::grid_dim())

struct float2 {
  float x, y;
};

namespace flashjit_kernel {

typedef std::uint16_t u16;
typedef std::uint32_t u32;
typedef std::uint64_t u64;

struct alignas(16) Vec16 {
  u32 x, y, z, w;
};

// The dynamic shared memory window (defined in sm90_emulator.cpp).
extern unsigned char shared_bytes[];

namespace emu = ::flashjit::testing::sm90_emulator;

inline u32 shared_address(const void* pointer) { return emu::shared_address(pointer); }
inline void cp_async_16(u32 destination, const void* source, int source_bytes) {
  emu::cp_async_16(destination, source, source_bytes);
}
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int PENDING>
inline void cp_async_wait() {
  emu::cp_async_wait(PENDING);
}

template <bool IS_BF16>
inline u32 pack2(float low, float high) {
  const u32 lo = IS_BF16 ? flashjit::float_to_bf16(low) : flashjit::float_to_fp16(low);
  const u32 hi = IS_BF16 ? flashjit::float_to_bf16(high) : flashjit::float_to_fp16(high);
  return lo | (hi << 16);
}
inline float fast_exp2(float x) { return std::exp2(x); }
inline float fast_log2(float x) { return std::log2(x); }
inline float minus_infinity() { return -HUGE_VALF; }
inline float plus_infinity() { return HUGE_VALF; }

inline void wgmma_fence() {}
inline void wgmma_commit() { emu::wgmma_commit(); }
template <int PENDING>
inline void wgmma_wait() {
  emu::wgmma_wait(PENDING);
}
template <int N>
inline void pin(float (&)[N]) {}
template <int M, int N>
inline void pin(u32 (&)[M][N]) {}
inline void fence_proxy_async() {}

template <int N, bool IS_BF16>
struct Wgmma {
  template <int TRANS_A = 0, int TRANS_B = 0>
  static void ss(float (&d)[N / 2], u64 a, u64 b, int accumulate) {
    emu::wgmma_ss(N, IS_BF16, d, a, b, accumulate != 0, TRANS_A, TRANS_B);
  }
  template <int TRANS_A = 0, int TRANS_B = 0>
  static void ss_first(float (&d)[N / 2], u64 a, u64 b) {
    emu::wgmma_ss(N, IS_BF16, d, a, b, false, TRANS_A, TRANS_B);
  }
  template <int TRANS_B = 1>
  static void rs(float (&d)[N / 2], const u32 (&a)[4], u64 b, int accumulate) {
    emu::wgmma_rs(N, IS_BF16, d, a, b, accumulate != 0, TRANS_B);
  }
};

inline void red_add_v2(float* address, float a, float b) { emu::red_add_v2(address, a, b); }
inline u32 dynamic_smem_bytes() { return emu::dynamic_smem_bytes(); }

}  // namespace flashjit_kernel
