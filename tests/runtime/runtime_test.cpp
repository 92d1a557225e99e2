// build_kernel and Runtime over a fake backend: the cache, kernel-map and config-selection logic
// (tuning DBs, tune hook, recorded misses) needs no GPU.
#include "runtime/runtime.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/tuning_store.hpp"

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
class FakeBackend final : public CudaTemplateBackend {
 public:
  FakeBackend() : device_(known_device("sm90").value()) {}

  std::string name() const override { return "fake"; }
  const DeviceSpec& device() const override { return device_; }
  std::string compiler_fingerprint() const override { return "fake 1.0 sm_90"; }
  DeviceFingerprint fingerprint() const override { return fake_fingerprint(); }
  static DeviceFingerprint fake_fingerprint() {
    DeviceFingerprint fingerprint;
    fingerprint.backend = "fake";
    fingerprint.name = "Fake sm90";
    fingerprint.arch = 90;
    fingerprint.sm_count = 132;
    fingerprint.smem_per_block_optin = 232448;
    fingerprint.l2_bytes = 52428800;
    fingerprint.driver_version = 13000;
    fingerprint.compiler = "fake 1.0";
    return fingerprint;
  }

  Result<KernelSource> render(const AttentionProblem& problem,
                              const AttentionConfig& config) const override {
    KernelSource source;
    source.entries = {"fake_entry"};
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

// Options that touch neither the user's tuning DB nor the environment's settings.
RuntimeOptions test_options() {
  RuntimeOptions options;
  options.user_db = "none";
  options.system_dbs.clear();
  options.tune_on_miss = false;
  options.log = false;
  return options;
}

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
  RuntimeOptions options = test_options();
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

// fp32 storage is a CPU-backend dtype: the CUDA template's backends answer with a typed error
// that names the dtype and what is allowed, before any config is chosen or anything compiles.
TEST_F(RuntimeTest, CudaTemplateRejectsFp32WithANamedError) {
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  RuntimeOptions options = test_options();
  options.use_disk_cache = false;
  Runtime runtime(std::move(backend), options);
  const AttentionProblem p = AttentionProblem::make(1, 2, 2, 64, 64, 64, DType::F32, false);
  auto expect_dtype_error = [](const Error& error) {
    EXPECT_EQ(error.code, ErrorCode::Unsupported) << error.describe();
    EXPECT_NE(error.message.find("dtype = f32"), std::string::npos) << error.message;
    EXPECT_NE(error.message.find("f16 and bf16"), std::string::npos) << error.message;
  };
  Result<std::shared_ptr<Kernel>> kernel = runtime.attention(p);
  ASSERT_FALSE(kernel.ok());
  expect_dtype_error(kernel.error());
  Result<std::shared_ptr<Kernel>> forced = runtime.attention(p, AttentionConfig{64, 64, 4, 2});
  ASSERT_FALSE(forced.ok());
  expect_dtype_error(forced.error());
  auto selected = runtime.select_config(p);
  ASSERT_FALSE(selected.ok());
  expect_dtype_error(selected.error());
  EXPECT_EQ(fake->compiles, 0);
  // The generator's own answers agree: no legal config, no default, no CUDA source.
  EXPECT_TRUE(fake->legal_configs(p).empty());
  ASSERT_FALSE(fake->default_config(p).ok());
  expect_dtype_error(fake->default_config(p).error());
  Result<KernelSource> source = render_cuda_attention(p, AttentionConfig{64, 64, 4, 2});
  ASSERT_FALSE(source.ok());
  EXPECT_NE(source.error().message.find("dtype = f32"), std::string::npos);
}

TEST_F(RuntimeTest, ConcurrentRequestsCompileOnce) {
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  RuntimeOptions options = test_options();
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
  RuntimeOptions options = test_options();
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
  RuntimeOptions options = test_options();
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

// A second process with a warm disk cache serves the kernel without compiling (no NVRTC call).
TEST_F(RuntimeTest, WarmDiskCacheMeansNoCompileAndStatsSaySo) {
  RuntimeOptions options = test_options();
  options.cache_dir = dir_ / "kernels";
  {
    Runtime first(std::make_unique<FakeBackend>(), options);
    ASSERT_TRUE(first.attention(problem()).ok());
    EXPECT_EQ(first.stats().compiles, 1);
    EXPECT_EQ(first.stats().disk_cache_loads, 0);
  }
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  Runtime second(std::move(backend), options);
  ASSERT_TRUE(second.attention(problem()).ok());
  EXPECT_EQ(fake->compiles, 0);
  EXPECT_EQ(second.stats().compiles, 0);
  EXPECT_EQ(second.stats().disk_cache_loads, 1);
}

// --- Config selection: tuning DBs, tune hook, recorded misses --------------------------------

class RuntimeSelectionTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    fs::create_directories(dir_);
    const AttentionProblem p = problem();
    const DeviceSpec device = known_device("sm90").value();
    default_ = default_config(p, device).value();
    for (const AttentionConfig& config : legal_configs(p, device)) {
      if (config != default_) others_.push_back(config);
    }
    ASSERT_GE(others_.size(), 3u);
  }

  // A DB with `config` chosen for `problem`'s key on the fake device.
  void choose(const fs::path& path, const AttentionProblem& p, const AttentionConfig& config) {
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(path);
    ASSERT_TRUE(store.ok()) << store.error().describe();
    TuneChoice choice;
    choice.config = config;
    choice.median_ms = 1.0;
    choice.default_ms = 1.2;
    ASSERT_TRUE((*store)->choose(FakeBackend::fake_fingerprint(), ProblemKey::of(p), choice).ok());
  }

  RuntimeOptions options_with(const fs::path& user_db,
                              std::vector<fs::path> system_dbs = {}) const {
    RuntimeOptions options = test_options();
    options.use_disk_cache = false;
    options.user_db = user_db;
    options.system_dbs = std::move(system_dbs);
    return options;
  }

  static std::pair<AttentionConfig, ChoiceSource> select(Runtime& runtime,
                                                         const AttentionProblem& p) {
    Result<std::pair<AttentionConfig, ChoiceSource>> selected = runtime.select_config(p);
    EXPECT_TRUE(selected.ok()) << selected.error().describe();
    return selected.ok() ? selected.value() : std::make_pair(AttentionConfig{}, ChoiceSource{});
  }

  static AttentionProblem sized(int64_t seqlen, int head_dim = 128) {
    return AttentionProblem::make(2, 8, 8, seqlen, seqlen, head_dim, DType::BF16, false);
  }

  AttentionConfig default_;
  std::vector<AttentionConfig> others_;  // legal, not the default
};

TEST_F(RuntimeSelectionTest, ExactThenNearestThenDefault) {
  const fs::path db = dir_ / "user.db";
  choose(db, sized(512), others_[0]);   // exact for sized(512)
  choose(db, sized(4096), others_[1]);  // nearest for sized(8192)
  Runtime runtime(std::make_unique<FakeBackend>(), options_with(db));
  ASSERT_NE(runtime.user_store(), nullptr);

  EXPECT_EQ(select(runtime, sized(512)), std::make_pair(others_[0], ChoiceSource::Exact));
  EXPECT_EQ(select(runtime, sized(500)), std::make_pair(others_[0], ChoiceSource::Exact));
  EXPECT_EQ(select(runtime, sized(8192)), std::make_pair(others_[1], ChoiceSource::NearestBucket));
  // Another head dim has no rows at all: the default for it.
  const AttentionProblem d64 = sized(512, 64);
  EXPECT_EQ(select(runtime, d64),
            std::make_pair(default_config(d64, runtime.backend().device()).value(),
                           ChoiceSource::Default));

  // attention() serves the selected config.
  Result<std::shared_ptr<Kernel>> kernel = runtime.attention(sized(512));
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  EXPECT_EQ((*kernel)->config(), others_[0]);
  Result<std::shared_ptr<Kernel>> nearest = runtime.attention(sized(8192));
  ASSERT_TRUE(nearest.ok());
  EXPECT_EQ((*nearest)->config(), others_[1]);

  Result<std::pair<AttentionConfig, ChoiceSource>> invalid =
      runtime.select_config(AttentionProblem::make(1, 1, 1, 1, 1, 100, DType::BF16, false));
  ASSERT_FALSE(invalid.ok());
  EXPECT_EQ(invalid.error().code, ErrorCode::InvalidArgument);
}

TEST_F(RuntimeSelectionTest, SelectionIsKeptInMemoryPerKey) {
  const fs::path db = dir_ / "user.db";
  choose(db, sized(512), others_[0]);
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  Runtime runtime(std::move(backend), options_with(db));
  Result<std::shared_ptr<Kernel>> first = runtime.attention(sized(512));
  ASSERT_TRUE(first.ok());
  // A new choice in the DB is not seen by this runtime for a key it has served.
  choose(db, sized(512), others_[1]);
  Result<std::shared_ptr<Kernel>> second = runtime.attention(sized(300));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(first->get(), second->get());
  EXPECT_EQ(fake->compiles, 1);
}

TEST_F(RuntimeSelectionTest, SystemDbsServeUnderTheUserDb) {
  const fs::path user = dir_ / "user.db";
  const fs::path system = dir_ / "system.db";
  choose(system, sized(512), others_[0]);
  choose(system, sized(2048), others_[1]);
  choose(user, sized(512), others_[2]);   // overrides the system DB's exact choice
  choose(user, sized(1024), others_[2]);  // the user DB's nearest for sized(2048)
  // A missing system DB in the list is skipped.
  Runtime runtime(std::make_unique<FakeBackend>(),
                  options_with(user, {dir_ / "missing.db", system}));
  ASSERT_EQ(runtime.system_stores().size(), 1u);
  EXPECT_EQ(select(runtime, sized(512)), std::make_pair(others_[2], ChoiceSource::Exact));
  // The system DB's exact choice beats the user DB's nearest one.
  EXPECT_EQ(select(runtime, sized(2048)), std::make_pair(others_[1], ChoiceSource::Exact));
  // Nearest: the user DB's (q1024) first, even though the system DB's (q2048) is as near.
  EXPECT_EQ(select(runtime, sized(4096)), std::make_pair(others_[2], ChoiceSource::NearestBucket));

  // Without a user DB, the system DB's nearest.
  Runtime system_only(std::make_unique<FakeBackend>(), options_with("none", {system}));
  EXPECT_EQ(system_only.user_store(), nullptr);
  EXPECT_EQ(select(system_only, sized(4096)),
            std::make_pair(others_[1], ChoiceSource::NearestBucket));
}

TEST_F(RuntimeSelectionTest, ASystemDbFolderStandsForItsDbFilesInNameOrder) {
  // A shipped folder (share/flashjit/tuning): its *.db files, b.db before c.db; other files
  // (the text form, notes) are not DBs.
  const fs::path folder = dir_ / "tuning";
  fs::create_directories(folder);
  choose(folder / "c.db", sized(512), others_[1]);
  choose(folder / "c.db", sized(1024), others_[1]);
  choose(folder / "b.db", sized(512), others_[0]);
  std::ofstream(folder / "b.sql") << "not a DB\n";
  Runtime runtime(std::make_unique<FakeBackend>(), options_with("none", {folder}));
  ASSERT_EQ(runtime.system_stores().size(), 2u);
  EXPECT_EQ(runtime.system_stores()[0]->path(), folder / "b.db");
  EXPECT_EQ(select(runtime, sized(512)), std::make_pair(others_[0], ChoiceSource::Exact));
  EXPECT_EQ(select(runtime, sized(1024)), std::make_pair(others_[1], ChoiceSource::Exact));
}

TEST_F(RuntimeSelectionTest, RowsOfAnotherDeviceAreNotUsed) {
  const fs::path db = dir_ / "user.db";
  {
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(db);
    ASSERT_TRUE(store.ok());
    DeviceFingerprint other = FakeBackend::fake_fingerprint();
    other.driver_version = 12080;
    TuneChoice choice;
    choice.config = others_[0];
    ASSERT_TRUE((*store)->choose(other, ProblemKey::of(sized(512)), choice).ok());
  }
  Runtime runtime(std::make_unique<FakeBackend>(), options_with(db));
  EXPECT_EQ(select(runtime, sized(512)), std::make_pair(default_, ChoiceSource::Default));
}

TEST_F(RuntimeSelectionTest, CorruptOrMissingDbsFallBackToTheDefault) {
  const fs::path junk = dir_ / "junk.db";
  { std::ofstream(junk) << std::string(8192, 'z'); }
  RuntimeOptions options = options_with(junk, {junk, dir_ / "missing.db"});
  options.log = true;  // the failures are logged to stderr
  Runtime runtime(std::make_unique<FakeBackend>(), options);
  EXPECT_EQ(runtime.user_store(), nullptr);
  EXPECT_TRUE(runtime.system_stores().empty());
  Result<std::shared_ptr<Kernel>> kernel = runtime.attention(problem());
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  EXPECT_EQ((*kernel)->config(), default_);

  // A user DB whose directory cannot be created.
  const fs::path blocker = dir_ / "file";
  { std::ofstream(blocker) << "x"; }
  Runtime blocked(std::make_unique<FakeBackend>(), options_with(blocker / "sub" / "user.db"));
  EXPECT_EQ(blocked.user_store(), nullptr);
  ASSERT_TRUE(blocked.attention(problem()).ok());
}

TEST_F(RuntimeSelectionTest, UntunedProblemsAreRecorded) {
  const fs::path db = dir_ / "user.db";
  choose(db, sized(512), others_[0]);
  {
    Runtime runtime(std::make_unique<FakeBackend>(), options_with(db));
    ASSERT_TRUE(runtime.attention(sized(512)).ok());  // exact: not recorded
    const AttentionProblem nearest =
        AttentionProblem::make(3, 8, 2, 4000, 5000, 128, DType::BF16, false);
    const AttentionProblem fallback = sized(512, 64);
    ASSERT_TRUE(runtime.attention(nearest).ok());
    ASSERT_TRUE(runtime.attention(fallback).ok());
    ASSERT_TRUE(runtime.attention(fallback).ok());  // served from memory: recorded once
    Result<std::vector<AttentionProblem>> recorded =
        runtime.user_store()->recorded_problems(FakeBackend::fake_fingerprint());
    ASSERT_TRUE(recorded.ok()) << recorded.error().describe();
    ASSERT_EQ(recorded->size(), 2u);
    std::set<std::string> shapes;
    for (const AttentionProblem& p : *recorded) shapes.insert(p.to_string());
    EXPECT_TRUE(shapes.count(nearest.to_string()));
    EXPECT_TRUE(shapes.count(fallback.to_string()));
  }
  // record_misses off: nothing new.
  RuntimeOptions options = options_with(db);
  options.record_misses = false;
  Runtime runtime(std::make_unique<FakeBackend>(), options);
  ASSERT_TRUE(runtime.attention(sized(512, 32)).ok());
  EXPECT_EQ(runtime.user_store()->recorded_problems(FakeBackend::fake_fingerprint())->size(), 2u);
}

TEST_F(RuntimeSelectionTest, TuneHookRunsOnlyWhenEnabledAndOnlyOnAnExactMiss) {
  const fs::path db = dir_ / "user.db";
  std::atomic<int> calls{0};
  const AttentionConfig tuned = others_[1];
  Runtime::TuneHook hook = [&](Runtime& runtime, const AttentionProblem& p) {
    ++calls;
    // A nested attention(problem) does not tune again (and does not deadlock).
    EXPECT_TRUE(runtime.attention(p).ok());
    TuneChoice choice;
    choice.config = tuned;
    Status chosen = runtime.user_store()->choose(runtime.fingerprint(), ProblemKey::of(p), choice);
    if (!chosen.ok()) return Result<AttentionConfig>(chosen.error());
    return Result<AttentionConfig>(tuned);
  };

  {
    Runtime off(std::make_unique<FakeBackend>(), options_with(db));
    off.set_tune_hook(hook);
    Result<std::shared_ptr<Kernel>> kernel = off.attention(sized(512));
    ASSERT_TRUE(kernel.ok());
    EXPECT_EQ((*kernel)->config(), default_);
    EXPECT_EQ(calls, 0);
  }

  RuntimeOptions options = options_with(db);
  options.tune_on_miss = true;
  {
    Runtime on(std::make_unique<FakeBackend>(), options);
    // No hook installed: the default, no failure.
    EXPECT_EQ(select(on, sized(1024)).second, ChoiceSource::Default);
    on.set_tune_hook(hook);
    // select_config never tunes.
    EXPECT_EQ(select(on, sized(1024)).second, ChoiceSource::Default);
    EXPECT_EQ(calls, 0);
    // The first attention() of a key without an exact choice tunes it, once.
    Result<std::shared_ptr<Kernel>> kernel = on.attention(sized(1024));
    ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
    EXPECT_EQ((*kernel)->config(), tuned);
    EXPECT_EQ(calls, 1);
    ASSERT_TRUE(on.attention(sized(1000)).ok());
    EXPECT_EQ(calls, 1);
  }
  // The tuned choice is in the DB: an exact hit for the next runtime, no tuning.
  Runtime again(std::make_unique<FakeBackend>(), options);
  again.set_tune_hook(hook);
  Result<std::shared_ptr<Kernel>> kernel = again.attention(sized(1024));
  ASSERT_TRUE(kernel.ok());
  EXPECT_EQ((*kernel)->config(), tuned);
  EXPECT_EQ(calls, 1);

  // A failing hook falls back (to the nearest: the tuned q1024 choice).
  again.set_tune_hook([&](Runtime&, const AttentionProblem&) -> Result<AttentionConfig> {
    ++calls;
    return make_error(ErrorCode::LaunchFailed, "fake tuning failure");
  });
  Result<std::shared_ptr<Kernel>> fallback = again.attention(sized(4096));
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ((*fallback)->config(), tuned);
  EXPECT_EQ(calls, 2);
}

TEST_F(RuntimeSelectionTest, ConcurrentRequestsWithADbCompileOnce) {
  const fs::path db = dir_ / "user.db";
  choose(db, sized(512), others_[0]);
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  Runtime runtime(std::move(backend), options_with(db));
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int64_t seqlen : {512, 300, 8192, 64}) {
        Result<std::shared_ptr<Kernel>> kernel = runtime.attention(sized(seqlen));
        if (!kernel.ok() || (*kernel)->config() != others_[0]) ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(fake->compiles, 1);
}

TEST(RuntimeDefaultsTest, EnvironmentDefaults) {
  struct SavedEnv {
    std::string name;
    std::optional<std::string> value;
    explicit SavedEnv(const char* n) : name(n) {
      if (const char* v = getenv(n)) value = v;
    }
    ~SavedEnv() {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  };
  SavedEnv db("FLASHJIT_DB"), system("FLASHJIT_SYSTEM_DB"), tune("FLASHJIT_TUNE"),
      log("FLASHJIT_LOG"), xdg("XDG_DATA_HOME");

  setenv("FLASHJIT_DB", "/tmp/x/tuning.db", 1);
  EXPECT_EQ(default_user_db(), fs::path("/tmp/x/tuning.db"));
  setenv("FLASHJIT_DB", "none", 1);
  EXPECT_FALSE(default_user_db().has_value());
  setenv("FLASHJIT_DB", "", 1);
  EXPECT_FALSE(default_user_db().has_value());
  unsetenv("FLASHJIT_DB");
  setenv("XDG_DATA_HOME", "/data", 1);
  EXPECT_EQ(default_user_db(), fs::path("/data/flashjit/tuning.db"));

  setenv("FLASHJIT_SYSTEM_DB", "/a.db::/b.db:", 1);
  EXPECT_EQ(default_system_dbs(), (std::vector<fs::path>{"/a.db", "/b.db"}));
  setenv("FLASHJIT_SYSTEM_DB", "none", 1);
  EXPECT_TRUE(default_system_dbs().empty());
  setenv("FLASHJIT_SYSTEM_DB", "", 1);
  EXPECT_TRUE(default_system_dbs().empty());
  // Unset: the shipped DBs' folder, which a build tree does not have (tests/cli/package_test.cpp
  // checks an installed tree).
  unsetenv("FLASHJIT_SYSTEM_DB");
  EXPECT_FALSE(shipped_tuning_dir().has_value());
  EXPECT_TRUE(default_system_dbs().empty());

  setenv("FLASHJIT_TUNE", "1", 1);
  setenv("FLASHJIT_LOG", "0", 1);
  RuntimeOptions options;
  EXPECT_TRUE(options.tune_on_miss);
  EXPECT_FALSE(options.log);
  EXPECT_TRUE(options.record_misses);
  EXPECT_FALSE(options.user_db.has_value());
}

// Without a GPU, "auto" falls back to the CPU backend where it is built in, else NoDevice.
TEST(RuntimeCreateTest, AutoWithoutAGpu) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  RuntimeOptions options;
  options.backend = "auto";
  options.user_db = "none";
  Result<std::unique_ptr<Runtime>> runtime = Runtime::create(options);
  if (have_cpu_backend()) {
    ASSERT_TRUE(runtime.ok()) << runtime.error().describe();
    EXPECT_EQ((*runtime)->backend().name(), "cpu");
  } else {
    ASSERT_FALSE(runtime.ok());
    EXPECT_EQ(runtime.error().code, ErrorCode::NoDevice);
  }
  options.backend = "cuda";
  runtime = Runtime::create(options);
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.error().code, ErrorCode::NoDevice);
}

TEST(RuntimeCreateTest, BackendNames) {
  EXPECT_EQ(resolve_backend("tpu").error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(resolve_backend("tpu").error().message.find("auto, cuda, hip, cpu"), std::string::npos);
  EXPECT_EQ(resolve_backend("cuda").value(), "cuda");
  if (have_cpu_backend()) {
    EXPECT_EQ(resolve_backend("cpu").value(), "cpu");
  } else {
    EXPECT_EQ(resolve_backend("cpu").error().code, ErrorCode::Unsupported);
  }
  if (have_hip_backend()) {
    EXPECT_EQ(resolve_backend("hip").value(), "hip");
  } else {
    EXPECT_EQ(resolve_backend("hip").error().code, ErrorCode::Unsupported);
  }
}

// Without an AMD GPU, forcing the HIP backend is a clean NoDevice (or Unsupported in a build
// without it), never a crash, with or without ROCm installed.
TEST(RuntimeCreateTest, HipWithoutAnAmdGpu) {
  if (gpu_device_count("hip") > 0) GTEST_SKIP() << "an AMD GPU is present";
  RuntimeOptions options;
  options.backend = "hip";
  options.user_db = "none";
  Result<std::unique_ptr<Runtime>> runtime = Runtime::create(options);
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.error().code, have_hip_backend() ? ErrorCode::NoDevice : ErrorCode::Unsupported)
      << runtime.error().describe();
}

}  // namespace
}  // namespace flashjit
