#include "support/decode_cases.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace flashjit::testing {

namespace {

void fill_nan(std::vector<uint16_t>& storage, int64_t offset, int64_t elements, DType dtype) {
  for (int64_t i = 0; i < elements; ++i)
    set_element(storage.data(), offset + i, std::numeric_limits<float>::quiet_NaN(), dtype);
}

// Element offset of key j of sequence b, kv head h, in the cache of `d` (k and v alike).
int64_t key_offset(const DecodeInputs& d, const Strides& s, int64_t b, int64_t j, int64_t h) {
  const KvCache& kv = d.problem.kv;
  if (!kv.paged()) return b * s.batch + j * s.seq + h * s.head;
  const int64_t page = d.inputs.block_table[b * kv.max_pages + j / kv.page_size];
  return page * s.batch + (j % kv.page_size) * s.seq + h * s.head;
}

}  // namespace

DecodeInputs make_decode_inputs(AttentionProblem problem, const std::vector<int32_t>& lengths,
                                int page_size, uint64_t seed) {
  DecodeInputs d;
  std::mt19937_64 engine(seed ^ 0x5eedull);
  if (page_size > 0) {
    int64_t used = 0;
    for (int32_t len : lengths) used += (len + page_size - 1) / page_size;
    problem = problem.with_paged_kv(page_size, used + 3);
  } else {
    problem.kv = KvCache{};
    problem.kv.seqlens_k = true;
  }
  d.problem = problem;
  d.inputs = random_inputs(problem, seed);
  d.inputs.seqlens_k = lengths;
  const int64_t d_head = problem.head_dim;
  if (problem.kv.paged()) {
    const KvCache& kv = problem.kv;
    std::vector<int32_t> pages(static_cast<size_t>(kv.num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), engine);
    const int32_t nan_page = pages.back();  // named by every unused table entry
    d.inputs.block_table.assign(static_cast<size_t>(problem.batch * kv.max_pages), nan_page);
    size_t next = 0;
    for (int64_t b = 0; b < problem.batch; ++b)
      for (int64_t i = 0; i < (lengths[b] + page_size - 1) / page_size; ++i)
        d.inputs.block_table[b * kv.max_pages + i] = pages[next++];
    // NaN: every page but the used ones (pages[0, next)), and each used page past the length.
    std::vector<bool> used_page(static_cast<size_t>(kv.num_pages), false);
    for (size_t i = 0; i < next; ++i) used_page[pages[i]] = true;
    for (std::vector<uint16_t>* cache : {&d.inputs.k, &d.inputs.v}) {
      const Strides& s = cache == &d.inputs.k ? problem.k_strides : problem.v_strides;
      for (int64_t page = 0; page < kv.num_pages; ++page)
        if (!used_page[page])
          for (int64_t r = 0; r < page_size; ++r)
            for (int64_t h = 0; h < problem.heads_kv; ++h)
              fill_nan(*cache, page * s.batch + r * s.seq + h * s.head, d_head, problem.dtype);
      for (int64_t b = 0; b < problem.batch; ++b) {
        const int64_t pages_b = (lengths[b] + page_size - 1) / page_size;
        for (int64_t j = lengths[b]; j < pages_b * page_size; ++j)
          for (int64_t h = 0; h < problem.heads_kv; ++h)
            fill_nan(*cache, key_offset(d, s, b, j, h), d_head, problem.dtype);
      }
    }
  } else {
    for (std::vector<uint16_t>* cache : {&d.inputs.k, &d.inputs.v}) {
      const Strides& s = cache == &d.inputs.k ? problem.k_strides : problem.v_strides;
      for (int64_t b = 0; b < problem.batch; ++b)
        for (int64_t j = lengths[b]; j < problem.seqlen_k; ++j)
          for (int64_t h = 0; h < problem.heads_kv; ++h)
            fill_nan(*cache, key_offset(d, s, b, j, h), d_head, problem.dtype);
    }
  }
  return d;
}

std::vector<DecodeShape> decode_shapes(int page_size) {
  const int page = page_size > 0 ? page_size : 64;
  return {
      {3, 8, 2, 1, page + 1, {1, page - 1, page + 1}},  // GQA 4:1, one query
      {2, 2, 2, 3, 2 * page + 5, {0, 2 * page + 5}},    // MHA, a sequence with no key
      {1, 16, 2, 2, 3 * page, {3 * page - 7}},          // GQA 8:1 x 2 queries = 16 rows
      {1, 4, 1, 16, page + 17, {page + 17}},            // MQA, 16 queries = 64 rows
      {2, 2, 1, 21, 2 * page, {2 * page, 12}},          // chunked prefill
  };
}

}  // namespace flashjit::testing
