// What the attention tests share beyond the reference: the shapes they run (sizes, GQA, layouts,
// per-tensor padded strides for every tensor a pass reads or writes), a binary cache for their
// compiles and a parallel build of many configs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "generator/problem.hpp"
#include "runtime/backend.hpp"
#include "runtime/binary_cache.hpp"

namespace flashjit::testing {

enum class Storage {
  kBshd,        // contiguous [batch, seq, heads, d]
  kBshdPadded,  // BSHD with padding after each head, sequence row and batch, different per tensor
  kBhsd,        // contiguous [batch, heads, seq, d]
};

struct Shape {
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  Storage storage = Storage::kBshd;

  std::string to_string() const;  // "(b1 hq2 hkv2 sq17 sk17 bshd)"
};

// The GPU tests' shapes (15, up to 4097 rows): a single row, ragged tails, seqlen_q != seqlen_k
// both ways (causal rows that see no key), GQA, MQA, batches, BHSD and padded strides.
const std::vector<Shape>& gpu_test_shapes();
// Small shapes for the host emulation of the kernels (9, up to 130 rows), covering the same
// cases.
const std::vector<Shape>& emulation_shapes();

// BSHD strides with `head_pad` elements after each head's row, `seq_pad` after each sequence row
// and `batch_pad` after each batch (all multiples of 8, as validate() requires).
Strides padded_bshd(int64_t seqlen, int64_t heads, int head_dim, int head_pad, int seq_pad,
                    int batch_pad);

// The problem of `shape` for `pass`. kBshdPadded pads every tensor differently (q, k, v, o and,
// for the backward, do, dq, dk, dv), so that a kernel using one tensor's strides for another's
// reads or writes the wrong elements.
AttentionProblem make_problem(const Shape& shape, int head_dim, DType dtype, bool causal,
                              Pass pass = Pass::Forward);

// An emulation test case's name for gtest: "d64_m64n32w4s2_bf16_causal" (the '-' of a config's
// suffix as '_').
std::string emulation_case_name(int head_dim, const AttentionConfig& config, DType dtype,
                                bool causal);

// `configs` restricted to the kernel families named in $FLASHJIT_TEST_FAMILIES (a comma list of
// "mma", "wgmma", "ws", "decode"; unset or empty: every family), so that a GPU session can run one
// family's tests alone (bench/device_run.sh ws). The families kept are printed once per process.
std::vector<AttentionConfig> selected_families(const std::vector<AttentionConfig>& configs);

// A binary cache for a test's compiles: $FLASHJIT_CACHE_DIR's default directory when that is
// set (reruns on the GPU machine skip compiling), else a fresh temporary directory removed
// afterwards.
class TestCache {
 public:
  TestCache();
  ~TestCache();
  TestCache(const TestCache&) = delete;
  TestCache& operator=(const TestCache&) = delete;
  const BinaryCache* get() const { return cache_.get(); }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  bool shared_ = false;
  std::filesystem::path dir_;
  std::unique_ptr<BinaryCache> cache_;
};

struct BuiltKernel {
  AttentionConfig config;
  std::shared_ptr<Kernel> kernel;  // null when the build failed
  std::string error;
  double seconds = 0;
};

// Every config of `problem`'s signature built (render, cache or compile, load) concurrently:
// NVRTC compiles are independent and thread-safe. In the order of `configs`.
std::vector<BuiltKernel> build_all(const Backend& backend, const BinaryCache* cache,
                                   const AttentionProblem& problem,
                                   const std::vector<AttentionConfig>& configs);

}  // namespace flashjit::testing
