/**
 * @file test_moe.c
 * @brief Suite "moe": the CPU oracle of the MoE layer, stage by stage and end to end.
 *
 * Seeds are printed (replay with MMOE_SEED=n); outputs are NaN-poisoned before each call.
 * Shapes are small (D 128-256) so that the suite stays fast under sanitizers; the padding
 * property runs over the real intermediate widths {128, 256, 2048, 2304, 2560, 3072}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"
#include "mmoe_log1p.h"
#include "mmoe_moe.h"
#include "mmoe_moe_synth.h"
#include "mmoe_test.h"
#include "moe_internal.h"
#include "moe_ref64.h"

static uint64_t g_seed;

/* ------------------------------------------------------------------ helpers */

static mmoe_moe_desc small_desc(int64_t d, int64_t inter, int64_t e, int topk, int n_shared)
{
    mmoe_moe_desc desc;
    mmoe_moe_desc_init(&desc);
    desc.hidden = d;
    desc.inter = inter;
    desc.n_experts = e;
    desc.topk = topk;
    desc.n_shared = n_shared;
    desc.shared_inter = inter;
    desc.routed_scaling_factor = 1.5f;
    desc.vocab = 64;
    return desc;
}

typedef struct fixture {
    mmoe_moe_desc desc;
    mmoe_moe_synth *synth;
    mmoe_moe_layer *layer;
} fixture;

static void fixture_make(fixture *f, const mmoe_moe_desc *desc, uint64_t seed, mmoe_moe_synth_values v)
{
    mmoe_error err;
    f->desc = *desc;
    ck_assert_int_eq(mmoe_moe_synth_create(desc, seed, v, &f->synth, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_moe_layer_create(desc, &f->layer, &err), MMOE_OK);
    mmoe_status st = mmoe_moe_layer_set_weights(f->layer, mmoe_moe_synth_weights(f->synth), &err);
    ck_assert_msg(st == MMOE_OK, "set_weights: %s", err.msg);
}

static void fixture_free(fixture *f)
{
    mmoe_moe_layer_destroy(f->layer);
    mmoe_moe_synth_destroy(f->synth);
}

/** Run with the router (idx/wts NULL) or a given routing; output y poisoned first. */
static mmoe_status run_layer(mmoe_moe_layer *layer, int64_t t, const uint16_t *x, const int32_t *ids,
                             const int64_t *idx, const float *wts, uint16_t *y, int64_t *oidx, float *owts,
                             mmoe_moe_result *res, mmoe_error *err)
{
    const mmoe_moe_desc *d = mmoe_moe_layer_desc(layer);
    mmoe_test_poison_bf16(y, (size_t)(t * d->hidden));
    mmoe_moe_input in = {t, x, ids, idx, wts};
    mmoe_moe_output out = {y, oidx, owts};
    return mmoe_moe_layer_run(layer, &in, &out, res, err);
}

static uint16_t *make_x(const mmoe_moe_desc *d, int64_t t, uint64_t seed, mmoe_moe_synth_values v)
{
    uint16_t *x = malloc((size_t)(t * d->hidden > 0 ? t * d->hidden : 1) * 2);
    mmoe_moe_synth_input(d, t, seed, v, x, NULL);
    return x;
}

/* ------------------------------------------------------------------ router */

START_TEST(router_ties_bias_renorm_scaling)
{
    mmoe_moe_desc d = small_desc(128, 128, 8, 3, 0);
    fixture f;
    fixture_make(&f, &d, g_seed, MMOE_SYNTH_NORMAL);
    mmoe_moe_weights *w = mmoe_moe_synth_weights_mut(f.synth);
    /* x = e_0, so logit[e] = gate[e][0] exactly */
    static const float z[8] = {1.0f, 2.0f, 2.0f, -1.0f, 25.0f, 0.5f, 2.0f, -3.0f};
    static const float bias[8] = {0, 0, 0, 0, 0, 0, 0, 100.0f};
    uint16_t *gate = w->gate.data;
    float *b = w->gate_bias.data;
    for (int e = 0; e < 8; e++) {
        gate[e * 128] = mmoe_bf16_from_f32(z[e]);
        b[e] = bias[e];
    }
    uint16_t x[128];
    memset(x, 0, sizeof x);
    x[0] = mmoe_bf16_from_f32(1.0f);
    uint16_t y[128];
    int64_t idx[3];
    float wts[3];
    mmoe_error err;
    ck_assert_int_eq(run_layer(f.layer, 1, x, NULL, NULL, NULL, y, idx, wts, NULL, &err), MMOE_OK);
    /* selection on s + bias: expert 7 (bias 100), 4 (z = 25 > 20: softplus = z, s = 5), then the
       tie s(2) of experts 1, 2, 6 goes to the lowest id, 1 */
    ck_assert_int_eq(idx[0], 7);
    ck_assert_int_eq(idx[1], 4);
    ck_assert_int_eq(idx[2], 1);
    /* weights from s only (the bias is for selection), renormalized, then scaled */
    /* log1p as the spec names it (mmoe_log1pf, tested on its own in log1pf_fixed_evaluation) */
    const float s7 = sqrtf(mmoe_log1pf(expf(-3.0f))), s4 = 5.0f, s1 = sqrtf(mmoe_log1pf(expf(2.0f)));
    const float sum = ((0.0f + s7) + s4) + s1;
    const float want[3] = {(s7 / sum) * 1.5f, (s4 / sum) * 1.5f, (s1 / sum) * 1.5f};
    for (int k = 0; k < 3; k++)
        ck_assert_msg(memcmp(&wts[k], &want[k], 4) == 0, "slot %d: weight %a, expected %a", k, (double)wts[k],
                      (double)want[k]);
    fixture_free(&f);
}
END_TEST

/*
 * mmoe_log1pf against log(1 + x) in long double rounded once to float (an independent,
 * more precise evaluation: the C library's log1pl), on a fixed grid: the arguments the router
 * gives it (x = expf(z) for z in [-110, 20] in steps of 2^-10, subnormals to 4.8e8) and the
 * rest of (-1, 2^20].  Within one ulp everywhere, and equal on all but two at most (none on
 * x86-64): the chapter of mmoe_log1p.h says why only arguments within a few float64 ulps of a
 * midpoint may differ.
 * Then the special values, as log1p's.
 */
START_TEST(log1pf_fixed_evaluation)
{
    int64_t n = 0, equal = 0;
    uint32_t worst = 0;
    for (int i = -110 * 1024; i <= 20 * 1024; i++) {
        const float x = expf((float)i / 1024.0f);
        const float got = mmoe_log1pf(x), want = (float)log1pl((long double)x);
        const uint32_t u = mmoe_test_ulp_f32(got, want);
        worst = u > worst ? u : worst;
        equal += u == 0;
        n++;
    }
    for (int i = 1; i < (1 << 16); i++) { /* (-1, 0) and (0, 2^20] */
        const float xs[2] = {-(float)i / (float)(1 << 16), (float)i * (float)i / 4096.0f};
        for (int j = 0; j < 2; j++) {
            const float got = mmoe_log1pf(xs[j]), want = (float)log1pl((long double)xs[j]);
            const uint32_t u = mmoe_test_ulp_f32(got, want);
            worst = u > worst ? u : worst;
            equal += u == 0;
            n++;
        }
    }
    fprintf(stderr, "mmoe_log1pf: %lld of %lld arguments equal to log1pl rounded once, worst %lld ulp\n",
            (long long)equal, (long long)n, (long long)worst);
    ck_assert_uint_le(worst, 1);
    ck_assert_int_ge(equal, n - 2);
    const float zero = 0.0f, nzero = -0.0f;
    const float z0 = mmoe_log1pf(zero), z1 = mmoe_log1pf(nzero);
    ck_assert(memcmp(&z0, &zero, 4) == 0 && memcmp(&z1, &nzero, 4) == 0);
    ck_assert(mmoe_log1pf(-1.0f) == -INFINITY);
    ck_assert(isnan(mmoe_log1pf(-1.5f)) && isnan(mmoe_log1pf(NAN)) && isnan(mmoe_log1pf(-INFINITY)));
    ck_assert(mmoe_log1pf(INFINITY) == INFINITY);
    ck_assert(mmoe_log1pf(0x1p-149f) == 0x1p-149f); /* log1p(x) = x below half an ulp */
    ck_assert(mmoe_log1pf(1.0f) == 0x1.62e43p-1f);   /* ln 2 rounded: 0.693147182... */
}
END_TEST

START_TEST(topk_select_nan_and_ties)
{
    const float sel[6] = {1.0f, NAN, 3.0f, 3.0f, -INFINITY, 1.0f};
    int64_t idx[6];
    moe_topk_select(sel, 6, 6, idx);
    const int64_t want[6] = {2, 3, 0, 5, 4, 1}; /* ties to the lower id; NaN last */
    for (int k = 0; k < 6; k++)
        ck_assert_int_eq(idx[k], want[k]);
    ck_assert(moe_sqrtsoftplus(30.0f) == sqrtf(30.0f)); /* threshold 20: identity */
}
END_TEST

START_TEST(hash_routing)
{
    mmoe_moe_desc d = small_desc(128, 128, 8, 3, 1);
    d.routing = MMOE_ROUTING_HASH;
    d.vocab = 16;
    fixture f;
    fixture_make(&f, &d, g_seed, MMOE_SYNTH_DYADIC);
    const int64_t t = 5;
    uint16_t *x = make_x(&d, t, g_seed, MMOE_SYNTH_DYADIC);
    int32_t ids[5] = {0, 15, 3, 3, 7};
    uint16_t y[5 * 128];
    int64_t idx[15];
    float wts[15];
    mmoe_error err;
    ck_assert_int_eq(run_layer(f.layer, t, x, ids, NULL, NULL, y, idx, wts, NULL, &err), MMOE_OK);
    const mmoe_moe_weights *w = mmoe_moe_synth_weights(f.synth);
    const int32_t *table = w->tid2eid.data;
    const uint16_t *gate = w->gate.data;
    for (int64_t i = 0; i < t; i++) {
        float s[3], sum = 0.0f;
        for (int k = 0; k < 3; k++) {
            const int64_t e = table[ids[i] * 3 + k];
            ck_assert_int_eq(idx[i * 3 + k], e);
            double z = 0; /* dyadic values: the FP32 logit is this exact sum */
            for (int j = 0; j < 128; j++)
                z += (double)mmoe_bf16_to_f32(x[i * 128 + j]) * (double)mmoe_bf16_to_f32(gate[e * 128 + j]);
            const float zf = (float)z;
            s[k] = sqrtf(zf > 20.0f ? zf : mmoe_log1pf(expf(zf)));
            sum += s[k];
        }
        for (int k = 0; k < 3; k++) {
            const float want = (s[k] / sum) * d.routed_scaling_factor;
            ck_assert_msg(memcmp(&wts[i * 3 + k], &want, 4) == 0, "token %lld slot %d", (long long)i, k);
        }
    }
    /* no token ids, or one out of range: clear errors */
    ck_assert_int_eq(run_layer(f.layer, t, x, NULL, NULL, NULL, y, idx, wts, NULL, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "token_ids"));
    ids[2] = 16;
    ck_assert_int_eq(run_layer(f.layer, t, x, ids, NULL, NULL, y, idx, wts, NULL, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "out of range"));
    free(x);
    fixture_free(&f);
}
END_TEST

/* ------------------------------------------------------------------ epilogue and combine */

/** The spec's epilogue, re-derived (docs/spec/moe-layer.md, R3-R7). */
static float spec_swiglu(mmoe_moe_recipe r, float limit, float acc_g, float acc_u, float w)
{
    float g = mmoe_bf16_round(acc_g), u = mmoe_bf16_round(acc_u);
    const int kernel = r != MMOE_RECIPE_DSV4_REF;
    const float c = kernel ? mmoe_bf16_round(limit) : limit;
    g = fminf(g, c);
    u = fminf(fmaxf(u, -c), c);
    float h;
    if (kernel) {
        float sig = 1.0f / (1.0f + expf(-g));
        h = ((g * sig) * u) * w;
    } else {
        h = mmoe_bf16_round(((g / (1.0f + expf(-g))) * u) * w);
    }
    return h;
}

START_TEST(epilogue_bit_exact_per_recipe)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed);
    for (int r = 0; r < MMOE_RECIPE_COUNT; r++) {
        const moe_rules *rules = moe_recipe_rules((mmoe_moe_recipe)r);
        for (int i = 0; i < 20000; i++) {
            const float g = (float)(mmoe_rng_normal(&rng) * 8.0), u = (float)(mmoe_rng_normal(&rng) * 8.0);
            const float w = (float)mmoe_rng_uniform(&rng);
            const float limit = i % 3 == 0 ? 7.3f : 10.0f; /* 7.3 is not a BF16 value: the recipes differ */
            const float got = moe_swiglu_one(&rules->routed, MMOE_MATH_PRECISE, limit, g, u, w);
            const float want = spec_swiglu((mmoe_moe_recipe)r, limit, g, u, w);
            ck_assert_msg(memcmp(&got, &want, 4) == 0, "recipe %d: g %a u %a w %a: %a != %a", r, (double)g,
                          (double)u, (double)w, (double)got, (double)want);
        }
    }
    /* the clamp: gate bounded above only, up on both sides */
    const moe_rules *sm100 = moe_recipe_rules(MMOE_RECIPE_SM100);
    float big = moe_swiglu_one(&sm100->routed, MMOE_MATH_PRECISE, 10.0f, 50.0f, -50.0f, 1.0f);
    ck_assert(big == (10.0f * (1.0f / (1.0f + expf(-10.0f)))) * -10.0f);
    float neg = moe_swiglu_one(&sm100->routed, MMOE_MATH_PRECISE, 10.0f, -50.0f, 1.0f, 1.0f);
    ck_assert(neg == -50.0f * (1.0f / (1.0f + expf(50.0f))));
    /* fast math: exp2f(fl(-g * log2 e)) instead of expf(-g).  The rounded product carries a
       relative error 2^-24 of |g| log2 e, i.e. an absolute error |g| log2(e) 2^-24 in the
       exponent, which is |g| 2^-24 relative in e (about |g| ulp); sig = 1/(1+e) and the
       products add a few ulp: bound |g| + 4 ulp. */
    for (int i = 0; i < 1000; i++) {
        const float g = (float)(mmoe_rng_normal(&rng) * 4.0), u = (float)mmoe_rng_normal(&rng);
        const float p = moe_swiglu_one(&sm100->routed, MMOE_MATH_PRECISE, 10.0f, g, u, 1.0f);
        const float q = moe_swiglu_one(&sm100->routed, MMOE_MATH_FAST, 10.0f, g, u, 1.0f);
        ck_assert_uint_le(mmoe_test_ulp_f32(p, q), (uint32_t)ceilf(fabsf(g)) + 4);
    }
}
END_TEST

START_TEST(requant_rules)
{
    /* SM100 kernel requant: amax 0 -> zeros (no 1e-4 clamp needed); a group scale is the
       ceil power of two of amax/448 */
    float a[64], out[64];
    for (int i = 0; i < 32; i++)
        a[i] = 0.0f;
    for (int i = 32; i < 64; i++)
        a[i] = (float)(i - 40) * 0.37f;
    moe_act_quant_rows(a, 1, 64, MOE_Q_SM100_REQUANT_32, out);
    for (int i = 0; i < 32; i++)
        ck_assert(out[i] == 0.0f);
    float amax = 23 * 0.37f;
    double sf = ldexp(1.0, (int)ceil(log2((double)(amax * (1.0f / 448.0f)))));
    for (int i = 32; i < 64; i++) {
        double q = mmoe_fp8_e4m3_to_f32(mmoe_fp8_e4m3_from_f32((float)(a[i] / sf))) * sf;
        ck_assert_msg(out[i] == (float)q, "element %d", i);
    }
}
END_TEST

START_TEST(combine_order)
{
    /* (2^24 + 1) - 2^24 = 0 in slot order, (1 - 2^24) + 2^24 = 1 in expert-id order */
    uint16_t rows[3][2], y[2];
    const float vals[3] = {16777216.0f, 1.0f, -16777216.0f};
    for (int k = 0; k < 3; k++)
        rows[k][0] = rows[k][1] = mmoe_bf16_from_f32(vals[k]);
    const int64_t idx[3] = {5, 1, 3};
    const uint16_t *slots[3] = {rows[0], rows[1], rows[2]};
    moe_combine_token(MOE_COMBINE_SLOT, 3, idx, slots, NULL, 2, y);
    ck_assert(mmoe_bf16_to_f32(y[0]) == 0.0f);
    moe_combine_token(MOE_COMBINE_EXPERT_ID, 3, idx, slots, NULL, 2, y);
    ck_assert(mmoe_bf16_to_f32(y[0]) == 1.0f);
    /* shared last: (0 + 2^24) + 1 -> 2^24, then + (-2^24) = 0 ... with slot 2 masked */
    const int64_t masked[3] = {5, 1, -1};
    moe_combine_token(MOE_COMBINE_SLOT, 3, masked, slots, rows[2], 2, y);
    ck_assert(mmoe_bf16_to_f32(y[1]) == 0.0f);
    const int64_t none[3] = {-1, -1, -1};
    moe_combine_token(MOE_COMBINE_SLOT, 3, none, slots, NULL, 2, y);
    ck_assert(y[0] == 0 && y[1] == 0); /* +0 */
}
END_TEST

START_TEST(weight_tiles_match_format_dequantizer)
{
    mmoe_moe_desc d = small_desc(128, 256, 2, 1, 1);
    mmoe_moe_synth *s;
    mmoe_error err;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, g_seed, MMOE_SYNTH_NORMAL, &s, &err), MMOE_OK);
    const mmoe_moe_weights *w = mmoe_moe_synth_weights(s);
    moe_mat m;
    moe_mat_from_fp4(&m, &w->experts[1].w2, &w->experts[1].w2_scale);
    float tile[128 * 128], row[256];
    moe_weight_tile_f32(&m, 0, 128, 128, 128, tile);
    for (int r = 0; r < 128; r++) {
        mmoe_dequant_row_mxfp4((const uint8_t *)w->experts[1].w2.data + r * 128,
                               (const uint8_t *)w->experts[1].w2_scale.data + r * 8, 256, row, NULL);
        ck_assert(memcmp(tile + r * 128, row + 128, 128 * 4) == 0);
    }
    moe_mat_from_fp8(&m, &w->shared.w1, &w->shared.w1_scale, 128);
    float t8[4 * 128];
    moe_weight_tile_f32(&m, 130, 4, 0, 128, t8);
    for (int r = 0; r < 4; r++) {
        mmoe_dequant_fp8_weight_row(w->shared.w1.data, 256, 128, (size_t)(130 + r), w->shared.w1_scale.data,
                                    MMOE_DT_F8_E8M0, 128, row, NULL);
        ck_assert(memcmp(t8 + r * 128, row, 128 * 4) == 0);
    }
    mmoe_moe_synth_destroy(s);
}
END_TEST

/* ------------------------------------------------------------------ padding */

START_TEST(padding_is_bit_identical)
{
    static const int64_t widths[] = {128, 256, 2048, 2304, 2560, 3072};
    static const int64_t pads[] = {256, 512, 1024, 2560};
    const int64_t t = 4;
    const int64_t width = widths[_i];
    for (int r = 0; r < 2 * MMOE_RECIPE_COUNT; r++) {
        mmoe_moe_desc d = small_desc(128, width, 3, 2, 1);
        d.recipe = (mmoe_moe_recipe)(r % MMOE_RECIPE_COUNT);
        /* the second round: serial shared expert with V4.1's 32 x 32 scale blocks */
        if (r >= MMOE_RECIPE_COUNT) {
            d.shared_mode = MMOE_SHARED_SERIAL;
            d.shared_block = 32;
        }
        fixture f;
        fixture_make(&f, &d, g_seed + (uint64_t)_i, MMOE_SYNTH_NORMAL);
        uint16_t *x = make_x(&d, t, g_seed, MMOE_SYNTH_NORMAL);
        uint16_t y0[4 * 128], y1[4 * 128];
        mmoe_error err;
        mmoe_moe_result res;
        mmoe_moe_result_init(&res);
        ck_assert_int_eq(run_layer(f.layer, t, x, NULL, NULL, NULL, y0, NULL, NULL, &res, &err), MMOE_OK);
        ck_assert_int_eq(res.padded, 0);
        for (size_t p = 0; p < sizeof pads / sizeof pads[0]; p++) {
            mmoe_moe_desc dp = d;
            dp.pad_to = pads[p];
            mmoe_moe_layer *lp;
            ck_assert_int_eq(mmoe_moe_layer_create(&dp, &lp, &err), MMOE_OK);
            ck_assert_int_eq(mmoe_moe_layer_set_weights(lp, mmoe_moe_synth_weights(f.synth), &err), MMOE_OK);
            ck_assert_int_eq(run_layer(lp, t, x, NULL, NULL, NULL, y1, NULL, NULL, &res, &err), MMOE_OK);
            const int64_t ip = (width + pads[p] - 1) / pads[p] * pads[p];
            ck_assert_int_eq(res.inter_used, ip);
            ck_assert_int_eq(res.padded, ip != width);
            /* the shared expert was padded along, so fusion stays possible */
            ck_assert_int_eq(res.shared_path, r < MMOE_RECIPE_COUNT ? MMOE_PATH_FUSED : MMOE_PATH_SERIAL);
            ck_assert_msg(memcmp(y0, y1, sizeof y0) == 0, "recipe %s, I %lld padded to %lld: output differs",
                          mmoe_moe_recipe_name(d.recipe), (long long)width, (long long)ip);
            mmoe_moe_memory mem;
            mmoe_moe_layer_memory(lp, &mem);
            ck_assert_uint_eq(mem.owned_peak_bytes, mem.owned_bytes); /* one copy, never two */
            mmoe_moe_layer_destroy(lp);
        }
        /* padding a layer after its weights were attached gives the same bits too */
        ck_assert_int_eq(mmoe_moe_layer_pad(f.layer, 512, &err), MMOE_OK);
        ck_assert_int_eq(run_layer(f.layer, t, x, NULL, NULL, NULL, y1, NULL, NULL, &res, &err), MMOE_OK);
        ck_assert(memcmp(y0, y1, sizeof y0) == 0);
        free(x);
        fixture_free(&f);
    }
}
END_TEST

START_TEST(padding_serial_path)
{
    mmoe_moe_desc d = small_desc(128, 2304, 2, 2, 1);
    d.shared_mode = MMOE_SHARED_SERIAL;
    fixture f;
    fixture_make(&f, &d, g_seed, MMOE_SYNTH_NORMAL);
    uint16_t *x = make_x(&d, 3, g_seed, MMOE_SYNTH_NORMAL);
    uint16_t y0[3 * 128], y1[3 * 128];
    mmoe_error err;
    ck_assert_int_eq(run_layer(f.layer, 3, x, NULL, NULL, NULL, y0, NULL, NULL, NULL, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_moe_layer_pad(f.layer, 512, &err), MMOE_OK);
    mmoe_moe_memory mem;
    mmoe_moe_layer_memory(f.layer, &mem);
    ck_assert_uint_gt(mem.owned_bytes, 0);
    ck_assert_int_eq(run_layer(f.layer, 3, x, NULL, NULL, NULL, y1, NULL, NULL, NULL, &err), MMOE_OK);
    ck_assert(memcmp(y0, y1, sizeof y0) == 0);
    /* padding an already padded (owned) layer again: each tensor is re-written once and its
       previous copy freed at once, so the peak exceeds the final size by at most one tensor
       (the largest: W1/W3/W2 of one expert, 2560 x 128 FP4 bytes + scales) */
    const size_t before = mem.owned_bytes;
    ck_assert_int_eq(mmoe_moe_layer_pad(f.layer, 1024, &err), MMOE_OK);
    mmoe_moe_layer_memory(f.layer, &mem);
    ck_assert_uint_gt(mem.owned_bytes, before);
    const size_t one_tensor = 3072 * 128; /* FP8 shared W1 at the final width, the largest */
    ck_assert_uint_le(mem.owned_peak_bytes, mem.owned_bytes + one_tensor);
    ck_assert_int_eq(run_layer(f.layer, 3, x, NULL, NULL, NULL, y1, NULL, NULL, NULL, &err), MMOE_OK);
    ck_assert(memcmp(y0, y1, sizeof y0) == 0);
    free(x);
    fixture_free(&f);
}
END_TEST

/* ------------------------------------------------------------------ shared expert */

START_TEST(fused_vs_serial)
{
    const int64_t t = 6, D = 128;
    for (int r = 0; r < MMOE_RECIPE_COUNT; r++) {
        mmoe_moe_desc d = small_desc(D, 256, 4, 2, 1);
        d.recipe = (mmoe_moe_recipe)r;
        fixture f;
        fixture_make(&f, &d, g_seed, MMOE_SYNTH_NORMAL);
        mmoe_moe_desc ds = d;
        ds.shared_mode = MMOE_SHARED_SERIAL;
        mmoe_moe_layer *ls;
        mmoe_error err;
        ck_assert_int_eq(mmoe_moe_layer_create(&ds, &ls, &err), MMOE_OK);
        ck_assert_int_eq(mmoe_moe_layer_set_weights(ls, mmoe_moe_synth_weights(f.synth), &err), MMOE_OK);
        mmoe_moe_desc dn = d; /* no shared expert: isolates the shared contribution */
        dn.n_shared = 0;
        mmoe_moe_layer *ln;
        ck_assert_int_eq(mmoe_moe_layer_create(&dn, &ln, &err), MMOE_OK);
        ck_assert_int_eq(mmoe_moe_layer_set_weights(ln, mmoe_moe_synth_weights(f.synth), &err), MMOE_OK);
        uint16_t *x = make_x(&d, t, g_seed, MMOE_SYNTH_NORMAL);
        uint16_t yf[6 * 128], ys[6 * 128], yn[6 * 128];
        mmoe_moe_result rf, rs;
        mmoe_moe_result_init(&rf);
        mmoe_moe_result_init(&rs);
        ck_assert_int_eq(run_layer(f.layer, t, x, NULL, NULL, NULL, yf, NULL, NULL, &rf, &err), MMOE_OK);
        ck_assert_int_eq(run_layer(ls, t, x, NULL, NULL, NULL, ys, NULL, NULL, &rs, &err), MMOE_OK);
        ck_assert_int_eq(run_layer(ln, t, x, NULL, NULL, NULL, yn, NULL, NULL, NULL, &err), MMOE_OK);
        ck_assert_int_eq(rf.shared_path, MMOE_PATH_FUSED);
        ck_assert_int_eq(rs.shared_path, MMOE_PATH_SERIAL);
        ck_assert_int_eq(rs.fallback, MMOE_FALLBACK_REQUESTED);
        double diff = 0, shared = 0;
        for (int64_t i = 0; i < t * D; i++) {
            double a = mmoe_bf16_to_f32(yf[i]), b = mmoe_bf16_to_f32(ys[i]), n = mmoe_bf16_to_f32(yn[i]);
            diff += (a - b) * (a - b);
            shared += (b - n) * (b - n);
        }
        if (d.recipe == MMOE_RECIPE_DSV4_REF) {
            /* the reference's own format is the serial format: identical */
            ck_assert(memcmp(yf, ys, sizeof yf) == 0);
        } else {
            /* Bound: the two shared outputs quantize x (and the intermediate) with different scale
               groups; each E4M3 rounding is within 2^-4 relative, so each path is within about
               3 * 2^-4 of the unquantized shared expert and they differ by at most 0.375 of the
               shared contribution's norm (plus the BF16 roundings of the sum). */
            ck_assert_msg(sqrt(diff) <= 0.375 * sqrt(shared) + 1e-3, "recipe %s: |fused - serial| %g vs shared %g",
                          mmoe_moe_recipe_name(d.recipe), sqrt(diff), sqrt(shared));
            ck_assert(diff > 0); /* they are different computations */
        }
        free(x);
        mmoe_moe_layer_destroy(ls);
        mmoe_moe_layer_destroy(ln);
        fixture_free(&f);
    }
}
END_TEST

START_TEST(fast_math_close_to_precise)
{
    /* Fast math perturbs sig by about |g| FP32 ulp (epilogue_bit_exact_per_recipe); that moves
       an E4M3/BF16 rounding of the intermediate only when a value sits next to a rounding
       boundary, so most outputs keep their bits and the rest differ by a few BF16 ulp. */
    mmoe_moe_desc d = small_desc(128, 256, 4, 2, 1);
    d.recipe = (mmoe_moe_recipe)_i;
    fixture f;
    fixture_make(&f, &d, g_seed, MMOE_SYNTH_NORMAL);
    mmoe_moe_desc df = d;
    df.math = MMOE_MATH_FAST;
    mmoe_moe_layer *lf;
    mmoe_error err;
    ck_assert_int_eq(mmoe_moe_layer_create(&df, &lf, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_moe_layer_set_weights(lf, mmoe_moe_synth_weights(f.synth), &err), MMOE_OK);
    const int64_t t = 8;
    uint16_t *x = make_x(&d, t, g_seed, MMOE_SYNTH_NORMAL);
    uint16_t yp[8 * 128], yf[8 * 128];
    mmoe_moe_result res;
    mmoe_moe_result_init(&res);
    ck_assert_int_eq(run_layer(f.layer, t, x, NULL, NULL, NULL, yp, NULL, NULL, NULL, &err), MMOE_OK);
    ck_assert_int_eq(run_layer(lf, t, x, NULL, NULL, NULL, yf, NULL, NULL, &res, &err), MMOE_OK);
    ck_assert_int_eq(res.math, MMOE_MATH_FAST);
    double diff = 0, norm = 0;
    int same = 0;
    for (int64_t i = 0; i < t * 128; i++) {
        const double a = mmoe_bf16_to_f32(yp[i]), b = mmoe_bf16_to_f32(yf[i]);
        diff += (a - b) * (a - b);
        norm += a * a;
        same += yp[i] == yf[i];
    }
    ck_assert_msg(sqrt(diff) <= 0x1.0p-5 * sqrt(norm), "fast vs precise: rel %g", sqrt(diff / norm));
    ck_assert_int_ge(same, (int)(t * 128 / 2));
    free(x);
    mmoe_moe_layer_destroy(lf);
    fixture_free(&f);
}
END_TEST

/** Buffers a mutate function allocated (freed by check_fallback). */
static void *g_extra[4];
static int g_n_extra;

/** Build a layer whose shared expert cannot be fused; check the reason; run it. */
static void check_fallback(mmoe_moe_desc d, mmoe_moe_fallback want, const char *needle, void (*mutate)(mmoe_moe_synth *))
{
    mmoe_error err;
    mmoe_moe_synth *s;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, g_seed, MMOE_SYNTH_NORMAL, &s, &err), MMOE_OK);
    if (mutate)
        mutate(s);
    mmoe_moe_layer *l;
    ck_assert_int_eq(mmoe_moe_layer_create(&d, &l, &err), MMOE_OK);
    ck_assert_msg(mmoe_moe_layer_set_weights(l, mmoe_moe_synth_weights(s), &err) == MMOE_OK, "%s", err.msg);
    mmoe_moe_fallback fb;
    char reason[MMOE_MOE_REASON_LEN];
    ck_assert_int_eq(mmoe_moe_layer_shared_plan(l, &fb, reason), MMOE_PATH_SERIAL);
    ck_assert_int_eq(fb, want);
    ck_assert_msg(strstr(reason, needle) != NULL, "reason '%s' lacks '%s'", reason, needle);
    const int64_t t = 3;
    uint16_t *x = make_x(&d, t, g_seed, MMOE_SYNTH_NORMAL);
    uint16_t *y = malloc((size_t)(t * d.hidden) * 2);
    mmoe_moe_result res;
    mmoe_moe_result_init(&res);
    ck_assert_int_eq(run_layer(l, t, x, NULL, NULL, NULL, y, NULL, NULL, &res, &err), MMOE_OK);
    ck_assert_int_eq(res.shared_path, MMOE_PATH_SERIAL);
    ck_assert_int_eq(res.fallback, want);
    ck_assert_str_eq(res.fallback_reason, reason);
    for (int64_t i = 0; i < t * d.hidden; i++)
        ck_assert(!isnan(mmoe_bf16_to_f32(y[i])));
    mmoe_moe_layer_destroy(l);
    /* --shared fused refuses, naming the same reason */
    if (want != MMOE_FALLBACK_REQUESTED) {
        d.shared_mode = MMOE_SHARED_FUSED;
        ck_assert_int_eq(mmoe_moe_layer_create(&d, &l, &err), MMOE_OK);
        ck_assert_int_eq(mmoe_moe_layer_set_weights(l, mmoe_moe_synth_weights(s), &err), MMOE_OK);
        ck_assert_int_eq(run_layer(l, t, x, NULL, NULL, NULL, y, NULL, NULL, &res, &err), MMOE_EUNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(err.msg, needle));
        ck_assert_int_eq(res.status, MMOE_EUNSUPPORTED);
        mmoe_moe_layer_destroy(l);
    }
    free(x);
    free(y);
    mmoe_moe_synth_destroy(s);
    while (g_n_extra > 0)
        free(g_extra[--g_n_extra]);
}

static void make_shared_bf16(mmoe_moe_synth *s)
{
    mmoe_moe_weights *w = mmoe_moe_synth_weights_mut(s);
    mmoe_tensor *m[3] = {&w->shared.w1, &w->shared.w3, &w->shared.w2};
    for (int i = 0; i < 3; i++) {
        /* a BF16 copy of the FP8 weights (scaled down) */
        int64_t n = m[i]->shape[0] * m[i]->shape[1];
        uint16_t *b = calloc((size_t)n, 2);
        g_extra[g_n_extra++] = b;
        for (int64_t j = 0; j < n; j++)
            b[j] = mmoe_bf16_from_f32(mmoe_fp8_e4m3_to_f32(((uint8_t *)m[i]->data)[j]) * 0.01f);
        m[i]->dtype = MMOE_DT_BF16;
        m[i]->data = b;
        m[i]->nbytes = (size_t)n * 2;
    }
}

static void make_scales_f32_not_pow2(mmoe_moe_synth *s)
{
    mmoe_moe_weights *w = mmoe_moe_synth_weights_mut(s);
    mmoe_tensor *m = &w->shared.w3_scale;
    int64_t n = mmoe_tensor_numel(m);
    float *f = malloc((size_t)n * 4);
    g_extra[g_n_extra++] = f;
    for (int64_t j = 0; j < n; j++)
        f[j] = mmoe_ue8m0_to_f32(((uint8_t *)m->data)[j]) * (j == 0 ? 1.5f : 1.0f);
    m->dtype = MMOE_DT_F32;
    m->data = f;
    m->nbytes = (size_t)n * 4;
}

START_TEST(fallback_conditions)
{
    mmoe_moe_desc d = small_desc(128, 256, 4, 2, 1);
    d.shared_mode = MMOE_SHARED_SERIAL;
    check_fallback(d, MMOE_FALLBACK_REQUESTED, "requested", NULL);
    d = small_desc(128, 128, 40, 32, 1);
    check_fallback(d, MMOE_FALLBACK_TOPK_LIMIT, "32 combine slots", NULL);
    d = small_desc(128, 256, 4, 2, 1);
    check_fallback(d, MMOE_FALLBACK_SHARED_DTYPE, "BF16", make_shared_bf16);
    d = small_desc(192 * 2, 384, 4, 2, 1);
    d.shared_block = 48;
    check_fallback(d, MMOE_FALLBACK_SCALE_BLOCK, "not a multiple of 32", NULL);
    d = small_desc(128, 256, 4, 2, 1);
    check_fallback(d, MMOE_FALLBACK_SCALE_NOT_POW2, "power of two", make_scales_f32_not_pow2);
    d = small_desc(128, 256, 4, 2, 1);
    d.shared_inter = 384; /* 384 is not a multiple of the routed 256 */
    check_fallback(d, MMOE_FALLBACK_SHARED_WIDTH, "not a multiple of the routed width", NULL);
    /* padding can break fusion too: routed 512 -> 768, shared 128 -> 384 */
    d = small_desc(128, 512, 4, 2, 1);
    d.shared_inter = 128;
    d.pad_to = 384;
    check_fallback(d, MMOE_FALLBACK_SHARED_WIDTH, "routed width 768", NULL);
}
END_TEST

/* ------------------------------------------------------------------ masks, edge sizes, counters */

START_TEST(masked_slots_and_empty_tokens)
{
    mmoe_moe_desc d = small_desc(128, 128, 4, 3, 0);
    fixture f;
    fixture_make(&f, &d, g_seed, MMOE_SYNTH_NORMAL);
    const int64_t t = 3;
    uint16_t *x = make_x(&d, t, g_seed, MMOE_SYNTH_NORMAL);
    int64_t idx[9] = {0, -1, 2, -1, -1, -1, 3, 1, -1};
    float wts[9] = {0.5f, NAN, 0.25f, 1, 2, 3, 0.75f, 0.5f, 123.0f};
    uint16_t y[3 * 128], y2[3 * 128];
    mmoe_error err;
    mmoe_moe_result res;
    mmoe_moe_result_init(&res);
    ck_assert_int_eq(run_layer(f.layer, t, x, NULL, idx, wts, y, NULL, NULL, &res, &err), MMOE_OK);
    ck_assert_int_eq(res.routed_pairs, 4);
    for (int j = 0; j < 128; j++) /* token 1: every slot masked, no shared expert: y = +0 */
        ck_assert_uint_eq(y[128 + j], 0);
    /* the weight of a masked slot is never read: change it and the bits stay */
    wts[1] = -7.0f;
    wts[8] = NAN;
    ck_assert_int_eq(run_layer(f.layer, t, x, NULL, idx, wts, y2, NULL, NULL, NULL, &err), MMOE_OK);
    ck_assert(memcmp(y, y2, sizeof y) == 0);
    /* counters: masked slots are not received */
    const int64_t *c = mmoe_moe_layer_counters(f.layer);
    ck_assert_int_eq(c[0], 2);
    ck_assert_int_eq(c[1], 2);
    ck_assert_int_eq(c[2], 2);
    ck_assert_int_eq(c[3], 2);
    free(x);
    fixture_free(&f);
}
END_TEST

START_TEST(zero_and_one_token)
{
    mmoe_moe_desc d = small_desc(128, 128, 4, 2, 1);
    fixture f;
    fixture_make(&f, &d, g_seed, MMOE_SYNTH_NORMAL);
    mmoe_error err;
    mmoe_moe_result res;
    mmoe_moe_result_init(&res);
    uint16_t y[128];
    mmoe_moe_input in0 = {0, NULL, NULL, NULL, NULL};
    mmoe_moe_output out0 = {NULL, NULL, NULL};
    ck_assert_int_eq(mmoe_moe_layer_run(f.layer, &in0, &out0, &res, &err), MMOE_OK);
    ck_assert_int_eq(res.routed_pairs, 0);
    ck_assert_int_eq(res.active_experts, 0);
    uint16_t *x = make_x(&d, 1, g_seed, MMOE_SYNTH_NORMAL);
    ck_assert_int_eq(run_layer(f.layer, 1, x, NULL, NULL, NULL, y, NULL, NULL, &res, &err), MMOE_OK);
    ck_assert_int_eq(res.routed_pairs, 2);
    for (int j = 0; j < 128; j++)
        ck_assert(!isnan(mmoe_bf16_to_f32(y[j])));
    free(x);
    fixture_free(&f);
}
END_TEST

START_TEST(one_expert_gets_all_and_idle_experts_are_not_read)
{
    mmoe_moe_desc d = small_desc(128, 256, 5, 1, 0);
    d.recipe = (mmoe_moe_recipe)(_i % MMOE_RECIPE_COUNT);
    fixture f;
    fixture_make(&f, &d, g_seed, MMOE_SYNTH_DYADIC);
    const int64_t t = 9;
    uint16_t *x = make_x(&d, t, g_seed, MMOE_SYNTH_DYADIC);
    int64_t idx[9];
    float wts[9];
    for (int i = 0; i < 9; i++) {
        idx[i] = 2;
        wts[i] = 0.25f * (float)(i + 1);
    }
    uint16_t y[9 * 128], y2[9 * 128];
    double bound[9 * 128];
    mmoe_error err;
    int64_t stats[5] = {7, 0, 0, 0, 0};
    mmoe_moe_result res;
    mmoe_moe_result_init(&res);
    res.expert_recv_stats = stats;
    ck_assert_int_eq(run_layer(f.layer, t, x, NULL, idx, wts, y, NULL, NULL, &res, &err), MMOE_OK);
    ck_assert_int_eq(res.active_experts, 1);
    ck_assert_int_eq(stats[2], 9);
    ck_assert_int_eq(stats[0], 7); /* added into, not overwritten */
    ck_assert_int_eq(ref64_layer(&d, mmoe_moe_synth_weights(f.synth), t, x, idx, wts, MMOE_PATH_NONE, y2, bound), 0);
    for (int64_t i = 0; i < t * 128; i++)
        ck_assert_msg(fabs(mmoe_bf16_to_f32(y[i]) - mmoe_bf16_to_f32(y2[i])) <= bound[i], "element %lld", (long long)i);
    /* experts without tokens are never read: poison their scales and weights */
    mmoe_moe_weights *w = mmoe_moe_synth_weights_mut(f.synth);
    for (int e = 0; e < 5; e++)
        if (e != 2)
            memset(w->experts[e].w2.data, 0x77, w->experts[e].w2.nbytes);
    ck_assert_int_eq(run_layer(f.layer, t, x, NULL, idx, wts, y2, NULL, NULL, NULL, &err), MMOE_OK);
    ck_assert(memcmp(y, y2, sizeof y) == 0);
    ck_assert_int_eq(mmoe_moe_layer_counters(f.layer)[2], 18); /* accumulated over both calls */
    free(x);
    fixture_free(&f);
}
END_TEST

/* ------------------------------------------------------------------ against the float64 reference */

START_TEST(recipes_vs_float64_reference)
{
    const mmoe_moe_recipe recipe = (mmoe_moe_recipe)(_i / 3);
    const int path_kind = _i % 3; /* 0: fused, 1: serial, 2: no shared expert */
    mmoe_moe_desc d = small_desc(256, 256, 6, 3, path_kind == 2 ? 0 : 1);
    d.recipe = recipe;
    d.shared_mode = path_kind == 1 ? MMOE_SHARED_SERIAL : MMOE_SHARED_AUTO;
    d.swiglu_limit = 10.0f;
    fixture f;
    fixture_make(&f, &d, g_seed + (uint64_t)_i, MMOE_SYNTH_DYADIC);
    const int64_t t = 7;
    uint16_t *x = make_x(&d, t, g_seed + 11, MMOE_SYNTH_DYADIC);
    uint16_t y[7 * 256], yr[7 * 256];
    double bound[7 * 256];
    int64_t idx[21];
    float wts[21];
    mmoe_error err;
    mmoe_moe_result res;
    mmoe_moe_result_init(&res);
    ck_assert_int_eq(run_layer(f.layer, t, x, NULL, NULL, NULL, y, idx, wts, &res, &err), MMOE_OK);
    idx[4] = -1; /* and once more with a masked slot */
    ck_assert_int_eq(run_layer(f.layer, t, x, NULL, idx, wts, y, NULL, NULL, &res, &err), MMOE_OK);
    ck_assert_int_eq(ref64_layer(&d, mmoe_moe_synth_weights(f.synth), t, x, idx, wts, res.shared_path, yr, bound), 0);
    int exact = 0;
    for (int64_t i = 0; i < t * 256; i++) {
        const double a = mmoe_bf16_to_f32(y[i]), b = mmoe_bf16_to_f32(yr[i]);
        ck_assert_msg(fabs(a - b) <= bound[i], "recipe %s path %s element %lld: %.9g vs ref %.9g (bound %.3g)",
                      mmoe_moe_recipe_name(recipe), mmoe_moe_path_name(res.shared_path), (long long)i, a, b, bound[i]);
        exact += y[i] == yr[i];
    }
    ck_assert_int_ge(exact, (int)(t * 256 * 3 / 4)); /* most elements agree to the bit */
    free(x);
    fixture_free(&f);
}
END_TEST

/* ------------------------------------------------------------------ bad inputs and loading */

START_TEST(bad_weights_give_clear_errors)
{
    mmoe_moe_desc d = small_desc(128, 128, 3, 2, 1);
    mmoe_moe_synth *s;
    mmoe_error err;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, g_seed, MMOE_SYNTH_NORMAL, &s, &err), MMOE_OK);
    mmoe_moe_weights *w = mmoe_moe_synth_weights_mut(s);
    mmoe_moe_layer *l;
    ck_assert_int_eq(mmoe_moe_layer_create(&d, &l, &err), MMOE_OK);
    /* shape */
    mmoe_moe_expert_weights *e1 = (mmoe_moe_expert_weights *)&w->experts[1];
    e1->w3.shape[0] = 64;
    ck_assert_int_eq(mmoe_moe_layer_set_weights(l, w, &err), MMOE_ESHAPE);
    ck_assert_ptr_nonnull(strstr(err.msg, "ffn.experts.1.w3.weight"));
    ck_assert_ptr_nonnull(strstr(err.msg, "[128, 64]"));
    e1->w3.shape[0] = 128;
    /* dtype */
    e1->w2_scale.dtype = MMOE_DT_F32;
    ck_assert_int_eq(mmoe_moe_layer_set_weights(l, w, &err), MMOE_EDTYPE);
    ck_assert_ptr_nonnull(strstr(err.msg, "ffn.experts.1.w2.scale"));
    e1->w2_scale.dtype = MMOE_DT_F8_E8M0;
    /* scale byte 255 */
    ((uint8_t *)e1->w1_scale.data)[5] = 255;
    ck_assert_int_eq(mmoe_moe_layer_set_weights(l, w, &err), MMOE_ERANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "255"));
    ck_assert_ptr_nonnull(strstr(err.msg, "ffn.experts.1.w1.scale"));
    ((uint8_t *)e1->w1_scale.data)[5] = 127;
    /* gate dtype */
    w->gate.dtype = MMOE_DT_F32;
    ck_assert_int_eq(mmoe_moe_layer_set_weights(l, w, &err), MMOE_EDTYPE);
    ck_assert_ptr_nonnull(strstr(err.msg, "ffn.gate.weight"));
    w->gate.dtype = MMOE_DT_BF16;
    /* missing shared tensor */
    void *keep = w->shared.w2.data;
    w->shared.w2.data = NULL;
    ck_assert_int_eq(mmoe_moe_layer_set_weights(l, w, &err), MMOE_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "ffn.shared_experts.w2.weight"));
    w->shared.w2.data = keep;
    ck_assert_int_eq(mmoe_moe_layer_set_weights(l, w, &err), MMOE_OK);
    /* bad routing inputs */
    uint16_t *x = make_x(&d, 2, g_seed, MMOE_SYNTH_NORMAL);
    uint16_t y[256];
    int64_t idx[4] = {0, 3, 1, 2};
    float wts[4] = {1, 1, 1, 1};
    ck_assert_int_eq(run_layer(l, 2, x, NULL, idx, wts, y, NULL, NULL, NULL, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "topk_idx[0][1] = 3"));
    idx[1] = 1;
    wts[2] = INFINITY;
    ck_assert_int_eq(run_layer(l, 2, x, NULL, idx, wts, y, NULL, NULL, NULL, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "not finite"));
    /* a bad description */
    mmoe_moe_desc bad = d;
    bad.hidden = 100;
    mmoe_moe_layer *l2;
    ck_assert_int_eq(mmoe_moe_layer_create(&bad, &l2, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "hidden 100"));
    free(x);
    mmoe_moe_layer_destroy(l);
    mmoe_moe_synth_destroy(s);
}
END_TEST

/** A lookup over a synthetic layer, under "layers.3." names, with one name removable. */
typedef struct table_ctx {
    const mmoe_moe_weights *w;
    int64_t n_experts;
    const char *hide;
} table_ctx;

static mmoe_status table_lookup(void *ctx, const char *name, mmoe_tensor *out, mmoe_error *err)
{
    (void)err;
    const table_ctx *tc = ctx;
    if (strncmp(name, "layers.3.", 9) != 0)
        return MMOE_ENOTFOUND;
    name += 9;
    if (tc->hide != NULL && strcmp(name, tc->hide) == 0)
        return MMOE_ENOTFOUND;
    if (strcmp(name, "ffn.gate.weight") == 0) {
        *out = tc->w->gate;
        return MMOE_OK;
    }
    if (strcmp(name, "ffn.gate.bias") == 0) {
        *out = tc->w->gate_bias;
        return MMOE_OK;
    }
    const mmoe_moe_expert_weights *x = NULL;
    char rest[64];
    long long e;
    if (sscanf(name, "ffn.experts.%lld.%63s", &e, rest) == 2 && e >= 0 && e < tc->n_experts)
        x = &tc->w->experts[e];
    else if (sscanf(name, "ffn.shared_experts.%63s", rest) == 1)
        x = &tc->w->shared;
    if (x == NULL)
        return MMOE_ENOTFOUND;
    const struct { const char *n; const mmoe_tensor *t; } m[6] = {
        {"w1.weight", &x->w1}, {"w1.scale", &x->w1_scale}, {"w3.weight", &x->w3},
        {"w3.scale", &x->w3_scale}, {"w2.weight", &x->w2}, {"w2.scale", &x->w2_scale}};
    for (int i = 0; i < 6; i++)
        if (strcmp(rest, m[i].n) == 0) {
            *out = *m[i].t;
            return MMOE_OK;
        }
    return MMOE_ENOTFOUND;
}

START_TEST(load_by_checkpoint_names)
{
    mmoe_moe_desc d = small_desc(128, 128, 3, 2, 1);
    fixture f;
    fixture_make(&f, &d, g_seed, MMOE_SYNTH_NORMAL);
    table_ctx tc = {mmoe_moe_synth_weights(f.synth), 3, NULL};
    mmoe_moe_layer *l;
    mmoe_error err;
    ck_assert_int_eq(mmoe_moe_layer_create(&d, &l, &err), MMOE_OK);
    ck_assert_msg(mmoe_moe_layer_load(l, table_lookup, &tc, 3, &err) == MMOE_OK, "%s", err.msg);
    uint16_t *x = make_x(&d, 2, g_seed, MMOE_SYNTH_NORMAL);
    uint16_t y[256], y2[256];
    ck_assert_int_eq(run_layer(f.layer, 2, x, NULL, NULL, NULL, y, NULL, NULL, NULL, &err), MMOE_OK);
    ck_assert_int_eq(run_layer(l, 2, x, NULL, NULL, NULL, y2, NULL, NULL, NULL, &err), MMOE_OK);
    ck_assert(memcmp(y, y2, sizeof y) == 0);
    /* without the prefix nothing is found; a missing tensor is named */
    ck_assert_int_eq(mmoe_moe_layer_load(l, table_lookup, &tc, -1, &err), MMOE_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "ffn.gate.weight"));
    tc.hide = "ffn.experts.2.w3.scale";
    ck_assert_int_eq(mmoe_moe_layer_load(l, table_lookup, &tc, 3, &err), MMOE_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "ffn.experts.2.w3.scale"));
    free(x);
    mmoe_moe_layer_destroy(l);
    fixture_free(&f);
}
END_TEST

START_TEST(desc_shapes_and_names)
{
    mmoe_moe_desc d;
    mmoe_error err;
    ck_assert_int_eq(mmoe_moe_desc_from_shape("v4.1-flash", 8, &d, &err), MMOE_OK);
    ck_assert_int_eq(d.inter, 2304);
    ck_assert_int_eq(d.shared_block, 32);
    ck_assert_int_eq(d.n_experts, 8);
    ck_assert_int_eq(mmoe_moe_desc_from_shape("v4-pro", 0, &d, &err), MMOE_OK);
    ck_assert_int_eq(d.hidden, 7168);
    ck_assert(d.routed_scaling_factor == 2.5f);
    ck_assert_int_eq(mmoe_moe_desc_from_shape("v5", 0, &d, &err), MMOE_EINVAL);
    mmoe_moe_recipe r;
    ck_assert_int_eq(mmoe_moe_recipe_from_name("dsv4-ref", &r, &err), MMOE_OK);
    ck_assert_int_eq(r, MMOE_RECIPE_DSV4_REF);
    ck_assert_int_eq(mmoe_moe_recipe_from_name("sm80", &r, &err), MMOE_EINVAL);
    ck_assert_str_eq(mmoe_moe_path_name(MMOE_PATH_SERIAL), "serial");
}
END_TEST

static Suite *moe_suite(void)
{
    Suite *s = suite_create("moe");
    TCase *tc = tcase_create("units");
    tcase_add_test(tc, router_ties_bias_renorm_scaling);
    tcase_add_test(tc, log1pf_fixed_evaluation);
    tcase_add_test(tc, topk_select_nan_and_ties);
    tcase_add_test(tc, hash_routing);
    tcase_add_test(tc, epilogue_bit_exact_per_recipe);
    tcase_add_test(tc, requant_rules);
    tcase_add_test(tc, combine_order);
    tcase_add_test(tc, weight_tiles_match_format_dequantizer);
    tcase_add_test(tc, desc_shapes_and_names);
    suite_add_tcase(s, tc);
    tc = tcase_create("layer");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, padding_is_bit_identical, 0, 6);
    tcase_add_test(tc, padding_serial_path);
    tcase_add_test(tc, fused_vs_serial);
    tcase_add_loop_test(tc, fast_math_close_to_precise, 0, MMOE_RECIPE_COUNT);
    tcase_add_test(tc, fallback_conditions);
    tcase_add_test(tc, masked_slots_and_empty_tokens);
    tcase_add_test(tc, zero_and_one_token);
    tcase_add_loop_test(tc, one_expert_gets_all_and_idle_experts_are_not_read, 0, 3);
    tcase_add_loop_test(tc, recipes_vs_float64_reference, 0, 3 * MMOE_RECIPE_COUNT);
    tcase_add_test(tc, bad_weights_give_clear_errors);
    tcase_add_test(tc, load_by_checkpoint_names);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("moe");
    return mmoe_test_run(moe_suite());
}
