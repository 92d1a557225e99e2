// Ping-pong between the consumer warpgroups of the warp-specialized forward (configs "-pp"):
// they take turns issuing their GEMMs, so that while the tensor cores run consumer c's S = Q K^T
// and P V, consumer c's neighbours do their softmax on the CUDA cores, and the other way round.
// Within a warpgroup the overlap of S_j with the softmax of S_{j-1}'s P V stays (mainloop.cuh).
//
// One named barrier per consumer, 256 threads: consumer c's turn (bar.sync, 128 threads) is
// complete when the previous consumer (c - 1 mod C) has passed it (bar.arrive, 128 threads)
// after issuing its own GEMMs. Consumer 0 passes the first turn to itself. Every consumer takes
// the same number of turns per tile (n_blocks - 1: the loop body of ws_consume; its peeled
// first S and last P V take none), so the turns continue across the tiles of a persistent CTA;
// the last pass of a CTA is never waited for. A barrier never holds two passes: the next pass
// to consumer c comes after a whole round of turns, which includes c's wait (a second pass
// would complete the barrier without c).
//
//   consumer 0:  turn | S_j, P V_j-1 | pass -> softmax(S_j) ........ | turn | S_j+1 ...
//   consumer 1:         turn (waits) ........ | S_j, P V_j-1 | pass -> softmax(S_j) ...

namespace flashjit_kernel {

// Named barrier ids of the forward (0 is __syncthreads): ws/epilogue.cuh takes 1 .. 3, the
// turns 4 .. 6.
constexpr int kWsTurnBarrier = 4;

template <class K>
struct WsTurns {
  int consumer;  // 0-based

  // Before the first turn of the kernel (not of each tile).
  __device__ __forceinline__ void init() const {
    if (K::kPingPong && consumer == 0) named_barrier_arrive(kWsTurnBarrier, 256);
  }
  // Waits until the previous consumer has issued its GEMMs of this step.
  __device__ __forceinline__ void take() const {
    if (K::kPingPong) named_barrier_sync(kWsTurnBarrier + consumer, 256);
  }
  // This consumer's GEMMs of this step are issued: the next consumer's turn.
  __device__ __forceinline__ void pass() const {
    if (K::kPingPong) named_barrier_arrive(kWsTurnBarrier + (consumer + 1) % K::kConsumers, 256);
  }
};

}  // namespace flashjit_kernel
