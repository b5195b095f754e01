/**
 * @file moe_recipe.c
 * @brief The recipes: every rounding point of each way of computing the layer, as data.
 *
 * A recipe answers, for each intermediate value of the layer, "in which format is it held,
 * and how is it rounded into that format?".  The GEMM accumulation order is *not* part of a
 * recipe: a tensor core sums in an unspecified order, so the oracle defines the GEMM value as
 * the exact sum of exact products, evaluated in FP32 in some order (the tests bound the
 * difference; see docs/moe-oracle.md).  Everything else is deterministic and is reproduced
 * bit for bit.
 *
 * ## sm100 (the SM100 fused kernel, `fp8_fp4_mega_moe`, recipe (1,1,32))
 *  1. x (BF16) -> E4M3 per 1x32 channels; scale UE8M0 = ceil_pow2(max(amax, 1e-4)/448) with the
 *     exponent clamped to [1, 254] (DeepGEMM's caller rule); q = e4m3_rn_sat(x * (1/sf)).
 *  2. L1 = sum_k q_x * sf_x * w_fp4 * sf_w (exact products; FP32 accumulation, order free).
 *  3. g = bf16_rn(L1_gate), u = bf16_rn(L1_up).
 *  4. clamp in BF16 with c = bf16_rn(swiglu_limit): g = min(g, c), u = min(max(u, -c), c).
 *  5. sig = 1 / (1 + expf(-g)) (RN add, IEEE division); gate = g * sig (RN).
 *  6. a = (gate * u) * w (two RN multiplies; w = routing weight, 1.0 for the shared slot).
 *  7. requant per 1x32: s = fl(amax * fl(1/448)); byte = biased_exp(s) + (mantissa(s) != 0),
 *     no clamps (amax 0 -> byte 0, sf_inv 2^127); q = e4m3_rn_sat(a * sf_inv).
 *  8. L2 = sum_k q * sf * w2 * sf_w2 (FP32, order free); y_e = bf16_rn(L2).
 *  9. combine: acc = 0.0f; acc += y_e for the unmasked slots in ascending slot order, then the
 *     shared slot; y = bf16_rn(acc).
 *
 * ## sm90 (the SM90 ports; FP8 activations with continuous FP32 scales)
 *  1. x -> E4M3 per 1x128: sf = fl(max(amax, 1e-4) / 448) (IEEE division), q = e4m3(x * fl(1/sf)).
 *     The tensor core's value of an element is q * sf; the oracle forms fl(q * sf) once (one
 *     more FP32 rounding than a kernel that scales each 128-block partial sum; inside the GEMM bound).
 *  2.-6. as sm100.
 *  7. requant per 1x128 with the same continuous rule (sgl-project/DeepGEMM #63: amax clamped
 *     to 1e-4 before the division).
 *  8.-9. as sm100.
 *  The FP4 weights are dequantized exactly (FP4 x UE8M0 in FP32); how an SM90 kernel turns
 *  them into E4M3 is an open question of the spec (megamoe-layer.md 7.2.1).
 *
 * ## dsv4-ref (DeepSeek-V4's inference code, model.py + kernel.py)
 *  1. x -> E4M3 per 1x128, UE8M0 scale = ceil_pow2(fl(max(amax, 1e-4) * fl(1/448))), [1, 254];
 *     q = e4m3(clamp(x / sf, +-448)).
 *  2. L1 as above (the reference sums FP4 products in 32-blocks: same exact value).
 *  3. g = bf16_rn(L1_gate), u = bf16_rn(L1_up)  (the Linear's BF16 output), widened to FP32.
 *  4. clamp in FP32 with c = swiglu_limit (torch.clamp on the FP32 tensors).
 *  5. silu(g) = g / (1 + expf(-g))   (torch's F.silu: one division).
 *  6. h = (silu(g) * u) * w; then h = bf16_rn(h) (`.to(bfloat16)` before w2).
 *  7. requant per 1x128 with step 1's rule (act_quant).
 *  8. y_e = bf16_rn(L2).
 *  9. combine: an FP32 buffer from zero; y_e added in ascending *expert id* order (the
 *     reference loops over experts), ties (a hash table repeating an expert) in slot order;
 *     then the shared expert's BF16 output; y = bf16_rn(sum).
 *
 * ## The serial shared expert (all recipes)
 * DeepSeek's plain FP8 linear path, i.e. dsv4-ref's steps 1-8 with w = 1, over the shared
 * weights with their checkpoint block scales; its BF16 output joins the combine last, exactly
 * where the fused shared slot would.  For dsv4-ref, fused and serial therefore coincide.
 *
 * ## fast math
 * MMOE_MATH_FAST replaces step 5 by the kernel's structure: e = exp2f(fl(-g * log2(e))) (what
 * `__expf` computes with ex2.approx, here with a correctly rounded exp2f) and sig = fl(1/(1+e))
 * (rcp.approx there, IEEE here).  The hardware's ex2.approx (2 ulp) and rcp.approx (1 ulp)
 * are not emulated: fast mode is not bit-exact with a GPU either, it only shows the size of the
 * effect (a few FP32 ulp of sig, which rarely moves a BF16/E4M3 rounding).
 */
#include "moe_internal.h"

static const moe_rules rules_table[MMOE_RECIPE_COUNT] = {
    [MMOE_RECIPE_SM100] = {MMOE_RECIPE_SM100, MOE_Q_UE8M0_32,
                           {1, MOE_SILU_MUL_RCP, 0, MOE_Q_SM100_REQUANT_32}, MOE_COMBINE_SLOT},
    [MMOE_RECIPE_SM90] = {MMOE_RECIPE_SM90, MOE_Q_F32_128,
                          {1, MOE_SILU_MUL_RCP, 0, MOE_Q_F32_128}, MOE_COMBINE_SLOT},
    [MMOE_RECIPE_DSV4_REF] = {MMOE_RECIPE_DSV4_REF, MOE_Q_UE8M0_128,
                              {0, MOE_SILU_DIV, 1, MOE_Q_UE8M0_128}, MOE_COMBINE_EXPERT_ID},
};

static const moe_rules serial_shared_rules = {MMOE_RECIPE_DSV4_REF, MOE_Q_UE8M0_128,
                                              {0, MOE_SILU_DIV, 1, MOE_Q_UE8M0_128},
                                              MOE_COMBINE_EXPERT_ID};

const moe_rules *moe_recipe_rules(mmoe_moe_recipe recipe)
{
    return (unsigned)recipe < MMOE_RECIPE_COUNT ? &rules_table[recipe] : NULL;
}

const moe_rules *moe_serial_shared_rules(void)
{
    return &serial_shared_rules;
}

int64_t moe_qrule_group(moe_qrule rule)
{
    switch (rule) {
    case MOE_Q_UE8M0_32:
    case MOE_Q_SM100_REQUANT_32:
        return 32;
    case MOE_Q_UE8M0_128:
    case MOE_Q_F32_128:
    case MOE_Q_NONE:
        return 128;
    }
    return 128;
}
