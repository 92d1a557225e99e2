// The CUDA decode template (templates/cuda/decode.cuh) compiles with NVRTC for sm80 and sm90
// with no spill, no stack frame, and registers within the launch bounds, in both its entries
// (split, combine): a few configs per head dim (the untuned default, the largest tiles, the most
// copies per thread), contiguous and paged. No GPU needed (NVRTC only): runs in CI. The full
// legal set is compiled by the tuner on a GPU machine; this keeps CI's cost to ~30 compiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "generator/decode_config.hpp"
#include "generator/device.hpp"
#include "generator/render.hpp"
#include "generator/render_decode.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "support/parallel.hpp"

namespace flashjit {
namespace {

struct Job {
  int arch;
  int head_dim;
  DType dtype;
  bool causal;
  int page_size;
  int seqlen_q;  // 1, or 8: 32 packed rows (block_m 32)
  AttentionConfig config;

  std::string name() const {
    return "sm" + std::to_string(arch) + " d" + std::to_string(head_dim) + " " + to_string(dtype) +
           (causal ? " causal" : "") +
           (page_size > 0 ? " paged" + std::to_string(page_size) : " contiguous") + " q" +
           std::to_string(seqlen_q) + " " + config.to_string();
  }
  AttentionProblem problem() const {
    const AttentionProblem p =
        AttentionProblem::make(4, 32, 8, seqlen_q, 8192, head_dim, dtype, causal);
    if (page_size > 0) return p.with_paged_kv(page_size, 4 * 8192 / page_size);
    return p;
  }
};

std::vector<Job> jobs() {
  std::vector<Job> out;
  for (int arch : {80, 90}) {
    const DeviceSpec device = known_device("sm" + std::to_string(arch)).value();
    for (int d : {64, 128, 256}) {
      for (int page : {0, 16}) {
        const bool causal = page == 0;  // chunked prefill's causal mask with the contiguous cache
        // d = 128 paged also with 8 queries: 32 packed rows, the block_m = 32 tiles.
        const int seqlen_q = d == 128 && page > 0 ? 8 : 1;
        Job job{arch, d, d == 64 ? DType::F16 : DType::BF16, causal, page, seqlen_q, {}};
        const AttentionProblem p = job.problem();
        // The default, and the legal tiles (auto splits) with the most registers and the most
        // copies per thread.
        std::vector<AttentionConfig> picks = {default_decode_config(p, device).value()};
        const AttentionConfig* most_registers = nullptr;
        const AttentionConfig* most_copies = nullptr;
        const std::vector<AttentionConfig> legal = legal_decode_configs(p, device);
        for (const AttentionConfig& c : legal) {
          if (c.splits != 0) continue;
          if (!most_registers ||
              decode_resources(c, p).registers > decode_resources(*most_registers, p).registers)
            most_registers = &c;
          if (!most_copies ||
              decode_resources(c, p).copies > decode_resources(*most_copies, p).copies)
            most_copies = &c;
        }
        for (const AttentionConfig* c : {most_registers, most_copies})
          if (c && std::find(picks.begin(), picks.end(), *c) == picks.end()) picks.push_back(*c);
        for (const AttentionConfig& c : picks) {
          job.config = c;
          out.push_back(job);
        }
      }
    }
  }
  return out;
}

TEST(CudaDecodeCompile, ChosenConfigsCompileWithoutSpills) {
  const std::vector<Job> all = jobs();
  struct Outcome {
    std::string error;
    cuda::PtxasReport split;
  };
  const std::vector<Outcome> outcomes = testing::parallel_map<Outcome>(all.size(), [&](size_t i) {
    Outcome outcome;
    Result<KernelSource> source = render_cuda_attention(all[i].problem(), all[i].config);
    if (!source.ok()) {
      outcome.error = "render: " + source.error().describe();
      return outcome;
    }
    Result<Binary> binary = cuda::nvrtc_compile(source.value(), all[i].arch);
    if (!binary.ok()) {
      outcome.error = binary.error().describe();
      return outcome;
    }
    outcome.split = cuda::parse_ptxas_report(binary->compile_log, kDecodeSplitEntry);
    return outcome;
  });
  std::printf("%-58s %5s %6s %6s\n", "config", "regs", "spill", "stack");
  for (size_t i = 0; i < all.size(); ++i) {
    const Outcome& o = outcomes[i];
    ASSERT_EQ(o.error, "") << all[i].name();
    std::printf("%-58s %5d %6d %6d\n", all[i].name().c_str(), o.split.registers,
                o.split.spill_store_bytes, o.split.stack_frame_bytes);
    ASSERT_GE(o.split.registers, 0) << all[i].name() << ": no ptxas report";
    EXPECT_EQ(o.split.spill_store_bytes, 0) << all[i].name();
    EXPECT_EQ(o.split.spill_load_bytes, 0) << all[i].name();
    // Registers within what the launch bounds leave a thread (65536 per SM, one CTA at least).
    const int threads = all[i].config.warps * 32;
    EXPECT_LE(o.split.registers * threads, 65536) << all[i].name();
  }
  std::printf("%zu decode sources compiled (one entry each: split + combine)\n", all.size());
}

}  // namespace
}  // namespace flashjit
