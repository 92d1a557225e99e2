#include "support/gpu.hpp"

#include <cstdlib>
#include <mutex>

namespace flashjit::testing {
namespace {

struct GpuState {
  std::shared_ptr<cuda::CudaBackend> backend;
  std::string unavailable_reason;
};

// Created once: driver init and context retain cost ~0.1-0.5 s, too much to repeat per test.
const GpuState& gpu_state() {
  static const GpuState state = [] {
    GpuState result;
    auto backend = cuda::CudaBackend::create(0);
    if (backend.ok()) {
      result.backend = std::shared_ptr<cuda::CudaBackend>(std::move(backend).value());
    } else {
      result.unavailable_reason = backend.error().describe();
    }
    return result;
  }();
  return state;
}

}  // namespace

std::shared_ptr<cuda::CudaBackend> gpu_backend() { return gpu_state().backend; }

const std::string& gpu_unavailable_reason() { return gpu_state().unavailable_reason; }

bool gpu_expected() {
  const char* value = std::getenv("FLASHJIT_EXPECT_GPU");
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}

}  // namespace flashjit::testing
