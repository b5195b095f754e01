/**
 * @file model_load.c
 * @brief Opening a checkpoint directory: config, shards, the tensor check, binding the layers.
 *
 * Order of work, so that a broken checkpoint fails early and with a precise message:
 *
 * 1. `config.json` → ::mmoe_config (a bad key is named);
 * 2. mmoe_ckpt_open(): the index and every shard are opened, mapped and validated
 *    (a missing shard is named);
 * 3. every tensor of mmoe_model_tensor_list() is looked up and its dtype and shape
 *    compared (a missing or malformed tensor is named, with the expected and found
 *    dtype/shape) -- with a few documented alternatives where real checkpoints may
 *    differ from the published layout (norm weights F32 instead of BF16; `wo_a`
 *    already dequantized to BF16 by convert.py; `tid2eid` I32; experts U8);
 * 4. each layer's attention weights are bound through the attention binder (attn_params.c) and its
 *    MoE layer is created (recipe dsv4-ref, shared expert serial) and loaded through
 *    the MoE oracle's loader, both with a lookup into the checkpoint.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"
#include "mmoe_model_tensors.h"
#include "model_internal.h"

/** Lookup context: the checkpoint, and an optional prefix rewrite for the MTP block. */
typedef struct lookup_ctx {
    const mmoe_ckpt *ck; /**< the checkpoint */
    const char *from;    /**< e.g. "layers.43." */
    const char *to;      /**< e.g. "mtp.0." */
} lookup_ctx;

/** The lookup callback given to the attention binder and the MoE loader: mmoe_ckpt_lookup() after the MTP rewrite. */
static mmoe_status ckpt_lookup(void *vctx, const char *name, mmoe_tensor *out, mmoe_error *err)
{
    const lookup_ctx *ctx = vctx;
    char buf[256];
    if (ctx->from && strncmp(name, ctx->from, strlen(ctx->from)) == 0) {
        snprintf(buf, sizeof buf, "%s%s", ctx->to, name + strlen(ctx->from));
        name = buf;
    }
    return mmoe_ckpt_lookup((void *)ctx->ck, name, out, err);
}

/** Does a found tensor satisfy @p s, allowing the documented alternatives? */
static int dtype_ok(const mmoe_tensor_spec *s, mmoe_dtype found)
{
    if (found == s->dtype)
        return 1;
    if (s->role == MMOE_ROLE_NORM && found == MMOE_DT_F32)
        return 1;
    if (s->role == MMOE_ROLE_TID2EID && found == MMOE_DT_I32)
        return 1;
    if (s->dtype == MMOE_DT_I8 && found == MMOE_DT_U8)
        return 1;
    if ((s->role == MMOE_ROLE_HC_BASE || s->role == MMOE_ROLE_HC_SCALE) && found == MMOE_DT_BF16)
        return 1;
    return 0;
}

/** Is this one of the two `attn.wo_a` tensors? */
static int is_wo_a(const char *name) { return strstr(name, "attn.wo_a.") != NULL; }

/**
 * convert.py dequantizes `wo_a` to BF16 and drops its scale.  For the spec of `wo_a.weight`
 * or `wo_a.scale`: is the checkpoint in that form (BF16 weight of the expected shape)?
 */
static int wo_a_converted(const mmoe_ckpt *ck, const mmoe_tensor_spec *s, const mmoe_ckpt_entry *e)
{
    char wname[MMOE_TENSOR_NAME_LEN];
    snprintf(wname, sizeof wname, "%s", s->name);
    char *dot = strrchr(wname, '.');
    snprintf(dot, sizeof wname - (size_t)(dot - wname), ".weight");
    const mmoe_tensor *w = mmoe_ckpt_find(ck, wname);
    if (!w || w->dtype != MMOE_DT_BF16)
        return 0;
    if (s->role == MMOE_ROLE_SCALE)
        return 1;
    return e && e->view.ndim == 2 && e->view.shape[0] == s->shape[0] && e->view.shape[1] == s->shape[1];
}

/** Step 3: every expected tensor present with the right dtype and shape. */
static mmoe_status check_tensors(const mmoe_model *m, const char *dir, mmoe_error *err)
{
    mmoe_tensor_spec *specs = NULL;
    size_t n = 0;
    mmoe_status st = mmoe_model_tensor_list(&m->cfg, &specs, &n, err);
    if (st != MMOE_OK)
        return st;
    char want[96], got[96];
    for (size_t i = 0; i < n && st == MMOE_OK; i++) {
        const mmoe_tensor_spec *s = &specs[i];
        const mmoe_ckpt_entry *e = mmoe_ckpt_find_entry(m->ck, s->name);
        if (is_wo_a(s->name) && wo_a_converted(m->ck, s, e))
            continue; /* convert.py's bf16 wo_a (no scale) is accepted as well */
        if (!e) {
            st = mmoe_error_set(err, MMOE_ENOTFOUND, "checkpoint %s: missing tensor '%s' (expected %s %s)", dir,
                                s->name, mmoe_dtype_name(s->dtype), mmoe_shape_str(s->ndim, s->shape, want, sizeof want));
            break;
        }
        if (!dtype_ok(s, e->view.dtype)) {
            st = mmoe_error_set(err, MMOE_EDTYPE, "checkpoint %s: tensor '%s' in %s: expected dtype %s, found %s", dir,
                                s->name, e->shard, mmoe_dtype_name(s->dtype), mmoe_dtype_name(e->view.dtype));
            break;
        }
        int same = e->view.ndim == s->ndim;
        for (int d = 0; same && d < s->ndim; d++)
            same = e->view.shape[d] == s->shape[d];
        if (!same) {
            st = mmoe_error_set(err, MMOE_ESHAPE, "checkpoint %s: tensor '%s' in %s: expected shape %s, found %s",
                                dir, s->name, e->shard, mmoe_shape_str(s->ndim, s->shape, want, sizeof want),
                                mmoe_shape_str(e->view.ndim, e->view.shape, got, sizeof got));
            break;
        }
    }
    free(specs);
    return st;
}

/** A float vector/matrix of the checkpoint as fp32: borrowed if F32, else converted and owned. */
static mmoe_status f32_view(mmoe_model *m, const char *name, const float **out, mmoe_error *err)
{
    const mmoe_tensor *t = mmoe_ckpt_find(m->ck, name);
    if (!t)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "missing tensor '%s'", name);
    if (t->dtype == MMOE_DT_F32) {
        *out = t->data;
        return MMOE_OK;
    }
    if (t->dtype != MMOE_DT_BF16)
        return mmoe_error_set(err, MMOE_EDTYPE, "tensor '%s': expected F32 or BF16, found %s", name,
                              mmoe_dtype_name(t->dtype));
    int64_t n = mmoe_tensor_numel(t);
    float **no = realloc(m->owned, sizeof(float *) * (size_t)(m->n_owned + 1));
    if (!no)
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory converting '%s'", name);
    m->owned = no;
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v)
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory converting '%s'", name);
    mmoe_bf16_to_f32_row(t->data, (size_t)n, v);
    m->owned[m->n_owned++] = v;
    *out = v;
    return MMOE_OK;
}

/** The three mHC tensors `<pre><site>_fn/_base/_scale` as fp32 arrays. */
static mmoe_status bind_hc(mmoe_model *m, const char *pre, const char *site, model_hc *hc, mmoe_error *err)
{
    char n[128];
    mmoe_status st;
    snprintf(n, sizeof n, "%s%s_fn", pre, site);
    if ((st = f32_view(m, n, &hc->fn, err)) != MMOE_OK)
        return st;
    snprintf(n, sizeof n, "%s%s_base", pre, site);
    if ((st = f32_view(m, n, &hc->base, err)) != MMOE_OK)
        return st;
    snprintf(n, sizeof n, "%s%s_scale", pre, site);
    return f32_view(m, n, &hc->scale, err);
}

/** The view of tensor `<pre><name>` (already checked by check_tensors()). */
static mmoe_status get_view(const mmoe_model *m, const char *pre, const char *name, mmoe_tensor *out,
                            mmoe_error *err)
{
    char n[160];
    snprintf(n, sizeof n, "%s%s", pre, name);
    const mmoe_tensor *t = mmoe_ckpt_find(m->ck, n);
    if (!t)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "missing tensor '%s'", n);
    *out = *t;
    return MMOE_OK;
}

/** A head's mHC tensors and final norm. */
static mmoe_status bind_head(mmoe_model *m, const char *pre, model_head *h, mmoe_error *err)
{
    mmoe_status st = bind_hc(m, pre, "hc_head", &h->hc, err);
    if (st == MMOE_OK)
        st = get_view(m, pre, "norm.weight", &h->norm, err);
    return st;
}


/** Bind block @p layer: mHC, norms, attention (attn_params.c's binder) and the MoE layer. */
static mmoe_status bind_block(mmoe_model *m, int layer, mmoe_error *err)
{
    const mmoe_config *c = &m->cfg;
    model_block *b = &m->blocks[layer];
    b->layer = layer;
    int mtp = layer >= c->n_layers;
    if (mtp)
        snprintf(b->prefix, sizeof b->prefix, "mtp.%d.", layer - c->n_layers);
    else
        snprintf(b->prefix, sizeof b->prefix, "layers.%d.", layer);
    mmoe_status st = bind_hc(m, b->prefix, "hc_attn", &b->hc_attn, err);
    if (st == MMOE_OK)
        st = bind_hc(m, b->prefix, "hc_ffn", &b->hc_ffn, err);
    if (st == MMOE_OK)
        st = get_view(m, b->prefix, "attn_norm.weight", &b->attn_norm, err);
    if (st == MMOE_OK)
        st = get_view(m, b->prefix, "ffn_norm.weight", &b->ffn_norm, err);
    if (st != MMOE_OK)
        return st;

    /* attention: attn_params.c's binder, names "<prefix>attn.*" */
    mmoe_attn_params_from_config(c, mmoe_config_ratio(c, layer), &b->attn_p);
    if ((st = mmoe_attn_params_validate(&b->attn_p, err)) != MMOE_OK)
        return st;
    lookup_ctx lc = {m->ck, NULL, NULL};
    char apre[48];
    snprintf(apre, sizeof apre, "%sattn", b->prefix);
    if ((st = mmoe_attn_weights_bind(&b->attn_p, apre, ckpt_lookup, &lc, &b->attn_w, err)) != MMOE_OK)
        return st;

    /* MoE: the oracle's loader, names "layers.L.ffn.*" (MTP: rewritten to "mtp.i.ffn.*") */
    if (c->score_func != MMOE_SCORE_SQRTSOFTPLUS)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                              "config: key 'scoring_func' = %s: the MoE oracle implements sqrtsoftplus only",
                              mmoe_score_func_name(c->score_func));
    if (c->expert_dtype == MMOE_EXPERT_FP8)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                              "config: key 'expert_dtype' = fp8: the MoE oracle implements FP4 experts only");
    mmoe_moe_desc d;
    mmoe_moe_desc_init(&d);
    d.hidden = c->dim;
    d.inter = c->moe_inter_dim;
    d.n_experts = c->n_routed_experts;
    d.topk = c->n_activated_experts;
    d.n_shared = c->n_shared_experts;
    d.shared_inter = c->moe_inter_dim;
    d.shared_block = c->weight_block_n;
    d.routed_scaling_factor = (float)c->route_scale;
    d.swiglu_limit = (float)c->swiglu_limit;
    d.scoring = MMOE_SCORING_SQRTSOFTPLUS;
    b->hash = layer < c->n_hash_layers;
    d.routing = b->hash ? MMOE_ROUTING_HASH : MMOE_ROUTING_BIASED;
    d.vocab = c->vocab_size;
    d.recipe = MMOE_RECIPE_DSV4_REF;
    d.math = MMOE_MATH_PRECISE;
    d.shared_mode = MMOE_SHARED_SERIAL; /* the reference's shared expert is a plain FP8 linear */
    d.pad_to = 0;
    /* one pool for all layers: they run one after another (moe_dequant_pool.c, "Sharing") */
    if ((st = mmoe_moe_layer_create_on_pool(&d, m->moe_pool, &b->moe, err)) != MMOE_OK)
        return st;
    char from[32];
    snprintf(from, sizeof from, "layers.%d.", layer);
    lookup_ctx mc = {m->ck, mtp ? from : NULL, mtp ? b->prefix : NULL};
    return mmoe_moe_layer_load(b->moe, ckpt_lookup, &mc, layer, err);
}

/** The MTP block's input projections, norms and head. */
static mmoe_status bind_mtp(mmoe_model *m, int i, mmoe_error *err)
{
    model_mtp *t = &m->mtp[i];
    char pre[32];
    snprintf(pre, sizeof pre, "mtp.%d.", i);
    mmoe_status st = get_view(m, pre, "e_proj.weight", &t->e_proj, err);
    if (st == MMOE_OK)
        st = get_view(m, pre, "e_proj.scale", &t->e_proj_scale, err);
    if (st == MMOE_OK)
        st = get_view(m, pre, "h_proj.weight", &t->h_proj, err);
    if (st == MMOE_OK)
        st = get_view(m, pre, "h_proj.scale", &t->h_proj_scale, err);
    if (st == MMOE_OK)
        st = get_view(m, pre, "enorm.weight", &t->enorm, err);
    if (st == MMOE_OK)
        st = get_view(m, pre, "hnorm.weight", &t->hnorm, err);
    if (st == MMOE_OK)
        st = bind_head(m, pre, &t->head, err);
    return st;
}

mmoe_status mmoe_model_open(const char *dir, mmoe_model_progress_fn progress, void *progress_ctx,
                            mmoe_model **out, mmoe_error *err)
{
    *out = NULL;
    mmoe_model *m = calloc(1, sizeof *m);
    if (!m)
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmoe_status st = mmoe_config_load(path, &m->cfg, err);
    if (st == MMOE_OK && progress)
        progress(progress_ctx, 0, m->cfg.n_layers + m->cfg.n_mtp_layers, "mapping shards");
    if (st == MMOE_OK)
        st = mmoe_ckpt_open(dir, &m->ck, err);
    /* an unset expert_dtype is decided by the checkpoint (the initial V4-Flash config lacks the key) */
    if (st == MMOE_OK && m->cfg.expert_dtype == MMOE_EXPERT_UNSET) {
        const mmoe_tensor *w1 = mmoe_ckpt_find(m->ck, "layers.0.ffn.experts.0.w1.weight");
        m->cfg.expert_dtype = (w1 && w1->dtype == MMOE_DT_F8_E4M3) ? MMOE_EXPERT_FP8 : MMOE_EXPERT_FP4;
    }
    if (st == MMOE_OK)
        st = check_tensors(m, dir, err);
    if (st != MMOE_OK)
        goto fail;
    for (size_t i = 0; i < mmoe_ckpt_count(m->ck); i++)
        m->weight_bytes += mmoe_ckpt_get(m->ck, i)->view.nbytes;
    m->hcp.hc = m->cfg.hc_mult;
    m->hcp.dim = m->cfg.dim;
    m->hcp.sinkhorn_iters = m->cfg.hc_sinkhorn_iters;
    m->hcp.norm_eps = (float)m->cfg.norm_eps;
    m->hcp.hc_eps = (float)m->cfg.hc_eps;
    m->embed = *mmoe_ckpt_find(m->ck, "embed.weight");
    m->head_w = *mmoe_ckpt_find(m->ck, "head.weight");
    if ((st = bind_head(m, "", &m->head, err)) != MMOE_OK)
        goto fail;
    m->n_blocks = m->cfg.n_layers + m->cfg.n_mtp_layers;
    m->blocks = calloc((size_t)m->n_blocks, sizeof *m->blocks);
    m->mtp = calloc((size_t)(m->cfg.n_mtp_layers ? m->cfg.n_mtp_layers : 1), sizeof *m->mtp);
    if (!m->blocks || !m->mtp) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
        goto fail;
    }
    if ((st = mmoe_moe_pool_create(0, &m->moe_pool, err)) != MMOE_OK)
        goto fail;
    for (int L = 0; L < m->n_blocks; L++) {
        if ((st = bind_block(m, L, err)) != MMOE_OK) {
            mmoe_error_prefix(err, "checkpoint %s: %s: ", dir, m->blocks[L].prefix);
            goto fail;
        }
        if (progress)
            progress(progress_ctx, L + 1, m->n_blocks, m->blocks[L].prefix);
    }
    for (int i = 0; i < m->cfg.n_mtp_layers; i++)
        if ((st = bind_mtp(m, i, err)) != MMOE_OK)
            goto fail;
    *out = m;
    return MMOE_OK;
fail:
    mmoe_model_close(m);
    return st;
}

void mmoe_model_close(mmoe_model *m)
{
    if (!m)
        return;
    if (m->blocks)
        for (int L = 0; L < m->n_blocks; L++)
            mmoe_moe_layer_destroy(m->blocks[L].moe);
    mmoe_moe_pool_destroy(m->moe_pool);
    free(m->blocks);
    free(m->mtp);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    mmoe_ckpt_close(m->ck);
    free(m);
}

const mmoe_config *mmoe_model_config(const mmoe_model *m) { return &m->cfg; }

void mmoe_model_set_moe_executor(mmoe_model *m, mmoe_model_moe_fn fn, void *ctx)
{
    m->moe_fn = fn;
    m->moe_ctx = ctx;
}

void mmoe_model_set_observer(mmoe_model *m, mmoe_model_observer fn, void *ctx)
{
    m->obs_fn = fn;
    m->obs_ctx = ctx;
}

int mmoe_model_n_blocks(const mmoe_model *m) { return m->n_blocks; }

mmoe_status mmoe_model_moe_layer(const mmoe_model *m, int block, mmoe_moe_desc *desc, mmoe_moe_weights *w,
                                 mmoe_error *err)
{
    if (block < 0 || block >= m->n_blocks)
        return mmoe_error_set(err, MMOE_EINVAL, "model: block %d outside [0, %d)", block, m->n_blocks);
    const model_block *b = &m->blocks[block];
    *desc = *mmoe_moe_layer_desc(b->moe);
    /* the names bind_block() used: "layers.L." rewritten to the MTP prefix for MTP blocks */
    char from[32];
    snprintf(from, sizeof from, "layers.%d.", block);
    const int mtp = block >= m->cfg.n_layers;
    lookup_ctx mc = {m->ck, mtp ? from : NULL, mtp ? b->prefix : NULL};
    return mmoe_moe_weights_lookup(desc, ckpt_lookup, &mc, block, w, err);
}

uint64_t mmoe_model_weight_bytes(const mmoe_model *m) { return m->weight_bytes; }

int mmoe_model_worker_threads(const mmoe_model *m) { return mmoe_moe_pool_threads(m->moe_pool); }
