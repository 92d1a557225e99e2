// On-disk cache of compiled kernels, so that a second process does not recompile.
// Entries are files named by a 128-bit hash of (source, compiler fingerprint, options);
// writes go to a temporary file in the same directory and are renamed into place, so readers
// never see a partial entry and concurrent writers of the same key are harmless.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "generator/error.hpp"

namespace flashjit {

// 32 hex digits; stable across runs, platforms and compilers.
std::string content_hash(std::string_view data);

class BinaryCache {
 public:
  explicit BinaryCache(std::filesystem::path dir);

  // $FLASHJIT_CACHE_DIR, else $XDG_CACHE_HOME/flashjit, else ~/.cache/flashjit,
  // else <temp dir>/flashjit-cache.
  static std::filesystem::path default_dir();

  // Key of one compile: hash of every input that changes the binary.
  static std::string key(std::string_view source, std::string_view compiler_fingerprint,
                         std::string_view options);

  const std::filesystem::path& dir() const { return dir_; }
  // nullopt on a miss or an unreadable/corrupt entry (a corrupt entry is a miss, not an error).
  std::optional<std::vector<char>> get(const std::string& key) const;
  Status put(const std::string& key, const std::vector<char>& bytes) const;

 private:
  std::filesystem::path dir_;
};

}  // namespace flashjit
