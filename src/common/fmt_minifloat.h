/**
 * @file fmt_minifloat.h
 * @brief Private helpers of the formats chapters: rounding an fp32 to a small float
 *        (E4M3, E5M2, E2M1) and building 256-entry decode tables at compile time.
 *
 * ## One rounding routine for three formats
 *
 * A small float with M mantissa bits and exponent bias B has, for a positive
 * magnitude, the code `(E << M) | m`: E the biased exponent field, m the
 * mantissa field.  Codes are ordered like the values they stand for, and the
 * code just past the largest normal of a binade is the first code of the next
 * binade.  So rounding an fp32 magnitude to the format is rounding its
 * significand to an integer, in the right unit:
 *
 * - **normal range** (unbiased exponent e >= 1 - B): the fp32 significand
 *   `sig = 1.f * 2^23` (24 bits) is shifted right by `23 - M` with round to
 *   nearest even, giving r in [2^M, 2^(M+1)].  The code is
 *   `((e + B) << M) + r - 2^M`; when r carries to 2^(M+1) this is exactly the
 *   first code of the next binade, so the carry needs no special case.
 * - **subnormal range** (e < 1 - B): the unit is the smallest subnormal
 *   2^(1-B-M); the code is the significand shifted by more, again RNE.  A
 *   value that rounds up to 2^M units lands on the minimum normal code, which
 *   is correct.
 *
 * Ties go to the even *integer*, and since `(e + B) << M` and `2^M` are even for
 * M >= 1, that is the even *code*: the hardware's "ties to even".  The routine
 * does not saturate: a magnitude past the largest finite value produces a
 * larger code, and each caller decides (clamp to the maximum, or NaN / Inf).
 *
 * ## Decode tables without global mutable state
 *
 * The T256() macro expands a value expression for every byte 0..255 into an
 * initializer list, so each decode table is a `static const float[256]`
 * computed by the compiler from the same field formulas the chapters describe.
 */
#ifndef MMOE_FMT_MINIFLOAT_H
#define MMOE_FMT_MINIFLOAT_H

#include <stdint.h>
#include <string.h>

/** fp32 bits of @p x (memcpy: no aliasing tricks). */
static inline uint32_t fmt_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/** The fp32 whose bits are @p u. */
static inline float fmt_f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/**
 * The UE8M0 decode of mmoe_ue8m0_to_f32() (fmt_ue8m0.c), inline for the oracle's kernels, which
 * convert a scale byte per group of 32 or 128 weights: 2^(b - 127) as the exponent field itself,
 * 255 -> NaN, 0 -> 2^-127 (an fp32 subnormal, which has no exponent field of its own).
 */
static inline float fmt_ue8m0_to_f32(uint8_t b)
{
    if (b == 0xFF)
        return fmt_f32_from_bits(0x7FC00000u);
    if (b == 0)
        return fmt_f32_from_bits(0x00400000u);
    return fmt_f32_from_bits((uint32_t)b << 23);
}

/** The BF16 widening of mmoe_bf16_to_f32() (fmt_bf16.c), inline for the oracle's loops: the bits moved up by 16. */
static inline float fmt_bf16_to_f32(uint16_t h)
{
    return fmt_f32_from_bits((uint32_t)h << 16);
}

/** @p v / 2^s rounded to nearest, ties to even (any shift s >= 0). */
static inline uint32_t fmt_rne_shift(uint32_t v, unsigned s)
{
    if (s == 0)
        return v;
    if (s > 31)
        return 0; /* v < 2^32 <= half a unit: rounds to 0 */
    uint32_t q = v >> s;
    uint32_t rem = v & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return q;
}

/**
 * Round a finite, non-negative fp32 magnitude (bits @p ua, sign bit clear, not Inf/NaN)
 * to the code of a small float with @p mbits mantissa bits and exponent bias @p bias,
 * nearest even, without saturation (see the file comment).
 */
static inline uint32_t fmt_round_magnitude(uint32_t ua, int mbits, int bias)
{
    int e32 = (int)(ua >> 23);
    uint32_t frac = ua & 0x7FFFFFu;
    uint32_t sig = e32 == 0 ? frac : (frac | 0x800000u);
    int e = e32 == 0 ? -126 : e32 - 127; /* value = sig * 2^(e - 23) */
    int emin = 1 - bias;                 /* exponent of the smallest normal */
    if (e >= emin) {
        uint32_t r = fmt_rne_shift(sig, (unsigned)(23 - mbits));
        return ((uint32_t)(e + bias) << mbits) + r - (1u << mbits);
    }
    return fmt_rne_shift(sig, (unsigned)(23 - mbits + (emin - e)));
}

/** Expand F(b) for b = base .. base+3. */
#define FMT_T4(F, b) F(b), F((b) + 1), F((b) + 2), F((b) + 3)
/** Expand F(b) for 16 consecutive bytes. */
#define FMT_T16(F, b) FMT_T4(F, b), FMT_T4(F, (b) + 4), FMT_T4(F, (b) + 8), FMT_T4(F, (b) + 12)
/** Expand F(b) for 64 consecutive bytes. */
#define FMT_T64(F, b) FMT_T16(F, b), FMT_T16(F, (b) + 16), FMT_T16(F, (b) + 32), FMT_T16(F, (b) + 48)
/** Expand F(b) for all 256 bytes: the initializer of a decode table. */
#define FMT_T256(F) FMT_T64(F, 0), FMT_T64(F, 64), FMT_T64(F, 128), FMT_T64(F, 192)

#endif /* MMOE_FMT_MINIFLOAT_H */
