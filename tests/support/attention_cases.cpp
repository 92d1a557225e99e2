#include "support/attention_cases.hpp"

#include <chrono>
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
