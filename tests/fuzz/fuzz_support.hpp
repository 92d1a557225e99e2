// Helpers of the fuzz targets (tests/fuzz/*.cpp): reading structured values from the fuzzer's
// bytes, and the invariant check whose failure is a finding (it aborts, as a sanitizer would).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "generator/error.hpp"

namespace flashjit::fuzz {

// A finding: prints what broke and aborts (libFuzzer saves the input as a crash).
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}
inline void require(bool condition, const std::string& what) {
  if (!condition) fail(what);
}
// Every error the library returns names something: an empty message is a finding.
inline void require_message(const Error& error, const char* where) {
  require(!error.message.empty(), std::string(where) + ": an error without a message");
}
// True when `result` (a Result or a Status) is ok; an error must have a message.
template <class R>
bool checked(const R& result, const char* where) {
  if (!result.ok()) require_message(result.error(), where);
  return result.ok();
}

// Consumes the fuzzer's bytes front to back; past the end every read is 0 / empty.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return offset_ >= size_; }
  uint8_t byte() { return offset_ < size_ ? data_[offset_++] : 0; }
  bool flag() { return (byte() & 1) != 0; }
  uint64_t u64() {
    uint64_t value = 0;
    for (int i = 0; i < 8; ++i) value = value << 8 | byte();
    return value;
  }
  // Mostly small values (the interesting range of extents and strides), sometimes a power of two
  // or a raw 64-bit value (the overflow cases).
  int64_t extent() {
    const uint8_t b = byte();
    if (b < 200) return b;
    if (b < 240) return int64_t{1} << (b - 200 + 8);         // 2^8 .. 2^47
    if (b < 250) return (int64_t{1} << (b - 240 + 20)) * 8;  // multiples of 8, 2^23 .. 2^32
    return static_cast<int64_t>(u64());
  }
  // A string up to the next '\n' (or the end), without it.
  std::string line() {
    std::string text;
    while (offset_ < size_ && data_[offset_] != '\n')
      text.push_back(static_cast<char>(data_[offset_++]));
    if (offset_ < size_) ++offset_;
    return text;
  }
  // Whatever is left.
  std::string rest() {
    std::string text(reinterpret_cast<const char*>(data_ + std::min(offset_, size_)),
                     size_ - std::min(offset_, size_));
    offset_ = size_;
    return text;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

// `text` split at every `separator` (empty pieces kept: an empty argv entry is an input too).
inline std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> pieces;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    pieces.emplace_back(
        text.substr(start, end == std::string_view::npos ? text.npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return pieces;
}

}  // namespace flashjit::fuzz
