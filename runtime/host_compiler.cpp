#include "runtime/host_compiler.hpp"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <utility>

#include "runtime/binary_cache.hpp"
#include "runtime/subprocess.hpp"

#ifndef FLASHJIT_HOST_CXX
#define FLASHJIT_HOST_CXX ""
#endif

namespace flashjit {
namespace {

const std::vector<std::string> kFlags = {"-O2", "-shared", "-fPIC", "-std=c++17",
                                         "-fdiagnostics-color=never"};
std::atomic<size_t> compiles{0};

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

bool executable_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

// `name` as a path: itself when it has a '/', else the first executable of that name on PATH.
std::optional<std::string> resolve(const std::string& name) {
  if (name.find('/') != std::string::npos)
    return executable_file(name) ? std::optional<std::string>(name) : std::nullopt;
  const std::string path = env("PATH") ? env("PATH") : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = end > start ? path.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + name;
    if (executable_file(candidate)) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// A compiler's identity for the cache key: its path and `--version` line; cached per path.
Result<std::string> identity(const std::string& path) {
  static std::mutex mutex;
  static auto* known = new std::map<std::string, std::string>();
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = known->find(path);
    if (found != known->end()) return found->second;
  }
  Result<ProcessResult> ran = run_process({path, "--version"}, "", 60);
  if (!ran.ok()) return ran.error();
  if (!ran->exited_ok())
    return make_error(ErrorCode::Unsupported,
                      path + " --version: " + ran->how_it_ended(60) + ": " + first_line(ran->err));
  const std::string id = path + " " + first_line(ran->out);
  std::lock_guard<std::mutex> lock(mutex);
  known->emplace(path, id);
  return id;
}

// Unique per process and call: concurrent writers never share a temporary file.
std::string temporary_suffix() {
  static std::atomic<unsigned long long> counter{0};
  return "." + std::to_string(static_cast<long long>(::getpid())) + "." +
         std::to_string(counter.fetch_add(1)) + ".tmp";
}

void* open_library(const std::filesystem::path& path, std::string& error) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* message = ::dlerror();
    error = message != nullptr ? message : "dlopen failed";
  }
  return handle;
}

// Compiles `source` with `compiler` into `target` (a temporary file renamed into place).
Status compile(const std::string& source, const std::string& compiler,
               const std::filesystem::path& target, double timeout_seconds) {
  const std::filesystem::path temporary = target.string() + temporary_suffix();
  // Its messages in English ("error:", what explain_variant_compile_error looks for): through
  // env(1) with LC_ALL=C where there is one, still an argument vector.
  std::vector<std::string> argv;
  if (executable_file("/usr/bin/env")) argv = {"/usr/bin/env", "LC_ALL=C"};
  argv.push_back(compiler);
  argv.insert(argv.end(), kFlags.begin(), kFlags.end());
  argv.insert(argv.end(), {"-x", "c++", "-", "-o", temporary.string()});
  compiles.fetch_add(1);
  Result<ProcessResult> ran = run_process(argv, source, timeout_seconds);
  std::error_code ignored;
  if (!ran.ok()) return ran.error();
  if (!ran->exited_ok()) {
    std::filesystem::remove(temporary, ignored);
    // The log first: its first line naming an error is the one explained to the user.
    return make_error(ErrorCode::CompileFailed, ran->err + ran->out + "(the host C++ compiler " +
                                                    compiler + ": " +
                                                    ran->how_it_ended(timeout_seconds) + ")");
  }
  std::error_code renamed;
  std::filesystem::rename(temporary, target, renamed);
  if (renamed) {
    std::filesystem::remove(temporary, ignored);
    return make_error(ErrorCode::IoError, "cannot rename " + temporary.string() + " to " +
                                              target.string() + ": " + renamed.message());
  }
  return Status();
}

}  // namespace

std::vector<std::string> host_compilers() {
  if (const char* chosen = env("FLASHJIT_HOST_CXX")) return {chosen};
  std::vector<std::string> out;
  for (const char* name : {FLASHJIT_HOST_CXX, env("CXX"), "c++"}) {
    if (name == nullptr || name[0] == '\0') continue;
    bool seen = false;
    for (const std::string& other : out) seen = seen || other == name;
    if (!seen) out.push_back(name);
  }
  return out;
}

size_t host_compiles() { return compiles.load(); }

HostLibrary::HostLibrary(void* handle, std::filesystem::path path)
    : handle_(handle), path_(std::move(path)) {}

HostLibrary::~HostLibrary() { ::dlclose(handle_); }

Result<void*> HostLibrary::lookup(const std::string& symbol) const {
  void* address = ::dlsym(handle_, symbol.c_str());
  if (address == nullptr)
    return make_error(ErrorCode::NotFound, "symbol " + symbol + " not in " + path_.string());
  return address;
}

Result<std::unique_ptr<HostLibrary>> HostLibrary::build(const std::string& source,
                                                        const HostCompileOptions& options) {
  const std::vector<std::string> candidates =
      options.compilers.empty() ? host_compilers() : options.compilers;
  std::string compiler, id, tried;
  for (const std::string& name : candidates) {
    const std::optional<std::string> path = resolve(name);
    Result<std::string> named =
        path ? identity(*path) : Result<std::string>(make_error(ErrorCode::NotFound, "not found"));
    if (named.ok()) {
      compiler = *path;
      id = *named;
      break;
    }
    tried += (tried.empty() ? "" : "; ") + name + " (" + named.error().message + ")";
  }
  if (compiler.empty())
    return make_error(ErrorCode::Unsupported, "no host C++ compiler runs: tried " +
                                                  (tried.empty() ? std::string("none") : tried) +
                                                  "; set FLASHJIT_HOST_CXX to a C++ compiler");
  std::string flags;
  for (const std::string& flag : kFlags) flags += flag + " ";
  const std::filesystem::path dir =
      options.cache_dir.empty() ? BinaryCache::default_dir() / "host" : options.cache_dir;
  std::error_code made;
  std::filesystem::create_directories(dir, made);
  if (made)
    return make_error(ErrorCode::IoError,
                      "cannot create the cache folder " + dir.string() + ": " + made.message());
  const std::filesystem::path target = dir / (BinaryCache::key(source, id, flags) + ".so");
  std::string error;
  void* handle = nullptr;
  if (std::filesystem::exists(target)) handle = open_library(target, error);
  if (handle == nullptr) {  // not there, or not loadable (then compiled again and replaced)
    Status compiled = compile(source, compiler, target, options.timeout_seconds);
    if (!compiled.ok()) return compiled.error();
    handle = open_library(target, error);
    if (handle == nullptr)
      return make_error(ErrorCode::IoError, "cannot load " + target.string() + ": " + error);
  }
  return std::unique_ptr<HostLibrary>(new HostLibrary(handle, target));
}

}  // namespace flashjit
