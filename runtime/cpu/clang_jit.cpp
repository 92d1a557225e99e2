#include "runtime/cpu/clang_jit.hpp"

#include <clang/Basic/Diagnostic.h>
#include <clang/Basic/DiagnosticOptions.h>
#include <clang/CodeGen/CodeGenAction.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/CompilerInvocation.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <clang/Lex/PreprocessorOptions.h>
#include <llvm/ADT/StringMap.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/Host.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <utility>

namespace flashjit::cpu {
namespace {

void initialize_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
  });
}

std::string error_text(llvm::Error error) { return llvm::toString(std::move(error)); }

// The host as LLVM sees it, whatever the cap.
const HostTarget& native_target() {
  static const HostTarget target = [] {
    initialize_llvm();
    HostTarget t;
    t.triple = llvm::sys::getProcessTriple();
    t.cpu = llvm::sys::getHostCPUName().str();
    // A CPU newer than LLVM 14 (Zen 5, ...) is "generic", which clang rejects as a target CPU:
    // plan for the baseline x86-64 model; the feature list below still enables AVX-512 etc.
    if (t.cpu == "generic" && llvm::StringRef(t.triple).startswith("x86_64")) t.cpu = "x86-64";
    llvm::StringMap<bool> features;
    if (llvm::sys::getHostCPUFeatures(features)) {
      std::vector<std::string> names;
      for (const auto& feature : features) {
        std::string name = feature.getValue() ? "+" : "-";  // appended: gcc 12 -Wrestrict
        name += feature.getKey().str();
        names.push_back(std::move(name));
      }
      std::sort(names.begin(), names.end());
      for (const std::string& name : names) {
        if (!t.features.empty()) t.features += ",";
        t.features += name;
      }
    }
    return t;
  }();
  return target;
}

}  // namespace

HostTarget isa_target(CpuIsa isa) {
  HostTarget t;
  t.triple = native_target().triple;
  t.cpu = isa == CpuIsa::Sse ? "x86-64" : isa == CpuIsa::Avx2 ? "x86-64-v3" : "x86-64-v4";
  if (isa == CpuIsa::Avx512Bf16) t.features = "+avx512bf16";
  return t;
}

bool host_runs(CpuIsa isa) {
  const HostTarget& host = native_target();
  if (!llvm::StringRef(host.triple).startswith("x86_64")) return false;
  auto has = [&](std::initializer_list<const char*> names) {
    for (const char* name : names)
      if (("," + host.features + ",").find(std::string(",+") + name + ",") == std::string::npos)
        return false;
    return true;
  };
  const bool avx2 = has({"avx2", "fma", "f16c", "bmi2", "movbe"});
  const bool avx512 = avx2 && has({"avx512f", "avx512bw", "avx512dq", "avx512vl"});
  switch (isa) {
    case CpuIsa::Sse:
      return true;
    case CpuIsa::Avx2:
      return avx2;
    case CpuIsa::Avx512:
      return avx512;
    case CpuIsa::Avx512Bf16:
      return avx512 && has({"avx512bf16"});
  }
  return false;
}

const HostTarget& host_target() {
  static const HostTarget target = [] {
    const Result<std::optional<CpuIsa>> cap = isa_cap();
    if (cap.ok() && cap->has_value() && host_runs(**cap)) return isa_target(**cap);
    return native_target();
  }();
  return target;
}

std::string clang_version() { return std::string("clang ") + LLVM_VERSION_STRING; }

std::string compiler_identity() {
  const HostTarget& target = host_target();
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : target.features) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  std::string out = clang_version();
  out += " ";
  out += target.triple;
  out += " ";
  out += target.cpu;
  out += " f:";
  out += hex;
  return out;
}

Result<ClangOutput> compile_cpp(const std::string& source, const std::string& file_name,
                                EmitKind kind, const HostTarget* target_override) {
  const auto start = std::chrono::steady_clock::now();
  initialize_llvm();
  const HostTarget& target = target_override != nullptr ? *target_override : host_target();

  std::string diagnostics;
  llvm::raw_string_ostream diagnostics_stream(diagnostics);
  llvm::IntrusiveRefCntPtr<clang::DiagnosticOptions> diagnostic_options =
      new clang::DiagnosticOptions();
  clang::CompilerInstance compiler;
  compiler.setVerboseOutputStream(llvm::nulls());  // no "1 error generated." on stderr
  compiler.createDiagnostics(
      new clang::TextDiagnosticPrinter(diagnostics_stream, diagnostic_options.get()),
      /*ShouldOwnClient=*/true);

  // cc1 arguments: what the driver passes for `clang++ -O3 -march=native -fPIC -std=c++17`.
  std::vector<std::string> args = {"-triple",
                                   target.triple,
                                   "-target-cpu",
                                   target.cpu,
                                   "-O3",
                                   "-std=c++17",
                                   "-vectorize-loops",
                                   "-vectorize-slp",
                                   "-ffp-contract=on",
                                   "-mrelocation-model",
                                   "pic",
                                   "-pic-level",
                                   "2",
                                   "-fno-rtti",
                                   "-Wall",
                                   file_name};
  for (size_t begin = 0; begin < target.features.size();) {  // none: the CPU's own
    size_t end = target.features.find(',', begin);
    if (end == std::string::npos) end = target.features.size();
    args.insert(args.end() - 1, {"-target-feature", target.features.substr(begin, end - begin)});
    begin = end + 1;
  }
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  if (!clang::CompilerInvocation::CreateFromArgs(compiler.getInvocation(), argv,
                                                 compiler.getDiagnostics())) {
    diagnostics_stream.flush();
    return make_error(ErrorCode::CompileFailed, "clang rejected its arguments: " + diagnostics);
  }
  compiler.getPreprocessorOpts().addRemappedFile(
      file_name, llvm::MemoryBuffer::getMemBufferCopy(source, file_name).release());

  llvm::LLVMContext context;
  clang::EmitLLVMOnlyAction action(&context);
  const bool parsed = compiler.ExecuteAction(action);
  diagnostics_stream.flush();
  std::unique_ptr<llvm::Module> module = parsed ? action.takeModule() : nullptr;
  if (!module) {
    return make_error(ErrorCode::CompileFailed, file_name + " failed to compile with " +
                                                    clang_version() + ":\n" + diagnostics);
  }

  ClangOutput output;
  output.log = diagnostics;
  if (kind == EmitKind::LlvmIr) {
    std::string ir;
    llvm::raw_string_ostream ir_stream(ir);
    module->print(ir_stream, nullptr);
    ir_stream.flush();
    output.bytes.assign(ir.begin(), ir.end());
  } else {
    std::string error;
    const llvm::Target* llvm_target = llvm::TargetRegistry::lookupTarget(target.triple, error);
    if (llvm_target == nullptr) {
      return make_error(ErrorCode::CompileFailed,
                        "no LLVM target for " + target.triple + ": " + error);
    }
    std::unique_ptr<llvm::TargetMachine> machine(llvm_target->createTargetMachine(
        target.triple, target.cpu, target.features, llvm::TargetOptions(), llvm::Reloc::PIC_,
        llvm::None, llvm::CodeGenOpt::Aggressive));
    if (!machine) {
      return make_error(ErrorCode::CompileFailed, "LLVM could not create a target machine for " +
                                                      target.triple + " " + target.cpu);
    }
    module->setDataLayout(machine->createDataLayout());
    llvm::SmallVector<char, 0> buffer;
    llvm::raw_svector_ostream stream(buffer);
    llvm::legacy::PassManager passes;
    const auto file_type =
        kind == EmitKind::Object ? llvm::CGFT_ObjectFile : llvm::CGFT_AssemblyFile;
    if (machine->addPassesToEmitFile(passes, stream, nullptr, file_type)) {
      return make_error(ErrorCode::CompileFailed, "LLVM cannot emit code for " + target.triple);
    }
    passes.run(*module);
    output.bytes.assign(buffer.begin(), buffer.end());
  }
  output.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return output;
}

JitModule::JitModule(std::unique_ptr<llvm::orc::LLJIT> jit) : jit_(std::move(jit)) {}
JitModule::~JitModule() = default;

Result<std::unique_ptr<JitModule>> JitModule::load(const std::vector<char>& object,
                                                   const std::string& name) {
  initialize_llvm();
  llvm::Expected<std::unique_ptr<llvm::orc::LLJIT>> jit = llvm::orc::LLJITBuilder().create();
  if (!jit) {
    return make_error(ErrorCode::CompileFailed,
                      "ORC LLJIT could not be created: " + error_text(jit.takeError()));
  }
  auto generator = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
      (*jit)->getDataLayout().getGlobalPrefix());
  if (!generator) {
    return make_error(ErrorCode::CompileFailed, "ORC cannot search the process's symbols: " +
                                                    error_text(generator.takeError()));
  }
  (*jit)->getMainJITDylib().addGenerator(std::move(*generator));
  std::unique_ptr<llvm::MemoryBuffer> buffer =
      llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()), name);
  if (llvm::Error error = (*jit)->addObjectFile(std::move(buffer))) {
    return make_error(ErrorCode::CompileFailed, "ORC could not load the object of " + name + ": " +
                                                    error_text(std::move(error)));
  }
  return std::unique_ptr<JitModule>(new JitModule(std::move(*jit)));
}

Result<void*> JitModule::lookup(const std::string& symbol) const {
  llvm::Expected<llvm::JITEvaluatedSymbol> found = jit_->lookup(symbol);
  if (!found) {
    return make_error(ErrorCode::NotFound,
                      "symbol " + symbol + " not found: " + error_text(found.takeError()));
  }
  return reinterpret_cast<void*>(static_cast<uintptr_t>(found->getAddress()));
}

}  // namespace flashjit::cpu
