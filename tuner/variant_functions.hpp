// Host functions of a variant's user expressions (Variant::score_mod, mask_mod, score_mod_grad)
// for the fp64 reference, compiled from the expressions' text: what lets the tuner, `flashjit
// tune --score-mod` and Python's flashjit.tune verify a variant without a host function stated
// by the caller. Two ways compile the same rendered source: the CPU backend's Clang JIT
// (runtime/cpu/clang_jit.hpp), first where the build has it, and the host's C++ compiler as a
// process into a shared object cached in flashjit's cache folder (runtime/host_compiler.hpp),
// which a build without the CPU backend (no LLVM: the GPU machines) uses.
//
// The expressions are evaluated in double: score is a double, batch, head, q_idx and kv_idx are
// int64, float literals (0.1f) lose their suffix, and the functions a kernel's expression may call
// (abs, min, max, tanh, exp, exp2, log, log2, sqrt, floor) are templates/attention_variant.h's
// own, which have double overloads. So the reference computes the expression's exact value where
// a kernel rounds it to float.
#pragma once

#include <cstddef>
#include <string>

#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/host_compiler.hpp"
#include "tuner/reference.hpp"

namespace flashjit {

// The variant's non-empty score_mod, mask_mod and score_mod_grad as host functions (the others
// left empty). The compiled module lives as long as any returned function does; modules are
// cached by the expressions' text for the process (the tuner verifies many configs).
// Errors: CompileFailed quoting the expression that does not compile and the compiler's first
// message; Unsupported when the build has no CPU backend and no host C++ compiler runs (naming
// those tried: see runtime/host_compiler.hpp, FLASHJIT_HOST_CXX).
Result<VariantFunctions> variant_functions_of(const Variant& variant);

// How variant_functions_of compiles; the default is the Clang JIT where the build has the CPU
// backend, else the host's C++ compiler. Tests force the host compiler in builds with the JIT.
struct ExpressionCompiler {
  bool host_compiler = false;  // the host's C++ compiler even where the JIT is there
  HostCompileOptions host;     // its compilers and cache folder
  bool process_cache = true;   // false: neither read nor fill the process's cache (a new process)
};
Result<VariantFunctions> variant_functions_of(const Variant& variant,
                                              const ExpressionCompiler& how);

// How many expression modules this process has compiled and keeps (the cache above).
size_t compiled_expression_modules();

// `given` with the functions `problem`'s reference needs but `given` lacks (score_mod,
// mask_mod; score_mod_grad for a backward problem) compiled from the expressions. `given`'s own
// functions win; nothing is compiled when nothing is missing.
Result<VariantFunctions> complete_variant_functions(const AttentionProblem& problem,
                                                    VariantFunctions given);

// The C++ text an expression is evaluated as in double: its float literals' f/F suffixes removed
// ("0.1f * abs(x)" -> "0.1 * abs(x)"; hexadecimal integers such as 0x1f kept).
std::string double_expression(const std::string& expression);

}  // namespace flashjit
