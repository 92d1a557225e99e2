#include "support/amd_gpu.hpp"

#if FLASHJIT_HAVE_HIP_BACKEND

#include <cstdlib>

namespace flashjit::testing {
namespace {

struct AmdState {
  std::shared_ptr<hip::HipBackend> backend;
  std::string unavailable_reason;
};

const AmdState& amd_state() {
  static const AmdState state = [] {
    AmdState result;
    Result<std::unique_ptr<hip::HipBackend>> created = hip::HipBackend::create(0);
    if (created.ok()) {
      result.backend = std::shared_ptr<hip::HipBackend>(std::move(created.value()));
    } else {
      result.unavailable_reason = created.error().describe();
    }
    return result;
  }();
  return state;
}

}  // namespace

std::shared_ptr<hip::HipBackend> amd_backend() { return amd_state().backend; }

const std::string& amd_unavailable_reason() { return amd_state().unavailable_reason; }

bool amd_gpu_expected() {
  const char* value = std::getenv("FLASHJIT_EXPECT_AMD_GPU");
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}

}  // namespace flashjit::testing

#endif
