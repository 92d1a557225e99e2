// Encodes the TMA tensor maps of a -ws forward launch with the driver (cuTensorMapEncodeTiled),
// from runtime/tensor_map_spec.hpp's description: the second parameter block of the -ws entry
// (FlashjitForwardTensorMaps, templates/attention_params.h). Host-only work, no device call.
#pragma once

#include "generator/config.hpp"
#include "generator/error.hpp"
#include "runtime/cuda/driver.hpp"
#include "runtime/tensor_map_spec.hpp"
#include "templates/attention_params.h"

namespace flashjit::cuda {

// One map. Error Unsupported when the driver lacks cuTensorMapEncodeTiled (before CUDA 12),
// DriverError naming the tensor, its dimensions and strides when the driver refuses them.
Status encode_tensor_map(const Driver& driver, const TensorMapSpec& spec, FlashjitTensorMap* map);

// The four maps of a launch of `problem` with `params` (make_launch_params) of a -ws kernel,
// into `maps`: the forward's q, k, v, o, or for a backward problem (the ws family's fused
// backward kernel) q, k, v and dO in the o slot (backward_tensor_map_specs).
Status encode_forward_tensor_maps(const Driver& driver, const FlashjitAttentionParams& params,
                                  const AttentionProblem& problem, const AttentionConfig& config,
                                  FlashjitForwardTensorMaps* maps);

}  // namespace flashjit::cuda
