// GPU correctness of the CUDA decode family (templates/cuda/decode.cuh): every legal tile of the
// d = 128 bf16 paged group and the untuned defaults of other groups against the fp64 reference,
// over decode shapes (batch up to 8, GQA 1:1 to 8:1, lengths 1, page_size +- 1 and thousands,
// seqlen_q 1 to 16, chunked prefill), split counts 1, 3, auto and more than the keys' blocks;
// a CUDA-graph capture of a decode call replayed with new block tables and lengths; the
// Runtime's default for a decode problem. Keys and pages a kernel must not read are NaN, outputs
// poisoned. Skips, with the reason, where there is no CUDA GPU (FLASHJIT_EXPECT_GPU=1: fails).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "generator/decode_config.hpp"
#include "runtime/cuda/driver.hpp"
#include "runtime/decode_launch.hpp"
#include "runtime/runtime.hpp"
#include "support/attention_cases.hpp"
#include "support/decode_cases.hpp"
#include "support/device_run.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// The decode inputs on the device (tuner/workload.hpp's tensors of the call: q, k, v, o, lse,
// the block table and the lengths) and the args pointing at them.
struct DecodeTensors {
  ft::DeviceTensors tensors;
  AttentionArgs args;
  void* buffer(TensorRole role) const { return tensors.find(role)->get(); }
};

Result<DecodeTensors> upload_decode(const Backend& backend, const ft::DecodeInputs& d) {
  Result<ft::DeviceTensors> tensors = ft::upload(backend, d.problem, d.inputs);
  if (!tensors.ok()) return tensors.error();
  DecodeTensors out;
  out.tensors = std::move(tensors.value());
  out.args = out.tensors.args;
  return out;
}

// One case's inputs on the device and its reference, made once for every config run on it.
struct Prepared {
  ft::DecodeInputs inputs;
  ft::Reference reference;
  DecodeTensors tensors;
};

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

struct Case {
  const char* name;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  std::vector<int32_t> lengths;
};

std::vector<Case> cases(int page) {
  return {
      {"gqa4_q1", 8, 32, 8, 1, 5000, {1, page - 1, page, page + 1, 5000, 777, 2 * page + 3, 4096}},
      {"mha_q1", 2, 4, 4, 1, 3000, {3000, 1}},
      {"gqa8_q2", 3, 16, 2, 2, 2049, {2049, page + 1, 17}},
      {"mqa_q16", 2, 8, 1, 16, 700, {700, 16}},
      {"chunked_prefill_q100", 2, 4, 2, 100, 1200, {1200, 60}},
  };
}

class CudaDecode : public ::testing::Test {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_GPU(); }
};

// Every legal tile (auto splits) of d = 128 bf16 paged (16 keys per page), causal and not,
// and splits 1 / 3 / 200 (more than the blocks: empty ranges) on the default tile.
TEST_F(CudaDecode, EveryLegalTileMatchesTheReference) {
  const Backend& backend = *ft::gpu_backend();
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
    for (const Case& c : cases(16)) {
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
            << b.config.to_string() << " " << cases(16)[i].name << (causal ? " causal" : "");
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
            << config.to_string() << " " << cases(16)[i].name << (causal ? " causal" : "");
    }
  }
}

// The defaults of other groups: head dims 64, 96 (padded), 256, fp16, page sizes 32 and 256,
// contiguous caches with and without per-sequence lengths.
TEST_F(CudaDecode, DefaultsOfOtherGroupsMatchTheReference) {
  const Backend& backend = *ft::gpu_backend();
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
    for (const Case& c : cases(g.page > 0 ? g.page : 64)) {
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
// workspace layouts change: one kernel (5 splits) over problems of batch 2, 8, 2, 8, 3 on its
// cached per-stream workspace (a call whose counters sit where an earlier call wrote partials
// must zero them first; one whose layout repeats the last call's must not need to), then twice on
// a caller's workspace full of 0xFF bytes (zeroed by every call).
TEST_F(CudaDecode, SplitCountersHoldAcrossLayoutsAndCallerWorkspaces) {
  const Backend& backend = *ft::gpu_backend();
  const ft::TestCache cache;
  AttentionConfig config{16, 64, 4, 3, KernelFamily::Decode};
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
    ASSERT_EQ(decode_splits(config, d.problem, backend.device()), 5);
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

// The driver's graph API, resolved from the libcuda the backend loaded (flashjit itself never
// captures: the caller does).
struct GraphApi {
  CUresult (*stream_create)(CUstream*, unsigned);
  CUresult (*stream_destroy)(CUstream);
  CUresult (*begin_capture)(CUstream, CUstreamCaptureMode);
  CUresult (*end_capture)(CUstream, CUgraph*);
  CUresult (*instantiate)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*launch)(CUgraphExec, CUstream);
  CUresult (*exec_destroy)(CUgraphExec);
  CUresult (*graph_destroy)(CUgraph);
  CUresult (*synchronize)(CUstream);

  static std::optional<GraphApi> load() {
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (library == nullptr) return std::nullopt;
    GraphApi api{};
    auto get = [&](auto& entry, const char* name) {
      entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(library, name));
      return entry != nullptr;
    };
    if (get(api.stream_create, "cuStreamCreate") && get(api.stream_destroy, "cuStreamDestroy_v2") &&
        get(api.begin_capture, "cuStreamBeginCapture_v2") &&
        get(api.end_capture, "cuStreamEndCapture") &&
        get(api.instantiate, "cuGraphInstantiateWithFlags") && get(api.launch, "cuGraphLaunch") &&
        get(api.exec_destroy, "cuGraphExecDestroy") && get(api.graph_destroy, "cuGraphDestroy") &&
        get(api.synchronize, "cuStreamSynchronize"))
      return api;
    return std::nullopt;
  }
};

// A decode call (paged, auto splits: partials and the fused combine through the kernel's own
// workspace) captured in a CUDA graph once, then replayed with new block tables and lengths
// written into the same device buffers: every replay matches the reference of its inputs.
TEST_F(CudaDecode, GraphCaptureReplaysWithNewBlockTablesAndLengths) {
  const Backend& backend = *ft::gpu_backend();
  const std::optional<GraphApi> graph_api = GraphApi::load();
  ASSERT_TRUE(graph_api) << "libcuda lacks the graph API";
  const GraphApi& g = *graph_api;
  const auto check_cu = [](CUresult result, const char* what) { return cuda::check(result, what); };
  AttentionProblem base = AttentionProblem::make(4, 32, 8, 1, 4096, 128, DType::BF16, false);
  // The capacity is fixed (num_pages, max_pages, seqlen_k); lengths and tables change.
  const std::vector<std::vector<int32_t>> replays = {
      {4096, 1, 17, 2000}, {15, 4096, 3000, 16}, {1, 1, 1, 1}, {4000, 4001, 4095, 4096}};
  // Per replay: new cache contents and a reshuffled table over the same capacity (every
  // sequence's pages allocated, so num_pages stays the same), and new lengths.
  std::vector<ft::DecodeInputs> inputs;
  for (size_t i = 0; i < replays.size(); ++i) {
    inputs.push_back(ft::make_decode_inputs(base, {4096, 4096, 4096, 4096}, 16, 1234 + i));
    inputs.back().inputs.seqlens_k = replays[i];
  }
  const AttentionProblem& problem = inputs[0].problem;
  const AttentionConfig config = backend.default_config(problem).value();
  Result<std::shared_ptr<Kernel>> kernel = build_kernel(backend, nullptr, problem, config);
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  ASSERT_GT(decode_splits(config, problem, backend.device()), 1) << "want the combine in the graph";

  Result<DecodeTensors> tensors = upload_decode(backend, inputs[0]);
  ASSERT_TRUE(tensors.ok()) << tensors.error().describe();
  CUstream stream = nullptr;
  ASSERT_TRUE(check_cu(g.stream_create(&stream, 0), "cuStreamCreate").ok());
  // Warm-up on the stream: the kernel's workspace for this stream is allocated here, not in the
  // capture.
  ASSERT_TRUE((*kernel)->launch(problem, tensors->args, stream).ok());
  ASSERT_TRUE(check_cu(g.synchronize(stream), "cuStreamSynchronize").ok());
  ASSERT_TRUE(
      check_cu(g.begin_capture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture")
          .ok());
  const Status captured = (*kernel)->launch(problem, tensors->args, stream);
  CUgraph graph = nullptr;
  const Status ended = check_cu(g.end_capture(stream, &graph), "cuStreamEndCapture");
  ASSERT_TRUE(captured.ok()) << captured.error().describe();
  ASSERT_TRUE(ended.ok()) << ended.error().describe();
  CUgraphExec exec = nullptr;
  ASSERT_TRUE(check_cu(g.instantiate(&exec, graph, 0), "cuGraphInstantiate").ok());

  const size_t o_bytes = static_cast<size_t>(problem.o_span()) * 2;
  for (size_t i = 0; i < replays.size(); ++i) {
    const ft::DecodeInputs& d = inputs[i];
    // New queries, cache contents (same layout), table and lengths into the captured buffers.
    ASSERT_TRUE(backend
                    .copy_to_device(const_cast<void*>(tensors->args.q), d.inputs.q.data(),
                                    d.inputs.q.size() * 2)
                    .ok());
    ASSERT_TRUE(backend
                    .copy_to_device(const_cast<void*>(tensors->args.k), d.inputs.k.data(),
                                    d.inputs.k.size() * 2)
                    .ok());
    ASSERT_TRUE(backend
                    .copy_to_device(const_cast<void*>(tensors->args.v), d.inputs.v.data(),
                                    d.inputs.v.size() * 2)
                    .ok());
    ASSERT_TRUE(backend
                    .copy_to_device(tensors->buffer(TensorRole::BlockTable),
                                    d.inputs.block_table.data(), d.inputs.block_table.size() * 4)
                    .ok());
    ASSERT_TRUE(backend
                    .copy_to_device(tensors->buffer(TensorRole::SeqlensK),
                                    d.inputs.seqlens_k.data(), d.inputs.seqlens_k.size() * 4)
                    .ok());
    ASSERT_TRUE(backend.fill_bytes(tensors->args.o, 0xFF, o_bytes).ok());
    ASSERT_TRUE(backend.fill_bytes(tensors->args.lse, 0xFF, problem.lse_elements() * 4).ok());
    ASSERT_TRUE(check_cu(g.launch(exec, stream), "cuGraphLaunch").ok());
    ASSERT_TRUE(check_cu(g.synchronize(stream), "cuStreamSynchronize").ok());
    std::vector<uint16_t> o(static_cast<size_t>(problem.o_span()));
    std::vector<float> lse(static_cast<size_t>(problem.lse_elements()));
    ASSERT_TRUE(backend.copy_to_host(o.data(), tensors->args.o, o_bytes).ok());
    ASSERT_TRUE(backend.copy_to_host(lse.data(), tensors->args.lse, lse.size() * 4).ok());
    EXPECT_TRUE(ft::matches_reference(ft::compare(problem, o, lse, ft::decode_reference(d))))
        << "replay " << i;
  }
  g.exec_destroy(exec);
  g.graph_destroy(graph);
  g.stream_destroy(stream);
}

// Runtime::attention serves a decode config for a decode problem and launches it.
TEST_F(CudaDecode, RuntimeServesTheDecodeFamily) {
  RuntimeOptions options;
  options.backend = "cuda";
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

}  // namespace
}  // namespace flashjit
