// Probes of the wgmma operand layouts the Hopper templates rely on (cuda/sm90_tiles.cuh), one
// warpgroup and one product each, against a host product: K-major A and B (S = Q K^T) with a row
// offset and N = 32; MN-major ("transposed") A and B (dQ = dS K from dS^T) at a 64-column block
// offset; K-major A with an MN-major B of N = 128 (the leading byte offset between two 64-column
// blocks); A from registers with an MN-major B (P^T dO). Inputs are small multiples of 1/4, so
// every product and sum is exact in fp32 and the comparison is exact: one wrong index shows.
//
// The probes compile with NVRTC everywhere (no GPU needed); they run on an sm90 GPU and skip
// elsewhere (FLASHJIT_EXPECT_GPU=1 turns the skip into a failure). The host emulation of the
// backward (tests/support/sm90_emulator.hpp) assumes exactly these layouts: this is where the
// hardware confirms them.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "runtime/cuda/driver.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "support/gpu.hpp"
#include "templates/embedded.hpp"
#include "tuner/reference.hpp"

namespace flashjit::cuda {
namespace {

// mode 0: SS, A K-major [64 x 64], B K-major rows 32..63 of a [64 x 64] tile, N = 32.
// mode 1: SS, A MN-major (A^T stored [K 64 x M 64]), B MN-major columns 64..127 of [K 64 x 128],
//         N = 64.
// mode 2: SS, A K-major [64 x 64], B MN-major [K 64 x N 128], N = 128.
// mode 3: RS, A [64 x 64] in registers (mma.sync fragments), B MN-major [K 64 x N 64], N = 64.
// D[64 x N] = A B over K = 64 (four k16 steps); out row-major.
constexpr const char* kProbeSource = R"(
namespace flashjit_kernel {
template <int MODE, int N, int A_ROWS, int A_COLS, int B_ROWS, int B_COLS>
__device__ __forceinline__ void probe(const u16* a_src, const u16* b_src, float* out) {
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  const u32 base = (shared_address(shared_bytes) + 1023) & ~1023u;
  unsigned char* smem = shared_bytes + (base - shared_address(shared_bytes));
  const u32 a_tile = base, b_tile = base + A_ROWS * A_COLS * 2;
  for (int i = threadIdx.x; i < A_ROWS * A_COLS; i += 128)
    *reinterpret_cast<u16*>(smem + wg_tile_offset<A_ROWS>(i / A_COLS, i % A_COLS)) = a_src[i];
  for (int i = threadIdx.x; i < B_ROWS * B_COLS; i += 128)
    *reinterpret_cast<u16*>(smem + A_ROWS * A_COLS * 2 +
                            wg_tile_offset<B_ROWS>(i / B_COLS, i % B_COLS)) = b_src[i];
  fence_proxy_async();
  __syncthreads();
  float d[N / 2];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  u32 frag[4][4];
  if (MODE == 3) {  // A fragments of k-step s: rows 16 w + lane / 4 (+ 8), cols 16 s + 2 (lane % 4) (+ 8)
    for (int s = 0; s < 4; ++s)
      for (int r = 0; r < 4; ++r) {
        const int row = warp * 16 + lane / 4 + 8 * (r % 2), col = 16 * s + 2 * (lane % 4) + 8 * (r / 2);
        frag[s][r] = a_src[row * 64 + col] | (static_cast<u32>(a_src[row * 64 + col + 1]) << 16);
      }
  }
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    if (MODE == 0) {
      const u64 a = advance(smem_descriptor(a_tile, 16, 1024), s * 32);
      const u64 b = advance(smem_descriptor(b_tile + 32 * 128, 16, 1024), s * 32);
      if (s == 0) Wgmma<N, true>::template ss_first<0, 0>(d, a, b);
      else Wgmma<N, true>::template ss<0, 0>(d, a, b, 1);
    } else if (MODE == 1) {
      const u64 a = advance(smem_descriptor(a_tile, 64 * 128, 1024), s * 2048);
      const u64 b = advance(smem_descriptor(b_tile + 64 * 128, 64 * 128, 1024), s * 2048);
      if (s == 0) Wgmma<N, true>::template ss_first<1, 1>(d, a, b);
      else Wgmma<N, true>::template ss<1, 1>(d, a, b, 1);
    } else if (MODE == 2) {
      const u64 a = advance(smem_descriptor(a_tile, 16, 1024), s * 32);
      const u64 b = advance(smem_descriptor(b_tile, 64 * 128, 1024), s * 2048);
      if (s == 0) Wgmma<N, true>::template ss_first<0, 1>(d, a, b);
      else Wgmma<N, true>::template ss<0, 1>(d, a, b, 1);
    } else {
      const u64 b = advance(smem_descriptor(b_tile, 64 * 128, 1024), s * 2048);
      Wgmma<N, true>::rs(d, frag[s], b, s > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  pin(d);
  for (int t = 0; t < N / 8; ++t)
    for (int e = 0; e < 4; ++e)
      out[(warp * 16 + lane / 4 + 8 * (e / 2)) * N + 8 * t + 2 * (lane % 4) + e % 2] = d[4 * t + e];
}
}  // namespace flashjit_kernel
extern "C" __global__ void __launch_bounds__(128) flashjit_probe_0(const unsigned short* a, const unsigned short* b, float* o) { flashjit_kernel::probe<0, 32, 64, 64, 64, 64>(a, b, o); }
extern "C" __global__ void __launch_bounds__(128) flashjit_probe_1(const unsigned short* a, const unsigned short* b, float* o) { flashjit_kernel::probe<1, 64, 64, 64, 64, 128>(a, b, o); }
extern "C" __global__ void __launch_bounds__(128) flashjit_probe_2(const unsigned short* a, const unsigned short* b, float* o) { flashjit_kernel::probe<2, 128, 64, 64, 64, 128>(a, b, o); }
extern "C" __global__ void __launch_bounds__(128) flashjit_probe_3(const unsigned short* a, const unsigned short* b, float* o) { flashjit_kernel::probe<3, 64, 64, 64, 64, 64>(a, b, o); }
)";

struct Probe {
  const char* name;
  int n;
  int a_rows, a_cols, b_rows, b_cols;
};
const Probe kProbes[] = {
    {"K-major A, K-major B rows 32..63, N = 32", 32, 64, 64, 64, 64},
    {"MN-major A (from A^T), MN-major B columns 64..127, N = 64", 64, 64, 64, 64, 128},
    {"K-major A, MN-major B over two 64-column blocks, N = 128", 128, 64, 64, 64, 128},
    {"A from registers, MN-major B, N = 64", 64, 64, 64, 64, 64},
};

// The product each probe computes, from the stored tiles (row-major, as the kernel reads them).
std::vector<float> expected(int mode, const std::vector<float>& a, const std::vector<float>& b) {
  const Probe& p = kProbes[mode];
  std::vector<float> d(64 * p.n, 0.f);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < p.n; ++n) {
      double sum = 0;
      for (int k = 0; k < 64; ++k) {
        const double av = mode == 1 ? a[k * 64 + m] : a[m * 64 + k];
        double bv = 0;
        if (mode == 0) bv = b[(32 + n) * 64 + k];
        if (mode == 1) bv = b[k * 128 + 64 + n];
        if (mode == 2) bv = b[k * 128 + n];
        if (mode == 3) bv = b[k * 64 + n];
        sum += av * bv;
      }
      d[m * p.n + n] = static_cast<float>(sum);
    }
  return d;
}

KernelSource probe_source() {
  KernelSource source;
  source.label = "wgmma layout probes";
  source.arch_specific = true;
  source.entries = {"flashjit_probe_0", "flashjit_probe_1", "flashjit_probe_2", "flashjit_probe_3"};
  for (const char* part : {"cuda/common.cuh", "cuda/wgmma.cuh", "cuda/sm90_tiles.cuh"})
    source.text += std::string(templates::text(part)) + "\n";
  source.text += kProbeSource;
  return source;
}

TEST(WgmmaProbe, CompilesForSm90a) {
  Result<Binary> binary = nvrtc_compile(probe_source(), 90);
  ASSERT_TRUE(binary.ok()) << binary.error().describe();
  EXPECT_FALSE(binary->bytes.empty());
}

TEST(WgmmaProbe, LayoutsMatchTheHostProduct) {
  FLASHJIT_REQUIRE_GPU();
  if (testing::gpu_backend()->device().arch != 90)
    GTEST_SKIP() << "wgmma needs sm90; device is " << testing::gpu_backend()->device().arch_name();
  Result<Binary> binary = nvrtc_compile(probe_source(), 90);
  ASSERT_TRUE(binary.ok()) << binary.error().describe();
  Result<const Driver*> loaded = driver();
  ASSERT_TRUE(loaded.ok()) << loaded.error().describe();
  const Driver& cu = *loaded.value();
  CUdevice device;
  CUcontext context;
  ASSERT_TRUE(check(cu.cuDeviceGet(&device, 0), "cuDeviceGet").ok());
  ASSERT_TRUE(check(cu.cuDevicePrimaryCtxRetain(&context, device), "retain").ok());
  ASSERT_TRUE(check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent").ok());
  CUmodule module;
  ASSERT_TRUE(check(cu.cuModuleLoadData(&module, binary->bytes.data()), "cuModuleLoadData").ok());

  std::mt19937 random(12345);
  std::uniform_int_distribution<int> quarter(-8, 8);  // -2 .. 2 in steps of 1/4: exact in bf16
  for (int mode = 0; mode < 4; ++mode) {
    const Probe& p = kProbes[mode];
    std::vector<float> a(p.a_rows * p.a_cols), b(p.b_rows * p.b_cols);
    std::vector<uint16_t> a_bits(a.size()), b_bits(b.size());
    for (size_t i = 0; i < a.size(); ++i) a_bits[i] = float_to_bf16(a[i] = quarter(random) / 4.f);
    for (size_t i = 0; i < b.size(); ++i) b_bits[i] = float_to_bf16(b[i] = quarter(random) / 4.f);
    CUdeviceptr a_dev, b_dev, d_dev;
    ASSERT_TRUE(check(cu.cuMemAlloc(&a_dev, a_bits.size() * 2), "alloc").ok());
    ASSERT_TRUE(check(cu.cuMemAlloc(&b_dev, b_bits.size() * 2), "alloc").ok());
    ASSERT_TRUE(check(cu.cuMemAlloc(&d_dev, 64 * p.n * 4), "alloc").ok());
    ASSERT_TRUE(check(cu.cuMemcpyHtoD(a_dev, a_bits.data(), a_bits.size() * 2), "HtoD").ok());
    ASSERT_TRUE(check(cu.cuMemcpyHtoD(b_dev, b_bits.data(), b_bits.size() * 2), "HtoD").ok());
    ASSERT_TRUE(check(cu.cuMemsetD8(d_dev, 0xFF, 64 * p.n * 4), "memset").ok());
    CUfunction function;
    const std::string entry = "flashjit_probe_" + std::to_string(mode);
    ASSERT_TRUE(check(cu.cuModuleGetFunction(&function, module, entry.c_str()), "get").ok());
    void* args[] = {&a_dev, &b_dev, &d_dev};
    const unsigned smem = 1024 + (p.a_rows * p.a_cols + p.b_rows * p.b_cols) * 2;
    ASSERT_TRUE(check(cu.cuLaunchKernel(function, 1, 1, 1, 128, 1, 1, smem, nullptr, args, nullptr),
                      "launch")
                    .ok());
    ASSERT_TRUE(check(cu.cuCtxSynchronize(), "synchronize").ok());
    std::vector<float> d(64 * p.n);
    ASSERT_TRUE(check(cu.cuMemcpyDtoH(d.data(), d_dev, d.size() * 4), "DtoH").ok());
    const std::vector<float> want = expected(mode, a, b);
    int wrong = 0;
    for (size_t i = 0; i < d.size(); ++i)
      if (d[i] != want[i] && wrong++ < 5)
        ADD_FAILURE() << p.name << ": D[" << i / p.n << "][" << i % p.n << "] = " << d[i]
                      << ", host " << want[i];
    EXPECT_EQ(wrong, 0) << p.name << ": " << wrong << " of " << d.size() << " elements differ";
    std::printf("  probe %d (%s): %s\n", mode, p.name, wrong == 0 ? "exact" : "WRONG");
    cu.cuMemFree(a_dev);
    cu.cuMemFree(b_dev);
    cu.cuMemFree(d_dev);
  }
  cu.cuModuleUnload(module);
  cu.cuDevicePrimaryCtxRelease(device);
}

}  // namespace
}  // namespace flashjit::cuda
