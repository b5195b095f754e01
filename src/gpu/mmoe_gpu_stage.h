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
 *     recipe's kernel rule.
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
    mmoe_gpu_gemm gemm;            /**< MMOE_GPU_GEMM_MMA or MMOE_GPU_GEMM_WGMMA (not AUTO) */
    int block_m;                   /**< tokens per tile: 16 or 64 (mma), 16, 64 or 128 (wgmma) */
    mmoe_gpu_weight_format weights;/**< weight format */
    int a_group;                   /**< channels per activation scale: 128 (sm90) or 32 (sm100) */
    int split_kb;                  /**< K blocks of 128 per split; 0: no split */
    int rows;                      /**< activation rows (tokens), >= 1 */
    int n;                         /**< weight rows (outputs), a multiple of 128 */
    int k;                         /**< reduction length, a multiple of 128 */
} mmoe_gpu_stage_gemm_desc;

/**
 * out[r][c] = sum over k of (a[r][k] * a_scale[r][k / a_group]) * (w[c][k] * 2^(w_scale[c][k / 32] - 127)),
 * computed by the layer's GEMM kernel (FP32 sums, before any epilogue; with split K the splits
 * are added here in ascending order, as the layer's split-K finish does).
 * @param a        E4M3 activations [rows, k]
 * @param a_scale  FP32 scales [rows, k / a_group]
 * @param w        weights in the checkpoint layout of @p d->weights
 * @param w_scale  UE8M0 scale bytes [n, k / 32]
 * @param out      FP32 [rows, n]
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

#ifdef __cplusplus
}
#endif

#endif /* MMOE_GPU_STAGE_H */
