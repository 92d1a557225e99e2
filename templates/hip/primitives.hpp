// AMD CDNA (gfx90a, gfx942) device primitives of the HIP attention templates: everything in them
// that is specific to AMD hardware, so that templates/hip/attention_fwd.hpp, attention_bwd.hpp
// and tiles.hpp are plain C++ over these names. A host emulation (tests/support/hip_emulator.hpp)
// defines the same names to run the kernel body on the CPU. Compiled by hipRTC; no header is
// included (hipRTC predefines threadIdx, blockIdx, gridDim, __syncthreads and the 16-bit float
// types).
namespace flashjit_hip {

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// The fp32 accumulator of one 16x16 MFMA tile: 4 values per lane (see mfma_16x16x16).
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef short i16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
typedef unsigned int u32x2 __attribute__((ext_vector_type(2)));

__device__ __forceinline__ int thread_index() { return threadIdx.x; }
// The lane within the wavefront of 64 (workgroups are one-dimensional).
__device__ __forceinline__ int lane_index() { return threadIdx.x & 63; }
__device__ __forceinline__ int block_index_x() { return blockIdx.x; }
__device__ __forceinline__ int block_index_y() { return blockIdx.y; }
__device__ __forceinline__ int block_index_z() { return blockIdx.z; }
__device__ __forceinline__ int grid_size_x() { return gridDim.x; }

// The workgroup's dynamic LDS (hipModuleLaunchKernel's sharedMemBytes).
__device__ __forceinline__ unsigned char* lds_base() {
  extern __shared__ __attribute__((aligned(16))) unsigned char flashjit_lds[];
  return flashjit_lds;
}

// Workgroup barrier that also orders LDS reads and writes around it.
__device__ __forceinline__ void barrier() { __syncthreads(); }

// The value of `value` in lane (this lane ^ mask) of the wavefront; every lane must take part.
// ds_bpermute moves data through the LDS crossbar without touching LDS memory.
__device__ __forceinline__ float shuffle_xor(float value, int mask) {
  const int source_lane = lane_index() ^ mask;
  return __builtin_bit_cast(
      float, __builtin_amdgcn_ds_bpermute(source_lane << 2, __builtin_bit_cast(int, value)));
}

// D = A B + C for one 16x16x16 tile (v_mfma_f32_16x16x16bf16_1k / _f16), fp32 accumulate. A and B
// are 4 16-bit elements per lane, element i in bits 16 * (i % 2) of word i / 2 (a_lo, a_hi). With
// l the lane (0..63), g = l / 16, r = l % 16 and i = 0..3 (AMD's matrix instruction calculator):
//   A[row r][k 4g + i]   is element i of lane l    (A: 16 x 16, row-major rows per lane)
//   B[k 4g + i][col r]   is element i of lane l    (B: 16 x 16)
//   D[row 4g + i][col r] is value i of lane l      (D, C: 16 x 16)
// Every lane must take part (no divergence around it).
template <bool IS_BF16>
__device__ __forceinline__ f32x4 mfma_16x16x16(u32 a_lo, u32 a_hi, u32 b_lo, u32 b_hi, f32x4 c) {
  const u32x2 a = {a_lo, a_hi};
  const u32x2 b = {b_lo, b_hi};
  if constexpr (IS_BF16) {
    return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(i16x4, a),
                                                     __builtin_bit_cast(i16x4, b), c, 0, 0, 0);
  } else {
    return __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(f16x4, a),
                                                 __builtin_bit_cast(f16x4, b), c, 0, 0, 0);
  }
}

// 2^x and log2(x) on the transcendental unit (v_exp_f32, v_log_f32); exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) { return __builtin_exp2f(x); }
__device__ __forceinline__ float fast_log2(float x) { return __builtin_log2f(x); }

// Two floats -> one word of two 16-bit values, `low` in the low half, rounded to nearest even.
// CDNA2/3 have no bf16 conversion instruction: round on the bits (NaN stays a quiet NaN).
__device__ __forceinline__ u32 bf16_bits(float value) {
  const u32 bits = __builtin_bit_cast(u32, value);
  const u32 rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return value != value ? 0x7fc0u : rounded;
}
template <bool IS_BF16>
__device__ __forceinline__ u32 pack2(float low, float high) {
  if constexpr (IS_BF16) {
    return bf16_bits(low) | (bf16_bits(high) << 16);
  } else {
    const u32 lo = __builtin_bit_cast(u16, static_cast<_Float16>(low));
    const u32 hi = __builtin_bit_cast(u16, static_cast<_Float16>(high));
    return lo | (hi << 16);
  }
}

// One 16-bit element of the storage type as a float (exact).
template <bool IS_BF16>
__device__ __forceinline__ float to_float(u16 bits) {
  if constexpr (IS_BF16) {
    return __builtin_bit_cast(float, static_cast<u32>(bits) << 16);
  } else {
    return static_cast<float>(__builtin_bit_cast(_Float16, bits));
  }
}

// *address += value in global memory, atomically, the old value not returned
// (global_atomic_add_f32, gfx90a and newer). On gfx90a it is correct in coarse-grained memory
// (hipMalloc's, where the backward's workspace lives), not in fine-grained host-coherent memory.
// HIP's atomicAdd compiles to a compare-and-swap loop instead.
__device__ __forceinline__ void atomic_add(float* address, float value) {
  __builtin_amdgcn_global_atomic_fadd_f32((__attribute__((address_space(1))) float*)address, value);
}

// The old value of *address, to which `value` is added atomically in global memory (the decode
// kernel's split counters; relaxed: memory_fence orders the partials around it).
__device__ __forceinline__ int atomic_fetch_add(int* address, int value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}

// A fence over the device (agent scope), release and acquire: this thread's global writes before
// it are visible to every CU before its later ones; global reads after it see what other
// workgroups wrote before their fence (on CDNA the acquire half invalidates this CU's L1).
__device__ __forceinline__ void memory_fence() {
  __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent");
}

}  // namespace flashjit_hip
