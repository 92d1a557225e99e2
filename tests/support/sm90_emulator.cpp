// The emulator's threads and scheduling, CTA and named barriers, warp operations, cp.async,
// wgmma and setmaxnreg (sm90_emulator.hpp has the model). Shared memory tracking, mbarriers and
// TMA are in sm90_emulator_memory.cpp.
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/launch_params.hpp"
#include "support/sm90_emulator_state.hpp"

namespace flashjit_kernel {
// The largest dynamic shared memory an sm90 CTA can have (227 KB) plus a guard band.
__attribute__((aligned(1024))) unsigned char shared_bytes[227 * 1024 + 1024];
}  // namespace flashjit_kernel

namespace flashjit::testing {
namespace sm90_emulator::internal {

namespace {
constexpr size_t kStackBytes = 256 * 1024;
Emulator* t_emulator = nullptr;
}  // namespace

Emulator& em() { return *t_emulator; }
int threads() { return static_cast<int>(em().lanes.size()); }

void join(Clock& into, const Clock& from) {
  for (size_t i = 0; i < into.size() && i < from.size(); ++i)
    if (from[i] > into[i]) into[i] = from[i];
}

void fail(const std::string& what) {
  if (em().error.empty()) {
    em().error = "thread " + std::to_string(em().current ? em().current->tid : -1) + ": " + what;
  }
}

void suspend(State state) {
  Lane* lane = em().current;
  lane->state = state;
  fiber_switch(lane->fiber, em().scheduler);
}

namespace {

void lane_entry() {
  (*em().kernel)();
  Lane* lane = em().current;
  if (!lane->copy_groups.empty() || !lane->open_copies.empty())
    fail("exits with cp.async copies never waited for");
  if (!lane->mma_groups.empty() || !lane->open_mmas.empty())
    fail("exits with wgmma groups never waited for");
  if (!lane->bulk_groups.empty() || !lane->open_bulk.empty())
    fail("exits with TMA stores it never waited for (cp.async.bulk.wait_group.read)");
  lane->state = State::kDone;
}

void run_copies(std::vector<Copy>& copies) {
  for (const Copy& c : copies) {
    if (c.destination % 16 != 0) fail("cp.async destination not 16-byte aligned");
    check_no_pending_readers(c.destination, c.destination + 16, "a cp.async landing");
    unsigned char* to = shared_at(c.destination, 16);
    if (!to) return;
    std::memset(to, 0, 16);
    if (c.bytes > 0) std::memcpy(to, c.source, c.bytes);
    record_generic_write(c.destination, 16);
  }
}

// ---- wgmma -------------------------------------------------------------------------------------

float element_of(uint16_t bits, bool bf16) {
  return bf16 ? bf16_to_float(bits) : fp16_to_float(bits);
}

struct Descriptor {
  uint32_t start, leading, stride;
};

Descriptor decode(uint64_t descriptor) {
  const int base_offset = static_cast<int>((descriptor >> 49) & 7);
  const int layout = static_cast<int>(descriptor >> 62);
  if (layout != 1 || base_offset != 0) {
    fail("descriptor with layout " + std::to_string(layout) + " and base offset " +
         std::to_string(base_offset) + " (the templates use 128-byte swizzle, offset 0)");
  }
  return {static_cast<uint32_t>(descriptor & 0x3FFF) << 4,
          static_cast<uint32_t>((descriptor >> 16) & 0x3FFF) << 4,
          static_cast<uint32_t>((descriptor >> 32) & 0x3FFF) << 4};
}

// The shared address (swizzled) of element (mn, k) of a k16 operand slice through a 128-byte
// swizzle descriptor (the layout of cuda/sm90_tiles.cuh): K-major rows of 128 bytes in 8-row
// groups `stride` apart; MN-major: 8-k rows of 64 mn-elements, 64-element blocks `leading`
// apart, 8-k groups `stride` apart.
uint32_t operand_address(const Descriptor& d, int mn, int k, bool mn_major) {
  const uint32_t address = mn_major ? d.start + (mn / 64) * d.leading + (k / 8) * d.stride +
                                          (k % 8) * 128 + (mn % 64) * 2
                                    : d.start + (mn / 8) * d.stride + (mn % 8) * 128 + k * 2;
  return address ^ (((address >> 7) & 7) << 4);
}

// The bytes [lo, hi) an operand of `rows` mn-elements may touch (the swizzle stays within a
// 128-byte row).
void operand_range(uint64_t descriptor, int rows, bool mn_major, uint32_t& lo, uint32_t& hi) {
  const Descriptor d = decode(descriptor);
  lo = d.start & ~127u;
  const uint32_t last = operand_address(d, rows - 1, 15, mn_major);
  hi = std::max(last, operand_address(d, mn_major ? 63 : 7, 15, mn_major)) / 128 * 128 + 128;
  if (mn_major && rows > 64)
    hi = std::max(hi, (d.start + (rows / 64 - 1) * d.leading) + d.stride + 1024);
}

float smem_operand(const Descriptor& d, int mn, int k, bool mn_major, bool bf16,
                   const std::vector<uint32_t>& observed, const Clock* clock) {
  const uint32_t address = operand_address(d, mn, k, mn_major);
  const unsigned char* at = shared_at(address, 2);
  if (!at) return NAN;
  check_async_read(address, observed, clock, "a wgmma");
  check_async_read(address + 1, observed, clock, "a wgmma");
  uint16_t bits;
  std::memcpy(&bits, at, 2);
  return element_of(bits, bf16);
}

// Executes op `i` of group `g` for the warpgroup whose lanes start at `wg`.
void run_mma(Lane* wg, size_t g, size_t i) {
  const Mma& op = wg[0].mma_groups[g][i];
  std::vector<uint32_t> observed = op.observed;  // the least any of the threads has seen
  for (int t = 1; t < kWarpgroupSize; ++t) {
    const Mma& other = wg[t].mma_groups[g][i];
    if (other.rs != op.rs || other.n != op.n || other.bf16 != op.bf16 || other.b != op.b ||
        other.accumulate != op.accumulate || other.trans_a != op.trans_a ||
        other.trans_b != op.trans_b || (!op.rs && other.a != op.a)) {
      fail("the warpgroup's threads issued different wgmmas (group " + std::to_string(g) + ", op " +
           std::to_string(i) + ")");
      return;
    }
    for (size_t b = 0; b < observed.size() && b < other.observed.size(); ++b)
      observed[b] = std::min(observed[b], other.observed[b]);
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
    const Descriptor da = decode(op.a);
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 16; ++k)
        a[m * 16 + k] = smem_operand(da, m, k, op.trans_a, op.bf16, observed, &op.clock);
  }
  const Descriptor db = decode(op.b);
  for (int col = 0; col < n; ++col)
    for (int k = 0; k < 16; ++k)
      b[col * 16 + k] = smem_operand(db, col, k, op.trans_b, op.bf16, observed, &op.clock);
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

// ---- warp operations ---------------------------------------------------------------------------

// The warp at `warp` (32 lanes) has lanes at a warp operation: run it when all are there.
void resolve_warp(Lane* warp) {
  int at_op = 0, done = 0;
  for (int l = 0; l < kWarpSize; ++l) {
    at_op += warp[l].state == State::kAtWarpOp;
    done += warp[l].state == State::kDone;
  }
  if (at_op == 0 || at_op + done < kWarpSize) return;  // the others have not arrived yet
  if (done > 0) {
    em().current = &warp[0];
    fail("a warp operation (shuffle, __syncwarp) with " + std::to_string(done) +
         " lane(s) of the warp exited");
    return;
  }
  for (int l = 1; l < kWarpSize; ++l)
    if (warp[l].op != warp[0].op || warp[l].lane_mask != warp[0].lane_mask) {
      em().current = &warp[l];
      fail("the warp's lanes meet at different warp operations (divergent shuffles)");
      return;
    }
  for (int l = 0; l < kWarpSize; ++l) {
    if (warp[l].op == WarpOp::kShuffleXor) warp[l].result = warp[l ^ warp[l].lane_mask].value;
    warp[l].op = WarpOp::kNone;
    warp[l].state = State::kRunnable;
  }
}

// ---- scheduling --------------------------------------------------------------------------------

std::string state_summary() {
  int counts[8] = {};
  for (const Lane& lane : em().lanes) ++counts[static_cast<int>(lane.state)];
  return "runnable " + std::to_string(counts[0]) + ", at __syncthreads " +
         std::to_string(counts[1]) + ", at a wgmma wait " + std::to_string(counts[2]) +
         ", at a warp operation " + std::to_string(counts[3]) + ", at a named barrier " +
         std::to_string(counts[4]) + ", at an mbarrier wait " + std::to_string(counts[5]) +
         ", done " + std::to_string(counts[6]) + "; TMA loads in flight " +
         std::to_string(em().loads.size());
}

// Runs warpgroup `w` until none of its threads can go on. Returns whether any thread ran.
bool run_warpgroup(int w) {
  Emulator& e = em();
  Lane* wg = &e.lanes[w * kWarpgroupSize];
  bool progressed = false;
  for (;;) {
    bool ran = false;
    for (int t = 0; t < kWarpgroupSize; ++t) {
      if (wg[t].state == State::kAtMbarrier && poll_mbarrier(wg[t])) wg[t].state = State::kRunnable;
      if (wg[t].state != State::kRunnable) continue;
      e.current = &wg[t];
      fiber_switch(e.scheduler, wg[t].fiber);
      e.current = nullptr;
      ran = true;
      if (!e.error.empty()) return true;
      // A TMA load in flight may land now (Sm90Options::early_landing).
      if (e.options.early_landing && !e.loads.empty() && e.random() % 4 == 0)
        land_load(e.random() % e.loads.size());
      if (!e.error.empty()) return true;
    }
    for (int warp = 0; warp < kWarpgroupSize / kWarpSize; ++warp)
      resolve_warp(wg + warp * kWarpSize);
    if (!e.error.empty()) return true;
    int waiting = 0;
    for (int t = 0; t < kWarpgroupSize; ++t) waiting += wg[t].state == State::kAtWgmmaWait;
    if (waiting == kWarpgroupSize) {
      // Sm90Options::late_wgmma: the other warpgroups may run first, the wgmmas still in flight
      // (what this warpgroup released before its wait is then visible to them).
      if (ran && e.options.late_wgmma && e.random() % 2 == 0) return true;
      run_wait(wg);
      ran = true;
    } else if (waiting > 0) {
      int blocked_elsewhere = 0;
      for (int t = 0; t < kWarpgroupSize; ++t)
        blocked_elsewhere += wg[t].state == State::kDone || wg[t].state == State::kAtBarrier;
      if (blocked_elsewhere > 0) {
        e.error = "warpgroup " + std::to_string(w) + ": " + std::to_string(waiting) +
                  " of 128 threads wait at a wgmma wait, others have exited or wait at "
                  "__syncthreads (" +
                  state_summary() + ")";
        return true;
      }
    }
    if (!e.error.empty()) return true;
    bool runnable = false;
    for (int t = 0; t < kWarpgroupSize; ++t) {
      if (wg[t].state == State::kAtMbarrier && poll_mbarrier(wg[t])) wg[t].state = State::kRunnable;
      runnable = runnable || wg[t].state == State::kRunnable;
    }
    progressed = progressed || ran;
    if (!runnable) return progressed;
  }
}

std::string run_cta() {
  Emulator& e = em();
  const int count = threads();
  for (int t = 0; t < count; ++t) {
    Lane& lane = e.lanes[t];
    lane.tid = t;
    lane.state = State::kRunnable;
    lane.copy_groups.clear();
    lane.open_copies.clear();
    lane.mma_groups.clear();
    lane.open_mmas.clear();
    lane.op = WarpOp::kNone;
    lane.bulk_groups.clear();
    lane.open_bulk.clear();
    lane.registers.clear();
    lane.clock.assign(count, 0);
    lane.fences.clear();
    lane.observed.clear();
    fiber_start(lane.fiber, lane.stack.get(), kStackBytes, lane_entry, e.scheduler);
  }
  reset_memory();
  const int warpgroups = count / kWarpgroupSize;
  for (int round = 0;; ++round) {
    // Warpgroups in turn, the order alternating per round, each until none of its threads can go
    // on. A warpgroup's wgmma wait runs as soon as its 128 threads are there, before the next
    // warpgroup runs: a missing barrier between one warpgroup's shared stores and another's
    // wgmma reads shows in one of the two orders.
    bool progressed = false;
    for (int n = 0; n < warpgroups; ++n) {
      const int w = round % 2 == 0 ? n : warpgroups - 1 - n;
      progressed = run_warpgroup(w) || progressed;
      if (!e.error.empty()) return e.error;
    }
    if (progressed) continue;
    int done = 0, at_barrier = 0;
    for (int t = 0; t < count; ++t) {
      done += e.lanes[t].state == State::kDone;
      at_barrier += e.lanes[t].state == State::kAtBarrier;
    }
    if (done == count) {
      check_memory_at_exit();
      return e.error;
    }
    if (at_barrier == count) {  // __syncthreads: everyone sees everyone's past
      Clock all(count, 0);
      for (Lane& lane : e.lanes) join(all, lane.clock);
      for (Lane& lane : e.lanes) {
        lane.clock = all;
        lane.state = State::kRunnable;
      }
      ++e.barrier_generation;
      continue;
    }
    if (!e.loads.empty()) {  // nothing can go on: a TMA load lands
      land_load(e.random() % e.loads.size());
      if (!e.error.empty()) return e.error;
      continue;
    }
    if (at_barrier > 0 && done > 0)
      return "__syncthreads that " + std::to_string(done) + " exited thread(s) never reach (" +
             state_summary() + ")";
    return "stuck: " + state_summary();
  }
}

}  // namespace
}  // namespace sm90_emulator::internal

namespace {
using namespace sm90_emulator::internal;
}  // namespace

std::string emulate_sm90(Sm90Grid grid, int threads, int smem_bytes,
                         const std::function<void()>& kernel, const Sm90Options& options) {
  if (threads <= 0 || threads % kWarpgroupSize != 0 || threads > 1024)
    return "threads = " + std::to_string(threads) + ": whole warpgroups of 128, at most 1024";
  if (smem_bytes < 0 || smem_bytes + kGuardBytes > sizeof(flashjit_kernel::shared_bytes))
    return "smem_bytes = " + std::to_string(smem_bytes) + ": more than an sm90 CTA has";
  Emulator e;
  e.lanes.resize(threads);
  for (Lane& lane : e.lanes) lane.stack.reset(new char[256 * 1024]);
  e.grid = {static_cast<unsigned>(grid.x), static_cast<unsigned>(grid.y),
            static_cast<unsigned>(grid.z)};
  e.smem_bytes = smem_bytes;
  e.kernel = &kernel;
  e.options = options;
  e.random.seed(options.seed);
  t_emulator = &e;
  std::string error;
  for (int z = 0; z < grid.z && error.empty(); ++z)
    for (int y = 0; y < grid.y && error.empty(); ++y)
      for (int x = 0; x < grid.x && error.empty(); ++x) {
        e.block = {static_cast<unsigned>(x), static_cast<unsigned>(y), static_cast<unsigned>(z)};
        std::memset(flashjit_kernel::shared_bytes, 0xFF, smem_bytes + kGuardBytes);
        error = run_cta();
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

std::string emulate_ws_forward(const AttentionProblem& problem, const AttentionConfig& config,
                               const FlashjitAttentionParams& params, int threads, int smem_bytes,
                               int persistent_ctas,
                               const std::function<void(const FlashjitForwardTensorMaps&)>& kernel,
                               const Sm90Options& options) {
  Result<ForwardTensorMapSpecs> specs = forward_tensor_map_specs(params, problem, config);
  if (!specs.ok()) return specs.error().describe();
  FlashjitForwardTensorMaps maps;
  encode_tensor_map(specs->q, &maps.q);
  encode_tensor_map(specs->k, &maps.k);
  encode_tensor_map(specs->v, &maps.v);
  encode_tensor_map(specs->o, &maps.o);
  const LaunchShape launch = forward_launch(
      problem, config, {threads, smem_bytes, config.persistent ? persistent_ctas : 0});
  const Sm90Grid grid{static_cast<int>(launch.grid_x), static_cast<int>(launch.grid_y),
                      static_cast<int>(launch.grid_z)};
  return emulate_sm90(
      grid, threads, smem_bytes, [&] { kernel(maps); }, options);
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
  suspend(State::kAtWgmmaWait);
}

namespace {
// What the issuing thread knows at the issue: the mbarrier phases it has seen (for the rule on
// TMA-written operands) and, for a warpgroup's first thread, its clock (generic-written ones).
void snapshot(Mma& op) {
  const Lane* lane = em().current;
  op.observed = lane->observed;
  if (lane->tid % kWarpgroupSize == 0) op.clock = lane->clock;
}
}  // namespace

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
  operand_range(a, 64, trans_a, op.a_lo, op.a_hi);
  operand_range(b, n, trans_b, op.b_lo, op.b_hi);
  snapshot(op);
  em().current->open_mmas.push_back(std::move(op));
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
  operand_range(b, n, trans_b, op.b_lo, op.b_hi);
  snapshot(op);
  em().current->open_mmas.push_back(std::move(op));
}
void red_add_v2(float* address, float a, float b) {
  if (reinterpret_cast<uintptr_t>(address) % 8 != 0) fail("red.global.add.v2 not 8-byte aligned");
  address[0] += a;
  address[1] += b;
}

float shuffle_xor(float value, int lane_mask) {
  Lane* lane = em().current;
  if (lane_mask <= 0 || lane_mask >= kWarpSize)
    fail("shuffle xor mask " + std::to_string(lane_mask));
  lane->op = WarpOp::kShuffleXor;
  lane->value = value;
  lane->lane_mask = lane_mask;
  suspend(State::kAtWarpOp);
  return lane->result;
}
void sync_warp() {
  Lane* lane = em().current;
  lane->op = WarpOp::kSyncWarp;
  lane->lane_mask = 0;
  suspend(State::kAtWarpOp);
}

void named_barrier_sync(int id, int count) {
  named_barrier_arrive(id, count);
  Lane* lane = em().current;
  if (em().named[id].arrived == 0) return;  // this arrival completed the barrier
  lane->named_id = id;
  suspend(State::kAtNamedBarrier);
  join(lane->clock, em().named[id].joined);
}

void named_barrier_arrive(int id, int count) {
  Emulator& e = em();
  Lane* lane = e.current;
  if (id <= 0 || id >= 16) return fail("named barrier id " + std::to_string(id) + " (1..15)");
  if (count <= 0 || count % kWarpSize != 0 || count > threads())
    return fail("named barrier " + std::to_string(id) + " with " + std::to_string(count) +
                " threads: a multiple of 32 up to the CTA's " + std::to_string(threads()));
  NamedBarrier& b = e.named[id];
  if (b.arrived == 0) {
    b.count = count;
    b.joined.assign(threads(), 0);
  } else if (b.count != count) {
    return fail("named barrier " + std::to_string(id) + " with " + std::to_string(count) +
                " threads while others arrived expecting " + std::to_string(b.count));
  }
  ++lane->clock[lane->tid];
  join(b.joined, lane->clock);
  if (++b.arrived < b.count) return;
  // Complete: the waiters go on with everyone's past.
  for (Lane& other : e.lanes)
    if (other.state == State::kAtNamedBarrier && other.named_id == id) {
      other.state = State::kRunnable;
      join(other.clock, b.joined);
    }
  join(lane->clock, b.joined);
  b.arrived = 0;
}

void setmaxnreg(int registers, bool increase) {
  Emulator& e = em();
  Lane* lane = e.current;
  if (registers < 24 || registers > 256 || registers % 8 != 0)
    return fail("setmaxnreg " + std::to_string(registers) + ": 24..256, a multiple of 8");
  const int launch = e.options.launch_registers;
  if (launch > 0 && (increase ? registers < launch : registers > launch))
    return fail(std::string("setmaxnreg.") + (increase ? "inc" : "dec") + " to " +
                std::to_string(registers) + " from the launch's " + std::to_string(launch));
  lane->registers.push_back(registers);
}

}  // namespace sm90_emulator

namespace sm90_emulator::internal {
// setmaxnreg at the CTA's end: one sequence per warpgroup, and the final counts fit the launch.
void check_registers_at_exit() {
  Emulator& e = em();
  long long total = 0;
  for (int w = 0; w < threads() / kWarpgroupSize && e.error.empty(); ++w) {
    const Lane* wg = &e.lanes[w * kWarpgroupSize];
    for (int t = 1; t < kWarpgroupSize; ++t)
      if (wg[t].registers != wg[0].registers) {
        e.current = const_cast<Lane*>(&wg[t]);
        return fail("setmaxnreg differs within warpgroup " + std::to_string(w) +
                    " (all 128 threads must execute the same ones)");
      }
    total += wg[0].registers.empty() ? e.options.launch_registers : wg[0].registers.back();
  }
  const long long launch = static_cast<long long>(e.options.launch_registers) * threads();
  if (e.options.launch_registers > 0 && total * kWarpgroupSize > launch)
    fail("after setmaxnreg the warpgroups hold " + std::to_string(total * kWarpgroupSize) +
         " registers; the launch gave the CTA " + std::to_string(launch));
}
}  // namespace sm90_emulator::internal

}  // namespace flashjit::testing
