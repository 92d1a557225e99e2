// Checked decode tables (issue 33): whether a decode call checks its block table and seqlens_k
// (AttentionArgs::check_tables, FLASHJIT_CHECK_TABLES, debug builds), the tables as the check
// sees them, and the host check (the CPU backend, whose tables are host memory). The rules and
// the GPU check kernel are templates/checks/decode_tables.h; the CUDA backend launches that kernel
// on the call's stream before the decode kernel (runtime/cuda/cuda_backend.cpp).
#pragma once

#include <string>

#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "templates/checks/decode_tables.h"

namespace flashjit {

// The check kernel's entry point and block size (one block).
inline constexpr const char* kDecodeTableCheckEntry = "flashjit_check_decode_tables";
inline constexpr int kDecodeTableCheckThreads = 512;

// FLASHJIT_CHECK_TABLES: "1" on, "0" off; unset (or anything else): on in a debug build of the
// library (NDEBUG not defined), off in a release build. Read at each call.
bool table_check_default();
// A call checks its tables when it asks (args.check_tables) or by default.
inline bool table_check_enabled(const AttentionArgs& args) {
  return args.check_tables || table_check_default();
}
// Asked for explicitly (args.check_tables or FLASHJIT_CHECK_TABLES=1), not by a debug build.
bool table_check_requested(const AttentionArgs& args);

// The tables of a decode call of `problem` (problem.kv: paged or not, seqlens_k or not).
FlashjitDecodeTables decode_tables_of(const AttentionProblem& problem, const AttentionArgs& args);

// The host check: InvalidArgument naming the first bad entry and what is allowed, e.g.
// "block_table[1][2] = 99: must be a page in [0, 64) (num_pages), used by seqlens_k[1] = 70".
// The tables must be host memory.
Status check_decode_tables(const FlashjitDecodeTables& tables);

// The CUDA source of the check kernel (templates/checks/decode_tables.h, as embedded).
std::string decode_table_check_source();

}  // namespace flashjit
