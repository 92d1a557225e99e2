// Helpers every config space's legality rules share (CUDA forward and backward families, HIP,
// CPU): membership of a knob value in its choices, the choices as text, and the error that names
// an illegal config and why.
#pragma once

#include <algorithm>
#include <iterator>
#include <string>

#include "generator/config.hpp"
#include "generator/error.hpp"

namespace flashjit::knobs {

template <class Range>
bool contains(const Range& range, int value) {
  return std::find(std::begin(range), std::end(range), value) != std::end(range);
}

// "{32, 64, 128}"
template <class Range>
std::string list(const Range& range) {
  std::string out;
  for (int v : range) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return "{" + out + "}";
}

// "config m64n128w8s2: <why>"
inline Status illegal(const AttentionConfig& config, const std::string& why,
                      ErrorCode code = ErrorCode::InvalidArgument) {
  return make_error(code, "config " + config.to_string() + ": " + why);
}

}  // namespace flashjit::knobs
