/**
 * @file moe_router.c
 * @brief The router: FP32 logits, sqrtsoftplus scores, biased top-k or hash selection,
 *        renormalized and scaled routing weights.
 *
 * For each token t (@ref spec_moe_router):
 *
 *     z[e]   = x_t . W_g[e]                       FP32 (x and W_g are BF16, widened exactly)
 *     s[e]   = sqrt(softplus(z[e]))               softplus(z) = z > 20 ? z : log1p(exp(z)),
 *                                                 log1p by mmoe_log1pf() (the same bits everywhere)
 *     sel[e] = s[e] + bias[e]                     bias only for the *selection* (noaux_tc)
 *     idx    = top-k of sel, descending; equal values: the lower expert id first
 *              (hash layers: idx = tid2eid[token_id], in the table's order)
 *     w_k    = s[idx_k];  sum = ((0 + w_0) + w_1) + ...;  w_k = (w_k / sum) * routed_scaling_factor
 *
 * The order of idx is the slot order: slot 0 holds the best expert.  The combine of the
 * fused kernels adds the experts in this slot order, so the tie rule is part of the result.
 * The logits are an FP32 GEMM in the fixed order of moe_dot.c (each product of two BF16 values
 * is exact in FP32; the sums run in eight FMA lanes and a fixed combine), so a token's logits
 * depend on that token only, on every CPU; everything after them is deterministic.
 * A NaN score is never preferred to a number.
 */
#include "moe_internal.h"

#include <math.h>
#include <stdlib.h>

#include "mmoe_formats.h"
#include "mmoe_log1p.h"

float moe_sqrtsoftplus(float z)
{
    const float sp = z > 20.0f ? z : mmoe_log1pf(expf(z));
    return sqrtf(sp);
}

void moe_topk_select(const float *sel, int64_t n, int k, int64_t *idx)
{
    for (int s = 0; s < k; s++) {
        int64_t best = -1;
        for (int64_t e = 0; e < n; e++) {
            int taken = 0;
            for (int p = 0; p < s; p++)
                taken |= idx[p] == e;
            if (taken)
                continue;
            /* strictly greater: on a tie the lower id (seen first) stays */
            if (best < 0 || sel[e] > sel[best] || (isnan(sel[best]) && !isnan(sel[e])))
                best = e;
        }
        idx[s] = best;
    }
}

/** Entry [row, k] of the hash table (I32 or I64). */
static int64_t tid2eid_at(const mmoe_tensor *t, int64_t row, int k, int topk)
{
    int64_t i = row * topk + k;
    if (t->dtype == MMOE_DT_I64)
        return ((const int64_t *)t->data)[i];
    return ((const int32_t *)t->data)[i];
}

/** w_k = (s[idx_k] / sum) * scale, sum accumulated in slot order from 0. */
static void renormalize(const float *s, const int64_t *idx, int topk, float scale, float *w)
{
    float sum = 0.0f;
    for (int k = 0; k < topk; k++)
        sum += s[idx[k]];
    for (int k = 0; k < topk; k++)
        w[k] = (s[idx[k]] / sum) * scale;
}

mmoe_status moe_route(const mmoe_moe_desc *desc, const float *x, int64_t t, const uint16_t *gate,
                      const float *bias, const mmoe_tensor *tid2eid, const int32_t *token_ids,
                      int64_t *idx, float *wts, float *logits, mmoe_error *err)
{
    const int64_t e_n = desc->n_experts, d = desc->hidden;
    const int topk = desc->topk;
    if (t == 0)
        return MMOE_OK;
    if (desc->routing == MMOE_ROUTING_HASH) {
        if (token_ids == NULL)
            return mmoe_error_set(err, MMOE_EINVAL, "moe: hash routing needs token_ids (input has none)");
        for (int64_t i = 0; i < t; i++)
            if (token_ids[i] < 0 || token_ids[i] >= tid2eid->shape[0])
                return mmoe_error_set(err, MMOE_EINVAL,
                                      "moe: token_ids[%lld] = %d out of range [0, %lld) of ffn.gate.tid2eid",
                                      (long long)i, token_ids[i], (long long)tid2eid->shape[0]);
    }
    float *gate_f32 = malloc((size_t)e_n * (size_t)d * sizeof(float));
    float *sel = malloc((size_t)e_n * sizeof(float));
    if (gate_f32 == NULL || sel == NULL) {
        free(gate_f32);
        free(sel);
        return mmoe_error_set(err, MMOE_ENOMEM, "moe: router: out of memory for the FP32 gate [%lld, %lld]",
                              (long long)e_n, (long long)d);
    }
    mmoe_bf16_to_f32_row(gate, (size_t)(e_n * d), gate_f32);
    moe_dot_gemm(moe_dot_isa_best(), x, d, t, gate_f32, d, e_n, d, logits, e_n);
    for (int64_t i = 0; i < t; i++) {
        float *s = logits + i * e_n;
        for (int64_t e = 0; e < e_n; e++)
            s[e] = moe_sqrtsoftplus(s[e]);
        int64_t *ti = idx + i * topk;
        if (desc->routing == MMOE_ROUTING_HASH) {
            for (int k = 0; k < topk; k++)
                ti[k] = tid2eid_at(tid2eid, token_ids[i], k, topk);
        } else {
            for (int64_t e = 0; e < e_n; e++)
                sel[e] = s[e] + (bias != NULL ? bias[e] : 0.0f);
            moe_topk_select(sel, e_n, topk, ti);
        }
        renormalize(s, ti, topk, desc->routed_scaling_factor, wts + i * topk);
    }
    free(gate_f32);
    free(sel);
    return MMOE_OK;
}
