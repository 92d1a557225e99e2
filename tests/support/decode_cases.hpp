// Decode-family test inputs: a K/V cache (contiguous, or paged with the pages of every sequence
// shuffled through the cache) with per-sequence lengths, and the fp64 reference of a problem that
// reads it (tuner/reference.hpp's, per sequence, over the keys the sequence has).
//
// Everything a correct kernel must not read is NaN: the keys past each sequence's length (the
// tail of its last page, the rest of a contiguous row), the pages no block table names, and the
// block-table entries past a sequence's pages point at a page of NaN. A kernel reading any of them
// gets NaN into its output, which the comparison fails.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "generator/problem.hpp"
#include "tuner/reference.hpp"

namespace flashjit::testing {

struct DecodeInputs {
  AttentionProblem problem;  // the problem as given (paged: with num_pages, max_pages)
  // q over q_span; k, v over kv_span (the cache); seqlens_k [batch]; block_table [batch,
  // max_pages] when paged.
  HostInputs inputs;
};

// `lengths` (one per sequence, each <= seqlen_k) become the problem's seqlens_k; with
// page_size > 0 the cache is paged: max_pages = ceil(seqlen_k / page_size), the used pages of all
// sequences shuffled over num_pages = used + 3 pages (one of them all NaN, named by the unused
// block-table entries). page_size == 0: contiguous K/V (kv.seqlens_k set). `problem.kv` is
// overwritten.
DecodeInputs make_decode_inputs(AttentionProblem problem, const std::vector<int32_t>& lengths,
                                int page_size, uint64_t seed);

// A problem shape of the decode emulation tests (CUDA's and HIP's), with its sequences' lengths.
struct DecodeShape {
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  std::vector<int32_t> lengths;  // per sequence; the paged cache's page size is the config's
};

// Small enough to emulate, around every edge: lengths 0, 1, 15..17 (page 16), a page +- 1 of the
// larger pages, GQA 1:1 .. 8:1, MQA, seqlen_q 1 .. 16, chunked prefill (seqlen_q 21 > keys of
// the second sequence: causal rows with no key). page_size 0 (contiguous): as for pages of 64.
std::vector<DecodeShape> decode_shapes(int page_size);

// The fp64 reference of `d.problem` over d.inputs (tuner/reference.hpp's, per sequence): o dense
// [batch, seqlen_q, heads_q, d] and lse [batch, heads_q, seqlen_q] (a sequence of 0 keys: o = 0,
// lse = +inf).
inline Reference decode_reference(const DecodeInputs& d) {
  return reference_attention(d.problem, d.inputs);
}

}  // namespace flashjit::testing
