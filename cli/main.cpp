// `flashjit`: the command line (cli/commands.hpp).
#include <string>
#include <vector>

#include "cli/commands.hpp"

int main(int argc, char** argv) {
  return flashjit::cli::run_cli(std::vector<std::string>(argv + 1, argv + argc));
}
