// Where arrays live and what runs them: a Place ("cpu", "cuda:N"), one Runtime per place for the
// life of the process, and the guard that keeps the calling thread's CUDA context as the caller
// (torch, cupy) had it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "array_checks.hpp"
#include "runtime/cuda/driver.hpp"
#include "runtime/runtime.hpp"

namespace flashjit::python {

// The CUDA backend makes its device's primary context current on the calling thread (the same
// context torch and cupy use). A host framework reads "its current device" from that binding, so
// every entry point here puts back whatever context the thread had.
class CudaContextGuard {
 public:
  explicit CudaContextGuard(bool cuda);
  ~CudaContextGuard();
  CudaContextGuard(const CudaContextGuard&) = delete;
  CudaContextGuard& operator=(const CudaContextGuard&) = delete;

 private:
  const cuda::Driver* driver_ = nullptr;
  CUcontext saved_ = nullptr;
};

// One Runtime per place, created on first use. Never destroyed at exit (deliberately leaked):
// the CUDA driver and LLVM may already be tearing down when static destructors run.
class Runtimes {
 public:
  std::shared_ptr<Runtime> get(const Place& place);
  // Forgets every runtime (kernels in use stay alive): the next call re-reads the tuning DBs.
  void clear();

 private:
  std::mutex mutex_;
  std::map<Place, std::shared_ptr<Runtime>> runtimes_;
};

Runtimes& runtimes();

// "cpu", "cuda", "cuda:N", or "auto" (the first CUDA device, else the CPU).
Place parse_place(const std::string& text);

}  // namespace flashjit::python
