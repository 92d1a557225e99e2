#include "tuner/variant_functions.hpp"

#include <cctype>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>

#include "generator/variant.hpp"
#include "runtime/host_compiler.hpp"
#include "templates/embedded.hpp"

#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/clang_jit.hpp"
#endif

namespace flashjit {

std::string double_expression(const std::string& expression) {
  auto identifier = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  std::string out;
  size_t i = 0;
  while (i < expression.size()) {
    const char c = expression[i];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {  // a name (digits in it too)
      const size_t start = i;
      while (i < expression.size() && identifier(expression[i])) ++i;
      out += expression.substr(start, i - start);
      continue;
    }
    if (!digit(c) && !(c == '.' && i + 1 < expression.size() && digit(expression[i + 1]))) {
      out += c;
      ++i;
      continue;
    }
    // A number (a preprocessing number: digits, letters, '.', and a sign after an exponent).
    const size_t start = i;
    const bool hex = c == '0' && i + 1 < expression.size() &&
                     (expression[i + 1] == 'x' || expression[i + 1] == 'X');
    while (i < expression.size()) {
      const char n = expression[i];
      const char before = i > start ? expression[i - 1] : '\0';
      const bool exponent_sign = (n == '+' || n == '-') && (hex ? (before == 'p' || before == 'P')
                                                                : (before == 'e' || before == 'E'));
      if (!identifier(n) && n != '.' && !exponent_sign) break;
      ++i;
    }
    std::string number = expression.substr(start, i - start);
    const bool floating = number.find_first_of(".eE") != std::string::npos;
    if (!hex && floating && (number.back() == 'f' || number.back() == 'F')) number.pop_back();
    out += number;
  }
  return out;
}

namespace {

#if FLASHJIT_HAVE_CPU_BACKEND
constexpr bool kHaveClangJit = true;
#else
constexpr bool kHaveClangJit = false;
#endif

constexpr const char* kScoreSymbol = "flashjit_reference_score_mod";
constexpr const char* kMaskSymbol = "flashjit_reference_mask_mod";
constexpr const char* kGradSymbol = "flashjit_reference_score_mod_grad";

// One line, in double (see the header); validate() allows no comments or strings, so newlines
// can become spaces.
std::string reference_line(const std::string& expression) {
  std::string text = double_expression(expression);
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

// attention_params.h and attention_variant.h (for the functions an expression may call, in
// namespace flashjit_variant) with no variant of their own, then one extern "C" function per
// expression, each on a line ending in generator/variant.hpp's marker so that a compile error
// names the expression (explain_variant_compile_error). The same source for both ways.
Result<std::string> render_reference_source(const Variant& v) {
  const std::string_view params = templates::text("attention_params.h");
  const std::string_view header = templates::text(kVariantHeader);
  if (params.empty() || header.empty())
    return make_error(ErrorCode::Unsupported,
                      "attention_params.h or attention_variant.h is not embedded in this build");
  std::ostringstream out;
  out << params << "\n"
      << "#define FLASHJIT_VARIANT 1\n#define FLASHJIT_VARIANT_CAUSAL 0\n"
      << "#define FLASHJIT_VARIANT_WINDOW_LEFT (-1)\n#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)\n"
      << "#define FLASHJIT_VARIANT_PREFIX 0\n#define FLASHJIT_VARIANT_ALIBI 0\n"
      << "#define FLASHJIT_VARIANT_SCORE_MOD 0\n#define FLASHJIT_VARIANT_MASK_MOD 0\n"
      << "#define FLASHJIT_VARIANT_SCORE_MOD_GRAD 0\n#define FLASHJIT_VARIANT_VARLEN 0\n"
      << header << "\nnamespace flashjit_variant {\n";
  const char* score_args =
      "(double score, long long batch, long long head, long long q_idx, long long kv_idx) {\n";
  if (!v.score_mod.empty())
    out << "extern \"C\" double " << kScoreSymbol << score_args << "  return static_cast<double>("
        << reference_line(v.score_mod) << ");  " << kVariantExpressionMarker << "score_mod\n}\n";
  if (!v.mask_mod.empty())
    out << "extern \"C\" bool " << kMaskSymbol
        << "(long long batch, long long head, long long q_idx, long long kv_idx) {\n"
        << "  return static_cast<bool>(" << reference_line(v.mask_mod) << ");  "
        << kVariantExpressionMarker << "mask_mod\n}\n";
  if (!v.score_mod_grad.empty())
    out << "extern \"C\" double " << kGradSymbol << score_args << "  return static_cast<double>("
        << reference_line(v.score_mod_grad) << ");  " << kVariantExpressionMarker
        << "score_mod_grad\n}\n";
  out << "}  // namespace flashjit_variant\n";
  return out.str();
}

bool uses_host_compiler(const ExpressionCompiler& how) {
  return how.host_compiler || !kHaveClangJit;
}

// A loaded module of the expressions (the JIT's or the host compiler's): its owner, kept alive
// by every function made from it, and its symbols.
struct Module {
  std::shared_ptr<const void> owner;
  std::function<Result<void*>(const std::string&)> lookup;
};

template <class Owner>
Module module_of(std::unique_ptr<Owner> loaded) {
  std::shared_ptr<const Owner> owner(std::move(loaded));
  const Owner* raw = owner.get();
  return Module{owner, [raw](const std::string& symbol) { return raw->lookup(symbol); }};
}

Result<Module> load(const std::string& source, const ExpressionCompiler& how) {
#if FLASHJIT_HAVE_CPU_BACKEND
  if (!uses_host_compiler(how)) {
    Result<cpu::ClangOutput> object =
        cpu::compile_cpp(source, "flashjit_reference_expressions.cpp");
    if (!object.ok()) return object.error();
    Result<std::unique_ptr<cpu::JitModule>> module =
        cpu::JitModule::load(object->bytes, "flashjit_reference_expressions");
    if (!module.ok()) return module.error();
    return module_of(std::move(module.value()));
  }
#endif
  Result<std::unique_ptr<HostLibrary>> library = HostLibrary::build(source, how.host);
  if (!library.ok()) return library.error();
  return module_of(std::move(library.value()));
}

// A compile error quoted as the kernels' are (a backward problem: score_mod_grad included); no
// compiler: Unsupported naming the expressions and what else to do.
Error explained(const Variant& v, const std::string& source, const Error& error) {
  if (error.code == ErrorCode::Unsupported)
    return make_error(ErrorCode::Unsupported, "evaluating the user expressions (score_mod = \"" +
                                                  v.score_mod + "\", mask_mod = \"" + v.mask_mod +
                                                  "\") in the fp64 reference: " + error.message +
                                                  "; or give host functions "
                                                  "(TuneOptions::variant_functions)");
  AttentionProblem problem =
      AttentionProblem::make(1, 1, 1, 1, 1, 8, DType::F32, false).with_pass(Pass::Backward);
  problem.variant = v;
  Error out = explain_variant_compile_error(problem, source, error);
  out.message = "the fp64 reference of the expressions: " + out.message;
  return out;
}

// The compiled modules by the way they were made and their source text, for the process.
std::mutex cache_mutex;
std::map<std::string, Module>& module_cache() {
  static auto* cache = new std::map<std::string, Module>();
  return *cache;
}

Result<Module> compiled_module(const Variant& v, const ExpressionCompiler& how) {
  Result<std::string> source = render_reference_source(v);
  if (!source.ok()) return source.error();
  std::string key = "jit\n";
  if (uses_host_compiler(how)) {
    key = "host\n" + how.host.cache_dir.string() + "\n";
    for (const std::string& compiler : how.host.compilers) key += compiler + "\n";
  }
  key += *source;
  std::lock_guard<std::mutex> lock(cache_mutex);  // one compile of a source at a time
  if (how.process_cache) {
    auto found = module_cache().find(key);
    if (found != module_cache().end()) return found->second;
  }
  Result<Module> module = load(*source, how);
  if (!module.ok()) return explained(v, *source, module.error());
  if (how.process_cache) module_cache().emplace(key, *module);
  return module;
}

}  // namespace

Result<VariantFunctions> variant_functions_of(const Variant& variant) {
  return variant_functions_of(variant, ExpressionCompiler{});
}

Result<VariantFunctions> variant_functions_of(const Variant& variant,
                                              const ExpressionCompiler& how) {
  VariantFunctions functions;
  if (variant.score_mod.empty() && variant.mask_mod.empty() && variant.score_mod_grad.empty())
    return functions;
  Result<Module> module = compiled_module(variant, how);
  if (!module.ok()) return module.error();
  std::shared_ptr<const void> keep = module->owner;
  using Score = double (*)(double, long long, long long, long long, long long);
  using Mask = bool (*)(long long, long long, long long, long long);
  auto score_function = [&](const char* symbol) -> Result<VariantFunctions::ScoreFunction> {
    Result<void*> address = module->lookup(symbol);
    if (!address.ok()) return address.error();
    const Score f = reinterpret_cast<Score>(address.value());
    return VariantFunctions::ScoreFunction(
        [keep, f](double score, int64_t batch, int64_t head, int64_t q_idx, int64_t kv_idx) {
          return f(score, batch, head, q_idx, kv_idx);
        });
  };
  if (!variant.score_mod.empty()) {
    Result<VariantFunctions::ScoreFunction> f = score_function(kScoreSymbol);
    if (!f.ok()) return f.error();
    functions.score_mod = std::move(f.value());
  }
  if (!variant.score_mod_grad.empty()) {
    Result<VariantFunctions::ScoreFunction> f = score_function(kGradSymbol);
    if (!f.ok()) return f.error();
    functions.score_mod_grad = std::move(f.value());
  }
  if (!variant.mask_mod.empty()) {
    Result<void*> address = module->lookup(kMaskSymbol);
    if (!address.ok()) return address.error();
    const Mask f = reinterpret_cast<Mask>(address.value());
    functions.mask_mod = [keep, f](int64_t batch, int64_t head, int64_t q_idx, int64_t kv_idx) {
      return f(batch, head, q_idx, kv_idx);
    };
  }
  return functions;
}

size_t compiled_expression_modules() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return module_cache().size();
}

Result<VariantFunctions> complete_variant_functions(const AttentionProblem& problem,
                                                    VariantFunctions given) {
  const Variant& v = problem.variant;
  const bool grad = problem.is_backward() && !v.score_mod_grad.empty();
  const bool missing = (!v.score_mod.empty() && !given.score_mod) ||
                       (!v.mask_mod.empty() && !given.mask_mod) || (grad && !given.score_mod_grad);
  if (!missing) return given;
  // Every expression the reference uses in one module (one compile, one cache entry).
  Variant expressions;
  expressions.score_mod = v.score_mod;
  expressions.mask_mod = v.mask_mod;
  if (grad) expressions.score_mod_grad = v.score_mod_grad;
  Result<VariantFunctions> compiled = variant_functions_of(expressions);
  if (!compiled.ok()) return compiled.error();
  if (!given.score_mod) given.score_mod = std::move(compiled->score_mod);
  if (!given.mask_mod) given.mask_mod = std::move(compiled->mask_mod);
  if (!given.score_mod_grad) given.score_mod_grad = std::move(compiled->score_mod_grad);
  return given;
}

}  // namespace flashjit
