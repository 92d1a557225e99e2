// NVRTC: compiles rendered kernel sources to CUBIN without a GPU. NVRTC is linked directly (it is
// part of the toolkit and needs no driver); each compile uses its own nvrtcProgram, so separate
// compiles run concurrently from different threads.
#include "runtime/cuda/nvrtc_compiler.hpp"

#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <string>
#include <vector>

namespace flashjit::cuda {
namespace {

std::string nvrtc_result_name(nvrtcResult result) {
  const char* name = nvrtcGetErrorString(result);
  return name != nullptr ? name : "nvrtcResult " + std::to_string(static_cast<int>(result));
}

Error nvrtc_error(const KernelSource& source, const char* call, nvrtcResult result,
                  const std::string& log = {}) {
  std::string message = "NVRTC " + std::string(call) + " failed for '" + source.label +
                        "': " + nvrtc_result_name(result);
  if (!log.empty()) message += "\n" + log;
  return make_error(ErrorCode::CompileFailed, std::move(message));
}

// Destroys the program on every path out of nvrtc_compile.
class ProgramGuard {
 public:
  explicit ProgramGuard(nvrtcProgram program) : program_(program) {}
  ~ProgramGuard() { nvrtcDestroyProgram(&program_); }
  ProgramGuard(const ProgramGuard&) = delete;
  ProgramGuard& operator=(const ProgramGuard&) = delete;

 private:
  nvrtcProgram program_;
};

// The program log without NVRTC's trailing NUL (and trailing blank lines).
Result<std::string> program_log(nvrtcProgram program, const KernelSource& source) {
  size_t size = 0;
  nvrtcResult result = nvrtcGetProgramLogSize(program, &size);
  if (result != NVRTC_SUCCESS) return nvrtc_error(source, "nvrtcGetProgramLogSize", result);
  std::string log(size, '\0');
  if (size > 0) {
    result = nvrtcGetProgramLog(program, log.data());
    if (result != NVRTC_SUCCESS) return nvrtc_error(source, "nvrtcGetProgramLog", result);
  }
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n' || log.back() == ' ')) {
    log.pop_back();
  }
  return log;
}

}  // namespace

std::string nvrtc_version() {
  int major = 0;
  int minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "nvrtc unknown";
  return "nvrtc " + std::to_string(major) + "." + std::to_string(minor);
}

std::vector<std::string> nvrtc_options(int arch, bool arch_specific) {
  return {
      // A real architecture, so that NVRTC runs ptxas and nvrtcGetCUBIN has a binary; sm_90a
      // for sources that use architecture-specific instructions (wgmma).
      "--gpu-architecture=sm_" + std::to_string(arch) + (arch_specific ? "a" : ""),
      "--std=c++17",
      // ptxas' resource report (registers, stack, spills) goes into the program log.
      "--ptxas-options=-v",
      // NVRTC 13 keeps its own compile cache in the driver's ComputeCache (~/.nv, only where
      // libcuda is present); a hit there skips ptxas and returns an empty log, so the report
      // above would vanish on GPU machines. flashjit's BinaryCache already caches CUBINs.
      "--no-cache",
      "--fmad=true",
  };
  // No --include-path: the templates include no CUDA headers, which keeps compiles fast and
  // independent of where (or whether) the toolkit's headers are installed.
}

Result<Binary> nvrtc_compile(const KernelSource& source, int arch) {
  const auto start = std::chrono::steady_clock::now();

  nvrtcProgram program = nullptr;
  const std::string file_name =
      (source.entries.empty() ? std::string("kernel") : source.entry()) + ".cu";
  nvrtcResult result = nvrtcCreateProgram(&program, source.text.c_str(), file_name.c_str(),
                                          /*numHeaders=*/0, nullptr, nullptr);
  if (result != NVRTC_SUCCESS) return nvrtc_error(source, "nvrtcCreateProgram", result);
  ProgramGuard guard(program);

  const std::vector<std::string> options = nvrtc_options(arch, source.arch_specific);
  std::vector<const char*> option_pointers;
  option_pointers.reserve(options.size());
  for (const std::string& option : options) option_pointers.push_back(option.c_str());

  const nvrtcResult compiled = nvrtcCompileProgram(
      program, static_cast<int>(option_pointers.size()), option_pointers.data());
  // The log is wanted on both paths: errors on failure, ptxas' report on success.
  Result<std::string> log = program_log(program, source);
  if (!log.ok()) return log.error();
  if (compiled != NVRTC_SUCCESS) {
    std::string options_text;
    for (const std::string& option : options) options_text += " " + option;
    return nvrtc_error(source, "nvrtcCompileProgram", compiled,
                       "options:" + options_text + "\n" + log.value());
  }

  size_t cubin_size = 0;
  result = nvrtcGetCUBINSize(program, &cubin_size);
  if (result != NVRTC_SUCCESS) return nvrtc_error(source, "nvrtcGetCUBINSize", result);
  if (cubin_size == 0) {
    // A virtual architecture (compute_XX) yields PTX only.
    return make_error(ErrorCode::CompileFailed, "NVRTC produced no CUBIN for '" + source.label +
                                                    "' (sm_" + std::to_string(arch) +
                                                    "): the architecture must be a real one");
  }
  Binary binary;
  binary.bytes.resize(cubin_size);
  result = nvrtcGetCUBIN(program, binary.bytes.data());
  if (result != NVRTC_SUCCESS) return nvrtc_error(source, "nvrtcGetCUBIN", result);

  binary.compile_log = std::move(log.value());
  binary.compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  binary.from_cache = false;
  return binary;
}

PtxasReport parse_ptxas_report(const std::string& compile_log) {
  // ptxas -v prints, per entry function:
  //   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
  //   ptxas info    : Used 168 registers, used 1 barriers, 400 bytes cmem[0]
  // A log with several functions reports the largest of each (the worst kernel decides).
  static const std::regex kRegisters(R"(Used (\d+) registers)");
  static const std::regex kFrame(
      R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  PtxasReport report;
  // std::stoi cannot throw here: the regex matched 1+ digits, but guard absurd lengths.
  auto to_int = [](const std::string& digits) {
    return digits.size() > 9 ? -1 : std::stoi(digits);
  };
  for (auto it = std::sregex_iterator(compile_log.begin(), compile_log.end(), kRegisters);
       it != std::sregex_iterator(); ++it) {
    report.registers = std::max(report.registers, to_int((*it)[1].str()));
  }
  for (auto it = std::sregex_iterator(compile_log.begin(), compile_log.end(), kFrame);
       it != std::sregex_iterator(); ++it) {
    report.stack_frame_bytes = std::max(report.stack_frame_bytes, to_int((*it)[1].str()));
    report.spill_store_bytes = std::max(report.spill_store_bytes, to_int((*it)[2].str()));
    report.spill_load_bytes = std::max(report.spill_load_bytes, to_int((*it)[3].str()));
  }
  return report;
}

PtxasReport parse_ptxas_report(const std::string& compile_log, const std::string& entry) {
  static const std::string kMarker = "Compiling entry function '";
  const size_t begin = compile_log.find(kMarker + entry + "'");
  if (begin == std::string::npos) return PtxasReport{};
  const size_t end = compile_log.find(kMarker, begin + kMarker.size());
  return parse_ptxas_report(
      compile_log.substr(begin, end == std::string::npos ? end : end - begin));
}

}  // namespace flashjit::cuda
