// The names of an enum's values as one table in declaration order, for the to_string of an enum
// numbered 0, 1, 2, ... (no explicit values): enum_name(DType::BF16, {"f16", "bf16", "f32"}, "?").
// Keep the table in the enum's order when adding a value (each enum's to_string test names them).
#pragma once

#include <cstddef>
#include <type_traits>

namespace flashjit {

// `names[value]`, or `fallback` for a value the table does not reach.
template <class Enum, std::size_t N>
constexpr const char* enum_name(Enum value, const char* const (&names)[N], const char* fallback) {
  const auto index = static_cast<std::underlying_type_t<Enum>>(value);
  return index >= 0 && static_cast<std::size_t>(index) < N ? names[index] : fallback;
}

}  // namespace flashjit
