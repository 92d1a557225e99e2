// The host emulator's internal state (tests/support/sm90_emulator.hpp is the interface): one CTA
// of coroutine threads, its shared memory with what last wrote each byte, its mbarriers, named
// barriers and asynchronous operations in flight. Shared by sm90_emulator.cpp (threads,
// scheduling, barriers, warp operations, wgmma) and sm90_emulator_memory.cpp (shared-memory
// tracking, mbarriers, TMA).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/fiber.hpp"
#include "support/sm90_emulator.hpp"

namespace flashjit::testing::sm90_emulator::internal {

constexpr int kWarpSize = 32;
constexpr int kWarpgroupSize = 128;
// The shared address of shared_bytes[0]: not a multiple of 1024, so that a kernel that does not
// round its tiles up to a swizzle atom reads the wrong swizzle phase.
constexpr uint32_t kWindowBase = 16;
constexpr size_t kGuardBytes = 1024;

enum class State {
  kRunnable,
  kAtBarrier,       // __syncthreads
  kAtWgmmaWait,     // wgmma.wait_group: the warpgroup meets
  kAtWarpOp,        // a shuffle or __syncwarp: the warp meets
  kAtNamedBarrier,  // bar.sync id, count
  kAtMbarrier,      // mbarrier try_wait loop
  kDone,
  kTrapped,
};

// A vector clock: entry t counts thread t's release events (arrivals, fences, barriers).
using Clock = std::vector<uint32_t>;
void join(Clock& into, const Clock& from);

struct Copy {  // one cp.async
  uint32_t destination;
  const void* source;
  int bytes;
};

struct Mma {  // one wgmma as one thread issued it
  bool rs = false;
  int n = 0;
  bool bf16 = false;
  float* d = nullptr;
  const uint32_t* a_registers = nullptr;
  uint64_t a = 0, b = 0;
  bool accumulate = false;
  int trans_a = 0, trans_b = 0;
  uint32_t a_lo = 0, a_hi = 0, b_lo = 0, b_hi = 0;  // shared bytes the operands may read
  std::vector<uint32_t> observed;                   // the issuing thread's observed mbarrier phases
  Clock clock;  // the issuing thread's clock (warpgroup leaders only)
};

enum class WarpOp { kNone, kShuffleXor, kSyncWarp };

struct Lane {
  Fiber fiber;
  std::unique_ptr<char[]> stack;
  int tid = 0;
  State state = State::kRunnable;
  // cp.async: committed groups (oldest first) and the open one.
  std::vector<std::vector<Copy>> copy_groups;
  std::vector<Copy> open_copies;
  // wgmma: committed groups and the open one; the wait's pending count.
  std::vector<std::vector<Mma>> mma_groups;
  std::vector<Mma> open_mmas;
  int wait_pending = 0;
  // A warp operation: its kind, operands and result.
  WarpOp op = WarpOp::kNone;
  float value = 0, result = 0;
  int lane_mask = 0;
  // What the thread waits at: a named barrier, an mbarrier phase.
  int named_id = 0;
  uint32_t wait_barrier = 0, wait_parity = 0;
  // TMA stores: committed bulk groups (indices into Emulator::stores) and the open one.
  std::vector<std::vector<int>> bulk_groups;
  std::vector<int> open_bulk;
  std::vector<int> registers;  // setmaxnreg counts, in order
  // Race tracking.
  Clock clock;
  std::vector<uint32_t> fences;    // own clock values of its fence.proxy.async
  std::vector<uint32_t> observed;  // per mbarrier: phases it has seen complete
};

struct Mbarrier {
  uint32_t address = 0;
  int expected = 0;      // arrivals per phase
  int pending = 0;       // arrivals still missing in the current phase
  long long tx = 0;      // transaction bytes still expected in the current phase
  uint32_t phase = 0;    // completed phases (the current one is `phase`)
  int init_thread = -1;  // who initialized it, at which of its clock values
  uint32_t init_clock = 0;
  bool fenced = false;  // fence.mbarrier_init after the init
  Clock arrivals;       // join of the current phase's arrivals
  Clock completed;      // join of the last completed phase's
};

struct NamedBarrier {
  int count = 0;    // threads of the current generation (0: none arrived)
  int arrived = 0;  // threads arrived so far
  Clock joined;
};

// What last wrote one byte of shared memory.
struct ByteState {
  enum Kind : uint8_t { kNone, kTma, kGeneric } kind = kNone;
  int16_t barrier = -1;  // TMA: the mbarrier it completed on ...
  uint32_t phase = 0;    // ... in this phase
  int16_t writer = -1;   // generic: the writing thread, at its clock value
  uint32_t clock = 0;
};

// A tensor map as the emulator encodes it (FlashjitTensorMap's opaque bytes).
struct EmulatedTensorMap {
  uint32_t magic;
  TensorMapSpec spec;
};
constexpr uint32_t kTensorMapMagic = 0x544d4150;  // "TMAP"

struct TmaLoad {
  uint32_t destination = 0;
  TensorMapSpec map;
  int coords[4] = {};
  int barrier = -1;  // index into Emulator::barriers
  int issuer = -1;
  uint32_t bytes = 0;
};

struct TmaStore {  // or a bulk reduction (reduce_to set): cp.reduce.async.bulk .add.f32
  uint32_t source = 0;
  float* reduce_to = nullptr;  // the global fp32 words the reduction adds into
  uint32_t reduce_bytes = 0;
  TensorMapSpec map;
  int coords[4] = {};
  int issuer = -1;
  Clock clock;  // the issuer's, at the issue
  bool done = false;
};

struct Emulator {
  Fiber scheduler;
  std::vector<Lane> lanes;
  Lane* current = nullptr;
  Sm90Dim3 block, grid;
  int smem_bytes = 0;
  Sm90Options options;
  std::mt19937_64 random;
  std::string error;  // the first error; the CTA stops at the next scheduling point
  const std::function<void()>* kernel = nullptr;
  int barrier_generation = 0;  // __syncthreads passed
  // Per CTA:
  std::vector<ByteState> bytes;  // per byte of the dynamic shared memory
  std::vector<Mbarrier> barriers;
  NamedBarrier named[16];
  std::vector<TmaLoad> loads;  // in flight
  std::vector<TmaStore> stores;
};

Emulator& em();
void fail(const std::string& what);
// Suspends the current thread in `state`; returns when the scheduler resumes it.
void suspend(State state);
int threads();

// ---- sm90_emulator.cpp ----
// At the CTA's end: setmaxnreg the same within each warpgroup, the final counts within the launch.
void check_registers_at_exit();

// ---- sm90_emulator_memory.cpp ----
// The byte at a shared address, or null (with an error) outside the launch's window.
unsigned char* shared_at(uint32_t address, int bytes);
// A generic write (st.shared, a cp.async landing) of `bytes` bytes by the current thread.
void record_generic_write(uint32_t address, int bytes);
// Checks for one byte an async-proxy read (a wgmma operand) by warpgroup leader `mma`'s group.
void check_async_read(uint32_t address, const std::vector<uint32_t>& observed_min,
                      const Clock* clock, const char* what);
// Checks that a write to [lo, hi) by `what` does not overlap a wgmma some warpgroup issued and
// has not waited for, nor a TMA load in flight.
void check_no_pending_readers(uint32_t lo, uint32_t hi, const char* what);
// Per CTA: clears the byte states, barriers and asynchronous operations.
void reset_memory();
// The scheduler's part: lands the in-flight TMA load `index`.
void land_load(size_t index);
// Whether the current thread's mbarrier wait can complete now (it then joins the phase).
bool poll_mbarrier(Lane& lane);
// At the CTA's end: what must not be left in flight.
void check_memory_at_exit();

}  // namespace flashjit::testing::sm90_emulator::internal
