/**
 * @file attn_ref.h
 * @brief Float64 oracles of the spec's number handling, shared by the attention suites.
 *
 * Written from docs/spec/architecture.md (linear layers) and the bit layouts, independently of the code
 * under test: the E4M3 grid is enumerated from its fields (bias 7, 3 mantissa
 * bits, no Inf, 0x7F NaN), rounding is a brute-force nearest search with ties to
 * the even code, and power-of-two scales come from exact comparisons.
 */
#ifndef ATTN_REF_H
#define ATTN_REF_H

#include <stdint.h>

/** Value of an E4M3FN code (any of the 254 finite codes). */
double attn_ref_e4m3_value(uint8_t code);

/** Nearest value of @p grid (n non-negative values, index = code) to x, ties to the even code; sign kept. */
double attn_ref_round_to_grid(double x, const double *grid, int n);

/** Nearest E4M3 value to x in [-448, 448], ties to the even code. */
double attn_ref_e4m3_round(double x);

/** Smallest power of two 2^e with fmax * 2^e >= amax. */
double attn_ref_pow2_scale(double amax, double fmax);

/**
 * The V4 activation quantizer on one block: s = 2^ceil(log2(max(amax, fp32(1e-4))/448)),
 * xq = e4m3(clamp(x/s, +-448)).  Writes xq (E4M3 units) and returns s.
 */
double attn_ref_fp8_block(const double *x, int n, double *xq);

/** sum_i softmax(gate)_i * val_i over n candidates (gates of -inf are absent). */
double attn_ref_softmax_pool(const double *gate, const double *val, int n);

#endif /* ATTN_REF_H */
