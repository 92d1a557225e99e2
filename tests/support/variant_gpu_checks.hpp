// The GPU checks of attention variants shared by the CUDA forward's and backward's tests
// (tests/runtime/cuda_variant_test.cpp, cuda_backward_variant_test.cpp): every config of a variant
// case over the GPU test shapes, and key blocks hidden from every query never used. Runs are
// judged by run_matches_reference (support/device_run.hpp): o and lse, or the gradients. Call them
// from a test that has made sure the backend has a device.
#pragma once

#include <functional>
#include <vector>

#include "generator/config.hpp"
#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "support/variant_cases.hpp"

namespace flashjit::testing {

// The configs a test runs for a problem (e.g. the legal ones of the selected families).
using ConfigsFor = std::function<std::vector<AttentionConfig>(const AttentionProblem&)>;

// For d64 fp16 and d128 bf16: the configs of `c`'s problem of `pass` built in parallel, then on
// every GPU test shape (inputs of seeds 1, 2, ...) each run with poisoned outputs against the fp64
// reference of the variant. Skips (GTEST_SKIP) where a head dim has no config.
void check_variant_on_every_config(const Backend& backend, const VariantCase& c, Pass pass,
                                   const ConfigsFor& configs_for);

// Key blocks a causal window hides from every query are never used: batch 2, 4:2 heads, d128 bf16,
// seqlen_q 64, seqlen_k 4096 (diagonal 4032), window (32, 0): no query sees a key below 4000, so
// keys [0, 3840) (whole blocks of every block_n) are NaN, and a kernel that loads one writes NaN
// (the backward: into dK and dV, which must be 0 there, or dQ). Then the same with a user mask_mod
// and the window. Every config `configs_for` gives, built one by one, for `pass`.
void check_hidden_key_blocks(const Backend& backend, Pass pass, const ConfigsFor& configs_for);

}  // namespace flashjit::testing
