// `flashjit db`: list, inspect, export, import, merge and clear tuning databases
// (docs/TUNING_DB.md describes the schema).
//
// Wiring into cli/main.cpp (dispatch(), before the lookup in commands(), since `db` has
// subcommands and positional arguments that parse_flags does not take):
//
//   if (name == "db") return run_db_command({args.begin() + 1, args.end()});
//
// and a line for `flashjit --help`, e.g. "db  list, show, export, import, merge, clear tuning
// DBs" (db_usage() is the full text, printed by `flashjit db --help`).
//
//   flashjit db ls     [--db PATH] [--all]
//   flashjit db show   [--db PATH] [--all] [problem flags]
//   flashjit db export [--db PATH] FILE
//   flashjit db import [--db PATH] FILE
//   flashjit db merge  OUT IN [IN...]
//   flashjit db clear  [--db PATH] [--stale]
//
// --db defaults to the user DB (runtime/runtime.hpp: default_user_db(): $FLASHJIT_DB, else
// ~/.local/share/flashjit/tuning.db). Exit status: 0 success, 1 the work failed (a DB could not
// be read or written), 2 a usage error. Errors are one line on stderr.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace flashjit::cli {

// `args`: everything after "db" ("ls", "--all", ...). Prints to std::cout / std::cerr.
int run_db_command(const std::vector<std::string>& args);
// The same, printing to `out` and `err` (tests).
int run_db_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// `flashjit db --help`.
std::string db_usage();

}  // namespace flashjit::cli
