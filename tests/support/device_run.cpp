#include "support/device_run.hpp"

#include <utility>

namespace flashjit::testing {
namespace {

Result<DeviceBuffer> allocate_copy(const Backend& backend, const void* host, size_t bytes) {
  Result<DeviceBuffer> buffer = backend.allocate(bytes);
  if (!buffer.ok()) return buffer.error();
  FLASHJIT_TRY(backend.copy_to_device(buffer->get(), host, bytes));
  return buffer;
}

Status allocate_into(const Backend& backend, size_t bytes, DeviceBuffer* buffer) {
  Result<DeviceBuffer> allocated = backend.allocate(bytes);
  if (!allocated.ok()) return allocated.error();
  *buffer = std::move(allocated.value());
  return ok_status();
}

Status copy_back(const Backend& backend, const DeviceBuffer& buffer, std::vector<uint16_t>* host) {
  host->resize(buffer.bytes() / sizeof(uint16_t));
  return backend.copy_to_host(host->data(), buffer.get(), buffer.bytes());
}

}  // namespace

Result<DeviceTensors> upload(const Backend& backend, const AttentionProblem& problem,
                             const HostInputs& inputs) {
  DeviceTensors t;
  auto upload_words = [&](const std::vector<uint16_t>& host, DeviceBuffer* buffer) -> Status {
    Result<DeviceBuffer> copied =
        allocate_copy(backend, host.data(), host.size() * sizeof(uint16_t));
    if (!copied.ok()) return copied.error();
    *buffer = std::move(copied.value());
    return ok_status();
  };
  const size_t word_bytes = sizeof(uint16_t) * storage_words(problem.dtype);
  FLASHJIT_TRY(upload_words(inputs.q, &t.q));
  FLASHJIT_TRY(upload_words(inputs.k, &t.k));
  FLASHJIT_TRY(upload_words(inputs.v, &t.v));
  if (!problem.is_backward()) {
    FLASHJIT_TRY(allocate_into(backend, problem.o_span() * word_bytes, &t.o));
    FLASHJIT_TRY(allocate_into(backend, problem.lse_elements() * sizeof(float), &t.lse));
    return t;
  }
  FLASHJIT_TRY(upload_words(inputs.o, &t.o));
  FLASHJIT_TRY(upload_words(inputs.d_o, &t.d_o));
  Result<DeviceBuffer> lse =
      allocate_copy(backend, inputs.lse.data(), inputs.lse.size() * sizeof(float));
  if (!lse.ok()) return lse.error();
  t.lse = std::move(lse.value());
  FLASHJIT_TRY(allocate_into(backend, problem.dq_span() * word_bytes, &t.dq));
  FLASHJIT_TRY(allocate_into(backend, problem.dkv_span() * word_bytes, &t.dk));
  FLASHJIT_TRY(allocate_into(backend, problem.dkv_span() * word_bytes, &t.dv));
  return t;
}

Status run_forward_poisoned(const Backend& backend, const Kernel& kernel,
                            const AttentionProblem& problem, const DeviceTensors& t,
                            std::vector<uint16_t>* o, std::vector<float>* lse) {
  FLASHJIT_TRY(backend.fill_bytes(t.o.get(), 0xFF, t.o.bytes()));
  FLASHJIT_TRY(backend.fill_bytes(t.lse.get(), 0xFF, t.lse.bytes()));
  FLASHJIT_TRY(
      kernel.launch(problem, {t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.as<float>()}));
  FLASHJIT_TRY(backend.synchronize());
  FLASHJIT_TRY(copy_back(backend, t.o, o));
  lse->resize(problem.lse_elements());
  return backend.copy_to_host(lse->data(), t.lse.get(), t.lse.bytes());
}

Status run_backward_poisoned(const Backend& backend, const Kernel& kernel,
                             const AttentionProblem& problem, const DeviceTensors& t,
                             HostGradients* gradients, void* workspace, size_t workspace_bytes) {
  for (const DeviceBuffer* buffer : {&t.dq, &t.dk, &t.dv})
    FLASHJIT_TRY(backend.fill_bytes(buffer->get(), 0xFF, buffer->bytes()));
  AttentionArgs args{t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.as<float>()};
  args.d_o = t.d_o.get();
  args.dq = t.dq.get();
  args.dk = t.dk.get();
  args.dv = t.dv.get();
  args.workspace = workspace;
  args.workspace_bytes = workspace_bytes;
  FLASHJIT_TRY(kernel.launch(problem, args));
  FLASHJIT_TRY(backend.synchronize());
  FLASHJIT_TRY(copy_back(backend, t.dq, &gradients->dq));
  FLASHJIT_TRY(copy_back(backend, t.dk, &gradients->dk));
  return copy_back(backend, t.dv, &gradients->dv);
}

}  // namespace flashjit::testing
