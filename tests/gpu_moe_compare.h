/**
 * @file gpu_moe_compare.h
 * @brief The GPU layer's output against the oracle's: the bounds of test_gpu_moe, and the
 *        requantization flips that a token's error may be explained by (tests only).
 *
 * ## What is bounded
 * The GPU and the oracle compute the same exact products and differ in the order of the FP32
 * additions of the GEMMs (and, for sm90, in one extra FP32 rounding of q * sf in the oracle).
 * Reordering a sum of K terms moves it by at most about K 2^-24 sum|terms|.  That moves a later
 * rounding (the BF16 rounding of gate/up or of the L2 output, or the requantization of the
 * intermediate) only for the rare values that lie that close to a rounding boundary.  So:
 *   - GMC_NORM_TOL: ||y_gpu - y_ref||_2 <= 2^-8 ||y_ref||_2 over the call (one BF16 ulp,
 *     normwise);
 *   - GMC_ELEM_FRAC: at most 0.5% of the elements differ by more than 2 BF16 ulps of
 *     max(|y_ref|, RMS of the token's reference row);
 *   - no NaN anywhere.
 *
 * ## Requantization flips
 * One intermediate channel c of expert e whose value lies within the reordering bound of an
 * E4M3 (or UE8M0-scaled) rounding boundary may be requantized one step apart on the two
 * sides.  Its effect on the token's output row is the step times the group's scale, times the
 * routing weight, times column c of that expert's W2:
 * \f[ y_{gpu} - y_{ref} = \alpha\, W_2^{(e)}[:, c] + r, \f]
 * where r is the L2 sums' and BF16 roundings' own difference, the one the two bounds above
 * admit.  A step of an intermediate that is large against the token's others moves the whole
 * row by a few BF16 ulps of its RMS (seen: 74 of 4096 elements of one token beyond 2 ulps,
 * token relative error 4.2e-3, from one channel), which would fail the element count of a call
 * with few tokens by itself.  So a token that fails either bound on its own is tested for such
 * flips: at most GMC_MAX_FLIPS times, the column of one of the token's experts (routed or
 * shared) that removes the most squared error is fitted by least squares (one scalar alpha per
 * flip, against D equations) and subtracted; if the remainder passes both bounds within the
 * token, the token's error is explained and its remainder is what the call's bounds count.  A
 * defect that is not one W2 column of the token's own experts (a wrong element, a wrong
 * channel order, a wrong expert) leaves a remainder the bounds refuse.
 */
#ifndef GPU_MOE_COMPARE_H
#define GPU_MOE_COMPARE_H

#include <stdint.h>

#include "mmoe_moe.h"

#define GMC_NORM_TOL 0x1.0p-8
#define GMC_ELEM_FRAC 0.005
/** The most requantization flips one token's error may be explained by. */
#define GMC_MAX_FLIPS 2

/** The experts a comparison may explain a token's error with (NULL weights: none). */
typedef struct gmc_layer {
    const mmoe_moe_desc *desc;  /**< hidden, topk, n_shared, shared_block */
    const mmoe_moe_weights *w;  /**< the layer's W2 (routed and shared) */
    const int64_t *topk_idx;    /**< [T, topk], -1 = masked slot */
} gmc_layer;

/** One flip a token's error was explained by. */
typedef struct gmc_flip {
    int64_t expert; /**< routed expert, or -1 for the shared expert */
    int64_t channel;
    double alpha;   /**< the fitted multiple of its W2 column */
} gmc_flip;

/** What a comparison found. */
typedef struct gmc_verdict {
    double rel_l2;         /**< over the call, explained tokens counted by their remainder */
    int64_t beyond;        /**< elements beyond 2 BF16 ulps, the same way */
    int64_t n;             /**< elements compared */
    int64_t nan_count;
    int64_t explained;     /**< tokens whose error was explained by flips */
    int pass;              /**< rel_l2, beyond and nan_count within the bounds */
} gmc_verdict;

/** Elements of one token's row whose difference @p err exceeds 2 BF16 ulps of max(|ref|, rms). */
int64_t gmc_beyond_2ulp(const double *err, const uint16_t *ref, int64_t D, double rms);

/**
 * Explain token @p t's error @p err [D] (modified in place into the remainder) by at most
 * @p max_flips W2 columns of its experts; @p flips receives them.  Returns the number of flips
 * (0 when the error passes as it is), or -1 when no such explanation passes the bounds.
 */
int gmc_explain_token(const gmc_layer *L, int64_t t, double *err, const uint16_t *ref, int max_flips,
                      gmc_flip *flips);

/**
 * Compare @p gpu with @p ref [T, D] (BF16) under the bounds above; with @p L non-NULL, a token
 * failing them on its own may be explained by flips (printed).  Prints a line, and a line per
 * token when the call fails.
 */
gmc_verdict gmc_compare(const char *what, const gmc_layer *L, const uint16_t *gpu, const uint16_t *ref, int64_t T,
                        int64_t D);

#endif
