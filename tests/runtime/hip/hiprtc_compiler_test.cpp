// hipRTC in a worker process: the wire format, the code object metadata reader, compiles for
// gfx90a (no GPU needed), compile errors with their log, and crash isolation: a target this ROCm
// does not know (gfx942 on ROCm 5.2), an instruction the target lacks (bf16 MFMA on gfx908) and
// fake workers that abort, hang or talk nonsense all come back as CompileFailed while this test
// process keeps running. Skips where hipRTC cannot be loaded; only in builds with the HIP
// backend.
#include <gtest/gtest.h>

#if FLASHJIT_HAVE_HIP_BACKEND

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/hip/hiprtc_compiler.hpp"

namespace flashjit::hip {
namespace {

namespace fs = std::filesystem;

bool have_hiprtc() { return hiprtc_version().rfind("hiprtc unavailable", 0) != 0; }

#define REQUIRE_HIPRTC()                                  \
  do {                                                    \
    if (!have_hiprtc()) GTEST_SKIP() << hiprtc_version(); \
  } while (0)

// A small kernel using the bf16 MFMA: compiles for gfx90a, not for targets without it.
KernelSource mfma_kernel() {
  KernelSource source;
  source.entries = {"flashjit_test_mfma"};
  source.label = "test mfma kernel";
  source.text = R"(
typedef short i16x4 __attribute__((ext_vector_type(4)));
typedef float f32x4 __attribute__((ext_vector_type(4)));
extern "C" __global__ void __launch_bounds__(64) flashjit_test_mfma(const i16x4* a, f32x4* d) {
  const int t = threadIdx.x;
  d[t] = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a[t], a[t + 64], d[t], 0, 0, 0);
}
)";
  return source;
}

// An executable shell script in a fresh temporary directory; removed with it.
class Script {
 public:
  explicit Script(const std::string& body) {
    char templ[] = "/tmp/flashjit-worker-test-XXXXXX";
    dir_ = mkdtemp(templ);
    path_ = dir_ + "/worker.sh";
    std::ofstream(path_) << "#!/bin/sh\n" << body << "\n";
    chmod(path_.c_str(), 0755);
  }
  ~Script() {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

TEST(HiprtcProtocol, RequestsAndResponsesRoundTripByteExact) {
  HiprtcRequest request;
  request.name = "kernel.hip";
  request.options = {"--offload-arch=gfx90a", "-O3", ""};
  request.source = std::string("line 1\nsource 5 with\nlength fields\0 and a NUL\n", 47);
  Result<HiprtcRequest> decoded = decode_request(encode_request(request));
  ASSERT_TRUE(decoded.ok()) << decoded.error().describe();
  EXPECT_EQ(decoded->name, request.name);
  EXPECT_EQ(decoded->options, request.options);
  EXPECT_EQ(decoded->source, request.source);

  HiprtcResponse response;
  response.compiled = true;
  response.log = "warning: x\n";
  for (int i = 0; i < 1024; ++i) response.code.push_back(static_cast<char>(i & 0xff));
  Result<HiprtcResponse> back = decode_response(encode_response(response));
  ASSERT_TRUE(back.ok()) << back.error().describe();
  EXPECT_TRUE(back->compiled);
  EXPECT_EQ(back->log, response.log);
  EXPECT_EQ(back->code, response.code);

  response.compiled = false;
  response.error = "hiprtcCompileProgram: HIPRTC_ERROR_COMPILATION";
  response.code.clear();
  back = decode_response(encode_response(response));
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->compiled);
  EXPECT_EQ(back->error, response.error);
}

TEST(HiprtcProtocol, MalformedInputIsAnErrorNamingWhy) {
  const std::string good = encode_request({"k.hip", {"-O3"}, "int x;"});
  EXPECT_FALSE(decode_request("").ok());
  EXPECT_FALSE(decode_request("something else\n").ok());
  for (size_t cut : {good.size() - 1, good.size() - 3, good.size() / 2}) {
    Result<HiprtcRequest> truncated = decode_request(good.substr(0, cut));
    EXPECT_FALSE(truncated.ok()) << "cut at " << cut;
  }
  Result<HiprtcRequest> unknown =
      decode_request("flashjit-hiprtc-request 1\nbogus 1\nx\nsource 0\n\n");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("bogus"), std::string::npos);
  Result<HiprtcRequest> bad_length = decode_request("flashjit-hiprtc-request 1\nsource -1\n\n");
  ASSERT_FALSE(bad_length.ok());
  EXPECT_NE(bad_length.error().message.find("length"), std::string::npos);
  EXPECT_FALSE(decode_request("flashjit-hiprtc-request 1\nname 1\nk\n").ok());  // no source
  EXPECT_FALSE(decode_response("flashjit-hiprtc-response 1\nstatus 5\nmaybe\n").ok());
}

TEST(CodeObjectResources, ReadsMsgpackIntegersOfTheKnownKeys) {
  auto fixstr = [](const std::string& key) {
    std::string s(1, static_cast<char>(0xa0 | key.size()));
    return s + key;
  };
  std::string bytes = "ELF...";
  bytes += fixstr(".vgpr_count") + std::string(1, '\x7f');                          // fixint 127
  bytes += fixstr(".agpr_count") + std::string("\xcc\xc8", 2);                      // uint8 200
  bytes += fixstr(".private_segment_fixed_size") + std::string("\xcd\x01\x02", 3);  // 258
  bytes += fixstr(".group_segment_fixed_size") + std::string("\xce\x00\x01\x00\x00", 5);
  bytes += fixstr(".wavefront_size") + std::string(1, '\x40');
  const std::vector<char> code(bytes.begin(), bytes.end());
  const CodeObjectResources r = parse_code_object_resources(code);
  EXPECT_EQ(r.vgprs, 127);
  EXPECT_EQ(r.agprs, 200);
  EXPECT_EQ(r.scratch_bytes, 258);
  EXPECT_EQ(r.lds_bytes, 65536);
  EXPECT_EQ(r.wavefront_size, 64);
  EXPECT_EQ(r.sgprs, -1);  // absent
  EXPECT_EQ(parse_code_object_resources({}).vgprs, -1);
}

// Several kernels in one code object (the backward's entry points): each kernel's map starts at its
// .agpr_count and is named by its .symbol (fixstr or str8) without ".kd".
TEST(CodeObjectResources, SplitsTheMetadataPerKernel) {
  auto fixstr = [](const std::string& key) {
    std::string s(1, static_cast<char>(0xa0 | key.size()));
    return s + key;
  };
  auto str8 = [](const std::string& value) {
    return std::string("\xd9", 1) + static_cast<char>(value.size()) + value;
  };
  const std::string long_name(40, 'k');  // longer than a fixstr holds
  std::string bytes = "ELF...";
  bytes += fixstr(".agpr_count") + std::string(1, '\x00');
  bytes += fixstr(".private_segment_fixed_size") + std::string(1, '\x00');
  bytes += fixstr(".symbol") + fixstr("first.kd");
  bytes += fixstr(".vgpr_count") + std::string(1, '\x15');  // 21
  bytes += fixstr(".vgpr_spill_count") + std::string(1, '\x00');
  bytes += fixstr(".agpr_count") + std::string("\xcc\xc8", 2);  // 200
  bytes += fixstr(".private_segment_fixed_size") + std::string(1, '\x10');
  bytes += fixstr(".symbol") + str8(long_name + ".kd");
  bytes += fixstr(".vgpr_count") + std::string("\xcd\x01\xc8", 3);  // 456
  bytes += fixstr(".vgpr_spill_count") + std::string(1, '\x02');
  const std::vector<char> code(bytes.begin(), bytes.end());
  const std::vector<KernelResources> kernels = parse_code_object_kernels(code);
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(kernels[0].name, "first");
  EXPECT_EQ(kernels[0].resources.vgprs, 21);
  EXPECT_EQ(kernels[0].resources.agprs, 0);
  EXPECT_EQ(kernels[0].resources.vgpr_spills, 0);
  EXPECT_EQ(kernels[1].name, long_name);
  EXPECT_EQ(kernels[1].resources.vgprs, 456);
  EXPECT_EQ(kernels[1].resources.agprs, 200);
  EXPECT_EQ(kernels[1].resources.vgpr_spills, 2);
  EXPECT_EQ(kernels[1].resources.scratch_bytes, 16);
  EXPECT_TRUE(parse_code_object_kernels({}).empty());
}

TEST(Hiprtc, OptionsNameTheTarget) {
  const std::vector<std::string> options = hiprtc_options("gfx90a:sramecc+:xnack-");
  EXPECT_EQ(options.front(), "--offload-arch=gfx90a:sramecc+:xnack-");
  EXPECT_NE(std::find(options.begin(), options.end(), "-O3"), options.end());
}

TEST(Hiprtc, WorkerIsFoundAndAnExplicitBadOneIsAnError) {
  Result<std::string> worker = find_worker();
  ASSERT_TRUE(worker.ok()) << worker.error().describe();
  EXPECT_NE(worker->find("flashjit-hiprtc-worker"), std::string::npos);
  setenv("FLASHJIT_HIPRTC_WORKER", "/no/such/worker", 1);
  Result<std::string> bad = find_worker();
  unsetenv("FLASHJIT_HIPRTC_WORKER");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("/no/such/worker"), std::string::npos);
}

TEST(Hiprtc, CompilesForGfx90aWithoutAGpu) {
  REQUIRE_HIPRTC();
  EXPECT_EQ(hiprtc_version().rfind("hiprtc ", 0), 0u) << hiprtc_version();
  Result<Binary> binary = hiprtc_compile(mfma_kernel(), "gfx90a");
  ASSERT_TRUE(binary.ok()) << binary.error().describe();
  ASSERT_GT(binary->bytes.size(), 4u);
  EXPECT_EQ(std::string(binary->bytes.data(), 4),
            "\x7f"
            "ELF");
  EXPECT_GT(binary->compile_seconds, 0);
  const CodeObjectResources r = parse_code_object_resources(binary->bytes);
  EXPECT_GT(r.vgprs, 0);
  EXPECT_EQ(r.wavefront_size, 64);
  EXPECT_EQ(r.scratch_bytes, 0);
  const std::vector<KernelResources> kernels = parse_code_object_kernels(binary->bytes);
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(kernels[0].name, mfma_kernel().entry());
  EXPECT_EQ(kernels[0].resources.vgprs, r.vgprs);
}

TEST(Hiprtc, CompileErrorsCarryTheLog) {
  REQUIRE_HIPRTC();
  KernelSource source = mfma_kernel();
  source.text += "\nthis is not C++;\n";
  Result<Binary> binary = hiprtc_compile(source, "gfx90a");
  ASSERT_FALSE(binary.ok());
  EXPECT_EQ(binary.error().code, ErrorCode::CompileFailed);
  const std::string& message = binary.error().message;
  EXPECT_NE(message.find("test mfma kernel"), std::string::npos) << message;
  EXPECT_NE(message.find("gfx90a"), std::string::npos) << message;
  EXPECT_NE(message.find("error"), std::string::npos) << message;
}

// The issue's crash-isolation test: on ROCm 5.2 hipRTC aborts the process for gfx942; here that
// is a CompileFailed that names the target, and this process goes on compiling. A ROCm that knows
// gfx942 compiles it instead.
TEST(Hiprtc, AnArchThisRocmDoesNotKnowIsACleanErrorNotACrash) {
  REQUIRE_HIPRTC();
  Result<Binary> binary = hiprtc_compile(mfma_kernel(), "gfx942");
  if (binary.ok()) {
    std::printf("  this hipRTC (%s) compiles gfx942\n", hiprtc_version().c_str());
  } else {
    EXPECT_EQ(binary.error().code, ErrorCode::CompileFailed);
    EXPECT_NE(binary.error().message.find("gfx942"), std::string::npos) << binary.error().message;
    std::printf("  gfx942: %s\n", binary.error().message.substr(0, 300).c_str());
  }
  // Still alive, still compiling.
  EXPECT_TRUE(hiprtc_compile(mfma_kernel(), "gfx90a").ok());
  Result<Binary> nonsense = hiprtc_compile(mfma_kernel(), "gfxnonsense");
  ASSERT_FALSE(nonsense.ok());
  EXPECT_EQ(nonsense.error().code, ErrorCode::CompileFailed);
  EXPECT_NE(nonsense.error().message.find("gfxnonsense"), std::string::npos);
}

TEST(Hiprtc, AnInstructionTheTargetLacksIsACleanError) {
  REQUIRE_HIPRTC();
  // gfx908 (MI100) has MFMA but not the bf16 "_1k" forms: ROCm 5.2 aborts in instruction
  // selection ("LLVM ERROR: Cannot select").
  Result<Binary> binary = hiprtc_compile(mfma_kernel(), "gfx908");
  ASSERT_FALSE(binary.ok());
  EXPECT_EQ(binary.error().code, ErrorCode::CompileFailed);
  EXPECT_NE(binary.error().message.find("gfx908"), std::string::npos) << binary.error().message;
}

TEST(Hiprtc, AWorkerThatAbortsIsACompileFailureNamingTheSignal) {
  Script script("echo 'LLVM ERROR: something' >&2; kill -ABRT $$");
  HiprtcCompileOptions options;
  options.worker = script.path();
  Result<Binary> binary = hiprtc_compile(mfma_kernel(), "gfx90a", options);
  ASSERT_FALSE(binary.ok());
  EXPECT_EQ(binary.error().code, ErrorCode::CompileFailed);
  const std::string& message = binary.error().message;
  EXPECT_NE(message.find("SIGABRT"), std::string::npos) << message;
  EXPECT_NE(message.find("LLVM ERROR: something"), std::string::npos) << message;
  EXPECT_NE(message.find("test mfma kernel"), std::string::npos) << message;
}

TEST(Hiprtc, AWorkerThatHangsOrTalksNonsenseIsACompileFailure) {
  Script hang("sleep 30");
  HiprtcCompileOptions options;
  options.worker = hang.path();
  options.timeout_seconds = 0.5;
  Result<Binary> binary = hiprtc_compile(mfma_kernel(), "gfx90a", options);
  ASSERT_FALSE(binary.ok());
  EXPECT_NE(binary.error().message.find("timed out"), std::string::npos) << binary.error().message;

  Script nonsense("cat > /dev/null; echo hello");
  options.worker = nonsense.path();
  options.timeout_seconds = 30;
  binary = hiprtc_compile(mfma_kernel(), "gfx90a", options);
  ASSERT_FALSE(binary.ok());
  EXPECT_NE(binary.error().message.find("unreadable"), std::string::npos) << binary.error().message;

  options.worker = "/no/such/worker";
  binary = hiprtc_compile(mfma_kernel(), "gfx90a", options);
  ASSERT_FALSE(binary.ok());
  EXPECT_NE(binary.error().message.find("could not start"), std::string::npos);
}

TEST(Hiprtc, CompilesFromManyThreadsAtOnce) {
  REQUIRE_HIPRTC();
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &ok] {
      // One of them crashes its worker; the others must not notice.
      Result<Binary> binary = hiprtc_compile(mfma_kernel(), t == 0 ? "gfx908" : "gfx90a");
      ok[t] = binary.ok();
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(ok, (std::vector<int>{0, 1, 1, 1}));
}

}  // namespace
}  // namespace flashjit::hip

#else

TEST(Hiprtc, NotBuilt) { GTEST_SKIP() << "built without the HIP backend (no ROCm headers)"; }

#endif
