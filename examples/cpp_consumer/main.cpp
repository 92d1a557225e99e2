// A program using an installed flashjit: one attention forward on the CPU backend (fp32, GQA,
// causal, seqlen_q != seqlen_k), checked against a naive fp64 reference. Prints the config and
// where it came from (the tuning DBs: the user DB, then the shipped ones), then the error.
// Exit status 0 when the output matches, 1 otherwise (or on any error).
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "runtime/runtime.hpp"

namespace {

// o[b, s, h, :] = softmax(scale q k^T + causal mask aligned bottom-right) v, BSHD, in doubles.
std::vector<double> reference(const flashjit::AttentionProblem& p, const std::vector<float>& q,
                              const std::vector<float>& k, const std::vector<float>& v) {
  const int64_t d = p.head_dim, hq = p.heads_q, hk = p.heads_kv;
  std::vector<double> o(q.size());
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / (hq / hk);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const float* qi = &q[((b * p.seqlen_q + i) * hq + h) * d];
        const int64_t last = p.causal ? i + p.seqlen_k - p.seqlen_q : p.seqlen_k - 1;
        std::vector<double> s;
        double top = -INFINITY;
        for (int64_t j = 0; j <= last; ++j) {
          const float* kj = &k[((b * p.seqlen_k + j) * hk + kh) * d];
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += double(qi[c]) * kj[c];
          s.push_back(dot * p.scale());
          top = std::max(top, s.back());
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - top));
        double* oi = &o[((b * p.seqlen_q + i) * hq + h) * d];
        for (int64_t j = 0; j <= last; ++j) {
          const float* vj = &v[((b * p.seqlen_k + j) * hk + kh) * d];
          for (int64_t c = 0; c < d; ++c) oi[c] += s[j] / sum * vj[c];
        }
      }
    }
  }
  return o;
}

const char* source_name(flashjit::ChoiceSource source) {
  switch (source) {
    case flashjit::ChoiceSource::Exact:
      return "tuned";
    case flashjit::ChoiceSource::NearestBucket:
      return "nearest tuned bucket";
    default:
      return "default";
  }
}

}  // namespace

int main() {
  flashjit::RuntimeOptions options;  // backend: $FLASHJIT_BACKEND, else a GPU, else the CPU
  options.system_dbs.emplace_back(FLASHJIT_TUNING_DIR);
  auto runtime = flashjit::Runtime::create(options);
  if (!runtime.ok()) {
    std::fprintf(stderr, "cpp_consumer: %s\n", runtime.error().describe().c_str());
    return 1;
  }
  if ((*runtime)->backend().name() != "cpu") {
    std::fprintf(stderr, "cpp_consumer: runs on the CPU backend (set FLASHJIT_BACKEND=cpu)\n");
    return 1;
  }
  // batch 2, 4 query heads sharing 2 key/value heads, 37 queries over 53 keys, head dim 64.
  const auto problem = flashjit::AttentionProblem::make(2, 4, 2, 37, 53, 64, flashjit::DType::F32,
                                                        /*causal=*/true);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto random = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& value : x) value = normal(rng);
    return x;
  };
  const int64_t d = problem.head_dim;
  const std::vector<float> q = random(problem.batch * problem.seqlen_q * problem.heads_q * d);
  const std::vector<float> k = random(problem.batch * problem.seqlen_k * problem.heads_kv * d);
  const std::vector<float> v = random(problem.batch * problem.seqlen_k * problem.heads_kv * d);
  std::vector<float> o(q.size(), NAN);  // poisoned: every element must be written

  auto selected = (*runtime)->select_config(problem);
  auto kernel = (*runtime)->attention(problem);
  if (!selected.ok() || !kernel.ok()) {
    std::fprintf(stderr, "cpp_consumer: %s\n",
                 (selected.ok() ? kernel.error() : selected.error()).describe().c_str());
    return 1;
  }
  flashjit::Status status = (*kernel)->launch(problem, {q.data(), k.data(), v.data(), o.data()});
  if (status.ok()) status = (*runtime)->backend().synchronize();
  if (!status.ok()) {
    std::fprintf(stderr, "cpp_consumer: %s\n", status.error().describe().c_str());
    return 1;
  }

  const std::vector<double> expected = reference(problem, q, k, v);
  double error = 0, norm = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    const double diff = std::isnan(o[i]) ? INFINITY : o[i] - expected[i];
    error += diff * diff;
    norm += expected[i] * expected[i];
  }
  const double relative = std::sqrt(error / norm);
  std::printf("problem %s\nconfig %s (%s)\nrelative L2 error vs fp64: %.3g\n",
              problem.to_string().c_str(), (*kernel)->config().to_string().c_str(),
              source_name(selected->second), relative);
  return relative < 1e-5 ? 0 : 1;
}
