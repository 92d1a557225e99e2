// The comparison of a kernel's outputs and gradients with the fp64 reference (see
// reference.hpp): relative L2 error, non-finite, poisoned and padding elements, tolerances.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "tuner/reference.hpp"

namespace flashjit {
namespace {

// One strided output tensor [batch, seqlen, heads, d] in raw storage against its dense
// reference (same order): relative L2 error, non-finite, poisoned and padding elements.
TensorComparison compare_tensor(const AttentionProblem& problem, const Strides& strides,
                                int64_t batch, int64_t seqlen, int64_t heads,
                                const std::vector<uint16_t>& bits,
                                const std::vector<double>& reference) {
  TensorComparison result;
  const int d = problem.head_dim;
  const int words = storage_words(problem.dtype);
  const size_t elements = bits.size() / static_cast<size_t>(words);
  std::vector<bool> logical(elements, false);
  auto poisoned = [&](size_t element) {
    for (int w = 0; w < words; ++w)
      if (bits[element * words + w] != kPoisonBits) return false;
    return true;
  };

  double diff_squared = 0, ref_squared = 0;
  size_t ref_index = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seqlen; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = b * strides.batch + s * strides.seq + h * strides.head;
        for (int c = 0; c < d; ++c, ++ref_index) {
          const double ref = reference[ref_index];
          ref_squared += ref * ref;
          const size_t offset = static_cast<size_t>(base + c);
          if (offset >= elements) {  // caller passed too little: count as garbage
            ++result.nan_count;
            continue;
          }
          logical[offset] = true;
          if (poisoned(offset)) ++result.poisoned_left;
          const double value =
              element_value(bits.data(), static_cast<int64_t>(offset), problem.dtype);
          if (!std::isfinite(value)) {
            ++result.nan_count;
            continue;
          }
          diff_squared += (value - ref) * (value - ref);
        }
      }
    }
  }
  for (size_t i = 0; i < elements; ++i) {
    if (!logical[i] && !poisoned(i)) ++result.padding_written;
  }
  const double diff_norm = std::sqrt(diff_squared), ref_norm = std::sqrt(ref_squared);
  result.rel_error = ref_norm > 0 ? diff_norm / ref_norm : diff_norm;
  return result;
}

bool tensor_ok(const TensorComparison& t, double max_rel) {
  // Written as x <= limit so that a NaN error fails.
  return t.rel_error <= max_rel && t.nan_count == 0 && t.poisoned_left == 0 &&
         t.padding_written == 0;
}

void describe(std::ostringstream& out, const char* name, const TensorComparison& t) {
  out << name << "_rel_error=" << t.rel_error << " " << name << "_nan_count=" << t.nan_count << " "
      << name << "_poisoned_left=" << t.poisoned_left << " " << name
      << "_padding_written=" << t.padding_written;
}

}  // namespace

Comparison compare(const AttentionProblem& problem, const std::vector<uint16_t>& o_bits,
                   const std::vector<float>& lse, const Reference& reference) {
  Comparison result;
  // Varlen: one packed sequence of the rows that belong to a document (reference.o's).
  const bool varlen = problem.variant.varlen;
  const int64_t row_elements = problem.heads_q * problem.head_dim;
  const int64_t rows =
      varlen ? static_cast<int64_t>(reference.o.size()) / row_elements : problem.seqlen_q;
  const TensorComparison o = compare_tensor(problem, problem.o_strides, varlen ? 1 : problem.batch,
                                            rows, problem.heads_q, o_bits, reference.o);
  result.o_rel_error = o.rel_error;
  result.o_nan_count = o.nan_count;
  result.poisoned_left = o.poisoned_left;
  result.o_padding_written = o.padding_written;

  result.lse_checked = !lse.empty();
  if (result.lse_checked) {
    for (size_t row = 0; row < reference.lse.size(); ++row) {
      const double ref = reference.lse[row];
      const double got = row < lse.size() ? lse[row] : std::numeric_limits<double>::quiet_NaN();
      const bool ref_infinite = ref == std::numeric_limits<double>::infinity();
      const bool got_infinite = got == std::numeric_limits<double>::infinity();
      if (ref_infinite || got_infinite) {
        if (ref_infinite != got_infinite) ++result.lse_mismatched_infinite;
        continue;
      }
      const double error =
          std::isfinite(got) ? std::abs(got - ref) : std::numeric_limits<double>::infinity();
      result.lse_max_abs_error = std::max(result.lse_max_abs_error, error);
    }
  }
  return result;
}

GradientComparison compare_gradients(const AttentionProblem& problem,
                                     const std::vector<uint16_t>& dq_bits,
                                     const std::vector<uint16_t>& dk_bits,
                                     const std::vector<uint16_t>& dv_bits,
                                     const Reference& reference) {
  GradientComparison result;
  // Varlen: one packed sequence of the rows that belong to a document (the reference's).
  const bool varlen = problem.variant.varlen;
  const int64_t batch = varlen ? 1 : problem.batch;
  auto rows = [&](const std::vector<double>& reference_rows, int64_t heads, int64_t seqlen) {
    return varlen ? static_cast<int64_t>(reference_rows.size()) / (heads * problem.head_dim)
                  : seqlen;
  };
  result.dq = compare_tensor(problem, problem.dq_strides, batch,
                             rows(reference.dq, problem.heads_q, problem.seqlen_q), problem.heads_q,
                             dq_bits, reference.dq);
  result.dk = compare_tensor(problem, problem.dk_strides, batch,
                             rows(reference.dk, problem.heads_kv, problem.seqlen_k),
                             problem.heads_kv, dk_bits, reference.dk);
  result.dv = compare_tensor(problem, problem.dv_strides, batch,
                             rows(reference.dv, problem.heads_kv, problem.seqlen_k),
                             problem.heads_kv, dv_bits, reference.dv);
  return result;
}

double GradientComparison::max_rel_error() const {
  if (std::isnan(dq.rel_error) || std::isnan(dk.rel_error) || std::isnan(dv.rel_error))
    return std::numeric_limits<double>::quiet_NaN();
  return std::max({dq.rel_error, dk.rel_error, dv.rel_error});
}

std::string GradientComparison::to_string() const {
  std::ostringstream out;
  out.precision(3);
  describe(out, "dq", dq);
  out << " ";
  describe(out, "dk", dk);
  out << " ";
  describe(out, "dv", dv);
  return out.str();
}

double gradient_tolerance(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return 1e-2;
    case DType::F16:
      return 2e-3;
    case DType::F32:
      return 2e-5;
  }
  return 1e-2;
}

bool within_tolerance(const GradientComparison& comparison, double max_rel) {
  return tensor_ok(comparison.dq, max_rel) && tensor_ok(comparison.dk, max_rel) &&
         tensor_ok(comparison.dv, max_rel);
}

std::string Comparison::to_string() const {
  std::ostringstream out;
  out.precision(3);
  out << "o_rel_error=" << o_rel_error << " o_nan_count=" << o_nan_count
      << " poisoned_left=" << poisoned_left << " o_padding_written=" << o_padding_written;
  if (lse_checked) {
    out << " lse_max_abs_error=" << lse_max_abs_error
        << " lse_mismatched_infinite=" << lse_mismatched_infinite;
  } else {
    out << " lse=unchecked";
  }
  return out.str();
}

bool within_tolerance(const Comparison& comparison, double max_rel, double max_lse_abs) {
  // Written as x <= limit so that a NaN error fails.
  const bool o_ok = comparison.o_rel_error <= max_rel && comparison.o_nan_count == 0 &&
                    comparison.poisoned_left == 0 && comparison.o_padding_written == 0;
  const bool lse_ok = !comparison.lse_checked || (comparison.lse_max_abs_error <= max_lse_abs &&
                                                  comparison.lse_mismatched_infinite == 0);
  return o_ok && lse_ok;
}

}  // namespace flashjit
