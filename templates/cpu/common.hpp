// Shared pieces of the CPU templates (templates/cpu/attention_fwd.hpp, attention_bwd.hpp): the
// storage types and their bit-exact conversions, the 16-lane vector type, a vector exp2 for the
// softmax, and the bf16 pair helpers around vdpbf16ps. The rendered source prepends
// attention_params.h and this file to the pass's template.
//
// Nothing is included: the host's aligned_alloc/free and log2f are resolved by the JIT from the
// process.

namespace flashjit_cpu {

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

extern "C" void* aligned_alloc(unsigned long alignment, unsigned long size);
extern "C" void free(void* pointer);

enum Storage { kF16 = 0, kBF16 = 1, kF32 = 2 };

// The element type of q, k, v and o in memory.
template <int S>
struct StorageElement {
  typedef u16 type;  // fp16 and bf16 bit patterns
};
template <>
struct StorageElement<kF32> {
  typedef float type;
};

constexpr int kLanes = 16;  // floats per f32x16 (one AVX-512 register, two AVX2 registers)

// The host has vdpbf16ps (Clang defines the macro from the target features it compiles for).
// FLASHJIT_CPU_EMULATE_DOT_BF16, defined before this file, takes the bf16 dot-product paths on
// any host with the two instructions emulated in plain vector code (the tests' way to check
// those paths' indexing on a host without AVX512_BF16; slow, never rendered by the generator).
#if defined(__AVX512BF16__) || defined(FLASHJIT_CPU_EMULATE_DOT_BF16)
#define FLASHJIT_CPU_DOT_BF16 1
#else
#define FLASHJIT_CPU_DOT_BF16 0
#endif

// Register tiles for the host's vector registers (the forward's and the backward's): kTileVectors
// f32x16 accumulators in rows of kTileLaneVectors, with the operands of one step (a row of lane
// vectors and a broadcast) beside them:
//   AVX-512  32 zmm: 16 accumulators, rows of 4 vectors (64 lanes): 16 + 4 + 1 registers;
//   AVX2     16 ymm: 6 accumulators of 1 vector (12 ymm, 1.5x the 8 FMAs in flight that a
//            4-cycle latency on 2 pipes needs), + 2 + 1;
//   SSE      16 xmm: 2 accumulators of 1 vector (8 xmm), + 4 + 1.
#if defined(__AVX512F__)
constexpr int kTileVectors = 16;
constexpr int kTileLaneVectors = 4;
#elif defined(__AVX__)
constexpr int kTileVectors = 6;
constexpr int kTileLaneVectors = 1;
#else
constexpr int kTileVectors = 2;
constexpr int kTileLaneVectors = 1;
#endif

// The lane vectors of a register tile over a block of `rows` lanes (up to kTileLaneVectors: 64
// rows with AVX-512, 16 with AVX2), and the streamed rows or head dims that go with `vectors` of
// them (kTileVectors accumulators in all, at most 8 rows): AVX-512 4 x 4, AVX2 1 x 6 (16 lanes in
// two ymm: the 6 x 16 tile of an AVX2 GEMM kernel, 12 accumulators + 2 + 1 of 16 ymm).
constexpr int tile_lane_vectors(int rows) {
  return rows / kLanes >= kTileLaneVectors ? kTileLaneVectors : rows / kLanes;
}
constexpr int tile_dims(int vectors) {
  return kTileVectors / vectors >= 8 ? 8 : kTileVectors / vectors;
}

// The first members of a CPU kernel's traits: its template parameters as constants and the
// head-dim rule every kernel checks (each traits struct adds its own after them).
#define FLASHJIT_CPU_TRAITS_SHAPE(HeadDim, BlockM, BlockN, StorageType, Causal) \
  static constexpr int kHeadDim = HeadDim;                                      \
  static constexpr int kBlockM = BlockM;                                        \
  static constexpr int kBlockN = BlockN;                                        \
  static constexpr int kStorage = StorageType;                                  \
  static constexpr bool kCausal = Causal;                                       \
  static_assert(HeadDim >= 8 && HeadDim <= 256 && HeadDim % 8 == 0,             \
                "head_dim must be a multiple of 8 in [8, 256]")

// The first members of a CPU kernel over traits T (cpu/attention_fwd.hpp's Kernel, the backward's,
// decode's): the shape under the short names the kernels use, and the storage's element type.
#define FLASHJIT_CPU_KERNEL_SHAPE(T)    \
  static constexpr int D = T::kHeadDim; \
  static constexpr int BM = T::kBlockM; \
  static constexpr int BN = T::kBlockN; \
  typedef typename StorageElement<T::kStorage>::type Element

// A compile-time int as a value (tile sizes through generic lambdas).
template <int N>
struct Int {
  static constexpr int value = N;
  constexpr operator int() const { return N; }  // a static stride where an int is read (tiles)
};

typedef float f32x16 __attribute__((ext_vector_type(16)));
typedef int i32x16 __attribute__((ext_vector_type(16)));

// Unaligned vector loads and stores of floats (V: f32x16 here, f32x8 in cpu/decode.hpp).
template <class V = f32x16>
inline V load(const float* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
template <class V>
inline void store(float* p, V v) {
  static_assert(sizeof(V) >= 32, "a vector (a scalar would store one float)");
  __builtin_memcpy(p, &v, sizeof(v));
}
inline f32x16 vmax(f32x16 a, f32x16 b) { return a > b ? a : b; }

inline float bits_to_float(u32 bits) { return __builtin_bit_cast(float, bits); }
inline u32 float_to_bits(float value) { return __builtin_bit_cast(u32, value); }

// ---- storage conversions (bit-exact, branch-free so that loops over them vectorize) ----------

// bf16 -> fp32 is a shift.
inline float bf16_to_float(u16 h) { return bits_to_float((u32)h << 16); }

// fp16 -> fp32, exact for every input (normals, subnormals, inf, NaN).
inline float fp16_to_float(u16 h) {
  const u32 sign = (u32)(h & 0x8000u) << 16;
  const u32 exponent_mantissa = (u32)(h & 0x7fffu) << 13;
  const u32 exponent = exponent_mantissa & (0x7c00u << 13);
  const float normal = bits_to_float(exponent_mantissa + ((127 - 15) << 23));
  const float inf_nan = bits_to_float(exponent_mantissa + ((255 - 31) << 23));
  // A subnormal (or zero) is mantissa * 2^-24: scale the 10 mantissa bits as an integer.
  const float subnormal = (float)(h & 0x03ffu) * 5.9604644775390625e-8f;
  const float magnitude = exponent == 0                 ? subnormal
                          : exponent == (0x7c00u << 13) ? inf_nan
                                                        : normal;
  return bits_to_float(float_to_bits(magnitude) | sign);
}

// fp32 -> bf16, round to nearest even; NaN stays NaN.
inline u16 float_to_bf16(float value) {
  const u32 bits = float_to_bits(value);
  const u32 rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return (bits & 0x7fffffffu) > 0x7f800000u ? (u16)((bits >> 16) | 0x40u) : (u16)rounded;
}

// fp32 -> fp16, round to nearest even (overflow to inf, subnormals, NaN).
inline u16 float_to_fp16(float value) {
  const u32 bits = float_to_bits(value);
  const u32 sign = (bits >> 16) & 0x8000u;
  const u32 magnitude = bits & 0x7fffffffu;
  // Subnormal results: adding 0.5 makes the FPU round the mantissa into the low bits.
  const u32 subnormal = float_to_bits(bits_to_float(magnitude) + 0.5f) - 0x3f000000u;
  const u32 normal =
      (magnitude + ((u32)(15 - 127) << 23) + 0xfffu + ((magnitude >> 13) & 1u)) >> 13;
  u32 out = magnitude < 0x38800000u ? subnormal : normal;
  out = magnitude >= 0x477ff000u ? 0x7c00u : out;  // rounds to >= 65520: infinity
  out = magnitude > 0x7f800000u ? 0x7e00u : out;   // NaN
  return (u16)(out | sign);
}

template <int S>
inline float to_float(typename StorageElement<S>::type x) {
  if constexpr (S == kF32)
    return x;
  else if constexpr (S == kBF16)
    return bf16_to_float(x);
  else
    return fp16_to_float(x);
}
template <int S>
inline typename StorageElement<S>::type from_float(float value) {
  if constexpr (S == kF32)
    return value;
  else if constexpr (S == kBF16)
    return float_to_bf16(value);
  else
    return float_to_fp16(value);
}

// dst[c] = src[c] * scale for c < N (a multiple of 8): one row of K, V, Q or dO converted to
// fp32 when packed. fp16 on a host with F16C: vcvtph2ps, 8 at a time (exact, as fp16_to_float;
// a signaling NaN comes out quiet); otherwise to_float, which the loop vectorizes.
template <int S, int N>
inline void convert_row(const typename StorageElement<S>::type* __restrict src,
                        float* __restrict dst, float scale) {
  static_assert(N % 8 == 0, "rows are a multiple of 8 elements");
#if defined(__F16C__)
  if constexpr (S == kF16) {
    typedef short i16x8 __attribute__((ext_vector_type(8)));
    typedef float f32x8 __attribute__((ext_vector_type(8)));
    for (int c = 0; c < N; c += 8) {
      i16x8 h;
      __builtin_memcpy(&h, src + c, sizeof(h));
      const f32x8 f = __builtin_ia32_vcvtph2ps256(h) * scale;
      __builtin_memcpy(dst + c, &f, sizeof(f));
    }
    return;
  }
#endif
  for (int c = 0; c < N; ++c) dst[c] = to_float<S>(src[c]) * scale;
}

// 2^x for x <= 0 (the softmax's only range), 16 lanes; exactly 0 from -126.5 down and for -inf,
// NaN stays NaN. x = n + f with n = round(x), f in [-1/2, 1/2]; 2^f by its Taylor series to
// degree 6 (relative error < 2e-7), 2^n by building the exponent bits: n = -127 (x clamped there)
// gives exponent bits 0, so 2^n = 0 exactly, with no select (clamp and all: 13 instructions).
inline f32x16 exp2_nonpositive(f32x16 x) {
  const f32x16 clamped = x < -127.0f ? -127.0f : x;  // vmaxps, which keeps a NaN x
  const f32x16 n = __builtin_elementwise_floor(clamped + 0.5f);
  const f32x16 f = clamped - n;
  f32x16 p = 1.5403530393381608e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.618129107628477e-03f;
  p = p * f + 5.550410866482158e-02f;
  p = p * f + 2.402265069591007e-01f;
  p = p * f + 6.931471805599453e-01f;
  p = p * f + 1.0f;
  const i32x16 exponent = (__builtin_convertvector(n, i32x16) + 127) << 23;
  const f32x16 scale = __builtin_bit_cast(f32x16, exponent);
  return p * scale;
}

inline int min_int(int a, int b) { return a < b ? a : b; }

// One past the last key that query rows [q0, q0 + rows) see: seqlen_k, or for a causal mask
// (bottom-right aligned: query i sees key j iff j <= i + diag) the last row's diagonal + 1.
template <bool Causal>
inline int key_end(const FlashjitAttentionParams& p, int q0, int rows, int diag) {
  return Causal ? min_int(p.seqlen_k, q0 + rows - 1 + diag + 1) : p.seqlen_k;
}

// The lane indices 0, 1, ..., 15 of a vector.
inline i32x16 lane_indices() {
  const i32x16 lanes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lanes;
}

// Asks for `bytes` from `p` on, a cache line at a time, ahead of their use (prefetcht1).
inline void prefetch(const void* p, int bytes) {
  for (int x = 0; x < bytes; x += 64) __builtin_prefetch((const char*)p + x, 0, 2);
}

// acc[i] += a[2i] b[2i] + a[2i+1] b[2i+1] over bf16 pairs, fp32 accumulation (vdpbf16ps: the
// products of two bf16 are exact in fp32, so this is as precise as two fp32 FMAs, at twice their
// rate). Only called when the host has AVX512_BF16 (Traits::kDotBf16).
inline f32x16 dot_bf16_pairs(f32x16 acc, i32x16 a, i32x16 b) {
#if defined(__AVX512BF16__)
  return __builtin_ia32_dpbf16ps_512(acc, a, b);
#elif FLASHJIT_CPU_DOT_BF16  // emulated: both products are exact in fp32
  const f32x16 a_lo = __builtin_bit_cast(f32x16, a << 16);
  const f32x16 a_hi = __builtin_bit_cast(f32x16, a & (int)0xffff0000u);
  const f32x16 b_lo = __builtin_bit_cast(f32x16, b << 16);
  const f32x16 b_hi = __builtin_bit_cast(f32x16, b & (int)0xffff0000u);
  return acc + a_lo * b_lo + a_hi * b_hi;
#else
  (void)a, (void)b;
  return acc;
#endif
}

inline i32x16 load_pairs(const u32* p) {
  i32x16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void store_pairs(u32* p, i32x16 v) { __builtin_memcpy(p, &v, sizeof(v)); }
// Two adjacent bf16 elements as one 32-bit word (the low one first).
inline u32 pair_at(const u16* p) {
  u32 word;
  __builtin_memcpy(&word, p, sizeof(word));
  return word;
}
// The operands of a tile step: 16 lanes of fp32 values or of bf16 pairs, and acc + x * b, an
// fp32 FMA with a broadcast x or, over bf16 pairs, vdpbf16ps (dot_bf16_pairs).
inline f32x16 load_lanes(const float* p) { return load(p); }
inline i32x16 load_lanes(const u32* p) { return load_pairs(p); }
inline f32x16 multiply_add(f32x16 acc, float x, f32x16 b) { return acc + x * b; }
inline f32x16 multiply_add(f32x16 acc, u32 x, i32x16 b) { return dot_bf16_pairs(acc, b, (int)x); }
// bf16 pairs (lo[i], hi[i]) from two fp32 vectors, each rounded to the nearest bf16 (even on
// ties): vcvtne2ps2bf16 gives [lo[0..15], hi[0..15]] as 32 bf16, one shuffle interleaves them.
// Only called when the host has AVX512_BF16 (Traits::kDotBf16).
inline i32x16 pack_bf16_pairs(f32x16 lo, f32x16 hi) {
#if FLASHJIT_CPU_DOT_BF16 && !defined(__AVX512BF16__)  // emulated: round to nearest even
  typedef unsigned u32x16 __attribute__((ext_vector_type(16)));
  const u32x16 l = __builtin_bit_cast(u32x16, lo), h = __builtin_bit_cast(u32x16, hi);
  const u32x16 l16 = (l + 0x7fffu + ((l >> 16) & 1u)) >> 16;
  const u32x16 h16 = (h + 0x7fffu + ((h >> 16) & 1u)) >> 16;
  return __builtin_bit_cast(i32x16, l16 | (h16 << 16));
#elif FLASHJIT_CPU_DOT_BF16
  typedef short i16x32 __attribute__((ext_vector_type(32)));
  const i16x32 halves = __builtin_ia32_cvtne2ps2bf16_512(hi, lo);
  return __builtin_bit_cast(
      i32x16,
      __builtin_shufflevector(halves, halves, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7,
                              23, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31));
#else
  (void)lo, (void)hi;
  return 0;
#endif
}

// 32 fp32 values, lo[0..15] then hi[0..15], as 32 bf16 in that order (16 pairs of neighbours:
// (lo[0], lo[1]), ..., (hi[14], hi[15])), each rounded to the nearest bf16 (even on ties):
// vcvtne2ps2bf16 alone. Only called when the host has AVX512_BF16 (Traits::kDotBf16).
inline i32x16 pack_bf16_row(f32x16 lo, f32x16 hi) {
#if FLASHJIT_CPU_DOT_BF16 && !defined(__AVX512BF16__)  // emulated: round to nearest even
  typedef unsigned u32x16 __attribute__((ext_vector_type(16)));
  const u32x16 l = __builtin_bit_cast(u32x16, lo), h = __builtin_bit_cast(u32x16, hi);
  const u32x16 l16 = (l + 0x7fffu + ((l >> 16) & 1u)) >> 16;
  const u32x16 h16 = (h + 0x7fffu + ((h >> 16) & 1u)) >> 16;
  const u32x16 even =
      __builtin_shufflevector(l16, h16, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const u32x16 odd =
      __builtin_shufflevector(l16, h16, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return __builtin_bit_cast(i32x16, even | (odd << 16));
#elif FLASHJIT_CPU_DOT_BF16
  return __builtin_bit_cast(i32x16, __builtin_ia32_cvtne2ps2bf16_512(hi, lo));
#else
  (void)lo, (void)hi;
  return 0;
#endif
}

// The register tile acc[t][v] of rows t0 + t (t < TT) and lanes g + 16 v (v < LV) of a [..][RS]
// block of floats: zeroed and stored by the scores tiles below (inlined: each compiles as its own
// loops did; the accumulate tiles keep theirs, which compiled differently through these).
template <int TT, int LV>
__attribute__((always_inline)) inline void zero_tile(f32x16 (&acc)[TT][LV]) {
  for (int t = 0; t < TT; ++t)
    for (int v = 0; v < LV; ++v) acc[t][v] = 0.0f;
}
template <int RS, int TT, int LV>
__attribute__((always_inline)) inline void store_tile(const f32x16 (&acc)[TT][LV],
                                                      float* __restrict block, int t0, int g) {
  for (int t = 0; t < TT; ++t)
    for (int v = 0; v < LV; ++v) store(block + (t0 + t) * RS + g + v * kLanes, acc[t][v]);
}

// ---- the two tile shapes (fp32 FMAs, then bf16 pairs) ------------------------------------------
// L lanes in the owned block (LV vectors of them per tile), rows of length D in the streamed one.

// out[r0 + a][g + 16 v] = sum_{c < D} a[r0 + a][c] * bt[c][g + 16 v]     (a < RT, v < LV)
// a: [rows][D] with rows a_stride floats apart (Int<D>: a packed block, the offsets constants; an
// i64: a tensor's row stride, fp32 rows read where they are), bt: [D][L], out: [rows][L].
template <int D, int L, int RT, int LV, class Stride>
__attribute__((noinline)) void scores_tile(const float* __restrict a, Stride a_stride,
                                           const float* __restrict bt, float* __restrict out,
                                           int r0, int g) {
  f32x16 acc[RT][LV];
  zero_tile(acc);
  // Pointers stepped along c (the rows' offsets are loop invariants: no index arithmetic in the
  // loop).
  const float* a_c = a + (i64)r0 * a_stride;
  const float* b_c = bt + g;
  for (int c = 0; c < D; ++c, ++a_c, b_c += L) {
    f32x16 b[LV];
    for (int v = 0; v < LV; ++v) b[v] = load(b_c + v * kLanes);
    for (int r = 0; r < RT; ++r) {
      const float x = a_c[r * a_stride];
      for (int v = 0; v < LV; ++v) acc[r][v] += x * b[v];
    }
  }
  store_tile<L>(acc, out, r0, g);
}

// acc[c0 + a][g + 16 v] = acc[..] * scale[g + 16 v] + sum_{r < rows} a(r, c0 + a) * y[r][g + 16 v]
// (a < CT, v < LV; scale = 1 when row_scale is null: the forward's O rescale by alpha, fused)
// a(r, c) = a[r * ar + c * AC] (ar = Int<D> or a tensor's row stride (i64), AC = 1: a row-major
// [rows][D]; ar = Int<1>, AC = BN: dS [BM][BN] read as dS^T), y: [rows][YS], acc: [..][CS].
// E = float: fp32 FMAs. E = u32: the same over the bf16 pairs of rows (r, r + 1), vdpbf16ps:
// `rows` counts row pairs, a(r / 2, c) and y[r / 2][x] are pairs (one function body, each
// instance compiles as its own copy did).
template <int AC, int YS, int CS, int CT, int LV, class E, class Stride>
__attribute__((noinline)) void accumulate_tile(const E* __restrict a, Stride ar,
                                               const E* __restrict y, float* __restrict acc_t,
                                               int rows, int c0, int g,
                                               const float* __restrict row_scale = nullptr) {
  f32x16 acc[CT][LV];
  for (int c = 0; c < CT; ++c)
    for (int v = 0; v < LV; ++v) acc[c][v] = load(acc_t + (c0 + c) * CS + g + v * kLanes);
  if (row_scale)
    for (int v = 0; v < LV; ++v)
      for (int c = 0; c < CT; ++c) acc[c][v] *= load(row_scale + g + v * kLanes);
  const E* a_r = a + (i64)c0 * AC;  // stepped along r, as y_r
  const E* y_r = y + g;
  for (int r = 0; r < rows; ++r, a_r += ar, y_r += YS) {
    decltype(load_lanes(y_r)) b[LV];
    for (int v = 0; v < LV; ++v) b[v] = load_lanes(y_r + v * kLanes);
    for (int c = 0; c < CT; ++c) {
      const E x = a_r[c * AC];
      for (int v = 0; v < LV; ++v) acc[c][v] = multiply_add(acc[c][v], x, b[v]);
    }
  }
  for (int c = 0; c < CT; ++c)
    for (int v = 0; v < LV; ++v) store(acc_t + (c0 + c) * CS + g + v * kLanes, acc[c][v]);
}

// As scores_tile over the bf16 pairs (c, c + 1): a's rows read in place (a_rows[r], bf16), bt
// packed as pairs btp[c / 2][x].
template <int D, int L, int RT, int LV>
__attribute__((noinline)) void scores_tile_dot(const u16* const* a_rows, const u32* __restrict btp,
                                               float* __restrict out, int r0, int g) {
  f32x16 acc[RT][LV];
  zero_tile(acc);
  for (i64 c = 0; c < D; c += 2) {
    i32x16 b[LV];
    for (int v = 0; v < LV; ++v) b[v] = load_pairs(btp + (c / 2) * L + g + v * kLanes);
    for (int r = 0; r < RT; ++r) {
      const i32x16 x = (int)pair_at(a_rows[r] + c);
      for (int v = 0; v < LV; ++v) acc[r][v] = dot_bf16_pairs(acc[r][v], b[v], x);
    }
  }
  store_tile<L>(acc, out, r0, g);
}

// f(start, Int<size>()) over [0, count) (count even): tiles of Big, then at most one of 4 (when
// Big > 4), then tiles of 2.
template <int Big, class F>
inline void for_each_tile(int count, F f) {
  int start = 0;
  for (; start + Big <= count; start += Big) f(start, Int<Big>());
  if constexpr (Big > 4) {
    if (start + 4 <= count) f(start, Int<4>()), start += 4;
  }
  for (; start < count; start += 2) f(start, Int<2>());
}

}  // namespace flashjit_cpu
