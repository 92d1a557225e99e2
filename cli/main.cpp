// `flashjit`: the command line (cli/commands.hpp).
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/tune_command.hpp"

int main(int argc, char** argv) {
  flashjit::cli::set_worker_executable("/proc/self/exe");
  return flashjit::cli::run_cli(std::vector<std::string>(argv + 1, argv + argc));
}
