// Fuzz target: the CLI's flag parser and the parsers of flag values (cli/args.hpp,
// cli/tune_command.hpp). Input: one byte choosing the command (plan, show, compile, run,
// devices, tune), then its argv, arguments separated by '\0'. Whatever the argv, each parser
// returns a value or an error with a message, and a problem it returns is valid.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/tune_command.hpp"
#include "fuzz_support.hpp"
#include "tuner/grid.hpp"

using namespace flashjit;
using namespace flashjit::cli;
using flashjit::fuzz::checked;
using flashjit::fuzz::require;
using flashjit::fuzz::require_message;

namespace {

// Problems a grid names (the tune command's product of lists), without building them.
size_t grid_size(const ProblemGrid& grid) {
  size_t size = 1;
  for (size_t n : {grid.dtypes.size(), grid.head_dims.size(), grid.causal.size(),
                   grid.passes.size(), grid.seqlens.size()}) {
    if (n != 0 && size > SIZE_MAX / n) return SIZE_MAX;
    size *= n;
  }
  return size;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<const Command*> table;
  for (const Command& command : commands()) table.push_back(&command);
  table.push_back(&tune_command());
  const Command& command = *table[data[0] % table.size()];
  std::vector<std::string> args;
  if (size > 1) {
    args = fuzz::split(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), '\0');
  }

  const Result<ParsedFlags> flags = parse_flags(command, args);
  if (!checked(flags, "parse_flags")) return 0;
  for (const auto& [name, value] : flags->values) {
    bool known = false;
    for (const Flag& flag : command.flags) known = known || flag.name == name;
    require(known, "parse_flags accepted a flag the command does not have: " + name);
  }
  (void)command_usage(command);

  if (command.name == "tune") {
    const Result<ProblemGrid> grid = grid_from_flags(*flags);
    // Building the problems of a grid of millions is slow, not wrong: only small grids.
    if (checked(grid, "grid_from_flags") && grid_size(*grid) <= 4096) {
      const Result<std::vector<AttentionProblem>> problems = tune_problems_from_flags(*flags);
      if (checked(problems, "tune_problems_from_flags")) {
        for (const AttentionProblem& problem : *problems) {
          require(validate(problem).ok(), "tune grid problem invalid: " + problem.to_string());
        }
      }
    }
    (void)checked(shard_from_flags(*flags), "shard_from_flags");
    (void)checked(devices_from_flags(*flags, 4), "devices_from_flags");
    (void)grid_flags_given(*flags);
    return 0;
  }

  const Result<AttentionProblem> problem = problem_from_flags(*flags);
  if (checked(problem, "problem_from_flags")) {
    require(validate(*problem).ok(),
            "problem_from_flags returned an invalid problem: " + problem->to_string());
  }
  const Result<std::optional<AttentionConfig>> config = config_from_flags(*flags);
  if (checked(config, "config_from_flags") && config->has_value()) {
    AttentionConfig with_splits = **config;
    (void)checked(apply_splits_flag(*flags, with_splits), "apply_splits_flag");
    const Result<AttentionConfig> again = AttentionConfig::parse((*config)->to_string());
    require(again.ok() && *again == **config,
            "config does not read back from its name: " + (*config)->to_string());
  }
  (void)checked(table_device_from_flags(*flags), "table_device_from_flags");
  for (const char* name : {"reps", "jobs", "device"}) {
    (void)checked(integer_flag(*flags, name, 1, 0, 1 << 20), "integer_flag");
  }
  return 0;
}
