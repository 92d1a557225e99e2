// The block map of a mask_mod (issue 31): FlashjitBlockMask (templates/attention_params.h) filled
// on the device by two small kernels, generated per variant (generator/block_mask.hpp renders
// them after the variant's prelude, so that the mask_mod, causal, the window and the prefix are
// those the attention kernels compile in) and launched by runtime/cuda/block_mask.cpp on the
// attention call's stream: no host sync, the same launches every call (CUDA-graph safe).
//
//   states  grid (ceil(k_tiles / kBlockMaskWarps), q_tiles, maps), kBlockMaskThreads threads:
//           one warp per (query tile, key tile) evaluates visible() on every element of the tile
//           (rows past seqlen_q left out), the lanes over the keys of a row, and votes with
//           shuffles every kBlockMaskVoteRows rows: empty (no element seen), full (every element
//           seen) or partial (stops at the first vote that shows both).
//   lists   grid (ceil(maps * (q_tiles + k_tiles) / kBlockMaskThreads)): one thread per query
//           tile writes its non-empty key tiles (q_count, q_list), one per key tile its non-empty
//           query tiles (k_count, k_list), each entry (tile << 1) | full.
//
// Only the CUDA built-ins the host emulator has (tests/support/cuda_emulator.hpp): the tests run
// both kernels on the CPU against a host evaluation of the expression.

namespace flashjit_kernel {

constexpr int kBlockMaskWarps = 4;
constexpr int kBlockMaskThreads = 32 * kBlockMaskWarps;
constexpr int kBlockMaskVoteRows = 8;

__device__ __forceinline__ float block_mask_warp_max(float x) {
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, mask));
  return x;
}
__device__ __forceinline__ float block_mask_warp_min(float x) {
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) x = fminf(x, __shfl_xor_sync(0xffffffffu, x, mask));
  return x;
}

__device__ __forceinline__ void block_mask_states(const FlashjitAttentionParams& p,
                                                  const FlashjitBlockMask& m) {
  const int lane = threadIdx.x % 32;
  const int k_tile = blockIdx.x * kBlockMaskWarps + threadIdx.x / 32;
  if (k_tile >= m.k_tiles) return;  // the whole warp
  const int q_tile = blockIdx.y;
  const int map = blockIdx.z;
  const int batch = m.per_head ? map / m.heads_q : 0;
  const int head = m.per_head ? map % m.heads_q : 0;
  const int diagonal = p.seqlen_k - p.seqlen_q;
  const int m0 = q_tile * m.block_m;
  const int n0 = k_tile * m.block_n;
  const int row_end = m0 + m.block_m < p.seqlen_q ? m0 + m.block_m : p.seqlen_q;
  float any = 0.f, all = 1.f;  // this lane's, then the warp's at each vote
  for (int row = m0; row < row_end; ++row) {
    for (int c = lane; c < m.block_n; c += 32) {
      const bool seen = flashjit_variant::visible(p, diagonal, batch, head, row, n0 + c);
      any = seen ? 1.f : any;
      all = seen ? all : 0.f;
    }
    if ((row - m0) % kBlockMaskVoteRows == kBlockMaskVoteRows - 1 || row == row_end - 1) {
      any = block_mask_warp_max(any);
      all = block_mask_warp_min(all);
      if (any != 0.f && all == 0.f) break;  // partial whatever the other rows see
    }
  }
  if (lane == 0) {
    const long long at = (static_cast<long long>(map) * m.q_tiles + q_tile) * m.k_tiles + k_tile;
    m.states[at] = any == 0.f ? 0 : all != 0.f ? 2 : 1;
  }
}

__device__ __forceinline__ void block_mask_lists(const FlashjitBlockMask& m) {
  const long long item = static_cast<long long>(blockIdx.x) * kBlockMaskThreads + threadIdx.x;
  const long long rows = static_cast<long long>(m.maps) * m.q_tiles;
  const long long columns = static_cast<long long>(m.maps) * m.k_tiles;
  if (item < rows) {  // query tile `item` of its map: a row of the states
    const unsigned char* states = m.states + item * m.k_tiles;
    int* list = m.q_list + item * m.k_tiles;
    int count = 0;
    for (int t = 0; t < m.k_tiles; ++t) {
      const int state = states[t];
      if (state != 0) list[count++] = (t << 1) | (state == 2 ? 1 : 0);
    }
    m.q_count[item] = count;
  } else if (item < rows + columns) {  // key tile of a map: a column of the states
    const long long column = item - rows;
    const long long map = column / m.k_tiles;
    const int k_tile = static_cast<int>(column % m.k_tiles);
    const unsigned char* states = m.states + map * m.q_tiles * m.k_tiles + k_tile;
    int* list = m.k_list + column * m.q_tiles;
    int count = 0;
    for (int t = 0; t < m.q_tiles; ++t) {
      const int state = states[static_cast<long long>(t) * m.k_tiles];
      if (state != 0) list[count++] = (t << 1) | (state == 2 ? 1 : 0);
    }
    m.k_count[column] = count;
  }
}

}  // namespace flashjit_kernel
