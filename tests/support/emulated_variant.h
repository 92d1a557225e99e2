// The variant prelude the generator renders for emulated_variant()
// (tests/support/variant_cases.hpp) for the CUDA and HIP host emulation tests, which compile the
// kernel templates in: include it where the renderer puts the prelude (after
// templates/attention_params.h and the emulator, before templates/attention_common.h), with
// FLASHJIT_VARIANT_MASK_MOD defined to 0 or 1 first (and FLASHJIT_VARIANT_SCORE_MOD_GRAD to 1 for
// a backward kernel). Each test checks that render_variant_prelude() gives these lines.
#pragma once

#ifndef FLASHJIT_VARIANT_MASK_MOD
#error "define FLASHJIT_VARIANT_MASK_MOD (0 or 1) before including support/emulated_variant.h"
#endif

// clang-format off
#define FLASHJIT_VARIANT 1
#define FLASHJIT_VARIANT_CAUSAL 1
#define FLASHJIT_VARIANT_WINDOW_LEFT (40)
#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)
#define FLASHJIT_VARIANT_PREFIX 24
#define FLASHJIT_VARIANT_SOFTCAP 2.000000000e+00f
#define FLASHJIT_VARIANT_ALIBI 1
#define FLASHJIT_VARIANT_SCORE_MOD 1
#include "templates/attention_variant.h"
// clang-format on

namespace flashjit_variant {
FLASHJIT_DEVICE float user_score_mod(float score, int batch, int head, int q_idx, int kv_idx) {
  return static_cast<float>(score - 0.05f * abs(q_idx - kv_idx) + 0.25f * head - batch);
}
#if FLASHJIT_VARIANT_MASK_MOD
FLASHJIT_DEVICE bool user_mask_mod(int batch, int head, int q_idx, int kv_idx) {
  return static_cast<bool>((kv_idx + head + batch) % 5 != 0 || q_idx < 8);
}
#endif
#if FLASHJIT_VARIANT_SCORE_MOD_GRAD
FLASHJIT_DEVICE float user_score_mod_grad(float, int, int, int, int) {
  return static_cast<float>(1.0f);
}
#endif
}  // namespace flashjit_variant
