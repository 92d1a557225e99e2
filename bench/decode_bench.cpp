// decode_bench: flashjit's decode family on a CUDA GPU over issue 18's grid: one query token
// per sequence, GQA 32:8, d = 128, bf16, batch x seqlen_k, contiguous K/V and a paged cache
// (16 keys per page, pages shuffled), beside the device-to-device copy bandwidth measured in the
// same process.
//
//   decode_bench [--batch 1,4,16,64] [--seqlen-k 1024,8192,32768,131072] [--page-size 16]
//                [--config m16n64w4s4-decode[-splitN]] [--target-ms 100] [--json PATH]
//
// Bandwidth = bytes of K and V the call reads (2 * batch * seqlen_k * heads_kv * d * 2) / time;
// the copy's = 2 * bytes / time (a copy reads and writes each byte). Each shape's inputs rotate
// over enough copies to exceed twice the L2 (as far as memory allows), so no launch finds its
// K/V in the cache. bench/decode_bench.py times torch SDPA's flash and cuDNN backends on the same
// shapes and the same copy in its own process and joins the two. host_us: host time per call of
// Kernel::launch (a cached kernel: checks, params, 1-2 cuLaunchKernel), over 200 calls enqueued
// back to back (the issue asks for at most 5 us).
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_args.hpp"
#include "generator/decode_config.hpp"
#include "runtime/cuda/driver.hpp"
#include "runtime/runtime.hpp"

namespace {

using namespace flashjit;

struct Options {
  std::vector<int64_t> batches = {1, 4, 16, 64};
  std::vector<int64_t> seqlens = {1024, 8192, 32768, 131072};
  int page_size = 16;
  std::optional<AttentionConfig> config;
  double target_ms = 100;
  std::optional<std::string> json_path;
};

// Median over batches of back-to-back launches, each batch ~target_ms / 10.
Result<double> median_ms(const Backend& backend, const std::function<Status(int)>& launch,
                         double target_ms) {
  int call = 0;
  Result<double> first = backend.time_ms([&] { return launch(call++); }, 3);  // warm-up
  if (!first.ok()) return first.error();
  const int reps =
      std::clamp(static_cast<int>(target_ms / 10 / std::max(first.value(), 1e-3)), 5, 1000);
  std::vector<double> times;
  for (int b = 0; b < 10; ++b) {
    Result<double> t = backend.time_ms([&] { return launch(call++); }, reps);
    if (!t.ok()) return t.error();
    times.push_back(t.value());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The device-to-device copy bandwidth (2 * bytes / time) of a 1 GiB buffer, GB/s.
Result<double> copy_bandwidth(const Backend& backend, double target_ms) {
  using CopyFn = CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CopyFn copy =
      library ? reinterpret_cast<CopyFn>(dlsym(library, "cuMemcpyDtoDAsync_v2")) : nullptr;
  if (copy == nullptr) return make_error(ErrorCode::NoDevice, "cuMemcpyDtoDAsync not found");
  const size_t bytes = size_t{1} << 30;
  Result<DeviceBuffer> a = backend.allocate(bytes), b = backend.allocate(bytes);
  if (!a.ok()) return a.error();
  if (!b.ok()) return b.error();
  Result<double> ms = median_ms(
      backend,
      [&](int) {
        return cuda::check(copy(reinterpret_cast<CUdeviceptr>(b->get()),
                                reinterpret_cast<CUdeviceptr>(a->get()), bytes, nullptr),
                           "cuMemcpyDtoDAsync");
      },
      target_ms);
  if (!ms.ok()) return ms.error();
  return 2.0 * bytes / (ms.value() * 1e-3) / 1e9;
}

struct Row {
  int64_t batch, seqlen_k;
  int page_size;
  std::string config;
  int splits;
  double ms, kv_bytes, gbps, copy_gbps, host_us;
};

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "decode_bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--batch" || arg == "--seqlen-k") {
      const std::string text = value();
      std::optional<std::vector<int64_t>> list = bench::parse_list<int64_t>(text);
      if (!list) {
        std::fprintf(stderr, "decode_bench: %s = '%s': a comma list of positive integers\n",
                     arg.c_str(), text.c_str());
        return 2;
      }
      (arg == "--batch" ? options.batches : options.seqlens) = *list;
    } else if (arg == "--page-size") {
      options.page_size = std::atoi(value().c_str());
    } else if (arg == "--config") {
      Result<AttentionConfig> config = AttentionConfig::parse(value());
      if (!config.ok()) {
        std::fprintf(stderr, "decode_bench: %s\n", config.error().message.c_str());
        return 2;
      }
      options.config = config.value();
    } else if (arg == "--target-ms") {
      options.target_ms = std::atof(value().c_str());
    } else if (arg == "--json") {
      options.json_path = value();
    } else {
      std::fprintf(stderr,
                   "usage: decode_bench [--batch LIST] [--seqlen-k LIST] [--page-size N] "
                   "[--config CFG] [--target-ms MS] [--json PATH]\n");
      return 2;
    }
  }
  RuntimeOptions runtime_options;
  runtime_options.backend = "cuda";
  Result<std::unique_ptr<Runtime>> runtime = Runtime::create(runtime_options);
  if (!runtime.ok()) {
    std::fprintf(stderr, "decode_bench: %s\n", runtime.error().describe().c_str());
    return 1;
  }
  const Backend& backend = (*runtime)->backend();
  Result<double> copy_gbps = copy_bandwidth(backend, options.target_ms);
  if (!copy_gbps.ok()) {
    std::fprintf(stderr, "decode_bench: copy: %s\n", copy_gbps.error().describe().c_str());
    return 1;
  }
  std::printf("device: %s; device-to-device copy %.0f GB/s\n", backend.device().name.c_str(),
              copy_gbps.value());
  std::printf("%6s %8s %6s %-28s %6s %9s %9s %7s %8s\n", "batch", "seqlen_k", "page", "config",
              "splits", "ms", "GB/s", "of copy", "host us");
  constexpr int64_t kHeadsQ = 32, kHeadsKv = 8, kHeadDim = 128;
  std::vector<Row> rows;
  std::mt19937 engine(7);
  int failures = 0;
  for (int page : {0, options.page_size}) {
    for (int64_t batch : options.batches) {
      for (int64_t seqlen_k : options.seqlens) {
        AttentionProblem problem = AttentionProblem::make(batch, kHeadsQ, kHeadsKv, 1, seqlen_k,
                                                          kHeadDim, DType::BF16, false);
        if (page > 0) {
          problem = problem.with_paged_kv(page, batch * ((seqlen_k + page - 1) / page));
        }
        const double kv_bytes = 2.0 * batch * seqlen_k * kHeadsKv * kHeadDim * 2;
        // Copies of K/V to rotate over: past 2x the L2, within ~40 GB.
        const int copies = static_cast<int>(std::clamp<double>(
            2.0 * backend.device().l2_bytes / kv_bytes + 1, 1, std::max(1.0, 40e9 / kv_bytes)));
        if (kv_bytes > 40e9) continue;
        Result<std::shared_ptr<Kernel>> kernel =
            options.config ? (*runtime)->attention(problem, *options.config)
                           : (*runtime)->attention(problem);
        if (!kernel.ok()) {
          std::printf("%6lld %8lld %6d  %s\n", static_cast<long long>(batch),
                      static_cast<long long>(seqlen_k), page, kernel.error().describe().c_str());
          ++failures;
          continue;
        }
        const AttentionConfig config = (*kernel)->config();
        const int splits = decode_splits(config, problem, backend.device());
        const size_t kv_span = static_cast<size_t>(problem.kv_span()) * 2;
        std::vector<DeviceBuffer> ks, vs, tables;
        Result<DeviceBuffer> q = backend.allocate(problem.q_span() * 2);
        Result<DeviceBuffer> o = backend.allocate(problem.o_span() * 2);
        Result<DeviceBuffer> lse = backend.allocate(problem.lse_elements() * 4);
        Result<DeviceBuffer> lens = backend.allocate(batch * 4);
        bool ok = q.ok() && o.ok() && lse.ok() && lens.ok();
        for (int c = 0; ok && c < copies; ++c) {
          Result<DeviceBuffer> k = backend.allocate(kv_span), v = backend.allocate(kv_span);
          ok = k.ok() && v.ok() && backend.fill_bytes(k->get(), 0x3c, kv_span).ok() &&
               backend.fill_bytes(v->get(), 0x3c, kv_span).ok();
          if (!ok) break;
          ks.push_back(std::move(k.value()));
          vs.push_back(std::move(v.value()));
          if (page > 0) {  // every sequence's pages, shuffled over the cache
            std::vector<int32_t> table(static_cast<size_t>(problem.block_table_elements()));
            std::iota(table.begin(), table.end(), 0);
            std::shuffle(table.begin(), table.end(), engine);
            Result<DeviceBuffer> t = backend.allocate(table.size() * 4);
            ok = t.ok() && backend.copy_to_device(t->get(), table.data(), table.size() * 4).ok();
            if (ok) tables.push_back(std::move(t.value()));
          }
        }
        if (ok) {
          const std::vector<int32_t> lengths(static_cast<size_t>(batch),
                                             static_cast<int32_t>(seqlen_k));
          ok = backend.fill_bytes(q->get(), 0x3c, problem.q_span() * 2).ok() &&
               backend.copy_to_device(lens->get(), lengths.data(), batch * 4).ok();
        }
        if (!ok) {
          std::printf("%6lld %8lld %6d  allocation failed\n", static_cast<long long>(batch),
                      static_cast<long long>(seqlen_k), page);
          ++failures;
          continue;
        }
        Result<double> ms = median_ms(
            backend,
            [&](int call) {
              const int c = call % copies;
              AttentionArgs args{q->get(), ks[c].get(), vs[c].get(), o->get(), lse->as<float>()};
              args.block_table = page > 0 ? tables[c].as<int32_t>() : nullptr;
              args.seqlens_k = problem.kv.seqlens_k ? lens->as<int32_t>() : nullptr;
              return (*kernel)->launch(problem, args);
            },
            options.target_ms);
        if (!ms.ok()) {
          std::printf("%6lld %8lld %6d  %s\n", static_cast<long long>(batch),
                      static_cast<long long>(seqlen_k), page, ms.error().describe().c_str());
          ++failures;
          continue;
        }
        // Host time per call: 200 launches enqueued back to back, then one synchronize.
        double host_us = 0;
        {
          AttentionArgs args{q->get(), ks[0].get(), vs[0].get(), o->get(), lse->as<float>()};
          args.block_table = page > 0 ? tables[0].as<int32_t>() : nullptr;
          args.seqlens_k = problem.kv.seqlens_k ? lens->as<int32_t>() : nullptr;
          constexpr int kCalls = 200;
          const auto start = std::chrono::steady_clock::now();
          for (int i = 0; i < kCalls; ++i) (void)(*kernel)->launch(problem, args);
          host_us =
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count() /
              kCalls;
          (void)backend.synchronize();
        }
        Row row{batch,
                seqlen_k,
                page,
                config.to_string(),
                splits,
                ms.value(),
                kv_bytes,
                kv_bytes / (ms.value() * 1e-3) / 1e9,
                copy_gbps.value(),
                host_us};
        std::printf("%6lld %8lld %6d %-28s %6d %9.4f %9.0f %6.0f%% %8.2f\n",
                    static_cast<long long>(batch), static_cast<long long>(seqlen_k), page,
                    row.config.c_str(), splits, row.ms, row.gbps, 100 * row.gbps / row.copy_gbps,
                    row.host_us);
        std::fflush(stdout);
        rows.push_back(row);
      }
    }
  }
  if (options.json_path) {
    std::ofstream out(*options.json_path);
    out << "{\"device\": \"" << backend.device().name << "\", \"copy_gbps\": " << copy_gbps.value()
        << ", \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out << "  {\"batch\": " << r.batch << ", \"seqlen_k\": " << r.seqlen_k
          << ", \"heads_q\": " << kHeadsQ << ", \"heads_kv\": " << kHeadsKv
          << ", \"head_dim\": " << kHeadDim << ", \"page_size\": " << r.page_size
          << ", \"config\": \"" << r.config << "\", \"splits\": " << r.splits
          << ", \"ms\": " << r.ms << ", \"kv_bytes\": " << r.kv_bytes << ", \"gbps\": " << r.gbps
          << ", \"host_us\": " << r.host_us << "}" << (i + 1 < rows.size() ? ",\n" : "\n");
    }
    out << "]}\n";
  }
  return failures == 0 ? 0 : 1;
}
