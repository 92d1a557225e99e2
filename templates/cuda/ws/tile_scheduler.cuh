// Which output tile (block_m query rows of one head of one batch) a CTA of the warp-specialized
// forward computes. One tile per CTA, read from the grid as the other families launch it:
// blockIdx.x = query block, y = head, z = batch. Causal query blocks near the end see the most
// keys: they are launched first so that the tail of the grid is short.

namespace flashjit_kernel {

struct WsTile {
  int m_block;  // query block: rows [m_block * block_m, + block_m)
  int head;     // query head
  int batch;
};

template <bool CAUSAL>
struct StaticTileScheduler {
  __device__ __forceinline__ static WsTile tile() {
    WsTile t;
    t.m_block =
        CAUSAL ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
    t.head = static_cast<int>(blockIdx.y);
    t.batch = static_cast<int>(blockIdx.z);
    return t;
  }
};

}  // namespace flashjit_kernel
