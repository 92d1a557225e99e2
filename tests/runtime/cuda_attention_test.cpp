// GPU correctness of the CUDA attention forward: every legal config of every (head_dim, dtype,
// causal) group against the fp64 reference, over shapes that hit the edges (a single row, ragged
// tails, seqlen_q != seqlen_k both ways, empty causal rows, GQA/MQA, batches, strided and BHSD
// layouts). Skips, with the reason, where there is no CUDA GPU.
//
// Per group: all configs are compiled in parallel first; then per shape the inputs and the
// reference are made once and every config runs on the same inputs. o and lse are poisoned
// (0xFF bytes: NaN) before each launch, so an element the kernel forgot to write fails.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/problem.hpp"
#include "runtime/binary_cache.hpp"
#include "runtime/runtime.hpp"
#include "support/attention_cases.hpp"
#include "support/gpu.hpp"
#include "support/parallel.hpp"
#include "support/reference.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// Tolerances: bf16 o is expected near 3e-3 relative error (P is rounded to bf16 before P V),
// fp16 lower; lse is fp32 math on the same rounded inputs as the reference.
constexpr double kMaxOutputRelError = 1e-2;
constexpr double kMaxLseAbsError = 1e-3;
// Past this many failing runs in one group the rest would add noise, not information.
constexpr int kMaxFailuresPerGroup = 30;

// ---------------------------------------------------------------------------------------------
// Shapes: tests/support/attention_cases.hpp (shared with the HIP tests)

using ft::Shape;
using ft::Storage;

const std::vector<Shape>& test_shapes() { return ft::gpu_test_shapes(); }

using ft::make_problem;  // forward problems (tests/support/attention_cases.hpp)

// ---------------------------------------------------------------------------------------------
// Device helpers

struct DeviceTensors {
  DeviceBuffer q, k, v, o, lse;
};

Result<DeviceTensors> upload(const Backend& backend, const AttentionProblem& problem,
                             const ft::HostInputs& inputs) {
  DeviceTensors tensors;
  auto allocate_copy = [&](const std::vector<uint16_t>& host, DeviceBuffer* buffer) -> Status {
    Result<DeviceBuffer> allocated = backend.allocate(host.size() * sizeof(uint16_t));
    if (!allocated.ok()) return allocated.error();
    *buffer = std::move(allocated.value());
    return backend.copy_to_device(buffer->get(), host.data(), buffer->bytes());
  };
  FLASHJIT_TRY(allocate_copy(inputs.q, &tensors.q));
  FLASHJIT_TRY(allocate_copy(inputs.k, &tensors.k));
  FLASHJIT_TRY(allocate_copy(inputs.v, &tensors.v));
  Result<DeviceBuffer> o = backend.allocate(problem.o_span() * sizeof(uint16_t));
  if (!o.ok()) return o.error();
  tensors.o = std::move(o.value());
  Result<DeviceBuffer> lse = backend.allocate(problem.lse_elements() * sizeof(float));
  if (!lse.ok()) return lse.error();
  tensors.lse = std::move(lse.value());
  return tensors;
}

AttentionArgs args_of(const DeviceTensors& tensors, bool with_lse = true) {
  return {tensors.q.get(), tensors.k.get(), tensors.v.get(), tensors.o.get(),
          with_lse ? tensors.lse.as<float>() : nullptr};
}

struct RunOutput {
  Status status;
  bool context_lost = false;  // the error came from synchronize: the context may be unusable
  std::vector<uint16_t> o;    // whole o span
  std::vector<float> lse;     // empty when run without lse
};

// Poison o and lse, launch, synchronize, copy both back.
RunOutput run_poisoned(const Backend& backend, const Kernel& kernel,
                       const AttentionProblem& problem, const DeviceTensors& tensors,
                       bool with_lse = true) {
  RunOutput out;
  auto fail = [&](const char* phase, const Status& status, bool lost = false) {
    out.status =
        make_error(status.error().code, std::string(phase) + ": " + status.error().message);
    out.context_lost = lost;
    return std::move(out);
  };
  if (Status s = backend.fill_bytes(tensors.o.get(), 0xFF, tensors.o.bytes()); !s.ok()) {
    return fail("poison o", s, true);
  }
  if (Status s = backend.fill_bytes(tensors.lse.get(), 0xFF, tensors.lse.bytes()); !s.ok()) {
    return fail("poison lse", s, true);
  }
  if (Status s = kernel.launch(problem, args_of(tensors, with_lse)); !s.ok()) {
    return fail("launch", s);
  }
  if (Status s = backend.synchronize(); !s.ok()) return fail("synchronize", s, true);
  out.o.resize(problem.o_span());
  if (Status s = backend.copy_to_host(out.o.data(), tensors.o.get(), tensors.o.bytes()); !s.ok()) {
    return fail("copy o back", s, true);
  }
  if (with_lse) {
    out.lse.resize(problem.lse_elements());
    if (Status s = backend.copy_to_host(out.lse.data(), tensors.lse.get(), tensors.lse.bytes());
        !s.ok()) {
      return fail("copy lse back", s, true);
    }
  }
  return out;
}

using ft::build_all;
using ft::BuiltKernel;
using ft::TestCache;

// ---------------------------------------------------------------------------------------------
// Every legal config of a group on every shape

struct Group {
  int head_dim;
  DType dtype;
  bool causal;

  std::string name() const {
    // Appended piecewise: gcc 12 warns (-Wrestrict, a false positive) on "literal" + string&&.
    std::string name = "d";
    name += std::to_string(head_dim);
    name += "_";
    name += to_string(dtype);
    name += causal ? "_causal" : "_noncausal";
    return name;
  }
};

void PrintTo(const Group& group, std::ostream* out) { *out << group.name(); }

class CudaAttentionAllConfigs : public ::testing::TestWithParam<Group> {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_GPU(); }
};

TEST_P(CudaAttentionAllConfigs, MatchesFp64Reference) {
  const Group& group = GetParam();
  const cuda::CudaBackend& backend = *ft::gpu_backend();
  const AttentionProblem group_problem =
      AttentionProblem::make(1, 2, 2, 128, 128, group.head_dim, group.dtype, group.causal);
  const std::vector<AttentionConfig> configs =
      ft::selected_families(legal_configs(group_problem, backend.device()));
  ASSERT_FALSE(configs.empty()) << "no legal config for " << group.name() << " on "
                                << backend.device().to_string();
  Result<AttentionConfig> default_cfg = default_config(group_problem, backend.device());
  ASSERT_TRUE(default_cfg.ok()) << default_cfg.error().describe();

  TestCache cache;
  const auto build_start = std::chrono::steady_clock::now();
  const std::vector<BuiltKernel> built = build_all(backend, cache.get(), group_problem, configs);
  std::printf("%s on %s: %zu legal configs built in %.1f s (default %s, cache %s)\n",
              group.name().c_str(), backend.device().name.c_str(), configs.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start).count(),
              default_cfg->to_string().c_str(), cache.dir().c_str());
  int failures = 0;
  for (const BuiltKernel& b : built) {
    if (!b.kernel) {
      ADD_FAILURE() << group.name() << " config=" << b.config.to_string()
                    << ": build failed: " << b.error;
      ++failures;
    }
  }

  // Worst errors per config over all shapes, for the summary table.
  struct Worst {
    double o_rel = 0, lse_abs = 0;
    int runs = 0;
  };
  std::map<AttentionConfig, Worst> worst;

  const std::vector<Shape>& shapes = test_shapes();
  for (size_t shape_index = 0; shape_index < shapes.size(); ++shape_index) {
    const Shape& shape = shapes[shape_index];
    const AttentionProblem problem = make_problem(shape, group.head_dim, group.dtype, group.causal);
    const std::string shape_context = group.name() + " shape=" + shape.to_string();
    ASSERT_TRUE(validate(problem).ok())
        << shape_context << ": " << validate(problem).error().describe();

    // One seed per (group, shape): every config sees the same inputs and the same reference.
    const uint64_t seed = 1'000'003ull * (shape_index + 1) + 16ull * group.head_dim +
                          2ull * static_cast<uint64_t>(group.dtype) + (group.causal ? 1 : 0);
    const ft::HostInputs inputs = ft::random_inputs(problem, seed);
    const ft::Reference reference = ft::reference_attention(problem, inputs);
    Result<DeviceTensors> tensors = upload(backend, problem, inputs);
    ASSERT_TRUE(tensors.ok()) << shape_context << ": " << tensors.error().describe();

    for (const BuiltKernel& b : built) {
      if (!b.kernel) continue;
      const std::string context = shape_context + " config=" + b.config.to_string() +
                                  (b.config == default_cfg.value() ? " (default)" : "") +
                                  " seed=" + std::to_string(seed);
      RunOutput out = run_poisoned(backend, *b.kernel, problem, tensors.value());
      if (!out.status.ok()) {
        ADD_FAILURE() << context << ": " << out.status.error().describe();
        // A failed synchronize usually means a sticky error (illegal address): every later
        // call in this process would fail too.
        if (out.context_lost) {
          FAIL() << "stopping " << group.name() << ": the CUDA context is lost";
        }
        if (++failures >= kMaxFailuresPerGroup) {
          FAIL() << "stopping " << group.name() << " after " << failures << " failures";
        }
        continue;
      }
      const ft::Comparison comparison = ft::compare(problem, out.o, out.lse, reference);
      Worst& w = worst[b.config];
      w.o_rel = std::max(w.o_rel, comparison.o_rel_error);
      w.lse_abs = std::max(w.lse_abs, comparison.lse_max_abs_error);
      ++w.runs;
      const ::testing::AssertionResult matches =
          ft::matches_reference(comparison, kMaxOutputRelError, kMaxLseAbsError);
      EXPECT_TRUE(matches) << context;
      if (!matches && ++failures >= kMaxFailuresPerGroup) {
        FAIL() << "stopping " << group.name() << " after " << failures << " failures";
      }
    }
  }

  std::printf("  %-20s %5s %6s %10s %12s %6s\n", "config", "regs", "local", "max o rel",
              "max lse abs", "runs");
  for (const BuiltKernel& b : built) {
    if (!b.kernel) continue;
    const Worst& w = worst[b.config];
    std::printf("  %-20s %5d %6d %10.2e %12.2e %6d%s\n", b.config.to_string().c_str(),
                b.kernel->info().regs_per_thread, b.kernel->info().local_bytes_per_thread, w.o_rel,
                w.lse_abs, w.runs, b.config == default_cfg.value() ? "  default" : "");
  }
  std::fflush(stdout);
}

std::vector<Group> all_groups() {
  std::vector<Group> groups;
  for (int head_dim : {64, 128, 256})
    for (DType dtype : {DType::F16, DType::BF16})
      for (bool causal : {false, true}) groups.push_back({head_dim, dtype, causal});
  return groups;
}

INSTANTIATE_TEST_SUITE_P(AllGroups, CudaAttentionAllConfigs, ::testing::ValuesIn(all_groups()),
                         [](const ::testing::TestParamInfo<Group>& info) {
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
    const Status status = kernel->launch(*other, args_of(tensors.value()));
    ASSERT_FALSE(status.ok()) << other->to_string();
    EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument) << status.error().describe();
  }
  // Same signature, other sizes: accepted.
  const auto smaller = AttentionProblem::make(1, 1, 1, 33, 50, 64, DType::BF16, false);
  EXPECT_TRUE(kernel->launch(smaller, args_of(tensors.value())).ok());
  EXPECT_TRUE(backend_->synchronize().ok());
}

TEST_F(CudaAttentionApi, LaunchRejectsNullTensorPointers) {
  const auto problem = AttentionProblem::make(1, 2, 2, 64, 64, 64, DType::BF16, false);
  std::shared_ptr<Kernel> kernel = kernel_for(problem);
  ASSERT_TRUE(kernel);
  Result<DeviceTensors> tensors = upload(*backend_, problem, ft::random_inputs(problem, 2));
  ASSERT_TRUE(tensors.ok()) << tensors.error().describe();

  for (int which = 0; which < 4; ++which) {
    AttentionArgs args = args_of(tensors.value());
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
  const Status status = kernel->launch(bad, args_of(tensors.value()));
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
  RunOutput out = run_poisoned(*backend_, *kernel, problem, tensors.value(), /*with_lse=*/false);
  ASSERT_TRUE(out.status.ok()) << out.status.error().describe();
  EXPECT_TRUE(ft::matches_reference(
      ft::compare(problem, out.o, {}, ft::reference_attention(problem, inputs))));
  // The lse buffer was not touched: still all 0xFF bytes.
  std::vector<uint32_t> lse_bits(problem.lse_elements());
  ASSERT_TRUE(
      backend_->copy_to_host(lse_bits.data(), tensors->lse.get(), tensors->lse.bytes()).ok());
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
      for (const AttentionConfig& config :
           ft::selected_families(legal_configs(probe, backend_->device()))) {
        Result<std::shared_ptr<Kernel>> kernel = build_kernel(*backend_, nullptr, probe, config);
        ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
        for (const Shape& shape :
             {Shape{1, 2, 2, 77, 77}, Shape{2, 4, 2, 130, 61, Storage::kBshdPadded}}) {
          const AttentionProblem problem = make_problem(shape, head_dim, DType::BF16, causal);
          const ft::HostInputs inputs = ft::random_inputs(problem, 11 + head_dim);
          Result<DeviceTensors> tensors = upload(*backend_, problem, inputs);
          ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
          RunOutput out = run_poisoned(*backend_, **kernel, problem, tensors.value());
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

}  // namespace
}  // namespace flashjit
