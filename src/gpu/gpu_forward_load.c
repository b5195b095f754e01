/**
 * @file gpu_forward_load.c
 * @brief From a loaded CPU model to the host views that the GPU forward uploads (gpu_forward_internal.h).
 *
 * The CPU model (model_internal.h) already holds every tensor as a checked view into the
 * mapped shards; this file only re-expresses those views as the plain structs of
 * gpu_forward_internal.h.  The MoE layers' views come from mmoe_moe_weights_lookup() with the
 * names the CPU loader uses (an MTP block's `layers.L.ffn.*` read as `mtp.i.ffn.*`).  Three
 * things are converted here and owned: the hash tables (to int32), the shared expert's block
 * scales (to fp32, the value each byte or float stands for) and the per-expert pointer arrays.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "gpu_forward_internal.h"
#include "mmoe_formats.h"
#include "mmoe_safetensors.h"
#include "model_internal.h"

/** Lookup context: the checkpoint and an optional prefix rewrite (MTP blocks). */
typedef struct gfw_lookup {
    const mmoe_ckpt *ck;       /**< the checkpoint */
    const char *from, *to;     /**< what the prefix from becomes */
    /** @var gfw_lookup::from
     *  a name prefix to rewrite (NULL: none) */
} gfw_lookup;

/** mmoe_moe_lookup_fn over the checkpoint. */
static mmoe_status lookup(void *vctx, const char *name, mmoe_tensor *out, mmoe_error *err)
{
    const gfw_lookup *c = vctx;
    char buf[256];
    if (c->from && strncmp(name, c->from, strlen(c->from)) == 0) {
        snprintf(buf, sizeof buf, "%s%s", c->to, name + strlen(c->from));
        name = buf;
    }
    const mmoe_tensor *t = mmoe_ckpt_find(c->ck, name);
    if (!t)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "missing tensor '%s'", name);
    *out = *t;
    return MMOE_OK;
}

size_t gfw_dense_bytes(const gfw_dense *w)
{
    const size_t n = (size_t)(w->rows * w->cols);
    return w->dtype == GFW_F32 ? 4 * n : w->dtype == GFW_BF16 ? 2 * n : n;
}

/** A dense view of @p t (BF16, F32 or F8 with @p scale); rows = 1 for a vector. */
static mmoe_status dense_of(const mmoe_tensor *t, const mmoe_tensor *scale, int block, const char *what,
                            gfw_dense *out, mmoe_error *err)
{
    memset(out, 0, sizeof *out);
    if (t->data == NULL)
        return MMOE_OK;
    out->data = t->data;
    out->rows = t->ndim == 2 ? t->shape[0] : 1;
    out->cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    switch (t->dtype) {
    case MMOE_DT_BF16: out->dtype = GFW_BF16; break;
    case MMOE_DT_F32: out->dtype = GFW_F32; break;
    case MMOE_DT_F8_E4M3:
        if (scale == NULL || scale->data == NULL || scale->dtype != MMOE_DT_F8_E8M0)
            return mmoe_error_set(err, MMOE_EUNSUPPORTED, "gpu forward: %s is F8 without E8M0 block scales", what);
        out->dtype = GFW_F8;
        out->scale = scale->data;
        out->block = block;
        break;
    default:
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "gpu forward: %s has dtype %s (BF16, F32 or F8 expected)",
                              what, mmoe_dtype_name(t->dtype));
    }
    return MMOE_OK;
}

/** An FP8 linear view. */
static gfw_fp8 fp8_of(const mmoe_tensor *w, const mmoe_tensor *s, int block)
{
    gfw_fp8 f;
    memset(&f, 0, sizeof f);
    if (w->data == NULL)
        return f;
    f.w = w->data;
    f.scale = s->data;
    f.N = w->shape[0];
    f.K = w->shape[1];
    f.block = block;
    return f;
}

/** An mHC site. */
static gfw_hc hc_of(const model_hc *h, int n_out, int n_scale)
{
    gfw_hc g = {h->fn, h->base, h->scale, n_out, n_scale};
    return g;
}

/** The fp32 value of every element of a shared-expert scale tensor (E8M0/U8 bytes or F32). */
static float *scales_f32(const mmoe_tensor *t)
{
    const int64_t n = mmoe_tensor_numel(t);
    float *f = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!f)
        return NULL;
    for (int64_t i = 0; i < n; i++)
        f[i] = t->dtype == MMOE_DT_F32 ? ((const float *)t->data)[i]
                                      : mmoe_ue8m0_to_f32(((const uint8_t *)t->data)[i]);
    return f;
}

/** The MoE views of block @p L. */
static mmoe_status moe_of(const mmoe_model *m, int L, gfw_moe *g, mmoe_error *err)
{
    const model_block *b = &m->blocks[L];
    const mmoe_moe_desc *d = mmoe_moe_layer_desc(b->moe);
    char from[32];
    snprintf(from, sizeof from, "layers.%d.", L);
    gfw_lookup lc = {m->ck, L >= m->cfg.n_layers ? from : NULL, L >= m->cfg.n_layers ? b->prefix : NULL};
    mmoe_moe_weights w;
    memset(&w, 0, sizeof w);
    mmoe_status st = mmoe_moe_weights_lookup(d, lookup, &lc, L, &w, err);
    if (st != MMOE_OK)
        return st;
    g->n_experts = d->n_experts;
    g->inter = d->inter;
    g->topk = d->topk;
    g->hash = d->routing == MMOE_ROUTING_HASH;
    g->route_scale = d->routed_scaling_factor;
    g->swiglu_limit = d->swiglu_limit;
    g->gate = w.gate.data;
    g->bias = w.gate_bias.data;
    g->shared_block = d->shared_block;
    const int64_t E = d->n_experts;
    g->w1 = calloc((size_t)E, sizeof *g->w1);
    g->w3 = calloc((size_t)E, sizeof *g->w3);
    g->w2 = calloc((size_t)E, sizeof *g->w2);
    g->s1 = calloc((size_t)E, sizeof *g->s1);
    g->s3 = calloc((size_t)E, sizeof *g->s3);
    g->s2 = calloc((size_t)E, sizeof *g->s2);
    if (!g->w1 || !g->w3 || !g->w2 || !g->s1 || !g->s3 || !g->s2) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "gpu forward: out of memory");
        goto done;
    }
    for (int64_t e = 0; e < E; e++) {
        g->w1[e] = w.experts[e].w1.data;
        g->w3[e] = w.experts[e].w3.data;
        g->w2[e] = w.experts[e].w2.data;
        g->s1[e] = w.experts[e].w1_scale.data;
        g->s3[e] = w.experts[e].w3_scale.data;
        g->s2[e] = w.experts[e].w2_scale.data;
    }
    if (g->hash) {
        const mmoe_tensor *t = &w.tid2eid;
        g->vocab = t->shape[0];
        const int64_t n = t->shape[0] * d->topk;
        g->tid2eid = malloc(sizeof(int32_t) * (size_t)n);
        if (!g->tid2eid) {
            st = mmoe_error_set(err, MMOE_ENOMEM, "gpu forward: out of memory");
            goto done;
        }
        for (int64_t i = 0; i < n; i++)
            g->tid2eid[i] = t->dtype == MMOE_DT_I64 ? (int32_t)((const int64_t *)t->data)[i]
                                                   : ((const int32_t *)t->data)[i];
    }
    if (d->n_shared > 0) {
        const mmoe_moe_expert_weights *s = &w.shared;
        if (s->w1.dtype != MMOE_DT_F8_E4M3 || s->w2.dtype != MMOE_DT_F8_E4M3 || s->w3.dtype != MMOE_DT_F8_E4M3) {
            st = mmoe_error_set(err, MMOE_EUNSUPPORTED, "gpu forward: %sffn.shared_experts: weights are %s, F8_E4M3 expected",
                                b->prefix, mmoe_dtype_name(s->w1.dtype));
            goto done;
        }
        g->shared_width = s->w1.shape[0];
        g->sw1 = s->w1.data;
        g->sw3 = s->w3.data;
        g->sw2 = s->w2.data;
        g->ss1 = scales_f32(&s->w1_scale);
        g->ss3 = scales_f32(&s->w3_scale);
        g->ss2 = scales_f32(&s->w2_scale);
        if (!g->ss1 || !g->ss3 || !g->ss2)
            st = mmoe_error_set(err, MMOE_ENOMEM, "gpu forward: out of memory");
    }
done:
    mmoe_moe_weights_release(&w);
    return st;
}

/** The compressor views. */
static mmoe_status comp_of(const mmoe_compressor_weights *c, const char *what, gfw_compressor *g, mmoe_error *err)
{
    mmoe_status st;
    memset(g, 0, sizeof *g);
    if (c->wkv.data == NULL)
        return MMOE_OK;
    if ((st = dense_of(&c->wkv, NULL, 0, what, &g->wkv, err)) != MMOE_OK ||
        (st = dense_of(&c->wgate, NULL, 0, what, &g->wgate, err)) != MMOE_OK ||
        (st = dense_of(&c->norm, NULL, 0, what, &g->norm, err)) != MMOE_OK)
        return st;
    g->ape = c->ape.data;
    return MMOE_OK;
}

/** One block's views. */
static mmoe_status block_of(const mmoe_model *m, int L, gfw_block_src *g, mmoe_error *err)
{
    const model_block *b = &m->blocks[L];
    const mmoe_attn_params *p = &b->attn_p;
    const mmoe_attn_weights *w = &b->attn_w;
    const int hc = m->cfg.hc_mult;
    gfw_attn_dims a = {p->dim, p->n_heads, p->head_dim, p->rope_dim, p->q_lora_rank, p->o_groups, p->o_lora_rank,
                       p->window, p->compress_ratio, p->index_n_heads, p->index_head_dim, p->index_topk,
                       p->weight_block, (float)p->norm_eps};
    g->a = a;
    if (p->rope_dim / 2 > 128)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "gpu forward: rope_dim %d > 256", p->rope_dim);
    attn_rope_freqs_for_layer(p, g->freqs);
    g->hc_attn = hc_of(&b->hc_attn, (2 + hc) * hc, 3);
    g->hc_ffn = hc_of(&b->hc_ffn, (2 + hc) * hc, 3);
    mmoe_status st;
    if ((st = dense_of(&b->attn_norm, NULL, 0, "attn_norm", &g->attn_norm, err)) != MMOE_OK ||
        (st = dense_of(&b->ffn_norm, NULL, 0, "ffn_norm", &g->ffn_norm, err)) != MMOE_OK ||
        (st = dense_of(&w->q_norm, NULL, 0, "q_norm", &g->q_norm, err)) != MMOE_OK ||
        (st = dense_of(&w->kv_norm, NULL, 0, "kv_norm", &g->kv_norm, err)) != MMOE_OK ||
        (st = dense_of(&w->wo_a, &w->wo_a_scale, p->weight_block, "wo_a", &g->wo_a, err)) != MMOE_OK ||
        (st = comp_of(&w->compressor, "compressor", &g->comp, err)) != MMOE_OK ||
        (st = comp_of(&w->idx_compressor, "indexer compressor", &g->idx_comp, err)) != MMOE_OK ||
        (st = dense_of(&w->idx_weights_proj, NULL, 0, "indexer weights_proj", &g->idx_weights_proj, err)) != MMOE_OK)
        return mmoe_error_prefix(err, "%s: ", b->prefix);
    g->wq_a = fp8_of(&w->wq_a, &w->wq_a_scale, p->weight_block);
    g->wq_b = fp8_of(&w->wq_b, &w->wq_b_scale, p->weight_block);
    g->wkv = fp8_of(&w->wkv, &w->wkv_scale, p->weight_block);
    g->wo_b = fp8_of(&w->wo_b, &w->wo_b_scale, p->weight_block);
    g->idx_wq_b = fp8_of(&w->idx_wq_b, &w->idx_wq_b_scale, p->weight_block);
    g->sink = w->attn_sink.data;
    if ((st = moe_of(m, L, &g->moe, err)) != MMOE_OK)
        return mmoe_error_prefix(err, "%sffn: ", b->prefix);
    return MMOE_OK;
}

mmoe_status gfw_model_src_build(const mmoe_model *m, gfw_model_src *src, mmoe_error *err)
{
    memset(src, 0, sizeof *src);
    const mmoe_config *c = &m->cfg;
    src->D = c->dim;
    src->V = c->vocab_size;
    src->hc = c->hc_mult;
    src->n_layers = c->n_layers;
    src->n_blocks = m->n_blocks;
    src->sinkhorn_iters = c->hc_sinkhorn_iters;
    src->norm_eps = (float)c->norm_eps;
    src->hc_eps = (float)c->hc_eps;
    src->max_seq_len = c->max_seq_len;
    src->embed = m->embed.data;
    src->head_w = m->head_w.data;
    src->hc_head = hc_of(&m->head.hc, c->hc_mult, 1);
    mmoe_status st = dense_of(&m->head.norm, NULL, 0, "norm", &src->head_norm, err);
    if (st != MMOE_OK)
        return st;
    if (m->embed.dtype != MMOE_DT_BF16 || m->head_w.dtype != MMOE_DT_BF16)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "gpu forward: embed/head must be BF16");
    src->blocks = calloc((size_t)m->n_blocks, sizeof *src->blocks);
    if (!src->blocks)
        return mmoe_error_set(err, MMOE_ENOMEM, "gpu forward: out of memory");
    for (int L = 0; L < m->n_blocks && st == MMOE_OK; L++)
        st = block_of(m, L, &src->blocks[L], err);
    if (st == MMOE_OK && c->n_mtp_layers > 0) {
        const model_mtp *t = &m->mtp[0];
        src->has_mtp = 1;
        src->mtp.e_proj = fp8_of(&t->e_proj, &t->e_proj_scale, c->weight_block_n);
        src->mtp.h_proj = fp8_of(&t->h_proj, &t->h_proj_scale, c->weight_block_n);
        src->mtp.hc_head = hc_of(&t->head.hc, c->hc_mult, 1);
        if ((st = dense_of(&t->enorm, NULL, 0, "mtp enorm", &src->mtp.enorm, err)) == MMOE_OK &&
            (st = dense_of(&t->hnorm, NULL, 0, "mtp hnorm", &src->mtp.hnorm, err)) == MMOE_OK)
            st = dense_of(&t->head.norm, NULL, 0, "mtp norm", &src->mtp.norm, err);
    }
    if (st != MMOE_OK)
        gfw_model_src_free(src);
    return st;
}

void gfw_model_src_free(gfw_model_src *src)
{
    if (src->blocks)
        for (int L = 0; L < src->n_blocks; L++) {
            gfw_moe *g = &src->blocks[L].moe;
            free(g->w1);
            free(g->w3);
            free(g->w2);
            free(g->s1);
            free(g->s3);
            free(g->s2);
            free(g->tid2eid);
            free(g->ss1);
            free(g->ss3);
            free(g->ss2);
        }
    free(src->blocks);
    memset(src, 0, sizeof *src);
}
