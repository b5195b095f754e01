/**
 * @file test_moe_naive.c
 * @brief Suite "moe_naive": the fast oracle against the naive reference (moe_naive.c), which
 *        reads the recipe table of docs/spec/moe-layer.md literally.
 *
 * Both implementations sum every GEMM output in the order of the specification
 * (@ref spec_moe_gemm_order: eight FP32 lanes of fused multiply-adds, k ascending, a fixed
 * combine), the oracle in moe_dot.c (scalar or AVX2, several tokens and rows at once), the
 * naive reference in one plain loop per output.  So they agree bit for bit on every layer, not
 * only where the order cannot matter.  Three families of random layers (seeds printed, replay
 * with MMOE_SEED=n), each compared bit for bit:
 *
 *  1. **sparse rows**: realistic quantized weights in which every row of W1, W3, W2, of the
 *     shared expert and of the router gate keeps only two non-zero weights (one for sm90).
 *     A sum of two exact products and zeros is one rounding in any order, so this family
 *     checks the rounding points R1-R9 of every recipe even if the summation order were
 *     wrong: fused and serial shared expert, biased and hash routing, the router's ties and
 *     weights, masked slots, precise and fast math.
 *  2. **dyadic L1, sparse L2**: dense W1/W3 and integer x whose L1 sums are exact in FP32
 *     (MMOE_SYNTH_DYADIC), W2 with two non-zeros per row (one for sm90, whose operands
 *     fl(q s) make rounded products); given routing.  Again independent of the order.
 *  3. **dense**: realistic dense weights and inputs (MMOE_SYNTH_NORMAL), where every L1, L2
 *     and router sum rounds many times and sm90's products fl(q s) W are not exact (the single
 *     rounding of the fused multiply-add matters), so this family checks the summation order
 *     itself.  Whole layers of every recipe, fused and serial, with the router's own choice
 *     (its FP32 weights show a one-ulp difference in a logit) and with given routing.  A
 *     one-ulp difference of an L1 or L2 sum rarely survives the BF16 roundings that follow, so
 *     the GEMM sums are also compared directly in FP32: moe_naive_dot() against the oracle's
 *     expert GEMM (moe_expert_gemm(), tiled for a batch and with FP4 decoded in registers for
 *     one token) for L1 and L2 of a routed (FP4) and of the shared (FP8) expert.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"
#include "mmoe_moe.h"
#include "mmoe_moe_synth.h"
#include "mmoe_rng.h"
#include "mmoe_test.h"
#include "moe_internal.h"
#include "moe_naive.h"

static uint64_t g_seed;

/* ------------------------------------------------------------------ sparsifying weights */

/** Keep @p keep (1 or 2) random non-zero columns per row of an FP4 pair matrix [rows, cols/2] (zero the rest). */
static void sparsify_fp4(mmoe_tensor *w, int keep, mmoe_rng *rng)
{
    uint8_t *b = w->data;
    const int64_t rows = w->shape[0], half = w->shape[1], cols = 2 * half;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t k1 = (int64_t)mmoe_rng_below(rng, (uint64_t)cols);
        const int64_t k2 = keep > 1 ? (int64_t)mmoe_rng_below(rng, (uint64_t)cols) : k1;
        for (int64_t c = 0; c < cols; c++) {
            uint8_t *byte = &b[r * half + c / 2];
            const int hi = c % 2;
            uint8_t code = hi ? *byte >> 4 : *byte & 0x0F;
            if (c == k1 || c == k2)
                code = (uint8_t)((code & 0x8) | (1 + mmoe_rng_below(rng, 7))); /* a random non-zero magnitude */
            else
                code = 0;
            *byte = hi ? (uint8_t)((*byte & 0x0F) | code << 4) : (uint8_t)((*byte & 0xF0) | code);
        }
    }
}

/** The same for a byte matrix (E4M3 shared weights) or a BF16 matrix (the gate), @p size bytes per element. */
static void sparsify_bytes(mmoe_tensor *w, size_t size, int keep, mmoe_rng *rng)
{
    const int64_t rows = w->shape[0], cols = w->shape[1];
    for (int64_t r = 0; r < rows; r++) {
        const int64_t k1 = (int64_t)mmoe_rng_below(rng, (uint64_t)cols);
        const int64_t k2 = keep > 1 ? (int64_t)mmoe_rng_below(rng, (uint64_t)cols) : k1;
        for (int64_t c = 0; c < cols; c++)
            if (c != k1 && c != k2)
                memset((uint8_t *)w->data + (size_t)(r * cols + c) * size, 0, size);
    }
}

/**
 * Sparsify the matrices of @p ew (W2 only when @p l2_only), @p keep non-zeros per row.  Two
 * exact products and zeros sum to one rounding in any order; but the sm90 operand fl(q s) is
 * not a short number, so its products are rounded too, and a fused multiply-add (which a BLAS
 * may use) skips that rounding: with one non-zero per row every form gives fl(p).
 */
static void sparsify_expert(mmoe_moe_expert_weights *ew, int l2_only, int keep, mmoe_rng *rng)
{
    if (ew->w1.dtype == MMOE_DT_F8_E4M3) {
        if (!l2_only) {
            sparsify_bytes(&ew->w1, 1, keep, rng);
            sparsify_bytes(&ew->w3, 1, keep, rng);
        }
        sparsify_bytes(&ew->w2, 1, keep, rng);
        return;
    }
    if (!l2_only) {
        sparsify_fp4(&ew->w1, keep, rng);
        sparsify_fp4(&ew->w3, keep, rng);
    }
    sparsify_fp4(&ew->w2, keep, rng);
}

/* ------------------------------------------------------------------ one comparison */

/** One layer of a family. */
typedef struct naive_case {
    mmoe_moe_recipe recipe;
    mmoe_moe_routing routing;
    mmoe_moe_shared_mode shared_mode;
    mmoe_moe_math math;
    int given_routing; /**< 1: random topk_idx (with masked slots) and weights are given */
} naive_case;

/** The description of the test layers: small, with every feature (D 256, I 256, E 8, topk 3). */
static mmoe_moe_desc case_desc(const naive_case *c)
{
    mmoe_moe_desc d;
    mmoe_moe_desc_init(&d);
    d.hidden = 256;
    d.inter = 256;
    d.n_experts = 8;
    d.topk = 3;
    d.n_shared = 1;
    d.shared_inter = 256;
    d.routed_scaling_factor = 1.5f;
    d.swiglu_limit = 10.0f;
    d.routing = c->routing;
    d.vocab = 64;
    d.recipe = c->recipe;
    d.math = c->math;
    d.shared_mode = c->shared_mode;
    return d;
}

/** Random routing with masked slots and weights in (0, 2). */
static void random_routing(const mmoe_moe_desc *d, int64_t t, mmoe_rng *rng, int64_t *idx, float *wts)
{
    for (int64_t i = 0; i < t * d->topk; i++) {
        idx[i] = mmoe_rng_below(rng, 5) == 0 ? -1 : (int64_t)mmoe_rng_below(rng, (uint64_t)d->n_experts);
        wts[i] = idx[i] < 0 ? 0.0f : (float)(2.0 * mmoe_rng_uniform(rng));
    }
}

/** Outputs of the oracle and of the naive reference. */
typedef struct naive_runs {
    int64_t t;
    uint16_t *y_fast, *y_naive;
    int64_t *idx_fast, *idx_naive;
    float *w_fast, *w_naive;
} naive_runs;

static void runs_free(naive_runs *r)
{
    free(r->y_fast);
    free(r->y_naive);
    free(r->idx_fast);
    free(r->idx_naive);
    free(r->w_fast);
    free(r->w_naive);
}

/** Run the oracle and the naive reference on the same layer and inputs. */
static naive_runs run_both(const mmoe_moe_desc *d, const mmoe_moe_weights *w, int64_t t, const uint16_t *x,
                           const int32_t *ids, const int64_t *given_idx, const float *given_w)
{
    naive_runs r = {t, malloc((size_t)(t * d->hidden) * 2), malloc((size_t)(t * d->hidden) * 2),
                    malloc((size_t)(t * d->topk) * sizeof(int64_t)), malloc((size_t)(t * d->topk) * sizeof(int64_t)),
                    malloc((size_t)(t * d->topk) * sizeof(float)), malloc((size_t)(t * d->topk) * sizeof(float))};
    ck_assert(r.y_fast && r.y_naive && r.idx_fast && r.idx_naive && r.w_fast && r.w_naive);
    mmoe_test_poison_bf16(r.y_fast, (size_t)(t * d->hidden));
    mmoe_test_poison_bf16(r.y_naive, (size_t)(t * d->hidden));
    mmoe_error err;
    mmoe_moe_layer *layer;
    ck_assert_int_eq(mmoe_moe_layer_create(d, &layer, &err), MMOE_OK);
    ck_assert_msg(mmoe_moe_layer_set_weights(layer, w, &err) == MMOE_OK, "%s", err.msg);
    const mmoe_moe_input in = {t, x, ids, given_idx, given_w};
    const mmoe_moe_output of = {r.y_fast, r.idx_fast, r.w_fast};
    ck_assert_msg(mmoe_moe_layer_run(layer, &in, &of, NULL, &err) == MMOE_OK, "%s", err.msg);
    const mmoe_moe_path path = mmoe_moe_layer_shared_plan(layer, NULL, NULL);
    const mmoe_moe_output on = {r.y_naive, r.idx_naive, r.w_naive};
    ck_assert_msg(moe_naive_layer(d, w, path, &in, &on, &err) == MMOE_OK, "%s", err.msg);
    mmoe_moe_layer_destroy(layer);
    return r;
}

/** Bit-exact comparison of everything two runs produced. */
static void assert_bit_exact(const mmoe_moe_desc *d, const naive_runs *r, const char *what)
{
    for (int64_t i = 0; i < r->t * d->topk; i++) {
        ck_assert_msg(r->idx_fast[i] == r->idx_naive[i], "%s: topk_idx[%lld]: oracle %lld, naive %lld", what,
                      (long long)i, (long long)r->idx_fast[i], (long long)r->idx_naive[i]);
        ck_assert_msg(memcmp(&r->w_fast[i], &r->w_naive[i], sizeof(float)) == 0,
                      "%s: topk_weights[%lld]: oracle %a, naive %a", what, (long long)i, r->w_fast[i], r->w_naive[i]);
    }
    for (int64_t i = 0; i < r->t * d->hidden; i++)
        ck_assert_msg(r->y_fast[i] == r->y_naive[i], "%s: y[%lld][%lld]: oracle 0x%04x, naive 0x%04x", what,
                      (long long)(i / d->hidden), (long long)(i % d->hidden), r->y_fast[i], r->y_naive[i]);
}

/* ------------------------------------------------------------------ family 1: sparse rows */

static const naive_case k_sparse_cases[] = {
    {MMOE_RECIPE_SM100, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, MMOE_MATH_PRECISE, 0},
    {MMOE_RECIPE_SM90, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, MMOE_MATH_PRECISE, 0},
    {MMOE_RECIPE_DSV4_REF, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, MMOE_MATH_PRECISE, 0},
    {MMOE_RECIPE_SM100, MMOE_ROUTING_HASH, MMOE_SHARED_SERIAL, MMOE_MATH_PRECISE, 0},
    {MMOE_RECIPE_SM90, MMOE_ROUTING_HASH, MMOE_SHARED_SERIAL, MMOE_MATH_FAST, 0},
    {MMOE_RECIPE_DSV4_REF, MMOE_ROUTING_HASH, MMOE_SHARED_SERIAL, MMOE_MATH_FAST, 0},
    {MMOE_RECIPE_SM100, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, MMOE_MATH_FAST, 1},
    {MMOE_RECIPE_SM90, MMOE_ROUTING_BIASED, MMOE_SHARED_SERIAL, MMOE_MATH_PRECISE, 1},
    {MMOE_RECIPE_DSV4_REF, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, MMOE_MATH_PRECISE, 1},
};
enum { N_SPARSE = sizeof k_sparse_cases / sizeof k_sparse_cases[0] };

START_TEST(sparse_rows_bit_exact)
{
    const naive_case *c = &k_sparse_cases[_i];
    const mmoe_moe_desc d = case_desc(c);
    const uint64_t seed = g_seed + 101u * (uint64_t)_i;
    mmoe_error err;
    mmoe_moe_synth *syn;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, seed, MMOE_SYNTH_NORMAL, &syn, &err), MMOE_OK);
    mmoe_moe_weights *w = mmoe_moe_synth_weights_mut(syn);
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed ^ 0x5eed);
    const int keep = d.recipe == MMOE_RECIPE_SM90 ? 1 : 2;
    for (int64_t e = 0; e < d.n_experts; e++)
        sparsify_expert((mmoe_moe_expert_weights *)&w->experts[e], 0, keep, &rng);
    sparsify_expert(&w->shared, 0, keep, &rng);
    sparsify_bytes(&w->gate, 2, 2, &rng);
    enum { T = 6 };
    uint16_t x[T * 256];
    int32_t ids[T];
    int64_t idx[T * 3];
    float wts[T * 3];
    mmoe_moe_synth_input(&d, T, seed + 1, MMOE_SYNTH_NORMAL, x, ids);
    random_routing(&d, T, &rng, idx, wts);
    naive_runs r = run_both(&d, w, T, x, d.routing == MMOE_ROUTING_HASH ? ids : NULL, c->given_routing ? idx : NULL,
                            c->given_routing ? wts : NULL);
    char what[128];
    snprintf(what, sizeof what, "sparse %s %s %s %s%s", mmoe_moe_recipe_name(d.recipe),
             d.routing == MMOE_ROUTING_HASH ? "hash" : "biased", mmoe_moe_shared_mode_name(d.shared_mode),
             d.math == MMOE_MATH_FAST ? "fast" : "precise", c->given_routing ? " given routing" : "");
    assert_bit_exact(&d, &r, what);
    runs_free(&r);
    mmoe_moe_synth_destroy(syn);
}
END_TEST

/* ------------------------------------------------------------------ family 2: dyadic L1 */

START_TEST(dyadic_l1_bit_exact)
{
    naive_case c = {(mmoe_moe_recipe)(_i % MMOE_RECIPE_COUNT), MMOE_ROUTING_BIASED,
                    _i < MMOE_RECIPE_COUNT ? MMOE_SHARED_AUTO : MMOE_SHARED_SERIAL, MMOE_MATH_PRECISE, 1};
    const mmoe_moe_desc d = case_desc(&c);
    const uint64_t seed = g_seed + 7919u * (uint64_t)_i;
    mmoe_error err;
    mmoe_moe_synth *syn;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, seed, MMOE_SYNTH_DYADIC, &syn, &err), MMOE_OK);
    mmoe_moe_weights *w = mmoe_moe_synth_weights_mut(syn);
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed ^ 0xd1ad);
    const int keep = d.recipe == MMOE_RECIPE_SM90 ? 1 : 2; /* sm90's L2 operand fl(q s) is not short */
    for (int64_t e = 0; e < d.n_experts; e++)
        sparsify_expert((mmoe_moe_expert_weights *)&w->experts[e], 1, keep, &rng);
    sparsify_expert(&w->shared, c.shared_mode == MMOE_SHARED_SERIAL ? 0 : 1, keep, &rng);
    enum { T = 5 };
    uint16_t x[T * 256];
    int64_t idx[T * 3];
    float wts[T * 3];
    mmoe_moe_synth_input(&d, T, seed + 1, MMOE_SYNTH_DYADIC, x, NULL);
    random_routing(&d, T, &rng, idx, wts);
    naive_runs r = run_both(&d, w, T, x, NULL, idx, wts);
    char what[96];
    snprintf(what, sizeof what, "dyadic %s %s", mmoe_moe_recipe_name(d.recipe), mmoe_moe_shared_mode_name(d.shared_mode));
    assert_bit_exact(&d, &r, what);
    runs_free(&r);
    mmoe_moe_synth_destroy(syn);
}
END_TEST

/* ------------------------------------------------------------------ family 3: dense */

START_TEST(dense_bit_exact)
{
    const int recipes = MMOE_RECIPE_COUNT;
    naive_case c = {(mmoe_moe_recipe)(_i % recipes), MMOE_ROUTING_BIASED,
                    (_i / recipes) % 2 == 0 ? MMOE_SHARED_AUTO : MMOE_SHARED_SERIAL, MMOE_MATH_PRECISE,
                    _i < 2 * recipes};
    const mmoe_moe_desc d = case_desc(&c);
    const uint64_t seed = g_seed + 104729u * (uint64_t)_i;
    mmoe_error err;
    mmoe_moe_synth *syn;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, seed, MMOE_SYNTH_NORMAL, &syn, &err), MMOE_OK);
    const mmoe_moe_weights *w = mmoe_moe_synth_weights(syn);
    enum { T = 4 };
    uint16_t x[T * 256];
    mmoe_moe_synth_input(&d, T, seed + 1, MMOE_SYNTH_NORMAL, x, NULL);
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed ^ 0xde05e);
    int64_t idx[T * 3];
    float wts[T * 3];
    random_routing(&d, T, &rng, idx, wts);
    naive_runs r = run_both(&d, w, T, x, NULL, c.given_routing ? idx : NULL, c.given_routing ? wts : NULL);
    char what[96];
    snprintf(what, sizeof what, "dense %s %s%s", mmoe_moe_recipe_name(d.recipe),
             mmoe_moe_shared_mode_name(d.shared_mode), c.given_routing ? " given routing" : "");
    assert_bit_exact(&d, &r, what);
    runs_free(&r);
    mmoe_moe_synth_destroy(syn);
}
END_TEST

/**
 * One matrix of a layer, as both sides read it: the checkpoint tensors (naive) and the
 * oracle's view of them.
 */
typedef struct gemm_operand {
    const char *name;
    const mmoe_tensor *w, *sf;
    int64_t block; /**< FP8 scale block (FP4: 32) */
    moe_mat mat;
} gemm_operand;

/**
 * Every output a[t] . W[j] of @p op computed by moe_naive_dot() and by the oracle's expert
 * GEMM, bit for bit in FP32: once for all @p m tokens in one call (tiled path for m > 4) and
 * once per token (FP4 weights decoded in registers).  @p a is [m, K].
 */
static void assert_gemm_same(const gemm_operand *op, const float *a, int64_t m, const char *recipe)
{
    const int64_t n = op->mat.rows, k = op->mat.cols;
    float *all = malloc((size_t)(m * n) * sizeof(float)), *one = malloc((size_t)n * sizeof(float));
    ck_assert(all != NULL && one != NULL);
    mmoe_test_poison_f32(all, (size_t)(m * n));
    moe_scratch scratch = {0};
    moe_gemm_clock clk = {0};
    ck_assert_int_eq(moe_expert_gemm(&op->mat, a, m, all, &scratch, &clk), 0);
    for (int64_t t = 0; t < m; t++) {
        mmoe_test_poison_f32(one, (size_t)n);
        ck_assert_int_eq(moe_expert_gemm(&op->mat, a + t * k, 1, one, &scratch, &clk), 0);
        for (int64_t j = 0; j < n; j++) {
            const float naive = moe_naive_dot(a + t * k, op->w, op->sf, op->block, j, k);
            const int same = memcmp(&naive, &all[t * n + j], sizeof naive) == 0 && memcmp(&naive, &one[j], sizeof naive) == 0;
            ck_assert_msg(same,
                          "dense GEMM %s %s: token %lld row %lld: naive %a, oracle %a (%lld tokens), %a (alone)",
                          recipe, op->name, (long long)t, (long long)j, naive, all[t * n + j], (long long)m, one[j]);
        }
    }
    moe_scratch_free(&scratch);
    free(all);
    free(one);
}

/*
 * The GEMM sums themselves, before any BF16 rounding can hide a difference of one FP32 ulp:
 * L1 (gate and up) on the recipe's quantized input, L2 on the naive reference's own quantized
 * intermediate, for a routed expert (FP4) and the shared expert (FP8, block scales).  sm90's
 * operands fl(q s) make these products inexact, so the single rounding of each fma is checked.
 */
START_TEST(dense_gemm_sums_bit_exact)
{
    naive_case c = {(mmoe_moe_recipe)_i, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, MMOE_MATH_PRECISE, 1};
    const mmoe_moe_desc d = case_desc(&c);
    const uint64_t seed = g_seed + 15485863u * (uint64_t)_i;
    mmoe_error err;
    mmoe_moe_synth *syn;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, seed, MMOE_SYNTH_NORMAL, &syn, &err), MMOE_OK);
    const mmoe_moe_weights *w = mmoe_moe_synth_weights(syn);
    enum { T = 6, D = 256, I = 256 };
    uint16_t x[T * D];
    mmoe_moe_synth_input(&d, T, seed + 1, MMOE_SYNTH_NORMAL, x, NULL);
    const moe_naive_quant qx = d.recipe == MMOE_RECIPE_SM100 ? MOE_NAIVE_Q_SM100_X
                               : d.recipe == MMOE_RECIPE_SM90 ? MOE_NAIVE_Q_SM90
                                                              : MOE_NAIVE_Q_V4;
    float xf[T * D], xq[T * D], g[I], u[I], av[I], aq_e[T * I], aq_s[T * I];
    moe_naive_scratch s = {0};
    s.g = g;
    s.u = u;
    s.a = av;
    uint16_t y[D];
    const mmoe_moe_expert_weights *ex = &w->experts[_i % d.n_experts], *sh = &w->shared;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t k = 0; k < D; k++)
            xf[t * D + k] = mmoe_bf16_to_f32(x[t * D + k]);
        moe_naive_quantize(qx, xf + t * D, D, xq + t * D);
        s.aq = aq_e + t * I; /* the L2 inputs the naive reference forms */
        moe_naive_expert(ex, I, 32, D, d.recipe, d.math, d.swiglu_limit, xq + t * D, 0.75f, &s, y);
        s.aq = aq_s + t * I;
        moe_naive_expert(sh, I, d.shared_block, D, d.recipe, d.math, d.swiglu_limit, xq + t * D, 1.0f, &s, y);
    }
    gemm_operand ops[6] = {{"expert W1", &ex->w1, &ex->w1_scale, 32, {0}},
                           {"expert W3", &ex->w3, &ex->w3_scale, 32, {0}},
                           {"expert W2", &ex->w2, &ex->w2_scale, 32, {0}},
                           {"shared W1", &sh->w1, &sh->w1_scale, d.shared_block, {0}},
                           {"shared W3", &sh->w3, &sh->w3_scale, d.shared_block, {0}},
                           {"shared W2", &sh->w2, &sh->w2_scale, d.shared_block, {0}}};
    for (int i = 0; i < 3; i++)
        moe_mat_from_fp4(&ops[i].mat, ops[i].w, ops[i].sf);
    for (int i = 3; i < 6; i++)
        moe_mat_from_fp8(&ops[i].mat, ops[i].w, ops[i].sf, ops[i].block);
    const char *name = mmoe_moe_recipe_name(d.recipe);
    assert_gemm_same(&ops[0], xq, T, name);
    assert_gemm_same(&ops[1], xq, T, name);
    assert_gemm_same(&ops[2], aq_e, T, name);
    assert_gemm_same(&ops[3], xq, T, name);
    assert_gemm_same(&ops[4], xq, T, name);
    assert_gemm_same(&ops[5], aq_s, T, name);
    mmoe_moe_synth_destroy(syn);
}
END_TEST

static Suite *naive_suite(void)
{
    Suite *s = suite_create("moe_naive");
    TCase *tc = tcase_create("oracle against the naive reference");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, sparse_rows_bit_exact, 0, N_SPARSE);
    tcase_add_loop_test(tc, dyadic_l1_bit_exact, 0, 2 * MMOE_RECIPE_COUNT);
    tcase_add_loop_test(tc, dense_bit_exact, 0, 4 * MMOE_RECIPE_COUNT);
    tcase_add_loop_test(tc, dense_gemm_sums_bit_exact, 0, MMOE_RECIPE_COUNT);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("moe_naive");
    return mmoe_test_run(naive_suite());
}
