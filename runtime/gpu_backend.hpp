// The host skeleton the GPU backends share (CUDA: runtime/cuda/cuda_backend.cpp, HIP:
// runtime/hip/hip_backend.cpp): copies, fills, synchronization and event timing around the
// device's current context; loading a module with each entry's resources checked against its
// shape; and the loaded kernel, which launches its entries through gpu_launch.hpp and
// decode_launch.hpp. What differs between the two APIs is a small device class `Gpu`
// (cuda::CudaGpu, hip::HipGpu) with:
//
//   using Module, Function, Event                  the API's handles
//   static constexpr const char* kApi, kMemory     "CUDA", "shared memory" (for messages)
//   static constexpr GridLimits kGridLimits
//   static int decode_splits(config, problem, spec)        the decode family's splits
//   static render(problem, config); compile(source, spec) const    the backend's generator,
//   compiler Result<Gpu> retain() const                     a handle of its own (CUDA: a context
//   reference) Status make_current() const                    on the calling thread
//   Result<DeviceBuffer> allocate(bytes) const     on the device, freed by the buffer
//   Status copy_to_device / copy_to_host / fill_bytes / synchronize (current, bytes > 0)
//   Status stream_synchronize(stream) / zero_async(pointer, bytes, stream)
//   Status create_event(Event*) / record_event(Event) / wait_event(Event)
//   Status elapsed_ms(float*, Event start, Event stop); void destroy_event(Event)
//   Status load_module(Module*, bytes) / get_function(Function*, Module, name)
//   Status prepare_function(Function, smem bytes)  (CUDA: the dynamic shared memory opt-in)
//   Status function_attributes(Function, KernelInfo*, int* max_threads)
//   Status launch(Function, const LaunchShape&, void** args, stream)
//   void unload_module(Module)                     (errors ignored: called from destructors)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "generator/decode_config.hpp"
#include "runtime/backend.hpp"
#include "runtime/decode_launch.hpp"
#include "runtime/gpu_launch.hpp"
#include "runtime/launch_params.hpp"
#include "runtime/workspace.hpp"
#include "templates/attention_params.h"

namespace flashjit {

// Error NoDevice unless `ordinal` names one of `count` devices of `api` ("CUDA"); `none`: what
// to say when there is none ("no CUDA device present").
inline Status check_device_ordinal(int ordinal, int count, const char* api, const char* none) {
  if (ordinal >= 0 && ordinal < count) return ok_status();
  return make_error(
      ErrorCode::NoDevice,
      std::string(api) + " device ordinal " + std::to_string(ordinal) + " out of range: " +
          (count == 0
               ? std::string(none)
               : std::to_string(count) + " device(s), valid 0.." + std::to_string(count - 1)));
}

// A module loaded for one kernel: on its own handle to the device (`gpu`), its entries'
// functions in order, and the main entry's resources (the forward's, the backward's dK/dV).
template <class Gpu>
struct LoadedModule {
  Gpu gpu;
  typename Gpu::Module module{};
  std::vector<typename Gpu::Function> functions;
  KernelInfo info;
};

// The kernels of one module: one for the forward and for decode, three for the backward
// (render.hpp and render_decode.hpp name and shape them). Thread-safe to launch: the only mutable
// state is the workspace cache (the backward's, decode's partials). A backend derives from it for
// what its launches add (CUDA: tensor maps, the decode table check).
template <class Gpu>
class GpuKernel : public Kernel {
 public:
  GpuKernel(LoadedModule<Gpu> loaded, std::vector<KernelShape> shapes, ProblemSignature signature,
            AttentionConfig config, DeviceSpec device)
      : gpu_(std::move(loaded.gpu)),
        module_(loaded.module),
        functions_(std::move(loaded.functions)),
        info_(loaded.info),
        shapes_(std::move(shapes)),
        signature_(std::move(signature)),
        config_(config),
        device_(std::move(device)),
        workspace_([this](size_t bytes) { return gpu_.allocate(bytes); },
                   [this](void* stream) -> Status { return gpu_.stream_synchronize(stream); }) {}
  ~GpuKernel() override { gpu_.unload_module(module_); }
  GpuKernel(const GpuKernel&) = delete;
  GpuKernel& operator=(const GpuKernel&) = delete;

  const ProblemSignature& signature() const override { return signature_; }
  const AttentionConfig& config() const override { return config_; }
  const KernelInfo& info() const override { return info_; }

  size_t workspace_bytes(const AttentionProblem& problem) const override {
    if (config_.family == KernelFamily::Decode)
      return gpu_decode_workspace(problem, config_, Gpu::decode_splits(config_, problem, device_))
          .bytes;
    return backward_workspace(problem, config_).bytes;
  }

  // The entries in order on `stream` (gpu_launch.hpp: checks, grids, the backward's workspace;
  // decode_launch.hpp for the decode family, its split counters zeroed on the stream).
  Status launch(const AttentionProblem& problem, const AttentionArgs& args,
                void* stream) const override {
    LaunchState state;
    auto enqueue_entry = [&](size_t entry, const LaunchShape& shape,
                             FlashjitAttentionParams& params) -> Status {
      return enqueue(problem, args, entry, shape, params, stream, state);
    };
    if (config_.family == KernelFamily::Decode) {
      return launch_gpu_decode(
          problem, args, signature_, config_, Gpu::decode_splits(config_, problem, device_),
          shapes_, Gpu::kGridLimits, workspace_, stream, enqueue_entry,
          [&](void* counters, size_t bytes) -> Status {
            return gpu_.zero_async(counters, bytes, stream);
          },
          [&]() -> Status { return before_decode(problem, args, stream); });
    }
    return launch_gpu_kernel(problem, args, signature_, config_, shapes_, Gpu::kGridLimits,
                             workspace_, stream, enqueue_entry);
  }

 protected:
  // What the entries of one launch share (a launch's own: kernels launch from many threads).
  struct LaunchState {
    // A mask_mod's block map (CUDA), taken when the first entry that reads it is enqueued.
    FlashjitBlockMask block_mask{};
    bool have_block_mask = false;
  };
  // Enqueues entry `entry` of a launch of `problem` with `shape` on `stream`: the params only.
  virtual Status enqueue(const AttentionProblem& problem, const AttentionArgs& args, size_t entry,
                         const LaunchShape& shape, FlashjitAttentionParams& params, void* stream,
                         LaunchState& state) const {
    (void)problem, (void)args, (void)state;
    void* kernel_args[] = {&params};
    return gpu_.launch(functions_[entry], shape, kernel_args, stream);
  }
  // Runs on `stream` before a decode kernel, after the launch's checks (the table check).
  virtual Status before_decode(const AttentionProblem& problem, const AttentionArgs& args,
                               void* stream) const = 0;

  const Gpu& gpu() const { return gpu_; }
  const DeviceSpec& device() const { return device_; }
  typename Gpu::Function function(size_t entry) const { return functions_[entry]; }

 private:
  Gpu gpu_;  // declared first: released last
  typename Gpu::Module module_;
  std::vector<typename Gpu::Function> functions_;
  KernelInfo info_;
  std::vector<KernelShape> shapes_;  // per entry
  ProblemSignature signature_;
  AttentionConfig config_;
  const DeviceSpec device_;  // the decode family's auto splits need the SM / CU count
  mutable WorkspaceCache workspace_;
};

// The device-side entry points of the Backend interface on a `Gpu`, over `Base` (the Backend
// that gives the config space: CudaTemplateBackend, or a ConfigSpaceBackend).
template <class Gpu, class Base>
class GpuBackend : public Base {
 public:
  const DeviceSpec& device() const override { return device_; }

  Result<KernelSource> render(const AttentionProblem& problem,
                              const AttentionConfig& config) const override {
    return Gpu::render(problem, config);
  }
  Result<Binary> compile(const KernelSource& source) const override {
    return gpu_.compile(source, device_);
  }
  Result<std::shared_ptr<Kernel>> load(const Binary& binary, const KernelSource& source,
                                       const ProblemSignature& signature,
                                       const AttentionConfig& config) const override {
    const std::vector<KernelShape> shapes = Gpu::kernel_shapes(signature, config, device_);
    Result<LoadedModule<Gpu>> loaded = load_module(binary, source, signature, config, shapes);
    if (!loaded.ok()) return loaded.error();
    return make_kernel(std::move(loaded.value()), shapes, signature, config, source);
  }

  Result<DeviceBuffer> allocate(size_t bytes) const override { return gpu_.allocate(bytes); }
  Status copy_to_device(void* dst, const void* src, size_t bytes) const override {
    if (bytes == 0) return ok_status();
    FLASHJIT_TRY(gpu_.make_current());
    return gpu_.copy_to_device(dst, src, bytes);
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) const override {
    if (bytes == 0) return ok_status();
    FLASHJIT_TRY(gpu_.make_current());
    return gpu_.copy_to_host(dst, src, bytes);
  }
  Status fill_bytes(void* dst, uint8_t value, size_t bytes) const override {
    if (bytes == 0) return ok_status();
    FLASHJIT_TRY(gpu_.make_current());
    return gpu_.fill_bytes(dst, value, bytes);
  }
  // Errors of earlier asynchronous launches surface here.
  Status synchronize() const override {
    FLASHJIT_TRY(gpu_.make_current());
    return gpu_.synchronize();
  }
  Result<double> time_ms(const std::function<Status()>& work, int repetitions) const override {
    if (repetitions < 1) {
      return make_error(ErrorCode::InvalidArgument,
                        "repetitions = " + std::to_string(repetitions) + ": must be at least 1");
    }
    FLASHJIT_TRY(gpu_.make_current());
    EventPair events(gpu_);
    FLASHJIT_TRY(gpu_.create_event(&events.start));
    FLASHJIT_TRY(gpu_.create_event(&events.stop));
    FLASHJIT_TRY(gpu_.record_event(events.start));
    for (int i = 0; i < repetitions; ++i) FLASHJIT_TRY(work());
    FLASHJIT_TRY(gpu_.record_event(events.stop));
    FLASHJIT_TRY(gpu_.wait_event(events.stop));
    float elapsed_ms = 0;
    FLASHJIT_TRY(gpu_.elapsed_ms(&elapsed_ms, events.start, events.stop));
    return static_cast<double>(elapsed_ms) / repetitions;
  }

 protected:
  // `base`: the arguments of Base's constructor (a ConfigSpaceBackend's space).
  template <class... BaseArgs>
  GpuBackend(Gpu gpu, DeviceSpec device, BaseArgs&&... base)
      : Base(std::forward<BaseArgs>(base)...), gpu_(std::move(gpu)), device_(std::move(device)) {}

  // The backend's kernel (a GpuKernel) of a loaded module.
  virtual std::shared_ptr<Kernel> make_kernel(LoadedModule<Gpu> loaded,
                                              std::vector<KernelShape> shapes,
                                              const ProblemSignature& signature,
                                              const AttentionConfig& config,
                                              const KernelSource& source) const = 0;

  // `binary`'s module on a handle of its own, after checking `source`'s entry count and that
  // each entry's `shapes` fit the device; each entry's function prepared for its dynamic memory
  // and its resources read (error Unsupported when its registers leave fewer threads per block
  // than the shape needs).
  Result<LoadedModule<Gpu>> load_module(const Binary& binary, const KernelSource& source,
                                        const ProblemSignature& signature,
                                        const AttentionConfig& config,
                                        const std::vector<KernelShape>& shapes) const {
    if (binary.bytes.empty()) {
      return make_error(ErrorCode::InvalidArgument,
                        "empty binary for '" + source.label + "': nothing to load");
    }
    if (config.family == KernelFamily::Decode) {
      if (source.entries.size() != 1)
        return make_error(ErrorCode::InvalidArgument,
                          "'" + source.label + "' defines " +
                              std::to_string(source.entries.size()) + " entry points; a " +
                              Gpu::kApi + " decode kernel has 1 (split, which combines)");
    } else {
      FLASHJIT_TRY(check_entry_count(source, signature.pass));
    }
    for (const KernelShape& shape : shapes) {
      if (shape.smem_bytes > device_.smem_per_block_optin) {
        return make_error(ErrorCode::InvalidArgument,
                          "config " + config.to_string() + " needs " +
                              std::to_string(shape.smem_bytes) + " bytes of " + Gpu::kMemory +
                              " for " + signature.to_string() + "; " + device_.name +
                              " allows at most " + std::to_string(device_.smem_per_block_optin));
      }
    }
    FLASHJIT_TRY(gpu_.make_current());
    Result<Gpu> own = gpu_.retain();
    if (!own.ok()) return own.error();
    LoadedModule<Gpu> loaded{std::move(own.value()), {}, {}, {}};
    FLASHJIT_TRY(loaded.gpu.load_module(&loaded.module, binary.bytes.data()));
    // Unloads the module on every error path below.
    auto fail = [&](const Status& status) -> Error {
      loaded.gpu.unload_module(loaded.module);
      return status.error();
    };
    const size_t main_entry = signature.pass == Pass::Backward ? 1 : 0;
    for (size_t e = 0; e < source.entries.size(); ++e) {
      const std::string& entry = source.entries[e];
      typename Gpu::Function function{};
      Status status = loaded.gpu.get_function(&function, loaded.module, entry.c_str());
      if (status.ok()) status = loaded.gpu.prepare_function(function, shapes[e].smem_bytes);
      if (!status.ok()) {
        return fail(
            make_error(status.error().code, status.error().message + " (entry '" + entry + "')"));
      }
      KernelInfo entry_info;
      entry_info.dynamic_smem_bytes = shapes[e].smem_bytes;
      entry_info.threads_per_block = shapes[e].threads;
      int max_threads = 0;
      status = loaded.gpu.function_attributes(function, &entry_info, &max_threads);
      if (!status.ok()) return fail(status);
      // Too many registers for the block size would only show up as a launch failure later.
      if (max_threads > 0 && max_threads < entry_info.threads_per_block) {
        return fail(make_error(
            ErrorCode::Unsupported,
            "'" + source.label + "' (entry '" + entry + "') uses " +
                std::to_string(entry_info.regs_per_thread) + " registers per thread, so at most " +
                std::to_string(max_threads) + " threads fit in a block; " + "config " +
                config.to_string() + " needs " + std::to_string(entry_info.threads_per_block)));
      }
      if (e == main_entry) loaded.info = entry_info;
      loaded.functions.push_back(function);
    }
    return loaded;
  }

  // The fields of a GPU's fingerprint that come from its DeviceSpec.
  DeviceFingerprint spec_fingerprint(int arch, int driver_version, std::string compiler) const {
    DeviceFingerprint fingerprint;
    fingerprint.backend = this->name();
    fingerprint.name = device_.name;
    fingerprint.arch = arch;
    fingerprint.sm_count = device_.sm_count;
    fingerprint.smem_per_block_optin = device_.smem_per_block_optin;
    fingerprint.l2_bytes = device_.l2_bytes;
    fingerprint.driver_version = driver_version;
    fingerprint.compiler = std::move(compiler);
    return fingerprint;
  }

  const Gpu& gpu() const { return gpu_; }

 private:
  // Destroys two events on every path out of time_ms.
  struct EventPair {
    explicit EventPair(const Gpu& gpu) : gpu(gpu) {}
    ~EventPair() {
      if (start != nullptr) gpu.destroy_event(start);
      if (stop != nullptr) gpu.destroy_event(stop);
    }
    EventPair(const EventPair&) = delete;
    EventPair& operator=(const EventPair&) = delete;
    const Gpu& gpu;
    typename Gpu::Event start = nullptr;
    typename Gpu::Event stop = nullptr;
  };

  Gpu gpu_;
  DeviceSpec device_;
};

}  // namespace flashjit
