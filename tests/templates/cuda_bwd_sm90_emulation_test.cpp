// The wgmma family's backward template (templates/cuda/attention_bwd_sm90.cuh) compiled for the
// host against an emulation of its sm_90a primitives (tests/support/sm90_emulator.hpp: wgmma
// with the documented operand layouts and late execution, cp.async with late copies, barriers,
// fp32 reductions), run on shapes that hit the edges and compared with the fp64 reference
// gradients. The preprocess (delta, lse_log2, zeroed dq_accum) and the Atomic mode's convert are
// done on the host exactly as cuda/attention_bwd_common.cuh defines them; the dK/dV kernel and
// the Separate mode's dQ kernel are the template's own code.
//
// This checks the algorithm, indexing, tile layouts, descriptors, pipeline and masking as the
// emulator documents the hardware; that the hardware agrees is the GPU tests' part.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "generator/backward_config_sm90.hpp"
#include "generator/device.hpp"
#include "runtime/launch_params.hpp"
#include "tuner/reference.hpp"
// The order matters: the template sees the emulated primitives.
// clang-format off
#include "templates/attention_params.h"
#include "templates/attention_common.h"
#include "support/sm90_emulator.hpp"
#include "templates/cuda/sm90_tiles.cuh"
#include "templates/cuda/attention_bwd_sm90.cuh"
#include "templates/cuda/attention_bwd_sm90_dq.cuh"
// clang-format on
#include "support/sm90_backward_emulation.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

enum class Storage { kBshd, kBshdPadded, kBhsd };

struct Shape {
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  Storage storage = Storage::kBshd;

  std::string to_string() const {
    static const char* const kNames[] = {"bshd", "bshd-padded", "bhsd"};
    return "(b" + std::to_string(batch) + " hq" + std::to_string(heads_q) + " hkv" +
           std::to_string(heads_kv) + " sq" + std::to_string(seqlen_q) + " sk" +
           std::to_string(seqlen_k) + " " + kNames[static_cast<int>(storage)] + ")";
  }
};

// Small enough to emulate, covering: one row, ragged tails, seqlen_q != seqlen_k both ways
// (causal rows that see no key), GQA and MQA over several query blocks, batches, BHSD, padded
// strides that differ per tensor.
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> list = {
      {1, 1, 1, 1, 1},
      {1, 2, 2, 17, 17},
      {1, 1, 1, 100, 300},
      {1, 1, 1, 300, 100},
      {1, 4, 1, 129, 200},
      {2, 4, 2, 70, 170, Storage::kBhsd},
      {1, 4, 2, 150, 190, Storage::kBshdPadded},
      {1, 1, 1, 257, 257},
  };
  return list;
}

Strides padded_bshd(int64_t seqlen, int64_t heads, int head_dim, int head_pad, int seq_pad,
                    int batch_pad) {
  Strides strides;
  strides.head = head_dim + head_pad;
  strides.seq = heads * strides.head + seq_pad;
  strides.batch = seqlen * strides.seq + batch_pad;
  return strides;
}

AttentionProblem make_problem(const Shape& shape, int head_dim, DType dtype, bool causal) {
  const Layout layout = shape.storage == Storage::kBhsd ? Layout::BHSD : Layout::BSHD;
  AttentionProblem p =
      AttentionProblem::make(shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q,
                             shape.seqlen_k, head_dim, dtype, causal, layout)
          .with_pass(Pass::Backward);
  if (shape.storage == Storage::kBshdPadded) {
    // Different padding per tensor: a kernel that uses one tensor's strides for another fails.
    p.q_strides = padded_bshd(shape.seqlen_q, shape.heads_q, head_dim, 8, 24, 16);
    p.k_strides = padded_bshd(shape.seqlen_k, shape.heads_kv, head_dim, 16, 24, 8);
    p.v_strides = padded_bshd(shape.seqlen_k, shape.heads_kv, head_dim, 24, 8, 32);
    p.o_strides = padded_bshd(shape.seqlen_q, shape.heads_q, head_dim, 8, 40, 8);
    p.do_strides = padded_bshd(shape.seqlen_q, shape.heads_q, head_dim, 32, 8, 16);
    p.dq_strides = padded_bshd(shape.seqlen_q, shape.heads_q, head_dim, 16, 16, 8);
    p.dk_strides = padded_bshd(shape.seqlen_k, shape.heads_kv, head_dim, 8, 8, 24);
    p.dv_strides = padded_bshd(shape.seqlen_k, shape.heads_kv, head_dim, 40, 16, 8);
  }
  return p;
}

using Outcome = ft::Sm90BackwardOutcome;
using ft::run_sm90_backward;

// One emulated config: the traits the renderer would instantiate, and the same knobs as a config.
template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool BF16, bool CAUSAL,
          bool ATOMIC>
void check_config() {
  using K = flashjit_kernel::Sm90BwdTraits<HEAD_DIM, BLOCK_M, BLOCK_N, WARPS, STAGES, BF16, CAUSAL,
                                           ATOMIC>;
  const AttentionConfig config{BLOCK_M,
                               BLOCK_N,
                               WARPS,
                               STAGES,
                               KernelFamily::Wgmma,
                               ATOMIC ? DqMode::Atomic : DqMode::Separate};
  const DType dtype = BF16 ? DType::BF16 : DType::F16;
  // Appended piecewise: gcc 12 warns (-Wrestrict, a false positive) on "literal" + string&&.
  std::string name = "d";
  name += std::to_string(HEAD_DIM);
  name += " ";
  name += to_string(dtype);
  name += CAUSAL ? " causal " : " non-causal ";
  name += config.to_string();
  // The template and the budget agree on the launch: the kernels trap on too little shared
  // memory, and the config is one the budget allows.
  const AttentionProblem sample = make_problem(shapes()[1], HEAD_DIM, dtype, CAUSAL);
  ASSERT_TRUE(check_wgmma_backward_config(config, sample, *known_device("sm90")).ok())
      << name << ": "
      << check_wgmma_backward_config(config, sample, *known_device("sm90")).error().message;
  EXPECT_EQ(wgmma_backward_dkdv_smem_bytes(config, sample), K::kSmemBytes) << name;
  EXPECT_EQ(wgmma_backward_dkdv_threads(config), K::kThreads) << name;
  if (!ATOMIC) {
    EXPECT_EQ(wgmma_backward_dq_smem_bytes(config, sample), K::kDqSmemBytes) << name;
    EXPECT_EQ(wgmma_backward_dq_threads(config), K::kDqThreads) << name;
  }
  const double tolerance = gradient_tolerance(dtype);
  double worst = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < shapes().size(); ++i) {
    const Shape& shape = shapes()[i];
    const AttentionProblem p = make_problem(shape, HEAD_DIM, dtype, CAUSAL);
    ASSERT_TRUE(validate(p).ok()) << validate(p).error().describe();
    const uint64_t seed = 7919ull * (i + 1) + HEAD_DIM + (CAUSAL ? 1 : 0);
    const HostInputs inputs = random_inputs(p, seed);
    const Reference reference = reference_attention(p, inputs);
    const Outcome outcome = run_sm90_backward<K>(p, config, inputs, reference);
    std::string where = name;
    where += " shape=";
    where += shape.to_string();
    where += " seed=";
    where += std::to_string(seed);
    ASSERT_TRUE(outcome.error.empty()) << where << ": " << outcome.error;
    EXPECT_TRUE(within_tolerance(outcome.comparison, tolerance))
        << where << ": " << outcome.comparison.to_string() << " (tolerance " << tolerance << ")";
    worst = std::max(worst, outcome.comparison.max_rel_error());
  }
  std::printf("  %-36s max relative L2 error %.2e (tolerance %.1e), %.1f s\n", name.c_str(), worst,
              tolerance,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// Every code path of the template: one or two warpgroups of 64 keys (RS dK/dV), two sharing 64
// keys (SS dK/dV through shared memory, N = 32 and 64 S^T tiles), block_m 64 and 128, one and
// two dQ tiles per warpgroup, 2 and 3 stages, both dQ modes (and the dQ kernel with one and two
// warpgroups), both dtypes, causal and not, a padded head dim.
TEST(CudaBwdSm90Emulation, D64) {
  check_config<64, 64, 64, 4, 2, true, true, true>();
  check_config<64, 64, 64, 4, 3, false, false, true>();  // (m128n64w4 Atomic spills at d 64)
  check_config<64, 128, 128, 8, 2, true, true, false>();
}
TEST(CudaBwdSm90Emulation, D128) {
  check_config<128, 64, 128, 8, 2, true, true, true>();
  check_config<128, 64, 128, 8, 2, true, false, true>();
  check_config<128, 64, 128, 8, 3, false, true, false>();
  check_config<128, 64, 64, 4, 2, true, true, true>();  // two dQ tiles in one warpgroup
  check_config<128, 64, 64, 8, 2, false, false, false>();
  check_config<128, 64, 64, 8, 2, true, false, true>();  // shared keys (SS) and Atomic
}
// d 256: no Atomic config fits (its staged dQ tiles take 68 KB); the dQ kernel's, both dtypes.
TEST(CudaBwdSm90Emulation, D256) {
  check_config<256, 64, 64, 8, 2, true, false, false>();
  check_config<256, 64, 64, 8, 2, false, true, false>();
}
TEST(CudaBwdSm90Emulation, PaddedHeadDim96) { check_config<96, 64, 64, 4, 2, true, true, true>(); }

}  // namespace
}  // namespace flashjit
