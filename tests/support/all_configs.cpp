#include "support/all_configs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>

#include "support/device_run.hpp"
#include "support/reference.hpp"

namespace flashjit::testing {
namespace {

// The seeds of a (group, shape): distinct per pass, shape and group.
uint64_t seed_of(const ConfigGroup& group, size_t shape_index) {
  const uint64_t base = group.pass == Pass::Backward ? 2'000'003ull : 1'000'003ull;
  return base * (shape_index + 1) + 16ull * group.head_dim +
         2ull * static_cast<uint64_t>(group.dtype) + (group.causal ? 1 : 0);
}

// One run's outputs against the reference: the verdict, its message and the errors of the
// summary table (forward: o rel, lse abs; backward: dq, dk, dv rel).
struct Checked {
  bool passed = false;
  std::string message;
  std::vector<double> errors;
};

Checked check(const AttentionProblem& problem, const RunOutput& out, const Reference& reference,
              const AllConfigsOptions& options) {
  Checked checked;
  if (!problem.is_backward()) {
    const Comparison comparison = compare(problem, out.o, out.lse, reference);
    const ::testing::AssertionResult matches =
        matches_reference(comparison, options.max_rel, options.max_lse_abs);
    checked.passed = static_cast<bool>(matches);
    checked.message = matches.message();
    checked.errors = {comparison.o_rel_error, comparison.lse_max_abs_error};
    return checked;
  }
  const double tolerance =
      options.max_grad_rel > 0 ? options.max_grad_rel : gradient_tolerance(problem.dtype);
  const GradientComparison comparison =
      compare_gradients(problem, out.dq, out.dk, out.dv, reference);
  checked.passed = within_tolerance(comparison, tolerance);
  std::ostringstream message;
  message << "(tolerance " << tolerance << "): " << comparison.to_string();
  checked.message = message.str();
  checked.errors = {comparison.dq.rel_error, comparison.dk.rel_error, comparison.dv.rel_error};
  return checked;
}

void print_summary(const ConfigGroup& group, const std::vector<BuiltKernel>& built,
                   const AttentionConfig& default_config,
                   const std::map<AttentionConfig, std::vector<double>>& worst,
                   const std::map<AttentionConfig, int>& runs) {
  int width = 18;
  for (const BuiltKernel& b : built)
    width = std::max(width, static_cast<int>(b.config.to_string().size()));
  const bool backward = group.pass == Pass::Backward;
  std::printf("  %-*s %5s %6s", width, "config", "regs", "local");
  if (backward) {
    std::printf(" %10s %10s %10s", "max dq rel", "max dk rel", "max dv rel");
  } else {
    std::printf(" %10s %12s", "max o rel", "max lse abs");
  }
  std::printf(" %5s\n", "runs");
  for (const BuiltKernel& b : built) {
    if (!b.kernel) continue;
    std::printf("  %-*s %5d %6d", width, b.config.to_string().c_str(),
                b.kernel->info().regs_per_thread, b.kernel->info().local_bytes_per_thread);
    const auto found = worst.find(b.config);
    const std::vector<double> errors =
        found != worst.end() ? found->second : std::vector<double>(backward ? 3 : 2, 0.0);
    if (backward) {
      std::printf(" %10.2e %10.2e %10.2e", errors[0], errors[1], errors[2]);
    } else {
      std::printf(" %10.2e %12.2e", errors[0], errors[1]);
    }
    const auto count = runs.find(b.config);
    std::printf(" %5d%s\n", count != runs.end() ? count->second : 0,
                b.config == default_config ? "  default" : "");
  }
  std::fflush(stdout);
}

// The runs of `built` over options.shapes; a reason to stop the group in `stop` (the context
// lost, too many failures); `worst` and `runs` filled for the summary table as it goes.
void run_shapes(const Backend& backend, const ConfigGroup& group, const std::string& label,
                const std::vector<BuiltKernel>& built, const AttentionConfig& default_cfg,
                const AllConfigsOptions& options, int& failures,
                std::map<AttentionConfig, std::vector<double>>& worst,
                std::map<AttentionConfig, int>& runs, std::string& stop) {
  for (size_t shape_index = 0; shape_index < options.shapes.size(); ++shape_index) {
    const Shape& shape = options.shapes[shape_index];
    const bool default_only =
        options.all_configs_max_seqlen > 0 &&
        std::max(shape.seqlen_q, shape.seqlen_k) > options.all_configs_max_seqlen;
    const AttentionProblem problem =
        make_problem(shape, group.head_dim, group.dtype, group.causal, group.pass);
    const std::string shape_context = label + " shape=" + shape.to_string();
    ASSERT_TRUE(validate(problem).ok())
        << shape_context << ": " << validate(problem).error().describe();

    // One seed per (group, shape): every config sees the same inputs and the same reference.
    const uint64_t seed = seed_of(group, shape_index);
    const HostInputs inputs = random_inputs(problem, seed);
    const Reference reference = reference_attention(problem, inputs);
    const Result<DeviceTensors> tensors = upload(backend, problem, inputs);
    ASSERT_TRUE(tensors.ok()) << shape_context << ": " << tensors.error().describe();

    for (const BuiltKernel& b : built) {
      if (!b.kernel) continue;
      const bool is_default = b.config == default_cfg;
      if (default_only && !is_default) continue;
      const std::string context = shape_context + " config=" + b.config.to_string() +
                                  (is_default ? " (default)" : "") +
                                  " seed=" + std::to_string(seed);
      const RunOutput out = run_poisoned(backend, *b.kernel, problem, tensors.value());
      if (!out.status.ok()) {
        ADD_FAILURE() << context << ": " << out.status.error().describe();
        // A failed synchronize usually means a sticky error (illegal address): every later
        // call in this process would fail too.
        if (out.context_lost) {
          stop = "the " + backend.name() + " context is lost";
          return;
        }
        if (++failures >= options.max_failures) {
          stop = std::to_string(failures) + " failures";
          return;
        }
        continue;
      }
      const Checked checked = check(problem, out, reference, options);
      std::vector<double>& w = worst[b.config];
      w.resize(checked.errors.size(), 0.0);
      for (size_t i = 0; i < w.size(); ++i) w[i] = std::max(w[i], checked.errors[i]);
      ++runs[b.config];
      EXPECT_TRUE(checked.passed) << context << " " << checked.message;
      if (!checked.passed && ++failures >= options.max_failures) {
        stop = std::to_string(failures) + " failures";
        return;
      }
    }
  }
}

}  // namespace

std::string ConfigGroup::name() const {
  // Appended piecewise: gcc 12 warns (-Wrestrict, a false positive) on "literal" + string&&.
  std::string name = "d";
  name += std::to_string(head_dim);
  name += "_";
  name += to_string(dtype);
  name += causal ? "_causal" : "_noncausal";
  return name;
}

void PrintTo(const ConfigGroup& group, std::ostream* out) {
  *out << (group.pass == Pass::Backward ? "bwd " : "") << group.name();
}

std::vector<ConfigGroup> all_groups(Pass pass) {
  std::vector<ConfigGroup> groups;
  for (int head_dim : {64, 128, 256})
    for (DType dtype : {DType::F16, DType::BF16})
      for (bool causal : {false, true}) groups.push_back({head_dim, dtype, causal, pass});
  return groups;
}

void check_all_configs(const Backend& backend, const ConfigGroup& group,
                       const AllConfigsOptions& options) {
  std::string label = group.pass == Pass::Backward ? "bwd " : "";
  label += group.name();
  const AttentionProblem group_problem =
      make_problem(Shape{1, 2, 2, 128, 128}, group.head_dim, group.dtype, group.causal, group.pass);
  const std::vector<AttentionConfig> configs =
      selected_families(backend.legal_configs(group_problem));
  ASSERT_FALSE(configs.empty()) << "no legal config for " << label << " on "
                                << backend.device().to_string();
  const Result<AttentionConfig> default_result = backend.default_config(group_problem);
  ASSERT_TRUE(default_result.ok()) << label << ": " << default_result.error().describe();
  const AttentionConfig& default_cfg = default_result.value();

  TestCache cache;
  const auto build_start = std::chrono::steady_clock::now();
  const std::vector<BuiltKernel> built = build_all(backend, cache.get(), group_problem, configs);
  std::printf("%s on %s: %zu legal configs built in %.1f s (default %s, cache %s)\n", label.c_str(),
              backend.device().name.c_str(), configs.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start).count(),
              default_cfg.to_string().c_str(), cache.dir().c_str());
  int failures = 0;
  for (const BuiltKernel& b : built) {
    if (!b.kernel) {
      ADD_FAILURE() << label << " config=" << b.config.to_string() << ": build failed: " << b.error;
      ++failures;
    } else if (b.config.family == KernelFamily::Ws) {
      // The -ws budget gives every consumer its registers after setmaxnreg: no local memory.
      EXPECT_EQ(b.kernel->info().local_bytes_per_thread, 0)
          << label << " config=" << b.config.to_string() << ": spills";
    }
  }

  // Worst errors and runs per config over all shapes, for the summary table: printed also when
  // the group stops early (what ran until then).
  std::map<AttentionConfig, std::vector<double>> worst;
  std::map<AttentionConfig, int> runs;
  std::string stop;
  run_shapes(backend, group, label, built, default_cfg, options, failures, worst, runs, stop);
  print_summary(group, built, default_cfg, worst, runs);
  if (!stop.empty()) FAIL() << "stopping " << label << ": " << stop;
}

}  // namespace flashjit::testing
