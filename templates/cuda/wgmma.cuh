// PTX wrappers for Hopper (sm_90a) that the wgmma-family templates share
// (attention_fwd_sm90.cuh, attention_bwd_sm90.cuh): warpgroup MMA (wgmma) and its fences and
// waits, the async-proxy fence, vector reductions, the launch's dynamic shared memory size. The
// layout arithmetic they work with (descriptors, swizzled tiles, their loader) is plain C++ in
// cuda/sm90_tiles.cuh. The renderer places this after cuda/common.cuh.

namespace flashjit_kernel {

// ---- fences and waits ---------------------------------------------------------------------------

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}
// Registers a wgmma reads or writes asynchronously: the compiler must not move their uses across
// the wait, nor reuse them before it. Passing each through an empty volatile asm after the wait
// pins them there.
template <int N>
__device__ __forceinline__ void pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int M, int N>
__device__ __forceinline__ void pin(u32 (&r)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < N; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
// Generic-proxy writes (cp.async, st.shared) to shared memory become visible to wgmma (async
// proxy). Each writing thread fences its own writes, then a barrier orders them for the issuer.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- wgmma -------------------------------------------------------------------------------------

// d[64 x N] (+)= a[64 x 16] * b[16 x N], 16-bit inputs (bf16 or fp16), fp32 accumulate, one
// warpgroup. d per thread: N / 2 floats, laid out per warp (rows 16 * warp .. + 15 of the 64) as
// N / 8 mma.sync m16n8 accumulator tiles: lane holds rows lane / 4 and lane / 4 + 8, columns
// 8 * t + 2 * (lane % 4) + {0, 1} of tile t, as d[4t + {0, 1}] and d[4t + {2, 3}].
//   ss        a and b from shared memory (descriptors, cuda/sm90_tiles.cuh); TRANS_A / TRANS_B =
//             1 for an MN-major operand, 0 for K-major.
//   rs        a from registers: the mma.sync A-fragment layout per warp (rows as d's, columns
//             2 * (lane % 4) + {0, 1} in a[0] (row lane / 4) and a[1] (row + 8), + 8 in a[2],
//             a[3]); an accumulator tile pair (t = 2s, 2s + 1) packed to 16 bits is A's k-step s.
//   *_first   d = a * b: d is only written, so it carries no value across loop iterations (a
//             loop-carried accumulator would need moves between wgmmas, and ptxas would
//             serialize every wgmma of the kernel).
template <int N, bool IS_BF16>
struct Wgmma;

// Operand lists of the N / 2 accumulators, constraint C ("+f" or "=f").
#define FLASHJIT_WGMMA_D4(C, i) C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3])
#define FLASHJIT_WGMMA_D16(C, i)                                                     \
  FLASHJIT_WGMMA_D4(C, i), FLASHJIT_WGMMA_D4(C, i + 4), FLASHJIT_WGMMA_D4(C, i + 8), \
      FLASHJIT_WGMMA_D4(C, i + 12)
#define FLASHJIT_WGMMA_D_16(C) FLASHJIT_WGMMA_D16(C, 0)
#define FLASHJIT_WGMMA_D_32(C) FLASHJIT_WGMMA_D16(C, 0), FLASHJIT_WGMMA_D16(C, 16)
#define FLASHJIT_WGMMA_D_64(C) \
  FLASHJIT_WGMMA_D_32(C), FLASHJIT_WGMMA_D16(C, 32), FLASHJIT_WGMMA_D16(C, 48)

#define FLASHJIT_WGMMA_R_16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FLASHJIT_WGMMA_R_32                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FLASHJIT_WGMMA_R_64                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"

// The instruction text. Operands after the R accumulators: ss: a, b, scale-d, trans-a, trans-b
// (%R .. %R+4); rs: a[0..3], b, scale-d, trans-b (%R .. %R+6).
#define FLASHJIT_WGMMA_SS_TEXT(N, TYPE, REGS, a, b, scale, ta, tb)                           \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #scale                                                \
  ", 0;\n"                                                                                   \
  "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS ", %" #a ", %" #b \
  ", p, 1, 1, %" #ta ", %" #tb ";\n}\n"
#define FLASHJIT_WGMMA_RS_TEXT(N, TYPE, REGS, a0, a1, a2, a3, b, scale, tb)                     \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #scale                                                   \
  ", 0;\n"                                                                                      \
  "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS ", {%" #a0 ", %" #a1 \
  ", %" #a2 ", %" #a3 "}, %" #b ", p, 1, 1, %" #tb ";\n}\n"

// One specialization per N, generic over the 16-bit type: R = N / 2 accumulators, i0.. = R ..
#define FLASHJIT_WGMMA_SHAPE(N, R, D, REGS, i0, i1, i2, i3, i4, i5, i6)                      \
  template <bool IS_BF16>                                                                    \
  struct Wgmma<N, IS_BF16> {                                                                 \
    template <int TRANS_A = 0, int TRANS_B = 0>                                              \
    static __device__ __forceinline__ void ss(float (&d)[R], u64 a, u64 b, int accumulate) { \
      if constexpr (IS_BF16)                                                                 \
        asm volatile(FLASHJIT_WGMMA_SS_TEXT(N, "bf16", REGS, i0, i1, i2, i3, i4)             \
                     : D("+f")                                                               \
                     : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));         \
      else                                                                                   \
        asm volatile(FLASHJIT_WGMMA_SS_TEXT(N, "f16", REGS, i0, i1, i2, i3, i4)              \
                     : D("+f")                                                               \
                     : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));         \
    }                                                                                        \
    template <int TRANS_A = 0, int TRANS_B = 0>                                              \
    static __device__ __forceinline__ void ss_first(float (&d)[R], u64 a, u64 b) {           \
      if constexpr (IS_BF16)                                                                 \
        asm volatile(FLASHJIT_WGMMA_SS_TEXT(N, "bf16", REGS, i0, i1, i2, i3, i4)             \
                     : D("=f")                                                               \
                     : "l"(a), "l"(b), "n"(0), "n"(TRANS_A), "n"(TRANS_B));                  \
      else                                                                                   \
        asm volatile(FLASHJIT_WGMMA_SS_TEXT(N, "f16", REGS, i0, i1, i2, i3, i4)              \
                     : D("=f")                                                               \
                     : "l"(a), "l"(b), "n"(0), "n"(TRANS_A), "n"(TRANS_B));                  \
    }                                                                                        \
    template <int TRANS_B = 1>                                                               \
    static __device__ __forceinline__ void rs(float (&d)[R], const u32 (&a)[4], u64 b,       \
                                              int accumulate) {                              \
      if constexpr (IS_BF16)                                                                 \
        asm volatile(FLASHJIT_WGMMA_RS_TEXT(N, "bf16", REGS, i0, i1, i2, i3, i4, i5, i6)     \
                     : D("+f")                                                               \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate),  \
                       "n"(TRANS_B));                                                        \
      else                                                                                   \
        asm volatile(FLASHJIT_WGMMA_RS_TEXT(N, "f16", REGS, i0, i1, i2, i3, i4, i5, i6)      \
                     : D("+f")                                                               \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate),  \
                       "n"(TRANS_B));                                                        \
    }                                                                                        \
  };

FLASHJIT_WGMMA_SHAPE(32, 16, FLASHJIT_WGMMA_D_16, FLASHJIT_WGMMA_R_16, 16, 17, 18, 19, 20, 21, 22)
FLASHJIT_WGMMA_SHAPE(64, 32, FLASHJIT_WGMMA_D_32, FLASHJIT_WGMMA_R_32, 32, 33, 34, 35, 36, 37, 38)
FLASHJIT_WGMMA_SHAPE(128, 64, FLASHJIT_WGMMA_D_64, FLASHJIT_WGMMA_R_64, 64, 65, 66, 67, 68, 69, 70)

#undef FLASHJIT_WGMMA_SHAPE
#undef FLASHJIT_WGMMA_RS_TEXT
#undef FLASHJIT_WGMMA_SS_TEXT
#undef FLASHJIT_WGMMA_R_64
#undef FLASHJIT_WGMMA_R_32
#undef FLASHJIT_WGMMA_R_16
#undef FLASHJIT_WGMMA_D_64
#undef FLASHJIT_WGMMA_D_32
#undef FLASHJIT_WGMMA_D_16
#undef FLASHJIT_WGMMA_D16
#undef FLASHJIT_WGMMA_D4

// ---- sm90-only memory operations ---------------------------------------------------------------

// fp32 address[0..1] += {a, b} in global memory (8-byte aligned); no value back (a reduction).
__device__ __forceinline__ void red_add_v2(float* address, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(address), "f"(a), "f"(b) : "memory");
}

// Bytes of dynamic shared memory this launch has.
__device__ __forceinline__ u32 dynamic_smem_bytes() {
  u32 bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(bytes));
  return bytes;
}

}  // namespace flashjit_kernel
