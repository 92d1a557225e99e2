#include "runtime/cpu/cpu_decode_kernel.hpp"

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include "generator/decode_config.hpp"
#include "runtime/decode_launch.hpp"
#include "runtime/table_check.hpp"
#include "runtime/workspace.hpp"

namespace flashjit::cpu {
namespace {

Result<DeviceBuffer> host_buffer(size_t bytes) {
  const size_t rounded =
      (std::max<size_t>(bytes, 1) + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  void* pointer = std::aligned_alloc(kWorkspaceAlign, rounded);
  if (pointer == nullptr)
    return make_error(ErrorCode::DriverError,
                      "host allocation of " + std::to_string(bytes) + " B failed");
  return DeviceBuffer(pointer, bytes, [](void* p) { std::free(p); });
}

class CpuDecodeKernel final : public Kernel {
 public:
  CpuDecodeKernel(std::unique_ptr<JitModule> module, std::vector<EntryFunction> entries,
                  WorkRunner runner, const CpuSpec& cpu, ProblemSignature signature,
                  AttentionConfig config, KernelInfo info)
      : module_(std::move(module)),
        entries_(std::move(entries)),
        runner_(std::move(runner)),
        cpu_(cpu),
        signature_(signature),
        config_(config),
        info_(info),
        // Launches are synchronous: nothing is in flight when a buffer is replaced.
        workspace_(host_buffer, [](void*) { return ok_status(); }) {}

  const ProblemSignature& signature() const override { return signature_; }
  const AttentionConfig& config() const override { return config_; }
  const KernelInfo& info() const override { return info_; }

  size_t workspace_bytes(const AttentionProblem& problem) const override {
    return decode_workspace(problem, cpu_decode_splits(config_, problem, cpu_)).bytes;
  }

  // Synchronous: returns when o (and lse) are written. `stream` only keys the own workspace.
  Status launch(const AttentionProblem& problem, const AttentionArgs& args,
                void* stream) const override {
    const int splits = cpu_decode_splits(config_, problem, cpu_);
    const DecodeWorkspace layout = decode_workspace(problem, splits);
    FLASHJIT_TRY(check_decode_launch(problem, args, signature_,
                                     static_cast<size_t>(dtype_bytes(problem.dtype)), layout));
    // The tables are host memory here: checked before the kernel reads them, when asked.
    if (table_check_enabled(args))
      FLASHJIT_TRY(check_decode_tables(decode_tables_of(problem, args)));
    const int64_t items =
        problem.batch * problem.heads_kv * decode_row_tiles(config_, problem) * splits;
    if (items > INT32_MAX || layout.rows > INT32_MAX) {
      return make_error(ErrorCode::InvalidArgument,
                        problem.to_string() + ": " + std::to_string(items) + " work items and " +
                            std::to_string(layout.rows) +
                            " rows; the CPU decode kernels take at most 2^31 - 1");
    }
    FlashjitAttentionParams params = make_launch_params(problem, args);
    if (layout.bytes == 0 || args.workspace != nullptr) {
      bind_decode(params, problem, args, layout, args.workspace);
      return run(params, items, layout);
    }
    std::lock_guard<std::mutex> lock(own_workspace_mutex_);
    Result<void*> workspace = workspace_.get(layout.bytes, stream);
    if (!workspace.ok()) return workspace.error();
    bind_decode(params, problem, args, layout, workspace.value());
    return run(params, items, layout);
  }

 private:
  Status run(const FlashjitAttentionParams& params, int64_t items,
             const DecodeWorkspace& layout) const {
    if (!runner_(entries_[0], params, items)) {
      return make_error(ErrorCode::LaunchFailed,
                        "the CPU decode kernel could not allocate its scratch (" +
                            std::to_string(info_.dynamic_smem_bytes) + " B per thread)");
    }
    if (layout.splits > 1 && !runner_(entries_[1], params, layout.rows)) {
      return make_error(ErrorCode::LaunchFailed, "the CPU decode combine failed");
    }
    return ok_status();
  }

  std::unique_ptr<JitModule> module_;
  std::vector<EntryFunction> entries_;  // split, combine
  WorkRunner runner_;
  CpuSpec cpu_;
  ProblemSignature signature_;
  AttentionConfig config_;
  KernelInfo info_;
  mutable std::mutex own_workspace_mutex_;
  mutable WorkspaceCache workspace_;
};

}  // namespace

std::shared_ptr<Kernel> make_cpu_decode_kernel(std::unique_ptr<JitModule> module,
                                               std::vector<EntryFunction> entries,
                                               WorkRunner runner, const CpuSpec& cpu,
                                               ProblemSignature signature, AttentionConfig config,
                                               KernelInfo info) {
  return std::make_shared<CpuDecodeKernel>(std::move(module), std::move(entries), std::move(runner),
                                           cpu, signature, config, info);
}

}  // namespace flashjit::cpu
