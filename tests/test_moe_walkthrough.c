/**
 * @file test_moe_walkthrough.c
 * @brief The worked example of the manual: one token through MoE layer 2 of the embedded tiny
 *        model (fixtures/tiny-dsv4), every intermediate value printed.
 *
 * Usage: `tests/test_moe_walkthrough [MODEL_DIR]` (default `$MMOE_SRCDIR/fixtures/tiny-dsv4`).
 * The input row is token 42's embedding passed through layer 2's `ffn_norm`, as the MoE of a
 * block sees a normalized row; the layer runs the model's recipe (dsv4-ref).  The numbers come
 * from the naive reference (moe_naive.c), stage by stage; at the end the fast oracle runs the
 * same token, and the program fails unless the two agree bit for bit (experts, weights and
 * all D outputs).  The manual's walkthrough (@ref walkthrough_moe) shows this program's
 * output; `make check` runs it, so it keeps working.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"
#include "mmoe_linear.h"
#include "mmoe_moe.h"
#include "mmoe_safetensors.h"
#include "moe_naive.h"

enum { LAYER = 2, TOKEN = 42, D = 128, SHOW = 4 };

static mmoe_status lookup(void *ctx, const char *name, mmoe_tensor *out, mmoe_error *err)
{
    (void)err;
    const mmoe_tensor *t = mmoe_ckpt_find(ctx, name);
    if (t == NULL)
        return MMOE_ENOTFOUND;
    *out = *t;
    return MMOE_OK;
}

static void show(const char *what, const float *v)
{
    printf("  %-34s", what);
    for (int i = 0; i < SHOW; i++)
        printf(" %+.8g", v[i]);
    printf(" ...\n");
}

static void show_bf16(const char *what, const uint16_t *v)
{
    float f[SHOW];
    for (int i = 0; i < SHOW; i++)
        f[i] = mmoe_bf16_to_f32(v[i]);
    show(what, f);
}

/** The amax of the first 128-group of @p v and its UE8M0 scale by the V4 rule. */
static void show_scale(const char *name, const float *v)
{
    float amax = 0.0f;
    for (int i = 0; i < 128; i++)
        amax = fmaxf(amax, fabsf(v[i]));
    const uint8_t b = mmoe_sf_ue8m0_v4(amax, 448.0f);
    printf("      amax(%s) = %.9g, amax * fl(1/448) = %.9g -> scale byte %u = 2^%d\n", name, amax,
           amax * (1.0f / 448.0f), b, b - 127);
}

int main(int argc, char **argv)
{
    char dir[1024];
    const char *src = getenv("MMOE_SRCDIR");
    snprintf(dir, sizeof dir, "%s", argc > 1 ? argv[1] : "");
    if (argc <= 1)
        snprintf(dir, sizeof dir, "%s/fixtures/tiny-dsv4", src != NULL ? src : ".");
    mmoe_error err;
    mmoe_ckpt *ck;
    if (mmoe_ckpt_open(dir, &ck, &err) != MMOE_OK) {
        fprintf(stderr, "test_moe_walkthrough: %s\n", err.msg);
        return 1;
    }
    /* the layer as config.json describes it: D 128, I 128, 8 experts, top-2, one shared expert */
    mmoe_moe_desc d;
    mmoe_moe_desc_init(&d);
    d.hidden = D;
    d.inter = 128;
    d.n_experts = 8;
    d.topk = 2;
    d.n_shared = 1;
    d.shared_inter = 128;
    d.routed_scaling_factor = 1.5f;
    d.swiglu_limit = 10.0f;
    d.recipe = MMOE_RECIPE_DSV4_REF;
    d.shared_mode = MMOE_SHARED_SERIAL;
    mmoe_moe_weights w;
    if (mmoe_moe_weights_lookup(&d, lookup, ck, LAYER, &w, &err) != MMOE_OK) {
        fprintf(stderr, "test_moe_walkthrough: %s\n", err.msg);
        mmoe_ckpt_close(ck);
        return 1;
    }
    const mmoe_tensor *embed = mmoe_ckpt_find(ck, "embed.weight");
    const mmoe_tensor *norm = mmoe_ckpt_find(ck, "layers.2.ffn_norm.weight");
    if (embed == NULL || norm == NULL) {
        fprintf(stderr, "test_moe_walkthrough: %s: embed.weight or layers.2.ffn_norm.weight missing\n", dir);
        mmoe_moe_weights_release(&w);
        mmoe_ckpt_close(ck);
        return 1;
    }
    uint16_t x[D], y_fast[D], y_naive[D];
    mmoe_rmsnorm_bf16((const uint16_t *)embed->data + (size_t)TOKEN * D, 1, D, norm, 1e-6f, x);

    moe_naive_scratch s = {0};
    float buf[9][D];
    s.x = buf[0];
    s.xq = buf[1];
    s.xs = buf[2];
    s.scores = buf[3];
    s.g = buf[4];
    s.u = buf[5];
    s.a = buf[6];
    s.aq = buf[7];
    uint16_t slot_y[2 * D], shared_y[D];
    int64_t idx[2];
    float wts[2];

    printf("MoE layer %d of %s, token %d, recipe %s\n", LAYER, dir, TOKEN, mmoe_moe_recipe_name(d.recipe));
    for (int k = 0; k < D; k++)
        s.x[k] = mmoe_bf16_to_f32(x[k]);
    show("x = ffn_norm(embed[42])", s.x);
    moe_naive_route(&d, &w, s.x, TOKEN, s.scores, idx, wts);
    printf("  router scores s_e = sqrt(softplus(z_e)):\n   ");
    for (int e = 0; e < d.n_experts; e++)
        printf(" %d:%.6g", e, s.scores[e]);
    printf("\n  bias b_e:\n   ");
    for (int e = 0; e < d.n_experts; e++)
        printf(" %d:%+.6g", e, ((const float *)w.gate_bias.data)[e]);
    printf("\n  top-2 of s + b: experts %lld, %lld; weights w = 1.5 s / (s_%lld + s_%lld): %.9g, %.9g\n",
           (long long)idx[0], (long long)idx[1], (long long)idx[0], (long long)idx[1], wts[0], wts[1]);
    moe_naive_quantize(MOE_NAIVE_Q_V4, s.x, D, s.xq);
    show("R1  x^ (E4M3 x UE8M0 per 128)", s.xq);
    show_scale("x", s.x);
    for (int j = 0; j < 2; j++) {
        printf(" slot %d: expert %lld, weight %.9g\n", j, (long long)idx[j], wts[j]);
        moe_naive_expert(&w.experts[idx[j]], d.inter, 32, D, d.recipe, d.math, d.swiglu_limit, s.xq, wts[j], &s,
                         slot_y + j * D);
        show("R2  g = x^ . W1 (FP32)", s.g);
        show("R2  u = x^ . W3 (FP32)", s.u);
        show("R3-R6 a = bf(silu(bf g) bf u w)", s.a);
        show("R7  a^ (E4M3 x UE8M0 per 128)", s.aq);
        show_scale("a", s.a);
        show_bf16("R8  y_e = bf(a^ . W2)", slot_y + j * D);
    }
    moe_naive_quantize(MOE_NAIVE_Q_V4, s.x, D, s.xs);
    moe_naive_expert(&w.shared, d.shared_inter, d.shared_block, D, MMOE_RECIPE_DSV4_REF, d.math, d.swiglu_limit, s.xs,
                     1.0f, &s, shared_y);
    printf(" shared expert (FP8 weights, 128 x 128 block scales, weight 1):\n");
    show_bf16("R8  y_sh", shared_y);
    moe_naive_combine(d.recipe, 2, idx, slot_y, shared_y, D, y_naive);
    printf(" R9 combine in ascending expert id (%lld, %lld), shared last:\n",
           (long long)(idx[0] < idx[1] ? idx[0] : idx[1]), (long long)(idx[0] < idx[1] ? idx[1] : idx[0]));
    show_bf16("y (naive reference)", y_naive);

    mmoe_moe_layer *layer;
    mmoe_status st = mmoe_moe_layer_create(&d, &layer, &err);
    if (st == MMOE_OK)
        st = mmoe_moe_layer_set_weights(layer, &w, &err);
    const mmoe_moe_input in = {1, x, NULL, NULL, NULL};
    int64_t idx_fast[2];
    float w_fast[2];
    const mmoe_moe_output out = {y_fast, idx_fast, w_fast};
    if (st == MMOE_OK)
        st = mmoe_moe_layer_run(layer, &in, &out, NULL, &err);
    mmoe_moe_layer_destroy(layer);
    mmoe_moe_weights_release(&w);
    mmoe_ckpt_close(ck);
    if (st != MMOE_OK) {
        fprintf(stderr, "test_moe_walkthrough: %s\n", err.msg);
        return 1;
    }
    show_bf16("y (fast oracle)", y_fast);
    int same = 0;
    double maxdiff = 0.0;
    for (int k = 0; k < D; k++) {
        same += y_fast[k] == y_naive[k];
        maxdiff = fmax(maxdiff, fabs((double)mmoe_bf16_to_f32(y_fast[k]) - mmoe_bf16_to_f32(y_naive[k])));
    }
    printf(" oracle experts %lld, %lld, weights %.9g, %.9g; %d of %d outputs bit-identical, largest difference %g\n",
           (long long)idx_fast[0], (long long)idx_fast[1], w_fast[0], w_fast[1], same, D, maxdiff);
    const int same_routing = idx_fast[0] == idx[0] && idx_fast[1] == idx[1] && memcmp(w_fast, wts, sizeof wts) == 0;
    return same_routing && same == D ? 0 : 1;
}
