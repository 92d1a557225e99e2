// flashjit.tune(): the Python keyword arguments -> a TuneRequest (tuner/tune_run.hpp), the run,
// and its report -> a dict with the keys of `flashjit tune --json`'s report.
#pragma once

#include <nanobind/nanobind.h>

#include "errors.hpp"

namespace flashjit::python {

// `spec`: the keyword arguments of flashjit.tune() as python/flashjit/_tune.py normalizes them
// (lists of ints / strings, causal "on" / "off" / "both", shard (i, n), devices a list or "all",
// None where not given), plus "worker" (the worker process's command line; empty: tune in this
// process). Returns (status, message, report): the run's exit status as `flashjit tune`'s, what
// went wrong (empty when status is 0), and the report as a dict. A bad value raises
// InvalidArgumentError naming the argument. In a tuning worker process the report goes to the
// supervisor and no summary is printed; elsewhere the summary table is printed on stdout.
nb::tuple tune(const nb::dict& spec);

}  // namespace flashjit::python
