// GPU correctness of the CUDA decode family (templates/cuda/decode.cuh): the checks of
// tests/support/decode_gpu_checks.hpp (every legal tile of the d = 128 bf16 paged group and the
// untuned defaults of other groups against the fp64 reference, over decode shapes with split
// counts 1, 3, auto and more than the keys' blocks; the split counters across layouts), a
// CUDA-graph capture of a decode call replayed with new block tables and lengths; the
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
#include "support/decode_gpu_checks.hpp"
#include "support/device_run.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

using ft::DecodeTensors;
using ft::run_and_check;
using ft::upload_decode;

class CudaDecode : public ::testing::Test {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_GPU(); }
};

TEST_F(CudaDecode, EveryLegalTileMatchesTheReference) {
  ft::check_every_legal_decode_tile(*ft::gpu_backend());
}

TEST_F(CudaDecode, DefaultsOfOtherGroupsMatchTheReference) {
  ft::check_decode_defaults(*ft::gpu_backend());
}

TEST_F(CudaDecode, SplitCountersHoldAcrossLayoutsAndCallerWorkspaces) {
  ft::check_decode_split_counters(*ft::gpu_backend(), {16, 64, 4, 3, KernelFamily::Decode});
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

TEST_F(CudaDecode, RuntimeServesTheDecodeFamily) { ft::check_runtime_serves_decode("cuda"); }

}  // namespace
}  // namespace flashjit
