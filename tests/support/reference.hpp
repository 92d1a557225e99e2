// Test support: half-precision conversions, random inputs and an fp64 attention reference that
// every backend's output is compared against.
//
// The reference itself lives in the library (tuner/reference.hpp: the tuner verifies every variant
// with it); this header re-exports it into flashjit::testing and adds the gtest verdict.
#pragma once

#include <gtest/gtest.h>

#include "tuner/reference.hpp"

namespace flashjit::testing {

using ::flashjit::bf16_to_float;
using ::flashjit::compare;
using ::flashjit::Comparison;
using ::flashjit::element_value;
using ::flashjit::float_to_bf16;
using ::flashjit::float_to_fp16;
using ::flashjit::float_to_half;
using ::flashjit::fp16_to_float;
using ::flashjit::half_to_float;
using ::flashjit::HostInputs;
using ::flashjit::kPoisonBits;
using ::flashjit::poisoned_storage;
using ::flashjit::random_inputs;
using ::flashjit::Reference;
using ::flashjit::reference_attention;
using ::flashjit::set_element;
using ::flashjit::storage_words;

// Passes when o is within `max_rel` relative L2 error, has no NaN/inf, nothing was left poisoned,
// no padding was written, and lse agrees within `max_lse_abs` with matching infinities
// (flashjit::within_tolerance). The failure message prints every field.
::testing::AssertionResult matches_reference(const Comparison& comparison, double max_rel = 1e-2,
                                             double max_lse_abs = 1e-3);

}  // namespace flashjit::testing
