/**
 * @file model_forward.c
 * @brief The forward pass of the whole model: embedding, blocks, head, MTP, and the per-sequence state.
 *
 * Buffers of one call (all bf16 bit patterns unless noted, T rows):
 *
 *     X     [T, hc, D]  the residual streams (updated in place by hc_post)
 *     y     [T, D]      hc_pre output, then the sub-layer's RMSNorm output (in place)
 *     o     [T, D]      the sub-layer output
 *     post  [T, hc] f32, comb [T, hc, hc] f32   the mHC write-back weights
 *
 * A block is exactly the six lines of a block (@ref spec_arch_mhc).  Each rounding point
 * is inside the callee that owns it: hc_pre/hc_post round to bf16 once
 * (mmoe_mhc.h), RMSNorm rounds its output, attention and MoE return bf16.
 */
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "mmoe_clock.h"
#include "fmt_minifloat.h"
#include "mmoe_formats.h"
#include "mmoe_linear.h"
#include "model_internal.h"

/* ------------------------------------------------------------------ state */

mmoe_status mmoe_model_state_create(const mmoe_model *m, int64_t max_seq_len, mmoe_model_state **out,
                                    mmoe_error *err)
{
    *out = NULL;
    if (max_seq_len <= 0)
        max_seq_len = m->cfg.max_seq_len;
    mmoe_model_state *s = calloc(1, sizeof *s);
    if (!s)
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
    s->m = m;
    s->max_seq_len = max_seq_len;
    s->caches = calloc((size_t)m->n_blocks, sizeof *s->caches);
    s->attn_s = calloc((size_t)m->n_blocks, sizeof(double));
    s->moe_s = calloc((size_t)m->n_blocks, sizeof(double));
    s->mhc_s = calloc((size_t)m->n_blocks, sizeof(double));
    s->scratch = mmoe_attn_scratch_create();
    mmoe_status st = MMOE_OK;
    if (!s->caches || !s->attn_s || !s->moe_s || !s->mhc_s || !s->scratch)
        st = mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
    else
        mmoe_attn_scratch_set_pool(s->scratch, m->moe_pool); /* the attention's linears share the MoE's threads */
    for (int L = 0; L < m->n_blocks && st == MMOE_OK; L++) {
        st = mmoe_attn_cache_create(&m->blocks[L].attn_p, max_seq_len, &s->caches[L], err);
        if (st != MMOE_OK)
            mmoe_error_prefix(err, "%s: ", m->blocks[L].prefix);
    }
    if (st != MMOE_OK) {
        mmoe_model_state_destroy(s);
        return st;
    }
    *out = s;
    return MMOE_OK;
}

void mmoe_model_state_destroy(mmoe_model_state *s)
{
    if (!s)
        return;
    if (s->caches)
        for (int L = 0; L < s->m->n_blocks; L++)
            mmoe_attn_cache_destroy(s->caches[L]);
    free(s->caches);
    free(s->attn_s);
    free(s->moe_s);
    free(s->mhc_s);
    mmoe_attn_scratch_destroy(s->scratch);
    free(s);
}

void mmoe_model_state_reset(mmoe_model_state *s)
{
    for (int L = 0; L < s->m->n_blocks; L++) {
        mmoe_attn_cache_reset(s->caches[L]);
        s->attn_s[L] = s->moe_s[L] = s->mhc_s[L] = 0.0;
    }
    s->pos = 0;
    s->embed_s = s->head_s = 0.0;
}

int64_t mmoe_model_state_pos(const mmoe_model_state *s) { return s->pos; }

size_t mmoe_model_state_bytes(const mmoe_model_state *s)
{
    size_t b = 0;
    for (int L = 0; L < s->m->n_blocks; L++)
        b += mmoe_attn_cache_bytes(s->caches[L]);
    return b;
}

void mmoe_model_state_timings(const mmoe_model_state *s, mmoe_model_timings *out)
{
    out->n_layers = s->m->n_blocks;
    out->attn_s = s->attn_s;
    out->moe_s = s->moe_s;
    out->mhc_s = s->mhc_s;
    out->embed_s = s->embed_s;
    out->head_s = s->head_s;
}

/* ------------------------------------------------------------------ one block */

/** Working memory of one forward call. */
typedef struct fwd_buf {
    uint16_t *X;   /**< streams bf16 [T, hc, D] */
    uint16_t *y;   /**< sub-layer input bf16 [T, D] */
    uint16_t *o;   /**< sub-layer output bf16 [T, D] */
    float *post;   /**< [T, hc] */
    float *comb;   /**< [T, hc, hc] */
} fwd_buf;

/** Allocate the buffers of a T-token call. */
static mmoe_status buf_alloc(const mmoe_model *m, int64_t T, fwd_buf *b, mmoe_error *err)
{
    const size_t D = (size_t)m->cfg.dim, hc = (size_t)m->cfg.hc_mult, t = (size_t)T;
    b->X = malloc(sizeof(uint16_t) * t * hc * D);
    b->y = malloc(sizeof(uint16_t) * t * D);
    b->o = malloc(sizeof(uint16_t) * t * D);
    b->post = malloc(sizeof(float) * t * hc);
    b->comb = malloc(sizeof(float) * t * hc * hc);
    if (!b->X || !b->y || !b->o || !b->post || !b->comb)
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory for %lld tokens", (long long)T);
    return MMOE_OK;
}

/** Free what buf_alloc() made (also after a partial failure). */
static void buf_free(fwd_buf *b)
{
    free(b->X);
    free(b->y);
    free(b->o);
    free(b->post);
    free(b->comb);
}

/** Tell the model's observer (if any) that sub-layer @p which of block @p L ran. */
static mmoe_status observe(const mmoe_model *m, int L, mmoe_sublayer which, int64_t pos, int64_t T,
                           const fwd_buf *b, mmoe_error *err)
{
    if (m->obs_fn == NULL || m->obs_fn(m->obs_ctx, L, which, pos, T, b->y, b->o) == 0)
        return MMOE_OK;
    return mmoe_error_set(err, MMOE_EINVAL, "forward: the observer stopped the forward after block %d's %s", L,
                          which == MMOE_SUBLAYER_ATTENTION ? "attention" : "MoE");
}

/** Spec 3.2 "Block": attention sub-layer, then MoE sub-layer, each wrapped in hc_pre / hc_post. */
static mmoe_status run_block(const mmoe_model *m, mmoe_model_state *s, int L, const int32_t *ids, int64_t pos,
                             int64_t T, fwd_buf *b, mmoe_error *err)
{
    const model_block *blk = &m->blocks[L];
    const mmoe_hc_params *hp = &m->hcp;
    const int64_t D = m->cfg.dim;
    const float eps = (float)m->cfg.norm_eps;
    double t0 = mmoe_clock_s();
    mmoe_hc_pre_pool(m->moe_pool, hp, b->X, T, blk->hc_attn.fn, blk->hc_attn.base, blk->hc_attn.scale, b->y, b->post,
                     b->comb);
    double t1 = mmoe_clock_s();
    mmoe_rmsnorm_bf16(b->y, T, D, &blk->attn_norm, eps, b->y);
    mmoe_tensor xin = mmoe_tensor_view2(MMOE_DT_BF16, T, D, b->y), xout = mmoe_tensor_view2(MMOE_DT_BF16, T, D, b->o);
    mmoe_status st = mmoe_attention_forward(&blk->attn_p, &blk->attn_w, s->caches[L], &xin, pos, T, &xout,
                                            s->scratch, err);
    if (st != MMOE_OK)
        return mmoe_error_prefix(err, "%sattn: ", blk->prefix);
    if ((st = observe(m, L, MMOE_SUBLAYER_ATTENTION, pos, T, b, err)) != MMOE_OK)
        return st;
    double t2 = mmoe_clock_s();
    mmoe_hc_post_pool(m->moe_pool, hp, b->o, b->X, T, b->post, b->comb, b->X);
    mmoe_hc_pre_pool(m->moe_pool, hp, b->X, T, blk->hc_ffn.fn, blk->hc_ffn.base, blk->hc_ffn.scale, b->y, b->post,
                     b->comb);
    double t3 = mmoe_clock_s();
    mmoe_rmsnorm_bf16(b->y, T, D, &blk->ffn_norm, eps, b->y);
    mmoe_moe_input in = {T, b->y, blk->hash ? ids : NULL, NULL, NULL};
    mmoe_moe_output out = {b->o, NULL, NULL};
    st = m->moe_fn != NULL ? m->moe_fn(m->moe_ctx, L, &in, &out, err) : mmoe_moe_layer_run(blk->moe, &in, &out, NULL, err);
    if (st != MMOE_OK)
        return mmoe_error_prefix(err, "%sffn: ", blk->prefix);
    if ((st = observe(m, L, MMOE_SUBLAYER_MOE, pos, T, b, err)) != MMOE_OK)
        return st;
    double t4 = mmoe_clock_s();
    mmoe_hc_post_pool(m->moe_pool, hp, b->o, b->X, T, b->post, b->comb, b->X);
    double t5 = mmoe_clock_s();
    s->mhc_s[L] += (t1 - t0) + (t3 - t2) + (t5 - t4);
    s->attn_s[L] += t2 - t1;
    s->moe_s[L] += t4 - t3;
    return MMOE_OK;
}

/* ------------------------------------------------------------------ forward */

/** Every id in [0, vocab_size)? The message names the first bad one. */
static mmoe_status check_ids(const mmoe_model *m, const int32_t *ids, int64_t T, mmoe_error *err)
{
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= m->cfg.vocab_size)
            return mmoe_error_set(err, MMOE_EINVAL, "token %lld: id %d is outside the vocabulary [0, %lld)",
                                  (long long)t, ids[t], (long long)m->cfg.vocab_size);
    return MMOE_OK;
}

mmoe_status mmoe_model_embed(const mmoe_model *m, const int32_t *ids, int64_t T, uint16_t *h, mmoe_error *err)
{
    mmoe_status st = check_ids(m, ids, T, err);
    if (st != MMOE_OK)
        return st;
    const int64_t D = m->cfg.dim;
    const uint16_t *E = m->embed.data;
    for (int64_t t = 0; t < T; t++)
        memcpy(h + t * D, E + (int64_t)ids[t] * D, sizeof(uint16_t) * (size_t)D);
    return MMOE_OK;
}

mmoe_status mmoe_model_forward(mmoe_model *m, mmoe_model_state *s, const int32_t *ids, int64_t T, float *logits,
                               int last_only, uint16_t *streams, mmoe_error *err)
{
    if (T < 1)
        return mmoe_error_set(err, MMOE_EINVAL, "forward: T = %lld, expected >= 1", (long long)T);
    if (s->pos + T > s->max_seq_len)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "forward: positions %lld..%lld exceed the state's max_seq_len %lld",
                              (long long)s->pos, (long long)(s->pos + T - 1), (long long)s->max_seq_len);
    mmoe_status st = check_ids(m, ids, T, err);
    if (st != MMOE_OK)
        return st;
    fwd_buf b = {0};
    if ((st = buf_alloc(m, T, &b, err)) != MMOE_OK)
        goto done;
    double t0 = mmoe_clock_s();
    mmoe_model_embed(m, ids, T, b.y, err); /* ids checked above */
    mmoe_hc_expand(&m->hcp, b.y, T, b.X);
    s->embed_s += mmoe_clock_s() - t0;
    for (int L = 0; L < m->cfg.n_layers && st == MMOE_OK; L++)
        st = run_block(m, s, L, ids, s->pos, T, &b, err);
    if (st != MMOE_OK)
        goto done;
    s->pos += T;
    if (streams)
        memcpy(streams, b.X, sizeof(uint16_t) * (size_t)(T * m->cfg.hc_mult * m->cfg.dim));
    if (logits) {
        t0 = mmoe_clock_s();
        int64_t first = last_only ? T - 1 : 0;
        st = mmoe_model_head_logits(m, &m->head, b.X + first * m->cfg.hc_mult * m->cfg.dim, T - first, logits, b.y,
                                    err);
        s->head_s += mmoe_clock_s() - t0;
    }
done:
    buf_free(&b);
    return st;
}

mmoe_status mmoe_model_mtp_forward(mmoe_model *m, mmoe_model_state *s, const uint16_t *streams,
                                   const int32_t *next_ids, int64_t T, float *logits, mmoe_error *err)
{
    const mmoe_config *c = &m->cfg;
    if (c->n_mtp_layers < 1)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "mtp: the model has no MTP layer");
    if (T < 1)
        return mmoe_error_set(err, MMOE_EINVAL, "mtp: T = %lld, expected >= 1", (long long)T);
    const int L = c->n_layers;
    int64_t pos = mmoe_attn_cache_next_pos(s->caches[L]);
    if (pos + T > s->max_seq_len)
        return mmoe_error_set(err, MMOE_EINVAL, "mtp: positions beyond the state's max_seq_len %lld",
                              (long long)s->max_seq_len);
    mmoe_status st = check_ids(m, next_ids, T, err);
    if (st != MMOE_OK)
        return st;
    const model_mtp *t = &m->mtp[0];
    const int64_t D = c->dim, hc = c->hc_mult;
    const float eps = (float)c->norm_eps;
    fwd_buf b = {0};
    uint16_t *e = malloc(sizeof(uint16_t) * (size_t)(T * D));
    uint16_t *hn = malloc(sizeof(uint16_t) * (size_t)(T * hc * D));
    uint16_t *hp = malloc(sizeof(uint16_t) * (size_t)(T * hc * D));
    if (!e || !hn || !hp) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
        goto done;
    }
    if ((st = buf_alloc(m, T, &b, err)) != MMOE_OK)
        goto done;
    /* e = e_proj(enorm(embed(ids))): one row per token */
    mmoe_model_embed(m, next_ids, T, b.y, err); /* ids checked above */
    mmoe_rmsnorm_bf16(b.y, T, D, &t->enorm, eps, b.y);
    if ((st = attn_linear_fp8(m->moe_pool, moe_dot_isa_best(), b.y, T, &t->e_proj, &t->e_proj_scale,
                              c->weight_block_n, e, err)) != MMOE_OK)
        goto done;
    /* h = h_proj(hnorm(X)): hnorm per stream (RMSNorm over D), one row per (token, stream) */
    mmoe_rmsnorm_bf16(streams, T * hc, D, &t->hnorm, eps, hn);
    if ((st = attn_linear_fp8(m->moe_pool, moe_dot_isa_best(), hn, T * hc, &t->h_proj, &t->h_proj_scale,
                              c->weight_block_n, hp, err)) != MMOE_OK)
        goto done;
    /* X' = bf16(e + h), e broadcast over the streams */
    for (int64_t r = 0; r < T; r++)
        for (int64_t j = 0; j < hc; j++)
            for (int64_t k = 0; k < D; k++) {
                size_t i = (size_t)((r * hc + j) * D + k);
                b.X[i] = mmoe_bf16_from_f32(fmt_bf16_to_f32(e[r * D + k]) + fmt_bf16_to_f32(hp[i]));
            }
    if ((st = run_block(m, s, L, next_ids, pos, T, &b, err)) != MMOE_OK)
        goto done;
    if (logits)
        st = mmoe_model_head_logits(m, &t->head, b.X, T, logits, b.y, err);
done:
    free(e);
    free(hn);
    free(hp);
    buf_free(&b);
    return st;
}
