// The cases and checks of the variant emulation tests
// (tests/templates/*variant*_emulation_test.cpp: the CUDA mma, wgmma and -ws templates and the HIP
// template, forward and backward), each with emulated_variant() compiled in. The cases: a single
// row; GQA with more keys, ragged blocks and a batch 1 that shifts the mods; more queries than keys
// (the first 60 rows see only the prefix); GQA 2:1 with 17 queries over 1000 keys (the window's
// blocks far past the prefix); and seqlen_q 40, seqlen_k 300 (diagonal 260: row 0 sees [220, 260]
// and the prefix [0, 24), read in its whole block and masked per element), with the keys of the
// whole blocks of `block_n` keys between the prefix's and row 0's band, which no row sees, set to
// NaN ([32, 192) for 32-key blocks, [64, 192) for 64; none for 128: the band starts in block 1).
// Each case is causal, of inputs of seeds `seed`, `seed` + 1, ..., and compared with the fp64
// reference of the variant.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "generator/problem.hpp"
#include "support/forward_emulation.hpp"
#include "support/variant_cases.hpp"

namespace flashjit::testing {

// The forward on each case, launched through run_guarded_forward (o and lse guarded).
void check_variant_forward_emulation(const VariantCase& variant, DType dtype, int head_dim,
                                     int block_n, uint64_t seed, const ForwardLaunch& launch);

// Runs the emulated backward of `problem` (deterministic as the test's config is), filling the
// gradients' whole spans; returns the emulator's error ("" when it ran).
using EmulatedBackward =
    std::function<std::string(const AttentionProblem&, const HostInputs&, Gradients* out)>;

// The backward on each case (inputs with o and lse from the variant's forward), its gradients
// within gradient_tolerance(dtype).
void check_variant_backward_emulation(const VariantCase& variant, DType dtype, int head_dim,
                                      int block_n, uint64_t seed, const EmulatedBackward& launch);

}  // namespace flashjit::testing
