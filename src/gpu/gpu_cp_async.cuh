/**
 * @file gpu_cp_async.cuh
 * @brief The cp.async copies (global to shared memory without registers) the streaming kernels
 *        share: the GEMMs' copy rings (gpu_gemm.cu, gpu_gemm_wgmma.cu, gpu_decode.cu) and the
 *        forward's FP8 linear (gpu_forward.cu).
 *
 * A thread issues copies, closes them into a group, and later waits until at most N of its
 * groups are still pending; after the wait it may read what the finished groups wrote (its own
 * copies; another thread's need a barrier as well).  Every statement is a compiler memory
 * barrier ("memory" clobber), so that no load of the destination moves above the wait and no
 * store to it below the issue.
 */
#ifndef MMOE_GPU_CP_ASYNC_CUH
#define MMOE_GPU_CP_ASYNC_CUH

namespace {

/**
 * Start copying 16 bytes (both ends 16-byte aligned) from global to shared memory, cached in L2
 * only; the destination as a shared-window address (a kernel that keeps its slots' addresses
 * so spares their conversion in its loop).
 */
__device__ __forceinline__ void cp_async16_sa(unsigned sa, const void *gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(__cvta_generic_to_global(gmem))
                 : "memory");
}

/** Start copying 16 bytes (both ends 16-byte aligned) from global to shared memory, cached in L2 only. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    cp_async16_sa((unsigned)__cvta_generic_to_shared(smem), gmem);
}

/** Start copying 4 bytes (both ends 4-byte aligned) from global to shared memory (shared-window address). */
__device__ __forceinline__ void cp_async4_sa(unsigned sa, const void *gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(__cvta_generic_to_global(gmem))
                 : "memory");
}

/** Start copying 4 bytes (both ends 4-byte aligned) from global to shared memory. */
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem)
{
    cp_async4_sa((unsigned)__cvta_generic_to_shared(smem), gmem);
}

/** Start copying 8 bytes (both ends 8-byte aligned) from global to shared memory (shared-window address). */
__device__ __forceinline__ void cp_async8_sa(unsigned sa, const void *gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(sa), "l"(__cvta_generic_to_global(gmem))
                 : "memory");
}

/** Close the calling thread's current group of copies (possibly empty). */
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/** Wait until at most @p N of the calling thread's groups of copies are pending. */
template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

} // namespace

#endif /* MMOE_GPU_CP_ASYNC_CUH */
