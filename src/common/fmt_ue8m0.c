/**
 * @file fmt_ue8m0.c
 * @brief E8M0 / UE8M0 scale bytes: decoding, the ways libraries round a scale to a power
 *        of two, the block-scale rules of DeepGEMM, DeepSeek-V4, the SM100 kernel and SM90,
 *        and the packing of four scale bytes into an int32 word.
 *
 * ## The format
 *
 * A UE8M0 byte is an exponent only: 8 bits, no sign, no mantissa, bias 127.
 * Byte e stands for 2^(e-127), e in [0, 254], i.e. 2^-127 ... 2^127; 0xFF is NaN;
 * there is no zero.  It is exactly the exponent field of an fp32, so for e >= 1 the
 * fp32 with bits `e << 23` *is* the scale; e = 0 is the fp32 subnormal 0x00400000.
 * ("E8M0" in the OCP MX spec, "UE8M0" in DeepGEMM, `float8_e8m0fnu` in PyTorch.)
 *
 * ## Rounding a scale to a power of two (@ref spec_fmt_ue8m0)
 *
 * | function | rule | used by | 1.0625 | 1.5 | 0 | 2^-128 | -448 | +Inf | NaN |
 * |---|---|---|---|---|---|---|---|---|---|
 * | mmoe_ue8m0_from_f32_ceil()         | smallest 2^k >= abs(s) | CUDA cudaRoundPosInf satfinite | 80 | 80 | 00 | 00 | 88 | fe | ff |
 * | mmoe_ue8m0_from_f32_ceil_clamped() | exp + (mant != 0), clamp [1,254] | DeepGEMM `ceil_to_ue8m0` | 80 | 80 | 01 | 01 | 88 | fe | fe |
 * | mmoe_ue8m0_ceil_bits()             | exp + (mant != 0), no clamp | SM100 requant epilogue | 128 | 128 | 0 | 1 | 136 | 255 | 256 |
 * | mmoe_ue8m0_from_f32_floor()        | largest 2^k <= abs(s) | OCP, CUDA cudaRoundZero | 7f | 7f | 00 | 00 | 87 | fe | ff |
 * | mmoe_ue8m0_from_f32_trunc()        | bits >> 23 | DeepGEMM FP32 -> packed UE8M0 | 7f | 7f | 00 | 00 | 87 | ff | ff |
 *
 * The bit formula `exp + (mant != 0)` is a true ceiling for normal fp32 values only:
 * for a subnormal s <= 2^-127 it gives 2^-126 where the ceiling is 2^-127.  That never
 * matters for DeepGEMM (the 1e-4 amax clamp keeps s near 2^-22), but it is the SM100
 * kernel's formula, so it is kept as its own function.  PyTorch's
 * `.to(float8_e8m0fnu)` rounds to nearest (1.5 -> 2) and is *not* a ceiling: never use it
 * to make UE8M0 scales.
 *
 * ## Block-scale rules
 *
 * - **DeepGEMM caller side** (`per_token_cast_to_fp8`, `per_token_cast_to_fp4`):
 *   `sf = ceil_clamped(fl(max(amax, 1e-4) / fmt_max))`.
 * - **DeepSeek-V4 `act_quant`**: `ceil_clamped(fl(max(amax, 1e-4) * fl(1/fmt_max)))`.
 *   Verified exhaustively by the spec's authors to equal the DeepGEMM rule for every
 *   normal amax; the tests re-check it on random and boundary values.
 * - **DeepSeek-V4 `fp4_act_quant`**: amax clamped to >= 6 * 2^-126, then as above
 *   with fmt_max = 6.
 * - **SM100 in-kernel requant** (`get_e4m3_sf_and_sf_inv`): `s = fl(amax * fl(1/448))`
 *   with fl(1/448) = 0x3B124925, byte = ceil_bits(s), no clamps at all: amax 0 gives
 *   byte 0 and sf_inv = 2^127, so the block quantizes to zeros.  sf_inv = 2^(127-e) is
 *   built from bits, never by a division.
 * - **SM90**: an FP32 scale `sf = fl(max(amax, 1e-4) / 448)`, no power of two; the
 *   elements are then multiplied by `fl(1/sf)`.
 * - **OCP MX shared exponent** (`mmoe_ue8m0_mx_shared_exp`): floor(log2(amax)) - emax_elem,
 *   which can clip the top of a block (amax 7 -> X = 1 -> 7 saturates to 6 in FP4).
 *
 * ## Packing
 *
 * DeepGEMM's "packed UE8M0" puts four consecutive K-groups into one int32,
 * little-endian: group 4j+b is byte b of word j.  Words are built with shifts, so the
 * result does not depend on the host's byte order.
 */
#include <math.h>

#include "fmt_minifloat.h"
#include "mmoe_formats.h"

enum { UE8M0_NAN = 0xFF, UE8M0_MAX = 0xFE };

float mmoe_ue8m0_to_f32(uint8_t b)
{
    return fmt_ue8m0_to_f32(b);
}

int mmoe_ue8m0_ceil_bits(float s)
{
    uint32_t ua = fmt_f32_bits(s) & 0x7FFFFFFFu;
    return (int)(ua >> 23) + ((ua & 0x7FFFFFu) != 0);
}

uint8_t mmoe_ue8m0_from_f32_ceil_clamped(float s)
{
    int e = mmoe_ue8m0_ceil_bits(s);
    if (e < 1)
        e = 1;
    if (e > 254)
        e = 254;
    return (uint8_t)e;
}

uint8_t mmoe_ue8m0_from_f32_ceil(float s)
{
    uint32_t ua = fmt_f32_bits(s) & 0x7FFFFFFFu;
    if (ua > 0x7F800000u)
        return UE8M0_NAN;
    if (ua <= 0x00400000u)
        return 0; /* 0 and (0, 2^-127]: the smallest scale 2^-127 */
    if (ua < 0x00800000u)
        return 1; /* subnormals in (2^-127, 2^-126) */
    int e = mmoe_ue8m0_ceil_bits(s);
    return (uint8_t)(e > UE8M0_MAX ? UE8M0_MAX : e); /* > 2^127 and Inf saturate */
}

uint8_t mmoe_ue8m0_from_f32_floor(float s)
{
    uint32_t ua = fmt_f32_bits(s) & 0x7FFFFFFFu;
    if (ua > 0x7F800000u)
        return UE8M0_NAN;
    uint32_t e = ua >> 23; /* 0 for zero and every subnormal (all < 2^-126) */
    return (uint8_t)(e > UE8M0_MAX ? UE8M0_MAX : e);
}

uint8_t mmoe_ue8m0_from_f32_trunc(float s)
{
    return (uint8_t)((fmt_f32_bits(s) >> 23) & 0xFFu);
}

uint8_t mmoe_ue8m0_mx_shared_exp(float amax, int emax_elem)
{
    uint32_t ua = fmt_f32_bits(amax) & 0x7FFFFFFFu;
    if (ua > 0x7F800000u)
        return UE8M0_NAN;
    int e = (int)(ua >> 23); /* biased floor(log2(amax)); 0 for zero/subnormal */
    if (e == 0)
        return 0;
    e -= emax_elem;
    if (e < 0)
        e = 0;
    if (e > UE8M0_MAX)
        e = UE8M0_MAX;
    return (uint8_t)e;
}

/** max(amax, floor) as torch.clamp(min=) does it: NaN stays NaN. */
static float clamp_amax(float amax, float floor_value)
{
    return amax < floor_value ? floor_value : amax;
}

uint8_t mmoe_sf_ue8m0_deepgemm(float amax, float fmt_max)
{
    return mmoe_ue8m0_from_f32_ceil_clamped(clamp_amax(amax, MMOE_AMAX_EPS) / fmt_max);
}

uint8_t mmoe_sf_ue8m0_v4(float amax, float fmt_max)
{
    float rcp = 1.0f / fmt_max;
    return mmoe_ue8m0_from_f32_ceil_clamped(clamp_amax(amax, MMOE_AMAX_EPS) * rcp);
}

uint8_t mmoe_sf_ue8m0_v4_fp4(float amax)
{
    float rcp = 1.0f / MMOE_FP4_E2M1_MAX;
    return mmoe_ue8m0_from_f32_ceil_clamped(clamp_amax(amax, 0x1.8p-124f /* 6 * 2^-126 */) * rcp);
}

uint8_t mmoe_sf_ue8m0_sm100_requant(float amax, float *sf_inv)
{
    float s = amax * fmt_f32_from_bits(MMOE_RCP_448_BITS);
    int e = mmoe_ue8m0_ceil_bits(s);
    if (e > UE8M0_MAX) { /* Inf or NaN amax: no finite scale */
        if (sf_inv)
            *sf_inv = NAN;
        return UE8M0_NAN;
    }
    if (sf_inv) {
        /* 2^-(e-127) = 2^(127-e): biased exponent 254 - e; e = 254 would need 2^-127 */
        uint32_t inv_field = (uint32_t)(254 - e);
        *sf_inv = inv_field ? fmt_f32_from_bits(inv_field << 23) : fmt_f32_from_bits(0x00400000u);
    }
    return (uint8_t)e;
}

float mmoe_sf_f32_sm90(float amax)
{
    return clamp_amax(amax, MMOE_AMAX_EPS) / MMOE_FP8_E4M3_MAX;
}

void mmoe_ue8m0_pack_words(const uint8_t *bytes, size_t n, int32_t *words)
{
    size_t nwords = (n + 3) / 4;
    for (size_t j = 0; j < nwords; j++) {
        uint32_t w = 0;
        for (size_t b = 0; b < 4 && 4 * j + b < n; b++)
            w |= (uint32_t)bytes[4 * j + b] << (8 * b);
        memcpy(&words[j], &w, sizeof w);
    }
}

void mmoe_ue8m0_unpack_words(const int32_t *words, size_t n, uint8_t *bytes)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, &words[i / 4], sizeof w);
        bytes[i] = (uint8_t)(w >> (8 * (i % 4)));
    }
}
