// The extension's functions around attention: the generated source of a kernel (show), the
// devices and their fingerprints (tuning: tune.hpp).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "errors.hpp"

namespace flashjit::python {

// The source of the kernel for a problem of `pass` ("fwd", "bwd"): on a table architecture
// (`arch`, no GPU needed), or on `device` ("auto", "cpu", "cuda:N") with that runtime's config
// selection; a first comment line names the problem, config, where it came from and the entry
// points.
std::string show(int64_t batch, int64_t heads, std::optional<int64_t> kv_heads, int64_t seqlen_q,
                 int64_t seqlen_k, int head_dim, const std::string& dtype, bool causal,
                 std::optional<double> scale, const std::string& layout,
                 std::optional<std::string> config, std::optional<std::string> arch,
                 const std::string& device, const std::string& pass, bool deterministic);

// CUDA devices and the host CPU, as dicts.
nb::list devices();

}  // namespace flashjit::python
