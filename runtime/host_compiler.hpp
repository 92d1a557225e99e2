// The host's C++ compiler as a process: a C++ source -> a shared object in flashjit's cache
// folder, loaded with dlopen. What a build without the CPU backend (no LLVM/Clang: the GPU
// machines) uses for host code made at run time: the fp64 reference's user expressions
// (tuner/variant_functions.hpp).
//
// The compiler: $FLASHJIT_HOST_CXX alone when set; else the compiler this build was made with,
// $CXX, then `c++` (a name without '/' is looked up on PATH); the first that runs (`--version`)
// is used. It runs as `<compiler> -O2 -shared -fPIC -std=c++17 -x c++ - -o <temp file>` with the
// source on its stdin and LC_ALL=C (through env(1)), started by posix_spawn with an argument
// vector (no shell: the source is only ever data). The library is named by a hash of the source,
// the compiler's identity (its path and `--version` line) and the flags; it is written to a
// temporary file in the cache folder and renamed into place, so a process never loads a partial
// library and concurrent processes compiling the same source are harmless. A later process (or a
// fresh cache) loads the file without compiling.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "generator/error.hpp"

namespace flashjit {

struct HostCompileOptions {
  std::vector<std::string> compilers;  // tried in order; empty: host_compilers()
  std::filesystem::path cache_dir;     // empty: BinaryCache::default_dir() / "host"
  double timeout_seconds = 300;        // of one compile
};

// The compilers tried by default (see above), in order.
std::vector<std::string> host_compilers();

// One loaded shared object; dlclose'd when this is destroyed.
class HostLibrary {
 public:
  // The shared object of `source` from the cache folder, compiled first when it is not there.
  // Errors: CompileFailed with the compiler's log ("<stdin>:LINE:COL: error: ...", the source's
  // own line numbers) and the compiler's name; Unsupported naming every compiler tried when none
  // runs; IoError when the cache folder cannot be written or the library cannot be loaded.
  static Result<std::unique_ptr<HostLibrary>> build(const std::string& source,
                                                    const HostCompileOptions& options = {});
  ~HostLibrary();
  HostLibrary(const HostLibrary&) = delete;
  HostLibrary& operator=(const HostLibrary&) = delete;

  // The address of an extern "C" symbol; error NotFound.
  Result<void*> lookup(const std::string& symbol) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  HostLibrary(void* handle, std::filesystem::path path);
  void* handle_;
  std::filesystem::path path_;
};

// How many compiles (not `--version` probes) this process has run: tests see a cache hit.
size_t host_compiles();

}  // namespace flashjit
