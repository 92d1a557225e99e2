// flashjit CPU attention forward: FlashAttention's algorithm on the host, compiled by Clang at run
// time with -O3 for the host CPU (every ISA feature it has: AVX2, AVX-512, FMA).
//
// One work item = (batch, head, block of kBlockM query rows). For each item:
//   Q block -> fp32, pre-scaled by scale * log2(e) (the softmax works in base 2);
//   for each block of kBlockN keys (only up to the causal diagonal):
//     K block -> fp32, transposed (d x kBlockN); V block -> fp32 (kBlockN x d)
//     S = Q K^T                          (register tiles: 4 rows x 16 keys)
//     mask (past seqlen_k, causal);  online softmax: new row max m', P = exp2(S - m'),
//     l = l * exp2(m - m') + rowsum(P);  O = O * exp2(m - m') + P V   (fp32 accumulate)
//   O /= l, stored in the storage type; lse = (m + log2 l) * ln 2 (natural log).
// A row with no visible key (causal, seqlen_q > seqlen_k) gets O = 0 and lse = +inf.
//
// The L1/L2 caches play the role of shared memory: the generator (generator/cpu_config.hpp) keeps
// the scratch of one work item (kScratchFloats below) within the L2 budget.
//
// Nothing is included: the host's malloc/free and log2f are resolved by the JIT from the process.
// The rendered source prepends attention_params.h and appends one Traits instantiation.

namespace flashjit_cpu {

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

extern "C" void* aligned_alloc(unsigned long alignment, unsigned long size);
extern "C" void free(void* pointer);

enum Storage { kF16 = 0, kBF16 = 1 };

template <int HeadDim, int BlockM, int BlockN, int StorageType, bool Causal>
struct Traits {
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockM = BlockM;
  static constexpr int kBlockN = BlockN;
  static constexpr int kStorage = StorageType;
  static constexpr bool kCausal = Causal;
  static_assert(HeadDim >= 8 && HeadDim <= 256 && HeadDim % 8 == 0,
                "head_dim must be a multiple of 8 in [8, 256]");
  static_assert(BlockM >= 4 && BlockM <= 256 && BlockM % 4 == 0,
                "block_m must be a multiple of 4 (the row tile) in [4, 256]");
  static_assert(BlockN >= 16 && BlockN <= 256 && BlockN % 16 == 0,
                "block_n must be a multiple of 16 (the key tile) in [16, 256]");
  static_assert(StorageType == kF16 || StorageType == kBF16, "storage must be fp16 or bf16");
  // Columns of the P V tile: 16 floats when the head dim allows, else 8.
  static constexpr int kVecD = HeadDim % 16 == 0 ? 16 : 8;
  // fp32 scratch of one work item: Q, K^T, V, S, O blocks, row max and row sum.
  static constexpr i64 kScratchFloats = (i64)BlockM * HeadDim + 2 * (i64)BlockN * HeadDim +
                                        (i64)BlockM * BlockN + (i64)BlockM * HeadDim + 2 * BlockM;
};

typedef float f32x8 __attribute__((ext_vector_type(8)));
typedef float f32x16 __attribute__((ext_vector_type(16)));

template <int N>
struct Vec;
template <>
struct Vec<8> {
  typedef f32x8 type;
};
template <>
struct Vec<16> {
  typedef f32x16 type;
};

template <class V>
inline V load(const float* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof(V));
  return v;
}
template <class V>
inline void store(float* p, V v) {
  __builtin_memcpy(p, &v, sizeof(V));
}

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
inline float to_float(u16 h) {
  return S == kBF16 ? bf16_to_float(h) : fp16_to_float(h);
}
template <int S>
inline u16 from_float(float value) {
  return S == kBF16 ? float_to_bf16(value) : float_to_fp16(value);
}

// 2^x for x <= 0 (the softmax's only range), relative error ~1e-7; 0 below -126 and for -inf.
inline float exp2_nonpositive(float x) {
  const float clamped = x < -126.0f ? -126.0f : x;
  const float whole = __builtin_floorf(clamped);
  const float f = clamped - whole;  // [0, 1)
  // Taylor series of 2^f = e^(f ln 2) to degree 7: error < 1.3e-6 * 2^f at f -> 1.
  float p = 1.525273380405984e-05f;
  p = p * f + 1.5403530393381608e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.618129107628477e-03f;
  p = p * f + 5.550410866482158e-02f;
  p = p * f + 2.402265069591007e-01f;
  p = p * f + 6.931471805599453e-01f;
  p = p * f + 1.0f;
  const float scale = bits_to_float((u32)((int)whole + 127) << 23);
  return x < -126.0f ? 0.0f : p * scale;
}

inline int min_int(int a, int b) { return a < b ? a : b; }

template <class T>
struct Kernel {
  static constexpr int D = T::kHeadDim;
  static constexpr int BM = T::kBlockM;
  static constexpr int BN = T::kBlockN;
  static constexpr int VD = T::kVecD;
  typedef typename Vec<VD>::type VecD;

  // One work item: query rows [m_block * BM, +BM) of (batch b, head h).
  static void block(const FlashjitAttentionParams& p, int b, int h, int m_block, float* scratch) {
    float* __restrict qs = scratch;            // [BM][D], scaled into log2 units
    float* __restrict kt = qs + BM * D;        // [D][BN], K block transposed
    float* __restrict vs = kt + D * BN;        // [BN][D]
    float* __restrict s = vs + BN * D;         // [BM][BN], scores, then probabilities
    float* __restrict acc = s + BM * BN;       // [BM][D], O accumulator
    float* __restrict row_max = acc + BM * D;  // [BM]
    float* __restrict row_sum = row_max + BM;  // [BM]
    const float kNegInf = -__builtin_inff();

    const int q0 = m_block * BM;
    const int rows = min_int(BM, p.seqlen_q - q0);
    const int rows4 = (rows + 3) & ~3;  // row tiles of 4; padding rows are zero and discarded
    const int hk = h / p.group_size;
    const u16* q = (const u16*)p.q + b * p.q_batch_stride + h * p.q_head_stride;
    const u16* k = (const u16*)p.k + b * p.k_batch_stride + hk * p.k_head_stride;
    const u16* v = (const u16*)p.v + b * p.v_batch_stride + hk * p.v_head_stride;

    for (int i = 0; i < rows4; ++i) {
      const u16* q_row = q + (i64)(q0 + (i < rows ? i : 0)) * p.q_seq_stride;
      const float keep = i < rows ? p.scale_log2 : 0.0f;
      for (int c = 0; c < D; ++c) qs[i * D + c] = to_float<T::kStorage>(q_row[c]) * keep;
      for (int c = 0; c < D; ++c) acc[i * D + c] = 0.0f;
      row_max[i] = kNegInf;
      row_sum[i] = 0.0f;
    }

    // Causal (bottom-right aligned): query i sees key j iff j <= i + diag.
    const int diag = p.seqlen_k - p.seqlen_q;
    int kv_end = p.seqlen_k;
    if (T::kCausal) kv_end = min_int(kv_end, q0 + rows - 1 + diag + 1);

    for (int n0 = 0; n0 < kv_end; n0 += BN) {
      const int cols = min_int(BN, p.seqlen_k - n0);
      for (int j = 0; j < BN; ++j) {
        const bool in = j < cols;
        const u16* k_row = k + (i64)(n0 + (in ? j : 0)) * p.k_seq_stride;
        const u16* v_row = v + (i64)(n0 + (in ? j : 0)) * p.v_seq_stride;
        const float keep = in ? 1.0f : 0.0f;
        for (int c = 0; c < D; ++c) kt[c * BN + j] = to_float<T::kStorage>(k_row[c]) * keep;
        for (int c = 0; c < D; ++c) vs[j * D + c] = to_float<T::kStorage>(v_row[c]) * keep;
      }

      // S = Q K^T, in register tiles of 4 rows x 16 keys.
      for (int i = 0; i < rows4; i += 4) {
        for (int j = 0; j < BN; j += 16) {
          f32x16 s0 = 0, s1 = 0, s2 = 0, s3 = 0;
          for (int c = 0; c < D; ++c) {
            const f32x16 kv = load<f32x16>(kt + c * BN + j);
            s0 += qs[(i + 0) * D + c] * kv;
            s1 += qs[(i + 1) * D + c] * kv;
            s2 += qs[(i + 2) * D + c] * kv;
            s3 += qs[(i + 3) * D + c] * kv;
          }
          store(s + (i + 0) * BN + j, s0);
          store(s + (i + 1) * BN + j, s1);
          store(s + (i + 2) * BN + j, s2);
          store(s + (i + 3) * BN + j, s3);
        }
      }

      // Mask, online softmax.
      for (int i = 0; i < rows4; ++i) {
        float* __restrict s_row = s + i * BN;
        int limit = i < rows ? cols : 0;
        if (T::kCausal) limit = min_int(limit, q0 + i + diag - n0 + 1);
        float block_max = kNegInf;
        for (int j = 0; j < BN; ++j) {
          const float x = j < limit ? s_row[j] : kNegInf;
          s_row[j] = x;
          block_max = block_max > x ? block_max : x;
        }
        const float m_new = row_max[i] > block_max ? row_max[i] : block_max;
        if (m_new == kNegInf) {  // nothing visible yet: P = 0, state unchanged
          for (int j = 0; j < BN; ++j) s_row[j] = 0.0f;
          continue;
        }
        const float alpha = exp2_nonpositive(row_max[i] - m_new);
        float sum = 0.0f;
        for (int j = 0; j < BN; ++j) {
          const float pj = exp2_nonpositive(s_row[j] - m_new);
          s_row[j] = pj;
          sum += pj;
        }
        row_sum[i] = row_sum[i] * alpha + sum;
        row_max[i] = m_new;
        for (int c = 0; c < D; ++c) acc[i * D + c] *= alpha;
      }

      // O += P V, in register tiles of 4 rows x VD columns.
      for (int i = 0; i < rows4; i += 4) {
        for (int c = 0; c < D; c += VD) {
          VecD o0 = load<VecD>(acc + (i + 0) * D + c);
          VecD o1 = load<VecD>(acc + (i + 1) * D + c);
          VecD o2 = load<VecD>(acc + (i + 2) * D + c);
          VecD o3 = load<VecD>(acc + (i + 3) * D + c);
          for (int j = 0; j < BN; ++j) {
            const VecD vv = load<VecD>(vs + j * D + c);
            o0 += s[(i + 0) * BN + j] * vv;
            o1 += s[(i + 1) * BN + j] * vv;
            o2 += s[(i + 2) * BN + j] * vv;
            o3 += s[(i + 3) * BN + j] * vv;
          }
          store(acc + (i + 0) * D + c, o0);
          store(acc + (i + 1) * D + c, o1);
          store(acc + (i + 2) * D + c, o2);
          store(acc + (i + 3) * D + c, o3);
        }
      }
    }

    // O = acc / l in the storage type; lse in natural log.
    u16* o = (u16*)p.o + b * p.o_batch_stride + h * p.o_head_stride;
    for (int i = 0; i < rows; ++i) {
      u16* o_row = o + (i64)(q0 + i) * p.o_seq_stride;
      const float l = row_sum[i];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      for (int c = 0; c < D; ++c) o_row[c] = from_float<T::kStorage>(acc[i * D + c] * inv);
      if (p.lse) {
        const float lse =
            l > 0.0f ? (row_max[i] + __builtin_log2f(l)) * 0.6931471805599453f : __builtin_inff();
        p.lse[((i64)b * p.heads_q + h) * p.seqlen_q + q0 + i] = lse;
      }
    }
  }

  // Work items [begin, end) of batch x heads_q x ceil(seqlen_q / BM), m_block fastest.
  // Returns 0, or 1 when the scratch could not be allocated.
  static int run(const FlashjitAttentionParams& p, int begin, int end) {
    float* scratch =
        (float*)aligned_alloc(64, (unsigned long)((T::kScratchFloats * 4 + 63) & ~63LL));
    if (!scratch) return 1;
    const int m_blocks = (p.seqlen_q + BM - 1) / BM;
    for (int w = begin; w < end; ++w) {
      const int m_block = w % m_blocks;
      const int head = (w / m_blocks) % p.heads_q;
      const int batch = w / m_blocks / p.heads_q;
      block(p, batch, head, m_block, scratch);
    }
    free(scratch);
    return 0;
  }
};

}  // namespace flashjit_cpu
