// The block-map tests' masks and their host evaluation (issue 31): the mask cases the
// emulation tests compile in as one mask_mod that dispatches on block_mask_case (so that one
// translation unit tests them all), the expected states of a tile by evaluating the mask on every
// element on the host, and a check of a built map (states, both lists) against them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "generator/block_mask.hpp"
#include "templates/attention_params.h"

namespace flashjit::testing {

// The masks (with whatever causal, window and prefix the test compiles in on top):
//   0 documents of 48 tokens: whole tiles empty, full tiles at 16 rows, partial ones across
//   1 documents of 64, rows [64, 160) seeing nothing: whole rows and whole query tiles empty
//   2 nothing hidden (true)
//   3 everything hidden (false): every row without a key
//   4 (kv_idx + head + 2 batch) % 7 != 0 || q_idx < 5: per (batch, head), almost all partial
enum BlockMaskCase { kDocuments48, kEmptyRows, kNothingHidden, kAllHidden, kPerHead, kMaskCases };
inline int block_mask_case = kDocuments48;  // the case the compiled-in mask_mod evaluates
bool block_mask_case_mask(int mask_case, int64_t batch, int64_t head, int64_t q, int64_t k);
const char* block_mask_case_name(int mask_case);
// The same mask as a mask_mod expression (for the generator: the GPU tests, the compile test).
const char* block_mask_case_expression(int mask_case);

// A host map with the layout of `shape` (FlashjitBlockMask's pointers into `storage`), every
// byte poisoned (0x7f) so that an entry the builder does not write shows.
struct HostBlockMask {
  BlockMaskShape shape;
  std::vector<unsigned char> storage;
  FlashjitBlockMask map{};
};
HostBlockMask host_block_mask(const BlockMaskShape& shape);

// The expected state of every tile of `shape` (0 empty, 1 partial, 2 full) for `visible(batch,
// head, row, key)` (keys past seqlen_k unseen, rows past seqlen_q left out), then the built map
// compared with it: states, counts and list entries. "" when equal, else the first difference.
template <class Visible>
std::vector<unsigned char> expected_states(const BlockMaskShape& shape, const Visible& visible) {
  std::vector<unsigned char> states;
  for (int64_t map = 0; map < shape.maps(); ++map) {
    const int64_t b = shape.per_head ? map / shape.heads_q : 0;
    const int64_t h = shape.per_head ? map % shape.heads_q : 0;
    for (int64_t qt = 0; qt < shape.q_tiles(); ++qt)
      for (int64_t kt = 0; kt < shape.k_tiles(); ++kt) {
        bool any = false, all = true;
        for (int64_t i = qt * shape.block_m; i < (qt + 1) * shape.block_m && i < shape.seqlen_q;
             ++i)
          for (int64_t j = kt * shape.block_n; j < (kt + 1) * shape.block_n; ++j) {
            const bool seen = j < shape.seqlen_k && visible(b, h, i, j);
            any |= seen;
            all &= seen;
          }
        states.push_back(!any ? 0 : all ? 2 : 1);
      }
  }
  return states;
}
// Writes the states and both lists of `map` from `states` (expected_states' order), as the
// builder would: for the kernels' emulation tests where the builder's emulator cannot run.
void fill_block_mask(HostBlockMask& map, const std::vector<unsigned char>& states);
std::string compare_block_mask(const HostBlockMask& built,
                               const std::vector<unsigned char>& expected);

}  // namespace flashjit::testing
