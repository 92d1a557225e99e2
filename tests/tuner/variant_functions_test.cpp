// The fp64 reference's own evaluation of user expressions (issue 17, tuner/variant_functions):
// the JIT'd score_mod / mask_mod / score_mod_grad equal hand-written host functions on random
// arguments, float literals are evaluated in double, a bad expression is a typed error quoting
// it, host functions the caller gives win, and the reference of a variant problem computed with
// JIT'd functions matches the one with hand-written functions (forward and backward). Without
// the CPU backend those tests run on the host compiler's functions.
//
// The host's C++ compiler forced (issue 17: what a build without the CPU backend uses; tested
// here beside the JIT): the same values as the JIT and as hand-written functions on random
// arguments, the shared object reused from the cache folder by a fresh process cache with no
// compile (a corrupt one compiled again), a bad expression quoted in a CompileFailed, compilers
// that do not run named in an Unsupported, one compile for two threads asking at once, and the
// reference of a score_mod + mask_mod problem (forward and backward) equal to the JIT's.
#include "tuner/variant_functions.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "runtime/host_compiler.hpp"
#include "runtime/runtime.hpp"
#include "tuner/reference.hpp"

namespace flashjit {
namespace {

TEST(DoubleExpression, DropsTheSuffixOfFloatLiteralsOnly) {
  EXPECT_EQ(double_expression("score - 0.1f * abs(q_idx - kv_idx)"),
            "score - 0.1 * abs(q_idx - kv_idx)");
  EXPECT_EQ(double_expression("1e-3f + 2.F + .5f + 1.5e+2f"), "1e-3 + 2. + .5 + 1.5e+2");
  // Hexadecimal integers, names with digits and plain integers stay as they are.
  EXPECT_EQ(double_expression("0x1f + x2f + q_idx / 64 + 1.0"), "0x1f + x2f + q_idx / 64 + 1.0");
  EXPECT_EQ(double_expression("score*1.0f-kv_idx"), "score*1.0-kv_idx");
}

struct Arguments {
  double score;
  int64_t batch, head, q_idx, kv_idx;
};

std::vector<Arguments> random_arguments(int count) {
  std::mt19937_64 rng(17);
  std::normal_distribution<double> score(0.0, 4.0);
  std::uniform_int_distribution<int64_t> small(0, 16), index(0, 5000);
  std::vector<Arguments> out;
  for (int i = 0; i < count; ++i)
    out.push_back({score(rng), small(rng), small(rng), index(rng), index(rng)});
  out.push_back({0.0, 0, 0, 0, 0});
  out.push_back({-1e6, 1, 0, 999, 1});
  return out;
}

// Equal to the last bits but for an FMA contraction (-O3, the host CPU): relative 1e-14; the host
// compiler's -O2 against the JIT's -O3: 1e-12.
void expect_close(double expected, double actual, double relative = 1e-14) {
  EXPECT_NEAR(actual, expected, relative * std::max(1.0, std::abs(expected)));
}

Variant tanh_variant() {
  Variant v;
  v.score_mod = "5.0f * tanh(score / 5.0f) - 0.1f * abs(q_idx - kv_idx) + 0.25f * head";
  v.mask_mod = "(q_idx / 64) == (kv_idx / 64) || max(batch, head) > 12 || min(q_idx, kv_idx) < 3";
  v.score_mod_grad = "1.0f - tanh(score / 5.0f) * tanh(score / 5.0f)";
  return v;
}

// `f` (of tanh_variant()) equals hand-written functions on random arguments.
void expect_tanh_variant(const VariantFunctions& f, double relative) {
  ASSERT_TRUE(f.score_mod && f.mask_mod && f.score_mod_grad);
  int masked = 0, seen = 0;
  for (const Arguments& a : random_arguments(2000)) {
    const double distance = static_cast<double>(std::llabs(a.q_idx - a.kv_idx));
    // In double: 0.1, not float's 0.1f (which is 0.1 + 1.5e-9).
    expect_close(5.0 * std::tanh(a.score / 5.0) - 0.1 * distance + 0.25 * a.head,
                 f.score_mod(a.score, a.batch, a.head, a.q_idx, a.kv_idx), relative);
    const double t = std::tanh(a.score / 5.0);
    expect_close(1.0 - t * t, f.score_mod_grad(a.score, a.batch, a.head, a.q_idx, a.kv_idx),
                 relative);
    const bool expected = a.q_idx / 64 == a.kv_idx / 64 || std::max(a.batch, a.head) > 12 ||
                          std::min(a.q_idx, a.kv_idx) < 3;
    EXPECT_EQ(f.mask_mod(a.batch, a.head, a.q_idx, a.kv_idx), expected)
        << a.batch << " " << a.head << " " << a.q_idx << " " << a.kv_idx;
    (expected ? seen : masked) += 1;
  }
  EXPECT_GT(masked, 100);  // both outcomes happen
  EXPECT_GT(seen, 100);
}

TEST(VariantFunctionsOf, EqualHandWrittenFunctionsOnRandomArguments) {
  Result<VariantFunctions> f = variant_functions_of(tanh_variant());
  ASSERT_TRUE(f.ok()) << f.error().describe();
  expect_tanh_variant(*f, 1e-14);
}

TEST(VariantFunctionsOf, IndicesAreSixtyFourBitAndOnlyGivenExpressionsCompile) {
  Variant v;
  v.score_mod = "score + q_idx * kv_idx";  // 3e9 * 3e9 overflows 32 bits
  Result<VariantFunctions> f = variant_functions_of(v);
  ASSERT_TRUE(f.ok()) << f.error().describe();
  EXPECT_FALSE(f->mask_mod);
  EXPECT_FALSE(f->score_mod_grad);
  EXPECT_EQ(f->score_mod(0.5, 0, 0, 3000000000LL, 3), 0.5 + 9000000000.0);
  // Again (from the cache: nothing compiled): the same values; the functions outlive another
  // copy's release.
  const size_t modules = compiled_expression_modules();
  Result<VariantFunctions> again = variant_functions_of(v);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(compiled_expression_modules(), modules);
  f = Result<VariantFunctions>(VariantFunctions{});
  EXPECT_EQ(again->score_mod(-2.0, 0, 0, 7, 5), 33.0);
  EXPECT_TRUE(variant_functions_of(Variant{}).ok());
  // Other text: another module.
  v.score_mod = "score + q_idx * kv_idx + 1";
  ASSERT_TRUE(variant_functions_of(v).ok());
  EXPECT_EQ(compiled_expression_modules(), modules + 1);
}

// A bad mask_mod beside a good score_mod compiled `how`: CompileFailed quoting the bad one only and
// the compiler's error line. Returns the message.
std::string expect_bad_mask_mod_quoted(const ExpressionCompiler& how) {
  Variant v;
  v.score_mod = "score * 2.0f";
  v.mask_mod = "q_idx >= no_such_variable";
  Result<VariantFunctions> f = variant_functions_of(v, how);
  EXPECT_FALSE(f.ok());
  if (f.ok()) return "";
  EXPECT_EQ(f.error().code, ErrorCode::CompileFailed);
  const std::string& message = f.error().message;
  EXPECT_NE(message.find("mask_mod = \"q_idx >= no_such_variable\" does not compile"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("no_such_variable"), std::string::npos) << message;
  EXPECT_NE(message.find("error:"), std::string::npos) << message;
  EXPECT_EQ(message.find("score_mod = "), std::string::npos) << message;  // only the bad one
  return message;
}

TEST(VariantFunctionsOf, ABadExpressionIsATypedErrorQuotingIt) {
  expect_bad_mask_mod_quoted(ExpressionCompiler{});
}

TEST(CompleteVariantFunctions, GivenFunctionsWinAndTheForwardNeedsNoDerivative) {
  AttentionProblem problem = AttentionProblem::make(1, 2, 2, 17, 17, 32, DType::F32, false);
  problem.variant.score_mod = "score * 0.5f";
  problem.variant.mask_mod = "kv_idx <= q_idx + 1";
  problem.variant.score_mod_grad = "0.5f";
  VariantFunctions given;
  given.score_mod = [](double, int64_t, int64_t, int64_t, int64_t) { return 42.0; };
  Result<VariantFunctions> forward = complete_variant_functions(problem, given);
  ASSERT_TRUE(forward.ok()) << forward.error().describe();
  EXPECT_EQ(forward->score_mod(1.0, 0, 0, 0, 0), 42.0);
  ASSERT_TRUE(forward->mask_mod);
  EXPECT_TRUE(forward->mask_mod(0, 0, 3, 4));
  EXPECT_FALSE(forward->mask_mod(0, 0, 3, 5));
  EXPECT_FALSE(forward->score_mod_grad);
  Result<VariantFunctions> backward =
      complete_variant_functions(problem.with_pass(Pass::Backward), given);
  ASSERT_TRUE(backward.ok()) << backward.error().describe();
  ASSERT_TRUE(backward->score_mod_grad);
  EXPECT_EQ(backward->score_mod_grad(3.0, 0, 0, 0, 0), 0.5);
  EXPECT_EQ(backward->score_mod(1.0, 0, 0, 0, 0), 42.0);
}

double max_abs_difference(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isinf(a[i]) && a[i] == b[i]) continue;  // rows with no key: lse +inf in both
    worst = std::max(worst, std::abs(a[i] - b[i]));
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
  }
  return worst;
}

void expect_same_reference(const AttentionProblem& problem, const Reference& expected,
                           const Reference& actual) {
  EXPECT_LT(max_abs_difference(expected.o, actual.o), 1e-12);
  EXPECT_LT(max_abs_difference(expected.lse, actual.lse), 1e-12);
  if (problem.is_backward()) {
    EXPECT_FALSE(actual.dq.empty());
    EXPECT_LT(max_abs_difference(expected.dq, actual.dq), 1e-12);
    EXPECT_LT(max_abs_difference(expected.dk, actual.dk), 1e-12);
    EXPECT_LT(max_abs_difference(expected.dv, actual.dv), 1e-12);
  }
}

// Odd sizes, GQA, causal, a score_mod and a mask_mod (and the derivative of the score_mod).
AttentionProblem score_and_mask_problem() {
  AttentionProblem forward = AttentionProblem::make(2, 4, 2, 33, 47, 32, DType::F32, true);
  forward.variant.score_mod = "score - 0.1f * abs(q_idx - kv_idx) + 0.05f * tanh(score)";
  forward.variant.mask_mod = "(kv_idx % 5) != 1 || batch == 1";
  forward.variant.score_mod_grad = "1.0f + 0.05f * (1.0f - tanh(score) * tanh(score))";
  return forward;
}

// The reference of a score_mod + mask_mod problem (odd sizes, GQA, causal; forward and
// backward) with JIT'd functions matches the one with hand-written functions, and differs from
// that of another score_mod (the comparison can fail).
TEST(CompleteVariantFunctions, TheReferenceMatchesHandWrittenFunctions) {
  const AttentionProblem forward = score_and_mask_problem();
  VariantFunctions hand;
  hand.score_mod = [](double s, int64_t, int64_t, int64_t q, int64_t k) {
    return s - 0.1 * static_cast<double>(std::llabs(q - k)) + 0.05 * std::tanh(s);
  };
  hand.mask_mod = [](int64_t b, int64_t, int64_t, int64_t k) { return k % 5 != 1 || b == 1; };
  hand.score_mod_grad = [](double s, int64_t, int64_t, int64_t, int64_t) {
    return 1.0 + 0.05 * (1.0 - std::tanh(s) * std::tanh(s));
  };
  for (const AttentionProblem& problem : {forward, forward.with_pass(Pass::Backward)}) {
    SCOPED_TRACE(problem.to_string());
    Result<VariantFunctions> jit = complete_variant_functions(problem, {});
    ASSERT_TRUE(jit.ok()) << jit.error().describe();
    const HostInputs inputs = random_inputs(problem, 7, hand);
    const Reference expected = reference_attention(problem, inputs, hand);
    const Reference actual = reference_attention(problem, inputs, *jit);
    expect_same_reference(problem, expected, actual);
    AttentionProblem other = problem;
    other.variant.score_mod = "score - 0.1f * abs(q_idx - kv_idx)";
    Result<VariantFunctions> other_jit = complete_variant_functions(other, {});
    ASSERT_TRUE(other_jit.ok()) << other_jit.error().describe();
    EXPECT_GT(max_abs_difference(expected.o, reference_attention(other, inputs, *other_jit).o),
              1e-4);
  }
}

namespace fs = std::filesystem;

class HostExpressions : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("flashjit-host-expressions-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  // The host compiler forced, into this test's own cache folder.
  ExpressionCompiler host(bool process_cache) const {
    ExpressionCompiler how;
    how.host_compiler = true;
    how.host.cache_dir = dir_;
    how.process_cache = process_cache;
    return how;
  }
  std::vector<fs::path> libraries() const {
    std::vector<fs::path> out;
    if (fs::exists(dir_))
      for (const auto& entry : fs::directory_iterator(dir_)) out.push_back(entry.path());
    return out;
  }
  fs::path dir_;
};

TEST_F(HostExpressions, EqualTheDefaultWayAndHandWrittenFunctions) {
  Result<VariantFunctions> host = variant_functions_of(tanh_variant(), this->host(false));
  ASSERT_TRUE(host.ok()) << host.error().describe();
  expect_tanh_variant(*host, 1e-12);
  // The default way: the Clang JIT in a build with the CPU backend.
  Result<VariantFunctions> other = variant_functions_of(tanh_variant());
  ASSERT_TRUE(other.ok()) << other.error().describe();
  for (const Arguments& a : random_arguments(500)) {
    expect_close(other->score_mod(a.score, a.batch, a.head, a.q_idx, a.kv_idx),
                 host->score_mod(a.score, a.batch, a.head, a.q_idx, a.kv_idx), 1e-12);
    expect_close(other->score_mod_grad(a.score, a.batch, a.head, a.q_idx, a.kv_idx),
                 host->score_mod_grad(a.score, a.batch, a.head, a.q_idx, a.kv_idx), 1e-12);
    EXPECT_EQ(other->mask_mod(a.batch, a.head, a.q_idx, a.kv_idx),
              host->mask_mod(a.batch, a.head, a.q_idx, a.kv_idx));
  }
}

TEST_F(HostExpressions, AFreshProcessCacheLoadsTheLibraryWithoutCompiling) {
  Variant v;
  v.score_mod = "score * 3.0f + q_idx * kv_idx";  // 64-bit indices: 3e9 * 3 overflows 32 bits
  const size_t compiles = host_compiles();
  Result<VariantFunctions> first = variant_functions_of(v, host(false));
  ASSERT_TRUE(first.ok()) << first.error().describe();
  EXPECT_EQ(host_compiles(), compiles + 1);
  const std::vector<fs::path> files = libraries();
  ASSERT_EQ(files.size(), 1u);  // the library alone: no temporary file left
  EXPECT_EQ(files[0].extension(), ".so");
  const auto written = fs::last_write_time(files[0]);
  // Another "process": nothing in its cache; the file is loaded, not compiled nor rewritten.
  Result<VariantFunctions> second = variant_functions_of(v, host(false));
  ASSERT_TRUE(second.ok()) << second.error().describe();
  EXPECT_EQ(host_compiles(), compiles + 1);
  EXPECT_EQ(libraries(), files);
  EXPECT_EQ(fs::last_write_time(files[0]), written);
  first = Result<VariantFunctions>(VariantFunctions{});  // the second outlives the first
  EXPECT_EQ(second->score_mod(0.5, 0, 0, 3000000000LL, 3), 1.5 + 9000000000.0);
  // A corrupt file (once nothing has it loaded) is compiled again and replaced.
  second = Result<VariantFunctions>(VariantFunctions{});
  fs::resize_file(files[0], 100);
  Result<VariantFunctions> third = variant_functions_of(v, host(false));
  ASSERT_TRUE(third.ok()) << third.error().describe();
  EXPECT_EQ(host_compiles(), compiles + 2);
  EXPECT_EQ(libraries(), files);
  EXPECT_GT(fs::file_size(files[0]), 100u);
  EXPECT_EQ(third->score_mod(-1.0, 0, 0, 7, 5), 32.0);
}

TEST_F(HostExpressions, ABadExpressionIsCompileFailedQuotingIt) {
  const std::string message = expect_bad_mask_mod_quoted(host(false));
  EXPECT_NE(message.find("the host C++ compiler"), std::string::npos) << message;
  EXPECT_TRUE(libraries().empty());  // no library, no temporary file
}

TEST_F(HostExpressions, NoCompilerThatRunsIsUnsupportedNamingThem) {
  Variant v;
  v.score_mod = "score * 2.0f";
  ExpressionCompiler how = host(false);
  how.host.compilers = {"/no/such/dir/c++", "flashjit-no-such-compiler-17", "/bin/false"};
  Result<VariantFunctions> f = variant_functions_of(v, how);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code, ErrorCode::Unsupported);
  for (const char* named : {"/no/such/dir/c++", "flashjit-no-such-compiler-17", "/bin/false",
                            "score * 2.0f", "FLASHJIT_HOST_CXX"})
    EXPECT_NE(f.error().message.find(named), std::string::npos) << named << f.error().message;
  // The environment's override is the only compiler tried.
  ASSERT_EQ(setenv("FLASHJIT_HOST_CXX", "/no/such/dir/g++-99", 1), 0);
  EXPECT_EQ(host_compilers(), std::vector<std::string>{"/no/such/dir/g++-99"});
  f = variant_functions_of(v, host(false));
  unsetenv("FLASHJIT_HOST_CXX");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code, ErrorCode::Unsupported);
  EXPECT_NE(f.error().message.find("/no/such/dir/g++-99"), std::string::npos) << f.error().message;
  EXPECT_TRUE(libraries().empty());
  EXPECT_FALSE(host_compilers().empty());
}

TEST_F(HostExpressions, TwoThreadsAskingAtOnceGetOneCompile) {
  Variant v;  // text no other test compiles: not in the process cache yet
  v.score_mod = "score + 0.0625f * kv_idx - " + std::to_string(getpid() % 1000) + ".0f";
  const size_t compiles = host_compiles();
  const size_t modules = compiled_expression_modules();
  std::vector<Result<VariantFunctions>> results(2, Result<VariantFunctions>(VariantFunctions{}));
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] { results[t] = variant_functions_of(v, host(true)); });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(host_compiles(), compiles + 1);
  EXPECT_EQ(compiled_expression_modules(), modules + 1);
  const double shift = static_cast<double>(getpid() % 1000);
  for (const auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.error().describe();
    ASSERT_TRUE(result->score_mod);
    EXPECT_EQ(result->score_mod(1.5, 0, 0, 0, 32), 1.5 + 2.0 - shift);
  }
}

// The reference of a score_mod + mask_mod problem (odd sizes, GQA, causal; forward and backward)
// with the host compiler's functions equals the default way's, and differs from that of another
// score_mod (the comparison can fail).
TEST_F(HostExpressions, TheReferenceEqualsTheDefaultWays) {
  const AttentionProblem forward = score_and_mask_problem();
  for (const AttentionProblem& problem : {forward, forward.with_pass(Pass::Backward)}) {
    SCOPED_TRACE(problem.to_string());
    Result<VariantFunctions> host = variant_functions_of(problem.variant, this->host(true));
    ASSERT_TRUE(host.ok()) << host.error().describe();
    Result<VariantFunctions> other = complete_variant_functions(problem, {});
    ASSERT_TRUE(other.ok()) << other.error().describe();
    const HostInputs inputs = random_inputs(problem, 7, *other);
    const Reference expected = reference_attention(problem, inputs, *other);
    const Reference actual = reference_attention(problem, inputs, *host);
    expect_same_reference(problem, expected, actual);
    Variant changed = problem.variant;
    changed.score_mod = "score - 0.1f * abs(q_idx - kv_idx)";
    Result<VariantFunctions> changed_host = variant_functions_of(changed, this->host(true));
    ASSERT_TRUE(changed_host.ok()) << changed_host.error().describe();
    AttentionProblem other_problem = problem;
    other_problem.variant = changed;
    EXPECT_GT(
        max_abs_difference(expected.o, reference_attention(other_problem, inputs, *changed_host).o),
        1e-4);
  }
}

}  // namespace
}  // namespace flashjit
