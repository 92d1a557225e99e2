#include "attention.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <utility>
#include <vector>

#include "generator/block_mask.hpp"
#include "generator/enum_names.hpp"
#include "runtime/backend.hpp"
#include "runtime/cuda/driver.hpp"

namespace flashjit::python {
namespace {

// Where a kernel's config came from, for config_for() and show().
const char* source_name(ChoiceSource source) {
  return enum_name(source, {"exact", "nearest", "default"}, "unknown");
}

std::shared_ptr<Kernel> kernel_for(Runtime& runtime, const Call& call,
                                   const std::optional<std::string>& config) {
  // Compiles on first use: without the GIL, with the caller's CUDA context put back after.
  nb::gil_scoped_release release;
  CudaContextGuard guard(call.place.cuda());
  if (!config) return unwrap(runtime.attention(call.problem));
  return unwrap(
      runtime.attention(call.problem, resolve_config(runtime, call.problem, config).first));
}

Prepared prepared(const Call& call, const std::optional<std::string>& config) {
  std::shared_ptr<Runtime> runtime = runtimes().get(call.place);
  return Prepared(call.place, call.problem, kernel_for(*runtime, call, config));
}

}  // namespace

void Prepared::launch(const AttentionArgs& args, uintptr_t stream, bool synchronize) const {
  // CPU launches run the kernel to completion: without the GIL.
  nb::gil_scoped_release release;
  CudaContextGuard guard(place_.cuda());
  check(kernel_->launch(problem_, args, reinterpret_cast<void*>(stream)));
  if (synchronize && place_.cuda()) {
    const cuda::Driver* cu = unwrap(cuda::driver());
    check(cuda::check(cu->cuStreamSynchronize(reinterpret_cast<CUstream>(stream)),
                      "cuStreamSynchronize", ErrorCode::LaunchFailed));
  }
}

void Prepared::forward(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse,
                       uintptr_t alibi_slopes, uintptr_t stream) const {
  AttentionArgs args{reinterpret_cast<const void*>(q), reinterpret_cast<const void*>(k),
                     reinterpret_cast<const void*>(v), reinterpret_cast<void*>(o),
                     reinterpret_cast<float*>(lse)};
  args.alibi_slopes = reinterpret_cast<const float*>(alibi_slopes);
  launch(args, stream);
}

void Prepared::backward(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse,
                        uintptr_t d_o, uintptr_t dq, uintptr_t dk, uintptr_t dv,
                        uintptr_t alibi_slopes, uintptr_t stream) const {
  AttentionArgs args{reinterpret_cast<const void*>(q), reinterpret_cast<const void*>(k),
                     reinterpret_cast<const void*>(v), reinterpret_cast<void*>(o),
                     reinterpret_cast<float*>(lse)};
  args.d_o = reinterpret_cast<const void*>(d_o);
  args.dq = reinterpret_cast<void*>(dq);
  args.dk = reinterpret_cast<void*>(dk);
  args.dv = reinterpret_cast<void*>(dv);
  args.alibi_slopes = reinterpret_cast<const float*>(alibi_slopes);
  launch(args, stream);
}

Prepared prepare_attention(InArray q, InArray k, InArray v, OutArray out,
                           std::optional<OutArray> lse, bool causal, std::optional<double> scale,
                           const std::string& layout, std::optional<std::string> config,
                           std::optional<nb::tuple> variant, std::optional<InArray> alibi_slopes) {
  return prepared(prepare(q, k, v, &out, lse ? &*lse : nullptr, causal, scale, layout,
                          variant_of(variant), alibi_slopes ? &*alibi_slopes : nullptr),
                  config);
}

Prepared prepare_attention_backward(InArray q, InArray k, InArray v, InArray o, InArray lse,
                                    InArray d_o, OutArray dq, OutArray dk, OutArray dv, bool causal,
                                    std::optional<double> scale, const std::string& layout,
                                    bool deterministic, std::optional<std::string> config,
                                    std::optional<nb::tuple> variant,
                                    std::optional<InArray> alibi_slopes) {
  return prepared(
      prepare_backward(q, k, v, o, lse, d_o, &dq, &dk, &dv, causal, scale, layout, deterministic,
                       variant_of(variant), alibi_slopes ? &*alibi_slopes : nullptr),
      config);
}

// config: nullopt = the runtime's selection (tuning DBs, then the SRAM-formula default);
// "default" = the SRAM-formula default; else a config name such as "m128n64w4s2".
std::pair<AttentionConfig, std::string> resolve_config(Runtime& runtime,
                                                       const AttentionProblem& problem,
                                                       const std::optional<std::string>& config) {
  if (!config) {
    auto [chosen, source] = unwrap(runtime.select_config(problem));
    return {chosen, source_name(source)};
  }
  if (*config == "default") return {unwrap(runtime.backend().default_config(problem)), "default"};
  AttentionConfig parsed = unwrap(AttentionConfig::parse(*config));
  Status legal = runtime.backend().check_config(parsed, problem);
  if (!legal.ok()) {
    raise(ErrorCode::InvalidArgument, "config = '" + *config +
                                          "' is not legal for this problem on " +
                                          runtime.backend().name() + ": " + legal.error().message);
  }
  return {parsed, "given"};
}

namespace {

// Launches a forward `call` of q, k, v into out and lse (allocated here in `framework` when not
// given: out contiguous with q's shape in `layout`, lse when `want_lse`); returns (out, lse) as
// allocated here (None for those given). `extra` fills the args beyond q, k, v, o, lse.
template <class Extra>
nb::tuple run_forward(Call& call, InArray& q, InArray& k, InArray& v, std::optional<OutArray>& out,
                      std::optional<OutArray>& lse, bool want_lse, Layout layout,
                      const std::optional<std::string>& config, uintptr_t stream, bool synchronize,
                      const std::string& framework, Extra extra) {
  std::shared_ptr<Runtime> runtime = runtimes().get(call.place);

  nb::object out_object = nb::none(), lse_object = nb::none();
  void* out_data = nullptr;
  float* lse_data = nullptr;
  if (out) {
    out_data = out->data();
  } else {
    // Contiguous, with q's shape (so in the same layout as q).
    Allocated allocated = allocate_array(*runtime, call.place, framework, shape_of(q), q.dtype());
    out_object = allocated.array;
    out_data = allocated.data;
    call.problem.o_strides = contiguous_strides(layout, call.problem.seqlen_q, call.problem.heads_q,
                                                call.problem.head_dim);
    if (call.problem.variant.varlen) call.problem.o_strides.batch = 0;  // one packed sequence
  }
  if (lse) {
    lse_data = static_cast<float*>(lse->data());
  } else if (want_lse) {
    // Varlen: the documents' packed [heads_q, len_q] blocks, heads_q * total_q in all.
    const std::vector<size_t> shape =
        call.problem.variant.varlen
            ? std::vector<size_t>{static_cast<size_t>(call.problem.lse_elements())}
            : std::vector<size_t>{static_cast<size_t>(call.problem.batch),
                                  static_cast<size_t>(call.problem.heads_q),
                                  static_cast<size_t>(call.problem.seqlen_q)};
    Allocated allocated =
        allocate_array(*runtime, call.place, framework, shape, nb::dtype<float>());
    lse_object = allocated.array;
    lse_data = static_cast<float*>(allocated.data);
  }

  AttentionArgs args{q.data(), k.data(), v.data(), out_data, lse_data};
  extra(args);
  prepared(call, config).launch(args, stream, synchronize);
  return nb::make_tuple(out_object, lse_object);
}

// Packed variable-length documents, when both offsets are given (make_varlen); one alone is an
// error naming the other.
void with_documents(Call& call, const std::optional<InArray>& cu_seqlens_q,
                    const std::optional<InArray>& cu_seqlens_k, int64_t max_seqlen_q,
                    int64_t max_seqlen_k) {
  if (cu_seqlens_q.has_value() != cu_seqlens_k.has_value())
    raise(ErrorCode::InvalidArgument,
          std::string(cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q") +
              " is None: packed variable-length documents need both cu_seqlens_q and "
              "cu_seqlens_k");
  if (cu_seqlens_q) make_varlen(call, *cu_seqlens_q, *cu_seqlens_k, max_seqlen_q, max_seqlen_k);
}

}  // namespace

nb::tuple attention(InArray q, InArray k, InArray v, std::optional<OutArray> out,
                    std::optional<OutArray> lse, bool want_lse, bool causal,
                    std::optional<double> scale, const std::string& layout,
                    std::optional<std::string> config, uintptr_t stream, bool synchronize,
                    const std::string& framework, std::optional<nb::tuple> variant,
                    std::optional<InArray> alibi_slopes, std::optional<InArray> cu_seqlens_q,
                    std::optional<InArray> cu_seqlens_k, int64_t max_seqlen_q,
                    int64_t max_seqlen_k) {
  Call call = prepare(q, k, v, out ? &*out : nullptr, lse ? &*lse : nullptr, causal, scale, layout,
                      variant_of(variant), alibi_slopes ? &*alibi_slopes : nullptr);
  with_documents(call, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  return run_forward(call, q, k, v, out, lse, want_lse, parse_layout(layout), config, stream,
                     synchronize, framework, [&](AttentionArgs& args) {
                       if (alibi_slopes)
                         args.alibi_slopes = static_cast<const float*>(alibi_slopes->data());
                       if (cu_seqlens_q) {
                         args.cu_seqlens_q = static_cast<const int32_t*>(cu_seqlens_q->data());
                         args.cu_seqlens_k = static_cast<const int32_t*>(cu_seqlens_k->data());
                       }
                     });
}

nb::tuple decode(InArray q, InArray k_cache, InArray v_cache, std::optional<InArray> block_table,
                 std::optional<InArray> seqlens_k, std::optional<OutArray> out,
                 std::optional<OutArray> lse, bool want_lse, bool causal,
                 std::optional<double> scale, std::optional<std::string> config, uintptr_t stream,
                 bool synchronize, const std::string& framework, bool check_tables) {
  Call call = prepare_decode(q, k_cache, v_cache, block_table ? &*block_table : nullptr,
                             seqlens_k ? &*seqlens_k : nullptr, out ? &*out : nullptr,
                             lse ? &*lse : nullptr, causal, scale);
  return run_forward(call, q, k_cache, v_cache, out, lse, want_lse, Layout::BSHD, config, stream,
                     synchronize, framework, [&](AttentionArgs& args) {
                       if (block_table)
                         args.block_table = static_cast<const int32_t*>(block_table->data());
                       if (seqlens_k)
                         args.seqlens_k = static_cast<const int32_t*>(seqlens_k->data());
                       args.check_tables = check_tables;
                     });
}

void def_attention(nb::module_& m) {
  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out").none(),
        nb::arg("lse").none(), nb::arg("want_lse"), nb::arg("causal"), nb::arg("scale").none(),
        nb::arg("layout"), nb::arg("config").none(), nb::arg("stream"), nb::arg("synchronize"),
        nb::arg("framework"), nb::arg("variant").none(), nb::arg("alibi_slopes").none(),
        nb::arg("cu_seqlens_q").none() = nb::none(), nb::arg("cu_seqlens_k").none() = nb::none(),
        nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_k") = 0);
}

nb::tuple attention_backward(InArray q, InArray k, InArray v, InArray o, std::optional<InArray> lse,
                             InArray d_o, std::optional<OutArray> dq, std::optional<OutArray> dk,
                             std::optional<OutArray> dv, bool causal, std::optional<double> scale,
                             const std::string& layout, bool deterministic,
                             std::optional<std::string> config, uintptr_t stream, bool synchronize,
                             const std::string& framework, std::optional<nb::tuple> variant,
                             std::optional<InArray> alibi_slopes,
                             std::optional<InArray> cu_seqlens_q,
                             std::optional<InArray> cu_seqlens_k, int64_t max_seqlen_q,
                             int64_t max_seqlen_k) {
  Call call = prepare_backward(q, k, v, o, lse, d_o, dq ? &*dq : nullptr, dk ? &*dk : nullptr,
                               dv ? &*dv : nullptr, causal, scale, layout, deterministic,
                               variant_of(variant), alibi_slopes ? &*alibi_slopes : nullptr);
  with_documents(call, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  std::shared_ptr<Runtime> runtime = runtimes().get(call.place);
  // A gradient the caller did not pass: contiguous, with its input's shape (prepare_backward
  // gave the problem those strides).
  nb::object made[3] = {nb::none(), nb::none(), nb::none()};
  void* data[3] = {nullptr, nullptr, nullptr};
  const std::optional<OutArray>* given[3] = {&dq, &dk, &dv};
  const InArray* like[3] = {&q, &k, &k};
  for (int i = 0; i < 3; ++i) {
    if (*given[i]) {
      data[i] = (*given[i])->data();
    } else {
      Allocated allocated =
          allocate_array(*runtime, call.place, framework, shape_of(*like[i]), q.dtype());
      made[i] = allocated.array;
      data[i] = allocated.data;
    }
  }
  AttentionArgs args{q.data(), k.data(), v.data(), const_cast<void*>(o.data()),
                     static_cast<float*>(const_cast<void*>(lse->data()))};
  args.d_o = d_o.data();
  args.dq = data[0];
  args.dk = data[1];
  args.dv = data[2];
  if (alibi_slopes) args.alibi_slopes = static_cast<const float*>(alibi_slopes->data());
  if (cu_seqlens_q) {
    args.cu_seqlens_q = static_cast<const int32_t*>(cu_seqlens_q->data());
    args.cu_seqlens_k = static_cast<const int32_t*>(cu_seqlens_k->data());
  }
  prepared(call, config).launch(args, stream, synchronize);
  return nb::make_tuple(made[0], made[1], made[2]);
}

nb::dict config_for(InArray q, InArray k, InArray v, bool causal, std::optional<double> scale,
                    const std::string& layout, std::optional<std::string> config,
                    const std::string& pass, bool deterministic, std::optional<nb::tuple> variant,
                    std::optional<InArray> alibi_slopes, std::optional<InArray> cu_seqlens_q,
                    std::optional<InArray> cu_seqlens_k, int64_t max_seqlen_q,
                    int64_t max_seqlen_k) {
  Call call = prepare(q, k, v, nullptr, nullptr, causal, scale, layout, variant_of(variant),
                      alibi_slopes ? &*alibi_slopes : nullptr);
  with_documents(call, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  AttentionProblem& p = call.problem;
  p.pass = unwrap(parse_pass(pass));
  if (deterministic && !p.is_backward()) {
    raise(ErrorCode::InvalidArgument,
          "deterministic = True applies to the backward pass only (pass_='bwd')");
  }
  p.deterministic = deterministic;
  // The gradients as attention_backward() allocates them (they do not change the config).
  p.do_strides = p.dq_strides = p.o_strides;
  p.dk_strides = p.dv_strides = p.k_strides;
  std::shared_ptr<Runtime> runtime = runtimes().get(call.place);
  std::pair<AttentionConfig, std::string> chosen;
  {
    nb::gil_scoped_release release;
    CudaContextGuard guard(call.place.cuda());
    chosen = resolve_config(*runtime, p, config);
  }
  nb::dict result;
  result["config"] = chosen.first.to_string();
  result["source"] = chosen.second;
  result["device"] = call.place.to_string();
  result["problem"] = p.to_string();
  return result;
}

nb::object block_mask_stats(InArray q, InArray k, InArray v, bool causal,
                            std::optional<double> scale, const std::string& layout,
                            std::optional<std::string> config, const std::string& pass,
                            bool deterministic, std::optional<nb::tuple> variant) {
  Call call = prepare(q, k, v, nullptr, nullptr, causal, scale, layout, variant_of(variant),
                      nullptr);
  AttentionProblem& p = call.problem;
  p.pass = unwrap(parse_pass(pass));
  p.deterministic = deterministic && p.is_backward();
  p.do_strides = p.dq_strides = p.o_strides;
  p.dk_strides = p.dv_strides = p.k_strides;
  std::shared_ptr<Runtime> runtime = runtimes().get(call.place);
  AttentionConfig chosen;
  BlockMask map;
  std::vector<unsigned char> states;
  {
    nb::gil_scoped_release release;
    CudaContextGuard guard(call.place.cuda());
    chosen = resolve_config(*runtime, p, config).first;
    if (runtime->backend().name() == "cuda" && block_mask_applies(p, chosen)) {
      map = unwrap(runtime->backend().build_block_mask(p, chosen.block_m, chosen.block_n));
      states.resize(static_cast<size_t>(map.shape.maps() * map.shape.q_tiles() *
                                        map.shape.k_tiles()));
      check(runtime->backend().copy_to_host(
          states.data(),
          static_cast<const unsigned char*>(map.buffer.get()) + map.shape.states_offset(),
          states.size()));
    }
  }
  if (states.empty()) return nb::none();
  double count[3] = {0, 0, 0};
  for (unsigned char state : states) count[state < 3 ? state : 1] += 1;
  const double tiles = static_cast<double>(states.size());
  nb::dict result;
  result["config"] = chosen.to_string();
  result["block_m"] = chosen.block_m;
  result["block_n"] = chosen.block_n;
  result["maps"] = map.shape.maps();
  result["build_ms"] = map.build_ms;
  result["empty"] = count[0] / tiles;
  result["partial"] = count[1] / tiles;
  result["full"] = count[2] / tiles;
  return result;
}

}  // namespace flashjit::python
