// GPU correctness of the CUDA attention backward: every legal config (every family, both dQ
// modes) of every (head_dim, dtype, causal) group against the fp64 reference gradients, over
// shapes that hit the edges (a single row, ragged tails, seqlen_q != seqlen_k both ways, rows
// that see no key, GQA 4:1 and MQA, batch 3, BHSD and per-tensor padded BSHD strides for every
// input and gradient), plus one long sequence per head dim; padded head dims; the launch
// contract (deterministic mode, caller workspaces, typed errors). Skips, with the reason, where
// there is no CUDA GPU (FLASHJIT_EXPECT_GPU=1 turns that into a failure).
//
// dq, dk and dv are poisoned (0xFF bytes: NaN) before each launch, so that an element a kernel
// forgot to write fails, and compared through their own strides, so that a write into the
// padding between rows fails too. A failure prints the three relative errors and the counts of
// non-finite, poisoned and padding elements, so that one GPU run diagnoses a bug.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "generator/backward_config.hpp"
#include "generator/config.hpp"
#include "generator/problem.hpp"
#include "runtime/runtime.hpp"
#include "support/all_configs.hpp"
#include "support/attention_cases.hpp"
#include "support/device_run.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;
using ft::Shape;
using ft::Storage;

AttentionProblem backward_problem(const Shape& shape, int head_dim, DType dtype, bool causal) {
  return ft::make_problem(shape, head_dim, dtype, causal, Pass::Backward);
}

// ---------------------------------------------------------------------------------------------
// Device helpers: tests/support/device_run.hpp

using ft::DeviceTensors;
using ft::run_poisoned;
using ft::RunOutput;
using ft::upload;

GradientComparison compare_output(const AttentionProblem& problem, const RunOutput& out,
                                  const ft::Reference& reference) {
  return compare_gradients(problem, out.dq, out.dk, out.dv, reference);
}

// ---------------------------------------------------------------------------------------------
// Every legal config of a group on every shape (tests/support/all_configs.hpp): the GPU tests'
// shapes, the long one (4097 rows) for the default config only

class CudaBackwardAllConfigs : public ::testing::TestWithParam<ft::ConfigGroup> {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_GPU(); }
};

TEST_P(CudaBackwardAllConfigs, MatchesFp64Reference) {
  ft::AllConfigsOptions options;
  options.shapes = ft::gpu_test_shapes();
  options.all_configs_max_seqlen = 4096;
  ft::check_all_configs(*ft::gpu_backend(), GetParam(), options);
}

INSTANTIATE_TEST_SUITE_P(AllGroups, CudaBackwardAllConfigs,
                         ::testing::ValuesIn(ft::all_groups(Pass::Backward)),
                         [](const ::testing::TestParamInfo<ft::ConfigGroup>& info) {
                           return info.param.name();
                         });

// ---------------------------------------------------------------------------------------------
// Padded head dims, the launch contract, the Runtime

class CudaBackwardApi : public ::testing::Test {
 protected:
  void SetUp() override {
    FLASHJIT_REQUIRE_GPU();
    backend_ = ft::gpu_backend();
  }

  // The default-config kernel of `problem`'s signature, built without a cache.
  std::shared_ptr<Kernel> kernel_for(const AttentionProblem& problem) {
    Result<AttentionConfig> config = default_config(problem, backend_->device());
    EXPECT_TRUE(config.ok()) << config.error().describe();
    if (!config.ok()) return nullptr;
    Result<std::shared_ptr<Kernel>> kernel =
        build_kernel(*backend_, nullptr, problem, config.value());
    EXPECT_TRUE(kernel.ok()) << kernel.error().describe();
    return kernel.ok() ? kernel.value() : nullptr;
  }

  // Runs `kernel` on fresh inputs of `problem` and checks the gradients against the reference.
  void expect_matches_reference(const Kernel& kernel, const AttentionProblem& problem,
                                uint64_t seed, const std::string& context) {
    const ft::HostInputs inputs = ft::random_inputs(problem, seed);
    Result<DeviceTensors> tensors = upload(*backend_, problem, inputs);
    ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
    RunOutput out = run_poisoned(*backend_, kernel, problem, tensors.value());
    ASSERT_TRUE(out.status.ok()) << context << ": " << out.status.error().describe();
    const GradientComparison comparison =
        compare_output(problem, out, ft::reference_attention(problem, inputs));
    EXPECT_TRUE(within_tolerance(comparison, gradient_tolerance(problem.dtype)))
        << context << " " << problem.to_string() << ": " << comparison.to_string();
  }

  std::shared_ptr<cuda::CudaBackend> backend_;
};

// Head dims that are not a power of two are padded in shared memory (zero-filled columns that
// are never written back): the default config of each, atomic and deterministic, on ragged and
// padded shapes.
TEST_F(CudaBackwardApi, PaddedHeadDimsMatchReference) {
  for (int head_dim : {8, 72, 96, 200})
    for (bool causal : {false, true})
      for (bool deterministic : {false, true}) {
        AttentionProblem probe =
            backward_problem(Shape{1, 2, 2, 77, 77}, head_dim, DType::BF16, causal);
        probe.deterministic = deterministic;
        std::shared_ptr<Kernel> kernel = kernel_for(probe);
        ASSERT_TRUE(kernel);
        std::string context = "d";  // appended: gcc 12 -Wrestrict
        context += std::to_string(head_dim);
        context += " ";
        context += kernel->config().to_string();
        for (const Shape& shape :
             {Shape{1, 2, 2, 77, 77}, Shape{2, 4, 2, 130, 61, Storage::kBshdPadded}}) {
          AttentionProblem problem = backward_problem(shape, head_dim, DType::BF16, causal);
          problem.deterministic = deterministic;
          expect_matches_reference(*kernel, problem, 11 + head_dim, context);
        }
      }
}

// DqMode::Separate adds nothing with atomics: two launches give the same bits.
TEST_F(CudaBackwardApi, DeterministicGradientsAreBitwiseIdentical) {
  for (int head_dim : {64, 128, 256}) {
    AttentionProblem problem =
        backward_problem(Shape{2, 8, 2, 300, 200}, head_dim, DType::BF16, /*causal=*/true);
    problem.deterministic = true;
    std::shared_ptr<Kernel> kernel = kernel_for(problem);
    ASSERT_TRUE(kernel);
    EXPECT_EQ(kernel->config().dq, DqMode::Separate) << kernel->config().to_string();
    const ft::HostInputs inputs = ft::random_inputs(problem, 21);
    Result<DeviceTensors> tensors = upload(*backend_, problem, inputs);
    ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
    RunOutput first = run_poisoned(*backend_, *kernel, problem, tensors.value());
    RunOutput second = run_poisoned(*backend_, *kernel, problem, tensors.value());
    ASSERT_TRUE(first.status.ok()) << first.status.error().describe();
    ASSERT_TRUE(second.status.ok()) << second.status.error().describe();
    EXPECT_TRUE(first.dq == second.dq) << "d" << head_dim << ": dq differs between two launches";
    EXPECT_TRUE(first.dk == second.dk) << "d" << head_dim << ": dk differs between two launches";
    EXPECT_TRUE(first.dv == second.dv) << "d" << head_dim << ": dv differs between two launches";
    const GradientComparison comparison =
        compare_output(problem, first, ft::reference_attention(problem, inputs));
    EXPECT_TRUE(within_tolerance(comparison, gradient_tolerance(problem.dtype)))
        << comparison.to_string();
  }
}

// A caller's workspace replaces the kernel's own; one byte too small is an InvalidArgument that
// names workspace_bytes, and nothing runs.
TEST_F(CudaBackwardApi, CallerWorkspaceWorksAndATooSmallOneIsRejected) {
  for (bool deterministic : {false, true}) {
    AttentionProblem problem =
        backward_problem(Shape{2, 4, 2, 150, 190}, 128, DType::F16, /*causal=*/true);
    problem.deterministic = deterministic;
    std::shared_ptr<Kernel> kernel = kernel_for(problem);
    ASSERT_TRUE(kernel);
    const size_t bytes = kernel->workspace_bytes(problem);
    ASSERT_GT(bytes, 0u);
    const ft::HostInputs inputs = ft::random_inputs(problem, 31);
    Result<DeviceTensors> tensors = upload(*backend_, problem, inputs);
    ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
    Result<DeviceBuffer> workspace = backend_->allocate(bytes);
    ASSERT_TRUE(workspace.ok()) << workspace.error().describe();
    // Garbage in the workspace must not matter: the preprocess writes what the others read.
    ASSERT_TRUE(backend_->fill_bytes(workspace->get(), 0xFF, bytes).ok());

    AttentionArgs args = tensors->args;
    args.workspace = workspace->get();
    args.workspace_bytes = bytes;
    RunOutput out = run_poisoned(*backend_, *kernel, problem, tensors.value(), args);
    ASSERT_TRUE(out.status.ok()) << out.status.error().describe();
    const GradientComparison comparison =
        compare_output(problem, out, ft::reference_attention(problem, inputs));
    EXPECT_TRUE(within_tolerance(comparison, gradient_tolerance(problem.dtype)))
        << kernel->config().to_string() << ": " << comparison.to_string();

    args.workspace_bytes = bytes - 1;
    const Status small = kernel->launch(problem, args);
    ASSERT_FALSE(small.ok());
    EXPECT_EQ(small.error().code, ErrorCode::InvalidArgument);
    EXPECT_NE(small.error().message.find("workspace_bytes"), std::string::npos)
        << small.error().message;
  }
}

TEST_F(CudaBackwardApi, NullLseAndNullGradientsAreTypedErrors) {
  const AttentionProblem problem = backward_problem(Shape{1, 2, 2, 64, 64}, 64, DType::BF16, false);
  std::shared_ptr<Kernel> kernel = kernel_for(problem);
  ASSERT_TRUE(kernel);
  Result<DeviceTensors> tensors = upload(*backend_, problem, ft::random_inputs(problem, 41));
  ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
  struct Case {
    const char* name;
    void (*clear)(AttentionArgs&);
  } cases[] = {
      {"lse", [](AttentionArgs& a) { a.lse = nullptr; }},
      {"dq", [](AttentionArgs& a) { a.dq = nullptr; }},
      {"dk", [](AttentionArgs& a) { a.dk = nullptr; }},
      {"dv", [](AttentionArgs& a) { a.dv = nullptr; }},
      {"do", [](AttentionArgs& a) { a.d_o = nullptr; }},
  };
  for (const Case& c : cases) {
    AttentionArgs args = tensors->args;
    c.clear(args);
    const Status status = kernel->launch(problem, args);
    ASSERT_FALSE(status.ok()) << "null " << c.name;
    EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument) << status.error().describe();
    EXPECT_EQ(status.error().message.rfind(std::string(c.name) + " is null", 0), 0u)
        << status.error().message;
  }
}

// The Runtime serves the backward's default config, a kernel per signature, the forward's apart.
TEST_F(CudaBackwardApi, RuntimeServesTheBackwardDefault) {
  std::string name = "flashjit-backward-runtime-test-";  // appended: gcc 12 -Wrestrict
  name += std::to_string(std::random_device{}());
  const std::filesystem::path cache_dir = std::filesystem::temp_directory_path() / name;
  RuntimeOptions options;
  options.cache_dir = cache_dir;
  // No tuning DB: what a tune run left in $FLASHJIT_DB must not decide what this test gets.
  options.user_db = "";
  options.system_dbs.clear();
  Result<std::unique_ptr<Runtime>> runtime = Runtime::create(options);
  ASSERT_TRUE(runtime.ok()) << runtime.error().describe();
  const AttentionProblem problem =
      backward_problem(Shape{2, 8, 2, 200, 333}, 128, DType::BF16, /*causal=*/true);
  Result<std::shared_ptr<Kernel>> kernel = (*runtime)->attention_backward(problem);
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  EXPECT_EQ((*kernel)->config(), default_config(problem, backend_->device()).value());
  EXPECT_EQ((*kernel)->signature(), ProblemSignature::of(problem));
  Result<std::shared_ptr<Kernel>> forward = (*runtime)->attention(problem.with_pass(Pass::Forward));
  ASSERT_TRUE(forward.ok()) << forward.error().describe();
  EXPECT_NE(forward->get(), kernel->get());
  expect_matches_reference(**kernel, problem, 51, "runtime default");
  std::error_code ignored;
  std::filesystem::remove_all(cache_dir, ignored);
}

}  // namespace
}  // namespace flashjit
