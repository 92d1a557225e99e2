#include "generator/render.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "generator/backward_config.hpp"
#include "generator/block_mask.hpp"
#include "generator/cpu_config.hpp"
#include "generator/hip_config.hpp"
#include "generator/knobs.hpp"
#include "generator/render_decode.hpp"
#include "generator/template_files.hpp"
#include "generator/variant.hpp"
#include "templates/embedded.hpp"

namespace flashjit {

namespace {

// Bump when the generator's output changes in a way the template texts do not show.
constexpr int kGeneratorEpoch = 1;

uint64_t fnv1a(std::string_view text, uint64_t hash = 1469598103934665603ull) {
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

std::string hex16(uint64_t hash) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return std::string(hex);
}

// Preconditions the template states as static_asserts, checked here first so that a bad
// config is a clear error instead of a compile log.
Status check_template_constraints(const AttentionProblem& problem, const AttentionConfig& config) {
  // A device with no limits to speak of: only the template's own constraints can fail. The wgmma
  // and ws families exist for sm90 only: the one architecture their constraints accept.
  return check_config(config, problem,
                      knobs::unlimited_device(config.family != KernelFamily::Mma ? 90 : 0));
}

// The same for the HIP templates: an AMD device with no limits to speak of.
Status check_hip_template_constraints(const AttentionProblem& problem,
                                      const AttentionConfig& config) {
  return check_hip_config(config, problem, knobs::unlimited_device(0, "gfx90a"));
}

}  // namespace

namespace {

// The decode family's templates (cuda/decode.cuh, cpu/decode.hpp, ...: a backend folder's
// decode.*): no prefill kernel (forward or backward) is compiled from them.
bool is_decode_template(std::string_view path) {
  const size_t slash = path.rfind('/');
  const std::string_view name = slash == std::string_view::npos ? path : path.substr(slash + 1);
  return slash != std::string_view::npos && name.substr(0, name.find('.')) == "decode";
}

// The scheme before per-pass versions (rows stamped with it are re-stamped:
// legacy_row_versions_of): the hash of the epoch and of every template of `backend` ("": all of
// them). Plain: as plain_kernel_text sees them, the variant header left out. Without decode: the
// decode family's templates left out.
std::string legacy_version_of_templates(std::string_view backend, bool plain, bool with_decode) {
  uint64_t hash = fnv1a("epoch " + std::to_string(kGeneratorEpoch));
  if (!backend.empty()) hash = fnv1a(backend, hash);
  if (plain) hash = fnv1a("plain", hash);
  if (!with_decode) hash = fnv1a("prefill", hash);
  int count = 0;
  const std::string_view* paths = templates::paths(&count);
  for (int i = 0; i < count; ++i) {
    const std::string_view path = paths[i];
    const size_t slash = path.find('/');
    const bool shared = slash == std::string_view::npos;
    if (!backend.empty() && !shared && path.substr(0, slash) != backend) continue;
    if (plain && path == kVariantHeader) continue;
    if (!with_decode && is_decode_template(path)) continue;
    // Checks (checks/: the decode table check, issue 33) are no kernel's source and came after
    // this scheme: left out, so that adding one does not change a version rows carry.
    if (path.substr(0, 7) == "checks/") continue;
    // Nor is the block-map builder (issue 31, launched beside the kernels), which came after too.
    if (path == "cuda/block_mask.cuh") continue;
    hash = fnv1a(path, hash);
    hash = fnv1a(plain ? plain_kernel_text(templates::text(path)) : templates::text(path), hash);
  }
  return hex16(hash);
}

}  // namespace

namespace detail {

std::vector<std::string_view> row_templates(std::string_view backend, RowKind kind, Pass pass) {
  using template_files::Use;
  std::vector<std::string_view> files = {"attention_params.h"};
  if (kind == RowKind::Variant) files.push_back(kVariantHeader);
  // A mask_mod's block map decides which tiles the CUDA variant kernels visit: its builder
  // (launched beside them, generator/block_mask.hpp) is part of their rows' version.
  if (kind == RowKind::Variant && backend == "cuda") files.push_back("cuda/block_mask.cuh");
  const Use use = pass == Pass::Backward ? Use::Backward : Use::Forward;
  for (const template_files::Family* family : template_files::kFamilies) {
    if (family->backend != backend) continue;
    if (family->use != use && !(kind == RowKind::Decode && family->use == Use::Decode)) continue;
    for (const char* file : family->files)
      if (std::find(files.begin(), files.end(), file) == files.end()) files.push_back(file);
  }
  return files;
}

std::string row_version(std::string_view backend, RowKind kind, Pass pass,
                        const std::function<std::string_view(std::string_view)>& text_of) {
  static constexpr const char* kKindTags[] = {"plain", "variant", "decode"};
  uint64_t hash = fnv1a("epoch " + std::to_string(kGeneratorEpoch) + " rows by pass");
  hash = fnv1a(backend, hash);
  hash = fnv1a(kKindTags[static_cast<int>(kind)], hash);
  hash = fnv1a(to_string(pass), hash);
  const std::vector<std::string_view> files = row_templates(backend, kind, pass);
  // In the embedded order (stable), whatever the order of the families' lists.
  int count = 0;
  const std::string_view* paths = templates::paths(&count);
  for (int i = 0; i < count; ++i) {
    const std::string_view path = paths[i];
    if (std::find(files.begin(), files.end(), path) == files.end()) continue;
    hash = fnv1a(path, hash);
    hash = fnv1a(
        kind == RowKind::Variant ? std::string(text_of(path)) : plain_kernel_text(text_of(path)),
        hash);
  }
  return hex16(hash);
}

}  // namespace detail

std::string plain_kernel_text(std::string_view text) {
  // Per open conditional: whether it is an `#ifdef FLASHJIT_VARIANT` and whether its current
  // branch is the variant's (dropped).
  struct Open {
    bool variant;
    bool dropping;
  };
  std::vector<Open> open;
  bool in_variant_fields = false;  // between the FLASHJIT_VARIANT_FIELDS_ markers
  std::string out;
  out.reserve(text.size());
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    end = end == std::string_view::npos ? text.size() : end + 1;
    const std::string_view line = text.substr(begin, end - begin);
    begin = end;
    const size_t first = line.find_first_not_of(" \t");
    if (line.find("// FLASHJIT_VARIANT_FIELDS_BEGIN") == first) in_variant_fields = true;
    if (in_variant_fields) {
      if (line.find("// FLASHJIT_VARIANT_FIELDS_END") == first) in_variant_fields = false;
      continue;
    }
    const std::string_view directive = first == std::string_view::npos || line[first] != '#'
                                           ? std::string_view()
                                           : line.substr(first + 1);
    auto is = [&](std::string_view word) {
      const size_t at = directive.find_first_not_of(" \t");
      return at != std::string_view::npos && directive.substr(at, word.size()) == word;
    };
    if (is("ifdef FLASHJIT_VARIANT") &&
        directive.find_first_not_of(" \t\r\n", directive.find("FLASHJIT_VARIANT") + 16) ==
            std::string_view::npos) {
      open.push_back({true, true});
      continue;
    }
    if (is("if")) {  // #if, #ifdef, #ifndef of anything else
      open.push_back({false, false});
    } else if ((is("else") || is("elif")) && !open.empty() && open.back().variant) {
      open.back().dropping = false;  // the plain branch
      continue;
    } else if (is("endif") && !open.empty()) {
      const bool variant = open.back().variant;
      open.pop_back();
      if (variant) continue;
    }
    if (std::none_of(open.begin(), open.end(), [](const Open& o) { return o.dropping; }))
      out += line;
  }
  return out;
}

const std::string& generator_version() {
  static const std::string version = legacy_version_of_templates("", false, true);
  return version;
}

namespace {

// Index of the device string's backend in kTemplateBackends; -1 for none of them.
int backend_index(std::string_view device) {
  const std::string_view backend = device.substr(0, device.find('|'));
  for (size_t i = 0; i < kTemplateBackends.size(); ++i)
    if (backend == kTemplateBackends[i]) return static_cast<int>(i);
  return -1;
}

// The row versions of `device`'s backend (generator_version() for another backend).
const std::string& backend_version(std::string_view device, RowKind kind, Pass pass) {
  // [backend][kind][pass]; decode rows are forward rows (the backward entry repeats them).
  using Versions = std::array<std::array<std::array<std::string, 2>, 3>, kTemplateBackends.size()>;
  static const Versions versions = [] {
    Versions each;
    auto text = [](std::string_view path) { return templates::text(path); };
    for (size_t i = 0; i < kTemplateBackends.size(); ++i)
      for (RowKind k : {RowKind::Plain, RowKind::Variant, RowKind::Decode})
        for (Pass p : {Pass::Forward, Pass::Backward})
          each[i][static_cast<int>(k)][static_cast<int>(p)] = detail::row_version(
              kTemplateBackends[i], k, k == RowKind::Decode ? Pass::Forward : p, text);
    return each;
  }();
  const int i = backend_index(device);
  return i < 0 ? generator_version() : versions[i][static_cast<int>(kind)][static_cast<int>(pass)];
}

}  // namespace

const std::string& generator_version_of(std::string_view device, Pass pass) {
  return backend_version(device, RowKind::Plain, pass);
}

const std::string& variant_generator_version_of(std::string_view device, Pass pass) {
  return backend_version(device, RowKind::Variant, pass);
}

const std::string& decode_generator_version_of(std::string_view device) {
  return backend_version(device, RowKind::Decode, Pass::Forward);
}

const LegacyRowVersions& legacy_row_versions_of(std::string_view device) {
  using Legacy = std::array<LegacyRowVersions, kTemplateBackends.size()>;
  static const Legacy legacy = [] {
    Legacy each;
    for (size_t i = 0; i < kTemplateBackends.size(); ++i) {
      const std::string_view backend = kTemplateBackends[i];
      each[i].plain = legacy_version_of_templates(backend, /*plain=*/true, /*with_decode=*/false);
      each[i].variant = legacy_version_of_templates(backend, false, false);
      each[i].decode = legacy_version_of_templates(backend, true, true);
    }
    return each;
  }();
  static const LegacyRowVersions other{generator_version(), generator_version(),
                                       generator_version()};
  const int i = backend_index(device);
  return i < 0 ? other : legacy[i];
}

std::string backend_generator_versions() {
  std::string text;
  for (std::string_view backend : kTemplateBackends) {
    const std::string prefix = std::string(backend) + "|";
    if (!text.empty()) text += ", ";
    text += backend;
    text += " fwd ";
    text += generator_version_of(prefix, Pass::Forward);
    text += " bwd ";
    text += generator_version_of(prefix, Pass::Backward);
  }
  return text;
}

namespace detail {

// The parts every backend's source shares: a header line naming what it is, the params struct,
// the template texts in order, then the backend's own instantiation.
Result<KernelSource> assemble(const template_files::Family& family,
                              std::vector<std::string> entries, const char* kind,
                              const AttentionProblem& problem, const AttentionConfig& config,
                              const std::string& instantiation, bool block_mask) {
  const std::string_view params = templates::text("attention_params.h");
  if (params.empty())
    return make_error(ErrorCode::Unsupported, "attention_params.h is not embedded in this build");
  std::string kernel;
  for (const char* path : family.files) {
    const std::string_view part = templates::text(path);
    if (part.empty())
      return make_error(ErrorCode::Unsupported,
                        std::string(path) + " is not embedded in this build");
    kernel += std::string(part) + "\n";
  }
  // "" for plain attention: its sources are exactly those of before variants.
  Result<std::string> variant = render_variant_prelude(problem, block_mask);
  if (!variant.ok()) return variant.error();
  KernelSource source;
  source.entries = std::move(entries);
  source.label = std::string(kind) + " d" + std::to_string(problem.head_dim) + " " +
                 to_string(problem.dtype) + (problem.causal ? " causal " : " ") +
                 config.to_string();
  if (problem.variant.active()) {  // appended: gcc 12 warns falsely (-Wrestrict)
    source.label += " ";
    source.label += problem.variant.key();
  }
  std::ostringstream text;
  // The version of the plain rows of this kernel's pass (a variant's source is the plain one's
  // with its prelude: the same line).
  const std::string device = std::string(family.backend) + "|";
  const std::string& version = family.use == template_files::Use::Decode
                                   ? decode_generator_version_of(device)
                                   : generator_version_of(device, problem.pass);
  text << "// flashjit " << source.label << " (generator " << version << ")\n"
       << params << "\n"
       << *variant << kernel << "// ---- instantiation ----\n"
       << instantiation;
  source.text = text.str();
  source.block_mask = block_mask;
  return source;
}

}  // namespace detail

namespace {

// A CUDA forward or backward source as its family compiles and launches it: the sm90 families
// for sm_90a alone (wgmma), the -ws family's main entries taking the TMA tensor maps too.
Result<KernelSource> for_family(KernelFamily family, Result<KernelSource> source) {
  if (source.ok()) {
    source->arch_specific = family == KernelFamily::Wgmma || family == KernelFamily::Ws;
    source->tensor_maps = family == KernelFamily::Ws;
  }
  return source;
}

}  // namespace

using detail::assemble;
using detail::gpu_tile_arguments;

namespace {

// The -ws family: its pieces (templates/cuda/ws/) and an entry taking the tensor maps too.
Result<KernelSource> render_cuda_attention_ws(const AttentionProblem& problem,
                                              const AttentionConfig& config) {
  const bool block_mask = block_mask_applies(problem, config);  // a third parameter
  std::ostringstream instantiation;
  instantiation << "typedef flashjit_kernel::WsTraits<" << gpu_tile_arguments(problem, config)
                << ", /*pingpong=*/" << (config.pingpong ? "true" : "false") << ", /*persistent=*/"
                << (config.persistent ? "true" : "false") << "> Config;\n"
                << "extern \"C\" __global__ void __launch_bounds__(Config::kThreads, "
                   "Config::kCtasPerSm)\n"
                << kAttentionForwardEntry
                << "(const __grid_constant__ FlashjitAttentionParams params,\n"
                << "    const __grid_constant__ FlashjitForwardTensorMaps maps"
                << (block_mask ? ",\n    const __grid_constant__ FlashjitBlockMask block_mask" : "")
                << ") {\n"
                << "  flashjit_kernel::attention_forward_ws<Config>(params, maps"
                << (block_mask ? ", &block_mask" : "") << ");\n"
                << "}\n";
  return for_family(config.family,
                    assemble(template_files::kCudaWsForward, {kAttentionForwardEntry},
                             "attention_fwd_ws", problem, config, instantiation.str(), block_mask));
}

}  // namespace

Result<KernelSource> render_cuda_attention(const AttentionProblem& problem,
                                           const AttentionConfig& config) {
  if (problem.is_backward()) return render_cuda_attention_backward(problem, config);
  if (config.family == KernelFamily::Decode) return render_cuda_decode(problem, config);
  FLASHJIT_TRY(validate(problem));
  FLASHJIT_TRY(check_template_constraints(problem, config));
  if (config.family == KernelFamily::Ws) return render_cuda_attention_ws(problem, config);
  const bool wgmma = config.family == KernelFamily::Wgmma;
  // A mask_mod's block map: a second parameter, passed on by address.
  const bool block_mask = block_mask_applies(problem, config);
  std::ostringstream instantiation;
  instantiation << "typedef flashjit_kernel::" << (wgmma ? "Sm90Traits" : "Traits") << "<"
                << gpu_tile_arguments(problem, config) << "> Config;\n"
                << "extern \"C\" __global__ void __launch_bounds__(Config::kThreads, 1)\n"
                << kAttentionForwardEntry
                << "(const __grid_constant__ FlashjitAttentionParams params"
                << (block_mask ? ",\n    const __grid_constant__ FlashjitBlockMask block_mask" : "")
                << ") {\n"
                << "  flashjit_kernel::"
                << (wgmma ? (problem.variant.varlen ? "attention_forward_sm90_varlen"
                                                    : "attention_forward_sm90")
                    : problem.variant.varlen ? "attention_forward_varlen"
                                             : "attention_forward")
                << "<Config>(params" << (block_mask ? ", &block_mask" : "") << ");\n"
                << "}\n";
  return for_family(
      config.family,
      wgmma ? assemble(template_files::kCudaWgmmaForward, {kAttentionForwardEntry},
                       "attention_fwd_sm90", problem, config, instantiation.str(), block_mask)
            : assemble(template_files::kCudaMmaForward, {kAttentionForwardEntry}, "attention_fwd",
                       problem, config, instantiation.str(), block_mask));
}

Result<KernelSource> render_hip_attention(const AttentionProblem& problem,
                                          const AttentionConfig& config) {
  if (problem.is_backward()) return render_hip_attention_backward(problem, config);
  if (config.family == KernelFamily::Decode) return render_hip_decode(problem, config);
  FLASHJIT_TRY(validate(problem));
  FLASHJIT_TRY(check_hip_template_constraints(problem, config));
  std::ostringstream instantiation;
  instantiation << "typedef flashjit_hip::Traits<" << gpu_tile_arguments(problem, config, "waves")
                << "> Config;\n"
                << "extern \"C\" __global__ void __launch_bounds__(Config::kThreads)\n"
                << kAttentionForwardEntry << "(FlashjitAttentionParams params) {\n"
                << "  flashjit_hip::"
                << (problem.variant.active() ? "attention_forward_variant" : "attention_forward")
                << "<Config>(params);\n"
                << "}\n";
  return assemble(template_files::kHipForward, {kAttentionForwardEntry}, "attention_fwd_hip",
                  problem, config, instantiation.str());
}

namespace detail {

std::string gpu_tile_arguments(const AttentionProblem& problem, const AttentionConfig& config,
                               const char* warps) {
  std::ostringstream out;
  out << "/*head_dim=*/" << problem.head_dim << ", /*block_m=*/" << config.block_m
      << ", /*block_n=*/" << config.block_n << ", /*" << warps << "=*/" << config.warps
      << ", /*stages=*/" << config.stages << ", /*bf16=*/"
      << (problem.dtype == DType::BF16 ? "true" : "false") << ", /*causal=*/"
      << (problem.causal ? "true" : "false");
  return out.str();
}

// "</*head_dim=*/128, /*block_m=*/64, /*block_n=*/64, /*storage=*/flashjit_cpu::kBF16,
// /*causal=*/false>": the parameters of both CPU templates' traits; the backward's add
// ", /*fused_dq=*/true" (DqMode::Atomic) before the ">".
std::string cpu_traits_arguments(const AttentionProblem& problem, const AttentionConfig& config) {
  std::ostringstream out;
  out << "</*head_dim=*/" << problem.head_dim << ", /*block_m=*/" << config.block_m
      << ", /*block_n=*/" << config.block_n << ", /*storage=*/"
      << (problem.dtype == DType::BF16  ? "flashjit_cpu::kBF16"
          : problem.dtype == DType::F32 ? "flashjit_cpu::kF32"
                                        : "flashjit_cpu::kF16")
      << ", /*causal=*/" << (problem.causal ? "true" : "false");
  if (problem.is_backward())
    out << ", /*fused_dq=*/" << (config.dq == DqMode::Atomic ? "true" : "false");
  out << ">";
  return out.str();
}

// One CPU entry point: extern "C" int entry(params, work_begin, work_end) calling
// flashjit_cpu::<function>.
std::string cpu_entry(const char* entry, const char* function) {
  // Built by appending: gcc 12 warns falsely (-Wrestrict) on "literal" + std::string&&.
  std::string text = "extern \"C\" int ";
  text += entry;
  text += "(const FlashjitAttentionParams* params, int work_begin, int work_end) {\n";
  text += "  return flashjit_cpu::";
  text += function;
  text += "(*params, work_begin, work_end);\n}\n";
  return text;
}

}  // namespace detail

using detail::cpu_entry;
using detail::cpu_traits_arguments;

Result<KernelSource> render_cpu_attention(const AttentionProblem& problem,
                                          const AttentionConfig& config) {
  if (problem.is_backward()) return render_cpu_attention_backward(problem, config);
  if (config.family == KernelFamily::Decode) return render_cpu_decode(problem, config);
  FLASHJIT_TRY(validate(problem));
  // A CPU with no cache limit to speak of: only the template's own constraints can fail.
  FLASHJIT_TRY(check_cpu_config(config, problem, unlimited_cpu()));
  std::ostringstream instantiation;
  instantiation << "typedef flashjit_cpu::Traits" << cpu_traits_arguments(problem, config)
                << " Config;\n"
                << cpu_entry(kCpuAttentionForwardEntry, "Kernel<Config>::run");
  return assemble(template_files::kCpuForward, {kCpuAttentionForwardEntry}, "attention_fwd_cpu",
                  problem, config, instantiation.str());
}

// ---- the backward pass ----------------------------------------------------------------------

namespace {

// The ws family's backward (cuda/ws/attention_bwd_ws.cuh): the preprocess, the fused kernel in
// the dK/dV entry (taking the tensor maps of Q, K, V and dO, in FlashjitForwardTensorMaps' q, k,
// v and o: runtime/tensor_map_spec.hpp's backward_tensor_map_specs), the convert. Plain
// attention only (the budget leaves variants to the other families).
Result<KernelSource> render_cuda_attention_backward_ws(const AttentionProblem& problem,
                                                       const AttentionConfig& config) {
  std::string row_args = "<";
  row_args += std::to_string(problem.head_dim);
  row_args += problem.dtype == DType::BF16 ? ", true>" : ", false>";
  const char* params = "(const __grid_constant__ FlashjitAttentionParams params) {\n";
  std::ostringstream instantiation;
  instantiation
      << "typedef flashjit_kernel::WsBwdTraits<" << gpu_tile_arguments(problem, config)
      << ", /*dq_atomic=*/true, /*persistent=*/" << (config.persistent ? "true" : "false")
      << (config.pingpong ? ", /*pingpong=*/true" : "") << "> Config;\n"
      << "extern \"C\" __global__ void __launch_bounds__(flashjit_kernel::kBackwardThreads)\n"
      << kBackwardPreprocessEntry << params << "  flashjit_kernel::backward_preprocess" << row_args
      << "(params);\n}\n"
      << "extern \"C\" __global__ void __launch_bounds__(Config::kThreads, 1)\n"
      << kBackwardDkDvEntry << "(const __grid_constant__ FlashjitAttentionParams params,\n"
      << "    const __grid_constant__ FlashjitForwardTensorMaps maps) {\n"
      << "  flashjit_kernel::attention_backward_ws_dkdv<Config>(params, maps);\n}\n"
      << "extern \"C\" __global__ void __launch_bounds__(flashjit_kernel::kBackwardThreads)\n"
      << kBackwardDqEntry << params << "  flashjit_kernel::backward_dq_convert" << row_args
      << "(params);\n}\n";
  return for_family(config.family,
                    assemble(template_files::kCudaWsBackward,
                             {kBackwardPreprocessEntry, kBackwardDkDvEntry, kBackwardDqEntry},
                             "attention_bwd_ws", problem, config, instantiation.str()));
}

}  // namespace

Result<KernelSource> render_cuda_attention_backward(const AttentionProblem& problem,
                                                    const AttentionConfig& config) {
  FLASHJIT_TRY(validate(problem));
  FLASHJIT_TRY(check_backward_template(config, problem));
  if (config.family == KernelFamily::Ws) return render_cuda_attention_backward_ws(problem, config);
  // Each family's template defines a traits template with these parameters and two device
  // functions over it: <prefix>_dkdv and <prefix>_dq (the DqMode::Separate dQ kernel). The row
  // kernels (preprocess, the Atomic mode's convert) are cuda/attention_bwd_common.cuh's.
  const bool wgmma = config.family == KernelFamily::Wgmma;
  const char* traits = wgmma ? "Sm90BwdTraits" : "BwdTraits";
  const char* prefix = wgmma ? "attention_backward_sm90" : "attention_backward";
  // Appended piecewise: gcc 12 warns (-Wrestrict, a false positive) on "literal" + string&&.
  std::string row_args = "<";
  row_args += std::to_string(problem.head_dim);
  row_args += problem.dtype == DType::BF16 ? ", true>" : ", false>";
  const char* params = "(const __grid_constant__ FlashjitAttentionParams params) {\n";
  // Packed documents: each kernel's *_varlen entry, which runs it on the document's view of the
  // params (templates/attention_variant.h, document_tile_view).
  const char* view = problem.variant.varlen ? "_varlen" : "";
  // A mask_mod's block map: a second parameter of the dK/dV and dQ kernels, passed on by address.
  const bool block_mask = block_mask_applies(problem, config);
  const char* masked_params = block_mask
                                  ? "(const __grid_constant__ FlashjitAttentionParams params,\n"
                                    "    const __grid_constant__ FlashjitBlockMask block_mask) {\n"
                                  : params;
  const char* mask_arg = block_mask ? ", &block_mask" : "";
  std::ostringstream instantiation;
  instantiation
      << "typedef flashjit_kernel::" << traits << "<" << gpu_tile_arguments(problem, config)
      << ", /*dq_atomic=*/" << (config.dq == DqMode::Atomic ? "true" : "false") << "> Config;\n"
      << "extern \"C\" __global__ void __launch_bounds__(flashjit_kernel::kBackwardThreads)\n"
      << kBackwardPreprocessEntry << params << "  flashjit_kernel::backward_preprocess" << view
      << row_args << "(params);\n}\n"
      << "extern \"C\" __global__ void __launch_bounds__(Config::kThreads, 1)\n"
      << kBackwardDkDvEntry << masked_params << "  flashjit_kernel::" << prefix << "_dkdv" << view
      << "<Config>(params" << mask_arg << ");\n}\n";
  if (config.dq == DqMode::Atomic) {
    instantiation
        << "extern \"C\" __global__ void __launch_bounds__(flashjit_kernel::kBackwardThreads)\n"
        << kBackwardDqEntry << params << "  flashjit_kernel::backward_dq_convert" << view
        << row_args << "(params);\n}\n";
  } else {
    instantiation << "extern \"C\" __global__ void __launch_bounds__(Config::kDqThreads, 1)\n"
                  << kBackwardDqEntry << masked_params << "  flashjit_kernel::" << prefix << "_dq"
                  << view << "<Config>(params" << mask_arg << ");\n}\n";
  }
  const std::vector<std::string> entries = {kBackwardPreprocessEntry, kBackwardDkDvEntry,
                                            kBackwardDqEntry};
  return for_family(
      config.family,
      wgmma ? assemble(template_files::kCudaWgmmaBackward, entries, "attention_bwd_sm90", problem,
                       config, instantiation.str(), block_mask)
            : assemble(template_files::kCudaMmaBackward, entries, "attention_bwd", problem, config,
                       instantiation.str(), block_mask));
}

Result<KernelSource> render_hip_attention_backward(const AttentionProblem& problem,
                                                   const AttentionConfig& config) {
  FLASHJIT_TRY(validate(problem));
  FLASHJIT_TRY(check_hip_template_constraints(problem, config));
  // templates/hip/attention_bwd.hpp: the row kernels (hip/attention_bwd_common.hpp) take
  // <head_dim, bf16>, the dK/dV and dQ kernels a BwdTraits; each entry is bounded to the threads it
  // is launched with (hip_backward_shapes), so that hipRTC may give each lane the registers those
  // waves leave.
  const bool bf16 = problem.dtype == DType::BF16;
  std::string row_args = "<";  // appended: gcc 12 warns falsely (-Wrestrict) on "<" + string
  row_args += std::to_string(problem.head_dim);
  row_args += bf16 ? ", true>" : ", false>";
  const char* params = "(FlashjitAttentionParams params) {\n";
  // A variant's dK/dV and dQ kernels enter through their *_variant entries (the variant's softmax
  // factor, packed documents' views); its row kernels are the plain ones but for packed documents
  // (their *_varlen entries).
  const char* entry = problem.variant.active() ? "_variant" : "";
  const char* rows = problem.variant.varlen ? "_varlen" : "";
  std::ostringstream instantiation;
  instantiation
      << "typedef flashjit_hip::BwdTraits<" << gpu_tile_arguments(problem, config, "waves")
      << ", /*dq_atomic=*/" << (config.dq == DqMode::Atomic ? "true" : "false") << "> Config;\n"
      << "extern \"C\" __global__ void __launch_bounds__(flashjit_hip::kBackwardThreads)\n"
      << kBackwardPreprocessEntry << params << "  flashjit_hip::backward_preprocess" << rows
      << row_args << "(params);\n}\n"
      << "extern \"C\" __global__ void __launch_bounds__(Config::kThreads)\n"
      << kBackwardDkDvEntry << params << "  flashjit_hip::attention_backward_dkdv" << entry
      << "<Config>(params);\n}\n";
  if (config.dq == DqMode::Atomic) {
    instantiation
        << "extern \"C\" __global__ void __launch_bounds__(flashjit_hip::kBackwardThreads)\n"
        << kBackwardDqEntry << params << "  flashjit_hip::backward_dq_convert" << rows << row_args
        << "(params);\n}\n";
  } else {
    instantiation << "extern \"C\" __global__ void __launch_bounds__(Config::kDqThreads)\n"
                  << kBackwardDqEntry << params << "  flashjit_hip::attention_backward_dq" << entry
                  << "<Config>(params);\n}\n";
  }
  return assemble(template_files::kHipBackward,
                  {kBackwardPreprocessEntry, kBackwardDkDvEntry, kBackwardDqEntry},
                  "attention_bwd_hip", problem, config, instantiation.str());
}

Result<KernelSource> render_cpu_attention_backward(const AttentionProblem& problem,
                                                   const AttentionConfig& config) {
  FLASHJIT_TRY(validate(problem));
  // A CPU with no cache limit to speak of: only the template's own constraints can fail.
  FLASHJIT_TRY(check_cpu_config(config, problem, unlimited_cpu()));
  std::ostringstream instantiation;
  instantiation << "typedef flashjit_cpu::BwdTraits" << cpu_traits_arguments(problem, config)
                << " Config;\n"
                << cpu_entry(kCpuBackwardPreprocessEntry, "Backward<Config>::preprocess")
                << cpu_entry(kCpuBackwardDkDvEntry, "Backward<Config>::dkdv")
                << cpu_entry(kCpuBackwardDqEntry, "Backward<Config>::dq");
  return assemble(template_files::kCpuBackward,
                  {kCpuBackwardPreprocessEntry, kCpuBackwardDkDvEntry, kCpuBackwardDqEntry},
                  "attention_bwd_cpu", problem, config, instantiation.str());
}

}  // namespace flashjit
