// Runs a command line through the shell for tests of the `flashjit` binary (tests/cli/*): its exit
// status and everything it printed.
//
//   const flashjit::testing::CommandOutcome plan =
//       flashjit::testing::run_command(std::string(FLASHJIT_CLI_PATH) + " plan --arch sm90");
//
// FLASHJIT_CLI_PATH is defined for the tests that tests/CMakeLists.txt lists as running the
// binary.
#pragma once

#include <string>

namespace flashjit::testing {

struct CommandOutcome {
  int status = -1;     // the exit status; -1 when it did not exit normally (or did not start)
  std::string output;  // stdout and stderr together
};

CommandOutcome run_command(const std::string& command_line);

}  // namespace flashjit::testing
