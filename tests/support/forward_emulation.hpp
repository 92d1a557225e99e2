// What the forward emulation tests share (tests/templates/*_emulation_test.cpp: the CUDA mma,
// wgmma and -ws templates, the HIP template; plain and with a variant): one launch with guarded,
// poisoned outputs, and its grid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "support/reference.hpp"
#include "templates/attention_params.h"

namespace flashjit::testing {

// Elements after each output that must stay untouched (a write past the tensor's span).
constexpr size_t kGuardElements = 64;

// The forward's grid as an emulator's grid type (CudaGrid, Sm90Grid, HipGrid): x the query blocks
// of block_m rows, y the query heads, z the batch (packed documents: the documents).
template <class Grid>
Grid forward_grid(const AttentionProblem& problem, int block_m) {
  Grid grid;
  grid.x = static_cast<int>((problem.seqlen_q + block_m - 1) / block_m);
  grid.y = static_cast<int>(problem.heads_q);
  grid.z = static_cast<int>(problem.batch);
  return grid;
}

// Launches the emulated kernel on the params of `problem` (`inputs` are the tensors they point
// at); returns the emulator's error ("" when it ran).
using ForwardLaunch = std::function<std::string(
    const AttentionProblem& problem, const HostInputs& inputs, const FlashjitAttentionParams&)>;

// One forward launch: o poisoned and lse NaN, each followed by kGuardElements guard elements,
// the launch params on them (ALiBi's slopes from `inputs` when it has them). Returns the
// emulator's error, or what was written past o's span or lse's end; else "" with o (the whole
// span) and lse filled.
std::string run_guarded_forward(const AttentionProblem& problem, const HostInputs& inputs,
                                const ForwardLaunch& launch, std::vector<uint16_t>* o,
                                std::vector<float>* lse);

}  // namespace flashjit::testing
