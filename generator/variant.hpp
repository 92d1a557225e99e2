// Rendering attention variants (AttentionProblem::variant, issue 17) into kernel sources: the
// constants and user expressions that precede templates/attention_variant.h, and the error a
// user expression that does not compile becomes.
#pragma once

#include <string>
#include <string_view>

#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

// The marker that ends the source line of each user expression ("// flashjit:score_mod"), so that
// a compiler's message about that line names the expression (explain_variant_compile_error) and
// `flashjit show` can point at it.
inline constexpr const char* kVariantExpressionMarker = "// flashjit:";

// The template only variant kernels include (the prelude below renders it in).
inline constexpr std::string_view kVariantHeader = "attention_variant.h";

// What the renderer inserts after attention_params.h for `problem`: "" for plain attention (so
// that its sources are exactly those of before variants); else the FLASHJIT_VARIANT_* defines,
// templates/attention_variant.h and the user's expressions as the bodies of
// flashjit_variant::user_score_mod / user_mask_mod, each on one line ending in the marker above.
// Error if the header is not embedded in this build.
// block_mask: the kernel reads a mask_mod's block map (FLASHJIT_VARIANT_BLOCK_MASK 1;
// generator/block_mask.hpp).
Result<std::string> render_variant_prelude(const AttentionProblem& problem,
                                           bool block_mask = false);

// Where the user's expressions landed in a rendered source: "score_mod: line 612:   return
// static_cast<float>(...);  // flashjit:score_mod", one line per expression (none: "").
// `flashjit show` prints it.
std::string describe_expression_lines(const std::string& source);

// A compile error of a source rendered for `problem`, restated for the user when the problem has
// user expressions: CompileFailed, quoting the expression whose line the compiler's first error
// is on (else every expression, as the failure may come from one's type) and that first message;
// `error` unchanged otherwise. `source` is the rendered text, `error` the compiler's.
Error explain_variant_compile_error(const AttentionProblem& problem, const std::string& source,
                                    const Error& error);

}  // namespace flashjit
