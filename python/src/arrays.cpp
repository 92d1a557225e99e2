#include "arrays.hpp"

#include <algorithm>
#include <utility>

#include "runtime/backend.hpp"

namespace flashjit::python {

std::string dtype_name(const nb::dlpack::dtype& dtype) {
  std::string kind;
  switch (static_cast<nb::dlpack::dtype_code>(dtype.code)) {
    case nb::dlpack::dtype_code::Int:
      kind = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      kind = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      kind = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      kind = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
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

Layout parse_layout(const std::string& text) {
  if (text == "bshd" || text == "BSHD") return Layout::BSHD;
  if (text == "bhsd" || text == "BHSD") return Layout::BHSD;
  raise(ErrorCode::InvalidArgument,
        "layout = '" + text +
            "': must be 'bshd' (batch, seqlen, heads, head_dim; flash_attn) or 'bhsd' (batch, "
            "heads, seqlen, head_dim; torch SDPA)");
}

namespace {

bool is_float(const nb::dlpack::dtype& dtype, int bits) {
  return dtype.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && dtype.bits == bits &&
         dtype.lanes == 1;
}

bool same_dtype(const nb::dlpack::dtype& a, const nb::dlpack::dtype& b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

// The element types attention() takes. float32 is DType::F32: the CPU backend runs it, the CUDA
// backend refuses it with its own Unsupported error.
DType element_type(const char* name, const nb::dlpack::dtype& dtype) {
  if (is_float(dtype, 16)) return DType::F16;
  if (dtype.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dtype.bits == 16 &&
      dtype.lanes == 1) {
    return DType::BF16;
  }
  if (is_float(dtype, 32)) return DType::F32;
  raise(ErrorCode::InvalidArgument, std::string(name) + ".dtype = " + dtype_name(dtype) +
                                        ": must be float16, bfloat16 or float32");
}

template <class Array>
Place place_of(const char* name, const Array& array) {
  const int type = array.device_type();
  const int id = array.device_id();
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value) return {"cpu", 0};
  if (type == nb::device::cuda::value || type == nb::device::cuda_managed::value) {
    return {"cuda", id};
  }
  raise(ErrorCode::Unsupported, std::string(name) + " is on a device of DLPack type " +
                                    std::to_string(type) +
                                    ": flashjit runs on CUDA devices and on the CPU");
}

template <class Array>
std::string shape_text(const Array& array) {
  std::string text = "(";
  for (size_t i = 0; i < array.ndim(); ++i) {
    if (i) text += ", ";
    text += std::to_string(array.shape(i));
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

template <class Array>
TensorView view_of(const char* name, const Array& array, Layout layout) {
  if (array.ndim() != 4) {
    raise(ErrorCode::InvalidArgument, std::string(name) +
                                          ".ndim = " + std::to_string(array.ndim()) + " (shape " +
                                          shape_text(array) + "): must be 4, " +
                                          layout_axes(layout) + " for layout " + to_string(layout));
  }
  if (array.shape(3) > 1 && array.stride(3) != 1) {
    raise(ErrorCode::InvalidArgument,
          std::string(name) + " is not contiguous in its last (head_dim) dimension (stride " +
              std::to_string(array.stride(3)) +
              "): flashjit needs stride 1 there; make it contiguous first");
  }
  // A size-1 axis is never stepped over, so its stride is irrelevant (frameworks report various
  // values there).
  auto stride = [&](Axis axis) -> int64_t {
    const size_t index = axis_index(layout, axis);
    return array.shape(index) == 1 ? 0 : array.stride(index);
  };
  TensorView view;
  view.batch = static_cast<int64_t>(array.shape(axis_index(layout, Axis::Batch)));
  view.seqlen = static_cast<int64_t>(array.shape(axis_index(layout, Axis::Seq)));
  view.heads = static_cast<int64_t>(array.shape(axis_index(layout, Axis::Head)));
  view.head_dim = static_cast<int64_t>(array.shape(3));
  view.strides = {stride(Axis::Batch), stride(Axis::Seq), stride(Axis::Head)};
  return view;
}

void same_place(const Place& place, const char* name, const Place& other) {
  if (!(other == place)) {
    raise(ErrorCode::InvalidArgument, "device mismatch: q is on " + place.to_string() + " but " +
                                          name + " is on " + other.to_string());
  }
}

// `array` (named `name`) has the shape, dtype and place of `like` (named `like_name`, on
// `place`): returns its strides through `layout`.
template <class Array>
Strides strides_like(const char* name, const Array& array, const char* like_name,
                     const InArray& like, const Place& place, Layout layout) {
  if (shape_text(array) != shape_text(like)) {
    raise(ErrorCode::InvalidArgument, std::string(name) + ".shape = " + shape_text(array) +
                                          ": must equal " + like_name +
                                          ".shape = " + shape_text(like));
  }
  if (!same_dtype(array.dtype(), like.dtype())) {
    raise(ErrorCode::InvalidArgument, std::string(name) + ".dtype = " + dtype_name(array.dtype()) +
                                          ": must match " + like_name +
                                          ".dtype = " + dtype_name(like.dtype()));
  }
  same_place(place, name, place_of(name, array));
  return view_of(name, array, layout).strides;
}

// The log-sum-exp of q's rows: float32, (batch, heads, seqlen_q), contiguous, on `place`.
template <class Array>
void check_lse(const Array& lse, const TensorView& q, const Place& place) {
  if (!is_float(lse.dtype(), 32)) {
    raise(ErrorCode::InvalidArgument,
          "lse.dtype = " + dtype_name(lse.dtype()) + ": must be float32");
  }
  same_place(place, "lse", place_of("lse", lse));
  const bool shape_ok = lse.ndim() == 3 && static_cast<int64_t>(lse.shape(0)) == q.batch &&
                        static_cast<int64_t>(lse.shape(1)) == q.heads &&
                        static_cast<int64_t>(lse.shape(2)) == q.seqlen;
  if (!shape_ok) {
    raise(ErrorCode::InvalidArgument, "lse.shape = " + shape_text(lse) +
                                          ": must be (batch, heads, seqlen_q) = (" +
                                          std::to_string(q.batch) + ", " + std::to_string(q.heads) +
                                          ", " + std::to_string(q.seqlen) + ")");
  }
  const bool contiguous = (q.seqlen == 1 || lse.stride(2) == 1) &&
                          (q.heads == 1 || lse.stride(1) == q.seqlen) &&
                          (q.batch == 1 || lse.stride(0) == q.heads * q.seqlen);
  if (!contiguous) raise(ErrorCode::InvalidArgument, "lse must be contiguous");
}

// ALiBi's slopes: float32 [heads_q], contiguous, on q's device (the kernels read slopes[head]).
void check_alibi_slopes(const InArray& slopes, const TensorView& q, const Place& place) {
  if (!is_float(slopes.dtype(), 32)) {
    raise(ErrorCode::InvalidArgument, "alibi_slopes.dtype = " + dtype_name(slopes.dtype()) +
                                          ": must be float32 (one slope per query head)");
  }
  if (slopes.ndim() != 1 || static_cast<int64_t>(slopes.shape(0)) != q.heads) {
    raise(ErrorCode::InvalidArgument, "alibi_slopes.shape = " + shape_text(slopes) +
                                          ": must be (heads_q,) = (" + std::to_string(q.heads) +
                                          ",), one slope per query head");
  }
  if (q.heads > 1 && slopes.stride(0) != 1)
    raise(ErrorCode::InvalidArgument,
          "alibi_slopes must be contiguous (stride " + std::to_string(slopes.stride(0)) + ")");
  const Place at = place_of("alibi_slopes", slopes);
  if (!(at == place)) {
    raise(ErrorCode::InvalidArgument,
          "alibi_slopes is on " + at.to_string() + ": must be on q's device, " + place.to_string());
  }
}

}  // namespace

Variant variant_of(const std::optional<nb::tuple>& spec) {
  Variant variant;
  if (!spec) return variant;
  if (spec->size() != 6) {
    raise(ErrorCode::InvalidArgument,
          "variant: expected (window_left, window_right, softcap, prefix, score_mod, mask_mod), "
          "got a tuple of " +
              std::to_string(spec->size()));
  }
  variant.window_left = nb::cast<int64_t>((*spec)[0]);
  variant.window_right = nb::cast<int64_t>((*spec)[1]);
  if (!(*spec)[2].is_none()) variant.softcap = static_cast<float>(nb::cast<double>((*spec)[2]));
  variant.prefix = nb::cast<int64_t>((*spec)[3]);
  variant.score_mod = nb::cast<std::string>((*spec)[4]);
  variant.mask_mod = nb::cast<std::string>((*spec)[5]);
  return variant;
}

Call prepare(const InArray& q, const InArray& k, const InArray& v, const OutArray* out,
             const OutArray* lse, bool causal, std::optional<double> scale,
             const std::string& layout_name, const Variant& variant, const InArray* alibi_slopes) {
  const Layout layout = parse_layout(layout_name);
  const DType dtype = element_type("q", q.dtype());
  for (const auto& [name, array] : {std::pair<const char*, const InArray*>{"k", &k}, {"v", &v}}) {
    if (!same_dtype(array->dtype(), q.dtype())) {
      raise(ErrorCode::InvalidArgument, std::string(name) +
                                            ".dtype = " + dtype_name(array->dtype()) +
                                            ": must match q.dtype = " + dtype_name(q.dtype()));
    }
  }
  const Place place = place_of("q", q);
  same_place(place, "k", place_of("k", k));
  same_place(place, "v", place_of("v", v));

  const TensorView qv = view_of("q", q, layout);
  const TensorView kv = view_of("k", k, layout);
  const TensorView vv = view_of("v", v, layout);
  if (shape_text(k) != shape_text(v)) {
    raise(ErrorCode::InvalidArgument,
          "v.shape = " + shape_text(v) + ": must equal k.shape = " + shape_text(k));
  }
  if (kv.batch != qv.batch) {
    raise(ErrorCode::InvalidArgument, "k.shape = " + shape_text(k) + ": batch " +
                                          std::to_string(kv.batch) + " must equal q's " +
                                          std::to_string(qv.batch) + " (layout " +
                                          to_string(layout) + " " + layout_axes(layout) + ")");
  }
  if (kv.head_dim != qv.head_dim) {
    raise(ErrorCode::InvalidArgument, "k.shape = " + shape_text(k) + ": head_dim " +
                                          std::to_string(kv.head_dim) + " must equal q's " +
                                          std::to_string(qv.head_dim));
  }
  if (qv.head_dim > kMaxHeadDim || qv.head_dim < kMinHeadDim || qv.head_dim % 8 != 0) {
    raise(ErrorCode::InvalidArgument, "head_dim = " + std::to_string(qv.head_dim) + " (q.shape " +
                                          shape_text(q) + "): must be a multiple of 8 in [" +
                                          std::to_string(kMinHeadDim) + ", " +
                                          std::to_string(kMaxHeadDim) + "]");
  }

  AttentionProblem problem;
  problem.batch = qv.batch;
  problem.heads_q = qv.heads;
  problem.heads_kv = kv.heads;
  problem.seqlen_q = qv.seqlen;
  problem.seqlen_k = kv.seqlen;
  problem.head_dim = static_cast<int>(qv.head_dim);
  problem.dtype = dtype;
  problem.causal = causal;
  if (scale) problem.softmax_scale = static_cast<float>(*scale);
  problem.q_strides = qv.strides;
  problem.k_strides = kv.strides;
  problem.v_strides = vv.strides;
  problem.o_strides = qv.strides;  // replaced by out's below

  if (out != nullptr) problem.o_strides = strides_like("out", *out, "q", q, place, layout);
  if (lse != nullptr) check_lse(*lse, qv, place);
  problem.variant = variant;
  problem.variant.alibi = alibi_slopes != nullptr;
  if (alibi_slopes != nullptr) check_alibi_slopes(*alibi_slopes, qv, place);
  check(validate(problem));
  return {place, problem};
}

Call prepare_backward(const InArray& q, const InArray& k, const InArray& v, const InArray& o,
                      const std::optional<InArray>& lse, const InArray& d_o, const OutArray* dq,
                      const OutArray* dk, const OutArray* dv, bool causal,
                      std::optional<double> scale, const std::string& layout_name,
                      bool deterministic) {
  Call call = prepare(q, k, v, nullptr, nullptr, causal, scale, layout_name);
  const Layout layout = parse_layout(layout_name);
  AttentionProblem& p = call.problem;
  p.pass = Pass::Backward;
  p.deterministic = deterministic;
  p.o_strides = strides_like("o", o, "q", q, call.place, layout);
  p.do_strides = strides_like("do", d_o, "q", q, call.place, layout);
  if (!lse) {
    raise(ErrorCode::InvalidArgument,
          "lse is None: the backward pass needs the forward's log-sum-exp, float32 (batch, heads, "
          "seqlen_q): o, lse = flashjit.attention(q, k, v, ..., return_lse=True)");
  }
  check_lse(*lse, view_of("q", q, layout), call.place);
  // Gradients the caller did not pass are allocated contiguous in the layout, like q and k.
  p.dq_strides = dq != nullptr ? strides_like("dq", *dq, "q", q, call.place, layout)
                               : contiguous_strides(layout, p.seqlen_q, p.heads_q, p.head_dim);
  const Strides dkv = contiguous_strides(layout, p.seqlen_k, p.heads_kv, p.head_dim);
  p.dk_strides = dk != nullptr ? strides_like("dk", *dk, "k", k, call.place, layout) : dkv;
  p.dv_strides = dv != nullptr ? strides_like("dv", *dv, "k", k, call.place, layout) : dkv;
  check(validate(p));
  return call;
}

Allocated allocate_array(Runtime& runtime, const Place& place, const std::string& framework,
                         std::vector<size_t> shape, nb::dlpack::dtype dtype) {
  size_t elements = 1;
  for (size_t extent : shape) elements *= extent;
  const size_t bytes = std::max<size_t>(1, elements * dtype.bits / 8);
  DeviceBuffer buffer;
  {
    CudaContextGuard guard(place.cuda());
    buffer = unwrap(runtime.backend().allocate(bytes));
  }
  void* data = buffer.get();
  struct Owned {
    DeviceBuffer buffer;
    bool cuda;
  };
  auto* owned = new Owned{std::move(buffer), place.cuda()};
  nb::capsule owner(owned, [](void* pointer) noexcept {
    auto* held = static_cast<Owned*>(pointer);
    CudaContextGuard guard(held->cuda);
    delete held;
  });
  const int device_type = place.cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  auto make = [&](auto array_type) {
    using Array = decltype(array_type);
    return nb::cast(
        Array(data, shape.size(), shape.data(), owner, nullptr, dtype, device_type, place.device));
  };
  if (framework == "jax") return {make(nb::ndarray<nb::jax>()), data};
  if (framework == "numpy" && !place.cuda()) return {make(nb::ndarray<nb::numpy>()), data};
  return {make(nb::ndarray<>()), data};  // no framework: a DLPack capsule
}

}  // namespace flashjit::python
