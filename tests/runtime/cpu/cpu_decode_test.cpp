// The decode family on the CPU backend (templates/cpu/decode.hpp: split-KV with a combine, GQA
// packing, paged K/V) against the fp64 reference: contiguous and paged caches (page sizes 16 and
// 256, pages shuffled through the cache), lengths 0, 1, page_size - 1, page_size, page_size + 1
// and long, GQA 1:1 to 8:1, seqlen_q 1 to 16 and chunked prefill (seqlen_q 37, causal), splits 1
// to many (more than the sequences' blocks: empty splits), poisoned outputs, NaN in every key and
// page a kernel must not read. Skips in a build without the CPU backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generator/decode_config.hpp"
#include "runtime/decode_launch.hpp"
#include "runtime/runtime.hpp"
#include "support/attention_cases.hpp"
#include "support/decode_cases.hpp"
#include "support/parallel.hpp"
#include "support/reference.hpp"

#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.hpp"
#endif

namespace flashjit {
namespace {

namespace ft = flashjit::testing;

#if FLASHJIT_HAVE_CPU_BACKEND

const cpu::CpuBackend& backend() {
  static const std::unique_ptr<cpu::CpuBackend> instance = cpu::CpuBackend::create().value();
  return *instance;
}

double max_rel_error(DType dtype) { return dtype == DType::F32 ? 2e-5 : 1e-2; }
double max_lse_error(DType dtype) { return dtype == DType::F32 ? 2e-5 : 1e-3; }

// Runs `kernel` on `d` (poisoned o, NaN lse) through the caller's workspace or the kernel's own,
// and compares with the reference.
::testing::AssertionResult run_and_check(const Kernel& kernel, const ft::DecodeInputs& d,
                                         bool caller_workspace) {
  const AttentionProblem& p = d.problem;
  std::vector<uint16_t> o = ft::poisoned_storage(p.o_span(), p.dtype);
  std::vector<float> lse(static_cast<size_t>(p.lse_elements()),
                         std::numeric_limits<float>::quiet_NaN());
  AttentionArgs args{d.inputs.q.data(), d.inputs.k.data(), d.inputs.v.data(), o.data(), lse.data()};
  args.block_table = p.kv.paged() ? d.inputs.block_table.data() : nullptr;
  args.seqlens_k = p.kv.seqlens_k ? d.inputs.seqlens_k.data() : nullptr;
  std::optional<DeviceBuffer> workspace;
  if (caller_workspace && kernel.workspace_bytes(p) > 0) {
    workspace = backend().allocate(kernel.workspace_bytes(p)).value();
    std::memset(workspace->get(), 0xFF, workspace->bytes());  // NaN partials until written
    args.workspace = workspace->get();
    args.workspace_bytes = workspace->bytes();
  }
  Status status = kernel.launch(p, args);
  if (!status.ok()) return ::testing::AssertionFailure() << status.error().describe();
  return ft::matches_reference(ft::compare(p, o, lse, ft::decode_reference(d)),
                               max_rel_error(p.dtype), max_lse_error(p.dtype));
}

struct Case {
  const char* name;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  int page_size;  // 0: contiguous
  std::vector<int32_t> lengths;
};

// Lengths around the page size (and 0, 1), GQA 1:1 .. 8:1, MQA, seqlen_q 1 .. 16, chunked
// prefill; each case's seqlen_k is the largest length (or more: room in the cache).
std::vector<Case> cases() {
  return {
      {"paged16_gqa4_q1", 6, 8, 2, 1, 300, 16, {1, 15, 16, 17, 300, 0}},
      {"paged16_mha_q3", 3, 2, 2, 3, 40, 16, {33, 2, 40}},
      {"paged256_gqa8_q2", 3, 16, 2, 2, 700, 256, {255, 257, 700}},
      {"paged16_mqa_q16", 2, 4, 1, 16, 100, 16, {100, 9}},
      {"paged16_chunked_prefill_q37", 2, 4, 2, 37, 150, 16, {150, 20}},
      {"contiguous_lens_gqa2_q1", 4, 4, 2, 1, 130, 0, {130, 1, 64, 65}},
  };
}

struct Variant {
  int head_dim;
  DType dtype;
  bool causal;
  int page_size;
};

// Every case under several configs (block_n, splits auto / 1 / 3 / 64), both workspaces.
TEST(CpuDecode, MatchesTheReferenceContiguousAndPaged) {
  const cpu::CpuBackend& cpu = backend();
  std::vector<Variant> variants;
  for (int d : {64, 128})
    for (DType dtype : {DType::BF16, DType::F16, DType::F32})
      for (bool causal : {false, true})
        for (int page : {0, 16, 256})
          if (d == 64 || dtype == DType::BF16) variants.push_back({d, dtype, causal, page});
  // Compile everything first (one kernel per variant, block_m and block_n), on all cores.
  struct Job {
    size_t variant;
    int block_m, block_n;
  };
  std::vector<Job> jobs;
  for (size_t v = 0; v < variants.size(); ++v)
    for (int m : {16, 64}) jobs.push_back({v, m, v % 2 == 0 ? 32 : 128});
  auto probe = [&](const Variant& v) {
    AttentionProblem p = AttentionProblem::make(1, 1, 1, 1, 256, v.head_dim, v.dtype, v.causal);
    return v.page_size > 0 ? p.with_paged_kv(v.page_size, 1) : [&] {
      p.kv.seqlens_k = true;
      return p;
    }();
  };
  // The split count is a launch parameter: every split choice of a tile loads the one object
  // compiled for the tile from this cache.
  const ft::TestCache cache;
  using Built = std::optional<Result<std::shared_ptr<Kernel>>>;
  std::vector<Built> kernels = ft::parallel_map<Built>(jobs.size(), [&](size_t i) {
    const Variant& v = variants[jobs[i].variant];
    AttentionConfig c{jobs[i].block_m, jobs[i].block_n, 1, 1, KernelFamily::Decode};
    return Built(build_kernel(cpu, cache.get(), probe(v), c));
  });
  int checked = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Variant& v = variants[jobs[i].variant];
    ASSERT_TRUE(kernels[i]->ok()) << kernels[i]->error().describe();
    const Kernel& built = ***kernels[i];
    const AttentionConfig tile = built.config();
    for (const Case& c : cases()) {
      if ((c.page_size == 0) != (v.page_size == 0)) continue;
      const int page = v.page_size;
      AttentionProblem p = AttentionProblem::make(c.batch, c.heads_q, c.heads_kv, c.seqlen_q,
                                                  c.seqlen_k, v.head_dim, v.dtype, v.causal);
      // Block m 64 only where the rows need it (chunked prefill, GQA 8 x 2): 16 elsewhere.
      if ((tile.block_m == 64) != (decode_packed_rows(p) > 16)) continue;
      const ft::DecodeInputs d = ft::make_decode_inputs(p, c.lengths, page, 100 + i);
      for (int splits : {0, 1, 3, 64}) {
        AttentionConfig config = tile;
        config.splits = splits;
        // The same binary with another split count (a launch parameter).
        BuildPath path = BuildPath::Compiled;
        const Result<std::shared_ptr<Kernel>> kernel =
            build_kernel(cpu, cache.get(), d.problem, config, &path);
        ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
        EXPECT_EQ(path, BuildPath::FromDiskCache) << "one object per tile, whatever the splits";
        const std::string label =
            std::string(c.name) + " d" + std::to_string(v.head_dim) + " " + to_string(v.dtype) +
            (v.causal ? " causal " : " ") + config.to_string() + " (" +
            std::to_string(cpu_decode_splits(config, d.problem, cpu.cpu())) + " splits)";
        EXPECT_TRUE(run_and_check(**kernel, d, /*caller_workspace=*/splits == 3)) << label;
        ++checked;
      }
    }
  }
  std::printf("%zu kernels, %d runs checked\n", jobs.size(), checked);
  EXPECT_GT(checked, 200);
}

// A contiguous decode problem (seqlen_q <= 16, no per-sequence lengths): the runtime's default
// is a -decode config, and the prefill families' configs are legal beside it.
TEST(CpuDecode, DefaultForAContiguousDecodeProblem) {
  const AttentionProblem p = AttentionProblem::make(2, 8, 2, 1, 1000, 128, DType::BF16, false);
  const AttentionConfig def = backend().default_config(p).value();
  EXPECT_EQ(def.family, KernelFamily::Decode) << def.to_string();
  const std::vector<AttentionConfig> legal = backend().legal_configs(p);
  EXPECT_TRUE(std::any_of(legal.begin(), legal.end(),
                          [](const AttentionConfig& c) { return c.family == KernelFamily::Mma; }));
  Result<std::shared_ptr<Kernel>> kernel = build_kernel(backend(), nullptr, p, def);
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  const ft::HostInputs inputs = ft::random_inputs(p, 9);
  std::vector<uint16_t> o = ft::poisoned_storage(p.o_span(), p.dtype);
  std::vector<float> lse(static_cast<size_t>(p.lse_elements()), -1.0f);
  ASSERT_TRUE(
      (*kernel)
          ->launch(p, {inputs.q.data(), inputs.k.data(), inputs.v.data(), o.data(), lse.data()})
          .ok());
  EXPECT_TRUE(ft::matches_reference(ft::compare(p, o, lse, ft::reference_attention(p, inputs))));
}

TEST(CpuDecode, LaunchNamesMissingPagedArguments) {
  AttentionProblem p = AttentionProblem::make(1, 2, 2, 1, 64, 64, DType::BF16, false);
  const ft::DecodeInputs d = ft::make_decode_inputs(p, {64}, 16, 1);
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(backend(), nullptr, d.problem, backend().default_config(d.problem).value());
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  std::vector<uint16_t> o = ft::poisoned_storage(d.problem.o_span(), p.dtype);
  AttentionArgs args{d.inputs.q.data(), d.inputs.k.data(), d.inputs.v.data(), o.data(), nullptr};
  args.seqlens_k = d.inputs.seqlens_k.data();
  Status status = (*kernel)->launch(d.problem, args);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("block_table is null"), std::string::npos)
      << status.error().message;
  args.block_table = d.inputs.block_table.data();
  args.seqlens_k = nullptr;
  status = (*kernel)->launch(d.problem, args);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("seqlens_k is null"), std::string::npos);
  // A prefill kernel does not take a paged problem.
  const AttentionProblem contiguous =
      AttentionProblem::make(1, 2, 2, 1, 64, 64, DType::BF16, false);
  Result<std::shared_ptr<Kernel>> prefill =
      build_kernel(backend(), nullptr, contiguous, AttentionConfig{64, 64, 1, 1});
  ASSERT_TRUE(prefill.ok());
  status = (*prefill)->launch(d.problem, args);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("does not match"), std::string::npos);
}

#else
TEST(CpuDecode, SkippedWithoutTheCpuBackend) { GTEST_SKIP() << "built without LLVM/Clang 14"; }
#endif

}  // namespace
}  // namespace flashjit
