// The attention entry points of the extension: the forward, the backward, and the config either
// would launch. python/flashjit/__init__.py documents them for users and allocates the outputs
// of the frameworks it knows (torch, numpy, cupy); what it passes as None is allocated here.
// Prepared calls are the fast path of torch tensors (python/flashjit/_torch.py): the arrays'
// checks, the problem and the kernel once per (shapes, strides, dtypes, device, options), then
// launches with data pointers only.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "arrays.hpp"

namespace flashjit::python {

// A call whose arrays were checked and whose kernel was built: the problem and the kernel of one
// (shapes, strides, dtypes, place, options), launched with the data pointers of arrays that have
// exactly those (the caller's promise: the torch fast path keys its cache on them). Pointers are
// still checked (null, alignment) by the kernel's launch.
class Prepared {
 public:
  Prepared(Place place, AttentionProblem problem, std::shared_ptr<Kernel> kernel)
      : place_(std::move(place)), problem_(std::move(problem)), kernel_(std::move(kernel)) {}

  // Enqueues the kernel(s) on `stream` (CUDA; ignored by the CPU backend, whose launches return
  // when done); with `synchronize`, waits for the stream. Releases the GIL.
  void launch(const AttentionArgs& args, uintptr_t stream, bool synchronize = false) const;
  // The forward with q, k, v, o, lse (0: none) and ALiBi's slopes (0: none; required by an ALiBi
  // problem) as data pointers.
  void forward(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse,
               uintptr_t alibi_slopes, uintptr_t stream) const;
  // The backward with q, k, v, o, lse, do, dq, dk, dv and ALiBi's slopes (0: none) as data
  // pointers.
  void backward(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse, uintptr_t d_o,
                uintptr_t dq, uintptr_t dk, uintptr_t dv, uintptr_t alibi_slopes,
                uintptr_t stream) const;

  const Place& place() const { return place_; }
  const AttentionProblem& problem() const { return problem_; }
  const Kernel& kernel() const { return *kernel_; }

 private:
  Place place_;
  AttentionProblem problem_;
  std::shared_ptr<Kernel> kernel_;
};

// The forward of q, k, v into out (and lse, when given), prepared: every array checked as
// attention() checks them, the kernel built (config as for resolve_config). `variant` and
// `alibi_slopes`: the attention variant (variant_of, arrays.hpp); the slopes given here are only
// checked, each launch passes its own pointer.
Prepared prepare_attention(InArray q, InArray k, InArray v, OutArray out,
                           std::optional<OutArray> lse, bool causal, std::optional<double> scale,
                           const std::string& layout, std::optional<std::string> config,
                           std::optional<nb::tuple> variant, std::optional<InArray> alibi_slopes);

// The backward of q, k, v, o, lse, do into dq, dk, dv, prepared likewise (`variant`: the
// forward's, with score_mod_grad for a score_mod).
Prepared prepare_attention_backward(InArray q, InArray k, InArray v, InArray o, InArray lse,
                                    InArray d_o, OutArray dq, OutArray dk, OutArray dv, bool causal,
                                    std::optional<double> scale, const std::string& layout,
                                    bool deterministic, std::optional<std::string> config,
                                    std::optional<nb::tuple> variant,
                                    std::optional<InArray> alibi_slopes);

// Defines `attention` on `m`, the forward: attention(q, k, v, out, lse, want_lse, causal, scale,
// layout, config, stream, synchronize, framework, variant, alibi_slopes, cu_seqlens_q=None,
// cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0). Returns (out, lse) as allocated here: each
// None when the caller passed it (or, for lse, did not ask for it). cu_seqlens_q / _k (both or
// neither): packed variable-length documents, q, k, v the (1, total, heads, head_dim) views of the
// packed arrays (make_varlen, arrays.hpp); lse then (heads_q * total_q,).
void def_attention(nb::module_& m);

// A decode (flashjit.decode): attention of q against a K/V cache, contiguous or paged, with
// per-sequence key counts (check_decode_arrays). Returns (out, lse) as attention() does.
nb::tuple decode(InArray q, InArray k_cache, InArray v_cache, std::optional<InArray> block_table,
                 std::optional<InArray> seqlens_k, std::optional<OutArray> out,
                 std::optional<OutArray> lse, bool want_lse, bool causal,
                 std::optional<double> scale, std::optional<std::string> config, uintptr_t stream,
                 bool synchronize, const std::string& framework, bool check_tables = false);

// The backward pass: writes dq, dk, dv from q, k, v, o, lse and do. Returns (dq, dk, dv) as
// allocated here: None for each the caller passed. The kernel's fp32 workspace is its own (per
// stream, grown when needed). cu_seqlens_q / _k (both or neither): packed variable-length
// documents, as attention(): q, k, v, o, do (dq, dk, dv) the (1, total, heads, head_dim) views of
// the packed arrays, lse the (1, heads_q, total_q) view of the forward's packed (heads_q *
// total_q,) one.
nb::tuple attention_backward(InArray q, InArray k, InArray v, InArray o, std::optional<InArray> lse,
                             InArray d_o, std::optional<OutArray> dq, std::optional<OutArray> dk,
                             std::optional<OutArray> dv, bool causal, std::optional<double> scale,
                             const std::string& layout, bool deterministic,
                             std::optional<std::string> config, uintptr_t stream, bool synchronize,
                             const std::string& framework,
                             std::optional<nb::tuple> variant = std::nullopt,
                             std::optional<InArray> alibi_slopes = std::nullopt,
                             std::optional<InArray> cu_seqlens_q = std::nullopt,
                             std::optional<InArray> cu_seqlens_k = std::nullopt,
                             int64_t max_seqlen_q = 0, int64_t max_seqlen_k = 0);

// The config attention() (pass_ "fwd") or attention_backward() ("bwd") would launch for q, k, v
// (packed documents: the (1, total, heads, head_dim) views and both offsets, as attention())
// and where it comes from: {config, source, device, problem}.
nb::dict config_for(InArray q, InArray k, InArray v, bool causal, std::optional<double> scale,
                    const std::string& layout, std::optional<std::string> config,
                    const std::string& pass, bool deterministic, std::optional<nb::tuple> variant,
                    std::optional<InArray> alibi_slopes, std::optional<InArray> cu_seqlens_q,
                    std::optional<InArray> cu_seqlens_k, int64_t max_seqlen_q,
                    int64_t max_seqlen_k);

// The block map (issue 31) the kernel config_for() names would read for q, k, v and the variant
// (a mask_mod): built now on the device and waited for, {config, block_m, block_n, maps,
// build_ms, empty, partial, full} (the tiles' shares); None when that kernel reads no map (no
// mask_mod, packed documents, a family or backend without maps: the CPU's).
nb::object block_mask_stats(InArray q, InArray k, InArray v, bool causal,
                            std::optional<double> scale, const std::string& layout,
                            std::optional<std::string> config, const std::string& pass,
                            bool deterministic, std::optional<nb::tuple> variant);

// Where a kernel's config came from ("exact", "nearest", "default", "given") and the config:
// nullopt = the runtime's selection (tuning DBs, then the SRAM-formula default); "default" = the
// SRAM-formula default; else a config name such as "m128n64w4s2", checked for legality.
std::pair<AttentionConfig, std::string> resolve_config(Runtime& runtime,
                                                       const AttentionProblem& problem,
                                                       const std::optional<std::string>& config);

}  // namespace flashjit::python
