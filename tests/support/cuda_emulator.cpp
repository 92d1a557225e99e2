#include "support/cuda_emulator.hpp"

#include <climits>
#include <memory>
#include <vector>

#include "support/fiber.hpp"
#include "tuner/reference.hpp"

namespace flashjit::testing {
namespace {

constexpr int kWarpSize = 32;
constexpr size_t kStackBytes = 256 * 1024;

enum class LaneState { kRunnable, kAtWarpOp, kAtBarrier, kDone };
enum class WarpOp { kNone, kLdmatrix, kLdmatrixTrans, kMmaBf16, kMmaF16, kShuffle, kSyncWarp };

struct Copy {
  uint32_t destination;
  const unsigned char* source;
  int bytes;
};

struct Lane {
  Fiber fiber;
  std::unique_ptr<char[]> stack;
  int tid = 0;
  LaneState state = LaneState::kRunnable;
  // The warp-wide operation this lane waits at, its operands and its result.
  WarpOp op = WarpOp::kNone;
  long long ops_done = 0;  // warp operations this lane has reached: equal in a converged warp
  uint32_t address = 0;
  uint32_t a[4] = {}, b[2] = {}, r[4] = {};
  float c[4] = {}, d[4] = {};
  float value = 0;
  int mask = 0;
  // cp.async: committed groups (oldest first) and the open one.
  std::vector<std::vector<Copy>> groups;
  std::vector<Copy> open;
};

// What happened to one byte of shared memory since the block started.
struct ByteState {
  int write_warp = -1;     // -1: never written
  int written_until = -1;  // barrier interval by which the write is complete (INT_MAX: pending)
  int read_interval = -1;
  uint64_t read_warps = 0;  // warps that read it in read_interval
};

struct Emulator {
  Fiber scheduler;
  std::vector<Lane> lanes;
  Lane* current = nullptr;
  std::vector<unsigned char> smem;
  std::vector<ByteState> bytes;
  int smem_bytes = 0;
  int interval = 0;   // barrier intervals since the block started
  std::string error;  // the first error of this block
  const std::function<void()>* kernel = nullptr;
};

Emulator* g_emulator = nullptr;
std::vector<std::pair<const unsigned char*, size_t>> g_globals;

Emulator& em() { return *g_emulator; }
int current_warp() { return em().current->tid / kWarpSize; }

void fail(const std::string& message) {
  if (em().error.empty()) {
    em().error = "thread " + std::to_string(em().current ? em().current->tid : -1) + ": " + message;
  }
}

// Back to the scheduler; returns when the scheduler resumes this lane.
void suspend(LaneState state) {
  Lane* lane = em().current;
  lane->state = state;
  fiber_switch(lane->fiber, em().scheduler);
}

void lane_entry() {
  (*em().kernel)();
  Lane* lane = em().current;
  if (!lane->open.empty() || !lane->groups.empty())
    fail("exits with cp.async copies it never waited for");
  lane->state = LaneState::kDone;
  // Returning resumes the fiber's link: the scheduler.
}

bool in_shared(uint32_t address, int bytes) {
  return static_cast<long long>(address) + bytes <= em().smem_bytes;
}

bool in_globals(const void* pointer, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(pointer);
  for (const auto& [begin, size] : g_globals)
    if (p >= begin && p + bytes <= begin + size) return true;
  return false;
}

std::string where(uint32_t address) { return "shared byte " + std::to_string(address); }

// The race rules of the header, for `bytes` bytes at `address` read or written by `warp`.
void check_read(uint32_t address, int bytes, int warp) {
  if (!in_shared(address, bytes)) {
    fail("reads " + std::to_string(bytes) + " shared bytes at " + std::to_string(address) +
         ", past the " + std::to_string(em().smem_bytes) + " the launch has");
    return;
  }
  for (int i = 0; i < bytes; ++i) {
    ByteState& s = em().bytes[address + i];
    if (s.write_warp < 0) {
      fail("reads " + where(address + i) + ", which nothing wrote");
      return;
    }
    if (s.written_until == INT_MAX) {
      fail("reads " + where(address + i) + " before the cp.async that fills it was waited for");
      return;
    }
    if (s.write_warp != warp && s.written_until >= em().interval) {
      fail("warp " + std::to_string(warp) + " reads " + where(address + i) + " that warp " +
           std::to_string(s.write_warp) + " wrote with no __syncthreads in between");
      return;
    }
    if (s.read_interval != em().interval) {
      s.read_interval = em().interval;
      s.read_warps = 0;
    }
    s.read_warps |= 1ull << warp;
  }
}

void check_write(uint32_t address, int bytes, int warp, bool pending) {
  if (!in_shared(address, bytes)) {
    fail("writes " + std::to_string(bytes) + " shared bytes at " + std::to_string(address) +
         ", past the " + std::to_string(em().smem_bytes) + " the launch has");
    return;
  }
  for (int i = 0; i < bytes; ++i) {
    ByteState& s = em().bytes[address + i];
    if (s.read_interval == em().interval && (s.read_warps & ~(1ull << warp)) != 0) {
      fail("warp " + std::to_string(warp) + " overwrites " + where(address + i) +
           " that another warp read with no __syncthreads in between");
      return;
    }
    if (s.write_warp >= 0 && s.write_warp != warp && s.written_until >= em().interval) {
      fail("warp " + std::to_string(warp) + " overwrites " + where(address + i) + " that warp " +
           std::to_string(s.write_warp) + " wrote with no __syncthreads in between");
      return;
    }
    s.write_warp = warp;
    s.written_until = pending ? INT_MAX : em().interval;
  }
}

void land(const Copy& copy) {
  if (copy.bytes == 16) {
    std::memcpy(em().smem.data() + copy.destination, copy.source, 16);
  } else {
    std::memset(em().smem.data() + copy.destination, 0, 16);
  }
  for (int i = 0; i < 16; ++i) em().bytes[copy.destination + i].written_until = em().interval;
}

uint16_t half_of(uint32_t word, int index) { return static_cast<uint16_t>(word >> (16 * index)); }

// ldmatrix .x4 for one warp: lane l addressed row l % 8 of matrix l / 8; without .trans lane l
// receives row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of each matrix, with .trans
// elements [2 (l % 4)][l / 4] and [2 (l % 4) + 1][l / 4].
void run_ldmatrix(Lane* warp, bool transposed) {
  const int warp_index = warp[0].tid / kWarpSize;
  for (int l = 0; l < kWarpSize; ++l) {
    if (warp[l].address % 16 != 0) {
      fail("ldmatrix row address " + std::to_string(warp[l].address) + " is not 16-byte aligned");
      return;
    }
    check_read(warp[l].address, 16, warp_index);
  }
  if (!em().error.empty()) return;
  auto element = [&](int matrix, int row, int col) {
    uint16_t bits;
    std::memcpy(&bits, em().smem.data() + warp[matrix * 8 + row].address + 2 * col, 2);
    return static_cast<uint32_t>(bits);
  };
  for (int l = 0; l < kWarpSize; ++l)
    for (int m = 0; m < 4; ++m) {
      const int g = l / 4, t = l % 4;
      warp[l].r[m] = transposed ? element(m, 2 * t, g) | element(m, 2 * t + 1, g) << 16
                                : element(m, g, 2 * t) | element(m, g, 2 * t + 1) << 16;
    }
}

// mma.m16n8k16.row.col for one warp (g = lane / 4, t = lane % 4): A[g][2t..] in a0, A[g + 8][2t..]
// in a1, A[g][2t + 8..] in a2, A[g + 8][2t + 8..] in a3; B[2t..][g] in b0, B[2t + 8..][g] in b1;
// C and D [g][2t, 2t + 1] in 0, 1 and [g + 8][2t, 2t + 1] in 2, 3.
void run_mma(Lane* warp, bool bf16) {
  float a[16][16], b[16][8], c[16][8];
  for (int l = 0; l < kWarpSize; ++l) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 2; ++i) {
      a[g][2 * t + i] = cuda_emulator::to_float(half_of(warp[l].a[0], i), bf16);
      a[g + 8][2 * t + i] = cuda_emulator::to_float(half_of(warp[l].a[1], i), bf16);
      a[g][2 * t + 8 + i] = cuda_emulator::to_float(half_of(warp[l].a[2], i), bf16);
      a[g + 8][2 * t + 8 + i] = cuda_emulator::to_float(half_of(warp[l].a[3], i), bf16);
      b[2 * t + i][g] = cuda_emulator::to_float(half_of(warp[l].b[0], i), bf16);
      b[2 * t + 8 + i][g] = cuda_emulator::to_float(half_of(warp[l].b[1], i), bf16);
      c[g][2 * t + i] = warp[l].c[i];
      c[g + 8][2 * t + i] = warp[l].c[2 + i];
    }
  }
  for (int l = 0; l < kWarpSize; ++l) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
      float sum = c[row][col];
      for (int k = 0; k < 16; ++k) sum += a[row][k] * b[k][col];
      warp[l].d[i] = sum;
    }
  }
}

// Runs one warp's pending operation; "" or why it cannot (divergence).
void run_warp_op(Lane* warp) {
  const WarpOp op = warp[0].op;
  for (int l = 1; l < kWarpSize; ++l) {
    if (warp[l].op != op || warp[l].ops_done != warp[0].ops_done) {
      fail("divergent warp: lane " + std::to_string(warp[l].tid) + " reached warp operation #" +
           std::to_string(warp[l].ops_done) + " while lane " + std::to_string(warp[0].tid) +
           " reached #" + std::to_string(warp[0].ops_done) + " (or a different kind)");
      return;
    }
  }
  switch (op) {
    case WarpOp::kLdmatrix:
    case WarpOp::kLdmatrixTrans:
      run_ldmatrix(warp, op == WarpOp::kLdmatrixTrans);
      break;
    case WarpOp::kMmaBf16:
    case WarpOp::kMmaF16:
      run_mma(warp, op == WarpOp::kMmaBf16);
      break;
    case WarpOp::kShuffle: {
      float values[kWarpSize];
      for (int l = 0; l < kWarpSize; ++l) values[l] = warp[l].value;
      for (int l = 0; l < kWarpSize; ++l) {
        if (warp[l].mask != warp[0].mask) fail("lane shuffle with different masks in one warp");
        warp[l].value = values[(l ^ warp[l].mask) & 31];
      }
      break;
    }
    case WarpOp::kSyncWarp:
    case WarpOp::kNone:
      break;
  }
  for (int l = 0; l < kWarpSize; ++l) {
    warp[l].op = WarpOp::kNone;
    warp[l].state = LaneState::kRunnable;
  }
}

void resume(Lane& lane, int block[3]) {
  em().current = &lane;
  threadIdx = {static_cast<unsigned>(lane.tid), 0, 0};
  blockIdx = {static_cast<unsigned>(block[0]), static_cast<unsigned>(block[1]),
              static_cast<unsigned>(block[2])};
  fiber_switch(em().scheduler, lane.fiber);
}

// Runs one block to completion; "" or the error.
std::string run_block(Emulator& e, int threads, int block[3]) {
  for (int t = 0; t < threads; ++t) {
    Lane& lane = e.lanes[t];
    lane.tid = t;
    lane.state = LaneState::kRunnable;
    lane.op = WarpOp::kNone;
    lane.ops_done = 0;
    lane.groups.clear();
    lane.open.clear();
    fiber_start(lane.fiber, lane.stack.get(), kStackBytes, lane_entry, e.scheduler);
  }
  const int warps = threads / kWarpSize;
  for (int phase = 0;; ++phase) {
    // Each warp runs until all its lanes wait at a barrier or are done. The warp order alternates
    // per phase (the race rules do not depend on it; stale data from a missing wait might).
    for (int n = 0; n < warps; ++n) {
      const int w = phase % 2 == 0 ? n : warps - 1 - n;
      Lane* warp = &e.lanes[w * kWarpSize];
      for (;;) {
        for (int l = 0; l < kWarpSize; ++l) {
          if (warp[l].state != LaneState::kRunnable) continue;
          resume(warp[l], block);
          if (!e.error.empty()) return e.error;
        }
        int at_op = 0;
        for (int l = 0; l < kWarpSize; ++l) at_op += warp[l].state == LaneState::kAtWarpOp;
        if (at_op == 0) break;
        if (at_op != kWarpSize) {
          return "divergent warp " + std::to_string(w) + ": " + std::to_string(at_op) +
                 " of 32 lanes wait at a warp operation, the others at a barrier or done";
        }
        e.current = &warp[0];
        run_warp_op(warp);
        if (!e.error.empty()) return e.error;
      }
    }
    int done = 0;
    for (int t = 0; t < threads; ++t) done += e.lanes[t].state == LaneState::kDone;
    if (done == threads) return "";
    if (done != 0) {
      return std::to_string(threads - done) + " threads wait at a __syncthreads that " +
             std::to_string(done) + " finished threads never reach";
    }
    ++e.interval;
    for (int t = 0; t < threads; ++t) e.lanes[t].state = LaneState::kRunnable;
  }
}

}  // namespace

void register_global(const void* begin, size_t bytes) {
  g_globals.emplace_back(static_cast<const unsigned char*>(begin), bytes);
}
void clear_globals() { g_globals.clear(); }

std::string emulate_cuda(CudaGrid grid, int threads, int smem_bytes,
                         const std::function<void()>& kernel) {
  if (threads <= 0 || threads % kWarpSize != 0 || threads > 1024)
    return "threads = " + std::to_string(threads) + ": whole warps of 32, at most 1024";
  if (threads / kWarpSize > 64) return "at most 64 warps";
  Emulator e;
  e.lanes.resize(threads);
  for (Lane& lane : e.lanes) lane.stack.reset(new char[kStackBytes]);
  e.smem_bytes = smem_bytes;
  e.smem.resize(smem_bytes + 16);
  e.kernel = &kernel;
  g_emulator = &e;
  gridDim = {static_cast<unsigned>(grid.x), static_cast<unsigned>(grid.y),
             static_cast<unsigned>(grid.z)};
  std::string error;
  for (int z = 0; z < grid.z && error.empty(); ++z)
    for (int y = 0; y < grid.y && error.empty(); ++y)
      for (int x = 0; x < grid.x && error.empty(); ++x) {
        int block[3] = {x, y, z};
        std::memset(e.smem.data(), 0xFF, e.smem.size());  // NaN in bf16 and fp16
        e.bytes.assign(smem_bytes, ByteState{});
        e.interval = 0;
        e.error.clear();
        e.current = nullptr;
        error = run_block(e, threads, block);
        if (!error.empty()) {
          error = "block (" + std::to_string(x) + ", " + std::to_string(y) + ", " +
                  std::to_string(z) + "): " + error;
        }
      }
  g_emulator = nullptr;
  return error;
}

namespace cuda_emulator {

unsigned char* shared_base() { return em().smem.data(); }

void barrier() { suspend(LaneState::kAtBarrier); }

namespace {
void arrive(WarpOp op) {
  Lane* lane = em().current;
  lane->op = op;
  ++lane->ops_done;
  suspend(LaneState::kAtWarpOp);
}
}  // namespace

void sync_warp() { arrive(WarpOp::kSyncWarp); }

float shuffle_xor(float value, int mask) {
  Lane* lane = em().current;
  lane->value = value;
  lane->mask = mask;
  arrive(WarpOp::kShuffle);
  return lane->value;
}

void ldmatrix(uint32_t (&r)[4], uint32_t address, bool transposed) {
  Lane* lane = em().current;
  lane->address = address;
  arrive(transposed ? WarpOp::kLdmatrixTrans : WarpOp::kLdmatrix);
  std::memcpy(r, lane->r, sizeof r);
}

void mma(bool bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Lane* lane = em().current;
  std::memcpy(lane->a, a, sizeof lane->a);
  lane->b[0] = b0;
  lane->b[1] = b1;
  std::memcpy(lane->c, d, sizeof lane->c);
  arrive(bf16 ? WarpOp::kMmaBf16 : WarpOp::kMmaF16);
  std::memcpy(d, lane->d, sizeof lane->d);
}

void cp_async(uint32_t destination, const void* source, int source_bytes) {
  if (destination % 16 != 0) {
    fail("cp.async to shared byte " + std::to_string(destination) + ": not 16-byte aligned");
    return;
  }
  if (source_bytes != 0 && source_bytes != 16) {
    fail("cp.async of " + std::to_string(source_bytes) + " bytes: the templates copy 16 or 0");
    return;
  }
  if (source_bytes == 16) {
    if (reinterpret_cast<uintptr_t>(source) % 16 != 0) {
      fail("cp.async from a global address that is not 16-byte aligned");
      return;
    }
    if (!in_globals(source, 16)) {
      fail("cp.async reads 16 bytes outside every registered global buffer");
      return;
    }
  }
  check_write(destination, 16, current_warp(), /*pending=*/true);
  em().current->open.push_back(
      {destination, static_cast<const unsigned char*>(source), source_bytes});
}

void cp_async_commit() {
  Lane* lane = em().current;
  lane->groups.push_back(std::move(lane->open));
  lane->open.clear();
}

void cp_async_wait(int pending_groups) {
  Lane* lane = em().current;
  while (static_cast<int>(lane->groups.size()) > pending_groups) {
    for (const Copy& copy : lane->groups.front()) land(copy);
    lane->groups.erase(lane->groups.begin());
  }
}

void shared_read(uint32_t address, int bytes) { check_read(address, bytes, current_warp()); }
void shared_write(uint32_t address, int bytes) {
  check_write(address, bytes, current_warp(), /*pending=*/false);
}

void reduce_add(float* address, float value) {
  if (reinterpret_cast<uintptr_t>(address) % 4 != 0 || !in_globals(address, 4)) {
    fail("reduction into a float outside every registered global buffer (or misaligned)");
    return;
  }
  *address += value;
}

float to_float(uint16_t bits, bool bf16) {
  return bf16 ? flashjit::bf16_to_float(bits) : flashjit::fp16_to_float(bits);
}
uint16_t from_float(float value, bool bf16) {
  return bf16 ? flashjit::float_to_bf16(value) : flashjit::float_to_fp16(value);
}

}  // namespace cuda_emulator

}  // namespace flashjit::testing
