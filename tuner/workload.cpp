#include "tuner/workload.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

namespace flashjit {
namespace {

constexpr size_t kHostBlockElements = size_t{1} << 20;  // random data copied block by block

size_t element_bytes(const AttentionProblem& problem) {
  return static_cast<size_t>(dtype_bytes(problem.dtype));
}

void bind(AttentionArgs& args, TensorRole role, void* pointer) {
  switch (role) {
    case TensorRole::Q:
      args.q = pointer;
      break;
    case TensorRole::K:
      args.k = pointer;
      break;
    case TensorRole::V:
      args.v = pointer;
      break;
    case TensorRole::O:
      args.o = pointer;
      break;
    case TensorRole::Lse:
      args.lse = static_cast<float*>(pointer);
      break;
    case TensorRole::DO:
      args.d_o = pointer;
      break;
    case TensorRole::DQ:
      args.dq = pointer;
      break;
    case TensorRole::DK:
      args.dk = pointer;
      break;
    case TensorRole::DV:
      args.dv = pointer;
      break;
  }
}

// The host storage of an input tensor of the verification problem.
const void* host_input(const HostInputs& inputs, TensorRole role) {
  switch (role) {
    case TensorRole::Q:
      return inputs.q.data();
    case TensorRole::K:
      return inputs.k.data();
    case TensorRole::V:
      return inputs.v.data();
    case TensorRole::O:
      return inputs.o.data();
    case TensorRole::Lse:
      return inputs.lse.data();
    case TensorRole::DO:
      return inputs.d_o.data();
    default:
      return nullptr;
  }
}

Result<std::vector<uint16_t>> download(const Backend& backend, const DeviceBuffer& buffer) {
  std::vector<uint16_t> bits(buffer.bytes() / sizeof(uint16_t));
  FLASHJIT_TRY(backend.copy_to_host(bits.data(), buffer.get(), bits.size() * sizeof(uint16_t)));
  return bits;
}

}  // namespace

const char* to_string(TensorRole role) {
  switch (role) {
    case TensorRole::Q:
      return "q";
    case TensorRole::K:
      return "k";
    case TensorRole::V:
      return "v";
    case TensorRole::O:
      return "o";
    case TensorRole::Lse:
      return "lse";
    case TensorRole::DO:
      return "do";
    case TensorRole::DQ:
      return "dq";
    case TensorRole::DK:
      return "dk";
    case TensorRole::DV:
      return "dv";
  }
  return "?";
}

std::vector<TensorSpec> tensor_specs(const AttentionProblem& p) {
  const size_t e = element_bytes(p);
  const size_t q = static_cast<size_t>(p.q_span()) * e;
  const size_t kv = static_cast<size_t>(p.kv_span()) * e;
  const size_t o = static_cast<size_t>(p.o_span()) * e;
  const size_t lse = static_cast<size_t>(p.lse_elements()) * sizeof(float);
  if (!p.is_backward()) {
    return {{TensorRole::Q, q, false},
            {TensorRole::K, kv, false},
            {TensorRole::V, kv, false},
            {TensorRole::O, o, true},
            {TensorRole::Lse, lse, true}};
  }
  const size_t d_o = static_cast<size_t>(p.do_span()) * e;
  const size_t dq = static_cast<size_t>(p.dq_span()) * e;
  const size_t dkv = static_cast<size_t>(p.dkv_span()) * e;
  return {{TensorRole::Q, q, false},  {TensorRole::K, kv, false},    {TensorRole::V, kv, false},
          {TensorRole::O, o, false},  {TensorRole::Lse, lse, false}, {TensorRole::DO, d_o, false},
          {TensorRole::DQ, dq, true}, {TensorRole::DK, dkv, true},   {TensorRole::DV, dkv, true}};
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

  for (const TensorSpec& spec : tensor_specs(problem)) {
    if (spec.output) continue;
    const DeviceBuffer* buffer = tensors.find(spec.role);
    if (buffer == nullptr) continue;
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

Result<std::unique_ptr<Verification>> Verification::create(const Backend& backend,
                                                           const AttentionProblem& problem,
                                                           uint64_t seed) {
  std::unique_ptr<Verification> v(new Verification(backend, problem));
  v->inputs_ = random_inputs(problem, seed);
  v->reference_ = reference_attention(problem, v->inputs_);
  v->specs_ = tensor_specs(problem);
  Result<DeviceTensors> tensors = allocate_tensors(backend, v->specs_);
  if (!tensors.ok()) return tensors.error();
  v->tensors_ = std::move(tensors.value());
  for (const TensorSpec& spec : v->specs_) {
    if (spec.output) continue;
    FLASHJIT_TRY(backend.copy_to_device(v->tensors_.find(spec.role)->get(),
                                        host_input(v->inputs_, spec.role), spec.bytes));
  }
  return v;
}

Result<Verification::Verdict> Verification::run(const Kernel& kernel, double max_rel,
                                                double max_lse_abs, double max_grad_rel) const {
  for (const TensorSpec& spec : specs_) {
    if (spec.output) {
      const DeviceBuffer* buffer = tensors_.find(spec.role);
      FLASHJIT_TRY(backend_.fill_bytes(buffer->get(), 0xFF, buffer->bytes()));
    }
  }
  Verdict verdict;
  Status launched = kernel.launch(problem_, tensors_.args);
  if (launched.ok()) launched = backend_.synchronize();
  if (!launched.ok()) {
    verdict.detail = launched.error().describe();
    return verdict;
  }
  verdict.launched = true;
  if (!problem_.is_backward()) {
    Result<std::vector<uint16_t>> o = download(backend_, *tensors_.find(TensorRole::O));
    if (!o.ok()) return o.error();
    std::vector<float> lse(static_cast<size_t>(problem_.lse_elements()));
    FLASHJIT_TRY(backend_.copy_to_host(lse.data(), tensors_.find(TensorRole::Lse)->get(),
                                       lse.size() * sizeof(float)));
    const Comparison comparison = compare(problem_, *o, lse, reference_);
    verdict.passed = within_tolerance(comparison, max_rel, max_lse_abs);
    verdict.detail = comparison.to_string();
    return verdict;
  }
  Result<std::vector<uint16_t>> dq = download(backend_, *tensors_.find(TensorRole::DQ));
  if (!dq.ok()) return dq.error();
  Result<std::vector<uint16_t>> dk = download(backend_, *tensors_.find(TensorRole::DK));
  if (!dk.ok()) return dk.error();
  Result<std::vector<uint16_t>> dv = download(backend_, *tensors_.find(TensorRole::DV));
  if (!dv.ok()) return dv.error();
  const GradientComparison comparison = compare_gradients(problem_, *dq, *dk, *dv, reference_);
  const double tolerance = max_grad_rel > 0 ? max_grad_rel : gradient_tolerance(problem_.dtype);
  verdict.passed = within_tolerance(comparison, tolerance);
  verdict.detail = comparison.to_string();
  return verdict;
}

}  // namespace flashjit
