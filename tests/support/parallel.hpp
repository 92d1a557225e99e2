// A minimal thread pool for tests: run independent jobs (kernel compiles, mostly) on all cores.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace flashjit::testing {

// Threads to use: hardware_concurrency, at least 1.
inline unsigned worker_count() { return std::max(1u, std::thread::hardware_concurrency()); }

// results[i] = job(i) for i in [0, count), on up to worker_count() threads. `job` must be safe to
// call concurrently; results come back in index order.
template <class Result, class Job>
std::vector<Result> parallel_map(size_t count, const Job& job) {
  std::vector<Result> results(count);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < count; i = next++) results[i] = job(i);
  };
  const size_t threads = std::min<size_t>(count, worker_count());
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();  // the calling thread works too
  for (auto& thread : pool) thread.join();
  return results;
}

}  // namespace flashjit::testing
