// A host emulation of the sm_90a primitives that the Hopper templates are written against: the
// wgmma family's backward (templates/cuda/attention_bwd_sm90.cuh) and the warp-specialized
// forward (templates/cuda/ws/). It defines the names of cuda/common.cuh, cuda/wgmma.cuh and
// cuda/tma.cuh, so that a kernel body runs on the CPU and its results are compared with the fp64
// reference where no H100 exists.
//
// Every thread of a CTA is a coroutine (ucontext) on the calling thread. Warpgroups run in turn
// (alternating order each round), each until none of its threads can go on: a thread runs until
// it reaches a CTA barrier, a wgmma wait, a warp operation (shuffle, __syncwarp), a named barrier
// or an mbarrier wait that is not yet complete. A warpgroup's 128 threads meet at a wgmma wait,
// which then at once executes their pending wgmma groups (all but the newest N) from the operands
// the threads issued: shared memory through the descriptors as cuda/sm90_tiles.cuh documents the
// layout (128-byte swizzle on address bits, K-major and MN-major), A fragments and accumulators
// through the registers each thread named, read and written at the wait, not at the issue. A
// warp's 32 lanes meet at a shuffle. cp.async copies land at cp.async.wait_group, not at the
// issue.
//
// TMA and mbarriers (cuda/tma.cuh): a tensor map is what encode_tensor_map() writes from a
// runtime/tensor_map_spec.hpp description (4-D, 128-byte swizzle, box of 64 columns); a TMA load
// lands, all of its box at once (elements outside the tensor zero-filled, the box's full byte
// count completed on its mbarrier), at a point the scheduler chooses: whenever no thread can go
// on, and with Sm90Options::early_landing at random points before that (seeded); with
// Sm90Options::late_wgmma a warpgroup's wgmma wait may run after the other warpgroups' turns. An
// mbarrier completes a phase when all its arrivals are in and its transaction bytes (expect_tx
// minus landed bytes) are zero; try_wait.parity P succeeds once the last phase of parity P has
// completed (on a fresh barrier parity 1: the phase "before" phase 0). A TMA store
// reads shared memory and writes the global tensor (clipped to it) when its thread waits for its
// bulk group; a bulk reduction (cp.reduce.async.bulk .add.f32) adds its words into global memory
// likewise. Named barriers count threads; setmaxnreg is checked (24..256, a multiple of 8, the
// same for the whole warpgroup, within the launch's registers), not enforced.
//
// Rules checked (an error names the thread and what it did): every byte a wgmma reads or a TMA
// store sends must be visible to it: written by a TMA load whose mbarrier phase every thread of
// the reading warpgroup has waited for, or by generic stores (st.shared, cp.async) that the
// writer fenced (fence.proxy.async) before a barrier or arrival that orders it before the read
// (vector clocks over CTA barriers, named barriers and mbarrier phases); a generic load
// (ld.shared) of a byte another thread stored needs a barrier or arrival ordering the store
// before it, and of a TMA-loaded byte the wait for its phase. A TMA load must not
// land on bytes that an issued, not yet waited wgmma may read, nor on another load in flight; a
// generic store neither. mbarriers are used only after their init has been fenced and published
// by a barrier. Shared memory starts as 0xFF bytes (NaN) at a base address that is not
// 1024-aligned, and bytes past the launch's dynamic shared memory must stay untouched. A CTA ends
// with no TMA load in flight and every TMA store waited for by its thread.
//
// What this checks: indexing, tile layouts and swizzles, descriptors and the wgmma operand and
// accumulator layouts as documented, the TMA box layout and byte counts as documented, pipelines
// (phases, parities, buffer reuse against late loads and late wgmmas), masking, GQA, strides,
// the workspace layout, the dynamic shared memory size. What it cannot check: that the hardware
// matches the documented layouts (tests/runtime/cuda/wgmma_probe_test.cpp and
// tma_probe_test.cpp do, on an H100), ptxas, timing, and races that no schedule it tries shows.
//
// Include after templates/attention_params.h and templates/attention_common.h, before
// templates/cuda/sm90_tiles.cuh and the template.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "runtime/tensor_map_spec.hpp"
#include "templates/attention_params.h"
#include "tuner/reference.hpp"

namespace flashjit::testing {

struct Sm90Grid {
  int x = 1, y = 1, z = 1;
};
struct Sm90Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

struct Sm90Options {
  // Seed of the scheduler's random choices (which in-flight TMA load lands first, and when).
  uint64_t seed = 1;
  // Land TMA loads at random scheduling points too (with probability 1/4 each), not only when
  // no thread can go on.
  bool early_landing = false;
  // When a warpgroup's 128 threads meet at a wgmma wait, let the other warpgroups run first with
  // probability 1/2 (the waited wgmmas stay in flight meanwhile): a buffer released to the
  // producer before the wgmmas that read it were waited for is then reloaded under them.
  bool late_wgmma = false;
  // Registers per thread at launch (what __launch_bounds__ gives): when set, setmaxnreg.inc must
  // not go below it nor .dec above it, and the warpgroups' final counts must fit the launch's.
  int launch_registers = 0;
};

// Runs `kernel` once per thread of every CTA of `grid` (`threads` per CTA, whole warpgroups of
// 128) with `smem_bytes` of dynamic shared memory. "" on success, else what went wrong. Not
// reentrant.
std::string emulate_sm90(Sm90Grid grid, int threads, int smem_bytes,
                         const std::function<void()>& kernel, const Sm90Options& options = {});

// The tensor map the emulated TMA reads for `spec` (its 128 opaque bytes).
void encode_tensor_map(const TensorMapSpec& spec, FlashjitTensorMap* map);

// A -ws forward launch (templates/cuda/ws/) of `problem` with `config` and `params`: the tensor
// maps runtime/tensor_map_spec.hpp describes, encoded for the emulated TMA, and the runtime's
// grid (forward_launch; a persistent config: at most `persistent_ctas` CTAs), each thread
// running kernel(maps). "" on success, else what went wrong (a map the spec refuses included).
std::string emulate_ws_forward(const AttentionProblem& problem, const AttentionConfig& config,
                               const FlashjitAttentionParams& params, int threads, int smem_bytes,
                               int persistent_ctas,
                               const std::function<void(const FlashjitForwardTensorMaps&)>& kernel,
                               const Sm90Options& options);

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
void store_shared_u32(uint32_t address, uint32_t value);
void load_shared_16(uint32_t address, void* value);
void load_shared_4(uint32_t address, void* value);
float shuffle_xor(float value, int lane_mask);
void sync_warp();
void fence_proxy_async();
void mbarrier_init(uint32_t barrier, uint32_t arrivals);
void fence_barrier_init();
void mbarrier_arrive(uint32_t barrier);
void mbarrier_arrive_expect_tx(uint32_t barrier, uint32_t bytes);
void mbarrier_wait(uint32_t barrier, uint32_t parity);
void tma_load_4d(uint32_t destination, const void* tensor_map, uint32_t barrier, int c0, int c1,
                 int c2, int c3);
void tma_store_4d(const void* tensor_map, uint32_t source, int c0, int c1, int c2, int c3);
void bulk_commit_group();
void bulk_wait_group_read(int pending);
void bulk_reduce_add_f32(float* destination, uint32_t source, uint32_t bytes);
void named_barrier_sync(int id, int threads);
void named_barrier_arrive(int id, int threads);
void setmaxnreg(int registers, bool increase);
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

inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
  return ::flashjit::testing::sm90_emulator::shuffle_xor(value, lane_mask);
}
inline void __syncwarp(unsigned = 0xffffffffu) { ::flashjit::testing::sm90_emulator::sync_warp(); }
inline unsigned __float_as_uint(float value) {
  unsigned bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
inline float __uint_as_float(unsigned bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

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
inline void fence_proxy_async() { emu::fence_proxy_async(); }
inline void store_shared_u32(u32 address, u32 value) { emu::store_shared_u32(address, value); }
inline Vec16 load_shared_vec16(u32 address) {
  Vec16 v;
  emu::load_shared_16(address, &v);
  return v;
}
inline float load_shared_f32(u32 address) {
  float v;
  emu::load_shared_4(address, &v);
  return v;
}

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

// cuda/tma.cuh
inline void mbarrier_init(u32 barrier, u32 arrivals) { emu::mbarrier_init(barrier, arrivals); }
inline void fence_barrier_init() { emu::fence_barrier_init(); }
inline void mbarrier_arrive(u32 barrier) { emu::mbarrier_arrive(barrier); }
inline void mbarrier_arrive_expect_tx(u32 barrier, u32 bytes) {
  emu::mbarrier_arrive_expect_tx(barrier, bytes);
}
inline void mbarrier_wait(u32 barrier, u32 parity) { emu::mbarrier_wait(barrier, parity); }
inline void tma_load_4d(u32 destination, const void* tensor_map, u32 barrier, int c0, int c1,
                        int c2, int c3) {
  emu::tma_load_4d(destination, tensor_map, barrier, c0, c1, c2, c3);
}
inline void tma_store_4d(const void* tensor_map, u32 source, int c0, int c1, int c2, int c3) {
  emu::tma_store_4d(tensor_map, source, c0, c1, c2, c3);
}
inline void bulk_commit_group() { emu::bulk_commit_group(); }
template <int PENDING>
inline void bulk_wait_group_read() {
  emu::bulk_wait_group_read(PENDING);
}
// cuda/attention_bwd_common.cuh (sm90): a bulk reduction lands at its thread's wait, as a store.
inline void bulk_reduce_add_f32(float* destination, u32 source, u32 bytes) {
  emu::bulk_reduce_add_f32(destination, source, bytes);
}
template <int PENDING>
inline void bulk_wait_group() {
  emu::bulk_wait_group_read(PENDING);
}
inline void prefetch_tensor_map(const void*) {}
inline void named_barrier_sync(int id, int threads) { emu::named_barrier_sync(id, threads); }
inline void named_barrier_arrive(int id, int threads) { emu::named_barrier_arrive(id, threads); }
template <int REGISTERS>
inline void setmaxnreg_inc() {
  emu::setmaxnreg(REGISTERS, true);
}
template <int REGISTERS>
inline void setmaxnreg_dec() {
  emu::setmaxnreg(REGISTERS, false);
}

}  // namespace flashjit_kernel
