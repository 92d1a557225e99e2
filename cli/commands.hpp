// The `flashjit` command line as a function: the executable (cli/main.cpp) and the Python module
// (`python -m flashjit ...`, python/flashjit/__main__.py) both run it, so they are one program.
#pragma once

#include <string>
#include <vector>

namespace flashjit::cli {

// Runs `flashjit <args...>` (args without the program name): prints to stdout / stderr (flushed
// before it returns) and returns the exit status (0 ok, 1 the work failed, 2 a usage error).
int run_cli(const std::vector<std::string>& args);

}  // namespace flashjit::cli
