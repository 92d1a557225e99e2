// flashjit._flashjit: the nanobind extension under the Python package flashjit. The public API
// and its documentation are python/flashjit/__init__.py; this module does the work.
//
// Arrays come in through DLPack (nb::ndarray: torch, cupy, jax, numpy, anything with __dlpack__
// or the buffer protocol) without copies. Arrays on the CPU run on the CPU backend, arrays on
// CUDA device n on the CUDA backend of device n; one Runtime per (backend, device) is kept for the
// life of the process. Errors are raised as flashjit.Error subclasses carrying the library's
// message (Error::message) and its code (.code).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cli/tune_command.hpp"
#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "runtime/backend.hpp"
#include "runtime/cpu/cpu_info.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/cuda/driver.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "runtime/runtime.hpp"
#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/clang_jit.hpp"
#endif

#ifndef FLASHJIT_VERSION
#define FLASHJIT_VERSION "0.1.0"
#endif

namespace nb = nanobind;

namespace flashjit::python {
namespace {

// --- errors -------------------------------------------------------------------------------------

// A library Error on its way to Python; the translator below turns it into a flashjit exception.
struct LibraryError : std::runtime_error {
  explicit LibraryError(const Error& error) : std::runtime_error(error.message), code(error.code) {}
  ErrorCode code;
};

[[noreturn]] void raise(const Error& error) { throw LibraryError(error); }
[[noreturn]] void raise(ErrorCode code, std::string message) {
  raise(make_error(code, std::move(message)));
}
void check(const Status& status) {
  if (!status.ok()) raise(status.error());
}
template <class T>
T unwrap(Result<T> result) {
  if (!result.ok()) raise(result.error());
  return std::move(result.value());
}

// The Python exception classes, created at import (see NB_MODULE below).
PyObject* g_error = nullptr;             // flashjit.Error(RuntimeError)
PyObject* g_invalid_argument = nullptr;  // flashjit.InvalidArgumentError(Error, ValueError)
PyObject* g_unsupported = nullptr;       // flashjit.UnsupportedError(Error, ValueError)
PyObject* g_no_device = nullptr;         // flashjit.NoDeviceError(Error)

PyObject* exception_type(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return g_invalid_argument;
    case ErrorCode::Unsupported:
      return g_unsupported;
    case ErrorCode::NoDevice:
      return g_no_device;
    default:
      return g_error;
  }
}

void set_python_error(const LibraryError& error) {
  PyObject* type = exception_type(error.code);
  nb::object instance = nb::steal(PyObject_CallFunction(type, "s", error.what()));
  if (!instance.is_valid()) return;  // the call set its own error
  PyObject_SetAttrString(instance.ptr(), "code", nb::str(to_string(error.code)).ptr());
  PyErr_SetObject(type, instance.ptr());
}

// --- CUDA context of the calling thread ---------------------------------------------------------

// The CUDA backend makes its device's primary context current on the calling thread (the same
// context torch and cupy use). A host framework reads "its current device" from that binding, so
// every entry point here puts back whatever context the thread had.
class CudaContextGuard {
 public:
  explicit CudaContextGuard(bool cuda) {
    if (!cuda) return;
    Result<const cuda::Driver*> loaded = cuda::driver();
    if (!loaded.ok()) return;
    driver_ = loaded.value();
    if (driver_->cuCtxGetCurrent(&saved_) != CUDA_SUCCESS) driver_ = nullptr;
  }
  ~CudaContextGuard() {
    if (driver_ != nullptr) driver_->cuCtxSetCurrent(saved_);
  }
  CudaContextGuard(const CudaContextGuard&) = delete;
  CudaContextGuard& operator=(const CudaContextGuard&) = delete;

 private:
  const cuda::Driver* driver_ = nullptr;
  CUcontext saved_ = nullptr;
};

// --- runtimes -----------------------------------------------------------------------------------

// Where arrays live and which backend runs them: ("cpu", 0) or ("cuda", ordinal).
struct Place {
  std::string backend;
  int device = 0;
  bool operator<(const Place& other) const {
    return std::tie(backend, device) < std::tie(other.backend, other.device);
  }
  bool operator==(const Place& other) const {
    return backend == other.backend && device == other.device;
  }
  bool cuda() const { return backend == "cuda"; }
  std::string to_string() const {
    return cuda() ? "cuda:" + std::to_string(device) : std::string("cpu");
  }
};

// One Runtime per place, created on first use. Never destroyed at exit (deliberately leaked):
// the CUDA driver and LLVM may already be tearing down when static destructors run.
class Runtimes {
 public:
  std::shared_ptr<Runtime> get(const Place& place) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto found = runtimes_.find(place); found != runtimes_.end()) return found->second;
    if (place.backend == "cpu" && !have_cpu_backend()) {
      raise(ErrorCode::Unsupported,
            "CPU arrays run on flashjit's CPU backend, and this build has none (LLVM/Clang 14 "
            "were not found when it was built); pass CUDA arrays, or rebuild with "
            "libclang-14-dev libclang-cpp14-dev llvm-14-dev installed");
    }
    RuntimeOptions options;
    options.backend = place.backend;
    options.device = place.device;
    CudaContextGuard guard(place.cuda());
    std::unique_ptr<Runtime> runtime = unwrap(Runtime::create(options));
    std::shared_ptr<Runtime> shared(runtime.release());
    runtimes_.emplace(place, shared);
    return shared;
  }
  // Forgets every runtime (kernels in use stay alive): the next call re-reads the tuning DBs.
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    runtimes_.clear();
  }

 private:
  std::mutex mutex_;
  std::map<Place, std::shared_ptr<Runtime>> runtimes_;
};

Runtimes& runtimes() {
  static Runtimes* instance = new Runtimes();
  return *instance;
}

// "cpu", "cuda", "cuda:N", or "auto" (the first CUDA device, else the CPU).
Place parse_place(const std::string& text) {
  if (text == "cpu") return {"cpu", 0};
  if (text == "cuda") return {"cuda", 0};
  if (text.rfind("cuda:", 0) == 0) {
    const std::string number = text.substr(5);
    if (!number.empty() && number.size() < 5 &&
        number.find_first_not_of("0123456789") == std::string::npos) {
      return {"cuda", std::stoi(number)};
    }
  }
  if (text == "auto") {
    if (cuda::device_count() > 0) return {"cuda", 0};
    if (have_cpu_backend()) return {"cpu", 0};
    Result<std::string> resolved = resolve_backend("auto");
    if (!resolved.ok()) raise(resolved.error());
    raise(ErrorCode::NoDevice, "no CUDA device and no CPU backend in this build");
  }
  raise(ErrorCode::InvalidArgument,
        "device = '" + text + "': must be 'auto', 'cpu', 'cuda' or 'cuda:N'");
}

// --- arrays -> problem --------------------------------------------------------------------------

using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

std::string dtype_name(const nb::dlpack::dtype& dtype) {
  std::string kind;
  switch (static_cast<nb::dlpack::dtype_code>(dtype.code)) {
    case nb::dlpack::dtype_code::Int:
      kind = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      kind = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      kind = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      kind = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    default:
      kind = "dtype" + std::to_string(dtype.code) + "_";
  }
  std::string name = kind + std::to_string(dtype.bits);
  if (dtype.lanes != 1) name += "x" + std::to_string(dtype.lanes);
  return name;
}

bool is_float(const nb::dlpack::dtype& dtype, int bits) {
  return dtype.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && dtype.bits == bits &&
         dtype.lanes == 1;
}

bool same_dtype(const nb::dlpack::dtype& a, const nb::dlpack::dtype& b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

// The element types attention() takes. float32 is DType::F32: the CPU backend runs it, the CUDA
// backend refuses it with its own Unsupported error.
DType element_type(const char* name, const nb::dlpack::dtype& dtype) {
  if (is_float(dtype, 16)) return DType::F16;
  if (dtype.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dtype.bits == 16 &&
      dtype.lanes == 1) {
    return DType::BF16;
  }
  if (is_float(dtype, 32)) return DType::F32;
  raise(ErrorCode::InvalidArgument, std::string(name) + ".dtype = " + dtype_name(dtype) +
                                        ": must be float16, bfloat16 or float32");
}

template <class Array>
Place place_of(const char* name, const Array& array) {
  const int type = array.device_type();
  const int id = array.device_id();
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value) return {"cpu", 0};
  if (type == nb::device::cuda::value || type == nb::device::cuda_managed::value) {
    return {"cuda", id};
  }
  raise(ErrorCode::Unsupported, std::string(name) + " is on a device of DLPack type " +
                                    std::to_string(type) +
                                    ": flashjit runs on CUDA devices and on the CPU");
}

template <class Array>
std::string shape_text(const Array& array) {
  std::string text = "(";
  for (size_t i = 0; i < array.ndim(); ++i) {
    if (i) text += ", ";
    text += std::to_string(array.shape(i));
  }
  return text + (array.ndim() == 1 ? ",)" : ")");
}

enum class Axis { Batch = 0, Seq = 1, Head = 2 };

Layout parse_layout(const std::string& text) {
  if (text == "bshd" || text == "BSHD") return Layout::BSHD;
  if (text == "bhsd" || text == "BHSD") return Layout::BHSD;
  raise(ErrorCode::InvalidArgument,
        "layout = '" + text +
            "': must be 'bshd' (batch, seqlen, heads, head_dim; flash_attn) or 'bhsd' (batch, "
            "heads, seqlen, head_dim; torch SDPA)");
}

// The array axis that holds `axis` in `layout`.
size_t axis_index(Layout layout, Axis axis) {
  if (axis == Axis::Batch) return 0;
  const bool seq_first = layout == Layout::BSHD;
  if (axis == Axis::Seq) return seq_first ? 1 : 2;
  return seq_first ? 2 : 1;
}

const char* layout_axes(Layout layout) {
  return layout == Layout::BSHD ? "(batch, seqlen, heads, head_dim)"
                                : "(batch, heads, seqlen, head_dim)";
}

// One 4-D attention tensor read through `layout`.
struct TensorView {
  int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  Strides strides;
};

template <class Array>
TensorView view_of(const char* name, const Array& array, Layout layout) {
  if (array.ndim() != 4) {
    raise(ErrorCode::InvalidArgument, std::string(name) +
                                          ".ndim = " + std::to_string(array.ndim()) + " (shape " +
                                          shape_text(array) + "): must be 4, " +
                                          layout_axes(layout) + " for layout " + to_string(layout));
  }
  if (array.shape(3) > 1 && array.stride(3) != 1) {
    raise(ErrorCode::InvalidArgument,
          std::string(name) + " is not contiguous in its last (head_dim) dimension (stride " +
              std::to_string(array.stride(3)) +
              "): flashjit needs stride 1 there; make it contiguous first");
  }
  // A size-1 axis is never stepped over, so its stride is irrelevant (frameworks report various
  // values there).
  auto stride = [&](Axis axis) -> int64_t {
    const size_t index = axis_index(layout, axis);
    return array.shape(index) == 1 ? 0 : array.stride(index);
  };
  TensorView view;
  view.batch = static_cast<int64_t>(array.shape(axis_index(layout, Axis::Batch)));
  view.seqlen = static_cast<int64_t>(array.shape(axis_index(layout, Axis::Seq)));
  view.heads = static_cast<int64_t>(array.shape(axis_index(layout, Axis::Head)));
  view.head_dim = static_cast<int64_t>(array.shape(3));
  view.strides = {stride(Axis::Batch), stride(Axis::Seq), stride(Axis::Head)};
  return view;
}

struct Call {
  Place place;
  AttentionProblem problem;
};

// Validates q, k, v (and out, lse when given) against each other and builds the problem.
Call prepare(const InArray& q, const InArray& k, const InArray& v, const OutArray* out,
             const OutArray* lse, bool causal, std::optional<double> scale,
             const std::string& layout_name) {
  const Layout layout = parse_layout(layout_name);
  const DType dtype = element_type("q", q.dtype());
  for (const auto& [name, array] : {std::pair<const char*, const InArray*>{"k", &k}, {"v", &v}}) {
    if (!same_dtype(array->dtype(), q.dtype())) {
      raise(ErrorCode::InvalidArgument, std::string(name) +
                                            ".dtype = " + dtype_name(array->dtype()) +
                                            ": must match q.dtype = " + dtype_name(q.dtype()));
    }
  }
  const Place place = place_of("q", q);
  auto same_place = [&](const char* name, const Place& other) {
    if (!(other == place)) {
      raise(ErrorCode::InvalidArgument, "device mismatch: q is on " + place.to_string() + " but " +
                                            name + " is on " + other.to_string());
    }
  };
  same_place("k", place_of("k", k));
  same_place("v", place_of("v", v));

  const TensorView qv = view_of("q", q, layout);
  const TensorView kv = view_of("k", k, layout);
  const TensorView vv = view_of("v", v, layout);
  if (shape_text(k) != shape_text(v)) {
    raise(ErrorCode::InvalidArgument,
          "v.shape = " + shape_text(v) + ": must equal k.shape = " + shape_text(k));
  }
  if (kv.batch != qv.batch) {
    raise(ErrorCode::InvalidArgument, "k.shape = " + shape_text(k) + ": batch " +
                                          std::to_string(kv.batch) + " must equal q's " +
                                          std::to_string(qv.batch) + " (layout " +
                                          to_string(layout) + " " + layout_axes(layout) + ")");
  }
  if (kv.head_dim != qv.head_dim) {
    raise(ErrorCode::InvalidArgument, "k.shape = " + shape_text(k) + ": head_dim " +
                                          std::to_string(kv.head_dim) + " must equal q's " +
                                          std::to_string(qv.head_dim));
  }
  if (qv.head_dim > kMaxHeadDim || qv.head_dim < kMinHeadDim || qv.head_dim % 8 != 0) {
    raise(ErrorCode::InvalidArgument, "head_dim = " + std::to_string(qv.head_dim) + " (q.shape " +
                                          shape_text(q) + "): must be a multiple of 8 in [" +
                                          std::to_string(kMinHeadDim) + ", " +
                                          std::to_string(kMaxHeadDim) + "]");
  }

  AttentionProblem problem;
  problem.batch = qv.batch;
  problem.heads_q = qv.heads;
  problem.heads_kv = kv.heads;
  problem.seqlen_q = qv.seqlen;
  problem.seqlen_k = kv.seqlen;
  problem.head_dim = static_cast<int>(qv.head_dim);
  problem.dtype = dtype;
  problem.causal = causal;
  if (scale) problem.softmax_scale = static_cast<float>(*scale);
  problem.q_strides = qv.strides;
  problem.k_strides = kv.strides;
  problem.v_strides = vv.strides;
  problem.o_strides = qv.strides;  // replaced by out's below

  if (out != nullptr) {
    if (shape_text(*out) != shape_text(q)) {
      raise(ErrorCode::InvalidArgument,
            "out.shape = " + shape_text(*out) + ": must equal q.shape = " + shape_text(q));
    }
    if (!same_dtype(out->dtype(), q.dtype())) {
      raise(ErrorCode::InvalidArgument, "out.dtype = " + dtype_name(out->dtype()) +
                                            ": must match q.dtype = " + dtype_name(q.dtype()));
    }
    same_place("out", place_of("out", *out));
    problem.o_strides = view_of("out", *out, layout).strides;
  }
  if (lse != nullptr) {
    if (!is_float(lse->dtype(), 32)) {
      raise(ErrorCode::InvalidArgument,
            "lse.dtype = " + dtype_name(lse->dtype()) + ": must be float32");
    }
    same_place("lse", place_of("lse", *lse));
    const bool shape_ok = lse->ndim() == 3 && static_cast<int64_t>(lse->shape(0)) == qv.batch &&
                          static_cast<int64_t>(lse->shape(1)) == qv.heads &&
                          static_cast<int64_t>(lse->shape(2)) == qv.seqlen;
    if (!shape_ok) {
      raise(ErrorCode::InvalidArgument,
            "lse.shape = " + shape_text(*lse) + ": must be (batch, heads, seqlen_q) = (" +
                std::to_string(qv.batch) + ", " + std::to_string(qv.heads) + ", " +
                std::to_string(qv.seqlen) + ")");
    }
    const bool contiguous = (qv.seqlen == 1 || lse->stride(2) == 1) &&
                            (qv.heads == 1 || lse->stride(1) == qv.seqlen) &&
                            (qv.batch == 1 || lse->stride(0) == qv.heads * qv.seqlen);
    if (!contiguous) raise(ErrorCode::InvalidArgument, "lse must be contiguous");
  }
  check(validate(problem));
  return {place, problem};
}

// --- kernels ------------------------------------------------------------------------------------

// Where a kernel's config came from, for config_for() and show().
const char* source_name(ChoiceSource source) {
  switch (source) {
    case ChoiceSource::Exact:
      return "exact";
    case ChoiceSource::NearestBucket:
      return "nearest";
    case ChoiceSource::Default:
      return "default";
  }
  return "unknown";
}

// config: nullopt = the runtime's selection (tuning DBs, then the SRAM-formula default);
// "default" = the SRAM-formula default; else a config name such as "m128n64w4s2".
std::pair<AttentionConfig, std::string> resolve_config(Runtime& runtime,
                                                       const AttentionProblem& problem,
                                                       const std::optional<std::string>& config) {
  if (!config) {
    auto [chosen, source] = unwrap(runtime.select_config(problem));
    return {chosen, source_name(source)};
  }
  if (*config == "default") return {unwrap(runtime.backend().default_config(problem)), "default"};
  AttentionConfig parsed = unwrap(AttentionConfig::parse(*config));
  Status legal = runtime.backend().check_config(parsed, problem);
  if (!legal.ok()) {
    raise(ErrorCode::InvalidArgument, "config = '" + *config +
                                          "' is not legal for this problem on " +
                                          runtime.backend().name() + ": " + legal.error().message);
  }
  return {parsed, "given"};
}

std::shared_ptr<Kernel> kernel_for(Runtime& runtime, const AttentionProblem& problem,
                                   const std::optional<std::string>& config) {
  if (!config) return unwrap(runtime.attention(problem));
  return unwrap(runtime.attention(problem, resolve_config(runtime, problem, config).first));
}

// Memory the module allocated for an output (arrays of frameworks without an allocator the
// Python layer knows, e.g. jax), owned by the returned array. `framework`: "jax" returns a jax
// array, "numpy" a numpy array (CPU only); anything else a DLPack capsule.
struct Allocated {
  nb::object array;
  void* data = nullptr;
};

Allocated allocate_array(Runtime& runtime, const Place& place, const std::string& framework,
                         std::vector<size_t> shape, nb::dlpack::dtype dtype) {
  size_t elements = 1;
  for (size_t extent : shape) elements *= extent;
  const size_t bytes = std::max<size_t>(1, elements * dtype.bits / 8);
  DeviceBuffer buffer;
  {
    CudaContextGuard guard(place.cuda());
    buffer = unwrap(runtime.backend().allocate(bytes));
  }
  void* data = buffer.get();
  struct Owned {
    DeviceBuffer buffer;
    bool cuda;
  };
  auto* owned = new Owned{std::move(buffer), place.cuda()};
  nb::capsule owner(owned, [](void* pointer) noexcept {
    auto* held = static_cast<Owned*>(pointer);
    CudaContextGuard guard(held->cuda);
    delete held;
  });
  const int device_type = place.cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  auto make = [&](auto array_type) {
    using Array = decltype(array_type);
    return nb::cast(
        Array(data, shape.size(), shape.data(), owner, nullptr, dtype, device_type, place.device));
  };
  if (framework == "jax") return {make(nb::ndarray<nb::jax>()), data};
  if (framework == "numpy" && !place.cuda()) return {make(nb::ndarray<nb::numpy>()), data};
  return {make(nb::ndarray<>()), data};  // no framework: a DLPack capsule
}

// attention(): returns (out, lse) as allocated here: each None when the caller passed it (or, for
// lse, did not ask for it).
nb::tuple attention(InArray q, InArray k, InArray v, std::optional<OutArray> out,
                    std::optional<OutArray> lse, bool want_lse, bool causal,
                    std::optional<double> scale, const std::string& layout,
                    std::optional<std::string> config, uintptr_t stream, bool synchronize,
                    const std::string& framework) {
  Call call = prepare(q, k, v, out ? &*out : nullptr, lse ? &*lse : nullptr, causal, scale, layout);
  std::shared_ptr<Runtime> runtime = runtimes().get(call.place);

  nb::object out_object = nb::none(), lse_object = nb::none();
  void* out_data = nullptr;
  float* lse_data = nullptr;
  if (out) {
    out_data = out->data();
  } else {
    // Contiguous, with q's shape (so in the same layout as q).
    std::vector<size_t> shape;
    for (size_t i = 0; i < 4; ++i) shape.push_back(q.shape(i));
    Allocated allocated = allocate_array(*runtime, call.place, framework, shape, q.dtype());
    out_object = allocated.array;
    out_data = allocated.data;
    call.problem.o_strides = contiguous_strides(parse_layout(layout), call.problem.seqlen_q,
                                                call.problem.heads_q, call.problem.head_dim);
  }
  if (lse) {
    lse_data = static_cast<float*>(lse->data());
  } else if (want_lse) {
    Allocated allocated = allocate_array(
        *runtime, call.place, framework,
        {static_cast<size_t>(call.problem.batch), static_cast<size_t>(call.problem.heads_q),
         static_cast<size_t>(call.problem.seqlen_q)},
        nb::dtype<float>());
    lse_object = allocated.array;
    lse_data = static_cast<float*>(allocated.data);
  }

  const AttentionArgs args{q.data(), k.data(), v.data(), out_data, lse_data};
  {
    // Compiles (first use) and CPU launches take long: let other Python threads run.
    nb::gil_scoped_release release;
    CudaContextGuard guard(call.place.cuda());
    std::shared_ptr<Kernel> kernel = kernel_for(*runtime, call.problem, config);
    check(kernel->launch(call.problem, args, reinterpret_cast<void*>(stream)));
    if (synchronize && call.place.cuda()) {
      const cuda::Driver* cu = unwrap(cuda::driver());
      check(cuda::check(cu->cuStreamSynchronize(reinterpret_cast<CUstream>(stream)),
                        "cuStreamSynchronize", ErrorCode::LaunchFailed));
    }
  }
  return nb::make_tuple(out_object, lse_object);
}

nb::dict config_for(InArray q, InArray k, InArray v, bool causal, std::optional<double> scale,
                    const std::string& layout, std::optional<std::string> config) {
  Call call = prepare(q, k, v, nullptr, nullptr, causal, scale, layout);
  std::shared_ptr<Runtime> runtime = runtimes().get(call.place);
  std::pair<AttentionConfig, std::string> chosen;
  {
    nb::gil_scoped_release release;
    CudaContextGuard guard(call.place.cuda());
    chosen = resolve_config(*runtime, call.problem, config);
  }
  nb::dict result;
  result["config"] = chosen.first.to_string();
  result["source"] = chosen.second;
  result["device"] = call.place.to_string();
  result["problem"] = call.problem.to_string();
  return result;
}

// --- show, devices, tune ------------------------------------------------------------------------

AttentionProblem make_problem(int64_t batch, int64_t heads, std::optional<int64_t> kv_heads,
                              int64_t seqlen_q, int64_t seqlen_k, int head_dim,
                              const std::string& dtype, bool causal, std::optional<double> scale,
                              const std::string& layout) {
  AttentionProblem problem =
      AttentionProblem::make(batch, heads, kv_heads.value_or(heads), seqlen_q, seqlen_k, head_dim,
                             unwrap(parse_dtype(dtype)), causal, parse_layout(layout));
  if (scale) problem.softmax_scale = static_cast<float>(*scale);
  check(validate(problem));
  return problem;
}

// The source of the kernel for `problem`: on a table architecture (`arch`, no GPU needed), or on
// `device` ("auto", "cpu", "cuda:N") with that runtime's config selection.
std::string show(int64_t batch, int64_t heads, std::optional<int64_t> kv_heads, int64_t seqlen_q,
                 int64_t seqlen_k, int head_dim, const std::string& dtype, bool causal,
                 std::optional<double> scale, const std::string& layout,
                 std::optional<std::string> config, std::optional<std::string> arch,
                 const std::string& device) {
  const AttentionProblem problem = make_problem(batch, heads, kv_heads, seqlen_q, seqlen_k,
                                                head_dim, dtype, causal, scale, layout);
  std::string header = "// flashjit show: " + problem.to_string();
  KernelSource source;
  if (arch) {
    if (*arch == "cpu") {
      raise(ErrorCode::InvalidArgument, "arch = 'cpu': use device='cpu' for the CPU backend");
    }
    const DeviceSpec spec = unwrap(known_device(*arch));
    AttentionConfig chosen;
    std::string from;
    if (!config || *config == "default") {
      chosen = unwrap(default_config(problem, spec));
      from = "default";
    } else {
      chosen = unwrap(AttentionConfig::parse(*config));
      Status legal = check_config(chosen, problem, spec);
      if (!legal.ok()) {
        raise(ErrorCode::InvalidArgument, "config = '" + *config + "' is not legal on " +
                                              spec.arch_name() + ": " + legal.error().message);
      }
      from = "given";
    }
    source = unwrap(render_cuda_attention(problem, chosen));
    header +=
        " | config " + chosen.to_string() + " (" + from + ") | " + spec.arch_name() + " (table)";
  } else {
    const Place place = parse_place(device);
    std::shared_ptr<Runtime> runtime = runtimes().get(place);
    CudaContextGuard guard(place.cuda());
    auto [chosen, from] = resolve_config(*runtime, problem, config);
    source = unwrap(runtime->backend().render(problem, chosen));
    header += " | config " + chosen.to_string() + " (" + from + ") | " + place.to_string() + " " +
              runtime->backend().device().name;
  }
  header += " | entry " + source.entry() + "\n";
  return header + source.text;
}

nb::list devices() {
  nb::list result;
  const int count = cuda::device_count();
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CudaContextGuard guard(true);
    nb::dict entry;
    entry["backend"] = "cuda";
    entry["device"] = "cuda:" + std::to_string(ordinal);
    Result<DeviceSpec> spec = cuda::query_device(ordinal);
    if (!spec.ok()) {
      entry["error"] = spec.error().describe();
      result.append(entry);
      continue;
    }
    entry["name"] = spec->name;
    entry["arch"] = spec->arch_name();
    entry["sm_count"] = spec->sm_count;
    entry["smem_per_block_optin"] = spec->smem_per_block_optin;
    entry["l2_bytes"] = spec->l2_bytes;
    if (auto backend = cuda::CudaBackend::create(ordinal); backend.ok()) {
      entry["fingerprint"] = (*backend)->fingerprint().to_string();
    }
    entry["compiler"] = cuda::nvrtc_version();
    result.append(entry);
  }
  const CpuSpec host = cpu::host_cpu();
  nb::dict entry;
  entry["backend"] = "cpu";
  entry["device"] = "cpu";
  entry["name"] = host.model;
  entry["cores"] = host.cores;
  entry["l1d_bytes"] = host.l1d_bytes;
  entry["l2_bytes"] = host.l2_bytes;
  entry["l3_bytes"] = host.l3_bytes;
  entry["isa"] = host.isa();
  entry["available"] = have_cpu_backend();
  if (have_cpu_backend()) {
    if (auto backend = create_backend("cpu"); backend.ok()) {
      entry["fingerprint"] = (*backend)->fingerprint().to_string();
    } else {
      entry["available"] = false;
      entry["error"] = backend.error().describe();
    }
#if FLASHJIT_HAVE_CPU_BACKEND
    entry["compiler"] = cpu::clang_version();
#endif
  } else {
    entry["error"] = "no CPU backend in this build (LLVM/Clang 14 not found when it was built)";
  }
  result.append(entry);
  return result;
}

// std::cerr also copied into a string, while `flashjit tune` runs (its errors go there).
class CerrTee : public std::streambuf {
 public:
  CerrTee() : original_(std::cerr.rdbuf(this)) {}
  ~CerrTee() override { std::cerr.rdbuf(original_); }
  CerrTee(const CerrTee&) = delete;
  CerrTee& operator=(const CerrTee&) = delete;
  std::string text() {
    std::lock_guard<std::mutex> lock(mutex_);
    return captured_;
  }

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    std::lock_guard<std::mutex> lock(mutex_);
    captured_.push_back(static_cast<char>(c));
    return original_->sputc(static_cast<char>(c));
  }
  std::streamsize xsputn(const char* data, std::streamsize size) override {
    std::lock_guard<std::mutex> lock(mutex_);
    captured_.append(data, static_cast<size_t>(size));
    return original_->sputn(data, size);
  }
  int sync() override { return original_->pubsync(); }

 private:
  std::streambuf* original_;
  std::mutex mutex_;
  std::string captured_;
};

// Runs `flashjit tune <args>` in this process; returns (exit status, what it wrote to std::cerr).
// Forgets the cached runtimes afterwards, so that attention() serves the new results.
nb::tuple tune(const std::vector<std::string>& args) {
  int status = 0;
  std::string errors;
  {
    nb::gil_scoped_release release;
    CudaContextGuard guard(true);
    std::cout.flush();
    CerrTee tee;
    try {
      status = cli::run_tune_command(args);
    } catch (const std::exception& error) {
      std::cerr << "flashjit tune: internal error: " << error.what() << "\n";
      status = 1;
    }
    std::cout.flush();
    std::fflush(stdout);
    std::fflush(stderr);
    errors = tee.text();
  }
  runtimes().clear();
  return nb::make_tuple(status, errors);
}

}  // namespace
}  // namespace flashjit::python

NB_MODULE(_flashjit, m) {
  using namespace flashjit::python;
  m.doc() = "flashjit's extension module; use the package flashjit (python/flashjit/__init__.py)";

  g_error = PyErr_NewExceptionWithDoc(
      "flashjit.Error",
      "An error reported by the flashjit library; .code names its kind (InvalidArgument, "
      "Unsupported, NoDevice, CompileFailed, DriverError, LaunchFailed, IoError, NotFound).",
      PyExc_RuntimeError, nullptr);
  nb::object value_error_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError));
  g_invalid_argument = PyErr_NewExceptionWithDoc(
      "flashjit.InvalidArgumentError",
      "A bad argument (shape, dtype, layout, device mismatch, strides, config).",
      value_error_bases.ptr(), nullptr);
  g_unsupported = PyErr_NewExceptionWithDoc("flashjit.UnsupportedError",
                                            "A valid request this build or device cannot serve.",
                                            value_error_bases.ptr(), nullptr);
  g_no_device = PyErr_NewExceptionWithDoc(
      "flashjit.NoDeviceError", "No usable device (no GPU, no driver).", g_error, nullptr);
  m.attr("Error") = nb::handle(g_error);
  m.attr("InvalidArgumentError") = nb::handle(g_invalid_argument);
  m.attr("UnsupportedError") = nb::handle(g_unsupported);
  m.attr("NoDeviceError") = nb::handle(g_no_device);

  nb::register_exception_translator([](const std::exception_ptr& pointer, void*) {
    try {
      std::rethrow_exception(pointer);
    } catch (const LibraryError& error) {
      set_python_error(error);
    }
  });

  m.attr("__version__") = FLASHJIT_VERSION;
  m.def("have_cpu_backend", &flashjit::have_cpu_backend);
  m.def("generator_version", [] { return flashjit::generator_version(); });

  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out").none(),
        nb::arg("lse").none(), nb::arg("want_lse"), nb::arg("causal"), nb::arg("scale").none(),
        nb::arg("layout"), nb::arg("config").none(), nb::arg("stream"), nb::arg("synchronize"),
        nb::arg("framework"));
  m.def("config_for", &config_for, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("causal"),
        nb::arg("scale").none(), nb::arg("layout"), nb::arg("config").none());
  m.def("show", &show, nb::arg("batch"), nb::arg("heads"), nb::arg("kv_heads").none(),
        nb::arg("seqlen_q"), nb::arg("seqlen_k"), nb::arg("head_dim"), nb::arg("dtype"),
        nb::arg("causal"), nb::arg("scale").none(), nb::arg("layout"), nb::arg("config").none(),
        nb::arg("arch").none(), nb::arg("device"));
  m.def("devices", &devices);
  m.def("tune", &tune, nb::arg("args"));
  m.def("clear_runtimes", [] { runtimes().clear(); });
}
