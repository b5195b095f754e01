/**
 * @file fmt_oracle.h
 * @brief Independent oracles of the formats suites: value formulas written from the
 *        format definitions with ldexp, and "nearest representable, ties to even" found by
 *        a brute-force search in double precision over a table of decoded codes.
 *
 * Nothing here calls the code under test.  The search does not know about bit tricks:
 * it compares |x - v| for every finite code value v (computed from sign/exponent/mantissa
 * fields with ldexp), keeps the smallest distance, and breaks an exact tie toward the
 * code whose last mantissa bit is 0.  Overflow is modelled with one virtual code past
 * the largest finite one (the value the next binade would start with): a saturating
 * conversion clamps it to the largest finite code, a non-saturating one reports it.
 */
#ifndef MMOE_FMT_ORACLE_H
#define MMOE_FMT_ORACLE_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mmoe_rng.h"

/**
 * Assert inside hot loops.  Check's ck_assert_msg() reports the location of every
 * *passing* assertion to the parent process (a write per call), which makes a loop over
 * millions of values spend its time in the kernel; this only calls Check on failure.
 */
#define FMT_CHECK(cond, ...)            \
    do {                                \
        if (!(cond))                    \
            ck_abort_msg(__VA_ARGS__);  \
    } while (0)

/** A positive half of a small float format: values of codes 0..max_code+1 (last = virtual). */
typedef struct fmt_oracle {
    int max_code;      /**< largest finite positive code */
    double value[130]; /**< value[c] for c in 0..max_code+1 */
} fmt_oracle;

/** Value of a positive code with @p mbits mantissa bits and bias @p bias, from its fields. */
static inline double oracle_minifloat_value(int code, int mbits, int bias)
{
    int e = code >> mbits, m = code & ((1 << mbits) - 1);
    if (e == 0)
        return ldexp((double)m / (1 << mbits), 1 - bias);          /* 0.m * 2^(1-bias) */
    return ldexp(1.0 + (double)m / (1 << mbits), e - bias);        /* 1.m * 2^(e-bias) */
}

static inline void oracle_init(fmt_oracle *o, int max_code, int mbits, int bias)
{
    o->max_code = max_code;
    for (int c = 0; c <= max_code + 1; c++)
        o->value[c] = oracle_minifloat_value(c, mbits, bias);
}

/**
 * Nearest code to |x| (x finite), ties to even code; may return max_code+1 (overflow).
 */
static inline int oracle_nearest(const fmt_oracle *o, double a)
{
    if (a >= o->value[o->max_code + 1])
        return o->max_code + 1; /* far past the top: distances would lose precision */
    int best = 0;
    double best_d = fabs(a - o->value[0]);
    for (int c = 1; c <= o->max_code + 1; c++) {
        double d = fabs(a - o->value[c]);
        if (d < best_d || (d == best_d && (c & 1) == 0 && (best & 1) != 0)) {
            best = c;
            best_d = d;
        }
    }
    return best;
}

static inline uint32_t oracle_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float oracle_float(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/**
 * A random float that exercises a small format: a quarter are random bit patterns (any
 * float, NaN and Inf included), half have a random exponent in [lo_exp, hi_exp] and a
 * random mantissa, a quarter are the exact midpoint between two adjacent codes of @p o
 * (an RNE tie) or one float ulp either side of it.  The sign is random.
 */
static inline float oracle_random_float(mmoe_rng *rng, const fmt_oracle *o, int lo_exp, int hi_exp)
{
    uint32_t r = mmoe_rng_u32(rng);
    uint32_t sign = (r & 1u) << 31;
    switch ((r >> 1) & 3u) {
    case 0:
        return oracle_float(mmoe_rng_u32(rng));
    case 1:
    case 2: {
        int e = lo_exp + (int)mmoe_rng_below(rng, (uint64_t)(hi_exp - lo_exp + 1));
        uint32_t frac = mmoe_rng_u32(rng) & 0x7FFFFFu;
        float mag = ldexpf(1.0f + (float)frac * 0x1p-23f, e);
        return oracle_float(oracle_bits(mag) | sign);
    }
    default: {
        int c = (int)mmoe_rng_below(rng, (uint64_t)o->max_code + 1); /* c..c+1, c+1 may be virtual */
        float mid = (float)((o->value[c] + o->value[c + 1]) / 2); /* exact: few significant bits */
        uint32_t which = (r >> 3) % 3u;
        if (which == 1)
            mid = nextafterf(mid, INFINITY);
        else if (which == 2)
            mid = nextafterf(mid, 0.0f);
        return oracle_float(oracle_bits(mid) | sign);
    }
    }
}

#endif /* MMOE_FMT_ORACLE_H */
