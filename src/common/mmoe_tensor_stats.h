/**
 * @file mmoe_tensor_stats.h
 * @brief Summary statistics of a tensor (min, max, mean, abs-max, NaN/Inf counts).
 *
 * What `megamoe inspect --stats` prints, and what a test or a debugging
 * session wants to know first about a weight or an activation: the range of
 * its finite values and whether anything is NaN or infinite.  Every element
 * is decoded exactly to double (all supported dtypes are exactly
 * representable in double); min, max and abs-max are exact, the mean is a
 * plain double-precision sum divided by the count of finite elements (relative
 * error about count * 2^-53, far below what a printout shows).
 *
 * Supported dtypes: every dtype of ::mmoe_dtype.  BF16, F16, F32, F64 and
 * the integer types I8, U8, I16, I32, I64 are decoded as themselves; FP8
 * (F8_E4M3, F8_E5M2) and E8M0 scales (F8_E8M0: 2^(b-127), 255 = NaN) through
 * the decoders of mmoe_formats.h.  Packed FP4 pairs are stored as I8/U8 and
 * are summarised as those bytes, not as FP4 values (the file does not say
 * which I8 tensors are packed FP4).
 */
#ifndef MMOE_TENSOR_STATS_H
#define MMOE_TENSOR_STATS_H

#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Statistics of one tensor. */
typedef struct mmoe_tensor_stats {
    int64_t count;    /**< number of elements */
    int64_t n_finite; /**< elements that are neither NaN nor infinite */
    int64_t n_nan;    /**< NaN elements */
    int64_t n_inf;    /**< +Inf or -Inf elements */
    double min;       /**< smallest finite value (NaN if n_finite == 0) */
    double max;       /**< largest finite value (NaN if n_finite == 0) */
    double mean;      /**< mean of the finite values (NaN if n_finite == 0) */
    double absmax;    /**< largest |finite value| (NaN if n_finite == 0) */
} mmoe_tensor_stats;

/** 1 if mmoe_tensor_stats_compute() can decode @p dt (every valid dtype), else 0. */
int mmoe_tensor_stats_supported(mmoe_dtype dt);

/**
 * Compute the statistics of @p t (which must be a valid view: nbytes =
 * numel * dtype size; the data may be unaligned).
 * @return MMOE_OK, MMOE_EUNSUPPORTED (dtype not decodable: message names it),
 *         or MMOE_EINVAL (nbytes does not match the shape)
 */
mmoe_status mmoe_tensor_stats_compute(const mmoe_tensor *t, mmoe_tensor_stats *out,
                                      mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_TENSOR_STATS_H */
