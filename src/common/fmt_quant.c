/**
 * @file fmt_quant.c
 * @brief Block quantization of a row: FP8 with UE8M0 or FP32 scales, MXFP4 with UE8M0
 *        scales, and the fast dequantizers that turn quantized rows back into floats.
 *
 * ## Block quantization in one picture
 *
 *     x[0 .. k)   = | block 0 | block 1 | ... |      block = 32 (MXFP4, SM100 input x)
 *                                                          or 128 (V4 linear inputs, SM90)
 *     per block:  amax = max |x_i|
 *                 sf   = rule(amax)                   (a power of two, or an fp32 on SM90)
 *                 q_i  = cast(x_i * (1/sf))           (E4M3: RNE + SATFINITE; E2M1: see below)
 *     stored:     q[k] codes, sf[k/block] scales;     x_i ~ decode(q_i) * sf
 *
 * The scale rules are the chapter of fmt_ue8m0.c; ::mmoe_sf_rule picks one:
 *
 * | rule | scale | element step | who |
 * |---|---|---|---|
 * | MMOE_SF_RULE_DEEPGEMM | ceil_clamped(max(amax,1e-4)/448) | e4m3(x * (1/sf)) | DeepGEMM `per_token_cast_to_fp8`, SM100 caller side |
 * | MMOE_SF_RULE_SM100_REQUANT | ceil_bits(amax * fl(1/448)), no clamps | e4m3(x * sf_inv) | SM100 L1 epilogue |
 * | MMOE_SF_RULE_V4 | ceil_clamped(max(amax,1e-4) * fl(1/448)) | e4m3(clamp(x / sf, +-448)) | DeepSeek-V4 `act_quant` |
 * | (FP32, 1x128) | fl(max(amax,1e-4)/448) | e4m3(x * fl(1/sf)) | SM90 |
 *
 * For a power-of-two sf, `x / sf` and `x * (1/sf)` are the same number (both exact
 * scalings by a power of two), and a ceiling scale guarantees |x / sf| <= 448, so the
 * clamp and the saturation policy never act on finite inputs.  With the SM90 fp32 scale
 * neither holds: 1/sf is rounded, and the product is rounded again before the cast,
 * which is why the element step is written exactly as the GPU computes it.
 *
 * The amax of a block that holds a NaN is NaN (as `torch.amax` propagates it); the
 * E4M3 cast then writes 0x7F for that element.
 *
 * ## Dequantization
 *
 * Decoding goes through the 256-entry `static const` tables of fmt_fp8.c and fmt_fp4.c:
 * one load per FP8 code, one load per pair of FP4 codes, one multiply per element.  For
 * UE8M0 scales the products are exact (a power of two times a short significand); with
 * fp32 scales they are one fp32 multiplication, rounded to nearest.
 *
 * Every function checks its sizes first and writes nothing when it fails.
 */
#include <math.h>

#include "mmoe_formats.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/** max |x_i| over n values; NaN if any is NaN. */
static float block_amax(const float *x, size_t n)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (isnan(a))
            return a;
        if (a > amax)
            amax = a;
    }
    return amax;
}

/** Validate pointers, block and row length of a row quantizer. */
static mmoe_status check_row(const char *fn, const void *x, const void *q, const void *sf, size_t k,
                             size_t block, mmoe_error *err)
{
    if (!x || !q || !sf)
        return mmoe_error_set(err, MMOE_EINVAL, "%s: NULL input, code or scale pointer", fn);
    if (block == 0)
        return mmoe_error_set(err, MMOE_EINVAL, "%s: block size must be positive, found 0", fn);
    if (k == 0 || k % block != 0)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "%s: row length k=%zu must be a positive multiple of the block size %zu",
                              fn, k, block);
    return MMOE_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Quantizers                                                                                 */
/* ------------------------------------------------------------------------------------------ */

mmoe_status mmoe_quant_row_fp8_ue8m0(const float *x, size_t k, size_t block, mmoe_sf_rule rule,
                                     uint8_t *q, uint8_t *sf, mmoe_error *err)
{
    static const char fn[] = "mmoe_quant_row_fp8_ue8m0";
    mmoe_status st = check_row(fn, x, q, sf, k, block, err);
    if (st != MMOE_OK)
        return st;
    if (rule != MMOE_SF_RULE_DEEPGEMM && rule != MMOE_SF_RULE_SM100_REQUANT && rule != MMOE_SF_RULE_V4)
        return mmoe_error_set(err, MMOE_EINVAL, "%s: unknown scale rule %d", fn, (int)rule);

    for (size_t b = 0; b < k / block; b++) {
        const float *xb = x + b * block;
        uint8_t *qb = q + b * block;
        float amax = block_amax(xb, block);
        if (rule == MMOE_SF_RULE_SM100_REQUANT) {
            float sf_inv;
            sf[b] = mmoe_sf_ue8m0_sm100_requant(amax, &sf_inv);
            for (size_t i = 0; i < block; i++)
                qb[i] = mmoe_fp8_e4m3_from_f32(xb[i] * sf_inv);
        } else if (rule == MMOE_SF_RULE_V4) {
            sf[b] = mmoe_sf_ue8m0_v4(amax, MMOE_FP8_E4M3_MAX);
            float s = mmoe_ue8m0_to_f32(sf[b]);
            for (size_t i = 0; i < block; i++) {
                float v = xb[i] / s;
                v = v > MMOE_FP8_E4M3_MAX ? MMOE_FP8_E4M3_MAX : v < -MMOE_FP8_E4M3_MAX ? -MMOE_FP8_E4M3_MAX : v;
                qb[i] = mmoe_fp8_e4m3_from_f32(v);
            }
        } else {
            sf[b] = mmoe_sf_ue8m0_deepgemm(amax, MMOE_FP8_E4M3_MAX);
            float inv = 1.0f / mmoe_ue8m0_to_f32(sf[b]); /* exact: a power of two */
            for (size_t i = 0; i < block; i++)
                qb[i] = mmoe_fp8_e4m3_from_f32(xb[i] * inv);
        }
    }
    return MMOE_OK;
}

mmoe_status mmoe_quant_row_fp8_1x32_ue8m0(const float *x, size_t k, uint8_t *q, uint8_t *sf,
                                          mmoe_error *err)
{
    return mmoe_quant_row_fp8_ue8m0(x, k, 32, MMOE_SF_RULE_DEEPGEMM, q, sf, err);
}

mmoe_status mmoe_quant_row_fp8_1x128_ue8m0(const float *x, size_t k, uint8_t *q, uint8_t *sf,
                                           mmoe_error *err)
{
    return mmoe_quant_row_fp8_ue8m0(x, k, 128, MMOE_SF_RULE_DEEPGEMM, q, sf, err);
}

mmoe_status mmoe_quant_row_fp8_1x128_f32(const float *x, size_t k, uint8_t *q, float *sf,
                                         mmoe_error *err)
{
    enum { BLOCK = 128 };
    mmoe_status st = check_row("mmoe_quant_row_fp8_1x128_f32", x, q, sf, k, BLOCK, err);
    if (st != MMOE_OK)
        return st;
    for (size_t b = 0; b < k / BLOCK; b++) {
        const float *xb = x + b * BLOCK;
        sf[b] = mmoe_sf_f32_sm90(block_amax(xb, BLOCK));
        float inv = 1.0f / sf[b]; /* fl(1/sf): rounded, as on the GPU */
        for (size_t i = 0; i < BLOCK; i++)
            q[b * BLOCK + i] = mmoe_fp8_e4m3_from_f32(xb[i] * inv);
    }
    return MMOE_OK;
}

mmoe_status mmoe_quant_row_fp4_1x32_ue8m0(const float *x, size_t k, mmoe_fp4_rounding rounding,
                                          uint8_t *packed, uint8_t *sf, mmoe_error *err)
{
    enum { BLOCK = 32 };
    static const char fn[] = "mmoe_quant_row_fp4_1x32_ue8m0";
    mmoe_status st = check_row(fn, x, packed, sf, k, BLOCK, err);
    if (st != MMOE_OK)
        return st;
    if (rounding != MMOE_FP4_RNE && rounding != MMOE_FP4_TIES_DOWN)
        return mmoe_error_set(err, MMOE_EINVAL, "%s: unknown FP4 rounding %d", fn, (int)rounding);
    for (size_t b = 0; b < k / BLOCK; b++) {
        const float *xb = x + b * BLOCK;
        sf[b] = mmoe_sf_ue8m0_deepgemm(block_amax(xb, BLOCK), MMOE_FP4_E2M1_MAX);
        float inv = 1.0f / mmoe_ue8m0_to_f32(sf[b]);
        for (size_t j = 0; j < BLOCK / 2; j++) {
            float lo = xb[2 * j] * inv, hi = xb[2 * j + 1] * inv;
            uint8_t clo = rounding == MMOE_FP4_RNE ? mmoe_fp4_e2m1_from_f32(lo) : mmoe_fp4_e2m1_from_f32_ties_down(lo);
            uint8_t chi = rounding == MMOE_FP4_RNE ? mmoe_fp4_e2m1_from_f32(hi) : mmoe_fp4_e2m1_from_f32_ties_down(hi);
            packed[b * (BLOCK / 2) + j] = mmoe_fp4_pack2(clo, chi);
        }
    }
    return MMOE_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Dequantizers                                                                               */
/* ------------------------------------------------------------------------------------------ */

mmoe_status mmoe_dequant_row_mxfp4(const uint8_t *packed, const uint8_t *sf, size_t k, float *out,
                                   mmoe_error *err)
{
    enum { BLOCK = 32, BYTES = BLOCK / 2 };
    mmoe_status st = check_row("mmoe_dequant_row_mxfp4", packed, out, sf, k, BLOCK, err);
    if (st != MMOE_OK)
        return st;
    const float *pair = mmoe_fp4_e2m1_pair_table();
    for (size_t b = 0; b < k / BLOCK; b++) {
        float s = mmoe_ue8m0_to_f32(sf[b]);
        const uint8_t *pb = packed + b * BYTES;
        float *ob = out + b * BLOCK;
        for (size_t j = 0; j < BYTES; j++) {
            ob[2 * j] = pair[2 * pb[j]] * s;
            ob[2 * j + 1] = pair[2 * pb[j] + 1] * s;
        }
    }
    return MMOE_OK;
}

mmoe_status mmoe_dequant_row_fp8(const uint8_t *q, const void *sf, mmoe_dtype sf_dtype, size_t k,
                                 size_t block, float *out, mmoe_error *err)
{
    static const char fn[] = "mmoe_dequant_row_fp8";
    if (!q || !sf || !out)
        return mmoe_error_set(err, MMOE_EINVAL, "%s: NULL code, scale or output pointer", fn);
    if (block == 0)
        return mmoe_error_set(err, MMOE_EINVAL, "%s: block size must be positive, found 0", fn);
    if (sf_dtype != MMOE_DT_F32 && sf_dtype != MMOE_DT_F8_E8M0)
        return mmoe_error_set(err, MMOE_EDTYPE, "%s: scale dtype must be F32 or F8_E8M0, found %s", fn,
                              mmoe_dtype_name(sf_dtype));
    const float *table = mmoe_fp8_e4m3_table();
    size_t nblocks = (k + block - 1) / block;
    for (size_t b = 0; b < nblocks; b++) {
        float s = sf_dtype == MMOE_DT_F32 ? ((const float *)sf)[b] : mmoe_ue8m0_to_f32(((const uint8_t *)sf)[b]);
        size_t end = (b + 1) * block < k ? (b + 1) * block : k;
        for (size_t i = b * block; i < end; i++)
            out[i] = table[q[i]] * s;
    }
    return MMOE_OK;
}

mmoe_status mmoe_dequant_fp8_weight_row(const uint8_t *w, size_t n, size_t k, size_t row,
                                        const void *sf, mmoe_dtype sf_dtype, size_t block,
                                        float *out, mmoe_error *err)
{
    static const char fn[] = "mmoe_dequant_fp8_weight_row";
    if (!w || !sf)
        return mmoe_error_set(err, MMOE_EINVAL, "%s: NULL weight or scale pointer", fn);
    if (block == 0)
        return mmoe_error_set(err, MMOE_EINVAL, "%s: block size must be positive, found 0", fn);
    if (row >= n)
        return mmoe_error_set(err, MMOE_EINVAL, "%s: row %zu out of range for a weight of %zu rows", fn, row, n);
    size_t sf_cols = (k + block - 1) / block;
    size_t sf_elem = sf_dtype == MMOE_DT_F32 ? sizeof(float) : 1;
    const uint8_t *sf_row = (const uint8_t *)sf + (row / block) * sf_cols * sf_elem;
    return mmoe_dequant_row_fp8(w + row * k, sf_row, sf_dtype, k, block, out, err);
}
