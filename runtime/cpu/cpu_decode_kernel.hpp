// The CPU backend's decode-family kernel (templates/cpu/decode.hpp): the split entry over its
// work items, then (more than one split) the combine entry over the rows, on the backend's thread
// pool, with the partials in the caller's workspace or one the kernel keeps
// (runtime/workspace.hpp). Built by CpuBackend::load for configs of family Decode.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "generator/cpu_config.hpp"
#include "runtime/backend.hpp"
#include "runtime/cpu/clang_jit.hpp"
#include "templates/attention_params.h"

namespace flashjit::cpu {

using EntryFunction = int (*)(const FlashjitAttentionParams*, int, int);
// Runs entry(params, begin, end) over work items [0, items) on the pool; false when an entry
// failed (its scratch could not be allocated).
using WorkRunner = std::function<bool(EntryFunction, const FlashjitAttentionParams&, int64_t)>;

// `entries`: the split and combine entry points (render_decode.hpp's kCpuDecode*Entry).
std::shared_ptr<Kernel> make_cpu_decode_kernel(std::unique_ptr<JitModule> module,
                                               std::vector<EntryFunction> entries,
                                               WorkRunner runner, const CpuSpec& cpu,
                                               ProblemSignature signature, AttentionConfig config,
                                               KernelInfo info);

}  // namespace flashjit::cpu
