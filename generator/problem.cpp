#include "generator/problem.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "generator/enum_names.hpp"

namespace flashjit {

const char* to_string(ErrorCode code) {
  return enum_name(code,
                   {"InvalidArgument", "Unsupported", "NoDevice", "CompileFailed", "DriverError",
                    "LaunchFailed", "IoError", "NotFound"},
                   "Unknown");
}

const char* to_string(DType dtype) { return enum_name(dtype, {"f16", "bf16", "f32"}, "unknown"); }

Result<DType> parse_dtype(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "f16" || lower == "fp16" || lower == "float16" || lower == "half") return DType::F16;
  if (lower == "bf16" || lower == "bfloat16") return DType::BF16;
  if (lower == "f32" || lower == "fp32" || lower == "float32" || lower == "float")
    return DType::F32;
  return make_error(ErrorCode::InvalidArgument,
                    "dtype = '" + text +
                        "': must be one of f16 (fp16, float16), bf16 (bfloat16), f32 (fp32, "
                        "float32; CPU backend only)");
}

const char* to_string(Layout layout) { return layout == Layout::BSHD ? "bshd" : "bhsd"; }

const char* to_string(Pass pass) { return pass == Pass::Forward ? "fwd" : "bwd"; }

Result<Pass> parse_pass(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "fwd" || lower == "forward") return Pass::Forward;
  if (lower == "bwd" || lower == "backward") return Pass::Backward;
  return make_error(ErrorCode::InvalidArgument,
                    "pass = '" + text + "': must be fwd (forward) or bwd (backward)");
}

Strides contiguous_strides(Layout layout, int64_t seqlen, int64_t heads, int64_t head_dim) {
  // Extents from a caller (flags, arrays) may be huge: saturate rather than overflow (fuzz
  // problem_config, issue 33: heads 1226130831 x seqlen_k 100000012 x d 128).
  auto times = [](int64_t a, int64_t b) {
    int64_t product = 0;
    if (__builtin_mul_overflow(a, b, &product)) return std::numeric_limits<int64_t>::max() & ~7;
    return product;
  };
  if (layout == Layout::BSHD)
    return {times(times(seqlen, heads), head_dim), times(heads, head_dim), head_dim};
  return {times(times(heads, seqlen), head_dim), head_dim, times(seqlen, head_dim)};
}

AttentionProblem AttentionProblem::make(int64_t batch, int64_t heads_q, int64_t heads_kv,
                                        int64_t seqlen_q, int64_t seqlen_k, int head_dim,
                                        DType dtype, bool causal, Layout layout) {
  AttentionProblem p;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.head_dim = head_dim;
  p.dtype = dtype;
  p.causal = causal;
  p.q_strides = contiguous_strides(layout, seqlen_q, heads_q, head_dim);
  p.o_strides = p.q_strides;
  p.k_strides = contiguous_strides(layout, seqlen_k, heads_kv, head_dim);
  p.v_strides = p.k_strides;
  p.do_strides = p.dq_strides = p.q_strides;
  p.dk_strides = p.dv_strides = p.k_strides;
  return p;
}

AttentionProblem AttentionProblem::make_varlen(int64_t num_docs, int64_t heads_q, int64_t heads_kv,
                                               int64_t max_seqlen_q, int64_t max_seqlen_k,
                                               int64_t total_q, int64_t total_k, int head_dim,
                                               DType dtype, bool causal) {
  AttentionProblem p = make(num_docs, heads_q, heads_kv, max_seqlen_q, max_seqlen_k, head_dim,
                            dtype, causal, Layout::BSHD);
  for (Strides* s : {&p.q_strides, &p.o_strides, &p.k_strides, &p.v_strides, &p.do_strides,
                     &p.dq_strides, &p.dk_strides, &p.dv_strides})
    s->batch = 0;  // one packed sequence: each document is a range of rows
  p.variant.varlen = true;
  p.variant.total_q = total_q;
  p.variant.total_k = total_k;
  return p;
}

AttentionProblem AttentionProblem::with_paged_kv(int page_size, int64_t num_pages) const {
  AttentionProblem copy = *this;
  copy.kv.page_size = page_size;
  copy.kv.num_pages = num_pages;
  copy.kv.max_pages = page_size > 0 ? (seqlen_k + page_size - 1) / page_size : 0;
  copy.kv.seqlens_k = true;
  if (page_size > 0) {
    copy.k_strides = {int64_t{page_size} * heads_kv * head_dim, heads_kv * int64_t{head_dim},
                      head_dim};
    copy.v_strides = copy.k_strides;
  }
  return copy;
}

float AttentionProblem::scale() const {
  return softmax_scale ? *softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

double AttentionProblem::flops() const {
  double f = 4.0 * batch * heads_q * static_cast<double>(seqlen_q) * seqlen_k * head_dim;
  if (causal) f /= 2;
  return pass == Pass::Backward ? 2.5 * f : f;
}

namespace {

int64_t span(const Strides& s, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  return (batch - 1) * s.batch + (seqlen - 1) * s.seq + (heads - 1) * s.head + head_dim;
}

// span() of extents >= 1 and strides >= 0 not yet validated (from a caller's arrays: any int64),
// or nullopt when it does not fit an int64_t.
std::optional<int64_t> checked_span(const Strides& s, int64_t batch, int64_t seqlen, int64_t heads,
                                    int64_t head_dim) {
  int64_t total = head_dim;
  for (auto [extent, stride] : {std::pair{batch, s.batch}, {seqlen, s.seq}, {heads, s.head}}) {
    int64_t term = 0;
    if (__builtin_mul_overflow(extent - 1, stride, &term) ||
        __builtin_add_overflow(total, term, &total)) {
      return std::nullopt;
    }
  }
  return total;
}

std::string str(int64_t v) { return std::to_string(v); }

// The tensor's elements must not alias: sort the axes by stride and require each stride to
// step over everything the smaller axes span. (Sufficient, and what dense or padded layouts meet.)
Status check_no_overlap(const char* name, const Strides& s, int64_t batch, int64_t seqlen,
                        int64_t heads, int64_t head_dim) {
  struct Axis {
    int64_t stride, extent;
    const char* what;
  };
  std::array<Axis, 4> axes{{{1, head_dim, "head_dim"},
                            {s.seq, seqlen, "seq"},
                            {s.head, heads, "head"},
                            {s.batch, batch, "batch"}}};
  std::sort(axes.begin(), axes.end(),
            [](const Axis& a, const Axis& b) { return a.stride < b.stride; });
  int64_t covered = 0;  // elements spanned by the axes so far, minus one
  for (const Axis& axis : axes) {
    if (axis.extent == 1) continue;
    if (axis.stride <= covered) {
      return make_error(ErrorCode::InvalidArgument,
                        std::string(name) + " strides (batch " + str(s.batch) + ", seq " +
                            str(s.seq) + ", head " + str(s.head) + ") make elements overlap: the " +
                            axis.what + " stride " + str(axis.stride) +
                            " must exceed the span of the smaller axes (" + str(covered) +
                            "); an output must not alias itself");
    }
    covered += (axis.extent - 1) * axis.stride;
  }
  return ok_status();
}

Status check_strides(const char* name, const Strides& s, int64_t batch, int64_t seqlen,
                     int64_t heads, int64_t head_dim, bool is_output) {
  const std::pair<const char*, int64_t> fields[] = {
      {"batch", s.batch}, {"seq", s.seq}, {"head", s.head}};
  for (auto [axis, value] : fields) {
    // 16-byte rows let the kernel move whole 8-element vectors; negative strides are not
    // supported by the address arithmetic.
    if (value < 0 || value % 8 != 0) {
      return make_error(
          ErrorCode::InvalidArgument,
          std::string(name) + "." + axis + " stride = " + str(value) +
              ": must be a non-negative multiple of 8 elements (16-byte aligned rows)");
    }
  }
  const std::optional<int64_t> spanned = checked_span(s, batch, seqlen, heads, head_dim);
  if (!spanned || *spanned > (int64_t{1} << 62)) {
    return make_error(ErrorCode::InvalidArgument,
                      std::string(name) + " strides span more than 2^62 elements");
  }
  if (is_output) return check_no_overlap(name, s, batch, seqlen, heads, head_dim);
  return ok_status();
}

// The K/V cache fields: a page size in range, a cache and a block table that can hold seqlen_k
// keys per sequence, per-sequence lengths with a paged cache; the forward pass only.
Status check_kv_cache(const AttentionProblem& p) {
  const KvCache& kv = p.kv;
  auto invalid = [](const std::string& message) {
    return Status(make_error(ErrorCode::InvalidArgument, message));
  };
  if (!kv.paged()) {
    if (kv.page_size != 0)
      return invalid("page_size = " + str(kv.page_size) + ": must be 0 (contiguous K/V) or a " +
                     "multiple of 16 in [" + str(kMinPageSize) + ", " + str(kMaxPageSize) + "]");
    if (kv.num_pages != 0 || kv.max_pages != 0)
      return invalid("num_pages = " + str(kv.num_pages) + ", max_pages = " + str(kv.max_pages) +
                     ": must be 0 without a page size (contiguous K/V)");
  } else {
    if (kv.page_size < kMinPageSize || kv.page_size > kMaxPageSize || kv.page_size % 16 != 0)
      return invalid("page_size = " + str(kv.page_size) + ": must be a multiple of 16 in [" +
                     str(kMinPageSize) + ", " + str(kMaxPageSize) + "]");
    if (kv.num_pages < 1 || kv.num_pages > INT_MAX)
      return invalid("num_pages = " + str(kv.num_pages) + ": must be in [1, 2^31 - 1]");
    if (kv.max_pages < 1 || kv.max_pages > INT_MAX / kv.page_size)
      return invalid("max_pages = " + str(kv.max_pages) + ": must be in [1, (2^31 - 1) / " +
                     "page_size]");
    if (kv.capacity() < p.seqlen_k)
      return invalid("max_pages = " + str(kv.max_pages) + ": a block table row of " +
                     str(kv.max_pages) + " pages of " + str(kv.page_size) + " keys holds " +
                     str(kv.capacity()) + " keys, fewer than seqlen_k = " + str(p.seqlen_k));
    if (!kv.seqlens_k)
      return invalid("a paged K/V cache needs per-sequence lengths (seqlens_k, int32 [batch])");
  }
  if ((kv.paged() || kv.seqlens_k) && p.pass != Pass::Forward)
    return invalid(std::string("a paged K/V cache and seqlens_k are for the forward pass; ") +
                   "this problem is " + to_string(p.pass));
  return ok_status();
}

// A float in the shortest text that reads back as the same float.
std::string float_text(float value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", static_cast<double>(value));
  return text;
}

// 64-bit FNV-1a of a user expression, in hex: its part of the variant key.
std::string expression_hash(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

bool is_identifier_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

// The variant's fields (window, softcap, prefix, the expressions); contiguous K/V only; the
// backward: not of packed documents, a score_mod with its derivative.
Status check_variant(const AttentionProblem& p) {
  const Variant& v = p.variant;
  auto invalid = [](const std::string& message) {
    return Status(make_error(ErrorCode::InvalidArgument, message));
  };
  const std::pair<const char*, int64_t> sides[] = {{"window_left", v.window_left},
                                                   {"window_right", v.window_right}};
  for (auto [name, value] : sides)
    if (value < -1 || value > INT_MAX)
      return invalid(std::string(name) + " = " + str(value) +
                     ": must be -1 (unbounded) or a key count in [0, 2^31 - 1]");
  if (v.softcap && !(std::isfinite(*v.softcap) && *v.softcap > 0.f))
    return invalid("softcap = " + float_text(*v.softcap) + ": must be finite and > 0");
  if (v.prefix < 0 || v.prefix > INT_MAX)
    return invalid("prefix = " + str(v.prefix) + ": must be in [0, 2^31 - 1]");
  FLASHJIT_TRY(check_variant_expression("score_mod", v.score_mod));
  FLASHJIT_TRY(check_variant_expression("mask_mod", v.mask_mod));
  FLASHJIT_TRY(check_variant_expression("score_mod_grad", v.score_mod_grad));
  if (!v.score_mod_grad.empty() && v.score_mod.empty())
    return invalid("score_mod_grad = \"" + v.score_mod_grad +
                   "\" without a score_mod: it is the derivative of the score_mod");
  if (!v.active()) return ok_status();
  if (p.pass == Pass::Backward && !v.score_mod.empty() && v.score_mod_grad.empty())
    return invalid("score_mod = \"" + v.score_mod +
                   "\" in a backward problem needs score_mod_grad, its derivative d score_mod / "
                   "d score (same variables; `score` is score_mod's input), e.g. \"1.0f\" for "
                   "\"score + 0.5f * head\"");
  if (p.kv.paged() || p.kv.seqlens_k)
    return make_error(ErrorCode::Unsupported,
                      "attention variants (" + v.key() +
                          ") take contiguous K/V without per-sequence lengths so far");
  return ok_status();
}

// Packed variable-length documents (Variant::varlen): the document count and longest lengths
// (batch, seqlen_q, seqlen_k) named as the varlen API names them, the packed row counts, batch
// strides 0.
Status check_varlen(const AttentionProblem& p) {
  const Variant& v = p.variant;
  auto invalid = [](const std::string& message) {
    return Status(make_error(ErrorCode::InvalidArgument, message));
  };
  if (!v.varlen) {
    if (v.total_q != 0 || v.total_k != 0)
      return invalid("total_q = " + str(v.total_q) + ", total_k = " + str(v.total_k) +
                     ": packed row counts are for varlen problems only (set varlen or leave 0)");
    return ok_status();
  }
  if (p.batch < 1 || p.batch > 65535)
    return invalid("num_docs = " + str(p.batch) + ": must be in [1, 65535] (cu_seqlens has " +
                   "num_docs + 1 entries)");
  if (p.seqlen_q < 1 || p.seqlen_q > INT_MAX)
    return invalid("max_seqlen_q = " + str(p.seqlen_q) + ": must be in [1, 2^31 - 1]");
  if (p.seqlen_k < 1 || p.seqlen_k > INT_MAX)
    return invalid("max_seqlen_k = " + str(p.seqlen_k) + ": must be in [1, 2^31 - 1]");
  for (auto [name, value] :
       {std::pair<const char*, int64_t>{"total_q", v.total_q}, {"total_k", v.total_k}})
    if (value < 1 || value > INT_MAX)
      return invalid(std::string(name) + " = " + str(value) +
                     ": must be in [1, 2^31 - 1] (rows of the packed tensor)");
  const std::pair<const char*, const Strides*> tensors[] = {
      {"q", &p.q_strides},   {"k", &p.k_strides},   {"v", &p.v_strides},   {"o", &p.o_strides},
      {"do", &p.do_strides}, {"dq", &p.dq_strides}, {"dk", &p.dk_strides}, {"dv", &p.dv_strides}};
  for (auto [name, strides] : tensors)
    if (strides->batch != 0 && (p.is_backward() || name[0] != 'd'))
      return invalid(std::string(name) + ".batch stride = " + str(strides->batch) +
                     ": must be 0 for packed variable-length documents (a document is a range "
                     "of rows, through the seq stride)");
  if (p.kv.paged() || p.kv.seqlens_k)
    return make_error(ErrorCode::Unsupported,
                      "packed variable-length documents take contiguous K/V without seqlens_k");
  return ok_status();
}

}  // namespace

Status check_cu_seqlens(const char* name, const int32_t* cu, int64_t num_docs, int64_t max_seqlen,
                        int64_t total) {
  auto invalid = [&](const std::string& message) {
    return Status(make_error(ErrorCode::InvalidArgument, std::string(name) + message));
  };
  if (cu == nullptr) return invalid(" is null: varlen needs int32 [num_docs + 1] offsets");
  if (cu[0] != 0) return invalid("[0] = " + str(cu[0]) + ": must be 0");
  for (int64_t b = 0; b < num_docs; ++b) {
    const int64_t length = int64_t{cu[b + 1]} - cu[b];
    if (length < 0)
      return invalid("[" + str(b + 1) + "] = " + str(cu[b + 1]) + " < " + name + "[" + str(b) +
                     "] = " + str(cu[b]) + ": the offsets must be non-decreasing");
    if (length > max_seqlen)
      return invalid(": document " + str(b) + " has " + str(length) + " rows (" + name + "[" +
                     str(b + 1) + "] - " + name + "[" + str(b) + "]), more than max_seqlen " +
                     str(max_seqlen));
  }
  if (cu[num_docs] > total)
    return invalid("[" + str(num_docs) + "] = " + str(cu[num_docs]) +
                   ": past the packed tensor's " + str(total) + " rows");
  return ok_status();
}

Status check_variant_expression(const char* what, const std::string& expression) {
  if (expression.empty()) return ok_status();  // none
  auto refuse = [&](const std::string& why) {
    return Status(make_error(ErrorCode::InvalidArgument, std::string(what) + " = \"" + expression +
                                                             "\": " + why +
                                                             " (one C++ expression is expected)"));
  };
  if (expression.size() > kMaxVariantExpression)
    return refuse("longer than " + std::to_string(kMaxVariantExpression) + " characters");
  if (expression.find_first_not_of(" \t\n\r") == std::string::npos) return refuse("empty");
  int depth = 0;  // parentheses and brackets together
  for (size_t i = 0; i < expression.size(); ++i) {
    const char c = expression[i];
    if (c == ';' || c == '{' || c == '}' || c == '#' || c == '"' || c == '\'' || c == '\\')
      return refuse(std::string("'") + c + "' at offset " + std::to_string(i) + " is not allowed");
    if (c == '/' && i + 1 < expression.size() &&
        (expression[i + 1] == '/' || expression[i + 1] == '*'))
      return refuse("a comment at offset " + std::to_string(i) + " is not allowed");
    if (static_cast<unsigned char>(c) < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r')
      return refuse("control character at offset " + std::to_string(i));
    if (static_cast<unsigned char>(c) >= 0x80)
      return refuse("non-ASCII character at offset " + std::to_string(i));
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') {
      if (--depth < 0)
        return refuse(std::string("unbalanced '") + c + "' at offset " + std::to_string(i));
    }
  }
  if (depth != 0) return refuse("unbalanced parentheses: " + std::to_string(depth) + " left open");
  // Keywords that make a statement or leave the function, as whole words.
  for (const char* keyword : {"return", "asm", "__asm__", "goto"}) {
    const std::string word = keyword;
    for (size_t at = expression.find(word); at != std::string::npos;
         at = expression.find(word, at + 1)) {
      const bool starts = at == 0 || !is_identifier_char(expression[at - 1]);
      const size_t end = at + word.size();
      const bool ends = end == expression.size() || !is_identifier_char(expression[end]);
      if (starts && ends) return refuse("'" + word + "' is not allowed");
    }
  }
  return ok_status();
}

std::string Variant::key() const {
  if (!active()) return "";
  std::string key;
  auto add = [&](const std::string& part) { key += (key.empty() ? "" : " ") + part; };
  if (has_window()) add("window(" + str(window_left) + "," + str(window_right) + ")");
  if (softcap) add("softcap" + float_text(*softcap));
  if (alibi) add("alibi");
  if (prefix > 0) add("prefix" + str(prefix));
  if (!score_mod.empty()) add("score_mod#" + expression_hash(score_mod));
  if (!mask_mod.empty()) add("mask_mod#" + expression_hash(mask_mod));
  if (!score_mod_grad.empty()) add("score_mod_grad#" + expression_hash(score_mod_grad));
  if (varlen) add("varlen");
  return key;
}

// Varlen: one packed sequence of total_q query rows / total_k key rows.
int64_t AttentionProblem::q_span() const {
  if (variant.varlen) return span(q_strides, 1, variant.total_q, heads_q, head_dim);
  return span(q_strides, batch, seqlen_q, heads_q, head_dim);
}
int64_t AttentionProblem::kv_span() const {
  // Paged: pages play the batch's part, keys within a page the sequence's.
  const int64_t outer = kv.paged() ? kv.num_pages : variant.varlen ? 1 : batch;
  const int64_t rows = kv.paged() ? kv.page_size : variant.varlen ? variant.total_k : seqlen_k;
  return std::max(span(k_strides, outer, rows, heads_kv, head_dim),
                  span(v_strides, outer, rows, heads_kv, head_dim));
}
int64_t AttentionProblem::o_span() const {
  if (variant.varlen) return span(o_strides, 1, variant.total_q, heads_q, head_dim);
  return span(o_strides, batch, seqlen_q, heads_q, head_dim);
}
// Varlen: the gradients and dO are packed like q, k, v.
int64_t AttentionProblem::do_span() const {
  if (variant.varlen) return span(do_strides, 1, variant.total_q, heads_q, head_dim);
  return span(do_strides, batch, seqlen_q, heads_q, head_dim);
}
int64_t AttentionProblem::dq_span() const {
  if (variant.varlen) return span(dq_strides, 1, variant.total_q, heads_q, head_dim);
  return span(dq_strides, batch, seqlen_q, heads_q, head_dim);
}
int64_t AttentionProblem::dkv_span() const {
  const int64_t outer = variant.varlen ? 1 : batch;
  const int64_t rows = variant.varlen ? variant.total_k : seqlen_k;
  return std::max(span(dk_strides, outer, rows, heads_kv, head_dim),
                  span(dv_strides, outer, rows, heads_kv, head_dim));
}

std::string layout_suffix(int page_size, bool seqlens_k, const std::string& variant) {
  std::string out;
  if (page_size > 0) out += " paged" + std::to_string(page_size);
  if (seqlens_k) out += " seqlens_k";
  if (!variant.empty()) {  // appended: gcc 12 warns falsely (-Wrestrict) on " " + string
    out += " ";
    out += variant;
  }
  return out;
}

std::string AttentionProblem::to_string() const {
  std::ostringstream out;
  out << (pass == Pass::Backward ? "attention_backward(" : "attention(") << "batch=" << batch
      << ", heads_q=" << heads_q << ", heads_kv=" << heads_kv << ", seqlen_q=" << seqlen_q
      << ", seqlen_k=" << seqlen_k << ", head_dim=" << head_dim
      << ", dtype=" << flashjit::to_string(dtype) << (causal ? ", causal" : "")
      << ", scale=" << scale()
      << (pass == Pass::Backward && deterministic ? ", deterministic" : "");
  if (kv.paged())
    out << ", page_size=" << kv.page_size << ", num_pages=" << kv.num_pages
        << ", max_pages=" << kv.max_pages;
  if (kv.seqlens_k) out << ", seqlens_k";
  if (variant.active()) out << ", " << variant.key();
  if (variant.varlen) out << ", total_q=" << variant.total_q << ", total_k=" << variant.total_k;
  out << ")";
  return out.str();
}

Status validate(const AttentionProblem& p) {
  auto invalid = [](const std::string& message) {
    return Status(make_error(ErrorCode::InvalidArgument, message));
  };
  constexpr int64_t kMaxGridDim = 65535;  // heads and batch index grid y/z
  FLASHJIT_TRY(check_varlen(p));
  if (p.batch < 1 || p.batch > kMaxGridDim)
    return invalid("batch = " + str(p.batch) + ": must be in [1, 65535]");
  if (p.heads_q < 1 || p.heads_q > kMaxGridDim)
    return invalid("heads_q = " + str(p.heads_q) + ": must be in [1, 65535]");
  if (p.heads_kv < 1 || p.heads_kv > p.heads_q || p.heads_q % p.heads_kv != 0)
    return invalid("heads_kv = " + str(p.heads_kv) + ": must divide heads_q = " + str(p.heads_q) +
                   " (GQA/MQA need heads_q to be a multiple of heads_kv)");
  if (p.seqlen_q < 1 || p.seqlen_q > INT_MAX)
    return invalid("seqlen_q = " + str(p.seqlen_q) + ": must be in [1, 2^31 - 1]");
  if (p.seqlen_k < 1 || p.seqlen_k > INT_MAX)
    return invalid("seqlen_k = " + str(p.seqlen_k) + ": must be in [1, 2^31 - 1]");
  if (p.head_dim < kMinHeadDim || p.head_dim > kMaxHeadDim || p.head_dim % 8 != 0)
    return invalid("head_dim = " + str(p.head_dim) + ": must be a multiple of 8 in [" +
                   str(kMinHeadDim) + ", " + str(kMaxHeadDim) + "]");
  if (p.softmax_scale && !std::isfinite(*p.softmax_scale))
    return invalid("softmax_scale = " + std::to_string(*p.softmax_scale) + ": must be finite");
  // Varlen: one packed sequence of total_q (total_k) rows.
  const bool varlen = p.variant.varlen;
  const int64_t q_outer = varlen ? 1 : p.batch;
  const int64_t q_rows = varlen ? p.variant.total_q : p.seqlen_q;
  FLASHJIT_TRY(check_strides("q", p.q_strides, q_outer, q_rows, p.heads_q, p.head_dim, false));
  FLASHJIT_TRY(check_kv_cache(p));
  FLASHJIT_TRY(check_variant(p));
  const int64_t kv_outer = p.kv.paged() ? p.kv.num_pages : varlen ? 1 : p.batch;
  const int64_t kv_rows = p.kv.paged() ? p.kv.page_size : varlen ? p.variant.total_k : p.seqlen_k;
  FLASHJIT_TRY(check_strides("k", p.k_strides, kv_outer, kv_rows, p.heads_kv, p.head_dim, false));
  FLASHJIT_TRY(check_strides("v", p.v_strides, kv_outer, kv_rows, p.heads_kv, p.head_dim, false));
  FLASHJIT_TRY(check_strides("o", p.o_strides, q_outer, q_rows, p.heads_q, p.head_dim, true));
  if (p.pass != Pass::Backward) return ok_status();
  // o is an input of the backward pass; the gradients are its outputs.
  // (Varlen: packed like q and k.)
  const int64_t k_outer = varlen ? 1 : p.batch, k_rows = varlen ? p.variant.total_k : p.seqlen_k;
  FLASHJIT_TRY(check_strides("do", p.do_strides, q_outer, q_rows, p.heads_q, p.head_dim, false));
  FLASHJIT_TRY(check_strides("dq", p.dq_strides, q_outer, q_rows, p.heads_q, p.head_dim, true));
  FLASHJIT_TRY(check_strides("dk", p.dk_strides, k_outer, k_rows, p.heads_kv, p.head_dim, true));
  FLASHJIT_TRY(check_strides("dv", p.dv_strides, k_outer, k_rows, p.heads_kv, p.head_dim, true));
  return ok_status();
}

}  // namespace flashjit
