// The host side of the decode emulation tests (CUDA's tests/templates/cuda_decode_emulation_test,
// HIP's hip_decode_emulation_test): one emulated launch as runtime/decode_launch.hpp makes it on
// a GPU, and the sweep of a config over tests/support/decode_cases.hpp's shapes and split counts
// against the fp64 reference. Header-only: each test compiles its backend's kernel in and passes
// it as a callable.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/problem.hpp"
#include "runtime/decode_launch.hpp"
#include "support/decode_cases.hpp"
#include "support/reference.hpp"

namespace flashjit::testing {

// One decode launch's host buffers: o and lse poisoned with guard elements past their spans, a
// NaN workspace (256-byte aligned) with the split counters zeroed (the runtime's job), the
// params bound to them.
struct EmulatedDecode {
  static constexpr size_t kGuardElements = 64;
  DecodeLaunch launch;
  std::vector<uint16_t> o;
  std::vector<float> lse, workspace;
  FlashjitAttentionParams params{};
  int32_t* counters = nullptr;
  size_t counter_count = 0;

  EmulatedDecode(const DecodeInputs& d, const AttentionConfig& config, int splits,
                 KernelShape block) {
    const AttentionProblem& p = d.problem;
    launch = decode_launch(p, config, splits, block);
    o.assign(p.o_span() + kGuardElements, kPoisonBits);
    lse.assign(p.lse_elements() + kGuardElements, -1.f);
    std::fill(lse.begin(), lse.begin() + p.lse_elements(), std::numeric_limits<float>::quiet_NaN());
    workspace.assign(launch.workspace.bytes / sizeof(float) + 64,
                     std::numeric_limits<float>::quiet_NaN());
    AttentionArgs args{d.inputs.q.data(), d.inputs.k.data(), d.inputs.v.data(), o.data(),
                       lse.data()};
    args.block_table = p.kv.paged() ? d.inputs.block_table.data() : nullptr;
    args.seqlens_k = p.kv.seqlens_k ? d.inputs.seqlens_k.data() : nullptr;
    params = make_launch_params(p, args);
    auto* base = reinterpret_cast<unsigned char*>(workspace.data());
    base += (256 - reinterpret_cast<uintptr_t>(base) % 256) % 256;
    bind_decode(params, p, args, launch.workspace, base);
    counters = reinterpret_cast<int32_t*>(base + launch.workspace.counters_offset);
    counter_count = launch.workspace.counter_bytes / sizeof(int32_t);
    std::fill(counters, counters + counter_count, 0);
  }

  // "" when the counters sit where the kernel looks for them (right after partial_lse).
  std::string layout_error(int splits) const {
    if (splits > 1 && reinterpret_cast<const float*>(counters) !=
                          params.partial_lse + splits * launch.workspace.rows)
      return "the counters are not where the kernel looks for them";
    return "";
  }

  // After the launch: the counters back at zero, nothing written past o's and lse's spans; then
  // the outputs.
  std::string finish(const AttentionProblem& p, std::vector<uint16_t>* o_out,
                     std::vector<float>* lse_out) const {
    for (size_t i = 0; i < counter_count; ++i)
      if (counters[i] != 0)
        return "split counter " + std::to_string(i) + " left at " + std::to_string(counters[i]);
    for (size_t i = p.o_span(); i < o.size(); ++i)
      if (o[i] != kPoisonBits) return "o written past its span";
    for (size_t i = p.lse_elements(); i < lse.size(); ++i)
      if (lse[i] != -1.f) return "lse written past its end";
    o_out->assign(o.begin(), o.begin() + p.o_span());
    lse_out->assign(lse.begin(), lse.begin() + p.lse_elements());
    return "";
  }
};

// A config of a decode emulation test: its template instantiation's launch (run) and budget.
struct DecodeEmulationCase {
  using Run = std::string (*)(const DecodeInputs&, const AttentionConfig&, int,
                              std::vector<uint16_t>*, std::vector<float>*);
  int head_dim;
  AttentionConfig config;
  DType dtype;
  bool causal;
  int page_size;
  Run run;
  int shared_bytes, threads;  // the template's, compared with the generator's

  std::string name() const {
    std::string text = "d";
    text += std::to_string(head_dim);
    text += "_";
    text += config.to_string();
    text += "_";
    text += to_string(dtype);
    text += causal ? "_causal" : "_noncausal";
    text += page_size > 0 ? "_paged" + std::to_string(page_size) : std::string("_contiguous");
    for (char& ch : text)
      if (ch == '-') ch = '_';  // gtest names: letters, digits and underscores
    return text;
  }
};

inline void PrintTo(const DecodeEmulationCase& c, std::ostream* out) { *out << c.name(); }

// The backend's side of the sweep: whether the config is legal for a problem (and its budget is
// what the template takes: the test's EXPECTs), and the split count a request resolves to.
struct DecodeEmulationBackend {
  std::function<void(const DecodeEmulationCase&, const AttentionProblem&)> check_budget;
  std::function<int(const AttentionConfig&, const AttentionProblem&)> resolve_splits;
};

// Runs `c` over decode_shapes(c.page_size) at 1 split (the kernel writes o), 3 (ranges merged by
// the last of each tile, some empty for short sequences) and auto, each against the fp64
// reference: 15 runs.
inline void check_decode_emulation(const DecodeEmulationCase& c,
                                   const DecodeEmulationBackend& backend, uint64_t seed) {
  int runs = 0;
  for (const DecodeShape& shape : decode_shapes(c.page_size)) {
    AttentionProblem problem =
        AttentionProblem::make(shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q,
                               shape.seqlen_k, c.head_dim, c.dtype, c.causal);
    const DecodeInputs d = make_decode_inputs(problem, shape.lengths, c.page_size, seed++);
    backend.check_budget(c, d.problem);
    const Reference reference = decode_reference(d);
    for (int splits : {1, 3, backend.resolve_splits(c.config, d.problem)}) {
      AttentionConfig config = c.config;
      config.splits = splits;
      const int resolved = backend.resolve_splits(config, d.problem);
      std::vector<uint16_t> o;
      std::vector<float> lse;
      const std::string label =
          c.name() + " b" + std::to_string(shape.batch) + " hq" + std::to_string(shape.heads_q) +
          " hkv" + std::to_string(shape.heads_kv) + " sq" + std::to_string(shape.seqlen_q) +
          " splits " + std::to_string(resolved);
      const std::string error = c.run(d, config, resolved, &o, &lse);
      ASSERT_EQ(error, "") << label;
      EXPECT_TRUE(matches_reference(compare(d.problem, o, lse, reference))) << label;
      ++runs;
    }
  }
  EXPECT_EQ(runs, 15);
}

}  // namespace flashjit::testing
