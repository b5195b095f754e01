/**
 * @file attn_cache.c
 * @brief The per-sequence KV cache of one attention layer, and the forward's scratch memory.
 *
 * What a layer must remember between forward calls (@ref spec_arch_attention, @ref spec_arch_compressor):
 *
 * - **window ring buffer**, bf16 [window, d]: the raw kv (normalized, rotated, FP8
 *   round trip on the nope dims) of the last `window` positions; position q lives in
 *   slot q mod window.  Every layer type has it.
 * - **compressed kv**, bf16 [max_seq_len/ratio, d] (ratio 4 or 128): block j in row j,
 *   written when the block's last token is processed.  (The reference stores window
 *   and blocks in one tensor, blocks at row window + j; the split is only layout.)
 * - **compressor state**, fp32 [c*ratio, c*d] values and gates of the partial block.
 * - ratio 4 only: the **indexer key cache** bf16 [max_seq_len/4, index_head_dim] and the
 *   indexer compressor's state.
 *
 * All of it is sized once from max_seq_len.  Reset puts the compressor states back
 * to kv = 0, gates = -inf (the reference only does this at construction; the oracle
 * does it for every new sequence) and the next position to 0; the kv rows need no
 * clearing because a row is always written before it is read.
 */
#include "attn_internal.h"

#include <stdlib.h>
#include <string.h>

/** Allocate @p n bytes, adding them to @p total; NULL on failure. */
static void *alloc_counted(size_t n, size_t *total)
{
    *total += n;
    return calloc(1, n > 0 ? n : 1);
}

/** Allocate a compressor state for @p ratio and width @p dh; returns 0 on allocation failure. */
static int compressor_alloc(attn_compressor_state *st, int ratio, int dh, size_t *total)
{
    st->ratio = ratio;
    st->overlap = ratio == 4 ? 2 : 1;
    st->dh = dh;
    const size_t n = (size_t)(st->overlap * ratio) * (size_t)(st->overlap * dh);
    st->kv_state = alloc_counted(sizeof(float) * n, total);
    st->score_state = alloc_counted(sizeof(float) * n, total);
    return st->kv_state != NULL && st->score_state != NULL;
}

mmoe_status mmoe_attn_cache_create(const mmoe_attn_params *p, int64_t max_seq_len,
                                   mmoe_attn_cache **out, mmoe_error *err)
{
    *out = NULL;
    mmoe_status st = mmoe_attn_params_validate(p, err);
    if (st != MMOE_OK)
        return st;
    if (max_seq_len < 1)
        return mmoe_error_set(err, MMOE_ERANGE, "attention cache: max_seq_len %lld must be >= 1",
                              (long long)max_seq_len);
    mmoe_attn_cache *c = calloc(1, sizeof *c);
    if (c == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "attention cache: out of memory");
    c->p = *p;
    c->max_seq_len = max_seq_len;
    c->bytes = sizeof *c;
    int ok = (c->window_kv = alloc_counted(sizeof(uint16_t) * (size_t)p->window * (size_t)p->head_dim,
                                           &c->bytes)) != NULL;
    if (p->compress_ratio > 0) {
        c->max_blocks = max_seq_len / p->compress_ratio;
        ok = ok && (c->comp_kv = alloc_counted(sizeof(uint16_t) * (size_t)c->max_blocks *
                                                   (size_t)p->head_dim, &c->bytes)) != NULL;
        ok = ok && compressor_alloc(&c->comp, p->compress_ratio, p->head_dim, &c->bytes);
    }
    if (p->compress_ratio == 4) {
        ok = ok && (c->idx_keys = alloc_counted(sizeof(uint16_t) * (size_t)c->max_blocks *
                                                    (size_t)p->index_head_dim, &c->bytes)) != NULL;
        ok = ok && compressor_alloc(&c->idx_comp, 4, p->index_head_dim, &c->bytes);
    }
    if (!ok) {
        size_t bytes = c->bytes;
        mmoe_attn_cache_destroy(c);
        return mmoe_error_set(err, MMOE_ENOMEM, "attention cache: out of memory (%zu bytes for %lld positions)",
                              bytes, (long long)max_seq_len);
    }
    mmoe_attn_cache_reset(c);
    *out = c;
    return MMOE_OK;
}

void mmoe_attn_cache_destroy(mmoe_attn_cache *c)
{
    if (c == NULL)
        return;
    free(c->window_kv);
    free(c->comp_kv);
    free(c->comp.kv_state);
    free(c->comp.score_state);
    free(c->idx_keys);
    free(c->idx_comp.kv_state);
    free(c->idx_comp.score_state);
    free(c);
}

void mmoe_attn_cache_reset(mmoe_attn_cache *c)
{
    c->next_pos = 0;
    if (c->comp.kv_state != NULL)
        attn_compressor_reset(&c->comp);
    if (c->idx_comp.kv_state != NULL)
        attn_compressor_reset(&c->idx_comp);
}

int64_t mmoe_attn_cache_next_pos(const mmoe_attn_cache *c)
{
    return c->next_pos;
}

size_t mmoe_attn_cache_bytes(const mmoe_attn_cache *c)
{
    return c->bytes;
}

/* ------------------------------------------------------------------ scratch */

mmoe_attn_scratch *mmoe_attn_scratch_create(void)
{
    return calloc(1, sizeof(mmoe_attn_scratch));
}

void mmoe_attn_scratch_destroy(mmoe_attn_scratch *s)
{
    if (s == NULL)
        return;
    free(s->buf);
    free(s);
}

void mmoe_attn_scratch_set_pool(mmoe_attn_scratch *s, struct mmoe_moe_pool *pool)
{
    if (s != NULL)
        s->pool = pool;
}

size_t attn_scratch_piece(size_t bytes)
{
    return (bytes + 63) & ~(size_t)63;
}

int attn_scratch_begin(mmoe_attn_scratch *s, size_t bytes)
{
    s->used = 0;
    if (bytes <= s->cap)
        return 0;
    void *nb = NULL;
    if (posix_memalign(&nb, 64, bytes) != 0)
        return -1;
    free(s->buf);
    s->buf = nb;
    s->cap = bytes;
    return 0;
}

void *attn_scratch_take(mmoe_attn_scratch *s, size_t bytes)
{
    void *p = s->buf + s->used;
    s->used += attn_scratch_piece(bytes);
    return p;
}
