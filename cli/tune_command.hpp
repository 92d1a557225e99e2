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
// The command turns its flags into a TuneRequest and prints the TuneRunReport that
// tuner/tune_run.hpp's run_tune returns (the table; --json: the JSON report). Everything but
// run_tune_command is pure (no device calls), for tests/cli/tune_command_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "tuner/grid.hpp"

namespace flashjit::cli {

// The command's name, help and flags (parse_flags(tune_command(), args)).
const Command& tune_command();

// The grid named by the flags (--pass --deterministic --head-dims --dtypes --causal --seqlens
// --tokens/--batch --hidden/--heads --kv-heads), each flag replacing that part of `base`.
// Errors name the flag and its value.
Result<ProblemGrid> grid_from_flags(const ParsedFlags& flags, const ProblemGrid& base = {});
// grid_problems(grid_from_flags(flags, base)): the grid's problems in tuning order
// (tuner/grid.hpp), with errors naming the flag.
Result<std::vector<AttentionProblem>> tune_problems_from_flags(const ParsedFlags& flags,
                                                               const ProblemGrid& base = {});
// True when a flag that shapes the problems (--head-dims ... --kv-heads, not --pass or
// --deterministic) was given: on the CPU without one the grid is cpu_default_grid().
bool grid_flags_given(const ParsedFlags& flags);

// --shard i/n (default 0/1).
Result<Shard> shard_from_flags(const ParsedFlags& flags);

// --devices 0,1 | all (default: 0). `device_count` is the number of CUDA devices present; an
// ordinal >= device_count is an error naming it.
Result<std::vector<int>> devices_from_flags(const ParsedFlags& flags, int device_count);

int run_tune_command(const std::vector<std::string>& args);

// The program `flashjit tune` re-runs as its worker process (crash isolation,
// tuner/tune_run.hpp TuneRequest::worker_argv), as the command line before "tune ...": the
// flashjit binary sets {"/proc/self/exe"}. Unset (the in-process tests), tuning runs in the
// calling process. (flashjit.tune() in Python builds its TuneRequest itself: python/src/tune.cpp.)
void set_worker_command(std::vector<std::string> command);
void set_worker_executable(std::string path);  // set_worker_command({path})

}  // namespace flashjit::cli
