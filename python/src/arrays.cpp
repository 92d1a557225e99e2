#include "arrays.hpp"

#include <algorithm>
#include <utility>

#include "runtime/backend.hpp"

namespace flashjit::python {

namespace {

ArrayDtype dtype_of(const nb::dlpack::dtype& dtype) {
  return {dtype.code, dtype.bits, dtype.lanes};
}

template <class Array>
ArrayInfo info_of(const Array& array) {
  ArrayInfo info;
  for (size_t i = 0; i < array.ndim(); ++i) {
    info.shape.push_back(array.shape(i));
    info.strides.push_back(array.stride(i));
  }
  info.dtype = dtype_of(array.dtype());
  info.device_type = array.device_type();
  info.device_id = array.device_id();
  return info;
}

template <class Array>
std::optional<ArrayInfo> info_of(const Array* array) {
  if (array == nullptr) return std::nullopt;
  return info_of(*array);
}

const ArrayInfo* pointer(const std::optional<ArrayInfo>& info) { return info ? &*info : nullptr; }

}  // namespace

Variant variant_of(const std::optional<nb::tuple>& spec) {
  Variant variant;
  if (!spec) return variant;
  if (spec->size() != 6 && spec->size() != 7) {
    raise(ErrorCode::InvalidArgument,
          "variant: expected (window_left, window_right, softcap, prefix, score_mod, mask_mod[, "
          "score_mod_grad]), got a tuple of " +
              std::to_string(spec->size()));
  }
  variant.window_left = nb::cast<int64_t>((*spec)[0]);
  variant.window_right = nb::cast<int64_t>((*spec)[1]);
  if (!(*spec)[2].is_none()) variant.softcap = static_cast<float>(nb::cast<double>((*spec)[2]));
  variant.prefix = nb::cast<int64_t>((*spec)[3]);
  variant.score_mod = nb::cast<std::string>((*spec)[4]);
  variant.mask_mod = nb::cast<std::string>((*spec)[5]);
  if (spec->size() == 7) variant.score_mod_grad = nb::cast<std::string>((*spec)[6]);
  return variant;
}

std::string dtype_name(const nb::dlpack::dtype& dtype) { return dtype_name(dtype_of(dtype)); }

Layout parse_layout(const std::string& text) { return unwrap(check_layout(text)); }

Call prepare(const InArray& q, const InArray& k, const InArray& v, const OutArray* out,
             const OutArray* lse, bool causal, std::optional<double> scale,
             const std::string& layout_name, const Variant& variant, const InArray* alibi_slopes) {
  const std::optional<ArrayInfo> out_info = info_of(out), lse_info = info_of(lse),
                                 slopes_info = info_of(alibi_slopes);
  return unwrap(check_forward_arrays(info_of(q), info_of(k), info_of(v), pointer(out_info),
                                     pointer(lse_info), causal, scale, layout_name, variant,
                                     pointer(slopes_info)));
}

void make_varlen(Call& call, const InArray& cu_seqlens_q, const InArray& cu_seqlens_k,
                 int64_t max_seqlen_q, int64_t max_seqlen_k) {
  check(make_varlen_call(call, info_of(cu_seqlens_q), info_of(cu_seqlens_k), max_seqlen_q,
                         max_seqlen_k));
}

Call prepare_decode(const InArray& q, const InArray& k_cache, const InArray& v_cache,
                    const InArray* block_table, const InArray* seqlens_k, const OutArray* out,
                    const OutArray* lse, bool causal, std::optional<double> scale) {
  const std::optional<ArrayInfo> table_info = info_of(block_table),
                                 lengths_info = info_of(seqlens_k), out_info = info_of(out),
                                 lse_info = info_of(lse);
  return unwrap(check_decode_arrays(info_of(q), info_of(k_cache), info_of(v_cache),
                                    pointer(table_info), pointer(lengths_info), pointer(out_info),
                                    pointer(lse_info), causal, scale));
}

Call prepare_backward(const InArray& q, const InArray& k, const InArray& v, const InArray& o,
                      const std::optional<InArray>& lse, const InArray& d_o, const OutArray* dq,
                      const OutArray* dk, const OutArray* dv, bool causal,
                      std::optional<double> scale, const std::string& layout_name,
                      bool deterministic, const Variant& variant, const InArray* alibi_slopes) {
  const std::optional<ArrayInfo> lse_info =
      lse ? std::optional<ArrayInfo>(info_of(*lse)) : std::nullopt;
  const std::optional<ArrayInfo> dq_info = info_of(dq), dk_info = info_of(dk),
                                 dv_info = info_of(dv), slopes_info = info_of(alibi_slopes);
  return unwrap(check_backward_arrays(info_of(q), info_of(k), info_of(v), info_of(o),
                                      pointer(lse_info), info_of(d_o), pointer(dq_info),
                                      pointer(dk_info), pointer(dv_info), causal, scale,
                                      layout_name, deterministic, variant, pointer(slopes_info)));
}

Allocated allocate_array(Runtime& runtime, const Place& place, const std::string& framework,
                         std::vector<size_t> shape, nb::dlpack::dtype dtype) {
  const size_t bytes = unwrap(array_bytes(shape, dtype.bits));
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
