/**
 * @file test_moe_batchinv.c
 * @brief Suite "moe_batchinv": the MoE oracle is batch-invariant, bit for bit.
 *
 * The property (src/cpu_ref/moe_dot.c): a token's output, routing and router scores are a
 * function of that token and the weights only.  For random layers of every recipe we run
 * T tokens as one batch and check, for every token, the same bits
 *  - when the token runs alone (T = 1),
 *  - inside a seeded shuffle of the batch,
 *  - inside a larger batch with other random tokens appended.
 * No tolerance: every output element is summed in one fixed order.  The suite runs in CI once
 * more under each OpenBLAS core type the CPU can execute (.ci/run), which must change nothing.
 *
 * The shapes include small ones where a BLAS's summation order was seen to depend on the
 * number of rows (router K = D = 256 with N = E = 8; L1 tiles with K = 256), and T values that
 * give the experts from a few to about 40 tokens, i.e. every register-block remainder of the
 * GEMM (E = 4 or 8, topk = 2; the shared expert gets all T).  The values are the realistic
 * MMOE_SYNTH_NORMAL family, whose FP32 sums are *not* exact, so a changed summation order shows.
 * Seeds are printed (replay with MMOE_SEED=n).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"
#include "mmoe_moe.h"
#include "mmoe_moe_synth.h"
#include "mmoe_rng.h"
#include "mmoe_test.h"
#include "moe_internal.h"

static uint64_t g_seed;

/** One layer configuration of the property test. */
typedef struct bi_config {
    const char *name;
    int64_t d, inter, e;
    int topk, n_shared;
    mmoe_moe_routing routing;
    mmoe_moe_shared_mode shared_mode;
    int64_t t; /**< batch size */
} bi_config;

static const bi_config k_configs[] = {
    {"tiny D=256 E=8 shared fused", 256, 256, 8, 2, 1, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 37},
    {"D=256 E=4 (about 20 tokens per expert)", 256, 128, 4, 2, 1, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 41},
    {"D=128 E=4 hash routing, serial shared", 128, 256, 4, 2, 1, MMOE_ROUTING_HASH, MMOE_SHARED_SERIAL, 33},
    {"D=256 E=8 no shared, T=16", 256, 128, 8, 3, 0, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 16},
    {"D=256 E=8 T=150 (about 38 tokens per expert)", 256, 128, 8, 2, 1, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 150},
};
enum { N_CONFIGS = sizeof k_configs / sizeof k_configs[0] };

/** Everything one run produces for its tokens. */
typedef struct bi_out {
    uint16_t *y;  /**< [t, D] */
    int64_t *idx; /**< [t, topk] */
    float *wts;   /**< [t, topk] */
} bi_out;

static bi_out bi_out_alloc(int64_t t, int64_t d, int topk)
{
    bi_out o = {malloc((size_t)(t * d) * 2), malloc((size_t)(t * topk) * sizeof(int64_t)),
                malloc((size_t)(t * topk) * sizeof(float))};
    ck_assert(o.y != NULL && o.idx != NULL && o.wts != NULL);
    return o;
}

static void bi_out_free(bi_out *o)
{
    free(o->y);
    free(o->idx);
    free(o->wts);
}

/** Run the layer on t tokens (rows of x, ids) into o; outputs NaN-poisoned first. */
static void run(mmoe_moe_layer *layer, int64_t t, const uint16_t *x, const int32_t *ids, bi_out *o)
{
    const mmoe_moe_desc *d = mmoe_moe_layer_desc(layer);
    mmoe_test_poison_bf16(o->y, (size_t)(t * d->hidden));
    mmoe_test_poison_f32(o->wts, (size_t)(t * d->topk));
    memset(o->idx, 0xff, (size_t)(t * d->topk) * sizeof(int64_t));
    mmoe_moe_input in = {t, x, ids, NULL, NULL};
    mmoe_moe_output out = {o->y, o->idx, o->wts};
    mmoe_error err;
    mmoe_status st = mmoe_moe_layer_run(layer, &in, &out, NULL, &err);
    ck_assert_msg(st == MMOE_OK, "run: %s", err.msg);
}

/** Row @p i of run @p a equals row @p j of run @p b, bit for bit (y, idx and wts). */
static void assert_same_row(const mmoe_moe_desc *d, const bi_out *a, int64_t i, const bi_out *b, int64_t j,
                            const char *what, const char *cfg, mmoe_moe_recipe r)
{
    const int64_t D = d->hidden;
    const int k = d->topk;
    ck_assert_msg(memcmp(a->idx + i * k, b->idx + j * k, (size_t)k * sizeof(int64_t)) == 0,
                  "%s, recipe %s: token %lld routed differently %s", cfg, mmoe_moe_recipe_name(r), (long long)i, what);
    ck_assert_msg(memcmp(a->wts + i * k, b->wts + j * k, (size_t)k * sizeof(float)) == 0,
                  "%s, recipe %s: token %lld routing weights differ %s", cfg, mmoe_moe_recipe_name(r), (long long)i,
                  what);
    for (int64_t c = 0; c < D; c++)
        ck_assert_msg(a->y[i * D + c] == b->y[j * D + c],
                      "%s, recipe %s: token %lld channel %lld: 0x%04x in the batch, 0x%04x %s", cfg,
                      mmoe_moe_recipe_name(r), (long long)i, (long long)c, a->y[i * D + c], b->y[j * D + c], what);
}

/* Loop index = config * MMOE_RECIPE_COUNT + recipe. */
START_TEST(layer_rows_are_batch_invariant)
{
    const bi_config *cfg = &k_configs[_i / MMOE_RECIPE_COUNT];
    const mmoe_moe_recipe recipe = (mmoe_moe_recipe)(_i % MMOE_RECIPE_COUNT);
    const uint64_t seed = g_seed + 977u * (uint64_t)_i;
    mmoe_moe_desc d;
    mmoe_moe_desc_init(&d);
    d.hidden = cfg->d;
    d.inter = cfg->inter;
    d.n_experts = cfg->e;
    d.topk = cfg->topk;
    d.n_shared = cfg->n_shared;
    d.shared_inter = cfg->inter;
    d.routing = cfg->routing;
    d.shared_mode = cfg->shared_mode;
    d.routed_scaling_factor = 1.5f;
    d.vocab = 64;
    d.recipe = recipe;

    mmoe_error err;
    mmoe_moe_synth *synth;
    mmoe_moe_layer *layer;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, seed, MMOE_SYNTH_NORMAL, &synth, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_moe_layer_create(&d, &layer, &err), MMOE_OK);
    ck_assert_msg(mmoe_moe_layer_set_weights(layer, mmoe_moe_synth_weights(synth), &err) == MMOE_OK, "%s", err.msg);

    /* the batch, then EXTRA other tokens for the "larger batch" run */
    const int64_t t = cfg->t, extra = 11, D = d.hidden, tt = t + extra;
    uint16_t *x = malloc((size_t)(tt * D) * 2), *xs = malloc((size_t)(tt * D) * 2);
    int32_t *ids = malloc((size_t)tt * sizeof(int32_t)), *ids_s = malloc((size_t)tt * sizeof(int32_t));
    int64_t *perm = malloc((size_t)t * sizeof(int64_t));
    ck_assert(x != NULL && xs != NULL && ids != NULL && ids_s != NULL && perm != NULL);
    mmoe_moe_synth_input(&d, tt, seed ^ 0x5eedu, MMOE_SYNTH_NORMAL, x, ids);
    const int32_t *ids_or_null = d.routing == MMOE_ROUTING_HASH ? ids : NULL;

    bi_out batch = bi_out_alloc(t, D, d.topk), one = bi_out_alloc(1, D, d.topk);
    bi_out shuf = bi_out_alloc(t, D, d.topk), big = bi_out_alloc(tt, D, d.topk);
    run(layer, t, x, ids_or_null, &batch);

    /* alone */
    for (int64_t i = 0; i < t; i++) {
        run(layer, 1, x + i * D, ids_or_null != NULL ? ids + i : NULL, &one);
        assert_same_row(&d, &batch, i, &one, 0, "when run alone", cfg->name, recipe);
    }

    /* shuffled (Fisher-Yates, seeded): row j of the shuffle is token perm[j] */
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed ^ 0x5407u);
    for (int64_t i = 0; i < t; i++)
        perm[i] = i;
    for (int64_t i = t - 1; i > 0; i--) {
        int64_t j = (int64_t)mmoe_rng_below(&rng, (uint64_t)(i + 1)), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (int64_t j = 0; j < t; j++) {
        memcpy(xs + j * D, x + perm[j] * D, (size_t)D * 2);
        ids_s[j] = ids[perm[j]];
    }
    run(layer, t, xs, ids_or_null != NULL ? ids_s : NULL, &shuf);
    for (int64_t j = 0; j < t; j++)
        assert_same_row(&d, &batch, perm[j], &shuf, j, "in a shuffled batch", cfg->name, recipe);

    /* larger batch: the same tokens first, other tokens after them */
    run(layer, tt, x, ids_or_null, &big);
    for (int64_t i = 0; i < t; i++)
        assert_same_row(&d, &batch, i, &big, i, "in a larger batch", cfg->name, recipe);

    bi_out_free(&batch);
    bi_out_free(&one);
    bi_out_free(&shuf);
    bi_out_free(&big);
    free(x);
    free(xs);
    free(ids);
    free(ids_s);
    free(perm);
    mmoe_moe_layer_destroy(layer);
    mmoe_moe_synth_destroy(synth);
}
END_TEST

/* The router alone, on its own shapes: D x E x T in {256 x 8 x 300, 4096 x 256 x 40} (an
 * OpenBLAS SGEMM gave other bits for M < 150 than for M = 300 at K = 256, N = 8); T in {1, 2,
 * 15, 16, 17, 33, 149} as prefixes of one batch of T_max, and every token alone. */
START_TEST(router_rows_are_batch_invariant)
{
    static const int64_t shapes[][3] = {{256, 8, 300}, {4096, 256, 40}};
    static const int64_t prefixes[] = {1, 2, 15, 16, 17, 33, 149};
    const int64_t D = shapes[_i][0], E = shapes[_i][1], tmax = shapes[_i][2];
    mmoe_moe_desc d;
    mmoe_moe_desc_init(&d);
    d.hidden = D;
    d.n_experts = E;
    d.topk = 6;
    d.routed_scaling_factor = 1.5f;
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 31u * (uint64_t)_i);
    float *x = malloc((size_t)(tmax * D) * sizeof(float)), *bias = malloc((size_t)E * sizeof(float));
    uint16_t *gate = malloc((size_t)(E * D) * 2);
    float *sc_all = malloc((size_t)(tmax * E) * sizeof(float)), *sc = malloc((size_t)(tmax * E) * sizeof(float));
    float *w_all = malloc((size_t)(tmax * 6) * sizeof(float)), *w = malloc((size_t)(tmax * 6) * sizeof(float));
    int64_t *i_all = malloc((size_t)(tmax * 6) * sizeof(int64_t)), *idx = malloc((size_t)(tmax * 6) * sizeof(int64_t));
    ck_assert(x && bias && gate && sc_all && sc && w_all && w && i_all && idx);
    for (int64_t i = 0; i < tmax * D; i++) /* BF16 inputs widened to FP32, as the layer does */
        x[i] = mmoe_bf16_to_f32(mmoe_bf16_from_f32((float)mmoe_rng_normal(&rng)));
    for (int64_t i = 0; i < E * D; i++)
        gate[i] = mmoe_bf16_from_f32((float)(mmoe_rng_normal(&rng) / 16.0));
    for (int64_t e = 0; e < E; e++)
        bias[e] = (float)(0.1 * mmoe_rng_normal(&rng));
    mmoe_error err;
    mmoe_test_poison_f32(sc_all, (size_t)(tmax * E));
    ck_assert_int_eq(moe_route(&d, x, tmax, gate, bias, NULL, NULL, i_all, w_all, sc_all, &err), MMOE_OK);
    /* prefixes of the batch; then T = 1 at every offset (each token alone) */
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0] && prefixes[p] < tmax; p++) {
        const int64_t t = prefixes[p];
        mmoe_test_poison_f32(sc, (size_t)(t * E));
        ck_assert_int_eq(moe_route(&d, x, t, gate, bias, NULL, NULL, idx, w, sc, &err), MMOE_OK);
        ck_assert_msg(memcmp(sc, sc_all, (size_t)(t * E) * sizeof(float)) == 0,
                      "D=%lld E=%lld: scores of the first %lld tokens depend on the batch", (long long)D,
                      (long long)E, (long long)t);
        ck_assert(memcmp(idx, i_all, (size_t)(t * 6) * sizeof(int64_t)) == 0);
        ck_assert(memcmp(w, w_all, (size_t)(t * 6) * sizeof(float)) == 0);
    }
    for (int64_t i = 0; i < tmax; i++) {
        mmoe_test_poison_f32(sc, (size_t)E);
        ck_assert_int_eq(moe_route(&d, x + i * D, 1, gate, bias, NULL, NULL, idx, w, sc, &err), MMOE_OK);
        ck_assert_msg(memcmp(sc, sc_all + i * E, (size_t)E * sizeof(float)) == 0,
                      "D=%lld E=%lld: token %lld alone has other scores than in the batch", (long long)D,
                      (long long)E, (long long)i);
    }
    free(x);
    free(bias);
    free(gate);
    free(sc_all);
    free(sc);
    free(w_all);
    free(w);
    free(i_all);
    free(idx);
}
END_TEST

static Suite *batchinv_suite(void)
{
    Suite *s = suite_create("moe_batchinv");
    TCase *tc = tcase_create("batch invariance");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, router_rows_are_batch_invariant, 0, 2);
    tcase_add_loop_test(tc, layer_rows_are_batch_invariant, 0, N_CONFIGS * MMOE_RECIPE_COUNT);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("moe_batchinv");
    /* which kernels OpenBLAS runs (.ci/run checks that OPENBLAS_CORETYPE took effect); the oracle's
     * GEMMs do not use them, so the bits must not depend on it */
    fprintf(stderr, "moe_batchinv: OpenBLAS core %s, fixed-order GEMM variant %s\n", openblas_get_corename(),
            moe_dot_isa_name(moe_dot_isa_best()));
    return mmoe_test_run(batchinv_suite());
}
