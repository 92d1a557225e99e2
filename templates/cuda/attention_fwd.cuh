// FlashAttention-2 forward for NVIDIA sm80+ (A100, RTX 30/40, H100/H200), tensor cores via
// mma.sync m16n8k16. The renderer prepends templates/attention_params.h,
// templates/attention_common.h (the key range, masking and LSE rules every GPU template shares),
// cuda/common.cuh (element types, PTX wrappers) and cuda/tiles.cuh (swizzled shared-memory tiles),
// and appends one instantiation.
//
// One CTA computes O for kBlockM query rows of one (batch, head):
//
// clang-format off
//   load Q tile                         Q: [kBlockM, d] -> shared
//   m = -inf, l = 0, acc = 0            per row, fp32, in registers
//   for each K/V block j:               K_j, V_j: [kBlockN, d], through kStages buffers
//     S   = Q K_j^T                     [kBlockM, kBlockN], fp32 registers
//     S   = mask(S)                     only blocks that cross seqlen_k or the diagonal
//     m'  = max(m, rowmax(S))
//     P   = exp2(S * scale_log2 - m' * scale_log2)   kept in registers as the A operand
//     l   = l * exp2((m - m') * scale_log2) + rowsum(P)
//     acc = acc * exp2((m - m') * scale_log2) + P V_j
//     m   = m'
//   O   = acc / l                       written through shared memory, 16-byte stores
//   LSE = (m * scale_log2 + log2(l)) * ln(2)
// clang-format on
//
// Each warp owns kRowsPerWarp = 16 * kMTiles query rows end to end, so warps synchronize only
// around the shared K/V buffers.
//
// An attention variant (FLASHJIT_VARIANT: templates/attention_variant.h, rendered before this
// file) changes three things: the K/V blocks visited come from its key-block range (hidden blocks
// are never loaded), its mask replaces the causal one, and when it modifies the scores every
// score passes through it as scale * q . k (the softmax then works with log2(e) alone). Shared
// tiles are cuda/tiles.cuh's: row-major, the 16-byte chunks of each row XOR-swizzled by (row % 8).

namespace flashjit_kernel {

template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, bool IS_BF16, bool CAUSAL>
struct Traits {
  // kHeadDimPadded: whole swizzle groups.
  FLASHJIT_TRAITS_SHAPE(HEAD_DIM, (HEAD_DIM + 63) / 64 * 64, BLOCK_M, BLOCK_N, WARPS, STAGES,
                        IS_BF16, CAUSAL);

  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;         // 16-row MMA tiles per warp
  static constexpr int kNTiles = kBlockN / 8;               // 8-column tiles of S
  static constexpr int kDTiles = kHeadDimPadded / 8;        // 8-column tiles of O
  static constexpr int kChunksPerRow = kHeadDimPadded / 8;  // 16-byte chunks per tile row
  static constexpr int kRowBytes = kHeadDimPadded * 2;
  static constexpr int kSmemElements = (kBlockM + 2 * kStages * kBlockN) * kHeadDimPadded;

  static_assert(kBlockM % (16 * kWarps) == 0, "each warp owns whole 16-row MMA tiles");
  static_assert(kMTiles == 1 || kMTiles == 2, "16 or 32 query rows per warp");
  static_assert(kBlockN % 16 == 0, "P feeds the second MMA in k-steps of 16 columns");
  static_assert(kStages >= 2 && kStages <= 3, "2 or 3 K/V pipeline stages");
  static_assert((kBlockN * kChunksPerRow) % kThreads == 0, "K/V tile copies split evenly");
  static_assert(kBlockN * kChunksPerRow / kThreads <= 16, "at most 16 copies per thread per tile");
  static_assert((kBlockM * kChunksPerRow) % kThreads == 0, "Q tile copies split evenly");
  static_assert((kRowsPerWarp * kChunksPerRow) % 32 == 0, "O row copies split over a warp");
};

// ---- the kernel -------------------------------------------------------------------------------

template <class K>
FLASHJIT_KERNEL_BODY(attention_forward) {  // p (a variant: and its block map)
  namespace fa = flashjit_attention;
#ifdef FLASHJIT_VARIANT
  namespace fv = flashjit_variant;
#endif
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kMTiles = K::kMTiles, kNTiles = K::kNTiles, kDTiles = K::kDTiles;
  constexpr int kDp = K::kHeadDimPadded;  // elements per row of every shared tile

  constexpr int kTileBytes = kBlockN * K::kRowBytes;

  unsigned char* shared_bytes = dynamic_shared_memory();
  u16* q_tile = reinterpret_cast<u16*>(shared_bytes);  // [kBlockM, d_padded]
  const u32 q_tile_address = shared_address(shared_bytes);
  const u32 kv_tiles =
      q_tile_address + kBlockM * K::kRowBytes;  // kStages x {K, V}: [kBlockN, d_padded]

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  // Causal rows near the end see the most keys: launch them first so the tail is short.
  const int m_block = K::kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / p.group_size;
  const int m0 = m_block * kBlockM;
  const int warp_row0 = warp * K::kRowsPerWarp;  // first row of this warp within the block

  FLASHJIT_FORWARD_TENSORS(p, batch, head, kv_head, m0);  // q, k, v, o, lse

  // Causal, bottom-right aligned: row i sees keys j <= i + diagonal.
  const int diagonal = fa::diagonal(p);
#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_BLOCK_MASK
  // The block map's non-empty key tiles of this query tile (empty ones are never loaded).
  const fv::BlockList key_tiles = fv::key_tiles_of(*block_mask, batch, head, m_block);
  const int n_blocks = key_tiles.count();
#define FLASHJIT_KEY_BLOCK(t) key_tiles.at(t)
#else
  // The variant's key blocks: the t-th block visited is key_blocks.at(t).
  const fv::KeyBlocks key_blocks = fv::key_blocks(p, diagonal, m0, kBlockM, kBlockN);
  const int n_blocks = key_blocks.count();
#define FLASHJIT_KEY_BLOCK(t) key_blocks.at(t)
#endif
  const float slope = fv::alibi_slope(p, head);
  // Modified scores are scaled scores: the softmax's factor is log2(e) alone.
  const float variant_scale_log2 = fv::kModifiesScores ? 1.4426950408889634f : p.scale_log2;
#define FLASHJIT_SCALE_LOG2 variant_scale_log2
#else
  const int n_blocks = fa::key_blocks<K::kCausal>(p, diagonal, m0, kBlockM, kBlockN);
#define FLASHJIT_KEY_BLOCK(t) (t)
// (A macro rather than a local copy: plain kernels compile exactly as before variants, and a
// local copy of the parameter changed the causal kernels' code.)
#define FLASHJIT_SCALE_LOG2 p.scale_log2
#endif

  // Fragment layout of an m16n8 accumulator: lane holds rows lane/4 and lane/4 + 8,
  // columns 2 * (lane % 4) + {0, 1}.
  const int frag_row = lane / 4;
  const int frag_col = 2 * (lane % 4);
  // Byte offsets of the row/chunk each lane addresses in its ldmatrix calls (before the
  // per-fragment constants): Q as the A operand, K as B, V as B through .trans.
  const u32 q_lane = 2 * swizzled_offset<kDp>(warp_row0 + lane % 16, lane / 16 * 8);
  const u32 k_lane = 2 * swizzled_offset<kDp>(lane / 16 * 8 + lane % 8, (lane / 8) % 2 * 8);
  const u32 v_lane = 2 * swizzled_offset<kDp>((lane / 8) % 2 * 8 + lane % 8, lane / 16 * 8);

  float acc[kMTiles][kDTiles][4];  // O accumulator, fp32
  float row_max[kMTiles][2];       // m, in units of raw scores
  float row_sum[kMTiles][2];       // l, this lane's partial (reduced over the quad at the end)
  warp_softmax_init(acc, row_max, row_sum);

  // Starts the copies of the t-th K/V block visited into buffer `buffer` (of kStages).
  auto load_kv = [&](int buffer, int t) {
    const u32 k_tile = kv_tiles + 2 * buffer * kTileBytes;
    const int n0 = FLASHJIT_KEY_BLOCK(t) * kBlockN;
    load_tile_async<K::kThreads, kBlockN, kDp, K::kHeadDim>(k_tile, k + n0 * p.k_seq_stride,
                                                            p.k_seq_stride, p.seqlen_k - n0);
    load_tile_async<K::kThreads, kBlockN, kDp, K::kHeadDim>(
        k_tile + kTileBytes, v + n0 * p.v_seq_stride, p.v_seq_stride, p.seqlen_k - n0);
  };
  if (n_blocks > 0) {
    // Prologue: Q and the first kStages - 1 K/V blocks in flight, one commit group per block.
    load_tile_async<K::kThreads, kBlockM, kDp, K::kHeadDim>(q_tile_address, q, p.q_seq_stride,
                                                            p.seqlen_q - m0);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_blocks) load_kv(s, s);
      cp_async_commit();
    }
  }

  for (int j = 0; j < n_blocks; ++j) {
    cp_async_wait<kStages - 2>();  // this thread's copies of block j (and Q) have landed
    __syncthreads();               // everyone's have; everyone is done with block j - 1's buffer
    {
      const int next = j + kStages - 1;  // refill the buffer block j - 1 used
      if (next < n_blocks) load_kv(next % kStages, next);
      cp_async_commit();
    }
    const u32 k_tile = kv_tiles + 2 * (j % kStages) * kTileBytes;
    const u32 v_tile = k_tile + kTileBytes;

    // S = Q K^T: [kRowsPerWarp, kBlockN] per warp.
    float s[kMTiles][kNTiles][4];
    FLASHJIT_WARP_SCORES(kDp, K::kIsBf16, kMTiles, kNTiles, s, q_tile_address, q_lane, k_tile,
                         k_lane);

    const int n0 = FLASHJIT_KEY_BLOCK(j) * kBlockN;
#ifdef FLASHJIT_VARIANT
    // The variant's scores and mask, per element, in the blocks that need either: two loops
    // (one loop testing all_visible per score was if-converted, visible() paid in every block).
#if FLASHJIT_VARIANT_BLOCK_MASK
    const bool all_visible = key_tiles.full(j);  // the map's full tiles: no per-element mask
#else
    const bool all_visible = fv::block_fully_visible(p, diagonal, m0, kBlockM, n0, kBlockN);
#endif
    auto apply = [&](bool masked) {  // called with a constant: one loop per case
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = m0 + warp_row0 + mt * 16 + frag_row + half * 8;
          const float distance0 = static_cast<float>(n0 + frag_col - row);  // key - row at nt, e 0
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = n0 + nt * 8 + frag_col + e;
              fa::apply_variant(s[mt][nt][2 * half + e], p, diagonal, masked, slope, batch, head,
                                row, key, distance0 + static_cast<float>(nt * 8 + e));
            }
        }
    };
    fa::apply_variant_block(all_visible, apply);
#else
    // Mask keys past seqlen_k and, when causal, above the diagonal. Only blocks that cross one of
    // those edges pay for it.
    if (fa::block_needs_mask<K::kCausal>(p, diagonal, m0, n0, kBlockN)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          // Last visible key of this fragment row, relative to this lane's first column.
          const int row = m0 + warp_row0 + mt * 16 + frag_row + half * 8;
          const int limit = fa::last_key<K::kCausal>(p, diagonal, row) - (n0 + frag_col);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (nt * 8 + e > limit) s[mt][nt][2 * half + e] = minus_infinity();
        }
    }
#endif

    // Online softmax (base 2), then acc += P V.
    u32 p_packed[kMTiles][kNTiles][2];
    online_softmax_step<K::kIsBf16>(s, row_max, row_sum, acc, p_packed, FLASHJIT_SCALE_LOG2);
    FLASHJIT_WARP_PV(kDp, K::kIsBf16, kMTiles, kNTiles, kDTiles, acc, p_packed, v_tile, v_lane);
  }
  cp_async_wait<0>();
  // Every lane's ldmatrix reads of the Q tile are done before any lane overwrites them with O
  // (a warp's lanes are not ordered without it; compute-sanitizer racecheck flagged the causal
  // m32n32 tiles, where the masking branches precede the epilogue).
  __syncwarp();

  // Epilogue: O = acc / l into this warp's own rows of the Q tile (no other warp reads them),
  // then 16-byte coalesced stores. LSE from the lanes that own column 0 of each row.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = quad_sum(row_sum[mt][half]);
      const float inverse = sum > 0.f ? 1.f / sum : 0.f;  // a row with no keys: O = 0
      const int row = warp_row0 + mt * 16 + frag_row + half * 8;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const u32 packed =
            pack2<K::kIsBf16>(acc[mt][dt][2 * half] * inverse, acc[mt][dt][2 * half + 1] * inverse);
        *reinterpret_cast<u32*>(q_tile + swizzled_offset<kDp>(row, dt * 8 + frag_col)) = packed;
      }
      if (lse && lane % 4 == 0 && m0 + row < p.seqlen_q) {
        lse[m0 + row] = fa::row_lse(row_max[mt][half], FLASHJIT_SCALE_LOG2, sum,
                                    [](float x) { return fast_log2(x); });
      }
    }
  __syncwarp();
  FLASHJIT_WARP_STORE_ROWS(K::kRowsPerWarp, K::kChunksPerRow, K::kHeadDim, o, p.o_seq_stride, lane,
                           warp_row0, m0, p.seqlen_q, q_tile + swizzled_offset<kDp>(row, col));
#undef FLASHJIT_KEY_BLOCK
#undef FLASHJIT_SCALE_LOG2
}

#ifdef FLASHJIT_VARIANT
#if FLASHJIT_VARIANT_VARLEN
// Packed variable-length documents (FA2's varlen): the CTA of (m_block, head, document
// blockIdx.z) reads the document's offsets, exits when its tile starts past the document's
// queries, and runs the kernel above on the document's view of the params (q, k, v, o, lse at
// its rows, its lengths as seqlen_q / seqlen_k): masks, the causal diagonal and the variant's
// band are per document, and no load or store crosses into another document.
FLASHJIT_FORWARD_DOCUMENT_ENTRY(attention_forward)
#endif
#endif
}  // namespace flashjit_kernel
