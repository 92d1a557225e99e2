// On-disk cache of compiled kernels. An entry file is a fixed header followed by the binary:
//
//   offset  0: "FJBC"                      magic
//   offset  4: uint32 little-endian       format version
//   offset  8: uint64 little-endian       payload size in bytes
//   offset 16: 32 ASCII hex digits        content_hash(payload)
//   offset 48: payload
//
// Anything that does not match exactly (short file, other version, wrong size or hash) is a miss,
// so a torn or corrupted file costs one recompile and is then overwritten.
#include "runtime/binary_cache.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <system_error>
#include <thread>

namespace flashjit {
namespace {

constexpr char kMagic[4] = {'F', 'J', 'B', 'C'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHashDigits = 32;
constexpr size_t kHeaderBytes = 4 + 4 + 8 + kHashDigits;

// MurmurHash3 x64_128 (Austin Appleby, public domain), reading blocks as little-endian on every
// platform so that keys are the same everywhere.
uint64_t rotate_left(uint64_t value, int bits) { return (value << bits) | (value >> (64 - bits)); }

uint64_t final_mix(uint64_t value) {
  value ^= value >> 33;
  value *= 0xff51afd7ed558ccdULL;
  value ^= value >> 33;
  value *= 0xc4ceb9fe1a85ec53ULL;
  value ^= value >> 33;
  return value;
}

// A block's lane, scrambled before it is mixed into its half of the state.
uint64_t scramble(uint64_t lane, uint64_t first, uint64_t second, int bits) {
  return rotate_left(lane * first, bits) * second;
}

uint64_t load_le64(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

void murmur3_x64_128(std::string_view data, uint64_t seed, uint64_t* out_high, uint64_t* out_low) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  const size_t length = data.size();
  const size_t blocks = length / 16;
  constexpr uint64_t c1 = 0x87c37b91114253d5ULL;
  constexpr uint64_t c2 = 0x4cf5ad432745937fULL;
  uint64_t h1 = seed;
  uint64_t h2 = seed;

  for (size_t i = 0; i < blocks; ++i) {
    h1 ^= scramble(load_le64(bytes + i * 16), c1, c2, 31);
    h1 = rotate_left(h1, 27) + h2;
    h1 = h1 * 5 + 0x52dce729;
    h2 ^= scramble(load_le64(bytes + i * 16 + 8), c2, c1, 33);
    h2 = rotate_left(h2, 31) + h1;
    h2 = h2 * 5 + 0x38495ab5;
  }

  const unsigned char* tail = bytes + blocks * 16;
  const size_t remaining = length & 15;
  uint64_t k1 = 0;
  uint64_t k2 = 0;
  for (size_t i = remaining; i > 8; --i) k2 ^= static_cast<uint64_t>(tail[i - 1]) << ((i - 9) * 8);
  if (remaining > 8) h2 ^= scramble(k2, c2, c1, 33);
  for (size_t i = remaining < 8 ? remaining : 8; i > 0; --i) {
    k1 ^= static_cast<uint64_t>(tail[i - 1]) << ((i - 1) * 8);
  }
  if (remaining > 0) h1 ^= scramble(k1, c1, c2, 31);

  h1 ^= static_cast<uint64_t>(length);
  h2 ^= static_cast<uint64_t>(length);
  h1 += h2;
  h2 += h1;
  h1 = final_mix(h1);
  h2 = final_mix(h2);
  h1 += h2;
  h2 += h1;
  *out_high = h1;
  *out_low = h2;
}

// A key is used as a file name: only hex digits (what key() makes) are accepted, so a caller
// cannot reach outside the cache directory.
bool is_valid_key(const std::string& key) {
  if (key.empty() || key.size() > 128) return false;
  for (char c : key) {
    const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (!hex) return false;
  }
  return true;
}

void store_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t read_le(const char* bytes, int count) {
  uint64_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  return value;
}

// Unique per process, thread and call: concurrent writers of one key never share a temp file.
std::string temporary_suffix() {
  static std::atomic<uint64_t> counter{0};
  const uint64_t sequence = counter.fetch_add(1, std::memory_order_relaxed);
  const uint64_t now =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const uint64_t thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
  char buffer[64];
  std::snprintf(
      buffer, sizeof(buffer), ".%ld.%016llx.tmp", static_cast<long>(getpid()),
      static_cast<unsigned long long>(final_mix(now ^ rotate_left(thread, 17)) + sequence));
  return buffer;
}

Error io_error(const std::string& what, const std::filesystem::path& path, int error_number) {
  return make_error(ErrorCode::IoError,
                    what + " " + path.string() + ": " + std::strerror(error_number));
}

}  // namespace

std::string content_hash(std::string_view data) {
  uint64_t high = 0;
  uint64_t low = 0;
  // A fixed non-zero seed, so that even the empty input has a well-mixed hash.
  murmur3_x64_128(data, 0x666c6173686a6974ULL /* "flashjit" */, &high, &low);
  char buffer[kHashDigits + 1];
  std::snprintf(buffer, sizeof(buffer), "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return std::string(buffer, kHashDigits);
}

BinaryCache::BinaryCache(std::filesystem::path dir) : dir_(std::move(dir)) {}

std::filesystem::path BinaryCache::default_dir() {
  auto env = [](const char* name) -> const char* {
    const char* value = std::getenv(name);
    return (value != nullptr && value[0] != '\0') ? value : nullptr;
  };
  if (const char* dir = env("FLASHJIT_CACHE_DIR")) return dir;
  if (const char* dir = env("XDG_CACHE_HOME")) return std::filesystem::path(dir) / "flashjit";
  if (const char* home = env("HOME")) return std::filesystem::path(home) / ".cache" / "flashjit";
  std::error_code error;
  std::filesystem::path temp = std::filesystem::temp_directory_path(error);
  if (error) temp = "/tmp";
  return temp / "flashjit-cache";
}

std::string BinaryCache::key(std::string_view source, std::string_view compiler_fingerprint,
                             std::string_view options) {
  // Length-prefixed fields: no choice of contents can make two different triples collide by
  // moving text across a separator.
  std::string material = "flashjit-binary-cache-key\n";
  material.reserve(material.size() + source.size() + compiler_fingerprint.size() + options.size() +
                   64);
  for (std::string_view field : {source, compiler_fingerprint, options}) {
    material += std::to_string(field.size());
    material += ':';
    material += field;
    material += '\n';
  }
  return content_hash(material);
}

std::optional<std::vector<char>> BinaryCache::get(const std::string& key) const {
  if (!is_valid_key(key)) return std::nullopt;
  const std::filesystem::path path = dir_ / (key + ".bin");
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return std::nullopt;

  std::vector<char> contents;
  char chunk[1 << 16];
  size_t read = 0;
  while ((read = std::fread(chunk, 1, sizeof(chunk), file)) > 0) {
    contents.insert(contents.end(), chunk, chunk + read);
  }
  const bool read_failed = std::ferror(file) != 0;
  std::fclose(file);
  if (read_failed || contents.size() < kHeaderBytes) return std::nullopt;

  const char* header = contents.data();
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0) return std::nullopt;
  if (read_le(header + 4, 4) != kFormatVersion) return std::nullopt;
  const uint64_t payload_size = read_le(header + 8, 8);
  if (payload_size != contents.size() - kHeaderBytes) return std::nullopt;
  const std::string_view stored_hash(header + 16, kHashDigits);
  const std::string_view payload(contents.data() + kHeaderBytes, payload_size);
  if (content_hash(payload) != stored_hash) return std::nullopt;
  return std::vector<char>(payload.begin(), payload.end());
}

Status BinaryCache::put(const std::string& key, const std::vector<char>& bytes) const {
  if (!is_valid_key(key)) {
    return make_error(ErrorCode::InvalidArgument,
                      "cache key '" + key + "': must be 1 to 128 hex digits (from key())");
  }
  std::error_code error;
  std::filesystem::create_directories(dir_, error);
  if (error) {
    return make_error(ErrorCode::IoError,
                      "cannot create cache directory " + dir_.string() + ": " + error.message());
  }

  std::string header(kMagic, sizeof(kMagic));
  store_le(header, kFormatVersion, 4);
  store_le(header, bytes.size(), 8);
  header += content_hash(std::string_view(bytes.data(), bytes.size()));

  const std::filesystem::path final_path = dir_ / (key + ".bin");
  const std::filesystem::path temp_path = dir_ / (key + temporary_suffix());
  std::FILE* file = std::fopen(temp_path.c_str(), "wb");
  if (file == nullptr) return io_error("cannot create", temp_path, errno);
  bool written = std::fwrite(header.data(), 1, header.size(), file) == header.size();
  if (written && !bytes.empty()) {
    written = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
  }
  int write_errno = errno;
  if (written && std::fflush(file) != 0) {
    written = false;
    write_errno = errno;
  }
  if (std::fclose(file) != 0 && written) {
    written = false;
    write_errno = errno;
  }
  if (!written) {
    std::filesystem::remove(temp_path, error);
    return io_error("cannot write", temp_path, write_errno);
  }

  // rename() replaces atomically on POSIX: readers see the old entry or the whole new one, and
  // the last of several concurrent writers of one key wins with an equally valid file.
  std::filesystem::rename(temp_path, final_path, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(temp_path, ignored);
    return make_error(ErrorCode::IoError, "cannot rename " + temp_path.string() + " to " +
                                              final_path.string() + ": " + error.message());
  }
  return ok_status();
}

}  // namespace flashjit
