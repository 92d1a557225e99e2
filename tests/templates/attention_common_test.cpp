// The key-range and masking rules every GPU template shares (templates/attention_common.h),
// compiled for the host and checked by brute force over every (query row, key) pair of many
// shapes: a block the rules skip has no visible pair, a block they leave unmasked has no hidden
// one. Both passes depend on them: the forward walks key blocks per query block, the backward
// query blocks per key block.
#include <gtest/gtest.h>

#include <string>

#include "templates/attention_params.h"
// After the params struct it reads.
#include "templates/attention_common.h"

namespace flashjit {
namespace {

namespace fa = flashjit_attention;

// The definition the rules implement (generator/problem.hpp): causal, bottom-right aligned.
bool visible(int row, int key, int seqlen_q, int seqlen_k, bool causal) {
  return key < seqlen_k && row < seqlen_q && (!causal || key <= row + seqlen_k - seqlen_q);
}

template <bool CAUSAL>
void check_shape(int seqlen_q, int seqlen_k, int block_m, int block_n) {
  FlashjitAttentionParams p{};
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  const int diagonal = fa::diagonal(p);
  const std::string where = "sq " + std::to_string(seqlen_q) + " sk " + std::to_string(seqlen_k) +
                            " bm " + std::to_string(block_m) + " bn " + std::to_string(block_n) +
                            (CAUSAL ? " causal" : "");
  const int query_blocks = fa::query_blocks(p, block_m);
  ASSERT_EQ(query_blocks, (seqlen_q + block_m - 1) / block_m) << where;
  const int key_block_count = (seqlen_k + block_n - 1) / block_n;

  for (int row = 0; row < seqlen_q; ++row) {
    const int last = fa::last_key<CAUSAL>(p, diagonal, row);
    for (int key = 0; key < seqlen_k; ++key)
      ASSERT_EQ(key <= last, visible(row, key, seqlen_q, seqlen_k, CAUSAL))
          << where << " row " << row << " key " << key;
  }

  for (int mb = 0; mb < query_blocks; ++mb) {
    const int m0 = mb * block_m;
    const int key_blocks = fa::key_blocks<CAUSAL>(p, diagonal, m0, block_m, block_n);
    for (int nb = 0; nb < key_block_count; ++nb) {
      const int n0 = nb * block_n;
      bool any_visible = false, any_hidden = false;
      for (int row = m0; row < m0 + block_m && row < seqlen_q; ++row)
        for (int key = n0; key < n0 + block_n; ++key) {
          (visible(row, key, seqlen_q, seqlen_k, CAUSAL) ? any_visible : any_hidden) = true;
        }
      // The forward: key blocks [0, key_blocks) of query block mb; the backward: query blocks
      // [first_query_block, query_blocks) of key block nb. Nothing visible outside either.
      if (nb >= key_blocks) {
        ASSERT_FALSE(any_visible) << where << ": key block " << nb << " skipped for rows " << m0;
      }
      if (mb < fa::first_query_block<CAUSAL>(diagonal, n0, block_m)) {
        ASSERT_FALSE(any_visible) << where << ": query block " << mb << " skipped for keys " << n0;
      }
      // Blocks the rules call unmasked hide nothing from the real rows.
      if (!fa::block_needs_mask<CAUSAL>(p, diagonal, m0, n0, block_n)) {
        ASSERT_FALSE(any_hidden) << where << ": block (" << m0 << ", " << n0
                                 << ") left unmasked hides a pair";
      }
    }
  }
  // The first query block a key block meets does see it (when any row does): no wasted block
  // at the start, so the count the backward derives is tight.
  for (int nb = 0; nb < key_block_count; ++nb) {
    const int n0 = nb * block_n;
    const int first = fa::first_query_block<CAUSAL>(diagonal, n0, block_m);
    if (first >= query_blocks) continue;
    bool sees = false;
    for (int row = first * block_m; row < (first + 1) * block_m && row < seqlen_q; ++row)
      for (int key = n0; key < n0 + block_n && key < seqlen_k; ++key)
        sees = sees || visible(row, key, seqlen_q, seqlen_k, CAUSAL);
    EXPECT_TRUE(sees) << where << ": key block " << nb << " starts at query block " << first
                      << ", which sees none of it";
  }
}

TEST(AttentionCommon, KeyRangesAndMasksMatchTheDefinition) {
  const int sizes[] = {1, 2, 15, 16, 17, 31, 64, 65, 100, 127, 128, 129, 250};
  for (int seqlen_q : sizes)
    for (int seqlen_k : sizes)
      for (int block_m : {32, 64, 128})
        for (int block_n : {32, 64, 128}) {
          check_shape<false>(seqlen_q, seqlen_k, block_m, block_n);
          check_shape<true>(seqlen_q, seqlen_k, block_m, block_n);
          if (::testing::Test::HasFatalFailure()) return;
        }
}

}  // namespace
}  // namespace flashjit
