// The template files each kernel family's source is assembled from, in order (after
// attention_params.h and, for an attention variant, attention_variant.h). The renderers assemble
// exactly these lists, and the tuning rows' generator versions (render.hpp) hash the union of a
// backend's lists per pass: a change to a backward template leaves the forward's rows current
// and the other way round. A template no list names is in no kernel and no version.
#pragma once

#include <span>
#include <string_view>

namespace flashjit::template_files {

enum class Use { Forward, Backward, Decode };

struct Family {
  std::string_view backend;  // the first field of the devices' strings: "cuda"
  Use use;
  std::span<const char* const> files;
};

// clang-format off
inline constexpr const char* kCudaMmaForwardFiles[] = {
    "attention_common.h", "cuda/common.cuh", "cuda/online_softmax.cuh", "cuda/tiles.cuh",
    "cuda/warp_mma.cuh", "cuda/attention_fwd.cuh"};
inline constexpr const char* kCudaWgmmaForwardFiles[] = {
    "attention_common.h", "cuda/common.cuh", "cuda/online_softmax.cuh", "cuda/wgmma.cuh",
    "cuda/sm90_tiles.cuh", "cuda/attention_fwd_sm90.cuh"};
inline constexpr const char* kCudaWsForwardFiles[] = {
    "attention_common.h", "cuda/common.cuh", "cuda/online_softmax.cuh", "cuda/wgmma.cuh",
    "cuda/sm90_tiles.cuh", "cuda/tma.cuh", "cuda/ws/pipeline.cuh", "cuda/ws/traits.cuh",
    "cuda/ws/tile_scheduler.cuh", "cuda/ws/pingpong.cuh", "cuda/ws/softmax.cuh",
    "cuda/ws/mainloop.cuh", "cuda/ws/epilogue.cuh", "cuda/ws/attention_fwd_ws.cuh"};
inline constexpr const char* kCudaMmaBackwardFiles[] = {
    "attention_common.h", "cuda/common.cuh", "cuda/tiles.cuh", "cuda/attention_bwd_common.cuh",
    "cuda/attention_bwd.cuh"};
inline constexpr const char* kCudaWgmmaBackwardFiles[] = {
    "attention_common.h", "cuda/common.cuh", "cuda/wgmma.cuh", "cuda/sm90_tiles.cuh",
    "cuda/bulk_group.cuh", "cuda/attention_bwd_common.cuh", "cuda/attention_bwd_sm90.cuh",
    "cuda/attention_bwd_sm90_dq.cuh"};
inline constexpr const char* kCudaWsBackwardFiles[] = {
    "attention_common.h", "cuda/common.cuh", "cuda/wgmma.cuh", "cuda/sm90_tiles.cuh",
    "cuda/tma.cuh", "cuda/attention_bwd_common.cuh", "cuda/attention_bwd_sm90.cuh",
    "cuda/ws/pipeline.cuh", "cuda/ws/pingpong.cuh", "cuda/ws/attention_bwd_ws.cuh"};
inline constexpr const char* kCudaDecodeFiles[] = {
    "attention_common.h", "decode_split.h", "cuda/common.cuh", "cuda/online_softmax.cuh",
    "cuda/tiles.cuh", "cuda/warp_mma.cuh", "cuda/decode.cuh"};
inline constexpr const char* kHipForwardFiles[] = {
    "attention_common.h", "hip/primitives.hpp", "hip/tiles.hpp", "hip/attention_fwd.hpp"};
inline constexpr const char* kHipBackwardFiles[] = {
    "attention_common.h", "hip/primitives.hpp", "hip/tiles.hpp", "hip/attention_bwd_common.hpp",
    "hip/attention_bwd.hpp"};
inline constexpr const char* kHipDecodeFiles[] = {
    "attention_common.h", "decode_split.h", "hip/primitives.hpp", "hip/tiles.hpp",
    "hip/decode.hpp"};
inline constexpr const char* kCpuForwardFiles[] = {"cpu/common.hpp", "cpu/attention_fwd.hpp"};
inline constexpr const char* kCpuBackwardFiles[] = {"cpu/common.hpp", "cpu/attention_bwd.hpp",
                                                     "cpu/attention_bwd_dq.hpp"};
inline constexpr const char* kCpuDecodeFiles[] = {"cpu/common.hpp", "cpu/decode.hpp"};
// clang-format on

inline constexpr Family kCudaMmaForward{"cuda", Use::Forward, kCudaMmaForwardFiles};
inline constexpr Family kCudaWgmmaForward{"cuda", Use::Forward, kCudaWgmmaForwardFiles};
inline constexpr Family kCudaWsForward{"cuda", Use::Forward, kCudaWsForwardFiles};
inline constexpr Family kCudaMmaBackward{"cuda", Use::Backward, kCudaMmaBackwardFiles};
inline constexpr Family kCudaWgmmaBackward{"cuda", Use::Backward, kCudaWgmmaBackwardFiles};
inline constexpr Family kCudaWsBackward{"cuda", Use::Backward, kCudaWsBackwardFiles};
inline constexpr Family kCudaDecode{"cuda", Use::Decode, kCudaDecodeFiles};
inline constexpr Family kHipForward{"hip", Use::Forward, kHipForwardFiles};
inline constexpr Family kHipBackward{"hip", Use::Backward, kHipBackwardFiles};
inline constexpr Family kHipDecode{"hip", Use::Decode, kHipDecodeFiles};
inline constexpr Family kCpuForward{"cpu", Use::Forward, kCpuForwardFiles};
inline constexpr Family kCpuBackward{"cpu", Use::Backward, kCpuBackwardFiles};
inline constexpr Family kCpuDecode{"cpu", Use::Decode, kCpuDecodeFiles};

inline constexpr const Family* kFamilies[] = {
    &kCudaMmaForward, &kCudaWgmmaForward, &kCudaWsForward, &kCudaMmaBackward, &kCudaWgmmaBackward,
    &kCudaWsBackward, &kCudaDecode,       &kHipForward,    &kHipBackward,     &kHipDecode,
    &kCpuForward,     &kCpuBackward,      &kCpuDecode};

}  // namespace flashjit::template_files
