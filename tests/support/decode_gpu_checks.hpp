// The GPU checks of a decode family, shared by the backends' tests (tests/runtime/
// cuda_decode_test.cpp, hip_decode_test.cpp): decode inputs on the device, a run against the fp64
// reference with poisoned outputs, the decode shapes (batch up to 8, GQA 1:1 to 8:1, lengths 1,
// page_size +- 1 and thousands, seqlen_q 1 to 16, chunked prefill), and the checks themselves.
// Keys and pages a kernel must not read are NaN (support/decode_cases.hpp). Call them from a test
// that has made sure the backend has a device.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "generator/config.hpp"
#include "runtime/backend.hpp"
#include "support/decode_cases.hpp"
#include "support/device_run.hpp"
#include "tuner/reference.hpp"
#include "tuner/workload.hpp"

namespace flashjit::testing {

// The decode inputs on the device (tuner/workload.hpp's tensors of the call: q, k, v, o, lse,
// the block table and the lengths) and the args pointing at them.
struct DecodeTensors {
  DeviceTensors tensors;
  AttentionArgs args;
  void* buffer(TensorRole role) const { return tensors.find(role)->get(); }
};

// One case's inputs on the device and its reference, made once for every config run on it.
struct Prepared {
  DecodeInputs inputs;
  Reference reference;
  DecodeTensors tensors;
};

struct DecodeGpuCase {
  const char* name;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  std::vector<int32_t> lengths;
};

Result<DecodeTensors> upload_decode(const Backend& backend, const DecodeInputs& d);
Result<Prepared> prepare(const Backend& backend, DecodeInputs d);
::testing::AssertionResult run_and_check(const Backend& backend, const Kernel& kernel,
                                         const Prepared& prepared);
::testing::AssertionResult run_and_check(const Backend& backend, const Kernel& kernel,
                                         const DecodeInputs& d);
std::vector<DecodeGpuCase> decode_gpu_cases(int page);

// Every legal tile (auto splits) of d = 128 bf16 paged (16 keys per page), causal and not, and
// splits 1 / 3 / 200 (more than the blocks: empty ranges) on the default tile.
void check_every_legal_decode_tile(const Backend& backend);
// The defaults of other groups: head dims 64, 96 (padded), 256, fp16, page sizes 32 and 256,
// contiguous caches with and without per-sequence lengths.
void check_decode_defaults(const Backend& backend);
// The split counters of the fused combine across changing workspace layouts and caller
// workspaces, for `config` (a legal d 128 bf16 tile; run with 5 splits).
void check_decode_split_counters(const Backend& backend, AttentionConfig config);
// Runtime::attention on backend `backend_name` serves a decode config for a decode problem.
void check_runtime_serves_decode(const std::string& backend_name);

}  // namespace flashjit::testing
