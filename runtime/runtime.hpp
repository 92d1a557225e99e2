// The public entry point: a Runtime serves ready attention kernels.
//
//   auto runtime = flashjit::Runtime::create();            // picks the CUDA device 0
//   auto problem = flashjit::AttentionProblem::make(2, 16, 16, 4096, 4096, 128,
//                                                   flashjit::DType::BF16, /*causal=*/true);
//   auto kernel = (*runtime)->attention(problem);          // compiled or loaded from the cache
//   (*kernel)->launch(problem, {q, k, v, o, lse}, stream);
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "generator/config.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "runtime/binary_cache.hpp"

namespace flashjit {

struct RuntimeOptions {
  int device = 0;                                  // CUDA device ordinal
  std::optional<std::filesystem::path> cache_dir;  // default: BinaryCache::default_dir()
  bool use_disk_cache = true;
};

// Render -> binary cache or compile -> load, for one config.
Result<std::shared_ptr<Kernel>> build_kernel(const Backend& backend, const BinaryCache* cache,
                                             const AttentionProblem& problem,
                                             const AttentionConfig& config);

class Runtime {
 public:
  // Error NoDevice when there is no usable GPU (no driver, no device).
  static Result<std::unique_ptr<Runtime>> create(const RuntimeOptions& options = {});
  // A runtime over a given backend (tests, other backends).
  Runtime(std::unique_ptr<Backend> backend, const RuntimeOptions& options);

  const Backend& backend() const { return *backend_; }

  // The kernel for `problem` with the default (untuned) config. Thread-safe; kernels are kept
  // in memory, so a second call for the same signature costs a map lookup.
  Result<std::shared_ptr<Kernel>> attention(const AttentionProblem& problem);
  // The kernel for `problem` with a given config; error InvalidArgument if it is not legal.
  Result<std::shared_ptr<Kernel>> attention(const AttentionProblem& problem,
                                            const AttentionConfig& config);

 private:
  std::unique_ptr<Backend> backend_;
  std::optional<BinaryCache> cache_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Kernel>> kernels_;  // key: signature + config
};

}  // namespace flashjit
