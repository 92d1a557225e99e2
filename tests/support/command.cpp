#include "support/command.hpp"

#include <sys/wait.h>

#include <cstdio>

namespace flashjit::testing {

CommandOutcome run_command(const std::string& command_line) {
  CommandOutcome outcome;
  const std::string command = command_line + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return outcome;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) outcome.output.append(buffer, n);
  const int status = pclose(pipe);
  outcome.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return outcome;
}

}  // namespace flashjit::testing
