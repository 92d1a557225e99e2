// The emulator's shared memory (what last wrote each byte, and the visibility rules of
// sm90_emulator.hpp), its mbarriers and the TMA: tensor maps, loads landing at the scheduler's
// choice, stores at their thread's wait.
#include <algorithm>
#include <climits>
#include <cstring>

#include "support/sm90_emulator_state.hpp"

namespace flashjit::testing {
namespace sm90_emulator::internal {

namespace {

std::string hex(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%x", value);
  return text;
}

Mbarrier* find_barrier(uint32_t address, int* index = nullptr) {
  std::vector<Mbarrier>& barriers = em().barriers;
  for (size_t i = 0; i < barriers.size(); ++i)
    if (barriers[i].address == address) {
      if (index) *index = static_cast<int>(i);
      return &barriers[i];
    }
  fail("mbarrier operation on " + hex(address) + ", which no mbarrier.init initialized");
  return nullptr;
}

// The current thread may use `b` once the init is fenced and ordered before it.
bool usable(const Mbarrier& b) {
  const Lane* lane = em().current;
  if (lane == nullptr || b.init_thread == lane->tid) return true;
  if (!b.fenced || lane->clock[b.init_thread] <= b.init_clock) {
    fail("uses the mbarrier at " + hex(b.address) + " before its init (by thread " +
         std::to_string(b.init_thread) +
         ") was published: fence.mbarrier_init, then a barrier, then the use");
    return false;
  }
  return true;
}

void maybe_complete(Mbarrier& b) {
  if (b.pending != 0 || b.tx != 0) return;
  b.completed = b.arrivals;
  b.arrivals.assign(threads(), 0);
  ++b.phase;
  b.pending = b.expected;
}

void arrive(Mbarrier& b) {
  Lane* lane = em().current;
  if (b.pending == 0) {
    fail("arrives on the mbarrier at " + hex(b.address) + " whose phase " +
         std::to_string(b.phase) + " has all its " + std::to_string(b.expected) +
         " arrivals already (and waits for transaction bytes)");
    return;
  }
  ++lane->clock[lane->tid];
  join(b.arrivals, lane->clock);
  --b.pending;
  maybe_complete(b);
}

EmulatedTensorMap decode_map(const void* tensor_map) {
  EmulatedTensorMap map{};
  std::memcpy(&map, tensor_map, sizeof map);
  if (map.magic != kTensorMapMagic)
    fail("a TMA operation through a tensor map that encode_tensor_map() did not write");
  return map;
}

uint32_t box_bytes(const TensorMapSpec& s) { return s.box[0] * s.box[1] * s.box[2] * s.box[3] * 2; }

// Calls f(shared address, global byte offset or -1 when outside the tensor) for every element of
// the box at `coords` placed at `base` with the 128-byte swizzle.
template <class F>
void for_each_box_element(const TensorMapSpec& s, uint32_t base, const int (&coords)[4], F f) {
  for (uint32_t i3 = 0; i3 < s.box[3]; ++i3)
    for (uint32_t i2 = 0; i2 < s.box[2]; ++i2)
      for (uint32_t i1 = 0; i1 < s.box[1]; ++i1)
        for (uint32_t i0 = 0; i0 < s.box[0]; ++i0) {
          const int64_t g[4] = {
              coords[0] + static_cast<int64_t>(i0), coords[1] + static_cast<int64_t>(i1),
              coords[2] + static_cast<int64_t>(i2), coords[3] + static_cast<int64_t>(i3)};
          bool inside = true;
          for (int d = 0; d < 4; ++d)
            inside = inside && g[d] >= 0 && static_cast<uint64_t>(g[d]) < s.dims[d];
          const int64_t offset = g[0] * 2 + g[1] * static_cast<int64_t>(s.strides_bytes[0]) +
                                 g[2] * static_cast<int64_t>(s.strides_bytes[1]) +
                                 g[3] * static_cast<int64_t>(s.strides_bytes[2]);
          const uint32_t linear =
              base + (((i3 * s.box[2] + i2) * s.box[1] + i1) * s.box[0] + i0) * 2;
          f(linear ^ (((linear >> 7) & 7) << 4), inside ? offset : -1);
        }
}

// The rule for one byte that an async-proxy reader (a wgmma, a TMA store) reads.
void check_byte(uint32_t address, const std::vector<uint32_t>& observed, const Clock* clock,
                const char* what) {
  Emulator& e = em();
  const ByteState& s = e.bytes[address - kWindowBase];
  if (s.kind == ByteState::kTma) {
    const uint32_t seen =
        static_cast<size_t>(s.barrier) < observed.size() ? observed[s.barrier] : 0;
    if (seen <= s.phase)
      fail(std::string(what) + " reads shared byte " + hex(address) +
           ", which a TMA load filled completing phase " + std::to_string(s.phase) +
           " of the mbarrier at " + hex(e.barriers[s.barrier].address) +
           ", before its issuing thread(s) waited for that phase");
  } else if (s.kind == ByteState::kGeneric && clock != nullptr) {
    const std::vector<uint32_t>& fences = e.lanes[s.writer].fences;
    const auto fence = std::upper_bound(fences.begin(), fences.end(), s.clock);
    if (fence == fences.end() || (*clock)[s.writer] < *fence)
      fail(std::string(what) + " reads shared byte " + hex(address) + ", which thread " +
           std::to_string(s.writer) +
           " wrote (generic proxy) without a fence.proxy.async ordered before the read "
           "(the writer's fence, then a barrier or arrival the reader waits for)");
  }
}

}  // namespace

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

void record_generic_write(uint32_t address, int bytes) {
  Emulator& e = em();
  const Lane* lane = e.current;
  for (int i = 0; i < bytes; ++i) {
    ByteState& s = e.bytes[address + i - kWindowBase];
    s.kind = ByteState::kGeneric;
    s.writer = static_cast<int16_t>(lane->tid);
    s.clock = lane->clock[lane->tid];
  }
}

void check_async_read(uint32_t address, const std::vector<uint32_t>& observed, const Clock* clock,
                      const char* what) {
  Emulator& e = em();
  for (const TmaLoad& load : e.loads)
    if (address >= load.destination && address < load.destination + load.bytes)
      return fail(std::string(what) + " reads shared byte " + hex(address) +
                  " while a TMA load into it is in flight");
  check_byte(address, observed, clock, what);
}

void check_no_pending_readers(uint32_t lo, uint32_t hi, const char* what) {
  Emulator& e = em();
  auto overlaps = [&](uint32_t a, uint32_t b) { return a < hi && lo < b; };
  std::string range = "[";  // appended: gcc 12 warns falsely (-Wrestrict) on "[" + string&&
  range += hex(lo);
  range += ", ";
  range += hex(hi);
  range += ")";
  for (size_t w = 0; w < e.lanes.size(); w += kWarpgroupSize) {
    const Lane& leader = e.lanes[w];
    auto check = [&](const Mma& op) {
      if ((!op.rs && overlaps(op.a_lo, op.a_hi)) || overlaps(op.b_lo, op.b_hi))
        fail(std::string(what) + " writes shared bytes " + range + " that a wgmma of warpgroup " +
             std::to_string(w / kWarpgroupSize) + " may still read (issued, not waited for)");
    };
    for (const std::vector<Mma>& group : leader.mma_groups)
      for (const Mma& op : group) check(op);
    for (const Mma& op : leader.open_mmas) check(op);
  }
  for (const TmaLoad& load : e.loads)
    if (overlaps(load.destination, load.destination + load.bytes))
      fail(std::string(what) + " writes shared bytes " + range +
           " that a TMA load in flight is filling");
  for (const TmaStore& store : e.stores)
    if (!store.done &&
        overlaps(store.source, store.source + (store.reduce_to != nullptr
                                                   ? store.reduce_bytes
                                                   : static_cast<uint32_t>(box_bytes(store.map)))))
      fail(std::string(what) + " writes shared bytes " + range +
           " that a TMA store has not read yet (its thread has not waited for it)");
  for (const Mbarrier& b : e.barriers)
    if (overlaps(b.address, b.address + 8))
      fail(std::string(what) + " writes over the mbarrier at " + hex(b.address));
}

void reset_memory() {
  Emulator& e = em();
  e.bytes.assign(e.smem_bytes, ByteState{});
  e.barriers.clear();
  for (NamedBarrier& b : e.named) b = NamedBarrier{};
  e.loads.clear();
  e.stores.clear();
}

void land_load(size_t index) {
  Emulator& e = em();
  const TmaLoad load = e.loads[index];
  e.loads.erase(e.loads.begin() + index);
  Mbarrier& b = e.barriers[load.barrier];
  const auto* global = static_cast<const unsigned char*>(load.map.base);
  for_each_box_element(load.map, load.destination, load.coords,
                       [&](uint32_t address, int64_t offset) {
                         unsigned char* to = shared_at(address, 2);
                         if (!to) return;
                         if (offset >= 0)
                           std::memcpy(to, global + offset, 2);
                         else
                           std::memset(to, 0, 2);
                         for (int i = 0; i < 2; ++i) {
                           ByteState& s = e.bytes[address + i - kWindowBase];
                           s.kind = ByteState::kTma;
                           s.barrier = static_cast<int16_t>(load.barrier);
                           s.phase = b.phase;
                         }
                       });
  b.tx -= load.bytes;
  maybe_complete(b);
}

bool poll_mbarrier(Lane& lane) {
  Emulator& e = em();
  int index = -1;
  Lane* saved = e.current;
  e.current = &lane;
  Mbarrier* b = find_barrier(lane.wait_barrier, &index);
  e.current = saved;
  if (b == nullptr) return true;  // the error stops the CTA
  // try_wait.parity P succeeds when P is the parity of the phase before the current one.
  if (lane.wait_parity == (b->phase & 1)) return false;
  join(lane.clock, b->completed);
  if (lane.observed.size() < e.barriers.size()) lane.observed.resize(e.barriers.size(), 0);
  lane.observed[index] = std::max(lane.observed[index], b->phase);
  return true;
}

void check_memory_at_exit() {
  Emulator& e = em();
  if (!e.loads.empty())
    return fail("the CTA ends with " + std::to_string(e.loads.size()) +
                " TMA load(s) in flight (nothing waited for them)");
  for (const TmaStore& store : e.stores)
    if (!store.done) return fail("the CTA ends with a TMA store its thread never waited for");
  check_registers_at_exit();
}

}  // namespace sm90_emulator::internal

using namespace sm90_emulator::internal;

void encode_tensor_map(const TensorMapSpec& spec, FlashjitTensorMap* map) {
  static_assert(sizeof(EmulatedTensorMap) <= sizeof(FlashjitTensorMap), "fits the opaque bytes");
  std::memset(map, 0, sizeof *map);
  const EmulatedTensorMap emulated{kTensorMapMagic, spec};
  std::memcpy(map, &emulated, sizeof emulated);
}

namespace sm90_emulator {

void store_shared_u32(uint32_t address, uint32_t value) {
  if (address % 4 != 0) return fail("st.shared.b32 at " + std::to_string(address));
  unsigned char* at = shared_at(address, 4);
  if (!at) return;
  check_no_pending_readers(address, address + 4, "a shared store");
  std::memcpy(at, &value, 4);
  record_generic_write(address, 4);
}

namespace {
// ld.shared of `bytes` (aligned to them): checked against loads in flight and unordered stores.
void load_shared(uint32_t address, void* value, uint32_t bytes) {
  if (address % bytes != 0)
    return fail("ld.shared of " + std::to_string(bytes) + " bytes at " + std::to_string(address));
  const unsigned char* at = shared_at(address, bytes);
  if (!at) return;
  Emulator& e = em();
  const Lane* lane = e.current;
  for (uint32_t a = address; a < address + bytes; ++a) {
    for (const TmaLoad& load : e.loads)
      if (a >= load.destination && a < load.destination + load.bytes)
        return fail("a shared load reads byte " + hex(a) +
                    " while a TMA load into it is in flight");
    const ByteState& s = e.bytes[a - kWindowBase];
    if (s.kind == ByteState::kTma) {
      check_byte(a, lane->observed, nullptr, "a shared load");
    } else if (s.kind == ByteState::kGeneric && s.writer != lane->tid &&
               lane->clock[s.writer] <= s.clock) {  // its arrival after the store counts past it
      return fail("a shared load reads byte " + hex(a) + ", which thread " +
                  std::to_string(s.writer) +
                  " stored with no barrier or arrival ordering the store before the load");
    }
  }
  std::memcpy(value, at, bytes);
}
}  // namespace

void load_shared_16(uint32_t address, void* value) { load_shared(address, value, 16); }
void load_shared_4(uint32_t address, void* value) { load_shared(address, value, 4); }

void fence_proxy_async() {
  Lane* lane = em().current;
  ++lane->clock[lane->tid];
  lane->fences.push_back(lane->clock[lane->tid]);
}

void mbarrier_init(uint32_t address, uint32_t arrivals) {
  Emulator& e = em();
  if (address % 8 != 0 || !shared_at(address, 8))
    return fail("mbarrier.init at " + std::to_string(address) + ": 8-byte aligned shared memory");
  for (const Mbarrier& b : e.barriers)
    if (b.address == address)
      return fail("mbarrier at " + std::to_string(address) + " initialized twice");
  if (arrivals == 0) return fail("mbarrier.init with 0 arrivals");
  Mbarrier b;
  b.address = address;
  b.expected = b.pending = static_cast<int>(arrivals);
  b.init_thread = e.current->tid;
  b.init_clock = e.current->clock[e.current->tid];
  b.arrivals.assign(threads(), 0);
  b.completed.assign(threads(), 0);
  e.barriers.push_back(b);
}

void fence_barrier_init() {
  Emulator& e = em();
  Lane* lane = e.current;
  for (Mbarrier& b : e.barriers)
    if (b.init_thread == lane->tid) b.fenced = true;
  ++lane->clock[lane->tid];
}

void mbarrier_arrive(uint32_t address) {
  Mbarrier* b = find_barrier(address);
  if (b && usable(*b)) arrive(*b);
}

void mbarrier_arrive_expect_tx(uint32_t address, uint32_t bytes) {
  Mbarrier* b = find_barrier(address);
  if (!b || !usable(*b)) return;
  b->tx += bytes;
  arrive(*b);
}

void mbarrier_wait(uint32_t address, uint32_t parity) {
  Mbarrier* b = find_barrier(address);
  if (!b || !usable(*b)) return;
  if (parity > 1) return fail("mbarrier wait with parity " + std::to_string(parity));
  Lane* lane = em().current;
  lane->wait_barrier = address;
  lane->wait_parity = parity;
  if (poll_mbarrier(*lane)) return;
  suspend(State::kAtMbarrier);  // the scheduler resumes it once a poll succeeds
}

void tma_load_4d(uint32_t destination, const void* tensor_map, uint32_t barrier, int c0, int c1,
                 int c2, int c3) {
  Emulator& e = em();
  const EmulatedTensorMap map = decode_map(tensor_map);
  int index = -1;
  Mbarrier* b = find_barrier(barrier, &index);
  if (!e.error.empty() || !b || !usable(*b)) return;
  if (destination % 128 != 0)
    return fail("TMA load to shared address " + std::to_string(destination) +
                ": not 128-byte aligned");
  TmaLoad load;
  load.destination = destination;
  load.map = map.spec;
  load.coords[0] = c0;
  load.coords[1] = c1;
  load.coords[2] = c2;
  load.coords[3] = c3;
  load.barrier = index;
  load.issuer = e.current->tid;
  load.bytes = box_bytes(map.spec);
  if (!shared_at(destination, static_cast<int>(load.bytes))) return;
  check_no_pending_readers(destination, destination + load.bytes, "a TMA load");
  e.loads.push_back(load);
}

void tma_store_4d(const void* tensor_map, uint32_t source, int c0, int c1, int c2, int c3) {
  Emulator& e = em();
  const EmulatedTensorMap map = decode_map(tensor_map);
  if (!e.error.empty()) return;
  if (source % 128 != 0)
    return fail("TMA store from shared address " + std::to_string(source) +
                ": not 128-byte aligned");
  TmaStore store;
  store.source = source;
  store.map = map.spec;
  store.coords[0] = c0;
  store.coords[1] = c1;
  store.coords[2] = c2;
  store.coords[3] = c3;
  store.issuer = e.current->tid;
  store.clock = e.current->clock;
  if (!shared_at(source, static_cast<int>(box_bytes(map.spec)))) return;
  e.current->open_bulk.push_back(static_cast<int>(e.stores.size()));
  e.stores.push_back(store);
}

void bulk_reduce_add_f32(float* destination, uint32_t source, uint32_t bytes) {
  Emulator& e = em();
  if (bytes == 0 || bytes % 16 != 0 || source % 16 != 0 ||
      reinterpret_cast<uintptr_t>(destination) % 16 != 0)
    return fail("cp.reduce.async.bulk of " + std::to_string(bytes) + " bytes from shared " +
                std::to_string(source) + ": size and addresses must be multiples of 16");
  if (!shared_at(source, static_cast<int>(bytes))) return;
  TmaStore store;
  store.source = source;
  store.reduce_to = destination;
  store.reduce_bytes = bytes;
  store.issuer = e.current->tid;
  store.clock = e.current->clock;
  e.current->open_bulk.push_back(static_cast<int>(e.stores.size()));
  e.stores.push_back(store);
}

void bulk_commit_group() {
  Lane* lane = em().current;
  lane->bulk_groups.push_back(std::move(lane->open_bulk));
  lane->open_bulk.clear();
}

void bulk_wait_group_read(int pending) {
  Emulator& e = em();
  Lane* lane = e.current;
  while (lane->bulk_groups.size() > static_cast<size_t>(pending)) {
    for (int index : lane->bulk_groups.front()) {
      TmaStore& store = e.stores[index];
      if (store.reduce_to != nullptr) {  // a bulk reduction: the words it reads, added
        for (uint32_t byte = 0; byte < store.reduce_bytes; byte += 4) {
          const unsigned char* from = shared_at(store.source + byte, 4);
          if (!from) return;
          for (uint32_t i = 0; i < 4; ++i)
            check_async_read(store.source + byte + i, lane->observed, &store.clock,
                             "a bulk reduction");
          float value;
          std::memcpy(&value, from, 4);
          store.reduce_to[byte / 4] += value;
        }
        store.done = true;
        continue;
      }
      auto* global = static_cast<unsigned char*>(const_cast<void*>(store.map.base));
      for_each_box_element(
          store.map, store.source, store.coords, [&](uint32_t address, int64_t offset) {
            const unsigned char* from = shared_at(address, 2);
            if (!from) return;
            check_async_read(address, lane->observed, &store.clock, "a TMA store");
            check_async_read(address + 1, lane->observed, &store.clock, "a TMA store");
            if (offset >= 0) std::memcpy(global + offset, from, 2);
          });
      store.done = true;
    }
    lane->bulk_groups.erase(lane->bulk_groups.begin());
  }
}

}  // namespace sm90_emulator

}  // namespace flashjit::testing
