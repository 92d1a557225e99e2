#include "array_checks.hpp"

#include <limits>
#include <utility>

namespace flashjit::python {

std::string dtype_name(const ArrayDtype& dtype) {
  std::string kind;
  switch (dtype.code) {
    case kDlpackInt:
      kind = "int";
      break;
    case kDlpackUInt:
      kind = "uint";
      break;
    case kDlpackFloat:
      kind = "float";
      break;
    case kDlpackBfloat:
      kind = "bfloat";
      break;
    case kDlpackComplex:
      kind = "complex";
      break;
    case kDlpackBool:
      return "bool";
    default:
      kind = "dtype" + std::to_string(dtype.code) + "_";
  }
  // Built by appending: gcc 12 warns falsely (-Wrestrict) on "literal" + std::string&&.
  std::string name = kind + std::to_string(dtype.bits);
  if (dtype.lanes != 1) {
    name += "x";
    name += std::to_string(dtype.lanes);
  }
  return name;
}

Result<Layout> check_layout(const std::string& text) {
  if (text == "bshd" || text == "BSHD") return Layout::BSHD;
  if (text == "bhsd" || text == "BHSD") return Layout::BHSD;
  return make_error(ErrorCode::InvalidArgument,
                    "layout = '" + text +
                        "': must be 'bshd' (batch, seqlen, heads, head_dim; flash_attn) or 'bhsd' "
                        "(batch, heads, seqlen, head_dim; torch SDPA)");
}

Result<size_t> array_bytes(const std::vector<size_t>& shape, int bits) {
  size_t elements = 1;
  size_t total_bits = 0;
  bool overflow = false;
  for (size_t extent : shape)
    overflow = overflow || __builtin_mul_overflow(elements, extent, &elements);
  overflow = overflow || __builtin_mul_overflow(elements, static_cast<size_t>(bits), &total_bits);
  if (overflow) {
    return make_error(ErrorCode::InvalidArgument,
                      "an output of " + std::to_string(shape.size()) + " axes of " +
                          std::to_string(bits) + "-bit elements is larger than memory can hold");
  }
  return std::max<size_t>(1, total_bits / 8);
}

namespace {

Error invalid(std::string message) { return make_error(ErrorCode::InvalidArgument, message); }

bool is_float(const ArrayDtype& dtype, int bits) {
  return dtype.code == kDlpackFloat && dtype.bits == bits && dtype.lanes == 1;
}

bool same_dtype(const ArrayDtype& a, const ArrayDtype& b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

// The element types attention() takes. float32 is DType::F32: the CPU backend runs it, the CUDA
// backend refuses it with its own Unsupported error.
Result<DType> element_type(const char* name, const ArrayDtype& dtype) {
  if (is_float(dtype, 16)) return DType::F16;
  if (dtype.code == kDlpackBfloat && dtype.bits == 16 && dtype.lanes == 1) return DType::BF16;
  if (is_float(dtype, 32)) return DType::F32;
  return invalid(std::string(name) + ".dtype = " + dtype_name(dtype) +
                 ": must be float16, bfloat16 or float32");
}

Result<Place> place_of(const char* name, const ArrayInfo& array) {
  const int type = array.device_type;
  if (type == kDlpackCpu || type == kDlpackCudaHost) return Place{"cpu", 0};
  if (type == kDlpackCuda || type == kDlpackCudaManaged) return Place{"cuda", array.device_id};
  return make_error(ErrorCode::Unsupported, std::string(name) + " is on a device of DLPack type " +
                                                std::to_string(type) +
                                                ": flashjit runs on CUDA devices and on the CPU");
}

std::string shape_text(const ArrayInfo& array) {
  std::string text = "(";
  for (size_t i = 0; i < array.ndim(); ++i) {
    if (i) text += ", ";
    text += std::to_string(array.shape[i]);
  }
  return text + (array.ndim() == 1 ? ",)" : ")");
}

enum class Axis { Batch = 0, Seq = 1, Head = 2 };

// The array axis that holds `axis` in `layout`.
size_t axis_index(Layout layout, Axis axis) {
  if (axis == Axis::Batch) return 0;
  const bool seq_first = layout == Layout::BSHD;
  if (axis == Axis::Seq) return seq_first ? 1 : 2;
  return seq_first ? 2 : 1;
}

const char* layout_axes(Layout layout) {
  return layout == Layout::BSHD ? "(batch, seqlen, heads, head_dim)"
                                : "(batch, heads, seqlen, head_dim)";
}

// One 4-D attention tensor read through `layout`.
struct TensorView {
  int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  Strides strides;
};

Result<TensorView> view_of(const char* name, const ArrayInfo& array, Layout layout) {
  if (array.ndim() != 4 || array.strides.size() != 4) {
    return invalid(std::string(name) + ".ndim = " + std::to_string(array.ndim()) + " (shape " +
                   shape_text(array) + "): must be 4, " + layout_axes(layout) + " for layout " +
                   to_string(layout));
  }
  if (array.shape[3] > 1 && array.strides[3] != 1) {
    return invalid(std::string(name) +
                   " is not contiguous in its last (head_dim) dimension (stride " +
                   std::to_string(array.strides[3]) +
                   "): flashjit needs stride 1 there; make it contiguous first");
  }
  // A size-1 axis is never stepped over, so its stride is irrelevant (frameworks report various
  // values there).
  auto stride = [&](Axis axis) -> int64_t {
    const size_t index = axis_index(layout, axis);
    return array.shape[index] == 1 ? 0 : array.strides[index];
  };
  TensorView view;
  view.batch = static_cast<int64_t>(array.shape[axis_index(layout, Axis::Batch)]);
  view.seqlen = static_cast<int64_t>(array.shape[axis_index(layout, Axis::Seq)]);
  view.heads = static_cast<int64_t>(array.shape[axis_index(layout, Axis::Head)]);
  view.head_dim = static_cast<int64_t>(array.shape[3]);
  view.strides = {stride(Axis::Batch), stride(Axis::Seq), stride(Axis::Head)};
  return view;
}

Status same_place(const Place& place, const char* name, const Place& other) {
  if (!(other == place)) {
    return invalid("device mismatch: q is on " + place.to_string() + " but " + name + " is on " +
                   other.to_string());
  }
  return ok_status();
}

// `array` (named `name`) has the shape, dtype and place of `like` (named `like_name`, on
// `place`): returns its strides through `layout`.
Result<Strides> strides_like(const char* name, const ArrayInfo& array, const char* like_name,
                             const ArrayInfo& like, const Place& place, Layout layout) {
  if (shape_text(array) != shape_text(like)) {
    return invalid(std::string(name) + ".shape = " + shape_text(array) + ": must equal " +
                   like_name + ".shape = " + shape_text(like));
  }
  if (!same_dtype(array.dtype, like.dtype)) {
    return invalid(std::string(name) + ".dtype = " + dtype_name(array.dtype) + ": must match " +
                   like_name + ".dtype = " + dtype_name(like.dtype));
  }
  Result<Place> other = place_of(name, array);
  FLASHJIT_TRY(other);
  FLASHJIT_TRY(same_place(place, name, *other));
  Result<TensorView> view = view_of(name, array, layout);
  FLASHJIT_TRY(view);
  return view->strides;
}

// The log-sum-exp of q's rows: float32, (batch, heads, seqlen_q), contiguous, on `place`.
Status check_lse(const ArrayInfo& lse, const TensorView& q, const Place& place) {
  if (!is_float(lse.dtype, 32)) {
    return invalid("lse.dtype = " + dtype_name(lse.dtype) + ": must be float32");
  }
  Result<Place> lse_place = place_of("lse", lse);
  FLASHJIT_TRY(lse_place);
  FLASHJIT_TRY(same_place(place, "lse", *lse_place));
  const bool shape_ok = lse.ndim() == 3 && lse.strides.size() == 3 &&
                        static_cast<int64_t>(lse.shape[0]) == q.batch &&
                        static_cast<int64_t>(lse.shape[1]) == q.heads &&
                        static_cast<int64_t>(lse.shape[2]) == q.seqlen;
  if (!shape_ok) {
    return invalid("lse.shape = " + shape_text(lse) + ": must be (batch, heads, seqlen_q) = (" +
                   std::to_string(q.batch) + ", " + std::to_string(q.heads) + ", " +
                   std::to_string(q.seqlen) + ")");
  }
  // q's extents are not validated yet: a product that overflows cannot be lse's stride.
  int64_t row_stride = 0;
  const bool fits = !__builtin_mul_overflow(q.heads, q.seqlen, &row_stride);
  const bool contiguous = (q.seqlen == 1 || lse.strides[2] == 1) &&
                          (q.heads == 1 || lse.strides[1] == q.seqlen) &&
                          (q.batch == 1 || (fits && lse.strides[0] == row_stride));
  if (!contiguous) return invalid("lse must be contiguous");
  return ok_status();
}

// ALiBi's slopes: float32 [heads_q], contiguous, on q's device (the kernels read slopes[head]).
Status check_alibi_slopes(const ArrayInfo& slopes, const TensorView& q, const Place& place) {
  if (!is_float(slopes.dtype, 32)) {
    return invalid("alibi_slopes.dtype = " + dtype_name(slopes.dtype) +
                   ": must be float32 (one slope per query head)");
  }
  if (slopes.ndim() != 1 || slopes.strides.size() != 1 ||
      static_cast<int64_t>(slopes.shape[0]) != q.heads) {
    return invalid("alibi_slopes.shape = " + shape_text(slopes) + ": must be (heads_q,) = (" +
                   std::to_string(q.heads) + ",), one slope per query head");
  }
  if (q.heads > 1 && slopes.strides[0] != 1) {
    return invalid("alibi_slopes must be contiguous (stride " + std::to_string(slopes.strides[0]) +
                   ")");
  }
  Result<Place> at = place_of("alibi_slopes", slopes);
  FLASHJIT_TRY(at);
  if (!(*at == place)) {
    return invalid("alibi_slopes is on " + at->to_string() + ": must be on q's device, " +
                   place.to_string());
  }
  return ok_status();
}

// An int32 array of `shape` (row-major contiguous: the kernels index it so) on `place`; `what`
// says what it holds, for the messages.
Status check_int32_table(const char* name, const ArrayInfo& array, const std::vector<size_t>& shape,
                         const std::string& what, const Place& place) {
  if (array.dtype.code != kDlpackInt || array.dtype.bits != 32 || array.dtype.lanes != 1) {
    return invalid(std::string(name) + ".dtype = " + dtype_name(array.dtype) + ": must be int32 (" +
                   what + ")");
  }
  ArrayInfo expected;
  expected.shape = shape;
  if (array.shape != shape) {
    return invalid(std::string(name) + ".shape = " + shape_text(array) + ": must be " +
                   shape_text(expected) + " (" + what + ")");
  }
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] > 1 && array.strides[i] != stride) {
      return invalid(std::string(name) + " must be contiguous (row-major): stride " +
                     std::to_string(array.strides[i]) + " on axis " + std::to_string(i) +
                     ", expected " + std::to_string(stride));
    }
    const bool fits = shape[i] <= static_cast<size_t>(INT64_MAX) &&
                      !__builtin_mul_overflow(stride, static_cast<int64_t>(shape[i]), &stride);
    if (!fits) {
      return invalid(std::string(name) + ".shape = " + shape_text(array) +
                     ": more elements than an int64 counts");
    }
  }
  Result<Place> at = place_of(name, array);
  FLASHJIT_TRY(at);
  if (!(*at == place)) {
    return invalid(std::string(name) + " is on " + at->to_string() + ": must be on q's device, " +
                   place.to_string());
  }
  return ok_status();
}

}  // namespace

Status make_varlen_call(Call& call, const ArrayInfo& cu_seqlens_q, const ArrayInfo& cu_seqlens_k,
                        int64_t max_seqlen_q, int64_t max_seqlen_k) {
  AttentionProblem& p = call.problem;
  if (p.batch != 1 || p.variant.varlen)
    return invalid("cu_seqlens_q: packed variable-length documents take q, k, v of 3 axes " +
                   std::string("(total, heads, head_dim)"));
  if (cu_seqlens_q.ndim() != 1 || cu_seqlens_q.shape[0] < 2)
    return invalid("cu_seqlens_q.shape = " + shape_text(cu_seqlens_q) +
                   ": must be (num_docs + 1,) with num_docs >= 1");
  const size_t entries = cu_seqlens_q.shape[0];
  FLASHJIT_TRY(check_int32_table("cu_seqlens_q", cu_seqlens_q, {entries},
                                 "the row offsets of the documents in q", call.place));
  FLASHJIT_TRY(check_int32_table("cu_seqlens_k", cu_seqlens_k, {entries},
                                 "the row offsets of the documents in k and v, as many as "
                                 "cu_seqlens_q's",
                                 call.place));
  p.variant.varlen = true;
  p.variant.total_q = p.seqlen_q;
  p.variant.total_k = p.seqlen_k;
  p.batch = static_cast<int64_t>(entries) - 1;
  p.seqlen_q = max_seqlen_q;
  p.seqlen_k = max_seqlen_k;
  for (Strides* s : {&p.q_strides, &p.k_strides, &p.v_strides, &p.o_strides, &p.do_strides,
                     &p.dq_strides, &p.dk_strides, &p.dv_strides})
    s->batch = 0;
  return validate(p);
}

Result<Call> check_decode_arrays(const ArrayInfo& q, const ArrayInfo& k_cache,
                                 const ArrayInfo& v_cache, const ArrayInfo* block_table,
                                 const ArrayInfo* seqlens_k, const ArrayInfo* out,
                                 const ArrayInfo* lse, bool causal, std::optional<double> scale) {
  if (block_table == nullptr) {  // K and V contiguous (batch, seqlen_k, heads_kv, head_dim)
    Result<Call> call = check_forward_arrays(q, k_cache, v_cache, out, lse, causal, scale, "bshd");
    FLASHJIT_TRY(call);
    if (seqlens_k != nullptr) {
      FLASHJIT_TRY(check_int32_table(
          "seqlens_k", *seqlens_k, {static_cast<size_t>(call->problem.batch)},
          "the key count of each sequence, each <= k_cache.shape[1]", call->place));
      call->problem.kv.seqlens_k = true;
      FLASHJIT_TRY(validate(call->problem));
    }
    return call;
  }
  // Paged: k_cache and v_cache (num_pages, page_size, heads_kv, head_dim). Checked as a
  // contiguous cache whose batch axis is the pages (same dtype, place, heads and head dims; the
  // page stride becomes the batch stride, as the paged problem reads it), then made paged.
  if (seqlens_k == nullptr) {
    return invalid(
        "seqlens_k is None: a paged cache (block_table given) needs the key count of each "
        "sequence, int32 (batch,)");
  }
  if (q.ndim() != 4 || k_cache.ndim() != 4) {
    return invalid("q.shape = " + shape_text(q) + ", k_cache.shape = " + shape_text(k_cache) +
                   ": a paged decode takes q (batch, seqlen_q, heads_q, head_dim) and k_cache, "
                   "v_cache (num_pages, page_size, heads_kv, head_dim)");
  }
  const size_t num_pages = k_cache.shape[0];
  if (num_pages == 0) return invalid("k_cache.shape = " + shape_text(k_cache) + ": no pages");
  ArrayInfo k_view = k_cache, v_view = v_cache;
  k_view.shape[0] = q.shape[0];
  if (v_cache.ndim() == 4 && v_cache.shape == k_cache.shape) v_view.shape[0] = q.shape[0];
  Result<Call> call = check_forward_arrays(q, k_view, v_view, out, lse, causal, scale, "bshd");
  if (!call.ok() && v_view.shape != k_view.shape) {
    return invalid("v_cache.shape = " + shape_text(v_cache) +
                   ": must equal k_cache.shape = " + shape_text(k_cache));
  }
  FLASHJIT_TRY(call);
  AttentionProblem& p = call->problem;
  if (block_table->ndim() != 2 || block_table->shape[0] != static_cast<size_t>(p.batch)) {
    return invalid("block_table.shape = " + shape_text(*block_table) +
                   ": must be (batch, max_pages) = (" + std::to_string(p.batch) +
                   ", pages per sequence), int32 page indices");
  }
  FLASHJIT_TRY(check_int32_table("block_table", *block_table, block_table->shape,
                                 "page indices into k_cache, in [0, num_pages)", call->place));
  FLASHJIT_TRY(check_int32_table("seqlens_k", *seqlens_k, {static_cast<size_t>(p.batch)},
                                 "the key count of each sequence, each <= max_pages * page_size",
                                 call->place));
  const int64_t page_size = p.seqlen_k;  // k_view's seqlen axis
  const int64_t max_pages = static_cast<int64_t>(block_table->shape[1]);
  int64_t capacity = 0;
  if (max_pages == 0 || __builtin_mul_overflow(max_pages, page_size, &capacity)) {
    return invalid("block_table.shape = " + shape_text(*block_table) +
                   ": needs 1 or more pages per sequence (max_pages * page_size keys)");
  }
  if (page_size < kMinPageSize || page_size > kMaxPageSize || page_size % 16 != 0) {
    return invalid("k_cache.shape = " + shape_text(k_cache) + ": page_size " +
                   std::to_string(page_size) + " (axis 1) must be a multiple of 16 in [" +
                   std::to_string(kMinPageSize) + ", " + std::to_string(kMaxPageSize) + "]");
  }
  p.seqlen_k = capacity;
  p.kv.page_size = static_cast<int>(page_size);
  p.kv.num_pages = static_cast<int64_t>(num_pages);
  p.kv.max_pages = max_pages;
  p.kv.seqlens_k = true;
  FLASHJIT_TRY(validate(p));
  return call;
}

Result<Call> check_forward_arrays(const ArrayInfo& q, const ArrayInfo& k, const ArrayInfo& v,
                                  const ArrayInfo* out, const ArrayInfo* lse, bool causal,
                                  std::optional<double> scale, const std::string& layout_name,
                                  const Variant& variant, const ArrayInfo* alibi_slopes) {
  const Result<Layout> layout = check_layout(layout_name);
  FLASHJIT_TRY(layout);
  const Result<DType> dtype = element_type("q", q.dtype);
  FLASHJIT_TRY(dtype);
  for (const auto& [name, array] : {std::pair<const char*, const ArrayInfo*>{"k", &k}, {"v", &v}}) {
    if (!same_dtype(array->dtype, q.dtype)) {
      return invalid(std::string(name) + ".dtype = " + dtype_name(array->dtype) +
                     ": must match q.dtype = " + dtype_name(q.dtype));
    }
  }
  const Result<Place> place = place_of("q", q);
  FLASHJIT_TRY(place);
  for (const auto& [name, array] : {std::pair<const char*, const ArrayInfo*>{"k", &k}, {"v", &v}}) {
    const Result<Place> other = place_of(name, *array);
    FLASHJIT_TRY(other);
    FLASHJIT_TRY(same_place(*place, name, *other));
  }

  const Result<TensorView> qv = view_of("q", q, *layout);
  FLASHJIT_TRY(qv);
  const Result<TensorView> kv = view_of("k", k, *layout);
  FLASHJIT_TRY(kv);
  const Result<TensorView> vv = view_of("v", v, *layout);
  FLASHJIT_TRY(vv);
  if (shape_text(k) != shape_text(v)) {
    return invalid("v.shape = " + shape_text(v) + ": must equal k.shape = " + shape_text(k));
  }
  if (kv->batch != qv->batch) {
    return invalid("k.shape = " + shape_text(k) + ": batch " + std::to_string(kv->batch) +
                   " must equal q's " + std::to_string(qv->batch) + " (layout " +
                   to_string(*layout) + " " + layout_axes(*layout) + ")");
  }
  if (kv->head_dim != qv->head_dim) {
    return invalid("k.shape = " + shape_text(k) + ": head_dim " + std::to_string(kv->head_dim) +
                   " must equal q's " + std::to_string(qv->head_dim));
  }
  if (qv->head_dim > kMaxHeadDim || qv->head_dim < kMinHeadDim || qv->head_dim % 8 != 0) {
    return invalid("head_dim = " + std::to_string(qv->head_dim) + " (q.shape " + shape_text(q) +
                   "): must be a multiple of 8 in [" + std::to_string(kMinHeadDim) + ", " +
                   std::to_string(kMaxHeadDim) + "]");
  }

  AttentionProblem problem;
  problem.batch = qv->batch;
  problem.heads_q = qv->heads;
  problem.heads_kv = kv->heads;
  problem.seqlen_q = qv->seqlen;
  problem.seqlen_k = kv->seqlen;
  problem.head_dim = static_cast<int>(qv->head_dim);
  problem.dtype = *dtype;
  problem.causal = causal;
  if (scale) problem.softmax_scale = static_cast<float>(*scale);
  problem.q_strides = qv->strides;
  problem.k_strides = kv->strides;
  problem.v_strides = vv->strides;
  problem.o_strides = qv->strides;  // replaced by out's below

  if (out != nullptr) {
    const Result<Strides> strides = strides_like("out", *out, "q", q, *place, *layout);
    FLASHJIT_TRY(strides);
    problem.o_strides = *strides;
  }
  if (lse != nullptr) FLASHJIT_TRY(check_lse(*lse, *qv, *place));
  problem.variant = variant;
  problem.variant.alibi = alibi_slopes != nullptr;
  if (alibi_slopes != nullptr) FLASHJIT_TRY(check_alibi_slopes(*alibi_slopes, *qv, *place));
  FLASHJIT_TRY(validate(problem));
  return Call{*place, problem};
}

Result<Call> check_backward_arrays(const ArrayInfo& q, const ArrayInfo& k, const ArrayInfo& v,
                                   const ArrayInfo& o, const ArrayInfo* lse, const ArrayInfo& d_o,
                                   const ArrayInfo* dq, const ArrayInfo* dk, const ArrayInfo* dv,
                                   bool causal, std::optional<double> scale,
                                   const std::string& layout_name, bool deterministic,
                                   const Variant& variant, const ArrayInfo* alibi_slopes) {
  Result<Call> call = check_forward_arrays(q, k, v, nullptr, nullptr, causal, scale, layout_name,
                                           variant, alibi_slopes);
  FLASHJIT_TRY(call);
  const Layout layout = *check_layout(layout_name);
  AttentionProblem& p = call->problem;
  const Place& place = call->place;
  p.pass = Pass::Backward;
  p.deterministic = deterministic;
  const Result<Strides> o_strides = strides_like("o", o, "q", q, place, layout);
  FLASHJIT_TRY(o_strides);
  p.o_strides = *o_strides;
  const Result<Strides> do_strides = strides_like("do", d_o, "q", q, place, layout);
  FLASHJIT_TRY(do_strides);
  p.do_strides = *do_strides;
  if (lse == nullptr) {
    return invalid(
        "lse is None: the backward pass needs the forward's log-sum-exp, float32 (batch, heads, "
        "seqlen_q): o, lse = flashjit.attention(q, k, v, ..., return_lse=True)");
  }
  const Result<TensorView> qv = view_of("q", q, layout);
  FLASHJIT_TRY(qv);
  FLASHJIT_TRY(check_lse(*lse, *qv, place));
  // Gradients the caller did not pass are allocated contiguous in the layout, like q and k.
  const Strides dkv = contiguous_strides(layout, p.seqlen_k, p.heads_kv, p.head_dim);
  const std::tuple<const char*, const ArrayInfo*, const char*, const ArrayInfo*, Strides*, Strides>
      gradients[] = {{"dq", dq, "q", &q, &p.dq_strides,
                      contiguous_strides(layout, p.seqlen_q, p.heads_q, p.head_dim)},
                     {"dk", dk, "k", &k, &p.dk_strides, dkv},
                     {"dv", dv, "k", &k, &p.dv_strides, dkv}};
  for (const auto& [name, given, like_name, like, strides, contiguous] : gradients) {
    if (given == nullptr) {
      *strides = contiguous;
      continue;
    }
    const Result<Strides> given_strides =
        strides_like(name, *given, like_name, *like, place, layout);
    FLASHJIT_TRY(given_strides);
    *strides = *given_strides;
  }
  FLASHJIT_TRY(validate(p));
  return call;
}

}  // namespace flashjit::python
