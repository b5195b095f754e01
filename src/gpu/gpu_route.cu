/**
 * @file gpu_route.cu
 * @brief Token-to-expert grouping on the GPU: the "pool" of (token, slot) rows per expert.
 *
 * The caller gives topk_idx [T, topk] (expert ids, -1 = masked slot) and
 * topk_w.  One thread block of 1024 threads:
 *   1. counts the valid pairs per expert (shared-memory atomics);
 *   2. turns the counts into each expert's first pool row (exclusive scan) and
 *      its first tile (tiles of block_m rows, ceil(count/block_m) per expert);
 *   3. scatters each valid pair to its expert's segment: pool row -> (token,
 *      slot, weight).  The order inside a segment follows the atomics and is
 *      not fixed; it does not matter, because every pool row is computed on
 *      its own and the combine reads the rows back by (token, slot);
 *   4. writes the tile list (expert, first row, rows) the GEMMs walk, and adds
 *      the counts into the layer's cumulative per-expert counters.
 * A masked slot never enters the pool, so an expert with no tokens has no
 * tile and costs nothing.
 */
#include "gpu_internal.cuh"

/** The whole grouping in one block (see the file comment). */
__global__ void route_kernel(const int32_t *topk_idx, const float *topk_w, int T, int topk, int E, int block_m,
                             int *counts, long long *cum_counts, mmoe_pool_entry *pool, mmoe_tile *tiles,
                             int *num_tiles, int *num_pairs)
{
    extern __shared__ int sh[];
    int *cnt = sh;              /* [E] pairs per expert */
    int *row_off = sh + E;      /* [E] first pool row */
    int *tile_off = sh + 2 * E; /* [E] first tile */
    int *cursor = sh + 3 * E;   /* [E] rows placed so far */
    const int pairs = T * topk;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        cnt[e] = 0;
        cursor[e] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
        int e = topk_idx[i];
        if (e >= 0)
            atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        /* exclusive scans of rows and tiles over the experts: each lane owns a contiguous chunk */
        const int lane = threadIdx.x, chunk = (E + 31) / 32;
        const int e0 = min(E, lane * chunk), e1 = min(E, e0 + chunk);
        int rows = 0, ntiles = 0;
        for (int e = e0; e < e1; e++) {
            rows += cnt[e];
            ntiles += (cnt[e] + block_m - 1) / block_m;
        }
        int rows_incl = rows, tiles_incl = ntiles;
        for (int off = 1; off < 32; off <<= 1) {
            int r = __shfl_up_sync(0xffffffffu, rows_incl, off), t = __shfl_up_sync(0xffffffffu, tiles_incl, off);
            if (lane >= off) {
                rows_incl += r;
                tiles_incl += t;
            }
        }
        int r = rows_incl - rows, t = tiles_incl - ntiles;
        for (int e = e0; e < e1; e++) {
            row_off[e] = r;
            tile_off[e] = t;
            r += cnt[e];
            t += (cnt[e] + block_m - 1) / block_m;
        }
        if (lane == 31) {
            *num_tiles = tiles_incl;
            *num_pairs = rows_incl;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
        int e = topk_idx[i];
        if (e >= 0) {
            int p = row_off[e] + atomicAdd(&cursor[e], 1);
            mmoe_pool_entry ent;
            ent.token = i / topk;
            ent.slot = i % topk;
            ent.weight = topk_w[i];
            pool[p] = ent;
        }
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int n = cnt[e];
        for (int j = 0; j * block_m < n; j++) {
            mmoe_tile tl;
            tl.expert = e;
            tl.row0 = row_off[e] + j * block_m;
            tl.nrows = min(block_m, n - j * block_m);
            tiles[tile_off[e] + j] = tl;
        }
        counts[e] = n;
        cum_counts[e] += n;
    }
}

cudaError_t mmoe_launch_route(const int32_t *topk_idx, const float *topk_w, int T, int topk, int E, int block_m,
                              int *counts, long long *cum_counts, mmoe_pool_entry *pool, mmoe_tile *tiles,
                              int *num_tiles, int *num_pairs, cudaStream_t stream)
{
    size_t smem = (size_t)4 * E * sizeof(int);
    route_kernel<<<1, 1024, smem, stream>>>(topk_idx, topk_w, T, topk, E, block_m, counts, cum_counts, pool,
                                            tiles, num_tiles, num_pairs);
    return cudaGetLastError();
}
