// Without a GPU (no libcuda.so.1): the backend must fail cleanly with NoDevice. With one, the
// device query, memory calls, module loading and launch-argument checks are exercised on a tiny
// hand-written kernel (the attention kernel itself is tested in cuda_attention_test).
#include "runtime/cuda/cuda_backend.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/nvrtc_compiler.hpp"

namespace flashjit::cuda {
namespace {

bool has_gpu() { return device_count() > 0; }

TEST(CudaBackendNoDeviceTest, CreateFailsCleanlyWithoutADevice) {
  if (has_gpu()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(device_count(), 0);
  Result<std::unique_ptr<CudaBackend>> backend = CudaBackend::create(0);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.error().code, ErrorCode::NoDevice);
  // Either the driver library is missing or cuInit says why; the message names which.
  const std::string& message = backend.error().message;
  EXPECT_TRUE(message.find("libcuda.so.1") != std::string::npos ||
              message.find("cuInit") != std::string::npos)
      << message;
  // The failure is remembered and repeatable.
  Result<const Driver*> loaded = driver();
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().code, ErrorCode::NoDevice);
  Result<DeviceSpec> spec = query_device(0);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.error().code, ErrorCode::NoDevice);
}

TEST(CudaBackendDeviceTest, OrdinalOutOfRangeIsNoDevice) {
  const int count = device_count();
  for (int ordinal : {-1, count, count + 7}) {
    Result<std::unique_ptr<CudaBackend>> backend = CudaBackend::create(ordinal);
    ASSERT_FALSE(backend.ok()) << ordinal;
    EXPECT_EQ(backend.error().code, ErrorCode::NoDevice) << backend.error().describe();
  }
}

TEST(CudaBackendDeviceTest, QueryDeviceFieldsAreSane) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  Result<DeviceSpec> spec = query_device(0);
  ASSERT_TRUE(spec.ok()) << spec.error().describe();
  EXPECT_FALSE(spec->name.empty());
  EXPECT_GE(spec->arch, 80);
  EXPECT_GT(spec->sm_count, 0);
  EXPECT_GE(spec->smem_per_block_optin, 48 * 1024);
  EXPECT_GE(spec->smem_per_sm, spec->smem_per_block_optin);
  EXPECT_GE(spec->regs_per_sm, 65536);
  EXPECT_GE(spec->max_threads_per_sm, 1024);
  EXPECT_EQ(spec->max_threads_per_block, 1024);
  EXPECT_GT(spec->l2_bytes, 0);
}

class CudaBackendGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
    Result<std::unique_ptr<CudaBackend>> created = CudaBackend::create(0);
    ASSERT_TRUE(created.ok()) << created.error().describe();
    backend_ = std::move(created.value());
  }

  // Adds 1.0f to n floats; its entry stands in for the attention kernel's.
  static KernelSource increment_kernel() {
    KernelSource source;
    source.entries = {"flashjit_test_increment"};
    source.label = "test increment kernel";
    source.text =
        "struct Params { float* x; int n; };\n"
        "extern \"C\" __global__ void flashjit_test_increment(Params p) {\n"
        "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "  if (i < p.n) p.x[i] += 1.0f;\n"
        "}\n";
    return source;
  }

  std::unique_ptr<CudaBackend> backend_;
};

TEST_F(CudaBackendGpuTest, FingerprintNamesCompilerAndArch) {
  const std::string fingerprint = backend_->compiler_fingerprint();
  EXPECT_EQ(fingerprint.rfind("nvrtc ", 0), 0u) << fingerprint;
  EXPECT_NE(fingerprint.find(" sm_" + std::to_string(backend_->device().arch)), std::string::npos)
      << fingerprint;
  EXPECT_EQ(backend_->name(), "cuda");
}

TEST_F(CudaBackendGpuTest, AllocateFillCopyRoundTrip) {
  constexpr size_t kBytes = 1 << 20;
  Result<DeviceBuffer> buffer = backend_->allocate(kBytes);
  ASSERT_TRUE(buffer.ok()) << buffer.error().describe();
  ASSERT_NE(buffer->get(), nullptr);
  EXPECT_EQ(buffer->bytes(), kBytes);
  ASSERT_TRUE(backend_->fill_bytes(buffer->get(), 0xab, kBytes).ok());
  std::vector<uint8_t> host(kBytes, 0);
  ASSERT_TRUE(backend_->copy_to_host(host.data(), buffer->get(), kBytes).ok());
  for (size_t i = 0; i < kBytes; i += 4097) ASSERT_EQ(host[i], 0xab) << i;
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(backend_->copy_to_device(buffer->get(), host.data(), kBytes).ok());
  std::vector<uint8_t> back(kBytes, 0);
  ASSERT_TRUE(backend_->copy_to_host(back.data(), buffer->get(), kBytes).ok());
  EXPECT_EQ(back, host);
  EXPECT_TRUE(backend_->synchronize().ok());

  Result<DeviceBuffer> empty = backend_->allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->get(), nullptr);
}

TEST_F(CudaBackendGpuTest, AbsurdAllocationIsAnErrorNotACrash) {
  Result<DeviceBuffer> buffer = backend_->allocate(size_t{1} << 50);  // 1 PiB
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.error().code, ErrorCode::DriverError);
  EXPECT_NE(buffer.error().message.find("cuMemAlloc"), std::string::npos);
}

TEST_F(CudaBackendGpuTest, BuffersAndKernelsMayOutliveTheBackend) {
  Result<DeviceBuffer> buffer = backend_->allocate(256);
  ASSERT_TRUE(buffer.ok());
  backend_.reset();
  buffer->reset();  // frees through its own context reference: no crash, no error to see
}

TEST_F(CudaBackendGpuTest, LoadReportsKernelInfo) {
  const KernelSource source = increment_kernel();
  Result<Binary> binary = backend_->compile(source);
  ASSERT_TRUE(binary.ok()) << binary.error().describe();
  const ProblemSignature signature{64, DType::F16, false};
  const AttentionConfig config{64, 64, 4, 2};
  Result<std::shared_ptr<Kernel>> kernel =
      backend_->load(binary.value(), source, signature, config);
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  EXPECT_GT((*kernel)->info().regs_per_thread, 0);
  EXPECT_EQ((*kernel)->info().local_bytes_per_thread, 0);
  EXPECT_EQ((*kernel)->info().threads_per_block, config.threads());
  EXPECT_EQ((*kernel)->info().dynamic_smem_bytes,
            smem_bytes(config, AttentionProblem::make(1, 1, 1, 1, 1, 64, DType::F16, false)));
  EXPECT_EQ((*kernel)->signature(), signature);
  EXPECT_EQ((*kernel)->config(), config);

  // Kernel outlives the backend: unloading must not crash.
  backend_.reset();
  kernel.value().reset();
}

TEST_F(CudaBackendGpuTest, LoadRejectsBadBinaryAndMissingEntry) {
  const KernelSource source = increment_kernel();
  const ProblemSignature signature{64, DType::F16, false};
  const AttentionConfig config{64, 64, 4, 2};
  Binary garbage;
  garbage.bytes = {'n', 'o', 't', ' ', 'a', 'n', ' ', 'e', 'l', 'f'};
  Result<std::shared_ptr<Kernel>> bad = backend_->load(garbage, source, signature, config);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("cuModuleLoadData"), std::string::npos) << bad.error().message;

  Result<Binary> binary = backend_->compile(source);
  ASSERT_TRUE(binary.ok()) << binary.error().describe();
  KernelSource renamed = source;
  renamed.entries = {"no_such_entry"};
  Result<std::shared_ptr<Kernel>> missing =
      backend_->load(binary.value(), renamed, signature, config);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("no_such_entry"), std::string::npos)
      << missing.error().message;
}

TEST_F(CudaBackendGpuTest, LaunchChecksArgumentsBeforeLaunching) {
  const KernelSource source = increment_kernel();
  Result<Binary> binary = backend_->compile(source);
  ASSERT_TRUE(binary.ok()) << binary.error().describe();
  const ProblemSignature signature{64, DType::F16, false};
  Result<std::shared_ptr<Kernel>> kernel =
      backend_->load(binary.value(), source, signature, AttentionConfig{64, 64, 4, 2});
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  Result<DeviceBuffer> buffer = backend_->allocate(1 << 16);
  ASSERT_TRUE(buffer.ok());
  char* base = buffer->as<char>();
  const AttentionProblem problem = AttentionProblem::make(1, 2, 2, 16, 16, 64, DType::F16, false);

  // Signature mismatch: names both.
  const AttentionProblem other = AttentionProblem::make(1, 2, 2, 16, 16, 128, DType::F16, false);
  Status status = (*kernel)->launch(other, {base, base, base, base, nullptr});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(status.error().message.find("d128"), std::string::npos) << status.error().message;
  EXPECT_NE(status.error().message.find("d64"), std::string::npos) << status.error().message;

  // Null and misaligned pointers: names which.
  status = (*kernel)->launch(problem, {base, nullptr, base, base, nullptr});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(status.error().message.rfind("k ", 0), 0u) << status.error().message;
  status = (*kernel)->launch(problem, {base, base, base, base + 8, nullptr});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().message.rfind("o = 0x", 0), 0u) << status.error().message;

  // Grid y limit.
  const AttentionProblem too_many_heads =
      AttentionProblem::make(1, 70000, 1, 16, 16, 64, DType::F16, false);
  if (validate(too_many_heads).ok()) {
    status = (*kernel)->launch(too_many_heads, {base, base, base, base, nullptr});
    ASSERT_FALSE(status.ok());
    EXPECT_NE(status.error().message.find("70000"), std::string::npos) << status.error().message;
  }
}

TEST_F(CudaBackendGpuTest, TimeMsMeasuresAndPropagatesErrors) {
  Result<DeviceBuffer> buffer = backend_->allocate(1 << 20);
  ASSERT_TRUE(buffer.ok());
  void* pointer = buffer->get();
  Result<double> ms =
      backend_->time_ms([&] { return backend_->fill_bytes(pointer, 1, 1 << 20); }, 5);
  ASSERT_TRUE(ms.ok()) << ms.error().describe();
  EXPECT_GE(ms.value(), 0.0);

  int calls = 0;
  Result<double> failed = backend_->time_ms(
      [&]() -> Status {
        ++calls;
        return make_error(ErrorCode::LaunchFailed, "work failed");
      },
      5);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().message, "work failed");
  EXPECT_EQ(calls, 1);

  Result<double> none = backend_->time_ms([] { return ok_status(); }, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::InvalidArgument);
}

}  // namespace
}  // namespace flashjit::cuda
