/**
 * @file moe_load.c
 * @brief From DeepSeek-V4 checkpoint names to the weights of a layer.
 *
 * The checkpoint stores one MoE layer under these names (@ref spec_arch_checkpoint),
 * optionally prefixed with `layers.L.`:
 *
 *     ffn.gate.weight                      BF16 [E, D]
 *     ffn.gate.bias                        F32  [E]            (score-routed layers)
 *     ffn.gate.tid2eid                     I64  [vocab, topk]  (hash-routed layers)
 *     ffn.experts.{e}.{w1,w3}.weight       I8   [I, D/2]   + .scale F8_E8M0 [I, D/32]
 *     ffn.experts.{e}.w2.weight            I8   [D, I/2]   + .scale F8_E8M0 [D, I/32]
 *     ffn.shared_experts.{w1,w3}.weight    F8_E4M3 [S*I, D] + .scale F8_E8M0 [S*I/B, D/B]
 *     ffn.shared_experts.w2.weight         F8_E4M3 [D, S*I] + .scale F8_E8M0 [D/B, S*I/B]
 *
 * The loader only resolves names through the caller's lookup function (a safetensors file, a
 * multi-shard checkpoint, a test's table), then hands the views to
 * mmoe_moe_layer_set_weights(), which checks every dtype and shape.  A name that is absent in
 * both forms is reported with the form that was tried first.
 */
#include "moe_internal.h"

#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/** The name resolver of one load. */
typedef struct loader {
    mmoe_moe_lookup_fn lookup; /**< the caller's resolver */
    void *ctx;                 /**< its context */
    int layer_index;           /**< L of the "layers.L." prefix, or -1 */
} loader;

/** Find "[layers.L.]name"; @p optional: absent is not an error (the view stays empty). */
static mmoe_status find(const loader *ld, const char *name, int optional, mmoe_tensor *out, mmoe_error *err)
{
    char full[256];
    memset(out, 0, sizeof *out);
    if (ld->layer_index >= 0) {
        snprintf(full, sizeof full, "layers.%d.%s", ld->layer_index, name);
        mmoe_status st = ld->lookup(ld->ctx, full, out, err);
        if (st != MMOE_ENOTFOUND)
            return st;
    }
    mmoe_status st = ld->lookup(ld->ctx, name, out, err);
    if (st == MMOE_ENOTFOUND) {
        memset(out, 0, sizeof *out);
        if (optional)
            return MMOE_OK;
        if (ld->layer_index >= 0)
            return mmoe_error_set(err, MMOE_ENOTFOUND, "moe load: tensor '%s' not found (nor 'layers.%d.%s')", name,
                                  ld->layer_index, name);
        return mmoe_error_set(err, MMOE_ENOTFOUND, "moe load: tensor '%s' not found", name);
    }
    return st;
}

/** The six tensors (w1, w3, w2 and their scales) of the expert named @p base. */
static mmoe_status find_expert(const loader *ld, const char *base, mmoe_moe_expert_weights *x, int need_scales,
                               mmoe_error *err)
{
    static const char *const mats[3] = {"w1", "w3", "w2"};
    mmoe_tensor *slots[3][2] = {{&x->w1, &x->w1_scale}, {&x->w3, &x->w3_scale}, {&x->w2, &x->w2_scale}};
    char name[200];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s.%s.weight", base, mats[i]);
        mmoe_status st = find(ld, name, 0, slots[i][0], err);
        if (st != MMOE_OK)
            return st;
        snprintf(name, sizeof name, "%s.%s.scale", base, mats[i]);
        st = find(ld, name, !need_scales, slots[i][1], err);
        if (st != MMOE_OK)
            return st;
    }
    return MMOE_OK;
}

mmoe_status mmoe_moe_weights_lookup(const mmoe_moe_desc *d, mmoe_moe_lookup_fn lookup, void *ctx,
                                    int layer_index, mmoe_moe_weights *w, mmoe_error *err)
{
    const loader ld = {lookup, ctx, layer_index};
    memset(w, 0, sizeof *w);
    mmoe_status st = find(&ld, "ffn.gate.weight", 0, &w->gate, err);
    if (st == MMOE_OK && d->routing == MMOE_ROUTING_BIASED)
        st = find(&ld, "ffn.gate.bias", 0, &w->gate_bias, err);
    if (st == MMOE_OK && d->routing == MMOE_ROUTING_HASH)
        st = find(&ld, "ffn.gate.tid2eid", 0, &w->tid2eid, err);
    if (st != MMOE_OK)
        return st;
    mmoe_moe_expert_weights *experts = calloc((size_t)d->n_experts, sizeof *experts);
    if (experts == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "moe load: out of memory");
    char base[64];
    for (int64_t e = 0; e < d->n_experts && st == MMOE_OK; e++) {
        snprintf(base, sizeof base, "ffn.experts.%lld", (long long)e);
        st = find_expert(&ld, base, &experts[e], 1, err);
    }
    /* shared scales are optional only for BF16 shared weights; set_weights checks that */
    if (st == MMOE_OK && d->n_shared > 0)
        st = find_expert(&ld, "ffn.shared_experts", &w->shared, 0, err);
    if (st != MMOE_OK) {
        free(experts);
        return st;
    }
    w->experts = experts;
    return MMOE_OK;
}

void mmoe_moe_weights_release(mmoe_moe_weights *w)
{
    if (w == NULL)
        return;
    free((void *)(uintptr_t)w->experts); /* allocated non-const by mmoe_moe_weights_lookup() */
    w->experts = NULL;
}

mmoe_status mmoe_moe_layer_load(mmoe_moe_layer *layer, mmoe_moe_lookup_fn lookup, void *ctx, int layer_index,
                                mmoe_error *err)
{
    mmoe_moe_weights w;
    mmoe_status st = mmoe_moe_weights_lookup(&layer->desc, lookup, ctx, layer_index, &w, err);
    if (st == MMOE_OK)
        st = mmoe_moe_layer_set_weights(layer, &w, err);
    mmoe_moe_weights_release(&w);
    return st;
}
