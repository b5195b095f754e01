/**
 * @file gpu_combine.cu
 * @brief The combine: one BF16 output row per token from its slots' BF16 rows.
 *
 * The L2 GEMM stored each (token, slot) result rounded to BF16 in a buffer
 * [T, topk+1, D]; slot topk is the shared expert.  For each token and channel:
 * acc = 0 (FP32); for each slot k in ascending order whose topk_idx is not -1,
 * acc += float(v_k); then acc += float(v_shared) when there is a shared
 * expert; y = bf16_rn(acc).  A token whose slots are all masked and that has
 * no shared expert gets 0.  Masked slots' rows are never read (they were never
 * written).  One block per token, two channels per thread and step.  At the
 * fewest tokens the decode pipeline sums the same way, in the same order, inside
 * its L2 launch (gpu_decode.cu), and runs no combine kernel.
 */
#include "gpu_internal.cuh"

/** One block per token: the slot sum in ascending slot order, one BF16 store. */
__global__ void combine_kernel(const __nv_bfloat16 *slots_buf, const int32_t *topk_idx, int topk, int has_shared,
                               int D, __nv_bfloat16 *y)
{
    mmoe_grid_dependency_wait(); /* as the dependent of a programmatic launch: the slots are written */
    const int t = blockIdx.x;
    const unsigned mask = mmoe_combine_slot_mask(topk_idx, t, topk, has_shared);
    for (int d = threadIdx.x * 2; d < D; d += blockDim.x * 2)
        *reinterpret_cast<__nv_bfloat162 *>(y + (size_t)t * D + d) = mmoe_combine_pair(slots_buf, mask, t, topk, D, d);
}

cudaError_t mmoe_launch_combine(const __nv_bfloat16 *slots_buf, const int32_t *topk_idx, int T, int topk,
                                int has_shared, int D, __nv_bfloat16 *y, cudaStream_t stream)
{
    if (T == 0)
        return cudaSuccess;
    combine_kernel<<<T, 256, 0, stream>>>(slots_buf, topk_idx, topk, has_shared, D, y);
    return cudaGetLastError();
}

cudaError_t mmoe_launch_combine_pdl(const __nv_bfloat16 *slots_buf, const int32_t *topk_idx, int T, int topk,
                                    int has_shared, int D, __nv_bfloat16 *y, cudaStream_t stream)
{
    if (T == 0)
        return cudaSuccess;
    cudaError_t e = mmoe_launch_pdl(combine_kernel, dim3((unsigned)T), dim3(256), 0, stream, slots_buf, topk_idx, topk,
                                    has_shared, D, y);
    return e != cudaSuccess ? e : cudaGetLastError();
}
