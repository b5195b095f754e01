/**
 * @file gpu_e2m1_decode.cuh
 * @brief Device helpers of the GEMM kernels: the E2M1 -> E4M3 decoder with folded scales, exact
 *        powers of two and the UE8M0 bytes of a scale word (the cp.async copies they use:
 *        gpu_cp_async.cuh).
 *
 * Both GEMM kernels (gpu_gemm.cu: mma.sync, portable; gpu_gemm_wgmma.cu: wgmma,
 * sm_90a) decode MXFP4 weights the same way, so the decoder lives here, once.
 *
 * **The decode.**  An MXFP4 weight is e2m1(code) * 2^(k - 127), with k the UE8M0
 * byte of its 32-wide group.  Inside a 128-wide K block the GEMMs fold the four
 * group exponents into the E4M3 values: each code is written as the E4M3 number
 * e2m1(code) * 2^r with r = k_g - base, and 2^(base - 127) is applied in FP32
 * later.  E2M1 magnitudes {0.5, 1, 1.5, 2, 3, 4, 6} times 2^r are E4M3 numbers
 * exactly for -8 <= r <= 6 (E4M3 reaches down to 2^-9 in its subnormals and up
 * to 448), which is where the callers' "fold is exact" test comes from.
 *
 * The decoder works on 8 codes (one 32-bit word, element 2i in the low nibble
 * of byte i) at a time with an 8-entry magnitude table held in two words: the
 * table for a shift r is built once per kernel (16 shifts, r = -8..7), and each
 * word of codes costs four byte-permutes plus the sign shuffling, 18 integer
 * instructions for 8 outputs.
 */
#ifndef MMOE_GPU_E2M1_DECODE_CUH
#define MMOE_GPU_E2M1_DECODE_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "gpu_cp_async.cuh"

namespace {

/** 2^e as a float, exact for e in [-149, 127]. */
__device__ __forceinline__ float pow2i(int e)
{
    return e >= -126 ? __uint_as_float((uint32_t)(e + 127) << 23) : __uint_as_float(1u << (e + 149));
}

/** Byte @p g of a word (a run-time @p g, without indexing a register array). */
__device__ __forceinline__ int byte_of(uint32_t w, int g)
{
    return (int)((w >> (8 * g)) & 0xffu);
}

/** Largest and smallest of the four UE8M0 bytes of a scale word. */
__device__ __forceinline__ void scale_span(uint32_t w, int *kmax, int *kmin)
{
    int hi = 0, lo = 255;
#pragma unroll
    for (int g = 0; g < 4; g++) {
        hi = max(hi, byte_of(w, g));
        lo = min(lo, byte_of(w, g));
    }
    *kmax = hi;
    *kmin = lo;
}

/**
 * E4M3 byte of the E2M1 magnitude code c3 (0..7) times 2^r, for -8 <= r <= 6
 * (exact there).  E2M1: c3 = 1 is 0.5; c3 >= 2 is (1 + (c3&1)/2) * 2^((c3>>1)-1).
 */
__device__ __forceinline__ uint32_t e2m1_mag_to_e4m3(int c3, int r)
{
    if (c3 == 0)
        return 0u;
    int x = c3 >= 2 ? (c3 >> 1) - 1 : -1;   /* unbiased exponent */
    int m = c3 >= 2 ? (c3 & 1) : 0;          /* the one mantissa bit */
    int xs = x + r;
    if (xs >= -6)
        return (uint32_t)(((xs + 7) << 3) | (m << 2));
    /* subnormal: value / 2^-9 = (2 + m) * 2^(xs + 8) */
    int units = xs + 8 >= 0 ? (2 + m) << (xs + 8) : (2 + m) >> 1;
    return (uint32_t)units;
}

/** Lookup table of the 8 E2M1 magnitudes scaled by 2^r, as 8 E4M3 bytes in two words. */
__device__ __forceinline__ void e2m1_lut(int r, uint32_t *lo, uint32_t *hi)
{
    uint32_t l = 0, h = 0;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        l |= e2m1_mag_to_e4m3(c, r) << (8 * c);
        h |= e2m1_mag_to_e4m3(c + 4, r) << (8 * c);
    }
    *lo = l;
    *hi = h;
}

/**
 * Eight E2M1 codes (one packed word, element 2i in the low nibble of byte i) to eight E4M3
 * bytes in K order, through the 8-entry magnitude table (lo, hi):
 * even and odd codes are split into bytes, their magnitudes looked up with one byte-permute
 * each (selector nibbles in the order n0 n4 n2 n6 / n1 n5 n3 n7), their sign bits moved to
 * bit 7, and two more byte-permutes interleave them back.  18 integer instructions per 8 codes.
 */
__device__ __forceinline__ void decode8(uint32_t w, uint32_t lo, uint32_t hi, uint32_t *out_lo, uint32_t *out_hi)
{
    const uint32_t ev = w & 0x07070707u, od = (w >> 4) & 0x07070707u;
    const uint32_t mE = __byte_perm(lo, hi, ev | (ev >> 12)); /* [n0 n4 n2 n6] */
    const uint32_t mO = __byte_perm(lo, hi, od | (od >> 12)); /* [n1 n5 n3 n7] */
    const uint32_t sE = __byte_perm((w << 4) & 0x80808080u, 0u, 0x3120u); /* signs in the same order */
    const uint32_t sO = __byte_perm(w & 0x80808080u, 0u, 0x3120u);
    const uint32_t E = mE | sE, O = mO | sO;
    *out_lo = __byte_perm(E, O, 0x6240u); /* n0 n1 n2 n3 */
    *out_hi = __byte_perm(E, O, 0x7351u); /* n4 n5 n6 n7 */
}

} // namespace

#endif /* MMOE_GPU_E2M1_DECODE_CUH */
