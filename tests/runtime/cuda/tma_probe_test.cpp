// Probes of the hardware facts the -ws family (templates/cuda/ws/) and its host emulation
// (tests/support/sm90_emulator.hpp) assume, through the templates' own wrappers (cuda/tma.cuh)
// and the backend's own encoding (runtime/cuda/tensor_maps.cpp):
//   - a tensor map encoded from runtime/tensor_map_spec.hpp's description (4-D, innermost head
//     dim, byte strides of seq, head and batch, per-tensor padding) addresses the elements the
//     description says;
//   - a TMA load lands the box as tests/support/tma_box.hpp states it: 128 bytes a row, 128-byte
//     swizzle (chunk j of row r at j ^ (r % 8)), zeros outside the tensor; boxes of 64 and of
//     128 rows;
//   - the load completes the whole box's bytes on its mbarrier (out-of-bounds elements counted):
//     a phase expecting exactly the box's bytes completes, and one expecting a byte more does not;
//   - mbarrier parities: on a fresh barrier parity 1 tests complete and parity 0 not; after phase
//     0 the reverse (the pipeline's first producer wait relies on it);
//   - a TMA store writes the box's elements inside the tensor and nothing else (padding and rows
//     past the end untouched).
// The probes compile with NVRTC everywhere; they run on an sm90 GPU and skip elsewhere
// (FLASHJIT_EXPECT_GPU=1 turns the skip into a failure).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "runtime/cuda/driver.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "runtime/cuda/tensor_maps.hpp"
#include "runtime/tensor_map_spec.hpp"
#include "support/gpu.hpp"
#include "support/tma_box.hpp"
#include "templates/embedded.hpp"

namespace flashjit::cuda {
namespace {

constexpr const char* kProbeSource = R"(
namespace flashjit_kernel {
__device__ __forceinline__ u32 test_wait(u32 barrier, u32 parity) {
  u32 done;
  asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
               "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(barrier), "r"(parity) : "memory");
  return done;
}
// try_wait with a bound, so that a phase that never completes reports rather than hangs.
__device__ __forceinline__ u32 bounded_wait(u32 barrier, u32 parity) {
  for (int i = 0; i < 200000; ++i)
    if (test_wait(barrier, parity)) return 1;
  return 0;
}
__device__ __forceinline__ u32 aligned_window(unsigned char*& smem) {
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  const u32 base = (shared_address(shared_bytes) + 1023) & ~1023u;
  smem = shared_bytes + (base - shared_address(shared_bytes));
  return base;
}
}  // namespace flashjit_kernel
using namespace flashjit_kernel;
// flags: [0] fresh barrier, parity 1 complete; [1] fresh, parity 0 complete; [2] phase 0
// completed after the load; [3] after it, parity 1 complete.
extern "C" __global__ void __launch_bounds__(128) flashjit_tma_load_probe(
    const __grid_constant__ FlashjitTensorMap map, int c0, int c1, int c2, int c3,
    unsigned box_bytes, unsigned expect_bytes, unsigned char* out, unsigned* flags) {
  unsigned char* smem;
  const u32 base = aligned_window(smem);
  const u32 barrier = base + box_bytes;
  if (threadIdx.x == 0) {
    mbarrier_init(barrier, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    flags[0] = test_wait(barrier, 1);
    flags[1] = test_wait(barrier, 0);
    mbarrier_arrive_expect_tx(barrier, expect_bytes);
    tma_load_4d(base, &map, barrier, c0, c1, c2, c3);
    flags[2] = bounded_wait(barrier, 0);
    flags[3] = test_wait(barrier, 1);
  }
  __syncthreads();
  for (unsigned i = threadIdx.x; i < box_bytes; i += 128) out[i] = smem[i];
}
extern "C" __global__ void __launch_bounds__(128) flashjit_tma_store_probe(
    const __grid_constant__ FlashjitTensorMap map, int c0, int c1, int c2, int c3,
    unsigned box_bytes, const unsigned char* in) {
  unsigned char* smem;
  const u32 base = aligned_window(smem);
  for (unsigned i = threadIdx.x; i < box_bytes; i += 128) smem[i] = in[i];
  fence_proxy_async();
  __syncthreads();
  if (threadIdx.x == 0) {
    tma_store_4d(&map, base, c0, c1, c2, c3);
    bulk_commit_group();
    bulk_wait_group_read<0>();
  }
}
)";

KernelSource probe_source() {
  KernelSource source;
  source.label = "TMA and mbarrier probes";
  source.arch_specific = true;
  source.entries = {"flashjit_tma_load_probe", "flashjit_tma_store_probe"};
  for (const char* part :
       {"attention_params.h", "cuda/common.cuh", "cuda/wgmma.cuh", "cuda/tma.cuh"})
    source.text += std::string(templates::text(part)) + "\n";
  source.text += kProbeSource;
  return source;
}

using testing::kTmaProbeElements;
using testing::tma_probe_spec;

TEST(TmaProbe, CompilesForSm90a) {
  Result<Binary> binary = nvrtc_compile(probe_source(), 90);
  ASSERT_TRUE(binary.ok()) << binary.error().describe();
  EXPECT_FALSE(binary->bytes.empty());
}

TEST(TmaProbe, SpecOfTheProbeIsValid) {
  alignas(16) static const uint16_t storage[8] = {};
  EXPECT_TRUE(check_tensor_map_spec(tma_probe_spec(storage, 64)).ok());
  EXPECT_TRUE(check_tensor_map_spec(tma_probe_spec(storage, 128)).ok());
}

class TmaProbeOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    FLASHJIT_REQUIRE_GPU();
    if (testing::gpu_backend()->device().arch != 90)
      GTEST_SKIP() << "TMA needs sm90; device is " << testing::gpu_backend()->device().arch_name();
    Result<Binary> binary = nvrtc_compile(probe_source(), 90);
    ASSERT_TRUE(binary.ok()) << binary.error().describe();
    Result<const Driver*> loaded = driver();
    ASSERT_TRUE(loaded.ok()) << loaded.error().describe();
    cu_ = loaded.value();
    ASSERT_TRUE(check(cu_->cuDeviceGet(&device_, 0), "cuDeviceGet").ok());
    ASSERT_TRUE(check(cu_->cuDevicePrimaryCtxRetain(&context_, device_), "retain").ok());
    ASSERT_TRUE(check(cu_->cuCtxSetCurrent(context_), "cuCtxSetCurrent").ok());
    ASSERT_TRUE(check(cu_->cuModuleLoadData(&module_, binary->bytes.data()), "load").ok());
    ASSERT_TRUE(
        check(cu_->cuModuleGetFunction(&load_, module_, "flashjit_tma_load_probe"), "get").ok());
    ASSERT_TRUE(
        check(cu_->cuModuleGetFunction(&store_, module_, "flashjit_tma_store_probe"), "get").ok());
    std::mt19937 random(4242);
    tensor_.resize(kTmaProbeElements);
    for (uint16_t& v : tensor_) v = static_cast<uint16_t>(random() & 0x7FFF);  // no NaN bits
    ASSERT_TRUE(check(cu_->cuMemAlloc(&tensor_dev_, tensor_.size() * 2), "alloc").ok());
    ASSERT_TRUE(
        check(cu_->cuMemcpyHtoD(tensor_dev_, tensor_.data(), tensor_.size() * 2), "HtoD").ok());
  }
  void TearDown() override {
    if (!cu_) return;
    if (tensor_dev_) cu_->cuMemFree(tensor_dev_);
    if (module_) cu_->cuModuleUnload(module_);
    cu_->cuDevicePrimaryCtxRelease(device_);
  }

  const Driver* cu_ = nullptr;
  CUdevice device_{};
  CUcontext context_{};
  CUmodule module_{};
  CUfunction load_{}, store_{};
  std::vector<uint16_t> tensor_;
  CUdeviceptr tensor_dev_ = 0;
};

TEST_F(TmaProbeOnGpu, LoadLandsTheDocumentedBoxAndCompletesItsBytes) {
  struct Case {
    int rows;
    int coords[4];
    int extra_expected_bytes;  // 0: expect exactly the box; 16: one more chunk, never completes
  };
  const Case cases[] = {
      {64, {0, 0, 1, 0}, 0},    // inside
      {64, {64, 80, 2, 1}, 0},  // columns 96.. and rows 100.. outside: zero, but counted
      {128, {0, 10, 0, 1}, 0},  // a 128-row box (a Q tile of block_m 128)
      {64, {0, 0, 0, 0}, 16},   // a phase expecting more than the box stays open
  };
  for (const Case& c : cases) {
    const TensorMapSpec spec = tma_probe_spec(reinterpret_cast<const void*>(tensor_dev_), c.rows);
    FlashjitTensorMap map;
    const Status encoded = encode_tensor_map(*cu_, spec, &map);
    ASSERT_TRUE(encoded.ok()) << encoded.error().describe();
    unsigned box_bytes = 64 * c.rows * 2;
    unsigned expect_bytes = box_bytes + c.extra_expected_bytes;
    CUdeviceptr out_dev, flags_dev;
    ASSERT_TRUE(check(cu_->cuMemAlloc(&out_dev, box_bytes), "alloc").ok());
    ASSERT_TRUE(check(cu_->cuMemAlloc(&flags_dev, 16), "alloc").ok());
    ASSERT_TRUE(check(cu_->cuMemsetD8(out_dev, 0xFF, box_bytes), "memset").ok());
    int c0 = c.coords[0], c1 = c.coords[1], c2 = c.coords[2], c3 = c.coords[3];
    void* args[] = {&map, &c0, &c1, &c2, &c3, &box_bytes, &expect_bytes, &out_dev, &flags_dev};
    ASSERT_TRUE(check(cu_->cuLaunchKernel(load_, 1, 1, 1, 128, 1, 1, box_bytes + 1024 + 8, nullptr,
                                          args, nullptr),
                      "launch")
                    .ok());
    ASSERT_TRUE(check(cu_->cuCtxSynchronize(), "synchronize").ok());
    std::vector<uint16_t> got(box_bytes / 2);
    unsigned flags[4];
    ASSERT_TRUE(check(cu_->cuMemcpyDtoH(got.data(), out_dev, box_bytes), "DtoH").ok());
    ASSERT_TRUE(check(cu_->cuMemcpyDtoH(flags, flags_dev, 16), "DtoH").ok());
    const std::string name = "box of " + std::to_string(c.rows) + " rows at (" +
                             std::to_string(c0) + ", " + std::to_string(c1) + ", " +
                             std::to_string(c2) + ", " + std::to_string(c3) + ")" +
                             (c.extra_expected_bytes ? " expecting 16 bytes more" : "");
    EXPECT_EQ(flags[0], 1u) << name << ": a fresh mbarrier's parity 1 is not complete";
    EXPECT_EQ(flags[1], 0u) << name << ": a fresh mbarrier's parity 0 is complete";
    if (c.extra_expected_bytes == 0) {
      EXPECT_EQ(flags[2], 1u) << name << ": the phase expecting the box's bytes never completed";
      EXPECT_EQ(flags[3], 0u) << name << ": after phase 0, parity 1 reads complete";
      const std::vector<uint16_t> want = testing::tma_box_image(spec, c.coords, tensor_.data());
      int wrong = 0;
      for (size_t i = 0; i < want.size(); ++i)
        if (got[i] != want[i] && wrong++ < 5)
          ADD_FAILURE() << name << ": shared word " << i << " (row " << i / 64 << ") = " << got[i]
                        << ", documented layout " << want[i];
      EXPECT_EQ(wrong, 0) << name;
      std::printf("  TMA load, %s: %s\n", name.c_str(), wrong == 0 ? "as documented" : "WRONG");
    } else {
      EXPECT_EQ(flags[2], 0u) << name << ": completed though more bytes were expected than landed";
      std::printf("  TMA load, %s: phase %s\n", name.c_str(),
                  flags[2] ? "COMPLETED" : "stays open");
    }
    cu_->cuMemFree(out_dev);
    cu_->cuMemFree(flags_dev);
  }
}

TEST_F(TmaProbeOnGpu, StoreWritesTheBoxInsideTheTensorOnly) {
  const TensorMapSpec spec = tma_probe_spec(reinterpret_cast<const void*>(tensor_dev_), 64);
  FlashjitTensorMap map;
  const Status encoded = encode_tensor_map(*cu_, spec, &map);
  ASSERT_TRUE(encoded.ok()) << encoded.error().describe();
  ASSERT_TRUE(check(cu_->cuMemsetD8(tensor_dev_, 0xFF, tensor_.size() * 2), "poison").ok());
  // The box in shared memory in the documented layout, value (row, col) = 1 + row * 64 + col.
  unsigned box_bytes = 64 * 64 * 2;
  std::vector<uint16_t> box(64 * 64);
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < 64; ++col)
      box[testing::tma_box_index(row, col)] = static_cast<uint16_t>(1 + row * 64 + col);
  CUdeviceptr in_dev;
  ASSERT_TRUE(check(cu_->cuMemAlloc(&in_dev, box_bytes), "alloc").ok());
  ASSERT_TRUE(check(cu_->cuMemcpyHtoD(in_dev, box.data(), box_bytes), "HtoD").ok());
  int c0 = 64, c1 = 80, c2 = 2, c3 = 1;  // columns 96.. and rows 100.. are outside
  void* args[] = {&map, &c0, &c1, &c2, &c3, &box_bytes, &in_dev};
  ASSERT_TRUE(check(cu_->cuLaunchKernel(store_, 1, 1, 1, 128, 1, 1, box_bytes + 1024, nullptr, args,
                                        nullptr),
                    "launch")
                  .ok());
  ASSERT_TRUE(check(cu_->cuCtxSynchronize(), "synchronize").ok());
  std::vector<uint16_t> got(tensor_.size());
  ASSERT_TRUE(check(cu_->cuMemcpyDtoH(got.data(), tensor_dev_, got.size() * 2), "DtoH").ok());
  std::vector<uint16_t> want(tensor_.size(), 0xFFFF);
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < 64; ++col) {
      const int64_t s = c1 + row, d = c0 + col;
      if (s >= 100 || d >= 96) continue;
      want[(c3 * spec.strides_bytes[2] + s * spec.strides_bytes[0] + c2 * spec.strides_bytes[1]) /
               2 +
           d] = static_cast<uint16_t>(1 + row * 64 + col);
    }
  int wrong = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && wrong++ < 5)
      ADD_FAILURE() << "global element " << i << " = " << got[i] << ", expected " << want[i];
  EXPECT_EQ(wrong, 0);
  std::printf("  TMA store of a half-outside box: %s\n", wrong == 0 ? "as documented" : "WRONG");
  cu_->cuMemFree(in_dev);
}

}  // namespace
}  // namespace flashjit::cuda
