#include "support/attention_cases.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <system_error>

#include "runtime/runtime.hpp"
#include "support/parallel.hpp"

namespace flashjit::testing {

std::string Shape::to_string() const {
  static const char* const kStorageNames[] = {"bshd", "bshd-padded", "bhsd"};
  return "(b" + std::to_string(batch) + " hq" + std::to_string(heads_q) + " hkv" +
         std::to_string(heads_kv) + " sq" + std::to_string(seqlen_q) + " sk" +
         std::to_string(seqlen_k) + " " + kStorageNames[static_cast<int>(storage)] + ")";
}

std::string emulation_case_name(int head_dim, const AttentionConfig& config, DType dtype,
                                bool causal) {
  // Built by appending: gcc 12 warns falsely (-Wrestrict) on "literal" + std::string&&.
  std::string text = "d";
  text += std::to_string(head_dim);
  text += "_";
  std::string knobs = config.to_string();  // gtest names allow no '-'
  std::replace(knobs.begin(), knobs.end(), '-', '_');
  text += knobs;
  text += "_";
  text += to_string(dtype);
  text += causal ? "_causal" : "_noncausal";
  return text;
}

std::vector<AttentionConfig> selected_families(const std::vector<AttentionConfig>& configs) {
  const char* env = std::getenv("FLASHJIT_TEST_FAMILIES");
  const std::string families = env ? env : "";
  if (families.empty()) return configs;
  static const bool printed = [&] {
    std::printf("FLASHJIT_TEST_FAMILIES=%s: only these kernel families are tested\n", env);
    return true;
  }();
  (void)printed;
  auto selected = [&](KernelFamily family) {
    const char* name = family == KernelFamily::Ws       ? "ws"
                       : family == KernelFamily::Wgmma  ? "wgmma"
                       : family == KernelFamily::Decode ? "decode"
                                                        : "mma";
    // Appended piecewise: gcc 12 warns (-Wrestrict, a false positive) on "literal" + string&&.
    std::string list = ",", wanted = ",";
    list += families;
    list += ",";
    wanted += name;
    wanted += ",";
    return list.find(wanted) != std::string::npos;
  };
  std::vector<AttentionConfig> kept;
  for (const AttentionConfig& c : configs)
    if (selected(c.family)) kept.push_back(c);
  return kept;
}

const std::vector<Shape>& gpu_test_shapes() {
  static const std::vector<Shape> shapes = {
      {1, 2, 2, 1, 1},
      {1, 2, 2, 17, 17},
      {1, 2, 2, 128, 128},
      {1, 1, 1, 1000, 1000},
      {1, 1, 1, 4097, 4097},
      {1, 2, 2, 100, 300},  // more keys than queries
      {1, 2, 2, 300, 100},  // more queries: causal leaves the first 200 rows empty
      {2, 2, 2, 1, 77},     // decode-like single query row
      {2, 8, 2, 257, 257},  // GQA 4:1
      {1, 4, 1, 129, 200},  // MQA
      {3, 2, 2, 64, 64},
      {2, 4, 2, 150, 190, Storage::kBshdPadded},
      {1, 2, 2, 200, 96, Storage::kBshdPadded},
      {2, 4, 4, 130, 130, Storage::kBhsd},
      {2, 4, 2, 70, 170, Storage::kBhsd},
  };
  return shapes;
}

const std::vector<Shape>& emulation_shapes() {
  static const std::vector<Shape> shapes = {
      {1, 1, 1, 1, 1},                          // a single row and key
      {1, 2, 2, 17, 17},                        // ragged tails
      {1, 1, 1, 130, 130},                      // several blocks, a ragged last one
      {1, 2, 2, 40, 100},                       // more keys than queries
      {1, 2, 2, 100, 40},                       // more queries: causal leaves 60 rows empty
      {2, 4, 2, 33, 65},                        // GQA 2:1, batches
      {1, 4, 1, 20, 50},                        // MQA
      {2, 2, 2, 50, 70, Storage::kBhsd},        // BHSD
      {1, 2, 2, 45, 77, Storage::kBshdPadded},  // padded strides, different per tensor
  };
  return shapes;
}

Strides padded_bshd(int64_t seqlen, int64_t heads, int head_dim, int head_pad, int seq_pad,
                    int batch_pad) {
  Strides strides;
  strides.head = head_dim + head_pad;
  strides.seq = heads * strides.head + seq_pad;
  strides.batch = seqlen * strides.seq + batch_pad;
  return strides;
}

AttentionProblem make_problem(const Shape& shape, int head_dim, DType dtype, bool causal,
                              Pass pass) {
  const Layout layout = shape.storage == Storage::kBhsd ? Layout::BHSD : Layout::BSHD;
  AttentionProblem problem =
      AttentionProblem::make(shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q,
                             shape.seqlen_k, head_dim, dtype, causal, layout);
  problem.pass = pass;
  if (shape.storage == Storage::kBshdPadded) {
    const int64_t sq = shape.seqlen_q, sk = shape.seqlen_k;
    const int64_t hq = shape.heads_q, hkv = shape.heads_kv;
    problem.q_strides = padded_bshd(sq, hq, head_dim, 8, 24, 16);
    problem.k_strides = padded_bshd(sk, hkv, head_dim, 16, 24, 8);
    problem.v_strides = padded_bshd(sk, hkv, head_dim, 24, 8, 32);
    problem.o_strides = padded_bshd(sq, hq, head_dim, 8, 40, 8);
    problem.do_strides = padded_bshd(sq, hq, head_dim, 16, 8, 24);
    problem.dq_strides = padded_bshd(sq, hq, head_dim, 24, 16, 8);
    problem.dk_strides = padded_bshd(sk, hkv, head_dim, 8, 8, 16);
    problem.dv_strides = padded_bshd(sk, hkv, head_dim, 32, 16, 8);
  }
  return problem;
}

TestCache::TestCache() {
  const char* env = std::getenv("FLASHJIT_CACHE_DIR");
  shared_ = env != nullptr && *env != '\0';
  if (shared_) {
    dir_ = BinaryCache::default_dir();
  } else {
    std::random_device entropy;
    dir_ = std::filesystem::temp_directory_path() /
           ("flashjit-test-cache-" + std::to_string(entropy()) + std::to_string(entropy()));
  }
  cache_ = std::make_unique<BinaryCache>(dir_);
}

TestCache::~TestCache() {
  if (!shared_) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

std::vector<BuiltKernel> build_all(const Backend& backend, const BinaryCache* cache,
                                   const AttentionProblem& problem,
                                   const std::vector<AttentionConfig>& configs) {
  return parallel_map<BuiltKernel>(configs.size(), [&](size_t i) {
    BuiltKernel built;
    built.config = configs[i];
    const auto start = std::chrono::steady_clock::now();
    Result<std::shared_ptr<Kernel>> kernel = build_kernel(backend, cache, problem, configs[i]);
    built.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (kernel.ok()) {
      built.kernel = kernel.value();
    } else {
      built.error = kernel.error().describe();
    }
    return built;
  });
}

}  // namespace flashjit::testing
