// Pieces every CUDA attention template shares: 16-bit elements as raw bits, and thin PTX
// wrappers (cp.async, ldmatrix, mma.sync, shared-memory loads and stores, reductions,
// conversions, exp2/log2). No CUDA headers, so NVRTC parses it in milliseconds. The renderer
// places it after templates/attention_params.h and before the kernel template.
//
// Everything a template does to the device beyond plain C++ goes through the functions here (and
// the CUDA built-ins threadIdx, blockIdx, gridDim, __syncthreads, __syncwarp, __shfl_xor_sync),
// so that tests/support/cuda_emulator.hpp can define the same names on the host and run a
// template's kernel body on the CPU.

namespace flashjit_kernel {

typedef unsigned short u16;  // one bf16/fp16 element, as raw bits
typedef unsigned int u32;
typedef unsigned long long u64;

struct alignas(16) Vec16 {  // one 16-byte vector: 8 elements
  u32 x, y, z, w;
};

// ---- PTX wrappers -----------------------------------------------------------------------------

// The kernel's dynamic shared memory (the launch's dynamic smem bytes).
__device__ __forceinline__ unsigned char* dynamic_shared_memory() {
  extern __shared__ __align__(128) unsigned char flashjit_dynamic_smem[];
  return flashjit_dynamic_smem;
}

__device__ __forceinline__ u32 shared_address(const void* pointer) {
  u32 address;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
      : "=r"(address)
      : "l"(pointer));
  return address;
}

// 16-byte global -> shared copy; bytes past `source_bytes` (0 or 16) are zero-filled.
__device__ __forceinline__ void cp_async_16(u32 destination, const void* source, int source_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(source),
               "r"(source_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// Loads and stores at a shared-memory address (shared_address()).
__device__ __forceinline__ float load_shared_f32(u32 address) {
  float value;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(value) : "r"(address) : "memory");
  return value;
}
__device__ __forceinline__ void store_shared_u32(u32 address, u32 value) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(value) : "memory");
}
__device__ __forceinline__ Vec16 load_shared_vec16(u32 address) {
  Vec16 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address)
               : "memory");
  return v;
}

// address[0] += a, address[1] += b in global memory (8-byte aligned), no value returned: one
// vector reduction on sm90, two scalar ones before. The order of concurrent additions is not
// defined (results may differ in the last bits run to run).
__device__ __forceinline__ void reduce_add_f32x2(float* address, float a, float b) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(address), "f"(a), "f"(b));
#else
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(address), "f"(a));
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(address + 1), "f"(b));
#endif
}

// d[16x8] += a[16x16] * b[16x8], fp32 accumulate.
template <bool IS_BF16>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  if constexpr (IS_BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> one register of two 16-bit elements, `low` in the low half.
template <bool IS_BF16>
__device__ __forceinline__ u32 pack2(float low, float high) {
  u32 packed;
  if constexpr (IS_BF16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(high), "f"(low));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(high), "f"(low));
  }
  return packed;
}

// One register of two 16-bit elements -> two floats, the low half first.
template <bool IS_BF16>
__device__ __forceinline__ void unpack2(u32 packed, float& low, float& high) {
  if constexpr (IS_BF16) {
    low = __uint_as_float(packed << 16);
    high = __uint_as_float(packed & 0xffff0000u);
  } else {
    asm("{ .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h; }\n"
        : "=f"(low), "=f"(high)
        : "r"(packed));
  }
}

__device__ __forceinline__ float fast_exp2(float x) {  // exp2(-inf) = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float minus_infinity() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float plus_infinity() { return __int_as_float(0x7f800000); }

}  // namespace flashjit_kernel
