/**
 * @file test_moe_naive.c
 * @brief Suite "moe_naive": the fast oracle against the naive reference (moe_naive.c), which
 *        reads the recipe table of docs/spec/moe-layer.md literally.
 *
 * The naive reference sums every GEMM with one FP32 accumulator per output, k ascending.  The
 * oracle lets OpenBLAS choose its order inside fixed blocks.  The products are exact either
 * way, so the two agree bit for bit whenever the *sums* cannot depend on the order.  Three
 * families of random layers (seeds printed, replay with MMOE_SEED=n):
 *
 *  1. **sparse rows**: realistic quantized weights in which every row of W1, W3, W2, of the
 *     shared expert and of the router gate keeps only two non-zero weights.  A sum of two
 *     exact products and zeros is one rounding in any order, so every stage is order-free and
 *     the layer must match **bit for bit**: the rounding points R1-R9 of every recipe, fused and
 *     serial shared expert, biased and hash routing, the router's ties and weights, masked
 *     slots, precise and fast math.
 *  2. **dyadic L1, sparse L2**: dense W1/W3 and integer x whose L1 sums are exact in FP32
 *     (MMOE_SYNTH_DYADIC), W2 with two non-zeros per row (one for sm90, whose operands
 *     fl(q s) make rounded products); given routing.  Bit for bit.
 *  3. **dense**: realistic dense weights (MMOE_SYNTH_NORMAL), the oracle's own routing given to
 *     both.  The sums of the two implementations are equal once the oracle also sums k
 *     ascending with one accumulator per output; until then (OpenBLAS's order) an L1 sum can
 *     differ by an FP32 ulp and flip a BF16 rounding, so each output is checked against the
 *     bound derived at dense_bound() and the number of bit-identical outputs is printed.
 *     Define MOE_NAIVE_EXPECT_BIT_EXACT to require bit-exactness in family 3 as well.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"
#include "mmoe_moe.h"
#include "mmoe_moe_synth.h"
#include "mmoe_rng.h"
#include "mmoe_test.h"
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

/**
 * The bound on |y_oracle - y_naive| for one output d of one token, while the two sum the GEMMs
 * in different orders.  With the oracle's order equal to the naive one it is 0.
 *
 * Derivation, per slot (weight w, naive values g, u, a, â of moe_naive_expert()):
 *  - L1: both orders sum the same exact products, so each sum is within gamma_D * S of the exact
 *    value (S = sum |x̂ W|, gamma_D = D u / (1 - D u), u = 2^-24); R3 then rounds each to BF16.
 *    Two BF16 roundings of values that close differ by at most one BF16 ulp (2^-7 |v|) plus
 *    2 gamma_D S, so |dg| <= 2^-7 |g| + 2 gamma_D S_g, and the same for u.
 *  - R4-R6: the clamp is 1-Lipschitz; |d silu / dg| <= 1.1; so
 *    |da| <= |w| (1.1 |dg| |u| + |silu(g)| |du| + |dg| |du|) plus a few FP32 ulps of |a| (taken
 *    as 2^-20 |a|); dsv4-ref's BF16 rounding of a adds one BF16 ulp (2^-7 |a|).
 *  - R7: each side rounds its a to E4M3 on its own group scale; a rounding moves a value by at
 *    most half an E4M3 step, 2^-4 |a| for normals and 2^-10 s below, and the group scale s is at
 *    most 2 amax / 448 (a ceiling; amax may differ by max |da| between the sides, and SM90's
 *    scale is amax / 448).  So |dâ_i| <= |da_i| + 2 (2^-4 (|a_i| + |da_i|) + 2^-10 (2 (amax + max|da|) / 448)).
 *  - L2: |d L2_d| <= sum_i |dâ_i| |W2_di| + 2 gamma_I sum_i |â_i W2_di| (+ the |dâ| on the right),
 *    then R8 rounds to BF16 (one ulp, 2^-7 |y|).
 *  - R9: the slot outputs (and the shared one) are added in the same order; each addition can
 *    shift by the difference of its inputs plus one FP32 ulp, and the final BF16 store by one
 *    BF16 ulp.
 * The sum of these terms, doubled as a margin, is returned.  The shared expert (weight 1) is
 * bounded the same way with the recipe of its path.
 */
static double dense_bound(const mmoe_moe_desc *d, const mmoe_moe_weights *w, mmoe_moe_path path, const uint16_t *xt,
                          const int64_t *idx, const float *wts, moe_naive_scratch *s, double *ybound)
{
    const double gamma_d = (double)d->hidden * 0x1p-24 / (1.0 - (double)d->hidden * 0x1p-24);
    const double gamma_i = 512.0 * 0x1p-24 / (1.0 - 512.0 * 0x1p-24);
    for (int64_t k = 0; k < d->hidden; k++)
        s->x[k] = mmoe_bf16_to_f32(xt[k]);
    moe_naive_quant qx = d->recipe == MMOE_RECIPE_SM100 ? MOE_NAIVE_Q_SM100_X
                         : d->recipe == MMOE_RECIPE_SM90 ? MOE_NAIVE_Q_SM90
                                                         : MOE_NAIVE_Q_V4;
    for (int64_t c = 0; c < d->hidden; c++)
        ybound[c] = 0.0;
    double ysum = 0.0;
    uint16_t *yrow = malloc((size_t)d->hidden * 2);
    double *da = malloc((size_t)(d->inter + d->n_shared * d->shared_inter) * sizeof(double));
    ck_assert(yrow != NULL && da != NULL);
    for (int j = -1; j < d->topk; j++) {
        const mmoe_moe_expert_weights *ew;
        int64_t width, block;
        mmoe_moe_recipe recipe = d->recipe;
        float wt;
        if (j < 0) { /* the shared expert */
            if (path == MMOE_PATH_NONE)
                continue;
            ew = &w->shared;
            width = d->n_shared * d->shared_inter;
            block = d->shared_block;
            wt = 1.0f;
            if (path == MMOE_PATH_SERIAL)
                recipe = MMOE_RECIPE_DSV4_REF;
        } else {
            if (idx[j] < 0)
                continue;
            ew = &w->experts[idx[j]];
            width = d->inter;
            block = 32;
            wt = wts[j];
        }
        moe_naive_quantize(j < 0 && path == MMOE_PATH_SERIAL ? MOE_NAIVE_Q_V4 : qx, s->x, d->hidden, s->xq);
        moe_naive_expert(ew, width, block, d->hidden, recipe, d->math, d->swiglu_limit, s->xq, wt, s, yrow);
        const int64_t group = recipe == MMOE_RECIPE_SM100 ? 32 : 128;
        double max_da = 0.0;
        for (int64_t i = 0; i < width; i++) {
            double sg = 0.0, su = 0.0;
            for (int64_t k = 0; k < d->hidden; k++) {
                sg += fabs((double)s->xq[k] * moe_naive_weight(&ew->w1, &ew->w1_scale, block, i, k));
                su += fabs((double)s->xq[k] * moe_naive_weight(&ew->w3, &ew->w3_scale, block, i, k));
            }
            const double g = fabs(mmoe_bf16_round(s->g[i])), u = fabs(mmoe_bf16_round(s->u[i]));
            const double dg = 0x1p-7 * g + 2 * gamma_d * sg, du = 0x1p-7 * u + 2 * gamma_d * su;
            const double silu = fmax(g, 0.3); /* |silu(g)| <= max(|g|, 0.28) */
            da[i] = fabs(wt) * (1.1 * dg * u + silu * du + dg * du) + 0x1p-20 * fabs(s->a[i]) +
                    (recipe == MMOE_RECIPE_DSV4_REF ? 0x1p-7 * fabs(s->a[i]) : 0.0);
            max_da = fmax(max_da, da[i]);
        }
        for (int64_t g0 = 0; g0 < width; g0 += group) {
            double amax = 0.0;
            for (int64_t i = g0; i < g0 + group; i++)
                amax = fmax(amax, fabs(s->a[i]));
            const double sub = 0x1p-10 * 2.0 * (amax + max_da) / 448.0;
            for (int64_t i = g0; i < g0 + group; i++)
                da[i] = da[i] + 2.0 * (0x1p-4 * (fabs(s->a[i]) + da[i]) + sub);
        }
        for (int64_t c = 0; c < d->hidden; c++) {
            double acc = 0.0, mag = 0.0;
            for (int64_t i = 0; i < width; i++) {
                const double w2 = fabs(moe_naive_weight(&ew->w2, &ew->w2_scale, block, c, i));
                acc += da[i] * w2;
                mag += (fabs(s->aq[i]) + da[i]) * w2;
            }
            const double y = fabs(mmoe_bf16_to_f32(yrow[c]));
            ybound[c] += acc + 2 * gamma_i * mag + 0x1p-7 * (y + acc) + 0x1p-23 * (y + acc);
            ysum += y;
        }
    }
    for (int64_t c = 0; c < d->hidden; c++)
        ybound[c] = 2.0 * (ybound[c] + 0x1p-7 * ysum + 0x1p-7 * ybound[c]);
    free(yrow);
    free(da);
    return ysum;
}

START_TEST(dense_within_bound)
{
    naive_case c = {(mmoe_moe_recipe)(_i % MMOE_RECIPE_COUNT), MMOE_ROUTING_BIASED,
                    _i < MMOE_RECIPE_COUNT ? MMOE_SHARED_AUTO : MMOE_SHARED_SERIAL, MMOE_MATH_PRECISE, 1};
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
    naive_runs r = run_both(&d, w, T, x, NULL, idx, wts);
    mmoe_moe_layer *layer;
    ck_assert_int_eq(mmoe_moe_layer_create(&d, &layer, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_moe_layer_set_weights(layer, w, &err), MMOE_OK);
    const mmoe_moe_path path = mmoe_moe_layer_shared_plan(layer, NULL, NULL);
    mmoe_moe_layer_destroy(layer);
    moe_naive_scratch s = {0};
    const size_t nw = (size_t)(d.n_shared * d.shared_inter);
    s.x = malloc(256 * sizeof(float));
    s.xq = malloc(256 * sizeof(float));
    s.g = malloc(nw * sizeof(float));
    s.u = malloc(nw * sizeof(float));
    s.a = malloc(nw * sizeof(float));
    s.aq = malloc(nw * sizeof(float));
    double bound[256];
    int64_t same = 0;
    double worst = 0.0;
    for (int64_t t = 0; t < T; t++) {
        dense_bound(&d, w, path, x + t * 256, idx + t * 3, wts + t * 3, &s, bound);
        for (int64_t k = 0; k < 256; k++) {
            const uint16_t a = r.y_fast[t * 256 + k], b = r.y_naive[t * 256 + k];
            same += a == b;
#ifdef MOE_NAIVE_EXPECT_BIT_EXACT
            ck_assert_msg(a == b, "dense y[%lld][%lld]: oracle 0x%04x, naive 0x%04x", (long long)t, (long long)k, a, b);
#endif
            const double diff = fabs((double)mmoe_bf16_to_f32(a) - (double)mmoe_bf16_to_f32(b));
            ck_assert_msg(diff <= bound[k], "dense %s y[%lld][%lld]: oracle %g, naive %g, |diff| %g > bound %g",
                          mmoe_moe_recipe_name(d.recipe), (long long)t, (long long)k, mmoe_bf16_to_f32(a),
                          mmoe_bf16_to_f32(b), diff, bound[k]);
            if (bound[k] > 0)
                worst = fmax(worst, diff / bound[k]);
        }
    }
    fprintf(stderr, "moe_naive: dense %s %s: %lld of %d outputs bit-identical, worst |diff| / bound %.3g\n",
            mmoe_moe_recipe_name(d.recipe), mmoe_moe_shared_mode_name(d.shared_mode), (long long)same, T * 256, worst);
    free(s.x);
    free(s.xq);
    free(s.g);
    free(s.u);
    free(s.a);
    free(s.aq);
    runs_free(&r);
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
    tcase_add_loop_test(tc, dense_within_bound, 0, 2 * MMOE_RECIPE_COUNT);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("moe_naive");
    return mmoe_test_run(naive_suite());
}
