#include "support/forward_emulation.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "runtime/launch_params.hpp"
#include "support/attention_cases.hpp"

namespace flashjit::testing {

std::string run_guarded_forward(const AttentionProblem& problem, const HostInputs& inputs,
                                const ForwardLaunch& launch, std::vector<uint16_t>* o,
                                std::vector<float>* lse) {
  std::vector<uint16_t> o_buffer(problem.o_span() + kGuardElements, kPoisonBits);
  std::vector<float> lse_buffer(problem.lse_elements() + kGuardElements, -1.f);
  std::fill(lse_buffer.begin(), lse_buffer.begin() + problem.lse_elements(),
            std::numeric_limits<float>::quiet_NaN());
  AttentionArgs args{inputs.q.data(), inputs.k.data(), inputs.v.data(), o_buffer.data(),
                     lse_buffer.data()};
  if (!inputs.alibi_slopes.empty()) args.alibi_slopes = inputs.alibi_slopes.data();
  const std::string error = launch(problem, inputs, make_launch_params(problem, args));
  if (!error.empty()) return error;
  for (size_t i = problem.o_span(); i < o_buffer.size(); ++i)
    if (o_buffer[i] != kPoisonBits) return "o written past its span";
  for (size_t i = problem.lse_elements(); i < lse_buffer.size(); ++i)
    if (lse_buffer[i] != -1.f) return "lse written past its end";
  o->assign(o_buffer.begin(), o_buffer.begin() + problem.o_span());
  lse->assign(lse_buffer.begin(), lse_buffer.begin() + problem.lse_elements());
  return "";
}

void check_variant_forward_emulation(const VariantCase& variant, DType dtype, int head_dim,
                                     int block_n, uint64_t seed, const ForwardLaunch& launch) {
  struct Case {
    Shape shape;
    int64_t nan_keys_begin = 0, nan_keys_end = 0;  // keys no query sees, set to NaN
  };
  const Case cases[] = {
      {{1, 1, 1, 1, 1}},
      {{2, 2, 1, 70, 150}},
      {{1, 2, 2, 100, 40}},
      {{1, 2, 1, 40, 300}, block_n, 220 / block_n * block_n},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(variant.name) + " " + c.shape.to_string());
    AttentionProblem problem = make_problem(c.shape, head_dim, dtype, true, Pass::Forward);
    problem.variant = variant.variant;
    ASSERT_TRUE(validate(problem).ok()) << validate(problem).error().describe();
    HostInputs inputs = random_inputs(problem, seed++);
    poison_keys(problem, inputs, c.nan_keys_begin, c.nan_keys_end);
    std::vector<uint16_t> o;
    std::vector<float> lse;
    ASSERT_EQ(run_guarded_forward(problem, inputs, launch, &o, &lse), "");
    EXPECT_TRUE(matches_reference(
        compare(problem, o, lse, reference_attention(problem, inputs, variant.functions))));
  }
}

}  // namespace flashjit::testing
