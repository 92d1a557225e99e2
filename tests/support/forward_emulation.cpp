#include "support/forward_emulation.hpp"

#include <algorithm>
#include <limits>

#include "runtime/launch_params.hpp"

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

}  // namespace flashjit::testing
