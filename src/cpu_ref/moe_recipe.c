/**
 * @file moe_recipe.c
 * @brief The recipes: every rounding point of each way of computing the layer, as data.
 *
 * A recipe answers, for each intermediate value of the layer, "in which format is it held,
 * and how is it rounded into that format?".  The answers are the table
 * @ref spec_moe_recipes (rows R1 to R9, one column per recipe); this file holds the same
 * table as data, one ::moe_rules per recipe, which the chapters of a call read:
 *
 * | field of ::moe_rules           | row    | read by          |
 * |--------------------------------|--------|------------------|
 * | x_quant                        | R1     | moe_act_quant.c  |
 * | routed.clamp_in_bf16           | R4     | moe_epilogue.c   |
 * | routed.silu                    | R5     | moe_epilogue.c   |
 * | routed.h_round_bf16            | R6     | moe_epilogue.c   |
 * | routed.requant                 | R7     | moe_act_quant.c  |
 * | combine                        | R9     | moe_combine.c    |
 *
 * R2, R3 and R8 are the same in every recipe (moe_expert_gemm.c, moe_epilogue.c).  The GEMM
 * summation order is not part of a recipe (@ref spec_moe_gemm_order).  The serial shared
 * expert uses the dsv4-ref column with weight 1 whatever the layer's recipe
 * (moe_serial_shared_rules()).
 */
#include "moe_internal.h"

/** The rules of each recipe: the columns of the recipe table. */
static const moe_rules rules_table[MMOE_RECIPE_COUNT] = {
    [MMOE_RECIPE_SM100] = {MMOE_RECIPE_SM100, MOE_Q_UE8M0_32,
                           {1, MOE_SILU_MUL_RCP, 0, MOE_Q_SM100_REQUANT_32}, MOE_COMBINE_SLOT},
    [MMOE_RECIPE_SM90] = {MMOE_RECIPE_SM90, MOE_Q_F32_128,
                          {1, MOE_SILU_MUL_RCP, 0, MOE_Q_F32_128}, MOE_COMBINE_SLOT},
    [MMOE_RECIPE_DSV4_REF] = {MMOE_RECIPE_DSV4_REF, MOE_Q_UE8M0_128,
                              {0, MOE_SILU_DIV, 1, MOE_Q_UE8M0_128}, MOE_COMBINE_EXPERT_ID},
};

/** The serial shared expert: DeepSeek's FP8 linear (dsv4-ref's expert steps). */
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
