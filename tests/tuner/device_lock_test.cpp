// tuner/device_lock: one holder per device across processes and threads, waiters told who holds
// it, different devices independent, released when the holder exits.
#include "tuner/device_lock.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

namespace flashjit {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class DeviceLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("flashjit-lock-test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(DeviceLockTest, OneHolderAtATimeAndTheWaiterIsToldWho) {
  Result<DeviceLock> first = DeviceLock::open(dir_, "cuda pci 0000:19:00.0");
  Result<DeviceLock> second = DeviceLock::open(dir_, "cuda pci 0000:19:00.0");
  ASSERT_TRUE(first.ok()) << first.error().describe();
  ASSERT_TRUE(second.ok()) << second.error().describe();
  EXPECT_EQ(first->path(), second->path());

  Result<DeviceLock::Guard> held = first->acquire();
  ASSERT_TRUE(held.ok() && held->held());
  Result<DeviceLock::Guard> busy = second->try_acquire();
  ASSERT_TRUE(busy.ok());
  EXPECT_FALSE(busy->held()) << "two holders of one device";

  std::atomic<long> told{-1};
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    Result<DeviceLock::Guard> mine = second->acquire([&](long pid) { told = pid; });
    got = mine.ok() && mine->held();
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(got) << "acquired while held";
  held->release();
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(told, static_cast<long>(getpid())) << "the waiter names the holder";
}

TEST_F(DeviceLockTest, DifferentDevicesDoNotWait) {
  Result<DeviceLock> a = DeviceLock::open(dir_, "cuda pci 0000:19:00.0");
  Result<DeviceLock> b = DeviceLock::open(dir_, "cuda pci 0000:3b:00.0");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->path(), b->path());
  Result<DeviceLock::Guard> held_a = a->acquire();
  Result<DeviceLock::Guard> held_b = b->try_acquire();
  ASSERT_TRUE(held_a.ok() && held_b.ok());
  EXPECT_TRUE(held_a->held());
  EXPECT_TRUE(held_b->held());
}

TEST_F(DeviceLockTest, AnotherProcessWaitsAndAnExitedHolderFreesTheDevice) {
  const std::string device = "cpu|AMD EPYC|2cores";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // holds the device for 300 ms, then exits without releasing it
    Result<DeviceLock> lock = DeviceLock::open(dir_, device);
    if (!lock.ok()) _exit(2);
    Result<DeviceLock::Guard> held = lock->acquire();
    if (!held.ok() || !held->held()) _exit(3);
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) _exit(4);
    std::this_thread::sleep_for(300ms);
    _exit(0);  // no destructor: the kernel releases the flock
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  Result<DeviceLock> lock = DeviceLock::open(dir_, device);
  ASSERT_TRUE(lock.ok());
  long told = -1;
  const auto start = std::chrono::steady_clock::now();
  Result<DeviceLock::Guard> held = lock->acquire([&](long pid) { told = pid; });
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(held.ok() && held->held());
  EXPECT_EQ(told, static_cast<long>(child));
  EXPECT_GE(waited, 100ms) << "did not wait for the other process";
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(ready[0]);
  close(ready[1]);
}

TEST_F(DeviceLockTest, AFolderThatCannotBeMadeIsANamedError) {
  const fs::path file = dir_ / "a-file";
  fs::create_directories(dir_);
  { std::ofstream(file) << "x"; }
  Result<DeviceLock> lock = DeviceLock::open(file / "locks", "cuda pci 0000:19:00.0");
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.error().code, ErrorCode::IoError);
  EXPECT_NE(lock.error().message.find((file / "locks").string()), std::string::npos)
      << lock.error().message;
}

TEST(DeviceLockDir, EnvironmentNamesTheFolder) {
  setenv("FLASHJIT_LOCK_DIR", "/tmp/flashjit-shared-locks", 1);
  EXPECT_EQ(DeviceLock::default_dir(), fs::path("/tmp/flashjit-shared-locks"));
  unsetenv("FLASHJIT_LOCK_DIR");
  EXPECT_NE(DeviceLock::default_dir().string().find("flashjit-locks-"), std::string::npos);
}

}  // namespace
}  // namespace flashjit
