#include "support/amd_gpu.hpp"

#if FLASHJIT_HAVE_HIP_BACKEND

#include <cstdlib>
#include <filesystem>
#include <random>

#include "support/device_run.hpp"

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

void check_hip_runtime_and_disk_cache(Pass pass,
                                      const std::function<void(const Kernel&)>& expect_kernel) {
  const bool backward = pass == Pass::Backward;
  std::random_device entropy;
  std::string name = backward ? "flashjit-hip-bwd-test-cache-" : "flashjit-hip-test-cache-";
  name += std::to_string(entropy());
  name += std::to_string(entropy());
  const std::filesystem::path cache_dir = std::filesystem::temp_directory_path() / name;
  RuntimeOptions options;
  options.backend = "hip";
  options.user_db = "none";
  options.cache_dir = cache_dir;
  for (int round = 0; round < 2; ++round) {
    Result<std::unique_ptr<Runtime>> runtime = Runtime::create(options);
    ASSERT_TRUE(runtime.ok()) << runtime.error().describe();
    const Backend& backend = (*runtime)->backend();
    EXPECT_EQ(backend.name(), "hip");
    for (int head_dim : {96, 128}) {
      const auto problem =
          AttentionProblem::make(2, 4, 2, 257, 300, head_dim, DType::BF16, true).with_pass(pass);
      Result<std::shared_ptr<Kernel>> kernel =
          backward ? (*runtime)->attention_backward(problem) : (*runtime)->attention(problem);
      ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
      const std::string where = "d" + std::to_string(head_dim) + " " +
                                (*kernel)->config().to_string() + " pass " + std::to_string(round);
      SCOPED_TRACE(where);
      if (expect_kernel) expect_kernel(**kernel);
      const HostInputs inputs = random_inputs(problem, 5);
      Result<DeviceTensors> tensors = upload(backend, problem, inputs);
      ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
      const RunOutput out = run_poisoned(backend, **kernel, problem, tensors.value());
      EXPECT_TRUE(run_matches_reference(problem, out, reference_attention(problem, inputs)));
    }
    const RuntimeStats stats = (*runtime)->stats();
    EXPECT_EQ(stats.compiles, round == 0 ? 2 : 0);
    EXPECT_EQ(stats.disk_cache_loads, round == 0 ? 0 : 2);
  }
  std::error_code ignored;
  std::filesystem::remove_all(cache_dir, ignored);
}

}  // namespace flashjit::testing

#endif
