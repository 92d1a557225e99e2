// The `flashjit` command line (cli/commands.hpp): plan, show, compile and run attention kernels,
// list devices, and the dispatch to tune, db and report.
//
// Exit status: 0 success; 1 the work failed (a compile, a launch); 2 a usage error (bad flag or
// value, invalid problem) or no device where one is needed.
#include "cli/commands.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/args.hpp"
#include "cli/db_command.hpp"
#include "cli/devices_command.hpp"
#include "cli/report_command.hpp"
#include "cli/tune_command.hpp"
#include "generator/backward_config.hpp"
#include "generator/config.hpp"
#include "generator/cpu_config.hpp"
#include "generator/device.hpp"
#include "generator/error.hpp"
#include "generator/hip_config.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "generator/variant.hpp"
#include "runtime/backend.hpp"
#include "runtime/cpu/cpu_info.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/clang_jit.hpp"
#include "runtime/cpu/cpu_backend.hpp"
#endif
#if FLASHJIT_HAVE_HIP_BACKEND
#include "runtime/hip/hip_backend.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"
#endif
#include "runtime/runtime.hpp"
#include "tuner/workload.hpp"

// Keep in step with project(VERSION) in CMakeLists.txt; the build defines it.
#ifndef FLASHJIT_VERSION
#define FLASHJIT_VERSION "0.1.0"
#endif

namespace flashjit::cli {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// Prints `error` as one line (plus the compile log, if any) and returns the exit status.
int report(std::string_view command, const Error& error) {
  std::string prefix = command.empty() ? "flashjit: " : "flashjit " + std::string(command) + ": ";
  if (error.code == ErrorCode::NoDevice) {
    std::cerr << prefix << "no device: " << error.message << "\n";
  } else {
    std::cerr << prefix << error.describe() << "\n";
  }
  bool usage = error.code == ErrorCode::InvalidArgument || error.code == ErrorCode::NoDevice;
  return usage ? kExitUsage : kExitFailed;
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

// AMD device `ordinal` through HIP (Unsupported in a build without the HIP backend).
Result<DeviceSpec> query_hip_device(int ordinal) {
#if FLASHJIT_HAVE_HIP_BACKEND
  return hip::query_device(ordinal);
#else
  (void)ordinal;
  return make_error(ErrorCode::Unsupported,
                    "built without the HIP backend (ROCm headers not found at build time)");
#endif
}

// The device a command plans for: --arch (table), --device N (driver: CUDA, or HIP with
// --backend hip), else device 0 of CUDA, then of HIP, if any.
Result<DeviceSpec> resolve_device(const ParsedFlags& flags) {
  auto table = table_device_from_flags(flags);
  FLASHJIT_TRY(table);
  if (*table) return **table;
  auto ordinal = integer_flag(flags, "device", -1, 0, 1023);
  FLASHJIT_TRY(ordinal);
  const std::string backend = flags.get("backend").value_or(default_backend_name());
  if (backend == "hip") return query_hip_device(*ordinal >= 0 ? static_cast<int>(*ordinal) : 0);
  if (*ordinal >= 0) return cuda::query_device(static_cast<int>(*ordinal));
  if (cuda::device_count() > 0) return cuda::query_device(0);
  if (backend == "auto" && gpu_device_count("hip") > 0) return query_hip_device(0);
  return make_error(ErrorCode::InvalidArgument, "no GPU (CUDA: " + no_device_reason() +
                                                    "); pass --arch (one of " +
                                                    join(known_archs(), ", ") + ")");
}

std::string device_summary(const DeviceSpec& device) {
  return device.name + " (" + device.arch_name() + ", " + std::to_string(device.sm_count) +
         (device.is_cpu()   ? " cores)"
          : device.is_amd() ? " CUs)"
                            : " SMs)");
}

// "entry flashjit_attention_fwd", or "entries a, b, c" for a source with several (the backward).
std::string entries_text(const KernelSource& source) {
  std::string text = source.entries.size() == 1 ? "entry " : "entries ";
  text += join(source.entries, ", ");
  return text;
}

// The generator's functions for the template that runs on `device`: the HIP template's on AMD,
// the CUDA template's otherwise (table devices have no backend object to ask).
Result<AttentionConfig> default_for(const AttentionProblem& problem, const DeviceSpec& device) {
  return device.is_amd() ? default_hip_config(problem, device) : default_config(problem, device);
}
Status check_for(const AttentionConfig& config, const AttentionProblem& problem,
                 const DeviceSpec& device) {
  return device.is_amd() ? check_hip_config(config, problem, device)
                         : check_config(config, problem, device);
}
Result<KernelSource> render_for(const AttentionProblem& problem, const AttentionConfig& config,
                                const DeviceSpec& device) {
  return device.is_amd() ? render_hip_attention(problem, config)
                         : render_cuda_attention(problem, config);
}

// What choosing a config needs of a target (a GPU or this CPU): its default, its template (does
// it render the config?) and its budget (is the config legal there?).
struct ConfigTarget {
  std::string name;  // "sm_90", "this CPU": for the warning
  std::function<Result<AttentionConfig>(const AttentionProblem&)> default_config;
  std::function<Status(const AttentionProblem&, const AttentionConfig&)> renders;
  std::function<Status(const AttentionConfig&, const AttentionProblem&)> legal;
};

ConfigTarget gpu_target(const DeviceSpec& device) {
  return {device.arch_name(),
          [&device](const AttentionProblem& problem) { return default_for(problem, device); },
          [&device](const AttentionProblem& problem, const AttentionConfig& config) -> Status {
            FLASHJIT_TRY(render_for(problem, config, device));
            return ok_status();
          },
          [&device](const AttentionConfig& config, const AttentionProblem& problem) {
            return check_for(config, problem, device);
          }};
}

ConfigTarget cpu_target(const CpuSpec& cpu) {
  return {"this CPU",
          [&cpu](const AttentionProblem& problem) { return default_cpu_config(problem, cpu); },
          [](const AttentionProblem& problem, const AttentionConfig& config) -> Status {
            FLASHJIT_TRY(render_cpu_attention(problem, config));
            return ok_status();
          },
          [&cpu](const AttentionConfig& config, const AttentionProblem& problem) {
            return check_cpu_config(config, problem, cpu);
          }};
}

// The config to use: --config, else the target's default. A --config the template rejects is an
// error; one that only exceeds the target's budget gets a warning on stderr, so that its source
// and compile report can still be looked at.
Result<AttentionConfig> choose_config(const ParsedFlags& flags, const AttentionProblem& problem,
                                      const ConfigTarget& target, std::string_view command) {
  auto given = config_from_flags(flags);
  FLASHJIT_TRY(given);
  if (!*given) {
    Result<AttentionConfig> def = target.default_config(problem);
    if (def.ok()) FLASHJIT_TRY(apply_splits_flag(flags, *def));
    return def;
  }
  FLASHJIT_TRY(apply_splits_flag(flags, **given));
  FLASHJIT_TRY(target.renders(problem, **given));
  Status legal = target.legal(**given, problem);
  if (!legal.ok()) {
    std::cerr << "flashjit " << command << ": warning: " << (*given)->to_string()
              << " is not legal on " << target.name << ": " << legal.error().message << "\n";
  }
  return **given;
}

// True when a planning command (plan, show) is for the CPU: --arch cpu, --backend cpu, or
// --backend auto (the default) with no --arch/--device and no GPU.
Result<bool> plans_for_cpu(const ParsedFlags& flags) {
  if (flags.get("arch") == std::optional<std::string>("cpu")) {
    if (flags.has("device")) {
      return make_error(ErrorCode::InvalidArgument, "--arch and --device exclude each other");
    }
    return true;
  }
  const std::string backend = flags.get("backend").value_or(default_backend_name());
  if (backend == "cpu") return true;
  if (backend == "cuda" || backend == "hip") return false;
  if (backend != "auto") {
    return make_error(ErrorCode::InvalidArgument,
                      "--backend = '" + backend + "': allowed: auto, cuda, hip, cpu");
  }
  if (flags.has("arch") || flags.has("device")) return false;
  return cuda::device_count() == 0 && gpu_device_count("hip") == 0;
}

// The problem of `flags` and whether it is planned for the host CPU (plans_for_cpu).
struct PlanTarget {
  AttentionProblem problem;
  bool on_cpu = false;
};
Result<PlanTarget> plan_target(const ParsedFlags& flags) {
  auto problem = problem_from_flags(flags);
  if (!problem.ok()) return problem.error();
  auto on_cpu = plans_for_cpu(flags);
  if (!on_cpu.ok()) return on_cpu.error();
  return PlanTarget{std::move(problem.value()), on_cpu.value()};
}

// `flashjit show`'s output: a header line on stderr (problem, config, `target`, entries) and
// where --score-mod / --mask-mod landed, the source on stdout.
int print_source(const AttentionProblem& problem, const AttentionConfig& config,
                 const std::string& target, const KernelSource& source) {
  std::cerr << "// flashjit show: " << problem.to_string() << " | config " << config.to_string()
            << " | " << target << " | " << entries_text(source) << "\n";
  std::cerr << describe_expression_lines(source.text);
  std::cout << source.text;
  if (!source.text.empty() && source.text.back() != '\n') std::cout << "\n";
  return kExitOk;
}

int run_plan(const ParsedFlags& flags) {
  auto target = plan_target(flags);
  if (!target.ok()) return report("plan", target.error());
  if (target->on_cpu) {
    std::cout << explain_cpu_plan(target->problem, cpu::host_cpu());
    return kExitOk;
  }
  auto device = resolve_device(flags);
  if (!device.ok()) return report("plan", device.error());
  std::cout << (device->is_amd() ? explain_hip_plan(target->problem, *device)
                                 : explain_plan(target->problem, *device));
  return kExitOk;
}

int run_show(const ParsedFlags& flags) {
  auto target = plan_target(flags);
  if (!target.ok()) return report("show", target.error());
  const AttentionProblem& problem = target->problem;
  if (target->on_cpu) {
    const CpuSpec cpu = cpu::host_cpu();
    auto config = choose_config(flags, problem, cpu_target(cpu), "show");
    if (!config.ok()) return report("show", config.error());
    auto source = render_cpu_attention(problem, *config);
    if (!source.ok()) return report("show", source.error());
    return print_source(problem, *config, "cpu " + cpu.to_string(), *source);
  }
  auto device = resolve_device(flags);
  if (!device.ok()) return report("show", device.error());
  auto config = choose_config(flags, problem, gpu_target(*device), "show");
  if (!config.ok()) return report("show", config.error());
  auto source = render_for(problem, *config, *device);
  if (!source.ok()) return report("show", source.error());
  return print_source(problem, *config, "device " + device_summary(*device), *source);
}

// "1.23": a compile's seconds as `flashjit compile` prints them.
std::string seconds_text(double seconds) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f", seconds);
  return buffer;
}

struct CompileOutcome {
  AttentionConfig config;
  ResourceUse use;
  std::optional<Result<Binary>> binary;  // empty until compiled
};

// `flashjit compile` for an AMD target: hipRTC in worker processes (a target this ROCm does not
// know fails cleanly), resources from the code objects.
int compile_hip(const AttentionProblem& problem, const DeviceSpec& device,
                const std::vector<AttentionConfig>& configs, int jobs) {
#if FLASHJIT_HAVE_HIP_BACKEND
  const std::string target = device.gcn_arch;
  std::cout << "compiling " << configs.size() << " config(s) for " << problem.to_string() << " on "
            << target << " with " << hip::hiprtc_version() << "\n"
            << std::flush;
  std::vector<std::optional<Result<Binary>>> binaries(configs.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < configs.size(); i = next++) {
      auto source = render_hip_attention(problem, configs[i]);
      binaries[i].emplace(source.ok() ? hip::hiprtc_compile(*source, target)
                                      : Result<Binary>(source.error()));
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 0; t < std::min<size_t>(static_cast<size_t>(jobs), configs.size()); ++t)
    threads.emplace_back(worker);
  for (std::thread& thread : threads) thread.join();

  std::printf("%-14s %8s %7s %9s %6s %6s %6s %9s %9s  %s\n", "config", "LDS B", "WGs/CU",
              "est regs", "VGPRs", "AGPRs", "spills", "scratch B", "compile s", "status");
  int failures = 0;
  for (size_t i = 0; i < configs.size(); ++i) {
    // The budget's estimates are the forward's formulas: for the backward only the compiler's
    // numbers (of the worst of its kernels) are shown.
    const bool estimates = !problem.is_backward();
    const HipResourceUse use = hip_resource_use(configs[i], problem, device);
    auto estimate = [&](int value) { return estimates ? std::to_string(value) : std::string("-"); };
    const Result<Binary>& binary = *binaries[i];
    std::string vgprs = "-", agprs = "-", spills = "-", scratch = "-", seconds = "-", status = "ok";
    if (binary.ok()) {
      const hip::CodeObjectResources r = hip::parse_code_object_resources(binary->bytes);
      auto text = [](int value) { return value >= 0 ? std::to_string(value) : std::string("-"); };
      vgprs = text(r.vgprs);
      agprs = text(r.agprs);
      spills = text(r.vgpr_spills);
      scratch = text(r.scratch_bytes);
      seconds = seconds_text(binary->compile_seconds);
    } else {
      ++failures;
      status = "FAILED";
    }
    std::printf("%-14s %8s %7s %9s %6s %6s %6s %9s %9s  %s\n", configs[i].to_string().c_str(),
                estimate(use.lds_bytes).c_str(), estimate(use.blocks_per_cu).c_str(),
                estimate(use.regs_per_lane).c_str(), vgprs.c_str(), agprs.c_str(), spills.c_str(),
                scratch.c_str(), seconds.c_str(), status.c_str());
  }
  std::fflush(stdout);
  for (const std::optional<Result<Binary>>& binary : binaries) {
    if (!binary->ok()) report("compile", binary->error());
  }
  if (failures > 0) {
    std::cerr << "flashjit compile: " << failures << " of " << configs.size()
              << " compile(s) failed\n";
    return kExitFailed;
  }
  return kExitOk;
#else
  (void)problem;
  (void)configs;
  (void)jobs;
  return report("compile", make_error(ErrorCode::Unsupported,
                                      "compiling for " + device.arch_name() +
                                          " needs the HIP backend; this build has none (ROCm "
                                          "headers not found at build time)"));
#endif
}

int run_compile(const ParsedFlags& flags) {
  auto problem = problem_from_flags(flags);
  if (!problem.ok()) return report("compile", problem.error());
  auto device = resolve_device(flags);
  if (!device.ok()) return report("compile", device.error());
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  auto jobs = integer_flag(flags, "jobs", cores, 1, 256);
  if (!jobs.ok()) return report("compile", jobs.error());

  std::vector<AttentionConfig> configs;
  if (flags.has("all")) {
    if (flags.has("config")) {
      return report("compile", make_error(ErrorCode::InvalidArgument,
                                          "--all and --config exclude each other"));
    }
    configs =
        device->is_amd() ? legal_hip_configs(*problem, *device) : legal_configs(*problem, *device);
    if (configs.empty()) {
      return report("compile", make_error(ErrorCode::Unsupported,
                                          "no legal config for " + problem->to_string() + " on " +
                                              device->arch_name()));
    }
  } else {
    auto config = choose_config(flags, *problem, gpu_target(*device), "compile");
    if (!config.ok()) return report("compile", config.error());
    configs.push_back(*config);
  }
  if (device->is_amd()) return compile_hip(*problem, *device, configs, static_cast<int>(*jobs));

  std::vector<CompileOutcome> outcomes;
  for (const AttentionConfig& config : configs) {
    outcomes.push_back({config, resource_use(config, *problem, *device), std::nullopt});
  }
  std::cout << "compiling " << outcomes.size() << " config(s) for " << problem->to_string()
            << " on " << device->arch_name() << " with " << cuda::nvrtc_version() << "\n"
            << std::flush;

  // Separate NVRTC programs compile independently, so a simple work queue over threads.
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < outcomes.size(); i = next++) {
      auto source = render_cuda_attention(*problem, outcomes[i].config);
      if (!source.ok()) {
        outcomes[i].binary.emplace(source.error());
      } else {
        outcomes[i].binary.emplace(cuda::nvrtc_compile(*source, device->arch));
      }
    }
  };
  size_t thread_count = std::min<size_t>(static_cast<size_t>(*jobs), outcomes.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < thread_count; ++t) threads.emplace_back(worker);
  for (std::thread& thread : threads) thread.join();

  // The backward's budget columns: dynamic shared memory of its dK/dV kernel and of its dQ
  // kernel (DqMode::Separate; the Atomic mode's convert kernel has none) and threads per CTA.
  const bool backward = problem->is_backward();
  if (backward) {
    std::printf("%-18s %11s %9s %8s %10s %13s %9s  %s\n", "config", "dK/dV smem", "dQ smem",
                "threads", "ptxas regs", "spill st/ld B", "compile s", "status");
  } else {
    std::printf("%-18s %9s %8s %9s %10s %13s %9s  %s\n", "config", "smem B", "ctas/SM", "est regs",
                "ptxas regs", "spill st/ld B", "compile s", "status");
  }
  int failures = 0;
  for (const CompileOutcome& outcome : outcomes) {
    const Result<Binary>& binary = *outcome.binary;
    std::string ptxas_regs = "-", spills = "-", seconds = "-", status = "ok";
    if (binary.ok()) {
      cuda::PtxasReport ptxas = cuda::parse_ptxas_report(binary->compile_log);
      if (ptxas.registers >= 0) ptxas_regs = std::to_string(ptxas.registers);
      if (ptxas.spill_store_bytes >= 0 || ptxas.spill_load_bytes >= 0) {
        spills =
            std::to_string(ptxas.spill_store_bytes) + "/" + std::to_string(ptxas.spill_load_bytes);
      }
      seconds = seconds_text(binary->compile_seconds);
    } else {
      ++failures;
      status = "FAILED";
    }
    const std::string name = outcome.config.to_string();
    if (backward) {
      const bool separate = outcome.config.dq == DqMode::Separate;
      const std::string dq_smem =
          separate ? std::to_string(backward_dq_smem_bytes(outcome.config, *problem)) : "-";
      std::printf("%-18s %11d %9s %8d %10s %13s %9s  %s\n", name.c_str(),
                  backward_dkdv_smem_bytes(outcome.config, *problem), dq_smem.c_str(),
                  backward_dkdv_threads(outcome.config), ptxas_regs.c_str(), spills.c_str(),
                  seconds.c_str(), status.c_str());
    } else {
      std::printf("%-18s %9d %8d %9d %10s %13s %9s  %s\n", name.c_str(), outcome.use.smem_bytes,
                  outcome.use.ctas_per_sm, outcome.use.regs_per_thread, ptxas_regs.c_str(),
                  spills.c_str(), seconds.c_str(), status.c_str());
    }
  }
  std::fflush(stdout);
  for (const CompileOutcome& outcome : outcomes) {
    if (!outcome.binary->ok()) report("compile", outcome.binary->error());
  }
  if (failures > 0) {
    std::cerr << "flashjit compile: " << failures << " of " << outcomes.size()
              << " compile(s) failed\n";
    return kExitFailed;
  }
  return kExitOk;
}

// Median, min and max of `reps` timings of `work` (one launch sequence each, device time), after
// a warm-up: the first launches pay for module setup and clocks ramping up.
struct Timing {
  double median = 0, min = 0, max = 0;
};

Result<Timing> time_work(const Backend& backend, const std::function<Status()>& work,
                         int64_t reps) {
  for (int i = 0; i < 3; ++i) FLASHJIT_TRY(work());
  FLASHJIT_TRY(backend.synchronize());
  std::vector<double> samples;
  for (int64_t i = 0; i < reps; ++i) {
    auto ms = backend.time_ms(work, 1);
    FLASHJIT_TRY(ms);
    samples.push_back(*ms);
  }
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  const double median = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  return Timing{median, samples.front(), samples.back()};
}

// `flashjit run`: the kernel of the problem's pass (--config, else the runtime's choice) on
// random inputs. The backward needs the forward's o and lse: a forward kernel (the runtime's
// choice) runs first, and its time and forward + backward's are reported too.
int run_run(const ParsedFlags& flags) {
  auto problem = problem_from_flags(flags);
  if (!problem.ok()) return report("run", problem.error());
  auto config = config_from_flags(flags);
  if (!config.ok()) return report("run", config.error());
  auto reps = integer_flag(flags, "reps", 20, 1, 100000);
  if (!reps.ok()) return report("run", reps.error());
  auto ordinal = integer_flag(flags, "device", 0, 0, 1023);
  if (!ordinal.ok()) return report("run", ordinal.error());

  RuntimeOptions options;
  options.device = static_cast<int>(*ordinal);
  if (std::optional<std::string> backend = flags.get("backend")) options.backend = *backend;
  auto runtime = Runtime::create(options);
  if (!runtime.ok()) return report("run", runtime.error());
  const Backend& backend = (*runtime)->backend();
  const bool backward = problem->is_backward();
  const AttentionProblem forward_problem = problem->with_pass(Pass::Forward);

  auto build_start = std::chrono::steady_clock::now();
  if (flags.has("splits") && !*config) {  // the runtime's choice with other splits
    auto selected = (*runtime)->select_config(*problem);
    if (!selected.ok()) return report("run", selected.error());
    *config = selected->first;
  }
  if (*config) {
    Status splits = apply_splits_flag(flags, **config);
    if (!splits.ok()) return report("run", splits.error());
  }
  auto kernel =
      *config ? (*runtime)->attention(*problem, **config) : (*runtime)->attention(*problem);
  if (!kernel.ok()) return report("run", kernel.error());
  std::shared_ptr<Kernel> forward = *kernel;
  if (backward) {
    auto built = (*runtime)->attention(forward_problem);
    if (!built.ok()) return report("run", built.error());
    forward = *built;
  }
  double build_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start).count();

  // Every tensor of the call (the backward's: q, k, v, o, lse, dO, dq, dk, dv), inputs random.
  auto tensors = allocate_tensors(backend, tensor_specs(*problem));
  if (!tensors.ok()) return report("run", tensors.error());
  Status filled = fill_for_timing(backend, *problem, *tensors, /*seed=*/1);
  // --docs: the documents' own lengths (fill_for_timing splits their total evenly).
  auto offsets = document_offsets_from_flags(flags);
  if (!offsets.ok()) return report("run", offsets.error());
  for (TensorRole role : {TensorRole::CuSeqlensQ, TensorRole::CuSeqlensK}) {
    const DeviceBuffer* buffer = tensors->find(role);
    if (!filled.ok() || offsets->empty() || buffer == nullptr) continue;
    filled =
        backend.copy_to_device(buffer->get(), offsets->data(), offsets->size() * sizeof(int32_t));
  }
  if (!filled.ok()) return report("run", filled.error());
  const AttentionArgs args = tensors->args;
  AttentionArgs forward_args{args.q, args.k, args.v, args.o, args.lse};
  forward_args.alibi_slopes = args.alibi_slopes;  // a variant's forward reads them too
  forward_args.cu_seqlens_q = args.cu_seqlens_q;  // and packed documents' offsets
  forward_args.cu_seqlens_k = args.cu_seqlens_k;
  const Kernel& ready = **kernel;
  auto launch = [&]() -> Status { return ready.launch(*problem, args); };
  auto launch_forward = [&]() -> Status { return forward->launch(forward_problem, forward_args); };
  if (backward) {  // o and lse as the forward leaves them
    Status ran = launch_forward();
    if (ran.ok()) ran = backend.synchronize();
    if (!ran.ok()) return report("run", ran.error());
  }

  auto timing = time_work(backend, launch, *reps);
  if (!timing.ok()) return report("run", timing.error());
  std::optional<Timing> forward_timing, both_timing;
  if (backward) {
    auto fwd = time_work(backend, launch_forward, *reps);
    if (!fwd.ok()) return report("run", fwd.error());
    auto both = time_work(
        backend,
        [&]() -> Status {
          FLASHJIT_TRY(launch_forward());
          return launch();
        },
        *reps);
    if (!both.ok()) return report("run", both.error());
    forward_timing = *fwd;
    both_timing = *both;
  }

  const bool on_cpu = backend.name() == "cpu";
  // "123.4 TFLOP/s" (GPU) or "637.1 GFLOP/s" (CPU) for `flops` in `ms`.
  auto speed = [&](double flops, double ms) {
    char text[48];
    const double per_s = flops / (ms * 1e-3);
    std::snprintf(text, sizeof(text), on_cpu ? "%.1f GFLOP/s" : "%.1f TFLOP/s",
                  on_cpu ? per_s / 1e9 : per_s / 1e12);
    return std::string(text);
  };
  const KernelInfo& info = ready.info();
  const std::string where = on_cpu ? backend.device().name + " (CPU, " +
                                         std::to_string(backend.device().sm_count) + " threads)"
                                   : device_summary(backend.device());
  std::printf("device   %s\n", where.c_str());
  std::printf("problem  %s\n", problem->to_string().c_str());
  std::printf("config   %s (%d regs, %d B local, %d B smem, %d threads%s)\n",
              ready.config().to_string().c_str(), info.regs_per_thread, info.local_bytes_per_thread,
              info.dynamic_smem_bytes, info.threads_per_block,
              backward ? "; its dK/dV kernel" : "");
  if (backward) {
    std::printf("workspace %.2f MiB (fp32: delta and lse rows%s)\n",
                static_cast<double>(ready.workspace_bytes(*problem)) / (1 << 20),
                ready.config().dq == DqMode::Atomic ? ", the dQ accumulator" : "");
  }
  const RuntimeStats stats = (*runtime)->stats();
  const char* compiler = on_cpu                    ? "compiled with Clang"
                         : backend.name() == "hip" ? "compiled with hipRTC"
                                                   : "compiled with NVRTC";
  std::printf("build    %.4f s (%s)\n", build_seconds,
              stats.compiles > 0 ? compiler : "loaded from the binary cache, no compile");
  std::printf("time     median %.4f ms, min %.4f ms, max %.4f ms over %lld reps\n", timing->median,
              timing->min, timing->max, static_cast<long long>(*reps));
  std::printf("speed    %s%s\n", speed(problem->flops(), timing->median).c_str(),
              backward ? " (the backward: 2.5x the forward's FLOPs)" : "");
  if (const auto [block_m, block_n] = ready.block_mask_tile(); block_m > 0) {
    // A mask_mod's block map (issue 31): its tiles by state, and its build's own device time
    // (apart from the kernel's: built once per shape, then reused by every call).
    Result<double> build_ms = ready.block_mask_build_ms(*problem);
    Result<BlockMask> map = backend.build_block_mask(*problem, block_m, block_n);
    if (!build_ms.ok()) return report("run", build_ms.error());
    if (!map.ok()) return report("run", map.error());
    const BlockMaskShape& shape = map->shape;
    std::vector<unsigned char> states(
        static_cast<size_t>(shape.maps() * shape.q_tiles() * shape.k_tiles()));
    Status copied = backend.copy_to_host(
        states.data(), static_cast<unsigned char*>(map->buffer.get()) + shape.states_offset(),
        states.size());
    if (!copied.ok()) return report("run", copied.error());
    double count[3] = {0, 0, 0};
    for (unsigned char state : states) count[state < 3 ? state : 1] += 1;
    const double tiles = static_cast<double>(states.size());
    std::printf(
        "blockmap %s: %.1f%% of tiles empty (skipped), %.1f%% partial, %.1f%% full; "
        "built in %.3f ms\n",
        shape.to_string().c_str(), 100 * count[0] / tiles, 100 * count[1] / tiles,
        100 * count[2] / tiles, build_ms.value());
  }
  if (backward) {
    std::printf("forward  median %.4f ms, %s (config %s)\n", forward_timing->median,
                speed(forward_problem.flops(), forward_timing->median).c_str(),
                forward->config().to_string().c_str());
    std::printf("fwd+bwd  median %.4f ms, %s (3.5x the forward's FLOPs)\n", both_timing->median,
                speed(forward_problem.flops() + problem->flops(), both_timing->median).c_str());
  }
  return kExitOk;
}

int dispatch(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cerr << program_usage();
    return kExitUsage;
  }
  const std::string& name = args[0];
  if (name == "--help" || name == "-h" || name == "help") {
    std::cout << program_usage();
    return kExitOk;
  }
  if (name == "--version") {
    std::cout << "flashjit " << FLASHJIT_VERSION << "\n"
              << "generator " << generator_version()
              << " (tuning rows: " << backend_generator_versions() << ")\n"
              << cuda::nvrtc_version() << "\n"
#if FLASHJIT_HAVE_CPU_BACKEND
              << cpu::clang_version() << " (CPU backend)\n"
#endif
#if FLASHJIT_HAVE_HIP_BACKEND
              << hip::hiprtc_version() << " (HIP backend)\n"
#endif
        ;
    return kExitOk;
  }
  // Commands with their own argument handling (subcommands, lists).
  if (name == "db") return run_db_command({args.begin() + 1, args.end()});
  if (name == "tune") return run_tune_command({args.begin() + 1, args.end()});
  if (name == "report") return run_report_command({args.begin() + 1, args.end()});
  const Command* command = find_command(name);
  if (command == nullptr) {
    std::vector<std::string> names;
    for (const Command& known : commands()) names.emplace_back(known.name);
    names.emplace_back("tune");
    names.emplace_back("db");
    names.emplace_back("report");
    return report("", make_error(ErrorCode::InvalidArgument,
                                 "unknown command '" + name + "'; commands: " + join(names, ", ") +
                                     " (see flashjit --help)"));
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  // --help wins over anything else on the line, even flags that would not parse.
  if (std::find_if(rest.begin(), rest.end(), [](const std::string& arg) {
        return arg == "--help" || arg == "-h";
      }) != rest.end()) {
    std::cout << command_usage(*command);
    return kExitOk;
  }
  auto flags = parse_flags(*command, rest);
  if (!flags.ok()) return report(command->name, flags.error());

  if (command->name == "plan") return run_plan(*flags);
  if (command->name == "show") return run_show(*flags);
  if (command->name == "compile") return run_compile(*flags);
  if (command->name == "run") return run_run(*flags);
  return run_devices();
}

}  // namespace

int run_cli(const std::vector<std::string>& args) {
  int status = kExitFailed;
  try {
    status = dispatch(args);
  } catch (const std::exception& error) {
    // Last resort: flashjit reports errors as values; anything here is a bug or out of memory.
    std::cerr << "flashjit: internal error: " << error.what() << "\n";
  } catch (...) {
    std::cerr << "flashjit: internal error: unknown exception\n";
  }
  std::cout.flush();
  std::fflush(stdout);
  std::fflush(stderr);
  return status;
}

}  // namespace flashjit::cli
