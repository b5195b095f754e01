/**
 * @file gpu_splitk.cu
 * @brief Split-K for the few-token case: the sum of the K splits and the GEMM epilogues.
 *
 * With one to a few tokens, a GEMM has only (experts touched) x (N blocks) thread blocks,
 * each streaming a whole K range of weights: too few blocks to keep the memory system busy.
 * The layer then splits K into fixed chunks of 512 (4 K blocks): each (tile, N block, chunk)
 * block stores its raw FP32 sums into a partial buffer, and the kernels here add the chunks
 * in ascending order and run the same epilogue the GEMM would have run (gpu_gemm.cu).
 * The chunk size is fixed, so that zero padding of K appends chunks whose sums are exact
 * zeros: the padded layer stays bit-identical to the unpadded one.
 */
#include "gpu_internal.cuh"

/** L1: g, u = sums over the splits; SwiGLU with clamp and routing weight (as the GEMM epilogue). */
__global__ void split_finish_swiglu(const mmoe_gemm_args p, int nsplit, int rows, const int *num_rows_dev)
{
    const int r = blockIdx.x;
    const int nrows = num_rows_dev != nullptr ? *num_rows_dev : rows;
    if (r >= nrows)
        return;
    const size_t plane = (size_t)p.partial_rows * p.partial_cols;
    const float w = p.pool != nullptr ? p.pool[r].weight : 1.0f;
    for (int j = threadIdx.x; j < p.n_out; j += blockDim.x) {
        float g = 0.0f, u = 0.0f;
        for (int z = 0; z < nsplit; z++) {
            const float *row = p.partial + z * plane + (size_t)r * p.partial_cols;
            g = __fadd_rn(g, row[j]);
            u = __fadd_rn(u, row[p.n_out + j]);
        }
        p.out_f32[(size_t)r * p.n_out + j] = mmoe_swiglu_channel(g, u, p.clamp, w);
    }
}

/** L2: the sum over the splits, rounded to BF16 into the (token, slot) row. */
__global__ void split_finish_slot(const mmoe_gemm_args p, int nsplit, int rows, const int *num_rows_dev)
{
    const int r = blockIdx.x;
    const int nrows = num_rows_dev != nullptr ? *num_rows_dev : rows;
    if (r >= nrows)
        return;
    const size_t plane = (size_t)p.partial_rows * p.partial_cols;
    int token = r, slot = p.shared_slot;
    if (p.pool != nullptr) {
        token = p.pool[r].token;
        slot = p.pool[r].slot;
    }
    __nv_bfloat16 *orow = p.out_slots + ((size_t)token * p.slots + slot) * p.n_out;
    for (int c = threadIdx.x; c < p.n_out; c += blockDim.x) {
        float s = 0.0f;
        for (int z = 0; z < nsplit; z++)
            s = __fadd_rn(s, p.partial[z * plane + (size_t)r * p.partial_cols + c]);
        orow[c] = __float2bfloat16_rn(s);
    }
}

cudaError_t mmoe_launch_split_finish(const mmoe_gemm_args *args, mmoe_epi epi, int nsplit, int rows,
                                     const int *num_rows_dev, cudaStream_t stream)
{
    if (rows <= 0)
        return cudaSuccess;
    if (epi == MMOE_EPI_SWIGLU)
        split_finish_swiglu<<<rows, 256, 0, stream>>>(*args, nsplit, rows, num_rows_dev);
    else
        split_finish_slot<<<rows, 256, 0, stream>>>(*args, nsplit, rows, num_rows_dev);
    return cudaGetLastError();
}
