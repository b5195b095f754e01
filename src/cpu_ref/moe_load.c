/**
 * @file moe_load.c
 * @brief From DeepSeek-V4 checkpoint names to the weights of a layer.
 *
 * The checkpoint stores one MoE layer under these names (dsv4-architecture.md section 4),
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
#include <stdlib.h>
#include <string.h>

typedef struct loader {
    mmoe_moe_lookup_fn lookup;
    void *ctx;
    int layer_index;
} loader;

/** Find `[layers.L.]name`; @p optional: absent is not an error (the view stays empty). */
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

mmoe_status mmoe_moe_layer_load(mmoe_moe_layer *layer, mmoe_moe_lookup_fn lookup, void *ctx, int layer_index,
                                mmoe_error *err)
{
    const mmoe_moe_desc *d = &layer->desc;
    const loader ld = {lookup, ctx, layer_index};
    mmoe_moe_weights w;
    memset(&w, 0, sizeof w);
    mmoe_status st = find(&ld, "ffn.gate.weight", 0, &w.gate, err);
    if (st == MMOE_OK && d->routing == MMOE_ROUTING_BIASED)
        st = find(&ld, "ffn.gate.bias", 0, &w.gate_bias, err);
    if (st == MMOE_OK && d->routing == MMOE_ROUTING_HASH)
        st = find(&ld, "ffn.gate.tid2eid", 0, &w.tid2eid, err);
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
        st = find_expert(&ld, "ffn.shared_experts", &w.shared, 0, err);
    if (st == MMOE_OK) {
        w.experts = experts;
        st = mmoe_moe_layer_set_weights(layer, &w, err);
    }
    free(experts);
    return st;
}
