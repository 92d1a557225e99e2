// Runtime: config selection (tuning DBs -> default), render -> disk cache or compile -> load, with
// selections and loaded kernels kept in memory.
#include "runtime/runtime.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <system_error>
#include <utility>

#include "generator/variant.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.hpp"
#endif
#if FLASHJIT_HAVE_HIP_BACKEND
#include "runtime/hip/hip_backend.hpp"
#endif

namespace flashjit {
namespace {

// Everything that selects a distinct compiled kernel; launch-time fields (sizes, strides) are not
// part of it.
std::string kernel_map_key(const AttentionProblem& problem, const AttentionConfig& config) {
  // Built by appending: gcc 12 warns falsely (-Wrestrict) on "literal" + std::string&&.
  std::string key = ProblemSignature::of(problem).to_string();
  key += " ";
  key += config.to_string();
  return key;
}

// Set while this thread runs the tune hook: a nested attention(problem) does not tune again.
thread_local bool t_in_tune_hook = false;

struct InTuneHook {
  InTuneHook() { t_in_tune_hook = true; }
  ~InTuneHook() { t_in_tune_hook = false; }
  InTuneHook(const InTuneHook&) = delete;
  InTuneHook& operator=(const InTuneHook&) = delete;
};

bool disabled_db(const std::filesystem::path& path) { return path.empty() || path == "none"; }

// `paths` with each folder replaced by its *.db files, in name order.
std::vector<std::filesystem::path> expand_folders(const std::vector<std::filesystem::path>& paths) {
  std::vector<std::filesystem::path> files;
  for (const std::filesystem::path& path : paths) {
    std::error_code ec;
    if (!std::filesystem::is_directory(path, ec)) {
      files.push_back(path);
      continue;
    }
    std::vector<std::filesystem::path> found;
    for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
      if (entry.path().extension() == ".db") found.push_back(entry.path());
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

std::string db_label(const char* which, const TuningStore& store) {
  std::string label = which;
  label += " DB ";
  label += store.path().string();
  return label;
}

}  // namespace

std::optional<std::filesystem::path> default_user_db() {
  if (const char* env = std::getenv("FLASHJIT_DB")) {
    const std::filesystem::path path(env);
    if (disabled_db(path)) return std::nullopt;
    return path;
  }
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::filesystem::path(xdg) / "flashjit" / "tuning.db";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::filesystem::path(home) / ".local" / "share" / "flashjit" / "tuning.db";
  }
  return std::nullopt;
}

std::optional<std::filesystem::path> shipped_tuning_dir() {
#ifdef FLASHJIT_TUNING_DIR_FROM_BINARY
  // The binary holding this function: dladdr names a shared library or module by its path; for
  // the main program it gives argv[0], which may be relative: /proc/self/exe then.
  std::filesystem::path binary;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&shipped_tuning_dir), &info) != 0 &&
      info.dli_fname != nullptr && info.dli_fname[0] == '/') {
    binary = info.dli_fname;
  } else {
    std::error_code ignored;
    binary = std::filesystem::read_symlink("/proc/self/exe", ignored);
  }
  if (binary.empty()) return std::nullopt;
  const std::filesystem::path dir =
      (binary.parent_path() / FLASHJIT_TUNING_DIR_FROM_BINARY).lexically_normal();
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) return dir;
#endif
  return std::nullopt;
}

std::vector<std::filesystem::path> default_system_dbs() {
  std::vector<std::filesystem::path> paths;
  const char* env = std::getenv("FLASHJIT_SYSTEM_DB");
  if (env == nullptr) {
    if (std::optional<std::filesystem::path> shipped = shipped_tuning_dir()) {
      paths.push_back(*shipped);
    }
    return paths;
  }
  if (std::string_view(env) == "none") return paths;
  std::string part;
  for (const char* c = env;; ++c) {
    if (*c == ':' || *c == '\0') {
      if (!part.empty()) paths.emplace_back(part);
      part.clear();
      if (*c == '\0') break;
    } else {
      part += *c;
    }
  }
  return paths;
}

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' && std::string_view(value) != "0";
}

Result<std::shared_ptr<Kernel>> build_kernel(const Backend& backend, const BinaryCache* cache,
                                             const AttentionProblem& problem,
                                             const AttentionConfig& config, BuildPath* path) {
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
      if (kernel.ok()) {
        if (path != nullptr) *path = BuildPath::FromDiskCache;
        return kernel;
      }
      // An entry the driver rejects (e.g. written by a broken build) is treated as a miss:
      // recompile below and overwrite it.
    }
  }

  Result<Binary> binary = backend.compile(source.value());
  // A user score_mod / mask_mod that does not compile: the error quotes it.
  if (!binary.ok()) return explain_variant_compile_error(problem, source->text, binary.error());
  if (path != nullptr) *path = BuildPath::Compiled;
  if (cache != nullptr) {
    // Not fatal: the kernel works without the cache entry (read-only or full disk).
    Status stored = cache->put(key, binary->bytes);
    (void)stored;
  }
  return backend.load(binary.value(), source.value(), signature, config);
}

std::string default_backend_name() {
  const char* env = std::getenv("FLASHJIT_BACKEND");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("auto");
}

bool have_cpu_backend() {
#if FLASHJIT_HAVE_CPU_BACKEND
  return true;
#else
  return false;
#endif
}

bool have_hip_backend() {
#if FLASHJIT_HAVE_HIP_BACKEND
  return true;
#else
  return false;
#endif
}

int gpu_device_count(const std::string& backend) {
  if (backend == "cuda") return cuda::device_count();
#if FLASHJIT_HAVE_HIP_BACKEND
  if (backend == "hip") return hip::device_count();
#endif
  return 0;
}

Result<std::string> resolve_backend(const std::string& name) {
  if (name == "cuda") return name;
  if (name == "hip") {
    if (!have_hip_backend()) {
      return make_error(ErrorCode::Unsupported,
                        "backend = hip: built without the HIP backend (ROCm headers not found)");
    }
    return name;
  }
  if (name == "cpu") {
    if (!have_cpu_backend()) {
      return make_error(ErrorCode::Unsupported,
                        "backend = cpu: built without the CPU backend (LLVM/Clang 14 not found)");
    }
    return name;
  }
  if (name != "auto") {
    return make_error(ErrorCode::InvalidArgument,
                      "backend = '" + name + "': must be one of auto, cuda, hip, cpu");
  }
  if (cuda::device_count() > 0) return std::string("cuda");
#if FLASHJIT_HAVE_HIP_BACKEND
  // Only an AMD GPU the HIP template supports: on any other (RDNA, MI100) auto goes on to the CPU.
  if (hip::device_count() > 0) {
    Result<DeviceSpec> amd = hip::query_device(0);
    if (amd.ok() && hip::supported_processor(gcn_processor(amd->gcn_arch))) {
      return std::string("hip");
    }
  }
#endif
  if (have_cpu_backend()) return std::string("cpu");
  Result<DeviceSpec> device = cuda::query_device(0);
  return make_error(ErrorCode::NoDevice,
                    "no CUDA device (" +
                        (device.ok() ? std::string("none found") : device.error().message) + ")" +
                        (have_hip_backend() ? ", no AMD GPU" : "") +
                        " and built without the CPU backend (LLVM/Clang 14 not found)");
}

Result<std::unique_ptr<Backend>> create_backend(const std::string& name, int device) {
  Result<std::string> resolved = resolve_backend(name);
  if (!resolved.ok()) return resolved.error();
#if FLASHJIT_HAVE_CPU_BACKEND
  if (*resolved == "cpu") {
    Result<std::unique_ptr<cpu::CpuBackend>> backend = cpu::CpuBackend::create();
    if (!backend.ok()) return backend.error();
    return std::unique_ptr<Backend>(std::move(backend.value()));
  }
#endif
#if FLASHJIT_HAVE_HIP_BACKEND
  if (*resolved == "hip") {
    Result<std::unique_ptr<hip::HipBackend>> backend = hip::HipBackend::create(device);
    if (!backend.ok()) return backend.error();
    return std::unique_ptr<Backend>(std::move(backend.value()));
  }
#endif
  Result<std::unique_ptr<cuda::CudaBackend>> backend = cuda::CudaBackend::create(device);
  if (!backend.ok()) return backend.error();
  return std::unique_ptr<Backend>(std::move(backend.value()));
}

Result<std::unique_ptr<Runtime>> Runtime::create(const RuntimeOptions& options) {
  Result<std::unique_ptr<Backend>> backend = create_backend(options.backend, options.device);
  if (!backend.ok()) return backend.error();
  return std::make_unique<Runtime>(std::move(backend.value()), options);
}

Runtime::Runtime(std::unique_ptr<Backend> backend, const RuntimeOptions& options)
    : backend_(std::move(backend)), options_(options), fingerprint_(backend_->fingerprint()) {
  if (options.use_disk_cache) {
    cache_.emplace(options.cache_dir.value_or(BinaryCache::default_dir()));
  }
  // Tuning DBs: a DB that cannot be opened is logged and skipped, never an error.
  std::optional<std::filesystem::path> user_db =
      options.user_db.has_value() ? options.user_db : default_user_db();
  if (user_db && !disabled_db(*user_db)) {
    std::error_code ignored;
    if (user_db->has_parent_path())
      std::filesystem::create_directories(user_db->parent_path(), ignored);
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(*user_db);
    if (store.ok()) {
      user_store_ = std::move(store.value());
    } else {
      log("user tuning DB not used: " + store.error().describe());
    }
  }
  for (const std::filesystem::path& path : expand_folders(options.system_dbs)) {
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open_read_only(path);
    if (store.ok()) {
      system_stores_.push_back(std::move(store.value()));
    } else {
      log("system tuning DB not used: " + store.error().describe());
    }
  }
}

Runtime::~Runtime() = default;

void Runtime::log(const std::string& line) const {
  if (!options_.log) return;
  std::string text = "flashjit: ";
  text += line;
  text += "\n";
  std::fputs(text.c_str(), stderr);  // one call: lines of concurrent threads do not interleave
}

void Runtime::set_tune_hook(TuneHook hook) {
  std::lock_guard<std::mutex> lock(hook_mutex_);
  tune_hook_ = std::move(hook);
}

Result<Runtime::Selection> Runtime::select(const AttentionProblem& problem, bool allow_tune) {
  const ProblemKey key = ProblemKey::of(problem);
  // A config from a DB is served only if it is legal for this problem on this device.
  auto legal = [&](const AttentionConfig& config, const std::string& where) {
    Status status = backend_->check_config(config, problem);
    if (!status.ok()) {
      log(config.to_string() + " from " + where + " ignored: " + status.error().message);
    }
    return status.ok();
  };
  auto exact = [&](const TuningStore& store, const char* which) -> std::optional<Selection> {
    Result<std::optional<TuneChoice>> choice = store.choice(fingerprint_, key);
    if (!choice.ok()) {
      log("lookup failed: " + choice.error().describe());
      return std::nullopt;
    }
    if (!choice->has_value()) return std::nullopt;
    const std::string where = db_label(which, store);
    if (!legal((*choice)->config, where)) return std::nullopt;
    return Selection{(*choice)->config, ChoiceSource::Exact, "exact, " + where};
  };
  auto nearest = [&](const TuningStore& store, const char* which) -> std::optional<Selection> {
    Result<std::optional<std::pair<ProblemKey, TuneChoice>>> found =
        store.nearest_choice(fingerprint_, key);
    if (!found.ok()) {
      log("lookup failed: " + found.error().describe());
      return std::nullopt;
    }
    if (!found->has_value()) return std::nullopt;
    const std::string where = db_label(which, store);
    if (!legal((*found)->second.config, where)) return std::nullopt;
    std::string detail = "nearest ";
    detail += (*found)->first.to_string();
    detail += ", ";
    detail += where;
    return Selection{(*found)->second.config, ChoiceSource::NearestBucket, std::move(detail)};
  };

  if (user_store_) {
    if (std::optional<Selection> found = exact(*user_store_, "user")) return *found;
  }
  for (const std::unique_ptr<TuningStore>& store : system_stores_) {
    if (std::optional<Selection> found = exact(*store, "system")) return *found;
  }

  if (allow_tune && options_.tune_on_miss && !t_in_tune_hook) {
    TuneHook hook;
    {
      std::lock_guard<std::mutex> lock(hook_mutex_);
      hook = tune_hook_;
    }
    if (hook) {
      std::lock_guard<std::mutex> tune_lock(tune_mutex_);
      // Another thread may have tuned this key while this one waited.
      if (user_store_) {
        if (std::optional<Selection> found = exact(*user_store_, "user")) return *found;
      }
      log("tuning " + key.to_string() + " (" + problem.to_string() + ")");
      Result<AttentionConfig> tuned = [&] {
        InTuneHook in_hook;
        return hook(*this, problem);
      }();
      if (!tuned.ok()) {
        log("tuning " + key.to_string() + " failed: " + tuned.error().describe());
      } else if (legal(tuned.value(), "the tune hook")) {
        return Selection{tuned.value(), ChoiceSource::Exact, "tuned now"};
      }
    }
  }

  if (user_store_) {
    if (std::optional<Selection> found = nearest(*user_store_, "user")) return *found;
  }
  for (const std::unique_ptr<TuningStore>& store : system_stores_) {
    if (std::optional<Selection> found = nearest(*store, "system")) return *found;
  }

  Result<AttentionConfig> config = backend_->default_config(problem);
  if (!config.ok()) return config.error();
  return Selection{config.value(), ChoiceSource::Default, "default"};
}

Result<std::pair<AttentionConfig, ChoiceSource>> Runtime::select_config(
    const AttentionProblem& problem) {
  FLASHJIT_TRY(backend_->check_problem(problem));
  Result<Selection> selection = select(problem, /*allow_tune=*/false);
  if (!selection.ok()) return selection.error();
  return std::make_pair(selection->config, selection->source);
}

Result<std::shared_ptr<Kernel>> Runtime::attention(const AttentionProblem& problem) {
  FLASHJIT_TRY(backend_->check_problem(problem));
  const ProblemKey key = ProblemKey::of(problem);
  const std::string map_key = key.to_string();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto found = selected_.find(map_key); found != selected_.end()) return found->second;
  }
  // Not under mutex_: DB lookups and the tune hook may take long (the hook builds kernels).
  Result<Selection> selection = select(problem, /*allow_tune=*/true);
  if (!selection.ok()) return selection.error();
  Result<std::shared_ptr<Kernel>> kernel = attention(problem, selection->config);
  if (!kernel.ok() && selection->source != ChoiceSource::Default) {
    log(selection->config.to_string() + " (" + selection->detail +
        ") failed to build, using the default: " + kernel.error().describe());
    Result<AttentionConfig> fallback = backend_->default_config(problem);
    if (!fallback.ok()) return kernel.error();
    selection = Selection{fallback.value(), ChoiceSource::Default, "default"};
    kernel = attention(problem, fallback.value());
  }
  if (!kernel.ok()) return kernel.error();
  log(map_key + " -> " + selection->config.to_string() + " (" + selection->detail + ")");
  // Inside the tune hook the key is being tuned: this answer is provisional, keep nothing.
  if (t_in_tune_hook) return kernel;

  if (options_.record_misses && user_store_ && selection->source != ChoiceSource::Exact) {
    Status recorded = user_store_->record_miss(fingerprint_, problem);
    if (!recorded.ok()) log("recording an untuned problem failed: " + recorded.error().describe());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // A concurrent call may have selected the same key first; both got the same kind of answer.
  return selected_.emplace(map_key, kernel.value()).first->second;
}

Result<std::shared_ptr<Kernel>> Runtime::attention(const AttentionProblem& problem,
                                                   const AttentionConfig& config) {
  FLASHJIT_TRY(backend_->check_problem(problem));
  const Status legal = backend_->check_config(config, problem);
  if (!legal.ok()) return make_error(ErrorCode::InvalidArgument, legal.error().message);

  const std::string key = kernel_map_key(problem, config);
  // Held across the build: concurrent requests for one kernel compile it once. Requests for
  // different kernels wait on each other; acceptable while compiles are rare (once per process).
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto found = kernels_.find(key); found != kernels_.end()) return found->second;
  BuildPath path = BuildPath::Compiled;
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(*backend_, cache_ ? &*cache_ : nullptr, problem, config, &path);
  if (!kernel.ok()) return kernel.error();
  ++(path == BuildPath::Compiled ? stats_.compiles : stats_.disk_cache_loads);
  log(key + (path == BuildPath::Compiled ? ": compiled (" + backend_->name() + ")"
                                         : std::string(": loaded from the binary cache")));
  kernels_.emplace(key, kernel.value());
  return kernel;
}

}  // namespace flashjit
