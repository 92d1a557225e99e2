// The GPU tests' sweep: every legal config of a (head_dim, dtype, causal) group of one pass, on
// one backend (CUDA or HIP: only the Backend interface is used), against the fp64 reference over
// a list of shapes; a summary table of the worst errors per config.
//
//   TEST_P(CudaAttentionAllConfigs, MatchesFp64Reference) {
//     ft::check_all_configs(*ft::gpu_backend(), GetParam(), {ft::gpu_test_shapes()});
//   }
//
// Per group: the configs are built in parallel first (a failed build is a test failure); then
// per shape one seed per (group, shape), so every config sees the same inputs and the same
// reference, the inputs uploaded once and every config run on them with its outputs poisoned
// (tests/support/device_run.hpp). A failure message names the group, shape, config (and whether
// it is the default), seed and every compared quantity; a failed synchronize (the context may be
// lost) stops the group, and so do `max_failures` failures; the summary table (regs, local
// bytes, worst errors and runs per config, the default marked) is printed either way.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "support/attention_cases.hpp"

namespace flashjit::testing {

struct ConfigGroup {
  int head_dim;
  DType dtype;
  bool causal;
  Pass pass = Pass::Forward;

  std::string name() const;  // "d128_bf16_causal" (the pass is not in it)
};
void PrintTo(const ConfigGroup& group, std::ostream* out);

// The standard groups of `pass`: head dims 64, 128, 256 x f16, bf16 x causal off and on.
std::vector<ConfigGroup> all_groups(Pass pass);

struct AllConfigsOptions {
  std::vector<Shape> shapes;
  // Shapes with more rows than this (seqlen_q or seqlen_k) run for the default config only (the
  // fp64 reference of a long sequence takes seconds); 0: every shape for every config.
  int64_t all_configs_max_seqlen = 0;
  int max_failures = 30;  // past this many failing runs in a group the rest add noise
  // Forward: o within max_rel relative L2 error, lse within max_lse_abs (matches_reference).
  double max_rel = 1e-2;
  double max_lse_abs = 1e-3;
  // Backward: every gradient within max_grad_rel relative L2 error; 0: gradient_tolerance(dtype).
  double max_grad_rel = 0;
};

// Every legal config of `group` on `backend`, over options.shapes; gtest failures as above.
void check_all_configs(const Backend& backend, const ConfigGroup& group,
                       const AllConfigsOptions& options);

}  // namespace flashjit::testing
