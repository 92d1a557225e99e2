// What the GPU backends (CUDA, HIP) do the same way around their driver calls: which entry points
// a kernel of a pass has and their block shapes, and one call's launch sequence (checks, grids,
// the backward's workspace, the params, the entries in order). Each backend supplies its shapes
// (generator: backward_config.hpp, hip_config.hpp), its grid limits and the call that enqueues
// one entry.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/error.hpp"
#include "generator/render.hpp"
#include "runtime/backend.hpp"
#include "runtime/launch_params.hpp"
#include "runtime/workspace.hpp"
#include "templates/attention_params.h"

namespace flashjit {

// A problem with `signature`'s compiled-in fields: a kernel's shared memory (LDS) and threads
// depend only on these and the config, so this stands in for any problem the kernel will run.
inline AttentionProblem representative_problem(const ProblemSignature& signature) {
  AttentionProblem problem;
  problem.head_dim = signature.head_dim;
  problem.dtype = signature.dtype;
  problem.causal = signature.causal;
  problem.pass = signature.pass;
  problem.kv.page_size = signature.page_size;
  return problem;
}

// The block shapes of a kernel's entry points in launch order: the forward's one, the
// backward's three (preprocess, dK/dV, dQ).
inline std::vector<KernelShape> entry_shapes(Pass pass, KernelShape forward,
                                             const BackwardShapes& backward) {
  if (pass == Pass::Forward) return {forward};
  return {backward.preprocess, backward.dkdv, backward.dq};
}

// Error InvalidArgument unless `source` defines as many entry points as a kernel of `pass` has.
inline Status check_entry_count(const KernelSource& source, Pass pass) {
  const size_t expected = pass == Pass::Backward ? 3 : 1;
  if (source.entries.size() == expected) return ok_status();
  return make_error(ErrorCode::InvalidArgument, "'" + source.label + "' defines " +
                                                    std::to_string(source.entries.size()) +
                                                    " entry points; a " + to_string(pass) +
                                                    " kernel has " + std::to_string(expected));
}

// One call of a loaded kernel whose entries have `shapes` (entry_shapes): check_attention_launch
// (with the workspace a given one must hold), the grids (forward_launch / backward_launch)
// within `limits`; for the backward the workspace, args.workspace or else `cache`'s buffer for
// `stream`, bound into the params; then enqueue(entry index, launch shape, params) for each
// entry in order, stopping at the first error.
template <class Enqueue>
Status launch_gpu_kernel(const AttentionProblem& problem, const AttentionArgs& args,
                         const ProblemSignature& signature, const AttentionConfig& config,
                         const std::vector<KernelShape>& shapes, const GridLimits& limits,
                         WorkspaceCache& cache, void* stream, const Enqueue& enqueue) {
  const bool backward = signature.pass == Pass::Backward;
  const BackwardWorkspace workspace_layout =
      backward ? backward_workspace(problem, config) : BackwardWorkspace{};
  // The problem (its pass too: the signature), pointers, sizes; a given workspace's size.
  FLASHJIT_TRY(check_attention_launch(problem, args, signature, 16, workspace_layout.bytes));
  if (shapes.size() != (backward ? 3u : 1u)) {
    return make_error(ErrorCode::InvalidArgument, std::to_string(shapes.size()) +
                                                      " entry shapes for a " +
                                                      to_string(signature.pass) + " kernel");
  }
  std::vector<LaunchShape> launches;
  if (backward) {
    const BackwardLaunch launch =
        backward_launch(problem, config, BackwardShapes{shapes[0], shapes[1], shapes[2]});
    launches = {launch.preprocess, launch.dkdv, launch.dq};
  } else {
    launches = {forward_launch(problem, config, shapes[0])};
  }
  for (const LaunchShape& launch : launches) FLASHJIT_TRY(check_launch_shape(launch, limits));

  FlashjitAttentionParams params = make_launch_params(problem, args);
  if (backward) {
    void* workspace = args.workspace;
    if (workspace == nullptr) {
      Result<void*> cached = cache.get(workspace_layout.bytes, stream);
      if (!cached.ok()) return cached.error();
      workspace = cached.value();
    }
    bind_workspace(params, workspace_layout, workspace);
  }
  for (size_t entry = 0; entry < launches.size(); ++entry) {
    const LaunchShape& launch = launches[entry];
    // validate() rules out empty problems; nothing to enqueue if one got through anyway.
    if (launch.grid_x <= 0 || launch.grid_y <= 0 || launch.grid_z <= 0) continue;
    FLASHJIT_TRY(enqueue(entry, launch, params));
  }
  return ok_status();
}

}  // namespace flashjit
