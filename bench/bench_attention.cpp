// bench_attention: forward-pass timing of flashjit's default (or a forced) config over the
// standard FlashAttention grid: 16k tokens in total (batch = 16384 / N), hidden 2048
// (heads = 2048 / d), d in {64, 128, 256}, causal off/on, BSHD contiguous (--tokens and --hidden
// change the batch and heads at the same FLOPs, e.g. to separate the batch from the head count).
//
//   bench_attention [--dtype bf16|f16] [--config m128n64w4s2] [--quick] [--d 64,128]
//                   [--n 1024,4096] [--tokens 16384] [--hidden 2048] [--target-ms 200]
//                   [--json PATH]
//
// Each shape: one warm-up batch, then the median of >= 10 timed batches of back-to-back launches
// (each batch at least 10 launches, ~target-ms in all). Inputs rotate over enough copies to
// exceed twice the L2 cache, so that no launch finds its inputs already cached.
// TFLOP/s use the FlashAttention convention (AttentionProblem::flops: causal counts half).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_args.hpp"
#include "runtime/runtime.hpp"

namespace {

using namespace flashjit;

constexpr int kTimedBatches = 10;
constexpr int kMinRepsPerBatch = 10;

struct Options {
  DType dtype = DType::BF16;
  std::optional<AttentionConfig> config;
  std::vector<int> head_dims = {64, 128, 256};
  std::vector<int64_t> seqlens = {512, 1024, 2048, 4096, 8192, 16384};
  int64_t tokens = 16384;  // batch x N of every shape (batch = tokens / N, at least 1)
  int64_t hidden = 2048;   // heads x d (heads = hidden / d, at least 1)
  double target_ms = 200;
  std::optional<std::string> json_path;
};

void print_usage() {
  std::printf(
      "usage: bench_attention [--dtype bf16|f16] [--config mXnYwZsW] [--quick] [--d LIST]\n"
      "                       [--n LIST] [--tokens T] [--hidden H] [--target-ms MS]\n"
      "                       [--json PATH]\n"
      "  --dtype      element type (default bf16)\n"
      "  --config     force one tile config instead of the default, e.g. m128n64w4s2\n"
      "  --quick      N in {1024, 4096, 16384} only\n"
      "  --d, --n     comma-separated head dims / sequence lengths to run\n"
      "  --tokens     batch x N of every shape (default 16384: batch = 16384 / N)\n"
      "  --hidden     heads x d of every shape (default 2048: heads = 2048 / d)\n"
      "  --target-ms  device time to spend timing each shape (default 200)\n"
      "  --json       also write the rows to PATH as a JSON list\n");
}

using bench::parse_list;

// Parses argv into `options`; prints the problem and returns false on a bad flag.
bool parse_options(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    if (flag == "--help" || flag == "-h") {
      print_usage();
      std::exit(0);
    } else if (flag == "--quick") {
      options->seqlens = {1024, 4096, 16384};
    } else if (flag == "--dtype" || flag == "--config" || flag == "--d" || flag == "--n" ||
               flag == "--tokens" || flag == "--hidden" || flag == "--target-ms" ||
               flag == "--json") {
      const std::optional<std::string> text = value();
      if (!text) {
        std::fprintf(stderr, "bench_attention: %s needs a value\n", flag.c_str());
        return false;
      }
      if (flag == "--dtype") {
        Result<DType> dtype = parse_dtype(*text);
        if (!dtype.ok()) {
          std::fprintf(stderr, "bench_attention: %s\n", dtype.error().describe().c_str());
          return false;
        }
        if (dtype.value() == DType::F32) {
          std::fprintf(stderr,
                       "bench_attention: --dtype %s: this benchmark times bf16 and f16 (the GPU's "
                       "dtypes); for fp32 on the CPU use bench/cpu_bench.py\n",
                       text->c_str());
          return false;
        }
        options->dtype = dtype.value();
      } else if (flag == "--config") {
        Result<AttentionConfig> config = AttentionConfig::parse(*text);
        if (!config.ok()) {
          std::fprintf(stderr, "bench_attention: %s\n", config.error().describe().c_str());
          return false;
        }
        options->config = config.value();
      } else if (flag == "--d" || flag == "--n") {
        bool ok = true;
        if (flag == "--d") {
          auto list = parse_list<int>(*text);
          ok = list.has_value();
          if (ok) options->head_dims = *list;
        } else {
          auto list = parse_list<int64_t>(*text);
          ok = list.has_value();
          if (ok) options->seqlens = *list;
        }
        if (!ok) {
          std::fprintf(stderr,
                       "bench_attention: %s = '%s': expected positive integers, "
                       "comma-separated\n",
                       flag.c_str(), text->c_str());
          return false;
        }
      } else if (flag == "--tokens" || flag == "--hidden") {
        const std::optional<std::vector<int64_t>> list = parse_list<int64_t>(*text);
        if (!list || list->size() != 1) {
          std::fprintf(stderr, "bench_attention: %s = '%s': expected one positive integer\n",
                       flag.c_str(), text->c_str());
          return false;
        }
        (flag == "--tokens" ? options->tokens : options->hidden) = list->front();
      } else if (flag == "--target-ms") {
        options->target_ms = std::atof(text->c_str());
        if (!(options->target_ms > 0)) {
          std::fprintf(stderr, "bench_attention: --target-ms must be positive\n");
          return false;
        }
      } else {
        options->json_path = *text;
      }
    } else {
      std::fprintf(stderr, "bench_attention: unknown argument '%s'\n", flag.c_str());
      print_usage();
      return false;
    }
  }
  return true;
}

// One set of device tensors, sized for the largest shape of the grid.
struct TensorSet {
  DeviceBuffer q, k, v, o, lse;
};

struct Row {
  std::string impl, dtype, config, error;
  int d = 0;
  bool causal = false;
  int64_t n = 0, batch = 0, heads = 0;
  double fwd_ms = 0, fwd_tflops = 0;
};

std::string json_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out;
}

bool write_json(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream out(path);
  out << "[\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    char numbers[160];
    std::snprintf(numbers, sizeof(numbers), "\"fwd_ms\": %.4f, \"fwd_tflops\": %.1f", r.fwd_ms,
                  r.fwd_tflops);
    out << " {\"impl\": \"" << json_escape(r.impl) << "\", \"dtype\": \"" << r.dtype
        << "\", \"d\": " << r.d << ", \"causal\": " << (r.causal ? "true" : "false")
        << ", \"N\": " << r.n << ", \"B\": " << r.batch << ", \"H\": " << r.heads
        << ", \"config\": \"" << r.config << "\", ";
    if (r.error.empty()) {
      out << numbers << "}";
    } else {
      out << "\"err\": \"" << json_escape(r.error) << "\"}";
    }
    out << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  out << "]\n";
  return static_cast<bool>(out);
}

// Normal(0, 1) values in the dtype's bit pattern; the same host data serves every shape (the
// element count is 16k tokens x 2048 for all of them).
std::vector<uint16_t> random_half_bits(size_t count, DType dtype, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> bits(count);
  for (auto& element : bits) {
    float value = normal(engine);
    uint32_t word;
    std::memcpy(&word, &value, sizeof(word));
    if (dtype == DType::BF16) {
      element = static_cast<uint16_t>((word + 0x7FFFu + ((word >> 16) & 1u)) >> 16);
    } else {
      // |value| < 8 in practice and far from fp16 subnormals: truncating the mantissa is enough
      // for benchmark data (rounding does not matter here, finiteness does).
      const uint32_t sign = (word >> 16) & 0x8000u;
      const int exponent = static_cast<int>((word >> 23) & 0xFF) - 127 + 15;
      if (exponent <= 0) {
        element = static_cast<uint16_t>(sign);  // tiny: zero
      } else if (exponent >= 31) {
        element = static_cast<uint16_t>(sign | 0x7BFFu);  // clamp to the largest finite
      } else {
        element = static_cast<uint16_t>(sign | (exponent << 10) | ((word >> 13) & 0x3FFu));
      }
    }
  }
  return bits;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!parse_options(argc, argv, &options)) return 2;

  Result<std::unique_ptr<Runtime>> created = Runtime::create();
  if (!created.ok()) {
    std::fprintf(stderr, "bench_attention: %s\n", created.error().describe().c_str());
    return 1;
  }
  Runtime& runtime = *created.value();
  const Backend& backend = runtime.backend();
  const DeviceSpec& device = backend.device();
  std::printf("# device %s\n# compiler %s\n", device.to_string().c_str(),
              backend.compiler_fingerprint().c_str());

  // Largest tensors over the grid: every shape has about tokens x hidden elements per tensor;
  // lse has batch * heads * N = tokens * (hidden / d) elements, largest for the smallest d.
  int64_t max_tensor_elements = 0, max_lse_elements = 0;
  for (int d : options.head_dims) {
    for (int64_t n : options.seqlens) {
      const int64_t batch = std::max<int64_t>(1, options.tokens / n);
      const int64_t heads = std::max<int64_t>(1, options.hidden / d);
      max_tensor_elements = std::max(max_tensor_elements, batch * n * heads * d);
      max_lse_elements = std::max(max_lse_elements, batch * heads * n);
    }
  }
  const size_t tensor_bytes = static_cast<size_t>(max_tensor_elements) * 2;
  const size_t input_set_bytes = 3 * tensor_bytes;
  const size_t l2_bytes = device.l2_bytes > 0 ? static_cast<size_t>(device.l2_bytes) : 50u << 20;
  size_t set_count = std::max<size_t>(1, (2 * l2_bytes + input_set_bytes - 1) / input_set_bytes);
  if (input_set_bytes <= l2_bytes) set_count = std::max<size_t>(set_count, 2);

  const std::vector<uint16_t> host_data =
      random_half_bits(static_cast<size_t>(max_tensor_elements), options.dtype, 20261122);
  std::vector<TensorSet> sets(set_count);
  for (TensorSet& set : sets) {
    for (DeviceBuffer* buffer : {&set.q, &set.k, &set.v, &set.o}) {
      Result<DeviceBuffer> allocated = backend.allocate(tensor_bytes);
      if (!allocated.ok()) {
        std::fprintf(stderr, "bench_attention: %s\n", allocated.error().describe().c_str());
        return 1;
      }
      *buffer = std::move(allocated.value());
    }
    for (DeviceBuffer* input : {&set.q, &set.k, &set.v}) {
      const Status copied = backend.copy_to_device(input->get(), host_data.data(), tensor_bytes);
      if (!copied.ok()) {
        std::fprintf(stderr, "bench_attention: %s\n", copied.error().describe().c_str());
        return 1;
      }
    }
    Result<DeviceBuffer> lse = backend.allocate(static_cast<size_t>(max_lse_elements) * 4);
    if (!lse.ok()) {
      std::fprintf(stderr, "bench_attention: %s\n", lse.error().describe().c_str());
      return 1;
    }
    set.lse = std::move(lse.value());
  }
  std::printf("# %zu input set(s) of %.0f MB rotated (L2 %.0f MB)\n", set_count,
              input_set_bytes / 1e6, l2_bytes / 1e6);
  std::printf("%-5s %4s %6s %6s %3s %3s %-13s %10s %10s  %s\n", "dtype", "d", "causal", "N", "B",
              "H", "config", "fwd_ms", "TFLOP/s", "impl");

  // Without --config every shape is timed twice: the SRAM-formula default config, and the config
  // the runtime serves (the tuning DB's choice, else the same default: then one timing serves
  // both rows).
  auto time_kernel = [&](const Kernel& kernel, const AttentionProblem& problem,
                         Row* row) -> std::optional<double> {
    size_t next_set = 0;
    auto work = [&]() -> Status {
      const TensorSet& set = sets[next_set++ % sets.size()];
      return kernel.launch(
          problem, {set.q.get(), set.k.get(), set.v.get(), set.o.get(), set.lse.as<float>()});
    };
    // Warm-up (first launch, clocks) and an estimate of one launch.
    Result<double> estimate = backend.time_ms(work, 3);
    if (!estimate.ok()) {
      row->error = estimate.error().describe();
      return std::nullopt;
    }
    const double per_batch_ms = options.target_ms / kTimedBatches;
    const int reps =
        std::max(kMinRepsPerBatch,
                 static_cast<int>(std::ceil(per_batch_ms / std::max(estimate.value(), 1e-3))));
    std::vector<double> batches;
    for (int b = 0; b < kTimedBatches; ++b) {
      Result<double> timed = backend.time_ms(work, reps);
      if (!timed.ok()) {
        row->error = timed.error().describe();
        return std::nullopt;
      }
      batches.push_back(timed.value());
    }
    return median(batches);
  };

  std::vector<Row> rows;
  int failures = 0;
  for (int d : options.head_dims) {
    for (bool causal : {false, true}) {
      for (int64_t n : options.seqlens) {
        Row base;
        base.dtype = to_string(options.dtype);
        base.d = d;
        base.causal = causal;
        base.n = n;
        base.batch = std::max<int64_t>(1, options.tokens / n);
        base.heads = std::max<int64_t>(1, options.hidden / d);
        const AttentionProblem problem = AttentionProblem::make(
            base.batch, base.heads, base.heads, n, n, d, options.dtype, causal, Layout::BSHD);

        // (impl, kernel) pairs to time for this shape.
        std::vector<std::pair<std::string, Result<std::shared_ptr<Kernel>>>> variants;
        if (options.config) {
          variants.emplace_back("flashjit-" + options.config->to_string(),
                                runtime.attention(problem, *options.config));
        } else {
          Result<AttentionConfig> fallback = default_config(problem, device);
          variants.emplace_back("flashjit-default",
                                fallback.ok() ? runtime.attention(problem, fallback.value())
                                              : Result<std::shared_ptr<Kernel>>(fallback.error()));
          variants.emplace_back("flashjit-tuned", runtime.attention(problem));
        }
        std::optional<double> default_ms;
        std::string default_config_name;
        for (auto& [impl, kernel] : variants) {
          Row row = base;
          row.impl = impl;
          std::optional<double> ms;
          if (!kernel.ok()) {
            row.error = kernel.error().describe();
          } else {
            row.config = kernel.value()->config().to_string();
            ms = impl == "flashjit-tuned" && default_ms && row.config == default_config_name
                     ? default_ms
                     : time_kernel(*kernel.value(), problem, &row);
            if (impl == "flashjit-default") {
              default_ms = ms;
              default_config_name = row.config;
            }
          }
          if (ms) {
            row.fwd_ms = *ms;
            row.fwd_tflops = problem.flops() / (*ms * 1e-3) / 1e12;
            std::printf("%-5s %4d %6s %6lld %3lld %3lld %-13s %10.4f %10.1f  %s\n",
                        row.dtype.c_str(), d, causal ? "yes" : "no", static_cast<long long>(n),
                        static_cast<long long>(row.batch), static_cast<long long>(row.heads),
                        row.config.c_str(), row.fwd_ms, row.fwd_tflops, impl.c_str());
          } else {
            ++failures;
            std::printf("%-5s %4d %6s %6lld %3lld %3lld ERROR: %s (%s)\n", row.dtype.c_str(), d,
                        causal ? "yes" : "no", static_cast<long long>(n),
                        static_cast<long long>(row.batch), static_cast<long long>(row.heads),
                        row.error.c_str(), impl.c_str());
          }
          std::fflush(stdout);
          rows.push_back(row);
        }
      }
    }
  }

  if (options.json_path) {
    if (!write_json(*options.json_path, rows)) {
      std::fprintf(stderr, "bench_attention: cannot write %s\n", options.json_path->c_str());
      return 1;
    }
    std::printf("# wrote %zu rows to %s\n", rows.size(), options.json_path->c_str());
  }
  return failures == 0 ? 0 : 1;
}
