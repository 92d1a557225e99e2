// Fuzz target: config names and problem parsing (generator/). Input, one item a line:
//   1. a config name as `flashjit show --config` takes it ("m128n64w4s2", "...-ws-pp", ...),
//   2. an architecture as `--arch` takes it ("sm90", "gfx90a:xnack-", ...),
//   3. a dtype and 4. a pass name (parse_dtype, parse_pass),
//   5... problem flags "name=value" (batch, heads, seqlen-q, head-dim, dtype, causal, window,
//      softcap, alibi, prefix, score-mod, mask-mod, page-size, ...), handed to
//      problem_from_flags without the argv parser in between.
// Invariants: every parser returns a value or an error with a message; a config name reads back
// from its own to_string(); a problem returned is valid; a config check_config accepts for a
// problem renders (CUDA or HIP) and a CPU config the CPU check accepts renders for the CPU.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cli/args.hpp"
#include "fuzz_support.hpp"
#include "generator/config.hpp"
#include "generator/cpu_config.hpp"
#include "generator/device.hpp"
#include "generator/hip_config.hpp"
#include "generator/problem.hpp"
#include "generator/render.hpp"
#include "runtime/tuning_store.hpp"

using namespace flashjit;
using flashjit::fuzz::checked;
using flashjit::fuzz::require;
using flashjit::fuzz::require_message;

namespace {

void check_rendered(const Result<KernelSource>& source, const AttentionConfig& config,
                    const AttentionProblem& problem, const char* backend) {
  require(source.ok(),
          std::string(backend) + ": a legal config does not render: " + config.to_string() +
              " for " + problem.to_string() + ": " + (source.ok() ? "" : source.error().message));
  require(!source->text.empty() && !source->entries.empty(),
          std::string(backend) + ": an empty kernel source");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::ByteReader in(data, size);
  const std::string config_text = in.line();
  const std::string arch_text = in.line();
  const std::string dtype_text = in.line();
  const std::string pass_text = in.line();
  cli::ParsedFlags flags;
  while (!in.empty()) {
    const std::string item = in.line();
    const size_t eq = item.find('=');
    flags.values[item.substr(0, eq)] = eq == std::string::npos ? "" : item.substr(eq + 1);
  }

  const Result<AttentionConfig> config = AttentionConfig::parse(config_text);
  if (checked(config, "AttentionConfig::parse")) {
    const Result<AttentionConfig> again = AttentionConfig::parse(config->to_string());
    require(again.ok() && *again == *config,
            "'" + config_text + "' reads as " + config->to_string() + ", which does not read back");
  }
  const Result<DeviceSpec> device = known_device(arch_text);
  (void)checked(device, "known_device");
  (void)checked(parse_dtype(dtype_text), "parse_dtype");
  (void)checked(parse_pass(pass_text), "parse_pass");
  (void)checked(check_variant_expression("score_mod", dtype_text), "check_variant_expression");

  const Result<AttentionProblem> problem = cli::problem_from_flags(flags);
  if (!checked(problem, "problem_from_flags")) return 0;
  require(validate(*problem).ok(), "problem_from_flags: invalid " + problem->to_string());
  (void)problem->to_string();
  (void)ProblemKey::of(*problem).to_string();
  (void)problem->flops();
  if (!config.ok()) return 0;

  const DeviceSpec gpu = device.ok() ? *device : *known_device("sm90");
  if (gpu.is_amd()) {
    if (checked(check_hip_config(*config, *problem, gpu), "check_hip_config") &&
        !problem->is_backward()) {
      check_rendered(render_hip_attention(*problem, *config), *config, *problem, "hip");
    }
  } else {
    const Status legal = check_config(*config, *problem, gpu);
    if (checked(legal, "check_config")) {
      (void)resource_use(*config, *problem, gpu);
      // The decode family renders through its own path (render_decode.hpp); the prefill
      // families here.
      if (config->family != KernelFamily::Decode) {
        check_rendered(problem->is_backward() ? render_cuda_attention_backward(*problem, *config)
                                              : render_cuda_attention(*problem, *config),
                       *config, *problem, "cuda");
      }
    }
  }
  const CpuSpec cpu = known_cpu();
  if (checked(check_cpu_config(*config, *problem, cpu), "check_cpu_config") &&
      config->family != KernelFamily::Decode) {
    check_rendered(problem->is_backward() ? render_cpu_attention_backward(*problem, *config)
                                          : render_cpu_attention(*problem, *config),
                   *config, *problem, "cpu");
  }
  return 0;
}
