/**
 * @file fmt_fp8.c
 * @brief FP8 E4M3FN and E5M2: bit layouts, decode tables, and the round-to-nearest-even
 *        encoders with and without saturation.
 *
 * ## Bit layouts
 *
 *     E4M3FN   s eeee mmm    bias 7    E5M2   s eeeee mm   bias 15
 *
 * | | E4M3FN | E5M2 |
 * |---|---|---|
 * | normal value | (1 + m/8) * 2^(e-7) | (1 + m/4) * 2^(e-15) |
 * | subnormal (e = 0) | m/8 * 2^-6 = m * 2^-9 | m/4 * 2^-14 = m * 2^-16 |
 * | max finite | 448 = 0x7E | 57344 = 0x7B |
 * | Inf | none ("FN" = finite only) | 0x7C / 0xFC |
 * | NaN | 0x7F, 0xFF only | 0x7D..0x7F, 0xFD..0xFF |
 *
 * E4M3FN gives the all-ones exponent to ordinary numbers (256..448) and keeps
 * only the all-ones *code* for NaN; that buys one binade of range at the price
 * of Inf.  E5M2 is IEEE-like.  Decoding is exact and is a 256-entry
 * `static const` table built at compile time from those formulas.
 *
 * ## Encoding: nearest even, then the overflow policy
 *
 * The magnitude is rounded to nearest, ties to even, by fmt_round_magnitude()
 * (fmt_minifloat.h); a result past the largest finite code is then handled by
 * one of two policies, which is where libraries differ (@ref spec_fmt_fp8):
 *
 * | input | SATFINITE (CUDA `__nv_fp8_e4m3`, our default) | non-saturating (PyTorch, ml_dtypes) |
 * |---|---|---|
 * | E4M3: 464 (tie 448/"480") | 0x7E | 0x7E |
 * | E4M3: 464 + 1 ulp, 480, 1e6 | 0x7E (448) | 0x7F (NaN) |
 * | E4M3: +-Inf | 0x7E / 0xFE | 0x7F / 0xFF |
 * | E5M2: 61440 (tie 57344/Inf) | 0x7B | 0x7C (Inf) |
 * | NaN, -NaN | 0x7F, 0x7F (sign dropped) | 0x7F, 0xFF (sign kept) |
 *
 * The MoE kernels use SATFINITE (`cvt.rn.satfinite.e4m3x2.f32`), and every
 * DeepSeek/DeepGEMM quantizer clamps to +-448 or sizes its scale so that the
 * policy never matters; the non-saturating variants exist to compare with
 * PyTorch and ml_dtypes bit for bit.
 */
#include <math.h>

#include "fmt_minifloat.h"
#include "mmoe_formats.h"

/* ------------------------------------------------------------------------------------------ */
/* Decode tables                                                                              */
/* ------------------------------------------------------------------------------------------ */

/** E4M3FN magnitude of byte b (sign ignored): the formulas of the table above. */
#define E4M3_MAG(b)                                                                 \
    (((b) & 0x7F) == 0x7F ? NAN                                                     \
     : (((b) >> 3) & 15) == 0                                                       \
         ? (float)((b) & 7) * 0x1p-9f                                               \
         : (float)(8 + ((b) & 7)) * (float)(1u << (((b) >> 3) & 15)) * 0x1p-10f)
/** Signed E4M3FN value of byte b. */
#define E4M3_VALUE(b) (((b) & 0x80) ? -(E4M3_MAG(b)) : (E4M3_MAG(b)))

/** E5M2 magnitude of byte b (sign ignored). */
#define E5M2_MAG(b)                                                                 \
    ((((b) >> 2) & 31) == 31 ? (((b) & 3) == 0 ? INFINITY : NAN)                    \
     : (((b) >> 2) & 31) == 0                                                       \
         ? (float)((b) & 3) * 0x1p-16f                                              \
         : (float)(4 + ((b) & 3)) * (float)(1u << (((b) >> 2) & 31)) * 0x1p-17f)
/** Signed E5M2 value of byte b. */
#define E5M2_VALUE(b) (((b) & 0x80) ? -(E5M2_MAG(b)) : (E5M2_MAG(b)))

/** E4M3FN decode table, computed by the compiler. */
static const float e4m3_table[256] = {FMT_T256(E4M3_VALUE)};
/** E5M2 decode table, computed by the compiler. */
static const float e5m2_table[256] = {FMT_T256(E5M2_VALUE)};

const float *mmoe_fp8_e4m3_table(void)
{
    return e4m3_table;
}

const float *mmoe_fp8_e5m2_table(void)
{
    return e5m2_table;
}

float mmoe_fp8_e4m3_to_f32(uint8_t b)
{
    return e4m3_table[b];
}

float mmoe_fp8_e5m2_to_f32(uint8_t b)
{
    return e5m2_table[b];
}

/* ------------------------------------------------------------------------------------------ */
/* Encoders                                                                                   */
/* ------------------------------------------------------------------------------------------ */

enum {
    E4M3_MBITS = 3, E4M3_BIAS = 7, E4M3_MAX_CODE = 0x7E,
    E5M2_MBITS = 2, E5M2_BIAS = 15, E5M2_MAX_CODE = 0x7B, E5M2_INF = 0x7C,
    FP8_NAN = 0x7F /* a NaN code of both formats */
};

/**
 * SATFINITE: round to nearest even, clamp the magnitude code to @p max_code (Inf included),
 * any NaN -> 0x7F without its sign.
 */
static uint8_t encode_satfinite(float x, int mbits, int bias, uint32_t max_code)
{
    uint32_t u = fmt_f32_bits(x);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t ua = u & 0x7FFFFFFFu;
    if (ua > 0x7F800000u)
        return FP8_NAN;
    uint32_t code = ua == 0x7F800000u ? max_code : fmt_round_magnitude(ua, mbits, bias);
    if (code > max_code)
        code = max_code;
    return (uint8_t)(sign | code);
}

/**
 * Non-saturating: round to nearest even; a code past @p max_code, and Inf, become
 * @p overflow_code (E4M3: NaN 0x7F; E5M2: Inf 0x7C) with the input's sign; NaN keeps its sign.
 */
static uint8_t encode_nosat(float x, int mbits, int bias, uint32_t max_code, uint32_t overflow_code)
{
    uint32_t u = fmt_f32_bits(x);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t ua = u & 0x7FFFFFFFu;
    if (ua > 0x7F800000u)
        return (uint8_t)(sign | FP8_NAN);
    uint32_t code = ua == 0x7F800000u ? overflow_code : fmt_round_magnitude(ua, mbits, bias);
    if (code > max_code)
        code = overflow_code;
    return (uint8_t)(sign | code);
}

uint8_t mmoe_fp8_e4m3_from_f32(float x)
{
    return encode_satfinite(x, E4M3_MBITS, E4M3_BIAS, E4M3_MAX_CODE);
}

uint8_t mmoe_fp8_e4m3_from_f32_nosat(float x)
{
    return encode_nosat(x, E4M3_MBITS, E4M3_BIAS, E4M3_MAX_CODE, FP8_NAN);
}

uint8_t mmoe_fp8_e5m2_from_f32(float x)
{
    return encode_satfinite(x, E5M2_MBITS, E5M2_BIAS, E5M2_MAX_CODE);
}

uint8_t mmoe_fp8_e5m2_from_f32_nosat(float x)
{
    return encode_nosat(x, E5M2_MBITS, E5M2_BIAS, E5M2_MAX_CODE, E5M2_INF); /* IEEE-style overflow */
}
