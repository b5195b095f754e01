/**
 * @file gpu_moe.cu
 * @brief The GPU layer object: weights on the device, the workspace, and one call's pipeline.
 *
 * Device memory of a layer (see mmoe_gpu_moe.h for the math): the
 * checkpoint's bytes, rearranged once at load time into the GEMM's tiles.
 *   w13: per expert, per block of 64 intermediate channels, per K block of
 *        128: a tile of 128 rows (the 64 gate rows w1, then the 64 up rows w3)
 *        x 64 bytes of E2M1 codes, contiguous (8 KB); s13 likewise with the 4
 *        UE8M0 bytes of each row and K block (512 B);
 *   w2/s2: per expert, per block of 128 output rows, per K block: 128 x 64 B;
 *   sw13/ss13, sw2/ss2: the shared expert's E4M3 bytes in the same tiling
 *        (128 x 128 B tiles) with its expanded 1x32 UE8M0 scales.
 * That is all: no decoded copy.  gpu_weight_bytes in the result counts it.
 *
 * The workspace grows to the largest T seen: the BF16 input, routing, FP8
 * input and its scales, the pool and tile list, the FP32 L1 output and its
 * FP8 requantization (routed and shared), the combine slots [T][topk+1][D]
 * and the output.
 *
 * One call of the tile GEMM families = 9 launches on two streams: quant(x), route,
 * L1 routed, L1 shared, quant(L1 routed), quant(L1 shared), L2 routed, L2 shared,
 * combine (plus the split-K sums for very few tokens).  No host synchronisation
 * between them: the routed GEMMs are launched on an upper bound of tiles and the
 * surplus blocks exit at once.
 *
 * One call of the decode family (decode16, gpu_decode.cu) = 5 launches on one stream, each after
 * the first a programmatic dependent launch: quant(x), L1 (routed and shared, routing
 * derived in each block, SwiGLU), one requantization of both intermediates, L2 (routed and
 * shared, BF16 slots), combine.  Up to MMOE_DECODE_FUSE_MAX_T tokens the same GEMM kernel
 * does the middle and last steps itself, 3 launches: quant(x), L1 then the requantization
 * of both intermediates by the last block of each 128-channel group, L2 then the combine of
 * each token's slots by the last block to write one of its 64-channel chunks; with no shared
 * expert a memset zeroes the output first (a token whose slots are all masked gets 0).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.cuh"
#include "gpu_decode_route.h"
#include "mmoe_gpu_moe.h"

/**
 * Blocks per SM of the L1 decode launch (reported in the result), with what they depend on:
 * the kernel instance (activation group) and its dynamic shared memory (the staged rows,
 * the widest K, the experts).  The occupancy calculator runs again only when one of those
 * changes, not on every call.
 */
typedef struct decode_occupancy {
    int known;           /**< 1: blocks holds the answer for the key below */
    int a_group;         /**< key: the activation group */
    int tile_rows;       /**< key: the staged rows */
    int kmax;            /**< key: the widest K of the launch */
    int E;               /**< key: the routed experts */
    int blocks;          /**< blocks per SM */
} decode_occupancy;

/** The GPU layer: weights, workspace and streams on device 0. */
struct mmoe_gpu_moe {
    mmoe_gpu_moe_desc d;      /**< sizes (inter_src/shared_inter_src filled in) */
    mmoe_gpu_recipe recipe;   /**< the recipe computed */
    int cc;                   /**< compute capability */
    int wgmma_ok;             /**< 1: the sm_90a wgmma kernel can run here (cc 9.0 and built for it) */
    int last_wgmma;           /**< 1: the last call ran the wgmma kernel; 0: the portable mma.sync one */
    int last_decode;          /**< 1: the last call ran a decode kernel (gpu_decode.cu) */
    int last_decode_fused;    /**< 1: that decode call was the 3-launch pipeline (MMOE_DECODE_FUSE_MAX_T) */
    cudaStream_t stream;      /**< the call's stream: inputs, routed experts, combine */
    cudaStream_t side;        /**< the shared expert runs here, concurrently with the routed GEMMs */
    cudaEvent_t x_ready;      /**< the quantized x is ready (side stream waits) */
    cudaEvent_t shared_done;  /**< the shared slot is written (combine waits) */
    uint8_t *w13;             /**< routed gate/up codes, tile-major */
    uint8_t *s13;             /**< their scales */
    uint8_t *w2;              /**< routed down codes, tile-major */
    uint8_t *s2;              /**< their scales */
    uint8_t *sw13;            /**< shared gate/up E4M3, tile-major */
    uint8_t *ss13;            /**< their expanded scales */
    uint8_t *sw2;             /**< shared down E4M3, tile-major */
    uint8_t *ss2;             /**< their expanded scales */
    long long *cum_counts;    /**< [E] received pairs over all calls */
    int *counts;              /**< [E] this call's pairs per expert */
    int *num_tiles;           /**< this call's routed tiles (device) */
    int *num_pairs;           /**< this call's valid pairs (device; num_tiles + 1) */
    long long wide_l1;        /**< L1 weight blocks on the exact path */
    long long wide_l2;        /**< L2 weight blocks on the exact path */
    size_t weight_bytes;      /**< bytes of all weight arrays */
    int cap;                  /**< tokens the workspace holds */
    int *pairs_of_expert;     /**< [E] host scratch of the decode routing table's builder */
    int32_t *dec_route;       /**< the decode GEMM's routed tiles and counters of the call (gpu_decode_route.h) */
    int32_t *dec_route_host;  /**< host copy being built (uploaded to dec_route) */
    int route_rows;           /**< a decode call's most pairs of one expert, capped at 8 (from its table) */
    decode_occupancy occ;     /**< blocks per SM of the last decode call's L1 launch, and what they depend on */
    size_t ws_bytes;          /**< bytes of the workspace */
    __nv_bfloat16 *x;         /**< [cap, D] input */
    __nv_bfloat16 *y;         /**< [cap, D] output */
    __nv_bfloat16 *slots;     /**< [cap, topk+1, D] per-slot L2 outputs */
    int32_t *idx;             /**< [cap, topk] routing */
    float *tw;                /**< [cap, topk] routing weights */
    float *xs;                /**< input scales */
    float *a1;                /**< [cap*topk, I] routed L1 output (FP32) */
    float *l2s;               /**< its requant scales */
    float *sh_a1;             /**< [cap, S*I] shared L1 output */
    float *sh_l2s;            /**< its requant scales */
    uint8_t *xq;              /**< [cap, D] quantized input */
    uint8_t *l2q;             /**< routed L2 input (E4M3) */
    uint8_t *sh_l2q;          /**< shared L2 input (E4M3) */
    /* the wgmma kernel's activations: the same E4M3 values as F16 bits (allocated where wgmma_ok) */
    uint16_t *x16;            /**< [cap, D] the quantized input */
    uint16_t *l2h;            /**< [cap*topk, I] the routed L2 input */
    uint16_t *sh_l2h;         /**< [cap, SI] the shared L2 input */
    int *rq_counters;         /**< decode L1: [grid rows][max(I, SI) / 128] blocks done per group, zero between calls */
    int *cb_counters;         /**< decode L2: [cap][D / 64] slot rows written per token and chunk, zero between calls */
    mmoe_pool_entry *pool;    /**< [cap*topk] pool rows */
    float *part;              /**< split-K partial sums of the routed GEMMs (T <= MMOE_SPLIT_MAX_T) */
    float *sh_part;           /**< split-K partial sums of the shared GEMMs */
    int last_split;           /**< 1 when the last call split K */
    mmoe_tile *tiles;         /**< routed tile list */
};


/** Turn a CUDA error into an mmoe_error naming the step. */
static mmoe_status cuda_fail(mmoe_error *err, cudaError_t e, const char *what)
{
    return mmoe_error_set(err, e == cudaErrorMemoryAllocation ? MMOE_ENOMEM : MMOE_EINTERNAL,
                          "gpu: %s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/** Return a CUDA failure of @p call as an mmoe_error naming @p what. */
#define CK(call, what)                                          \
    do {                                                        \
        cudaError_t ck_e_ = (call);                             \
        if (ck_e_ != cudaSuccess)                               \
            return cuda_fail(err, ck_e_, what);                 \
    } while (0)

mmoe_status mmoe_gpu_available(int *cc, mmoe_error *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return mmoe_error_set(err, MMOE_ENODEV, "gpu: no CUDA device (%s)",
                              e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess)
        return mmoe_error_set(err, MMOE_ENODEV, "gpu: cannot read device 0: %s", cudaGetErrorString(e));
    if (prop.major < 9)
        return mmoe_error_set(err, MMOE_ENODEV, "gpu: device 0 (%s) is sm_%d%d; this build targets sm_90a/sm_100a",
                              prop.name, prop.major, prop.minor);
    if (cc != NULL)
        *cc = prop.major * 10 + prop.minor;
    return MMOE_OK;
}

/* ------------------------------------------------------------------ random weights (benchmarks) */

/** A 64-bit mix (splitmix finalizer) truncated to 32 bits. */
__device__ __forceinline__ uint32_t hash32(uint64_t x)
{
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return (uint32_t)x;
}

/** What fill_random() draws. */
enum fill_kind {
    FILL_E2M1_PAIRS = 0,   /**< any byte (two E2M1 codes) */
    FILL_UE8M0 = 1,        /**< UE8M0 in 118..125 */
    FILL_E4M3 = 2,         /**< E4M3 without NaN, |v| < 2 */
    FILL_UE8M0_BLOCK = 3   /**< UE8M0 in 118..125, constant over each 4 consecutive bytes (an
                                expanded 128-wide block scale, as the shared expert's are) */
};

/** Random bytes of one kind (hash of seed and index). */
__global__ void fill_random(uint8_t *p, size_t n, uint64_t seed, fill_kind kind)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = hash32(seed * 0x9E3779B97F4A7C15ULL + (kind == FILL_UE8M0_BLOCK ? i / 4 : i));
        p[i] = kind == FILL_E2M1_PAIRS ? (uint8_t)h : kind == FILL_E4M3 ? (uint8_t)(h & 0xBF) : (uint8_t)(118 + (h & 7));
    }
}

/**
 * Count (row, 128-K block)s whose four UE8M0 bytes cannot be folded into E4M3
 * (FP4: spread > 14; FP8: not all equal): the blocks the GEMM computes by
 * per-32 promotion.
 */
__global__ void count_wide_blocks(const uint8_t *s, size_t nblocks, int fp8, unsigned long long *out)
{
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nblocks; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t w = reinterpret_cast<const uint32_t *>(s)[i];
        int mx = 0, mn = 255;
        for (int g = 0; g < 4; g++) {
            int k = (int)(w >> (8 * g) & 0xffu);
            mx = max(mx, k);
            mn = min(mn, k);
        }
        local += fp8 ? (mx != mn) : (mx - mn > 14);
    }
    if (local)
        atomicAdd(out, local);
}

/** Count the exact-path blocks of a scale array into @p out. */
static mmoe_status count_wide(const uint8_t *s, size_t bytes, int fp8, long long *out, mmoe_error *err)
{
    unsigned long long *d = NULL, h = 0;
    CK(cudaMalloc(&d, sizeof *d), "cudaMalloc(counter)");
    cudaError_t e = cudaMemset(d, 0, sizeof *d);
    if (e == cudaSuccess && bytes > 0) {
        count_wide_blocks<<<264, 256>>>(s, bytes / 4, fp8, d);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "count_wide_blocks");
    *out += (long long)h;
    return MMOE_OK;
}

/* ------------------------------------------------------------------ create / destroy */

/** Check the sizes of a description; the error names the field. */
static mmoe_status check_desc(const mmoe_gpu_moe_desc *d, mmoe_error *err)
{
    if (d->hidden <= 0 || d->hidden % 128 != 0)
        return mmoe_error_set(err, MMOE_ESHAPE, "gpu layer: hidden must be a positive multiple of 128, got %d", d->hidden);
    if (d->inter <= 0 || d->inter % 128 != 0)
        return mmoe_error_set(err, MMOE_ESHAPE, "gpu layer: inter must be a positive multiple of 128, got %d", d->inter);
    if (d->shared_inter < 0 || d->shared_inter % 128 != 0)
        return mmoe_error_set(err, MMOE_ESHAPE, "gpu layer: shared_inter must be 0 or a multiple of 128, got %d",
                              d->shared_inter);
    if (d->inter_src < 0 || d->inter_src > d->inter || d->inter_src % 128 != 0)
        return mmoe_error_set(err, MMOE_ESHAPE, "gpu layer: inter_src must be a multiple of 128 in [0, inter=%d], got %d",
                              d->inter, d->inter_src);
    if (d->shared_inter_src < 0 || d->shared_inter_src > d->shared_inter || d->shared_inter_src % 128 != 0)
        return mmoe_error_set(err, MMOE_ESHAPE,
                              "gpu layer: shared_inter_src must be a multiple of 128 in [0, shared_inter=%d], got %d",
                              d->shared_inter, d->shared_inter_src);
    if (d->block_m != 0 && d->block_m != 16 && d->block_m != 64 && d->block_m != 128)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: block_m must be 0 (auto), 16, 64 or 128, got %d",
                              d->block_m);
    if (d->recipe != MMOE_GPU_RECIPE_AUTO && d->recipe != MMOE_GPU_RECIPE_SM90 && d->recipe != MMOE_GPU_RECIPE_SM100)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: unknown recipe %d", (int)d->recipe);
    if (d->gemm != MMOE_GPU_GEMM_AUTO && d->gemm != MMOE_GPU_GEMM_MMA && d->gemm != MMOE_GPU_GEMM_WGMMA &&
        d->gemm != MMOE_GPU_GEMM_DECODE16)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: unknown GEMM kernel family %d", (int)d->gemm);
    if (d->block_m != 0 && d->gemm == MMOE_GPU_GEMM_DECODE16)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: block_m %d: the %s kernel's tiles are 8 tokens "
                              "(block_m must be 0)", d->block_m, mmoe_gpu_gemm_name(d->gemm));
    if (d->block_m == 128 && d->gemm == MMOE_GPU_GEMM_MMA)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: block_m 128 needs the wgmma kernel (mma.sync: 16 or 64)");
    if (d->n_experts <= 0 || d->n_experts > 4096)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: n_experts must be in 1..4096, got %d", d->n_experts);
    if (d->topk <= 0 || d->topk > 31)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: topk must be in 1..31 (topk+1 combine slots <= 32), got %d",
                              d->topk);
    return MMOE_OK;
}

/** Byte sizes of the layer's weight arrays. */
struct weight_sizes {
    size_t w13, s13, w2, s2, sw13, ss13, sw2, ss2;
    /** @var weight_sizes::w13
     *  routed gate and up weights (E2M1 codes)
     *  @var weight_sizes::s13
     *  their UE8M0 scales
     *  @var weight_sizes::w2
     *  routed down weights (E2M1 codes)
     *  @var weight_sizes::s2
     *  their UE8M0 scales
     *  @var weight_sizes::sw13
     *  shared gate and up weights (FP8)
     *  @var weight_sizes::ss13
     *  their scales
     *  @var weight_sizes::sw2
     *  shared down weights (FP8)
     *  @var weight_sizes::ss2
     *  their scales */
};

/** The byte sizes of the weight arrays of the layer @p desc. */
static weight_sizes weight_sizes_of(const mmoe_gpu_moe_desc *desc)
{
    const size_t D = (size_t)desc->hidden, I = (size_t)desc->inter, E = (size_t)desc->n_experts;
    const size_t SI = (size_t)desc->shared_inter;
    weight_sizes z;
    z.w13 = E * 2 * I * D / 2;
    z.s13 = E * 2 * I * D / 32;
    z.w2 = E * D * I / 2;
    z.s2 = E * D * I / 32;
    z.sw13 = 2 * SI * D;
    z.ss13 = 2 * SI * D / 32;
    z.sw2 = D * SI;
    z.ss2 = D * SI / 32;
    return z;
}

/**
 * Upload the checkpoint's weights: each matrix goes through a staging buffer in the checkpoint
 * layout (zero codes and unit scales first: the padding), then one kernel writes it tile-major
 * into the layer's arrays (see mmoe_tile_rows).
 */
static cudaError_t upload_weights(mmoe_gpu_moe *L, const mmoe_gpu_moe_weights *w)
{
    const size_t D = (size_t)L->d.hidden, I = (size_t)L->d.inter, E = (size_t)L->d.n_experts;
    const size_t SI = (size_t)L->d.shared_inter;
    const size_t Is = (size_t)L->d.inter_src, SIs = (size_t)L->d.shared_inter_src;
    const size_t n13 = I * D > 2 * SI * D ? I * D : 2 * SI * D;
    const size_t n2 = D * I / 2 > D * SI ? D * I / 2 : D * SI;
    uint8_t *st13 = NULL, *sts13 = NULL, *st2 = NULL, *sts2 = NULL;
    cudaError_t pe = cudaMalloc((void **)&st13, n13);
    if (pe == cudaSuccess) pe = cudaMalloc((void **)&sts13, n13 / 16);
    if (pe == cudaSuccess) pe = cudaMalloc((void **)&st2, n2);
    if (pe == cudaSuccess) pe = cudaMalloc((void **)&sts2, n2 / 16);
    for (size_t x = 0; x < E + (SI > 0) && pe == cudaSuccess; x++) {
        const int shared = x == E;
        const size_t rows13 = shared ? SI : I, src13 = shared ? SIs : Is;
        const size_t b13 = shared ? D : D / 2; /* bytes per L1 row */
        const size_t k2 = shared ? SI : I, src2 = shared ? SIs : Is;
        const size_t b2 = shared ? k2 : k2 / 2, bsrc2 = shared ? src2 : src2 / 2;
        pe = cudaMemset(st13, 0, 2 * rows13 * b13);
        if (pe == cudaSuccess) pe = cudaMemset(sts13, 127, 2 * rows13 * D / 32);
        if (pe == cudaSuccess) pe = cudaMemset(st2, 0, D * b2);
        if (pe == cudaSuccess) pe = cudaMemset(sts2, 127, D * k2 / 32);
        const uint8_t *g = shared ? w->sw1 : w->w1[x], *u = shared ? w->sw3 : w->w3[x];
        const uint8_t *gs = shared ? w->ss1 : w->s1[x], *us = shared ? w->ss3 : w->s3[x];
        const uint8_t *d2 = shared ? w->sw2 : w->w2[x], *ds2 = shared ? w->ss2 : w->s2[x];
        if (pe == cudaSuccess) pe = cudaMemcpy(st13, g, src13 * b13, cudaMemcpyHostToDevice);
        if (pe == cudaSuccess) pe = cudaMemcpy(st13 + rows13 * b13, u, src13 * b13, cudaMemcpyHostToDevice);
        if (pe == cudaSuccess) pe = cudaMemcpy(sts13, gs, src13 * D / 32, cudaMemcpyHostToDevice);
        if (pe == cudaSuccess)
            pe = cudaMemcpy(sts13 + rows13 * D / 32, us, src13 * D / 32, cudaMemcpyHostToDevice);
        if (pe == cudaSuccess) pe = cudaMemcpy2D(st2, b2, d2, bsrc2, bsrc2, D, cudaMemcpyHostToDevice);
        if (pe == cudaSuccess) pe = cudaMemcpy2D(sts2, k2 / 32, ds2, src2 / 32, src2 / 32, D, cudaMemcpyHostToDevice);
        uint8_t *o13 = shared ? L->sw13 : L->w13 + x * (2 * I * D / 2);
        uint8_t *os13 = shared ? L->ss13 : L->s13 + x * (2 * I * D / 32);
        uint8_t *o2 = shared ? L->sw2 : L->w2 + x * (D * I / 2);
        uint8_t *os2 = shared ? L->ss2 : L->s2 + x * (D * I / 32);
        if (pe == cudaSuccess)
            pe = mmoe_tile_rows((const uint32_t *)st13, (uint32_t *)o13, (int)(rows13 / 64), (int)(D / 128),
                                (int)(b13 / 4), shared ? 32 : 16, 1, (int)rows13, 0);
        if (pe == cudaSuccess)
            pe = mmoe_tile_rows((const uint32_t *)sts13, (uint32_t *)os13, (int)(rows13 / 64), (int)(D / 128),
                                (int)(D / 128), 1, 1, (int)rows13, 0);
        if (pe == cudaSuccess)
            pe = mmoe_tile_rows((const uint32_t *)st2, (uint32_t *)o2, (int)(D / 128), (int)(k2 / 128),
                                (int)(b2 / 4), shared ? 32 : 16, 0, 0, 0);
        if (pe == cudaSuccess)
            pe = mmoe_tile_rows((const uint32_t *)sts2, (uint32_t *)os2, (int)(D / 128), (int)(k2 / 128),
                                (int)(k2 / 128), 1, 0, 0, 0);
        if (pe == cudaSuccess)
            pe = cudaDeviceSynchronize(); /* the staging buffers are reused by the next matrix */
    }
    cudaFree(st13);
    cudaFree(sts13);
    cudaFree(st2);
    cudaFree(sts2);
    return pe;
}

/** Random weights drawn on the device (benchmarks; see fill_random for the value ranges). */
static cudaError_t fill_random_weights(mmoe_gpu_moe *L, uint64_t seed)
{
    const weight_sizes z = weight_sizes_of(&L->d);
    fill_random<<<1024, 256>>>(L->w13, z.w13, seed, FILL_E2M1_PAIRS);
    fill_random<<<1024, 256>>>(L->s13, z.s13, seed + 1, FILL_UE8M0);
    fill_random<<<1024, 256>>>(L->w2, z.w2, seed + 2, FILL_E2M1_PAIRS);
    fill_random<<<1024, 256>>>(L->s2, z.s2, seed + 3, FILL_UE8M0);
    fill_random<<<1024, 256>>>(L->sw13, z.sw13, seed + 4, FILL_E4M3);
    fill_random<<<1024, 256>>>(L->ss13, z.ss13, seed + 5, FILL_UE8M0_BLOCK);
    fill_random<<<1024, 256>>>(L->sw2, z.sw2, seed + 6, FILL_E4M3);
    fill_random<<<1024, 256>>>(L->ss2, z.ss2, seed + 7, FILL_UE8M0_BLOCK);
    return cudaGetLastError();
}

/** Count the weight blocks the mma.sync kernel computes on its exact path (E4M3 fold inexact). */
static mmoe_status count_exact_path(mmoe_gpu_moe *L, mmoe_error *err)
{
    const weight_sizes z = weight_sizes_of(&L->d);
    mmoe_status st = count_wide(L->s13, z.s13, 0, &L->wide_l1, err);
    if (st == MMOE_OK)
        st = count_wide(L->s2, z.s2, 0, &L->wide_l2, err);
    if (st == MMOE_OK)
        st = count_wide(L->ss13, z.ss13, 1, &L->wide_l1, err);
    if (st == MMOE_OK)
        st = count_wide(L->ss2, z.ss2, 1, &L->wide_l2, err);
    return st;
}

/**
 * Which GEMM families can run: the wgmma one needs a compute-capability-9.0 device and this
 * build's sm_90a code (probed once).  Refuses a request the device cannot serve.
 */
static mmoe_status probe_families(mmoe_gpu_moe *L, mmoe_error *err)
{
    const mmoe_gpu_moe_desc *desc = &L->d;
    const int cc = L->cc;
    if (desc->gemm == MMOE_GPU_GEMM_WGMMA && cc != 90)
        return mmoe_error_set(err, MMOE_ENODEV,
                              "gpu layer: the wgmma kernel needs a compute-capability-9.0 device (sm_90a); "
                              "this one is sm_%d (use gemm auto or mma)", cc);
    if (cc == 90) {
        int built = 0;
        cudaError_t pe = mmoe_wgmma_built_for_device(&built);
        if (pe != cudaSuccess)
            return cuda_fail(err, pe, "wgmma build probe");
        L->wgmma_ok = built;
    }
    if (desc->gemm == MMOE_GPU_GEMM_WGMMA && !L->wgmma_ok)
        return mmoe_error_set(err, MMOE_ENODEV,
                              "gpu layer: this build has no sm_90a code for the wgmma kernel (CUDA_GENCODE lacks "
                              "-gencode=arch=compute_90a,code=sm_90a); use gemm auto or mma");
    if (desc->block_m == 128 && !L->wgmma_ok)
        return mmoe_error_set(err, MMOE_ENODEV, "gpu layer: block_m 128 needs the wgmma kernel, which this "
                              "device or build lacks (sm_%d)", cc);
    return MMOE_OK;
}

/** Check that the weights a layer needs are given (NULL: random weights). */
static mmoe_status check_weights(const mmoe_gpu_moe_desc *desc, const mmoe_gpu_moe_weights *w, mmoe_error *err)
{
    if (w != NULL && (w->w1 == NULL || w->w3 == NULL || w->w2 == NULL || w->s1 == NULL || w->s3 == NULL ||
                      w->s2 == NULL))
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: routed weights w1/w3/w2 and scales s1/s3/s2 are required");
    if (w != NULL && desc->shared_inter > 0 &&
        (w->sw1 == NULL || w->sw3 == NULL || w->sw2 == NULL || w->ss1 == NULL || w->ss3 == NULL || w->ss2 == NULL))
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: shared_inter=%d but shared weights or scales are missing",
                              desc->shared_inter);
    return MMOE_OK;
}

/** Allocate device memory for the layer or fail (freeing the layer). */
#define DALLOC(ptr, bytes, what)                                                   \
    do {                                                                           \
        cudaError_t e_ = cudaMalloc((void **)&(ptr), (bytes) > 0 ? (bytes) : 16);  \
        if (e_ != cudaSuccess) {                                                   \
            mmoe_gpu_moe_destroy(L);                                               \
            return cuda_fail(err, e_, "cudaMalloc(" what ")");                     \
        }                                                                          \
    } while (0)

mmoe_status mmoe_gpu_moe_create(const mmoe_gpu_moe_desc *desc, const mmoe_gpu_moe_weights *w, uint64_t seed,
                                mmoe_gpu_moe **out, mmoe_error *err)
{
    int cc = 0;
    mmoe_status st = check_desc(desc, err);
    if (st == MMOE_OK)
        st = mmoe_gpu_available(&cc, err);
    if (st == MMOE_OK)
        st = check_weights(desc, w, err);
    if (st != MMOE_OK)
        return st;
    mmoe_gpu_moe *L = (mmoe_gpu_moe *)calloc(1, sizeof *L);
    if (L == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "gpu layer: out of host memory");
    L->d = *desc;
    if (L->d.inter_src == 0)
        L->d.inter_src = L->d.inter;
    if (L->d.shared_inter_src == 0)
        L->d.shared_inter_src = L->d.shared_inter;
    L->cc = cc;
    L->pairs_of_expert = (int *)calloc((size_t)desc->n_experts > 0 ? (size_t)desc->n_experts : 1, sizeof(int));
    if (L->pairs_of_expert == NULL) {
        free(L);
        return mmoe_error_set(err, MMOE_ENOMEM, "gpu layer: out of host memory");
    }
    st = probe_families(L, err);
    if (st != MMOE_OK) {
        free(L->pairs_of_expert);
        free(L);
        return st;
    }
    L->recipe = desc->recipe != MMOE_GPU_RECIPE_AUTO ? desc->recipe
                : cc >= 100                         ? MMOE_GPU_RECIPE_SM100
                                                    : MMOE_GPU_RECIPE_SM90;
    cudaError_t e = cudaStreamCreateWithFlags(&L->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&L->side, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&L->x_ready, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&L->shared_done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        mmoe_gpu_moe_destroy(L);
        return cuda_fail(err, e, "cudaStreamCreate/cudaEventCreate");
    }
    const size_t E = (size_t)desc->n_experts;
    const weight_sizes z = weight_sizes_of(desc);
    DALLOC(L->w13, z.w13, "w13");
    DALLOC(L->s13, z.s13, "s13");
    DALLOC(L->w2, z.w2, "w2");
    DALLOC(L->s2, z.s2, "s2");
    DALLOC(L->sw13, z.sw13, "shared w13");
    DALLOC(L->ss13, z.ss13, "shared s13");
    DALLOC(L->sw2, z.sw2, "shared w2");
    DALLOC(L->ss2, z.ss2, "shared s2");
    DALLOC(L->cum_counts, E * sizeof(long long), "expert counters");
    DALLOC(L->counts, E * sizeof(int), "counts");
    DALLOC(L->num_tiles, 2 * sizeof(int), "tile count");
    L->num_pairs = L->num_tiles + 1;
    L->weight_bytes = z.w13 + z.s13 + z.w2 + z.s2 + z.sw13 + z.ss13 + z.sw2 + z.ss2;
    e = cudaMemset(L->cum_counts, 0, E * sizeof(long long));
    if (e == cudaSuccess)
        e = w != NULL ? upload_weights(L, w) : fill_random_weights(L, seed);
    if (e != cudaSuccess) {
        mmoe_gpu_moe_destroy(L);
        return cuda_fail(err, e, w != NULL ? "upload of the weights" : "random weights");
    }
    st = count_exact_path(L, err);
    if (st != MMOE_OK) {
        mmoe_gpu_moe_destroy(L);
        return st;
    }
    *out = L;
    return MMOE_OK;
}

/** Free the token workspace. */
static void free_workspace(mmoe_gpu_moe *L)
{
    void *ptrs[] = {L->x, L->y, L->slots, L->idx, L->tw, L->xs, L->a1, L->l2s, L->sh_a1, L->sh_l2s,
                    L->xq, L->l2q, L->sh_l2q, L->pool, L->tiles, L->part, L->sh_part, L->rq_counters,
                    L->cb_counters, L->x16, L->l2h, L->sh_l2h, L->dec_route};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        cudaFree(ptrs[i]);
    L->x = L->y = L->slots = NULL;
    L->idx = NULL;
    L->tw = L->xs = L->a1 = L->l2s = L->sh_a1 = L->sh_l2s = NULL;
    L->xq = L->l2q = L->sh_l2q = NULL;
    L->x16 = L->l2h = L->sh_l2h = NULL;
    L->dec_route = NULL;
    free(L->dec_route_host);
    L->dec_route_host = NULL;
    L->pool = NULL;
    L->tiles = NULL;
    L->part = L->sh_part = NULL;
    L->rq_counters = L->cb_counters = NULL;
    L->cap = 0;
    L->ws_bytes = 0;
}

void mmoe_gpu_moe_destroy(mmoe_gpu_moe *L)
{
    if (L == NULL)
        return;
    free_workspace(L);
    void *ptrs[] = {L->w13, L->s13, L->w2, L->s2, L->sw13, L->ss13, L->sw2, L->ss2, L->cum_counts, L->counts,
                    L->num_tiles};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        cudaFree(ptrs[i]);
    if (L->stream != NULL)
        cudaStreamDestroy(L->stream);
    if (L->side != NULL)
        cudaStreamDestroy(L->side);
    if (L->x_ready != NULL)
        cudaEventDestroy(L->x_ready);
    if (L->shared_done != NULL)
        cudaEventDestroy(L->shared_done);
    free(L->pairs_of_expert);
    free(L);
}

/* ------------------------------------------------------------------ workspace */

/** Allocate one workspace array and count its bytes. */
static cudaError_t walloc(mmoe_gpu_moe *L, void **p, size_t bytes)
{
    bytes = bytes > 0 ? bytes : 16;
    L->ws_bytes += bytes;
    return cudaMalloc(p, bytes);
}

/** Calls with at most this many tokens split K (gpu_splitk.cu). */
#define MMOE_SPLIT_MAX_T 4
/** K blocks of 128 per split: fixed 512-wide chunks. */
#define MMOE_SPLIT_KB 4

/** Number of K splits of a reduction of length @p K. */
static size_t split_count(size_t K)
{
    return (K / 128 + MMOE_SPLIT_KB - 1) / MMOE_SPLIT_KB;
}

/**
 * Counters of the decode L1 launch's requantization for @p T tokens: one per grid row (the
 * shared tiles and the bound of the routed tiles, which grows with T) and 128-channel group of
 * the wider part.
 */
static size_t rq_counter_count(const mmoe_gpu_moe *L, int T)
{
    const int I = L->d.inter, SI = L->d.shared_inter;
    const size_t rows = (size_t)(T + 7) / 8 + (size_t)mmoe_decode_route_max_tiles(T, L->d.topk, L->d.n_experts);
    return rows * (size_t)((I > SI ? I : SI) / 128);
}

/** Grow the workspace to hold @p T tokens. */
static mmoe_status ensure_workspace(mmoe_gpu_moe *L, int T, mmoe_error *err)
{
    if (T <= L->cap)
        return MMOE_OK;
    free_workspace(L);
    const size_t t = (size_t)T, D = (size_t)L->d.hidden, I = (size_t)L->d.inter, K = (size_t)L->d.topk;
    const size_t SI = (size_t)L->d.shared_inter, E = (size_t)L->d.n_experts;
    const size_t ts = t < MMOE_SPLIT_MAX_T ? t : MMOE_SPLIT_MAX_T; /* tokens of a split-K call */
    const size_t rq_bytes = rq_counter_count(L, T) * sizeof(int);
    const size_t cb_bytes = t * (D / 64) * sizeof(int); /* the decode L2's combine: per token and 64 channels */
    const size_t route_bytes = mmoe_decode_route_ints(mmoe_decode_route_max_tiles(T, (int)K, (int)E), (int)E) * 4;
    const struct {
        void **p;
        size_t bytes;
    } arrays[] = {
        {(void **)&L->x, t * D * 2},          {(void **)&L->y, t * D * 2},
        {(void **)&L->slots, t * (K + 1) * D * 2}, {(void **)&L->idx, t * K * 4},
        {(void **)&L->tw, t * K * 4},         {(void **)&L->xq, t * D},
        {(void **)&L->xs, t * D / 32 * 4},    {(void **)&L->pool, t * K * sizeof(mmoe_pool_entry)},
        {(void **)&L->tiles, (t * K + E) * sizeof(mmoe_tile)},
        {(void **)&L->a1, t * K * I * 4},     {(void **)&L->l2q, t * K * I},
        {(void **)&L->l2s, t * K * I / 32 * 4}, {(void **)&L->sh_a1, t * SI * 4},
        {(void **)&L->sh_l2q, t * SI},        {(void **)&L->sh_l2s, t * SI / 32 * 4},
        {(void **)&L->part, ts * K * (2 * I * split_count(D) > D * split_count(I) ? 2 * I * split_count(D)
                                                                                : D * split_count(I)) * 4},
        {(void **)&L->sh_part, ts * (2 * SI * split_count(D) > D * split_count(SI) ? 2 * SI * split_count(D)
                                                                                 : D * split_count(SI)) * 4},
        {(void **)&L->rq_counters, rq_bytes},     {(void **)&L->cb_counters, cb_bytes},
        {(void **)&L->dec_route, route_bytes},
        {(void **)&L->x16, L->wgmma_ok ? t * D * 2 : 0},
        {(void **)&L->l2h, L->wgmma_ok ? t * K * I * 2 : 0},
        {(void **)&L->sh_l2h, L->wgmma_ok ? t * SI * 2 : 0},
    };
    cudaError_t e = cudaSuccess;
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0] && e == cudaSuccess; i++)
        e = walloc(L, arrays[i].p, arrays[i].bytes);
    /* the counters start at zero; each launch leaves them at zero (on the layer's stream: ordered
       before every kernel of the calls) */
    if (e == cudaSuccess)
        e = cudaMemsetAsync(L->rq_counters, 0, rq_bytes, L->stream);
    if (e == cudaSuccess)
        e = cudaMemsetAsync(L->cb_counters, 0, cb_bytes, L->stream);
    if (e != cudaSuccess) {
        free_workspace(L);
        return cuda_fail(err, e, "cudaMalloc(workspace)");
    }
    L->dec_route_host = (int32_t *)malloc(route_bytes);
    if (L->dec_route_host == NULL) {
        free_workspace(L);
        return mmoe_error_set(err, MMOE_ENOMEM, "gpu layer: out of host memory (routing table)");
    }
    L->cap = T;
    return MMOE_OK;
}

/* ------------------------------------------------------------------ one call */

/**
 * The expected pairs per expert above which AUTO runs the wgmma kernel rather than the mma.sync
 * one (16-token tiles up to 16.5, 64 up to 64.5, 128 above: choose_block_m).  Measured on one
 * H200, V4-Flash layer (docs/perf.md, "Kernel choice"): from T = 128 (e = 3) on the wgmma kernel
 * is the faster family at every T measured, with each tile height against mma.sync's; below
 * it (calls that do not run the decode kernel) it was not measured, and mma.sync keeps them.
 */
#define MMOE_AUTO_WGMMA_MIN_PAIRS 2.5

/**
 * The largest call AUTO runs on the decode kernel (gpu_decode.cu): measured on one H200,
 * V4-Flash layer, sm90 recipe (docs/perf.md, "Kernel choice"): faster than both tile kernels
 * at every T measured up to here (T = 128: 1323 us against wgmma's 2259; T = 384: 2479
 * against 2529); at T = 512 the wgmma kernel is faster (2799 against 3131), so larger calls
 * run the tile kernels.
 */
#define MMOE_AUTO_DECODE_MAX_T 384

/**
 * The largest decode call whose GEMMs requantize and combine themselves (3 launches); larger
 * ones run the standalone requantization and combine kernels (5 launches).  Measured on one
 * H200, V4-Flash layer, decode16, median us of `megamoe bench moe` (fused / 5 launches):
 * T = 1: 59.4 / 63.1, 2: 85.2 / 88.8, 4: 166 / 170, 8: 299 / 295, 16: 512 / 494,
 * 32: 934 / 895, 128: 2119 / 1980.  Fusing saves two launch gaps, which is most of a call
 * of few tokens; with more tokens the last block of each group does its serial epilogue
 * (a group's rows, a token's slots) after the others have finished, and that costs more.
 */
#define MMOE_DECODE_FUSE_MAX_T 4

/**
 * Does this call run the decode kernel (decode16)?  When asked for, always; under AUTO on a
 * compute-capability-9.0 device with the sm90 recipe (where it was measured) and no forced
 * tile height, up to MMOE_AUTO_DECODE_MAX_T tokens.
 */
static int use_decode(const mmoe_gpu_moe *L, int T)
{
    if (L->d.gemm != MMOE_GPU_GEMM_AUTO)
        return L->d.gemm == MMOE_GPU_GEMM_DECODE16;
    return L->cc == 90 && L->recipe == MMOE_GPU_RECIPE_SM90 && L->d.block_m == 0 && T <= MMOE_AUTO_DECODE_MAX_T;
}

/** The tile kernel family of one call: the requested one, or for AUTO the faster one at this size. */
static int use_wgmma(const mmoe_gpu_moe *L, int T)
{
    if (L->d.gemm != MMOE_GPU_GEMM_AUTO)
        return L->d.gemm == MMOE_GPU_GEMM_WGMMA;
    if (L->d.block_m == 128)
        return 1;
    const double e = (double)T * L->d.topk / L->d.n_experts;
    return L->wgmma_ok && e > MMOE_AUTO_WGMMA_MIN_PAIRS;
}

/**
 * Tile height: the description's, or by the expected pairs per expert e (as in
 * get_block_config_for_mega_moe): 16 while e <= 16.5, else 64; with the wgmma kernel 128
 * from 64.5 on (each tile decodes its weight block once, so wider tiles decode less per
 * FLOP; measured: T = 2048, e = 48: 64-row tiles 4.58 ms, 128-row 4.98; T = 8192: 16.0 and
 * 11.6 ms).
 */
static int choose_block_m(int forced, int wgmma, int T, int topk, int E)
{
    if (forced == 16 || forced == 64 || forced == 128)
        return forced;
    double e = (double)T * topk / E;
    return e <= 16.5 ? 16 : (!wgmma || e <= 64.5) ? 64 : 128;
}

/** Make @p a a split-K launch: MMOE_SPLIT_KB K blocks per split, raw FP32 sums into @p partial [splits][rows][cols]. */
static void use_split_k(mmoe_gemm_args *a, float *partial, int rows, int cols)
{
    a->split_kb = MMOE_SPLIT_KB;
    a->partial = partial;
    a->partial_rows = rows;
    a->partial_cols = cols;
}

/** One grouped GEMM with the kernel family of this call. */
static cudaError_t layer_gemm(const mmoe_gpu_moe *L, const mmoe_gemm_args *a, int bm, mmoe_bfmt bfmt, int ag, mmoe_epi epi,
                              int tiles, cudaStream_t s)
{
    return L->last_wgmma ? mmoe_launch_gemm_wgmma(a, bm, bfmt, ag, epi, tiles, s)
                    : mmoe_launch_gemm(a, bm, bfmt, ag, epi, tiles, s);
}

/** One part (routed or shared) of a decode GEMM launch. */
static mmoe_decode_part decode_part(mmoe_bfmt bfmt, int K, int n_out, const uint8_t *a, const float *a_scale,
                                    const uint8_t *b, const uint8_t *b_scale, size_t b_stride, size_t bs_stride,
                                    float *out_f32)
{
    mmoe_decode_part q;
    memset(&q, 0, sizeof q);
    q.bfmt = bfmt;
    q.K = K;
    q.n_out = n_out;
    q.a = a;
    q.a_scale = a_scale;
    q.b = b;
    q.b_scale = b_scale;
    q.b_expert_stride = b_stride;
    q.bs_expert_stride = bs_stride;
    q.out_f32 = out_f32;
    return q;
}

/** Blocks per SM of L1 decode launch @p a into @p o, from the calculator only when its key changed. */
static cudaError_t decode_occupancy_of(decode_occupancy *o, const mmoe_decode_args *a, int a_group)
{
    const int kmax = a->shared.K > a->routed.K ? a->shared.K : a->routed.K;
    if (o->known && o->a_group == a_group && o->tile_rows == a->tile_rows && o->kmax == kmax && o->E == a->E)
        return cudaSuccess;
    o->known = 0;
    const cudaError_t e = mmoe_decode_gemm_occupancy(a, a_group, MMOE_EPI_SWIGLU, &o->blocks);
    if (e != cudaSuccess)
        return e;
    o->known = 1;
    o->a_group = a_group;
    o->tile_rows = a->tile_rows;
    o->kmax = kmax;
    o->E = a->E;
    return cudaSuccess;
}

/**
 * The decode pipeline (gpu_decode.cu): quant(x); L1 of the routed and the shared experts in one
 * launch, its routed tiles from the call's table (gpu_decode_route.h, built in upload_inputs);
 * one requantization of both intermediates; L2 of both into the combine slots; combine.  Up to MMOE_DECODE_FUSE_MAX_T tokens (@p fused) the L1
 * launch requantizes and the L2 launch combines (their counters set), and the two standalone
 * kernels are not launched.  One stream, every launch after the first a programmatic dependent
 * launch, so that each GEMM's blocks load their weights while the kernel before finishes.
 */
static mmoe_status launch_layer_decode(mmoe_gpu_moe *L, int T, int fused, mmoe_error *err)
{
    const int D = L->d.hidden, I = L->d.inter, K = L->d.topk, E = L->d.n_experts, SI = L->d.shared_inter;
    const int sm90 = L->recipe == MMOE_GPU_RECIPE_SM90;
    const int ag = sm90 ? 128 : 32;
    cudaStream_t s = L->stream;
    /* the fused L2 sums only tokens with a slot to sum: without a shared expert, all-masked
       tokens stay 0 (the combine kernel writes their 0 itself) */
    if (fused && SI == 0)
        CK(cudaMemsetAsync(L->y, 0, (size_t)T * D * 2, s), "zero the output");
    CK(mmoe_launch_quant(L->x, NULL, T, D, sm90 ? MMOE_QUANT_SM90 : MMOE_QUANT_SM100_INPUT, L->xq, L->xs, s), "quantize x");
    mmoe_decode_args a;
    memset(&a, 0, sizeof a);
    a.T = T;
    a.topk = K;
    a.E = E;
    a.topk_idx = L->idx;
    a.topk_w = L->tw;
    a.clamp = L->d.swiglu_limit;
    a.shared_tiles = SI > 0 ? (T + 7) / 8 : 0;
    a.routed_tiles = mmoe_decode_route_max_tiles(T, K, E);
    a.route = L->dec_route;
    /* rows a block stages: a shared tile's tokens, a routed tile's pairs (from the upload's scan) */
    const int shared_rows = SI > 0 ? (T < 8 ? T : 8) : 0;
    a.tile_rows = shared_rows > L->route_rows ? shared_rows : L->route_rows;
    if (a.tile_rows < 1)
        a.tile_rows = 1; /* every slot masked and no shared expert: the blocks stage nothing */
    /* L1: gate/up of the shared expert (FP8) and the routed experts (MXFP4), SwiGLU */
    a.shared = decode_part(MMOE_B_FP8, D, SI, L->xq, L->xs, L->sw13, L->ss13, 0, 0, L->sh_a1);
    a.routed = decode_part(MMOE_B_FP4, D, I, L->xq, L->xs, L->w13, L->s13, (size_t)2 * I * D / 2,
                           (size_t)2 * I * D / 32, L->a1);
    a.counts = L->counts;
    a.cum_counts = L->cum_counts;
    a.num_pairs = L->num_pairs;
    if (fused) {
        /* the L2 inputs: the last block of each 128-channel group requantizes it (the recipe's rule) */
        a.rq_counters = L->rq_counters;
        a.rq_groups = (I > SI ? I : SI) / 128;
        a.rq_routed_q = L->l2q;
        a.rq_routed_s = L->l2s;
        a.rq_shared_q = L->sh_l2q;
        a.rq_shared_s = L->sh_l2s;
    }
    CK(mmoe_launch_decode_gemm(&a, ag, MMOE_EPI_SWIGLU, 1, s), fused ? "L1 decode GEMM (requantizing)" : "L1 decode GEMM");
    CK(decode_occupancy_of(&L->occ, &a, ag), "L1 decode GEMM occupancy");
    if (!fused)
        CK(mmoe_launch_requant_decode(L->a1, T * K, L->idx, I, L->sh_a1, SI > 0 ? T : 0, SI,
                                      sm90 ? MMOE_QUANT_SM90 : MMOE_QUANT_SM100_REQUANT, L->l2q, L->l2s, L->sh_l2q,
                                      L->sh_l2s, s),
           "requantize L1 (decode)");
    /* L2: down projections into the combine slots (routed A rows are the pairs) */
    a.shared = decode_part(MMOE_B_FP8, SI, D, L->sh_l2q, L->sh_l2s, L->sw2, L->ss2, 0, 0, NULL);
    a.routed = decode_part(MMOE_B_FP4, I, D, L->l2q, L->l2s, L->w2, L->s2, (size_t)D * I / 2, (size_t)D * I / 32, NULL);
    a.routed_a_by_pair = 1;
    a.out_slots = L->slots;
    a.counts = NULL;
    a.cum_counts = NULL;
    a.num_pairs = NULL;
    a.rq_counters = NULL;
    if (fused) {
        /* ... and the last writer of each token's 64-channel chunk sums its slots into y */
        a.cb_counters = L->cb_counters;
        a.cb_chunks = D / 64;
        a.cb_has_shared = SI > 0;
        a.cb_out = L->y;
    }
    CK(mmoe_launch_decode_gemm(&a, ag, MMOE_EPI_SLOT_BF16, 1, s), fused ? "L2 decode GEMM (combining)" : "L2 decode GEMM");
    if (!fused)
        CK(mmoe_launch_combine_pdl(L->slots, L->idx, T, K, SI > 0, D, L->y, s), "combine");
    return MMOE_OK;
}

/** Launch the whole pipeline on inputs already on the device (L->x, L->idx, L->tw). */
static mmoe_status launch_layer(mmoe_gpu_moe *L, int T, int *block_m_out, mmoe_error *err)
{
    const int D = L->d.hidden, I = L->d.inter, K = L->d.topk, E = L->d.n_experts, SI = L->d.shared_inter;
    const int sm90 = L->recipe == MMOE_GPU_RECIPE_SM90;
    const int ag = sm90 ? 128 : 32;
    L->last_decode = use_decode(L, T);
    L->last_decode_fused = L->last_decode && T <= MMOE_DECODE_FUSE_MAX_T;
    if (L->last_decode) {
        L->last_wgmma = 0;
        L->last_split = 0;
        *block_m_out = 8;
        return T == 0 ? MMOE_OK : launch_layer_decode(L, T, L->last_decode_fused, err);
    }
    L->last_wgmma = use_wgmma(L, T);
    const int bm = choose_block_m(L->d.block_m, L->last_wgmma, T, K, E);
    cudaStream_t s = L->stream;
    const int split = T <= MMOE_SPLIT_MAX_T; /* few tokens: split K so that enough blocks stream the weights */
    L->last_split = split;
    *block_m_out = bm;
    if (T == 0)
        return MMOE_OK;
    CK(mmoe_launch_quant(L->x, NULL, T, D, sm90 ? MMOE_QUANT_SM90 : MMOE_QUANT_SM100_INPUT, L->xq, L->xs, s), "quantize x");
    const int wg = L->last_wgmma; /* the wgmma kernel reads every activation widened to F16 */
    if (wg)
        CK(mmoe_launch_widen_e4m3(L->xq, (long long)T * D, L->x16, s), "widen x");
    mmoe_gemm_args a;
    if (SI > 0) {
        /* the shared expert on the side stream: it needs only the quantized x */
        CK(cudaEventRecord(L->x_ready, s), "cudaEventRecord");
        CK(cudaStreamWaitEvent(L->side, L->x_ready, 0), "cudaStreamWaitEvent");
        s = L->side;
        const int sbm = T <= 16 ? 16 : (L->last_wgmma && T > 64) ? 128 : 64;
        const int stiles = (T + sbm - 1) / sbm;
        memset(&a, 0, sizeof a);
        a.K = D;
        a.n_out = SI;
        a.a = L->xq;
        a.a16 = wg ? L->x16 : NULL;
        a.a_scale = L->xs;
        a.total_rows = T;
        a.b = L->sw13;
        a.b_scale = L->ss13;
        a.b_up_row0 = SI;
        a.clamp = L->d.swiglu_limit;
        a.out_f32 = L->sh_a1;
        if (split)
            use_split_k(&a, L->sh_part, T, 2 * SI);
        CK(layer_gemm(L, &a, sbm, MMOE_B_FP8, ag, MMOE_EPI_SWIGLU, stiles, s), "L1 GEMM (shared)");
        if (split)
            CK(mmoe_launch_split_finish(&a, MMOE_EPI_SWIGLU, (int)split_count(D), T, NULL, s), "L1 split-K sum (shared)");
        CK(mmoe_launch_quant(NULL, L->sh_a1, T, SI, sm90 ? MMOE_QUANT_SM90 : MMOE_QUANT_SM100_REQUANT, L->sh_l2q, L->sh_l2s, s), "requantize L1 (shared)");
        if (wg)
            CK(mmoe_launch_widen_e4m3(L->sh_l2q, (long long)T * SI, L->sh_l2h, s), "widen the shared L2 input");
        memset(&a, 0, sizeof a);
        a.K = SI;
        a.n_out = D;
        a.a = L->sh_l2q;
        a.a16 = wg ? L->sh_l2h : NULL;
        a.a_scale = L->sh_l2s;
        a.total_rows = T;
        a.b = L->sw2;
        a.b_scale = L->ss2;
        a.shared_slot = K;
        a.out_slots = L->slots;
        a.slots = K + 1;
        if (split)
            use_split_k(&a, L->sh_part, T, D);
        CK(layer_gemm(L, &a, sbm, MMOE_B_FP8, ag, MMOE_EPI_SLOT_BF16, stiles, s), "L2 GEMM (shared)");
        if (split)
            CK(mmoe_launch_split_finish(&a, MMOE_EPI_SLOT_BF16, (int)split_count(SI), T, NULL, s),
               "L2 split-K sum (shared)");
        CK(cudaEventRecord(L->shared_done, s), "cudaEventRecord");
        s = L->stream;
    }
    CK(mmoe_launch_route(L->idx, L->tw, T, K, E, bm, L->counts, L->cum_counts, L->pool, L->tiles, L->num_tiles,
                         L->num_pairs, s),
       "route");
    /* tiles: sum over experts of ceil(n_e / bm) <= min(pairs, pairs / bm + experts) */
    const int max_tiles = (T * K + bm - 1) / bm + E < T * K ? (T * K + bm - 1) / bm + E : T * K;
    memset(&a, 0, sizeof a);
    /* L1 routed */
    a.K = D;
    a.n_out = I;
    a.a = L->xq;
    a.a16 = wg ? L->x16 : NULL;
    a.a_scale = L->xs;
    a.a_gather = L->pool;
    a.tiles = L->tiles;
    a.num_tiles = L->num_tiles;
    a.b = L->w13;
    a.b_scale = L->s13;
    a.b_expert_stride = (size_t)2 * I * D / 2;
    a.bs_expert_stride = (size_t)2 * I * D / 32;
    a.b_up_row0 = I;
    a.clamp = L->d.swiglu_limit;
    a.pool = L->pool;
    a.out_f32 = L->a1;
    if (split)
        use_split_k(&a, L->part, T * K, 2 * I);
    CK(layer_gemm(L, &a, bm, MMOE_B_FP4, ag, MMOE_EPI_SWIGLU, max_tiles, s), "L1 GEMM (routed)");
    if (split)
        CK(mmoe_launch_split_finish(&a, MMOE_EPI_SWIGLU, (int)split_count(D), T * K, L->num_pairs, s),
           "L1 split-K sum (routed)");
    /* requantize: rows beyond the valid pairs are quantized too (garbage in, never read) */
    CK(mmoe_launch_quant(NULL, L->a1, T * K, I, sm90 ? MMOE_QUANT_SM90 : MMOE_QUANT_SM100_REQUANT, L->l2q, L->l2s, s), "requantize L1 (routed)");
    if (wg)
        CK(mmoe_launch_widen_e4m3(L->l2q, (long long)T * K * I, L->l2h, s), "widen the routed L2 input");
    /* L2 routed */
    memset(&a, 0, sizeof a);
    a.K = I;
    a.n_out = D;
    a.a = L->l2q;
    a.a16 = wg ? L->l2h : NULL;
    a.a_scale = L->l2s;
    a.tiles = L->tiles;
    a.num_tiles = L->num_tiles;
    a.b = L->w2;
    a.b_scale = L->s2;
    a.b_expert_stride = (size_t)D * I / 2;
    a.bs_expert_stride = (size_t)D * I / 32;
    a.pool = L->pool;
    a.out_slots = L->slots;
    a.slots = K + 1;
    if (split)
        use_split_k(&a, L->part, T * K, D);
    CK(layer_gemm(L, &a, bm, MMOE_B_FP4, ag, MMOE_EPI_SLOT_BF16, max_tiles, s), "L2 GEMM (routed)");
    if (split)
        CK(mmoe_launch_split_finish(&a, MMOE_EPI_SLOT_BF16, (int)split_count(I), T * K, L->num_pairs, s),
           "L2 split-K sum (routed)");
    if (SI > 0)
        CK(cudaStreamWaitEvent(s, L->shared_done, 0), "cudaStreamWaitEvent");
    CK(mmoe_launch_combine(L->slots, L->idx, T, K, SI > 0, D, L->y, s), "combine");
    return MMOE_OK;
}

/** Check the routing and copy the inputs of a call to the device. */
static mmoe_status upload_inputs(mmoe_gpu_moe *L, int T, const uint16_t *x, const int32_t *topk_idx,
                                 const float *topk_w, mmoe_error *err)
{
    const int K = L->d.topk, E = L->d.n_experts;
    if (T < 0)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: T must be >= 0, got %d", T);
    if (T > 0 && (x == NULL || topk_idx == NULL || topk_w == NULL))
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: x, topk_idx and topk_weights are required");
    for (long long i = 0; i < (long long)T * K; i++)
        if (topk_idx[i] < -1 || topk_idx[i] >= E)
            return mmoe_error_set(err, MMOE_ERANGE, "gpu layer: topk_idx[%lld][%lld] = %d is outside [-1, %d)",
                                  i / K, i % K, (int)topk_idx[i], E);
    mmoe_status st = ensure_workspace(L, T, err);
    if (st != MMOE_OK || T == 0)
        return st;
    const size_t D = (size_t)L->d.hidden;
    CK(cudaMemcpyAsync(L->x, x, (size_t)T * D * 2, cudaMemcpyHostToDevice, L->stream), "upload x");
    CK(cudaMemcpyAsync(L->idx, topk_idx, (size_t)T * K * 4, cudaMemcpyHostToDevice, L->stream), "upload topk_idx");
    CK(cudaMemcpyAsync(L->tw, topk_w, (size_t)T * K * 4, cudaMemcpyHostToDevice, L->stream), "upload topk_weights");
    if (use_decode(L, T)) {
        /* the decode GEMM's routed tiles, built here once instead of in each of its blocks */
        const int max_tiles = mmoe_decode_route_max_tiles(T, K, E);
        mmoe_decode_route_table(T, K, E, topk_idx, max_tiles, L->dec_route_host, L->pairs_of_expert);
        L->route_rows = mmoe_decode_route_most_rows(L->dec_route_host, max_tiles, E);
        CK(cudaMemcpyAsync(L->dec_route, L->dec_route_host, mmoe_decode_route_ints(max_tiles, E) * 4,
                           cudaMemcpyHostToDevice, L->stream),
           "upload the decode routing table");
    }
    return MMOE_OK;
}

/** The decode16 kernel's description, which the two launch shapes complete (fill_result()). */
#define DECODE16_KERNEL "decode16: mma.sync.m16n8k16 f16 (activations staged as E4M3, both operands made F16 in " \
                        "registers) swap-AB weight streaming, 8-token tiles "

/** Fill the GPU details of a call. */
static void fill_result(mmoe_gpu_moe *L, int bm, long long pairs, mmoe_gpu_moe_result *res)
{
    if (res == NULL)
        return;
    memset(res, 0, sizeof *res);
    res->device_cc = L->cc;
    res->recipe = L->recipe;
    const int fused = L->last_decode_fused;
    if (L->last_decode)
        res->kernel = fused ? DECODE16_KERNEL "(3 launches (fused), programmatic dependent launch)"
                            : DECODE16_KERNEL "(5 launches, programmatic dependent launch)";
    else if (L->last_wgmma)
        res->kernel = L->last_split ? "wgmma f16 (E4M3/E2M1 converted) warp-specialized grouped GEMM, split-K (staged)"
                                    : "wgmma f16 (E4M3/E2M1 converted) warp-specialized grouped GEMM (staged, 9 launches)";
    else
        res->kernel = L->last_split ? "mma.sync.m16n8k32 e4m3 grouped GEMM, split-K (staged)"
                                    : "mma.sync.m16n8k32 e4m3 grouped GEMM (staged, 9 launches)";
    res->gemm = L->last_decode ? MMOE_GPU_GEMM_DECODE16
                : L->last_wgmma  ? MMOE_GPU_GEMM_WGMMA
                                 : MMOE_GPU_GEMM_MMA;
    res->block_m = bm;
    res->shared_fused = L->d.shared_inter > 0;
    res->routed_pairs = pairs;
    res->exact_path_blocks_l1 = L->wide_l1;
    res->exact_path_blocks_l2 = L->wide_l2;
    res->gpu_weight_bytes = L->weight_bytes;
    res->gpu_workspace_bytes = L->ws_bytes;
    res->decode_blocks_per_sm = L->last_decode ? L->occ.blocks : 0;
    res->decode_launches = !L->last_decode ? 0 : fused ? 3 : 5;
    if (L->cc >= 100) {
        res->fallback = 1;
        snprintf(res->fallback_reason, sizeof res->fallback_reason,
                 "sm_%d: no native tcgen05 kernel; the portable mma.sync kernel ran (%s formats)", L->cc,
                 mmoe_gpu_recipe_name(L->recipe));
    } else if (L->recipe == MMOE_GPU_RECIPE_SM100) {
        res->fallback = 1;
        snprintf(res->fallback_reason, sizeof res->fallback_reason,
                 "sm100 recipe requested on sm_%d: the %s kernel emulates its formats (per-32 promotion)", L->cc,
                 L->last_decode ? mmoe_gpu_gemm_name(res->gemm) : L->last_wgmma ? "wgmma" : "portable mma.sync");
    } else if (L->d.gemm == MMOE_GPU_GEMM_AUTO && !L->wgmma_ok && !L->last_decode) {
        res->fallback = 1;
        snprintf(res->fallback_reason, sizeof res->fallback_reason,
                 "sm_%d: no sm_90a wgmma code for this device; the portable mma.sync kernel ran", L->cc);
    }
}

mmoe_status mmoe_gpu_moe_run(mmoe_gpu_moe *L, int T, const uint16_t *x, const int32_t *topk_idx, const float *topk_w,
                             uint16_t *y, mmoe_gpu_moe_result *res, mmoe_error *err)
{
    if (L == NULL)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: NULL layer");
    mmoe_status st = upload_inputs(L, T, x, topk_idx, topk_w, err);
    if (st != MMOE_OK)
        return st;
    int bm = 0;
    st = launch_layer(L, T, &bm, err);
    if (st != MMOE_OK)
        return st;
    int pairs = 0;
    if (T > 0) {
        CK(cudaMemcpyAsync(&pairs, L->num_pairs, sizeof pairs, cudaMemcpyDeviceToHost, L->stream), "read pair count");
        CK(cudaMemcpyAsync(y, L->y, (size_t)T * L->d.hidden * 2, cudaMemcpyDeviceToHost, L->stream), "download y");
    }
    CK(cudaStreamSynchronize(L->stream), "layer kernels");
    fill_result(L, bm, pairs, res);
    return MMOE_OK;
}

mmoe_status mmoe_gpu_moe_expert_counts(mmoe_gpu_moe *L, int64_t *counts, mmoe_error *err)
{
    const int E = L->d.n_experts;
    long long *h = (long long *)malloc((size_t)E * sizeof *h);
    if (h == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "gpu layer: out of host memory");
    cudaError_t e = cudaMemcpy(h, L->cum_counts, (size_t)E * sizeof *h, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        for (int i = 0; i < E; i++)
            counts[i] = h[i];
    free(h);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "read expert counters");
    return MMOE_OK;
}

/** qsort order of doubles. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

mmoe_status mmoe_gpu_moe_time(mmoe_gpu_moe *L, int T, const uint16_t *x, const int32_t *topk_idx, const float *topk_w,
                              int warmup, int iters, double *median_us, double *min_us, mmoe_gpu_moe_result *res,
                              mmoe_error *err)
{
    if (iters <= 0)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: iters must be > 0");
    mmoe_status st = upload_inputs(L, T, x, topk_idx, topk_w, err);
    if (st != MMOE_OK)
        return st;
    int bm = 0;
    /* one call captured into a graph: replays cost one launch instead of 9 to 15 */
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    int use_graph = 0;
    if (T > 0 && cudaStreamBeginCapture(L->stream, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
        mmoe_status cst = launch_layer(L, T, &bm, err);
        cudaError_t ce = cudaStreamEndCapture(L->stream, &graph);
        if (cst == MMOE_OK && ce == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess)
            use_graph = 1;
        cudaGetLastError(); /* a failed capture leaves an error behind: clear it, launch directly */
    }
    for (int i = 0; i < warmup && st == MMOE_OK; i++) {
        if (use_graph) {
            cudaError_t ge = cudaGraphLaunch(exec, L->stream);
            if (ge != cudaSuccess)
                st = cuda_fail(err, ge, "cudaGraphLaunch");
        } else {
            st = launch_layer(L, T, &bm, err);
        }
    }
    double *ms = (double *)malloc((size_t)iters * sizeof *ms);
    if (ms == NULL)
        st = mmoe_error_set(err, MMOE_ENOMEM, "gpu layer: out of host memory");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < iters && st == MMOE_OK; i++) {
        cudaEventRecord(e0, L->stream);
        if (use_graph) {
            cudaError_t ge = cudaGraphLaunch(exec, L->stream);
            if (ge != cudaSuccess)
                st = cuda_fail(err, ge, "cudaGraphLaunch");
        } else {
            st = launch_layer(L, T, &bm, err);
        }
        cudaEventRecord(e1, L->stream);
        cudaError_t e = cudaEventSynchronize(e1);
        if (st == MMOE_OK && e != cudaSuccess)
            st = cuda_fail(err, e, "timed layer call");
        float f = 0.0f;
        cudaEventElapsedTime(&f, e0, e1);
        ms[i] = f;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (exec != NULL)
        cudaGraphExecDestroy(exec);
    if (graph != NULL)
        cudaGraphDestroy(graph);
    if (st == MMOE_OK) {
        qsort(ms, (size_t)iters, sizeof *ms, cmp_double);
        *median_us = 1000.0 * ms[iters / 2];
        *min_us = 1000.0 * ms[0];
        int pairs = 0;
        cudaMemcpy(&pairs, L->num_pairs, sizeof pairs, cudaMemcpyDeviceToHost);
        fill_result(L, bm, pairs, res);
        if (res != NULL)
            res->graph = use_graph;
    }
    free(ms);
    return st;
}

mmoe_status mmoe_gpu_quantize_input(mmoe_gpu_recipe recipe, int rows, int cols, const uint16_t *x, uint8_t *q,
                                    float *scales, mmoe_error *err)
{
    mmoe_status st = mmoe_gpu_available(NULL, err);
    if (st != MMOE_OK)
        return st;
    if (rows < 0 || cols <= 0 || cols % 128 != 0)
        return mmoe_error_set(err, MMOE_ESHAPE, "gpu quantize: cols must be a positive multiple of 128, got %d", cols);
    if (rows == 0)
        return MMOE_OK;
    const int sm90 = recipe != MMOE_GPU_RECIPE_SM100;
    const size_t n = (size_t)rows * cols, ns = n / (sm90 ? 128 : 32);
    __nv_bfloat16 *dx = NULL;
    uint8_t *dq = NULL;
    float *ds = NULL;
    cudaError_t e = cudaMalloc(&dx, n * 2);
    if (e == cudaSuccess) e = cudaMalloc(&dq, n);
    if (e == cudaSuccess) e = cudaMalloc(&ds, ns * 4);
    if (e == cudaSuccess) e = cudaMemcpy(dx, x, n * 2, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = mmoe_launch_quant(dx, NULL, rows, cols, sm90 ? MMOE_QUANT_SM90 : MMOE_QUANT_SM100_INPUT, dq, ds, 0);
    if (e == cudaSuccess) e = cudaMemcpy(q, dq, n, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(scales, ds, ns * 4, cudaMemcpyDeviceToHost);
    cudaFree(dx);
    cudaFree(dq);
    cudaFree(ds);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "quantize input");
    return MMOE_OK;
}
