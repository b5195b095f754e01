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
 *   - GMC_ELEM_FRAC: at most 0.5% of the elements differ by more than GMC_ULPS = 2 BF16 ulps
 *     of max(|y_ref|, RMS of the token's reference row);
 *   - no NaN anywhere.
 *
 * ## Requantization flips
 * One intermediate channel c of expert e whose value lies within the reordering bound of an
 * E4M3 (or UE8M0-scaled) rounding boundary may be requantized one step apart on the two
 * sides.  Its effect on the token's output row is the step times the group's scale, times the
 * routing weight, times column c of that expert's W2:
 * \f[ y_{gpu} - y_{ref} = \alpha\, W_2^{(e)}[:, c] + r. \f]
 * A step of an intermediate that is large against the token's others moves the whole row by a
 * few BF16 ulps of its RMS (seen: 74 of 4096 elements of one token beyond 2 ulps, token
 * relative error 4.2e-3, from one channel), which would fail the element count of a call with
 * few tokens by itself.  So when a call fails the bounds, each token failing them on its own is
 * tested for such flips: at most GMC_MAX_FLIPS times, the column of one of the token's experts
 * (routed or shared) that removes the most squared error is chosen, and the chosen columns'
 * multiples are fitted together by least squares (one scalar per flip, against D equations).
 *
 * The remainder r holds what the bounds above admit, and more: where the flipped slot's
 * output is rounded to BF16 before the combine (the sm90 recipe), the two sides now round
 * different values, so each element also differs by up to one BF16 ulp of that slot's value,
 * whose RMS is about the token's or less (the slots' outputs are independent sums).  So an
 * explained token is judged on its own: r within GMC_FLIP_NORM_TOL = 2^-7 normwise and at most
 * 0.5% of its elements beyond GMC_FLIP_ULPS = 3 ulps (the two above plus that one); the call's
 * bounds then hold over the tokens not explained.  A defect that is not one W2 column of the
 * token's own experts (a wrong element, a wrong channel order, a wrong expert) leaves a
 * remainder these refuse.
 */
#ifndef GPU_MOE_COMPARE_H
#define GPU_MOE_COMPARE_H

#include <stdint.h>

#include "mmoe_moe.h"

#define GMC_NORM_TOL 0x1.0p-8
#define GMC_ELEM_FRAC 0.005
#define GMC_ULPS 2
#define GMC_FLIP_NORM_TOL 0x1.0p-7
#define GMC_FLIP_ULPS 3
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
    double rel_l2;         /**< over the tokens not explained by flips */
    int64_t beyond;        /**< their elements beyond GMC_ULPS BF16 ulps */
    int64_t n;             /**< their elements */
    int64_t nan_count;     /**< over the call (-1: the comparison ran out of memory) */
    int64_t explained;     /**< tokens whose error was explained by flips */
    int pass;              /**< no NaN, every explained token within its bounds, the rest within the call's */
} gmc_verdict;

/** Elements of one token's row whose difference @p err exceeds @p ulps BF16 ulps of max(|ref|, rms). */
int64_t gmc_beyond_ulps(const double *err, const uint16_t *ref, int64_t D, double rms, int ulps);

/**
 * Explain token @p t's error @p err [D] (modified in place into the remainder) by at most
 * @p max_flips W2 columns of its experts; @p flips receives them.  Returns the number of flips
 * (0 when the error passes the call's bounds as it is), or -1 when no such explanation leaves
 * a remainder within an explained token's bounds.
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

/**
 * gmc_compare(), then Check assertions that no output is NaN and the call passes, each naming
 * @p what and the suite's @p seed.
 */
void gmc_assert_close(const char *what, const gmc_layer *L, const uint16_t *gpu, const uint16_t *ref, int64_t T,
                      int64_t D, uint64_t seed);

#endif
