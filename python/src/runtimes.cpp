#include "runtimes.hpp"

#include "errors.hpp"
#include "runtime/backend.hpp"
#include "runtime/cuda/cuda_backend.hpp"

namespace flashjit::python {

CudaContextGuard::CudaContextGuard(bool cuda) {
  if (!cuda) return;
  Result<const cuda::Driver*> loaded = cuda::driver();
  if (!loaded.ok()) return;
  driver_ = loaded.value();
  if (driver_->cuCtxGetCurrent(&saved_) != CUDA_SUCCESS) driver_ = nullptr;
}

CudaContextGuard::~CudaContextGuard() {
  if (driver_ != nullptr) driver_->cuCtxSetCurrent(saved_);
}

std::shared_ptr<Runtime> Runtimes::get(const Place& place) {
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

void Runtimes::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  runtimes_.clear();
}

Runtimes& runtimes() {
  static Runtimes* instance = new Runtimes();
  return *instance;
}

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

}  // namespace flashjit::python
