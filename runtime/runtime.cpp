// Runtime: render -> disk cache or compile -> load, with loaded kernels kept in memory.
#include "runtime/runtime.hpp"

#include <utility>

#include "runtime/cuda/cuda_backend.hpp"

namespace flashjit {
namespace {

// Everything that selects a distinct compiled kernel; launch-time fields (sizes, strides) are not
// part of it.
std::string kernel_map_key(const AttentionProblem& problem, const AttentionConfig& config) {
  // Built by appending: gcc 12 warns falsely (-Wrestrict) on "literal" + std::string&&.
  std::string key = "d";
  key += std::to_string(problem.head_dim);
  key += "-";
  key += to_string(problem.dtype);
  key += problem.causal ? "-causal-" : "-noncausal-";
  key += config.to_string();
  return key;
}

}  // namespace

Result<std::shared_ptr<Kernel>> build_kernel(const Backend& backend, const BinaryCache* cache,
                                             const AttentionProblem& problem,
                                             const AttentionConfig& config) {
  Result<KernelSource> source = backend.render(problem, config);
  if (!source.ok()) return source.error();
  const ProblemSignature signature = ProblemSignature::of(problem);

  // The key needs no generator version: any template change already changes the source text.
  std::string key;
  if (cache != nullptr) {
    key = BinaryCache::key(source->text, backend.compiler_fingerprint(), /*options=*/"");
    if (std::optional<std::vector<char>> cached = cache->get(key)) {
      Binary binary;
      binary.bytes = std::move(*cached);
      binary.from_cache = true;
      Result<std::shared_ptr<Kernel>> kernel =
          backend.load(binary, source.value(), signature, config);
      if (kernel.ok()) return kernel;
      // An entry the driver rejects (e.g. written by a broken build) is treated as a miss:
      // recompile below and overwrite it.
    }
  }

  Result<Binary> binary = backend.compile(source.value());
  if (!binary.ok()) return binary.error();
  if (cache != nullptr) {
    // Not fatal: the kernel works without the cache entry (read-only or full disk).
    Status stored = cache->put(key, binary->bytes);
    (void)stored;
  }
  return backend.load(binary.value(), source.value(), signature, config);
}

Result<std::unique_ptr<Runtime>> Runtime::create(const RuntimeOptions& options) {
  Result<std::unique_ptr<cuda::CudaBackend>> backend = cuda::CudaBackend::create(options.device);
  if (!backend.ok()) return backend.error();
  return std::make_unique<Runtime>(std::unique_ptr<Backend>(std::move(backend.value())), options);
}

Runtime::Runtime(std::unique_ptr<Backend> backend, const RuntimeOptions& options)
    : backend_(std::move(backend)) {
  if (options.use_disk_cache) {
    cache_.emplace(options.cache_dir.value_or(BinaryCache::default_dir()));
  }
}

Result<std::shared_ptr<Kernel>> Runtime::attention(const AttentionProblem& problem) {
  FLASHJIT_TRY(validate(problem));
  Result<AttentionConfig> config = default_config(problem, backend_->device());
  if (!config.ok()) return config.error();
  return attention(problem, config.value());
}

Result<std::shared_ptr<Kernel>> Runtime::attention(const AttentionProblem& problem,
                                                   const AttentionConfig& config) {
  FLASHJIT_TRY(validate(problem));
  const Status legal = check_config(config, problem, backend_->device());
  if (!legal.ok()) return make_error(ErrorCode::InvalidArgument, legal.error().message);

  const std::string key = kernel_map_key(problem, config);
  // Held across the build: concurrent requests for one kernel compile it once. Requests for
  // different kernels wait on each other; acceptable while compiles are rare (once per process).
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto found = kernels_.find(key); found != kernels_.end()) return found->second;
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(*backend_, cache_ ? &*cache_ : nullptr, problem, config);
  if (!kernel.ok()) return kernel.error();
  kernels_.emplace(key, kernel.value());
  return kernel;
}

}  // namespace flashjit
