// A small JSON reader: see tuner/json.hpp.
#include "tuner/json.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

namespace flashjit {
namespace {

class Parser {
 public:
  Parser(std::string_view text, std::string_view what) : text_(text), what_(what) {}

  Result<Json> document() {
    Json value;
    FLASHJIT_TRY(parse(value, 0));
    skip_space();
    if (at_ < text_.size()) return fail("text after the value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 200;

  Error fail(std::string_view why) const {
    std::string message(what_);
    message += ": JSON error at byte ";
    message += std::to_string(at_);
    message += ": ";
    message.append(why);
    return make_error(ErrorCode::InvalidArgument, std::move(message));
  }
  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t' || text_[at_] == '\r')) {
      ++at_;
    }
  }
  bool literal(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }

  Status parse(Json& out, int depth) {
    if (depth > kMaxDepth) return fail("nested too deeply");
    skip_space();
    if (at_ >= text_.size()) return fail("unexpected end");
    const char c = text_[at_];
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    if (c == '"') {
      out.kind = Json::Kind::String;
      return string(out.string);
    }
    if (literal("true") || literal("false")) {
      out.kind = Json::Kind::Bool;
      out.boolean = text_[at_ - 1] == 'e' && text_[at_ - 2] == 'u';  // "true", not "false"
      return ok_status();
    }
    if (literal("null")) return ok_status();
    // Python's json writes NaN and Infinity: numbers that are not finite.
    constexpr double kInfinity = std::numeric_limits<double>::infinity();
    for (const auto& [word, value] : {std::pair<std::string_view, double>{"NaN", std::nan("")},
                                      {"Infinity", kInfinity},
                                      {"-Infinity", -kInfinity}}) {
      if (literal(word)) {
        out.kind = Json::Kind::Number;
        out.number = value;
        return ok_status();
      }
    }
    const std::string rest(text_.substr(at_, 64));
    char* end = nullptr;
    const double value = std::strtod(rest.c_str(), &end);
    if (end == rest.c_str()) return fail("expected a value");
    out.kind = Json::Kind::Number;
    out.number = value;
    at_ += static_cast<size_t>(end - rest.c_str());
    return ok_status();
  }

  Status string(std::string& out) {
    ++at_;  // the opening quote
    while (at_ < text_.size() && text_[at_] != '"') {
      char c = text_[at_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) break;
      c = text_[at_++];
      switch (c) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          if (at_ + 4 > text_.size()) return fail("short \\u escape");
          const unsigned code = static_cast<unsigned>(
              std::strtoul(std::string(text_.substr(at_, 4)).c_str(), nullptr, 16));
          at_ += 4;
          // UTF-8 of the code unit (surrogate pairs are kept as two 3-byte sequences).
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xc0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3f));
          } else {
            out += static_cast<char>(0xe0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (code & 0x3f));
          }
          break;
        }
        default:
          out += c;  // \" \\ \/
      }
    }
    if (at_ >= text_.size()) return fail("unterminated string");
    ++at_;  // the closing quote
    return ok_status();
  }

  // The rest of an array or object after its opening bracket: item() for each element, ','
  // between them, up to `close`; `expected`: the error after an element ("expected ',' or ']'").
  template <class Item>
  Status elements(char close, const char* expected, const Item& item) {
    ++at_;
    skip_space();
    if (at_ < text_.size() && text_[at_] == close) return ++at_, ok_status();
    while (true) {
      FLASHJIT_TRY(item());
      skip_space();
      if (at_ < text_.size() && text_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < text_.size() && text_[at_] == close) return ++at_, ok_status();
      return fail(expected);
    }
  }

  Status array(Json& out, int depth) {
    out.kind = Json::Kind::Array;
    return elements(']', "expected ',' or ']'", [&] {
      out.items.emplace_back();
      return parse(out.items.back(), depth + 1);
    });
  }

  Status object(Json& out, int depth) {
    out.kind = Json::Kind::Object;
    return elements('}', "expected ',' or '}'", [&]() -> Status {
      skip_space();
      if (at_ >= text_.size() || text_[at_] != '"') return fail("expected a member name");
      std::string name;
      FLASHJIT_TRY(string(name));
      skip_space();
      if (at_ >= text_.size() || text_[at_] != ':') return fail("expected ':'");
      ++at_;
      return parse(out.members[name], depth + 1);
    });
  }

  std::string_view text_;
  std::string_view what_;
  size_t at_ = 0;
};

}  // namespace

const Json& Json::operator[](std::string_view name) const {
  static const Json kNull;
  if (kind != Kind::Object) return kNull;
  auto found = members.find(std::string(name));
  return found == members.end() ? kNull : found->second;
}

std::string Json::text_or(std::string_view fallback) const {
  return kind == Kind::String ? string : std::string(fallback);
}

double Json::number_or(double fallback) const { return kind == Kind::Number ? number : fallback; }

Result<Json> parse_json(std::string_view text, std::string_view what) {
  return Parser(text, what).document();
}

}  // namespace flashjit
