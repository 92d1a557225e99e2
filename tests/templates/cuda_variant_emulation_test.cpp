// The CUDA mma forward template (templates/cuda/attention_fwd.cuh) with an attention variant
// (templates/attention_variant.h) run on the host through the device-primitive emulator
// (tests/support/cuda_emulator.hpp) against the fp64 reference: causal sliding window + prefix-LM
// + soft-capping + ALiBi + a user score_mod at once, so that key-block skipping, per-element
// masking and every score modification run. Hidden key blocks hold NaN: a kernel that loads one
// fails. The variant is compiled in (one per translation unit): the defines below are what the
// generator renders for emulated_variant(), which the first test checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "generator/variant.hpp"
#include "runtime/launch_params.hpp"
#include "support/attention_cases.hpp"
#include "support/forward_emulation.hpp"
#include "support/reference.hpp"
#include "support/variant_cases.hpp"
#include "support/variant_emulation.hpp"
#include "templates/attention_params.h"
// clang-format off: the order matters (as the renderer assembles the source)
#include "support/cuda_emulator.hpp"
#define FLASHJIT_VARIANT_MASK_MOD 0
#include "support/emulated_variant.h"
#include "templates/attention_common.h"
#include "templates/cuda/online_softmax.cuh"
// (tiles before the kernel)
#include "templates/cuda/tiles.cuh"
#include "templates/cuda/warp_mma.cuh"
// (the kernel last)
#include "templates/cuda/attention_fwd.cuh"
// clang-format on

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// The variant compiled in above (support/emulated_variant.h) and its host expressions.
const ft::VariantCase kVariant = ft::emulated_variant(/*with_mask_mod=*/false);

TEST(CudaVariantEmulation, TheDefinesAreWhatTheGeneratorRenders) {
  AttentionProblem p = AttentionProblem::make(1, 1, 1, 16, 16, 64, DType::BF16, true);
  p.variant = kVariant.variant;
  const std::string prelude = render_variant_prelude(p).value();
  for (const std::string& line : ft::emulated_forward_prelude_lines(/*with_mask_mod=*/false))
    EXPECT_NE(prelude.find(line), std::string::npos) << line;
}

template <class K>
void check(DType dtype, int head_dim, uint64_t seed) {
  ft::check_variant_forward_emulation(
      kVariant, dtype, head_dim, K::kBlockN, seed,
      [](const AttentionProblem& problem, const ft::HostInputs& inputs,
         const FlashjitAttentionParams& params) {
        ft::clear_globals();
        for (const std::vector<uint16_t>* tensor : {&inputs.q, &inputs.k, &inputs.v})
          ft::register_global(tensor->data(), tensor->size() * sizeof(uint16_t));
        ft::register_global(inputs.alibi_slopes.data(), inputs.alibi_slopes.size() * sizeof(float));
        const auto grid = ft::forward_grid<ft::CudaGrid>(problem, K::kBlockM);
        return ft::emulate_cuda(grid, K::kThreads, K::kSmemElements * 2,
                                [&] { flashjit_kernel::attention_forward<K>(params); });
      });
}

TEST(CudaVariantEmulation, MatchesTheFp64Reference) {
  check<flashjit_kernel::Traits<64, 64, 32, 4, 2, true, true>>(DType::BF16, 64, /*seed=*/7);
  check<flashjit_kernel::Traits<128, 128, 64, 4, 3, false, true>>(DType::F16, 128, /*seed=*/7);
}

}  // namespace
}  // namespace flashjit
