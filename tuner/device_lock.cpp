#include "tuner/device_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>

namespace flashjit {
namespace {

namespace fs = std::filesystem;

std::string errno_text() { return std::strerror(errno); }

// A file name for `device`: a readable prefix (letters, digits, dashes) and a hash of the whole.
std::string file_name(const std::string& device) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : device) hash = (hash ^ c) * 1099511628211ull;
  std::string prefix;
  for (char c : device) {
    if (prefix.size() >= 40) break;
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (keep) {
      prefix += c;
    } else if (!prefix.empty() && prefix.back() != '-') {
      prefix += '-';
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return prefix + hex + ".lock";
}

long read_holder(int fd) {
  char text[32] = {};
  const ssize_t n = pread(fd, text, sizeof text - 1, 0);
  if (n <= 0) return 0;
  return std::strtol(text, nullptr, 10);
}

}  // namespace

DeviceLock::Guard& DeviceLock::Guard::operator=(Guard&& other) noexcept {
  if (this != &other) {
    release();
    lock_ = other.lock_;
    other.lock_ = nullptr;
  }
  return *this;
}

void DeviceLock::Guard::release() {
  if (lock_ != nullptr) lock_->unlock();
  lock_ = nullptr;
}

fs::path DeviceLock::default_dir() {
  if (const char* dir = std::getenv("FLASHJIT_LOCK_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  const char* tmp = std::getenv("TMPDIR");
  const fs::path base = tmp != nullptr && *tmp != '\0' ? fs::path(tmp) : fs::path("/tmp");
  return base / ("flashjit-locks-" + std::to_string(getuid()));
}

Result<DeviceLock> DeviceLock::open(const fs::path& dir, const std::string& device) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return make_error(ErrorCode::IoError, "device lock folder " + dir.string() +
                                              " cannot be made: " + ec.message() +
                                              " (FLASHJIT_LOCK_DIR names another)");
  }
  fs::path path = dir / file_name(device);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return make_error(ErrorCode::IoError, "device lock " + path.string() +
                                              " cannot be opened: " + errno_text() +
                                              " (FLASHJIT_LOCK_DIR names another folder)");
  }
  return DeviceLock(fd, std::move(path), device);
}

DeviceLock::DeviceLock(DeviceLock&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), device_(std::move(other.device_)) {
  other.fd_ = -1;
}

DeviceLock& DeviceLock::operator=(DeviceLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    device_ = std::move(other.device_);
    other.fd_ = -1;
  }
  return *this;
}

DeviceLock::~DeviceLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock too
}

Status DeviceLock::mark_holder() const {
  const std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(fd_, 0) != 0 || pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    const std::string reason = errno_text();
    unlock();
    return make_error(ErrorCode::IoError,
                      "device lock " + path_.string() + ": cannot record the holder: " + reason);
  }
  return ok_status();
}

void DeviceLock::unlock() const {
  if (fd_ >= 0) flock(fd_, LOCK_UN);
}

Result<DeviceLock::Guard> DeviceLock::try_acquire() const {
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return Guard();
    return make_error(ErrorCode::IoError, "device lock " + path_.string() + ": " + errno_text());
  }
  FLASHJIT_TRY(mark_holder());
  return Guard(this);
}

Result<DeviceLock::Guard> DeviceLock::acquire(const std::function<void(long)>& on_wait) const {
  Result<Guard> quick = try_acquire();
  if (!quick.ok() || quick->held()) return quick;
  if (on_wait) on_wait(read_holder(fd_));
  while (flock(fd_, LOCK_EX) != 0) {
    if (errno != EINTR) {
      return make_error(ErrorCode::IoError, "device lock " + path_.string() + ": " + errno_text());
    }
  }
  FLASHJIT_TRY(mark_holder());
  return Guard(this);
}

}  // namespace flashjit
