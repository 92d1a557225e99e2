#include "support/variant_gpu_checks.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

#include "runtime/runtime.hpp"
#include "support/attention_cases.hpp"
#include "support/device_run.hpp"
#include "support/reference.hpp"

namespace flashjit::testing {

void check_variant_on_every_config(const Backend& backend, const VariantCase& c, Pass pass,
                                   const ConfigsFor& configs_for) {
  for (auto [head_dim, dtype] : {std::pair{64, DType::F16}, std::pair{128, DType::BF16}}) {
    AttentionProblem probe = make_problem(gpu_test_shapes()[0], head_dim, dtype, c.causal, pass);
    probe.variant = c.variant;
    const std::vector<AttentionConfig> configs = configs_for(probe);
    if (configs.empty()) GTEST_SKIP() << "no config of the selected families";
    const std::vector<BuiltKernel> kernels = build_all(backend, nullptr, probe, configs);
    uint64_t seed = 1;
    for (const Shape& shape : gpu_test_shapes()) {
      AttentionProblem problem = make_problem(shape, head_dim, dtype, c.causal, pass);
      problem.variant = c.variant;
      const HostInputs inputs = random_inputs(problem, seed++, c.functions);
      const Reference reference = reference_attention(problem, inputs, c.functions);
      Result<DeviceTensors> tensors = upload(backend, problem, inputs);
      ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
      for (size_t i = 0; i < configs.size(); ++i) {
        const std::string where = std::string(c.name) + " d" + std::to_string(head_dim) + " " +
                                  to_string(dtype) + " " + configs[i].to_string() + " " +
                                  shape.to_string();
        ASSERT_TRUE(kernels[i].kernel) << where << ": " << kernels[i].error;
        EXPECT_TRUE(run_matches_reference(
            problem, run_poisoned(backend, *kernels[i].kernel, problem, *tensors), reference))
            << where;
      }
    }
  }
}

void check_hidden_key_blocks(const Backend& backend, Pass pass, const ConfigsFor& configs_for) {
  for (const bool mask_mod : {false, true}) {
    SCOPED_TRACE(mask_mod ? "window + mask_mod" : "window");
    AttentionProblem problem =
        AttentionProblem::make(2, 4, 2, 64, 4096, 128, DType::BF16, true).with_pass(pass);
    problem.variant.window_left = 32;
    problem.variant.window_right = 0;
    VariantFunctions functions;
    if (mask_mod) {
      problem.variant.mask_mod = "(q_idx + kv_idx) % 3 != 0";
      functions.mask_mod = [](int64_t, int64_t, int64_t i, int64_t j) { return (i + j) % 3 != 0; };
    }
    HostInputs inputs = random_inputs(problem, 3, functions);
    poison_keys(problem, inputs, 0, 3840);
    const Reference reference = reference_attention(problem, inputs, functions);
    Result<DeviceTensors> tensors = upload(backend, problem, inputs);
    ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
    for (const AttentionConfig& config : configs_for(problem)) {
      Result<std::shared_ptr<Kernel>> kernel = build_kernel(backend, nullptr, problem, config);
      ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
      EXPECT_TRUE(run_matches_reference(problem, run_poisoned(backend, **kernel, problem, *tensors),
                                        reference))
          << config.to_string();
    }
  }
}

}  // namespace flashjit::testing
