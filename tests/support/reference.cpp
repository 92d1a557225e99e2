#include "support/reference.hpp"

namespace flashjit::testing {

::testing::AssertionResult matches_reference(const Comparison& comparison, double max_rel,
                                             double max_lse_abs) {
  if (within_tolerance(comparison, max_rel, max_lse_abs)) {
    return ::testing::AssertionSuccess() << comparison.to_string();
  }
  return ::testing::AssertionFailure()
         << "mismatch vs fp64 reference (limits: o_rel_error <= " << max_rel
         << ", lse_max_abs_error <= " << max_lse_abs << "): " << comparison.to_string();
}

}  // namespace flashjit::testing
