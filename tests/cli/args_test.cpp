// The CLI's argument parsing: every bad value is an error naming the flag, never a crash.
// (cli/*.cpp but main.cpp are the flashjit_cli_lib library, which every test links.)
#include "cli/args.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace flashjit::cli {
namespace {

const Command& command(std::string_view name) {
  const Command* found = find_command(name);
  EXPECT_NE(found, nullptr) << name;
  return *found;
}

Result<ParsedFlags> parse(std::string_view name, std::vector<std::string> args) {
  return parse_flags(command(name), args);
}

// The error message of parsing + converting `args` for `plan` into a problem; "" on success.
std::string problem_error(std::vector<std::string> args) {
  auto flags = parse("plan", std::move(args));
  if (!flags.ok()) return flags.error().message;
  auto problem = problem_from_flags(*flags);
  return problem.ok() ? "" : problem.error().message;
}

TEST(Commands, AllSubcommandsExistAndHaveHelp) {
  for (const char* name : {"plan", "show", "compile", "run", "devices"}) {
    const Command& found = command(name);
    EXPECT_FALSE(found.summary.empty());
    EXPECT_NE(command_usage(found).find("--help"), std::string::npos) << name;
    EXPECT_NE(program_usage().find(name), std::string::npos) << name;
  }
  EXPECT_EQ(find_command("tune"), nullptr);
}

TEST(ParseFlags, ValuesSwitchesAndEqualsForm) {
  auto flags = parse("compile", {"--batch", "3", "--head-dim=64", "--causal", "--all"});
  ASSERT_TRUE(flags.ok()) << flags.error().describe();
  EXPECT_EQ(flags->get("batch"), "3");
  EXPECT_EQ(flags->get("head-dim"), "64");
  EXPECT_TRUE(flags->has("causal"));
  EXPECT_TRUE(flags->has("all"));
  EXPECT_FALSE(flags->has("arch"));
  EXPECT_EQ(flags->get("arch"), std::nullopt);
}

TEST(ParseFlags, ShortHelpIsHelp) {
  auto flags = parse("plan", {"-h"});
  ASSERT_TRUE(flags.ok());
  EXPECT_TRUE(flags->has("help"));
}

TEST(ParseFlags, RejectsMalformedLines) {
  auto unknown = parse("plan", {"--bogus", "1"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(unknown.error().message.find("--bogus"), std::string::npos);
  EXPECT_NE(unknown.error().message.find("--batch"), std::string::npos);  // lists the allowed

  // A flag of another command is unknown here.
  EXPECT_FALSE(parse("plan", {"--all"}).ok());
  EXPECT_FALSE(parse("devices", {"--arch", "sm90"}).ok());

  auto missing = parse("plan", {"--batch"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("--batch needs a value"), std::string::npos);

  EXPECT_FALSE(parse("plan", {"--causal=yes"}).ok());
  EXPECT_FALSE(parse("plan", {"--batch", "1", "--batch", "2"}).ok());
  EXPECT_FALSE(parse("plan", {"positional"}).ok());
  EXPECT_FALSE(parse("plan", {"-x"}).ok());
  EXPECT_FALSE(parse("plan", {"--"}).ok());
}

TEST(IntegerFlag, RangeAndSyntax) {
  auto flags = parse("run", {"--reps", "7"});
  ASSERT_TRUE(flags.ok());
  auto reps = integer_flag(*flags, "reps", 20, 1, 100);
  ASSERT_TRUE(reps.ok());
  EXPECT_EQ(*reps, 7);
  auto fallback = integer_flag(*flags, "device", 0, 0, 7);
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(*fallback, 0);

  for (const char* bad : {"0", "-1", "101", "7x", "", "1e3", "0x10", "99999999999999999999"}) {
    auto parsed = parse("run", {"--reps", bad});
    ASSERT_TRUE(parsed.ok()) << bad;
    auto value = integer_flag(*parsed, "reps", 20, 1, 100);
    ASSERT_FALSE(value.ok()) << bad;
    EXPECT_NE(value.error().message.find("--reps = '" + std::string(bad) + "'"), std::string::npos)
        << value.error().message;
    EXPECT_NE(value.error().message.find("[1, 100]"), std::string::npos);
  }
}

TEST(ProblemFromFlags, Defaults) {
  auto flags = parse("plan", {});
  ASSERT_TRUE(flags.ok());
  auto problem = problem_from_flags(*flags);
  ASSERT_TRUE(problem.ok()) << problem.error().describe();
  EXPECT_EQ(problem->batch, kDefaultBatch);
  EXPECT_EQ(problem->heads_q, kDefaultHeads);
  EXPECT_EQ(problem->heads_kv, kDefaultHeads);
  EXPECT_EQ(problem->seqlen_q, kDefaultSeqlen);
  EXPECT_EQ(problem->seqlen_k, kDefaultSeqlen);
  EXPECT_EQ(problem->head_dim, kDefaultHeadDim);
  EXPECT_EQ(problem->dtype, DType::BF16);
  EXPECT_FALSE(problem->causal);
  EXPECT_FALSE(problem->softmax_scale.has_value());
}

TEST(ProblemFromFlags, EveryFlag) {
  auto flags = parse("plan", {"--batch", "3", "--heads", "32", "--kv-heads", "8", "--seqlen",
                              "1000", "--seqlen-k", "2048", "--head-dim", "64", "--dtype", "fp16",
                              "--causal", "--scale", "0.25", "--layout", "bhsd"});
  ASSERT_TRUE(flags.ok()) << flags.error().describe();
  auto problem = problem_from_flags(*flags);
  ASSERT_TRUE(problem.ok()) << problem.error().describe();
  EXPECT_EQ(problem->batch, 3);
  EXPECT_EQ(problem->heads_q, 32);
  EXPECT_EQ(problem->heads_kv, 8);
  EXPECT_EQ(problem->seqlen_q, 1000);
  EXPECT_EQ(problem->seqlen_k, 2048);
  EXPECT_EQ(problem->head_dim, 64);
  EXPECT_EQ(problem->dtype, DType::F16);
  EXPECT_TRUE(problem->causal);
  ASSERT_TRUE(problem->softmax_scale.has_value());
  EXPECT_FLOAT_EQ(*problem->softmax_scale, 0.25f);
  AttentionProblem expected =
      AttentionProblem::make(3, 32, 8, 1000, 2048, 64, DType::F16, true, Layout::BHSD);
  EXPECT_EQ(problem->q_strides, expected.q_strides);
  EXPECT_EQ(problem->k_strides, expected.k_strides);
  EXPECT_EQ(problem->o_strides, expected.o_strides);
}

TEST(ProblemFromFlags, BadValuesNameTheFlagAndTheValue) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;  // a part of the message
  };
  const Case cases[] = {
      {{"--batch", "0"}, "--batch = '0'"},
      {{"--batch", "two"}, "--batch = 'two'"},
      {{"--heads", "-4"}, "--heads = '-4'"},
      {{"--heads", "16", "--kv-heads", "3"}, "--kv-heads = '3': must divide --heads = 16"},
      {{"--heads", "4", "--kv-heads", "8"}, "--kv-heads = '8'"},
      {{"--seqlen", "0"}, "--seqlen = '0'"},
      {{"--seqlen-q", "x"}, "--seqlen-q = 'x'"},
      {{"--seqlen-k", "1.5"}, "--seqlen-k = '1.5'"},
      {{"--head-dim", "100"}, "--head-dim = '100': must be a multiple of 8"},
      {{"--head-dim", "512"}, "--head-dim = '512'"},
      {{"--head-dim", "0"}, "--head-dim = '0'"},
      {{"--dtype", "fp8"}, "--dtype = 'fp8': allowed: bf16, fp16, fp32"},
      {{"--layout", "sbhd"}, "--layout = 'sbhd': allowed: bshd, bhsd"},
      {{"--scale", "0"}, "--scale = '0'"},
      {{"--scale", "-1"}, "--scale = '-1'"},
      {{"--scale", "nan"}, "--scale = 'nan'"},
      {{"--scale", "inf"}, "--scale = 'inf'"},
      {{"--scale", "0.1x"}, "--scale = '0.1x'"},
  };
  for (const Case& c : cases) {
    std::string message = problem_error(c.args);
    EXPECT_NE(message.find(c.expected), std::string::npos)
        << "args: " << c.args[0] << " ... got: '" << message << "'";
  }
}

// --docs L1,L2,...: packed variable-length documents of those lengths (num_docs, the longest,
// the total), with the other problem and variant flags.
TEST(ProblemFromFlags, DocsArePackedDocuments) {
  auto flags = parse("plan", {"--docs", "1,17,1000,0", "--heads", "8", "--kv-heads", "2",
                              "--causal", "--window", "64,0", "--head-dim", "64"});
  ASSERT_TRUE(flags.ok()) << flags.error().message;
  auto problem = problem_from_flags(*flags);
  ASSERT_TRUE(problem.ok()) << problem.error().message;
  EXPECT_TRUE(problem->variant.varlen);
  EXPECT_EQ(problem->batch, 4);
  EXPECT_EQ(problem->seqlen_q, 1000);
  EXPECT_EQ(problem->seqlen_k, 1000);
  EXPECT_EQ(problem->variant.total_q, 1018);
  EXPECT_EQ(problem->variant.total_k, 1018);
  EXPECT_EQ(problem->heads_kv, 2);
  EXPECT_EQ(problem->head_dim, 64);
  EXPECT_TRUE(problem->causal);
  EXPECT_EQ(problem->variant.key(), "window(64,0) varlen");
  EXPECT_EQ(problem->q_strides.batch, 0);
  for (const char* bad : {"", "1,,2", "-3", "5,x", "3000000000"})
    EXPECT_NE(problem_error({"--docs", bad}).find("--docs = '" + std::string(bad) + "'"),
              std::string::npos)
        << bad << ": " << problem_error({"--docs", bad});
  // The backward of packed documents is a problem (the CPU backend's).
  EXPECT_EQ(problem_error({"--docs", "4,4", "--pass", "bwd"}), "");
}

// `flashjit run --docs` launches the documents' own lengths: their offsets (cu_seqlens).
TEST(ProblemFromFlags, DocsGiveTheirOffsets) {
  auto flags = parse("run", {"--docs", "100,1,17,300", "--head-dim", "64"});
  ASSERT_TRUE(flags.ok()) << flags.error().message;
  auto offsets = document_offsets_from_flags(*flags);
  ASSERT_TRUE(offsets.ok()) << offsets.error().message;
  EXPECT_EQ(*offsets, (std::vector<int32_t>{0, 100, 101, 118, 418}));
  auto none = parse("run", {"--head-dim", "64"});
  ASSERT_TRUE(none.ok());
  ASSERT_TRUE(document_offsets_from_flags(*none).ok());
  EXPECT_TRUE(document_offsets_from_flags(*none)->empty());
  auto bad = parse("run", {"--docs", "7,-1"});
  ASSERT_TRUE(bad.ok());
  ASSERT_FALSE(document_offsets_from_flags(*bad).ok());
  EXPECT_NE(document_offsets_from_flags(*bad).error().message.find("--docs = '7,-1'"),
            std::string::npos);
}

TEST(ProblemFromFlags, PassAndDeterministic) {
  for (const char* command : {"plan", "show", "compile", "run"}) {
    auto defaults = parse(command, {});
    ASSERT_TRUE(defaults.ok()) << command;
    auto forward = problem_from_flags(*defaults);
    ASSERT_TRUE(forward.ok()) << forward.error().describe();
    EXPECT_EQ(forward->pass, Pass::Forward) << command;
    EXPECT_FALSE(forward->deterministic);

    auto flags = parse(command, {"--pass", "bwd", "--deterministic", "--layout", "bhsd", "--heads",
                                 "8", "--kv-heads", "2", "--seqlen-q", "17"});
    ASSERT_TRUE(flags.ok()) << command << ": " << flags.error().describe();
    auto backward = problem_from_flags(*flags);
    ASSERT_TRUE(backward.ok()) << backward.error().describe();
    EXPECT_EQ(backward->pass, Pass::Backward) << command;
    EXPECT_TRUE(backward->deterministic);
    // The gradients are contiguous in the layout, like the tensors they belong to.
    EXPECT_EQ(backward->do_strides, backward->o_strides);
    EXPECT_EQ(backward->dq_strides, backward->q_strides);
    EXPECT_EQ(backward->dk_strides, backward->k_strides);
    EXPECT_EQ(backward->dv_strides, backward->v_strides);
    EXPECT_EQ(backward->q_strides, contiguous_strides(Layout::BHSD, 17, 8, kDefaultHeadDim));
  }
  auto spelled = parse("run", {"--pass", "backward"});
  ASSERT_TRUE(spelled.ok());
  EXPECT_EQ(problem_from_flags(*spelled)->pass, Pass::Backward);
  auto forward = parse("run", {"--pass", "fwd"});
  ASSERT_TRUE(forward.ok());
  EXPECT_EQ(problem_from_flags(*forward)->pass, Pass::Forward);

  EXPECT_NE(problem_error({"--pass", "sideways"}).find("--pass = 'sideways': allowed: fwd, bwd"),
            std::string::npos);
  EXPECT_NE(problem_error({"--pass", ""}).find("--pass = ''"), std::string::npos);
  EXPECT_NE(problem_error({"--deterministic"})
                .find("--deterministic applies to the backward "
                      "pass only: add --pass bwd"),
            std::string::npos);
  EXPECT_NE(problem_error({"--pass", "fwd", "--deterministic"}).find("--deterministic"),
            std::string::npos);
  // A switch takes no value.
  auto valued = parse("plan", {"--deterministic=yes"});
  ASSERT_FALSE(valued.ok());
  EXPECT_NE(valued.error().message.find("--deterministic"), std::string::npos);
}

// --score-mod-grad: the score_mod's derivative, which a backward problem with a score_mod needs.
TEST(ProblemFromFlags, ScoreModGradForTheBackward) {
  auto flags =
      parse("show", {"--pass", "bwd", "--score-mod", "score * 2.0f", "--score-mod-grad", "2.0f"});
  ASSERT_TRUE(flags.ok()) << flags.error().describe();
  auto problem = problem_from_flags(*flags);
  ASSERT_TRUE(problem.ok()) << problem.error().describe();
  EXPECT_EQ(problem->variant.score_mod_grad, "2.0f");
  EXPECT_TRUE(validate(*problem).ok());
  auto missing = parse("show", {"--pass", "bwd", "--score-mod", "score * 2.0f"});
  ASSERT_TRUE(missing.ok());
  auto refused = problem_from_flags(*missing);
  const Status status = refused.ok() ? validate(*refused) : Status(refused.error());
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("needs score_mod_grad"), std::string::npos)
      << status.error().message;
}

TEST(ProblemFromFlags, DtypeSpellings) {
  for (const char* spelling : {"bf16", "bfloat16"}) {
    EXPECT_EQ(problem_error({"--dtype", spelling}), "") << spelling;
  }
  for (const char* spelling : {"fp16", "f16", "float16"}) {
    EXPECT_EQ(problem_error({"--dtype", spelling}), "") << spelling;
  }
}

TEST(ConfigFromFlags, ParsesOrNamesTheFlag) {
  auto absent = parse("show", {});
  ASSERT_TRUE(absent.ok());
  auto none = config_from_flags(*absent);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  auto given = parse("show", {"--config", "m64n32w4s3"});
  ASSERT_TRUE(given.ok());
  auto config = config_from_flags(*given);
  ASSERT_TRUE(config.ok()) << config.error().describe();
  ASSERT_TRUE(config->has_value());
  EXPECT_EQ((**config).block_m, 64);
  EXPECT_EQ((**config).block_n, 32);
  EXPECT_EQ((**config).warps, 4);
  EXPECT_EQ((**config).stages, 3);

  auto bad = parse("show", {"--config", "m128"});
  ASSERT_TRUE(bad.ok());
  auto error = config_from_flags(*bad);
  ASSERT_FALSE(error.ok());
  EXPECT_NE(error.error().message.find("--config = 'm128'"), std::string::npos);
}

TEST(TableDeviceFromFlags, KnownArchsUnknownArchAndConflicts) {
  for (const std::string& arch : known_archs()) {
    auto flags = parse("plan", {"--arch", arch});
    ASSERT_TRUE(flags.ok());
    auto device = table_device_from_flags(*flags);
    ASSERT_TRUE(device.ok()) << device.error().describe();
    ASSERT_TRUE(device->has_value());
    EXPECT_EQ((**device).arch_name(), arch);
  }

  auto unknown = parse("plan", {"--arch", "sm70"});
  ASSERT_TRUE(unknown.ok());
  auto error = table_device_from_flags(*unknown);
  ASSERT_FALSE(error.ok());
  EXPECT_NE(error.error().message.find("--arch = 'sm70'"), std::string::npos);
  EXPECT_NE(error.error().message.find("sm90"), std::string::npos);

  auto both = parse("plan", {"--arch", "sm90", "--device", "0"});
  ASSERT_TRUE(both.ok());
  EXPECT_FALSE(table_device_from_flags(*both).ok());

  auto absent = parse("plan", {});
  ASSERT_TRUE(absent.ok());
  auto none = table_device_from_flags(*absent);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

}  // namespace
}  // namespace flashjit::cli
