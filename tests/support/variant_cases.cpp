// See variant_cases.hpp.
#include "support/variant_cases.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "support/reference.hpp"

namespace flashjit::testing {

namespace {
Variant window(int64_t left, int64_t right) {
  Variant v;
  v.window_left = left;
  v.window_right = right;
  return v;
}
}  // namespace

std::vector<VariantCase> variant_cases() {
  std::vector<VariantCase> out;
  out.push_back({"sliding_window_causal", true, window(37, 0), {}});
  out.push_back({"window_both_sides", false, window(16, 23), {}});
  out.push_back({"window_right_only", false, window(-1, 8), {}});
  out.push_back({"empty_windows", false, window(0, 0), {}});  // q_longer: rows with no key
  Variant softcap;
  softcap.softcap = 0.75f;  // small enough to bite on N(0, 1) scores
  out.push_back({"softcap", false, softcap, {}});
  Variant alibi;
  alibi.alibi = true;
  out.push_back({"alibi_causal", true, alibi, {}});
  Variant prefix = window(8, 0);
  prefix.prefix = 20;
  out.push_back({"prefix_lm", true, prefix, {}});
  Variant combined = window(32, 0);
  combined.softcap = 1.5f;
  combined.alibi = true;
  out.push_back({"window_softcap_alibi_causal", true, combined, {}});
  Variant score;
  score.score_mod = "score - 0.1f * abs(q_idx - kv_idx) + (head == 1 ? 0.5f : 0.f)";
  score.score_mod_grad = "1.0f";  // the backward's d score_mod / d score
  VariantFunctions score_f;
  score_f.score_mod = [](double s, int64_t, int64_t h, int64_t i, int64_t j) {
    return s - 0.1 * std::abs(static_cast<double>(i - j)) + (h == 1 ? 0.5 : 0.0);
  };
  score_f.score_mod_grad = [](double, int64_t, int64_t, int64_t, int64_t) { return 1.0; };
  out.push_back({"score_mod", false, score, score_f});
  // A score_mod whose derivative depends on the score and the head (the backward's chain).
  Variant squared;
  squared.score_mod = "score * (0.75f + 0.125f * head) + 0.05f * score * score";
  squared.score_mod_grad = "0.75f + 0.125f * head + 0.1f * score";
  VariantFunctions squared_f;
  squared_f.score_mod = [](double s, int64_t, int64_t h, int64_t, int64_t) {
    return s * (0.75 + 0.125 * static_cast<double>(h)) + 0.05 * s * s;
  };
  squared_f.score_mod_grad = [](double s, int64_t, int64_t h, int64_t, int64_t) {
    return 0.75 + 0.125 * static_cast<double>(h) + 0.1 * s;
  };
  out.push_back({"score_mod_nonlinear_softcap", false, squared, squared_f});
  out.back().variant.softcap = 4.0f;
  Variant mask;
  mask.mask_mod = "(q_idx / 16) == (kv_idx / 16) || batch == 1";
  VariantFunctions mask_f;
  mask_f.mask_mod = [](int64_t b, int64_t, int64_t i, int64_t j) {
    return i / 16 == j / 16 || b == 1;
  };
  out.push_back({"mask_mod_causal", true, mask, mask_f});
  return out;
}

std::vector<NamedVariant> compile_variants() {
  std::vector<NamedVariant> out;
  Variant v;
  v.window_left = 1024;
  v.window_right = 0;
  out.push_back({"window", v});
  v = Variant();
  v.softcap = 50.f;
  v.alibi = true;
  out.push_back({"softcap_alibi", v});
  v = Variant();
  v.prefix = 100;
  v.window_left = 256;
  out.push_back({"prefix", v});
  v = Variant();
  v.score_mod = "score - 0.1f * abs(q_idx - kv_idx)";
  out.push_back({"score_mod", v});
  v = Variant();
  v.mask_mod = "(q_idx / 64) == (kv_idx / 64)";
  out.push_back({"mask_mod", v});
  v = Variant();
  v.window_left = 512;
  v.softcap = 30.f;
  v.alibi = true;
  v.prefix = 16;
  v.score_mod = "score * 0.5f + tanh(score)";
  v.mask_mod = "kv_idx % 3 != 1";
  out.push_back({"everything", v});
  return out;
}

std::vector<NamedVariant> backward_compile_variants() {
  std::vector<NamedVariant> out = compile_variants();
  for (NamedVariant& named : out) {
    Variant& v = named.variant;
    if (v.score_mod == "score - 0.1f * abs(q_idx - kv_idx)") v.score_mod_grad = "1.0f";
    if (v.score_mod == "score * 0.5f + tanh(score)")
      v.score_mod_grad = "0.5f + 1.0f - tanh(score) * tanh(score)";
    if (!v.score_mod.empty() && v.score_mod_grad.empty())
      ADD_FAILURE() << named.name << ": a score_mod of compile_variants() with no derivative here";
  }
  return out;
}

std::vector<std::string> emulated_forward_prelude_lines(bool with_mask_mod) {
  std::vector<std::string> lines = {
      "#define FLASHJIT_VARIANT_CAUSAL 1\n",
      "#define FLASHJIT_VARIANT_WINDOW_LEFT (40)\n",
      "#define FLASHJIT_VARIANT_WINDOW_RIGHT (-1)\n",
      "#define FLASHJIT_VARIANT_PREFIX 24\n",
      "#define FLASHJIT_VARIANT_SOFTCAP 2.000000000e+00f\n",
      "#define FLASHJIT_VARIANT_ALIBI 1\n",
      "#define FLASHJIT_VARIANT_SCORE_MOD 1\n",
      with_mask_mod ? "#define FLASHJIT_VARIANT_MASK_MOD 1\n"
                    : "#define FLASHJIT_VARIANT_MASK_MOD 0\n",
      "  return static_cast<float>(score - 0.05f * abs(q_idx - kv_idx) + 0.25f * head - batch);"};
  if (with_mask_mod)
    lines.push_back("  return static_cast<bool>((kv_idx + head + batch) % 5 != 0 || q_idx < 8);");
  return lines;
}

std::vector<std::string> emulated_backward_prelude_lines() {
  std::vector<std::string> lines = emulated_forward_prelude_lines(/*with_mask_mod=*/true);
  lines.push_back("#define FLASHJIT_VARIANT_SCORE_MOD_GRAD 1\n");
  lines.push_back("  return static_cast<float>(1.0f);  // flashjit:score_mod_grad\n");
  return lines;
}

VariantCase emulated_variant(bool with_mask_mod) {
  VariantCase c{with_mask_mod ? "emulated_with_mask_mod" : "emulated", true, {}, {}};
  c.variant.window_left = 40;
  c.variant.softcap = 2.0f;
  c.variant.alibi = true;
  c.variant.prefix = 24;
  c.variant.score_mod = "score - 0.05f * abs(q_idx - kv_idx) + 0.25f * head - batch";
  c.variant.score_mod_grad = "1.0f";
  c.functions.score_mod = [](double s, int64_t b, int64_t h, int64_t i, int64_t j) {
    return s - 0.05 * std::abs(static_cast<double>(i - j)) + 0.25 * h - b;
  };
  c.functions.score_mod_grad = [](double, int64_t, int64_t, int64_t, int64_t) { return 1.0; };
  if (with_mask_mod) {
    c.variant.mask_mod = "(kv_idx + head + batch) % 5 != 0 || q_idx < 8";
    c.functions.mask_mod = [](int64_t b, int64_t h, int64_t i, int64_t j) {
      return (j + h + b) % 5 != 0 || i < 8;
    };
  }
  return c;
}

void poison_keys(const AttentionProblem& problem, HostInputs& inputs, int64_t begin, int64_t end) {
  for (int64_t b = 0; b < problem.batch; ++b)
    for (int64_t j = begin; j < end; ++j)
      for (int64_t h = 0; h < problem.heads_kv; ++h)
        for (int col = 0; col < problem.head_dim; ++col) {
          const int64_t k_at = b * problem.k_strides.batch + j * problem.k_strides.seq +
                               h * problem.k_strides.head + col;
          const int64_t v_at = b * problem.v_strides.batch + j * problem.v_strides.seq +
                               h * problem.v_strides.head + col;
          set_element(inputs.k.data(), k_at, NAN, problem.dtype);
          set_element(inputs.v.data(), v_at, NAN, problem.dtype);
        }
}

namespace {

struct VarlenCase {
  std::vector<int64_t> q, k;  // rows of each document
  int64_t spare;              // rows past the last document
};

AttentionProblem varlen_problem(const VarlenCase& c, int64_t heads_q, int64_t heads_kv,
                                int head_dim, DType dtype, bool causal) {
  int64_t max_q = 1, max_k = 1, total_q = c.spare, total_k = c.spare;
  for (size_t b = 0; b < c.q.size(); ++b) {
    max_q = std::max(max_q, c.q[b]);
    max_k = std::max(max_k, c.k[b]);
    total_q += c.q[b];
    total_k += c.k[b];
  }
  AttentionProblem p =
      AttentionProblem::make_varlen(static_cast<int64_t>(c.q.size()), heads_q, heads_kv, max_q,
                                    max_k, total_q, total_k, head_dim, dtype, causal);
  if (causal) p.variant.window_left = kVarlenEmulationWindowLeft;
  return p;
}

}  // namespace

AttentionProblem varlen_emulation_problem(DType dtype, int head_dim, bool causal) {
  return varlen_problem({{1}, {1}, 0}, 1, 1, head_dim, dtype, causal);
}

namespace {
const VarlenCase kVarlenCases[] = {
    {{1}, {1}, 0},
    // 17 queries of 5 keys (rows that see none), empty documents, more keys than queries.
    {{17, 0, 3, 100, 1}, {5, 4, 0, 130, 1}, 9},
    {{70, 40}, {40, 70}, 3},
    // One document much longer than the others (several query blocks: the other documents'
    // tiles at those blocks start past their ends).
    {{5, 300, 33}, {300, 260, 1}, 4},
};
}  // namespace

void check_varlen_emulation(DType dtype, int head_dim, const VarlenRun& run, bool causal) {
  uint64_t seed = 3;
  for (const VarlenCase& c : kVarlenCases)
    for (const auto& [heads_q, heads_kv] : {std::pair<int64_t, int64_t>{2, 2}, {4, 1}}) {
      const AttentionProblem problem =
          varlen_problem(c, heads_q, heads_kv, head_dim, dtype, causal);
      ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
      HostInputs inputs = random_inputs(problem, seed++);
      inputs.cu_seqlens_q = cu_seqlens_of(c.q);
      inputs.cu_seqlens_k = cu_seqlens_of(c.k);
      poison_keys(problem, inputs, inputs.cu_seqlens_k.back(), problem.variant.total_k);
      std::vector<uint16_t> o(problem.o_span(), kPoisonBits);
      std::vector<float> lse(problem.lse_elements(), std::numeric_limits<float>::quiet_NaN());
      ASSERT_EQ(run(problem, inputs, &o, &lse), "") << problem.to_string();
      const Comparison result = compare(problem, o, lse, reference_attention(problem, inputs));
      EXPECT_TRUE(matches_reference(result)) << problem.to_string();
      EXPECT_EQ(result.o_padding_written, 0) << problem.to_string();
    }
}

void check_varlen_backward_emulation(DType dtype, int head_dim, bool causal_window,
                                     const VarlenBackwardRun& run) {
  uint64_t seed = 5;
  for (const VarlenCase& c : kVarlenCases)
    for (const auto& [heads_q, heads_kv] : {std::pair<int64_t, int64_t>{2, 2}, {4, 1}}) {
      const AttentionProblem problem =
          varlen_problem(c, heads_q, heads_kv, head_dim, dtype, causal_window)
              .with_pass(Pass::Backward);
      ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
      HostInputs inputs = random_inputs(problem, seed++);
      inputs.cu_seqlens_q = cu_seqlens_of(c.q);
      inputs.cu_seqlens_k = cu_seqlens_of(c.k);
      set_forward_outputs(problem, inputs);
      const int64_t rows_q = inputs.cu_seqlens_q.back(), total_q = problem.variant.total_q;
      poison_keys(problem, inputs, inputs.cu_seqlens_k.back(), problem.variant.total_k);
      for (int64_t row = rows_q; row < total_q; ++row)
        for (int64_t h = 0; h < problem.heads_q; ++h)
          for (int col = 0; col < problem.head_dim; ++col) {
            set_element(inputs.q.data(),
                        row * problem.q_strides.seq + h * problem.q_strides.head + col, NAN, dtype);
            set_element(inputs.o.data(),
                        row * problem.o_strides.seq + h * problem.o_strides.head + col, NAN, dtype);
            set_element(inputs.d_o.data(),
                        row * problem.do_strides.seq + h * problem.do_strides.head + col, NAN,
                        dtype);
          }
      std::fill(inputs.lse.begin() + problem.heads_q * rows_q, inputs.lse.end(),
                std::numeric_limits<float>::quiet_NaN());
      Gradients out;
      ASSERT_EQ(run(problem, inputs, &out), "") << problem.to_string();
      const GradientComparison comparison =
          compare_gradients(problem, out.dq, out.dk, out.dv, reference_attention(problem, inputs));
      EXPECT_TRUE(within_tolerance(comparison, gradient_tolerance(dtype)))
          << problem.to_string() << ": " << comparison.to_string();
      // The spare rows past the last document are left as they were (poisoned).
      auto untouched = [](const std::vector<uint16_t>& tensor, int64_t from) {
        for (size_t i = static_cast<size_t>(from); i < tensor.size(); ++i)
          if (tensor[i] != kPoisonBits) return false;
        return true;
      };
      EXPECT_TRUE(untouched(out.dq, rows_q * problem.dq_strides.seq)) << problem.to_string();
      const int64_t rows_k = inputs.cu_seqlens_k.back();
      EXPECT_TRUE(untouched(out.dk, rows_k * problem.dk_strides.seq)) << problem.to_string();
      EXPECT_TRUE(untouched(out.dv, rows_k * problem.dv_strides.seq)) << problem.to_string();
    }
}

}  // namespace flashjit::testing
