#include "support/decode_gpu_checks.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "generator/decode_config.hpp"
#include "runtime/decode_launch.hpp"
#include "runtime/runtime.hpp"
#include "support/attention_cases.hpp"
#include "support/device_run.hpp"
#include "support/reference.hpp"

namespace flashjit::testing {

namespace ft = ::flashjit::testing;

Result<DecodeTensors> upload_decode(const Backend& backend, const ft::DecodeInputs& d) {
  Result<ft::DeviceTensors> tensors = ft::upload(backend, d.problem, d.inputs);
  if (!tensors.ok()) return tensors.error();
  DecodeTensors out;
  out.tensors = std::move(tensors.value());
  out.args = out.tensors.args;
  return out;
}

Result<Prepared> prepare(const Backend& backend, ft::DecodeInputs d) {
  Prepared out;
  out.reference = ft::decode_reference(d);
  Result<DecodeTensors> tensors = upload_decode(backend, d);
  if (!tensors.ok()) return tensors.error();
  out.tensors = std::move(tensors.value());
  out.inputs = std::move(d);
  return out;
}

::testing::AssertionResult run_and_check(const Backend& backend, const Kernel& kernel,
                                         const Prepared& prepared) {
  const AttentionProblem& problem = prepared.inputs.problem;
  const ft::RunOutput out =
      ft::run_poisoned(backend, kernel, problem, prepared.tensors.tensors, prepared.tensors.args);
  if (!out.status.ok()) return ::testing::AssertionFailure() << out.status.error().describe();
  return ft::matches_reference(ft::compare(problem, out.o, out.lse, prepared.reference));
}

::testing::AssertionResult run_and_check(const Backend& backend, const Kernel& kernel,
                                         const ft::DecodeInputs& d) {
  Result<Prepared> prepared = prepare(backend, d);
  if (!prepared.ok()) return ::testing::AssertionFailure() << prepared.error().describe();
  return run_and_check(backend, kernel, *prepared);
}

std::vector<DecodeGpuCase> decode_gpu_cases(int page) {
  return {
      {"gqa4_q1", 8, 32, 8, 1, 5000, {1, page - 1, page, page + 1, 5000, 777, 2 * page + 3, 4096}},
      {"mha_q1", 2, 4, 4, 1, 3000, {3000, 1}},
      {"gqa8_q2", 3, 16, 2, 2, 2049, {2049, page + 1, 17}},
      {"mqa_q16", 2, 8, 1, 16, 700, {700, 16}},
      {"chunked_prefill_q100", 2, 4, 2, 100, 1200, {1200, 60}},
  };
}

// Every legal tile (auto splits) of d = 128 bf16 paged (16 keys per page), causal and not,
// and splits 1 / 3 / 200 (more than the blocks: empty ranges) on the default tile.
void check_every_legal_decode_tile(const Backend& backend) {
  const ft::TestCache cache;
  for (bool causal : {false, true}) {
    const AttentionProblem probe =
        AttentionProblem::make(1, 8, 2, 1, 4096, 128, DType::BF16, causal).with_paged_kv(16, 256);
    std::vector<AttentionConfig> tiles;
    for (const AttentionConfig& c : backend.legal_configs(probe))
      if (c.family == KernelFamily::Decode && c.splits == 0) tiles.push_back(c);
    // block_m 32 tiles (enumerated for more packed rows) too.
    const AttentionProblem rows32 =
        AttentionProblem::make(1, 16, 2, 4, 4096, 128, DType::BF16, causal).with_paged_kv(16, 256);
    for (const AttentionConfig& c : backend.legal_configs(rows32))
      if (c.family == KernelFamily::Decode && c.splits == 0 && c.block_m == 32) tiles.push_back(c);
    const std::vector<ft::BuiltKernel> built = ft::build_all(backend, cache.get(), probe, tiles);
    std::vector<Prepared> prepared;
    for (const DecodeGpuCase& c : decode_gpu_cases(16)) {
      AttentionProblem p = AttentionProblem::make(c.batch, c.heads_q, c.heads_kv, c.seqlen_q,
                                                  c.seqlen_k, 128, DType::BF16, causal);
      Result<Prepared> one =
          prepare(backend, ft::make_decode_inputs(p, c.lengths, 16, 11 + prepared.size()));
      ASSERT_TRUE(one.ok()) << one.error().describe();
      prepared.push_back(std::move(one.value()));
    }
    int runs = 0;
    for (const ft::BuiltKernel& b : built) {
      ASSERT_TRUE(b.kernel) << b.config.to_string() << ": " << b.error;
      for (size_t i = 0; i < prepared.size(); ++i) {
        if (!backend.check_config(b.config, prepared[i].inputs.problem).ok()) continue;
        EXPECT_TRUE(run_and_check(backend, *b.kernel, prepared[i]))
            << b.config.to_string() << " " << decode_gpu_cases(16)[i].name
            << (causal ? " causal" : "");
        ++runs;
      }
    }
    std::printf("%zu tiles, %d runs (%s)\n", built.size(), runs, causal ? "causal" : "non-causal");
    const AttentionConfig def = backend.default_config(probe).value();
    for (int splits : {1, 3, 200}) {
      AttentionConfig config = def;
      config.splits = std::min(splits, kMaxDecodeSplits);
      Result<std::shared_ptr<Kernel>> kernel = build_kernel(backend, cache.get(), probe, config);
      ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
      for (size_t i = 0; i < prepared.size(); ++i)
        EXPECT_TRUE(run_and_check(backend, **kernel, prepared[i]))
            << config.to_string() << " " << decode_gpu_cases(16)[i].name
            << (causal ? " causal" : "");
    }
  }
}

// The defaults of other groups: head dims 64, 96 (padded), 256, fp16, page sizes 32 and 256,
// contiguous caches with and without per-sequence lengths.
void check_decode_defaults(const Backend& backend) {
  const ft::TestCache cache;
  struct Group {
    int head_dim;
    DType dtype;
    bool causal;
    int page;  // 0: contiguous with seqlens_k; -1: contiguous, every sequence seqlen_k keys
  };
  for (const Group& g : {Group{64, DType::F16, false, 32}, Group{96, DType::BF16, true, 256},
                         Group{256, DType::BF16, false, 16}, Group{128, DType::F16, true, 0},
                         Group{128, DType::BF16, false, -1}}) {
    for (const DecodeGpuCase& c : decode_gpu_cases(g.page > 0 ? g.page : 64)) {
      AttentionProblem p = AttentionProblem::make(c.batch, c.heads_q, c.heads_kv, c.seqlen_q,
                                                  c.seqlen_k, g.head_dim, g.dtype, g.causal);
      ft::DecodeInputs d;
      if (g.page >= 0) {
        d = ft::make_decode_inputs(p, c.lengths, g.page, 99);
      } else {
        if (p.seqlen_q > kMaxDecodeSeqlenQ) continue;  // a prefill problem: not the family's
        d = ft::make_decode_inputs(p, std::vector<int32_t>(c.batch, c.seqlen_k), 0, 99);
        d.problem.kv = KvCache{};  // a plain contiguous problem: no lengths tensor
      }
      const AttentionConfig config = backend.default_config(d.problem).value();
      ASSERT_EQ(config.family, KernelFamily::Decode) << config.to_string();
      Result<std::shared_ptr<Kernel>> kernel =
          build_kernel(backend, cache.get(), d.problem, config);
      ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
      EXPECT_TRUE(run_and_check(backend, **kernel, d))
          << "d" << g.head_dim << " " << to_string(g.dtype) << " page " << g.page << " " << c.name
          << " " << config.to_string();
    }
  }
}

// The split counters of the fused combine (zero before and after every launch) when the calls'
// workspace layouts change: one kernel of `config` (5 splits) over problems of batch 2, 8, 2, 8, 3
// on its cached per-stream workspace (a call whose counters sit where an earlier call wrote
// partials must zero them first; one whose layout repeats the last call's must not need to), then
// twice on a caller's workspace full of 0xFF bytes (zeroed by every call).
void check_decode_split_counters(const Backend& backend, AttentionConfig config) {
  const ft::TestCache cache;
  config.splits = 5;
  auto inputs_of = [](int64_t batch, uint64_t seed) {
    const AttentionProblem p =
        AttentionProblem::make(batch, 32, 8, 1, 3000, 128, DType::BF16, false);
    std::vector<int32_t> lengths(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) lengths[b] = static_cast<int32_t>(3000 - 371 * b);
    return ft::make_decode_inputs(p, lengths, 16, seed);
  };
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(backend, cache.get(), inputs_of(2, 1).problem, config);
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  uint64_t seed = 40;
  for (int64_t batch : {2, 8, 2, 8, 3}) {
    const ft::DecodeInputs d = inputs_of(batch, seed++);
    ASSERT_EQ(decode_splits(config, d.problem, 1, 1), 5);
    EXPECT_TRUE(run_and_check(backend, **kernel, d)) << "batch " << batch;
  }
  for (int call = 0; call < 2; ++call) {
    Result<Prepared> prepared = prepare(backend, inputs_of(4, seed++));
    ASSERT_TRUE(prepared.ok()) << prepared.error().describe();
    const size_t bytes = (*kernel)->workspace_bytes(prepared->inputs.problem);
    ASSERT_GT(bytes, 0u);
    Result<DeviceBuffer> workspace = backend.allocate(bytes);
    ASSERT_TRUE(workspace.ok()) << workspace.error().describe();
    ASSERT_TRUE(backend.fill_bytes(workspace->get(), 0xFF, bytes).ok());
    prepared->tensors.args.workspace = workspace->get();
    prepared->tensors.args.workspace_bytes = bytes;
    EXPECT_TRUE(run_and_check(backend, **kernel, *prepared)) << "caller workspace, call " << call;
  }
}

// Runtime::attention serves a decode config for a decode problem and launches it.
void check_runtime_serves_decode(const std::string& backend_name) {
  RuntimeOptions options;
  options.backend = backend_name;
  options.user_db = "none";
  options.use_disk_cache = false;
  Result<std::unique_ptr<Runtime>> runtime = Runtime::create(options);
  ASSERT_TRUE(runtime.ok()) << runtime.error().describe();
  AttentionProblem p = AttentionProblem::make(2, 32, 8, 1, 2048, 128, DType::BF16, false);
  const ft::DecodeInputs d = ft::make_decode_inputs(p, {2048, 33}, 16, 5);
  Result<std::shared_ptr<Kernel>> kernel = (*runtime)->attention(d.problem);
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  EXPECT_EQ((*kernel)->config().family, KernelFamily::Decode);
  EXPECT_TRUE(run_and_check((*runtime)->backend(), **kernel, d));
}

}  // namespace flashjit::testing
