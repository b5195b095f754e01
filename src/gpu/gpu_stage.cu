/**
 * @file gpu_stage.cu
 * @brief Single stages of the GPU layer on host arrays (mmoe_gpu_stage.h): for the per-stage tests.
 *
 * Each entry point uploads its inputs, prepares them exactly as the layer does (the weights
 * re-laid out tile-major by mmoe_tile_rows()), launches the one stage, and downloads the raw
 * result.  The GEMM runs with uniform tiles over the rows (no routing) and stores its FP32
 * sums through the split-K path of the kernel: without a split, one split covers all of K, so
 * the sums are the kernel's own, before any epilogue rounding.
 */
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.cuh"
#include "mmoe_gpu_stage.h"

namespace {

/** An mmoe_error for a failed CUDA call of stage @p what. */
mmoe_status stage_fail(mmoe_error *err, cudaError_t e, const char *what)
{
    return mmoe_error_set(err, e == cudaErrorMemoryAllocation ? MMOE_ENOMEM : MMOE_EINTERNAL,
                          "gpu stage: %s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/** Check a stage GEMM description; the error names the field. */
mmoe_status check_gemm_desc(const mmoe_gpu_stage_gemm_desc *d, int cc, mmoe_error *err)
{
    const int decode = d->gemm == MMOE_GPU_GEMM_DECODE16;
    if (d->gemm != MMOE_GPU_GEMM_MMA && d->gemm != MMOE_GPU_GEMM_WGMMA && !decode)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu stage gemm: gemm must be mma, wgmma or decode16, got %d",
                              (int)d->gemm);
    const int bm_ok = decode
                          ? d->block_m == 8
                          : d->block_m == 16 || d->block_m == 64 || (d->block_m == 128 && d->gemm == MMOE_GPU_GEMM_WGMMA);
    if (!bm_ok)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu stage gemm: block_m %d is not a tile height of %s", d->block_m,
                              mmoe_gpu_gemm_name(d->gemm));
    if (d->weights != MMOE_GPU_WEIGHTS_MXFP4 && d->weights != MMOE_GPU_WEIGHTS_FP8)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu stage gemm: unknown weight format %d", (int)d->weights);
    if (d->a_group != 32 && d->a_group != 128)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu stage gemm: a_group must be 32 or 128, got %d", d->a_group);
    if (decode && d->split_kb != 0)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu stage gemm: the decode kernel splits K inside a block "
                              "(split_kb must be 0, got %d)", d->split_kb);
    if (d->rows <= 0 || d->n <= 0 || d->n % 128 != 0 || d->k <= 0 || d->k % 128 != 0 || d->split_kb < 0)
        return mmoe_error_set(err, MMOE_ESHAPE,
                              "gpu stage gemm: need rows >= 1, n and k positive multiples of 128, split_kb >= 0 "
                              "(rows %d, n %d, k %d, split_kb %d)", d->rows, d->n, d->k, d->split_kb);
    if (d->gemm == MMOE_GPU_GEMM_WGMMA) {
        int built = 0;
        cudaError_t e = mmoe_wgmma_built_for_device(&built);
        if (e != cudaSuccess)
            return stage_fail(err, e, "wgmma build probe");
        if (cc != 90 || !built)
            return mmoe_error_set(err, MMOE_ENODEV, "gpu stage gemm: the wgmma kernel needs an sm_90a build on a "
                                  "compute-capability-9.0 device (this one is sm_%d, built %d)", cc, built);
    }
    return MMOE_OK;
}

/** Device buffers of one stage GEMM. */
struct gemm_bufs {
    uint8_t *a, *w_src, *ws_src, *w, *ws;
    uint16_t *a16;
    float *as, *part;
};

void free_bufs(gemm_bufs *b)
{
    cudaFree(b->a);
    cudaFree(b->a16);
    cudaFree(b->w_src);
    cudaFree(b->ws_src);
    cudaFree(b->w);
    cudaFree(b->ws);
    cudaFree(b->as);
    cudaFree(b->part);
}

} // namespace

mmoe_status mmoe_gpu_stage_gemm(const mmoe_gpu_stage_gemm_desc *d, const uint8_t *a, const float *a_scale,
                                const uint8_t *w, const uint8_t *w_scale, float *out, mmoe_error *err)
{
    int cc = 0;
    mmoe_status st = mmoe_gpu_available(&cc, err);
    if (st != MMOE_OK)
        return st;
    st = check_gemm_desc(d, cc, err);
    if (st != MMOE_OK)
        return st;
    const int fp4 = d->weights == MMOE_GPU_WEIGHTS_MXFP4;
    const size_t rows = (size_t)d->rows, N = (size_t)d->n, K = (size_t)d->k;
    const size_t wrow = fp4 ? K / 2 : K; /* weight bytes per row */
    const int nkb = (int)(K / 128);
    const int split_kb = d->split_kb > 0 ? d->split_kb : nkb;
    const int nsplit = (nkb + split_kb - 1) / split_kb;
    gemm_bufs b;
    memset(&b, 0, sizeof b);
    cudaError_t e = cudaMalloc((void **)&b.a, rows * K);
    if (e == cudaSuccess) e = cudaMalloc((void **)&b.as, rows * (K / d->a_group) * 4);
    if (e == cudaSuccess) e = cudaMalloc((void **)&b.w_src, N * wrow);
    if (e == cudaSuccess) e = cudaMalloc((void **)&b.ws_src, N * K / 32);
    if (e == cudaSuccess) e = cudaMalloc((void **)&b.w, N * wrow);
    if (e == cudaSuccess) e = cudaMalloc((void **)&b.ws, N * K / 32);
    if (e == cudaSuccess) e = cudaMalloc((void **)&b.part, (size_t)nsplit * rows * N * 4);
    if (e == cudaSuccess) e = cudaMemcpy(b.a, a, rows * K, cudaMemcpyHostToDevice);
    /* the wgmma kernel reads the activations widened to F16, as the layer gives them to it */
    if (e == cudaSuccess && d->gemm == MMOE_GPU_GEMM_WGMMA) e = cudaMalloc((void **)&b.a16, rows * K * 2);
    if (e == cudaSuccess && d->gemm == MMOE_GPU_GEMM_WGMMA) e = mmoe_launch_widen_e4m3(b.a, (long long)(rows * K), b.a16, 0);
    if (e == cudaSuccess) e = cudaMemcpy(b.as, a_scale, rows * (K / d->a_group) * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(b.w_src, w, N * wrow, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(b.ws_src, w_scale, N * K / 32, cudaMemcpyHostToDevice);
    /* the layer's tile-major layout: [n-block][K block][128 rows][row bytes of one K block] */
    if (e == cudaSuccess)
        e = mmoe_tile_rows((const uint32_t *)b.w_src, (uint32_t *)b.w, (int)(N / 128), nkb, (int)(wrow / 4),
                           fp4 ? 16 : 32, 0, 0, 0);
    if (e == cudaSuccess)
        e = mmoe_tile_rows((const uint32_t *)b.ws_src, (uint32_t *)b.ws, (int)(N / 128), nkb, nkb, 1, 0, 0, 0);
    if (e == cudaSuccess)
        e = cudaMemset(b.part, 0xff, (size_t)nsplit * rows * N * 4); /* NaN: every sum must be written */
    mmoe_gemm_args g;
    memset(&g, 0, sizeof g);
    g.K = (int)K;
    g.n_out = (int)N;
    g.a = b.a;
    g.a16 = b.a16;
    g.a_scale = b.as;
    g.total_rows = (int)rows;
    g.b = b.w;
    g.b_scale = b.ws;
    g.split_kb = split_kb;
    g.partial = b.part;
    g.partial_rows = (int)rows;
    g.partial_cols = (int)N;
    const int tiles = (int)((rows + d->block_m - 1) / d->block_m);
    const mmoe_bfmt bfmt = fp4 ? MMOE_B_FP4 : MMOE_B_FP8;
    /* the decode kernel: the rows as its shared part (uniform tiles of 8), raw sums out */
    mmoe_decode_args dg;
    memset(&dg, 0, sizeof dg);
    dg.shared.bfmt = bfmt;
    dg.shared.K = (int)K;
    dg.shared.n_out = (int)N;
    dg.shared.a = b.a;
    dg.shared.a_scale = b.as;
    dg.shared.b = b.w;
    dg.shared.b_scale = b.ws;
    dg.shared_tiles = (int)((rows + 7) / 8);
    dg.tile_rows = rows < 8 ? (int)rows : 8; /* a tile of the uniform rows holds min(8, rows) */
    dg.T = (int)rows;
    dg.raw = b.part;
    if (e == cudaSuccess)
        e = d->gemm == MMOE_GPU_GEMM_DECODE16
                ? mmoe_launch_decode_gemm(&dg, d->a_group, MMOE_EPI_SLOT_BF16, 0, 0)
            : d->gemm == MMOE_GPU_GEMM_WGMMA
                ? mmoe_launch_gemm_wgmma(&g, d->block_m, bfmt, d->a_group, MMOE_EPI_SLOT_BF16, tiles, 0)
                : mmoe_launch_gemm(&g, d->block_m, bfmt, d->a_group, MMOE_EPI_SLOT_BF16, tiles, 0);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    float *h = NULL;
    if (e == cudaSuccess) {
        h = (float *)malloc((size_t)nsplit * rows * N * 4);
        if (h == NULL) {
            free_bufs(&b);
            return mmoe_error_set(err, MMOE_ENOMEM, "gpu stage gemm: out of host memory");
        }
        e = cudaMemcpy(h, b.part, (size_t)nsplit * rows * N * 4, cudaMemcpyDeviceToHost);
    }
    free_bufs(&b);
    if (e != cudaSuccess) {
        free(h);
        return stage_fail(err, e, "gemm");
    }
    for (size_t i = 0; i < rows * N; i++) {
        float s = 0.0f;
        for (int z = 0; z < nsplit; z++)
            s += h[(size_t)z * rows * N + i];
        out[i] = s;
    }
    free(h);
    return MMOE_OK;
}

mmoe_status mmoe_gpu_stage_requant(mmoe_gpu_recipe recipe, int rows, int cols, const float *x, uint8_t *q,
                                   float *scales, mmoe_error *err)
{
    mmoe_status st = mmoe_gpu_available(NULL, err);
    if (st != MMOE_OK)
        return st;
    if (recipe != MMOE_GPU_RECIPE_SM90 && recipe != MMOE_GPU_RECIPE_SM100)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu stage requant: recipe must be sm90 or sm100");
    if (rows <= 0 || cols <= 0 || cols % 128 != 0)
        return mmoe_error_set(err, MMOE_ESHAPE, "gpu stage requant: need rows >= 1 and cols a positive multiple "
                              "of 128 (rows %d, cols %d)", rows, cols);
    const int sm90 = recipe == MMOE_GPU_RECIPE_SM90;
    const size_t n = (size_t)rows * cols, ns = n / (sm90 ? 128 : 32);
    float *dx = NULL, *ds = NULL;
    uint8_t *dq = NULL;
    cudaError_t e = cudaMalloc((void **)&dx, n * 4);
    if (e == cudaSuccess) e = cudaMalloc((void **)&dq, n);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ds, ns * 4);
    if (e == cudaSuccess) e = cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = mmoe_launch_quant(NULL, dx, rows, cols, sm90 ? MMOE_QUANT_SM90 : MMOE_QUANT_SM100_REQUANT, dq, ds, 0);
    if (e == cudaSuccess) e = cudaMemcpy(q, dq, n, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(scales, ds, ns * 4, cudaMemcpyDeviceToHost);
    cudaFree(dx);
    cudaFree(dq);
    cudaFree(ds);
    if (e != cudaSuccess)
        return stage_fail(err, e, "requant");
    return MMOE_OK;
}

mmoe_status mmoe_gpu_stage_route(int T, int topk, int E, int block_m, const int32_t *topk_idx, const float *topk_w,
                                 mmoe_gpu_stage_route_out *out, mmoe_error *err)
{
    mmoe_status st = mmoe_gpu_available(NULL, err);
    if (st != MMOE_OK)
        return st;
    if (T <= 0 || topk <= 0 || E <= 0 || block_m <= 0)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu stage route: T, topk, E and block_m must be positive "
                              "(T %d, topk %d, E %d, block_m %d)", T, topk, E, block_m);
    const size_t pairs = (size_t)T * topk, max_tiles = pairs + (size_t)E;
    int32_t *d_idx = NULL;
    float *d_w = NULL;
    int *d_counts = NULL, *d_nums = NULL;
    long long *d_cum = NULL;
    mmoe_pool_entry *d_pool = NULL;
    mmoe_tile *d_tiles = NULL;
    cudaError_t e = cudaMalloc((void **)&d_idx, pairs * 4);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_w, pairs * 4);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_counts, (size_t)E * sizeof(int));
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_nums, 2 * sizeof(int));
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_cum, (size_t)E * sizeof(long long));
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_pool, pairs * sizeof(mmoe_pool_entry));
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_tiles, max_tiles * sizeof(mmoe_tile));
    if (e == cudaSuccess) e = cudaMemcpy(d_idx, topk_idx, pairs * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(d_w, topk_w, pairs * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemset(d_cum, 0, (size_t)E * sizeof(long long));
    if (e == cudaSuccess)
        e = mmoe_launch_route(d_idx, d_w, T, topk, E, block_m, d_counts, d_cum, d_pool, d_tiles, d_nums, d_nums + 1, 0);
    mmoe_pool_entry *pool = (mmoe_pool_entry *)malloc(pairs * sizeof *pool);
    mmoe_tile *tiles = (mmoe_tile *)malloc(max_tiles * sizeof *tiles);
    int nums[2] = {0, 0};
    if (pool == NULL || tiles == NULL)
        e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaMemcpy(nums, d_nums, sizeof nums, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(out->counts, d_counts, (size_t)E * sizeof(int), cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(pool, d_pool, pairs * sizeof *pool, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(tiles, d_tiles, max_tiles * sizeof *tiles, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess && (nums[0] < 0 || (size_t)nums[0] > max_tiles || nums[1] < 0 || (size_t)nums[1] > pairs))
        e = cudaErrorInvalidValue;
    if (e == cudaSuccess) {
        out->num_tiles = nums[0];
        out->num_pairs = nums[1];
        for (int i = 0; i < nums[1]; i++) {
            out->pool_token[i] = pool[i].token;
            out->pool_slot[i] = pool[i].slot;
            out->pool_weight[i] = pool[i].weight;
        }
        for (int i = 0; i < nums[0]; i++) {
            out->tile_expert[i] = tiles[i].expert;
            out->tile_row0[i] = tiles[i].row0;
            out->tile_rows[i] = tiles[i].nrows;
        }
    }
    free(pool);
    free(tiles);
    cudaFree(d_idx);
    cudaFree(d_w);
    cudaFree(d_counts);
    cudaFree(d_nums);
    cudaFree(d_cum);
    cudaFree(d_pool);
    cudaFree(d_tiles);
    if (e != cudaSuccess)
        return stage_fail(err, e, "route");
    return MMOE_OK;
}

mmoe_status mmoe_gpu_stage_combine(int T, int topk, int has_shared, int D, const uint16_t *slots,
                                   const int32_t *topk_idx, uint16_t *y, mmoe_error *err)
{
    mmoe_status st = mmoe_gpu_available(NULL, err);
    if (st != MMOE_OK)
        return st;
    if (T <= 0 || topk <= 0 || topk > 31 || D <= 0 || D % 2 != 0)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu stage combine: need T >= 1, topk in 1..31, D even and "
                              "positive (T %d, topk %d, D %d)", T, topk, D);
    const size_t nslots = (size_t)T * (topk + 1) * D, ny = (size_t)T * D;
    __nv_bfloat16 *d_slots = NULL, *d_y = NULL;
    int32_t *d_idx = NULL;
    cudaError_t e = cudaMalloc((void **)&d_slots, nslots * 2);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_y, ny * 2);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_idx, (size_t)T * topk * 4);
    if (e == cudaSuccess) e = cudaMemcpy(d_slots, slots, nslots * 2, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(d_idx, topk_idx, (size_t)T * topk * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemset(d_y, 0xff, ny * 2);
    if (e == cudaSuccess) e = mmoe_launch_combine(d_slots, d_idx, T, topk, has_shared, D, d_y, 0);
    if (e == cudaSuccess) e = cudaMemcpy(y, d_y, ny * 2, cudaMemcpyDeviceToHost);
    cudaFree(d_slots);
    cudaFree(d_y);
    cudaFree(d_idx);
    if (e != cudaSuccess)
        return stage_fail(err, e, "combine");
    return MMOE_OK;
}

mmoe_status mmoe_gpu_stage_split_sum(int nsplit, int rows, int cols, const float *partial, uint16_t *out,
                                     mmoe_error *err)
{
    mmoe_status st = mmoe_gpu_available(NULL, err);
    if (st != MMOE_OK)
        return st;
    if (nsplit <= 0 || rows <= 0 || cols <= 0)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu stage split sum: nsplit, rows and cols must be positive "
                              "(%d, %d, %d)", nsplit, rows, cols);
    const size_t np = (size_t)nsplit * rows * cols, no = (size_t)rows * cols;
    float *d_part = NULL;
    __nv_bfloat16 *d_out = NULL;
    cudaError_t e = cudaMalloc((void **)&d_part, np * 4);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_out, no * 2);
    if (e == cudaSuccess) e = cudaMemcpy(d_part, partial, np * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemset(d_out, 0xff, no * 2);
    mmoe_gemm_args g;
    memset(&g, 0, sizeof g);
    g.n_out = cols;
    g.partial = d_part;
    g.partial_rows = rows;
    g.partial_cols = cols;
    g.out_slots = d_out; /* one slot per row: out[row][0][col] */
    g.slots = 1;
    g.shared_slot = 0;
    if (e == cudaSuccess) e = mmoe_launch_split_finish(&g, MMOE_EPI_SLOT_BF16, nsplit, rows, NULL, 0);
    if (e == cudaSuccess) e = cudaMemcpy(out, d_out, no * 2, cudaMemcpyDeviceToHost);
    cudaFree(d_part);
    cudaFree(d_out);
    if (e != cudaSuccess)
        return stage_fail(err, e, "split sum");
    return MMOE_OK;
}
