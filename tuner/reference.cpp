// fp64 attention reference, half conversions and output comparison (see reference.hpp).
#include "tuner/reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

namespace flashjit {
namespace {

uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Runs `task(i)` for i in [0, count) on up to hardware_concurrency threads.
template <class Task>
void parallel_for(int64_t count, const Task& task) {
  const int64_t threads =
      std::min<int64_t>(count, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) task(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int64_t i = next++; i < count; i = next++) task(i);
    });
  }
  for (auto& thread : pool) thread.join();
}

// All 65536 patterns decoded once: the reference decodes millions of elements.
const std::vector<float>& decode_table(DType dtype) {
  static const std::vector<float> f16_table = [] {
    std::vector<float> table(65536);
    for (uint32_t bits = 0; bits < 65536; ++bits) table[bits] = fp16_to_float(bits);
    return table;
  }();
  static const std::vector<float> bf16_table = [] {
    std::vector<float> table(65536);
    for (uint32_t bits = 0; bits < 65536; ++bits) table[bits] = bf16_to_float(bits);
    return table;
  }();
  return dtype == DType::F16 ? f16_table : bf16_table;
}

// Element `index` of raw storage: through the decode table for the 16-bit dtypes.
float decode(const uint16_t* storage, int64_t index, DType dtype) {
  if (dtype == DType::F32) {
    return bits_float(static_cast<uint32_t>(storage[2 * index]) |
                      static_cast<uint32_t>(storage[2 * index + 1]) << 16);
  }
  return decode_table(dtype)[storage[index]];
}

// One tensor gathered through its strides into dense fp64 [batch, heads, seq, head_dim].
std::vector<double> gather_dense(const std::vector<uint16_t>& storage, const Strides& strides,
                                 int64_t batch, int64_t heads, int64_t seqlen, int head_dim,
                                 DType dtype) {
  std::vector<double> dense(static_cast<size_t>(batch * heads * seqlen * head_dim));
  size_t out = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t s = 0; s < seqlen; ++s) {
        const int64_t base = b * strides.batch + h * strides.head + s * strides.seq;
        for (int c = 0; c < head_dim; ++c) dense[out++] = decode(storage.data(), base + c, dtype);
      }
    }
  }
  return dense;
}

// The inputs of `problem` gathered dense: q, k, v (and for the backward d_o) as fp64
// [batch, heads, seq, head_dim].
struct DenseInputs {
  std::vector<double> q, k, v, d_o;
};
DenseInputs gather_inputs(const AttentionProblem& problem, const HostInputs& inputs) {
  auto gather = [&](const std::vector<uint16_t>& storage, const Strides& strides, bool keys) {
    return gather_dense(storage, strides, problem.batch, keys ? problem.heads_kv : problem.heads_q,
                        keys ? problem.seqlen_k : problem.seqlen_q, problem.head_dim,
                        problem.dtype);
  };
  DenseInputs dense{gather(inputs.q, problem.q_strides, false),
                    gather(inputs.k, problem.k_strides, true),
                    gather(inputs.v, problem.v_strides, true),
                    {}};
  if (problem.is_backward()) dense.d_o = gather(inputs.d_o, problem.do_strides, false);
  return dense;
}

// Number of keys query row `i` sees (0 for an empty row).
int64_t visible_keys(const AttentionProblem& problem, int64_t i) {
  if (!problem.causal) return problem.seqlen_k;
  const int64_t last = i + problem.seqlen_k - problem.seqlen_q;  // last visible key index
  return std::clamp<int64_t>(last + 1, 0, problem.seqlen_k);
}

}  // namespace

float bf16_to_float(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_bf16(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // keep sign, force a quiet NaN
  }
  // Round to nearest even; overflow carries into the exponent and correctly gives infinity.
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float fp16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1F) return bits_float(sign | 0x7F800000u | (mantissa << 13));
  return bits_float(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

uint16_t float_to_fp16(float value) {
  const uint32_t bits = float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to infinity
  if (magnitude < 0x38800000u) {
    // Below 2^-14: a subnormal half, i.e. an integer multiple of 2^-24. Scaling by 2^24 is exact
    // and nearbyint rounds to nearest even (the default rounding mode); 1024 becomes the
    // smallest normal, which the bit layout encodes the same way.
    const float scaled = std::ldexp(bits_float(magnitude), 24);
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t exponent = (magnitude >> 23) - 127 + 15;
  const uint32_t mantissa = magnitude & 0x7FFFFFu;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  const uint32_t dropped = mantissa & 0x1FFFu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) ++half;  // carry is fine
  return sign | static_cast<uint16_t>(half);
}

float half_to_float(uint16_t bits, DType dtype) {
  return dtype == DType::F16 ? fp16_to_float(bits) : bf16_to_float(bits);
}

uint16_t float_to_half(float value, DType dtype) {
  return dtype == DType::F16 ? float_to_fp16(value) : float_to_bf16(value);
}

float element_value(const uint16_t* storage, int64_t index, DType dtype) {
  return decode(storage, index, dtype);
}

void set_element(uint16_t* storage, int64_t index, float value, DType dtype) {
  if (dtype == DType::F32) {
    const uint32_t bits = float_bits(value);
    storage[2 * index] = static_cast<uint16_t>(bits);
    storage[2 * index + 1] = static_cast<uint16_t>(bits >> 16);
    return;
  }
  storage[index] = float_to_half(value, dtype);
}

std::vector<float> standard_alibi_slopes(int64_t heads) {
  std::vector<float> slopes(static_cast<size_t>(std::max<int64_t>(heads, 0)));
  for (int64_t h = 0; h < heads; ++h)
    slopes[h] = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(heads));
  return slopes;
}

std::vector<int32_t> cu_seqlens_of(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> cu(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) cu[b + 1] = cu[b] + static_cast<int32_t>(lengths[b]);
  return cu;
}

std::vector<int32_t> even_cu_seqlens(int64_t docs, int64_t total, int64_t longest) {
  std::vector<int64_t> lengths;
  int64_t left = total;
  for (int64_t b = 0; b < docs; ++b) {
    const int64_t docs_left = docs - b;
    lengths.push_back(std::max<int64_t>(0, std::min(longest, (left + docs_left - 1) / docs_left)));
    left -= lengths.back();
  }
  return cu_seqlens_of(lengths);
}

HostInputs random_inputs(const AttentionProblem& problem, uint64_t seed,
                         const VariantFunctions& functions) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](int64_t elements) {
    std::vector<uint16_t> storage(static_cast<size_t>(elements * storage_words(problem.dtype)));
    for (int64_t i = 0; i < elements; ++i)
      set_element(storage.data(), i, normal(engine), problem.dtype);
    return storage;
  };
  HostInputs inputs;
  inputs.q = fill(problem.q_span());
  inputs.k = fill(problem.kv_span());
  inputs.v = fill(problem.kv_span());
  if (problem.kv.paged()) {
    std::vector<int32_t> pages(static_cast<size_t>(problem.kv.num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), engine);
    inputs.block_table.resize(static_cast<size_t>(problem.block_table_elements()));
    for (size_t i = 0; i < inputs.block_table.size(); ++i)
      inputs.block_table[i] = pages[i % pages.size()];
  }
  if (problem.variant.alibi) inputs.alibi_slopes = standard_alibi_slopes(problem.heads_q);
  if (problem.variant.varlen) {
    inputs.cu_seqlens_q = even_cu_seqlens(problem.batch, problem.variant.total_q, problem.seqlen_q);
    inputs.cu_seqlens_k = even_cu_seqlens(problem.batch, problem.variant.total_k, problem.seqlen_k);
  }
  if (problem.kv.seqlens_k)
    inputs.seqlens_k.assign(static_cast<size_t>(problem.batch),
                            static_cast<int32_t>(problem.seqlen_k));
  if (!problem.is_backward()) return inputs;
  inputs.d_o = fill(problem.do_span());
  inputs.o = fill(problem.o_span());  // random padding; the rows are overwritten below
  set_forward_outputs(problem, inputs, functions);
  return inputs;
}

void set_forward_outputs(const AttentionProblem& problem, HostInputs& inputs,
                         const VariantFunctions& functions) {
  const Reference forward =
      reference_attention(problem.with_pass(Pass::Forward), inputs, functions);
  if (problem.variant.varlen) {  // forward.o is dense [rows, h, d], lse the packed blocks
    const int64_t row = problem.heads_q * problem.head_dim;
    const int64_t rows = static_cast<int64_t>(forward.o.size()) / row;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < problem.heads_q; ++h)
        for (int c = 0; c < problem.head_dim; ++c)
          set_element(inputs.o.data(), r * problem.o_strides.seq + h * problem.o_strides.head + c,
                      static_cast<float>(forward.o[r * row + h * problem.head_dim + c]),
                      problem.dtype);
    inputs.lse.assign(static_cast<size_t>(problem.lse_elements()),
                      std::numeric_limits<float>::infinity());
    std::copy(forward.lse.begin(), forward.lse.end(), inputs.lse.begin());
    return;
  }
  size_t index = 0;  // forward.o is dense [b, s, h, d]
  for (int64_t b = 0; b < problem.batch; ++b)
    for (int64_t s = 0; s < problem.seqlen_q; ++s)
      for (int64_t h = 0; h < problem.heads_q; ++h)
        for (int c = 0; c < problem.head_dim; ++c, ++index) {
          const int64_t offset = b * problem.o_strides.batch + s * problem.o_strides.seq +
                                 h * problem.o_strides.head + c;
          set_element(inputs.o.data(), offset, static_cast<float>(forward.o[index]), problem.dtype);
        }
  inputs.lse.assign(forward.lse.begin(), forward.lse.end());  // +inf stays +inf
}

namespace {
void add_reference_gradients(const AttentionProblem& problem, const HostInputs& inputs,
                             const VariantFunctions& functions, Reference& reference);
}  // namespace

namespace {

// Element offset of key j of sequence b, kv head h, through `strides` (paged: the block table).
int64_t cache_offset(const AttentionProblem& p, const HostInputs& inputs, const Strides& s,
                     int64_t b, int64_t j, int64_t h) {
  if (!p.kv.paged()) return b * s.batch + j * s.seq + h * s.head;
  const int64_t page = inputs.block_table[b * p.kv.max_pages + j / p.kv.page_size];
  return page * s.batch + (j % p.kv.page_size) * s.seq + h * s.head;
}

// The reference of a problem with a paged cache or per-sequence lengths: each sequence alone,
// its keys gathered into a contiguous BSHD cache.
Reference reference_per_sequence(const AttentionProblem& p, const HostInputs& inputs) {
  const int64_t dh = p.head_dim, words = storage_words(p.dtype);
  Reference out;
  out.o.assign(static_cast<size_t>(p.batch * p.seqlen_q * p.heads_q * dh), 0.0);
  out.lse.assign(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q),
                 std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = p.kv.seqlens_k ? inputs.seqlens_k[b] : p.seqlen_k;
    if (len == 0) continue;  // no key: o = 0, lse = +inf
    AttentionProblem one = AttentionProblem::make(1, p.heads_q, p.heads_kv, p.seqlen_q, len,
                                                  p.head_dim, p.dtype, p.causal);
    one.softmax_scale = p.scale();
    one.q_strides = p.q_strides;
    HostInputs gathered;
    gathered.q.assign(inputs.q.begin() + b * p.q_strides.batch * words,
                      inputs.q.begin() + (b * p.q_strides.batch + one.q_span()) * words);
    gathered.k.assign(static_cast<size_t>(one.kv_span() * words), 0);
    gathered.v.assign(static_cast<size_t>(one.kv_span() * words), 0);
    for (int64_t j = 0; j < len; ++j)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        const int64_t to = (j * p.heads_kv + h) * dh * words;
        std::copy_n(inputs.k.begin() + cache_offset(p, inputs, p.k_strides, b, j, h) * words,
                    dh * words, gathered.k.begin() + to);
        std::copy_n(inputs.v.begin() + cache_offset(p, inputs, p.v_strides, b, j, h) * words,
                    dh * words, gathered.v.begin() + to);
      }
    const Reference r = reference_attention(one, gathered);
    std::copy(r.o.begin(), r.o.end(), out.o.begin() + b * p.seqlen_q * p.heads_q * dh);
    std::copy(r.lse.begin(), r.lse.end(), out.lse.begin() + b * p.heads_q * p.seqlen_q);
  }
  return out;
}

// The reference of packed variable-length documents: each document alone, its rows sliced
// from the packed tensors, its index the batch the user expressions see. All NaN when the
// offsets do not describe documents of the problem (a reference nothing passes against).
Reference reference_per_document(const AttentionProblem& p, const HostInputs& inputs,
                                 const VariantFunctions& functions) {
  const int64_t dh = p.head_dim, words = storage_words(p.dtype), heads = p.heads_q;
  const std::vector<int32_t>& cq = inputs.cu_seqlens_q;
  const std::vector<int32_t>& ck = inputs.cu_seqlens_k;
  Reference out;
  const size_t entries = static_cast<size_t>(p.batch + 1);
  if (cq.size() != entries || ck.size() != entries ||
      !check_cu_seqlens("cu_seqlens_q", cq.data(), p.batch, p.seqlen_q, p.variant.total_q).ok() ||
      !check_cu_seqlens("cu_seqlens_k", ck.data(), p.batch, p.seqlen_k, p.variant.total_k).ok()) {
    out.o.assign(static_cast<size_t>(p.variant.total_q * heads * dh),
                 std::numeric_limits<double>::quiet_NaN());
    out.lse.assign(static_cast<size_t>(p.variant.total_q * heads),
                   std::numeric_limits<double>::quiet_NaN());
    if (p.is_backward()) {
      out.dq = out.o;
      out.dk.assign(static_cast<size_t>(p.variant.total_k * p.heads_kv * dh),
                    std::numeric_limits<double>::quiet_NaN());
      out.dv = out.dk;
    }
    return out;
  }
  const int64_t rows = cq[p.batch];
  out.o.assign(static_cast<size_t>(rows * heads * dh), 0.0);
  out.lse.assign(static_cast<size_t>(rows * heads), std::numeric_limits<double>::infinity());
  if (p.is_backward()) {  // dense [rows, heads, d] like o; dk, dv over the documents' keys
    out.dq.assign(out.o.size(), 0.0);
    out.dk.assign(static_cast<size_t>(ck[p.batch] * p.heads_kv * dh), 0.0);
    out.dv.assign(out.dk.size(), 0.0);
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len_q = cq[b + 1] - cq[b], len_k = ck[b + 1] - ck[b];
    if (len_q == 0 || len_k == 0) continue;  // no key: o = 0, lse = +inf
    AttentionProblem one = p;
    one.batch = 1;
    one.seqlen_q = len_q;
    one.seqlen_k = len_k;
    one.variant.varlen = false;
    one.variant.total_q = one.variant.total_k = 0;
    HostInputs slice;
    auto rows_of = [&](const std::vector<uint16_t>& packed, int64_t first, int64_t elements) {
      const auto begin = packed.begin() + first * words;
      const int64_t available = static_cast<int64_t>(packed.end() - begin);
      return std::vector<uint16_t>(begin, begin + std::min(elements * words, available));
    };
    slice.q = rows_of(inputs.q, cq[b] * p.q_strides.seq, one.q_span());
    slice.k = rows_of(inputs.k, ck[b] * p.k_strides.seq, one.kv_span());
    slice.v = rows_of(inputs.v, ck[b] * p.v_strides.seq, one.kv_span());
    if (p.is_backward()) slice.d_o = rows_of(inputs.d_o, cq[b] * p.do_strides.seq, one.do_span());
    slice.alibi_slopes = inputs.alibi_slopes;
    VariantFunctions document;  // the user expressions see the document's index as the batch
    if (functions.score_mod)
      document.score_mod = [&, b](double s, int64_t, int64_t h, int64_t i, int64_t j) {
        return functions.score_mod(s, b, h, i, j);
      };
    if (functions.mask_mod)
      document.mask_mod = [&, b](int64_t, int64_t h, int64_t i, int64_t j) {
        return functions.mask_mod(b, h, i, j);
      };
    const Reference r = reference_attention(one, slice, document);
    std::copy(r.o.begin(), r.o.end(), out.o.begin() + cq[b] * heads * dh);
    std::copy(r.lse.begin(), r.lse.end(), out.lse.begin() + cq[b] * heads);
    if (p.is_backward()) {
      std::copy(r.dq.begin(), r.dq.end(), out.dq.begin() + cq[b] * heads * dh);
      std::copy(r.dk.begin(), r.dk.end(), out.dk.begin() + ck[b] * p.heads_kv * dh);
      std::copy(r.dv.begin(), r.dv.end(), out.dv.begin() + ck[b] * p.heads_kv * dh);
    }
  }
  return out;
}

}  // namespace

double variant_score(const AttentionProblem& problem, const VariantFunctions& functions,
                     int64_t batch, int64_t head, int64_t i, int64_t j, double score,
                     double slope) {
  constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();
  const Variant& v = problem.variant;
  const int64_t diagonal = problem.seqlen_k - problem.seqlen_q;
  if (j >= problem.seqlen_k) return kMinusInfinity;
  const bool in_band = (!problem.causal || j <= i + diagonal) &&
                       (v.window_left < 0 || j >= i + diagonal - v.window_left) &&
                       (v.window_right < 0 || j <= i + diagonal + v.window_right);
  if (!(j < v.prefix || in_band)) return kMinusInfinity;
  if (!v.mask_mod.empty()) {
    if (!functions.mask_mod) return std::numeric_limits<double>::quiet_NaN();
    if (!functions.mask_mod(batch, head, i, j)) return kMinusInfinity;
  }
  if (v.softcap) score = *v.softcap * std::tanh(score / *v.softcap);
  if (v.alibi) score += slope * static_cast<double>(j - i);
  if (!v.score_mod.empty()) {
    if (!functions.score_mod) return std::numeric_limits<double>::quiet_NaN();
    score = functions.score_mod(score, batch, head, i, j);
  }
  return score;
}

double variant_score_grad(const AttentionProblem& problem, const VariantFunctions& functions,
                          int64_t batch, int64_t head, int64_t i, int64_t j, double score,
                          double slope) {
  const Variant& v = problem.variant;
  double grad = 1.0;
  if (v.softcap) {
    const double t = std::tanh(score / *v.softcap);
    grad = 1.0 - t * t;
    score = *v.softcap * t;
  }
  if (v.alibi) score += slope * static_cast<double>(j - i);
  if (!v.score_mod.empty()) {
    if (!functions.score_mod_grad) return std::numeric_limits<double>::quiet_NaN();
    grad *= functions.score_mod_grad(score, batch, head, i, j);
  }
  return grad;
}

Reference reference_attention(const AttentionProblem& problem, const HostInputs& inputs,
                              const VariantFunctions& functions) {
  if (problem.kv.paged() || problem.kv.seqlens_k) return reference_per_sequence(problem, inputs);
  if (problem.variant.varlen) return reference_per_document(problem, inputs, functions);
  if (problem.is_backward()) {
    Reference reference = reference_attention(problem.with_pass(Pass::Forward), inputs, functions);
    add_reference_gradients(problem, inputs, functions, reference);
    return reference;
  }
  const int64_t batch = problem.batch, heads_q = problem.heads_q, heads_kv = problem.heads_kv;
  const int64_t seqlen_q = problem.seqlen_q, seqlen_k = problem.seqlen_k;
  const int d = problem.head_dim;
  const int64_t group = heads_q / heads_kv;
  const double scale = problem.scale();

  const DenseInputs dense = gather_inputs(problem, inputs);
  const std::vector<double>& q = dense.q;
  const std::vector<double>& k = dense.k;
  const std::vector<double>& v = dense.v;
  const bool variant = problem.variant.active();

  Reference reference;
  reference.o.assign(static_cast<size_t>(batch * seqlen_q * heads_q * d), 0.0);
  reference.lse.assign(static_cast<size_t>(batch * heads_q * seqlen_q), 0.0);
  if ((!problem.variant.score_mod.empty() && !functions.score_mod) ||
      (!problem.variant.mask_mod.empty() && !functions.mask_mod) ||
      (problem.variant.alibi && inputs.alibi_slopes.size() != static_cast<size_t>(heads_q))) {
    // A user expression without its host function, or ALiBi without slopes: nothing to compare
    // against, and nothing may pass.
    std::fill(reference.o.begin(), reference.o.end(), std::numeric_limits<double>::quiet_NaN());
    std::fill(reference.lse.begin(), reference.lse.end(), std::numeric_limits<double>::quiet_NaN());
    return reference;
  }

  // Work items: (batch, head, block of kRowsPerTask query rows), so that one long head is spread
  // over all threads too. Inside an item, kRowBlock rows share each streamed K/V row.
  constexpr int64_t kRowsPerTask = 32;
  constexpr int kRowBlock = 8;
  const int64_t tasks_per_head = (seqlen_q + kRowsPerTask - 1) / kRowsPerTask;

  parallel_for(batch * heads_q * tasks_per_head, [&](int64_t task) {
    const int64_t bh = task / tasks_per_head;
    const int64_t b = bh / heads_q, h = bh % heads_q;
    const int64_t h_kv = h / group;
    const double* q_head = &q[static_cast<size_t>((b * heads_q + h) * seqlen_q * d)];
    const double* k_head = &k[static_cast<size_t>((b * heads_kv + h_kv) * seqlen_k * d)];
    const double* v_head = &v[static_cast<size_t>((b * heads_kv + h_kv) * seqlen_k * d)];
    const double slope = problem.variant.alibi ? inputs.alibi_slopes[h] : 0.0;

    std::vector<double> q_transposed(static_cast<size_t>(d) * kRowBlock);   // [d][row]
    std::vector<double> scores(static_cast<size_t>(kRowBlock * seqlen_k));  // [row][key]
    std::vector<double> accum(static_cast<size_t>(kRowBlock) * d);          // [row][d]

    const int64_t task_begin = (task % tasks_per_head) * kRowsPerTask;
    const int64_t task_end = std::min(seqlen_q, task_begin + kRowsPerTask);
    for (int64_t row0 = task_begin; row0 < task_end; row0 += kRowBlock) {
      const int rows = static_cast<int>(std::min<int64_t>(kRowBlock, task_end - row0));
      int64_t limits[kRowBlock];
      int64_t max_limit = 0;
      for (int r = 0; r < kRowBlock; ++r) {
        // A variant: every key is a candidate, variant_score hides the invisible ones.
        limits[r] = r >= rows ? 0 : variant ? problem.seqlen_k : visible_keys(problem, row0 + r);
        max_limit = std::max(max_limit, limits[r]);
        for (int c = 0; c < d; ++c) {
          q_transposed[c * kRowBlock + r] = r < rows ? q_head[(row0 + r) * d + c] : 0.0;
        }
      }

      // S = scale * Q K^T for the keys any row of the block sees.
      for (int64_t j = 0; j < max_limit; ++j) {
        const double* k_row = k_head + j * d;
        double dots[kRowBlock] = {};
        for (int c = 0; c < d; ++c) {
          const double kc = k_row[c];
          for (int r = 0; r < kRowBlock; ++r) dots[r] += q_transposed[c * kRowBlock + r] * kc;
        }
        for (int r = 0; r < kRowBlock; ++r) scores[r * seqlen_k + j] = scale * dots[r];
        if (variant)
          for (int r = 0; r < rows; ++r)
            scores[r * seqlen_k + j] = variant_score(problem, functions, b, h, row0 + r, j,
                                                     scores[r * seqlen_k + j], slope);
      }

      // Softmax weights in place, then O = P V.
      double row_max[kRowBlock], row_sum[kRowBlock];
      for (int r = 0; r < rows; ++r) {
        double* s = &scores[r * seqlen_k];
        row_max[r] = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < limits[r]; ++j) row_max[r] = std::max(row_max[r], s[j]);
        row_sum[r] = 0;
        if (row_max[r] == -std::numeric_limits<double>::infinity()) {
          limits[r] = 0;  // every key hidden: a row with no key
          continue;
        }
        for (int64_t j = 0; j < limits[r]; ++j) {
          s[j] = std::exp(s[j] - row_max[r]);
          row_sum[r] += s[j];
        }
      }
      std::fill(accum.begin(), accum.end(), 0.0);
      for (int64_t j = 0; j < max_limit; ++j) {
        const double* v_row = v_head + j * d;
        for (int r = 0; r < rows; ++r) {
          if (j >= limits[r]) continue;
          const double p = scores[r * seqlen_k + j];
          if (p == 0) continue;  // a hidden key adds nothing (its v may be anything, even NaN)
          double* out = &accum[static_cast<size_t>(r) * d];
          for (int c = 0; c < d; ++c) out[c] += p * v_row[c];
        }
      }

      for (int r = 0; r < rows; ++r) {
        const int64_t i = row0 + r;
        const size_t lse_index = static_cast<size_t>((b * heads_q + h) * seqlen_q + i);
        double* o_row = &reference.o[static_cast<size_t>(((b * seqlen_q + i) * heads_q + h) * d)];
        if (limits[r] == 0) {
          reference.lse[lse_index] = std::numeric_limits<double>::infinity();
          continue;  // o stays 0
        }
        reference.lse[lse_index] = row_max[r] + std::log(row_sum[r]);
        for (int c = 0; c < d; ++c) o_row[c] = accum[static_cast<size_t>(r) * d + c] / row_sum[r];
      }
    }
  });
  return reference;
}

namespace {

// The gradients, with the exact forward of the rounded inputs: per (batch, kv head) task, every
// query head of the group and every row, dS = P * (dP - D) one row at a time.
void add_reference_gradients(const AttentionProblem& problem, const HostInputs& inputs,
                             const VariantFunctions& functions, Reference& reference) {
  const int64_t batch = problem.batch, heads_q = problem.heads_q, heads_kv = problem.heads_kv;
  const int64_t seqlen_q = problem.seqlen_q, seqlen_k = problem.seqlen_k;
  const int d = problem.head_dim;
  const int64_t group = heads_q / heads_kv;
  const double scale = problem.scale();
  // gather_dense is [b, h, s, d]; the outputs are [b, s, h, d].
  reference.dq.assign(static_cast<size_t>(batch * seqlen_q * heads_q * d), 0.0);
  reference.dk.assign(static_cast<size_t>(batch * seqlen_k * heads_kv * d), 0.0);
  reference.dv.assign(static_cast<size_t>(batch * seqlen_k * heads_kv * d), 0.0);
  const bool variant = problem.variant.active();
  if ((!problem.variant.score_mod.empty() && !functions.score_mod_grad) ||
      (problem.variant.alibi && inputs.alibi_slopes.size() != static_cast<size_t>(heads_q))) {
    // A score_mod without its derivative or ALiBi without slopes: nothing may pass.
    for (auto* g : {&reference.dq, &reference.dk, &reference.dv})
      std::fill(g->begin(), g->end(), std::numeric_limits<double>::quiet_NaN());
    return;
  }
  const DenseInputs dense = gather_inputs(problem, inputs);
  const std::vector<double>& q = dense.q;
  const std::vector<double>& k = dense.k;
  const std::vector<double>& v = dense.v;
  const std::vector<double>& d_o = dense.d_o;

  parallel_for(batch * heads_kv, [&](int64_t task) {
    const int64_t b = task / heads_kv, h_kv = task % heads_kv;
    const double* k_head = &k[static_cast<size_t>((b * heads_kv + h_kv) * seqlen_k * d)];
    const double* v_head = &v[static_cast<size_t>((b * heads_kv + h_kv) * seqlen_k * d)];
    std::vector<double> dk(static_cast<size_t>(seqlen_k) * d, 0.0), dv(dk.size(), 0.0);
    std::vector<double> ds(static_cast<size_t>(seqlen_k)), p(ds.size());
    for (int64_t h = h_kv * group; h < (h_kv + 1) * group; ++h) {
      const double slope = problem.variant.alibi ? inputs.alibi_slopes[h] : 0.0;
      const double* q_head = &q[static_cast<size_t>((b * heads_q + h) * seqlen_q * d)];
      const double* do_head = &d_o[static_cast<size_t>((b * heads_q + h) * seqlen_q * d)];
      for (int64_t i = 0; i < seqlen_q; ++i) {
        // A variant: every key a candidate, variant_score hides the invisible ones.
        const int64_t keys = variant ? seqlen_k : visible_keys(problem, i);
        const double lse = reference.lse[static_cast<size_t>((b * heads_q + h) * seqlen_q + i)];
        if (keys == 0 || lse == std::numeric_limits<double>::infinity())
          continue;  // no key: o = 0, no gradient flows
        const double* q_row = q_head + i * d;
        const double* do_row = do_head + i * d;
        const double* o_row =
            &reference.o[static_cast<size_t>(((b * seqlen_q + i) * heads_q + h) * d)];
        double delta = 0;  // D_i = dO_i . O_i
        for (int c = 0; c < d; ++c) delta += do_row[c] * o_row[c];
        for (int64_t j = 0; j < keys; ++j) {
          double s = 0, dp = 0;
          for (int c = 0; c < d; ++c) {
            s += q_row[c] * k_head[j * d + c];
            dp += do_row[c] * v_head[j * d + c];
          }
          if (!variant) {
            p[j] = std::exp(scale * s - lse);
            ds[j] = p[j] * (dp - delta);
            continue;
          }
          // dS with respect to the scaled score: through the variant's chain factor.
          const double t = variant_score(problem, functions, b, h, i, j, scale * s, slope);
          if (t == -std::numeric_limits<double>::infinity()) {
            p[j] = ds[j] = 0;  // hidden: no probability, no gradient
            continue;
          }
          p[j] = std::exp(t - lse);
          ds[j] = p[j] * (dp - delta) *
                  variant_score_grad(problem, functions, b, h, i, j, scale * s, slope);
        }
        double* dq_row = &reference.dq[static_cast<size_t>(((b * seqlen_q + i) * heads_q + h) * d)];
        for (int64_t j = 0; j < keys; ++j) {
          const double dsj = scale * ds[j], pj = p[j];
          if (pj == 0) continue;  // a hidden key: its k and v may be anything, even NaN
          for (int c = 0; c < d; ++c) {
            dq_row[c] += dsj * k_head[j * d + c];
            dk[j * d + c] += dsj * q_row[c];
            dv[j * d + c] += pj * do_row[c];
          }
        }
      }
    }
    for (int64_t j = 0; j < seqlen_k; ++j) {
      const size_t out = static_cast<size_t>(((b * seqlen_k + j) * heads_kv + h_kv) * d);
      for (int c = 0; c < d; ++c) {
        reference.dk[out + c] = dk[j * d + c];
        reference.dv[out + c] = dv[j * d + c];
      }
    }
  });
}

}  // namespace

}  // namespace flashjit
