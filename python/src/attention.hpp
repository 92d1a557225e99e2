// The attention entry points of the extension: the forward, the backward, and the config either
// would launch. python/flashjit/__init__.py documents them for users and allocates the outputs
// of the frameworks it knows (torch, numpy, cupy); what it passes as None is allocated here.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "arrays.hpp"

namespace flashjit::python {

// Returns (out, lse) as allocated here: each None when the caller passed it (or, for lse, did
// not ask for it).
nb::tuple attention(InArray q, InArray k, InArray v, std::optional<OutArray> out,
                    std::optional<OutArray> lse, bool want_lse, bool causal,
                    std::optional<double> scale, const std::string& layout,
                    std::optional<std::string> config, uintptr_t stream, bool synchronize,
                    const std::string& framework);

// The backward pass: writes dq, dk, dv from q, k, v, o, lse and do. Returns (dq, dk, dv) as
// allocated here: None for each the caller passed. The kernel's fp32 workspace is its own (per
// stream, grown when needed).
nb::tuple attention_backward(InArray q, InArray k, InArray v, InArray o, std::optional<InArray> lse,
                             InArray d_o, std::optional<OutArray> dq, std::optional<OutArray> dk,
                             std::optional<OutArray> dv, bool causal, std::optional<double> scale,
                             const std::string& layout, bool deterministic,
                             std::optional<std::string> config, uintptr_t stream, bool synchronize,
                             const std::string& framework);

// The config attention() (pass_ "fwd") or attention_backward() ("bwd") would launch for q, k, v
// and where it comes from: {config, source, device, problem}.
nb::dict config_for(InArray q, InArray k, InArray v, bool causal, std::optional<double> scale,
                    const std::string& layout, std::optional<std::string> config,
                    const std::string& pass, bool deterministic);

// Where a kernel's config came from ("exact", "nearest", "default", "given") and the config:
// nullopt = the runtime's selection (tuning DBs, then the SRAM-formula default); "default" = the
// SRAM-formula default; else a config name such as "m128n64w4s2", checked for legality.
std::pair<AttentionConfig, std::string> resolve_config(Runtime& runtime,
                                                       const AttentionProblem& problem,
                                                       const std::optional<std::string>& config);

}  // namespace flashjit::python
