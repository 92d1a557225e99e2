// Command-line parsing for the `flashjit` tool: the command table, a flag parser, and the
// conversion of problem flags into an AttentionProblem. No device calls here, so all of it is
// testable without a GPU (tests/cli/args_test.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit::cli {

struct Flag {
  std::string_view name;     // without the leading dashes: "batch"
  std::string_view metavar;  // "N"; empty for a switch (a flag without a value)
  std::string_view help;
  bool is_switch() const { return metavar.empty(); }
};

struct Command {
  std::string_view name;     // "plan"
  std::string_view summary;  // one line for `flashjit --help`
  std::string_view details;  // a paragraph for `flashjit <command> --help`
  std::vector<Flag> flags;   // every flag the command accepts (--help included)
};

// All subcommands, in the order `flashjit --help` lists them.
const std::vector<Command>& commands();
const Command* find_command(std::string_view name);

// The flags given on one command line. A switch maps to "".
struct ParsedFlags {
  std::map<std::string, std::string, std::less<>> values;

  bool has(std::string_view name) const { return values.find(name) != values.end(); }
  // The value of `name`, or nullopt when the flag was not given.
  std::optional<std::string> get(std::string_view name) const;
};

// Parses `--name value`, `--name=value` and switches against `command.flags` ("-h" is --help).
// Errors (InvalidArgument) name the flag and what is allowed: an unknown flag, a missing value,
// a value given to a switch, a flag given twice, a positional argument.
Result<ParsedFlags> parse_flags(const Command& command, const std::vector<std::string>& args);

// Integer flag in [min_value, max_value]; `fallback` when absent.
Result<int64_t> integer_flag(const ParsedFlags& flags, std::string_view name, int64_t fallback,
                             int64_t min_value, int64_t max_value);

// Defaults of the problem flags: a mid-sized problem, d = 128, bf16, as the README uses.
inline constexpr int64_t kDefaultBatch = 2;
inline constexpr int64_t kDefaultHeads = 16;
inline constexpr int64_t kDefaultSeqlen = 4096;
inline constexpr int kDefaultHeadDim = 128;

// --batch --heads --kv-heads --seqlen --seqlen-q --seqlen-k --head-dim --dtype --causal --scale
// --layout --pass --deterministic -> a validated problem (every tensor contiguous in the layout,
// the gradients too). Flag errors name the flag; validation errors come from flashjit::validate.
Result<AttentionProblem> problem_from_flags(const ParsedFlags& flags);

// --window L,R --softcap C --alibi --prefix P --score-mod EXPR --mask-mod EXPR
// --score-mod-grad EXPR into `variant`
// (the values' ranges are validate()'s to check).
Status apply_variant_flags(const ParsedFlags& flags, Variant& variant);
// Those flags, as every command that takes them (plan, show, run, bench, tune) lists them.
std::vector<Flag> variant_flags();
// --page-size N: `problem` reading K/V from a paged cache of N keys a page (enough pages for every
// sequence's to be distinct) with per-sequence lengths; nothing when the flag is absent. Errors
// name the flag; a backward problem is InvalidArgument.
Status apply_page_size_flag(const ParsedFlags& flags, AttentionProblem& problem);
// --docs L1,L2,...: the documents' offsets (cu_seqlens: 0, L1, L1 + L2, ..., the total), empty
// when the flag is absent. The error names the flag and the value.
Result<std::vector<int32_t>> document_offsets_from_flags(const ParsedFlags& flags);

// --config, or nullopt when absent.
Result<std::optional<AttentionConfig>> config_from_flags(const ParsedFlags& flags);
// --splits auto|N into a -decode config (error naming the flag for another family); nothing when
// the flag is absent.
Status apply_splits_flag(const ParsedFlags& flags, AttentionConfig& config);

// --arch as a table device, or nullopt when absent. --device is resolved by the caller (it
// needs the driver).
Result<std::optional<DeviceSpec>> table_device_from_flags(const ParsedFlags& flags);

// `flashjit --help` and `flashjit <command> --help` texts.
std::string program_usage();
std::string command_usage(const Command& command);

}  // namespace flashjit::cli
