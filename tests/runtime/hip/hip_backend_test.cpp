// The HIP backend's host side, without an AMD GPU: creating it fails cleanly (NoDevice, with the
// reason) whether or not ROCm is installed; device properties -> DeviceSpec; which processors
// are supported; launch grids and launch-argument checks; the config space it serves. The kernel
// on a real AMD GPU is tests/runtime/hip_attention_test.cpp. Only in builds with the HIP backend.
#include <gtest/gtest.h>

#if FLASHJIT_HAVE_HIP_BACKEND

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "generator/decode_config.hpp"
#include "generator/hip_config.hpp"
#include "runtime/hip/hip_backend.hpp"
#include "runtime/launch_params.hpp"
#include "runtime/runtime.hpp"

namespace flashjit::hip {
namespace {

hipDeviceProp_t mi250x_properties() {
  hipDeviceProp_t p;
  std::memset(&p, 0, sizeof p);
  std::strcpy(p.name, "AMD Instinct MI250X");
  std::strcpy(p.gcnArchName, "gfx90a:sramecc+:xnack-");
  p.warpSize = 64;
  p.multiProcessorCount = 110;
  p.sharedMemPerBlock = 65536;
  p.maxSharedMemoryPerMultiProcessor = 65536;
  p.maxThreadsPerMultiProcessor = 2048;
  p.maxThreadsPerBlock = 1024;
  p.l2CacheSize = 8 << 20;
  return p;
}

TEST(HipBackendNoDevice, CreateFailsCleanlyWithoutAnAmdGpu) {
  if (device_count() > 0) GTEST_SKIP() << "an AMD GPU is present";
  Result<std::unique_ptr<HipBackend>> backend = HipBackend::create(0);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.error().code, ErrorCode::NoDevice);
  // Either the runtime library is missing or hipInit says why.
  const std::string& message = backend.error().message;
  EXPECT_TRUE(message.find("libamdhip64") != std::string::npos ||
              message.find("hipInit") != std::string::npos)
      << message;
  EXPECT_FALSE(query_device(0).ok());
  EXPECT_EQ(query_device(-1).error().code, ErrorCode::NoDevice);
}

TEST(HipDeviceSpec, FromProperties) {
  Result<DeviceSpec> spec = device_spec_from_properties(mi250x_properties());
  ASSERT_TRUE(spec.ok()) << spec.error().describe();
  EXPECT_TRUE(spec->is_amd());
  EXPECT_FALSE(spec->is_cpu());
  EXPECT_EQ(spec->arch_name(), "gfx90a");
  EXPECT_EQ(spec->gcn_arch, "gfx90a:sramecc+:xnack-");
  EXPECT_EQ(spec->name, "AMD Instinct MI250X");
  EXPECT_EQ(spec->sm_count, 110);
  EXPECT_EQ(spec->warp_size, 64);
  EXPECT_EQ(spec->smem_per_block_optin, 65536);
  EXPECT_EQ(spec->max_regs_per_thread, 512);
  EXPECT_EQ(spec->l2_bytes, 8 << 20);
  // The legal set equals the table gfx90a's: the CU count does not enter the budget.
  const auto problem = AttentionProblem::make(1, 8, 8, 512, 512, 128, DType::BF16, true);
  EXPECT_EQ(legal_hip_configs(problem, *spec),
            legal_hip_configs(problem, known_device("gfx90a").value()));

  hipDeviceProp_t garbage = mi250x_properties();
  std::strcpy(garbage.gcnArchName, "");
  Result<DeviceSpec> bad = device_spec_from_properties(garbage);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::Unsupported);
  EXPECT_NE(bad.error().message.find("layout"), std::string::npos);
}

TEST(HipDeviceSpec, SupportedProcessors) {
  for (const char* yes : {"gfx90a", "gfx940", "gfx941", "gfx942"})
    EXPECT_TRUE(supported_processor(yes));
  for (const char* no : {"gfx908", "gfx906", "gfx1100", "gfx950", "", "sm90"})
    EXPECT_FALSE(supported_processor(no)) << no;
  EXPECT_EQ(gcn_processor("gfx942:sramecc+:xnack-"), "gfx942");
  EXPECT_EQ(gcn_arch_number("gfx90a:xnack-"), 0x90a);
  EXPECT_EQ(gcn_arch_number("gfx942"), 0x942);
  EXPECT_EQ(gcn_arch_number("sm90"), 0);
  EXPECT_EQ(gcn_arch_number("gfxzz"), 0);
}

TEST(HipLaunch, GridAndLimits) {
  const AttentionConfig config{128, 64, 4, 1};
  auto problem = AttentionProblem::make(3, 16, 4, 1000, 1000, 128, DType::BF16, true);
  Result<std::vector<LaunchGrid>> grids = launch_grids(problem, config);
  ASSERT_TRUE(grids.ok()) << grids.error().describe();
  ASSERT_EQ(grids->size(), 1u);
  const LaunchGrid& grid = grids->front();
  EXPECT_EQ(grid.x, 8u);  // ceil(1000 / 128)
  EXPECT_EQ(grid.y, 16u);
  EXPECT_EQ(grid.z, 3u);
  EXPECT_EQ(grid.threads, 256u);
  EXPECT_EQ(static_cast<int>(grid.lds_bytes), hip_lds_bytes(config, problem));

  problem.heads_q = 70000;
  problem.heads_kv = 70000;
  Result<std::vector<LaunchGrid>> too_many_heads = launch_grids(problem, config);
  ASSERT_FALSE(too_many_heads.ok());
  EXPECT_NE(too_many_heads.error().message.find("heads_q = 70000"), std::string::npos);
  problem.heads_q = problem.heads_kv = 1;
  problem.batch = 65536;
  EXPECT_FALSE(launch_grids(problem, config).ok());
  problem.batch = 1;
  problem.seqlen_q = int64_t{1} << 31;  // 2^24 workgroups of 256 threads: past 2^32 work-items
  Result<std::vector<LaunchGrid>> too_long = launch_grids(problem, config);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.error().message.find("seqlen_q"), std::string::npos);
  EXPECT_NE(too_long.error().message.find("work-items"), std::string::npos);
}

// The backward's three launches (render.hpp's contract) with the template's shapes: preprocess
// and convert over seqlen_q rounded to 128 rows, dK/dV over key blocks and kv heads, the
// separate dQ kernel over query blocks with block_m / 16 waves.
TEST(HipLaunch, BackwardGrids) {
  AttentionConfig config{32, 128, 4, 1};
  const auto problem =
      AttentionProblem::make(3, 16, 4, 1000, 700, 128, DType::BF16, true).with_pass(Pass::Backward);
  Result<std::vector<LaunchGrid>> grids = launch_grids(problem, config);
  ASSERT_TRUE(grids.ok()) << grids.error().describe();
  ASSERT_EQ(grids->size(), 3u);
  const LaunchGrid& preprocess = (*grids)[0];
  const LaunchGrid& dkdv = (*grids)[1];
  const LaunchGrid& convert = (*grids)[2];
  EXPECT_EQ(preprocess.x, 8u);  // 1024 / 128
  EXPECT_EQ(preprocess.y, 16u);
  EXPECT_EQ(preprocess.z, 3u);
  EXPECT_EQ(preprocess.threads, 128u);
  EXPECT_EQ(preprocess.lds_bytes, 0u);
  EXPECT_EQ(dkdv.x, 6u);  // ceil(700 / 128)
  EXPECT_EQ(dkdv.y, 4u);  // kv heads
  EXPECT_EQ(dkdv.threads, 256u);
  EXPECT_EQ(static_cast<int>(dkdv.lds_bytes), hip_bwd_dkdv_lds_bytes(config, problem));
  EXPECT_EQ(convert.x, 8u);
  EXPECT_EQ(convert.threads, 128u);

  config.dq = DqMode::Separate;
  grids = launch_grids(problem, config);
  ASSERT_TRUE(grids.ok()) << grids.error().describe();
  const LaunchGrid& dq = (*grids)[2];
  EXPECT_EQ(dq.x, 32u);  // ceil(1000 / 32)
  EXPECT_EQ(dq.y, 16u);
  EXPECT_EQ(dq.threads, 128u);  // 32 / 16 waves
  EXPECT_EQ(static_cast<int>(dq.lds_bytes), hip_bwd_dq_lds_bytes(config, problem));
  EXPECT_GT(dq.lds_bytes, 0u);

  auto many_kv_heads = problem;
  many_kv_heads.heads_q = many_kv_heads.heads_kv = 70000;
  Result<std::vector<LaunchGrid>> too_many = launch_grids(many_kv_heads, config);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.error().message.find("heads_q = 70000"), std::string::npos);
}

// The decode family's one launch (render_decode.hpp): (splits x row tiles, kv heads, batch),
// waves * 64 threads, hip_decode_lds_bytes; auto splits need the device's CU count.
TEST(HipLaunch, DecodeGrids) {
  AttentionConfig config{16, 64, 4, 1, KernelFamily::Decode};
  const auto problem =
      AttentionProblem::make(3, 32, 8, 5, 4000, 128, DType::BF16, false).with_paged_kv(16, 800);
  EXPECT_FALSE(launch_grids(problem, config).ok());  // auto splits, no device
  const DeviceSpec device = known_device("gfx90a").value();
  Result<std::vector<LaunchGrid>> grids = launch_grids(problem, config, &device);
  ASSERT_TRUE(grids.ok()) << grids.error().describe();
  ASSERT_EQ(grids->size(), 1u);
  const LaunchGrid& split = grids->front();
  const int splits = hip_decode_splits(config, problem, device);
  EXPECT_EQ(split.x, 2u * splits);  // 4:1 x 5 queries = 20 packed rows: 2 tiles of 16
  EXPECT_EQ(split.y, 8u);
  EXPECT_EQ(split.z, 3u);
  EXPECT_EQ(split.threads, 256u);
  EXPECT_EQ(static_cast<int>(split.lds_bytes), hip_decode_lds_bytes(config, problem));
  config.splits = 7;
  grids = launch_grids(problem, config);
  ASSERT_TRUE(grids.ok()) << grids.error().describe();
  EXPECT_EQ(grids->front().x, 14u);
}

TEST(HipLaunch, ArgumentChecks) {
  const auto problem = AttentionProblem::make(1, 2, 2, 64, 64, 128, DType::BF16, false);
  const ProblemSignature signature = ProblemSignature::of(problem);
  alignas(16) static char memory[256];
  AttentionArgs args{memory, memory, memory, memory, reinterpret_cast<float*>(memory)};
  EXPECT_TRUE(check_attention_launch(problem, args, signature).ok());

  AttentionArgs null_q = args;
  null_q.q = nullptr;
  Status status = check_attention_launch(problem, null_q, signature);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("q is null"), std::string::npos);

  AttentionArgs misaligned = args;
  misaligned.v = memory + 8;
  status = check_attention_launch(problem, misaligned, signature);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("16-byte aligned"), std::string::npos);

  AttentionArgs lse = args;
  lse.lse = reinterpret_cast<float*>(memory + 2);
  EXPECT_FALSE(check_attention_launch(problem, lse, signature).ok());

  auto causal = problem;
  causal.causal = true;
  status = check_attention_launch(causal, args, signature);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("does not match"), std::string::npos);
}

// The backward's launch checks (shared with CUDA): every gradient pointer, the forward's LSE, a
// caller's workspace large enough and 256-byte aligned; the workspace layout per DqMode.
TEST(HipLaunch, BackwardArgumentChecks) {
  const auto problem =
      AttentionProblem::make(2, 4, 2, 100, 60, 64, DType::F16, true).with_pass(Pass::Backward);
  const ProblemSignature signature = ProblemSignature::of(problem);
  AttentionConfig config{32, 64, 4, 1};
  const BackwardWorkspace atomic = backward_workspace(problem, config);
  EXPECT_EQ(atomic.seqlen_q_rounded, 128);
  EXPECT_TRUE(atomic.has_dq_accum);
  // delta and lse_log2 (2 * 4 * 128 floats each), then the accumulator (... x 64 floats).
  EXPECT_EQ(atomic.lse_offset, 4096u);
  EXPECT_EQ(atomic.dq_accum_offset, 8192u);
  EXPECT_EQ(atomic.bytes, 8192u + 2 * 4 * 128 * 64 * 4);
  config.dq = DqMode::Separate;
  const BackwardWorkspace separate = backward_workspace(problem, config);
  EXPECT_FALSE(separate.has_dq_accum);
  EXPECT_EQ(separate.bytes, 8192u);

  alignas(256) static char memory[1 << 16];
  AttentionArgs args{memory, memory, memory, memory, reinterpret_cast<float*>(memory)};
  args.d_o = args.dq = args.dk = args.dv = memory;
  EXPECT_TRUE(check_attention_launch(problem, args, signature, 16, atomic.bytes).ok());
  AttentionArgs no_do = args;
  no_do.d_o = nullptr;
  Status status = check_attention_launch(problem, no_do, signature, 16, atomic.bytes);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("do is null"), std::string::npos);
  AttentionArgs no_dk = args;
  no_dk.dk = nullptr;
  EXPECT_FALSE(check_attention_launch(problem, no_dk, signature, 16, atomic.bytes).ok());
  AttentionArgs no_lse = args;
  no_lse.lse = nullptr;
  status = check_attention_launch(problem, no_lse, signature, 16, atomic.bytes);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("log-sum-exp"), std::string::npos);
  AttentionArgs small = args;
  small.workspace = memory;
  small.workspace_bytes = atomic.bytes - 1;
  status = check_attention_launch(problem, small, signature, 16, atomic.bytes);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("workspace_bytes"), std::string::npos);
  AttentionArgs misaligned = args;
  misaligned.workspace = memory + 16;
  misaligned.workspace_bytes = atomic.bytes;
  status = check_attention_launch(problem, misaligned, signature, 16, atomic.bytes);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("256-byte aligned"), std::string::npos);
  // A forward problem does not match a backward kernel.
  status = check_attention_launch(problem.with_pass(Pass::Forward), args, signature);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("does not match"), std::string::npos);
}

TEST(HipRuntime, BackendIsSelectableByName) {
  EXPECT_TRUE(have_hip_backend());
  EXPECT_EQ(resolve_backend("hip").value(), "hip");
  if (device_count() == 0) {
    Result<std::unique_ptr<Backend>> backend = create_backend("hip", 0);
    ASSERT_FALSE(backend.ok());
    EXPECT_EQ(backend.error().code, ErrorCode::NoDevice);
  }
}

}  // namespace
}  // namespace flashjit::hip

#else

TEST(HipBackend, NotBuilt) { GTEST_SKIP() << "built without the HIP backend (no ROCm headers)"; }

#endif
