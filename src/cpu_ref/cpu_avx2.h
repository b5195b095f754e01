/**
 * @file cpu_avx2.h
 * @brief What the oracle's AVX2 kernels share: whether this build can have them, their target
 *        attribute, the exact decoders of eight E4M3 codes and the widening of eight BF16 values.
 *
 * The oracle's vector kernels (moe_dot.c for the MoE's fixed-order GEMM, linear_dense.c and
 * linear_fp8.c for the attention's linears) are compiled with GCC's target attribute, so one
 * binary runs everywhere and takes them only where the CPU reports AVX2, FMA and F16C
 * (moe_dot_isa_runs_here()).  Every vector kernel has a scalar twin that gives the same bits;
 * the kernels change how fast a value is computed, never which value.
 */
#ifndef MMOE_CPU_AVX2_H
#define MMOE_CPU_AVX2_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(MMOE_CPU_GENERIC_ONLY)
/**
 * 1 where the AVX2 kernels can be compiled (x86-64 with GCC's target attribute), else 0, as on
 * any other CPU; defining MMOE_CPU_GENERIC_ONLY leaves them out on x86-64 too (CI compiles the
 * oracle so, to keep the build of other CPUs warning-free).
 */
#define MMOE_CPU_HAVE_X86 1
#include <immintrin.h>
#include <stdint.h>

/** The target attribute of every AVX2 kernel (AVX2, FMA and F16C: every x86 CPU with the first two has the third). */
#define MMOE_AVX2 __attribute__((target("avx2,fma,f16c")))

/**
 * Eight E4M3 codes (bytes at @p codes) as their FP32 values, exactly, with no subnormal float
 * on the way (an x86 core takes a slow microcode assist for each).  A code's 7 magnitude bits
 * become bits 26..20 of a float and 120 is added to its exponent field, so that a normal code
 * (exponent e = 1..15, mantissa m) reads (1 + m/8) 2^(e + 120 - 127), its E4M3 value; a
 * subnormal code (e = 0, value m 2^-9) takes the exponent field 121 instead, which reads
 * (1 + m/8) 2^-6, and then loses 2^-6 by an exact subtraction (a vector without subnormal
 * codes, the usual case of real weights, skips these two steps).  The sign bit is set last (so
 * 0x80 is -0), and the two NaN codes (magnitude 0x7F) take the decoder's NaN of their sign
 * (@p nan_pos, @p nan_neg: the values of mmoe_fp8_e4m3_table()).
 */
MMOE_AVX2 static inline __attribute__((always_inline)) __m256 mmoe_e4m3_codes_avx2(const uint8_t *codes,
                                                                                   __m256 nan_pos, __m256 nan_neg)
{
    const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)codes));
    const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7F));
    const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(x, 7), 31);
    const __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag); /* exponent field 0 */
    __m256i bits = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
    __m256 v;
    if (_mm256_testz_si256(sub, sub)) { /* no subnormal code: the usual case of real weights */
        v = _mm256_or_ps(_mm256_castsi256_ps(bits), _mm256_castsi256_ps(sign));
    } else {
        bits = _mm256_add_epi32(bits, _mm256_and_si256(sub, _mm256_set1_epi32(1 << 23)));
        const __m256 lift = _mm256_and_ps(_mm256_castsi256_ps(sub), _mm256_set1_ps(0x1p-6f));
        v = _mm256_or_ps(_mm256_sub_ps(_mm256_castsi256_ps(bits), lift), _mm256_castsi256_ps(sign));
    }
    const __m256 is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F)));
    if (!_mm256_testz_ps(is_nan, is_nan))
        v = _mm256_blendv_ps(v, _mm256_blendv_ps(nan_pos, nan_neg, _mm256_castsi256_ps(sign)), is_nan);
    return v;
}

/**
 * Eight E4M3 codes (the low 8 bytes of @p codes) as their FP32 values times 2^-8, exactly,
 * through the FP16 format: a code c becomes the FP16 bits (c + (c & 0x80)) << 7, its sign at bit
 * 15 and its seven magnitude bits at bits 13..7, so that FP16's exponent field (bias 15) holds
 * E4M3's (bias 7) and FP16's top three mantissa bits E4M3's three.  A normal code then reads
 * (1 + m/8) 2^(e - 15) and a subnormal one m 2^-17 (an FP16 subnormal): both the E4M3 value
 * times 2^-8, and a normal FP32 number after F16C's widening, exact.  The two NaN codes
 * (magnitude 0x7F) would read 1.875: callers keep them out or replace them.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) __m256 mmoe_e4m3x8_x256th_avx2(__m128i codes)
{
    const __m128i w = _mm_cvtepu8_epi16(codes);
    return _mm256_cvtph_ps(_mm_slli_epi16(_mm_add_epi16(w, _mm_and_si128(w, _mm_set1_epi16(0x80))), 7));
}

/** Eight BF16 values at @p h as FP32 values (the bits moved up by 16: fmt_bf16_to_f32()). */
MMOE_AVX2 static inline __attribute__((always_inline)) __m256 mmoe_bf16x8_avx2(const uint16_t *h)
{
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)h)), 16));
}

#else
/** 0: this build has no AVX2 kernels. */
#define MMOE_CPU_HAVE_X86 0
#endif

#endif /* MMOE_CPU_AVX2_H */
