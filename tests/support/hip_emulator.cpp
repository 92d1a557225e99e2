#include "support/hip_emulator.hpp"

#include <cstring>
#include <memory>
#include <vector>

#include "support/fiber.hpp"

namespace flashjit::testing {
namespace {

constexpr int kWaveSize = 64;
constexpr size_t kStackBytes = 128 * 1024;
constexpr size_t kLdsGuardBytes = 256;  // past the end of LDS: must stay untouched

enum class LaneState { kRunnable, kAtWaveOp, kAtBarrier, kDone };
enum class WaveOp { kNone, kMfmaBf16, kMfmaF16, kShuffle };

struct Lane {
  Fiber fiber;
  std::unique_ptr<char[]> stack;
  int tid = 0;
  LaneState state = LaneState::kRunnable;
  // The wave-wide operation this lane waits at, its operands and its result.
  WaveOp op = WaveOp::kNone;
  long long ops_done = 0;  // wave operations this lane has reached: equal in a converged wave
  uint32_t a[2] = {0, 0}, b[2] = {0, 0};
  float c[4] = {0, 0, 0, 0};
  float d[4] = {0, 0, 0, 0};
  float value = 0;
  int mask = 0;
};

struct Emulator {
  Fiber scheduler;
  std::vector<Lane> lanes;
  Lane* current = nullptr;
  int block[3] = {0, 0, 0};
  int grid_x = 1;
  std::vector<unsigned char> lds;
  int lds_bytes = 0;
  const std::function<void()>* kernel = nullptr;
};

thread_local Emulator* t_emulator = nullptr;

Emulator& emulator() { return *t_emulator; }

// Back to the scheduler; returns when the scheduler resumes this lane.
void suspend(LaneState state) {
  Lane* lane = emulator().current;
  lane->state = state;
  fiber_switch(lane->fiber, emulator().scheduler);
}

void lane_entry() {
  (*emulator().kernel)();
  emulator().current->state = LaneState::kDone;
  // Returning resumes the fiber's link: the scheduler.
}

float element(uint32_t word_pair_lo, uint32_t word_pair_hi, int i, bool bf16) {
  const uint32_t word = i < 2 ? word_pair_lo : word_pair_hi;
  const uint16_t bits = static_cast<uint16_t>(word >> (16 * (i % 2)));
  return bf16 ? bf16_to_float(bits) : fp16_to_float(bits);
}

// The MFMA 16x16x16 of one wave, from the operands its 64 lanes left (l = lane, g = l / 16,
// r = l % 16): A[r][4g + i] and B[4g + i][r] are element i of lane l, C and D[4g + i][r] value i.
void run_mfma(Lane* wave, bool bf16) {
  float a[16][16], b[16][16], c[16][16];
  for (int l = 0; l < kWaveSize; ++l) {
    const int g = l / 16, r = l % 16;
    for (int i = 0; i < 4; ++i) {
      a[r][4 * g + i] = element(wave[l].a[0], wave[l].a[1], i, bf16);
      b[4 * g + i][r] = element(wave[l].b[0], wave[l].b[1], i, bf16);
      c[4 * g + i][r] = wave[l].c[i];
    }
  }
  for (int l = 0; l < kWaveSize; ++l) {
    const int g = l / 16, r = l % 16;
    for (int i = 0; i < 4; ++i) {
      const int row = 4 * g + i, col = r;
      float sum = c[row][col];
      for (int k = 0; k < 16; ++k) sum += a[row][k] * b[k][col];
      wave[l].d[i] = sum;
    }
  }
}

// Runs one wave's pending operation; "" or why it cannot (divergence).
std::string run_wave_op(Lane* wave) {
  const WaveOp op = wave[0].op;
  for (int l = 1; l < kWaveSize; ++l) {
    if (wave[l].op != op || wave[l].ops_done != wave[0].ops_done) {
      return "divergent wave: lane " + std::to_string(wave[l].tid) + " reached wave operation #" +
             std::to_string(wave[l].ops_done) + " while lane " + std::to_string(wave[0].tid) +
             " reached #" + std::to_string(wave[0].ops_done) + " (or a different kind)";
    }
  }
  if (op == WaveOp::kShuffle) {
    for (int l = 1; l < kWaveSize; ++l) {
      if (wave[l].mask != wave[0].mask) return "lane shuffle with different masks in one wave";
    }
    float values[kWaveSize];
    for (int l = 0; l < kWaveSize; ++l) values[l] = wave[l].value;
    for (int l = 0; l < kWaveSize; ++l) wave[l].value = values[(l ^ wave[0].mask) & 63];
  } else {
    run_mfma(wave, op == WaveOp::kMfmaBf16);
  }
  for (int l = 0; l < kWaveSize; ++l) {
    wave[l].op = WaveOp::kNone;
    wave[l].state = LaneState::kRunnable;
  }
  return "";
}

// Runs one workgroup to completion; "" or the error.
std::string run_workgroup(Emulator& em, int threads) {
  for (int t = 0; t < threads; ++t) {
    Lane& lane = em.lanes[t];
    lane.tid = t;
    lane.state = LaneState::kRunnable;
    lane.op = WaveOp::kNone;
    lane.ops_done = 0;
    fiber_start(lane.fiber, lane.stack.get(), kStackBytes, lane_entry, em.scheduler);
  }
  const int waves = threads / kWaveSize;
  for (int phase = 0;; ++phase) {
    // Each wave runs until all its lanes wait at a barrier or are done. The wave order alternates
    // per phase, so that a missing barrier between a write by one wave and a read by another
    // shows up in one of the two orders.
    for (int n = 0; n < waves; ++n) {
      const int w = phase % 2 == 0 ? n : waves - 1 - n;
      Lane* wave = &em.lanes[w * kWaveSize];
      for (;;) {
        for (int l = 0; l < kWaveSize; ++l) {
          if (wave[l].state != LaneState::kRunnable) continue;
          em.current = &wave[l];
          fiber_switch(em.scheduler, wave[l].fiber);
        }
        int at_op = 0;
        for (int l = 0; l < kWaveSize; ++l) at_op += wave[l].state == LaneState::kAtWaveOp;
        if (at_op == 0) break;
        if (at_op != kWaveSize) {
          return "divergent wave " + std::to_string(w) + ": " + std::to_string(at_op) +
                 " of 64 lanes wait at an MFMA or shuffle, the others at a barrier or done";
        }
        const std::string error = run_wave_op(wave);
        if (!error.empty()) return error;
      }
    }
    int done = 0;
    for (int t = 0; t < threads; ++t) done += em.lanes[t].state == LaneState::kDone;
    if (done == threads) return "";
    if (done != 0) {
      return std::to_string(threads - done) + " threads wait at a barrier that " +
             std::to_string(done) + " finished threads never reach";
    }
    for (int t = 0; t < threads; ++t) em.lanes[t].state = LaneState::kRunnable;
  }
}

}  // namespace

std::string emulate_hip(HipGrid grid, int threads, int lds_bytes,
                        const std::function<void()>& kernel) {
  if (threads <= 0 || threads % kWaveSize != 0 || threads > 1024)
    return "threads = " + std::to_string(threads) + ": whole waves of 64, at most 1024";
  Emulator em;
  em.lanes.resize(threads);
  for (Lane& lane : em.lanes) lane.stack.reset(new char[kStackBytes]);
  em.grid_x = grid.x;
  em.lds_bytes = lds_bytes;
  em.lds.resize(lds_bytes + kLdsGuardBytes);
  em.kernel = &kernel;
  t_emulator = &em;
  std::string error;
  for (int z = 0; z < grid.z && error.empty(); ++z)
    for (int y = 0; y < grid.y && error.empty(); ++y)
      for (int x = 0; x < grid.x && error.empty(); ++x) {
        em.block[0] = x;
        em.block[1] = y;
        em.block[2] = z;
        std::memset(em.lds.data(), 0xFF, em.lds.size());  // NaN in bf16 and fp16
        error = run_workgroup(em, threads);
        for (size_t i = lds_bytes; i < em.lds.size() && error.empty(); ++i) {
          if (em.lds[i] != 0xFF)
            error = "LDS written past its " + std::to_string(lds_bytes) + " bytes";
        }
        if (!error.empty()) {
          error = "workgroup (" + std::to_string(x) + ", " + std::to_string(y) + ", " +
                  std::to_string(z) + "): " + error;
        }
      }
  t_emulator = nullptr;
  return error;
}

namespace hip_emulator {

int thread_index() { return emulator().current->tid; }
int block_index(int axis) { return emulator().block[axis]; }
int grid_size_x() { return emulator().grid_x; }
unsigned char* lds() { return emulator().lds.data(); }

void barrier() { suspend(LaneState::kAtBarrier); }

float shuffle_xor(float value, int mask) {
  Lane* lane = emulator().current;
  lane->op = WaveOp::kShuffle;
  lane->value = value;
  lane->mask = mask;
  ++lane->ops_done;
  suspend(LaneState::kAtWaveOp);
  return lane->value;
}

void mfma_16x16x16(bool bf16, const uint32_t a[2], const uint32_t b[2], const float c[4],
                   float d[4]) {
  Lane* lane = emulator().current;
  lane->op = bf16 ? WaveOp::kMfmaBf16 : WaveOp::kMfmaF16;
  std::memcpy(lane->a, a, sizeof lane->a);
  std::memcpy(lane->b, b, sizeof lane->b);
  std::memcpy(lane->c, c, sizeof lane->c);
  ++lane->ops_done;
  suspend(LaneState::kAtWaveOp);
  std::memcpy(d, lane->d, sizeof lane->d);
}

}  // namespace hip_emulator

}  // namespace flashjit::testing
