// The C++ examples of the docs, compiled verbatim (tests/CMakeLists.txt extracts them) and run on
// the GPU: README.md's ("Using the library": the forward) and docs/USAGE.md's ("C++ API": the
// forward, then the backward on its o and lse).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/runtime.hpp"
#include "support/gpu.hpp"

namespace {

// README.md's code, with its free variables as parameters.
flashjit::Status readme_example(const void* q, const void* k, const void* v, void* o, float* lse,
                                void* stream) {
#include "readme_example.inc"
  return status;
}

// docs/USAGE.md's code (forward and backward), with its free variables as parameters.
flashjit::Status usage_example(const void* q, const void* k, const void* v, void* o, float* lse,
                               const void* d_o, void* dq, void* dk, void* dv, void* stream) {
#include "usage_example.inc"
  return status;
}

TEST(ReadmeExample, CompilesAndRuns) {
  FLASHJIT_REQUIRE_GPU();
  auto backend = flashjit::cuda::CudaBackend::create(0);
  ASSERT_TRUE(backend.ok()) << backend.error().describe();
  // The examples' problem: batch 2, 16 heads, 4096 x 4096, d 128, bf16, causal, BSHD.
  const auto problem =
      flashjit::AttentionProblem::make(2, 16, 16, 4096, 4096, 128, flashjit::DType::BF16, true);
  const size_t bytes = static_cast<size_t>(problem.q_span()) * 2;
  std::vector<uint16_t> host(problem.q_span());
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0x3c00 + (i * 2654435761u) % 512;  // ~1..2
  std::vector<flashjit::DeviceBuffer> buffers;  // q, k, v, o, d_o, dq, dk, dv
  for (int i = 0; i < 8; ++i) {
    auto buffer = (*backend)->allocate(bytes);
    ASSERT_TRUE(buffer.ok()) << buffer.error().describe();
    ASSERT_TRUE((*backend)->copy_to_device(buffer->get(), host.data(), bytes).ok());
    buffers.push_back(std::move(buffer.value()));
  }
  auto lse = (*backend)->allocate(problem.lse_elements() * sizeof(float));
  ASSERT_TRUE(lse.ok());
  for (int i : {3, 5, 6, 7})  // poison o and the gradients
    ASSERT_TRUE((*backend)->fill_bytes(buffers[i].get(), 0xFF, bytes).ok());
  std::vector<uint16_t> out(problem.o_span());
  // README.md: the forward alone writes o.
  const flashjit::Status forward =
      readme_example(buffers[0].get(), buffers[1].get(), buffers[2].get(), buffers[3].get(),
                     lse->as<float>(), nullptr);
  ASSERT_TRUE(forward.ok()) << forward.error().describe();
  ASSERT_TRUE((*backend)->synchronize().ok());
  ASSERT_TRUE((*backend)->copy_to_host(out.data(), buffers[3].get(), bytes).ok());
  for (uint16_t bits : out) ASSERT_NE(bits & 0x7F80, 0x7F80) << "NaN/inf or unwritten o";
  ASSERT_TRUE((*backend)->fill_bytes(buffers[3].get(), 0xFF, bytes).ok());  // poison o again
  // docs/USAGE.md: forward, then backward.
  const flashjit::Status status = usage_example(
      buffers[0].get(), buffers[1].get(), buffers[2].get(), buffers[3].get(), lse->as<float>(),
      buffers[4].get(), buffers[5].get(), buffers[6].get(), buffers[7].get(), nullptr);
  ASSERT_TRUE(status.ok()) << status.error().describe();
  ASSERT_TRUE((*backend)->synchronize().ok());
  for (int i : {3, 5, 6, 7}) {  // o, dq, dk, dv: written and finite
    ASSERT_TRUE((*backend)->copy_to_host(out.data(), buffers[i].get(), bytes).ok());
    for (uint16_t bits : out)
      ASSERT_NE(bits & 0x7F80, 0x7F80) << "NaN/inf or unwritten output " << i;
  }
}

}  // namespace
