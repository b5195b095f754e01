/**
 * @file test_gpu_forward.c
 * @brief Suite "gpu_forward": the whole DeepSeek-V4 forward on the GPU against the CPU oracle
 *        (skipped, exit 77, without CUDA or a device).
 *
 * Models: the embedded tiny model (fixtures/tiny-dsv4: hash layers, window-only, ratio 4 with
 * the indexer, ratio 128, MTP) and a fresh synth-model checkpoint of the "tiny" preset (seed
 * printed) run for 140 tokens: past the 16-token window, 35 ratio-4 blocks for index_topk 4
 * (more blocks than the indexer keeps), one complete ratio-128 block; the prefill goes in
 * chunks of 64 (the GPU model's max_tokens), so chunked prefill is exercised as well.
 *
 * **The bound.**  The GPU runs the oracle's recipe with the same rounding points; it differs
 * in (a) exp and log1p, computed in double and rounded once (the C library's fp32 expf is
 * within 0.502 ulp, not correctly rounded), i.e. at most one fp32 ulp per call, and (b) the
 * order of the MoE's fp32 GEMM sums and router logits (the oracle's BLAS), at most about
 * K * 2^-24 relative.  Either moves a later bf16 rounding only when a value sits that close
 * to a rounding boundary; one moved rounding is one bf16 ulp (2^-8 relative) of one element,
 * which the following layers spread but do not amplify by more than the model's Lipschitz
 * factor (a few units for these random models).  So per token:
 *   - FWD_REL_TOL: ||logits_gpu - logits_cpu||_2 <= 2^-4 * ||logits_cpu||_2;
 *   - no NaN; and the argmax agrees wherever the oracle's top-2 margin exceeds
 *     FWD_MARGIN_TOL * (max|logit| + 1) (a margin smaller than the bound cannot decide);
 *   - greedy generation: 12 tokens decoded one at a time on both backends, teacher-forced
 *     with the oracle's choice, the GPU picks the same token under the same margin rule.
 * Exactly equal logits are counted and printed (most tokens of most models are bit-exact).
 * Decode on the GPU (one token per call) is compared with the GPU prefill under the same
 * bound (the fixed-order kernels make them equal except through the MoE's GEMM order,
 * which here is fixed too: in practice bit-exact).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_config.h"
#include "mmoe_gpu_forward.h"
#include "mmoe_gpu_moe.h"
#include "mmoe_model.h"
#include "mmoe_rng.h"
#include "mmoe_synth_model.h"
#include "mmoe_test.h"

#define FWD_REL_TOL 0x1.0p-4
#define FWD_MARGIN_TOL 0x1.0p-4

static uint64_t g_seed;

/** Open a model directory (CPU) or fail the test. */
static mmoe_model *open_model(const char *dir)
{
    mmoe_model *m = NULL;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_msg(mmoe_model_open(dir, NULL, NULL, &m, &err) == MMOE_OK, "%s", err.msg);
    return m;
}

/** The embedded tiny model's directory. */
static void tiny_dir(char *buf, size_t n)
{
    const char *src = getenv("MMOE_SRCDIR");
    snprintf(buf, n, "%s/fixtures/tiny-dsv4", src ? src : ".");
}

/** Index of the largest logit and the margin to the second. */
static int64_t argmax_margin(const float *l, int64_t V, float *margin, float *amax)
{
    int64_t b = 0, s = -1;
    float mx = 0.0f;
    for (int64_t v = 0; v < V; v++) {
        if (fabsf(l[v]) > mx)
            mx = fabsf(l[v]);
        if (l[v] > l[b])
            b = v;
    }
    for (int64_t v = 0; v < V; v++)
        if (v != b && (s < 0 || l[v] > l[s]))
            s = v;
    *margin = s < 0 ? INFINITY : l[b] - l[s];
    *amax = mx;
    return b;
}

/** Compare [T, V] logits row by row; returns the number of bit-identical rows. */
static int64_t compare_logits(const char *what, const float *gpu, const float *cpu, int64_t T, int64_t V)
{
    int64_t exact = 0;
    double worst = 0.0;
    for (int64_t t = 0; t < T; t++) {
        const float *g = gpu + t * V, *c = cpu + t * V;
        double num = 0.0, den = 0.0;
        for (int64_t v = 0; v < V; v++) {
            ck_assert_msg(!isnan(g[v]), "%s: token %lld: NaN logit at %lld (seed %llu)", what, (long long)t,
                          (long long)v, (unsigned long long)g_seed);
            num += ((double)g[v] - c[v]) * ((double)g[v] - c[v]);
            den += (double)c[v] * c[v];
        }
        const double rel = sqrt(num) / (sqrt(den) > 1e-30 ? sqrt(den) : 1e-30);
        worst = rel > worst ? rel : worst;
        ck_assert_msg(rel <= FWD_REL_TOL, "%s: token %lld: relative logit error %.3g > %.3g (seed %llu)", what,
                      (long long)t, rel, FWD_REL_TOL, (unsigned long long)g_seed);
        float margin, amax;
        const int64_t bc = argmax_margin(c, V, &margin, &amax);
        float mg, ag;
        const int64_t bg = argmax_margin(g, V, &mg, &ag);
        if (margin > FWD_MARGIN_TOL * (amax + 1.0f))
            ck_assert_msg(bc == bg, "%s: token %lld: argmax %lld (gpu) vs %lld (cpu), margin %g (seed %llu)", what,
                          (long long)t, (long long)bg, (long long)bc, margin, (unsigned long long)g_seed);
        exact += memcmp(g, c, sizeof(float) * (size_t)V) == 0;
    }
    fprintf(stderr, "gpu_forward: %s: %lld of %lld tokens bit-exact, worst relative error %.3g\n", what,
            (long long)exact, (long long)T, worst);
    return exact;
}

/** Skip the whole program without a device (checked once in main). */
static int have_gpu(void)
{
    mmoe_error err;
    int cc = 0;
    return mmoe_gpu_available(&cc, &err) == MMOE_OK;
}

/**
 * Prefill @p T random tokens on both backends (GPU in chunks of @p chunk), compare all logits;
 * then the MTP logits; then greedy decode of @p n_gen tokens.
 */
static void run_model(const char *what, const char *dir, int64_t T, int64_t chunk, int n_gen)
{
    mmoe_model *m = open_model(dir);
    const mmoe_config *c = mmoe_model_config(m);
    const int64_t V = c->vocab_size, row = c->hc_mult * c->dim, total = T + n_gen + 1;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_model_state *s = NULL;
    ck_assert_msg(mmoe_model_state_create(m, total, &s, &err) == MMOE_OK, "%s", err.msg);
    mmoe_gpu_model *g = NULL;
    ck_assert_msg(mmoe_gpu_model_create(m, total, chunk, &g, &err) == MMOE_OK, "%s", err.msg);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)total);
    float *lc = malloc(sizeof(float) * (size_t)(T * V)), *lg = malloc(sizeof(float) * (size_t)(T * V));
    uint16_t *sc = malloc(2 * (size_t)(T * row)), *sg = malloc(2 * (size_t)(T * row));
    ck_assert(ids && lc && lg && sc && sg);
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)T);
    for (int64_t i = 0; i < total; i++)
        ids[i] = (int32_t)mmoe_rng_below(&r, (uint64_t)V);

    ck_assert_msg(mmoe_model_forward(m, s, ids, T, lc, 0, sc, &err) == MMOE_OK, "%s", err.msg);
    mmoe_test_poison_f32(lg, (size_t)(T * V));
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        const int64_t n = T - t0 < chunk ? T - t0 : chunk;
        ck_assert_msg(mmoe_gpu_model_forward(g, ids + t0, n, lg + t0 * V, 0, sg + t0 * row, &err) == MMOE_OK, "%s",
                      err.msg);
    }
    char label[128];
    snprintf(label, sizeof label, "%s prefill", what);
    compare_logits(label, lg, lc, T, V);
    float m0, a0;
    int64_t next = argmax_margin(lc + (T - 1) * V, V, &m0, &a0);

    if (c->n_mtp_layers > 0) {
        /* the MTP block on the oracle's streams, so that only the block itself is compared */
        const int64_t n = T - 1 < chunk ? T - 1 : chunk;
        ck_assert_msg(mmoe_model_mtp_forward(m, s, sc, ids + 1, n, lc, &err) == MMOE_OK, "%s", err.msg);
        mmoe_test_poison_f32(lg, (size_t)(n * V));
        ck_assert_msg(mmoe_gpu_model_mtp_forward(g, sc, ids + 1, n, lg, &err) == MMOE_OK, "%s", err.msg);
        snprintf(label, sizeof label, "%s mtp", what);
        compare_logits(label, lg, lc, n, V);
    }

    /* greedy decode, teacher-forced with the oracle's choice */
    int undecided = 0;
    for (int i = 0; i < n_gen; i++) {
        int32_t id = (int32_t)next;
        ck_assert_msg(mmoe_model_forward(m, s, &id, 1, lc, 1, NULL, &err) == MMOE_OK, "%s", err.msg);
        mmoe_test_poison_f32(lg, (size_t)V);
        ck_assert_msg(mmoe_gpu_model_forward(g, &id, 1, lg, 1, NULL, &err) == MMOE_OK, "%s", err.msg);
        float margin, amax, mg, ag;
        next = argmax_margin(lc, V, &margin, &amax);
        const int64_t ng = argmax_margin(lg, V, &mg, &ag);
        if (margin > FWD_MARGIN_TOL * (amax + 1.0f))
            ck_assert_msg(ng == next, "%s: decode step %d: gpu picks %lld, cpu %lld (margin %g, seed %llu)", what, i,
                          (long long)ng, (long long)next, margin, (unsigned long long)g_seed);
        else
            undecided++;
        snprintf(label, sizeof label, "%s decode %d", what, i);
        if (i == n_gen - 1)
            compare_logits(label, lg, lc, 1, V);
    }
    fprintf(stderr, "gpu_forward: %s: greedy decode of %d tokens agrees (%d steps below the margin bound)\n", what,
            n_gen, undecided);
    ck_assert_int_eq(mmoe_gpu_model_pos(g), T + n_gen);

    /* decode = prefill on the GPU: replay the first 20 tokens one at a time */
    const int64_t n_dec = T < 20 ? T : 20;
    ck_assert_msg(mmoe_gpu_model_reset(g, &err) == MMOE_OK, "%s", err.msg);
    mmoe_model_state_reset(s);
    ck_assert_msg(mmoe_model_forward(m, s, ids, n_dec, lc, 0, NULL, &err) == MMOE_OK, "%s", err.msg);
    for (int64_t t = 0; t < n_dec; t++)
        ck_assert_msg(mmoe_gpu_model_forward(g, ids + t, 1, lg + t * V, 0, NULL, &err) == MMOE_OK, "%s", err.msg);
    snprintf(label, sizeof label, "%s gpu decode vs cpu prefill", what);
    compare_logits(label, lg, lc, n_dec, V);

    free(ids);
    free(lc);
    free(lg);
    free(sc);
    free(sg);
    mmoe_gpu_model_destroy(g);
    mmoe_model_state_destroy(s);
    mmoe_model_close(m);
}

START_TEST(test_tiny_fixture)
{
    char dir[4096];
    tiny_dir(dir, sizeof dir);
    run_model("tiny-dsv4", dir, 40, 64, 12);
}
END_TEST

START_TEST(test_synth_long)
{
    char root[512], dir[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    mmoe_config cfg;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert(mmoe_config_preset("tiny", 3, &cfg, &err) == MMOE_OK);
    ck_assert_msg(mmoe_synth_model_write(&cfg, g_seed, dir, 1 << 20, NULL, NULL, &err) == MMOE_OK, "%s", err.msg);
    run_model("synth tiny x3", dir, 140, 64, 12);
    mmoe_test_rmtree(root);
}
END_TEST

START_TEST(test_refuses)
{
    char dir[4096];
    tiny_dir(dir, sizeof dir);
    mmoe_model *m = open_model(dir);
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_gpu_model *g = NULL;
    /* a state no device holds: refused before any allocation, naming the bytes */
    mmoe_status st = mmoe_gpu_model_create(m, (int64_t)1 << 40, 1, &g, &err);
    ck_assert_int_eq(st, MMOE_ENOMEM);
    ck_assert_ptr_null(g);
    ck_assert_msg(strstr(err.msg, "bytes") != NULL && strstr(err.msg, "available") != NULL, "%s", err.msg);
    /* bad ids and too many tokens */
    ck_assert_msg(mmoe_gpu_model_create(m, 64, 8, &g, &err) == MMOE_OK, "%s", err.msg);
    int32_t ids[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    ck_assert_int_eq(mmoe_gpu_model_forward(g, ids, 9, NULL, 0, NULL, &err), MMOE_EINVAL);
    ids[2] = -1;
    ck_assert_int_eq(mmoe_gpu_model_forward(g, ids, 3, NULL, 0, NULL, &err), MMOE_EINVAL);
    ck_assert_msg(strstr(err.msg, "token 2") != NULL, "%s", err.msg);
    ck_assert_int_eq(mmoe_gpu_model_pos(g), 0);
    mmoe_gpu_model_destroy(g);
    mmoe_model_close(m);
}
END_TEST

static Suite *gpu_forward_suite(void)
{
    Suite *s = suite_create("gpu_forward");
    TCase *tc = tcase_create("forward");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, test_refuses);
    tcase_add_test(tc, test_tiny_fixture);
    tcase_add_test(tc, test_synth_long);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (!have_gpu()) {
        fprintf(stderr, "gpu_forward: no CUDA device (or no CUDA in this build): skipped\n");
        return MMOE_TEST_SKIP;
    }
    g_seed = mmoe_test_seed("gpu_forward");
    return mmoe_test_run(gpu_forward_suite());
}
