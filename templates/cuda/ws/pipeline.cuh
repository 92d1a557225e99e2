// The pipeline between the producer (one thread issuing TMA loads) and the consumer warpgroups of
// the warp-specialized forward: a ring of STAGES shared-memory buffers, two mbarriers per stage
// (the shape of CUTLASS's PipelineTmaAsync, written out):
//   full[s]   1 arrival (the producer's arrive.expect_tx) plus the buffer's TMA bytes: completes
//             when the load into buffer s has landed.
//   empty[s]  one arrival per consumer thread: completes when every consumer has finished with
//             buffer s (after the wgmma wait of the MMAs that read it).
// Fill r (r = 0, 1, ...) of stage s is phase r of full[s], and its release phase r of empty[s].
// A PipelineState walks the stages in order: index s, phase = r & 1. Consumers wait full[s] for
// parity `phase`; the producer waits empty[s] for parity `phase ^ 1`, which on a fresh barrier
// names the phase before phase 0 and is complete at once: the first fill of a stage never waits.

namespace flashjit_kernel {

template <int STAGES>
struct PipelineState {
  int index = 0;  // the stage
  u32 phase = 0;  // parity of the stage's round
  __device__ __forceinline__ void advance() {
    if (++index == STAGES) {
      index = 0;
      phase ^= 1;
    }
  }
};

template <int STAGES>
struct Pipeline {
  u32 full;   // shared address of full[0]; full[s] at + 8 s
  u32 empty;  // of empty[0]

  __device__ __forceinline__ u32 full_barrier(int stage) const { return full + 8 * stage; }
  __device__ __forceinline__ u32 empty_barrier(int stage) const { return empty + 8 * stage; }

  // One thread, before the CTA barrier that publishes the pipeline.
  __device__ __forceinline__ void init(u32 consumer_arrivals) const {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(full_barrier(s), 1);
      mbarrier_init(empty_barrier(s), consumer_arrivals);
    }
  }
  // Producer: waits until buffer state.index is free, then announces the bytes its TMA loads
  // will bring (the loads complete on full_barrier(state.index)).
  __device__ __forceinline__ void producer_acquire(const PipelineState<STAGES>& state,
                                                   u32 bytes) const {
    mbarrier_wait(empty_barrier(state.index), state.phase ^ 1);
    mbarrier_arrive_expect_tx(full_barrier(state.index), bytes);
  }
  // Producer, at the end: waits until the consumers released every buffer (the CTA's loads have
  // all landed and been read before the producing thread exits).
  __device__ __forceinline__ void producer_tail(PipelineState<STAGES> state) const {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_wait(empty_barrier(state.index), state.phase ^ 1);
      state.advance();
    }
  }
  // Consumer: waits until buffer state.index holds its load.
  __device__ __forceinline__ void consumer_wait(const PipelineState<STAGES>& state) const {
    mbarrier_wait(full_barrier(state.index), state.phase);
  }
  // Consumer: this thread is done with buffer state.index (its MMAs have been waited for).
  __device__ __forceinline__ void consumer_release(const PipelineState<STAGES>& state) const {
    mbarrier_arrive(empty_barrier(state.index));
  }
};

// The start of a warp-specialized kernel (the forward's and the backward's): one thread
// initializes the CTA's mbarriers (SHARED::init_barriers(): its pipelines and other barriers) and
// prefetches the tensor maps' descriptors; then the CTA barrier that publishes the barriers (the
// last CTA-wide barrier: the roles go their own ways after it).
template <class SHARED>
__device__ __forceinline__ void ws_init_barriers(const SHARED& smem,
                                                 const FlashjitForwardTensorMaps& maps) {
  if (threadIdx.x == 0) {
    smem.init_barriers();
    fence_barrier_init();
    prefetch_tensor_map(&maps.q);
    prefetch_tensor_map(&maps.k);
    prefetch_tensor_map(&maps.v);
    prefetch_tensor_map(&maps.o);
  }
  __syncthreads();
}

}  // namespace flashjit_kernel
