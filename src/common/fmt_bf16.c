/**
 * @file fmt_bf16.c
 * @brief BF16: the top half of an fp32, rounded to nearest even, with NaN kept NaN.
 *
 * ## Layout
 *
 * bfloat16 is `s eeeeeeee mmmmmmm`: the sign, the full 8-bit fp32 exponent and the top
 * 7 mantissa bits.  So bf16 -> fp32 is `bits << 16`, exact, and fp32 -> bf16 only has to
 * round away the low 16 bits.
 *
 * ## Rounding
 *
 * Round to nearest even on the integer bits:
 *
 *     h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
 *
 * Adding 0x7FFF carries into bit 16 exactly when the low half is above 0x8000; the
 * extra `(u >> 16) & 1` makes the exact half (0x8000) carry only when the kept part is
 * odd.  A carry out of the mantissa moves to the next binade, and FLT_MAX (0x7F7FFFFF)
 * rounds to Inf (0x7F80), like every IEEE conversion.  fp32 subnormals round the same
 * way (they are just smaller bf16 subnormals).
 *
 * ## NaN
 *
 * The formula would turn the signalling NaN 0x7F800001 into 0x7F80 = Inf, so NaN is
 * handled first: `(u >> 16) | 0x0040` keeps the sign and the top payload and sets the
 * quiet bit (the ggml rule; CUDA writes 0x7FFF, torch 0x7FFF/0xFFFF).  Compare NaNs as
 * a class, never bitwise, across libraries.
 *
 * ## Rows
 *
 * mmoe_bf16_to_f32_row() widens eight values per step where the compiler targets SSE2 (every
 * x86-64 build): interleaving zero words below the BF16 words is the same `bits << 16`.
 */
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "fmt_minifloat.h"
#include "mmoe_formats.h"

uint16_t mmoe_bf16_from_f32(float x)
{
    uint32_t u = fmt_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float mmoe_bf16_to_f32(uint16_t h)
{
    return fmt_bf16_to_f32(h);
}

float mmoe_bf16_round(float x)
{
    return mmoe_bf16_to_f32(mmoe_bf16_from_f32(x));
}

void mmoe_bf16_from_f32_row(const float *x, size_t n, uint16_t *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = mmoe_bf16_from_f32(x[i]);
}

void mmoe_bf16_to_f32_row(const uint16_t *h, size_t n, float *out)
{
    size_t i = 0;
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(h + i));
        _mm_storeu_si128((__m128i *)(void *)(out + i), _mm_unpacklo_epi16(zero, v));
        _mm_storeu_si128((__m128i *)(void *)(out + i + 4), _mm_unpackhi_epi16(zero, v));
    }
#endif
    for (; i < n; i++)
        out[i] = mmoe_bf16_to_f32(h[i]);
}
