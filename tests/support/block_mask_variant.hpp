// The block-map emulation tests' variant: causal plus a mask_mod that reads the case chosen in
// support/variant_cases.hpp (block_mask_case), with the block map compiled in. Included where
// the renderer puts the variant block: after the emulator, before the templates.
#pragma once
// clang-format off
#define FLASHJIT_VARIANT 1
#define FLASHJIT_VARIANT_CAUSAL 1
#define FLASHJIT_VARIANT_WINDOW_LEFT (-1)
#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)
#define FLASHJIT_VARIANT_PREFIX 0
#define FLASHJIT_VARIANT_ALIBI 0
#define FLASHJIT_VARIANT_SCORE_MOD 0
#define FLASHJIT_VARIANT_MASK_MOD 1
#define FLASHJIT_VARIANT_VARLEN 0
#define FLASHJIT_VARIANT_BLOCK_MASK 1
#include "templates/attention_variant.h"
namespace flashjit_variant {
FLASHJIT_DEVICE bool user_mask_mod(int batch, int head, int q_idx, int kv_idx) {
  return flashjit::testing::block_mask_case_mask(flashjit::testing::block_mask_case, batch, head,
                                                 q_idx, kv_idx);
}
}  // namespace flashjit_variant
// clang-format on
