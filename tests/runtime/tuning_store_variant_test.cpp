// The tuning store's keys for attention variants and K/V cache layouts (schema version 3): record,
// choose, exact and nearest lookups match the variant, page_size and seqlens_k exactly; variant
// rows are stamped with (and staled by) the variant templates' generator version; recorded misses
// replay with their variant and layout; the text form carries them. Version-2 files:
// tuning_store_migration_v2_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generator/render.hpp"
#include "runtime/tuning_store.hpp"
#include "support/tuning_db.hpp"

namespace flashjit {
namespace {

namespace fs = std::filesystem;
using flashjit::testing::query;

DeviceFingerprint fingerprint() {
  DeviceFingerprint device;
  device.backend = "cuda";
  device.name = "Test GPU";
  device.arch = 90;
  device.sm_count = 132;
  device.smem_per_block_optin = 232448;
  device.l2_bytes = 52428800;
  device.driver_version = 13000;
  device.compiler = "nvrtc 13.0";
  return device;
}

ProblemKey plain_key(int64_t q = 1024) {
  ProblemKey key;
  key.head_dim = 64;
  key.dtype = DType::BF16;
  key.causal = true;
  key.seqlen_q_bucket = q;
  key.seqlen_k_bucket = q;
  key.batch_heads_bucket = 16;
  return key;
}

Variant window_softcap() {
  Variant v;
  v.window_left = 128;
  v.window_right = 0;
  v.softcap = 50.0f;
  return v;
}

ProblemKey with_variant(ProblemKey key, const Variant& variant) {
  key.variant = variant.key();
  return key;
}

ProblemKey paged(ProblemKey key, int page_size) {
  key.page_size = page_size;
  key.seqlens_k = true;
  return key;
}

TuneChoice choice(int block_m) {
  TuneChoice c;
  c.config = AttentionConfig{block_m, 64, 4, 2};
  c.median_ms = block_m / 100.0;
  c.default_ms = 2.0;
  return c;
}

TuneResult timed(int block_m) {
  TuneResult r;
  r.config = AttentionConfig{block_m, 64, 4, 2};
  r.median_ms = block_m / 100.0;
  r.repetitions = 5;
  return r;
}

class TuningStoreVariantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("flashjit-store-variant-test-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Result<std::unique_ptr<TuningStore>> opened = TuningStore::open(dir_ / "tuning.db");
    ASSERT_TRUE(opened.ok()) << opened.error().describe();
    store_ = std::move(opened.value());
  }
  void TearDown() override {
    store_.reset();
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  fs::path dir_;
  std::unique_ptr<TuningStore> store_;
};

TEST_F(TuningStoreVariantTest, EveryKindOfKeyIsStoredUnderItsOwnKey) {
  Variant alibi;
  alibi.alibi = true;
  Variant mods;
  mods.score_mod = "score - 0.1f * abs(q_idx - kv_idx)";
  mods.mask_mod = "(q_idx / 64) == (kv_idx / 64)";
  ProblemKey seqlens_only = plain_key();
  seqlens_only.seqlens_k = true;
  const std::vector<ProblemKey> keys = {plain_key(),
                                        with_variant(plain_key(), window_softcap()),
                                        with_variant(plain_key(), alibi),
                                        with_variant(plain_key(), mods),
                                        paged(plain_key(), 16),
                                        paged(plain_key(), 32),
                                        seqlens_only,
                                        with_variant(paged(plain_key(), 16), alibi)};
  const DeviceFingerprint device = fingerprint();
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(store_->record(device, keys[i], timed(16 * (i + 1))).ok()) << keys[i].to_string();
    ASSERT_TRUE(store_->choose(device, keys[i], choice(16 * (i + 1))).ok());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE(keys[i].to_string());
    Result<std::optional<TuneChoice>> found = store_->choice(device, keys[i]);
    ASSERT_TRUE(found.ok()) << found.error().describe();
    ASSERT_TRUE(found->has_value());
    EXPECT_EQ((*found)->config, choice(16 * (i + 1)).config);
    Result<std::vector<TuneResult>> rows = store_->results(device, keys[i]);
    ASSERT_EQ(rows->size(), 1u);
    EXPECT_EQ((*rows)[0].config, timed(16 * (i + 1)).config);
    // The nearest bucket of the same key one bucket up is this key's, never another's.
    ProblemKey up = keys[i];
    up.seqlen_q_bucket *= 2;
    Result<std::optional<std::pair<ProblemKey, TuneChoice>>> near =
        store_->nearest_choice(device, up);
    ASSERT_TRUE(near.ok() && near->has_value());
    EXPECT_EQ((*near)->first, keys[i]);
    EXPECT_EQ((*near)->second.config, choice(16 * (i + 1)).config);
    ASSERT_EQ(store_->result_entries(keys[i])->size(), 1u);
    EXPECT_EQ(store_->result_entries(keys[i])->at(0).key, keys[i]);
  }
  // Read back with their keys, each current under its own kind's generator version.
  Result<std::vector<TuningStore::Entry>> entries = store_->entries();
  ASSERT_TRUE(entries.ok()) << entries.error().describe();
  ASSERT_EQ(entries->size(), keys.size());
  for (const TuningStore::Entry& entry : *entries) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), entry.key), keys.end()) << entry.key.to_string();
    EXPECT_TRUE(entry.current) << entry.key.to_string();
    // A variant's, a key a decode config may serve (paged, per-sequence lengths), a prefill key's.
    const std::string& expected =
        !entry.key.variant.empty()   ? variant_generator_version_of(entry.device, entry.key.pass)
        : entry.key.may_run_decode() ? decode_generator_version_of(entry.device)
                                     : generator_version_of(entry.device, entry.key.pass);
    EXPECT_EQ(entry.generator, expected) << entry.key.to_string();
  }
  EXPECT_EQ(query(dir_ / "tuning.db", "SELECT count(DISTINCT generator) FROM choices"),
            std::vector<std::string>{"3"});
  // A variant problem of another variant (or none) has no exact or nearest choice.
  Variant other = window_softcap();
  other.window_left = 64;
  EXPECT_FALSE(store_->choice(device, with_variant(plain_key(), other))->has_value());
  EXPECT_FALSE(store_->nearest_choice(device, with_variant(plain_key(), other))->has_value());
  EXPECT_FALSE(store_->choice(device, paged(plain_key(), 64))->has_value());
}

TEST_F(TuningStoreVariantTest, VariantRowsGoStaleWithTheVariantTemplatesOnly) {
  const DeviceFingerprint device = fingerprint();
  const fs::path path = dir_ / "tuning.db";
  const ProblemKey variant = with_variant(plain_key(), window_softcap());
  ASSERT_TRUE(store_->choose(device, plain_key(), choice(64)).ok());
  ASSERT_TRUE(store_->choose(device, variant, choice(128)).ok());
  ASSERT_TRUE(store_->choose(device, paged(plain_key(), 16), choice(32)).ok());
  // A variant row stamped with the plain version (as if written before the variant templates
  // changed) is stale, and a plain row stamped with the variant version too.
  ASSERT_TRUE(
      store_->choose(device, with_variant(plain_key(2048), window_softcap()), choice(16)).ok());
  ASSERT_TRUE(store_->choose(device, plain_key(2048), choice(16)).ok());
  query(path, "UPDATE choices SET generator = '" + generator_version_of("cuda|", Pass::Forward) +
                  "' WHERE seqlen_q_bucket = 2048 AND variant <> ''");
  query(path, "UPDATE choices SET generator = '" +
                  variant_generator_version_of("cuda|", Pass::Forward) +
                  "' WHERE seqlen_q_bucket = 2048 AND variant = ''");
  EXPECT_FALSE(
      store_->choice(device, with_variant(plain_key(2048), window_softcap()))->has_value());
  EXPECT_FALSE(store_->choice(device, plain_key(2048))->has_value());
  int stale = 0;
  const Result<std::vector<TuningStore::Entry>> entries = store_->entries();
  ASSERT_TRUE(entries.ok());
  for (const TuningStore::Entry& entry : *entries) stale += entry.current ? 0 : 1;
  EXPECT_EQ(stale, 2);

  ASSERT_TRUE(store_->clear(/*stale_only=*/true).ok());
  EXPECT_EQ(store_->entries()->size(), 3u);
  EXPECT_EQ(store_->choice(device, variant)->value().config, choice(128).config);
  EXPECT_EQ(store_->choice(device, plain_key())->value().config, choice(64).config);
  EXPECT_EQ(store_->choice(device, paged(plain_key(), 16))->value().config, choice(32).config);
  // Reopening (which re-stamps legacy plain rows) leaves variant rows alone.
  store_.reset();
  Result<std::unique_ptr<TuningStore>> again = TuningStore::open(path);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->choice(device, variant)->value().config, choice(128).config);
}

// Rows stamped by the schemes before, for this build's templates: the hash of every template
// (generator_version()), or of every template of the backend per row kind (before the versions
// were per pass; before that the plain rows carried what was then the decode formula). Reopening
// re-stamps each with the version of its kind and pass; a row of another stamp (other templates)
// stays stale.
TEST_F(TuningStoreVariantTest, OlderStampsOfTheSameTemplatesAreReStampedByKindAndPass) {
  const DeviceFingerprint device = fingerprint();
  const fs::path path = dir_ / "tuning.db";
  auto backward = [](ProblemKey key) {
    key.pass = Pass::Backward;
    return key;
  };
  const ProblemKey variant = with_variant(plain_key(), window_softcap());
  struct Row {
    ProblemKey key;
    std::string old_stamp;
    std::string now;  // "" for a row that stays stale
  };
  const LegacyRowVersions& legacy = legacy_row_versions_of("cuda|");
  const std::vector<Row> rows = {
      {plain_key(), legacy.plain, generator_version_of("cuda|", Pass::Forward)},
      {backward(plain_key()), legacy.plain, generator_version_of("cuda|", Pass::Backward)},
      {plain_key(512), legacy.decode, generator_version_of("cuda|", Pass::Forward)},
      {backward(plain_key(512)), generator_version(),
       generator_version_of("cuda|", Pass::Backward)},
      {paged(plain_key(), 16), legacy.decode, decode_generator_version_of("cuda|")},
      {variant, legacy.variant, variant_generator_version_of("cuda|", Pass::Forward)},
      {backward(variant), legacy.variant, variant_generator_version_of("cuda|", Pass::Backward)},
      {plain_key(2048), "0123456789abcdef", ""},
      {backward(with_variant(plain_key(2048), window_softcap())), legacy.plain,
       ""},  // a variant row under a plain stamp: not its templates
  };
  for (size_t i = 0; i < rows.size(); ++i)
    ASSERT_TRUE(store_->choose(device, rows[i].key, choice(16 * (i + 1))).ok());
  store_.reset();
  for (size_t i = 0; i < rows.size(); ++i)
    query(path, "UPDATE choices SET generator = '" + rows[i].old_stamp + "' WHERE config = '" +
                    choice(16 * (i + 1)).config.to_string() + "'");
  Result<std::unique_ptr<TuningStore>> again = TuningStore::open(path);
  ASSERT_TRUE(again.ok()) << again.error().describe();
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(rows[i].key.to_string());
    Result<std::optional<TuneChoice>> found = (*again)->choice(device, rows[i].key);
    ASSERT_TRUE(found.ok()) << found.error().describe();
    EXPECT_EQ(found->has_value(), !rows[i].now.empty());
    EXPECT_EQ(query(path, "SELECT generator FROM choices WHERE config = '" +
                              choice(16 * (i + 1)).config.to_string() + "'"),
              std::vector<std::string>{rows[i].now.empty() ? rows[i].old_stamp : rows[i].now});
  }
}

TEST_F(TuningStoreVariantTest, RecordedProblemsReplayWithTheirVariantAndLayout) {
  const DeviceFingerprint device = fingerprint();
  AttentionProblem windowed = AttentionProblem::make(2, 8, 2, 300, 300, 64, DType::BF16, true);
  windowed.variant = window_softcap();
  windowed.variant.softcap = 0.1f;  // not exact in decimal: must come back bit for bit
  windowed.variant.prefix = 7;
  AttentionProblem mods = AttentionProblem::make(1, 4, 4, 100, 200, 32, DType::F16, false);
  mods.variant.alibi = true;
  mods.variant.score_mod = "score - 0.1f * abs(q_idx - kv_idx) == 1 ? score : 2*score";
  mods.variant.mask_mod = "(q_idx / 64) == (kv_idx / 64)";
  mods.variant.score_mod_grad = "score == 1 ? 1.0f : 2.0f";  // (a backward's)
  const AttentionProblem docs =
      AttentionProblem::make_varlen(3, 4, 2, 100, 120, 250, 300, 64, DType::BF16, true);
  const AttentionProblem paged_decode =
      AttentionProblem::make(4, 8, 2, 1, 1000, 128, DType::BF16, false).with_paged_kv(16, 4 * 63);
  AttentionProblem lengths = AttentionProblem::make(4, 8, 8, 1, 777, 128, DType::BF16, false);
  lengths.kv.seqlens_k = true;
  const AttentionProblem plain = AttentionProblem::make(2, 8, 2, 300, 300, 64, DType::BF16, true);
  const std::vector<AttentionProblem> problems = {windowed,     mods,    docs,
                                                  paged_decode, lengths, plain};
  for (const AttentionProblem& problem : problems) {
    ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
    ASSERT_TRUE(store_->record_miss(device, problem).ok()) << problem.to_string();
  }
  ASSERT_TRUE(store_->record_miss(device, windowed).ok());  // twice: most used first
  Result<std::vector<AttentionProblem>> replayed = store_->recorded_problems(device);
  ASSERT_TRUE(replayed.ok()) << replayed.error().describe();
  ASSERT_EQ(replayed->size(), problems.size());  // the plain twin of `windowed` is its own row
  EXPECT_EQ((*replayed)[0].to_string(), windowed.to_string());
  for (const AttentionProblem& expected : problems) {
    bool found = false;
    for (const AttentionProblem& got : *replayed) {
      if (got.to_string() != expected.to_string()) continue;
      found = true;
      EXPECT_EQ(got.variant, expected.variant) << expected.to_string();
      EXPECT_EQ(got.kv, expected.kv) << expected.to_string();
      EXPECT_EQ(ProblemKey::of(got), ProblemKey::of(expected));
      EXPECT_EQ(got.k_strides, expected.k_strides) << expected.to_string();
    }
    EXPECT_TRUE(found) << expected.to_string();
  }
  // A hand-edited definition that is not its key's variant is skipped, not misread.
  query(dir_ / "tuning.db",
        "UPDATE recorded_problems SET variant_spec = 'alibi' WHERE variant LIKE 'window%'");
  query(dir_ / "tuning.db",
        "UPDATE recorded_problems SET variant_spec = 'nonsense=1' WHERE variant LIKE 'alibi%'");
  EXPECT_EQ(store_->recorded_problems(device)->size(), problems.size() - 2);
}

TEST_F(TuningStoreVariantTest, TheTextFormCarriesVariantAndLayoutRows) {
  const DeviceFingerprint device = fingerprint();
  const std::vector<ProblemKey> keys = {plain_key(), with_variant(plain_key(), window_softcap()),
                                        paged(plain_key(), 16)};
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(store_->record(device, keys[i], timed(16 << i)).ok());
    ASSERT_TRUE(store_->choose(device, keys[i], choice(16 << i)).ok());
  }
  const fs::path text = dir_ / "export.sql";
  ASSERT_TRUE(store_->export_to(text).ok());
  Result<std::unique_ptr<TuningStore>> copy = TuningStore::open(dir_ / "copy.db");
  ASSERT_TRUE(copy.ok());
  Status merged = (*copy)->merge_from(text);
  ASSERT_TRUE(merged.ok()) << merged.error().describe();
  for (size_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE(keys[i].to_string());
    ASSERT_TRUE((*copy)->choice(device, keys[i])->has_value());
    EXPECT_EQ((*copy)->choice(device, keys[i])->value().config, choice(16 << i).config);
    EXPECT_EQ((*copy)->results(device, keys[i])->size(), 1u);
  }
  // Exporting the copy gives the same text (sorted, every column).
  const fs::path again = dir_ / "again.sql";
  ASSERT_TRUE((*copy)->export_to(again).ok());
  auto read = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(read(again), read(text));
  EXPECT_NE(read(text).find("'window(128,0) softcap50'"), std::string::npos);
}

}  // namespace
}  // namespace flashjit
