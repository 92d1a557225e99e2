// Rendering: one (problem, config) -> one self-contained kernel source for a backend.
// Pure text work; no device or compiler is touched here.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "generator/config.hpp"
#include "generator/error.hpp"
#include "generator/problem.hpp"

namespace flashjit {

struct KernelSource {
  // extern "C" names of the kernel functions, in launch order: one for the forward; for the
  // backward the preprocess, dK/dV and dQ kernels (kBackward*Entry, on the CPU kCpuBackward*).
  std::vector<std::string> entries;
  std::string text;   // the whole translation unit: params struct, template, instantiation
  std::string label;  // "attention_fwd d128 bf16 causal m128n64w4s2", for logs and errors
  // Compile for the architecture-specific target (sm_90a rather than sm_90): the source uses
  // instructions (wgmma) that exist only there.
  bool arch_specific = false;
  // The forward entry takes a second parameter after FlashjitAttentionParams: the TMA tensor
  // maps (FlashjitForwardTensorMaps, templates/attention_params.h), encoded per launch (the -ws
  // family).
  bool tensor_maps = false;
  // The main entries take a mask_mod's block map (FlashjitBlockMask) as their second parameter
  // (after the tensor maps, for an entry taking those too): generator/block_mask.hpp,
  // block_mask_applies.
  bool block_mask = false;

  const std::string& entry() const { return entries.front(); }  // the first (or only) one
};

// Name of the entry point every rendered attention forward source defines.
inline constexpr const char* kAttentionForwardEntry = "flashjit_attention_fwd";

// The entry points every rendered GPU backward source defines (CUDA, HIP), launched in this
// order on one stream; each takes the FlashjitAttentionParams by value:
//   preprocess  grid (seqlen_q_rounded / kBackwardPreprocessRows, heads_q, batch),
//               kBackwardPreprocessThreads threads, no dynamic shared memory: delta and lse_log2
//               for every row (padding rows too), dq_accum zeroed when it is not null.
//   dkdv        grid (ceil(seqlen_k / block_n), heads_kv, batch); threads and dynamic shared
//               memory per family (BackwardShapes below: CUDA generator/backward_config.hpp,
//               HIP generator/hip_config.hpp).
//   dq          DqMode::Atomic: dq = dq_accum * scale in the storage type, grid and threads as
//               the preprocess; DqMode::Separate: grid (ceil(seqlen_q / block_m), heads_q,
//               batch), threads and dynamic shared memory per family.
inline constexpr const char* kBackwardPreprocessEntry = "flashjit_attention_bwd_preprocess";
inline constexpr const char* kBackwardDkDvEntry = "flashjit_attention_bwd_dkdv";
inline constexpr const char* kBackwardDqEntry = "flashjit_attention_bwd_dq";
inline constexpr int kBackwardPreprocessRows = 128;  // query rows per preprocess/convert block
inline constexpr int kBackwardPreprocessThreads = 128;

// Threads per block (CTA, workgroup) and dynamic shared memory (LDS) in bytes of one entry point.
struct KernelShape {
  int threads = 0;
  int smem_bytes = 0;
  // A persistent forward (configs "-ws...-persist"): its grid is (min(tiles, persistent_ctas), 1,
  // 1), tiles = ceil(seqlen_q / block_m) x heads_q x batch, and each CTA walks its tiles
  // (templates/cuda/ws/tile_scheduler.cuh). 0: one CTA per tile, grid (ceil(seqlen_q / block_m),
  // heads_q, batch).
  int persistent_ctas = 0;
  bool operator==(const KernelShape&) const = default;
};

// The block shapes of a GPU backward source's entry points, in launch order (the grids are the
// contract's above: runtime/launch_params.hpp's backward_launch).
struct BackwardShapes {
  KernelShape preprocess, dkdv, dq;
};

// The backward's shapes of a family whose dK/dV kernel and (DqMode::Separate) dQ kernel have the
// given shapes: the preprocess and, for DqMode::Atomic, the convert are the contract's row
// kernels.
inline BackwardShapes backward_shapes(const AttentionConfig& config, KernelShape dkdv,
                                      KernelShape dq_separate) {
  const KernelShape rows{kBackwardPreprocessThreads, 0};
  return {rows, dkdv, config.dq == DqMode::Atomic ? rows : dq_separate};
}

// CUDA forward kernel: the mma family (sm80+, templates/cuda/attention_fwd.cuh), the wgmma
// family (sm90a, attention_fwd_sm90.cuh) or the ws family (sm90a, cuda/ws/; its entry also
// takes the tensor maps: KernelSource::tensor_maps), all after templates/cuda/common.cuh.
// Validates the problem and the config's template constraints (not the device budget:
// check_config's job).
Result<KernelSource> render_cuda_attention(const AttentionProblem& problem,
                                           const AttentionConfig& config);

// HIP (AMD CDNA: gfx90a, gfx942; MFMA builtins) forward kernel, for hipRTC
// (templates/hip/attention_fwd.hpp). The same entry name as the CUDA kernel, taking
// FlashjitAttentionParams by value; launch with block (warps * 64) threads and
// hip_lds_bytes(config, problem) bytes of dynamic LDS. A problem with an attention variant gets
// the variant prelude and enters through attention_forward_variant (packed documents: grid z is
// the document). Validates the problem and the config's template constraints (not the device
// budget: check_hip_config's job).
Result<KernelSource> render_hip_attention(const AttentionProblem& problem,
                                          const AttentionConfig& config);

// Name of the entry point every rendered CPU attention forward source defines:
//   extern "C" int flashjit_attention_fwd_cpu(const FlashjitAttentionParams* params,
//                                             int work_begin, int work_end);
// It computes work items [work_begin, work_end) of batch x heads_q x ceil(seqlen_q / block_m)
// (the query block fastest) and returns 0, or 1 when its scratch could not be allocated.
inline constexpr const char* kCpuAttentionForwardEntry = "flashjit_attention_fwd_cpu";

// The CPU backward's entry points, each with the forward's signature over its own work items
// (batch x heads x blocks, the block fastest), run one after the other over the thread pool:
//   preprocess  batch x heads_q x ceil(seqlen_q / block_m): delta and lse_log2
//   dkdv        DqMode::Separate: batch x heads_kv x ceil(seqlen_k / block_n): dK, dV;
//               DqMode::Atomic: batch x heads_kv x dq_accum_splits (the split fastest): dK, dV
//               and dQ into the split's copy of dq_accum (the launcher picks the split count)
//   dq          batch x heads_q x ceil(seqlen_q / block_m): dQ (Separate: from K and V again;
//               Atomic: the sum of the dq_accum copies)
inline constexpr const char* kCpuBackwardPreprocessEntry = "flashjit_attention_bwd_preprocess_cpu";
inline constexpr const char* kCpuBackwardDkDvEntry = "flashjit_attention_bwd_dkdv_cpu";
inline constexpr const char* kCpuBackwardDqEntry = "flashjit_attention_bwd_dq_cpu";

// C++ (host CPU, Clang) forward kernel (templates/cpu/attention_fwd.hpp). Validates the problem
// and the config's template constraints (not the cache budget: check_cpu_config's job).
Result<KernelSource> render_cpu_attention(const AttentionProblem& problem,
                                          const AttentionConfig& config);

// The backward pass of `problem` (problem.pass is Backward; the functions above forward here for
// such problems): one source defining the pass's entry points (kBackward*Entry above; on the CPU
// kCpuBackward*Entry). Validates the problem and the config's template constraints.
Result<KernelSource> render_cuda_attention_backward(const AttentionProblem& problem,
                                                    const AttentionConfig& config);
Result<KernelSource> render_hip_attention_backward(const AttentionProblem& problem,
                                                   const AttentionConfig& config);
Result<KernelSource> render_cpu_attention_backward(const AttentionProblem& problem,
                                                   const AttentionConfig& config);

// Changes whenever a template or the generator's output changes: a hash of the embedded template
// texts plus a manual epoch. generator_version(): every template (what `flashjit --version`
// prints). The tuning DB keys its rows with the version of what their kernels are compiled from
// (ProblemKey::generator_version says which a row carries): the templates of the device's
// backend that its families for the row's pass assemble (generator/template_files.hpp), each as
// such a kernel sees it:
//   generator_version_of(device, pass)          plain rows: plain_kernel_text of each (the
//                                               variant branches and header left out);
//   variant_generator_version_of(device, pass)  rows of a problem with a variant: whole texts;
//   decode_generator_version_of(device)         forward rows a decode config may serve: the
//                                               forward's and the decode family's, plain.
// So a change to one backend's templates leaves the other backends' rows current, a change to
// variant code leaves plain rows current, a change to the backward's templates leaves the
// forward's rows current (and the other way round), and a change to decode kernels leaves
// prefill rows current. Devices of another backend (test fakes) get generator_version().
const std::string& generator_version();
const std::string& generator_version_of(std::string_view device, Pass pass);
const std::string& variant_generator_version_of(std::string_view device, Pass pass);
const std::string& decode_generator_version_of(std::string_view device);
// The versions rows carried before 2026-11-28, when each row kind hashed every template of its
// backend whatever the pass (plain prefill rows, variant rows, decode rows), for this build's
// templates: TuningStore::open re-stamps rows that carry them (their templates are this build's).
struct LegacyRowVersions {
  std::string plain, variant, decode;
};
const LegacyRowVersions& legacy_row_versions_of(std::string_view device);

enum class RowKind { Plain, Variant, Decode };
namespace detail {
// The templates whose texts a row version of `backend` hashes (attention_params.h first), and the
// version from texts given by `text_of` (templates::text in the build; other texts in tests).
std::vector<std::string_view> row_templates(std::string_view backend, RowKind kind, Pass pass);
std::string row_version(std::string_view backend, RowKind kind, Pass pass,
                        const std::function<std::string_view(std::string_view)>& text_of);
}  // namespace detail

// A template's text as a plain kernel sees it: without the branches it does not compile (the
// body of each `#ifdef FLASHJIT_VARIANT` up to its #else, kept, or #endif, and those directives)
// and without the variant fields of the launch parameters (the lines from a
// `// FLASHJIT_VARIANT_FIELDS_BEGIN` line to a `// FLASHJIT_VARIANT_FIELDS_END` line, both
// included), which it compiles but never reads.
std::string plain_kernel_text(std::string_view text);
// The backends with a template folder (and so a version) of their own: the first field of their
// devices' strings ("cuda|...").
inline constexpr std::array<std::string_view, 3> kTemplateBackends = {"cuda", "hip", "cpu"};
// "cuda fwd <version> bwd <version>, hip ..., cpu ...": the plain rows' versions, as
// `flashjit --version` and `db ls` print them.
std::string backend_generator_versions();

}  // namespace flashjit
