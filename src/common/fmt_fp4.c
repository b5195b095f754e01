/**
 * @file fmt_fp4.c
 * @brief FP4 E2M1, the element type of MXFP4: codes, the two rounding conventions the
 *        project meets, and the packing of two codes per byte.
 *
 * ## Codes
 *
 * A code is 4 bits `s ee m` (exponent bias 1, no Inf, no NaN); the sign is bit 3 and
 * bits 2..0 index the magnitudes
 *
 * | code  | 0 | 1   | 2   | 3   | 4   | 5   | 6   | 7   |
 * |-------|---|-----|-----|-----|-----|-----|-----|-----|
 * | value | 0 | 0.5 | 1.0 | 1.5 | 2.0 | 3.0 | 4.0 | 6.0 |
 *
 * `ee = 00` is subnormal (value m * 0.5); otherwise (2 + m) * 2^(ee-2).  Codes 8..15
 * are the negatives, 8 being -0 (decoded here as -0.0f, which compares equal to 0).
 *
 * ## fp32 -> E2M1: two conventions (@ref spec_fmt_e2m1)
 *
 * | input | mmoe_fp4_e2m1_from_f32 (RNE-sat: CUDA, SM100 cvt) | ..._ties_down (DeepGEMM test reference) |
 * |---|---|---|
 * | 0.75 (tie 0.5/1)  | 2 (1.0, even code) | 1 (0.5) |
 * | 1.75 (tie 1.5/2)  | 4 (2.0)            | 3 (1.5) |
 * | 3.5  (tie 3/4)    | 6 (4.0)            | 5 (3.0) |
 * | 5.0  (tie 4/6)    | 6 (4.0)            | 6       |
 * | 7, 100, +Inf      | 7 (saturate to 6)  | 7       |
 * | -0.0, -0.25       | 8 (-0 kept)        | 0 (sign only on non-zero codes) |
 * | NaN               | 7 (+6)             | 0       |
 *
 * The oracle uses RNE with saturation, like the hardware.  The "ties down" variant
 * reproduces DeepGEMM's `_quantize_to_fp4_e2m1`, which counts the strict thresholds
 * 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0 that |x| exceeds; it exists to compare with
 * DeepGEMM fixtures.  (ggml's `best_index_mxfp4` also takes the lower code on a tie.)
 *
 * ## Packing
 *
 * Element 2j goes to the low nibble (bits 0-3) and element 2j+1 to the high nibble of
 * byte j: OCP, PyTorch `float4_e2m1fn_x2`, the DeepSeek-V4 checkpoints and DeepGEMM all
 * agree, and so does CUDA's `__nv_cvt_float2_to_fp4x2` (`.x` low).  ggml's
 * `block_mxfp4` does *not* (byte j holds elements j and j+16).  An asymmetric pair
 * shows the order: (1.0, 6.0) -> 0x72.
 */
#include "fmt_minifloat.h"
#include "mmoe_formats.h"

/** Magnitude of nibble n: subnormal m*0.5, else (2+m) * 2^(ee-2). */
#define E2M1_MAG(n) \
    ((((n) >> 1) & 3) == 0 ? (float)((n) & 1) * 0.5f : (float)(2 + ((n) & 1)) * (float)(1u << (((n) >> 1) & 3)) * 0.25f)
/** Signed value of nibble n (code 8 is -0.0f). */
#define E2M1_VALUE(n) (((n) & 8) ? -(E2M1_MAG((n) & 7)) : (E2M1_MAG((n) & 7)))
/** The two values of packed byte b: low nibble first. */
#define E2M1_PAIR(b) E2M1_VALUE((b) & 15), E2M1_VALUE(((b) >> 4) & 15)

/** Values of both nibbles of every byte, computed by the compiler. */
static const float e2m1_pair_table[512] = {FMT_T256(E2M1_PAIR)};

const float *mmoe_fp4_e2m1_pair_table(void)
{
    return e2m1_pair_table;
}

float mmoe_fp4_e2m1_to_f32(uint8_t code)
{
    return e2m1_pair_table[2 * (code & 15)];
}

enum { E2M1_MBITS = 1, E2M1_BIAS = 1, E2M1_MAX_CODE = 7, E2M1_SIGN = 8 };

uint8_t mmoe_fp4_e2m1_from_f32(float x)
{
    uint32_t u = fmt_f32_bits(x);
    uint32_t ua = u & 0x7FFFFFFFu;
    if (ua > 0x7F800000u)
        return E2M1_MAX_CODE; /* NaN -> +6, as the CUDA conversion does */
    uint32_t sign = (u >> 31) ? E2M1_SIGN : 0u;
    uint32_t code = ua == 0x7F800000u ? E2M1_MAX_CODE : fmt_round_magnitude(ua, E2M1_MBITS, E2M1_BIAS);
    if (code > E2M1_MAX_CODE)
        code = E2M1_MAX_CODE;
    return (uint8_t)(sign | code);
}

uint8_t mmoe_fp4_e2m1_from_f32_ties_down(float x)
{
    float a = x < 0.0f ? -x : x; /* NaN stays NaN: every comparison below is false */
    uint8_t code = (uint8_t)((a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) +
                             (a > 3.5f) + (a > 5.0f));
    if (code != 0 && x < 0.0f)
        code |= E2M1_SIGN;
    return code;
}

uint8_t mmoe_fp4_pack2(uint8_t lo, uint8_t hi)
{
    return (uint8_t)((lo & 15u) | ((hi & 15u) << 4));
}

void mmoe_fp4_pack_row(const uint8_t *codes, size_t k, uint8_t *packed)
{
    size_t pairs = k / 2;
    for (size_t j = 0; j < pairs; j++)
        packed[j] = mmoe_fp4_pack2(codes[2 * j], codes[2 * j + 1]);
    if (k % 2)
        packed[pairs] = mmoe_fp4_pack2(codes[k - 1], 0);
}

void mmoe_fp4_unpack_row(const uint8_t *packed, size_t k, uint8_t *codes)
{
    for (size_t i = 0; i < k; i++) {
        uint8_t byte = packed[i / 2];
        codes[i] = (uint8_t)((i % 2) ? (byte >> 4) : (byte & 15u));
    }
}
