/**
 * @file moe_epilogue.c
 * @brief The L1 epilogue: BF16 rounding, the SwiGLU clamp, silu(g) * u, the routing weight,
 *        and the FP8 requantization that feeds L2.
 *
 * In the fused kernel this is the code between the two GEMMs, run on the FP32 accumulators
 * of L1 while they sit in TMEM/registers.  Per token row and intermediate channel it applies
 * rows R3 to R7 of @ref spec_moe_recipes, in the form the recipe's ::moe_epilogue_rules name:
 * BF16 rounding of both accumulators, the clamp, silu, the up projection and the routing
 * weight (1 for the shared expert), the reference's BF16 rounding of the result, and the
 * requantization of each 32- or 128-channel group.
 *
 * The clamp bounds only the gate from above (a large negative gate makes silu vanish anyway)
 * and the up projection on both sides.  The kernels clamp BF16 values against a BF16 bound;
 * the reference clamps the widened FP32 values against the FP32 bound; for c = 10 (exact in
 * BF16) the two agree.  A NaN passes the clamp unchanged (as torch.clamp does).
 *
 * Putting the routing weight *before* the requantization (instead of scaling y in the
 * combine) is what makes the per-32 scales of a_q track the weighted values; it changes
 * the bits of the result and is part of every recipe.
 */
#include "moe_internal.h"

#include <math.h>

#include "mmoe_formats.h"

/** log2(e) rounded to FP32: the multiplier of __expf's ex2.approx form. */
#define MOE_LOG2E_F 1.44269502f

float moe_swiglu_one(const moe_epilogue_rules *rules, mmoe_moe_math math, float limit, float g_acc,
                     float u_acc, float w)
{
    float g = mmoe_bf16_round(g_acc);
    float u = mmoe_bf16_round(u_acc);
    if (limit > 0.0f && !isinf(limit)) {
        const float c = rules->clamp_in_bf16 ? mmoe_bf16_round(limit) : limit;
        if (g > c)
            g = c;
        if (u > c)
            u = c;
        else if (u < -c)
            u = -c;
    }
    const float e = math == MMOE_MATH_FAST ? exp2f(-g * MOE_LOG2E_F) : expf(-g);
    float gate;
    if (rules->silu == MOE_SILU_MUL_RCP) {
        const float sig = 1.0f / (1.0f + e);
        gate = g * sig;
    } else {
        gate = g / (1.0f + e);
    }
    float a = gate * u;
    a = a * w;
    if (rules->h_round_bf16)
        a = mmoe_bf16_round(a);
    return a;
}

void moe_l1_epilogue(const moe_epilogue_rules *rules, mmoe_moe_math math, float limit, float *gate,
                     const float *up, int64_t m, int64_t n, const float *w)
{
    for (int64_t r = 0; r < m; r++) {
        const float wr = w != NULL ? w[r] : 1.0f;
        float *grow = gate + r * n;
        const float *urow = up + r * n;
        for (int64_t j = 0; j < n; j++)
            grow[j] = moe_swiglu_one(rules, math, limit, grow[j], urow[j], wr);
    }
    moe_act_quant_rows(gate, m, n, rules->requant, gate);
}
