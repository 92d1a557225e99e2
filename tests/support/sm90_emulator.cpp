#include "support/sm90_emulator.hpp"

#include <ucontext.h>

#include <cstring>
#include <memory>
#include <vector>

namespace flashjit_kernel {
// The largest dynamic shared memory an sm90 CTA can have (227 KB) plus a guard band.
__attribute__((aligned(1024))) unsigned char shared_bytes[227 * 1024 + 1024];
}  // namespace flashjit_kernel

namespace flashjit::testing {
namespace {

constexpr int kWarpgroupSize = 128;
constexpr size_t kStackBytes = 256 * 1024;
// The shared address of shared_bytes[0]: not a multiple of 1024, so that a kernel that does not
// round its tiles up to a swizzle atom reads the wrong swizzle phase.
constexpr uint32_t kWindowBase = 16;
constexpr size_t kGuardBytes = 1024;

enum class State { kRunnable, kAtBarrier, kAtWait, kDone, kTrapped };

struct Copy {
  uint32_t destination;
  const void* source;
  int bytes;
};

struct Mma {
  bool rs = false;
  int n = 0;
  bool bf16 = false;
  float* d = nullptr;
  const uint32_t* a_registers = nullptr;
  uint64_t a = 0, b = 0;
  bool accumulate = false;
  int trans_a = 0, trans_b = 0;
};

struct Lane {
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  int tid = 0;
  State state = State::kRunnable;
  std::vector<std::vector<Copy>> copy_groups;
  std::vector<Copy> open_copies;
  std::vector<std::vector<Mma>> mma_groups;
  std::vector<Mma> open_mmas;
  int wait_pending = 0;
};

struct Emulator {
  ucontext_t scheduler;
  std::vector<Lane> lanes;
  Lane* current = nullptr;
  Sm90Dim3 block, grid;
  int smem_bytes = 0;
  std::string error;  // the first error; the CTA stops at the next scheduling point
  const std::function<void()>* kernel = nullptr;
};

Emulator* t_emulator = nullptr;

Emulator& em() { return *t_emulator; }

void fail(const std::string& what) {
  if (em().error.empty()) {
    em().error = "thread " + std::to_string(em().current ? em().current->tid : -1) + ": " + what;
  }
}

void suspend(State state) {
  Lane* lane = em().current;
  lane->state = state;
  swapcontext(&lane->context, &em().scheduler);
}

void lane_entry() {
  (*em().kernel)();
  Lane* lane = em().current;
  if (!lane->copy_groups.empty() || !lane->open_copies.empty())
    fail("exits with cp.async copies never waited for");
  if (!lane->mma_groups.empty() || !lane->open_mmas.empty())
    fail("exits with wgmma groups never waited for");
  lane->state = State::kDone;
}

// Shared byte at `address` (a shared-space address), or null with an error when outside the
// launch's window.
unsigned char* shared_at(uint32_t address, int bytes) {
  if (address < kWindowBase ||
      address + bytes > kWindowBase + static_cast<uint32_t>(em().smem_bytes)) {
    fail("shared address " + std::to_string(address) + " (+" + std::to_string(bytes) +
         ") outside the dynamic shared memory [" + std::to_string(kWindowBase) + ", " +
         std::to_string(kWindowBase + em().smem_bytes) + ")");
    return nullptr;
  }
  return flashjit_kernel::shared_bytes + (address - kWindowBase);
}

void run_copies(std::vector<Copy>& copies) {
  for (const Copy& c : copies) {
    if (c.destination % 16 != 0) fail("cp.async destination not 16-byte aligned");
    unsigned char* to = shared_at(c.destination, 16);
    if (!to) return;
    std::memset(to, 0, 16);
    if (c.bytes > 0) std::memcpy(to, c.source, c.bytes);
  }
}

// ---- wgmma -------------------------------------------------------------------------------------

float element_of(uint16_t bits, bool bf16) {
  return bf16 ? bf16_to_float(bits) : fp16_to_float(bits);
}

// Element (mn, k) of a k16 operand slice through a 128-byte-swizzle descriptor (the layout of
// cuda/sm90_tiles.cuh): K-major rows of 128 bytes in 8-row groups `stride` apart; MN-major: 8-k
// rows of 64 mn-elements, 64-element blocks `leading` apart, 8-k groups `stride` apart.
float smem_operand(uint64_t descriptor, int mn, int k, bool mn_major, bool bf16) {
  const uint32_t start = static_cast<uint32_t>(descriptor & 0x3FFF) << 4;
  const uint32_t leading = static_cast<uint32_t>((descriptor >> 16) & 0x3FFF) << 4;
  const uint32_t stride = static_cast<uint32_t>((descriptor >> 32) & 0x3FFF) << 4;
  const int base_offset = static_cast<int>((descriptor >> 49) & 7);
  const int layout = static_cast<int>(descriptor >> 62);
  if (layout != 1 || base_offset != 0) {
    fail("descriptor with layout " + std::to_string(layout) + " and base offset " +
         std::to_string(base_offset) + " (the templates use 128-byte swizzle, offset 0)");
    return NAN;
  }
  const uint32_t address =
      mn_major ? start + (mn / 64) * leading + (k / 8) * stride + (k % 8) * 128 + (mn % 64) * 2
               : start + (mn / 8) * stride + (mn % 8) * 128 + k * 2;
  const uint32_t swizzled = address ^ (((address >> 7) & 7) << 4);
  const unsigned char* at = shared_at(swizzled, 2);
  if (!at) return NAN;
  uint16_t bits;
  std::memcpy(&bits, at, 2);
  return element_of(bits, bf16);
}

// Executes op `i` of group `g` for the warpgroup whose lanes start at `wg`.
void run_mma(Lane* wg, size_t g, size_t i) {
  const Mma& op = wg[0].mma_groups[g][i];
  for (int t = 1; t < kWarpgroupSize; ++t) {
    const Mma& other = wg[t].mma_groups[g][i];
    if (other.rs != op.rs || other.n != op.n || other.bf16 != op.bf16 || other.b != op.b ||
        other.accumulate != op.accumulate || other.trans_a != op.trans_a ||
        other.trans_b != op.trans_b || (!op.rs && other.a != op.a)) {
      fail("the warpgroup's threads issued different wgmmas (group " + std::to_string(g) + ", op " +
           std::to_string(i) + ")");
      return;
    }
  }
  const int n = op.n;
  std::vector<float> a(64 * 16), b(static_cast<size_t>(n) * 16), d(64 * static_cast<size_t>(n));
  if (op.rs) {
    // mma.sync A fragments: rows 16 w + lane / 4 (+ 8), columns 2 (lane % 4) (+ 1) (+ 8).
    for (int t = 0; t < kWarpgroupSize; ++t) {
      const int row = (t / 32) * 16 + (t % 32) / 4, col = 2 * (t % 4);
      for (int r = 0; r < 4; ++r) {
        const uint32_t word = wg[t].mma_groups[g][i].a_registers[r];
        const int rr = row + 8 * (r % 2), cc = col + 8 * (r / 2);
        a[rr * 16 + cc] = element_of(static_cast<uint16_t>(word & 0xFFFF), op.bf16);
        a[rr * 16 + cc + 1] = element_of(static_cast<uint16_t>(word >> 16), op.bf16);
      }
    }
  } else {
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 16; ++k) a[m * 16 + k] = smem_operand(op.a, m, k, op.trans_a, op.bf16);
  }
  for (int col = 0; col < n; ++col)
    for (int k = 0; k < 16; ++k) b[col * 16 + k] = smem_operand(op.b, col, k, op.trans_b, op.bf16);
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < n; ++col) {
      float sum = 0;
      for (int k = 0; k < 16; ++k) sum = std::fma(a[row * 16 + k], b[col * 16 + k], sum);
      d[row * n + col] = sum;
    }
  for (int t = 0; t < kWarpgroupSize; ++t) {
    float* registers = wg[t].mma_groups[g][i].d;
    const int warp = t / 32, lane = t % 32;
    for (int col8 = 0; col8 < n / 8; ++col8)
      for (int e = 0; e < 4; ++e) {
        const int row = warp * 16 + lane / 4 + 8 * (e / 2), col = col8 * 8 + 2 * (lane % 4) + e % 2;
        float& value = registers[4 * col8 + e];
        value = (op.accumulate ? value : 0.f) + d[row * n + col];
      }
  }
}

// The warpgroup at `wg` has met at a wgmma wait: run all but its newest `pending` groups.
void run_wait(Lane* wg) {
  const int pending = wg[0].wait_pending;
  const size_t groups = wg[0].mma_groups.size();
  for (int t = 0; t < kWarpgroupSize; ++t) {
    if (wg[t].wait_pending != pending || wg[t].mma_groups.size() != groups) {
      fail("the warpgroup's threads wait for different wgmma groups");
      return;
    }
    if (!wg[t].open_mmas.empty()) {
      fail("wgmma issued but not committed before a wait");
      return;
    }
    for (size_t g = 0; g < groups; ++g)
      if (wg[t].mma_groups[g].size() != wg[0].mma_groups[g].size()) {
        fail("the warpgroup's threads issued different numbers of wgmmas");
        return;
      }
  }
  const size_t run = groups > static_cast<size_t>(pending) ? groups - pending : 0;
  for (size_t g = 0; g < run && em().error.empty(); ++g)
    for (size_t i = 0; i < wg[0].mma_groups[g].size() && em().error.empty(); ++i) run_mma(wg, g, i);
  for (int t = 0; t < kWarpgroupSize; ++t) {
    wg[t].mma_groups.erase(wg[t].mma_groups.begin(), wg[t].mma_groups.begin() + run);
    wg[t].state = State::kRunnable;
  }
}

std::string state_summary() {
  int counts[5] = {0, 0, 0, 0, 0};
  for (const Lane& lane : em().lanes) ++counts[static_cast<int>(lane.state)];
  return "runnable " + std::to_string(counts[0]) + ", at a barrier " + std::to_string(counts[1]) +
         ", at a wgmma wait " + std::to_string(counts[2]) + ", done " + std::to_string(counts[3]);
}

std::string run_cta(int threads) {
  Emulator& e = em();
  for (int t = 0; t < threads; ++t) {
    Lane& lane = e.lanes[t];
    lane.tid = t;
    lane.state = State::kRunnable;
    lane.copy_groups.clear();
    lane.open_copies.clear();
    lane.mma_groups.clear();
    lane.open_mmas.clear();
    getcontext(&lane.context);
    lane.context.uc_stack.ss_sp = lane.stack.get();
    lane.context.uc_stack.ss_size = kStackBytes;
    lane.context.uc_link = &e.scheduler;
    makecontext(&lane.context, lane_entry, 0);
  }
  const int warpgroups = threads / kWarpgroupSize;
  for (int round = 0;; ++round) {
    // Warpgroups in turn, the order alternating per round, each until it blocks at a barrier or
    // is done. A warpgroup's wgmma wait runs as soon as its 128 threads are there, before the
    // next warpgroup runs: a missing barrier between one warpgroup's shared stores and another's
    // wgmma reads shows in one of the two orders. (Registers and copies still land late: at the
    // wait, after everything the threads did since the issue.)
    for (int n = 0; n < warpgroups; ++n) {
      const int w = round % 2 == 0 ? n : warpgroups - 1 - n;
      Lane* wg = &e.lanes[w * kWarpgroupSize];
      for (;;) {
        for (int t = 0; t < kWarpgroupSize; ++t) {
          if (wg[t].state != State::kRunnable) continue;
          e.current = &wg[t];
          swapcontext(&e.scheduler, &wg[t].context);
          e.current = nullptr;
          if (!e.error.empty()) return e.error;
        }
        int waiting = 0;
        for (int t = 0; t < kWarpgroupSize; ++t) waiting += wg[t].state == State::kAtWait;
        if (waiting == 0) break;
        if (waiting != kWarpgroupSize)
          return "warpgroup " + std::to_string(w) + ": " + std::to_string(waiting) +
                 " of 128 threads wait at a wgmma wait, the others elsewhere (" + state_summary() +
                 ")";
        run_wait(wg);
        if (!e.error.empty()) return e.error;
      }
    }
    int done = 0, at_barrier = 0;
    for (int t = 0; t < threads; ++t) {
      done += e.lanes[t].state == State::kDone;
      at_barrier += e.lanes[t].state == State::kAtBarrier;
    }
    if (done == threads) return "";
    if (at_barrier != threads) return "stuck: " + state_summary();
    for (int t = 0; t < threads; ++t) e.lanes[t].state = State::kRunnable;
  }
}

}  // namespace

std::string emulate_sm90(Sm90Grid grid, int threads, int smem_bytes,
                         const std::function<void()>& kernel) {
  if (threads <= 0 || threads % kWarpgroupSize != 0 || threads > 1024)
    return "threads = " + std::to_string(threads) + ": whole warpgroups of 128, at most 1024";
  if (smem_bytes < 0 || smem_bytes + kGuardBytes > sizeof(flashjit_kernel::shared_bytes))
    return "smem_bytes = " + std::to_string(smem_bytes) + ": more than an sm90 CTA has";
  Emulator e;
  e.lanes.resize(threads);
  for (Lane& lane : e.lanes) lane.stack.reset(new char[kStackBytes]);
  e.grid = {static_cast<unsigned>(grid.x), static_cast<unsigned>(grid.y),
            static_cast<unsigned>(grid.z)};
  e.smem_bytes = smem_bytes;
  e.kernel = &kernel;
  t_emulator = &e;
  std::string error;
  for (int z = 0; z < grid.z && error.empty(); ++z)
    for (int y = 0; y < grid.y && error.empty(); ++y)
      for (int x = 0; x < grid.x && error.empty(); ++x) {
        e.block = {static_cast<unsigned>(x), static_cast<unsigned>(y), static_cast<unsigned>(z)};
        std::memset(flashjit_kernel::shared_bytes, 0xFF, smem_bytes + kGuardBytes);
        error = run_cta(threads);
        for (size_t i = smem_bytes; i < smem_bytes + kGuardBytes && error.empty(); ++i)
          if (flashjit_kernel::shared_bytes[i] != 0xFF)
            error =
                "shared memory written past the launch's " + std::to_string(smem_bytes) + " bytes";
        if (!error.empty())
          error = "CTA (" + std::to_string(x) + ", " + std::to_string(y) + ", " +
                  std::to_string(z) + "): " + error;
      }
  t_emulator = nullptr;
  return error;
}

namespace sm90_emulator {

Sm90Dim3 thread_idx() { return {static_cast<unsigned>(em().current->tid), 0, 0}; }
Sm90Dim3 block_idx() { return em().block; }
Sm90Dim3 grid_dim() { return em().grid; }
void barrier() { suspend(State::kAtBarrier); }
void trap() {
  fail("trap (the kernel's own check failed, e.g. too little dynamic shared memory)");
  suspend(State::kTrapped);
}
uint32_t shared_address(const void* pointer) {
  const auto* p = static_cast<const unsigned char*>(pointer);
  if (p < flashjit_kernel::shared_bytes ||
      p >= flashjit_kernel::shared_bytes + sizeof(flashjit_kernel::shared_bytes)) {
    fail("shared_address of a pointer outside shared memory");
    return 0;
  }
  return kWindowBase + static_cast<uint32_t>(p - flashjit_kernel::shared_bytes);
}
uint32_t dynamic_smem_bytes() { return static_cast<uint32_t>(em().smem_bytes); }
void cp_async_16(uint32_t destination, const void* source, int source_bytes) {
  if (source_bytes != 0 && source_bytes != 16) fail("cp.async of " + std::to_string(source_bytes));
  em().current->open_copies.push_back({destination, source, source_bytes});
}
void cp_async_commit() {
  Lane* lane = em().current;
  lane->copy_groups.push_back(std::move(lane->open_copies));
  lane->open_copies.clear();
}
void cp_async_wait(int pending) {
  Lane* lane = em().current;
  while (lane->copy_groups.size() > static_cast<size_t>(pending)) {
    run_copies(lane->copy_groups.front());
    lane->copy_groups.erase(lane->copy_groups.begin());
  }
}
void wgmma_commit() {
  Lane* lane = em().current;
  lane->mma_groups.push_back(std::move(lane->open_mmas));
  lane->open_mmas.clear();
}
void wgmma_wait(int pending) {
  em().current->wait_pending = pending;
  suspend(State::kAtWait);
}
void wgmma_ss(int n, bool bf16, float* d, uint64_t a, uint64_t b, bool accumulate, int trans_a,
              int trans_b) {
  Mma op;
  op.n = n;
  op.bf16 = bf16;
  op.d = d;
  op.a = a;
  op.b = b;
  op.accumulate = accumulate;
  op.trans_a = trans_a;
  op.trans_b = trans_b;
  em().current->open_mmas.push_back(op);
}
void wgmma_rs(int n, bool bf16, float* d, const uint32_t* a, uint64_t b, bool accumulate,
              int trans_b) {
  Mma op;
  op.rs = true;
  op.n = n;
  op.bf16 = bf16;
  op.d = d;
  op.a_registers = a;
  op.b = b;
  op.accumulate = accumulate;
  op.trans_b = trans_b;
  em().current->open_mmas.push_back(op);
}
void red_add_v2(float* address, float a, float b) {
  if (reinterpret_cast<uintptr_t>(address) % 8 != 0) fail("red.global.add.v2 not 8-byte aligned");
  address[0] += a;
  address[1] += b;
}

}  // namespace sm90_emulator

}  // namespace flashjit::testing
