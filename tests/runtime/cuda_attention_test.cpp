// GPU correctness of the CUDA attention forward: every legal config of every (head_dim, dtype,
// causal) group against the fp64 reference, over shapes that hit the edges (a single row, ragged
// tails, seqlen_q != seqlen_k both ways, empty causal rows, GQA/MQA, batches, strided and BHSD
// layouts). Skips, with the reason, where there is no CUDA GPU.
//
// Per group: all configs are compiled in parallel first; then per shape the inputs and the
// reference are made once and every config runs on the same inputs. o and lse are poisoned
// (0xFF bytes: NaN) before each launch, so an element the kernel forgot to write fails.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/forward_config_ws.hpp"
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

// Tolerances: bf16 o is expected near 3e-3 relative error (P is rounded to bf16 before P V),
// fp16 lower; lse is fp32 math on the same rounded inputs as the reference.
constexpr double kMaxOutputRelError = 1e-2;
constexpr double kMaxLseAbsError = 1e-3;

// ---------------------------------------------------------------------------------------------
// Shapes: tests/support/attention_cases.hpp (shared with the HIP tests); device helpers:
// tests/support/device_run.hpp

using ft::make_problem;  // forward problems
using ft::Shape;
using ft::Storage;

using ft::DeviceTensors;
using ft::run_poisoned;
using ft::RunOutput;
using ft::upload;

// ---------------------------------------------------------------------------------------------
// Every legal config of a group on every shape (tests/support/all_configs.hpp)

class CudaAttentionAllConfigs : public ::testing::TestWithParam<ft::ConfigGroup> {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_GPU(); }
};

TEST_P(CudaAttentionAllConfigs, MatchesFp64Reference) {
  ft::AllConfigsOptions options;
  options.shapes = ft::gpu_test_shapes();
  options.max_rel = kMaxOutputRelError;
  options.max_lse_abs = kMaxLseAbsError;
  ft::check_all_configs(*ft::gpu_backend(), GetParam(), options);
}

INSTANTIATE_TEST_SUITE_P(AllGroups, CudaAttentionAllConfigs,
                         ::testing::ValuesIn(ft::all_groups(Pass::Forward)),
                         [](const ::testing::TestParamInfo<ft::ConfigGroup>& info) {
                           return info.param.name();
                         });

// ---------------------------------------------------------------------------------------------
// Launch contract and Runtime

class CudaAttentionApi : public ::testing::Test {
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

  std::shared_ptr<cuda::CudaBackend> backend_;
};

TEST_F(CudaAttentionApi, LaunchRejectsProblemOfAnotherSignature) {
  const auto problem = AttentionProblem::make(1, 2, 2, 64, 64, 64, DType::BF16, false);
  std::shared_ptr<Kernel> kernel = kernel_for(problem);
  ASSERT_TRUE(kernel);
  EXPECT_EQ(kernel->signature(), ProblemSignature::of(problem));
  EXPECT_EQ(kernel->config(), default_config(problem, backend_->device()).value());

  // Buffers big enough for the largest variant, so that a wrongly accepted launch stays in bounds.
  const auto largest = AttentionProblem::make(1, 2, 2, 64, 64, 128, DType::BF16, false);
  Result<DeviceTensors> tensors = upload(*backend_, largest, ft::random_inputs(largest, 1));
  ASSERT_TRUE(tensors.ok()) << tensors.error().describe();

  AttentionProblem other_dim = AttentionProblem::make(1, 2, 2, 64, 64, 128, DType::BF16, false);
  AttentionProblem other_dtype = AttentionProblem::make(1, 2, 2, 64, 64, 64, DType::F16, false);
  AttentionProblem other_mask = AttentionProblem::make(1, 2, 2, 64, 64, 64, DType::BF16, true);
  for (const AttentionProblem* other : {&other_dim, &other_dtype, &other_mask}) {
    const Status status = kernel->launch(*other, tensors->args);
    ASSERT_FALSE(status.ok()) << other->to_string();
    EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument) << status.error().describe();
  }
  // Same signature, other sizes: accepted.
  const auto smaller = AttentionProblem::make(1, 1, 1, 33, 50, 64, DType::BF16, false);
  EXPECT_TRUE(kernel->launch(smaller, tensors->args).ok());
  EXPECT_TRUE(backend_->synchronize().ok());
}

TEST_F(CudaAttentionApi, LaunchRejectsNullTensorPointers) {
  const auto problem = AttentionProblem::make(1, 2, 2, 64, 64, 64, DType::BF16, false);
  std::shared_ptr<Kernel> kernel = kernel_for(problem);
  ASSERT_TRUE(kernel);
  Result<DeviceTensors> tensors = upload(*backend_, problem, ft::random_inputs(problem, 2));
  ASSERT_TRUE(tensors.ok()) << tensors.error().describe();

  for (int which = 0; which < 4; ++which) {
    AttentionArgs args = tensors->args;
    if (which == 0) args.q = nullptr;
    if (which == 1) args.k = nullptr;
    if (which == 2) args.v = nullptr;
    if (which == 3) args.o = nullptr;
    const Status status = kernel->launch(problem, args);
    ASSERT_FALSE(status.ok()) << "null "
                              << "qkvo"[which];
    EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument) << status.error().describe();
  }
}

TEST_F(CudaAttentionApi, LaunchRejectsInvalidProblem) {
  const auto problem = AttentionProblem::make(1, 2, 2, 64, 64, 64, DType::BF16, false);
  std::shared_ptr<Kernel> kernel = kernel_for(problem);
  ASSERT_TRUE(kernel);
  Result<DeviceTensors> tensors = upload(*backend_, problem, ft::random_inputs(problem, 3));
  ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
  AttentionProblem bad = problem;
  bad.heads_q = 3;  // not a multiple of heads_kv = 2
  const Status status = kernel->launch(bad, tensors->args);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument) << status.error().describe();
}

TEST_F(CudaAttentionApi, NullLseWritesOnlyO) {
  const auto problem = AttentionProblem::make(2, 4, 2, 100, 150, 128, DType::F16, true);
  std::shared_ptr<Kernel> kernel = kernel_for(problem);
  ASSERT_TRUE(kernel);
  const ft::HostInputs inputs = ft::random_inputs(problem, 4);
  Result<DeviceTensors> tensors = upload(*backend_, problem, inputs);
  ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
  AttentionArgs without_lse = tensors->args;
  without_lse.lse = nullptr;
  RunOutput out = run_poisoned(*backend_, *kernel, problem, tensors.value(), without_lse);
  ASSERT_TRUE(out.status.ok()) << out.status.error().describe();
  EXPECT_TRUE(ft::matches_reference(
      ft::compare(problem, out.o, {}, ft::reference_attention(problem, inputs))));
  // The lse buffer was not touched: still all 0xFF bytes.
  std::vector<uint32_t> lse_bits(problem.lse_elements());
  const DeviceBuffer& lse = *tensors->find(ft::TensorRole::Lse);
  ASSERT_TRUE(backend_->copy_to_host(lse_bits.data(), lse.get(), lse.bytes()).ok());
  for (uint32_t bits : lse_bits) ASSERT_EQ(bits, 0xFFFFFFFFu);
}

TEST_F(CudaAttentionApi, RuntimeServesDefaultConfigAndKeepsKernels) {
  const std::filesystem::path cache_dir =
      std::filesystem::temp_directory_path() /
      ("flashjit-runtime-test-" + std::to_string(std::random_device{}()));
  RuntimeOptions options;
  options.cache_dir = cache_dir;
  // No tuning DB: what a tune run left in $FLASHJIT_DB must not decide what this test gets.
  options.user_db = "";
  options.system_dbs.clear();
  Result<std::unique_ptr<Runtime>> runtime = Runtime::create(options);
  ASSERT_TRUE(runtime.ok()) << runtime.error().describe();
  const Backend& backend = (*runtime)->backend();

  const auto problem = AttentionProblem::make(2, 4, 4, 200, 200, 128, DType::BF16, true);
  Result<std::shared_ptr<Kernel>> kernel = (*runtime)->attention(problem);
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  EXPECT_EQ((*kernel)->config(), default_config(problem, backend.device()).value());
  EXPECT_EQ((*kernel)->signature(), ProblemSignature::of(problem));

  const ft::HostInputs inputs = ft::random_inputs(problem, 5);
  Result<DeviceTensors> tensors = upload(backend, problem, inputs);
  ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
  RunOutput out = run_poisoned(backend, **kernel, problem, tensors.value());
  ASSERT_TRUE(out.status.ok()) << out.status.error().describe();
  EXPECT_TRUE(ft::matches_reference(
      ft::compare(problem, out.o, out.lse, ft::reference_attention(problem, inputs)),
      kMaxOutputRelError, kMaxLseAbsError));

  // Kept in memory: the same object for the same signature, whatever the sizes.
  Result<std::shared_ptr<Kernel>> again = (*runtime)->attention(problem);
  ASSERT_TRUE(again.ok()) << again.error().describe();
  EXPECT_EQ(again->get(), kernel->get());
  const auto resized = AttentionProblem::make(1, 8, 2, 999, 77, 128, DType::BF16, true);
  Result<std::shared_ptr<Kernel>> same_signature = (*runtime)->attention(resized);
  ASSERT_TRUE(same_signature.ok()) << same_signature.error().describe();
  EXPECT_EQ(same_signature->get(), kernel->get());

  // Another signature is another kernel; an illegal config is refused.
  const auto other = AttentionProblem::make(2, 4, 4, 200, 200, 128, DType::BF16, false);
  Result<std::shared_ptr<Kernel>> other_kernel = (*runtime)->attention(other);
  ASSERT_TRUE(other_kernel.ok()) << other_kernel.error().describe();
  EXPECT_NE(other_kernel->get(), kernel->get());
  Result<std::shared_ptr<Kernel>> illegal =
      (*runtime)->attention(problem, AttentionConfig{48, 64, 4, 2});
  ASSERT_FALSE(illegal.ok());
  EXPECT_EQ(illegal.error().code, ErrorCode::InvalidArgument) << illegal.error().describe();

  // The disk cache got the compiled kernels.
  EXPECT_TRUE(std::filesystem::exists(cache_dir));
  EXPECT_FALSE(std::filesystem::is_empty(cache_dir));
  std::error_code ignored;
  std::filesystem::remove_all(cache_dir, ignored);
}

}  // namespace
}  // namespace flashjit

namespace flashjit {
namespace {

// Head dims that are not a multiple of 64 are padded in shared memory (zero-filled columns that
// are never written back): every legal config, padded strides and ragged sizes.
TEST_F(CudaAttentionApi, PaddedHeadDimsMatchReference) {
  for (int head_dim : {8, 72, 96, 200}) {
    for (bool causal : {false, true}) {
      const auto probe = AttentionProblem::make(1, 1, 1, 64, 64, head_dim, DType::BF16, causal);
      // Every legal config (the -ws schedules make ~30 at some head dims), compiled concurrently.
      ft::TestCache cache;
      for (const ft::BuiltKernel& built :
           ft::build_all(*backend_, cache.get(), probe,
                         ft::selected_families(legal_configs(probe, backend_->device())))) {
        const AttentionConfig& config = built.config;
        ASSERT_TRUE(built.kernel) << config.to_string() << ": " << built.error;
        const std::shared_ptr<Kernel>& kernel = built.kernel;
        for (const Shape& shape :
             {Shape{1, 2, 2, 77, 77}, Shape{2, 4, 2, 130, 61, Storage::kBshdPadded}}) {
          const AttentionProblem problem = make_problem(shape, head_dim, DType::BF16, causal);
          const ft::HostInputs inputs = ft::random_inputs(problem, 11 + head_dim);
          Result<DeviceTensors> tensors = upload(*backend_, problem, inputs);
          ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
          RunOutput out = run_poisoned(*backend_, *kernel, problem, tensors.value());
          ASSERT_TRUE(out.status.ok()) << out.status.error().describe();
          EXPECT_TRUE(ft::matches_reference(
              ft::compare(problem, out.o, out.lse, ft::reference_attention(problem, inputs)),
              kMaxOutputRelError, kMaxLseAbsError))
              << "d" << head_dim << (causal ? " causal " : " ") << config.to_string() << " "
              << problem.to_string();
        }
      }
    }
  }
}

// The -ws schedules where they matter: a problem of more tiles than the H100 has CTA slots (384
// to 1024 tiles for 132 SMs: persistent CTAs walk about three or four, carrying pipelines, Q
// rounds and ping-pong turns across them; causal: the first 200 rows see no key, their tiles come
// last), GQA 4:1. Each schedule of the head dim's -ws tile gives the plain tile's O and LSE bit for
// bit (ping-pong and the tile order change no arithmetic), a one-consumer tile (two CTAs per SM)
// persistent too; all match the fp64 reference.
TEST_F(CudaAttentionApi, WsSchedulesWalkingManyTilesMatchThePlainTile) {
  if (backend_->device().arch != 90) GTEST_SKIP() << "the -ws family runs on sm90 only";
  ft::TestCache cache;
  for (int head_dim : {64, 128, 256}) {
    for (bool causal : {false, true}) {
      const AttentionProblem problem =
          make_problem(Shape{4, 32, 8, 500, 300}, head_dim, DType::BF16, causal);
      const Result<AttentionConfig> tile = default_ws_config(problem, backend_->device());
      ASSERT_TRUE(tile.ok()) << tile.error().describe();
      std::vector<AttentionConfig> configs;
      for (bool pingpong : {false, true})
        for (bool persistent : {false, true}) {
          AttentionConfig c = tile.value();
          c.pingpong = pingpong;
          c.persistent = persistent;
          configs.push_back(c);
        }
      AttentionConfig one_consumer{64, 64, 8, 2, KernelFamily::Ws};
      one_consumer.persistent = true;
      configs.push_back(one_consumer);
      const std::vector<ft::BuiltKernel> built =
          ft::build_all(*backend_, cache.get(), problem, configs);
      const ft::HostInputs inputs = ft::random_inputs(problem, 4242 + head_dim + causal);
      const ft::Reference reference = ft::reference_attention(problem, inputs);
      Result<DeviceTensors> tensors = upload(*backend_, problem, inputs);
      ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
      RunOutput plain;
      for (const ft::BuiltKernel& b : built) {
        const std::string where = "d" + std::to_string(head_dim) + (causal ? " causal " : " ") +
                                  b.config.to_string() + " " + problem.to_string();
        ASSERT_TRUE(b.kernel) << where << ": " << b.error;
        RunOutput out = run_poisoned(*backend_, *b.kernel, problem, tensors.value());
        ASSERT_TRUE(out.status.ok()) << where << ": " << out.status.error().describe();
        EXPECT_TRUE(ft::matches_reference(ft::compare(problem, out.o, out.lse, reference),
                                          kMaxOutputRelError, kMaxLseAbsError))
            << where;
        if (b.config == configs.front()) {
          plain = out;
        } else if (b.config.block_m == configs.front().block_m) {
          EXPECT_TRUE(out.o == plain.o) << where << ": O differs from the plain tile's";
          EXPECT_TRUE(
              out.lse.size() == plain.lse.size() &&
              std::memcmp(out.lse.data(), plain.lse.data(), out.lse.size() * sizeof(float)) == 0)
              << where << ": LSE differs from the plain tile's";
        }
      }
    }
  }
}

}  // namespace
}  // namespace flashjit
