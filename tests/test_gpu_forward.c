/**
 * @file test_gpu_forward.c
 * @brief Suite "gpu_forward": the whole DeepSeek-V4 forward on the GPU against the CPU oracle
 *        (skipped, exit 77, without CUDA or a device).
 *
 * Models: the embedded tiny model (fixtures/tiny-dsv4: hash layers, window-only, ratio 4 with
 * the indexer, ratio 128, MTP); fresh synth-model checkpoints (seed printed) of the "tiny"
 * preset with 1, 2 and 3 layers (one layer type more each), the last run for 140 tokens: past
 * the 16-token window, 35 ratio-4 blocks for index_topk 4 (more blocks than the indexer keeps),
 * one complete ratio-128 block; and one at V4-Flash widths (test_synth_flash).  Prefills go
 * in chunks of 64 (the GPU model's max_tokens), so chunked prefill is exercised as well.
 *
 * **Exact, or the bound.**  The GPU runs the oracle's recipe with the same rounding points and
 * the same operations (the router's log1p is mmoe_log1p.h's on both; the GEMM sums of the
 * router and the experts follow the oracle's fixed order, @ref spec_moe_gemm_order).  The one
 * function the two may compute differently is exp, where the host's expf is not glibc's FMA
 * build (one ulp per call); exp_is_exact() checks it on 65536 arguments.  Where it holds, the
 * whole forward is bit-exact: every sub-layer, every routing weight, the final streams and
 * the logits are compared bit for bit.  Else one exp ulp moves a later rounding only when a
 * value sits that close to a rounding boundary; one moved bf16 rounding is one bf16 ulp (2^-8
 * relative) of one element, which the following layers spread but do not amplify by more
 * than the model's Lipschitz factor (a few units for these random models); a moved routing
 * weight can move an expert's FP8 group scale (spec_moe_epilogue), one FP8 step of that
 * expert's share of the token.  So per token:
 *   - FWD_REL_TOL: ||logits_gpu - logits_cpu||_2 <= 2^-4 * ||logits_cpu||_2;
 *   - no NaN; and the argmax agrees wherever the oracle's top-2 margin exceeds
 *     FWD_MARGIN_TOL * (max|logit| + 1) (a margin smaller than the bound cannot decide);
 *   - greedy generation: 12 tokens decoded one at a time on both backends, teacher-forced
 *     with the oracle's choice, the GPU picks the same token under the same margin rule.
 * Sub-layers (test_sublayers, and in the V4-Flash case): every block's attention, with its
 * caches over 140 tokens, and its MoE, each on its own against the CPU sub-layer: bit-exact
 * where the device's expf is the host's, else the attention normwise within 2^-6 and the MoE
 * within 2^-7; then the MoE once more with the oracle's own
 * routing given, bit-exact where expf is, and the router's logits bit-exact against the
 * spec's order written out in the test (check_moe_given()).  The same sub-layers once more on
 * the oracle forward's own activations (check_sublayers_on_forward(): the CPU model's observer
 * keeps every sub-layer's input and output), under the same rules, the worst token printed,
 * with the routing (experts and weights) compared token by token; and the GPU forward's own
 * sub-layer inputs (gfw_test_set_observer()) against the oracle's, token by token.
 *
 * **The recipe it checks.**  The bit-exact requirements are the `exact` recipe's (the default).
 * Run with MMOE_GPU_FP8_LINEARS=tc, the few-token FP8 linears are within 2^-14 A of the oracle's
 * before their BF16 rounding instead (gpu_linear_fp8_tc.cuh; the recipe's own test is
 * test_linear_fp8_tc in the blocks suite), so a BF16 rounding of a decode step may differ from
 * the prefill's and the oracle's: forward_is_exact() is then false and the suite holds the
 * forward to the bounds above (a moved rounding is a BF16 ulp of one element, as a moved exp
 * is), and GPU decode to GPU prefill under the same bound instead of bit for bit.
 *
 * The CLI: `megamoe logits --backend gpu|cpu` (70 tokens: two GPU calls; --mtp) under the same
 * bound, `megamoe generate --backend cpu|gpu|auto` greedy continuations identical.  Without a
 * GPU the program still checks the refusals (`--backend gpu` exits 1 naming the option and
 * writes no file; `auto` runs on the CPU and says so; a bad name exits 2), then exits 77.
 *
 * CUDA graphs (test_cuda_graph): with mmoe_gpu_model_set_cuda_graph() on, a decode step is one
 * replay of a captured graph; its logits and streams must equal the same model's with graphs
 * off bit for bit at every position (the same kernels on the same inputs), on the tiny
 * fixture and on a synth model decoded past the window, over ratio-4 and ratio-128 block
 * boundaries and past index_topk blocks, then again from position 0 after a reset.
 *
 * Exactly equal logits are counted and printed (most tokens of most models are bit-exact).
 * Decode on the GPU (one token per call) is compared with the CPU prefill under the same
 * bound, and with the GPU's own prefill bit for bit: every GPU kernel is row-independent and
 * sums in a fixed order, so a token's bits do not depend on the other tokens of its call.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "gpu_forward_internal.h"
#include "mmoe_config.h"
#include "mmoe_formats.h"
#include "mmoe_gpu_forward.h"
#include "mmoe_gpu_moe.h"
#include "mmoe_model.h"
#include "mmoe_rng.h"
#include "mmoe_safetensors.h"
#include "mmoe_synth_model.h"
#include "mmoe_test.h"
#include "model_internal.h"

#define FWD_REL_TOL 0x1.0p-4
#define FWD_MARGIN_TOL 0x1.0p-4

static uint64_t g_seed;

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

static int exp_is_exact(void);
static int fp8_linears_exact(void);
static int forward_is_exact(void);

/**
 * Prefill @p T random tokens on both backends (GPU in chunks of @p chunk), compare all logits;
 * then the MTP logits; then greedy decode of @p n_gen tokens; then the first @p n_replay tokens
 * again, one per GPU call, against the CPU's prefill.
 */
static void run_model(const char *what, const char *dir, int64_t T, int64_t chunk, int n_gen, int64_t n_replay)
{
    mmoe_model *m = mmoe_test_open_model(dir);
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
    int64_t same = 0, tokens_same = 0, first_diff = -1;
    for (int64_t t = 0; t < T; t++) {
        int64_t here = 0;
        for (int64_t i = t * row; i < (t + 1) * row; i++)
            here += sc[i] == sg[i];
        same += here;
        tokens_same += here == row;
        if (here != row && first_diff < 0)
            first_diff = t;
    }
    /* before the logits' check, so that a failing run says where the streams first part */
    fprintf(stderr, "gpu_forward: %s: final streams: %lld of %lld bf16 values identical (%lld of %lld tokens; first "
            "token that differs: %lld)\n", what, (long long)same, (long long)(T * row), (long long)tokens_same,
            (long long)T, (long long)first_diff);
    if (forward_is_exact()) {
        ck_assert_msg(same == T * row, "%s: the final streams differ from the oracle's from token %lld (seed %llu)", what,
                      (long long)first_diff, (unsigned long long)g_seed);
        ck_assert_msg(memcmp(lg, lc, sizeof(float) * (size_t)(T * V)) == 0, "%s: the logits differ from the oracle's "
                      "(seed %llu)", label, (unsigned long long)g_seed);
    }
    compare_logits(label, lg, lc, T, V);
    float m0, a0;
    int64_t next = argmax_margin(lc + (T - 1) * V, V, &m0, &a0);
    const int64_t n_dec = T < n_replay ? T : n_replay;
    float *lg_prefill = malloc(sizeof(float) * (size_t)(n_dec * V));
    ck_assert_ptr_nonnull(lg_prefill);
    memcpy(lg_prefill, lg, sizeof(float) * (size_t)(n_dec * V));

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

    /* decode = prefill on the GPU: replay the first n_replay tokens one at a time */
    ck_assert_msg(mmoe_gpu_model_reset(g, &err) == MMOE_OK, "%s", err.msg);
    mmoe_model_state_reset(s);
    ck_assert_msg(mmoe_model_forward(m, s, ids, n_dec, lc, 0, NULL, &err) == MMOE_OK, "%s", err.msg);
    for (int64_t t = 0; t < n_dec; t++)
        ck_assert_msg(mmoe_gpu_model_forward(g, ids + t, 1, lg + t * V, 0, NULL, &err) == MMOE_OK, "%s", err.msg);
    snprintf(label, sizeof label, "%s gpu decode vs cpu prefill", what);
    compare_logits(label, lg, lc, n_dec, V);
    /* every GPU kernel is row-independent with a fixed order: decode = prefill bit for bit (the
       exact recipe; under `tc` a decode step's few-token linears are bounded, its prefill's exact) */
    if (fp8_linears_exact())
        ck_assert_msg(memcmp(lg, lg_prefill, sizeof(float) * (size_t)(n_dec * V)) == 0,
                      "%s: GPU decode logits differ from the GPU prefill's (seed %llu)", what,
                      (unsigned long long)g_seed);
    else {
        snprintf(label, sizeof label, "%s gpu decode vs gpu prefill", what);
        compare_logits(label, lg, lg_prefill, n_dec, V);
    }
    free(lg_prefill);

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
    run_model("tiny-dsv4", dir, 40, 64, 12, 20);
}
END_TEST

/**
 * Write a synth checkpoint of preset @p preset with @p layers layers into @p dir (overrides: experts,
 * vocab when > 0; @p ratios, when given, the compress ratio of each main layer, and @p n_hash hash layers).
 */
static void synth_write(const char *dir, const char *preset, int layers, int64_t experts, int64_t vocab,
                        const int *ratios, int n_hash)
{
    mmoe_config cfg;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert(mmoe_config_preset(preset, layers, &cfg, &err) == MMOE_OK);
    if (experts > 0)
        cfg.n_routed_experts = (int)experts;
    if (vocab > 0)
        cfg.vocab_size = vocab;
    if (ratios != NULL) {
        for (int i = 0; i < layers; i++)
            cfg.compress_ratios[i] = ratios[i];
        cfg.n_hash_layers = n_hash;
    }
    if (cfg.max_seq_len > 1024)
        cfg.max_seq_len = 1024;
    ck_assert_msg(mmoe_synth_model_write(&cfg, g_seed, dir, 256 << 20, 0, NULL, NULL, &err) == MMOE_OK, "%s", err.msg);
}

/** A synth checkpoint in a temporary directory, run and removed. */
static void synth_case(const char *what, const char *preset, int layers, int64_t T, int n_gen)
{
    char root[512], dir[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    synth_write(dir, preset, layers, 0, 0, NULL, 0);
    run_model(what, dir, T, 64, n_gen, 20);
    mmoe_test_rmtree(root);
}

/** Do the GPU forward's FP8 linears run the exact recipe (MMOE_GPU_FP8_LINEARS unset, empty or "exact")? */
static int fp8_linears_exact(void)
{
    const char *v = getenv("MMOE_GPU_FP8_LINEARS");
    return v == NULL || v[0] == '\0' || strcmp(v, "exact") == 0;
}

/** Must the forward be bit-exact: the device's expf is the host's and the FP8 linears are exact? */
static int forward_is_exact(void) { return exp_is_exact() && fp8_linears_exact(); }

/** Does the device's expf equal the host's on a sample (then the exp-based kernels are exact)? */
static int exp_is_exact(void)
{
    enum { N = 1 << 16 };
    static float x[N], y[N];
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ 0xe4f);
    for (int i = 0; i < N; i++)
        x[i] = (float)((double)mmoe_rng_below(&r, 1u << 24) / (double)(1u << 24) * 40.0 - 30.0);
    mmoe_error err;
    ck_assert_msg(gfw_test_unary(GFW_TEST_EXPF, x, N, y, &err) == MMOE_OK, "%s", err.msg);
    for (int i = 0; i < N; i++) {
        const float h = expf(x[i]);
        if (memcmp(&h, &y[i], 4) != 0)
            return 0;
    }
    return 1;
}

/** Normwise relative difference of two bf16 arrays, and the count of identical elements. */
static double bf16_rel(const uint16_t *g, const uint16_t *c, int64_t n, int64_t *same)
{
    double num = 0.0, den = 0.0;
    *same = 0;
    for (int64_t i = 0; i < n; i++) {
        const double a = mmoe_bf16_to_f32(g[i]), b = mmoe_bf16_to_f32(c[i]);
        if (isnan(a))
            return INFINITY;
        num += (a - b) * (a - b);
        den += b * b;
        *same += g[i] == c[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1e-30);
}

/**
 * Router logits of @p T tokens x [T, D] against the gate [E, D] (bf16 both) in the order that
 * @ref spec_moe_gemm_order defines, written out from that page: eight fp32 lanes, lane k mod 8
 * one fmaf per k in ascending k, then ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)).
 */
static void spec_router_logits(const uint16_t *x, const uint16_t *gate, int64_t T, int64_t E, int64_t D, float *z)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++) {
            float p[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            for (int64_t k = 0; k < D; k++)
                p[k % 8] = fmaf(mmoe_bf16_to_f32(x[t * D + k]), mmoe_bf16_to_f32(gate[e * D + k]), p[k % 8]);
            z[t * E + e] = ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
        }
}

/**
 * The MoE sub-layer of block @p L with the oracle's own routing (ci, cw from its run) given to
 * the GPU, in calls of 1, 2, 3, 5, 8, 13, ... tokens (every token tile, full and partial):
 * bit-exact with the oracle's yc where the device's exp is the host's (every other step is
 * the oracle's arithmetic in the oracle's order); and the router's logits bit-exact with
 * spec_router_logits().
 */
static void check_moe_given(const char *what, mmoe_gpu_model *g, const gfw_block_src *bs, int L, const uint16_t *x,
                            const int64_t *ci, const float *cw, const uint16_t *yc, int64_t T, int64_t D,
                            int64_t chunk, int exact_exp)
{
    const int64_t E = bs->moe.n_experts, k = bs->moe.topk;
    uint16_t *yg = malloc(2 * (size_t)(T * D));
    int32_t *gi = malloc(sizeof(int32_t) * (size_t)(T * k));
    float *zg = malloc(sizeof(float) * (size_t)(T * E)), *zs = malloc(sizeof(float) * (size_t)(T * E));
    ck_assert(yg && gi && zg && zs);
    for (int64_t i = 0; i < T * k; i++)
        gi[i] = (int32_t)ci[i];
    mmoe_test_poison_bf16(yg, (size_t)(T * D));
    mmoe_test_poison_f32(zg, (size_t)(T * E));
    mmoe_error err;
    mmoe_error_clear(&err);
    int64_t want = 1, want_prev = 1; /* calls of 1, 2, 3, 5, 8, 13, ... tokens, at most chunk */
    for (int64_t t0 = 0; t0 < T;) {
        int64_t n = want > chunk ? chunk : want;
        n = T - t0 < n ? T - t0 : n;
        ck_assert_msg(gfw_test_moe_given(g, L, x + t0 * D, gi + t0 * k, cw + t0 * k, n, zg + t0 * E, yg + t0 * D,
                                         &err) == MMOE_OK, "%s", err.msg);
        t0 += n;
        const int64_t next = want + want_prev;
        want_prev = want;
        want = next;
    }
    spec_router_logits(x, bs->moe.gate, T, E, D, zs);
    int64_t zsame = 0, same = 0;
    for (int64_t i = 0; i < T * E; i++)
        zsame += memcmp(&zg[i], &zs[i], 4) == 0;
    for (int64_t i = 0; i < T * D; i++)
        same += yg[i] == yc[i];
    fprintf(stderr, "gpu_forward: %s: block %d moe with the oracle's routing: %lld of %lld bit-exact; router logits "
            "%lld of %lld\n", what, L, (long long)same, (long long)(T * D), (long long)zsame, (long long)(T * E));
    ck_assert_msg(zsame == T * E, "%s: block %d router logits differ from the spec's order (seed %llu)", what, L,
                  (unsigned long long)g_seed);
    if (exact_exp)
        ck_assert_msg(same == T * D, "%s: block %d moe with the oracle's routing differs from the oracle (seed %llu)",
                      what, L, (unsigned long long)g_seed);
    free(yg), free(gi), free(zg), free(zs);
}

/**
 * The oracle's MoE layer of block @p b on tokens [t0, t0 + n) of x [T, D] (@p ids: the
 * sequence's token ids, for hash layers): output rows into y, routing rows into ci, cw (k per
 * token), all at the tokens' positions.
 */
static void oracle_moe_chunk(const model_block *b, const uint16_t *x, const int32_t *ids, int64_t t0, int64_t n,
                             int64_t D, int64_t k, uint16_t *y, int64_t *ci, float *cw)
{
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_moe_input in = {n, x + t0 * D, b->hash ? ids + t0 : NULL, NULL, NULL};
    mmoe_moe_output out = {y + t0 * D, ci + t0 * k, cw + t0 * k};
    ck_assert_msg(mmoe_moe_layer_run(b->moe, &in, &out, NULL, &err) == MMOE_OK, "%s", err.msg);
}

/**
 * Every block's attention and MoE sub-layer on its own, on random normalized inputs: the CPU
 * sub-layer (mmoe_attention_forward with a fresh cache, mmoe_moe_layer_run) against the GPU
 * model's (gfw_test_sublayer), T tokens in calls of @p chunk.  Both are exact where exp is (all
 * their other steps are); else the MoE normwise within 2^-7 (a flipped bf16 or E4M3 rounding
 * of an intermediate moves an output by one bf16 ulp, 2^-8 relative, of a few elements).
 */
static void check_sublayers(const char *what, const char *dir, int64_t T, int64_t chunk)
{
    mmoe_model *m = mmoe_test_open_model(dir);
    const mmoe_config *c = mmoe_model_config(m);
    const int64_t D = c->dim;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_gpu_model *g = NULL;
    ck_assert_msg(mmoe_gpu_model_create(m, T, chunk, &g, &err) == MMOE_OK, "%s", err.msg);
    gfw_model_src src;
    ck_assert_msg(gfw_model_src_build(m, &src, &err) == MMOE_OK, "%s", err.msg);
    const int exact_exp = forward_is_exact();
    uint16_t *x = malloc(2 * (size_t)(T * D)), *yc = malloc(2 * (size_t)(T * D)), *yg = malloc(2 * (size_t)(T * D));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
    int64_t *ci = malloc(sizeof(int64_t) * (size_t)(T * MMOE_MOE_MAX_TOPK));
    float *cw = malloc(sizeof(float) * (size_t)(T * MMOE_MOE_MAX_TOPK));
    ck_assert(x && yc && yg && ids && ci && cw);
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ 0x5b);
    for (int L = 0; L < m->n_blocks; L++) {
        const model_block *b = &m->blocks[L];
        for (int64_t i = 0; i < T * D; i++)
            x[i] = mmoe_bf16_from_f32((float)((double)mmoe_rng_below(&r, 1u << 24) / (double)(1u << 24) * 4.0 - 2.0));
        for (int64_t i = 0; i < T; i++)
            ids[i] = (int32_t)mmoe_rng_below(&r, (uint64_t)c->vocab_size);
        /* attention */
        mmoe_attn_cache *cache = NULL;
        ck_assert_msg(mmoe_attn_cache_create(&b->attn_p, T, &cache, &err) == MMOE_OK, "%s", err.msg);
        mmoe_test_poison_bf16(yg, (size_t)(T * D));
        for (int64_t t0 = 0; t0 < T; t0 += chunk) {
            const int64_t n = T - t0 < chunk ? T - t0 : chunk;
            mmoe_tensor xi, xo;
            memset(&xi, 0, sizeof xi);
            xi.dtype = MMOE_DT_BF16;
            xi.ndim = 2;
            xi.shape[0] = n;
            xi.shape[1] = D;
            xi.data = x + t0 * D;
            xi.nbytes = 2 * (size_t)(n * D);
            xo = xi;
            xo.data = yc + t0 * D;
            ck_assert_msg(mmoe_attention_forward(&b->attn_p, &b->attn_w, cache, &xi, t0, n, &xo, NULL, &err) == MMOE_OK,
                          "%s", err.msg);
            ck_assert_msg(gfw_test_sublayer(g, L, 0, x + t0 * D, NULL, n, t0, yg + t0 * D, &err) == MMOE_OK, "%s",
                          err.msg);
        }
        mmoe_attn_cache_destroy(cache);
        int64_t same;
        double rel = bf16_rel(yg, yc, T * D, &same);
        fprintf(stderr, "gpu_forward: %s: block %d (ratio %d) attention: %lld of %lld bit-exact, rel %.3g\n", what, L,
                b->attn_p.compress_ratio, (long long)same, (long long)(T * D), rel);
        if (exact_exp)
            ck_assert_msg(same == T * D, "%s: block %d attention differs from the oracle (seed %llu)", what, L,
                          (unsigned long long)g_seed);
        ck_assert_msg(rel <= 0x1.0p-6, "%s: block %d attention: rel %.3g (seed %llu)", what, L, rel,
                      (unsigned long long)g_seed);
        /* MoE */
        mmoe_test_poison_bf16(yg, (size_t)(T * D));
        for (int64_t t0 = 0; t0 < T; t0 += chunk) {
            const int64_t n = T - t0 < chunk ? T - t0 : chunk;
            oracle_moe_chunk(b, x, ids, t0, n, D, src.blocks[L].moe.topk, yc, ci, cw);
            ck_assert_msg(gfw_test_sublayer(g, L, 1, x + t0 * D, ids + t0, n, t0, yg + t0 * D, &err) == MMOE_OK, "%s",
                          err.msg);
        }
        rel = bf16_rel(yg, yc, T * D, &same);
        fprintf(stderr, "gpu_forward: %s: block %d (%s) moe: %lld of %lld bit-exact, rel %.3g\n", what, L,
                b->hash ? "hash" : "score", (long long)same, (long long)(T * D), rel);
        ck_assert_msg(rel <= 0x1.0p-7, "%s: block %d moe: rel %.3g (seed %llu)", what, L, rel,
                      (unsigned long long)g_seed);
        if (exact_exp)
            ck_assert_msg(same == T * D, "%s: block %d moe differs from the oracle (seed %llu)", what, L,
                          (unsigned long long)g_seed);
        check_moe_given(what, g, &src.blocks[L], L, x, ci, cw, yc, T, D, chunk, exact_exp);
    }
    gfw_model_src_free(&src);
    free(x), free(yc), free(yg), free(ids), free(ci), free(cw);
    mmoe_gpu_model_destroy(g);
    mmoe_model_close(m);
}

/** What observe_sublayers() keeps: each block's sub-layers' inputs and outputs over the sequence. */
typedef struct fwd_acts {
    int64_t D;
    uint16_t *in[2 * 8], *out[2 * 8]; /**< [block * 2 + which] bf16 [T, D] by position */
} fwd_acts;

/** Room for the inputs and outputs of the @p nl layers' sub-layers over @p T tokens of width @p D, NaN-filled. */
static void fwd_acts_alloc(fwd_acts *a, int64_t D, int64_t T, int nl)
{
    ck_assert_int_le(nl, 8);
    memset(a, 0, sizeof *a);
    a->D = D;
    for (int k = 0; k < 2 * nl; k++) {
        a->in[k] = malloc(2 * (size_t)(T * D));
        a->out[k] = malloc(2 * (size_t)(T * D));
        ck_assert(a->in[k] && a->out[k]);
        mmoe_test_poison_bf16(a->in[k], (size_t)(T * D));
        mmoe_test_poison_bf16(a->out[k], (size_t)(T * D));
    }
}

/** Free what fwd_acts_alloc() took. */
static void fwd_acts_free(fwd_acts *a)
{
    for (int k = 0; k < 2 * 8; k++)
        free(a->in[k]), free(a->out[k]);
}

/** A forward's observer (the oracle's or the GPU's): copy each sub-layer's input and output to its positions. */
static int observe_sublayers(void *ctx, int block, mmoe_sublayer which, int64_t pos, int64_t T, const uint16_t *in,
                             const uint16_t *out)
{
    fwd_acts *a = ctx;
    const int k = block * 2 + (int)which;
    if (k >= 2 * 8 || a->in[k] == NULL)
        return 1;
    memcpy(a->in[k] + pos * a->D, in, 2 * (size_t)(T * a->D));
    if (out != NULL) /* the GPU forward's MoE: its combine is inside hc_post */
        memcpy(a->out[k] + pos * a->D, out, 2 * (size_t)(T * a->D));
    return 0;
}

/**
 * The token of @p T whose output row differs most from the oracle's (relative L2 over the row),
 * and that difference; @p n_tok_diff counts the tokens with any differing element.
 */
static int64_t worst_token(const uint16_t *g, const uint16_t *c, int64_t T, int64_t D, double *rel,
                           int64_t *n_tok_diff)
{
    int64_t worst = -1;
    *rel = 0.0;
    *n_tok_diff = 0;
    for (int64_t t = 0; t < T; t++) {
        int64_t same;
        const double r = bf16_rel(g + t * D, c + t * D, D, &same);
        *n_tok_diff += same != D;
        if (worst < 0 || r > *rel) {
            worst = t;
            *rel = r;
        }
    }
    return worst;
}

/**
 * The GPU forward of the same tokens (chunks of @p chunk) with an observer: each sub-layer's
 * input, and the attention's output, against the oracle's @p a, token by token.  Printed for
 * every sub-layer: the tokens that differ, the first of them, the worst token's relative
 * error, so that where the forward first parts from the oracle can be read off.  Bit-exact
 * where exp is (@p exact_exp), else the first attention's input still is (embedding, hc_pre and
 * the norm use no exp) and every compared tensor is within the forward's bound 2^-4
 * (FWD_REL_TOL's, whole tensor).
 */
static void compare_forward_inputs(const char *what, mmoe_gpu_model *g, const fwd_acts *a, const int32_t *ids,
                                   int64_t T, int64_t chunk, int nl, int exact_exp)
{
    const int64_t D = a->D;
    mmoe_error err;
    mmoe_error_clear(&err);
    fwd_acts ga;
    fwd_acts_alloc(&ga, D, T, nl);
    ck_assert_msg(gfw_test_set_observer(g, observe_sublayers, &ga, &err) == MMOE_OK, "%s", err.msg);
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        const int64_t n = T - t0 < chunk ? T - t0 : chunk;
        ck_assert_msg(mmoe_gpu_model_forward(g, ids + t0, n, NULL, 0, NULL, &err) == MMOE_OK, "%s", err.msg);
    }
    ck_assert_msg(gfw_test_set_observer(g, NULL, NULL, &err) == MMOE_OK, "%s", err.msg);
    for (int k = 0; k < 2 * nl; k++)
        for (int side = 0; side < 1 + (k % 2 == 0); side++) {
            const uint16_t *gx = side ? ga.out[k] : ga.in[k], *cx = side ? a->out[k] : a->in[k];
            int64_t same, n_tok, first = -1;
            double rel_tok;
            const double rel = bf16_rel(gx, cx, T * D, &same);
            const int64_t worst = worst_token(gx, cx, T, D, &rel_tok, &n_tok);
            for (int64_t t = 0; t < T && first < 0; t++)
                if (memcmp(gx + t * D, cx + t * D, 2 * (size_t)D) != 0)
                    first = t;
            fprintf(stderr, "gpu_forward: %s: forward: block %d %s %s: %lld of %lld tokens differ (first %lld), rel "
                    "%.3g; worst token %lld: rel %.3g\n", what, k / 2, k % 2 ? "moe" : "attention",
                    side ? "output" : "input", (long long)n_tok, (long long)T, (long long)first, rel, (long long)worst,
                    rel_tok);
            if ((k == 0 && side == 0) || exact_exp)
                ck_assert_msg(same == T * D, "%s: forward: block %d %s %s differs from the oracle's from token %lld "
                              "(seed %llu)", what, k / 2, k % 2 ? "moe" : "attention", side ? "output" : "input",
                              (long long)first, (unsigned long long)g_seed);
            ck_assert_msg(rel <= FWD_REL_TOL, "%s: forward: block %d %s %s: rel %.3g (worst token %lld: %.3g; seed "
                          "%llu)", what, k / 2, k % 2 ? "moe" : "attention", side ? "output" : "input", rel,
                          (long long)worst, rel_tok, (unsigned long long)g_seed);
        }
    fwd_acts_free(&ga);
}

/**
 * Block @p L's MoE on the oracle forward's own inputs @p x: the oracle layer's routing (experts
 * and weights, in calls of @p chunk) against the GPU router's @p gi, @p gw ([T, k]), token by token (the tokens that differ printed with the weights' ulp
 * distance); then check_moe_given() with the oracle's routing.  The oracle's output of these
 * calls must be the forward's @p yc bit for bit (the layer is batch-invariant).
 */
static void check_routing_on_forward(const char *what, mmoe_gpu_model *g, const gfw_block_src *bs, int L,
                                     const model_block *b, const uint16_t *x, const int32_t *ids, const int32_t *gi,
                                     const float *gw, const uint16_t *yc, int64_t T, int64_t D, int64_t chunk,
                                     int exact_exp)
{
    const int64_t k = bs->moe.topk;
    int64_t *ci = malloc(sizeof(int64_t) * (size_t)(T * k));
    float *cw = malloc(sizeof(float) * (size_t)(T * k));
    uint16_t *y = malloc(2 * (size_t)(T * D));
    ck_assert(ci && cw && y);
    for (int64_t t0 = 0; t0 < T; t0 += chunk)
        oracle_moe_chunk(b, x, ids, t0, T - t0 < chunk ? T - t0 : chunk, D, k, y, ci, cw);
    ck_assert_msg(memcmp(y, yc, 2 * (size_t)(T * D)) == 0, "%s: block %d: the oracle's MoE of the forward's inputs "
                  "is not the forward's (seed %llu)", what, L, (unsigned long long)g_seed);
    int64_t idx_diff = 0, w_diff = 0, shown = 0;
    for (int64_t t = 0; t < T; t++) {
        int di = 0, dw = 0;
        for (int64_t j = 0; j < k; j++) {
            di |= gi[t * k + j] != ci[t * k + j];
            dw |= memcmp(&gw[t * k + j], &cw[t * k + j], 4) != 0;
        }
        idx_diff += di;
        w_diff += dw;
        if ((di || dw) && shown++ < 4)
            for (int64_t j = 0; j < k; j++) {
                int32_t ub, ua;
                memcpy(&ub, &gw[t * k + j], 4);
                memcpy(&ua, &cw[t * k + j], 4);
                fprintf(stderr, "gpu_forward: %s: block %d token %lld slot %lld: expert gpu %d cpu %lld, weight gpu "
                        "%.9g cpu %.9g (%d ulp)\n", what, L, (long long)t, (long long)j, gi[t * k + j],
                        (long long)ci[t * k + j], gw[t * k + j], cw[t * k + j], ub - ua);
            }
    }
    fprintf(stderr, "gpu_forward: %s: forward's activations: block %d (%s) routing: %lld of %lld tokens with other "
            "experts, %lld with other weights\n", what, L, b->hash ? "hash" : "score", (long long)idx_diff,
            (long long)T, (long long)w_diff);
    if (exact_exp) /* the same logits (check_moe_given), exp and log1p: the same routing */
        ck_assert_msg(idx_diff == 0 && w_diff == 0, "%s: block %d: the GPU's routing differs from the oracle's at %lld "
                      "tokens (seed %llu)", what, L, (long long)(idx_diff > w_diff ? idx_diff : w_diff),
                      (unsigned long long)g_seed);
    check_moe_given(what, g, bs, L, x, ci, cw, yc, T, D, chunk, exact_exp);
    free(ci), free(cw), free(y);
}

/**
 * Every sub-layer of the main layers on the oracle forward's own activations: the CPU forward
 * of @p T random tokens (one call) with an observer that keeps each attention's and MoE's input
 * and output; then each GPU sub-layer (a fresh model, chunks of @p chunk, the attention's caches
 * filled by its own chunks) on those inputs against those outputs, under check_sublayers()'s
 * rules.  Random inputs (check_sublayers()) miss what only a model's own activations reach
 * (their scale, the router's near-ties, the attention's peaks); the worst token of each
 * sub-layer is printed, so that a forward that parts from the oracle says where.
 */
static void check_sublayers_on_forward(const char *what, const char *dir, int64_t T, int64_t chunk)
{
    mmoe_model *m = mmoe_test_open_model(dir);
    const mmoe_config *c = mmoe_model_config(m);
    const int64_t D = c->dim;
    const int nl = c->n_layers;
    mmoe_error err;
    mmoe_error_clear(&err);
    fwd_acts a;
    fwd_acts_alloc(&a, D, T, nl);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
    uint16_t *yg = malloc(2 * (size_t)(T * D));
    ck_assert(ids && yg);
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)T); /* run_model()'s tokens for the same T */
    for (int64_t i = 0; i < T; i++)
        ids[i] = (int32_t)mmoe_rng_below(&r, (uint64_t)c->vocab_size);
    mmoe_model_state *s = NULL;
    ck_assert_msg(mmoe_model_state_create(m, T, &s, &err) == MMOE_OK, "%s", err.msg);
    mmoe_model_set_observer(m, observe_sublayers, &a);
    ck_assert_msg(mmoe_model_forward(m, s, ids, T, NULL, 0, NULL, &err) == MMOE_OK, "%s", err.msg);
    mmoe_model_set_observer(m, NULL, NULL);
    mmoe_model_state_destroy(s);

    mmoe_gpu_model *g = NULL;
    ck_assert_msg(mmoe_gpu_model_create(m, T, chunk, &g, &err) == MMOE_OK, "%s", err.msg);
    const int exact_exp = forward_is_exact();
    gfw_model_src src;
    ck_assert_msg(gfw_model_src_build(m, &src, &err) == MMOE_OK, "%s", err.msg);
    const int64_t K = MMOE_MOE_MAX_TOPK;
    int32_t *gi = malloc(sizeof(int32_t) * (size_t)(T * K));
    float *gw = malloc(sizeof(float) * (size_t)(T * K));
    ck_assert(gi && gw);
    compare_forward_inputs(what, g, &a, ids, T, chunk, nl, exact_exp);
    ck_assert_msg(mmoe_gpu_model_reset(g, &err) == MMOE_OK, "%s", err.msg);
    for (int L = 0; L < nl; L++)
        for (int which = 0; which < 2; which++) {
            const uint16_t *x = a.in[2 * L + which], *yc = a.out[2 * L + which];
            mmoe_test_poison_bf16(yg, (size_t)(T * D));
            for (int64_t t0 = 0; t0 < T; t0 += chunk) {
                const int64_t n = T - t0 < chunk ? T - t0 : chunk;
                ck_assert_msg(gfw_test_sublayer(g, L, which, x + t0 * D, which ? ids + t0 : NULL, n, t0, yg + t0 * D,
                                              &err) == MMOE_OK, "%s", err.msg);
                if (which)
                    ck_assert_msg(gfw_test_last_routing(g, L, n, gi + t0 * src.blocks[L].moe.topk,
                                                        gw + t0 * src.blocks[L].moe.topk, &err) == MMOE_OK, "%s",
                                  err.msg);
            }
            if (which)
                check_routing_on_forward(what, g, &src.blocks[L], L, &m->blocks[L], x, ids, gi, gw, yc, T, D, chunk,
                                         exact_exp);
            int64_t same, n_tok;
            double rel_tok;
            const double rel = bf16_rel(yg, yc, T * D, &same);
            const int64_t worst = worst_token(yg, yc, T, D, &rel_tok, &n_tok);
            const char *name = which ? "moe" : "attention";
            fprintf(stderr, "gpu_forward: %s: forward's activations: block %d %s: %lld of %lld bit-exact (%lld of %lld "
                    "tokens differ), rel %.3g; worst token %lld: rel %.3g\n", what, L, name, (long long)same,
                    (long long)(T * D), (long long)n_tok, (long long)T, rel, (long long)worst, rel_tok);
            if (exact_exp)
                ck_assert_msg(same == T * D, "%s: forward's activations: block %d %s differs from the oracle "
                              "(worst token %lld, seed %llu)", what, L, name, (long long)worst,
                              (unsigned long long)g_seed);
            ck_assert_msg(rel <= (which ? 0x1.0p-7 : 0x1.0p-6), "%s: forward's activations: block %d %s: rel %.3g "
                          "(worst token %lld: %.3g; seed %llu)", what, L, name, rel, (long long)worst, rel_tok,
                          (unsigned long long)g_seed);
        }
    fwd_acts_free(&a);
    free(ids), free(yg), free(gi), free(gw);
    gfw_model_src_free(&src);
    mmoe_gpu_model_destroy(g);
    mmoe_model_close(m);
}

START_TEST(test_sublayers)
{
    char dir[4096];
    tiny_dir(dir, sizeof dir);
    check_sublayers("tiny-dsv4", dir, 40, 16);
    check_sublayers_on_forward("tiny-dsv4", dir, 40, 16);
    /* one token a call: the decode step's own kernels (one-token attention, router and plan) */
    check_sublayers_on_forward("tiny-dsv4", dir, 24, 1);
    char root[512], sdir[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
    snprintf(sdir, sizeof sdir, "%s/ckpt", root);
    synth_write(sdir, "tiny", 3, 0, 0, NULL, 0);
    check_sublayers("synth tiny x3", sdir, 140, 64);
    check_sublayers("synth tiny x3, one token a call", sdir, 24, 1);
    mmoe_test_rmtree(root);
    /* 256 experts (V4-Flash's count): the one-token router's lanes hold eight experts each */
    ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
    snprintf(sdir, sizeof sdir, "%s/ckpt", root);
    synth_write(sdir, "tiny", 3, 256, 0, NULL, 0);
    check_sublayers("synth tiny x3, 256 experts, one token a call", sdir, 24, 1);
    check_sublayers("synth tiny x3, 256 experts", sdir, 24, 8);
    mmoe_test_rmtree(root);
}
END_TEST

/* one layer type more at a time: window only (hash), + ratio 4 (hash), + ratio 128 */
START_TEST(test_synth_layers)
{
    synth_case("synth tiny x1", "tiny", 1, 40, 4);
    synth_case("synth tiny x2", "tiny", 2, 40, 4);
}
END_TEST

static void graph_case(const char *what, const char *dir, int64_t n);

/*
 * V4-Flash widths (D 4096, 64 heads of 512, q_lora 1024, 8 groups, indexer 64 x 128, window 128,
 * top-512, 6 of 8 experts + 1 shared, vocabulary 1024): layer 0 ratio 4 (hash-routed), layer 1
 * ratio 128 (score-routed), the MTP block window-only.  136 tokens pass the window, make 34
 * ratio-4 blocks and one ratio-128 block; then the decode with CUDA graphs on against off
 * (graph_case) over 136 positions.  With MMOE_GPU_FWD_FLASH_DIR set the checkpoint is
 * written there and kept (for `megamoe bench forward`), else in a temporary directory.
 */
START_TEST(test_synth_flash)
{
    const int ratios[2] = {4, 128};
    const char *keep = getenv("MMOE_GPU_FWD_FLASH_DIR");
    char root[512] = "", dir[600];
    if (keep != NULL) {
        snprintf(dir, sizeof dir, "%s", keep);
    } else {
        ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
        snprintf(dir, sizeof dir, "%s/ckpt", root);
    }
    synth_write(dir, "v4-flash", 2, 8, 1024, ratios, 1);
    check_sublayers("synth v4-flash widths", dir, 136, 64);
    check_sublayers_on_forward("synth v4-flash widths", dir, 136, 64);
    run_model("synth v4-flash widths", dir, 136, 64, 4, 6);
    graph_case("synth v4-flash widths cuda graph", dir, 136); /* past the window of 128 and a ratio-128 block */
    if (keep == NULL)
        mmoe_test_rmtree(root);
}
END_TEST

START_TEST(test_synth_long)
{
    synth_case("synth tiny x3", "tiny", 3, 140, 12);
}
END_TEST

START_TEST(test_refuses)
{
    char dir[4096];
    tiny_dir(dir, sizeof dir);
    mmoe_model *m = mmoe_test_open_model(dir);
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

/** A model's decode on the GPU with CUDA graphs off (@p g_ref) and on (@p g_graph), compared call by call. */
typedef struct graph_pair {
    mmoe_gpu_model *g_ref;   /**< graphs off: every call kernel by kernel */
    mmoe_gpu_model *g_graph; /**< graphs on */
    int64_t V, row;          /**< vocabulary; streams per token (hc * D) */
    float *l_ref, *l_graph;  /**< [V] logits of the last call */
    uint16_t *s_ref, *s_graph; /**< [row] streams of the last call */
} graph_pair;

/**
 * Feed @p n tokens of @p ids one per call to both models (logits and final streams wanted, as
 * generate's decode steps do), outputs NaN-poisoned first; each call's logits and streams must
 * be bit-identical.  @p what and the first position name a failure.
 */
static void graph_decode_compare(const char *what, graph_pair *p, const int32_t *ids, int64_t n)
{
    mmoe_error err;
    mmoe_error_clear(&err);
    for (int64_t i = 0; i < n; i++) {
        const int64_t pos = mmoe_gpu_model_pos(p->g_graph);
        mmoe_test_poison_f32(p->l_ref, (size_t)p->V);
        mmoe_test_poison_f32(p->l_graph, (size_t)p->V);
        mmoe_test_poison_bf16(p->s_ref, (size_t)p->row);
        mmoe_test_poison_bf16(p->s_graph, (size_t)p->row);
        ck_assert_msg(mmoe_gpu_model_forward(p->g_ref, ids + i, 1, p->l_ref, 1, p->s_ref, &err) == MMOE_OK, "%s",
                      err.msg);
        ck_assert_msg(mmoe_gpu_model_forward(p->g_graph, ids + i, 1, p->l_graph, 1, p->s_graph, &err) == MMOE_OK,
                      "%s", err.msg);
        for (int64_t v = 0; v < p->V; v++)
            ck_assert_msg(!isnan(p->l_ref[v]), "%s: position %lld: NaN logit %lld (seed %llu)", what, (long long)pos,
                          (long long)v, (unsigned long long)g_seed);
        ck_assert_msg(memcmp(p->l_ref, p->l_graph, sizeof(float) * (size_t)p->V) == 0,
                      "%s: position %lld: the graphed decode step's logits differ from the eager step's (seed %llu)",
                      what, (long long)pos, (unsigned long long)g_seed);
        ck_assert_msg(memcmp(p->s_ref, p->s_graph, 2 * (size_t)p->row) == 0,
                      "%s: position %lld: the graphed decode step's streams differ from the eager step's (seed %llu)",
                      what, (long long)pos, (unsigned long long)g_seed);
    }
}

/**
 * CUDA graphs on against off (mmoe_gpu_model_set_cuda_graph), on the model in @p dir for @p n
 * positions: a prefill of 5 tokens (eager on both), then decode one token per call, every
 * call's logits and streams bit-identical; the graph is captured once (at position 5) and
 * replayed by every later step.  Then a step with timing on (eager on both: still identical);
 * then both models reset and a new random sequence decoded from position 0 with the same
 * graph (positions below the one it was captured at: a position baked into the graph would
 * show here), still one capture.
 */
static void graph_case(const char *what, const char *dir, int64_t n)
{
    mmoe_model *m = mmoe_test_open_model(dir);
    const mmoe_config *c = mmoe_model_config(m);
    mmoe_error err;
    mmoe_error_clear(&err);
    graph_pair p;
    memset(&p, 0, sizeof p);
    p.V = c->vocab_size;
    p.row = c->hc_mult * c->dim;
    ck_assert_msg(mmoe_gpu_model_create(m, n + 2, 8, &p.g_ref, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_msg(mmoe_gpu_model_create(m, n + 2, 8, &p.g_graph, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(mmoe_gpu_model_set_cuda_graph(p.g_ref, 0, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_gpu_model_set_cuda_graph(p.g_graph, 1, &err), MMOE_OK);
    p.l_ref = malloc(sizeof(float) * (size_t)p.V);
    p.l_graph = malloc(sizeof(float) * (size_t)p.V);
    p.s_ref = malloc(2 * (size_t)p.row);
    p.s_graph = malloc(2 * (size_t)p.row);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n + 2));
    ck_assert(p.l_ref && p.l_graph && p.s_ref && p.s_graph && ids);
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ 0x9a4f ^ (uint64_t)n);
    for (int64_t i = 0; i < n + 2; i++)
        ids[i] = (int32_t)mmoe_rng_below(&r, (uint64_t)p.V);
    const int64_t n_pre = 5;
    ck_assert_msg(mmoe_gpu_model_forward(p.g_ref, ids, n_pre, p.l_ref, 1, NULL, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_msg(mmoe_gpu_model_forward(p.g_graph, ids, n_pre, p.l_graph, 1, NULL, &err) == MMOE_OK, "%s", err.msg);
    ck_assert(memcmp(p.l_ref, p.l_graph, sizeof(float) * (size_t)p.V) == 0);
    graph_decode_compare(what, &p, ids + n_pre, n - n_pre);
    mmoe_gpu_graph_stats gs;
    mmoe_gpu_model_graph_stats(p.g_graph, &gs);
    ck_assert_msg(gs.enabled == 1 && gs.captures == 1 && gs.replays == n - n_pre && gs.eager_calls == 1,
                  "%s: graph stats: enabled %d, %lld captures, %lld replays, %lld eager calls (expected 1, 1, %lld, 1)",
                  what, gs.enabled, (long long)gs.captures, (long long)gs.replays, (long long)gs.eager_calls,
                  (long long)(n - n_pre));
    mmoe_gpu_model_graph_stats(p.g_ref, &gs);
    ck_assert(gs.enabled == 0 && gs.captures == 0 && gs.replays == 0);
    /* timing on: the step runs kernel by kernel even with graphs on */
    mmoe_gpu_model_set_timing(p.g_graph, 1);
    graph_decode_compare(what, &p, ids + n, 1);
    mmoe_gpu_model_set_timing(p.g_graph, 0);
    mmoe_gpu_model_graph_stats(p.g_graph, &gs);
    ck_assert_int_eq(gs.eager_calls, 2);
    /* a new sequence after reset, decoded from position 0 by the graph captured at position 5 */
    ck_assert_msg(mmoe_gpu_model_reset(p.g_ref, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_msg(mmoe_gpu_model_reset(p.g_graph, &err) == MMOE_OK, "%s", err.msg);
    for (int64_t i = 0; i < n + 2; i++)
        ids[i] = (int32_t)mmoe_rng_below(&r, (uint64_t)p.V);
    const int64_t n_again = n < 24 ? n : 24;
    graph_decode_compare(what, &p, ids, n_again);
    mmoe_gpu_model_graph_stats(p.g_graph, &gs);
    ck_assert_msg(gs.captures == 1 && gs.replays == n - n_pre + n_again, "%s: after reset: %lld captures, %lld replays",
                  what, (long long)gs.captures, (long long)gs.replays);
    fprintf(stderr, "gpu_forward: %s: %lld decode steps as graph replays bit-identical to the eager steps (logits and "
            "streams), %lld more after reset; one capture\n", what, (long long)(n - n_pre), (long long)n_again);
    free(ids);
    free(p.l_ref), free(p.l_graph), free(p.s_ref), free(p.s_graph);
    mmoe_gpu_model_destroy(p.g_ref);
    mmoe_gpu_model_destroy(p.g_graph);
    mmoe_model_close(m);
}

/** An exchange that must never run (the refusal comes first). */
static mmoe_status no_exchange(void *ctx, const int32_t *idx_dev, int64_t T, int k, int64_t D, uint16_t *slot_y_dev,
                               mmoe_error *err)
{
    (void)ctx, (void)idx_dev, (void)T, (void)k, (void)D, (void)slot_y_dev;
    return mmoe_error_set(err, MMOE_EINTERNAL, "no exchange in this test");
}

/*
 * CUDA graphs: decode with graphs on equals graphs off bit for bit, on the embedded tiny model
 * and on a 3-layer synth model (window-only, ratio 4, ratio 128) decoded over 140 positions:
 * past the 16-token window, over every ratio-4 block boundary up to 35 blocks (more than
 * index_topk 4, so the indexer's top-k selects) and across the ratio-128 block boundary (the
 * first compressed block joins at position 127).  Also: MMOE_GPU_GRAPH read at creation (1 on,
 * a bad value refused naming it), and a rank of the expert-parallel forward refuses graphs.
 */
START_TEST(test_cuda_graph)
{
    char dir[4096];
    tiny_dir(dir, sizeof dir);
    graph_case("tiny-dsv4 cuda graph", dir, 40);
    char root[512], sdir[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
    snprintf(sdir, sizeof sdir, "%s/ckpt", root);
    synth_write(sdir, "tiny", 3, 0, 0, NULL, 0);
    graph_case("synth tiny x3 cuda graph", sdir, 140);
    mmoe_test_rmtree(root);

    mmoe_model *m = mmoe_test_open_model(dir);
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_gpu_model *g = NULL;
    mmoe_gpu_graph_stats gs;
    const char *outer = getenv(MMOE_GPU_GRAPH_ENV); /* restored below (gpu-check.sh runs the suite with it) */
    char outer_value[16] = "";
    if (outer)
        snprintf(outer_value, sizeof outer_value, "%s", outer);
    ck_assert_int_eq(setenv(MMOE_GPU_GRAPH_ENV, "1", 1), 0);
    ck_assert_msg(mmoe_gpu_model_create(m, 16, 4, &g, &err) == MMOE_OK, "%s", err.msg);
    mmoe_gpu_model_graph_stats(g, &gs);
    ck_assert_int_eq(gs.enabled, 1);
    mmoe_gpu_model_destroy(g);
    g = NULL;
    ck_assert_int_eq(setenv(MMOE_GPU_GRAPH_ENV, "yes", 1), 0);
    ck_assert_int_eq(mmoe_gpu_model_create(m, 16, 4, &g, &err), MMOE_EINVAL);
    ck_assert_ptr_null(g);
    ck_assert_msg(strstr(err.msg, MMOE_GPU_GRAPH_ENV) && strstr(err.msg, "yes"), "%s", err.msg);
    ck_assert_int_eq(outer ? setenv(MMOE_GPU_GRAPH_ENV, outer_value, 1) : unsetenv(MMOE_GPU_GRAPH_ENV), 0);
    const gfw_ep_part part = {0, mmoe_model_config(m)->n_routed_experts, no_exchange, NULL};
    ck_assert_msg(gfw_model_create_part(m, &part, 16, 4, &g, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(mmoe_gpu_model_set_cuda_graph(g, 1, &err), MMOE_EUNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "expert-parallel") != NULL, "%s", err.msg);
    ck_assert_int_eq(mmoe_gpu_model_set_cuda_graph(g, 0, &err), MMOE_OK);
    mmoe_gpu_model_destroy(g);
    mmoe_model_close(m);
}
END_TEST

/** Run a shell command; its exit status (-1 when it did not exit). */
static int sh(const char *cmd)
{
    const int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/** The megamoe program and the tiny fixture, or fail. */
static void cli_paths(const char **bin, char *dir, size_t n)
{
    *bin = getenv("MMOE_BIN");
    ck_assert_msg(*bin != NULL, "MMOE_BIN is not set (run through make check)");
    tiny_dir(dir, n);
}

/* megamoe logits --backend gpu against --backend cpu (prefill over two GPU chunks, and --mtp) */
START_TEST(test_cli_logits)
{
    const char *bin;
    char dir[4096], root[512], cmd[16384], toks[4096];
    cli_paths(&bin, dir, sizeof dir);
    ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
    size_t len = 0;
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ 0xc1);
    for (int i = 0; i < 70; i++)
        len += (size_t)snprintf(toks + len, sizeof toks - len, "%s%llu", i ? "," : "",
                                (unsigned long long)mmoe_rng_below(&r, 512));
    const char *be[2] = {"cpu", "gpu"};
    mmoe_st_file *f[2] = {NULL, NULL};
    mmoe_error err;
    for (int b = 0; b < 2; b++) {
        snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --ids %s --mtp --backend %s --out '%s/%s.st' 2>'%s/%s.err'",
                 bin, dir, toks, be[b], root, be[b], root, be[b]);
        ck_assert_msg(sh(cmd) == 0, "%s failed", cmd);
        snprintf(cmd, sizeof cmd, "%s/%s.st", root, be[b]);
        ck_assert_msg(mmoe_st_open(cmd, &f[b], &err) == MMOE_OK, "%s", err.msg);
    }
    const char *names[2] = {"logits", "mtp_logits"};
    for (int i = 0; i < 2; i++) {
        const mmoe_tensor *c = mmoe_st_find(f[0], names[i]), *g = mmoe_st_find(f[1], names[i]);
        ck_assert(c && g && c->shape[0] == g->shape[0] && c->shape[1] == g->shape[1]);
        compare_logits(names[i], g->data, c->data, c->shape[0], c->shape[1]);
    }
    snprintf(cmd, sizeof cmd, "grep -q 'backend: gpu (requested' '%s/gpu.err'", root);
    ck_assert_msg(sh(cmd) == 0, "megamoe logits --backend gpu does not say which backend ran");
    mmoe_st_close(f[0]);
    mmoe_st_close(f[1]);
    mmoe_test_rmtree(root);
}
END_TEST

/* megamoe generate: greedy continuations of the fixture on both backends; auto says it took the GPU */
START_TEST(test_cli_generate)
{
    const char *bin;
    char dir[4096], root[512], cmd[16384];
    cli_paths(&bin, dir, sizeof dir);
    ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
    const char *be[3] = {"cpu", "gpu", "auto"};
    for (int b = 0; b < 3; b++) {
        snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' --prompt 'the quick brown fox' --max-tokens 12 --print-ids "
                 "--backend %s > '%s/%s.out' 2>'%s/%s.err'", bin, dir, be[b], root, be[b], root, be[b]);
        ck_assert_msg(sh(cmd) == 0, "%s failed", cmd);
    }
    snprintf(cmd, sizeof cmd, "cmp -s '%s/cpu.out' '%s/gpu.out' && cmp -s '%s/cpu.out' '%s/auto.out'", root, root, root,
             root);
    if (sh(cmd) != 0) {
        snprintf(cmd, sizeof cmd, "cat '%s/cpu.out' '%s/gpu.out' >&2", root, root);
        sh(cmd);
        ck_abort_msg("greedy generate: the GPU's continuation differs from the CPU's (ids above)");
    }
    snprintf(cmd, sizeof cmd, "grep -q 'backend: gpu (auto' '%s/auto.err'", root);
    ck_assert_msg(sh(cmd) == 0, "generate --backend auto does not say that it took the GPU");
    mmoe_test_rmtree(root);
}
END_TEST

/**
 * Without a usable GPU: `--backend gpu` is refused (exit 1, the message names the option),
 * `--backend auto` runs on the CPU and says so, a bad name is a usage error (exit 2).
 */
static int check_refusal_without_gpu(void)
{
    const char *bin = getenv("MMOE_BIN");
    if (bin == NULL)
        return 0;
    char dir[4096], root[512], cmd[16384];
    tiny_dir(dir, sizeof dir);
    if (mmoe_test_mkdtemp(root, sizeof root) != 0)
        return 1;
    int bad = 0;
    snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --ids 1,2 --backend gpu --out '%s/g.st' 2>'%s/g.err'", bin,
             dir, root, root);
    bad |= sh(cmd) != 1;
    snprintf(cmd, sizeof cmd, "grep -q -- '--backend gpu:' '%s/g.err' && test ! -e '%s/g.st'", root, root);
    bad |= sh(cmd) != 0;
    snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --ids 1,2 --backend auto --out '%s/a.st' 2>'%s/a.err'", bin,
             dir, root, root);
    bad |= sh(cmd) != 0;
    snprintf(cmd, sizeof cmd, "grep -q 'backend: cpu (auto' '%s/a.err'", root);
    bad |= sh(cmd) != 0;
    snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' --prompt x --backend tpu 2>/dev/null", bin, dir);
    bad |= sh(cmd) != 2;
    mmoe_test_rmtree(root);
    if (bad)
        fprintf(stderr, "gpu_forward: the CPU-only behaviour of --backend is wrong\n");
    return bad;
}

static Suite *gpu_forward_suite(void)
{
    Suite *s = suite_create("gpu_forward");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {{"refuse", test_refuses},         {"sublayers", test_sublayers},
                 {"tiny", test_tiny_fixture},      {"layers", test_synth_layers},
                 {"long", test_synth_long},        {"flash", test_synth_flash},
                 {"cli_logits", test_cli_logits},  {"cli_generate", test_cli_generate},
                 {"cuda_graph", test_cuda_graph}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_tags(tc, cases[i].name); /* CK_RUN_CASE / CK_EXCLUDE_TAGS select cases */
        tcase_set_timeout(tc, 1200);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    if (!have_gpu()) {
        if (check_refusal_without_gpu() != 0)
            return 1;
        fprintf(stderr, "gpu_forward: no CUDA device (or no CUDA in this build): --backend refusals checked, "
                        "the GPU cases skipped\n");
        return MMOE_TEST_SKIP;
    }
    /* CUDA state does not survive fork(): run the tests in this process */
    setenv("CK_FORK", "no", 1);
    setvbuf(stderr, NULL, _IONBF, 0);
    g_seed = mmoe_test_seed("gpu_forward");
    return mmoe_test_run(gpu_forward_suite());
}
