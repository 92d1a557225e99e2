// Fuzz target: the Python module's array checks (python/src/array_checks.hpp: what every
// flashjit.attention / attention_backward / decode call runs on its arrays before anything else)
// and the launch checks its data pointers then meet (runtime/launch_params.hpp,
// runtime/decode_launch.hpp). Input: a few option bytes (pass or decode, layout, causal, scale,
// which optional arrays are given, varlen), then per array its DLPack description: ndim, extents,
// strides (each either the contiguous one or a fuzzed one), dtype, device and byte offset; varlen
// (packed variable-length documents: make_varlen_call) the offsets arrays and max_seqlen_q / _k.
// Invariants: the checks return a call or an error with a message; a call's problem is valid,
// its tensors' spans are positive, and a launch check of it with pointers at the arrays' byte
// offsets returns (ok or a typed error) for the CUDA (16-byte) and CPU (element) alignments.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "array_checks.hpp"
#include "fuzz_support.hpp"
#include "generator/render.hpp"
#include "runtime/backend.hpp"
#include "runtime/decode_launch.hpp"
#include "runtime/launch_params.hpp"

using namespace flashjit;
using namespace flashjit::python;
using flashjit::fuzz::checked;
using flashjit::fuzz::require;
using flashjit::fuzz::require_message;

namespace {

struct FuzzedArray {
  ArrayInfo info;
  uint64_t byte_offset = 0;
};

// A base shape all arrays start from, so that the checks past "shapes must agree" are reached.
FuzzedArray read_array(fuzz::ByteReader& in, const std::vector<size_t>& base) {
  FuzzedArray array;
  const uint8_t shape_mode = in.byte();
  size_t ndim = base.size();
  if (shape_mode % 8 == 7) ndim = in.byte() % 6;  // a wrong rank, now and then
  for (size_t i = 0; i < ndim; ++i) {
    const bool fuzzed = i >= base.size() || ((shape_mode >> ((i + 1) % 8)) & 1) != 0;
    array.info.shape.push_back(fuzzed ? static_cast<size_t>(in.extent()) : base[i]);
  }
  // Strides: contiguous (row-major) unless the bit of the axis says fuzzed.
  const uint8_t stride_mode = in.byte();
  array.info.strides.assign(ndim, 0);
  int64_t step = 1;
  for (size_t i = ndim; i-- > 0;) {
    // A fuzzed stride: an extent less 8 (negative strides too), wrapping like DLPack's int64.
    const auto fuzzed = [&] {
      return static_cast<int64_t>(static_cast<uint64_t>(in.extent()) - 8);
    };
    array.info.strides[i] = (stride_mode >> (i % 8) & 1) != 0 ? fuzzed() : step;
    step =
        static_cast<int64_t>(static_cast<uint64_t>(step) *
                             static_cast<uint64_t>(array.info.shape[i] ? array.info.shape[i] : 1));
  }
  const uint8_t dtype = in.byte();
  static constexpr ArrayDtype kDtypes[] = {{kDlpackFloat, 16, 1}, {kDlpackBfloat, 16, 1},
                                           {kDlpackFloat, 32, 1}, {kDlpackFloat, 64, 1},
                                           {kDlpackInt, 8, 1},    {kDlpackFloat, 16, 2},
                                           {kDlpackBool, 8, 1},   {kDlpackComplex, 64, 1}};
  array.info.dtype = dtype < 248 ? kDtypes[dtype % 8] : ArrayDtype{in.byte(), in.byte(), in.byte()};
  const uint8_t device = in.byte();
  static constexpr int32_t kDevices[] = {
      kDlpackCpu, kDlpackCpu, kDlpackCuda, kDlpackCudaHost, kDlpackCudaManaged, 4, 10, 14};
  array.info.device_type = kDevices[device % 8];
  array.info.device_id = device >> 6;
  const uint8_t offset = in.byte();
  array.byte_offset = offset < 128 ? 0 : offset < 250 ? offset : in.u64();
  return array;
}

// Fake, well-aligned base addresses, one per array; the checks never dereference them.
const void* pointer_at(int index, const FuzzedArray* array) {
  if (array == nullptr) return nullptr;
  const uintptr_t base = (uintptr_t{1} << 40) * static_cast<uintptr_t>(index + 1);
  return reinterpret_cast<const void*>(base + static_cast<uintptr_t>(array->byte_offset));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::ByteReader in(data, size);
  const uint8_t options = in.byte();
  const bool backward = options & 1;
  const std::string layout = (options & 2) ? "bhsd" : (options & 4) ? "BSHD" : "bshd";
  const bool causal = options & 8;
  std::optional<double> scale;
  if (options & 16) scale = static_cast<double>(static_cast<int8_t>(in.byte())) / 8.0;
  const uint8_t given = in.byte();                  // which optional arrays are given
  const bool decode = !backward && (options & 64);  // flashjit.decode: a K/V cache
  const bool varlen = !decode && (options & 128);   // cu_seqlens

  // (batch, seqlen, heads, head_dim) as bytes: small shapes, the interesting ones.
  const std::vector<size_t> q_base = {size_t{in.byte()} % 5 + 1, size_t{in.byte()} + 1,
                                      size_t{in.byte()} % 9 + 1, size_t{in.byte()} % 33 * 8};
  std::vector<size_t> k_base = q_base;
  k_base[1] = size_t{in.byte()} + 1;
  const std::vector<size_t> lse_base = {q_base[0], q_base[2], q_base[1]};

  const FuzzedArray q = read_array(in, q_base), k = read_array(in, k_base),
                    v = read_array(in, k_base);
  std::optional<FuzzedArray> out, lse, o, d_o, dq, dk, dv;
  if (backward) {
    o = read_array(in, q_base);
    d_o = read_array(in, q_base);
  }
  if (given & 1) out = read_array(in, q_base);
  if (given & 2) lse = read_array(in, lse_base);
  if (given & 4) dq = read_array(in, q_base);
  if (given & 8) dk = read_array(in, k_base);
  if (given & 16) dv = read_array(in, k_base);
  // decode: the block table (paged: k and v are then the pages) and the per-sequence lengths,
  // int32 unless the byte after each says otherwise.
  std::optional<FuzzedArray> table, lengths;
  if (decode && (given & 32)) table = read_array(in, {q_base[0], size_t{in.byte()} % 9});
  if (decode && (given & 64)) lengths = read_array(in, {q_base[0]});
  // varlen: cu_seqlens_q and cu_seqlens_k (num_docs + 1 entries), then the longest lengths.
  std::optional<FuzzedArray> cu_q, cu_k;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  if (varlen) {
    const size_t entries = in.byte() % 6;
    cu_q = read_array(in, {entries});
    cu_k = read_array(in, {in.byte() < 240 ? entries : entries + 1});
    max_seqlen_q = static_cast<int64_t>(in.byte()) - 8;  // 0 and negatives now and then
    max_seqlen_k = static_cast<int64_t>(in.byte()) - 8;
  }
  for (std::optional<FuzzedArray>* array : {&table, &lengths, &cu_q, &cu_k})
    if (*array && in.byte() < 224) (*array)->info.dtype = ArrayDtype{kDlpackInt, 32, 1};
  auto info = [](const std::optional<FuzzedArray>& array) {
    return array ? &array->info : nullptr;
  };

  Result<Call> call =
      backward
          ? check_backward_arrays(q.info, k.info, v.info, o->info, info(lse), d_o->info, info(dq),
                                  info(dk), info(dv), causal, scale, layout, (options & 32) != 0)
      : decode ? check_decode_arrays(q.info, k.info, v.info, info(table), info(lengths), info(out),
                                     info(lse), causal, scale)
               : check_forward_arrays(q.info, k.info, v.info, info(out), info(lse), causal, scale,
                                      layout);
  if (!checked(call, backward ? "check_backward_arrays"
                     : decode ? "check_decode_arrays"
                              : "check_forward_arrays"))
    return 0;
  if (varlen &&
      !checked(make_varlen_call(*call, cu_q->info, cu_k->info, max_seqlen_q, max_seqlen_k),
               "make_varlen_call"))
    return 0;
  const AttentionProblem& problem = call->problem;
  require(validate(problem).ok(), "the checks returned an invalid problem: " + problem.to_string());
  require(problem.q_span() > 0 && problem.kv_span() > 0 && problem.o_span() > 0,
          "a non-positive span: " + problem.to_string());
  (void)checked(array_bytes(q.info.shape, q.info.dtype.bits), "array_bytes");

  // The launch checks of the same call, pointers at the arrays' byte offsets (as nb::ndarray's
  // data() adds them). The forward's output: out's when given, else the module's allocation.
  AttentionArgs args;
  args.q = pointer_at(0, &q);
  args.k = pointer_at(1, &k);
  args.v = pointer_at(2, &v);
  const FuzzedArray allocated{};
  args.o = const_cast<void*>(pointer_at(3, backward ? &*o : out ? &*out : &allocated));
  args.lse = static_cast<float*>(const_cast<void*>(pointer_at(4, lse ? &*lse : nullptr)));
  if (backward) {
    args.d_o = pointer_at(5, &*d_o);
    args.dq = const_cast<void*>(pointer_at(6, dq ? &*dq : &allocated));
    args.dk = const_cast<void*>(pointer_at(7, dk ? &*dk : &allocated));
    args.dv = const_cast<void*>(pointer_at(8, dv ? &*dv : &allocated));
  }
  args.block_table = static_cast<const int32_t*>(pointer_at(9, table ? &*table : nullptr));
  args.seqlens_k = static_cast<const int32_t*>(pointer_at(10, lengths ? &*lengths : nullptr));
  args.cu_seqlens_q = static_cast<const int32_t*>(pointer_at(11, cu_q ? &*cu_q : nullptr));
  args.cu_seqlens_k = static_cast<const int32_t*>(pointer_at(12, cu_k ? &*cu_k : nullptr));
  require(!problem.variant.varlen || (varlen && problem.lse_elements() > 0),
          "a varlen problem without its offsets, or an empty lse: " + problem.to_string());
  require(!problem.kv.paged() || (table && lengths), "a paged problem without its tables");
  const ProblemSignature signature = ProblemSignature::of(problem);
  for (size_t alignment : {size_t{16}, static_cast<size_t>(dtype_bytes(problem.dtype))}) {
    (void)checked(check_decode_launch(problem, args, signature, alignment, DecodeWorkspace{}),
                  "check_decode_launch");
  }
  return 0;
}
