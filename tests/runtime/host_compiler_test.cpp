// The host's C++ compiler as a process (runtime/host_compiler.hpp): a source compiled into a
// shared object whose symbols are found (a missing one: NotFound naming it), the compiler's
// argument vector (no shell: a "compiler" with shell syntax in its name is a file name that does
// not exist), a compiler's failure as CompileFailed with its log and name, the default compilers
// ($FLASHJIT_HOST_CXX alone; $CXX once), and threads building one source into one folder at once
// (temp file + rename: one library, no temporary left, every load works).
#include "runtime/host_compiler.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace flashjit {
namespace {

namespace fs = std::filesystem;

class HostCompiler : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("flashjit-host-compiler-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    options_.cache_dir = dir_ / "cache";
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  std::vector<fs::path> cached() const {
    std::vector<fs::path> out;
    if (fs::exists(options_.cache_dir))
      for (const auto& entry : fs::directory_iterator(options_.cache_dir))
        out.push_back(entry.path());
    return out;
  }
  // An executable shell script in the test's folder.
  fs::path script(const std::string& name, const std::string& body) const {
    const fs::path path = dir_ / name;
    std::ofstream(path) << "#!/bin/sh\n" << body;
    fs::permissions(path, fs::perms::owner_all);
    return path;
  }
  fs::path dir_;
  HostCompileOptions options_;
};

// A source whose value depends on the test, so that no earlier library of the process is reused.
std::string cube_source(int offset) {
  return "// $(touch pwned) `touch pwned`: text, never a command\n"
         "#include <cmath>\n"
         "extern \"C\" double flashjit_test_cube(double x) { return x * x * x + " +
         std::to_string(offset) + " + std::sqrt(4.0); }\n";
}

using Cube = double (*)(double);

TEST_F(HostCompiler, CompilesLoadsAndFindsSymbols) {
  const int offset = static_cast<int>(getpid() % 1000);
  Result<std::unique_ptr<HostLibrary>> library = HostLibrary::build(cube_source(offset), options_);
  ASSERT_TRUE(library.ok()) << library.error().describe();
  Result<void*> cube = (*library)->lookup("flashjit_test_cube");
  ASSERT_TRUE(cube.ok()) << cube.error().describe();
  EXPECT_EQ(reinterpret_cast<Cube>(*cube)(3.0), 27.0 + offset + 2.0);
  EXPECT_EQ((*library)->path().parent_path(), options_.cache_dir);
  EXPECT_EQ((*library)->path().extension(), ".so");
  EXPECT_EQ(cached(), std::vector<fs::path>{(*library)->path()});
  Result<void*> missing = (*library)->lookup("flashjit_no_such_symbol");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::NotFound);
  EXPECT_NE(missing.error().message.find("flashjit_no_such_symbol"), std::string::npos);
  EXPECT_FALSE(fs::exists("pwned"));
  EXPECT_FALSE(fs::exists(options_.cache_dir / "pwned"));
}

TEST_F(HostCompiler, ShellSyntaxInTheCompilerIsAFileName) {
  const fs::path marker = dir_ / "pwned";
  options_.compilers = {"c++; touch " + marker.string(), "$(touch " + marker.string() + ")"};
  Result<std::unique_ptr<HostLibrary>> library = HostLibrary::build(cube_source(1), options_);
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.error().code, ErrorCode::Unsupported);
  EXPECT_NE(library.error().message.find("c++; touch "), std::string::npos)
      << library.error().message;
  EXPECT_FALSE(fs::exists(marker));
}

TEST_F(HostCompiler, ACompilersFailureIsCompileFailedWithItsLogAndName) {
  // Answers --version; records its arguments and fails any compile.
  const fs::path arguments = dir_ / "arguments";
  const fs::path fake = script("fake-c++",
                               "if [ \"$1\" = --version ]; then echo fake 1.0; exit 0; fi\n"
                               "for a in \"$@\"; do echo \"$a\"; done > " +
                                   arguments.string() +
                                   "\ncat > /dev/null\n"
                                   "echo '<stdin>:3:1: error: fake failure' >&2\n"
                                   "exit 4\n");
  options_.compilers = {fake.string()};
  Result<std::unique_ptr<HostLibrary>> library = HostLibrary::build(cube_source(2), options_);
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.error().code, ErrorCode::CompileFailed);
  const std::string& message = library.error().message;
  EXPECT_EQ(message.rfind("<stdin>:3:1: error: fake failure", 0), 0u) << message;  // log first
  EXPECT_NE(message.find(fake.string() + ": exit status 4"), std::string::npos) << message;
  EXPECT_TRUE(cached().empty());  // the temporary file removed
  std::ifstream in(arguments);
  std::vector<std::string> argv;
  for (std::string line; std::getline(in, line);) argv.push_back(line);
  ASSERT_GE(argv.size(), 6u);
  for (const char* flag : {"-O2", "-shared", "-fPIC", "-std=c++17", "-"})
    EXPECT_NE(std::find(argv.begin(), argv.end(), flag), argv.end()) << flag;
  const auto output = std::find(argv.begin(), argv.end(), "-o");
  ASSERT_NE(output, argv.end());
  ASSERT_NE(output + 1, argv.end());
  EXPECT_EQ(fs::path(*(output + 1)).parent_path(), options_.cache_dir);
  EXPECT_EQ(fs::path(*(output + 1)).extension(), ".tmp");
}

TEST_F(HostCompiler, TheDefaultCompilers) {
  const char* saved = std::getenv("CXX");
  const std::string old_cxx = saved ? saved : "";
  ASSERT_EQ(unsetenv("FLASHJIT_HOST_CXX"), 0);
  ASSERT_EQ(setenv("CXX", "/opt/flashjit-test/bin/g++", 1), 0);
  std::vector<std::string> compilers = host_compilers();
  ASSERT_GE(compilers.size(), 2u);
  EXPECT_EQ(compilers.back(), "c++");
  EXPECT_EQ(compilers[compilers.size() - 2], "/opt/flashjit-test/bin/g++");
  ASSERT_EQ(setenv("CXX", "c++", 1), 0);
  compilers = host_compilers();
  EXPECT_EQ(std::count(compilers.begin(), compilers.end(), "c++"), 1);
  ASSERT_EQ(setenv("FLASHJIT_HOST_CXX", "clang++-14", 1), 0);
  EXPECT_EQ(host_compilers(), std::vector<std::string>{"clang++-14"});
  unsetenv("FLASHJIT_HOST_CXX");
  if (saved)
    setenv("CXX", old_cxx.c_str(), 1);
  else
    unsetenv("CXX");
}

TEST_F(HostCompiler, ThreadsBuildingOneSourceAtOnceShareOneFile) {
  const std::string source = cube_source(static_cast<int>(getpid() % 1000) + 5000);
  constexpr int kThreads = 4;
  std::vector<double> values(kThreads, 0.0);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      Result<std::unique_ptr<HostLibrary>> library = HostLibrary::build(source, options_);
      if (!library.ok()) {
        errors[t] = library.error().describe();
        return;
      }
      Result<void*> cube = (*library)->lookup("flashjit_test_cube");
      if (cube.ok()) values[t] = reinterpret_cast<Cube>(*cube)(2.0);
    });
  for (std::thread& thread : threads) thread.join();
  const double expected = 8.0 + static_cast<double>(getpid() % 1000 + 5000) + 2.0;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "");
    EXPECT_EQ(values[t], expected);
  }
  const std::vector<fs::path> files = cached();
  ASSERT_EQ(files.size(), 1u);  // one library, no temporary file left
  EXPECT_EQ(files[0].extension(), ".so");
}

}  // namespace
}  // namespace flashjit
