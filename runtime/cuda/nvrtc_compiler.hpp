// NVRTC: CUDA source text -> CUBIN for one architecture. Needs no GPU.
#pragma once

#include <string>
#include <vector>

#include "generator/error.hpp"
#include "generator/render.hpp"
#include "runtime/backend.hpp"

namespace flashjit::cuda {

// "nvrtc 13.0"
std::string nvrtc_version();

// Options passed to NVRTC for `arch` (80, 86, 89, 90): -arch=sm_XX (sm_XXa when arch_specific),
// -std=c++17, ptxas -v, ...
std::vector<std::string> nvrtc_options(int arch, bool arch_specific = false);

// Compiles to CUBIN. On failure the error (CompileFailed) carries the label and the full log.
// The log of a success holds ptxas' resource report ("Used N registers, ... spill stores").
Result<Binary> nvrtc_compile(const KernelSource& source, int arch);

// Parsed from ptxas' -v report in a compile log; -1 where the log does not say.
struct PtxasReport {
  int registers = -1;
  int spill_store_bytes = -1;
  int spill_load_bytes = -1;
  int stack_frame_bytes = -1;
};
PtxasReport parse_ptxas_report(const std::string& compile_log);
// The report of one entry function of a log with several (a backward source's kernels): the
// part of the log from "Compiling entry function '<entry>'" to the next entry function. All
// fields -1 when the log does not name it.
PtxasReport parse_ptxas_report(const std::string& compile_log, const std::string& entry);

}  // namespace flashjit::cuda
