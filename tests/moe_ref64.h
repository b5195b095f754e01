/**
 * @file moe_ref64.h
 * @brief An independent float64 reference of the MoE layer, re-derived from the spec, with a
 *        per-element error bound for comparing the oracle against it.
 *
 * It shares only the scalar format conversions (mmoe_formats.h) with the code under test.
 * GEMMs are summed in double (exact for the dyadic test layers' L1, and within a derived
 * bound for L2); every rounding point of each recipe is re-implemented from
 * docs/spec/moe-layer.md, without looking at the oracle's tables.
 */
#ifndef MOE_REF64_H
#define MOE_REF64_H

#include <stdint.h>

#include "mmoe_moe.h"

/**
 * Compute y [t, D] (BF16) for the given routing, recipe and shared path, and a per-element
 * bound [t, D] on |y_oracle - y_ref| (see moe_ref64.c for the derivation).
 * @param shared_path  MMOE_PATH_NONE, _FUSED or _SERIAL
 * @return 0, or -1 on allocation failure
 */
int ref64_layer(const mmoe_moe_desc *d, const mmoe_moe_weights *w, int64_t t, const uint16_t *x,
                const int64_t *idx, const float *wts, mmoe_moe_path shared_path, uint16_t *y, double *bound);

/** One bf16 ulp at magnitude |v| (2^-133 for 0). */
double ref64_ulp_bf16(double v);

#endif
