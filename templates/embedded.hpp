// Kernel template texts, embedded into the library at build time (see CMakeLists.txt).
#pragma once

#include <string_view>

namespace flashjit::templates {

// Text of a file under templates/, by its path relative to that folder
// ("cuda/attention_fwd.cuh"); empty if no such file was embedded.
std::string_view text(std::string_view relative_path);

// All embedded files' paths, sorted.
const std::string_view* paths(int* count);

}  // namespace flashjit::templates
