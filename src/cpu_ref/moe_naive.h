/**
 * @file moe_naive.h
 * @brief A naive reference of the MoE layer (moe_naive.c): plain loops, one token at a time.
 *
 * Not installed and not used by the library's fast path: the tests compare the oracle with
 * it, and the manual's walkthrough (@ref walkthrough_moe) shows its code.  It reads the
 * weights in checkpoint layout (::mmoe_moe_weights) and ignores ::mmoe_moe_desc::pad_to
 * (padding never changes the output, @ref spec_moe_padding).
 */
#ifndef MOE_NAIVE_H
#define MOE_NAIVE_H

#include <stdint.h>

#include "mmoe_moe.h"

/** The FP8 quantizers of the recipe table (@ref spec_moe_recipes, rows R1 and R7). */
typedef enum moe_naive_quant {
    MOE_NAIVE_Q_SM100_X,       /**< 1x32, UE8M0 by DeepGEMM's caller rule (sm100 R1) */
    MOE_NAIVE_Q_SM100_REQUANT, /**< 1x32, UE8M0 by the SM100 epilogue's rule (sm100 R7) */
    MOE_NAIVE_Q_SM90,          /**< 1x128, continuous FP32 scale (sm90 R1 and R7) */
    MOE_NAIVE_Q_V4,            /**< 1x128, UE8M0 by DeepSeek-V4's act_quant (dsv4-ref R1 and R7) */
    MOE_NAIVE_Q_NONE           /**< no quantization (a shared expert stored in BF16) */
} moe_naive_quant;

/** Buffers of one token (moe_naive_layer() allocates them; the walkthrough reads them). */
typedef struct moe_naive_scratch {
    float *x;          /**< [D] the input, widened */
    float *xq;         /**< [D] the input quantized by the recipe (values code x scale) */
    float *xs;         /**< [D] the input quantized for the serial shared expert */
    float *scores;     /**< [E] router scores sqrt(softplus(z)) */
    float *g;          /**< [width] L1 gate sums of the last expert run */
    float *u;          /**< [width] L1 up sums */
    float *a;          /**< [width] the intermediate after SwiGLU and the routing weight */
    float *aq;         /**< [width] the intermediate quantized (the L2 input) */
    uint16_t *slot_y;  /**< [topk, D] BF16 output of each slot */
    uint16_t *shared_y;/**< [D] BF16 output of the shared expert */
} moe_naive_scratch;

/** Weight W[r][c] of a matrix in checkpoint layout: FP4 pairs with 1x32 UE8M0 scales,
 *  E4M3 with @p block x @p block scales (UE8M0 or F32), or BF16. */
float moe_naive_weight(const mmoe_tensor *w, const mmoe_tensor *sf, int64_t block, int64_t r, int64_t c);

/**
 * The dot product of every GEMM of the layer, written as @ref spec_moe_gemm_order defines
 * it: the sum over k < @p n of a[k] W[row][k], with W[row][k] = moe_naive_weight(@p w, @p sf,
 * @p block, @p row, k), in eight FP32 lanes of fmaf (lane k mod 8, k ascending) and the fixed
 * combine ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)).
 */
float moe_naive_dot(const float *a, const mmoe_tensor *w, const mmoe_tensor *sf, int64_t block, int64_t row,
                    int64_t n);

/** Route one token: @p scores [E] out, expert ids @p idx and weights @p wts [topk] out. */
void moe_naive_route(const mmoe_moe_desc *d, const mmoe_moe_weights *w, const float *x, int32_t token_id,
                     float *scores, int64_t *idx, float *wts);

/** Quantize @p n values with @p rule; @p out gets code x scale (exact for UE8M0, fl(q s) for SM90). */
void moe_naive_quantize(moe_naive_quant rule, const float *x, int64_t n, float *out);

/** R3 to R6 of @p recipe for one channel: from the L1 sums to the weighted intermediate. */
float moe_naive_swiglu(mmoe_moe_recipe recipe, mmoe_moe_math math, float limit, float g_acc, float u_acc,
                       float w);

/**
 * One expert task of one token (R2 to R8): L1 over the quantized input @p xq [hidden], the
 * SwiGLU with routing weight @p w, the requant, L2, the BF16 output row @p y [hidden].
 * @p width is the expert's intermediate width, @p block the block size of FP8 scales;
 * g, u, a and aq of @p s hold the intermediate values afterwards.
 */
void moe_naive_expert(const mmoe_moe_expert_weights *ew, int64_t width, int64_t block, int64_t hidden,
                      mmoe_moe_recipe recipe, mmoe_moe_math math, float limit, const float *xq, float w,
                      moe_naive_scratch *s, uint16_t *y);

/** R9: the BF16 rows @p slot_y [topk, hidden] summed in the recipe's order, shared last. */
void moe_naive_combine(mmoe_moe_recipe recipe, int topk, const int64_t *idx, const uint16_t *slot_y,
                       const uint16_t *shared_y, int64_t hidden, uint16_t *y);

/**
 * The whole layer, token by token.  @p shared_path is the shared expert's path (the oracle's
 * decision, mmoe_moe_layer_shared_plan()).  Routing as in mmoe_moe_layer_run(): the caller's
 * topk_idx / topk_weights, or the router.  The output's topk arrays may be NULL.
 * @return MMOE_OK, MMOE_EINVAL (topk too large) or MMOE_ENOMEM
 */
mmoe_status moe_naive_layer(const mmoe_moe_desc *d, const mmoe_moe_weights *w, mmoe_moe_path shared_path,
                            const mmoe_moe_input *in, const mmoe_moe_output *out, mmoe_error *err);

/** Free the buffers of @p s. */
void moe_naive_scratch_free(moe_naive_scratch *s);

#endif /* MOE_NAIVE_H */
