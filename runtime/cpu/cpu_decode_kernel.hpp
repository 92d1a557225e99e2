// What the CPU backend's kernels share (CpuKernelBase, host_allocation), and its decode-family
// kernel (templates/cpu/decode.hpp): the split entry over its work items, then (more than one
// split) the combine entry over the rows, on the backend's thread pool, with the partials in the
// caller's workspace or one the kernel keeps (runtime/workspace.hpp). Built by CpuBackend::load
// for configs of family Decode.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "generator/cpu_config.hpp"
#include "runtime/backend.hpp"
#include "runtime/cpu/clang_jit.hpp"
#include "runtime/workspace.hpp"
#include "templates/attention_params.h"

namespace flashjit::cpu {

using EntryFunction = int (*)(const FlashjitAttentionParams*, int, int);
// Runs entry(params, begin, end) over work items [0, items) on the pool; false when an entry
// failed (its scratch could not be allocated).
using WorkRunner = std::function<bool(EntryFunction, const FlashjitAttentionParams&, int64_t)>;

// Host memory for allocate() and the kernels' own workspaces: kWorkspaceAlign (256-byte) aligned,
// so that any buffer from allocate() can serve as a workspace too.
Result<DeviceBuffer> host_allocation(size_t bytes);

// What every CPU kernel holds: the JIT module its entry points live in, the entries in launch
// order, what it was compiled for, and a cache of its own host workspaces (launches are
// synchronous: nothing is in flight when a buffer is replaced; the launches that use it take
// own_workspace_mutex_, one at a time).
class CpuKernelBase : public Kernel {
 public:
  const ProblemSignature& signature() const override { return signature_; }
  const AttentionConfig& config() const override { return config_; }
  const KernelInfo& info() const override { return info_; }

 protected:
  CpuKernelBase(std::unique_ptr<JitModule> module, std::vector<EntryFunction> entries,
                ProblemSignature signature, AttentionConfig config, KernelInfo info);

  std::unique_ptr<JitModule> module_;
  std::vector<EntryFunction> entries_;
  ProblemSignature signature_;
  AttentionConfig config_;
  KernelInfo info_;
  mutable std::mutex own_workspace_mutex_;
  mutable WorkspaceCache workspace_;
};

// `entries`: the split and combine entry points (render_decode.hpp's kCpuDecode*Entry).
std::shared_ptr<Kernel> make_cpu_decode_kernel(std::unique_ptr<JitModule> module,
                                               std::vector<EntryFunction> entries,
                                               WorkRunner runner, const CpuSpec& cpu,
                                               ProblemSignature signature, AttentionConfig config,
                                               KernelInfo info);

}  // namespace flashjit::cpu
