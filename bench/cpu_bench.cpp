// cpu_bench: flashjit's CPU backend timed on one problem, and the host's measured clock and FMA
// throughput; bench/cpu_bench.py drives it and times PyTorch's CPU SDPA in the same run.
//
//   cpu_bench peak
//       {"cores": 2, "clock_ghz": 3.6, "lanes": 16, "fma_gflops_per_core": ..., ...}  (one line)
//   cpu_bench time --dtype bf16 --d 128 --n 2048 [--causal] [--pass fwd|bwd] [--tokens 4096]
//                  [--hidden 512] [--reps 7] [--warmup 2] [--db PATH] [--config m64n64w1s1,...]
//       one JSON line per implementation timed: "default" (the cache-budget default config) and
//       "tuned" (what Runtime::attention serves from the tuning DB, when it is another config),
//       or each forced --config ("forced", in the list's order). The implementations' reps are
//       interleaved (one launch of each in turn), so that the other load of a shared machine
//       hits all alike. --pass bwd times the backward pass (dq, dk, dv from q, k, v, o, lse and
//       dO; o and lse made by the forward kernel beforehand, outside the timing), FLOPs 2.5x
//       the forward's.
//
// Shapes follow the GPU benchmark's convention scaled down for a CPU: batch = tokens / N,
// heads = hidden / d, BSHD contiguous. FLOPs by the FlashAttention convention (4 B H N^2 d,
// halved when causal). Each rep is one synchronous launch on all cores; the median is reported
// together with every sample. Inputs are Normal(0, 1) rounded to the dtype.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cpu/cpu_info.hpp"
#include "runtime/runtime.hpp"
#include "tuner/reference.hpp"

namespace {

using namespace flashjit;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// ---- peak: the clock and what the FMA units really do ------------------------------------------

// A chain of dependent adds retires one per cycle on every x86 core of the last decade: the time
// per add is the clock period the core runs at right now (turbo included, other load excluded).
__attribute__((noinline)) long dependent_adds(long iterations) {
  long x = 0;
  for (long i = 0; i < iterations; ++i) {
    asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
  }
  return x;
}

double measure_clock_ghz() {
  dependent_adds(10'000'000);  // let the clock ramp up
  double best = 0;  // the best of 20 short trials: the others lost time to other processes
  for (int trial = 0; trial < 20; ++trial) {
    const long iterations = 20'000'000;
    const Clock::time_point start = Clock::now();
    dependent_adds(iterations);
    best = std::max(best, 4.0 * iterations / seconds_since(start) / 1e9);
  }
  return best;
}

// The body of a peak measurement: 12 independent chains (enough to cover 4-cycle latency on 2
// pipes) of STEP(a) from accumulators of INIT, `iterations` rounds; their sum kept by STORE_SUM
// (a0 + a11 into float[16]); returns the GFLOP/s of one core at FLOP per instruction.
#define FLASHJIT_PEAK(INIT, STEP, STORE_SUM, FLOP)                                                 \
  auto a0 = INIT;                                                                                  \
  decltype(a0) a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,    \
               a10 = a0, a11 = a0;                                                                 \
  const Clock::time_point start = Clock::now();                                                    \
  for (long i = 0; i < iterations; ++i) {                                                          \
    a0 = STEP(a0), a1 = STEP(a1), a2 = STEP(a2), a3 = STEP(a3), a4 = STEP(a4), a5 = STEP(a5);      \
    a6 = STEP(a6), a7 = STEP(a7), a8 = STEP(a8), a9 = STEP(a9), a10 = STEP(a10);                   \
    a11 = STEP(a11);                                                                               \
    asm volatile(""                                                                                \
                 : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), \
                   "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));                                      \
  }                                                                                                \
  const double seconds = seconds_since(start);                                                     \
  float lanes[16];                                                                                 \
  STORE_SUM(lanes, a0, a11);                                                                       \
  volatile float sink = lanes[0];                                                                  \
  (void)sink;                                                                                      \
  return 12.0 * iterations * (FLOP) / seconds / 1e9;

// fp32 FMA: 16 (8) lanes x 2 FLOP per instruction.
__attribute__((target("avx512f"), noinline)) double fma512_gflops(long iterations) {
  const __m512 b = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-4f);
#define STEP(a) _mm512_fmadd_ps(a, b, c)
#define STORE_SUM(out, x, y) _mm512_storeu_ps(out, _mm512_add_ps(x, y))
  FLASHJIT_PEAK(_mm512_set1_ps(0.5f), STEP, STORE_SUM, 16 * 2)
#undef STORE_SUM
#undef STEP
}

__attribute__((target("avx2,fma"), noinline)) double fma256_gflops(long iterations) {
  const __m256 b = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-4f);
#define STEP(a) _mm256_fmadd_ps(a, b, c)
#define STORE_SUM(out, x, y) _mm256_storeu_ps(out, _mm256_add_ps(x, y))
  FLASHJIT_PEAK(_mm256_set1_ps(0.5f), STEP, STORE_SUM, 8 * 2)
#undef STORE_SUM
#undef STEP
}

// vdpbf16ps: 16 lanes x 2 products x 2 FLOP per instruction.
__attribute__((target("avx512f,avx512bf16"), noinline)) double dpbf16_gflops(long iterations) {
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3a80);
#define STEP(a) _mm512_dpbf16_ps(a, b, c)
#define STORE_SUM(out, x, y) _mm512_storeu_ps(out, _mm512_add_ps(x, y))
  FLASHJIT_PEAK(_mm512_set1_ps(0.5f), STEP, STORE_SUM, 16 * 4)
#undef STORE_SUM
#undef STEP
}

template <class F>
double best_of(F measure) {
  double best = 0;
  for (int trial = 0; trial < 10; ++trial) best = std::max(best, measure(5'000'000));
  return best;
}

// The ISA levels as the CPU backend sees them: the host's, under a FLASHJIT_CPU_ISA cap (so that
// a capped run's peak is that level's).
int run_peak() {
  const CpuSpec spec = cpu::host_cpu();
  const bool avx512 = spec.avx512f;
  const bool avx2 = spec.avx2 && spec.fma;
  const bool bf16 = avx512 && spec.avx512bf16;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const double ghz = measure_clock_ghz();
  const int lanes = avx512 ? 16 : avx2 ? 8 : 4;
  const double fma = avx512 ? best_of(fma512_gflops) : avx2 ? best_of(fma256_gflops) : 0.0;
  const double dot = bf16 ? best_of(dpbf16_gflops) : 0.0;
  std::printf(
      "{\"cores\": %d, \"clock_ghz\": %.3f, \"lanes\": %d, \"isa\": \"%s\", "
      "\"fma_gflops_per_core\": %.1f, \"fma_flop_per_cycle\": %.1f, "
      "\"dpbf16_gflops_per_core\": %.1f, \"dpbf16_flop_per_cycle\": %.1f}\n",
      cores, ghz, lanes,
      avx512 ? (bf16 ? "avx512f avx512bf16" : "avx512f")
      : avx2 ? "avx2"
             : "sse",
      fma, fma / ghz, dot, dot / ghz);
  return 0;
}

// ---- time: flashjit on one problem --------------------------------------------------------------

struct TimeOptions {
  DType dtype = DType::BF16;
  int d = 128;
  int64_t n = 2048;
  bool causal = false;
  Pass pass = Pass::Forward;
  int64_t tokens = 4096;
  int64_t hidden = 512;
  int reps = 7;
  int warmup = 2;
  std::optional<std::string> db;
  std::vector<AttentionConfig> configs;  // forced; empty: the default and the tuned config
};

bool parse_time_options(int argc, char** argv, TimeOptions* o) {
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--causal") {
      o->causal = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cpu_bench: %s needs a value\n", flag.c_str());
      return false;
    }
    const std::string value = argv[++i];
    auto positive = [&](int64_t* out) {
      char* end = nullptr;
      const long long parsed = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || parsed <= 0) {
        std::fprintf(stderr, "cpu_bench: %s = '%s': expected a positive integer\n", flag.c_str(),
                     value.c_str());
        return false;
      }
      *out = parsed;
      return true;
    };
    int64_t number = 0;
    if (flag == "--dtype") {
      Result<DType> dtype = parse_dtype(value);
      if (!dtype.ok()) {
        std::fprintf(stderr, "cpu_bench: %s\n", dtype.error().describe().c_str());
        return false;
      }
      o->dtype = *dtype;
    } else if (flag == "--pass") {
      Result<Pass> pass = parse_pass(value);
      if (!pass.ok()) {
        std::fprintf(stderr, "cpu_bench: %s\n", pass.error().describe().c_str());
        return false;
      }
      o->pass = *pass;
    } else if (flag == "--config") {
      for (size_t start = 0; start <= value.size();) {
        const size_t comma = std::min(value.find(',', start), value.size());
        Result<AttentionConfig> config = AttentionConfig::parse(value.substr(start, comma - start));
        if (!config.ok()) {
          std::fprintf(stderr, "cpu_bench: %s\n", config.error().describe().c_str());
          return false;
        }
        o->configs.push_back(*config);
        start = comma + 1;
      }
    } else if (flag == "--db") {
      o->db = value;
    } else if (flag == "--d" || flag == "--n" || flag == "--tokens" || flag == "--hidden" ||
               flag == "--reps" || flag == "--warmup") {
      if (!positive(&number)) return false;
      if (flag == "--d") o->d = static_cast<int>(number);
      if (flag == "--n") o->n = number;
      if (flag == "--tokens") o->tokens = number;
      if (flag == "--hidden") o->hidden = number;
      if (flag == "--reps") o->reps = static_cast<int>(number);
      if (flag == "--warmup") o->warmup = static_cast<int>(number);
    } else {
      std::fprintf(stderr, "cpu_bench: unknown flag '%s'\n", flag.c_str());
      return false;
    }
  }
  return true;
}

int fail(const Error& error) {
  std::fprintf(stderr, "cpu_bench: %s\n", error.describe().c_str());
  return 1;
}

int run_time(const TimeOptions& o) {
  RuntimeOptions options;
  options.backend = "cpu";
  options.user_db = o.db ? std::optional<std::filesystem::path>(*o.db) : std::nullopt;
  options.record_misses = false;
  options.tune_on_miss = false;
  Result<std::unique_ptr<Runtime>> created = Runtime::create(options);
  if (!created.ok()) return fail(created.error());
  Runtime& runtime = **created;
  const Backend& backend = runtime.backend();

  const int64_t batch = std::max<int64_t>(1, o.tokens / o.n);
  const int64_t heads = std::max<int64_t>(1, o.hidden / o.d);
  const AttentionProblem forward =
      AttentionProblem::make(batch, heads, heads, o.n, o.n, o.d, o.dtype, o.causal);
  const AttentionProblem problem = forward.with_pass(o.pass);
  if (Status valid = backend.check_problem(problem); !valid.ok()) return fail(valid.error());

  // Inputs once (the same for every implementation), Normal(0, 1) in the dtype: q, k, v (and
  // for the backward dO).
  std::vector<DeviceBuffer> tensors;
  std::vector<int64_t> spans = {problem.q_span(), problem.kv_span(), problem.kv_span()};
  if (problem.is_backward()) spans.push_back(problem.do_span());
  for (int64_t span : spans) {
    std::vector<uint16_t> host(static_cast<size_t>(span * storage_words(o.dtype)));
    std::mt19937_64 engine(20261122 + tensors.size());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < span; ++i) set_element(host.data(), i, normal(engine), o.dtype);
    Result<DeviceBuffer> buffer = backend.allocate(host.size() * 2);
    if (!buffer.ok()) return fail(buffer.error());
    Status copied = backend.copy_to_device(buffer->get(), host.data(), host.size() * 2);
    if (!copied.ok()) return fail(copied.error());
    tensors.push_back(std::move(buffer.value()));
  }
  Result<DeviceBuffer> out = backend.allocate(problem.o_span() * dtype_bytes(o.dtype));
  if (!out.ok()) return fail(out.error());
  Result<DeviceBuffer> lse = backend.allocate(problem.lse_elements() * sizeof(float));
  if (!lse.ok()) return fail(lse.error());
  AttentionArgs args{tensors[0].get(), tensors[1].get(), tensors[2].get(), out->get(),
                     lse->as<float>()};
  std::vector<DeviceBuffer> gradients;
  if (problem.is_backward()) {
    // o and lse from the forward kernel, as a training step would have them.
    Result<std::shared_ptr<Kernel>> fwd = runtime.attention(forward);
    if (!fwd.ok()) return fail(fwd.error());
    if (Status done = (*fwd)->launch(forward, args); !done.ok()) return fail(done.error());
    for (int64_t span : {problem.dq_span(), problem.dkv_span(), problem.dkv_span()}) {
      Result<DeviceBuffer> buffer = backend.allocate(span * dtype_bytes(o.dtype));
      if (!buffer.ok()) return fail(buffer.error());
      gradients.push_back(std::move(buffer.value()));
    }
    args.d_o = tensors[3].get();
    args.dq = gradients[0].get();
    args.dk = gradients[1].get();
    args.dv = gradients[2].get();
  }

  std::vector<std::pair<std::string, Result<std::shared_ptr<Kernel>>>> variants;
  if (!o.configs.empty()) {
    for (const AttentionConfig& config : o.configs)
      variants.emplace_back("forced", runtime.attention(problem, config));
  } else {
    Result<AttentionConfig> def = backend.default_config(problem);
    if (!def.ok()) return fail(def.error());
    variants.emplace_back("default", runtime.attention(problem, *def));
    auto selected = runtime.select_config(problem);
    if (!selected.ok()) return fail(selected.error());
    if (selected->first != *def) variants.emplace_back("tuned", runtime.attention(problem));
  }
  for (auto& [impl, kernel] : variants) {
    if (!kernel.ok()) return fail(kernel.error());
    for (int i = 0; i < o.warmup; ++i) {
      Status status = (*kernel)->launch(problem, args);
      if (!status.ok()) return fail(status.error());
    }
  }
  // Rep by rep, one launch of each implementation in turn.
  std::vector<std::vector<double>> samples_of(variants.size());
  for (int i = 0; i < o.reps; ++i)
    for (size_t v = 0; v < variants.size(); ++v) {
      const Kernel& ready = **variants[v].second;
      Result<double> ms = backend.time_ms([&] { return ready.launch(problem, args); }, 1);
      if (!ms.ok()) return fail(ms.error());
      samples_of[v].push_back(*ms);
    }
  for (size_t v = 0; v < variants.size(); ++v) {
    const std::string& impl = variants[v].first;
    const Kernel& ready = **variants[v].second;
    const std::vector<double>& samples = samples_of[v];
    const double ms = median(samples);
    std::string list;
    for (double sample : samples) {
      char text[32];
      std::snprintf(text, sizeof text, "%s%.4f", list.empty() ? "" : ", ", sample);
      list += text;
    }
    std::printf(
        "{\"impl\": \"flashjit-%s\", \"pass\": \"%s\", \"config\": \"%s\", \"dtype\": \"%s\", "
        "\"d\": %d, \"N\": %lld, "
        "\"causal\": %s, \"B\": %lld, \"H\": %lld, \"threads\": %d, \"ms\": %.4f, \"gflops\": "
        "%.2f, \"samples_ms\": [%s]}\n",
        impl.c_str(), to_string(o.pass), ready.config().to_string().c_str(), to_string(o.dtype),
        o.d, static_cast<long long>(o.n), o.causal ? "true" : "false",
        static_cast<long long>(batch), static_cast<long long>(heads), backend.device().sm_count, ms,
        problem.flops() / (ms * 1e-3) / 1e9, list.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "peak") return run_peak();
  if (mode == "time") {
    TimeOptions options;
    if (!parse_time_options(argc, argv, &options)) return 2;
    return run_time(options);
  }
  std::fprintf(
      stderr,
      "usage: cpu_bench peak\n"
      "       cpu_bench time --dtype bf16|fp16|fp32 --d D --n N [--causal] [--pass fwd|bwd]\n"
      "                      [--tokens T]\n"
      "                      [--hidden H] [--reps R] [--warmup W] [--db PATH]\n"
      "                      [--config CFG[,CFG...]]\n");
  return 2;
}
