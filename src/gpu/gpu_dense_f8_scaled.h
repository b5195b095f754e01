/**
 * @file gpu_dense_f8_scaled.h
 * @brief The scaled doubles of the few-token dense FP8 linear (gpu_linear_dense_f8_rows.cuh), in
 *        plain C that the CUDA kernels and a CPU test (tests/test_gpu_dense_f8_scaled.c) share.
 *
 * The oracle's product of a BF16 value x and the FP8 weight w = bf16(fl32(e 2^(sb - 127))) (E4M3
 * value e, UE8M0 scale byte sb) enters a double fma chain.  The kernel computes every value of
 * that chain times 2^-MMOE_DF8_SHIFT instead:
 *
 *   - **Direct scale bytes** (MMOE_DF8_DIRECT_MIN .. MMOE_DF8_DIRECT_MAX, and no NaN code in the
 *     chunk): w = e 2^(sb - 127) exactly, so x w 2^-512 = (x 2^(sb - 127 + 1016 - 512)) (e 2^-1016):
 *     the staged x carries 2^mmoe_df8_x_exponent(sb) and the weight is e 2^-1016, whose double
 *     bits are the code's own bits moved (mmoe_df8_e4m3_hi(): the sign to bit 63, the seven
 *     magnitude bits to bits 49..55, the exponent's four bits landing on the low bits of the
 *     double's exponent field, so normal codes become normal doubles 2^-1016 times their value
 *     and subnormal codes subnormal ones).
 *   - **Other scale bytes**: the staged x carries 2^-512 and the weight is the oracle's decode.
 *
 * (The form is exact for scale bytes 3..246, where e 2^(sb - 127) keeps its bits through the
 * fp32 and bf16 roundings and stays finite; the kernels keep the narrower range 10..134, which
 * the dense linears' other direct decodes (dense_f8_chunk16 in gpu_forward.cu and
 * k_linear_dense_tokens) share through mmoe_df8_scale_direct(), and the CPU test fails when the
 * range is widened to 2 or to 247.)
 *
 * Every product, fma result and tree node is then the oracle's times 2^-512: finite products of
 * two BF16 values are integer multiples of 2^-266 below 2^256, partial sums of up to 12288 of
 * them stay below 2^270, so times 2^-512 they are normal doubles, where rounding commutes with a
 * power-of-two scaling; the result times 2^512 is the oracle's double.  The CPU test runs this
 * arithmetic for every scale byte, NaN codes and BF16 x of every exponent against the oracle's
 * dense linear, bit for bit, and checks mmoe_df8_e4m3_hi() for every code.
 */
#ifndef MMOE_GPU_DENSE_F8_SCALED_H
#define MMOE_GPU_DENSE_F8_SCALED_H

#include <stdint.h>

#ifdef __CUDACC__
#define MMOE_DF8_FN __host__ __device__ static inline
#else
/** The qualifiers of this header's functions: host and device under nvcc, static inline in C. */
#define MMOE_DF8_FN static inline
#endif

/** The constants of the scaled form. */
enum mmoe_df8_const {
    MMOE_DF8_SHIFT = 512,      /**< every staged product and partial sum is the oracle's times 2^-512 */
    MMOE_DF8_DIRECT_MIN = 10,  /**< smallest scale byte whose weights are e 2^(sb - 127) exactly */
    MMOE_DF8_DIRECT_MAX = 134, /**< largest such scale byte */
    MMOE_DF8_CODE_EXP = 1016   /**< mmoe_df8_e4m3_hi() gives e 2^-MMOE_DF8_CODE_EXP */
};

/** Whether scale byte @p sb takes the direct form (see the file comment). */
MMOE_DF8_FN int mmoe_df8_scale_direct(uint32_t sb)
{
    return sb >= MMOE_DF8_DIRECT_MIN && sb <= MMOE_DF8_DIRECT_MAX;
}

/** The power of two the staged x of a chunk with scale byte @p sb carries: sb + 377 or -512. */
MMOE_DF8_FN int mmoe_df8_x_exponent(uint32_t sb)
{
    return mmoe_df8_scale_direct(sb) ? (int)sb - 127 + MMOE_DF8_CODE_EXP - MMOE_DF8_SHIFT : -MMOE_DF8_SHIFT;
}

/**
 * The high word of the double e 2^-1016 for E4M3 code @p code (not NaN): sign to bit 31, the
 * magnitude bits to bits 17..23 (the kernel builds four at once with one byte permute and a
 * mask, e4m3_times_2m1016() in gpu_forward.cu); the low word is zero.
 */
MMOE_DF8_FN uint32_t mmoe_df8_e4m3_hi(uint32_t code)
{
    return (code & 0x80u) << 24 | (code & 0x7Fu) << 17;
}

#endif /* MMOE_GPU_DENSE_F8_SCALED_H */
