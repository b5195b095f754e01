/**
 * @file mmoe_linear.h
 * @brief Linear layers, RMSNorm and the in-place QAT round trips of the DeepSeek-V4 oracle (@ref spec_arch_linear).
 *
 * Every `Linear` of the reference is one of three kinds:
 *
 * - **FP8 block-scaled** (mmoe_linear_fp8()): the bf16 activation row is quantized
 *   to FP8 E4M3 in 1x128 blocks with a power-of-two (UE8M0) scale; for each K block
 *   of the weight (128, or 32 for 32x32-block checkpoints) a fresh partial dot
 *   product `sum(xq * wq)` is formed and added, times the two scales, into an fp32
 *   accumulator in ascending block order; the result is rounded to bf16.
 * - **BF16 / FP32 weight** (mmoe_linear_dense()): plain matmul, bf16 (or fp32) output.
 *
 * Determinism.  The reference leaves the summation order inside a block to the
 * tensor core.  The oracle fixes it by making the block partial *exact*: a product
 * of two E4M3 values has at most 8 significant bits and lies in [2^-18, 2^17.6], so
 * the sum of 128 of them fits a double's 53 bits exactly, whatever the order.  The
 * partial is that exact sum rounded once to fp32 -- the best any fp32 tensor core
 * can do -- and OpenBLAS may compute it (cblas_dgemm per K block) without changing
 * a bit.  Dense (bf16/fp32) linears accumulate in double in a fixed order per
 * output element, then round to fp32 (and bf16).  Either way an output row depends
 * only on its input row: a token gives the same bits in a prefill of T rows and in
 * a decode of one row.
 *
 * Activations are bf16 bit patterns (uint16_t), row-major [T, K].
 */
#ifndef MMOE_LINEAR_H
#define MMOE_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Check an FP8 weight/scale pair: @p w F8_E4M3 [N, K], @p scale F8_E8M0
 * [ceil(N/b), ceil(K/b)], K a multiple of 128 (the activation block), no scale byte 255.
 * @param w      the weight view
 * @param scale  the scale view
 * @param N      expected output width
 * @param K      expected input width
 * @param block  weight block edge b (must divide 128)
 * @param name   tensor name for messages (e.g. "layers.2.attn.wq_a")
 * @param err    error message, or NULL
 * @return MMOE_OK, MMOE_EDTYPE, MMOE_ESHAPE, MMOE_ENOTFOUND (no data) or MMOE_ERANGE (bad K or b, NaN scale)
 */
mmoe_status mmoe_linear_fp8_check(const mmoe_tensor *w, const mmoe_tensor *scale, int64_t N,
                                  int64_t K, int block, const char *name, mmoe_error *err);

/**
 * y = bf16(x @ W^T) for an FP8 block-scaled weight (@ref spec_arch_linear).
 * @param x      bf16 [T, K], K a multiple of 128
 * @param T      rows
 * @param w      F8_E4M3 [N, K]
 * @param scale  F8_E8M0 [ceil(N/block), ceil(K/block)]
 * @param block  weight block edge (128 or 32; must divide 128)
 * @param y      bf16 [T, N], written
 * @param err    error message, or NULL
 * @return MMOE_OK, MMOE_ENOMEM, or the errors of mmoe_linear_fp8_check()
 */
mmoe_status mmoe_linear_fp8(const uint16_t *x, int64_t T, const mmoe_tensor *w,
                            const mmoe_tensor *scale, int block, uint16_t *y, mmoe_error *err);

/**
 * y = x @ W^T for a BF16 or F32 weight [N, K]: each output is the exact-product,
 * double-accumulated dot product (fixed order), rounded to fp32; written as fp32
 * to @p y_f32 and/or as bf16 (RNE of that fp32) to @p y_bf16 (either may be NULL).
 * @param x       bf16 [T, K]
 * @param T       rows
 * @param K       input width
 * @param w       BF16 or F32 [N, K]
 * @param N       output width
 * @param y_f32   fp32 [T, N] or NULL
 * @param y_bf16  bf16 [T, N] or NULL
 * @param err     error message, or NULL
 * @return MMOE_OK, MMOE_ENOMEM, or MMOE_EDTYPE / MMOE_ESHAPE if @p w is not BF16/F32 [N, K]
 */
mmoe_status mmoe_linear_dense(const uint16_t *x, int64_t T, int64_t K, const mmoe_tensor *w,
                              int64_t N, float *y_f32, uint16_t *y_bf16, mmoe_error *err);

/**
 * RMSNorm of the reference: y = bf16(w_fp32 * (x_fp32 * rsqrt(mean(x_fp32^2) + eps))),
 * the mean accumulated in double and rounded to fp32, rsqrt in fp32.
 * @param x       bf16 [T, n]
 * @param T       rows
 * @param n       row width
 * @param weight  BF16 or F32 [n] (values upcast to fp32)
 * @param eps     epsilon added to the mean square (fp32)
 * @param y       bf16 [T, n] (may alias @p x)
 */
void mmoe_rmsnorm_bf16(const uint16_t *x, int64_t T, int64_t n, const mmoe_tensor *weight,
                       float eps, uint16_t *y);

/**
 * The sum of squares of @p n bf16 values in double, in @ref spec_arch_sum_order (chunks of
 * MMOE_SUM_CHUNK summed from +0, then the pairwise tree): the mean square of RMSNorm and of
 * mHC's stream norm.  The squares are exact in double (8-bit significands).
 */
double mmoe_bf16_sum_of_squares(const uint16_t *x, int64_t n);

/**
 * In-place FP8 QAT round trip (`act_quant` in place): per block of @p block values,
 * s = 2^ceil(log2(max(amax, 1e-4)/448)), x <- bf16(fp32(e4m3(clamp(x/s, +-448))) * s).
 * Preconditions: 1 <= @p block <= 256 and @p n a multiple of @p block (a trailing
 * partial block would be left unchanged).
 */
void mmoe_roundtrip_fp8_bf16(uint16_t *x, int64_t n, int block);

/**
 * In-place FP4 QAT round trip (`fp4_act_quant`): per block, s = 2^ceil(log2(max(amax,
 * 6*2^-126)/6)), x <- bf16(e2m1_rne_sat(x/s) * s).  Precondition: @p n a multiple of
 * @p block (a trailing partial block would be left unchanged).
 */
void mmoe_roundtrip_fp4_bf16(uint16_t *x, int64_t n, int block);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_LINEAR_H */
