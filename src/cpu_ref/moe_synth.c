/**
 * @file moe_synth.c
 * @brief Random layers with real shapes: quantized like a checkpoint, written with its names.
 *
 * Routed experts: for each row of W1/W3 ([I, D]) and W2 ([D, I]) draw real values and quantize
 * them with the MXFP4 row quantizer of mmoe_formats.h (1x32 UE8M0 scale = ceil_pow2(max(amax,
 * 1e-4) / 6), E2M1 codes rounded to nearest even), exactly as a checkpoint's routed experts were
 * produced.  Shared experts: FP8 E4M3 with one UE8M0 scale per B x B block (ceil_pow2(amax /
 * 448), mmoe_quant_fp8_weight_blocks()), the checkpoint's FP8 format.  Normal deviates come
 * from a table of 65536 Box-Muller draws indexed by the generator (mmoe_normal_table_fill_random();
 * a layer of v4-flash with 32 experts has 0.8 G weights; the table keeps synthesis to a few
 * seconds while the values stay normal-shaped).
 *
 * The dyadic family (mmoe_moe_synth.h) draws codes and scales directly instead.
 */
#include "mmoe_moe_synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"
#include "mmoe_rng.h"
#include "mmoe_safetensors.h"
#include "moe_internal.h"

/** Std-dev of synthetic weights (of the order of a trained layer's). */
#define SYNTH_WEIGHT_STD 0.02

/** A synthetic layer and every buffer it owns. */
struct mmoe_moe_synth {
    mmoe_moe_desc desc;               /**< its description */
    mmoe_moe_weights w;               /**< views of its tensors */
    mmoe_moe_expert_weights *experts; /**< [E] routed experts */
    void **blocks;                    /**< every allocation, freed together */
    size_t n_blocks;                  /**< allocations made */
    size_t cap_blocks;                /**< capacity of blocks */
};

/** calloc that the synth frees at destroy time. */
static void *synth_alloc(mmoe_moe_synth *s, size_t bytes)
{
    if (s->n_blocks == s->cap_blocks) {
        size_t cap = s->cap_blocks ? 2 * s->cap_blocks : 64;
        void **nb = realloc(s->blocks, cap * sizeof *nb);
        if (nb == NULL)
            return NULL;
        s->blocks = nb;
        s->cap_blocks = cap;
    }
    void *p = calloc(bytes > 0 ? bytes : 1, 1);
    if (p != NULL)
        s->blocks[s->n_blocks++] = p;
    return p;
}

/** One routed FP4 matrix [n, k] with 1x32 scales. */
static int make_fp4(mmoe_moe_synth *s, int64_t n, int64_t k, mmoe_moe_synth_values values,
                    const mmoe_normal_table *nt, mmoe_rng *rng, mmoe_tensor *w, mmoe_tensor *sf)
{
    uint8_t *wb = synth_alloc(s, (size_t)(n * k / 2));
    uint8_t *sb = synth_alloc(s, (size_t)(n * k / 32));
    float *row = malloc((size_t)k * sizeof(float));
    if (wb == NULL || sb == NULL || row == NULL) {
        free(row);
        return -1;
    }
    for (int64_t r = 0; r < n; r++) {
        if (values == MMOE_SYNTH_DYADIC) {
            for (int64_t j = 0; j < k / 2; j++)
                wb[r * (k / 2) + j] = (uint8_t)mmoe_rng_u32(rng);
            for (int64_t g = 0; g < k / 32; g++)
                sb[r * (k / 32) + g] = (uint8_t)(126 + mmoe_rng_below(rng, 3));
        } else {
            for (int64_t j = 0; j < k; j++)
                row[j] = (float)SYNTH_WEIGHT_STD * mmoe_normal_table_draw(nt, rng);
            mmoe_quant_row_fp4_1x32_ue8m0(row, (size_t)k, MMOE_FP4_RNE, wb + r * (k / 2), sb + r * (k / 32), NULL);
        }
    }
    free(row);
    *w = mmoe_tensor_view2(MMOE_DT_I8, n, k / 2, wb);
    *sf = mmoe_tensor_view2(MMOE_DT_F8_E8M0, n, k / 32, sb);
    return 0;
}

/** One shared FP8 matrix [n, k] with B x B block scales. */
static int make_fp8(mmoe_moe_synth *s, int64_t n, int64_t k, int64_t bsz, mmoe_moe_synth_values values,
                    const mmoe_normal_table *nt, mmoe_rng *rng, mmoe_tensor *w, mmoe_tensor *sf)
{
    const int64_t sr = moe_ceil_div(n, bsz), sc = moe_ceil_div(k, bsz);
    uint8_t *wb = synth_alloc(s, (size_t)(n * k));
    uint8_t *sb = synth_alloc(s, (size_t)(sr * sc));
    float *vals = malloc((size_t)(n * k) * sizeof(float));
    if (wb == NULL || sb == NULL || vals == NULL) {
        free(vals);
        return -1;
    }
    if (values == MMOE_SYNTH_DYADIC) {
        for (int64_t i = 0; i < sr * sc; i++)
            sb[i] = (uint8_t)(126 + mmoe_rng_below(rng, 3));
        for (int64_t i = 0; i < n * k; i++)
            wb[i] = mmoe_fp8_e4m3_from_f32((float)((int64_t)mmoe_rng_below(rng, 17) - 8));
    } else {
        for (int64_t i = 0; i < n * k; i++)
            vals[i] = (float)SYNTH_WEIGHT_STD * mmoe_normal_table_draw(nt, rng);
        if (mmoe_quant_fp8_weight_blocks(vals, (size_t)n, (size_t)k, (size_t)bsz, (size_t)bsz, wb, sb, NULL) !=
            MMOE_OK) {
            free(vals);
            return -1;
        }
    }
    free(vals);
    *w = mmoe_tensor_view2(MMOE_DT_F8_E4M3, n, k, wb);
    *sf = mmoe_tensor_view2(MMOE_DT_F8_E8M0, sr, sc, sb);
    return 0;
}

/** Gate weight, and bias or hash table. */
static int make_router(mmoe_moe_synth *s, mmoe_moe_synth_values values, const mmoe_normal_table *nt, mmoe_rng *rng)
{
    const mmoe_moe_desc *d = &s->desc;
    uint16_t *gate = synth_alloc(s, (size_t)(d->n_experts * d->hidden) * 2);
    if (gate == NULL)
        return -1;
    const float gstd = 1.0f / sqrtf((float)d->hidden);
    for (int64_t i = 0; i < d->n_experts * d->hidden; i++)
        gate[i] = mmoe_bf16_from_f32(values == MMOE_SYNTH_DYADIC ? (float)((int64_t)mmoe_rng_below(rng, 9) - 4) / 64.0f
                                                                 : gstd * mmoe_normal_table_draw(nt, rng));
    s->w.gate = mmoe_tensor_view2(MMOE_DT_BF16, d->n_experts, d->hidden, gate);
    if (d->routing == MMOE_ROUTING_BIASED) {
        float *bias = synth_alloc(s, (size_t)d->n_experts * sizeof(float));
        if (bias == NULL)
            return -1;
        for (int64_t e = 0; e < d->n_experts; e++)
            bias[e] = values == MMOE_SYNTH_DYADIC ? (float)((int64_t)mmoe_rng_below(rng, 9) - 4) / 16.0f
                                                  : 0.1f * mmoe_normal_table_draw(nt, rng);
        mmoe_tensor b = {MMOE_DT_F32, 1, {d->n_experts}, bias, (size_t)d->n_experts * sizeof(float)};
        s->w.gate_bias = b;
    } else {
        int32_t *t2e = synth_alloc(s, (size_t)(d->vocab * d->topk) * sizeof(int32_t));
        if (t2e == NULL)
            return -1;
        for (int64_t v = 0; v < d->vocab; v++)
            for (int k = 0; k < d->topk; k++) {
                int64_t e;
                int dup;
                do { /* distinct experts per token, as a hash table holds them */
                    e = (int64_t)mmoe_rng_below(rng, (uint64_t)d->n_experts);
                    dup = 0;
                    for (int p = 0; p < k; p++)
                        dup |= t2e[v * d->topk + p] == e;
                } while (dup);
                t2e[v * d->topk + k] = (int32_t)e;
            }
        s->w.tid2eid = mmoe_tensor_view2(MMOE_DT_I32, d->vocab, d->topk, t2e);
    }
    return 0;
}

mmoe_status mmoe_moe_synth_create(const mmoe_moe_desc *desc, uint64_t seed, mmoe_moe_synth_values values,
                                  mmoe_moe_synth **out, mmoe_error *err)
{
    *out = NULL;
    mmoe_status st = mmoe_moe_desc_validate(desc, err);
    if (st != MMOE_OK)
        return st;
    mmoe_moe_synth *s = calloc(1, sizeof *s);
    mmoe_normal_table *nt = malloc(sizeof *nt);
    if (s == NULL || nt == NULL) {
        free(s);
        free(nt);
        return mmoe_error_set(err, MMOE_ENOMEM, "synth: out of memory");
    }
    s->desc = *desc;
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed);
    mmoe_normal_table_fill_random(nt, &rng);
    const int64_t D = desc->hidden, I = desc->inter, W = (int64_t)desc->n_shared * desc->shared_inter;
    int bad = make_router(s, values, nt, &rng);
    s->experts = synth_alloc(s, (size_t)desc->n_experts * sizeof *s->experts);
    bad |= s->experts == NULL;
    for (int64_t e = 0; e < desc->n_experts && !bad; e++) {
        mmoe_moe_expert_weights *x = &s->experts[e];
        bad |= make_fp4(s, I, D, values, nt, &rng, &x->w1, &x->w1_scale);
        bad |= make_fp4(s, I, D, values, nt, &rng, &x->w3, &x->w3_scale);
        bad |= make_fp4(s, D, I, values, nt, &rng, &x->w2, &x->w2_scale);
    }
    if (!bad && desc->n_shared > 0) {
        mmoe_moe_expert_weights *x = &s->w.shared;
        bad |= make_fp8(s, W, D, desc->shared_block, values, nt, &rng, &x->w1, &x->w1_scale);
        bad |= make_fp8(s, W, D, desc->shared_block, values, nt, &rng, &x->w3, &x->w3_scale);
        bad |= make_fp8(s, D, W, desc->shared_block, values, nt, &rng, &x->w2, &x->w2_scale);
    }
    free(nt);
    if (bad) {
        mmoe_moe_synth_destroy(s);
        return mmoe_error_set(err, MMOE_ENOMEM, "synth: out of memory for the layer's tensors");
    }
    s->w.experts = s->experts;
    *out = s;
    return MMOE_OK;
}

const mmoe_moe_weights *mmoe_moe_synth_weights(const mmoe_moe_synth *s)
{
    return &s->w;
}

mmoe_moe_weights *mmoe_moe_synth_weights_mut(mmoe_moe_synth *s)
{
    return &s->w;
}

void mmoe_moe_synth_destroy(mmoe_moe_synth *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->n_blocks; i++)
        free(s->blocks[i]);
    free(s->blocks);
    free(s);
}

void mmoe_moe_synth_input(const mmoe_moe_desc *desc, int64_t t, uint64_t seed, mmoe_moe_synth_values values,
                          uint16_t *x, int32_t *token_ids)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed ^ 0x5eed1e5ull);
    const int64_t D = desc->hidden;
    for (int64_t i = 0; i < t; i++) {
        for (int64_t j = 0; j < D; j++) {
            float v = values == MMOE_SYNTH_DYADIC ? (float)((int64_t)mmoe_rng_below(&rng, 29) - 14)
                                                  : (float)mmoe_rng_normal(&rng);
            x[i * D + j] = mmoe_bf16_from_f32(v);
        }
        if (values == MMOE_SYNTH_DYADIC) /* one |14| per 32-group: every group scale is exactly 2^-5 */
            for (int64_t g = 0; g < D; g += 32)
                x[i * D + g + (int64_t)mmoe_rng_below(&rng, 32)] = mmoe_bf16_from_f32(mmoe_rng_u32(&rng) & 1 ? 14.0f : -14.0f);
        if (token_ids != NULL)
            token_ids[i] = (int32_t)mmoe_rng_below(&rng, (uint64_t)(desc->vocab > 0 ? desc->vocab : 1));
    }
}

/** Add one tensor under its (optionally prefixed) checkpoint name. */
static mmoe_status add(mmoe_st_writer *wr, int layer_index, const char *name, const mmoe_tensor *t, mmoe_error *err)
{
    char full[256];
    if (layer_index >= 0)
        snprintf(full, sizeof full, "layers.%d.%s", layer_index, name);
    else
        snprintf(full, sizeof full, "%s", name);
    return mmoe_st_writer_add_tensor(wr, full, t, err);
}

/** Add the six tensors of one expert. */
static mmoe_status add_expert(mmoe_st_writer *wr, int li, const char *base, const mmoe_moe_expert_weights *x,
                              mmoe_error *err)
{
    const mmoe_tensor *t[6] = {&x->w1, &x->w1_scale, &x->w3, &x->w3_scale, &x->w2, &x->w2_scale};
    static const char *const suffix[6] = {"w1.weight", "w1.scale", "w3.weight", "w3.scale", "w2.weight", "w2.scale"};
    char name[200];
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "%s.%s", base, suffix[i]);
        mmoe_status st = add(wr, li, name, t[i], err);
        if (st != MMOE_OK)
            return st;
    }
    return MMOE_OK;
}

mmoe_status mmoe_moe_synth_write(const mmoe_moe_synth *s, int layer_index, const char *path, mmoe_error *err)
{
    const mmoe_moe_desc *d = &s->desc;
    mmoe_st_writer *wr = NULL;
    mmoe_status st = mmoe_st_writer_create(&wr, err);
    if (st != MMOE_OK)
        return st;
    st = add(wr, layer_index, "ffn.gate.weight", &s->w.gate, err);
    if (st == MMOE_OK)
        st = d->routing == MMOE_ROUTING_BIASED ? add(wr, layer_index, "ffn.gate.bias", &s->w.gate_bias, err)
                                               : add(wr, layer_index, "ffn.gate.tid2eid", &s->w.tid2eid, err);
    char base[64];
    for (int64_t e = 0; e < d->n_experts && st == MMOE_OK; e++) {
        snprintf(base, sizeof base, "ffn.experts.%lld", (long long)e);
        st = add_expert(wr, layer_index, base, &s->experts[e], err);
    }
    if (st == MMOE_OK && d->n_shared > 0)
        st = add_expert(wr, layer_index, "ffn.shared_experts", &s->w.shared, err);
    char v[64];
    struct { const char *k; } keys[6] = {{"moe.topk"}, {"moe.n_shared"}, {"moe.shared_inter"}, {"moe.shared_block"},
                                         {"moe.routed_scaling_factor"}, {"moe.swiglu_limit"}};
    for (int i = 0; i < 6 && st == MMOE_OK; i++) {
        switch (i) {
        case 0: snprintf(v, sizeof v, "%d", d->topk); break;
        case 1: snprintf(v, sizeof v, "%d", d->n_shared); break;
        case 2: snprintf(v, sizeof v, "%lld", (long long)d->shared_inter); break;
        case 3: snprintf(v, sizeof v, "%d", d->shared_block); break;
        case 4: snprintf(v, sizeof v, "%.9g", (double)d->routed_scaling_factor); break;
        default: snprintf(v, sizeof v, "%.9g", (double)d->swiglu_limit); break;
        }
        st = mmoe_st_writer_set_metadata(wr, keys[i].k, v, err);
    }
    if (st == MMOE_OK) /* the only score function of the oracle; stated so that readers need not assume it */
        st = mmoe_st_writer_set_metadata(wr, "moe.scoring_func", "sqrtsoftplus", err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_finish(wr, path, err);
    mmoe_st_writer_destroy(wr);
    return st;
}
