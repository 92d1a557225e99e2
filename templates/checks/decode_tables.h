// The decode family's table check (issue 33): the rules a paged or per-sequence-length decode
// call's tables must follow, shared by the host check (runtime/table_check.cpp, the CPU backend,
// whose tables are host memory) and the GPU check kernel below (compiled alone with NVRTC and
// launched on the call's stream just before the decode kernel: no host sync, so a checked call
// can be captured in a CUDA graph). Plain C apart from the kernel. Not part of any decode kernel
// (templates/cuda/decode.cuh is untouched): no tuning row depends on this file.
//
// The entries of sequence b, in the order they are checked (the first bad one is reported):
//   entry 0       its length: seqlens_k[b] (when given) in [0, seqlen_k] (seqlen_k: the keys the
//                 cache holds per sequence: the contiguous cache's length, or max_pages *
//                 page_size for a paged one)
//   entry 1 + j   (paged, when its length is good) block_table[b][j] for each page the length
//                 uses (j < ceil(len / page_size)), in [0, num_pages). The table's later columns
//                 are never read by the kernels, so they may hold anything (-1 padding).
// Entry e of sequence b has the flat index b * (max_pages + 1) + e.
#ifndef FLASHJIT_CHECKS_DECODE_TABLES_H
#define FLASHJIT_CHECKS_DECODE_TABLES_H

#if defined(__CUDACC__)
#define FLASHJIT_TABLES_FN __device__ __forceinline__
#else
#define FLASHJIT_TABLES_FN static inline
#endif

struct FlashjitDecodeTables {
  const int* block_table;  // [batch, max_pages] (row stride max_pages); null: contiguous cache
  const int* seqlens_k;    // [batch]; null: every sequence has seqlen_k keys
  long long batch;
  long long max_pages;  // 0 for a contiguous cache
  long long num_pages;
  long long page_size;  // 0 for a contiguous cache
  long long seqlen_k;   // keys per sequence the cache holds
};

// Entries per sequence (its length, then one per table column).
FLASHJIT_TABLES_FN long long flashjit_tables_per_sequence(const struct FlashjitDecodeTables* t) {
  return t->max_pages + 1;
}

FLASHJIT_TABLES_FN long long flashjit_tables_length(const struct FlashjitDecodeTables* t,
                                                    long long b) {
  return t->seqlens_k ? (long long)t->seqlens_k[b] : t->seqlen_k;
}

FLASHJIT_TABLES_FN int flashjit_tables_length_ok(const struct FlashjitDecodeTables* t,
                                                 long long length) {
  return length >= 0 && length <= t->seqlen_k;
}

// Nonzero when entry `e` of sequence `b` breaks its rule.
FLASHJIT_TABLES_FN int flashjit_tables_entry_bad(const struct FlashjitDecodeTables* t, long long b,
                                                 long long e) {
  const long long length = flashjit_tables_length(t, b);
  if (e == 0) return !flashjit_tables_length_ok(t, length);
  if (t->block_table == 0 || !flashjit_tables_length_ok(t, length)) return 0;
  const long long j = e - 1;
  if (j * t->page_size >= length) return 0;  // a page past the sequence's keys: never read
  const int page = t->block_table[b * t->max_pages + j];
  return page < 0 || page >= t->num_pages;
}

#if defined(__CUDACC__)
// One block: each thread scans its entries in ascending order and stops at its first bad one;
// the block's minimum (the first bad entry) is printed by thread 0, which then traps: the
// stream's later work (the decode kernel) never runs, and the call's synchronization reports an
// error (cudaErrorLaunchFailure; the context is unusable afterwards, as after any device fault).
extern "C" __global__ void __launch_bounds__(512)
    flashjit_check_decode_tables(const struct FlashjitDecodeTables t) {
  __shared__ unsigned long long first;
  const unsigned long long none = ~0ull;
  if (threadIdx.x == 0) first = none;
  __syncthreads();
  const long long per = flashjit_tables_per_sequence(&t);
  const long long total = t.batch * per;
  for (long long i = threadIdx.x; i < total; i += blockDim.x) {
    if ((unsigned long long)i > *(volatile unsigned long long*)&first) break;
    if (flashjit_tables_entry_bad(&t, i / per, i % per)) {
      atomicMin(&first, (unsigned long long)i);
      break;
    }
  }
  __syncthreads();
  if (threadIdx.x != 0 || first == none) return;
  const long long b = (long long)(first / (unsigned long long)per);
  const long long e = (long long)(first % (unsigned long long)per);
  const long long length = flashjit_tables_length(&t, b);
  if (e == 0) {
    printf(
        "flashjit: decode table check failed: seqlens_k[%lld] = %lld: must be in [0, %lld] "
        "(the keys the cache holds per sequence)\n",
        b, length, t.seqlen_k);
  } else {
    printf(
        "flashjit: decode table check failed: block_table[%lld][%lld] = %d: must be a page in "
        "[0, %lld) (num_pages), used by seqlens_k[%lld] = %lld\n",
        b, e - 1, t.block_table[b * t.max_pages + e - 1], t.num_pages, b, length);
  }
  __trap();
}
#endif

#undef FLASHJIT_TABLES_FN
#endif  // FLASHJIT_CHECKS_DECODE_TABLES_H
