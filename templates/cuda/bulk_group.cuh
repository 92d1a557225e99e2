// The bulk-group wrappers of the wgmma backward's dQ reductions (cuda/attention_bwd_common.cuh):
// the same two as cuda/tma.cuh's, which the wgmma backward does not assemble (its text keys the
// forward's tuning rows). Fold into tma.cuh at the next re-ship of the forward rows.

namespace flashjit_kernel {

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Until at most PENDING of this thread's bulk groups may still read their shared memory.
template <int PENDING>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(PENDING) : "memory");
}
#endif

}  // namespace flashjit_kernel
