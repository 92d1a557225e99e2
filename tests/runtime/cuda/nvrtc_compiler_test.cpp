// NVRTC needs no GPU: these tests run everywhere the toolkit is installed.
#include "runtime/cuda/nvrtc_compiler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

namespace flashjit::cuda {
namespace {

KernelSource tiny_kernel(const std::string& body = "x[i] = x[i] * 2.0f + 1.0f;") {
  KernelSource source;
  source.entries = {"flashjit_test_scale"};
  source.label = "test scale kernel";
  source.text =
      "extern \"C\" __global__ void flashjit_test_scale(float* x, int n) {\n"
      "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
      "  if (i < n) { " +
      body + " }\n}\n";
  return source;
}

TEST(NvrtcVersionTest, NamesMajorAndMinor) {
  const std::string version = nvrtc_version();
  EXPECT_EQ(version.rfind("nvrtc ", 0), 0u) << version;
  EXPECT_NE(version.find('.'), std::string::npos) << version;
  EXPECT_EQ(version.find("unknown"), std::string::npos) << version;
}

TEST(NvrtcOptionsTest, TargetsTheRealArchitecture) {
  const std::vector<std::string> options = nvrtc_options(90);
  auto has = [&](const std::string& option) {
    return std::find(options.begin(), options.end(), option) != options.end();
  };
  EXPECT_TRUE(has("--gpu-architecture=sm_90"));
  EXPECT_TRUE(has("--std=c++17"));
  EXPECT_TRUE(has("--ptxas-options=-v"));
  // Without it NVRTC's own cache (GPU machines) returns CUBINs with no ptxas report.
  EXPECT_TRUE(has("--no-cache"));
  for (const std::string& option : options) {
    EXPECT_EQ(option.find("--include-path"), std::string::npos) << option;
  }
}

TEST(ParsePtxasReportTest, ReadsRegistersStackAndSpills) {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'flashjit_attention_fwd' for 'sm_90'\n"
      "ptxas info    : Function properties for flashjit_attention_fwd\n"
      "ptxas         .     24 bytes stack frame, 16 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 400 bytes cmem[0]\n"
      "ptxas info    : Compile time = 120.5 ms\n";
  const PtxasReport report = parse_ptxas_report(log);
  EXPECT_EQ(report.registers, 168);
  EXPECT_EQ(report.stack_frame_bytes, 24);
  EXPECT_EQ(report.spill_store_bytes, 16);
  EXPECT_EQ(report.spill_load_bytes, 12);
}

TEST(ParsePtxasReportTest, OlderFormatAndSeveralFunctions) {
  const std::string log =
      "ptxas info    : Function properties for a\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 40 registers, 380 bytes cmem[0]\n"
      "ptxas info    : Function properties for b\n"
      "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Used 255 registers, 380 bytes cmem[0]\n";
  const PtxasReport report = parse_ptxas_report(log);
  EXPECT_EQ(report.registers, 255);
  EXPECT_EQ(report.stack_frame_bytes, 8);
  EXPECT_EQ(report.spill_store_bytes, 4);
  EXPECT_EQ(report.spill_load_bytes, 4);
}

TEST(ParsePtxasReportTest, UnknownWhereTheLogIsSilent) {
  const PtxasReport report = parse_ptxas_report("nothing here");
  EXPECT_EQ(report.registers, -1);
  EXPECT_EQ(report.stack_frame_bytes, -1);
  EXPECT_EQ(report.spill_store_bytes, -1);
  EXPECT_EQ(report.spill_load_bytes, -1);
}

class NvrtcCompileTest : public ::testing::TestWithParam<int> {};

TEST_P(NvrtcCompileTest, TinyKernelGivesCubinAndRegisterReport) {
  const int arch = GetParam();
  Result<Binary> binary = nvrtc_compile(tiny_kernel(), arch);
  ASSERT_TRUE(binary.ok()) << binary.error().describe();
  ASSERT_GT(binary->bytes.size(), 4u);
  // A CUBIN is an ELF file.
  EXPECT_EQ(std::string(binary->bytes.data(), 4),
            "\x7f"
            "ELF");
  EXPECT_FALSE(binary->from_cache);
  EXPECT_GT(binary->compile_seconds, 0.0);
  const PtxasReport report = parse_ptxas_report(binary->compile_log);
  EXPECT_GT(report.registers, 0) << binary->compile_log;
  EXPECT_EQ(report.spill_store_bytes, 0) << binary->compile_log;
  EXPECT_NE(binary->compile_log.find("sm_" + std::to_string(arch)), std::string::npos)
      << binary->compile_log;
}

INSTANTIATE_TEST_SUITE_P(Archs, NvrtcCompileTest, ::testing::Values(80, 90),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "sm" + std::to_string(info.param);
                         });

TEST(NvrtcCompileErrorTest, SyntaxErrorIsCompileFailedWithLogAndLabel) {
  Result<Binary> binary = nvrtc_compile(tiny_kernel("x[i] = undeclared_name +;"), 80);
  ASSERT_FALSE(binary.ok());
  EXPECT_EQ(binary.error().code, ErrorCode::CompileFailed);
  const std::string& message = binary.error().message;
  EXPECT_NE(message.find("test scale kernel"), std::string::npos) << message;
  EXPECT_NE(message.find("undeclared_name"), std::string::npos) << message;
  EXPECT_NE(message.find("error"), std::string::npos) << message;
}

TEST(NvrtcCompileErrorTest, UnknownArchitectureIsCompileFailed) {
  Result<Binary> binary = nvrtc_compile(tiny_kernel(), 12);
  ASSERT_FALSE(binary.ok());
  EXPECT_EQ(binary.error().code, ErrorCode::CompileFailed);
  EXPECT_NE(binary.error().message.find("sm_12"), std::string::npos) << binary.error().message;
}

// Repeated compiles of one source: each log holds the report (NVRTC's own cache is off, so a
// second compile is not served from it without ptxas' output).
TEST(NvrtcRepeatTest, EveryCompileReportsRegisters) {
  for (int i = 0; i < 3; ++i) {
    Result<Binary> binary = nvrtc_compile(tiny_kernel(), 90);
    ASSERT_TRUE(binary.ok()) << binary.error().describe();
    EXPECT_GT(parse_ptxas_report(binary->compile_log).registers, 0)
        << "compile " << i << ": " << binary->compile_log;
  }
}

TEST(NvrtcConcurrencyTest, SeparateCompilesRunConcurrently) {
  constexpr int kThreads = 4;
  std::vector<int> ok(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Result<Binary> binary = nvrtc_compile(tiny_kernel(), t % 2 == 0 ? 80 : 90);
      ok[t] = binary.ok() && !binary->bytes.empty();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(ok[t]) << "thread " << t;
}

}  // namespace
}  // namespace flashjit::cuda
