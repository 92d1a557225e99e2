// FLASHJIT_EMULATED_ENTRY(name): a backward kernel's entry as the renderer picks it
// (generator/render.cpp): with packed documents compiled in (FLASHJIT_VARIANT_VARLEN), the
// *_varlen one, which runs each CTA on its document's view of the params
// (templates/attention_variant.h, document_tile_view). For the host emulations'
// launch sequences (support/cuda_backward_emulation.hpp, support/sm90_backward_emulation.hpp):
// include it after the variant prelude.
#pragma once

#if defined(FLASHJIT_VARIANT) && FLASHJIT_VARIANT_VARLEN
#define FLASHJIT_EMULATED_ENTRY(name) name##_varlen
#else
#define FLASHJIT_EMULATED_ENTRY(name) name
#endif
