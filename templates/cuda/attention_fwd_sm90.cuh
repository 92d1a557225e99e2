// FlashAttention forward for Hopper (sm_90a: H100, H200): warpgroup MMA (wgmma) reading Q, K
// and V straight from shared memory, P from registers. The renderer prepends
// templates/attention_params.h, templates/attention_common.h (key range, masking and LSE rules)
// and cuda/common.cuh, and appends one instantiation; NVRTC compiles it for sm_90a (wgmma exists
// on sm_90a only).
//
// One CTA computes O for kBlockM = 64 * kWarpgroups query rows of one (batch, head). Each
// warpgroup (4 warps, 128 threads) owns 64 rows end to end; each warp 16 of them.
//
// clang-format off
//   load Q tile                               Q: [kBlockM, d] -> shared (wgmma layout, below)
//   m = -inf, l = 0, O = 0                    per row, fp32, in registers
//   S = Q K_0^T                               issued, waited
//   for j = 0 .. n-1:
//     issue S' = Q K_{j+1}^T  (if j+1 < n)     async on the tensor cores ...
//     issue O += P_{j-1} V_{j-1} (if j > 0)    ... both in flight
//     softmax of S_j -> P_j, m, l             CUDA cores, overlapped with the two MMAs above
//     wait; O *= exp2(m_old - m_new)           (the P V of block j-1 used the old max)
//   O += P_{n-1} V_{n-1}; O /= l; LSE
// clang-format on
//
// The loop below runs that schedule one block shifted: iteration j issues S_j and P_{j-1} V_{j-1}
// together, then does S_j's softmax while P_{j-1} V_{j-1} runs. K_j and V_{j-1} are read in the
// same iteration, so each load group carries {K_j, V_{j-1}} and K and V keep kStages buffers each.
//
// Shared tiles use wgmma's 128-byte swizzled K-major layout: the head dim is cut into 64-column
// blocks; a block holds all rows, 128 bytes per row, and 16-byte chunk c of row r sits at chunk
// c ^ (r % 8) (rows 8i..8i+7 form one 1024-byte swizzle atom). Q and K are K-major operands as
// stored; V, stored the same way, is the N-major ("transposed") B operand of P V.

namespace flashjit_kernel {

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool IS_BF16, bool CAUSAL>
struct Sm90Traits {
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kHeadDimPadded = (HEAD_DIM + 63) / 64 * 64;  // whole 64-column blocks
  static constexpr int kBlockM = BLOCK_M;
  static constexpr int kBlockN = BLOCK_N;
  static constexpr int kWarps = WARPS;
  static constexpr int kStages = STAGES;
  static constexpr bool kIsBf16 = IS_BF16;
  static constexpr bool kCausal = CAUSAL;

  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpgroups = kWarps / 4;
  static constexpr int kNTiles = kBlockN / 8;               // 8-key column tiles of S
  static constexpr int kChunksPerRow = kHeadDimPadded / 8;  // 16-byte chunks per row
  // P V is issued in N-chunks of the head dim: one wgmma up to n128.
  static constexpr int kPvChunk = kHeadDimPadded % 128 == 0 ? 128 : 64;
  static constexpr int kPvChunks = kHeadDimPadded / kPvChunk;
  static constexpr int kQTileBytes = kBlockM * kHeadDimPadded * 2;
  static constexpr int kKvTileBytes = kBlockN * kHeadDimPadded * 2;
  // + 1024: the dynamic shared window is rounded up to a swizzle atom.
  static constexpr int kSmemBytes = 1024 + kQTileBytes + 2 * kStages * kKvTileBytes;

  static_assert(kHeadDim % 8 == 0 && kHeadDim >= 8 && kHeadDim <= 256,
                "head dim: a multiple of 8 in [8, 256]");
  static_assert(kWarps % 4 == 0 && kBlockM == 16 * kWarps, "64 query rows per warpgroup");
  static_assert(kBlockN == 64 || kBlockN == 128, "S = Q K^T is one m64n64 or m64n128 wgmma");
  static_assert(kStages >= 2 && kStages <= 3, "2 or 3 K and V buffers");
  static_assert((kBlockN * kChunksPerRow) % kThreads == 0, "K/V tile copies split evenly");
  static_assert((kBlockM * kChunksPerRow) % kThreads == 0, "Q tile copies split evenly");
  static_assert((16 * kChunksPerRow) % 32 == 0, "O row copies split over a warp");
};

// ---- wgmma wrappers ----------------------------------------------------------------------------

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading-dimension byte
// offset, stride-dimension byte offset (all >> 4). K-major operands: stride = 1024 bytes between
// 8-row groups, leading offset unused (1). N-major V: leading = bytes between 64-column blocks.
__device__ __forceinline__ u64 smem_descriptor(u32 address, u32 leading_bytes, u32 stride_bytes) {
  return static_cast<u64>((address & 0x3FFFF) >> 4) | static_cast<u64>(leading_bytes >> 4) << 16 |
         static_cast<u64>(stride_bytes >> 4) << 32 | 1ull << 62;
}
// The descriptor of the same matrix `bytes` further on (bytes % 16 == 0, stays below 256 KB).
__device__ __forceinline__ u64 advance(u64 descriptor, u32 bytes) {
  return descriptor + (bytes >> 4);
}

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
// the wait. Passing each through an empty volatile asm after the wait pins them there.
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
// Generic-proxy writes (cp.async) to shared memory become visible to wgmma (async proxy).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// d[64 x N] (+)= a[64 x 16] * b[16 x N], fp32 accumulate, one warpgroup. ss: a and b from shared
// memory (K-major); rs: a from registers (the mma.sync A-fragment layout per warp), b N-major.
// d per thread: N / 2 floats, laid out per warp as N / 8 mma.sync m16n8 accumulator tiles.
template <int N, bool IS_BF16>
struct Wgmma {
  static __device__ __forceinline__ void ss(float (&d)[N / 2], u64 a, u64 b, int accumulate);
  // d = a * b: d is only written, so it carries no value across loop iterations (a loop-carried
  // accumulator would need moves between wgmmas, and ptxas would serialize every wgmma).
  static __device__ __forceinline__ void ss_first(float (&d)[N / 2], u64 a, u64 b);
  static __device__ __forceinline__ void rs(float (&d)[N / 2], const u32 (&a)[4], u64 b,
                                            int accumulate);
};

template <>
__device__ __forceinline__ void Wgmma<64, true>::ss(float (&d)[32], u64 a, u64 b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void Wgmma<64, true>::ss_first(float (&d)[32], u64 a, u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
        "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
        "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "l"(a), "l"(b), "n"(0));
}

template <>
__device__ __forceinline__ void Wgmma<64, true>::rs(float (&d)[32], const u32 (&a)[4], u64 b,
                                                    int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, "
      "1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void Wgmma<64, false>::ss(float (&d)[32], u64 a, u64 b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void Wgmma<64, false>::ss_first(float (&d)[32], u64 a, u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
        "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
        "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "l"(a), "l"(b), "n"(0));
}

template <>
__device__ __forceinline__ void Wgmma<64, false>::rs(float (&d)[32], const u32 (&a)[4], u64 b,
                                                     int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, "
      "1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void Wgmma<128, true>::ss(float (&d)[64], u64 a, u64 b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void Wgmma<128, true>::ss_first(float (&d)[64], u64 a, u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
        "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
        "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]),
        "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]),
        "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]),
        "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]),
        "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]),
        "=f"(d[63])
      : "l"(a), "l"(b), "n"(0));
}

template <>
__device__ __forceinline__ void Wgmma<128, true>::rs(float (&d)[64], const u32 (&a)[4], u64 b,
                                                     int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void Wgmma<128, false>::ss(float (&d)[64], u64 a, u64 b,
                                                      int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void Wgmma<128, false>::ss_first(float (&d)[64], u64 a, u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
        "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
        "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]),
        "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]),
        "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]),
        "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]),
        "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]),
        "=f"(d[63])
      : "l"(a), "l"(b), "n"(0));
}

template <>
__device__ __forceinline__ void Wgmma<128, false>::rs(float (&d)[64], const u32 (&a)[4], u64 b,
                                                      int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// ---- shared-memory tiles -----------------------------------------------------------------------

// Byte offset of (row, col) in a swizzled [rows, kHeadDimPadded] tile of ROWS rows.
template <class K, int ROWS>
__device__ __forceinline__ u32 wg_tile_offset(int row, int col) {
  return (col >> 6) * (ROWS * 128) + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4) +
         (col & 7) * 2;
}

// Starts the copy of ROWS global rows (row r at source + r * row_stride) into a shared tile.
// Rows at or past `valid_rows` and columns past the head dim are zero-filled.
template <class K, int ROWS>
__device__ __forceinline__ void wg_load_tile_async(u32 tile, const u16* source,
                                                   long long row_stride, int valid_rows) {
  constexpr int kCopies = ROWS * K::kChunksPerRow / K::kThreads;
  if constexpr (K::kThreads % K::kChunksPerRow == 0 && (K::kThreads / K::kChunksPerRow) % 8 == 0) {
    // Each thread keeps one column and steps down the rows; the step keeps the swizzle phase.
    constexpr int kRowStep = K::kThreads / K::kChunksPerRow;
    const int row0 = threadIdx.x / K::kChunksPerRow;
    const int col = threadIdx.x % K::kChunksPerRow * 8;
    const u16* from = source + row0 * row_stride + col;
    const long long step = kRowStep * row_stride;
    const int rows_left = col < K::kHeadDim ? valid_rows - row0 : 0;
    const u32 to = tile + wg_tile_offset<K, ROWS>(row0, col);
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool valid = i * kRowStep < rows_left;
      cp_async_16(to + i * kRowStep * 128, valid ? from + i * step : source, valid ? 16 : 0);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int copy = threadIdx.x + i * K::kThreads;
      const int row = copy / K::kChunksPerRow;
      const int col = copy % K::kChunksPerRow * 8;
      const bool valid = row < valid_rows && col < K::kHeadDim;
      cp_async_16(tile + wg_tile_offset<K, ROWS>(row, col),
                  valid ? source + row * row_stride + col : source, valid ? 16 : 0);
    }
  }
}

// ---- the kernel --------------------------------------------------------------------------------

template <class K>
__device__ __forceinline__ void attention_forward_sm90(const FlashjitAttentionParams& p) {
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kNTiles = K::kNTiles, kDp = K::kHeadDimPadded;
  constexpr int kPvChunk = K::kPvChunk, kPvChunks = K::kPvChunks;

  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  // Swizzle atoms start on 1024-byte boundaries; the descriptors assume it (base offset 0).
  const u32 q_tile = (shared_address(shared_bytes) + 1023) & ~1023u;  // [kBlockM, kDp]
  const u32 k_tiles = q_tile + K::kQTileBytes;                        // kStages x [kBlockN, kDp]
  const u32 v_tiles = k_tiles + kStages * K::kKvTileBytes;            // kStages x [kBlockN, kDp]
  unsigned char* q_tile_pointer = shared_bytes + (q_tile - shared_address(shared_bytes));

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warpgroup = warp / 4;
  // Causal rows near the end see the most keys: launch them first so the tail is short.
  const int m_block = K::kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / p.group_size;
  const int m0 = m_block * kBlockM;
  const int warp_row0 = warp * 16;  // first row of this warp within the block

  const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                 m0 * p.q_seq_stride;
  const u16* k =
      static_cast<const u16*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
  const u16* v =
      static_cast<const u16*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
  u16* o = static_cast<u16*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
           m0 * p.o_seq_stride;
  float* lse = p.lse ? p.lse + (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q : 0;

  // Causal, bottom-right aligned: row i sees keys j <= i + diagonal (attention_common.h).
  namespace fa = flashjit_attention;
  const int diagonal = fa::diagonal(p);
  const int n_blocks = fa::key_blocks<K::kCausal>(p, diagonal, m0, kBlockM, kBlockN);

  // Accumulator layout (per warp, as mma.sync m16n8 tiles): lane holds rows lane/4 and
  // lane/4 + 8, columns 2 * (lane % 4) + {0, 1} of each 8-column tile.
  const int frag_row = lane / 4;
  const int frag_col = 2 * (lane % 4);

  // Descriptors of this warpgroup's 64 Q rows and of K/V buffer 0.
  const u64 q_desc = smem_descriptor(q_tile + warpgroup * 64 * 128, 16, 1024);
  const u64 k_desc0 = smem_descriptor(k_tiles, 16, 1024);
  const u64 v_desc0 = smem_descriptor(v_tiles, kBlockN * 128, 1024);

  float acc[kPvChunks][kPvChunk / 2];  // O: [16 rows of this warp, kDp], fp32
  float s[kNTiles * 4];                // S: [16 rows, kBlockN], fp32
  u32 p_prev[kBlockN / 16][4];         // P of the previous block: A fragments per 16-key step
  float row_max[2], row_sum[2];        // m (raw score units) and this lane's partial l
#pragma unroll
  for (int c = 0; c < kPvChunks; ++c)
#pragma unroll
    for (int i = 0; i < kPvChunk / 2; ++i) acc[c][i] = 0.f;
#pragma unroll
  for (int t = 0; t < kBlockN / 16; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) p_prev[t][e] = 0u;
  row_max[0] = row_max[1] = minus_infinity();
  row_sum[0] = row_sum[1] = 0.f;

  // Load group g carries K_g and V_{g-1} (what iteration g reads); group 0 also carries Q.
  auto load_group = [&](int g) {
    if (g < n_blocks)
      wg_load_tile_async<K, kBlockN>(k_tiles + (g % kStages) * K::kKvTileBytes,
                                     k + g * kBlockN * p.k_seq_stride, p.k_seq_stride,
                                     p.seqlen_k - g * kBlockN);
    if (g >= 1 && g - 1 < n_blocks)
      wg_load_tile_async<K, kBlockN>(v_tiles + ((g - 1) % kStages) * K::kKvTileBytes,
                                     v + (g - 1) * kBlockN * p.v_seq_stride, p.v_seq_stride,
                                     p.seqlen_k - (g - 1) * kBlockN);
    cp_async_commit();
  };
  if (n_blocks > 0) {
    wg_load_tile_async<K, kBlockM>(q_tile, q, p.q_seq_stride, p.seqlen_q - m0);
#pragma unroll
    for (int g = 0; g < kStages - 1; ++g) load_group(g);
  }

  // Iteration j reads K_j (S_j = Q K_j^T) and V_{j-1} (O += P_{j-1} V_{j-1}). Its first
  // (j = 0: no P V yet) and last (j = n: no S) are peeled off, so that every wgmma below is
  // unconditional: ptxas serializes all wgmmas of a kernel where a branch leaves it unsure which
  // accumulators are in flight.
  auto wait_for_group = [&](int j) {
    cp_async_wait<kStages - 2>();  // this thread's copies of group j have landed
    fence_proxy_async();           // ... and are visible to wgmma
    __syncthreads();               // everyone's have; every wgmma of iteration j - 1 is done
    // Refill: K_{j+S-1} replaces K_{j-1}, V_{j+S-2} replaces V_{j-2}; both were read last time.
    load_group(j + kStages - 1);
  };
  auto issue_s = [&](int j) {  // S = Q K_j^T
    const u64 k_desc = advance(k_desc0, (j % kStages) * K::kKvTileBytes);
#pragma unroll
    for (int kk = 0; kk < kDp / 16; ++kk) {  // 16 head-dim columns per step
      const u32 q_step = (kk / 4) * (kBlockM * 128) + (kk % 4) * 32;
      const u32 k_step = (kk / 4) * (kBlockN * 128) + (kk % 4) * 32;
      if (kk == 0)
        Wgmma<kBlockN, K::kIsBf16>::ss_first(s, advance(q_desc, q_step), advance(k_desc, k_step));
      else
        Wgmma<kBlockN, K::kIsBf16>::ss(s, advance(q_desc, q_step), advance(k_desc, k_step), 1);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int j) {  // O += P_j V_j
    const u64 v_desc = advance(v_desc0, (j % kStages) * K::kKvTileBytes);
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t)  // 16 keys per step
#pragma unroll
      for (int c = 0; c < kPvChunks; ++c)
        Wgmma<kPvChunk, K::kIsBf16>::rs(
            acc[c], p_prev[t], advance(v_desc, t * 16 * 128 + c * (kPvChunk / 64) * kBlockN * 128),
            1);
    wgmma_commit();
  };
  // Mask S_j, fold it into m and l, write P_j to p_next; returns the rescale factor of O per half.
  u32 p_next[kBlockN / 16][4];
  float correction[2];
  auto softmax = [&](int j) {
    // Keys past seqlen_k and, when causal, above the diagonal: only blocks crossing an edge.
    const int n0 = j * kBlockN;
    if (fa::block_needs_mask<K::kCausal>(p, diagonal, m0, n0, kBlockN)) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + warp_row0 + frag_row + half * 8;
        const int limit = fa::last_key<K::kCausal>(p, diagonal, row) - (n0 + frag_col);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (nt * 8 + e > limit) s[nt * 4 + 2 * half + e] = minus_infinity();
      }
    }
    // Online softmax, base 2, scale folded into one FMA per score; P packed to 16 bits.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float block_max = row_max[half];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
        block_max = fmaxf(block_max, fmaxf(s[nt * 4 + 2 * half], s[nt * 4 + 2 * half + 1]));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
      // A row that has seen no key yet has max -inf; subtract 0 instead so exp2 gives 0, not NaN.
      const float max_scaled = fa::scaled_row_max(block_max, p.scale_log2);
      correction[half] = fast_exp2(row_max[half] * p.scale_log2 - max_scaled);
      row_max[half] = block_max;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const float p0 = fast_exp2(fmaf(s[nt * 4 + 2 * half], p.scale_log2, -max_scaled));
        const float p1 = fast_exp2(fmaf(s[nt * 4 + 2 * half + 1], p.scale_log2, -max_scaled));
        sum += p0 + p1;
        // Key tiles (2t, 2t + 1) form k-step t's A fragment: {row, row + 8} x {tile 2t, 2t + 1}.
        p_next[nt / 2][(nt % 2) * 2 + half] = pack2<K::kIsBf16>(p0, p1);
      }
      row_sum[half] = row_sum[half] * correction[half] + sum;
    }
  };
  auto rescale_and_advance = [&] {  // O *= correction (P V of the old max is done); P_prev = P
#pragma unroll
    for (int c = 0; c < kPvChunks; ++c)
#pragma unroll
      for (int i = 0; i < kPvChunk / 2; ++i) acc[c][i] *= correction[(i / 2) % 2];
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) p_prev[t][e] = p_next[t][e];
  };

  if (n_blocks > 0) {
    wait_for_group(0);  // S_0
    wgmma_fence();
    issue_s(0);
    wgmma_wait<0>();
    pin(s);
    softmax(0);
    rescale_and_advance();
    for (int j = 1; j < n_blocks; ++j) {  // S_j with P_{j-1} V_{j-1} in flight
      wait_for_group(j);
      wgmma_fence();  // acc (rescaled) and p_prev (written) are ready for the tensor cores
      issue_s(j);
      issue_pv(j - 1);
      wgmma_wait<1>();  // S_j is done; P_{j-1} V_{j-1} may still run
      pin(s);
      softmax(j);
      wgmma_wait<0>();  // P_{j-1} V_{j-1} is done: acc holds blocks < j at the old max
      pin(p_prev);
#pragma unroll
      for (int c = 0; c < kPvChunks; ++c) pin(acc[c]);
      rescale_and_advance();
    }
    wait_for_group(n_blocks);  // P_{n-1} V_{n-1}
    wgmma_fence();
    issue_pv(n_blocks - 1);
    wgmma_wait<0>();
    pin(p_prev);
#pragma unroll
    for (int c = 0; c < kPvChunks; ++c) pin(acc[c]);
  }
  cp_async_wait<0>();

  // Epilogue: O = acc / l into this warp's own rows of the Q tile (only its warpgroup's wgmmas
  // read those rows, all finished), then 16-byte coalesced stores. LSE from the quad leaders.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = row_sum[half];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inverse = sum > 0.f ? 1.f / sum : 0.f;  // a row with no keys: O = 0
    const int row = warp_row0 + frag_row + half * 8;
#pragma unroll
    for (int c = 0; c < kPvChunks; ++c)
#pragma unroll
      for (int dt = 0; dt < kPvChunk / 8; ++dt) {
        const u32 packed = pack2<K::kIsBf16>(acc[c][dt * 4 + 2 * half] * inverse,
                                             acc[c][dt * 4 + 2 * half + 1] * inverse);
        const int col = c * kPvChunk + dt * 8 + frag_col;
        *reinterpret_cast<u32*>(q_tile_pointer + wg_tile_offset<K, kBlockM>(row, col)) = packed;
      }
    if (lse && lane % 4 == 0 && m0 + row < p.seqlen_q) {
      lse[m0 + row] =
          fa::row_lse(row_max[half], p.scale_log2, sum, [](float x) { return fast_log2(x); });
    }
  }
  __syncwarp();
  constexpr int kCopies = 16 * K::kChunksPerRow / 32;
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const int copy = lane + i * 32;
    const int row = warp_row0 + copy / K::kChunksPerRow;
    const int col = copy % K::kChunksPerRow * 8;
    if (m0 + row < p.seqlen_q && col < K::kHeadDim) {
      *reinterpret_cast<Vec16*>(o + row * p.o_seq_stride + col) =
          *reinterpret_cast<const Vec16*>(q_tile_pointer + wg_tile_offset<K, kBlockM>(row, col));
    }
  }
}

}  // namespace flashjit_kernel
