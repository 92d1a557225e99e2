#include "runtime/binary_cache.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace flashjit {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class BinaryCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("flashjit-binary-cache-test-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }

  static std::vector<char> sample_bytes(size_t size, int seed = 1) {
    std::vector<char> bytes(size);
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + seed * 7) & 0xff);
    return bytes;
  }

  fs::path root_;
};

bool is_lower_hex(const std::string& text) {
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

TEST(ContentHashTest, KnownValuesAreStable) {
  // Pinned: a change here invalidates every user's cache (and any key stored elsewhere).
  EXPECT_EQ(content_hash(""), "f523af444b3b1d84bf92385f891b2d1d");
  EXPECT_EQ(content_hash("a"), "77498b54da12078f1192fac0eb78c6a4");
  EXPECT_EQ(content_hash("flashjit"), "f98ce2667704332c801686f29c55fbac");
  // 17 bytes: one full 16-byte block plus a tail.
  EXPECT_EQ(content_hash("0123456789abcdef0"), "8860939658ecb68edd1a1ac87a0290d0");
}

TEST(ContentHashTest, Is32LowerHexDigitsAndSensitiveToEveryByte) {
  const std::string base(1000, 'x');
  const std::string hash = content_hash(base);
  EXPECT_EQ(hash.size(), 32u);
  EXPECT_TRUE(is_lower_hex(hash)) << hash;
  for (size_t position : {size_t{0}, size_t{15}, size_t{16}, size_t{500}, size_t{999}}) {
    std::string changed = base;
    changed[position] = 'y';
    EXPECT_NE(content_hash(changed), hash) << "byte " << position;
  }
  EXPECT_NE(content_hash(base + '\0'), hash);  // the length counts
}

TEST(BinaryCacheKeyTest, ChangesWithEachInput) {
  const std::string key = BinaryCache::key("source", "nvrtc 13.0 sm_90", "");
  EXPECT_EQ(key.size(), 32u);
  EXPECT_TRUE(is_lower_hex(key));
  EXPECT_EQ(BinaryCache::key("source", "nvrtc 13.0 sm_90", ""), key);
  EXPECT_NE(BinaryCache::key("source2", "nvrtc 13.0 sm_90", ""), key);
  EXPECT_NE(BinaryCache::key("source", "nvrtc 13.0 sm_80", ""), key);
  EXPECT_NE(BinaryCache::key("source", "nvrtc 13.0 sm_90", "-G"), key);
  // Text moved across a field boundary is a different key.
  EXPECT_NE(BinaryCache::key("ab", "c", ""), BinaryCache::key("a", "bc", ""));
  EXPECT_NE(BinaryCache::key("a", "", "b"), BinaryCache::key("a", "b", ""));
}

TEST_F(BinaryCacheTest, MissOnEmptyCache) {
  BinaryCache cache(root_ / "cache");
  EXPECT_FALSE(cache.get(BinaryCache::key("s", "f", "")).has_value());
}

TEST_F(BinaryCacheTest, PutThenGetRoundTrips) {
  BinaryCache cache(root_ / "nested" / "cache");  // created on demand
  const std::string key = BinaryCache::key("source", "fingerprint", "");
  const std::vector<char> bytes = sample_bytes(100000);
  ASSERT_TRUE(cache.put(key, bytes).ok());
  std::optional<std::vector<char>> loaded = cache.get(key);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(*loaded, bytes);

  // Overwrite with different contents, and an empty payload is legal too.
  const std::vector<char> other = sample_bytes(10, 2);
  ASSERT_TRUE(cache.put(key, other).ok());
  EXPECT_EQ(cache.get(key).value(), other);
  ASSERT_TRUE(cache.put(key, {}).ok());
  ASSERT_TRUE(cache.get(key).has_value());
  EXPECT_TRUE(cache.get(key)->empty());

  // No temporary files are left behind.
  for (const auto& entry : fs::directory_iterator(cache.dir())) {
    EXPECT_EQ(entry.path().extension(), ".bin") << entry.path();
  }
}

TEST_F(BinaryCacheTest, CorruptEntryIsAMiss) {
  BinaryCache cache(root_);
  const std::string key = BinaryCache::key("source", "fingerprint", "");
  ASSERT_TRUE(cache.put(key, sample_bytes(4096)).ok());
  const fs::path path = root_ / (key + ".bin");
  ASSERT_TRUE(fs::exists(path));
  {
    // Flip one payload byte in place.
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(2000);
    char byte = 0;
    file.read(&byte, 1);
    file.seekp(2000);
    byte = static_cast<char>(byte ^ 0x5a);
    file.write(&byte, 1);
  }
  EXPECT_FALSE(cache.get(key).has_value());
  // A bad magic is a miss too.
  ASSERT_TRUE(cache.put(key, sample_bytes(64)).ok());
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.write("XXXX", 4);
  }
  EXPECT_FALSE(cache.get(key).has_value());
}

TEST_F(BinaryCacheTest, TruncatedEntryIsAMiss) {
  BinaryCache cache(root_);
  const std::string key = BinaryCache::key("source", "fingerprint", "");
  ASSERT_TRUE(cache.put(key, sample_bytes(4096)).ok());
  const fs::path path = root_ / (key + ".bin");
  const auto full_size = fs::file_size(path);
  fs::resize_file(path, full_size - 1);
  EXPECT_FALSE(cache.get(key).has_value());
  fs::resize_file(path, 10);  // shorter than the header
  EXPECT_FALSE(cache.get(key).has_value());
  fs::resize_file(path, 0);
  EXPECT_FALSE(cache.get(key).has_value());
}

TEST_F(BinaryCacheTest, KeysThatAreNotHexAreRejected) {
  BinaryCache cache(root_ / "cache");
  EXPECT_FALSE(cache.get("../escape").has_value());
  EXPECT_FALSE(cache.get("").has_value());
  const Status status = cache.put("../escape", sample_bytes(8));
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument);
  EXPECT_FALSE(fs::exists(root_ / "escape.bin"));
}

TEST_F(BinaryCacheTest, ConcurrentPutsOfOneKeyLeaveAValidEntry) {
  BinaryCache cache(root_ / "cache");
  const std::string key = BinaryCache::key("shared", "fingerprint", "");
  const std::vector<char> bytes = sample_bytes(200000);
  std::vector<std::thread> writers;
  std::vector<int> failures(8, 0);
  for (int t = 0; t < 8; ++t) {
    writers.emplace_back([&, t] {
      for (int round = 0; round < 10; ++round) {
        if (!cache.put(key, bytes).ok()) ++failures[t];
        // Readers racing writers see a whole entry or none, never a partial one.
        std::optional<std::vector<char>> seen = cache.get(key);
        if (seen.has_value() && *seen != bytes) ++failures[t];
      }
    });
  }
  for (std::thread& writer : writers) writer.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  std::optional<std::vector<char>> loaded = cache.get(key);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(*loaded, bytes);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(cache.dir())) {
    ++files;
    EXPECT_EQ(entry.path().extension(), ".bin") << entry.path();
  }
  EXPECT_EQ(files, 1);
}

TEST_F(BinaryCacheTest, UnwritableDirectoryIsAnIoError) {
  // A directory below a regular file can never be created, even as root (where permission bits
  // would not stop us).
  const fs::path blocker = root_ / "not-a-directory";
  { std::ofstream(blocker) << "file"; }
  BinaryCache cache(blocker / "cache");
  const Status status = cache.put(BinaryCache::key("s", "f", ""), sample_bytes(16));
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, ErrorCode::IoError);
  EXPECT_NE(status.error().message.find(blocker.string()), std::string::npos)
      << status.error().message;
  EXPECT_FALSE(cache.get(BinaryCache::key("s", "f", "")).has_value());
}

// Sets an environment variable for one scope and restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(BinaryCacheDefaultDirTest, FollowsEnvironment) {
  {
    ScopedEnv cache_dir("FLASHJIT_CACHE_DIR", "/some/where/flashjit");
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(BinaryCache::default_dir(), fs::path("/some/where/flashjit"));
  }
  {
    ScopedEnv cache_dir("FLASHJIT_CACHE_DIR", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(BinaryCache::default_dir(), fs::path("/xdg/flashjit"));
  }
  {
    ScopedEnv cache_dir("FLASHJIT_CACHE_DIR", "");  // empty counts as unset
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(BinaryCache::default_dir(), fs::path("/home/someone/.cache/flashjit"));
  }
  {
    ScopedEnv cache_dir("FLASHJIT_CACHE_DIR", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", nullptr);
    EXPECT_EQ(BinaryCache::default_dir().filename(), fs::path("flashjit-cache"));
  }
}

}  // namespace
}  // namespace flashjit
