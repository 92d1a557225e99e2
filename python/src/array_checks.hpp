// The checks of the arrays an attention call is given, as pure C++ (no nanobind, no Python):
// what DLPack says about each array (ArrayInfo: shape, strides in elements, dtype, device) in,
// the Place and AttentionProblem of the call out, or an Error naming the array and what is
// allowed. python/src/arrays.cpp reads nb::ndarrays into ArrayInfos and raises these errors as
// Python exceptions; tests/fuzz/python_arrays.cpp feeds them arbitrary arrays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit::python {

// Where arrays live and which backend runs them: ("cpu", 0) or ("cuda", ordinal).
struct Place {
  std::string backend;
  int device = 0;
  bool operator<(const Place& other) const {
    return std::tie(backend, device) < std::tie(other.backend, other.device);
  }
  bool operator==(const Place& other) const {
    return backend == other.backend && device == other.device;
  }
  bool cuda() const { return backend == "cuda"; }
  std::string to_string() const {
    return cuda() ? "cuda:" + std::to_string(device) : std::string("cpu");
  }
};

// DLPack's element type (DLDataType) and device types (DLDeviceType), as nanobind reports them.
struct ArrayDtype {
  uint8_t code = 0;  // 0 int, 1 uint, 2 float, 3 opaque handle, 4 bfloat, 5 complex, 6 bool
  uint8_t bits = 0;
  uint16_t lanes = 1;
};
inline constexpr uint8_t kDlpackInt = 0, kDlpackUInt = 1, kDlpackFloat = 2, kDlpackBfloat = 4,
                         kDlpackComplex = 5, kDlpackBool = 6;
inline constexpr int32_t kDlpackCpu = 1, kDlpackCuda = 2, kDlpackCudaHost = 3,
                         kDlpackCudaManaged = 13;

// One array as DLPack describes it: the extent and the stride (in elements) of each axis.
struct ArrayInfo {
  std::vector<size_t> shape;
  std::vector<int64_t> strides;  // as many as shape
  ArrayDtype dtype;
  int32_t device_type = kDlpackCpu;
  int32_t device_id = 0;
  size_t ndim() const { return shape.size(); }
};

std::string dtype_name(const ArrayDtype& dtype);  // "float16", "bfloat16", "int8", ...
Result<Layout> check_layout(const std::string& text);

struct Call {
  Place place;
  AttentionProblem problem;
};

// Validates q, k, v (and out, lse when given) against each other and builds the forward problem
// (o's strides: out's, else q's; the caller sets them for an output it allocates). `variant` and
// `alibi_slopes` (fp32 [heads_q], contiguous, on q's device; sets variant.alibi) make it an
// attention variant; validate() checks the variant's values (window sides, softcap, prefix, the
// expressions) with the library's messages.
Result<Call> check_forward_arrays(const ArrayInfo& q, const ArrayInfo& k, const ArrayInfo& v,
                                  const ArrayInfo* out, const ArrayInfo* lse, bool causal,
                                  std::optional<double> scale, const std::string& layout_name,
                                  const Variant& variant = {},
                                  const ArrayInfo* alibi_slopes = nullptr);

// The backward's arrays: o and do with q's shape and dtype, lse float32 (batch, heads_q,
// seqlen_q) contiguous (required: the error says where it comes from), dq with q's shape and
// dk, dv with k's when given (contiguous in the layout when not: the caller allocates them so),
// all on q's device. Builds the backward problem with every array's strides. `variant` and
// `alibi_slopes` as check_forward_arrays takes them (the forward's variant, and for a score_mod
// its score_mod_grad: validate() says when it is missing).
Result<Call> check_backward_arrays(const ArrayInfo& q, const ArrayInfo& k, const ArrayInfo& v,
                                   const ArrayInfo& o, const ArrayInfo* lse, const ArrayInfo& d_o,
                                   const ArrayInfo* dq, const ArrayInfo* dk, const ArrayInfo* dv,
                                   bool causal, std::optional<double> scale,
                                   const std::string& layout_name, bool deterministic,
                                   const Variant& variant = {},
                                   const ArrayInfo* alibi_slopes = nullptr);

// A decode call's arrays (flashjit.decode): q (batch, seqlen_q, heads_q, head_dim); either K and V
// contiguous, k_cache and v_cache (batch, seqlen_k, heads_kv, head_dim) with optional seqlens_k
// (int32 (batch,): keys of each sequence), or paged, (num_pages, page_size, heads_kv, head_dim)
// with block_table (int32 (batch, max_pages), contiguous) and seqlens_k (required); all on q's
// device. Builds the forward problem (kv: the cache's layout; seqlen_k: k_cache.shape[1], or
// max_pages * page_size when paged). The contents of seqlens_k and block_table are device data
// and not checked: each length must be <= seqlen_k and each page index in [0, num_pages).
Result<Call> check_decode_arrays(const ArrayInfo& q, const ArrayInfo& k_cache,
                                 const ArrayInfo& v_cache, const ArrayInfo* block_table,
                                 const ArrayInfo* seqlens_k, const ArrayInfo* out,
                                 const ArrayInfo* lse, bool causal, std::optional<double> scale);

// Makes a forward or backward `call` over q, k, v (o, do, dq, dk, dv) of shapes (1, total,
// heads, head_dim) (the packed 3-D arrays of a varlen call, viewed with a batch axis of 1) a
// problem of packed variable-length documents (Variant::varlen): cu_seqlens_q and cu_seqlens_k
// int32 (num_docs + 1,) contiguous on q's device, max_seqlen_q / _k the longest document's
// lengths. The offsets' values are device data, checked by the CPU backend before a launch only.
Status make_varlen_call(Call& call, const ArrayInfo& cu_seqlens_q, const ArrayInfo& cu_seqlens_k,
                        int64_t max_seqlen_q, int64_t max_seqlen_k);

// Bytes of an output of `shape` with elements of `bits` bits (at least 1), or an error when the
// count does not fit a size_t (the module allocates outputs of this size).
Result<size_t> array_bytes(const std::vector<size_t>& shape, int bits);

}  // namespace flashjit::python
