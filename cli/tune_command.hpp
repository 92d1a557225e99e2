// `flashjit tune`: tunes a grid of attention problems (or the problems the runtime recorded) on
// one or more GPUs and writes the results to the tuning DB.
//
// Wiring into cli/main.cpp (not done here):
//   - list it: add tune_command() to the table that `flashjit --help` prints (args.cpp commands());
//   - dispatch: if (name == "tune") return flashjit::cli::run_tune_command(rest);
//     where `rest` is the arguments after "tune". run_tune_command parses its own flags (with
//     tune_command()), prints its own --help and returns the exit status: 0 every problem got a
//     choice; 1 a device/DB failure or a problem with no usable config; 2 a bad flag or value, or
//     no CUDA device ("no CUDA device: ...").
//
// Everything but run_tune_command is pure (no device calls), for tests/cli/tune_command_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit::cli {

// The command's name, help and flags (parse_flags(tune_command(), args)).
const Command& tune_command();

// The standard grid's defaults: 16k tokens (batch = tokens / seqlen), hidden 2048
// (heads = hidden / head dim), N 512 ... 16384, d 64/128/256, causal off and on, bf16.
inline constexpr int64_t kTuneDefaultTokens = 16384;
inline constexpr int64_t kTuneDefaultHidden = 2048;

// The problems named by the grid flags (--head-dims --dtypes --causal --seqlens --tokens/--batch
// --hidden/--heads --kv-heads), ordered by dtype, head dim, causal (off first), seqlen, so that
// problems sharing kernels are adjacent. Errors name the flag and its value.
Result<std::vector<AttentionProblem>> tune_problems_from_flags(const ParsedFlags& flags);
// The grid `flashjit tune` uses on the CPU when no grid flag is given: d 64,128 x N 256,1024 x
// causal both, batch 1, 4 heads, bf16.
std::vector<AttentionProblem> cpu_default_problems();

// --shard i/n: this process tunes the problems whose index in the full list is i modulo n.
struct Shard {
  int index = 0;
  int count = 1;
};
Result<Shard> shard_from_flags(const ParsedFlags& flags);
std::vector<AttentionProblem> select_shard(const std::vector<AttentionProblem>& problems,
                                           const Shard& shard);

// --devices 0,1 | all (default: 0). `device_count` is the number of CUDA devices present; an
// ordinal >= device_count is an error naming it.
Result<std::vector<int>> devices_from_flags(const ParsedFlags& flags, int device_count);

// Splits `problems` into `workers` contiguous parts of near-equal size (adjacent problems share
// kernels, so contiguous parts compile least). Part i of the result goes to worker i.
std::vector<std::vector<AttentionProblem>> split_for_workers(
    const std::vector<AttentionProblem>& problems, int workers);

int run_tune_command(const std::vector<std::string>& args);

}  // namespace flashjit::cli
