/**
 * @file cpu_avx512.h
 * @brief What the oracle's AVX-512 kernels share: their target attribute, the CPU features they
 *        need, and the exact decoders of sixteen E4M3 codes.
 *
 * The AVX-512 kernels are the AVX2 kernels of cpu_avx2.h with twice the lanes, written so that
 * every lane performs the operations of one lane of the AVX2 kernel (or of the scalar
 * definition) on the same values, in the same order: they change how many values one
 * instruction computes, never a value.
 *
 * - Where the order of a sum is free (the FP8 linear's exact block partials, linear_fp8.c), a
 *   register simply holds sixteen consecutive k instead of eight.
 * - Where the order is fixed (the MoE oracle's eight FP32 lanes, lane k mod 8 taking one fused
 *   multiply-add per k in ascending order, moe_dot.c), a 16-lane register holds the eight lanes
 *   of **two outputs**: the lower half those of weight row j, the upper half those of row j + 1,
 *   and the activations of k .. k + 7 stand in both halves.  Each half then receives exactly the
 *   fused multiply-adds the AVX2 kernel gives its register.
 *
 * They need AVX512F (the 512-bit operations and masks), AVX512DQ (broadcasting eight floats into
 * both halves, moving a half out), AVX512BW and AVX512VL (byte and word operations on the
 * narrower registers the decoders start from); moe_dot_isa_runs_here() asks the CPU for all four.
 */
#ifndef MMOE_CPU_AVX512_H
#define MMOE_CPU_AVX512_H

#include "cpu_avx2.h"

#if MMOE_CPU_HAVE_X86

/** The target attribute of every AVX-512 kernel. */
#define MMOE_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512bw,avx512vl")))

/**
 * Sixteen E4M3 codes, given as the low bytes of sixteen 32-bit lanes @p x, as their FP32 values,
 * exactly: the steps of mmoe_e4m3_codes_avx2() with masks instead of branches for the subnormal
 * codes (exponent field 121, then 2^-6 subtracted: no subnormal float on the way) and a branch
 * for the rare NaN codes (magnitude 0x7F), which take @p nan_pos or @p nan_neg by their sign.
 */
MMOE_AVX512 static inline __attribute__((always_inline)) __m512 mmoe_e4m3_lanes_avx512(__m512i x, __m512 nan_pos,
                                                                                       __m512 nan_neg)
{
    const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7F));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24);
    const __mmask16 sub = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(8)); /* exponent field 0 */
    __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
    bits = _mm512_mask_add_epi32(bits, sub, bits, _mm512_set1_epi32(1 << 23));
    __m512 v = _mm512_mask_sub_ps(_mm512_castsi512_ps(bits), sub, _mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p-6f));
    v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
    const __mmask16 is_nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
    if (is_nan != 0) {
        const __mmask16 neg = _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x80));
        v = _mm512_mask_blend_ps(is_nan, v, _mm512_mask_blend_ps(neg, nan_pos, nan_neg));
    }
    return v;
}

/**
 * Sixteen consecutive E4M3 codes at @p codes as their FP32 values times 2^-8, exactly: the FP16
 * bits of mmoe_e4m3x8_x256th_avx2() for sixteen codes, widened by one conversion, the two NaN
 * codes taking @p nan_pos or @p nan_neg by their sign.  Five integer steps and one conversion,
 * against the eleven of mmoe_e4m3_lanes_avx512(): for the FP8 linear, whose exact partials take
 * the 2^8 back as one multiplication of the partial.
 */
MMOE_AVX512 static inline __attribute__((always_inline)) __m512 mmoe_e4m3_codes_x256th_avx512(const uint8_t *codes,
                                                                                               __m512 nan_pos,
                                                                                               __m512 nan_neg)
{
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)codes);
    const __m256i w = _mm256_cvtepu8_epi16(b);
    const __m256i h = _mm256_slli_epi16(_mm256_add_epi16(w, _mm256_and_si256(w, _mm256_set1_epi16(0x80))), 7);
    __m512 v = _mm512_cvtph_ps(h);
    const __mmask16 is_nan = _mm_cmpeq_epi8_mask(_mm_and_si128(b, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F));
    if (is_nan != 0) {
        const __mmask16 neg = _mm_movepi8_mask(b);
        v = _mm512_mask_blend_ps(is_nan, v, _mm512_mask_blend_ps(neg, nan_pos, nan_neg));
    }
    return v;
}

/**
 * Eight E4M3 codes at @p lo and eight at @p hi as the lower and upper halves of one register of
 * FP32 values (two weight rows' codes for the paired kernels of moe_dot.c).
 */
MMOE_AVX512 static inline __attribute__((always_inline)) __m512 mmoe_e4m3_pair_avx512(const uint8_t *lo,
                                                                                      const uint8_t *hi,
                                                                                      __m512 nan_pos, __m512 nan_neg)
{
    const __m128i b = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(const void *)lo),
                                         _mm_loadl_epi64((const __m128i *)(const void *)hi));
    return mmoe_e4m3_lanes_avx512(_mm512_cvtepu8_epi32(b), nan_pos, nan_neg);
}

#endif /* MMOE_CPU_HAVE_X86 */

#endif /* MMOE_CPU_AVX512_H */
