/**
 * @file mmoe_model_tensors.c
 * @brief Building the checkpoint tensor list from a config (see mmoe_model_tensors.h).
 *
 * A small growable array and three helpers (`add`, `add_fp8`, `add_fp4`)
 * that append a tensor, an FP8 weight with its block scale, or a packed FP4
 * expert weight with its 1x32 scale.  The layer function reads like the
 * table of @ref spec_arch_checkpoint.
 */
#include "mmoe_model_tensors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/** A growable array of specs. */
typedef struct list {
    mmoe_tensor_spec *v; /**< the specs */
    size_t n;            /**< used */
    size_t cap;          /**< allocated */
    int oom;             /**< an allocation failed (later adds are ignored) */
    int layer;           /**< layer index recorded in new specs */
} list;

/** Append a tensor named by the printf-style @p fmt; d1 = 0 makes it 1-D.  NULL on allocation failure. */
static mmoe_tensor_spec *add(list *l, mmoe_dtype dt, mmoe_tensor_role role, int64_t d0, int64_t d1,
                             const char *fmt, ...)
{
    if (l->oom)
        return NULL;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        mmoe_tensor_spec *nv = realloc(l->v, cap * sizeof *nv);
        if (!nv) {
            l->oom = 1;
            return NULL;
        }
        l->v = nv;
        l->cap = cap;
    }
    mmoe_tensor_spec *s = &l->v[l->n++];
    memset(s, 0, sizeof *s);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    s->dtype = dt;
    s->role = role;
    s->ndim = d1 > 0 ? 2 : 1;
    s->shape[0] = d0;
    s->shape[1] = d1 > 0 ? d1 : 0;
    s->layer = l->layer;
    return s;
}

/** ceil(a / b) for positive values. */
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/** An FP8 linear `<name>.weight` [out, in] and its `<name>.scale`. */
static void add_fp8(list *l, const mmoe_config *c, const char *name, int64_t out, int64_t in)
{
    add(l, MMOE_DT_F8_E4M3, MMOE_ROLE_LINEAR, out, in, "%s.weight", name);
    add(l, MMOE_DT_F8_E8M0, MMOE_ROLE_SCALE, ceil_div(out, c->weight_block_n), ceil_div(in, c->weight_block_k),
        "%s.scale", name);
}

/** A routed expert weight: packed FP4 [out, in/2] + [out, in/32] scales (or FP8 if so configured). */
static void add_expert(list *l, const mmoe_config *c, const char *name, int64_t out, int64_t in)
{
    if (c->expert_dtype == MMOE_EXPERT_FP8) {
        add_fp8(l, c, name, out, in);
        return;
    }
    add(l, MMOE_DT_I8, MMOE_ROLE_LINEAR, out, in / 2, "%s.weight", name);
    add(l, MMOE_DT_F8_E8M0, MMOE_ROLE_SCALE, out, in / 32, "%s.scale", name);
}

/** A compressor's wkv/wgate (BF16 [c*dh, D]), ape (F32 [ratio, c*dh]) and norm (BF16 [dh]). */
static void add_compressor(list *l, const char *p, int ratio, int64_t dh, int64_t D)
{
    int64_t c = ratio == 4 ? 2 : 1;
    add(l, MMOE_DT_BF16, MMOE_ROLE_LINEAR, c * dh, D, "%s.wkv.weight", p);
    add(l, MMOE_DT_BF16, MMOE_ROLE_LINEAR, c * dh, D, "%s.wgate.weight", p);
    add(l, MMOE_DT_F32, MMOE_ROLE_APE, ratio, c * dh, "%s.ape", p);
    add(l, MMOE_DT_BF16, MMOE_ROLE_NORM, dh, 0, "%s.norm.weight", p);
}

/** The block prefix followed by @p s, in the buffer n (inside add_block()). */
#define N(s) (snprintf(n, sizeof n, "%s%s", pre, s), n)

/** One transformer block under prefix @p pre ("layers.3." or "mtp.0."). */
static void add_block(list *l, const mmoe_config *c, int layer, const char *pre)
{
    const int64_t D = c->dim, H = c->n_heads, d = c->head_dim, G = c->o_groups, hc = c->hc_mult;
    const int64_t n_mix = (2 + hc) * hc, I = c->moe_inter_dim;
    const int ratio = mmoe_config_ratio(c, layer);
    char n[MMOE_TENSOR_NAME_LEN];
    for (int s = 0; s < 2; s++) {
        const char *sub = s == 0 ? "attn" : "ffn";
        add(l, MMOE_DT_F32, MMOE_ROLE_HC_FN, n_mix, hc * D, "%shc_%s_fn", pre, sub);
        add(l, MMOE_DT_F32, MMOE_ROLE_HC_BASE, n_mix, 0, "%shc_%s_base", pre, sub);
        add(l, MMOE_DT_F32, MMOE_ROLE_HC_SCALE, 3, 0, "%shc_%s_scale", pre, sub);
        add(l, MMOE_DT_BF16, MMOE_ROLE_NORM, D, 0, "%s%s_norm.weight", pre, sub);
    }
    add_fp8(l, c, N("attn.wq_a"), c->q_lora_rank, D);
    add(l, MMOE_DT_BF16, MMOE_ROLE_NORM, c->q_lora_rank, 0, "%sattn.q_norm.weight", pre);
    add_fp8(l, c, N("attn.wq_b"), H * d, c->q_lora_rank);
    add_fp8(l, c, N("attn.wkv"), d, D);
    add(l, MMOE_DT_BF16, MMOE_ROLE_NORM, d, 0, "%sattn.kv_norm.weight", pre);
    add_fp8(l, c, N("attn.wo_a"), G * c->o_lora_rank, H * d / G);
    add_fp8(l, c, N("attn.wo_b"), D, G * c->o_lora_rank);
    add(l, MMOE_DT_F32, MMOE_ROLE_SINK, H, 0, "%sattn.attn_sink", pre);
    if (ratio == 4 || ratio == 128)
        add_compressor(l, N("attn.compressor"), ratio, d, D);
    if (ratio == 4) {
        add_fp8(l, c, N("attn.indexer.wq_b"), (int64_t)c->index_n_heads * c->index_head_dim, c->q_lora_rank);
        add(l, MMOE_DT_BF16, MMOE_ROLE_LINEAR, c->index_n_heads, D, "%sattn.indexer.weights_proj.weight", pre);
        add_compressor(l, N("attn.indexer.compressor"), 4, c->index_head_dim, D);
    }
    add(l, MMOE_DT_BF16, MMOE_ROLE_LINEAR, c->n_routed_experts, D, "%sffn.gate.weight", pre);
    if (layer < c->n_hash_layers)
        add(l, MMOE_DT_I64, MMOE_ROLE_TID2EID, c->vocab_size, c->n_activated_experts, "%sffn.gate.tid2eid", pre);
    else
        add(l, MMOE_DT_F32, MMOE_ROLE_BIAS, c->n_routed_experts, 0, "%sffn.gate.bias", pre);
    for (int e = 0; e < c->n_routed_experts; e++) {
        char en[MMOE_TENSOR_NAME_LEN];
        snprintf(en, sizeof en, "%sffn.experts.%d.w1", pre, e);
        add_expert(l, c, en, I, D);
        snprintf(en, sizeof en, "%sffn.experts.%d.w2", pre, e);
        add_expert(l, c, en, D, I);
        snprintf(en, sizeof en, "%sffn.experts.%d.w3", pre, e);
        add_expert(l, c, en, I, D);
    }
    if (c->n_shared_experts > 0) {
        int64_t Ws = (int64_t)c->n_shared_experts * I;
        add_fp8(l, c, N("ffn.shared_experts.w1"), Ws, D);
        add_fp8(l, c, N("ffn.shared_experts.w2"), D, Ws);
        add_fp8(l, c, N("ffn.shared_experts.w3"), Ws, D);
    }
#undef N
}

/** A head's hc_head_fn/base/scale and norm (main model: empty prefix). */
static void add_head(list *l, const mmoe_config *c, const char *pre)
{
    add(l, MMOE_DT_F32, MMOE_ROLE_HC_FN, c->hc_mult, (int64_t)c->hc_mult * c->dim, "%shc_head_fn", pre);
    add(l, MMOE_DT_F32, MMOE_ROLE_HC_BASE, c->hc_mult, 0, "%shc_head_base", pre);
    add(l, MMOE_DT_F32, MMOE_ROLE_HC_SCALE, 1, 0, "%shc_head_scale", pre);
    add(l, MMOE_DT_BF16, MMOE_ROLE_NORM, c->dim, 0, "%snorm.weight", pre);
}

mmoe_status mmoe_model_tensor_list(const mmoe_config *c, mmoe_tensor_spec **out, size_t *n, mmoe_error *err)
{
    list l = {0};
    *out = NULL;
    *n = 0;
    for (int i = 0; i < c->n_layers + c->n_mtp_layers; i++) {
        int r = mmoe_config_ratio(c, i);
        if (r != 0 && r != 4 && r != 128)
            return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                                  "config: compress_ratios[%d] = %d (V4.1 CSA2) has no supported checkpoint "
                                  "layout; only 0, 4 and 128 are implemented",
                                  i, r);
    }
    l.layer = -1;
    add(&l, MMOE_DT_BF16, MMOE_ROLE_EMBED, c->vocab_size, c->dim, "embed.weight");
    add(&l, MMOE_DT_BF16, MMOE_ROLE_LINEAR, c->vocab_size, c->dim, "head.weight");
    add_head(&l, c, "");
    char pre[64];
    for (int L = 0; L < c->n_layers; L++) {
        l.layer = L;
        snprintf(pre, sizeof pre, "layers.%d.", L);
        add_block(&l, c, L, pre);
    }
    for (int m = 0; m < c->n_mtp_layers; m++) {
        l.layer = c->n_layers + m;
        snprintf(pre, sizeof pre, "mtp.%d.", m);
        char nm[MMOE_TENSOR_NAME_LEN];
        snprintf(nm, sizeof nm, "%se_proj", pre);
        add_fp8(&l, c, nm, c->dim, c->dim);
        snprintf(nm, sizeof nm, "%sh_proj", pre);
        add_fp8(&l, c, nm, c->dim, c->dim);
        add(&l, MMOE_DT_BF16, MMOE_ROLE_NORM, c->dim, 0, "%senorm.weight", pre);
        add(&l, MMOE_DT_BF16, MMOE_ROLE_NORM, c->dim, 0, "%shnorm.weight", pre);
        add_head(&l, c, pre);
        add_block(&l, c, c->n_layers + m, pre);
    }
    if (l.oom) {
        free(l.v);
        return mmoe_error_set(err, MMOE_ENOMEM, "tensor list: out of memory");
    }
    *out = l.v;
    *n = l.n;
    return MMOE_OK;
}

uint64_t mmoe_model_tensor_bytes(const mmoe_tensor_spec *s, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t numel = (uint64_t)s[i].shape[0] * (uint64_t)(s[i].ndim == 2 ? s[i].shape[1] : 1);
        total += numel * mmoe_dtype_size(s[i].dtype);
    }
    return total;
}
