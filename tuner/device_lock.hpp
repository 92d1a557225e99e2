// One timer per device: tuners in different processes that share a device take turns for their
// timing phases, so that no process times its configs while another's run on the same device
// (issue 15: four concurrent tuners on one H100 measured their defaults at 64-91 TFLOP/s instead
// of ~300 and stored "gains" of 3-5x). Compiles and verification stay parallel.
//
// The lock is an advisory flock(2) on a file per device in a folder of locks:
// FLASHJIT_LOCK_DIR, else $TMPDIR/flashjit-locks-<uid> (/tmp when TMPDIR is unset). The file is
// named by Backend::timing_device_id() (a hash of it and a readable prefix) and holds the pid of
// the holder, for the "waiting for <device>: held by pid N" message. The kernel releases an flock
// when its holder exits or crashes, so a killed tuner never leaves a device locked. Tuners of
// different users only share the lock with a common FLASHJIT_LOCK_DIR (a folder both can write).
//
//   Result<DeviceLock> lock = DeviceLock::open(DeviceLock::default_dir(),
//   backend.timing_device_id());
//   {
//     Result<DeviceLock::Guard> held = lock->acquire([](long pid) { ... say who we wait for ... });
//     ... time ...
//   }  // released
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include "generator/error.hpp"

namespace flashjit {

class DeviceLock {
 public:
  // Holds the lock while alive; movable.
  class Guard {
   public:
    Guard() = default;
    explicit Guard(const DeviceLock* lock) : lock_(lock) {}
    Guard(Guard&& other) noexcept : lock_(other.lock_) { other.lock_ = nullptr; }
    Guard& operator=(Guard&& other) noexcept;
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    ~Guard() { release(); }
    void release();
    bool held() const { return lock_ != nullptr; }

   private:
    const DeviceLock* lock_ = nullptr;
  };

  // FLASHJIT_LOCK_DIR, else $TMPDIR/flashjit-locks-<uid>.
  static std::filesystem::path default_dir();

  // Opens (creating the folder and the file if needed) the lock of `device` in `dir`. Error
  // IoError naming the path when the folder or file cannot be made or opened.
  static Result<DeviceLock> open(const std::filesystem::path& dir, const std::string& device);

  DeviceLock(DeviceLock&& other) noexcept;
  DeviceLock& operator=(DeviceLock&& other) noexcept;
  DeviceLock(const DeviceLock&) = delete;
  DeviceLock& operator=(const DeviceLock&) = delete;
  ~DeviceLock();

  // Blocks until this process holds the device. When another process holds it, calls
  // `on_wait(pid of the holder, 0 if unknown)` once before waiting. Not reentrant: one Guard at
  // a time per DeviceLock.
  Result<Guard> acquire(const std::function<void(long holder_pid)>& on_wait = {}) const;

  // Without waiting: a Guard that holds the lock, or one that does not (held() false) when
  // another process has it.
  Result<Guard> try_acquire() const;

  const std::filesystem::path& path() const { return path_; }
  const std::string& device() const { return device_; }

 private:
  DeviceLock(int fd, std::filesystem::path path, std::string device)
      : fd_(fd), path_(std::move(path)), device_(std::move(device)) {}
  Status mark_holder() const;
  void unlock() const;

  int fd_ = -1;
  std::filesystem::path path_;
  std::string device_;
};

}  // namespace flashjit
