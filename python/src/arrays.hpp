// Arrays in, problems out: DLPack arrays (nb::ndarray: torch, cupy, jax, numpy, anything with
// __dlpack__ or the buffer protocol) read without copies, checked against each other (dtype,
// shape, place, a contiguous last axis) and turned into the AttentionProblem of the call, for the
// forward (q, k, v, out, lse) and the backward (q, k, v, o, lse, do, dq, dk, dv). Errors name the
// array and what is allowed. The checks themselves are python/src/array_checks.hpp (pure C++,
// fuzzed by tests/fuzz/python_arrays.cpp); here they are applied to nb::ndarrays and their errors
// raised. Also the outputs the module allocates itself.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "array_checks.hpp"
#include "errors.hpp"
#include "generator/problem.hpp"
#include "runtime/runtime.hpp"
#include "runtimes.hpp"

namespace flashjit::python {

using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

std::string dtype_name(const nb::dlpack::dtype& dtype);  // "float16", "bfloat16", "int8", ...
Layout parse_layout(const std::string& text);            // check_layout, raising its error

// The attention variant of a call as python/flashjit/__init__.py passes it (_variant_spec): None
// for plain attention, else the tuple (window_left, window_right, softcap or None, prefix,
// score_mod, mask_mod), each already of its Python type (int, float, str). ALiBi comes from the
// slopes array, not from the tuple. The values are checked by validate() with the problem.
Variant variant_of(const std::optional<nb::tuple>& spec);

// check_forward_arrays of the arrays' DLPack descriptions, raising its error: validates q, k, v
// (and out, lse when given) against each other and builds the forward problem (o's strides:
// out's, else q's; the caller sets them for an output it allocates); `variant` and
// `alibi_slopes` as check_forward_arrays takes them.
Call prepare(const InArray& q, const InArray& k, const InArray& v, const OutArray* out,
             const OutArray* lse, bool causal, std::optional<double> scale,
             const std::string& layout_name, const Variant& variant = {},
             const InArray* alibi_slopes = nullptr);

// make_varlen_call, raising its error: `call` (from prepare() over the (1, total, heads, d) views
// of packed q, k, v) becomes a varlen problem of the documents of cu_seqlens_q / _k.
void make_varlen(Call& call, const InArray& cu_seqlens_q, const InArray& cu_seqlens_k,
                 int64_t max_seqlen_q, int64_t max_seqlen_k);

// check_backward_arrays, raising its error: o and do with q's shape and dtype, lse float32
// (batch, heads_q, seqlen_q) contiguous (required), dq with q's shape and dk, dv with k's when
// given (contiguous in the layout when not: the caller allocates them so), all on q's device.
// check_decode_arrays (array_checks.hpp) of these arrays: a decode's problem (contiguous or
// paged K/V cache, per-sequence key counts).
Call prepare_decode(const InArray& q, const InArray& k_cache, const InArray& v_cache,
                    const InArray* block_table, const InArray* seqlens_k, const OutArray* out,
                    const OutArray* lse, bool causal, std::optional<double> scale);

Call prepare_backward(const InArray& q, const InArray& k, const InArray& v, const InArray& o,
                      const std::optional<InArray>& lse, const InArray& d_o, const OutArray* dq,
                      const OutArray* dk, const OutArray* dv, bool causal,
                      std::optional<double> scale, const std::string& layout_name,
                      bool deterministic, const Variant& variant = {},
                      const InArray* alibi_slopes = nullptr);

// Memory the module allocated for an output (arrays of frameworks without an allocator the
// Python layer knows, e.g. jax), owned by the returned array. `framework`: "jax" returns a jax
// array, "numpy" a numpy array (CPU only); anything else a DLPack capsule.
struct Allocated {
  nb::object array;
  void* data = nullptr;
};
Allocated allocate_array(Runtime& runtime, const Place& place, const std::string& framework,
                         std::vector<size_t> shape, nb::dlpack::dtype dtype);

// The shape of `array` as a vector, for allocate_array.
template <class Array>
std::vector<size_t> shape_of(const Array& array) {
  std::vector<size_t> shape;
  for (size_t i = 0; i < array.ndim(); ++i) shape.push_back(array.shape(i));
  return shape;
}

}  // namespace flashjit::python
