// A small JSON reader: the tuning report a worker process hands back (tuner/run_report.hpp) and
// the CLI's inputs (`flashjit report --side-by-side FILE`: the JSON bench/side_by_side.py writes).
// Values are kept as a tree; errors name the byte offset.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "generator/error.hpp"

namespace flashjit {

struct Json {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> items;              // Array
  std::map<std::string, Json> members;  // Object

  // The member `name` of an object, or null when absent (or not an object).
  const Json& operator[](std::string_view name) const;
  bool is_number() const { return kind == Kind::Number; }
  bool is_string() const { return kind == Kind::String; }
  bool is_object() const { return kind == Kind::Object; }
  bool is_array() const { return kind == Kind::Array; }
  // The string, or `fallback` for any other kind; the number, or `fallback`.
  std::string text_or(std::string_view fallback) const;
  double number_or(double fallback) const;
};

// Parses a whole document. InvalidArgument "<what>: JSON error at byte N: ..." on bad input.
Result<Json> parse_json(std::string_view text, std::string_view what);

}  // namespace flashjit
