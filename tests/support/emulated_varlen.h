// The variant prelude the generator renders for ft::varlen_emulation_problem()
// (tests/support/variant_cases.hpp: packed documents, causal, window (30, -1)) for the varlen
// host emulation tests (CUDA mma, wgmma and -ws, HIP; the CUDA backward's): include it where the
// renderer puts the prelude (after templates/attention_params.h and the emulator). Each of those
// tests checks that render_variant_prelude() gives these lines.
// FLASHJIT_EMULATED_VARLEN_NON_CAUSAL=1 (a compile definition of the tests' second builds): the
// documents alone, not causal, without a window (varlen_emulation_problem(.., false));
// FLASHJIT_EMULATED_VARLEN_CAUSAL_WINDOW says which.
#pragma once

// clang-format off
#define FLASHJIT_VARIANT 1
#if FLASHJIT_EMULATED_VARLEN_NON_CAUSAL  // ft::varlen_emulation_problem(dtype, d, false)
#define FLASHJIT_EMULATED_VARLEN_CAUSAL_WINDOW 0
#define FLASHJIT_VARIANT_CAUSAL 0
#define FLASHJIT_VARIANT_WINDOW_LEFT (-1)
#else
#define FLASHJIT_EMULATED_VARLEN_CAUSAL_WINDOW 1
#define FLASHJIT_VARIANT_CAUSAL 1
#define FLASHJIT_VARIANT_WINDOW_LEFT (30)
#endif
#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)
#define FLASHJIT_VARIANT_PREFIX 0
#define FLASHJIT_VARIANT_ALIBI 0
#define FLASHJIT_VARIANT_SCORE_MOD 0
#define FLASHJIT_VARIANT_MASK_MOD 0
#define FLASHJIT_VARIANT_VARLEN 1
#include "templates/attention_variant.h"
#include "templates/attention_common.h"  // after the variant, as the renderer places them
// clang-format on
