// The problems a tuning run covers, and how a run is divided: a grid (every combination of
// dtypes, head dims, causal settings, passes and sequence lengths, with batch and heads from a
// token and hidden-size budget or fixed), the CPU's small default grid, shards of a run (array
// jobs: --shard i/n) and the split of a run over workers (one per GPU). A TuneRequest
// (tuner/tune_run.hpp) names its problems as a grid; `flashjit tune` and flashjit.tune() build
// one from their flags and keyword arguments.
#pragma once

#include <cstdint>
#include <vector>

#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

// The standard grid's budget: 16k tokens (batch = tokens / seqlen), hidden size 2048 (heads =
// hidden / head dim), so that every problem does about the same work per token.
inline constexpr int64_t kGridDefaultTokens = 16384;
inline constexpr int64_t kGridDefaultHidden = 2048;

struct ProblemGrid {
  std::vector<DType> dtypes = {DType::BF16};
  std::vector<int> head_dims = {64, 128, 256};
  std::vector<bool> causal = {false, true};
  std::vector<Pass> passes = {Pass::Forward};
  std::vector<int64_t> seqlens = {512, 1024, 2048, 4096, 8192, 16384};
  int64_t tokens = kGridDefaultTokens;  // batch = max(1, tokens / seqlen), unless batch > 0
  int64_t batch = 0;
  int64_t hidden = kGridDefaultHidden;  // heads = max(1, hidden / head dim), unless heads > 0
  int64_t heads = 0;
  int64_t kv_heads = 0;  // key/value heads (GQA); 0: as many as the query heads
  // The backward problems ask for bitwise reproducible gradients (AttentionProblem::
  // deterministic: configs with a separate dQ kernel only). No effect on forward problems.
  bool deterministic = false;
};

// The grid's query heads for `head_dim` (heads, or hidden / head_dim, at least 1) and key/value
// heads (kv_heads, or the query heads).
int64_t grid_heads(const ProblemGrid& grid, int head_dim);
int64_t grid_kv_heads(const ProblemGrid& grid, int head_dim);

// Every problem of the grid, contiguous BSHD, ordered by dtype, head dim, causal (off first),
// pass (forward first), seqlen: problems that share kernels are adjacent, and a shape's forward
// and backward are tuned one after the other. Errors (InvalidArgument) name the field: an empty
// list, key/value heads that do not divide the query heads, a problem validate() rejects.
Result<std::vector<AttentionProblem>> grid_problems(const ProblemGrid& grid);

// The grid `flashjit tune` uses on the CPU when no grid flag is given (the standard one would
// take hours there): d 64,128 x N 256,1024 x causal both, batch 1, 4 heads, bf16, forward.
ProblemGrid cpu_default_grid();

// --shard i/n: this process tunes the problems whose index in the full list is i modulo n.
struct Shard {
  int index = 0;
  int count = 1;
};
std::vector<AttentionProblem> select_shard(const std::vector<AttentionProblem>& problems,
                                           const Shard& shard);

// Splits `problems` into `workers` contiguous parts of near-equal size (adjacent problems share
// kernels, so contiguous parts compile least). Part i of the result goes to worker i.
std::vector<std::vector<AttentionProblem>> split_for_workers(
    const std::vector<AttentionProblem>& problems, int workers);

}  // namespace flashjit
