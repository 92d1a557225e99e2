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

class CpuDecodeKernel final : public CpuKernelBase {
 public:
  CpuDecodeKernel(std::unique_ptr<JitModule> module, std::vector<EntryFunction> entries,
                  WorkRunner runner, const CpuSpec& cpu, ProblemSignature signature,
                  AttentionConfig config, KernelInfo info)
      : CpuKernelBase(std::move(module), std::move(entries), std::move(signature), config, info),
        runner_(std::move(runner)),
        cpu_(cpu) {}

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

  WorkRunner runner_;  // entries_: split, combine
  CpuSpec cpu_;
};

}  // namespace

Result<DeviceBuffer> host_allocation(size_t bytes) {
  const size_t rounded =
      (std::max<size_t>(bytes, 1) + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  void* pointer = std::aligned_alloc(kWorkspaceAlign, rounded);
  if (pointer == nullptr)
    return make_error(ErrorCode::DriverError,
                      "host allocation of " + std::to_string(bytes) + " B failed");
  return DeviceBuffer(pointer, bytes, [](void* p) { std::free(p); });
}

CpuKernelBase::CpuKernelBase(std::unique_ptr<JitModule> module, std::vector<EntryFunction> entries,
                             ProblemSignature signature, AttentionConfig config, KernelInfo info)
    : module_(std::move(module)),
      entries_(std::move(entries)),
      signature_(std::move(signature)),
      config_(config),
      info_(info),
      workspace_(host_allocation, [](void*) { return ok_status(); }) {}

std::shared_ptr<Kernel> make_cpu_decode_kernel(std::unique_ptr<JitModule> module,
                                               std::vector<EntryFunction> entries,
                                               WorkRunner runner, const CpuSpec& cpu,
                                               ProblemSignature signature, AttentionConfig config,
                                               KernelInfo info) {
  return std::make_shared<CpuDecodeKernel>(std::move(module), std::move(entries), std::move(runner),
                                           cpu, signature, config, info);
}

}  // namespace flashjit::cpu
