/**
 * @file moe_combine.c
 * @brief The combine: one token's expert outputs summed in FP32, in a fixed order, stored once
 *        as BF16.
 *
 * Each expert task of a token produced a BF16 row (the L2 output rounded to BF16).  The
 * combine widens each to FP32 and adds it into an accumulator that starts at +0.0f, then
 * stores one BF16 row: row R9 of @ref spec_moe_recipes.  FP32 addition is not associative,
 * so the order is part of the recipe: ascending slot for the fused kernels (their warp
 * ballot visits set bits from the lowest), ascending expert id for DeepSeek's reference (its
 * loop runs over the experts); the shared expert always last.  Masked slots (id -1)
 * contribute nothing; a token with no slot and no shared expert gets bf16(+0) = 0.
 */
#include "moe_internal.h"

#include "fmt_minifloat.h"
#include "mmoe_formats.h"

/** The order in which the slots of a token are visited (insertion sort: topk is small). */
static int slot_order(moe_combine_order order, int topk, const int64_t *idx, int *visit)
{
    int n = 0;
    for (int k = 0; k < topk; k++) {
        if (idx[k] < 0)
            continue;
        int pos = n++;
        if (order == MOE_COMBINE_EXPERT_ID)
            while (pos > 0 && idx[visit[pos - 1]] > idx[k]) {
                visit[pos] = visit[pos - 1];
                pos--;
            }
        visit[pos] = k;
    }
    return n;
}

void moe_combine_token(moe_combine_order order, int topk, const int64_t *idx,
                       const uint16_t *const *slot_y, const uint16_t *shared_y, int64_t d, uint16_t *y)
{
    int visit[MMOE_MOE_MAX_TOPK];
    const int n = slot_order(order, topk, idx, visit);
    for (int64_t j = 0; j < d; j++) {
        float acc = 0.0f;
        for (int v = 0; v < n; v++)
            acc += fmt_bf16_to_f32(slot_y[visit[v]][j]);
        if (shared_y != NULL)
            acc += fmt_bf16_to_f32(shared_y[j]);
        y[j] = mmoe_bf16_from_f32(acc);
    }
}
