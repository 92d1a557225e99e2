#include "runtime/cuda/block_mask.hpp"

#include "generator/render.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"

namespace flashjit::cuda {

FlashjitBlockMask block_mask_view(const BlockMaskShape& shape, void* base) {
  unsigned char* bytes = static_cast<unsigned char*>(base);
  FlashjitBlockMask map{};
  map.q_count = reinterpret_cast<int*>(bytes + shape.q_count_offset());
  map.q_list = reinterpret_cast<int*>(bytes + shape.q_list_offset());
  map.k_count = reinterpret_cast<int*>(bytes + shape.k_count_offset());
  map.k_list = reinterpret_cast<int*>(bytes + shape.k_list_offset());
  map.states = bytes + shape.states_offset();
  map.q_tiles = static_cast<int>(shape.q_tiles());
  map.k_tiles = static_cast<int>(shape.k_tiles());
  map.block_m = shape.block_m;
  map.block_n = shape.block_n;
  map.maps = static_cast<int>(shape.maps());
  map.per_head = shape.per_head ? 1 : 0;
  map.heads_q = static_cast<int>(shape.heads_q);
  return map;
}

FlashjitAttentionParams block_mask_params(const BlockMaskShape& shape) {
  FlashjitAttentionParams params{};
  params.batch = static_cast<int>(shape.batch);
  params.heads_q = params.heads_kv = static_cast<int>(shape.heads_q);
  params.group_size = 1;
  params.seqlen_q = static_cast<int>(shape.seqlen_q);
  params.seqlen_k = static_cast<int>(shape.seqlen_k);
  return params;
}

Result<std::vector<char>> block_mask_builder_binary(const AttentionProblem& problem, int arch) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, std::vector<char>> binaries;
  Result<KernelSource> source = render_block_mask_builder(problem);
  if (!source.ok()) return source.error();
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(source->text, arch);
  if (auto found = binaries.find(key); found != binaries.end()) return found->second;
  Result<Binary> binary = nvrtc_compile(source.value(), arch);
  if (!binary.ok()) return binary.error();
  return binaries.emplace(key, std::move(binary->bytes)).first->second;
}

Result<BlockMaskBuilder> block_mask_builder(const Driver* driver, CUcontext context,
                                            const AttentionProblem& problem, int arch) {
  static std::mutex mutex;
  static std::map<std::pair<CUcontext, std::string>, BlockMaskBuilder> loaded;
  const std::string key = block_mask_key(problem);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto found = loaded.find({context, key}); found != loaded.end()) return found->second;
  Result<std::vector<char>> binary = block_mask_builder_binary(problem, arch);
  if (!binary.ok()) return binary.error();
  CUmodule module = nullptr;
  FLASHJIT_TRY(check(driver->cuModuleLoadData(&module, binary->data()),
                     "cuModuleLoadData (block mask builder)"));
  BlockMaskBuilder builder;
  Status found = check(driver->cuModuleGetFunction(&builder.states, module, kBlockMaskStatesEntry),
                       "cuModuleGetFunction (block mask states)");
  if (found.ok())
    found = check(driver->cuModuleGetFunction(&builder.lists, module, kBlockMaskListsEntry),
                  "cuModuleGetFunction (block mask lists)");
  if (!found.ok()) {
    driver->cuModuleUnload(module);
    return found.error();
  }
  return loaded.emplace(std::make_pair(context, key), builder).first->second;
}

Status check_block_mask_shape(const BlockMaskShape& shape) {
  if (shape.maps() <= 65535 && shape.q_tiles() <= 65535 &&
      shape.q_tiles() * shape.k_tiles() * shape.maps() < (int64_t{1} << 31))
    return ok_status();
  return make_error(ErrorCode::Unsupported,
                    "block map of " + shape.to_string() +
                        ": too many tiles (at most 65535 query tiles and 65535 maps, fewer than "
                        "2^31 tiles in all)");
}

Status enqueue_block_mask_build(const Driver* driver, const BlockMaskBuilder& builder,
                                const BlockMaskShape& shape, const FlashjitBlockMask& map,
                                CUstream stream) {
  FLASHJIT_TRY(check_block_mask_shape(shape));
  FlashjitAttentionParams params = block_mask_params(shape);
  FlashjitBlockMask mask = map;
  void* states_args[] = {&params, &mask};
  const unsigned states_x =
      static_cast<unsigned>((shape.k_tiles() + kBlockMaskWarps - 1) / kBlockMaskWarps);
  FLASHJIT_TRY(
      check(driver->cuLaunchKernel(builder.states, states_x, static_cast<unsigned>(shape.q_tiles()),
                                   static_cast<unsigned>(shape.maps()), kBlockMaskThreads, 1, 1, 0,
                                   stream, states_args, nullptr),
            "cuLaunchKernel (block mask states)", ErrorCode::LaunchFailed));
  void* lists_args[] = {&mask};
  const unsigned lists_x = static_cast<unsigned>(
      (shape.maps() * (shape.q_tiles() + shape.k_tiles()) + kBlockMaskThreads - 1) /
      kBlockMaskThreads);
  return check(driver->cuLaunchKernel(builder.lists, lists_x, 1, 1, kBlockMaskThreads, 1, 1, 0,
                                      stream, lists_args, nullptr),
               "cuLaunchKernel (block mask lists)", ErrorCode::LaunchFailed);
}

BlockMaskCache::~BlockMaskCache() {
  if (driver_->cuCtxSetCurrent(context_) != CUDA_SUCCESS) return;
  for (const Built& built : maps_) driver_->cuMemFree(built.buffer);
}

Result<FlashjitBlockMask> BlockMaskCache::get_locked(const AttentionProblem& problem,
                                                     CUstream stream) {
  const BlockMaskShape shape = block_mask_shape(problem, block_m_, block_n_);
  for (const Built& built : maps_)
    if (built.shape == shape) return built.map;
  FLASHJIT_TRY(check_block_mask_shape(shape));
  if (builder_.states == nullptr) {
    Result<BlockMaskBuilder> builder = block_mask_builder(driver_, context_, problem, arch_);
    if (!builder.ok()) return builder.error();
    builder_ = builder.value();
  }
  Built built;
  built.shape = shape;
  FLASHJIT_TRY(check(driver_->cuMemAlloc(&built.buffer, shape.bytes()), "cuMemAlloc (block map)"));
  built.map = block_mask_view(shape, reinterpret_cast<void*>(built.buffer));
  Status status = enqueue_block_mask_build(driver_, builder_, shape, built.map, stream);
  if (!status.ok()) {
    driver_->cuMemFree(built.buffer);
    return status.error();
  }
  maps_.push_back(built);
  return built.map;
}

Result<FlashjitBlockMask> BlockMaskCache::get(const AttentionProblem& problem, CUstream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  return get_locked(problem, stream);
}

Result<double> BlockMaskCache::time_build(const AttentionProblem& problem, CUstream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  FLASHJIT_TRY(check(driver_->cuCtxSetCurrent(context_), "cuCtxSetCurrent"));
  Result<FlashjitBlockMask> map = get_locked(problem, stream);
  if (!map.ok()) return map.error();
  return time_block_mask_build(driver_, builder_, block_mask_shape(problem, block_m_, block_n_),
                               map.value(), stream);
}

Result<double> time_block_mask_build(const Driver* driver, const BlockMaskBuilder& builder,
                                     const BlockMaskShape& shape, const FlashjitBlockMask& map,
                                     CUstream stream) {
  CUevent start = nullptr, stop = nullptr;
  FLASHJIT_TRY(check(driver->cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate"));
  Status status = check(driver->cuEventCreate(&stop, CU_EVENT_DEFAULT), "cuEventCreate");
  float elapsed = 0;
  if (status.ok()) status = check(driver->cuEventRecord(start, stream), "cuEventRecord");
  if (status.ok()) status = enqueue_block_mask_build(driver, builder, shape, map, stream);
  if (status.ok()) status = check(driver->cuEventRecord(stop, stream), "cuEventRecord");
  if (status.ok())
    status = check(driver->cuEventSynchronize(stop), "cuEventSynchronize", ErrorCode::LaunchFailed);
  if (status.ok())
    status = check(driver->cuEventElapsedTime(&elapsed, start, stop), "cuEventElapsedTime");
  driver->cuEventDestroy(start);
  if (stop != nullptr) driver->cuEventDestroy(stop);
  if (!status.ok()) return status.error();
  return static_cast<double>(elapsed);
}

}  // namespace flashjit::cuda
