// tests/support/fiber.hpp, the emulators' coroutines: switches keep each side's locals, the
// floating-point rounding mode is per fiber, a fiber's stack is aligned for SSE/AVX locals, and a
// finished fiber returns to its link.
#include "support/fiber.hpp"

#include <gtest/gtest.h>

#include <cfenv>
#include <cstdint>
#include <memory>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace flashjit::testing {
namespace {

constexpr size_t kStack = 64 * 1024;

struct Pingpong {
  Fiber scheduler;
  std::vector<Fiber> fibers;
  std::vector<long long> sums;
  std::vector<int> order;  // which fiber ran, switch after switch
  int current = 0;
  int rounding_seen = 0;           // the rounding mode fiber 1 found after its switches
  unsigned sse_rounding_seen = 0;  // the same in MXCSR (SSE arithmetic), x86-64
  bool aligned = true;
};

Pingpong* g_pingpong = nullptr;

// MXCSR's rounding bits (0: to nearest, 0x6000: toward zero); 0 where there is no MXCSR.
unsigned sse_rounding() {
#if defined(__x86_64__)
  return _mm_getcsr() & 0x6000u;
#else
  return 0;
#endif
}
constexpr int kRounds = 5000;

void ping_entry() {
  Pingpong& p = *g_pingpong;
  const int me = p.current;
  if (me == 1) std::fesetround(FE_TOWARDZERO);  // fiber 1's own mode, kept across switches
  long long sum = 0;
  double x = 0.1 * (me + 1);
  for (int round = 0; round < kRounds; ++round) {
    alignas(32) double block[4] = {x, x, x, x};
    p.aligned = p.aligned && reinterpret_cast<uintptr_t>(block) % 32 == 0;
    sum += round * (me + 1) + static_cast<long long>(block[3] * 10);
    p.order.push_back(me);
    fiber_switch(p.fibers[me], p.scheduler);
  }
  if (me == 1) {
    p.rounding_seen = std::fegetround();  // glibc: the x87 control word
    p.sse_rounding_seen = sse_rounding();
  }
  p.sums[me] = sum;
}

TEST(Fiber, SwitchesKeepLocalsRoundingModeAndAlignmentAndReturnToTheLink) {
  const int count = 3;
  Pingpong p;
  p.fibers.resize(count);
  p.sums.assign(count, -1);
  std::vector<std::unique_ptr<char[]>> stacks;
  g_pingpong = &p;
  for (int f = 0; f < count; ++f) {
    stacks.emplace_back(new char[kStack + 8]);
    // A stack that does not start aligned: fiber_start aligns its top.
    fiber_start(p.fibers[f], stacks.back().get() + 8 * f, kStack, ping_entry, p.scheduler);
  }
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  // Round-robin until every fiber has finished (each runs kRounds + 1 times).
  for (int step = 0; step <= kRounds; ++step)
    for (int f = 0; f < count; ++f) {
      p.current = f;
      fiber_switch(p.scheduler, p.fibers[f]);
      EXPECT_EQ(std::fegetround(), FE_TONEAREST) << "fiber " << f << "'s mode leaked out";
      EXPECT_EQ(sse_rounding(), 0u) << "fiber " << f << "'s SSE mode leaked out";
    }
  g_pingpong = nullptr;
  for (int f = 0; f < count; ++f) {
    long long want = 0;
    const double x = 0.1 * (f + 1);
    for (int round = 0; round < kRounds; ++round)
      want += round * (f + 1) + static_cast<long long>(x * 10);
    EXPECT_EQ(p.sums[f], want) << "fiber " << f;
  }
  EXPECT_EQ(p.rounding_seen, FE_TOWARDZERO);
#if defined(__x86_64__)
  EXPECT_EQ(p.sse_rounding_seen, 0x6000u);
#endif
  EXPECT_TRUE(p.aligned);
  ASSERT_EQ(p.order.size(), static_cast<size_t>(count * kRounds));
  for (size_t i = 0; i < p.order.size(); ++i) ASSERT_EQ(p.order[i], static_cast<int>(i % count));
}

}  // namespace
}  // namespace flashjit::testing
