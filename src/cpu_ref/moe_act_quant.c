/**
 * @file moe_act_quant.c
 * @brief FP8 activation quantizers of the recipes, producing the values the tensor core sees.
 *
 * Every FP8 GEMM of the layer multiplies E4M3 codes q by a scale sf that belongs to a group of
 * 32 or 128 consecutive channels of one token.  The oracle does not keep (q, sf) pairs: it
 * keeps the real value q * sf as an FP32 number, because that is the operand the GEMM
 * multiplies.  For the power-of-two scales (UE8M0) the product is exact (a 4-bit significand
 * times 2^e).  For the SM90 continuous FP32 scale the product is rounded once, fl(q * sf).
 *
 * The scale rules are the format library's (mmoe_formats.h, @ref spec_fmt_ue8m0); which rule
 * quantizes what is rows R1 and R7 of @ref spec_moe_recipes (the recipe table).
 *
 * | rule                      | scale rule (mmoe_formats.h)   | used for              |
 * |---------------------------|-------------------------------|-----------------------|
 * | MOE_Q_UE8M0_32            | mmoe_sf_ue8m0_deepgemm()      | sm100 R1              |
 * | MOE_Q_UE8M0_128           | mmoe_sf_ue8m0_v4()            | dsv4-ref R1 and R7    |
 * | MOE_Q_SM100_REQUANT_32    | mmoe_sf_ue8m0_sm100_requant() | sm100 R7              |
 * | MOE_Q_F32_128             | mmoe_sf_f32_sm90()            | sm90 R1 and R7        |
 *
 * MOE_Q_NONE leaves the values alone (a shared expert stored in BF16 runs a plain BF16 linear).
 */
#include "moe_internal.h"

#include <stdlib.h>

#include "fmt_minifloat.h"
#include "mmoe_formats.h"

/* The largest group is 128 channels: one stack buffer of codes per group. */
enum { MOE_QGROUP_MAX = 128 };

/** One row, UE8M0 scale per @p group channels with the format library's @p rule. */
static void quant_row_ue8m0(const float *x, int64_t k, int64_t group, mmoe_sf_rule rule, float *out)
{
    const float *e4m3 = mmoe_fp8_e4m3_table();
    uint8_t q[MOE_QGROUP_MAX];
    uint8_t sf;
    for (int64_t g0 = 0; g0 < k; g0 += group) {
        /* one group at a time so that out may alias x */
        mmoe_quant_row_fp8_ue8m0(x + g0, (size_t)group, (size_t)group, rule, q, &sf, NULL);
        float scale = fmt_ue8m0_to_f32(sf);
        for (int64_t i = 0; i < group; i++)
            out[g0 + i] = e4m3[q[i]] * scale; /* exact: power-of-two scale */
    }
}

/** One row, continuous FP32 scale per 128 channels (SM90). */
static void quant_row_f32_128(const float *x, int64_t k, float *out)
{
    const float *e4m3 = mmoe_fp8_e4m3_table();
    uint8_t q[MOE_QGROUP_MAX];
    float sf;
    for (int64_t g0 = 0; g0 < k; g0 += 128) {
        mmoe_quant_row_fp8_1x128_f32(x + g0, 128, q, &sf, NULL);
        for (int64_t i = 0; i < 128; i++)
            out[g0 + i] = e4m3[q[i]] * sf; /* fl(q * sf): the one extra rounding of sm90 */
    }
}

void moe_act_quant_rows(const float *x, int64_t rows, int64_t k, moe_qrule rule, float *out)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * k;
        float *orow = out + r * k;
        switch (rule) {
        case MOE_Q_UE8M0_32:
            quant_row_ue8m0(xr, k, 32, MMOE_SF_RULE_DEEPGEMM, orow);
            break;
        case MOE_Q_UE8M0_128:
            quant_row_ue8m0(xr, k, 128, MMOE_SF_RULE_V4, orow);
            break;
        case MOE_Q_SM100_REQUANT_32:
            quant_row_ue8m0(xr, k, 32, MMOE_SF_RULE_SM100_REQUANT, orow);
            break;
        case MOE_Q_F32_128:
            quant_row_f32_128(xr, k, orow);
            break;
        case MOE_Q_NONE:
            for (int64_t i = 0; i < k && orow != xr; i++)
                orow[i] = xr[i];
            break;
        }
    }
}
