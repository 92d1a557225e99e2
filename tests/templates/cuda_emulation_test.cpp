// The CUDA mma.sync templates' kernel bodies (templates/cuda/attention_fwd.cuh and
// attention_bwd.cuh, with cuda/tiles.cuh and cuda/attention_bwd_common.cuh) run on the host
// through an emulation of their device primitives (tests/support/cuda_emulator.hpp), against the
// fp64 reference. No GPU is needed, so this runs in CI.
//
// The forward cases check the emulator itself: that template runs on H100s and matches the
// reference there, so it matching here too says the emulated ldmatrix/mma layouts agree with the
// hardware's for the patterns it uses. The backward cases then check the backward kernels'
// algorithm, indexing, tile layouts and swizzles, masking, GQA, strides, workspace use, the
// preprocess and convert kernels, and the pipelines' waits and barriers (the emulator's race
// rules) on configs chosen to cover every code path. None of it shows that the hardware and the
// compiler agree: tests/runtime/cuda_backward_test.cpp does, on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "generator/backward_config.hpp"
#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/problem.hpp"
#include "runtime/launch_params.hpp"
#include "support/attention_cases.hpp"
#include "support/forward_emulation.hpp"
#include "support/reference.hpp"
#include "templates/attention_params.h"
// The kernels need their primitives declared before them: params, emulated primitives, rules.
#include "support/cuda_emulator.hpp"
#include "templates/attention_common.h"
#include "templates/cuda/online_softmax.cuh"
#include "templates/cuda/tiles.cuh"
#include "templates/cuda/warp_mma.cuh"
// clang-format off: the order of the templates matters (as the renderer assembles them)
#include "templates/cuda/attention_bwd.cuh"
#include "templates/cuda/attention_bwd_common.cuh"
#include "templates/cuda/attention_fwd.cuh"
// clang-format on
#include "support/cuda_backward_emulation.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

using ft::Gradients;
using ft::make_problem;
using ft::register_inputs;
using ft::run_backward;
using ft::Shape;
using ft::Storage;

// ---- the forward: the emulator against a template verified on GPUs --------------------------

template <class K>
std::string run_forward(const AttentionProblem& problem, const ft::HostInputs& inputs,
                        std::vector<uint16_t>* o, std::vector<float>* lse) {
  return ft::run_guarded_forward(
      problem, inputs,
      [](const AttentionProblem& problem, const ft::HostInputs& inputs,
         const FlashjitAttentionParams& params) {
        register_inputs(inputs);
        const auto grid = ft::forward_grid<ft::CudaGrid>(problem, K::kBlockM);
        return ft::emulate_cuda(grid, K::kThreads, K::kSmemElements * 2,
                                [&] { flashjit_kernel::attention_forward<K>(params); });
      },
      o, lse);
}

using ForwardFn = std::string (*)(const AttentionProblem&, const ft::HostInputs&,
                                  std::vector<uint16_t>*, std::vector<float>*);

struct ForwardCase {
  int head_dim;
  AttentionConfig config;
  DType dtype;
  bool causal;
  ForwardFn run;

  std::string name() const { return ft::emulation_case_name(head_dim, config, dtype, causal); }
};

void PrintTo(const ForwardCase& c, std::ostream* out) { *out << c.name(); }

template <int D, int BM, int BN, int W, int S, bool BF16, bool CAUSAL>
ForwardCase forward_case() {
  typedef flashjit_kernel::Traits<D, BM, BN, W, S, BF16, CAUSAL> K;
  return {D, {BM, BN, W, S}, BF16 ? DType::BF16 : DType::F16, CAUSAL, &run_forward<K>};
}

const std::vector<Shape>& forward_shapes() {
  static const std::vector<Shape> all = {
      {1, 1, 1, 1, 1},                          // a single row and key
      {1, 2, 1, 70, 150},                       // GQA, more keys, ragged blocks
      {1, 2, 2, 100, 40},                       // more queries: causal leaves 60 rows empty
      {1, 2, 2, 45, 77, Storage::kBshdPadded},  // padded strides
  };
  return all;
}

class CudaForwardEmulation : public ::testing::TestWithParam<ForwardCase> {};

TEST_P(CudaForwardEmulation, MatchesTheFp64Reference) {
  const ForwardCase& c = GetParam();
  uint64_t seed = 100;
  for (const Shape& shape : forward_shapes()) {
    const AttentionProblem problem =
        make_problem(shape, c.head_dim, c.dtype, c.causal, Pass::Forward);
    ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
    const ft::HostInputs inputs = ft::random_inputs(problem, seed++);
    std::vector<uint16_t> o;
    std::vector<float> lse;
    const std::string error = c.run(problem, inputs, &o, &lse);
    ASSERT_EQ(error, "") << c.name() << " " << shape.to_string();
    EXPECT_TRUE(ft::matches_reference(
        ft::compare(problem, o, lse, ft::reference_attention(problem, inputs))))
        << c.name() << " " << shape.to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, CudaForwardEmulation,
                         ::testing::Values(forward_case<64, 64, 64, 4, 2, true, true>(),
                                           forward_case<128, 128, 32, 4, 3, false, false>(),
                                           forward_case<96, 64, 64, 2, 2, true, false>()),
                         [](const ::testing::TestParamInfo<ForwardCase>& info) {
                           return info.param.name();
                         });

// ---- the backward ------------------------------------------------------------------------------

using BackwardFn = std::string (*)(const AttentionProblem&, const AttentionConfig&,
                                   const ft::HostInputs&, Gradients*);
// run_backward without a block map (its defaulted last parameter), as a plain function pointer.
template <class K>
std::string run_plain_backward(const AttentionProblem& problem, const AttentionConfig& config,
                               const ft::HostInputs& inputs, Gradients* out) {
  return run_backward<K>(problem, config, inputs, out);
}

struct BackwardCase {
  int head_dim;
  AttentionConfig config;
  DType dtype;
  bool causal;
  BackwardFn run;
  int smem_bytes, dq_smem_bytes, threads;  // the template's, compared with the generator's

  std::string name() const { return ft::emulation_case_name(head_dim, config, dtype, causal); }
};

void PrintTo(const BackwardCase& c, std::ostream* out) { *out << c.name(); }

template <int D, int BM, int BN, int W, int S, bool BF16, bool CAUSAL, bool ATOMIC>
BackwardCase backward_case() {
  typedef flashjit_kernel::BwdTraits<D, BM, BN, W, S, BF16, CAUSAL, ATOMIC> K;
  const AttentionConfig config{
      BM, BN, W, S, KernelFamily::Mma, ATOMIC ? DqMode::Atomic : DqMode::Separate};
  return {D,
          config,
          BF16 ? DType::BF16 : DType::F16,
          CAUSAL,
          &run_plain_backward<K>,
          K::kSmemBytes,
          K::kDqSmemBytes,
          K::kThreads};
}

std::vector<BackwardCase> backward_cases() {
  return {
      // d <= 64 (padded to 64): the default shape, 32-row warp blocks in every product
      backward_case<64, 128, 128, 8, 2, true, true, true>(),
      backward_case<64, 64, 128, 8, 2, false, false, true>(),
      // 4 warps, 16-row blocks of S (32 x 32 over 4 warps), one buffer, block_n = 32 (the
      // 64-byte swizzle of P and dS)
      backward_case<64, 32, 32, 4, 1, true, true, false>(),
      backward_case<64, 64, 64, 4, 1, false, true, true>(),
      // padded head dims (72 -> 128, 200 -> 256), separate dQ kernel
      backward_case<72, 64, 128, 8, 2, true, false, false>(),
      backward_case<128, 64, 128, 8, 2, false, true, true>(),
      backward_case<200, 64, 64, 8, 1, true, true, true>(),
      backward_case<256, 64, 64, 8, 2, false, false, false>(),
  };
}

const std::vector<Shape>& backward_shapes() {
  static const std::vector<Shape> all = {
      {1, 1, 1, 1, 1},                          // a single row and key
      {1, 1, 1, 17, 17},                        // ragged tails
      {1, 2, 1, 70, 150},                       // GQA 2:1, more keys than queries
      {1, 2, 2, 150, 40},                       // more queries: causal leaves 110 rows empty
      {2, 3, 1, 33, 65, Storage::kBhsd},        // MQA 3:1, batches, BHSD
      {1, 2, 2, 45, 77, Storage::kBshdPadded},  // padded strides, different per tensor
  };
  return all;
}

class CudaBackwardEmulation : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(CudaBackwardEmulation, MatchesTheFp64Reference) {
  const BackwardCase& c = GetParam();
  {
    // The template's launch shape is the generator's, and the config is one it can render.
    const AttentionProblem problem =
        make_problem(backward_shapes()[1], c.head_dim, c.dtype, c.causal, Pass::Backward);
    Status legal = check_backward_template(c.config, problem);
    EXPECT_TRUE(legal.ok()) << legal.error().describe();
    EXPECT_EQ(backward_dkdv_smem_bytes(c.config, problem), c.smem_bytes);
    EXPECT_EQ(backward_dq_smem_bytes(c.config, problem), c.dq_smem_bytes);
    EXPECT_EQ(backward_dkdv_threads(c.config), c.threads);
    EXPECT_EQ(backward_dq_threads(c.config), c.threads);
  }
  const auto start = std::chrono::steady_clock::now();
  double worst = 0;
  uint64_t seed = 1;
  for (const Shape& shape : backward_shapes()) {
    const AttentionProblem problem =
        make_problem(shape, c.head_dim, c.dtype, c.causal, Pass::Backward);
    ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
    const ft::HostInputs inputs = ft::random_inputs(problem, seed++);
    const ft::Reference reference = ft::reference_attention(problem, inputs);
    Gradients gradients;
    const std::string error = c.run(problem, c.config, inputs, &gradients);
    if (!error.empty()) {
      ADD_FAILURE() << c.name() << " " << shape.to_string() << ": " << error;
      continue;
    }
    const GradientComparison comparison =
        compare_gradients(problem, gradients.dq, gradients.dk, gradients.dv, reference);
    worst = std::max(worst, comparison.max_rel_error());
    EXPECT_TRUE(within_tolerance(comparison, gradient_tolerance(c.dtype)))
        << c.name() << " " << shape.to_string() << ": " << comparison.to_string();
  }
  std::printf("  %s: %zu shapes emulated in %.1f s, worst gradient rel error %.2e\n",
              c.name().c_str(), backward_shapes().size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              worst);
}

INSTANTIATE_TEST_SUITE_P(Configs, CudaBackwardEmulation, ::testing::ValuesIn(backward_cases()),
                         [](const ::testing::TestParamInfo<BackwardCase>& info) {
                           return info.param.name();
                         });

}  // namespace
}  // namespace flashjit

namespace flashjit {
namespace {

// ---- the emulator must be able to fail -------------------------------------------------------

TEST(CudaEmulator, ReportsDivergenceAtAWarpOperation) {
  const std::string error = ft::emulate_cuda({1, 1, 1}, 32, 16, [] {
    if (threadIdx.x < 16) __shfl_xor_sync(0xffffffffu, 1.f, 1);
  });
  EXPECT_NE(error.find("divergent"), std::string::npos) << error;
}

TEST(CudaEmulator, ReportsABarrierNotEveryThreadReaches) {
  const std::string error = ft::emulate_cuda({1, 1, 1}, 64, 16, [] {
    if (threadIdx.x < 32) __syncthreads();
  });
  EXPECT_NE(error.find("__syncthreads"), std::string::npos) << error;
}

TEST(CudaEmulator, ReportsSharedMemoryRaces) {
  using namespace flashjit_kernel;
  // Warp 1 reads what warp 0 wrote in the same barrier interval.
  std::string error = ft::emulate_cuda({1, 1, 1}, 64, 128, [] {
    const u32 base = shared_address(dynamic_shared_memory());
    if (threadIdx.x < 32) store_shared_u32(base + 4 * threadIdx.x, 1);
    __syncwarp();
    if (threadIdx.x >= 32) load_shared_f32(base + 4 * (threadIdx.x - 32));
  });
  EXPECT_NE(error.find("with no __syncthreads in between"), std::string::npos) << error;
  // The same with a barrier is fine.
  error = ft::emulate_cuda({1, 1, 1}, 64, 128, [] {
    const u32 base = shared_address(dynamic_shared_memory());
    if (threadIdx.x < 32) store_shared_u32(base + 4 * threadIdx.x, 1);
    __syncthreads();
    if (threadIdx.x >= 32) load_shared_f32(base + 4 * (threadIdx.x - 32));
  });
  EXPECT_EQ(error, "");
  // A cp.async read before its wait; then a read of bytes nothing wrote.
  static const float source[4] = {1, 2, 3, 4};
  ft::clear_globals();
  ft::register_global(source, sizeof source);
  error = ft::emulate_cuda({1, 1, 1}, 32, 16, [] {
    const u32 base = shared_address(dynamic_shared_memory());
    if (threadIdx.x == 0) cp_async_16(base, source, 16);
    cp_async_commit();
    load_shared_f32(base);
    cp_async_wait<0>();
  });
  EXPECT_NE(error.find("before the cp.async that fills it was waited for"), std::string::npos)
      << error;
  error = ft::emulate_cuda({1, 1, 1}, 32, 16,
                           [] { load_shared_f32(shared_address(dynamic_shared_memory())); });
  EXPECT_NE(error.find("which nothing wrote"), std::string::npos) << error;
}

TEST(CudaEmulator, MmaOfLdmatrixFragmentsIsTheMatrixProduct) {
  using namespace flashjit_kernel;
  // A [16 x 16] row-major and B^T [8 x 16] row-major in shared memory (B[k][n] = Bt[n][k]); A
  // through ldmatrix.x4 (lanes address rows lane % 16, columns lane / 16 * 8), B through
  // ldmatrix.x4 of two 8-row groups; D = A B + 0.5 compared with the host product.
  float a[16][16], bt[8][16];
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) a[i][k] = static_cast<float>((i * 3 + k * 5) % 7) - 3.f;
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 16; ++k) bt[n][k] = static_cast<float>((n * 2 + k) % 5) - 2.f;
  std::vector<float> d(32 * 4, 0.f);
  const std::string error = ft::emulate_cuda({1, 1, 1}, 32, 768, [&] {
    const int lane = threadIdx.x;
    const u32 base = shared_address(dynamic_shared_memory());
    for (int i = lane; i < 16 * 8; i += 32)  // 16 rows of 8 pairs
      store_shared_u32(base + 4 * i, pack2<true>(a[i / 8][2 * (i % 8)], a[i / 8][2 * (i % 8) + 1]));
    for (int i = lane; i < 8 * 8; i += 32)
      store_shared_u32(base + 512 + 4 * i,
                       pack2<true>(bt[i / 8][2 * (i % 8)], bt[i / 8][2 * (i % 8) + 1]));
    __syncthreads();
    u32 af[4], bf[4];
    ldmatrix_x4(af, base + 32 * (lane % 16) + 16 * (lane / 16));
    // Bt rows 0-7 at k 0 and k 8 (lanes 0-15); lanes 16-31 repeat them (an .x4 needs 4 groups).
    ldmatrix_x4(bf, base + 512 + 32 * (lane % 8) + 16 * ((lane / 8) % 2));
    float acc[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    mma_16x8x16<true>(acc, af, bf[0], bf[1]);
    for (int e = 0; e < 4; ++e) d[lane * 4 + e] = acc[e];
  });
  ASSERT_EQ(error, "");
  for (int lane = 0; lane < 32; ++lane)
    for (int e = 0; e < 4; ++e) {
      const int row = lane / 4 + 8 * (e / 2), col = 2 * (lane % 4) + e % 2;
      float expected = 0.5f;
      for (int k = 0; k < 16; ++k) expected += a[row][k] * bt[col][k];
      EXPECT_EQ(d[lane * 4 + e], expected) << "lane " << lane << " e " << e;
    }
}

}  // namespace
}  // namespace flashjit
