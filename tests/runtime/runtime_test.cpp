// build_kernel and Runtime over a fake backend: the cache and kernel-map logic needs no GPU.
#include "runtime/runtime.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cuda/cuda_backend.hpp"

namespace flashjit {
namespace {

namespace fs = std::filesystem;

class FakeKernel final : public Kernel {
 public:
  FakeKernel(ProblemSignature signature, AttentionConfig config)
      : signature_(signature), config_(config) {}
  const ProblemSignature& signature() const override { return signature_; }
  const AttentionConfig& config() const override { return config_; }
  const KernelInfo& info() const override { return info_; }
  Status launch(const AttentionProblem&, const AttentionArgs&, void*) const override {
    return ok_status();
  }

 private:
  ProblemSignature signature_;
  AttentionConfig config_;
  KernelInfo info_;
};

// Renders a source naming the signature and config, "compiles" it to its own bytes, and counts.
class FakeBackend final : public Backend {
 public:
  FakeBackend() : device_(known_device("sm90").value()) {}

  std::string name() const override { return "fake"; }
  const DeviceSpec& device() const override { return device_; }
  std::string compiler_fingerprint() const override { return "fake 1.0 sm_90"; }

  Result<KernelSource> render(const AttentionProblem& problem,
                              const AttentionConfig& config) const override {
    KernelSource source;
    source.entry = "fake_entry";
    source.label = "fake " + config.to_string();
    source.text = "d" + std::to_string(problem.head_dim) + " " + to_string(problem.dtype) +
                  (problem.causal ? " causal " : " ") + config.to_string();
    return source;
  }
  Result<Binary> compile(const KernelSource& source) const override {
    ++compiles;
    if (fail_compile) return make_error(ErrorCode::CompileFailed, "fake compile failure");
    Binary binary;
    binary.bytes.assign(source.text.begin(), source.text.end());
    return binary;
  }
  Result<std::shared_ptr<Kernel>> load(const Binary& binary, const KernelSource& source,
                                       const ProblemSignature& signature,
                                       const AttentionConfig& config) const override {
    ++loads;
    if (binary.from_cache) ++cache_loads;
    // Rejects anything but what compile() makes, like a driver rejecting a bad image.
    if (std::string(binary.bytes.begin(), binary.bytes.end()) != source.text) {
      return make_error(ErrorCode::DriverError, "fake load: bad image");
    }
    return std::shared_ptr<Kernel>(std::make_shared<FakeKernel>(signature, config));
  }

  Result<DeviceBuffer> allocate(size_t) const override { return DeviceBuffer(); }
  Status copy_to_device(void*, const void*, size_t) const override { return ok_status(); }
  Status copy_to_host(void*, const void*, size_t) const override { return ok_status(); }
  Status fill_bytes(void*, uint8_t, size_t) const override { return ok_status(); }
  Status synchronize() const override { return ok_status(); }
  Result<double> time_ms(const std::function<Status()>&, int) const override { return 0.0; }

  mutable std::atomic<int> compiles{0};
  mutable std::atomic<int> loads{0};
  mutable std::atomic<int> cache_loads{0};
  bool fail_compile = false;

 private:
  DeviceSpec device_;
};

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("flashjit-runtime-test-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  static AttentionProblem problem(int head_dim = 128, bool causal = false) {
    return AttentionProblem::make(2, 8, 8, 512, 512, head_dim, DType::BF16, causal);
  }

  fs::path dir_;
};

TEST_F(RuntimeTest, BuildKernelCompilesOnceThenHitsTheDiskCache) {
  FakeBackend backend;
  BinaryCache cache(dir_);
  const AttentionProblem p = problem();
  const AttentionConfig config = default_config(p, backend.device()).value();

  Result<std::shared_ptr<Kernel>> first = build_kernel(backend, &cache, p, config);
  ASSERT_TRUE(first.ok()) << first.error().describe();
  EXPECT_EQ(backend.compiles, 1);
  EXPECT_EQ(backend.cache_loads, 0);

  Result<std::shared_ptr<Kernel>> second = build_kernel(backend, &cache, p, config);
  ASSERT_TRUE(second.ok()) << second.error().describe();
  EXPECT_EQ(backend.compiles, 1);
  EXPECT_EQ(backend.cache_loads, 1);
  EXPECT_EQ((*second)->config(), config);
  EXPECT_EQ((*second)->signature(), ProblemSignature::of(p));

  // Without a cache every build compiles.
  ASSERT_TRUE(build_kernel(backend, nullptr, p, config).ok());
  EXPECT_EQ(backend.compiles, 2);
}

TEST_F(RuntimeTest, RejectedCacheEntryIsRecompiledAndReplaced) {
  FakeBackend backend;
  BinaryCache cache(dir_);
  const AttentionProblem p = problem();
  const AttentionConfig config = default_config(p, backend.device()).value();
  const KernelSource source = backend.render(p, config).value();
  const std::string key = BinaryCache::key(source.text, backend.compiler_fingerprint(), "");
  // A well-formed entry whose contents the backend cannot load.
  ASSERT_TRUE(cache.put(key, std::vector<char>{'b', 'a', 'd'}).ok());

  ASSERT_TRUE(build_kernel(backend, &cache, p, config).ok());
  EXPECT_EQ(backend.compiles, 1);
  std::optional<std::vector<char>> replaced = cache.get(key);
  ASSERT_TRUE(replaced.has_value());
  EXPECT_EQ(std::string(replaced->begin(), replaced->end()), source.text);
}

TEST_F(RuntimeTest, CacheWriteFailureIsNotFatal) {
  FakeBackend backend;
  fs::create_directories(dir_);
  const fs::path blocker = dir_ / "file";
  { std::ofstream(blocker) << "x"; }
  BinaryCache cache(blocker / "cache");  // cannot be created
  const AttentionProblem p = problem();
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(backend, &cache, p, default_config(p, backend.device()).value());
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
}

TEST_F(RuntimeTest, CompileFailurePropagates) {
  FakeBackend backend;
  backend.fail_compile = true;
  const AttentionProblem p = problem();
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(backend, nullptr, p, default_config(p, backend.device()).value());
  ASSERT_FALSE(kernel.ok());
  EXPECT_EQ(kernel.error().code, ErrorCode::CompileFailed);
}

TEST_F(RuntimeTest, KernelsAreKeptInMemoryPerSignatureAndConfig) {
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  RuntimeOptions options;
  options.use_disk_cache = false;
  Runtime runtime(std::move(backend), options);

  Result<std::shared_ptr<Kernel>> a = runtime.attention(problem());
  ASSERT_TRUE(a.ok()) << a.error().describe();
  // Same signature, other sizes: the same kernel object, no new compile.
  Result<std::shared_ptr<Kernel>> b =
      runtime.attention(AttentionProblem::make(1, 4, 2, 100, 300, 128, DType::BF16, false));
  ASSERT_TRUE(b.ok()) << b.error().describe();
  EXPECT_EQ(a.value().get(), b.value().get());
  EXPECT_EQ(fake->compiles, 1);

  // Another signature compiles another kernel.
  Result<std::shared_ptr<Kernel>> causal = runtime.attention(problem(128, true));
  ASSERT_TRUE(causal.ok());
  EXPECT_NE(causal.value().get(), a.value().get());
  EXPECT_EQ(fake->compiles, 2);
}

TEST_F(RuntimeTest, ConcurrentRequestsCompileOnce) {
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  RuntimeOptions options;
  options.use_disk_cache = false;
  Runtime runtime(std::move(backend), options);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      if (!runtime.attention(problem()).ok()) ++failures;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(fake->compiles, 1);
}

TEST_F(RuntimeTest, InvalidProblemAndIllegalConfigAreInvalidArgument) {
  RuntimeOptions options;
  options.use_disk_cache = false;
  Runtime runtime(std::make_unique<FakeBackend>(), options);

  AttentionProblem bad = problem();
  bad.head_dim = 100;
  Result<std::shared_ptr<Kernel>> kernel = runtime.attention(bad);
  ASSERT_FALSE(kernel.ok());
  EXPECT_EQ(kernel.error().code, ErrorCode::InvalidArgument);

  const AttentionConfig illegal{256, 128, 2, 3};  // far beyond any SRAM budget at d256
  Result<std::shared_ptr<Kernel>> too_big = runtime.attention(problem(256), illegal);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.error().code, ErrorCode::InvalidArgument);
  EXPECT_FALSE(too_big.error().message.empty());
}

TEST_F(RuntimeTest, DiskCacheDirectoryFromOptions) {
  RuntimeOptions options;
  options.cache_dir = dir_ / "kernels";
  Runtime runtime(std::make_unique<FakeBackend>(), options);
  ASSERT_TRUE(runtime.attention(problem()).ok());
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(dir_ / "kernels")) {
    EXPECT_EQ(entry.path().extension(), ".bin");
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST(RuntimeCreateTest, NoDeviceWithoutAGpu) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  Result<std::unique_ptr<Runtime>> runtime = Runtime::create();
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.error().code, ErrorCode::NoDevice);
}

}  // namespace
}  // namespace flashjit
