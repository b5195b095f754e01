/**
 * @file moe_layer.c
 * @brief The layer object: create, attach weights, run one call, destroy.
 *
 * A call runs the stages of the fused kernel one after another, on the CPU:
 *
 *  1. widen x (BF16) to FP32 (exact);
 *  2. routing: the caller's topk_idx/topk_weights, or the router (moe_router.c);
 *  3. "dispatch": group the unmasked (token, slot) pairs by expert, in ascending token order
 *     (the order inside an expert's pool does not change any result: each row's GEMM is
 *     independent), and count them;
 *  4. quantize x once in the recipe's format (moe_act_quant.c);
 *  5. for every expert that received tokens: gather its tokens' activations, L1 GEMMs, the L1
 *     epilogue with each pair's routing weight, the L2 GEMM, BF16 rounding into the pair's
 *     combine slot;
 *  6. the shared expert, fused (one more slot, recipe format, weight 1) or serial
 *     (moe_shared.c), for all tokens;
 *  7. the combine of each token (moe_combine.c).
 *
 * Memory of a call: the FP32 copy of x, its quantized form, the per-slot BF16 outputs
 * [T * topk, D], and the per-expert GEMM scratch (kept by the layer between calls).
 */
#include "moe_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"

void moe_layer_account(mmoe_moe_layer *layer, long long delta)
{
    if (delta < 0 && (size_t)(-delta) > layer->owned_bytes)
        layer->owned_bytes = 0;
    else
        layer->owned_bytes = (size_t)((long long)layer->owned_bytes + delta);
    if (layer->owned_bytes > layer->owned_peak_bytes)
        layer->owned_peak_bytes = layer->owned_bytes;
}

/** Bytes of @p m the layer reads but does not own. */
static size_t mat_borrowed(const moe_mat *m)
{
    return (m->w_owned == NULL ? m->w_bytes : 0) + (m->sf_owned == NULL ? m->sf_bytes : 0);
}

size_t moe_layer_borrowed_bytes(const mmoe_moe_layer *layer)
{
    if (!layer->has_weights)
        return 0;
    size_t n = layer->gate_bytes;
    for (int64_t e = 0; e < layer->desc.n_experts; e++)
        n += mat_borrowed(&layer->experts[e].w1) + mat_borrowed(&layer->experts[e].w3) +
             mat_borrowed(&layer->experts[e].w2);
    if (layer->desc.n_shared > 0)
        n += mat_borrowed(&layer->shared.w1) + mat_borrowed(&layer->shared.w3) + mat_borrowed(&layer->shared.w2);
    return n;
}

/** Create a layer on @p pool (a reference the layer takes over), or on a new pool of its own (NULL). */
static mmoe_status layer_create_on(const mmoe_moe_desc *desc, moe_dequant_pool *pool, mmoe_moe_layer **out,
                                   mmoe_error *err)
{
    *out = NULL;
    mmoe_status st = mmoe_moe_desc_validate(desc, err);
    if (st != MMOE_OK)
        return st;
    mmoe_moe_layer *layer = calloc(1, sizeof *layer);
    if (layer == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "moe: out of memory for the layer object");
    layer->desc = *desc;
    layer->counters = calloc((size_t)desc->n_experts, sizeof(int64_t));
    if (layer->counters == NULL) {
        free(layer);
        return mmoe_error_set(err, MMOE_ENOMEM, "moe: out of memory for %lld expert counters",
                              (long long)desc->n_experts);
    }
    if (pool != NULL) {
        moe_dequant_pool_retain(pool);
        layer->dequant_pool = pool;
    } else {
        int n_threads = 1;
        st = moe_dequant_threads_from_env(&n_threads, err);
        if (st == MMOE_OK)
            st = moe_dequant_pool_create(n_threads, &layer->dequant_pool, err);
        if (st != MMOE_OK) {
            free(layer->counters);
            free(layer);
            return st;
        }
    }
    layer->scratch.pool = layer->dequant_pool;
    *out = layer;
    return MMOE_OK;
}

mmoe_status mmoe_moe_layer_create(const mmoe_moe_desc *desc, mmoe_moe_layer **out, mmoe_error *err)
{
    return layer_create_on(desc, NULL, out, err);
}

mmoe_status mmoe_moe_layer_create_on_pool(const mmoe_moe_desc *desc, mmoe_moe_pool *pool, mmoe_moe_layer **out,
                                         mmoe_error *err)
{
    if (pool == NULL) {
        *out = NULL;
        return mmoe_error_set(err, MMOE_EINVAL, "moe: mmoe_moe_layer_create_on_pool needs a pool (got NULL)");
    }
    return layer_create_on(desc, pool, out, err);
}

/** Drop every weight view and free every owned weight buffer. */
static void release_weights(mmoe_moe_layer *layer)
{
    moe_shared_release(layer);
    if (layer->experts != NULL)
        for (int64_t e = 0; e < layer->desc.n_experts; e++) {
            moe_mat_release(&layer->experts[e].w1);
            moe_mat_release(&layer->experts[e].w3);
            moe_mat_release(&layer->experts[e].w2);
        }
    free(layer->experts);
    layer->experts = NULL;
    moe_mat_release(&layer->shared.w1);
    moe_mat_release(&layer->shared.w3);
    moe_mat_release(&layer->shared.w2);
    layer->has_weights = 0;
    layer->owned_bytes = 0;
}

void mmoe_moe_layer_destroy(mmoe_moe_layer *layer)
{
    if (layer == NULL)
        return;
    release_weights(layer);
    moe_scratch_free(&layer->scratch);
    moe_dequant_pool_release(layer->dequant_pool);
    free(layer->counters);
    free(layer);
}

mmoe_status mmoe_moe_layer_set_weights(mmoe_moe_layer *layer, const mmoe_moe_weights *w, mmoe_error *err)
{
    const mmoe_moe_desc *d = &layer->desc;
    mmoe_status st = moe_weights_validate(d, w, err);
    if (st != MMOE_OK)
        return st;
    release_weights(layer);
    layer->owned_peak_bytes = 0;
    layer->experts = calloc((size_t)d->n_experts, sizeof *layer->experts);
    if (layer->experts == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "moe: out of memory for %lld experts", (long long)d->n_experts);
    layer->gate = w->gate.data;
    layer->gate_bytes = w->gate.nbytes;
    layer->bias = d->routing == MMOE_ROUTING_BIASED ? w->gate_bias.data : NULL;
    if (layer->bias != NULL)
        layer->gate_bytes += w->gate_bias.nbytes;
    layer->tid2eid = w->tid2eid;
    if (d->routing == MMOE_ROUTING_HASH)
        layer->gate_bytes += w->tid2eid.nbytes;
    for (int64_t e = 0; e < d->n_experts; e++) {
        const mmoe_moe_expert_weights *x = &w->experts[e];
        moe_mat_from_fp4(&layer->experts[e].w1, &x->w1, &x->w1_scale);
        moe_mat_from_fp4(&layer->experts[e].w3, &x->w3, &x->w3_scale);
        moe_mat_from_fp4(&layer->experts[e].w2, &x->w2, &x->w2_scale);
    }
    if (d->n_shared > 0) {
        moe_mat_from_fp8(&layer->shared.w1, &w->shared.w1, &w->shared.w1_scale, d->shared_block);
        moe_mat_from_fp8(&layer->shared.w3, &w->shared.w3, &w->shared.w3_scale, d->shared_block);
        moe_mat_from_fp8(&layer->shared.w2, &w->shared.w2, &w->shared.w2_scale, d->shared_block);
        mmoe_moe_shared_facts_of(&w->shared, d->inter, (int64_t)d->n_shared * d->shared_inter, &layer->shared_facts);
    }
    layer->inter_used = d->inter;
    layer->shared_inter_used = d->shared_inter;
    layer->has_weights = 1;
    st = d->pad_to > 0 ? mmoe_moe_layer_pad(layer, d->pad_to, err) : moe_shared_expand(layer, err);
    if (st != MMOE_OK)
        release_weights(layer);
    return st;
}

const mmoe_moe_desc *mmoe_moe_layer_desc(const mmoe_moe_layer *layer)
{
    return &layer->desc;
}

const int64_t *mmoe_moe_layer_counters(const mmoe_moe_layer *layer)
{
    return layer->counters;
}

void mmoe_moe_layer_memory(const mmoe_moe_layer *layer, mmoe_moe_memory *out)
{
    const moe_scratch *s = &layer->scratch;
    out->borrowed_bytes = moe_layer_borrowed_bytes(layer);
    out->owned_bytes = layer->owned_bytes;
    out->owned_peak_bytes = layer->owned_peak_bytes;
    out->scratch_bytes = (s->tile_cap + s->xg_cap + s->gate_cap + s->up_cap + s->yl2_cap) * sizeof(float);
}

mmoe_moe_path mmoe_moe_layer_shared_plan(const mmoe_moe_layer *layer, mmoe_moe_fallback *fallback, char *reason)
{
    return moe_shared_decide(layer, fallback, reason);
}

void mmoe_moe_result_init(mmoe_moe_result *r)
{
    memset(r, 0, sizeof *r);
    r->backend = "cpu";
}

/** Reset a result at the start of a call, keeping the caller's expert_recv_stats array. */
static void result_reset(mmoe_moe_result *r)
{
    int64_t *stats = r->expert_recv_stats;
    mmoe_moe_result_init(r);
    r->expert_recv_stats = stats;
}

/* ------------------------------------------------------------------ one call */

/** Everything a call allocates, freed together. */
typedef struct call_bufs {
    float *xf;         /**< [T, D] x widened */
    float *xq;         /**< [T, D] x quantized (recipe format), dequantized values */
    float *xs;         /**< [T, D] x quantized for the serial shared expert */
    int64_t *idx;      /**< [T, topk] expert ids */
    float *wts;        /**< [T, topk] routing weights */
    float *logits;     /**< [T, E] router logits / scores */
    uint16_t *slot_y;  /**< [T * topk, D] BF16 expert outputs per slot */
    uint16_t *shared_y;/**< [T, D] BF16 shared expert output */
    int64_t *count;    /**< [E] pairs per expert */
    int64_t *start;    /**< [E + 1] CSR offsets */
    int64_t *fill;     /**< [E] CSR fill pointers */
    int64_t *pair;     /**< [pairs] token * topk + slot, grouped by expert */
    float *pair_w;     /**< [pairs] routing weight of the pair, in the gathered order */
} call_bufs;

/** Free the buffers of a call. */
static void call_free(call_bufs *b)
{
    free(b->xf);
    free(b->xq);
    free(b->xs);
    free(b->idx);
    free(b->wts);
    free(b->logits);
    free(b->slot_y);
    free(b->shared_y);
    free(b->count);
    free(b->start);
    free(b->fill);
    free(b->pair);
    free(b->pair_w);
}

/** malloc(n * size) (at least 1 byte); sets *fail on failure. */
static void *alloc_or_flag(size_t n, size_t size, int *fail)
{
    void *p = malloc(n * size > 0 ? n * size : 1);
    if (p == NULL)
        *fail = 1;
    return p;
}

/** Check a caller's topk_idx / topk_weights (ids in [-1, E), finite weights where unmasked). */
static mmoe_status check_given_routing(const mmoe_moe_layer *layer, const mmoe_moe_input *in, mmoe_error *err)
{
    const int topk = layer->desc.topk;
    if (in->topk_weights == NULL)
        return mmoe_error_set(err, MMOE_EINVAL, "moe: topk_idx given without topk_weights");
    for (int64_t i = 0; i < in->n_tokens * topk; i++) {
        int64_t e = in->topk_idx[i];
        if (e < -1 || e >= layer->desc.n_experts)
            return mmoe_error_set(err, MMOE_EINVAL,
                                  "moe: topk_idx[%lld][%lld] = %lld is not an expert id in [0, %lld) or -1",
                                  (long long)(i / topk), (long long)(i % topk), (long long)e,
                                  (long long)layer->desc.n_experts);
        if (e >= 0 && !isfinite(in->topk_weights[i]))
            return mmoe_error_set(err, MMOE_EINVAL, "moe: topk_weights[%lld][%lld] is not finite",
                                  (long long)(i / topk), (long long)(i % topk));
    }
    return MMOE_OK;
}

/** Group the unmasked pairs by expert (counting sort; ascending token order inside an expert). */
static void dispatch(const mmoe_moe_layer *layer, int64_t t, call_bufs *b)
{
    const int64_t e_n = layer->desc.n_experts;
    const int topk = layer->desc.topk;
    memset(b->count, 0, (size_t)e_n * sizeof(int64_t));
    for (int64_t i = 0; i < t * topk; i++)
        if (b->idx[i] >= 0)
            b->count[b->idx[i]]++;
    b->start[0] = 0;
    for (int64_t e = 0; e < e_n; e++)
        b->start[e + 1] = b->start[e] + b->count[e];
    int64_t *fill = b->fill;
    memcpy(fill, b->start, (size_t)e_n * sizeof(int64_t));
    for (int64_t i = 0; i < t * topk; i++)
        if (b->idx[i] >= 0) {
            int64_t p = fill[b->idx[i]]++;
            b->pair[p] = i;
            b->pair_w[p] = b->wts[i];
        }
}

/** One expert task on m gathered rows: L1, epilogue, L2; the BF16 results go to @p dst rows. */
static int run_expert(mmoe_moe_layer *layer, const moe_mat *w1, const moe_mat *w3, const moe_mat *w2,
                      const moe_epilogue_rules *rules, const float *xg, int64_t m, const float *w,
                      uint16_t *const *dst, moe_gemm_clock *clk, double *epi_s)
{
    moe_scratch *s = &layer->scratch;
    const int64_t d = layer->desc.hidden, n = w1->rows;
    if (moe_scratch_reserve(&s->gate, &s->gate_cap, (size_t)(m * n)) != 0 ||
        moe_scratch_reserve(&s->up, &s->up_cap, (size_t)(m * n)) != 0 ||
        moe_scratch_reserve(&s->yl2, &s->yl2_cap, (size_t)(m * d)) != 0)
        return -1;
    if (moe_expert_gemm(w1, xg, m, s->gate, s, clk) != 0 ||
        moe_expert_gemm(w3, xg, m, s->up, s, clk) != 0)
        return -1;
    double t0 = mmoe_clock_s();
    moe_l1_epilogue(rules, layer->desc.math, layer->desc.swiglu_limit, s->gate, s->up, m, n, w);
    *epi_s += mmoe_clock_s() - t0;
    if (moe_expert_gemm(w2, s->gate, m, s->yl2, s, clk) != 0)
        return -1;
    for (int64_t r = 0; r < m; r++)
        mmoe_bf16_from_f32_row(s->yl2 + r * d, (size_t)d, dst[r]);
    return 0;
}

/** Record a failure in the result (if any) and return it. */
static mmoe_status fail(mmoe_moe_result *r, mmoe_error *err, mmoe_status st)
{
    if (r != NULL) {
        r->status = st;
        if (err != NULL)
            r->error = *err;
    }
    return st;
}

/** The shared expert for all tokens, fused (recipe format) or serial (DeepSeek FP8 linear). */
static mmoe_status run_shared(mmoe_moe_layer *layer, mmoe_moe_path path, const call_bufs *b, int64_t t,
                              moe_gemm_clock *clk, double *epi_s, double *quant_s, mmoe_error *err)
{
    const int64_t d = layer->desc.hidden;
    uint16_t **dst = malloc((size_t)t * sizeof *dst);
    if (dst == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "moe: out of memory (shared rows)");
    for (int64_t i = 0; i < t; i++)
        dst[i] = b->shared_y + i * d;
    int rc;
    if (path == MMOE_PATH_FUSED) {
        const moe_rules *rules = moe_recipe_rules(layer->desc.recipe);
        rc = run_expert(layer, &layer->shared_fused_w1, &layer->shared_fused_w3, &layer->shared_fused_w2,
                        &rules->routed, b->xq, t, NULL, dst, clk, epi_s);
    } else {
        moe_rules serial = *moe_serial_shared_rules();
        if (layer->shared.w1.fmt == MOE_W_BF16) {
            serial.x_quant = MOE_Q_NONE;
            serial.routed.requant = MOE_Q_NONE;
        }
        double t0 = mmoe_clock_s();
        moe_act_quant_rows(b->xf, t, d, serial.x_quant, b->xs);
        *quant_s += mmoe_clock_s() - t0;
        rc = run_expert(layer, &layer->shared.w1, &layer->shared.w3, &layer->shared.w2, &serial.routed, b->xs, t,
                        NULL, dst, clk, epi_s);
    }
    free(dst);
    if (rc != 0)
        return mmoe_error_set(err, MMOE_ENOMEM, "moe: out of memory in the shared expert");
    return MMOE_OK;
}

/** Every routed expert that received tokens: gather, L1, epilogue, L2, into the slots. */
static mmoe_status run_routed(mmoe_moe_layer *layer, call_bufs *b, moe_gemm_clock *clk, double *epi_s,
                              int64_t *active, mmoe_error *err)
{
    const moe_rules *rules = moe_recipe_rules(layer->desc.recipe);
    const int64_t d = layer->desc.hidden;
    moe_scratch *s = &layer->scratch;
    for (int64_t e = 0; e < layer->desc.n_experts; e++) {
        const int64_t m = b->count[e];
        if (m == 0)
            continue; /* no tokens: no weight is touched */
        (*active)++;
        const int64_t *pairs = b->pair + b->start[e];
        if (moe_scratch_reserve(&s->xg, &s->xg_cap, (size_t)(m * d)) != 0)
            return mmoe_error_set(err, MMOE_ENOMEM, "moe: out of memory gathering %lld tokens", (long long)m);
        uint16_t **dst = malloc((size_t)m * sizeof *dst);
        if (dst == NULL)
            return mmoe_error_set(err, MMOE_ENOMEM, "moe: out of memory (slot rows)");
        for (int64_t r = 0; r < m; r++) {
            const int64_t token = pairs[r] / layer->desc.topk;
            memcpy(s->xg + r * d, b->xq + token * d, (size_t)d * sizeof(float));
            dst[r] = b->slot_y + pairs[r] * d;
        }
        const moe_expert *x = &layer->experts[e];
        int rc = run_expert(layer, &x->w1, &x->w3, &x->w2, &rules->routed, s->xg, m, b->pair_w + b->start[e], dst,
                            clk, epi_s);
        free(dst);
        if (rc != 0)
            return mmoe_error_set(err, MMOE_ENOMEM, "moe: out of memory in expert %lld", (long long)e);
    }
    return MMOE_OK;
}

/** One layer call (mmoe_moe_layer_run()), with the layer's pool already held. */
static mmoe_status layer_run_held(mmoe_moe_layer *layer, const mmoe_moe_input *in, const mmoe_moe_output *out,
                                  mmoe_moe_result *result, mmoe_error *err)
{
    const double t_start = mmoe_clock_s();
    mmoe_error local_err;
    if (err == NULL)
        err = &local_err;
    mmoe_error_clear(err);
    if (result != NULL)
        result_reset(result);
    if (layer == NULL || in == NULL || out == NULL)
        return fail(result, err, mmoe_error_set(err, MMOE_EINVAL, "moe run: layer, input and output are required"));
    const mmoe_moe_desc *desc = &layer->desc;
    const int64_t t = in->n_tokens, d = desc->hidden, e_n = desc->n_experts;
    const int topk = desc->topk;
    if (!layer->has_weights)
        return fail(result, err, mmoe_error_set(err, MMOE_EINVAL, "moe run: the layer has no weights"));
    if (t < 0 || (t > 0 && (in->x == NULL || out->y == NULL)))
        return fail(result, err, mmoe_error_set(err, MMOE_EINVAL, "moe run: need n_tokens >= 0, x and y (T = %lld)",
                                                (long long)t));
    char reason[MMOE_MOE_REASON_LEN];
    mmoe_moe_fallback fb;
    const mmoe_moe_path path = moe_shared_decide(layer, &fb, reason);
    if (result != NULL) {
        result->recipe = desc->recipe;
        result->math = desc->math;
        result->shared_path = path;
        result->fallback = fb;
        memcpy(result->fallback_reason, reason, sizeof reason);
        result->inter_used = layer->inter_used;
        result->shared_inter_used = (int64_t)desc->n_shared * layer->shared_inter_used;
        result->padded = layer->inter_used != desc->inter || layer->shared_inter_used != desc->shared_inter;
        result->n_tokens = t;
    }
    if (desc->shared_mode == MMOE_SHARED_FUSED && path == MMOE_PATH_SERIAL)
        return fail(result, err, mmoe_error_set(err, MMOE_EUNSUPPORTED,
                                                "moe run: --shared fused is not possible: %s", reason));
    if (in->topk_idx != NULL) {
        mmoe_status st = check_given_routing(layer, in, err);
        if (st != MMOE_OK)
            return fail(result, err, st);
    }

    call_bufs b = {0};
    int oom = 0;
    const size_t td = (size_t)t * (size_t)d;
    b.xf = alloc_or_flag(td, sizeof(float), &oom);
    b.xq = alloc_or_flag(td, sizeof(float), &oom);
    b.idx = alloc_or_flag((size_t)t * (size_t)topk, sizeof(int64_t), &oom);
    b.wts = alloc_or_flag((size_t)t * (size_t)topk, sizeof(float), &oom);
    b.logits = alloc_or_flag((size_t)t * (size_t)e_n, sizeof(float), &oom);
    b.slot_y = alloc_or_flag(td * (size_t)topk, sizeof(uint16_t), &oom);
    b.count = alloc_or_flag((size_t)e_n, sizeof(int64_t), &oom);
    b.start = alloc_or_flag((size_t)e_n + 1, sizeof(int64_t), &oom);
    b.fill = alloc_or_flag((size_t)e_n, sizeof(int64_t), &oom);
    b.pair = alloc_or_flag((size_t)t * (size_t)topk, sizeof(int64_t), &oom);
    b.pair_w = alloc_or_flag((size_t)t * (size_t)topk, sizeof(float), &oom);
    if (path != MMOE_PATH_NONE)
        b.shared_y = alloc_or_flag(td, sizeof(uint16_t), &oom);
    if (path == MMOE_PATH_SERIAL)
        b.xs = alloc_or_flag(td, sizeof(float), &oom);
    if (oom) {
        call_free(&b);
        return fail(result, err, mmoe_error_set(err, MMOE_ENOMEM, "moe run: out of memory for T = %lld tokens",
                                                (long long)t));
    }
    mmoe_moe_timings tm = {0};
    moe_gemm_clock clk = {0};
    mmoe_status st = MMOE_OK;

    /* 1-2: widen x, route */
    double t0 = mmoe_clock_s();
    mmoe_bf16_to_f32_row(in->x, td, b.xf);
    if (in->topk_idx != NULL) {
        memcpy(b.idx, in->topk_idx, (size_t)t * (size_t)topk * sizeof(int64_t));
        memcpy(b.wts, in->topk_weights, (size_t)t * (size_t)topk * sizeof(float));
    } else {
        st = moe_route(desc, b.xf, t, layer->gate, layer->bias, &layer->tid2eid, in->token_ids, b.idx, b.wts,
                       b.logits, err);
    }
    tm.route_s = mmoe_clock_s() - t0;

    /* 3-4: dispatch, quantize x */
    int64_t active = 0;
    if (st == MMOE_OK) {
        dispatch(layer, t, &b);
        t0 = mmoe_clock_s();
        moe_act_quant_rows(b.xf, t, d, moe_recipe_rules(desc->recipe)->x_quant, b.xq);
        tm.quant_s = mmoe_clock_s() - t0;
        /* 5: routed experts */
        st = run_routed(layer, &b, &clk, &tm.epilogue_s, &active, err);
    }
    /* 6: shared expert */
    if (st == MMOE_OK && path != MMOE_PATH_NONE && t > 0)
        st = run_shared(layer, path, &b, t, &clk, &tm.epilogue_s, &tm.quant_s, err);
    /* 7: combine */
    if (st == MMOE_OK) {
        t0 = mmoe_clock_s();
        const uint16_t *rows[MMOE_MOE_MAX_TOPK];
        const moe_combine_order order = moe_recipe_rules(desc->recipe)->combine;
        for (int64_t i = 0; i < t; i++) {
            for (int k = 0; k < topk; k++)
                rows[k] = b.slot_y + (i * topk + k) * d;
            moe_combine_token(order, topk, b.idx + i * topk, rows,
                              path != MMOE_PATH_NONE ? b.shared_y + i * d : NULL, d, out->y + i * d);
        }
        tm.combine_s = mmoe_clock_s() - t0;
        if (out->topk_idx != NULL)
            memcpy(out->topk_idx, b.idx, (size_t)t * (size_t)topk * sizeof(int64_t));
        if (out->topk_weights != NULL)
            memcpy(out->topk_weights, b.wts, (size_t)t * (size_t)topk * sizeof(float));
        int64_t pairs = 0;
        for (int64_t e = 0; e < e_n; e++) {
            layer->counters[e] += b.count[e];
            pairs += b.count[e];
            if (result != NULL && result->expert_recv_stats != NULL)
                result->expert_recv_stats[e] += b.count[e];
        }
        if (result != NULL) {
            result->routed_pairs = pairs;
            result->active_experts = active;
        }
    }
    call_free(&b);
    tm.dequant_s = clk.dequant_s;
    tm.gemm_s = clk.gemm_s;
    tm.total_s = mmoe_clock_s() - t_start;
    if (result != NULL) {
        result->time = tm;
        result->gemm_flops = clk.flops;
    }
    if (st != MMOE_OK)
        return fail(result, err, st);
    if (result != NULL)
        result->status = MMOE_OK;
    return MMOE_OK;
}

mmoe_status mmoe_moe_layer_run(mmoe_moe_layer *layer, const mmoe_moe_input *in, const mmoe_moe_output *out,
                               mmoe_moe_result *result, mmoe_error *err)
{
    /* a shared pool runs one call at a time: another thread's call on a layer of the same pool
     * waits here (moe_dequant_pool.c, "Sharing") */
    moe_dequant_pool *pool = layer != NULL ? layer->dequant_pool : NULL;
    moe_dequant_pool_lock(pool);
    mmoe_status st = layer_run_held(layer, in, out, result, err);
    moe_dequant_pool_unlock(pool);
    return st;
}
