// The installed package (cmake --install) and its shipped tuning DBs, as a user gets them:
// install this build into a temporary prefix, add a CPU tuning DB built from its text form by the
// build's own step (cmake/build_tuning_db.cmake), move the prefix elsewhere (it must be
// relocatable), then
//   - the installed `flashjit run` serves the shipped DB's choice ("exact, system DB <file>" with
//     FLASHJIT_LOG=1) with no user DB, ignores stale rows (another generator version), and lets a
//     user DB win;
//   - examples/cpp_consumer, configured with find_package(flashjit) against the moved prefix and
//     built, runs an fp32 GQA causal forward on the CPU backend, gets the shipped config and
//     matches its naive fp64 reference; its cpp_tune (flashjit::tuner) tunes a small CPU grid
//     into a fresh DB and the runtime serves each problem's choice.
// Needs the CPU backend (skips without it); about 25 s (the consumer's configure and build).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "generator/config.hpp"
#include "generator/problem.hpp"
#include "runtime/runtime.hpp"
#include "runtime/tuning_store.hpp"
#include "support/command.hpp"

namespace {

namespace fs = std::filesystem;
using flashjit::AttentionConfig;
using flashjit::AttentionProblem;
using flashjit::testing::CommandOutcome;
using flashjit::testing::run_command;

// The consumer's problem (examples/cpp_consumer/main.cpp) and the same as `flashjit run` flags.
AttentionProblem consumer_problem(bool causal = true) {
  return AttentionProblem::make(2, 4, 2, 37, 53, 64, flashjit::DType::F32, causal);
}
std::string consumer_flags(bool causal = true) {
  return std::string(
             "--backend cpu --batch 2 --heads 4 --kv-heads 2 --seqlen-q 37 --seqlen-k 53 "
             "--head-dim 64 --dtype fp32 --reps 1") +
         (causal ? " --causal" : "");
}

std::string quoted(const fs::path& path) {
  std::string text = "'";  // appended: gcc 12 warns falsely (-Wrestrict) on "'" + std::string&&
  text += path.string();
  text += "'";
  return text;
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class PackageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!flashjit::have_cpu_backend()) GTEST_SKIP() << "built without the CPU backend";
    dir_ = fs::temp_directory_path() / ("flashjit-package-test-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    auto backend = flashjit::create_backend("cpu");
    ASSERT_TRUE(backend.ok()) << backend.error().describe();
    backend_ = std::move(backend.value());
    default_ = backend_->default_config(consumer_problem()).value();
    for (const AttentionConfig& config : backend_->legal_configs(consumer_problem())) {
      if (config != default_) others_.push_back(config);
    }
    ASSERT_GE(others_.size(), 3u) << "the test needs three non-default configs";
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  // A DB choosing `config` for `problem`'s key on this CPU (a timed results row too).
  void choose(const fs::path& path, const AttentionProblem& problem,
              const AttentionConfig& config) {
    auto store = flashjit::TuningStore::open(path);
    ASSERT_TRUE(store.ok()) << store.error().describe();
    const auto key = flashjit::ProblemKey::of(problem);
    flashjit::TuneResult result;
    result.config = config;
    result.median_ms = 0.5;
    result.min_ms = 0.4;
    result.max_ms = 0.6;
    result.repetitions = 10;
    result.tflops = 0.01;
    ASSERT_TRUE((*store)->record(backend_->fingerprint(), key, result).ok());
    flashjit::TuneChoice choice;
    choice.config = config;
    choice.median_ms = 0.5;
    choice.default_ms = 0.7;
    ASSERT_TRUE((*store)->choose(backend_->fingerprint(), key, choice).ok());
  }

  // The build's step that turns a text DB into a shippable one.
  void build_db(const fs::path& sql, const fs::path& db) {
    const CommandOutcome built =
        run_command(std::string(FLASHJIT_CMAKE_COMMAND) + " -DFLASHJIT=" + FLASHJIT_CLI_PATH +
                    " -DSQL=" + quoted(sql) + " -DDB=" + quoted(db) + " -P " +
                    quoted(fs::path(FLASHJIT_SOURCE_DIR) / "cmake" / "build_tuning_db.cmake"));
    ASSERT_EQ(built.status, 0) << built.output;
    ASSERT_TRUE(fs::is_regular_file(db));
  }

  fs::path dir_;
  std::unique_ptr<flashjit::Backend> backend_;
  AttentionConfig default_;
  std::vector<AttentionConfig> others_;
};

TEST_F(PackageTest, InstalledTreeServesShippedDbsAndBuildsAConsumer) {
  // Install, then add the shipped DBs as the build would have (text form -> DB).
  const fs::path installed = dir_ / "installed";
  const CommandOutcome install =
      run_command(std::string(FLASHJIT_CMAKE_COMMAND) + " --install " + quoted(FLASHJIT_BUILD_DIR) +
                  " --prefix " + quoted(installed));
  ASSERT_EQ(install.status, 0) << install.output;
  const fs::path tuning = installed / "share" / "flashjit" / "tuning";
  ASSERT_TRUE(fs::is_directory(tuning)) << "the install has no share/flashjit/tuning";
  for (const char* file :
       {"bin/flashjit", "lib/cmake/flashjit/flashjitConfig.cmake",
        "lib/cmake/flashjit/flashjitConfigVersion.cmake", "include/flashjit/runtime/runtime.hpp",
        "include/flashjit/templates/attention_params.h", "include/flashjit/tuner/tune_run.hpp"}) {
    EXPECT_TRUE(fs::exists(installed / file)) << file;
  }

  // cpu-example: the consumer's key -> others_[0]. stale: the non-causal key -> others_[1],
  // under another generator version (as after a template change): never served.
  choose(dir_ / "example.db", consumer_problem(), others_[0]);
  choose(dir_ / "stale-source.db", consumer_problem(/*causal=*/false), others_[1]);
  for (const char* name : {"example", "stale-source"}) {
    const CommandOutcome exported =
        run_command(std::string("FLASHJIT_DB=none ") + FLASHJIT_CLI_PATH + " db export --db " +
                    quoted(dir_ / (std::string(name) + ".db")) + " " +
                    quoted(dir_ / (std::string(name) + ".sql")));
    ASSERT_EQ(exported.status, 0) << exported.output;
  }
  std::string stale = read(dir_ / "stale-source.sql");
  const std::string version = flashjit::generator_version_of("cpu|", flashjit::Pass::Forward);
  ASSERT_NE(stale.find("'" + version + "'"), std::string::npos) << stale;
  for (size_t at; (at = stale.find("'" + version + "'")) != std::string::npos;) {
    stale.replace(at + 1, version.size(), "0123456789abcdef");
  }
  std::ofstream(dir_ / "stale.sql") << stale;
  build_db(dir_ / "example.sql", tuning / "cpu-example.db");
  build_db(dir_ / "stale.sql", tuning / "cpu-stale.db");

  // Relocatable: everything is found from the moved tree.
  const fs::path moved = dir_ / "moved";
  fs::rename(installed, moved);
  const fs::path shipped = moved / "share" / "flashjit" / "tuning" / "cpu-example.db";
  const std::string env =
      "env -u FLASHJIT_SYSTEM_DB FLASHJIT_LOG=1 FLASHJIT_CACHE_DIR=" + quoted(dir_ / "cache") + " ";
  const std::string flashjit = (moved / "bin" / "flashjit").string();

  const CommandOutcome tuned =
      run_command(env + "FLASHJIT_DB=none " + flashjit + " run " + consumer_flags());
  ASSERT_EQ(tuned.status, 0) << tuned.output;
  EXPECT_NE(tuned.output.find("-> " + others_[0].to_string() + " (exact, system DB " +
                              shipped.string() + ")"),
            std::string::npos)
      << tuned.output;

  const CommandOutcome untuned =
      run_command(env + "FLASHJIT_DB=none " + flashjit + " run " + consumer_flags(false));
  ASSERT_EQ(untuned.status, 0) << untuned.output;
  const AttentionConfig untuned_default = backend_->default_config(consumer_problem(false)).value();
  EXPECT_NE(untuned.output.find("-> " + untuned_default.to_string() + " (default)"),
            std::string::npos)
      << "a stale row was served: " << untuned.output;

  // The user DB wins over the shipped one, key by key.
  choose(dir_ / "user.db", consumer_problem(), others_[2]);
  const CommandOutcome user = run_command(env + "FLASHJIT_DB=" + quoted(dir_ / "user.db") + " " +
                                          flashjit + " run " + consumer_flags());
  ASSERT_EQ(user.status, 0) << user.output;
  EXPECT_NE(user.output.find("-> " + others_[2].to_string() + " (exact, user DB"),
            std::string::npos)
      << user.output;

  // A program of another project: find_package(flashjit) against the moved prefix.
  const fs::path consumer = dir_ / "consumer";
  const CommandOutcome configured = run_command(
      std::string(FLASHJIT_CMAKE_COMMAND) + " -S " +
      quoted(fs::path(FLASHJIT_SOURCE_DIR) / "examples" / "cpp_consumer") + " -B " +
      quoted(consumer) + " -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=" + quoted(moved) +
      " -DCMAKE_CXX_COMPILER=" + FLASHJIT_CXX_COMPILER +
      " -DCUDAToolkit_ROOT=" + quoted(FLASHJIT_CUDA_ROOT));
  ASSERT_EQ(configured.status, 0) << configured.output;
  const CommandOutcome built =
      run_command(std::string(FLASHJIT_CMAKE_COMMAND) + " --build " + quoted(consumer) + " -j 2");
  ASSERT_EQ(built.status, 0) << built.output;
  const CommandOutcome ran = run_command(env + "FLASHJIT_DB=none FLASHJIT_BACKEND=cpu " +
                                         (consumer / "cpp_consumer").string());
  EXPECT_EQ(ran.status, 0) << ran.output;
  EXPECT_NE(ran.output.find("config " + others_[0].to_string() + " (tuned)"), std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find("(exact, system DB " + shipped.string() + ")"), std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find("relative L2 error vs fp64"), std::string::npos) << ran.output;

  // Tuning from C++ (tuner/tune_run.hpp through flashjit::tuner): two problems into a new DB,
  // each served afterwards as the exact tuned config.
  const CommandOutcome tuned_here =
      run_command(env + "FLASHJIT_DB=none " + (consumer / "cpp_tune").string() + " " +
                  quoted(dir_ / "cpp-tune.db"));
  EXPECT_EQ(tuned_here.status, 0) << tuned_here.output;
  EXPECT_NE(tuned_here.output.find("2 problem(s) tuned (2 reported done)"), std::string::npos)
      << tuned_here.output;
  EXPECT_EQ(tuned_here.output.find("NOT served"), std::string::npos) << tuned_here.output;
}

}  // namespace
