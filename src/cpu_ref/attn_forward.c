/**
 * @file attn_forward.c
 * @brief The attention sub-layer, assembled: q path, kv path, compressors, indexer, sparse attention, output.
 *
 * For the T tokens of a call (positions p = start_pos + t), in the reference's
 * order (@ref spec_arch_attention to @ref spec_arch_indexer):
 *
 * **Row-parallel projections** (every row independent of the others):
 *
 *     qr = q_norm(wq_a(x))                        FP8 linear + RMSNorm, bf16 [q_lora]
 *     q  = wq_b(qr)                               FP8 linear, bf16 [H, d]
 *     q_h = q_h * rsqrt(mean(q_h^2) + eps)        per head, in bf16 arithmetic (below)
 *     RoPE(q_h[d-r:], p)
 *     kv = kv_norm(wkv(x)); RoPE(kv[d-r:], p)     FP8 linear + RMSNorm, bf16 [d]
 *     kv[:d-r] = FP8 round trip (block 64)        the cache's QAT simulation
 *     ratio > 0: compressor kv/gate = fp32 matmuls of x (width c*d)
 *     ratio 4:   qi = FP4(Hadamard(RoPE(idx_wq_b(qr))))  per indexer head
 *                wi = bf16(bf16(weights_proj(x)) * (ihd * ihn)^-0.5)
 *                indexer compressor kv/gate (width 2*ihd)
 *
 * The per-head q scaling is done with bf16 tensor ops in the reference: each q^2 is
 * rounded to bf16, their mean (fp32 sum; here a double sum in the order of
 * @ref spec_arch_sum_order, then fp32) is rounded to bf16, + eps rounded to bf16,
 * rsqrt rounded to bf16, and the product q * rsqrt rounded to bf16.
 *
 * **Token-sequential part** (each token t in order):
 *  1. its kv goes into the window ring buffer (slot p mod window);
 *  2. the compressor(s) buffer the token; a block completed by it (p+1 multiple of r)
 *     is pooled, finished and stored, and is visible to this same token;
 *  3. the index list: window positions max(0, p-window+1) .. p (oldest first), then
 *     the compressed blocks: HCA all j < (p+1)/128 ascending; CSA the indexer's
 *     top-min(index_topk, (p+1)/4) blocks in descending score order;
 *  4. sparse attention with the sink (attn_sparse.c), scale d^-0.5;
 *  5. inverse RoPE of each head's last r dims at p.
 *
 * **Row-parallel output**: the grouped projection (attn_out_proj.c).
 *
 * Because every token first extends the cache and then attends by reading only the
 * cache, a prefill of T tokens executes exactly the arithmetic of T single-token
 * decode calls: the outputs agree bit for bit (the test suite checks this).  The
 * reference's own prefill differs from its decode only in fp32 rounding (its prefill
 * index lists carry -1 padding, which shifts the 64-entry chunk boundaries of the
 * online softmax); docs/attention.md records this decision.
 */
#include "attn_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_minifloat.h"
#include "mmoe_formats.h"
#include "mmoe_sum_order.h"

/** Sizes of one call's working memory. */
typedef struct fwd_sizes {
    int64_t T;       /**< tokens of the call */
    int64_t D;       /**< model width */
    int64_t H;       /**< query heads */
    int64_t d;       /**< head width */
    int64_t q;       /**< q_lora_rank */
    int64_t hd;      /**< H * d */
    int64_t c_width; /**< compressor projection width c*d */
    int64_t ih;      /**< indexer heads */
    int64_t id;      /**< indexer head width */
    int64_t i_width; /**< indexer compressor width 2*id */
    int64_t n_list;  /**< longest index list: window + blocks */
    int64_t gr;      /**< G * o_lora_rank */
    int64_t threads; /**< threads of the scratch's pool (per-thread buffers of the sparse attention) */
} fwd_sizes;

/** Everything a call carves from the scratch. */
typedef struct fwd_bufs {
    uint16_t *xb;            /**< bf16 input [T, D] */
    uint16_t *qr;            /**< q latent [T, q_lora] */
    uint16_t *q;             /**< queries [T, H, d] */
    uint16_t *kv;            /**< raw kv [T, d] */
    uint16_t *o;             /**< attention output [T, H, d] */
    uint16_t *z;             /**< wo_a latents [T, G*o_lora] */
    uint16_t *outb;          /**< bf16 output [T, D] */
    float *ckv;              /**< compressor kv projection [T, c*d] (ratio > 0) */
    float *cgate;            /**< compressor gate projection [T, c*d] (ratio > 0) */
    uint16_t *qi;            /**< indexer queries [T, ih, id] (ratio 4) */
    uint16_t *wi;            /**< indexer head weights [T, ih] (ratio 4) */
    float *ikv;              /**< indexer compressor kv [T, 2*id] (ratio 4) */
    float *igate;            /**< indexer compressor gate [T, 2*id] (ratio 4) */
    const uint16_t **rows;   /**< the index list of one token */
    float *idx_scores;       /**< indexer scores of one token */
    attn_scored *topk_work;  /**< top-k work space */
    int64_t *topk_idx;       /**< top-k result */
    float *acc;              /**< sparse attention scratch [threads][ATTN_SPARSE_SCRATCH_FLOATS(d)] */
    float *chunk_scores;     /**< scores of one online-softmax chunk [threads][chunk] */
    float *pooled;           /**< a pooled compressor block [d] */
} fwd_bufs;

/** The bytes every piece needs (in carving order), summed. */
static size_t scratch_bytes(const fwd_sizes *s, int ratio, size_t *pieces, int *n_pieces)
{
    int n = 0;
    pieces[n++] = sizeof(uint16_t) * (size_t)(s->T * s->D);        /* xb */
    pieces[n++] = sizeof(uint16_t) * (size_t)(s->T * s->q);        /* qr */
    pieces[n++] = sizeof(uint16_t) * (size_t)(s->T * s->hd);       /* q */
    pieces[n++] = sizeof(uint16_t) * (size_t)(s->T * s->d);        /* kv */
    pieces[n++] = sizeof(uint16_t) * (size_t)(s->T * s->hd);       /* o */
    pieces[n++] = sizeof(uint16_t) * (size_t)(s->T * s->gr);       /* z */
    pieces[n++] = sizeof(uint16_t) * (size_t)(s->T * s->D);        /* outb */
    pieces[n++] = ratio > 0 ? sizeof(float) * (size_t)(s->T * s->c_width) : 0; /* ckv */
    pieces[n++] = ratio > 0 ? sizeof(float) * (size_t)(s->T * s->c_width) : 0; /* cgate */
    pieces[n++] = ratio == 4 ? sizeof(uint16_t) * (size_t)(s->T * s->ih * s->id) : 0; /* qi */
    pieces[n++] = ratio == 4 ? sizeof(uint16_t) * (size_t)(s->T * s->ih) : 0;         /* wi */
    pieces[n++] = ratio == 4 ? sizeof(float) * (size_t)(s->T * s->i_width) : 0;       /* ikv */
    pieces[n++] = ratio == 4 ? sizeof(float) * (size_t)(s->T * s->i_width) : 0;       /* igate */
    pieces[n++] = sizeof(uint16_t *) * (size_t)s->n_list;          /* rows */
    pieces[n++] = sizeof(float) * (size_t)(s->n_list + 1);         /* idx_scores */
    pieces[n++] = sizeof(attn_scored) * (size_t)(s->n_list + 1);   /* topk_work */
    pieces[n++] = sizeof(int64_t) * (size_t)(s->n_list + 1);       /* topk_idx */
    pieces[n++] = sizeof(float) * (size_t)(s->threads * ATTN_SPARSE_SCRATCH_FLOATS(s->d)); /* acc */
    pieces[n++] = sizeof(float) * (size_t)s->threads * ATTN_SPARSE_CHUNK; /* chunk_scores */
    pieces[n++] = sizeof(float) * (size_t)s->d;                    /* pooled */
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += attn_scratch_piece(pieces[i]);
    *n_pieces = n;
    return total;
}

/** Hand out the pieces of @p sc in the order of scratch_bytes(). */
static void carve(mmoe_attn_scratch *sc, const size_t *pieces, fwd_bufs *b)
{
    int i = 0;
    b->xb = attn_scratch_take(sc, pieces[i++]);
    b->qr = attn_scratch_take(sc, pieces[i++]);
    b->q = attn_scratch_take(sc, pieces[i++]);
    b->kv = attn_scratch_take(sc, pieces[i++]);
    b->o = attn_scratch_take(sc, pieces[i++]);
    b->z = attn_scratch_take(sc, pieces[i++]);
    b->outb = attn_scratch_take(sc, pieces[i++]);
    b->ckv = attn_scratch_take(sc, pieces[i++]);
    b->cgate = attn_scratch_take(sc, pieces[i++]);
    b->qi = attn_scratch_take(sc, pieces[i++]);
    b->wi = attn_scratch_take(sc, pieces[i++]);
    b->ikv = attn_scratch_take(sc, pieces[i++]);
    b->igate = attn_scratch_take(sc, pieces[i++]);
    b->rows = attn_scratch_take(sc, pieces[i++]);
    b->idx_scores = attn_scratch_take(sc, pieces[i++]);
    b->topk_work = attn_scratch_take(sc, pieces[i++]);
    b->topk_idx = attn_scratch_take(sc, pieces[i++]);
    b->acc = attn_scratch_take(sc, pieces[i++]);
    b->chunk_scores = attn_scratch_take(sc, pieces[i++]);
    b->pooled = attn_scratch_take(sc, pieces[i++]);
}

/** q_h <- q_h * rsqrt(mean(q_h^2) + eps), in the reference's bf16 arithmetic. */
static void scale_heads_bf16(uint16_t *q, int64_t n_heads, int64_t d, float eps)
{
    for (int64_t h = 0; h < n_heads; h++) {
        uint16_t *qh = q + h * d;
        mmoe_pairwise pw;
        mmoe_pairwise_init(&pw);
        for (int64_t c0 = 0; c0 < d; c0 += MMOE_SUM_CHUNK) {
            const int64_t c1 = d - c0 < MMOE_SUM_CHUNK ? d : c0 + MMOE_SUM_CHUNK;
            double part = 0.0;
            for (int64_t c = c0; c < c1; c++) {
                const float v = fmt_bf16_to_f32(qh[c]);
                part += (double)mmoe_bf16_round(v * v);
            }
            mmoe_pairwise_push(&pw, part);
        }
        const double sum = mmoe_pairwise_result(&pw);
        const float mean = mmoe_bf16_round((float)sum / (float)d);
        const float with_eps = mmoe_bf16_round(mean + eps);
        const float rs = mmoe_bf16_round(1.0f / sqrtf(with_eps));
        for (int64_t c = 0; c < d; c++)
            qh[c] = mmoe_bf16_from_f32(fmt_bf16_to_f32(qh[c]) * rs);
    }
}

/** RoPE (or its inverse) on the last rope_dim dims of each of @p n_heads rows of width @p width. */
static void rope_heads(uint16_t *x, int64_t n_heads, int64_t width, int rope_dim, const float *freqs,
                       int64_t pos, int inverse)
{
    float cos_v[ATTN_MAX_ROPE_DIM / 2], sin_v[ATTN_MAX_ROPE_DIM / 2];
    attn_rope_cos_sin(freqs, rope_dim / 2, pos, cos_v, sin_v);
    for (int64_t h = 0; h < n_heads; h++)
        attn_rope_rotate_bf16(x + h * width + width - rope_dim, rope_dim, cos_v, sin_v, inverse);
}

/** Check the x / out tensors against [T, D]. */
static mmoe_status check_io(const mmoe_tensor *t, const char *what, int64_t T, int64_t D,
                            mmoe_error *err)
{
    const int64_t shape[2] = {T, D};
    return mmoe_tensor_expect(t, what, t->dtype == MMOE_DT_F32 ? MMOE_DT_F32 : MMOE_DT_BF16, 2,
                              shape, err);
}

/** The row-parallel projections of the file comment. */
static mmoe_status project_rows(moe_dequant_pool *pool, const mmoe_attn_params *p, const mmoe_attn_weights *w,
                                const fwd_sizes *s, int64_t start_pos, const float *freqs, fwd_bufs *b,
                                mmoe_error *err)
{
    const moe_dot_isa isa = moe_dot_isa_best();
    const float eps = (float)p->norm_eps;
    const int64_t T = s->T;
    mmoe_status st;
    if ((st = attn_linear_fp8(pool, isa, b->xb, T, &w->wq_a, &w->wq_a_scale, p->weight_block, b->qr, err)) != MMOE_OK)
        return mmoe_error_prefix(err, "attention wq_a: ");
    mmoe_rmsnorm_bf16(b->qr, T, s->q, &w->q_norm, eps, b->qr);
    if ((st = attn_linear_fp8(pool, isa, b->qr, T, &w->wq_b, &w->wq_b_scale, p->weight_block, b->q, err)) != MMOE_OK)
        return mmoe_error_prefix(err, "attention wq_b: ");
    if ((st = attn_linear_fp8(pool, isa, b->xb, T, &w->wkv, &w->wkv_scale, p->weight_block, b->kv, err)) != MMOE_OK)
        return mmoe_error_prefix(err, "attention wkv: ");
    mmoe_rmsnorm_bf16(b->kv, T, s->d, &w->kv_norm, eps, b->kv);
    for (int64_t t = 0; t < T; t++) {
        const int64_t pos = start_pos + t;
        scale_heads_bf16(b->q + t * s->hd, s->H, s->d, eps);
        rope_heads(b->q + t * s->hd, s->H, s->d, p->rope_dim, freqs, pos, 0);
        rope_heads(b->kv + t * s->d, 1, s->d, p->rope_dim, freqs, pos, 0);
        mmoe_roundtrip_fp8_bf16(b->kv + t * s->d, s->d - p->rope_dim, 64);
    }
    if (p->compress_ratio > 0) {
        const mmoe_compressor_weights *c = &w->compressor;
        if ((st = attn_linear_dense(pool, b->xb, T, s->D, &c->wkv, s->c_width, b->ckv, NULL, err)) != MMOE_OK ||
            (st = attn_linear_dense(pool, b->xb, T, s->D, &c->wgate, s->c_width, b->cgate, NULL, err)) != MMOE_OK)
            return mmoe_error_prefix(err, "attention compressor: ");
    }
    if (p->compress_ratio == 4) {
        const mmoe_compressor_weights *c = &w->idx_compressor;
        if ((st = attn_linear_fp8(pool, isa, b->qr, T, &w->idx_wq_b, &w->idx_wq_b_scale, p->weight_block, b->qi,
                                  err)) != MMOE_OK)
            return mmoe_error_prefix(err, "indexer wq_b: ");
        if ((st = attn_linear_dense(pool, b->xb, T, s->D, &w->idx_weights_proj, s->ih, NULL, b->wi, err)) != MMOE_OK ||
            (st = attn_linear_dense(pool, b->xb, T, s->D, &c->wkv, s->i_width, b->ikv, NULL, err)) != MMOE_OK ||
            (st = attn_linear_dense(pool, b->xb, T, s->D, &c->wgate, s->i_width, b->igate, NULL, err)) != MMOE_OK)
            return mmoe_error_prefix(err, "indexer: ");
        const float w_scale = (float)(1.0 / sqrt((double)s->id) * (1.0 / sqrt((double)s->ih)));
        for (int64_t i = 0; i < T * s->ih; i++)
            b->wi[i] = mmoe_bf16_from_f32(fmt_bf16_to_f32(b->wi[i]) * w_scale);
        for (int64_t t = 0; t < T; t++) {
            uint16_t *qit = b->qi + t * s->ih * s->id;
            rope_heads(qit, s->ih, s->id, p->rope_dim, freqs, start_pos + t, 0);
            for (int64_t h = 0; h < s->ih; h++)
                attn_hadamard_bf16(qit + h * s->id, (int)s->id);
            mmoe_roundtrip_fp4_bf16(qit, s->ih * s->id, 32);
        }
    }
    return MMOE_OK;
}

/** Steps 1-5 of the file comment for token @p t. */
static void attend_token(moe_dequant_pool *pool, const mmoe_attn_params *p, const mmoe_attn_weights *w,
                         mmoe_attn_cache *c, const fwd_sizes *s, int64_t t, int64_t pos, const float *freqs,
                         fwd_bufs *b)
{
    const int64_t d = s->d, W = p->window, r = p->compress_ratio;
    const float eps = (float)p->norm_eps;
    memcpy(c->window_kv + (pos % W) * d, b->kv + t * d, sizeof(uint16_t) * (size_t)d);
    if (r > 0 && attn_compressor_push(&c->comp, pos, b->ckv + t * s->c_width, b->cgate + t * s->c_width,
                                      (const float *)w->compressor.ape.data, b->pooled)) {
        const int64_t j = pos / r;
        attn_compressor_finish(b->pooled, (int)d, &w->compressor.norm, eps, p->rope_dim, freqs, j * r,
                               ATTN_COMPRESSOR_KV, c->comp_kv + j * d);
    }
    if (r == 4 && attn_compressor_push(&c->idx_comp, pos, b->ikv + t * s->i_width,
                                       b->igate + t * s->i_width,
                                       (const float *)w->idx_compressor.ape.data, b->pooled)) {
        const int64_t j = pos / 4;
        attn_compressor_finish(b->pooled, (int)s->id, &w->idx_compressor.norm, eps, p->rope_dim, freqs,
                               j * 4, ATTN_COMPRESSOR_INDEXER, c->idx_keys + j * s->id);
    }

    int64_t n = 0;
    const int64_t first = pos - W + 1 > 0 ? pos - W + 1 : 0;
    for (int64_t q = first; q <= pos; q++)
        b->rows[n++] = c->window_kv + (q % W) * d;
    if (r > 0) {
        const int64_t n_causal = (pos + 1) / r;
        if (r == 128) {
            for (int64_t j = 0; j < n_causal; j++)
                b->rows[n++] = c->comp_kv + j * d;
        } else {
            attn_indexer_scores(b->qi + t * s->ih * s->id, b->wi + t * s->ih, c->idx_keys, (int)s->ih,
                                (int)s->id, n_causal, b->idx_scores);
            const int64_t k = attn_topk_desc(b->idx_scores, n_causal, p->index_topk, b->topk_work,
                                             b->topk_idx);
            for (int64_t i = 0; i < k; i++)
                b->rows[n++] = c->comp_kv + b->topk_idx[i] * d;
        }
    }
    const float scale = (float)(1.0 / sqrt((double)d));
    uint16_t *ot = b->o + t * s->hd;
    attn_sparse_attention_pool(pool, b->q + t * s->hd, (int)s->H, (int)d, b->rows, n,
                               (const float *)w->attn_sink.data, scale, b->acc, b->chunk_scores, ot);
    rope_heads(ot, s->H, d, p->rope_dim, freqs, pos, 1);
}

mmoe_status mmoe_attention_forward(const mmoe_attn_params *p, const mmoe_attn_weights *w,
                                   mmoe_attn_cache *cache, const mmoe_tensor *x,
                                   int64_t start_pos, int64_t T, mmoe_tensor *out,
                                   mmoe_attn_scratch *scratch, mmoe_error *err)
{
    mmoe_status st;
    if (T < 1)
        return mmoe_error_set(err, MMOE_EINVAL, "attention: T = %lld tokens, expected >= 1", (long long)T);
    if (cache->p.compress_ratio != p->compress_ratio || cache->p.head_dim != p->head_dim ||
        cache->p.window != p->window || cache->p.index_head_dim != p->index_head_dim)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "attention: cache made for compress ratio %d / head_dim %d / window %d, "
                              "layer has %d / %d / %d", cache->p.compress_ratio, cache->p.head_dim,
                              cache->p.window, p->compress_ratio, p->head_dim, p->window);
    if (start_pos != cache->next_pos)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "attention: start_pos %lld, but the cache's next position is %lld",
                              (long long)start_pos, (long long)cache->next_pos);
    if (start_pos + T > cache->max_seq_len)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "attention: positions up to %lld exceed the cache's max_seq_len %lld",
                              (long long)(start_pos + T - 1), (long long)cache->max_seq_len);
    if ((st = mmoe_attn_weights_validate(p, "attn", w, err)) != MMOE_OK ||
        (st = check_io(x, "attention input x", T, p->dim, err)) != MMOE_OK ||
        (st = check_io(out, "attention output", T, p->dim, err)) != MMOE_OK)
        return st;

    fwd_sizes s = {0};
    s.T = T;
    s.D = p->dim;
    s.H = p->n_heads;
    s.d = p->head_dim;
    s.q = p->q_lora_rank;
    s.hd = s.H * s.d;
    s.c_width = (p->compress_ratio == 4 ? 2 : 1) * s.d;
    s.ih = p->index_n_heads;
    s.id = p->index_head_dim;
    s.i_width = 2 * s.id;
    s.gr = (int64_t)p->o_groups * p->o_lora_rank;
    s.n_list = p->window + cache->max_blocks;

    mmoe_attn_scratch local = {0};
    mmoe_attn_scratch *sc = scratch != NULL ? scratch : &local;
    s.threads = moe_dequant_pool_threads(sc->pool);
    size_t pieces[32];
    int n_pieces = 0;
    if (attn_scratch_begin(sc, scratch_bytes(&s, p->compress_ratio, pieces, &n_pieces)) != 0)
        return mmoe_error_set(err, MMOE_ENOMEM, "attention: out of memory for the scratch of %lld tokens",
                              (long long)T);
    fwd_bufs b;
    carve(sc, pieces, &b);

    if (x->dtype == MMOE_DT_F32)
        mmoe_bf16_from_f32_row((const float *)x->data, (size_t)(T * s.D), b.xb);
    else
        memcpy(b.xb, x->data, sizeof(uint16_t) * (size_t)(T * s.D));

    float freqs[ATTN_MAX_ROPE_DIM / 2];
    attn_rope_freqs_for_layer(p, freqs);
    st = project_rows(sc->pool, p, w, &s, start_pos, freqs, &b, err);
    if (st == MMOE_OK) {
        for (int64_t t = 0; t < T; t++)
            attend_token(sc->pool, p, w, cache, &s, t, start_pos + t, freqs, &b);
        cache->next_pos = start_pos + T;
        st = attn_out_proj(sc->pool, p, w, b.o, T, b.z, b.outb, err);
    }
    if (st == MMOE_OK) {
        if (out->dtype == MMOE_DT_F32)
            mmoe_bf16_to_f32_row(b.outb, (size_t)(T * s.D), (float *)out->data);
        else
            memcpy(out->data, b.outb, sizeof(uint16_t) * (size_t)(T * s.D));
    }
    if (sc == &local)
        free(local.buf);
    return st;
}
