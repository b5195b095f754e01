/**
 * @file moe_naive.c
 * @brief The MoE layer as plain loops, one token at a time: the recipe table of the
 *        specification, read literally.
 *
 * This file is the short version of the layer, written to be read next to
 * @ref spec_moe_recipes.  It computes exactly what the oracle (moe_layer.c and the chapters
 * it calls) computes, with none of the oracle's machinery: no dequantized weight tiles, no
 * vector registers, no grouping of tokens by expert, no worker threads.  Each weight is
 * decoded where it is used, every GEMM output is one call of moe_naive_dot(), and every
 * rounding point is a visible function call, labelled with its row of the recipe table
 * (R1 to R9).  It is slow (one fused multiply-add per weight per token) and is used only by
 * the tests (`tests/test_moe_naive.c` compares the oracle with it bit for bit) and by the
 * walkthrough of the manual (@ref walkthrough_moe).
 *
 * The order of the GEMM sums is the one @ref spec_moe_gemm_order defines (eight FP32 lanes of
 * fused multiply-adds, k ascending, then a fixed combine); moe_naive_dot() is that definition as
 * a plain loop, written independently of the oracle's moe_dot.c.
 */
#include "moe_naive.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_minifloat.h"
#include "mmoe_formats.h"
#include "mmoe_log1p.h"

/* ------------------------------------------------------------------ reading weights */

/** The UE8M0 or F32 scale at flat index @p i of a scale tensor, as a real number. */
static float scale_at(const mmoe_tensor *sf, int64_t i)
{
    if (sf->dtype == MMOE_DT_F32)
        return ((const float *)sf->data)[i];
    return fmt_ue8m0_to_f32(((const uint8_t *)sf->data)[i]);
}

float moe_naive_weight(const mmoe_tensor *w, const mmoe_tensor *sf, int64_t block, int64_t r, int64_t c)
{
    const int64_t cols = w->dtype == MMOE_DT_I8 || w->dtype == MMOE_DT_U8 ? 2 * w->shape[1] : w->shape[1];
    switch (w->dtype) {
    case MMOE_DT_I8:
    case MMOE_DT_U8: { /* FP4 pair bytes, one UE8M0 scale per 1 x 32 */
        const uint8_t byte = ((const uint8_t *)w->data)[r * (cols / 2) + c / 2];
        const uint8_t code = c % 2 == 0 ? byte & 0x0F : byte >> 4; /* element 2j low, 2j+1 high */
        return mmoe_fp4_e2m1_to_f32(code) * scale_at(sf, r * (cols / 32) + c / 32);
    }
    case MMOE_DT_F8_E4M3: { /* E4M3 bytes, one scale per block x block */
        const uint8_t byte = ((const uint8_t *)w->data)[r * cols + c];
        const int64_t sf_cols = (cols + block - 1) / block;
        return mmoe_fp8_e4m3_to_f32(byte) * scale_at(sf, (r / block) * sf_cols + c / block);
    }
    case MMOE_DT_BF16:
        return fmt_bf16_to_f32(((const uint16_t *)w->data)[r * cols + c]);
    default:
        return NAN;
    }
}

/* ------------------------------------------------------------------ the dot product */

/** Partial sums ("lanes") of the dot product of @ref spec_moe_gemm_order. */
#define NAIVE_DOT_LANES 8

/* [naive dot] */
/* The definition of @ref spec_moe_gemm_order: lane k mod 8 takes the products in ascending k,
 * one fused multiply-add (fmaf, one rounding) each; the eight lanes, all starting at +0, are
 * then added in one fixed tree. */
float moe_naive_dot(const float *a, const mmoe_tensor *w, const mmoe_tensor *sf, int64_t block, int64_t row,
                    int64_t n)
{
    float p[NAIVE_DOT_LANES] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t k = 0; k < n; k++)
        p[k % NAIVE_DOT_LANES] = fmaf(a[k], moe_naive_weight(w, sf, block, row, k), p[k % NAIVE_DOT_LANES]);
    return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}
/* [naive dot] */

/* ------------------------------------------------------------------ the router */

/** \f$\sqrt{\mathrm{softplus}(z)}\f$ with torch's threshold: softplus(z) = z above 20. */
static float sqrt_softplus(float z)
{
    return sqrtf(z > 20.0f ? z : mmoe_log1pf(expf(z)));
}

/* [naive router] */
void moe_naive_route(const mmoe_moe_desc *d, const mmoe_moe_weights *w, const float *x, int32_t token_id,
                     float *scores, int64_t *idx, float *wts)
{
    for (int64_t e = 0; e < d->n_experts; e++) /* z_e = x . G_e (BF16 gate, no scale) */
        scores[e] = sqrt_softplus(moe_naive_dot(x, &w->gate, NULL, 0, e, d->hidden));
    for (int j = 0; j < d->topk; j++) {
        if (d->routing == MMOE_ROUTING_HASH) { /* ids from the table */
            const int64_t at = (int64_t)token_id * d->topk + j;
            idx[j] = w->tid2eid.dtype == MMOE_DT_I64 ? ((const int64_t *)w->tid2eid.data)[at]
                                                     : ((const int32_t *)w->tid2eid.data)[at];
            continue;
        }
        int64_t best = -1; /* the largest s + bias not chosen yet; ties: the lower id */
        float best_sel = 0.0f;
        for (int64_t e = 0; e < d->n_experts; e++) {
            int taken = 0;
            for (int p = 0; p < j; p++)
                taken |= idx[p] == e;
            const float bias = w->gate_bias.data != NULL ? ((const float *)w->gate_bias.data)[e] : 0.0f;
            const float sel = scores[e] + bias;
            if (!taken && (best < 0 || sel > best_sel || (isnan(best_sel) && !isnan(sel)))) {
                best = e;
                best_sel = sel;
            }
        }
        idx[j] = best;
    }
    float sum = 0.0f; /* renormalize in slot order, then scale */
    for (int j = 0; j < d->topk; j++)
        sum += scores[idx[j]];
    for (int j = 0; j < d->topk; j++)
        wts[j] = (scores[idx[j]] / sum) * d->routed_scaling_factor;
}
/* [naive router] */

/* ------------------------------------------------------------------ quantization (R1, R7) */

/** The largest |x_i| of a group; NaN if the group holds one. */
static float group_amax(const float *x, int64_t n)
{
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]))
            return NAN;
        if (fabsf(x[i]) > amax)
            amax = fabsf(x[i]);
    }
    return amax;
}

/* [naive quantize] */
void moe_naive_quantize(moe_naive_quant rule, const float *x, int64_t n, float *out)
{
    const int64_t group = rule == MOE_NAIVE_Q_SM100_X || rule == MOE_NAIVE_Q_SM100_REQUANT ? 32 : 128;
    for (int64_t g0 = 0; g0 < n; g0 += group) {
        const float amax = group_amax(x + g0, group);
        for (int64_t i = g0; i < g0 + group; i++) {
            float s, sf_inv;
            switch (rule) {
            case MOE_NAIVE_Q_SM100_X: /* ceil_bits(max(amax,1e-4)/448) in [1,254]; e4m3(x * (1/s)) */
                s = fmt_ue8m0_to_f32(mmoe_sf_ue8m0_deepgemm(amax, 448.0f));
                out[i] = mmoe_fp8_e4m3_to_f32(mmoe_fp8_e4m3_from_f32(x[i] * (1.0f / s))) * s;
                break;
            case MOE_NAIVE_Q_SM100_REQUANT: /* ceil_bits(amax * fl(1/448)), no clamps; e4m3(x * s^-1) */
                s = fmt_ue8m0_to_f32(mmoe_sf_ue8m0_sm100_requant(amax, &sf_inv));
                out[i] = mmoe_fp8_e4m3_to_f32(mmoe_fp8_e4m3_from_f32(x[i] * sf_inv)) * s;
                break;
            case MOE_NAIVE_Q_SM90: /* s = fl(max(amax,1e-4)/448) in FP32; e4m3(x * fl(1/s)); fl(q * s) */
                s = mmoe_sf_f32_sm90(amax);
                out[i] = mmoe_fp8_e4m3_to_f32(mmoe_fp8_e4m3_from_f32(x[i] * (1.0f / s))) * s;
                break;
            case MOE_NAIVE_Q_V4: /* ceil_bits(max(amax,1e-4) * fl(1/448)) in [1,254]; e4m3(clamp(x/s)) */
                s = fmt_ue8m0_to_f32(mmoe_sf_ue8m0_v4(amax, 448.0f));
                float v = x[i] / s;
                v = v > 448.0f ? 448.0f : v < -448.0f ? -448.0f : v;
                out[i] = mmoe_fp8_e4m3_to_f32(mmoe_fp8_e4m3_from_f32(v)) * s;
                break;
            case MOE_NAIVE_Q_NONE: /* BF16 weights: the activation stays as it is */
                out[i] = x[i];
                break;
            }
        }
    }
}
/* [naive quantize] */

/* ------------------------------------------------------------------ one expert (R2 to R8) */

/** The quantizer of x (R1) and of the intermediate (R7) of a recipe. */
static void recipe_quantizers(mmoe_moe_recipe recipe, moe_naive_quant *qx, moe_naive_quant *qa)
{
    switch (recipe) {
    case MMOE_RECIPE_SM100:
        *qx = MOE_NAIVE_Q_SM100_X;
        *qa = MOE_NAIVE_Q_SM100_REQUANT;
        return;
    case MMOE_RECIPE_SM90:
        *qx = *qa = MOE_NAIVE_Q_SM90;
        return;
    default:
        *qx = *qa = MOE_NAIVE_Q_V4;
        return;
    }
}

/* [naive swiglu] */
float moe_naive_swiglu(mmoe_moe_recipe recipe, mmoe_moe_math math, float limit, float g_acc, float u_acc,
                       float w)
{
    float g = mmoe_bf16_round(g_acc); /* R3 */
    float u = mmoe_bf16_round(u_acc);
    if (limit > 0.0f && !isinf(limit)) { /* R4: kernels clamp against bf16(c), the reference against c */
        const float c = recipe == MMOE_RECIPE_DSV4_REF ? limit : mmoe_bf16_round(limit);
        g = g > c ? c : g;
        u = u > c ? c : u < -c ? -c : u;
    }
    const float e = math == MMOE_MATH_FAST ? exp2f(-g * 1.44269502f) : expf(-g);
    float silu;
    if (recipe == MMOE_RECIPE_DSV4_REF) /* R5: one division (torch's F.silu) */
        silu = g / (1.0f + e);
    else /* R5: a reciprocal, then a product (the kernels) */
        silu = g * (1.0f / (1.0f + e));
    float a = (silu * u) * w; /* R6: the routing weight before the requant */
    if (recipe == MMOE_RECIPE_DSV4_REF)
        a = mmoe_bf16_round(a);
    return a;
}
/* [naive swiglu] */

/* [naive expert] */
void moe_naive_expert(const mmoe_moe_expert_weights *ew, int64_t width, int64_t block, int64_t hidden,
                      mmoe_moe_recipe recipe, mmoe_moe_math math, float limit, const float *xq, float w,
                      moe_naive_scratch *s, uint16_t *y)
{
    moe_naive_quant qx, qa;
    recipe_quantizers(recipe, &qx, &qa);
    if (ew->w1.dtype == MMOE_DT_BF16)
        qa = MOE_NAIVE_Q_NONE;
    for (int64_t i = 0; i < width; i++) { /* R2: L1, one dot product per output */
        s->g[i] = moe_naive_dot(xq, &ew->w1, &ew->w1_scale, block, i, hidden);
        s->u[i] = moe_naive_dot(xq, &ew->w3, &ew->w3_scale, block, i, hidden);
        s->a[i] = moe_naive_swiglu(recipe, math, limit, s->g[i], s->u[i], w); /* R3 to R6 */
    }
    moe_naive_quantize(qa, s->a, width, s->aq); /* R7 */
    for (int64_t n = 0; n < hidden; n++) /* R8: L2, the same dot product, then one BF16 rounding */
        y[n] = mmoe_bf16_from_f32(moe_naive_dot(s->aq, &ew->w2, &ew->w2_scale, block, n, width));
}
/* [naive expert] */

/* ------------------------------------------------------------------ the combine (R9) */

/* [naive combine] */
void moe_naive_combine(mmoe_moe_recipe recipe, int topk, const int64_t *idx, const uint16_t *slot_y,
                       const uint16_t *shared_y, int64_t hidden, uint16_t *y)
{
    int order[MMOE_MOE_MAX_TOPK], n = 0;
    for (int j = 0; j < topk; j++) /* unmasked slots in slot order */
        if (idx[j] >= 0)
            order[n++] = j;
    if (recipe == MMOE_RECIPE_DSV4_REF) /* the reference: ascending expert id, equal ids in slot order */
        for (int a = 1; a < n; a++)
            for (int b = a; b > 0 && idx[order[b - 1]] > idx[order[b]]; b--) {
                const int t = order[b];
                order[b] = order[b - 1];
                order[b - 1] = t;
            }
    for (int64_t c = 0; c < hidden; c++) {
        float acc = 0.0f;
        for (int v = 0; v < n; v++)
            acc += fmt_bf16_to_f32(slot_y[(int64_t)order[v] * hidden + c]);
        if (shared_y != NULL) /* the shared expert last */
            acc += fmt_bf16_to_f32(shared_y[c]);
        y[c] = mmoe_bf16_from_f32(acc);
    }
}
/* [naive combine] */

/* ------------------------------------------------------------------ the layer */

void moe_naive_scratch_free(moe_naive_scratch *s)
{
    free(s->x);
    free(s->xq);
    free(s->xs);
    free(s->scores);
    free(s->g);
    free(s->u);
    free(s->a);
    free(s->aq);
    free(s->slot_y);
    free(s->shared_y);
    memset(s, 0, sizeof *s);
}

/** Allocate the scratch of one token of a layer described by @p d. */
static mmoe_status scratch_alloc(const mmoe_moe_desc *d, moe_naive_scratch *s, mmoe_error *err)
{
    const int64_t width = d->inter > d->n_shared * d->shared_inter ? d->inter : d->n_shared * d->shared_inter;
    const size_t nd = (size_t)d->hidden, nw = (size_t)width;
    memset(s, 0, sizeof *s);
    s->x = malloc(nd * sizeof(float));
    s->xq = malloc(nd * sizeof(float));
    s->xs = malloc(nd * sizeof(float));
    s->scores = malloc((size_t)d->n_experts * sizeof(float));
    s->g = malloc(nw * sizeof(float));
    s->u = malloc(nw * sizeof(float));
    s->a = malloc(nw * sizeof(float));
    s->aq = malloc(nw * sizeof(float));
    s->slot_y = malloc((size_t)d->topk * nd * sizeof(uint16_t));
    s->shared_y = malloc(nd * sizeof(uint16_t));
    if (!s->x || !s->xq || !s->xs || !s->scores || !s->g || !s->u || !s->a || !s->aq || !s->slot_y || !s->shared_y) {
        moe_naive_scratch_free(s);
        return mmoe_error_set(err, MMOE_ENOMEM, "moe naive: out of memory for one token (D %lld, width %lld)",
                              (long long)d->hidden, (long long)width);
    }
    return MMOE_OK;
}

/* [naive token] */
/** One token: route (unless @p given), quantize, every slot's expert, the shared expert, combine. */
static void naive_token(const mmoe_moe_desc *d, const mmoe_moe_weights *w, mmoe_moe_path shared_path,
                        const uint16_t *x_bf16, int32_t token_id, int64_t *idx, float *wts, int given,
                        moe_naive_scratch *s, uint16_t *y)
{
    moe_naive_quant qx, qa;
    recipe_quantizers(d->recipe, &qx, &qa);
    for (int64_t k = 0; k < d->hidden; k++)
        s->x[k] = fmt_bf16_to_f32(x_bf16[k]);
    if (!given) /* 1. route */
        moe_naive_route(d, w, s->x, token_id, s->scores, idx, wts);
    moe_naive_quantize(qx, s->x, d->hidden, s->xq); /* 2. R1 */
    for (int j = 0; j < d->topk; j++) /* 3. each unmasked slot: L1, SwiGLU, requant, L2 */
        if (idx[j] >= 0)
            moe_naive_expert(&w->experts[idx[j]], d->inter, 32, d->hidden, d->recipe, d->math, d->swiglu_limit,
                             s->xq, wts[j], s, s->slot_y + (int64_t)j * d->hidden);
    const int64_t ws = (int64_t)d->n_shared * d->shared_inter;
    if (shared_path == MMOE_PATH_FUSED) /* 4. the shared expert: the recipe's own formats, weight 1 */
        moe_naive_expert(&w->shared, ws, d->shared_block, d->hidden, d->recipe, d->math, d->swiglu_limit, s->xq,
                         1.0f, s, s->shared_y);
    if (shared_path == MMOE_PATH_SERIAL) { /* ... or DeepSeek's FP8 linear: the dsv4-ref column */
        moe_naive_quantize(w->shared.w1.dtype == MMOE_DT_BF16 ? MOE_NAIVE_Q_NONE : MOE_NAIVE_Q_V4, s->x, d->hidden,
                           s->xs);
        moe_naive_expert(&w->shared, ws, d->shared_block, d->hidden, MMOE_RECIPE_DSV4_REF, d->math, d->swiglu_limit,
                         s->xs, 1.0f, s, s->shared_y);
    }
    moe_naive_combine(d->recipe, d->topk, idx, s->slot_y, /* 5. R9 */
                      shared_path != MMOE_PATH_NONE ? s->shared_y : NULL, d->hidden, y);
}
/* [naive token] */

mmoe_status moe_naive_layer(const mmoe_moe_desc *d, const mmoe_moe_weights *w, mmoe_moe_path shared_path,
                            const mmoe_moe_input *in, const mmoe_moe_output *out, mmoe_error *err)
{
    if (d->topk > MMOE_MOE_MAX_TOPK)
        return mmoe_error_set(err, MMOE_EINVAL, "moe naive: topk %d > %d", d->topk, MMOE_MOE_MAX_TOPK);
    moe_naive_scratch s;
    mmoe_status st = scratch_alloc(d, &s, err);
    if (st != MMOE_OK)
        return st;
    int64_t idx[MMOE_MOE_MAX_TOPK];
    float wts[MMOE_MOE_MAX_TOPK];
    const int given = in->topk_idx != NULL;
    for (int64_t t = 0; t < in->n_tokens; t++) {
        if (given) {
            memcpy(idx, in->topk_idx + t * d->topk, (size_t)d->topk * sizeof *idx);
            memcpy(wts, in->topk_weights + t * d->topk, (size_t)d->topk * sizeof *wts);
        }
        naive_token(d, w, shared_path, in->x + t * d->hidden, in->token_ids != NULL ? in->token_ids[t] : 0, idx, wts,
                    given, &s, out->y + t * d->hidden);
        if (out->topk_idx != NULL)
            memcpy(out->topk_idx + t * d->topk, idx, (size_t)d->topk * sizeof *idx);
        if (out->topk_weights != NULL)
            memcpy(out->topk_weights + t * d->topk, wts, (size_t)d->topk * sizeof *wts);
    }
    moe_naive_scratch_free(&s);
    return MMOE_OK;
}
