// The tuner on attention variants and K/V cache layouts (issues 17 and 18: "tuned like any other
// problem, the variant is part of the DB key"): the small problem kernels are verified on keeps
// the variant and the layout (the same kernel signature), and on the CPU backend a window +
// softcap problem and an ALiBi problem are tuned, stored under their variant keys (a plain problem
// of the same shape does not see them) and served by the Runtime. Skips without the CPU backend.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "generator/render.hpp"
#include "runtime/runtime.hpp"
#include "tuner/reference.hpp"
#include "tuner/tuner.hpp"
#include "tuner/variant_functions.hpp"
#include "tuner/workload.hpp"

#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.hpp"
#endif

namespace flashjit {
namespace {

namespace fs = std::filesystem;

Variant window_softcap() {
  Variant v;
  v.window_left = 24;
  v.window_right = 0;
  v.softcap = 20.0f;
  return v;
}

AttentionProblem with_variant(AttentionProblem p, const Variant& v) {
  p.variant = v;
  return p;
}

TEST(VerificationProblem, KeepsTheSignatureVariantAndLayout) {
  const AttentionProblem prefill =
      AttentionProblem::make(4, 16, 4, 3000, 3000, 128, DType::BF16, true);
  Variant alibi_prefix;
  alibi_prefix.alibi = true;
  alibi_prefix.prefix = 1000;  // longer than the small problem: still the same key
  Variant mods;
  mods.score_mod = "score * 0.5f";
  mods.mask_mod = "kv_idx != 3";
  const std::vector<AttentionProblem> problems = {
      prefill,
      with_variant(prefill, window_softcap()),
      with_variant(prefill, alibi_prefix),
      with_variant(prefill, mods),
      AttentionProblem::make_varlen(7, 16, 4, 2000, 2500, 9000, 11000, 128, DType::F16, true),
      AttentionProblem::make(8, 32, 8, 1, 5000, 128, DType::BF16, false).with_paged_kv(32, 8 * 157),
      [] {
        AttentionProblem p = AttentionProblem::make(8, 32, 8, 1, 5000, 128, DType::BF16, false);
        p.kv.seqlens_k = true;
        return p;
      }(),
      prefill.with_pass(Pass::Backward),
      AttentionProblem::make_varlen(7, 16, 4, 2000, 2500, 9000, 11000, 128, DType::F16, true)
          .with_pass(Pass::Backward),
  };
  for (const AttentionProblem& problem : problems) {
    SCOPED_TRACE(problem.to_string());
    ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
    const AttentionProblem small = verification_problem(problem, 2, 65, 77);
    EXPECT_TRUE(validate(small).ok()) << validate(small).error().describe();
    EXPECT_EQ(ProblemSignature::of(small), ProblemSignature::of(problem));
    EXPECT_EQ(small.group_size(), problem.group_size());
    EXPECT_EQ(small.heads_kv, 2);
    EXPECT_EQ(small.seqlen_q, 65);
    EXPECT_EQ(small.seqlen_k, 77);
    EXPECT_EQ(small.deterministic, problem.deterministic);
    const bool per_sequence = problem.variant.varlen || problem.kv.paged() || problem.kv.seqlens_k;
    EXPECT_EQ(small.batch, per_sequence ? 3 : 1);
    if (problem.variant.varlen) {  // 3 documents, none longer than the longest
      EXPECT_EQ(small.variant.total_q, 3 * 65 - 5);
      EXPECT_EQ(small.variant.total_k, 3 * 77 - 7);
    }
    if (problem.kv.paged()) {  // every sequence's pages distinct
      EXPECT_EQ(small.kv.max_pages, 3);
      EXPECT_EQ(small.kv.num_pages, 9);
    }
    // The timing and verification tensors include the variant's and the layout's.
    EXPECT_EQ(tensor_specs(small).size(), tensor_specs(problem).size());
  }
}

#if FLASHJIT_HAVE_CPU_BACKEND

class TunerVariantCpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("flashjit-tuner-variant-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Result<std::unique_ptr<cpu::CpuBackend>> backend = cpu::CpuBackend::create();
    ASSERT_TRUE(backend.ok()) << backend.error().describe();
    backend_ = std::move(backend.value());
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  static TuneOptions tiny() {
    TuneOptions options;
    options.warmup_ms = 1;
    options.min_time_ms = 3;
    options.min_samples = 3;
    options.max_samples = 8;
    options.retime_top = 1;
    options.max_compile_threads = 2;
    options.lock_dir = (fs::temp_directory_path() / "flashjit-tuner-variant-locks").string();
    return options;
  }
  fs::path dir_;
  std::unique_ptr<cpu::CpuBackend> backend_;
};

TEST_F(TunerVariantCpuTest, VariantProblemsAreTunedStoredUnderTheirKeyAndServed) {
  const fs::path db = dir_ / "tuning.db";
  const AttentionProblem plain = AttentionProblem::make(1, 4, 2, 96, 96, 32, DType::F32, true);
  Variant alibi;
  alibi.alibi = true;
  // (The varlen backward: its offsets uploaded with the backward's inputs, tensor_specs.)
  const std::vector<AttentionProblem> variants = {
      with_variant(plain, window_softcap()), with_variant(plain, alibi),
      AttentionProblem::make_varlen(3, 4, 2, 40, 40, 100, 100, 32, DType::F32, true)
          .with_pass(Pass::Backward)};
  const DeviceFingerprint device = backend_->fingerprint();
  std::vector<AttentionConfig> chosen;
  {
    Result<std::unique_ptr<TuningStore>> store = TuningStore::open(db);
    ASSERT_TRUE(store.ok()) << store.error().describe();
    Tuner tuner(*backend_, nullptr, store->get(), tiny());
    for (const AttentionProblem& problem : variants) {
      SCOPED_TRACE(problem.to_string());
      Result<TuneReport> report = tuner.tune(problem);
      ASSERT_TRUE(report.ok()) << report.error().describe();
      // Every config was verified against the variant's fp64 reference: none is wrong.
      for (const TuneResult& result : report->results) {
        EXPECT_NE(result.status, TuneStatus::WrongResult)
            << result.config.to_string() << ": " << result.message;
        EXPECT_NE(result.status, TuneStatus::CompileFailed)
            << result.config.to_string() << ": " << result.message;
      }
      ASSERT_TRUE(report->choice.has_value()) << report->note;
      EXPECT_EQ(report->key, ProblemKey::of(problem));
      EXPECT_FALSE(report->key.variant.empty());
      Result<std::optional<TuneChoice>> stored = (*store)->choice(device, report->key);
      ASSERT_TRUE(stored.ok() && stored->has_value());
      EXPECT_EQ((*stored)->config, report->choice->config);
      EXPECT_EQ((*store)->results(device, report->key)->size(), report->results.size());
      chosen.push_back(report->choice->config);
    }
    // The plain problem of the same shape sees none of it, exact or nearest.
    EXPECT_FALSE((*store)->choice(device, ProblemKey::of(plain))->has_value());
    EXPECT_FALSE((*store)->nearest_choice(device, ProblemKey::of(plain))->has_value());
    // Stamped with the variant templates' version, current.
    Result<std::vector<TuningStore::Entry>> entries = (*store)->entries();
    ASSERT_TRUE(entries.ok());
    ASSERT_EQ(entries->size(), variants.size());
    for (const TuningStore::Entry& entry : *entries) {
      EXPECT_EQ(entry.generator, variant_generator_version_of(entry.device, entry.key.pass));
      EXPECT_TRUE(entry.current);
    }
  }

  // The Runtime serves the stored choices for the variant problems, the default for the plain.
  RuntimeOptions options;
  options.use_disk_cache = false;
  options.user_db = db;
  options.system_dbs = {};
  options.record_misses = false;
  Result<std::unique_ptr<cpu::CpuBackend>> backend = cpu::CpuBackend::create();
  ASSERT_TRUE(backend.ok());
  Runtime runtime(std::move(backend.value()), options);
  for (size_t i = 0; i < variants.size(); ++i) {
    Result<std::pair<AttentionConfig, ChoiceSource>> selected = runtime.select_config(variants[i]);
    ASSERT_TRUE(selected.ok()) << selected.error().describe();
    EXPECT_EQ(selected->second, ChoiceSource::Exact) << variants[i].to_string();
    EXPECT_EQ(selected->first, chosen[i]) << variants[i].to_string();
  }
  Result<std::pair<AttentionConfig, ChoiceSource>> plain_selected = runtime.select_config(plain);
  ASSERT_TRUE(plain_selected.ok());
  EXPECT_EQ(plain_selected->second, ChoiceSource::Default);
}

// A paged decode problem: verified on 3 sequences of uneven lengths through a shuffled block table.
TEST_F(TunerVariantCpuTest, APagedDecodeProblemIsTunedUnderItsLayoutKey) {
  const AttentionProblem problem =
      AttentionProblem::make(2, 4, 2, 1, 200, 32, DType::F32, false).with_paged_kv(16, 2 * 13);
  ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
  Result<std::unique_ptr<TuningStore>> store = TuningStore::open(dir_ / "tuning.db");
  ASSERT_TRUE(store.ok());
  Tuner tuner(*backend_, nullptr, store->get(), tiny());
  Result<TuneReport> report = tuner.tune(problem);
  ASSERT_TRUE(report.ok()) << report.error().describe();
  for (const TuneResult& result : report->results)
    EXPECT_EQ(result.status, TuneStatus::Timed) << result.config.to_string() << result.message;
  ASSERT_TRUE(report->choice.has_value()) << report->note;
  EXPECT_EQ(report->key.page_size, 16);
  EXPECT_TRUE(report->key.seqlens_k);
  const DeviceFingerprint device = backend_->fingerprint();
  EXPECT_EQ((*store)->choice(device, report->key)->value().config, report->choice->config);
  ProblemKey contiguous = report->key;
  contiguous.page_size = 0;
  contiguous.seqlens_k = false;
  EXPECT_FALSE((*store)->choice(device, contiguous)->has_value());
  // Stamped with the version that covers the decode templates (a decode config may serve it).
  EXPECT_EQ((*store)->entries()->at(0).generator, decode_generator_version_of(device.to_string()));
}

// A user expression is verified through the function compiled from its text when none is given
// (tuner/variant_functions), through the caller's host function when one is, and through the
// functions the host's C++ compiler made (what a build without the CPU backend uses): a wrong one
// fails.
TEST_F(TunerVariantCpuTest, AUserExpressionIsVerifiedWithOrWithoutItsHostFunction) {
  Variant mods;
  mods.score_mod = "score * 0.5f";
  mods.mask_mod = "kv_idx != q_idx + 1";
  const AttentionProblem problem =
      with_variant(AttentionProblem::make(1, 2, 2, 40, 40, 32, DType::F32, false), mods);
  auto expect_all_timed = [&](const TuneOptions& options) {
    Tuner tuner(*backend_, nullptr, nullptr, options);
    Result<TuneReport> report = tuner.tune(problem);
    ASSERT_TRUE(report.ok()) << report.error().describe();
    ASSERT_TRUE(report->choice.has_value()) << report->note;
    for (const TuneResult& result : report->results)
      EXPECT_EQ(result.status, TuneStatus::Timed) << result.config.to_string() << result.message;
  };
  expect_all_timed(tiny());

  TuneOptions options = tiny();
  ExpressionCompiler host;
  host.host_compiler = true;
  host.host.cache_dir = dir_ / "host";
  Result<VariantFunctions> host_functions = variant_functions_of(mods, host);
  ASSERT_TRUE(host_functions.ok()) << host_functions.error().describe();
  options.variant_functions = *host_functions;
  expect_all_timed(options);

  options.variant_functions.score_mod = [](double score, int64_t, int64_t, int64_t, int64_t) {
    return score * 0.5;
  };
  options.variant_functions.mask_mod = [](int64_t, int64_t, int64_t q_idx, int64_t kv_idx) {
    return kv_idx != q_idx + 1;
  };
  expect_all_timed(options);

  // A wrong host function fails every config (the check can fail).
  options.variant_functions.score_mod = [](double score, int64_t, int64_t, int64_t, int64_t) {
    return score;
  };
  Tuner wrong(*backend_, nullptr, nullptr, options);
  Result<TuneReport> failed = wrong.tune(problem);
  ASSERT_TRUE(failed.ok()) << failed.error().describe();
  EXPECT_FALSE(failed->choice.has_value());
  for (const TuneResult& result : failed->results)
    EXPECT_EQ(result.status, TuneStatus::WrongResult) << result.config.to_string();
}

#endif  // FLASHJIT_HAVE_CPU_BACKEND

}  // namespace
}  // namespace flashjit
