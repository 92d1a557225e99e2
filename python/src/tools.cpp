#include "tools.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>

#include "attention.hpp"
#include "generator/config.hpp"
#include "generator/device.hpp"
#include "generator/render.hpp"
#include "runtime/cpu/cpu_info.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "runtimes.hpp"
#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/clang_jit.hpp"
#endif

namespace flashjit::python {
namespace {

AttentionProblem make_problem(int64_t batch, int64_t heads, std::optional<int64_t> kv_heads,
                              int64_t seqlen_q, int64_t seqlen_k, int head_dim,
                              const std::string& dtype, bool causal, std::optional<double> scale,
                              const std::string& layout, const std::string& pass,
                              bool deterministic) {
  AttentionProblem problem =
      AttentionProblem::make(batch, heads, kv_heads.value_or(heads), seqlen_q, seqlen_k, head_dim,
                             unwrap(parse_dtype(dtype)), causal, parse_layout(layout));
  if (scale) problem.softmax_scale = static_cast<float>(*scale);
  problem.pass = unwrap(parse_pass(pass));
  if (deterministic && !problem.is_backward()) {
    raise(ErrorCode::InvalidArgument,
          "deterministic = True applies to the backward pass only (pass_='bwd')");
  }
  problem.deterministic = deterministic;
  check(validate(problem));
  return problem;
}

}  // namespace

std::string show(int64_t batch, int64_t heads, std::optional<int64_t> kv_heads, int64_t seqlen_q,
                 int64_t seqlen_k, int head_dim, const std::string& dtype, bool causal,
                 std::optional<double> scale, const std::string& layout,
                 std::optional<std::string> config, std::optional<std::string> arch,
                 const std::string& device, const std::string& pass, bool deterministic) {
  const AttentionProblem problem =
      make_problem(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, dtype, causal, scale,
                   layout, pass, deterministic);
  std::string header = "// flashjit show: " + problem.to_string();
  KernelSource source;
  if (arch) {
    if (*arch == "cpu") {
      raise(ErrorCode::InvalidArgument, "arch = 'cpu': use device='cpu' for the CPU backend");
    }
    const DeviceSpec spec = unwrap(known_device(*arch));
    AttentionConfig chosen;
    std::string from;
    if (!config || *config == "default") {
      chosen = unwrap(default_config(problem, spec));
      from = "default";
    } else {
      chosen = unwrap(AttentionConfig::parse(*config));
      Status legal = check_config(chosen, problem, spec);
      if (!legal.ok()) {
        raise(ErrorCode::InvalidArgument, "config = '" + *config + "' is not legal on " +
                                              spec.arch_name() + ": " + legal.error().message);
      }
      from = "given";
    }
    source = unwrap(render_cuda_attention(problem, chosen));
    header +=
        " | config " + chosen.to_string() + " (" + from + ") | " + spec.arch_name() + " (table)";
  } else {
    const Place place = parse_place(device);
    std::shared_ptr<Runtime> runtime = runtimes().get(place);
    CudaContextGuard guard(place.cuda());
    auto [chosen, from] = resolve_config(*runtime, problem, config);
    source = unwrap(runtime->backend().render(problem, chosen));
    header += " | config " + chosen.to_string() + " (" + from + ") | " + place.to_string() + " " +
              runtime->backend().device().name;
  }
  header += source.entries.size() == 1 ? " | entry " : " | entries ";
  for (size_t i = 0; i < source.entries.size(); ++i) header += (i ? ", " : "") + source.entries[i];
  header += "\n";
  return header + source.text;
}

nb::list devices() {
  nb::list result;
  const int count = cuda::device_count();
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CudaContextGuard guard(true);
    nb::dict entry;
    entry["backend"] = "cuda";
    entry["device"] = "cuda:" + std::to_string(ordinal);
    Result<DeviceSpec> spec = cuda::query_device(ordinal);
    if (!spec.ok()) {
      entry["error"] = spec.error().describe();
      result.append(entry);
      continue;
    }
    entry["name"] = spec->name;
    entry["arch"] = spec->arch_name();
    entry["sm_count"] = spec->sm_count;
    entry["smem_per_block_optin"] = spec->smem_per_block_optin;
    entry["l2_bytes"] = spec->l2_bytes;
    if (auto backend = cuda::CudaBackend::create(ordinal); backend.ok()) {
      entry["fingerprint"] = (*backend)->fingerprint().to_string();
    }
    entry["compiler"] = cuda::nvrtc_version();
    result.append(entry);
  }
  const CpuSpec host = cpu::host_cpu();
  nb::dict entry;
  entry["backend"] = "cpu";
  entry["device"] = "cpu";
  entry["name"] = host.model;
  entry["cores"] = host.cores;
  entry["l1d_bytes"] = host.l1d_bytes;
  entry["l2_bytes"] = host.l2_bytes;
  entry["l3_bytes"] = host.l3_bytes;
  entry["isa"] = host.isa();
  entry["available"] = have_cpu_backend();
  if (have_cpu_backend()) {
    if (auto backend = create_backend("cpu"); backend.ok()) {
      entry["fingerprint"] = (*backend)->fingerprint().to_string();
    } else {
      entry["available"] = false;
      entry["error"] = backend.error().describe();
    }
#if FLASHJIT_HAVE_CPU_BACKEND
    entry["compiler"] = cpu::clang_version();
#endif
  } else {
    entry["error"] = "no CPU backend in this build (LLVM/Clang 14 not found when it was built)";
  }
  result.append(entry);
  return result;
}

}  // namespace flashjit::python
