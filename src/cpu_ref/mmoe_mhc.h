/**
 * @file mmoe_mhc.h
 * @brief Manifold-constrained hyper-connections (mHC): the 4-stream residual of DeepSeek-V4 (@ref spec_arch_mhc).
 *
 * DeepSeek-V4 does not carry one residual vector per token but `hc` (= 4)
 * *streams* X[j], j = 0..hc-1, each of width D, stored bf16 and stream-major:
 * element (t, j, c) of a [T, hc, D] array.  The embedding is copied into all
 * four streams (mmoe_hc_expand()).  Each sub-layer (attention, MoE) then
 *
 * 1. **mixes** the streams into one input:  `y = sum_j pre[j] * X[j]`
 *    (mmoe_hc_pre()), with weights computed from the streams themselves:
 *    `m = (fn @ flatten(X)) * rsqrt(mean(flatten(X)^2) + norm_eps)`, 24 = (2+hc)*hc
 *    values;  `pre = sigmoid(m[0:4]*scale[0] + base[0:4]) + hc_eps`,
 *    `post = 2*sigmoid(m[4:8]*scale[1] + base[4:8])`, and a 4x4 mixing matrix
 *    `C = m[8:24]*scale[2] + base[8:24]` made doubly stochastic by a row
 *    softmax and Sinkhorn normalization (mmoe_hc_sinkhorn());
 * 2. runs the sub-layer on `y`, giving `out`;
 * 3. **writes back** (mmoe_hc_post()): `X_new[k] = post[k]*out + sum_j C[j][k]*R[j]`
 *    where R is the stream state before the sub-layer.
 *
 * The head (mmoe_hc_head()) mixes the streams once more, with sigmoid weights
 * only (no Sinkhorn, no post), before the final norm.
 *
 * **Rounding points.**  Everything inside is fp32 (the reference upcasts):
 * the mean of squares and the 24 dot products are accumulated in double in a
 * fixed order and rounded once to fp32 (so a row gives the same bits whether it
 * is alone or in a batch); sigmoid, softmax and the Sinkhorn steps are fp32
 * operations in index order.  The outputs that leave are rounded to bf16 once:
 * `y` of hc_pre / hc_head and the new streams of hc_post.
 *
 * Parameters (checkpoint names `layers.L.hc_attn_fn` etc., all F32):
 * fn [(2+hc)*hc, hc*D], base [(2+hc)*hc], scale [3]; head: fn [hc, hc*D],
 * base [hc], scale [1].
 */
#ifndef MMOE_MHC_H
#define MMOE_MHC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Numbers that shape every mHC call (from the model config). */
typedef struct mmoe_hc_params {
    int hc;             /**< number of streams (hc_mult, 4) */
    int64_t dim;        /**< D, width of one stream */
    int sinkhorn_iters; /**< hc_sinkhorn_iters (20): column normalizations after the softmax */
    float norm_eps;     /**< eps of the stream RMS (rms_norm_eps, 1e-6) */
    float hc_eps;       /**< hc_eps (1e-6) */
} mmoe_hc_params;

/**
 * Copy each embedding row into all hc streams: X[t, j, :] = h[t, :].
 * @param p  stream count and width
 * @param h  bf16 [T, D]
 * @param T  tokens
 * @param X  bf16 [T, hc, D] (written)
 */
void mmoe_hc_expand(const mmoe_hc_params *p, const uint16_t *h, int64_t T, uint16_t *X);

/**
 * Make a raw 4x4 mixing matrix doubly stochastic, in place (fp32, @ref spec_arch_mhc step 3):
 * row softmax, + hc_eps, one column normalization, then iters-1 times (row, column)
 * normalization, each dividing by (sum + hc_eps).
 * @param C       hc*hc values, row j = input stream j (C[j*hc + k])
 * @param hc      number of streams
 * @param iters   hc_sinkhorn_iters (number of column normalizations)
 * @param hc_eps  the epsilon added after the softmax and to every sum
 */
void mmoe_hc_sinkhorn(float *C, int hc, int iters, float hc_eps);

/**
 * Pre-mix of one sub-layer for T tokens.
 * @param p      mHC parameters
 * @param X      bf16 [T, hc, D] streams
 * @param T      tokens
 * @param fn     F32 [(2+hc)*hc, hc*D]
 * @param base   F32 [(2+hc)*hc]
 * @param scale  F32 [3]
 * @param y      bf16 [T, D] (written): the sub-layer input before its RMSNorm
 * @param post   F32 [T, hc] (written): write-back weights of the new output
 * @param comb   F32 [T, hc, hc] (written): doubly stochastic stream mixing, [t][j][k]
 */
void mmoe_hc_pre(const mmoe_hc_params *p, const uint16_t *X, int64_t T, const float *fn,
                 const float *base, const float *scale, uint16_t *y, float *post, float *comb);

/**
 * Write-back of one sub-layer: Xn[t,k,:] = bf16(post[t,k]*out[t,:] + sum_j comb[t,j,k]*R[t,j,:]),
 * fp32 inside (the sum over j in ascending order, then the post term added).
 * @param p     mHC parameters
 * @param out   bf16 [T, D] sub-layer output
 * @param R     bf16 [T, hc, D] streams before the sub-layer
 * @param T     tokens
 * @param post  F32 [T, hc] from mmoe_hc_pre()
 * @param comb  F32 [T, hc, hc] from mmoe_hc_pre()
 * @param Xn    bf16 [T, hc, D] (written; may alias @p R)
 */
void mmoe_hc_post(const mmoe_hc_params *p, const uint16_t *out, const uint16_t *R, int64_t T,
                  const float *post, const float *comb, uint16_t *Xn);

/** The MoE layers' worker pool (mmoe_moe.h). */
typedef struct mmoe_moe_pool mmoe_moe_pool;

/** mmoe_hc_pre() with the tokens shared out over @p pool's threads (NULL: the caller alone): the same bits. */
void mmoe_hc_pre_pool(mmoe_moe_pool *pool, const mmoe_hc_params *p, const uint16_t *X, int64_t T, const float *fn,
                      const float *base, const float *scale, uint16_t *y, float *post, float *comb);

/** mmoe_hc_post() with the tokens shared out over @p pool's threads (NULL: the caller alone): the same bits. */
void mmoe_hc_post_pool(mmoe_moe_pool *pool, const mmoe_hc_params *p, const uint16_t *out, const uint16_t *R,
                       int64_t T, const float *post, const float *comb, uint16_t *Xn);

/**
 * Head mix (@ref spec_arch_head): pre = sigmoid(m*scale[0] + base) + hc_eps with m from @p fn [hc, hc*D];
 * y[t] = bf16(sum_j pre[j]*X[t,j]).
 * @param p      mHC parameters
 * @param X      bf16 [T, hc, D] final streams
 * @param T      tokens
 * @param fn     F32 [hc, hc*D]
 * @param base   F32 [hc]
 * @param scale  F32 [1]
 * @param y      bf16 [T, D] (written)
 */
void mmoe_hc_head(const mmoe_hc_params *p, const uint16_t *X, int64_t T, const float *fn,
                  const float *base, const float *scale, uint16_t *y);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_MHC_H */
