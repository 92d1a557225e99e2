#include "generator/variant.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "templates/embedded.hpp"

namespace flashjit {
namespace {

// The expression on one line: newlines become spaces (validate() allows no comments, strings or
// preprocessor lines, so nothing depends on them).
std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

// The 1-based source line of the first error in a compiler log: NVRTC's "name(123): error: ..."
// or Clang's "name:123:45: error: ..."; 0 if none is found. `message` gets that line of the log.
int first_error_line(const std::string& log, std::string& message) {
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t at = line.find("error");
    if (at == std::string::npos) continue;
    message = line;
    // The number just before "): error" or the first ":N:" of the line.
    if (size_t paren = line.rfind("): ", at); paren != std::string::npos) {
      const size_t open = line.rfind('(', paren);
      if (open != std::string::npos) return std::atoi(line.c_str() + open + 1);
    }
    if (size_t colon = line.find(':'); colon != std::string::npos && colon < at)
      return std::atoi(line.c_str() + colon + 1);
    return 0;
  }
  return 0;
}

}  // namespace

Result<std::string> render_variant_prelude(const AttentionProblem& problem, bool block_mask) {
  const Variant& v = problem.variant;
  if (!v.active()) return std::string();
  const std::string_view header = templates::text(kVariantHeader);
  if (header.empty())
    return make_error(ErrorCode::Unsupported,
                      std::string(kVariantHeader) + " is not embedded in this build");
  std::ostringstream out;
  out << "// ---- attention variant: " << v.key() << " ----\n"
      << "#define FLASHJIT_VARIANT 1\n"
      << "#define FLASHJIT_VARIANT_CAUSAL " << (problem.causal ? 1 : 0) << "\n"
      << "#define FLASHJIT_VARIANT_WINDOW_LEFT (" << v.window_left << ")\n"
      << "#define FLASHJIT_VARIANT_WINDOW_RIGHT (" << v.window_right << ")\n"
      << "#define FLASHJIT_VARIANT_PREFIX " << v.prefix << "\n";
  if (v.softcap) {
    char literal[48];
    std::snprintf(literal, sizeof literal, "%.9ef", static_cast<double>(*v.softcap));
    out << "#define FLASHJIT_VARIANT_SOFTCAP " << literal << "\n";
  }
  out << "#define FLASHJIT_VARIANT_ALIBI " << (v.alibi ? 1 : 0) << "\n"
      << "#define FLASHJIT_VARIANT_SCORE_MOD " << (v.score_mod.empty() ? 0 : 1) << "\n"
      << "#define FLASHJIT_VARIANT_MASK_MOD " << (v.mask_mod.empty() ? 0 : 1) << "\n";
  // The score_mod's derivative: backward kernels only (the forward has no use for it).
  const bool score_mod_grad = problem.is_backward() && !v.score_mod_grad.empty();
  if (score_mod_grad) out << "#define FLASHJIT_VARIANT_SCORE_MOD_GRAD 1\n";
  out << "#define FLASHJIT_VARIANT_VARLEN " << (v.varlen ? 1 : 0) << "\n";
  if (block_mask) out << "#define FLASHJIT_VARIANT_BLOCK_MASK 1\n";
  out << header << "\n";
  if (!v.score_mod.empty() || !v.mask_mod.empty()) {
    out << "// ---- the user's expressions ----\nnamespace flashjit_variant {\n";
    if (!v.score_mod.empty())
      out << "FLASHJIT_DEVICE float user_score_mod(float score, int batch, int head, int q_idx, "
             "int kv_idx) {\n"
          << "  return static_cast<float>(" << one_line(v.score_mod) << ");  "
          << kVariantExpressionMarker << "score_mod\n}\n";
    if (!v.mask_mod.empty())
      out << "FLASHJIT_DEVICE bool user_mask_mod(int batch, int head, int q_idx, int kv_idx) {\n"
          << "  return static_cast<bool>(" << one_line(v.mask_mod) << ");  "
          << kVariantExpressionMarker << "mask_mod\n}\n";
    if (score_mod_grad)
      out << "FLASHJIT_DEVICE float user_score_mod_grad(float score, int batch, int head, "
             "int q_idx, int kv_idx) {\n"
          << "  return static_cast<float>(" << one_line(v.score_mod_grad) << ");  "
          << kVariantExpressionMarker << "score_mod_grad\n}\n";
    out << "}  // namespace flashjit_variant\n";
  }
  out << "// ---- end of the attention variant ----\n";
  return out.str();
}

std::string describe_expression_lines(const std::string& source) {
  std::string out;
  std::istringstream lines(source);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    const size_t marker = line.find(kVariantExpressionMarker);
    if (marker == std::string::npos) continue;
    const std::string what = line.substr(marker + std::string(kVariantExpressionMarker).size());
    out += what + ": line " + std::to_string(number) + ": " + line + "\n";
  }
  return out;
}

Error explain_variant_compile_error(const AttentionProblem& problem, const std::string& source,
                                    const Error& error) {
  const Variant& v = problem.variant;
  if (error.code != ErrorCode::CompileFailed || (v.score_mod.empty() && v.mask_mod.empty()))
    return error;
  const bool grad = problem.is_backward() && !v.score_mod_grad.empty();
  std::string message;
  const int line = first_error_line(error.message, message);
  std::string source_line;
  if (line > 0) {
    std::istringstream lines(source);
    for (int i = 0; i < line && std::getline(lines, source_line); ++i) {
    }
  }
  auto on_line = [&](const char* what) {  // the line ends in the marker naming `what`
    const std::string marker = std::string(kVariantExpressionMarker) + what;
    return source_line.size() >= marker.size() &&
           source_line.compare(source_line.size() - marker.size(), marker.size(), marker) == 0;
  };
  std::vector<std::pair<const char*, const std::string*>> quoted;
  if (!v.score_mod.empty() && on_line("score_mod")) quoted.push_back({"score_mod", &v.score_mod});
  if (!v.mask_mod.empty() && on_line("mask_mod")) quoted.push_back({"mask_mod", &v.mask_mod});
  if (grad && on_line("score_mod_grad")) quoted.push_back({"score_mod_grad", &v.score_mod_grad});
  if (quoted.empty()) {  // not on an expression's line: name them all
    if (!v.score_mod.empty()) quoted.push_back({"score_mod", &v.score_mod});
    if (!v.mask_mod.empty()) quoted.push_back({"mask_mod", &v.mask_mod});
    if (grad) quoted.push_back({"score_mod_grad", &v.score_mod_grad});
  }
  std::string text;
  for (const auto& [what, expression] : quoted)
    text += (text.empty() ? "" : ", ") + std::string(what) + " = \"" + *expression + "\"";
  text += quoted.size() == 1 && on_line(quoted.front().first) ? " does not compile: "
                                                              : ": the kernel does not compile: ";
  text += message.empty() ? std::string("(no error line in the compiler's log)") : message;
  return Error{ErrorCode::CompileFailed, text + "\n(full log)\n" + error.message};
}

}  // namespace flashjit
