// `flashjit report`: one self-contained HTML file (inline SVG and CSS, no scripts, nothing loaded
// from the network) from a tuning DB and, optionally, a bench/side_by_side.py JSON:
//
//   flashjit report [--db PATH] [--side-by-side FILE.json] --out FILE.html
//
// - per problem key of the DB (each device and generator version; stale ones marked): every
//   measured config's speed as a bar chart (the chosen config and the default in their colors),
//   the choice against the default (gain), and the configs that failed with their status and why;
// - with --side-by-side: the run's facts (device, date, commit, torch), its summary table
//   (geo-mean ratios per pass and dtype, worst and best shape, as side_by_side.py computed them),
//   per pass and dtype the TFLOP/s-vs-seqlen panels of every implementation, and every shape's
//   numbers.
// --db defaults to the user DB; it may be left out (no DB section) when --side-by-side is given.
// Exit status: 0 written, 1 an input could not be read, 2 a usage error.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace flashjit::cli {

// `args`: everything after "report". Prints to std::cout / std::cerr.
int run_report_command(const std::vector<std::string>& args);
int run_report_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace flashjit::cli
