// What the C++ benchmarks' flag parsing shares (bench/bench_attention.cpp, decode_bench.cpp).
#pragma once

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace flashjit::bench {

// "1024,4096" -> {1024, 4096}: positive integers, comma-separated, at least one; nullopt else.
template <class T>
std::optional<std::vector<T>> parse_list(const std::string& text) {
  std::vector<T> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    char* end = nullptr;
    const long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value <= 0) return std::nullopt;
    values.push_back(static_cast<T>(value));
  }
  if (values.empty()) return std::nullopt;
  return values;
}

}  // namespace flashjit::bench
