#include "runtime/cuda/tensor_maps.hpp"

#include <string>

namespace flashjit::cuda {

static_assert(sizeof(FlashjitTensorMap) == sizeof(CUtensorMap) &&
                  alignof(FlashjitTensorMap) == alignof(CUtensorMap),
              "FlashjitTensorMap is a CUtensorMap as the kernels see it");

Status encode_tensor_map(const Driver& driver, const TensorMapSpec& spec, FlashjitTensorMap* map) {
  if (driver.cuTensorMapEncodeTiled == nullptr)
    return make_error(ErrorCode::Unsupported,
                      "the CUDA driver lacks cuTensorMapEncodeTiled (a CUDA 12 or newer driver "
                      "is needed for -ws kernels, which load through TMA)");
  cuuint64_t dims[4], strides[3];
  cuuint32_t box[4], element_strides[4] = {1, 1, 1, 1};
  for (int i = 0; i < 4; ++i) {
    dims[i] = spec.dims[i];
    box[i] = spec.box[i];
  }
  for (int i = 0; i < 3; ++i) strides[i] = spec.strides_bytes[i];
  const CUresult result = driver.cuTensorMapEncodeTiled(
      reinterpret_cast<CUtensorMap*>(map),
      spec.dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      4, const_cast<void*>(spec.base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result == CUDA_SUCCESS) return ok_status();
  const Status status = check(result, "cuTensorMapEncodeTiled");
  std::string shape = "dims (" + std::to_string(spec.dims[0]);
  for (int i = 1; i < 4; ++i) shape += ", " + std::to_string(spec.dims[i]);
  shape += "), byte strides (" + std::to_string(spec.strides_bytes[0]) + ", " +
           std::to_string(spec.strides_bytes[1]) + ", " + std::to_string(spec.strides_bytes[2]) +
           "), box (" + std::to_string(spec.box[0]) + ", " + std::to_string(spec.box[1]) +
           ", 1, 1)";
  return make_error(status.error().code,
                    status.error().message + " for " + spec.tensor + ": " + shape);
}

Status encode_forward_tensor_maps(const Driver& driver, const FlashjitAttentionParams& params,
                                  const AttentionProblem& problem, const AttentionConfig& config,
                                  FlashjitForwardTensorMaps* maps) {
  // A backward kernel's (the ws family's fused kernel) hold dO where the forward's hold O.
  Result<ForwardTensorMapSpecs> specs = problem.is_backward()
                                            ? backward_tensor_map_specs(params, problem, config)
                                            : forward_tensor_map_specs(params, problem, config);
  if (!specs.ok()) return specs.error();
  FLASHJIT_TRY(encode_tensor_map(driver, specs->q, &maps->q));
  FLASHJIT_TRY(encode_tensor_map(driver, specs->k, &maps->k));
  FLASHJIT_TRY(encode_tensor_map(driver, specs->v, &maps->v));
  return encode_tensor_map(driver, specs->o, &maps->o);
}

}  // namespace flashjit::cuda
