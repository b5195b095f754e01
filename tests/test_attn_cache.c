/**
 * @file test_attn_cache.c
 * @brief Suite "attn_cache": prefill versus token-by-token decode, chunked prefill, reset, argument and weight errors.
 *
 * The oracle promises bit-identical outputs whether a sequence is fed in one
 * prefill, one token at a time, or in arbitrary chunks (see attn_forward.c), so
 * these checks are memcmp.  The sequences cover what the cache must get right:
 * positions past the window (ring buffer wrap-around), compression-block
 * boundaries (a block becomes visible to the token that completes it; the overlap
 * state carried between blocks), and for CSA more compressed blocks than
 * index_topk, so that the indexer really selects.
 */
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "attn_test_util.h"
#include "mmoe_formats.h"
#include "mmoe_test.h"

/** Run @p T tokens through a fresh cache in chunks of the given sizes (cycled). */
static void run_chunks(const mmoe_attn_params *p, const mmoe_attn_weights *w, const uint16_t *x, int64_t T,
                       const int64_t *chunks, int n_chunks, mmoe_attn_scratch *scratch, uint16_t *out)
{
    mmoe_attn_cache *cache = NULL;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_attn_cache_create(p, T + 5, &cache, &err), MMOE_OK);
    int64_t pos = 0;
    for (int i = 0; pos < T; i++) {
        int64_t n = chunks[i % n_chunks];
        if (n > T - pos)
            n = T - pos;
        mmoe_tensor xt = {MMOE_DT_BF16, 2, {n, p->dim}, (void *)(x + pos * p->dim), 0};
        mmoe_tensor ot = {MMOE_DT_BF16, 2, {n, p->dim}, out + pos * p->dim, 0};
        xt.nbytes = ot.nbytes = sizeof(uint16_t) * (size_t)(n * p->dim);
        ck_assert_msg(mmoe_attention_forward(p, w, cache, &xt, pos, n, &ot, scratch, &err) == MMOE_OK,
                      "%s", err.msg);
        pos += n;
        ck_assert_int_eq(mmoe_attn_cache_next_pos(cache), pos);
    }
    mmoe_attn_cache_destroy(cache);
}

static void check_prefill_equals_decode(int ratio, int64_t T, int topk, int weight_block)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_cache/prefill_vs_decode"));
    mmoe_attn_params p;
    attn_test_params_tiny(&p, ratio);
    p.index_topk = topk;
    p.weight_block = weight_block;
    attn_test_layer L;
    attn_test_layer_make(&L, &p, &rng, 0);
    const size_t n = (size_t)(T * p.dim);
    uint16_t *x = malloc(sizeof(uint16_t) * n), *prefill = malloc(sizeof(uint16_t) * n);
    uint16_t *decode = malloc(sizeof(uint16_t) * n), *chunked = malloc(sizeof(uint16_t) * n);
    attn_test_fill_bf16(&rng, x, (int64_t)n, 0.0, 1.0);
    mmoe_test_poison_bf16(prefill, n);
    mmoe_test_poison_bf16(decode, n);
    mmoe_test_poison_bf16(chunked, n);
    mmoe_attn_scratch *scratch = mmoe_attn_scratch_create();
    const int64_t all[1] = {T}, one[1] = {1}, mixed[4] = {5, 1, 13, 3};
    run_chunks(&p, &L.w, x, T, all, 1, NULL, prefill);
    run_chunks(&p, &L.w, x, T, one, 1, scratch, decode);
    run_chunks(&p, &L.w, x, T, mixed, 4, scratch, chunked);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(prefill[i] == decode[i], "ratio %d: token %zu ch %zu: prefill 0x%04x decode 0x%04x",
                      ratio, i / (size_t)p.dim, i % (size_t)p.dim, prefill[i], decode[i]);
        ck_assert_msg(prefill[i] == chunked[i], "ratio %d: token %zu: chunked differs", ratio, i / (size_t)p.dim);
    }
    /* the output is not trivially zero or constant */
    int distinct = 0;
    for (size_t i = 1; i < n; i++)
        distinct += prefill[i] != prefill[0];
    ck_assert_int_gt(distinct, (int)(n / 2));
    mmoe_attn_scratch_destroy(scratch);
    free(x);
    free(prefill);
    free(decode);
    free(chunked);
    attn_test_layer_free(&L);
}

START_TEST(swa_past_the_window)
{
    check_prefill_equals_decode(0, 27, 3, 128); /* window 8: wraps three times */
}
END_TEST

START_TEST(csa_more_blocks_than_topk)
{
    check_prefill_equals_decode(4, 45, 3, 128); /* 11 blocks, top-3 of them, window 8 */
}
END_TEST

START_TEST(hca_across_block_boundaries)
{
    check_prefill_equals_decode(128, 2 * 128 + 9, 3, 128); /* two complete blocks, one partial */
}
END_TEST

START_TEST(csa_with_32x32_weight_blocks)
{
    check_prefill_equals_decode(4, 21, 2, 32); /* V4.1-style 32x32 FP8 weight blocks */
}
END_TEST

START_TEST(reset_and_f32_io)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_cache/reset"));
    mmoe_attn_params p;
    attn_test_params_tiny(&p, 4);
    attn_test_layer L;
    attn_test_layer_make(&L, &p, &rng, 1);
    const int64_t T = 13;
    const size_t n = (size_t)(T * p.dim);
    uint16_t *x = malloc(sizeof(uint16_t) * n), *o1 = malloc(sizeof(uint16_t) * n);
    float *xf = malloc(sizeof(float) * n), *of = malloc(sizeof(float) * n);
    attn_test_fill_bf16(&rng, x, (int64_t)n, 0.0, 1.0);
    mmoe_bf16_to_f32_row(x, n, xf);
    mmoe_attn_cache *cache = NULL;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_attn_cache_create(&p, 64, &cache, &err), MMOE_OK);
    ck_assert_uint_gt(mmoe_attn_cache_bytes(cache), 0);
    mmoe_tensor xt = {MMOE_DT_BF16, 2, {T, p.dim}, x, sizeof(uint16_t) * n};
    mmoe_tensor ot = {MMOE_DT_BF16, 2, {T, p.dim}, o1, sizeof(uint16_t) * n};
    ck_assert_int_eq(mmoe_attention_forward(&p, &L.w, cache, &xt, 0, T, &ot, NULL, &err), MMOE_OK);
    /* a new sequence after reset, with F32 in and out, gives the same values */
    mmoe_attn_cache_reset(cache);
    mmoe_test_poison_f32(of, n);
    mmoe_tensor xft = {MMOE_DT_F32, 2, {T, p.dim}, xf, sizeof(float) * n};
    mmoe_tensor oft = {MMOE_DT_F32, 2, {T, p.dim}, of, sizeof(float) * n};
    ck_assert_int_eq(mmoe_attention_forward(&p, &L.w, cache, &xft, 0, T, &oft, NULL, &err), MMOE_OK);
    for (size_t i = 0; i < n; i++)
        ck_assert_float_eq(of[i], mmoe_bf16_to_f32(o1[i]));
    mmoe_attn_cache_destroy(cache);
    free(x);
    free(o1);
    free(xf);
    free(of);
    attn_test_layer_free(&L);
}
END_TEST

START_TEST(argument_errors_leave_the_cache_alone)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, 7);
    mmoe_attn_params p;
    attn_test_params_tiny(&p, 128);
    attn_test_layer L;
    attn_test_layer_make(&L, &p, &rng, 0);
    uint16_t x[4 * 128], o[4 * 128];
    attn_test_fill_bf16(&rng, x, 4 * 128, 0.0, 1.0);
    mmoe_attn_cache *cache = NULL;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_attn_cache_create(&p, 4, &cache, &err), MMOE_OK);
    mmoe_tensor xt = {MMOE_DT_BF16, 2, {2, 128}, x, sizeof(uint16_t) * 256};
    mmoe_tensor ot = {MMOE_DT_BF16, 2, {2, 128}, o, sizeof(uint16_t) * 256};
    ck_assert_int_eq(mmoe_attention_forward(&p, &L.w, cache, &xt, 1, 2, &ot, NULL, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "next position is 0"));
    ck_assert_int_eq(mmoe_attention_forward(&p, &L.w, cache, &xt, 0, 0, &ot, NULL, &err), MMOE_EINVAL);
    mmoe_tensor bad = xt;
    bad.shape[1] = 64;
    ck_assert_int_eq(mmoe_attention_forward(&p, &L.w, cache, &bad, 0, 2, &ot, NULL, &err), MMOE_ESHAPE);
    ck_assert_ptr_nonnull(strstr(err.msg, "attention input x"));
    mmoe_attn_weights w = L.w;
    w.compressor.ape.data = NULL;
    ck_assert_int_eq(mmoe_attention_forward(&p, &w, cache, &xt, 0, 2, &ot, NULL, &err), MMOE_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "attn.compressor.ape"));
    w = L.w;
    w.kv_norm.shape[0] = 64;
    ck_assert_int_eq(mmoe_attention_forward(&p, &w, cache, &xt, 0, 2, &ot, NULL, &err), MMOE_ESHAPE);
    ck_assert_ptr_nonnull(strstr(err.msg, "attn.kv_norm.weight"));
    ck_assert_int_eq(mmoe_attn_cache_next_pos(cache), 0);
    /* the cache holds 4 positions: 2 + 2 fit, a fifth does not */
    ck_assert_int_eq(mmoe_attention_forward(&p, &L.w, cache, &xt, 0, 2, &ot, NULL, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_attention_forward(&p, &L.w, cache, &xt, 2, 2, &ot, NULL, &err), MMOE_OK);
    mmoe_tensor x1 = xt, o1 = ot;
    x1.shape[0] = o1.shape[0] = 1;
    ck_assert_int_eq(mmoe_attention_forward(&p, &L.w, cache, &x1, 4, 1, &o1, NULL, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "max_seq_len 4"));
    /* a cache of another layer type is refused */
    mmoe_attn_params p0;
    attn_test_params_tiny(&p0, 0);
    ck_assert_int_eq(mmoe_attention_forward(&p0, &L.w, cache, &xt, 4, 2, &ot, NULL, &err), MMOE_EINVAL);
    mmoe_attn_cache_destroy(cache);
    /* parameter validation names the field */
    p.q_lora_rank = 64;
    ck_assert_int_eq(mmoe_attn_cache_create(&p, 4, &cache, &err), MMOE_ERANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "q_lora_rank 64"));
    ck_assert_ptr_null(cache);
    attn_test_layer_free(&L);
}
END_TEST

/* ---------------------------------------------------------------- binding by name */

typedef struct name_table {
    const char *names[64];
    mmoe_tensor tensors[64];
    int n;
    const char *hide; /* pretend this one is absent */
} name_table;

static void add(name_table *t, const char *name, mmoe_tensor v)
{
    t->names[t->n] = name;
    t->tensors[t->n++] = v;
}

static mmoe_status lookup(void *ctx, const char *name, mmoe_tensor *out, mmoe_error *err)
{
    name_table *t = ctx;
    (void)err;
    if (t->hide != NULL && strcmp(name, t->hide) == 0)
        return MMOE_ENOTFOUND;
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->names[i], name) == 0) {
            *out = t->tensors[i];
            return MMOE_OK;
        }
    return MMOE_ENOTFOUND;
}

START_TEST(bind_by_checkpoint_names)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, 3);
    mmoe_attn_params p;
    attn_test_params_tiny(&p, 4);
    attn_test_layer L;
    attn_test_layer_make(&L, &p, &rng, 1);
    const mmoe_attn_weights *w = &L.w;
    name_table t = {.n = 0};
    add(&t, "layers.2.attn.wq_a.weight", w->wq_a);
    add(&t, "layers.2.attn.wq_a.scale", w->wq_a_scale);
    add(&t, "layers.2.attn.q_norm.weight", w->q_norm);
    add(&t, "layers.2.attn.wq_b.weight", w->wq_b);
    add(&t, "layers.2.attn.wq_b.scale", w->wq_b_scale);
    add(&t, "layers.2.attn.wkv.weight", w->wkv);
    add(&t, "layers.2.attn.wkv.scale", w->wkv_scale);
    add(&t, "layers.2.attn.kv_norm.weight", w->kv_norm);
    add(&t, "layers.2.attn.wo_a.weight", w->wo_a);
    add(&t, "layers.2.attn.wo_a.scale", w->wo_a_scale);
    add(&t, "layers.2.attn.wo_b.weight", w->wo_b);
    add(&t, "layers.2.attn.wo_b.scale", w->wo_b_scale);
    add(&t, "layers.2.attn.attn_sink", w->attn_sink);
    add(&t, "layers.2.attn.compressor.wkv.weight", w->compressor.wkv);
    add(&t, "layers.2.attn.compressor.wgate.weight", w->compressor.wgate);
    add(&t, "layers.2.attn.compressor.ape", w->compressor.ape);
    add(&t, "layers.2.attn.compressor.norm.weight", w->compressor.norm);
    add(&t, "layers.2.attn.indexer.wq_b.weight", w->idx_wq_b);
    add(&t, "layers.2.attn.indexer.wq_b.scale", w->idx_wq_b_scale);
    add(&t, "layers.2.attn.indexer.weights_proj.weight", w->idx_weights_proj);
    add(&t, "layers.2.attn.indexer.compressor.wkv.weight", w->idx_compressor.wkv);
    add(&t, "layers.2.attn.indexer.compressor.wgate.weight", w->idx_compressor.wgate);
    add(&t, "layers.2.attn.indexer.compressor.ape", w->idx_compressor.ape);
    add(&t, "layers.2.attn.indexer.compressor.norm.weight", w->idx_compressor.norm);
    mmoe_attn_weights bound;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_msg(mmoe_attn_weights_bind(&p, "layers.2.attn", lookup, &t, &bound, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_ptr_eq(bound.idx_compressor.ape.data, w->idx_compressor.ape.data);
    ck_assert_ptr_eq(bound.wo_a_scale.data, w->wo_a_scale.data);
    t.hide = "layers.2.attn.indexer.wq_b.scale";
    ck_assert_int_eq(mmoe_attn_weights_bind(&p, "layers.2.attn", lookup, &t, &bound, &err), MMOE_ENOTFOUND);
    ck_assert_str_eq(err.msg, "tensor 'layers.2.attn.indexer.wq_b.scale' is missing");
    t.hide = NULL;
    t.tensors[15].shape[0] = 3; /* compressor.ape */
    ck_assert_int_eq(mmoe_attn_weights_bind(&p, "layers.2.attn", lookup, &t, &bound, &err), MMOE_ESHAPE);
    ck_assert_ptr_nonnull(strstr(err.msg, "layers.2.attn.compressor.ape"));
    ck_assert_ptr_nonnull(strstr(err.msg, "expected shape [4, 256]"));
    attn_test_layer_free(&L);
}
END_TEST

static Suite *attn_cache_suite(void)
{
    Suite *s = suite_create("attn_cache");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, swa_past_the_window);
    tcase_add_test(tc, csa_more_blocks_than_topk);
    tcase_add_test(tc, hca_across_block_boundaries);
    tcase_add_test(tc, csa_with_32x32_weight_blocks);
    tcase_add_test(tc, reset_and_f32_io);
    tcase_add_test(tc, argument_errors_leave_the_cache_alone);
    tcase_add_test(tc, bind_by_checkpoint_names);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(attn_cache_suite());
}
