// `flashjit report`: the HTML's structure (tests/python/test_report.py renders it in headless
// Chromium): one section per key with a bar per timed config (the chosen one and the default in
// their colors), failures with their escaped message, stale keys marked, the side-by-side JSON's
// summary table and one panel per (head dim, causal) per pass and dtype; nothing loaded from
// anywhere (no script, link, image or URL but the SVG namespace); usage errors.
#include "cli/report_command.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "runtime/tuning_store.hpp"
#include "support/tuning_db.hpp"

namespace {

namespace fs = std::filesystem;
using namespace flashjit;

struct Outcome {
  int status = 0;
  std::string out, err;
};

Outcome run(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  Outcome result;
  result.status = cli::run_report_command(args, out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

DeviceFingerprint device() {
  DeviceFingerprint fingerprint;
  fingerprint.backend = "cuda";
  fingerprint.name = "Fake GPU";
  fingerprint.arch = 90;
  fingerprint.sm_count = 132;
  fingerprint.compiler = "nvrtc 13.0";
  return fingerprint;
}

ProblemKey key_of(int64_t seqlen, Pass pass = Pass::Forward) {
  return ProblemKey::of(
      AttentionProblem::make(2, 16, 16, seqlen, seqlen, 128, DType::BF16, true).with_pass(pass));
}

class ReportCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("flashjit-report-test-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  fs::path dir_;
};

TEST_F(ReportCommandTest, OneSelfContainedFileWithEveryKeyConfigAndFailure) {
  const fs::path db = dir_ / "tuning.db";
  {
    auto store = TuningStore::open(db);
    ASSERT_TRUE(store.ok()) << store.error().describe();
    // Key 1 (forward): 3 timed configs, the default not chosen, a failure with markup in it.
    const AttentionConfig configs[] = {{128, 64, 8, 2}, {64, 64, 4, 2}, {128, 128, 8, 2}};
    for (int i = 0; i < 3; ++i) {
      TuneResult result;
      result.config = configs[i];
      result.median_ms = 1.0 + i;
      result.tflops = 300.0 / (1 + i);
      result.is_default = i == 1;
      ASSERT_TRUE((*store)->record(device(), key_of(4096), result).ok());
    }
    TuneResult failed;
    failed.config = AttentionConfig{256, 128, 8, 3};
    failed.status = TuneStatus::CompileFailed;
    failed.message = "too much smem: <script>alert(1)</script> & more";
    ASSERT_TRUE((*store)->record(device(), key_of(4096), failed).ok());
    ASSERT_TRUE((*store)->choose(device(), key_of(4096), {configs[0], 1.0, 2.0}).ok());
    // Key 2 (backward), one config, chosen; made stale below.
    TuneResult only;
    only.config = AttentionConfig{64, 128, 8, 2};
    only.median_ms = 3.0;
    only.tflops = 250;
    only.is_default = true;
    ASSERT_TRUE((*store)->record(device(), key_of(1024, Pass::Backward), only).ok());
    ASSERT_TRUE((*store)->choose(device(), key_of(1024, Pass::Backward), {only.config, 3, 3}).ok());
  }
  flashjit::testing::query(db,
                           "UPDATE results SET generator = '0123456789abcdef' WHERE pass = 'bwd'");
  flashjit::testing::query(db,
                           "UPDATE choices SET generator = '0123456789abcdef' WHERE pass = 'bwd'");

  const fs::path peers =
      fs::path(FLASHJIT_SOURCE_DIR) / "docs" / "perf" / "nvidia-h100-80gb-hbm3-2026-11-23-bwd.json";
  const fs::path html = dir_ / "report.html";
  const Outcome written =
      run({"--db", db.string(), "--side-by-side", peers.string(), "--out", html.string()});
  ASSERT_EQ(written.status, 0) << written.err;
  const std::string page = read(html);

  // One file, nothing loaded from anywhere.
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(count(page, "</html>"), 1u);
  for (const char* outside : {"<script", "<link", "<img", "<iframe", "src=", "url(", "@import"}) {
    EXPECT_EQ(page.find(outside), std::string::npos) << outside;
  }
  EXPECT_EQ(count(page, "http"), count(page, "xmlns=\"http://www.w3.org/2000/svg\""));

  // The DB: two keys (the stale one after the current one), 4 bars, the failure escaped.
  EXPECT_EQ(count(page, "<section class=\"key\""), 2u);
  EXPECT_LT(page.find("fwd d128 bf16 causal g1 q4096"), page.find("bwd d128 bf16 causal g1 q1024"));
  EXPECT_NE(page.find("bwd d128 bf16 causal g1 q1024 k1024 bh32 <span class=\"stale\">"),
            std::string::npos);
  EXPECT_EQ(count(page, "<rect class=\"bar\""), 4u);
  EXPECT_EQ(count(page, "height=\"14\" fill=\"#d62728\""), 2u);  // each key's chosen bar
  EXPECT_EQ(count(page, "height=\"14\" fill=\"#ff9896\""), 1u);  // a default not chosen
  EXPECT_NE(page.find("300 TFLOP/s (chosen)"), std::string::npos);
  EXPECT_NE(page.find("150 TFLOP/s (default)"), std::string::npos);
  EXPECT_NE(page.find("gain 2.000x"), std::string::npos);
  EXPECT_NE(page.find("compile-failed"), std::string::npos);
  EXPECT_NE(page.find("too much smem: &lt;script&gt;alert(1)&lt;/script&gt; &amp; more"),
            std::string::npos);

  // The side-by-side run: its summary per pass, and per pass and dtype 6 panels (d 64/128/256 x
  // causal) of 4 implementations.
  EXPECT_NE(page.find("Side by side: NVIDIA H100 80GB HBM3"), std::string::npos);
  EXPECT_EQ(count(page, "<tr><td>bwd</td><td>flashjit tuned / torch flash</td>"), 1u);
  EXPECT_EQ(count(page, "<tr><td>fwd+bwd</td><td>flashjit tuned / cuDNN</td>"), 1u);
  EXPECT_EQ(count(page, "<svg class=\"lines\""), 4u);  // bwd, fwd+bwd x bf16, fp16
  EXPECT_EQ(count(page, "<g class=\"panel\""), 24u);
  EXPECT_EQ(count(page, "<polyline class=\"series\""), 96u);
  EXPECT_EQ(count(page, "data-series=\"torch SDPA cuDNN\""), 24u);
}

TEST_F(ReportCommandTest, AnOlderSideBySideJsonAloneWithoutADb) {
  const fs::path html = dir_ / "peers.html";
  const Outcome written = run(
      {"--side-by-side",
       (fs::path(FLASHJIT_SOURCE_DIR) / "docs" / "perf" / "nvidia-h100-80gb-hbm3-2026-11-22.json")
           .string(),
       "--out", html.string()});
  ASSERT_EQ(written.status, 0) << written.err;
  const std::string page = read(html);
  EXPECT_EQ(page.find("<h2>Tuning DB</h2>"), std::string::npos);
  // Its summary is the forward's alone (no per-pass level).
  EXPECT_EQ(count(page, "<tr><td>fwd</td><td>flashjit"), 4u);
  EXPECT_EQ(count(page, "<svg class=\"lines\""), 2u);
}

TEST_F(ReportCommandTest, UsageAndInputErrors) {
  const std::string out = (dir_ / "x.html").string();
  Outcome no_out = run({"--db", (dir_ / "x.db").string()});
  EXPECT_EQ(no_out.status, 2);
  EXPECT_NE(no_out.err.find("--out"), std::string::npos) << no_out.err;
  EXPECT_EQ(run({"--bogus", "--out", out}).status, 2);
  Outcome missing_db = run({"--db", (dir_ / "missing.db").string(), "--out", out});
  EXPECT_EQ(missing_db.status, 1);
  EXPECT_NE(missing_db.err.find("no such file"), std::string::npos) << missing_db.err;
  Outcome missing_json = run({"--side-by-side", (dir_ / "missing.json").string(), "--out", out});
  EXPECT_EQ(missing_json.status, 1);
  std::ofstream(dir_ / "bad.json") << "{\"rows\": [1, 2,]}";
  Outcome bad = run({"--side-by-side", (dir_ / "bad.json").string(), "--out", out});
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("JSON error at byte 15"), std::string::npos) << bad.err;
  std::ofstream(dir_ / "other.json") << "{\"rows\": 3}";
  Outcome other = run({"--side-by-side", (dir_ / "other.json").string(), "--out", out});
  EXPECT_EQ(other.status, 2);
  EXPECT_NE(other.err.find("not a bench/side_by_side.py JSON"), std::string::npos) << other.err;
  for (const Outcome& failed : {no_out, missing_db, missing_json, bad, other}) {
    EXPECT_EQ(failed.err.find('\n'), failed.err.size() - 1) << failed.err;
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(run({"--help"}).status, 0);
}

}  // namespace
