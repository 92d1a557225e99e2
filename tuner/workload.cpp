#include "tuner/workload.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <type_traits>
#include <utility>

#include "generator/enum_names.hpp"
#include "tuner/variant_functions.hpp"

namespace flashjit {
namespace {

constexpr size_t kHostBlockElements = size_t{1} << 20;  // random data copied block by block

size_t element_bytes(const AttentionProblem& problem) {
  return static_cast<size_t>(dtype_bytes(problem.dtype));
}

// Where each role's tensor lives, in one table: its pointer in AttentionArgs, its host storage as
// an input (HostInputs) and as an output (HostOutputs), `kNone` where it has none.
// visit(args member, inputs member, outputs member) for `role`.
constexpr std::nullptr_t kNone = nullptr;
template <class Visit>
void visit_role(TensorRole role, const Visit& visit) {
  using A = AttentionArgs;
  using I = HostInputs;
  using O = HostOutputs;
  switch (role) {
    case TensorRole::Q:
      return visit(&A::q, &I::q, kNone);
    case TensorRole::K:
      return visit(&A::k, &I::k, kNone);
    case TensorRole::V:
      return visit(&A::v, &I::v, kNone);
    case TensorRole::O:
      return visit(&A::o, &I::o, &O::o);
    case TensorRole::Lse:
      return visit(&A::lse, &I::lse, &O::lse);
    case TensorRole::DO:
      return visit(&A::d_o, &I::d_o, kNone);
    case TensorRole::DQ:
      return visit(&A::dq, kNone, &O::dq);
    case TensorRole::DK:
      return visit(&A::dk, kNone, &O::dk);
    case TensorRole::DV:
      return visit(&A::dv, kNone, &O::dv);
    case TensorRole::BlockTable:
      return visit(&A::block_table, &I::block_table, kNone);
    case TensorRole::SeqlensK:
      return visit(&A::seqlens_k, &I::seqlens_k, kNone);
    case TensorRole::AlibiSlopes:
      return visit(&A::alibi_slopes, &I::alibi_slopes, kNone);
    case TensorRole::CuSeqlensQ:
      return visit(&A::cu_seqlens_q, &I::cu_seqlens_q, kNone);
    case TensorRole::CuSeqlensK:
      return visit(&A::cu_seqlens_k, &I::cu_seqlens_k, kNone);
  }
}

template <class Member>
constexpr bool is_none = std::is_null_pointer_v<Member>;

void bind(AttentionArgs& args, TensorRole role, void* pointer) {
  visit_role(role, [&](auto arg, auto, auto) {
    using Pointer = std::remove_reference_t<decltype(args.*arg)>;
    args.*arg = static_cast<Pointer>(pointer);
  });
}

// The host storage of input `role` and its size in bytes ({nullptr, 0}: not an input).
std::pair<const void*, size_t> host_input(const HostInputs& inputs, TensorRole role) {
  std::pair<const void*, size_t> host{nullptr, 0};
  visit_role(role, [&](auto, auto input, auto) {
    if constexpr (!is_none<decltype(input)>) {
      const auto& v = inputs.*input;
      host = {v.data(), v.size() * sizeof(v[0])};
    }
  });
  return host;
}

// The host storage output `role` is copied back into, sized to `bytes` (nullptr: not an output).
void* host_output(HostOutputs& outputs, TensorRole role, size_t bytes) {
  void* host = nullptr;
  visit_role(role, [&](auto, auto, auto output) {
    if constexpr (!is_none<decltype(output)>) {
      auto& v = outputs.*output;
      v.resize(bytes / sizeof(v[0]));
      host = v.data();
    }
  });
  return host;
}

// `status`'s error with the tensor it concerns in front: "dq: ...".
Error about(TensorRole role, const Status& status) {
  return make_error(status.error().code,
                    std::string(to_string(role)) + ": " + status.error().message);
}

}  // namespace

const char* to_string(TensorRole role) {
  return enum_name(role,
                   {"q", "k", "v", "o", "lse", "do", "dq", "dk", "dv", "block_table", "seqlens_k",
                    "alibi_slopes", "cu_seqlens_q", "cu_seqlens_k"},
                   "?");
}

const char* to_string(RunStep step) {
  return enum_name(step, {"poison the outputs", "launch", "synchronize", "copy the outputs back"},
                   "?");
}

namespace {

// A variant's inputs, both passes: ALiBi's slopes, packed documents' offsets.
void add_variant_inputs(const AttentionProblem& p, std::vector<TensorSpec>& specs) {
  if (p.variant.alibi)
    specs.push_back(
        {TensorRole::AlibiSlopes, static_cast<size_t>(p.heads_q) * sizeof(float), false});
  if (p.variant.varlen)
    for (TensorRole role : {TensorRole::CuSeqlensQ, TensorRole::CuSeqlensK})
      specs.push_back({role, static_cast<size_t>(p.batch + 1) * sizeof(int32_t), false});
}

}  // namespace

std::vector<TensorSpec> tensor_specs(const AttentionProblem& p) {
  const size_t e = element_bytes(p);
  const size_t q = static_cast<size_t>(p.q_span()) * e;
  const size_t kv = static_cast<size_t>(p.kv_span()) * e;
  const size_t o = static_cast<size_t>(p.o_span()) * e;
  const size_t lse = static_cast<size_t>(p.lse_elements()) * sizeof(float);
  if (!p.is_backward()) {
    std::vector<TensorSpec> specs = {{TensorRole::Q, q, false},
                                     {TensorRole::K, kv, false},
                                     {TensorRole::V, kv, false},
                                     {TensorRole::O, o, true},
                                     {TensorRole::Lse, lse, true}};
    if (p.kv.paged())
      specs.push_back({TensorRole::BlockTable,
                       static_cast<size_t>(p.block_table_elements()) * sizeof(int32_t), false});
    if (p.kv.seqlens_k)
      specs.push_back(
          {TensorRole::SeqlensK, static_cast<size_t>(p.batch) * sizeof(int32_t), false});
    add_variant_inputs(p, specs);
    return specs;
  }
  const size_t d_o = static_cast<size_t>(p.do_span()) * e;
  const size_t dq = static_cast<size_t>(p.dq_span()) * e;
  const size_t dkv = static_cast<size_t>(p.dkv_span()) * e;
  std::vector<TensorSpec> specs = {
      {TensorRole::Q, q, false},  {TensorRole::K, kv, false},    {TensorRole::V, kv, false},
      {TensorRole::O, o, false},  {TensorRole::Lse, lse, false}, {TensorRole::DO, d_o, false},
      {TensorRole::DQ, dq, true}, {TensorRole::DK, dkv, true},   {TensorRole::DV, dkv, true}};
  add_variant_inputs(p, specs);  // the backward of a variant reads the forward's
  return specs;
}

bool has_index_tensors(const AttentionProblem& p) {
  return p.kv.paged() || p.kv.seqlens_k || p.variant.alibi || p.variant.varlen;
}

AttentionProblem verification_problem(const AttentionProblem& problem, int64_t heads_kv,
                                      int64_t seqlen_q, int64_t seqlen_k) {
  const int64_t group = problem.group_size();
  const bool per_sequence = problem.variant.varlen || problem.kv.paged() || problem.kv.seqlens_k;
  const int64_t batch = per_sequence ? 3 : 1;
  // Varlen: totals a little short of 3 full documents, so that even_cu_seqlens gives them
  // uneven lengths, none past the longest.
  AttentionProblem small =
      problem.variant.varlen
          ? AttentionProblem::make_varlen(batch, heads_kv * group, heads_kv, seqlen_q, seqlen_k,
                                          batch * seqlen_q - 5, batch * seqlen_k - 7,
                                          problem.head_dim, problem.dtype, problem.causal)
          : AttentionProblem::make(batch, heads_kv * group, heads_kv, seqlen_q, seqlen_k,
                                   problem.head_dim, problem.dtype, problem.causal);
  const Variant documents = small.variant;
  small.variant = problem.variant;  // the same key: window, softcap, ALiBi, prefix, mods
  small.variant.total_q = documents.total_q;
  small.variant.total_k = documents.total_k;
  small.pass = problem.pass;
  small.deterministic = problem.deterministic;
  if (problem.kv.paged()) {
    const int page = problem.kv.page_size;
    small = small.with_paged_kv(page, batch * ((seqlen_k + page - 1) / page));
  }
  small.kv.seqlens_k = problem.kv.seqlens_k;
  return small;
}

const DeviceBuffer* DeviceTensors::find(TensorRole role) const {
  for (const auto& [r, buffer] : buffers)
    if (r == role) return &buffer;
  return nullptr;
}

Result<DeviceTensors> allocate_tensors(const Backend& backend,
                                       const std::vector<TensorSpec>& specs) {
  DeviceTensors tensors;
  for (const TensorSpec& spec : specs) {
    Result<DeviceBuffer> buffer = backend.allocate(spec.bytes);
    if (!buffer.ok()) return buffer.error();
    bind(tensors.args, spec.role, buffer->get());
    tensors.buffers.emplace_back(spec.role, std::move(buffer.value()));
  }
  return tensors;
}

Status fill_for_timing(const Backend& backend, const AttentionProblem& problem,
                       DeviceTensors& tensors, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> block(kHostBlockElements * storage_words(problem.dtype));
  for (size_t i = 0; i < kHostBlockElements; ++i)
    set_element(block.data(), static_cast<int64_t>(i), normal(engine), problem.dtype);
  const size_t block_bytes = block.size() * sizeof(uint16_t);
  const float lse_value = std::log(static_cast<float>(problem.seqlen_k)) + 0.5f;
  const std::vector<float> lse_block(kHostBlockElements, lse_value);

  // The int32 tensors of a paged cache hold what random_inputs makes (pages, full lengths).
  const HostInputs indices = [&] {
    HostInputs none;
    if (problem.variant.alibi) none.alibi_slopes = standard_alibi_slopes(problem.heads_q);
    if (problem.variant.varlen) {  // the documents random_inputs makes (no data needed)
      none.cu_seqlens_q = even_cu_seqlens(problem.batch, problem.variant.total_q, problem.seqlen_q);
      none.cu_seqlens_k = even_cu_seqlens(problem.batch, problem.variant.total_k, problem.seqlen_k);
    }
    if (!problem.kv.paged() && !problem.kv.seqlens_k) return none;
    AttentionProblem small = problem;  // the indices only: no K/V data needed
    HostInputs made;
    std::mt19937_64 shuffle(seed);
    std::vector<int32_t> pages(static_cast<size_t>(std::max<int64_t>(1, problem.kv.num_pages)));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), shuffle);
    made.block_table.resize(static_cast<size_t>(small.block_table_elements()));
    for (size_t i = 0; i < made.block_table.size(); ++i)
      made.block_table[i] = pages[i % pages.size()];
    made.seqlens_k.assign(static_cast<size_t>(problem.batch),
                          static_cast<int32_t>(problem.seqlen_k));
    return made;
  }();
  for (const TensorSpec& spec : tensor_specs(problem)) {
    if (spec.output) continue;
    const DeviceBuffer* buffer = tensors.find(spec.role);
    if (buffer == nullptr) continue;
    if (spec.role == TensorRole::BlockTable || spec.role == TensorRole::SeqlensK ||
        spec.role == TensorRole::AlibiSlopes || spec.role == TensorRole::CuSeqlensQ ||
        spec.role == TensorRole::CuSeqlensK) {
      const auto [host, bytes] = host_input(indices, spec.role);
      FLASHJIT_TRY(backend.copy_to_device(buffer->get(), host, std::min(bytes, buffer->bytes())));
      continue;
    }
    const bool lse = spec.role == TensorRole::Lse;
    const void* source = lse ? static_cast<const void*>(lse_block.data()) : block.data();
    const size_t source_bytes = lse ? lse_block.size() * sizeof(float) : block_bytes;
    auto* base = static_cast<unsigned char*>(buffer->get());
    for (size_t offset = 0; offset < buffer->bytes(); offset += source_bytes) {
      const size_t bytes = std::min(source_bytes, buffer->bytes() - offset);
      FLASHJIT_TRY(backend.copy_to_device(base + offset, source, bytes));
    }
  }
  return ok_status();
}

Result<DeviceTensors> upload_inputs(const Backend& backend, const AttentionProblem& problem,
                                    const HostInputs& inputs) {
  const std::vector<TensorSpec> specs = tensor_specs(problem);
  Result<DeviceTensors> tensors = allocate_tensors(backend, specs);
  if (!tensors.ok()) return tensors.error();
  for (const TensorSpec& spec : specs) {
    if (spec.output) continue;
    const auto [host, bytes] = host_input(inputs, spec.role);
    if (bytes != spec.bytes) {
      return make_error(ErrorCode::InvalidArgument, std::string("host ") + to_string(spec.role) +
                                                        " has " + std::to_string(bytes) +
                                                        " bytes: " + problem.to_string() +
                                                        " needs " + std::to_string(spec.bytes));
    }
    if (Status copied = backend.copy_to_device(tensors->find(spec.role)->get(), host, bytes);
        !copied.ok())
      return about(spec.role, copied);
  }
  return tensors;
}

PoisonedRun launch_poisoned(const Backend& backend, const Kernel& kernel,
                            const AttentionProblem& problem, const DeviceTensors& tensors,
                            const AttentionArgs& args) {
  PoisonedRun run;
  auto fail = [&](RunStep step, Error error) {
    run.status = std::move(error);
    run.failed = step;
    return std::move(run);
  };
  const std::vector<TensorSpec> specs = tensor_specs(problem);
  for (const TensorSpec& spec : specs) {
    if (!spec.output) continue;
    const DeviceBuffer* buffer = tensors.find(spec.role);
    if (buffer == nullptr || buffer->bytes() < spec.bytes) {
      return fail(RunStep::Poison,
                  make_error(ErrorCode::InvalidArgument,
                             std::string(to_string(spec.role)) + ": no device buffer of " +
                                 std::to_string(spec.bytes) + " bytes for " + problem.to_string()));
    }
    if (Status s = backend.fill_bytes(buffer->get(), 0xFF, buffer->bytes()); !s.ok())
      return fail(RunStep::Poison, about(spec.role, s));
  }
  if (Status s = kernel.launch(problem, args); !s.ok()) return fail(RunStep::Launch, s.error());
  if (Status s = backend.synchronize(); !s.ok()) return fail(RunStep::Synchronize, s.error());
  for (const TensorSpec& spec : specs) {
    if (!spec.output) continue;
    void* host = host_output(run.outputs, spec.role, spec.bytes);
    if (Status s = backend.copy_to_host(host, tensors.find(spec.role)->get(), spec.bytes); !s.ok())
      return fail(RunStep::Download, about(spec.role, s));
  }
  return run;
}

Result<std::unique_ptr<Verification>> Verification::create(const Backend& backend,
                                                           const AttentionProblem& problem,
                                                           uint64_t seed,
                                                           const VariantFunctions& given) {
  // User expressions without a host function: compiled for the host (tuner/variant_functions).
  Result<VariantFunctions> complete = complete_variant_functions(problem, given);
  if (!complete.ok()) return complete.error();
  const VariantFunctions& functions = complete.value();
  std::unique_ptr<Verification> v(new Verification(backend, problem));
  v->inputs_ = random_inputs(problem, seed, functions);  // (a backward's o, lse: the variant's)
  for (size_t b = 0; b < v->inputs_.seqlens_k.size(); ++b) {
    const int64_t len = problem.seqlen_k - static_cast<int64_t>(b % 3) * problem.seqlen_k / 3;
    v->inputs_.seqlens_k[b] = static_cast<int32_t>(std::max<int64_t>(1, len));
  }
  v->reference_ = reference_attention(problem, v->inputs_, functions);
  Result<DeviceTensors> tensors = upload_inputs(backend, problem, v->inputs_);
  if (!tensors.ok()) return tensors.error();
  v->tensors_ = std::move(tensors.value());
  return v;
}

Result<Verification::Verdict> Verification::run(const Kernel& kernel, double max_rel,
                                                double max_lse_abs, double max_grad_rel) const {
  const PoisonedRun run = launch_poisoned(backend_, kernel, problem_, tensors_, tensors_.args);
  Verdict verdict;
  if (!run.status.ok()) {
    if (run.failed != RunStep::Launch && run.failed != RunStep::Synchronize)
      return run.status.error();
    verdict.detail = run.status.error().describe();
    return verdict;
  }
  verdict.launched = true;
  const HostOutputs& out = run.outputs;
  if (!problem_.is_backward()) {
    const Comparison comparison = compare(problem_, out.o, out.lse, reference_);
    verdict.passed = within_tolerance(comparison, max_rel, max_lse_abs);
    verdict.detail = comparison.to_string();
    return verdict;
  }
  const GradientComparison comparison =
      compare_gradients(problem_, out.dq, out.dk, out.dv, reference_);
  const double tolerance = max_grad_rel > 0 ? max_grad_rel : gradient_tolerance(problem_.dtype);
  verdict.passed = within_tolerance(comparison, tolerance);
  verdict.detail = comparison.to_string();
  return verdict;
}

}  // namespace flashjit
