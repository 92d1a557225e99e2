// Building a mask_mod's block map on the device (issue 31): the generated builder
// (generator/block_mask.hpp renders it, templates/cuda/block_mask.cuh) compiled with NVRTC once
// per block_mask_key and architecture in the process, loaded into the kernel's context, and
// launched on the attention call's stream (two small kernels, no host sync).
//
// BlockMaskCache is a loaded kernel's maps (CudaKernel, for a source with
// KernelSource::block_mask): one per problem shape at the kernel's block_m x block_n, built on the
// first call of that shape (which allocates: warm up before capturing a CUDA graph, as for the
// backward's workspace) and reused by every later call, on any stream (a later call on another
// stream than the first must be ordered after it, as for any input the first call wrote).
#pragma once

#include <cuda.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "generator/block_mask.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"
#include "runtime/cuda/driver.hpp"
#include "templates/attention_params.h"

namespace flashjit::cuda {

// The map of `shape` in a buffer of shape.bytes() at `base` (device memory).
FlashjitBlockMask block_mask_view(const BlockMaskShape& shape, void* base);

// The params the builder reads (the sizes visible() needs).
FlashjitAttentionParams block_mask_params(const BlockMaskShape& shape);

// The builder's CUBIN for `problem`'s block_mask_key at `arch`: compiled on first use, then kept
// for the process.
Result<std::vector<char>> block_mask_builder_binary(const AttentionProblem& problem, int arch);

// The builder's two kernels for `problem` loaded in `context` (current): once per context and
// block_mask_key in the process (the modules stay loaded with the context).
struct BlockMaskBuilder {
  CUfunction states = nullptr;
  CUfunction lists = nullptr;
};
Result<BlockMaskBuilder> block_mask_builder(const Driver* driver, CUcontext context,
                                            const AttentionProblem& problem, int arch);

// Enqueues the build of the map of `shape` at `map` (block_mask_view of a buffer of
// shape.bytes()) on `stream`: the states kernel, then the lists kernel. The context is current.
Status enqueue_block_mask_build(const Driver* driver, const BlockMaskBuilder& builder,
                                const BlockMaskShape& shape, const FlashjitBlockMask& map,
                                CUstream stream);

class BlockMaskCache {
 public:
  // The maps of a kernel at `block_m` x `block_n` in `context` (the kernel's; the cache takes no
  // reference of its own: the kernel outlives it).
  BlockMaskCache(const Driver* driver, CUcontext context, int arch, int block_m, int block_n)
      : driver_(driver), context_(context), arch_(arch), block_m_(block_m), block_n_(block_n) {}
  ~BlockMaskCache();
  BlockMaskCache(const BlockMaskCache&) = delete;
  BlockMaskCache& operator=(const BlockMaskCache&) = delete;

  // The map of `problem` (built on `stream` on its shape's first call). The context is current.
  Result<FlashjitBlockMask> get(const AttentionProblem& problem, CUstream stream);
  // A bench hook: builds `problem`'s map again on `stream` between two events and waits for
  // them: the build's device time in milliseconds (a new shape is built once first, untimed:
  // that first build also compiles and loads the builder).
  Result<double> time_build(const AttentionProblem& problem, CUstream stream);

 private:
  Result<FlashjitBlockMask> get_locked(const AttentionProblem& problem, CUstream stream);

  const Driver* driver_;
  CUcontext context_;
  int arch_, block_m_, block_n_;
  std::mutex mutex_;
  BlockMaskBuilder builder_;
  struct Built {
    BlockMaskShape shape;
    CUdeviceptr buffer = 0;
    FlashjitBlockMask map{};
  };
  std::vector<Built> maps_;
};

// Builds the map again between two events on `stream` and waits: the build's device time (ms).
Result<double> time_block_mask_build(const Driver* driver, const BlockMaskBuilder& builder,
                                     const BlockMaskShape& shape, const FlashjitBlockMask& map,
                                     CUstream stream);

// Error Unsupported when a map of `shape` exceeds the launch grid (65535 query tiles or maps).
Status check_block_mask_shape(const BlockMaskShape& shape);

}  // namespace flashjit::cuda
