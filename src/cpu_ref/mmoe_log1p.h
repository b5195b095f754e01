/**
 * @file mmoe_log1p.h
 * @brief log1p for fp32 arguments, evaluated in float64 by one fixed sequence of IEEE
 *        operations that the oracle and the GPU kernels share (the router's softplus).
 *
 * The router's score is \f$\sqrt{\mathrm{softplus}(z)}\f$ with
 * \f$\mathrm{softplus}(z) = \log(1 + e^z)\f$ (@ref spec_moe_router).  The C library's log1pf is
 * not the same function everywhere: glibc 2.36's differs from the correctly rounded value for
 * about 1 % of the arguments the router meets, and a GPU's log1p is another implementation
 * again.  One ulp of a routing weight is small, but the weight multiplies the expert's
 * activations before their FP8 requantization, so a weight that moves by one ulp can move the
 * amax of a 128-channel group across a power of two and change that group's scale: a whole
 * expert's contribution to the token then changes by up to one FP8 step.  The oracle and the
 * GPU must therefore compute the *same* log1p, bit for bit, and the only way to have that on
 * every machine is to define it here, in operations that IEEE 754 rounds the same way on every
 * conforming processor: float64 addition, multiplication and division, and fused multiply-add.
 *
 * **The evaluation.**  For \f$x > -1\f$ (a float, exact in float64):
 * 1. \f$s = \mathrm{fl}(1 + x)\f$ and its rounding error \f$c = (1 + x) - s\f$, exactly (Knuth's
 *    TwoSum; no products, so no fused operation can change it);
 * 2. \f$s = 2^k m\f$ with \f$m \in [\sqrt{1/2}, \sqrt 2)\f$ (exponent bits; exact);
 * 3. \f$\log m = 2\,\mathrm{atanh}(r) = 2r + \frac{2}{3} r^3 + \frac{2}{5} r^5 + \dots\f$ with
 *    \f$r = (m - 1) / (m + 1)\f$, \f$|r| \le 0.1716\f$, \f$r^2 \le 0.0295\f$: the series to
 *    \f$r^{25}\f$ leaves a remainder below \f$10^{-19} |r|\f$;
 * 4. \f$\log(1 + x) = k \ln 2 + \log m + c / s\f$ (the last term is the first order of
 *    \f$\log(s + c) - \log s\f$; its neglected second order is below \f$2^{-106}\f$), with
 *    \f$\ln 2\f$ in two parts;
 * 5. one rounding to fp32 (round to nearest even).
 * Every multiply-add is written as fma() (on the device __fma_rn), every other operation as a
 * single operation (on the device the _rn intrinsics, which nvcc never contracts), so that no
 * compiler may fuse a product into an addition on one side only.  The float64 result is within
 * a few float64 ulps of \f$\log(1 + x)\f$; its rounding to fp32 is the correctly rounded value
 * except when \f$\log(1 + x)\f$ lies within those few ulps of a midpoint between two floats
 * (a fraction of about \f$2^{-27}\f$ of the arguments), and then it is one of the two
 * neighbours: within one fp32 ulp always, and the same bits on every machine.
 *
 * Special values as log1p's: \f$\pm 0\f$ returns itself, -1 gives \f$-\infty\f$, anything below -1
 * NaN, \f$+\infty\f$ gives \f$+\infty\f$, NaN gives NaN.
 */
#ifndef MMOE_LOG1P_H
#define MMOE_LOG1P_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/** Storage of the functions below: static inline, and for the device too under nvcc. */
#ifdef __CUDACC__
#define MMOE_LOG1P_FN __host__ __device__ static inline
#else
#define MMOE_LOG1P_FN static inline
#endif

/** @cond MMOE_LOG1P_INTERNAL */
#if defined(__CUDA_ARCH__)
#define MMOE_L1P_ADD(a, b) __dadd_rn((a), (b))
#define MMOE_L1P_SUB(a, b) __dsub_rn((a), (b))
#define MMOE_L1P_MUL(a, b) __dmul_rn((a), (b))
#define MMOE_L1P_DIV(a, b) __ddiv_rn((a), (b))
#define MMOE_L1P_FMA(a, b, c) __fma_rn((a), (b), (c))
#define MMOE_L1P_TO_F32(a) __double2float_rn(a)
#else
#define MMOE_L1P_ADD(a, b) ((a) + (b))
#define MMOE_L1P_SUB(a, b) ((a) - (b))
#define MMOE_L1P_MUL(a, b) ((a) * (b))
#define MMOE_L1P_DIV(a, b) ((a) / (b))
#define MMOE_L1P_FMA(a, b, c) fma((a), (b), (c))
#define MMOE_L1P_TO_F32(a) ((float)(a))
#endif
/** @endcond */

/** \f$\ln 2\f$ = MMOE_LN2_HI + MMOE_LN2_LO; HI has 36 significant bits, so k * HI is exact for |k| < 2^17. */
#define MMOE_LN2_HI 0x1.62e42fefa0000p-1
/** The rest of \f$\ln 2\f$, rounded to float64. */
#define MMOE_LN2_LO 0x1.cf79abc9e3b3ap-40

/**
 * \f$\log(1 + x)\f$ rounded to fp32 by the fixed float64 evaluation of the file's chapter: the
 * same bits on the host and on the device, within one fp32 ulp of the exact value.
 */
MMOE_LOG1P_FN float mmoe_log1pf(float x)
{
    if (!(x > -1.0f) || x == 0.0f || x == INFINITY) /* NaN, <= -1, +-0, +inf */
        return x == -1.0f ? -INFINITY : (x < -1.0f ? NAN : x);
    const double xd = (double)x;
    /* 1. s + c = 1 + x exactly */
    const double s = MMOE_L1P_ADD(1.0, xd);
    const double bv = MMOE_L1P_SUB(s, 1.0);
    const double c = MMOE_L1P_ADD(MMOE_L1P_SUB(1.0, MMOE_L1P_SUB(s, bv)), MMOE_L1P_SUB(xd, bv));
    /* 2. s = 2^k m, m in [sqrt(1/2), sqrt(2)) */
    uint64_t bits;
    memcpy(&bits, &s, sizeof bits);
    int k = (int)((bits >> 52) & 0x7FF) - 1023;
    bits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull; /* m in [1, 2) */
    double m;
    memcpy(&m, &bits, sizeof m);
    if (m > 0x1.6a09e667f3bcdp+0) { /* sqrt(2) rounded: m / 2, exact */
        m = MMOE_L1P_MUL(m, 0.5);
        k++;
    }
    /* 3. log m = 2r + r^3 (2/3 + r^2 (2/5 + ...)), r = (m - 1) / (m + 1) */
    const double r = MMOE_L1P_DIV(MMOE_L1P_SUB(m, 1.0), MMOE_L1P_ADD(m, 1.0));
    const double r2 = MMOE_L1P_MUL(r, r);
    double p = 2.0 / 25.0;
    p = MMOE_L1P_FMA(p, r2, 2.0 / 23.0);
    p = MMOE_L1P_FMA(p, r2, 2.0 / 21.0);
    p = MMOE_L1P_FMA(p, r2, 2.0 / 19.0);
    p = MMOE_L1P_FMA(p, r2, 2.0 / 17.0);
    p = MMOE_L1P_FMA(p, r2, 2.0 / 15.0);
    p = MMOE_L1P_FMA(p, r2, 2.0 / 13.0);
    p = MMOE_L1P_FMA(p, r2, 2.0 / 11.0);
    p = MMOE_L1P_FMA(p, r2, 2.0 / 9.0);
    p = MMOE_L1P_FMA(p, r2, 2.0 / 7.0);
    p = MMOE_L1P_FMA(p, r2, 2.0 / 5.0);
    p = MMOE_L1P_FMA(p, r2, 2.0 / 3.0);
    const double r3 = MMOE_L1P_MUL(r2, r);
    const double log_m = MMOE_L1P_FMA(r3, p, MMOE_L1P_MUL(2.0, r));
    /* 4. k ln2 + log m + c / s */
    const double tail = MMOE_L1P_FMA((double)k, MMOE_LN2_LO, MMOE_L1P_DIV(c, s));
    const double y = MMOE_L1P_FMA((double)k, MMOE_LN2_HI, MMOE_L1P_ADD(log_m, tail));
    return MMOE_L1P_TO_F32(y);
}

#endif /* MMOE_LOG1P_H */
