/**
 * @file mmoe_gpu_stage.h
 * @brief Single stages of the GPU layer, callable on their own: for the per-stage tests.
 *
 * The layer (mmoe_gpu_moe.h) runs a pipeline of kernels; when its output disagrees with the
 * oracle, these entry points say which stage is wrong.  Each takes host arrays, runs exactly
 * one stage on device 0 and returns its raw result:
 *   - mmoe_gpu_stage_gemm(): one expert's GEMM (FP8 activations with FP32 group scales times
 *     MXFP4 or FP8 weights with UE8M0 scales), through a chosen kernel family and tile height,
 *     with or without split K; the FP32 sums before any epilogue;
 *   - mmoe_gpu_stage_requant(): the requantization of FP32 rows (the L1 output) with the
 *     recipe's kernel rule;
 *   - mmoe_gpu_stage_route(): the grouping of (token, slot) pairs by expert and the tile list;
 *   - mmoe_gpu_stage_combine(): the slot sum of each token;
 *   - mmoe_gpu_stage_split_sum(): the split-K finish of an L2 GEMM (sum of the splits in
 *     order, BF16).
 * Without CUDA both answer ::MMOE_ENODEV.
 */
#ifndef MMOE_GPU_STAGE_H
#define MMOE_GPU_STAGE_H

#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_gpu_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Weight format of a stage GEMM. */
typedef enum mmoe_gpu_weight_format {
    MMOE_GPU_WEIGHTS_MXFP4 = 0, /**< E2M1 codes, two per byte (low nibble first), [N, K/2] */
    MMOE_GPU_WEIGHTS_FP8 = 1    /**< E4M3 bytes [N, K] */
} mmoe_gpu_weight_format;

/** One GEMM stage: sizes, formats and the kernel to run. */
typedef struct mmoe_gpu_stage_gemm_desc {
    mmoe_gpu_gemm gemm;            /**< MMOE_GPU_GEMM_MMA, _WGMMA or _DECODE16 (not AUTO) */
    int block_m;                   /**< tokens per tile: 16 or 64 (mma), 16, 64 or 128 (wgmma), 8 (decode16) */
    mmoe_gpu_weight_format weights;/**< weight format */
    int a_group;                   /**< channels per activation scale: 128 (sm90) or 32 (sm100) */
    int split_kb;                  /**< K blocks of 128 per split; 0: no split (always 0 for decode) */
    int rows;                      /**< activation rows (tokens), >= 1 */
    int n;                         /**< weight rows (outputs), a multiple of 128 */
    int k;                         /**< reduction length, a multiple of 128 */
} mmoe_gpu_stage_gemm_desc;

/**
 * out[r][c] = sum over k of (a[r][k] * a_scale[r][k / a_group]) * (w[c][k] * 2^(w_scale[c][k / 32] - 127)),
 * computed by the layer's GEMM kernel (FP32 sums, before any epilogue; with split K the splits
 * are added here in ascending order, as the layer's split-K finish does).
 * @param d        the stage: sizes, formats and kernel
 * @param a        E4M3 activations [rows, k]
 * @param a_scale  FP32 scales [rows, k / a_group]
 * @param w        weights in the checkpoint layout of @p d->weights
 * @param w_scale  UE8M0 scale bytes [n, k / 32]
 * @param out      FP32 [rows, n]
 * @param err      message on failure
 */
mmoe_status mmoe_gpu_stage_gemm(const mmoe_gpu_stage_gemm_desc *d, const uint8_t *a, const float *a_scale,
                                const uint8_t *w, const uint8_t *w_scale, float *out, mmoe_error *err);

/**
 * Requantize FP32 rows [rows, cols] to E4M3 with the recipe's in-layer rule (sm90: FP32 scale
 * per 128 with the 1e-4 clamp; sm100: UE8M0 per 32, no clamps); @p scales receives the FP32
 * value of each scale ([rows, cols/128] or [rows, cols/32]).
 */
mmoe_status mmoe_gpu_stage_requant(mmoe_gpu_recipe recipe, int rows, int cols, const float *x, uint8_t *q,
                                   float *scales, mmoe_error *err);

/** What mmoe_gpu_stage_route() returns (arrays owned by the caller). */
typedef struct mmoe_gpu_stage_route_out {
    int32_t *counts;      /**< [E] valid pairs per expert */
    int32_t *pool_token;  /**< [T*topk] token of each pool row (rows [0, num_pairs) are written) */
    int32_t *pool_slot;   /**< [T*topk] its slot */
    float *pool_weight;   /**< [T*topk] its routing weight */
    int32_t *tile_expert; /**< [T*topk + E] expert of each tile (tiles [0, num_tiles) are written) */
    int32_t *tile_row0;   /**< first pool row of each tile */
    int32_t *tile_rows;   /**< rows of each tile, 1..block_m */
    int num_pairs;        /**< valid pairs */
    int num_tiles;        /**< tiles */
} mmoe_gpu_stage_route_out;

/**
 * Group the valid (token, slot) pairs of topk_idx [T, topk] (-1: masked) by expert, as the
 * layer's route kernel does: expert segments in ascending expert order, tiles of @p block_m
 * rows.  The order of the pairs inside one segment is not fixed.
 */
mmoe_status mmoe_gpu_stage_route(int T, int topk, int E, int block_m, const int32_t *topk_idx, const float *topk_w,
                                 mmoe_gpu_stage_route_out *out, mmoe_error *err);

/**
 * The combine: y[t][d] = bf16(sum over the valid slots k of token t in ascending order, the
 * shared slot topk last when @p has_shared, of slots[t][k][d] in FP32 from zero).
 * @param T           tokens
 * @param topk        routed slots per token
 * @param has_shared  1: slot topk holds the shared expert's output
 * @param D           hidden width
 * @param slots       BF16 [T][topk + 1][D]
 * @param topk_idx    [T, topk] experts of the slots (-1: masked)
 * @param y           BF16 [T][D]
 * @param err         message on failure
 */
mmoe_status mmoe_gpu_stage_combine(int T, int topk, int has_shared, int D, const uint16_t *slots,
                                   const int32_t *topk_idx, uint16_t *y, mmoe_error *err);

/**
 * The split-K finish of an L2 GEMM: out[r][c] = bf16(sum over z in ascending order of
 * partial[z][r][c], in FP32 from zero).
 */
mmoe_status mmoe_gpu_stage_split_sum(int nsplit, int rows, int cols, const float *partial, uint16_t *out,
                                     mmoe_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MMOE_GPU_STAGE_H */
