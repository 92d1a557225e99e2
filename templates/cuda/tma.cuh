// PTX wrappers of the warp-specialized Hopper family (sm_90a, templates/cuda/ws/): the tensor
// memory accelerator (TMA: cp.async.bulk.tensor loads and stores through tensor maps), the
// mbarriers its loads complete on, named barriers (bar.sync with an id and a thread count) and
// setmaxnreg (registers moved between warpgroups). The renderer places this after cuda/wgmma.cuh;
// tests/support/sm90_emulator.hpp defines the same names on the host.
//
// Shared-memory operands are shared-space addresses (shared_address()). A tensor map is the
// generic address of a CUtensorMap kernel parameter (__grid_constant__: its address is valid for
// TMA), encoded on the host for each launch (runtime/tensor_map_spec.hpp describes them).

namespace flashjit_kernel {

// ---- mbarriers ---------------------------------------------------------------------------------

// An mbarrier of `arrivals` expected arrivals per phase, phase 0 in progress, no transaction
// bytes pending. One thread initializes; fence_barrier_init() then a CTA barrier publish it.
__device__ __forceinline__ void mbarrier_init(u32 barrier, u32 arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals)
               : "memory");
}
// Makes this thread's mbarrier inits visible to the other threads and to the async proxy (TMA
// completions), once a barrier orders them.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival on the current phase.
__device__ __forceinline__ void mbarrier_arrive(u32 barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}
// Adds `bytes` to the transaction bytes the current phase waits for (the TMA loads that complete
// on it), then arrives: the phase completes when every arrival is in and every byte has landed.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 barrier, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes)
               : "memory");
}
// Waits until the phase of the given parity has completed: the current phase when the barrier
// is in it, else the one before (on a fresh barrier, parity 1 names a completed phase).
__device__ __forceinline__ void mbarrier_wait(u32 barrier, u32 parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "waiting:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra waiting;\n}\n" ::"r"(barrier),
      "r"(parity)
      : "memory");
}

// ---- TMA ---------------------------------------------------------------------------------------

// Loads the box of `tensor_map` at coordinates (c0, c1, c2, c3) (c0 innermost, in elements) into
// shared memory at `destination` (the map's swizzle applied), completing `bytes of the box` on
// the mbarrier `barrier`. Elements outside the tensor are zero-filled (and counted).
__device__ __forceinline__ void tma_load_4d(u32 destination, const void* tensor_map, u32 barrier,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(destination),
      "l"(tensor_map), "r"(barrier), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// Stores the box at `source` to `tensor_map` at (c0, c1, c2, c3); elements outside the tensor are
// skipped. Asynchronous: part of this thread's open bulk group (bulk_commit_group).
__device__ __forceinline__ void tma_store_4d(const void* tensor_map, u32 source, int c0, int c1,
                                             int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], "
      "[%1];\n" ::"l"(tensor_map),
      "r"(source), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until at most PENDING of this thread's bulk groups still read shared memory (their
// source may be overwritten, or the CTA exit, after this).
template <int PENDING>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(PENDING) : "memory");
}
__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

// ---- named barriers and registers --------------------------------------------------------------

// Barrier `id` (1..15; 0 is __syncthreads) completes when `threads` threads (a multiple of 32,
// whole warps) have arrived; sync waits for that, arrive does not.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The warpgroup's threads raise (inc) or lower (dec) their register count to REGISTERS (24..256,
// a multiple of 8); all 128 threads execute it. ptxas compiles the code after it to that count.
template <int REGISTERS>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
}
template <int REGISTERS>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
}

}  // namespace flashjit_kernel
