// Clang/LLVM 14 in-process: a C++ source string -> optimized LLVM module (-O3, the host CPU and
// all its features, as -march=native) -> object file bytes; ORC LLJIT loads an object and finds
// its symbols. The host's own functions (aligned_alloc, free, log2f) resolve from the process.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "generator/error.hpp"
#include "runtime/cpu/cpu_info.hpp"

namespace llvm::orc {
class LLJIT;
}

namespace flashjit::cpu {

// The target the JIT compiles for: the host's triple, CPU name and features (as LLVM sees them);
// under a valid FLASHJIT_CPU_ISA cap the cap's level instead (isa_target), when the host runs it.
struct HostTarget {
  std::string triple;    // "x86_64-pc-linux-gnu"
  std::string cpu;       // "znver3", "skylake-avx512", ...
  std::string features;  // "+avx2,+avx512f,...,-amx-tile"
};
const HostTarget& host_target();

// The target of an ISA level (cpu_info.hpp CpuIsa) on this host's triple.
HostTarget isa_target(CpuIsa isa);
// Whether the host can run code compiled for `isa` (its CPU features include the level's).
bool host_runs(CpuIsa isa);

// "clang 14.0.6"
std::string clang_version();
// Cache and fingerprint identity of the compiler and target: "clang 14.0.6 x86_64-pc-linux-gnu
// znver3 f:0123456789abcdef" (a hash of the feature string).
std::string compiler_identity();

enum class EmitKind { Object, Assembly, LlvmIr };

struct ClangOutput {
  std::vector<char> bytes;  // object file, or assembly / IR text
  std::string log;          // clang's warnings (empty when clean)
  double seconds = 0;
};

// Compiles `source` (C++17) named `file_name` in diagnostics, for the host (target null) or for
// `target`. Error CompileFailed with clang's diagnostics (file:line:col: error: ...) when it does
// not compile. Thread-safe.
Result<ClangOutput> compile_cpp(const std::string& source, const std::string& file_name,
                                EmitKind kind = EmitKind::Object,
                                const HostTarget* target = nullptr);

// One loaded object file: its own LLJIT instance, alive as long as this is.
class JitModule {
 public:
  // Error CompileFailed when ORC cannot load the object (corrupt bytes, unresolved symbols).
  static Result<std::unique_ptr<JitModule>> load(const std::vector<char>& object,
                                                 const std::string& name);
  ~JitModule();
  JitModule(const JitModule&) = delete;
  JitModule& operator=(const JitModule&) = delete;

  // The address of an extern "C" symbol; error NotFound.
  Result<void*> lookup(const std::string& symbol) const;

 private:
  explicit JitModule(std::unique_ptr<llvm::orc::LLJIT> jit);
  std::unique_ptr<llvm::orc::LLJIT> jit_;
};

}  // namespace flashjit::cpu
