// Checked decode tables (issue 33, runtime/table_check.hpp, templates/checks/decode_tables.h):
// the rules on host tables (an out-of-range or negative page, a negative length, a length past
// the table or past a contiguous cache, padding past a sequence's pages ignored), the switch
// (AttentionArgs::check_tables, FLASHJIT_CHECK_TABLES, debug builds), the check kernel compiled
// with NVRTC (no GPU needed), a CPU decode call refused with an error naming the entry, and on a
// CUDA GPU a checked call captured in a graph (good tables: the reference) and the check kernel
// trapping on each kind of bad entry (in a child process: a trap loses the context). The GPU
// tests skip without a GPU (FLASHJIT_EXPECT_GPU=1: fail).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/driver.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "runtime/runtime.hpp"
#include "runtime/table_check.hpp"
#include "support/decode_cases.hpp"
#include "support/decode_gpu_checks.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"

#if FLASHJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.hpp"
#endif

namespace flashjit {
namespace {

namespace ft = ::flashjit::testing;

// 3 sequences over a paged cache of 10 pages of 16 keys, 4 table columns (64 keys each at most).
struct PagedTables {
  std::vector<int32_t> table = {3, 7,  -1, -1,   // 20 keys: pages 0, 1 used (the rest padding)
                                0, 1,  2,  9,    // 64 keys: all four
                                5, 99, 99, 99};  // 16 keys: page 0 only
  std::vector<int32_t> lengths = {20, 64, 16};
  FlashjitDecodeTables tables() const { return {table.data(), lengths.data(), 3, 4, 10, 16, 64}; }
};

std::string error_of(const FlashjitDecodeTables& tables) {
  const Status status = check_decode_tables(tables);
  return status.ok() ? "" : status.error().message;
}

TEST(DecodeTableCheck, GoodTablesPassAndPaddingIsNotRead) {
  PagedTables t;
  EXPECT_EQ(error_of(t.tables()), "");
  t.lengths = {0, 0, 0};  // no keys: no page read, whatever the table says
  t.table.assign(12, -5);
  EXPECT_EQ(error_of(t.tables()), "");
}

TEST(DecodeTableCheck, OutOfRangePageIsNamed) {
  PagedTables t;
  t.table[1 * 4 + 2] = 10;  // == num_pages
  EXPECT_EQ(error_of(t.tables()),
            "block_table[1][2] = 10: must be a page in [0, 10) (num_pages), used by "
            "seqlens_k[1] = 64");
  t.table[1 * 4 + 2] = -1;
  EXPECT_NE(error_of(t.tables()).find("block_table[1][2] = -1"), std::string::npos);
  // A length one past a page boundary uses the next page.
  PagedTables u;
  u.lengths[2] = 17;
  EXPECT_NE(error_of(u.tables()).find("block_table[2][1] = 99"), std::string::npos);
  EXPECT_NE(error_of(u.tables()).find("seqlens_k[2] = 17"), std::string::npos);
}

TEST(DecodeTableCheck, NegativeLengthAndLengthPastTheTableAreNamed) {
  PagedTables t;
  t.lengths[1] = -3;
  EXPECT_EQ(error_of(t.tables()),
            "seqlens_k[1] = -3: must be in [0, 64] (the keys the cache holds per sequence: "
            "max_pages * page_size)");
  t.lengths[1] = 65;
  EXPECT_NE(error_of(t.tables()).find("seqlens_k[1] = 65: must be in [0, 64]"), std::string::npos);
  // The first bad entry in order: sequence 0's page before sequence 1's length.
  t.table[1] = 12;
  EXPECT_NE(error_of(t.tables()).find("block_table[0][1] = 12"), std::string::npos);
  // A contiguous cache of 100 keys per sequence.
  std::vector<int32_t> lengths = {100, 101};
  const FlashjitDecodeTables contiguous{nullptr, lengths.data(), 2, 0, 0, 0, 100};
  EXPECT_EQ(error_of(contiguous),
            "seqlens_k[1] = 101: must be in [0, 100] (the keys the cache holds per sequence)");
  lengths[1] = std::numeric_limits<int32_t>::min();
  EXPECT_NE(error_of(contiguous).find("seqlens_k[1] = -2147483648"), std::string::npos);
}

TEST(DecodeTableCheck, TablesOfAProblem) {
  AttentionProblem p =
      AttentionProblem::make(3, 8, 2, 1, 64, 64, DType::BF16, false).with_paged_kv(16, 10);
  PagedTables t;
  AttentionArgs args;
  args.block_table = t.table.data();
  args.seqlens_k = t.lengths.data();
  const FlashjitDecodeTables tables = decode_tables_of(p, args);
  EXPECT_EQ(tables.max_pages, p.kv.max_pages);
  EXPECT_EQ(tables.num_pages, 10);
  EXPECT_EQ(tables.page_size, 16);
  EXPECT_EQ(tables.seqlen_k, p.kv.capacity());
  EXPECT_EQ(tables.block_table, t.table.data());
}

TEST(DecodeTableCheck, SwitchFromArgsEnvironmentAndBuild) {
  AttentionArgs args;
  unsetenv("FLASHJIT_CHECK_TABLES");
#ifdef NDEBUG
  EXPECT_FALSE(table_check_enabled(args)) << "off by default in a release build";
#else
  EXPECT_TRUE(table_check_enabled(args)) << "on by default in a debug build";
#endif
  EXPECT_FALSE(table_check_requested(args));
  setenv("FLASHJIT_CHECK_TABLES", "1", 1);
  EXPECT_TRUE(table_check_enabled(args));
  EXPECT_TRUE(table_check_requested(args));
  setenv("FLASHJIT_CHECK_TABLES", "0", 1);
  EXPECT_FALSE(table_check_enabled(args));
  args.check_tables = true;  // the call's request wins
  EXPECT_TRUE(table_check_enabled(args));
  EXPECT_TRUE(table_check_requested(args));
  unsetenv("FLASHJIT_CHECK_TABLES");
}

// The check kernel compiles with NVRTC for sm_80 and sm_90, without spills; its printf and trap
// are in it. No GPU needed.
TEST(DecodeTableCheck, CheckKernelCompilesWithNvrtc) {
  KernelSource source;
  source.entries = {kDecodeTableCheckEntry};
  source.text = decode_table_check_source();
  source.label = "decode table check";
  ASSERT_NE(source.text.find("flashjit_check_decode_tables"), std::string::npos);
  for (int arch : {80, 90}) {
    Result<Binary> binary = cuda::nvrtc_compile(source, arch);
    ASSERT_TRUE(binary.ok()) << binary.error().describe();
    EXPECT_FALSE(binary->bytes.empty());
    const cuda::PtxasReport report = cuda::parse_ptxas_report(binary->compile_log);
    EXPECT_EQ(report.spill_store_bytes, 0) << binary->compile_log;
    EXPECT_GT(report.registers, 0) << binary->compile_log;
  }
}

#if FLASHJIT_HAVE_CPU_BACKEND
// A CPU decode call with check_tables: each bad entry refused before the kernel reads it
// (InvalidArgument naming it); the good tables give the reference.
TEST(DecodeTableCheck, CpuDecodeRefusesBadTables) {
  std::unique_ptr<cpu::CpuBackend> backend = cpu::CpuBackend::create().value();
  AttentionProblem base = AttentionProblem::make(3, 4, 2, 1, 70, 64, DType::BF16, false);
  ft::DecodeInputs d = ft::make_decode_inputs(base, {70, 33, 5}, 16, 77);
  const AttentionProblem& p = d.problem;
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(*backend, nullptr, p, backend->default_config(p).value());
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  auto run = [&](const std::vector<int32_t>& table, const std::vector<int32_t>& lengths,
                 std::vector<uint16_t>* o_out) -> Status {
    std::vector<uint16_t> o = ft::poisoned_storage(p.o_span(), p.dtype);
    std::vector<float> lse(static_cast<size_t>(p.lse_elements()));
    AttentionArgs args{d.inputs.q.data(), d.inputs.k.data(), d.inputs.v.data(), o.data(),
                       lse.data()};
    args.block_table = table.data();
    args.seqlens_k = lengths.data();
    args.check_tables = true;
    Status status = (*kernel)->launch(p, args);
    if (o_out != nullptr) *o_out = o;
    return status;
  };
  std::vector<uint16_t> o;
  ASSERT_TRUE(run(d.inputs.block_table, d.inputs.seqlens_k, &o).ok());
  const int64_t columns = p.kv.max_pages;
  {
    std::vector<int32_t> table = d.inputs.block_table;
    table[1 * columns + 1] = static_cast<int32_t>(p.kv.num_pages);
    const Status status = run(table, d.inputs.seqlens_k, &o);
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.error().code, ErrorCode::InvalidArgument);
    EXPECT_NE(status.error().message.find("block_table[1][1] = " + std::to_string(p.kv.num_pages)),
              std::string::npos)
        << status.error().message;
    // Poisoned output untouched: the kernel did not run.
    EXPECT_EQ(o, ft::poisoned_storage(p.o_span(), p.dtype));
  }
  {
    std::vector<int32_t> lengths = d.inputs.seqlens_k;
    lengths[2] = -1;
    const Status status = run(d.inputs.block_table, lengths, nullptr);
    ASSERT_FALSE(status.ok());
    // The problem's seqlen_k (70) bounds the lengths: within the table's capacity (80).
    ASSERT_LE(p.seqlen_k, p.kv.capacity());
    EXPECT_NE(status.error().message.find("seqlens_k[2] = -1: must be in [0, " +
                                          std::to_string(p.seqlen_k) + "]"),
              std::string::npos)
        << status.error().message;
    lengths[2] = static_cast<int32_t>(p.kv.capacity() + 1);
    const Status past = run(d.inputs.block_table, lengths, nullptr);
    ASSERT_FALSE(past.ok());
    EXPECT_NE(past.error().message.find("seqlens_k[2] = " + std::to_string(p.kv.capacity() + 1)),
              std::string::npos)
        << past.error().message;
  }
}
#endif

// ---- CUDA GPU --------------------------------------------------------------------------------

class DecodeTableCheckGpu : public ::testing::Test {
 protected:
  void SetUp() override { FLASHJIT_REQUIRE_GPU(); }
};

ft::DecodeInputs gpu_inputs() {
  const AttentionProblem base = AttentionProblem::make(3, 8, 2, 1, 300, 128, DType::BF16, false);
  return ft::make_decode_inputs(base, {300, 17, 129}, 16, 4242);
}

// Good tables with the check on: the reference, also from a CUDA graph captured with the check.
TEST_F(DecodeTableCheckGpu, CheckedCallMatchesTheReference) {
  const Backend& backend = *ft::gpu_backend();
  const ft::DecodeInputs d = gpu_inputs();
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(backend, nullptr, d.problem, backend.default_config(d.problem).value());
  ASSERT_TRUE(kernel.ok()) << kernel.error().describe();
  Result<ft::Prepared> prepared = ft::prepare(backend, d);
  ASSERT_TRUE(prepared.ok()) << prepared.error().describe();
  prepared->tensors.args.check_tables = true;
  EXPECT_TRUE(ft::run_and_check(backend, **kernel, *prepared));
  EXPECT_TRUE(backend.synchronize().ok());

  // Graph-safe: the checked call captured on a stream (after a warm-up there, which compiles and
  // loads the check kernel and allocates the workspace) and replayed.
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(library, nullptr);
  auto get = [&](const char* name) { return dlsym(library, name); };
  using StreamCreate = CUresult (*)(CUstream*, unsigned);
  using BeginCapture = CUresult (*)(CUstream, CUstreamCaptureMode);
  using EndCapture = CUresult (*)(CUstream, CUgraph*);
  using Instantiate = CUresult (*)(CUgraphExec*, CUgraph, unsigned long long);
  using GraphLaunch = CUresult (*)(CUgraphExec, CUstream);
  using Synchronize = CUresult (*)(CUstream);
  auto stream_create = reinterpret_cast<StreamCreate>(get("cuStreamCreate"));
  auto begin_capture = reinterpret_cast<BeginCapture>(get("cuStreamBeginCapture_v2"));
  auto end_capture = reinterpret_cast<EndCapture>(get("cuStreamEndCapture"));
  auto instantiate = reinterpret_cast<Instantiate>(get("cuGraphInstantiateWithFlags"));
  auto graph_launch = reinterpret_cast<GraphLaunch>(get("cuGraphLaunch"));
  auto synchronize = reinterpret_cast<Synchronize>(get("cuStreamSynchronize"));
  ASSERT_TRUE(stream_create && begin_capture && end_capture && instantiate && graph_launch &&
              synchronize);
  const AttentionProblem& p = prepared->inputs.problem;
  const AttentionArgs& args = prepared->tensors.args;
  CUstream stream = nullptr;
  ASSERT_EQ(stream_create(&stream, 0), CUDA_SUCCESS);
  ASSERT_TRUE((*kernel)->launch(p, args, stream).ok());
  ASSERT_EQ(synchronize(stream), CUDA_SUCCESS);
  ASSERT_EQ(begin_capture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  const Status captured = (*kernel)->launch(p, args, stream);
  CUgraph graph = nullptr;
  ASSERT_EQ(end_capture(stream, &graph), CUDA_SUCCESS);
  ASSERT_TRUE(captured.ok()) << captured.error().describe();
  CUgraphExec exec = nullptr;
  ASSERT_EQ(instantiate(&exec, graph, 0), CUDA_SUCCESS);
  const size_t o_bytes = static_cast<size_t>(p.o_span()) * 2;
  ASSERT_TRUE(backend.fill_bytes(args.o, 0xFF, o_bytes).ok());
  ASSERT_EQ(graph_launch(exec, stream), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(stream), CUDA_SUCCESS);
  std::vector<uint16_t> o(static_cast<size_t>(p.o_span()));
  std::vector<float> lse(static_cast<size_t>(p.lse_elements()));
  ASSERT_TRUE(backend.copy_to_host(o.data(), args.o, o_bytes).ok());
  ASSERT_TRUE(backend.copy_to_host(lse.data(), args.lse, lse.size() * 4).ok());
  EXPECT_TRUE(ft::matches_reference(ft::compare(p, o, lse, prepared->reference)));
}

// In a child process (a trap loses the CUDA context): a checked call with one bad entry; the
// device's printf (stdout, sent to stderr here) names it and the synchronization fails.
void run_bad_call(int bad) {
  dup2(2, 1);
  const Backend& backend = *ft::gpu_backend();
  ft::DecodeInputs d = gpu_inputs();
  const int64_t columns = d.problem.kv.max_pages;
  if (bad == 0) d.inputs.block_table[2 * columns + 3] = 1000;  // sequence 2 uses 9 pages
  if (bad == 1) d.inputs.seqlens_k[1] = -7;
  if (bad == 2) d.inputs.seqlens_k[0] = static_cast<int32_t>(d.problem.kv.capacity() + 5);
  Result<std::shared_ptr<Kernel>> kernel =
      build_kernel(backend, nullptr, d.problem, backend.default_config(d.problem).value());
  if (!kernel.ok()) std::_Exit(10);
  Result<ft::DecodeTensors> tensors = ft::upload_decode(backend, d);
  if (!tensors.ok()) std::_Exit(11);
  tensors->args.check_tables = true;
  if (!(*kernel)->launch(d.problem, tensors->args).ok()) std::_Exit(12);
  const Status synced = backend.synchronize();
  std::fflush(stdout);
  std::fprintf(stderr, "synchronize: %s\n", synced.ok() ? "ok" : synced.error().describe().c_str());
  std::fflush(stderr);
  std::_Exit(synced.ok() ? 0 : 3);
}

TEST_F(DecodeTableCheckGpu, BadEntriesTrapNamingTheFirst) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_bad_call(0), ::testing::ExitedWithCode(3),
              "block_table\\[2\\]\\[3\\] = 1000: must be a page in \\[0, [0-9]+\\)");
  EXPECT_EXIT(run_bad_call(1), ::testing::ExitedWithCode(3),
              "seqlens_k\\[1\\] = -7: must be in \\[0, [0-9]+\\]");
  EXPECT_EXIT(run_bad_call(2), ::testing::ExitedWithCode(3), "seqlens_k\\[0\\] = [0-9]+: must be");
}

}  // namespace
}  // namespace flashjit
