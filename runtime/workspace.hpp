// Scratch memory a kernel keeps between launches (the backward pass's fp32 workspace): one
// buffer per stream, allocated on first use and grown when a larger problem needs more, so that a
// launch allocates nothing in the steady state. Thread-safe.
//
// Per stream, because launches on one stream run in order and may share a buffer, while launches
// on two streams may overlap. Growing replaces a stream's buffer: the old one is freed only after
// `drain(stream)` returned (the stream's earlier work, which may still read it, has finished).
// A stream handle reused after its stream was destroyed with work still queued on it would share
// the buffer with that work: destroy streams after their work, or pass a workspace explicitly.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include "generator/error.hpp"
#include "runtime/backend.hpp"

namespace flashjit {

class WorkspaceCache {
 public:
  using Allocate = std::function<Result<DeviceBuffer>(size_t bytes)>;
  using Drain = std::function<Status(void* stream)>;

  WorkspaceCache(Allocate allocate, Drain drain)
      : allocate_(std::move(allocate)), drain_(std::move(drain)) {}

  // A buffer of at least `bytes` for launches on `stream`; valid until the next call for the
  // same stream that asks for more.
  Result<void*> get(size_t bytes, void* stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceBuffer& buffer = buffers_[stream];
    if (buffer.get() != nullptr && buffer.bytes() >= bytes) return buffer.get();
    if (buffer.get() != nullptr) {
      FLASHJIT_TRY(drain_(stream));
      buffer.reset();
    }
    regions_.erase(stream);
    // Some headroom, so that slowly growing problems do not reallocate every time.
    Result<DeviceBuffer> grown = allocate_(bytes + bytes / 8);
    if (!grown.ok()) return grown.error();
    buffer = std::move(grown.value());
    return buffer.get();
  }

  // A region of `stream`'s buffer that the kernel's launches leave as they found it (the decode
  // family's split counters: zero before, zero after): whether the last launch on `stream`
  // remembered this same region (then it needs no initializing), and remember_region after a
  // launch that initialized or used it. Growing the buffer forgets it.
  bool same_region_as_last(void* stream, const void* begin, size_t bytes) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = regions_.find(stream);
    return found != regions_.end() && found->second.first == begin && found->second.second == bytes;
  }
  void remember_region(void* stream, const void* begin, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    regions_[stream] = {begin, bytes};
  }

  // Bytes held over all streams.
  size_t bytes_held() const {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t total = 0;
    for (const auto& [stream, buffer] : buffers_) total += buffer.bytes();
    return total;
  }

 private:
  Allocate allocate_;
  Drain drain_;
  mutable std::mutex mutex_;
  std::map<void*, DeviceBuffer> buffers_;
  std::map<void*, std::pair<const void*, size_t>> regions_;  // same_region_as_last
};

}  // namespace flashjit
