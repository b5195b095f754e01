/**
 * @file cmd_bench_moe.c
 * @brief `megamoe bench moe`: time the MoE layer and compare its GEMM rate with OpenBLAS SGEMM.
 *
 *     megamoe bench moe --shape v4-flash --experts 32 --tokens 1,8,64 --backend cpu
 *                       [--reps N] [--recipe R] [--shared M] [--pad-to N] [--seed S] [--threads N] [--json]
 *
 * --tokens is the list of token counts T to time.  The layer has the shape's D, I and top-k,
 * and --experts routed experts (default 32, not a full model's 256 or 384, to keep the
 * setup short): the header line prints the shape as run, with E and what the full shape has.
 *
 * For each token count T: a synthetic layer of the shape (quantized normals) and a random
 * input; one warm-up call, then N timed calls; the median wall time of the whole call.
 * The layer's rate is its GEMM FLOPs (2 M N K over every expert GEMM it ran) divided by the
 * median *whole-call* time, so routing, quantization, dequantization and the epilogue all
 * count against it.
 *
 * The yardstick, measured in the same run: OpenBLAS SGEMM on exactly the same GEMM shapes
 * (the same per-expert token counts M, the same N and K, hence the same FLOP count) with
 * weights that are already FP32 (one expert's weights, dequantized once before timing, reused
 * for every expert: the same bytes per GEMM as a real FP32 layer would stream).  The ratio
 * layer / SGEMM is what "dequantization must not dominate" measures: 1.0 means the FP4 layer
 * is as fast as if its weights had been FP32 to begin with.
 *
 * With --json the table becomes JSON Lines on stdout (mmoe_json_report.h), one object per
 * token count: {"bench": "moe", "backend": "cpu", "shape", "experts", "tokens", "reps",
 * "median_ms", "tflops", "peer": "openblas-sgemm", "peer_median_ms", "peer_tflops",
 * "ratio_to_peer", "gemm_flops", "routed_pairs", "active_experts", "dequant_ms", "gemm_ms",
 * "recipe", "shared_path", "fallback_reason"}; ratio_to_peer = peer_median_ms / median_ms
 * (above 1: faster than the peer), the table's "ratio".
 *
 * Any fallback of the shared expert is printed.  `--backend gpu` runs the GPU benchmark
 * (bench_moe_gpu.c) with the PyTorch peer measured in the same run; `--gpus N` / `--ep-ranks N`
 * the expert-parallel layer (bench_moe_ep.c).
 */
#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_moe_gpu.h"
#include "cli_ep.h"
#include "mmoe_cli.h"
#include "mmoe_clock.h"
#include "mmoe_formats.h"
#include "mmoe_json_report.h"
#include "mmoe_moe_synth.h"

/** Most token counts in one --tokens list. */
#define BENCH_MAX_T 32
/** Largest token count in --tokens. */
#define BENCH_MAX_TOKENS (INT64_C(1) << 20)

/** qsort comparator of doubles. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/** Median of @p n values (sorts them). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/** Experts of the layer when --experts is not given (a full model's 256/384 take long to set up). */
#define BENCH_DEFAULT_EXPERTS 32

/** Print the usage. */
static void bench_usage(FILE *out)
{
    fprintf(out, "usage: megamoe bench moe [options]\n\n"
                 "Time the MoE layer (CPU oracle) against OpenBLAS SGEMM on the same GEMM shapes\n"
                 "(--backend gpu: the GPU layer against PyTorch; see docs/perf.md).\n\n"
                 "  --shape S        v4-flash, v4-pro, v4.1-flash or tiny (default v4-flash)\n"
                 "  --experts N      routed experts of the layer (default %d, or all of a shape with fewer;\n"
                 "                   the full shape's count is printed next to it)\n"
                 "  --tokens LIST    token counts to time, comma-separated, each 0..%lld (default 1,8,64)\n"
                 "  --reps N         timed calls per token count, 1..100000 (default 5; the median is shown)\n"
                 "  --backend B      cpu or gpu (default cpu)\n"
                 "  --recipe R       sm100, sm90 or dsv4-ref (default sm100)\n"
                 "  --shared M       auto, fused or serial (default auto)\n"
                 "  --pad-to N       pad the intermediate width to a multiple of N (multiple of 128; default 0)\n"
                 "  --seed S         RNG seed of weights and inputs (default 1)\n"
                 "  --threads N      OpenBLAS and dequantization threads, 1..%d (default: their own defaults)\n"
                 "  --json           one JSON object per token count on stdout instead of the table\n"
                 "                   (default: the table)\n\n"
                 "example:\n"
                 "  megamoe bench moe --shape v4-flash --experts 32 --tokens 1,8,64 --reps 5\n",
            BENCH_DEFAULT_EXPERTS, (long long)BENCH_MAX_TOKENS, MMOE_CLI_MAX_THREADS);
}

/** Dequantize an FP4 expert matrix [n, k] to FP32 with the format library. */
static float *dequant_fp4(const mmoe_tensor *w, const mmoe_tensor *sf)
{
    const int64_t n = w->shape[0], k = 2 * w->shape[1];
    float *out = malloc((size_t)(n * k) * sizeof(float));
    if (out == NULL)
        return NULL;
    for (int64_t r = 0; r < n; r++)
        mmoe_dequant_row_mxfp4((const uint8_t *)w->data + r * (k / 2), (const uint8_t *)sf->data + r * (k / 32),
                               (size_t)k, out + r * k, NULL);
    return out;
}

/** The same GEMMs as the layer's call, on FP32 weights; returns the time. */
static double sgemm_same_shapes(const mmoe_moe_desc *d, const int64_t *counts, int64_t t, int shared,
                                const float *w13, const float *w2, const float *a, float *c)
{
    const int D = (int)d->hidden, n_inter = (int)d->inter;
    double t0 = mmoe_clock_s();
    for (int64_t e = 0; e <= d->n_experts; e++) {
        int m = e < d->n_experts ? (int)counts[e] : (shared ? (int)t : 0);
        if (m == 0)
            continue;
        for (int g = 0; g < 2; g++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n_inter, D, 1.0f, a, D, w13, D, 0.0f, c, n_inter);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, D, n_inter, 1.0f, c, n_inter, w2, n_inter, 0.0f, c, D);
    }
    return mmoe_clock_s() - t0;
}

/** The JSON Lines row of one token count (--json). */
static int print_json_row(const mmoe_moe_desc *d, const char *shape, int64_t t, int reps, double flops, double tl,
                          double ts, const mmoe_moe_result *res, double dq_ms, double gemm_ms)
{
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("moe"));
    json_object_set_new(o, "backend", json_string("cpu"));
    mmoe_json_set_str(o, "shape", shape);
    mmoe_json_set_int(o, "experts", d->n_experts);
    mmoe_json_set_int(o, "tokens", t);
    mmoe_json_set_int(o, "reps", reps);
    mmoe_json_set_real(o, "median_ms", 1e3 * tl);
    mmoe_json_set_real(o, "tflops", flops / tl * 1e-12);
    json_object_set_new(o, "peer", json_string("openblas-sgemm"));
    mmoe_json_set_real(o, "peer_median_ms", 1e3 * ts);
    mmoe_json_set_real(o, "peer_tflops", flops / ts * 1e-12);
    mmoe_json_set_real(o, "ratio_to_peer", ts / tl);
    mmoe_json_set_real(o, "gemm_flops", flops);
    mmoe_json_set_int(o, "routed_pairs", res->routed_pairs);
    mmoe_json_set_int(o, "active_experts", res->active_experts);
    mmoe_json_set_real(o, "dequant_ms", dq_ms);
    mmoe_json_set_real(o, "gemm_ms", gemm_ms);
    mmoe_json_set_str(o, "recipe", mmoe_moe_recipe_name(d->recipe));
    mmoe_json_set_str(o, "shared_path", mmoe_moe_path_name(res->shared_path));
    mmoe_json_set_str(o, "fallback_reason", res->shared_path == MMOE_PATH_SERIAL ? res->fallback_reason : NULL);
    mmoe_error err;
    if (mmoe_json_print_line(stdout, o, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe bench moe: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/** Time the layer and the SGEMM yardstick at one token count; print one row (a JSON line with @p json). */
static int bench_one(const mmoe_moe_desc *d, mmoe_moe_layer *layer, const mmoe_moe_synth *s, int64_t t, int reps,
                     uint64_t seed, const float *w13, const float *w2, const char *shape, int json)
{
    mmoe_error err;
    const int64_t D = d->hidden;
    uint16_t *x = malloc((size_t)(t * D) * 2), *y = malloc((size_t)(t * D) * 2);
    int64_t *counts = calloc((size_t)d->n_experts, sizeof(int64_t));
    double *times = malloc((size_t)(reps + 1) * sizeof(double)), *ref = malloc((size_t)(reps + 1) * sizeof(double));
    size_t wide = (size_t)t * (size_t)(D > d->inter ? D : d->inter);
    float *a = malloc(wide * sizeof(float)), *c = malloc(wide * sizeof(float));
    int rc = 1;
    if (x == NULL || y == NULL || counts == NULL || times == NULL || ref == NULL || a == NULL || c == NULL) {
        fprintf(stderr, "megamoe bench moe: out of memory\n");
        goto done;
    }
    (void)s;
    mmoe_moe_synth_input(d, t, seed + (uint64_t)t, MMOE_SYNTH_NORMAL, x, NULL);
    for (size_t i = 0; i < wide; i++)
        a[i] = 0.01f * (float)((int)(i % 17) - 8);
    mmoe_moe_input in = {t, x, NULL, NULL, NULL};
    mmoe_moe_output out = {y, NULL, NULL};
    mmoe_moe_result res;
    mmoe_moe_result_init(&res);
    res.expert_recv_stats = counts;
    if (mmoe_moe_layer_run(layer, &in, &out, &res, &err) != MMOE_OK) { /* warm-up; its counts size the reference */
        fprintf(stderr, "megamoe bench moe: %s\n", err.msg);
        goto done;
    }
    const int shared = res.shared_path != MMOE_PATH_NONE;
    double flops = res.gemm_flops, dq = 0, gm = 0;
    sgemm_same_shapes(d, counts, t, shared, w13, w2, a, c); /* warm-up */
    for (int r = 0; r < reps; r++) {
        mmoe_moe_result rr;
        mmoe_moe_result_init(&rr);
        if (mmoe_moe_layer_run(layer, &in, &out, &rr, &err) != MMOE_OK) {
            fprintf(stderr, "megamoe bench moe: %s\n", err.msg);
            goto done;
        }
        times[r] = rr.time.total_s;
        dq += rr.time.dequant_s;
        gm += rr.time.gemm_s;
        ref[r] = sgemm_same_shapes(d, counts, t, shared, w13, w2, a, c);
    }
    double tl = median(times, reps), ts = median(ref, reps);
    if (json) {
        rc = print_json_row(d, shape, t, reps, flops, tl, ts, &res, 1e3 * dq / reps, 1e3 * gm / reps);
        goto done;
    }
    printf("%6lld %8lld %7lld %10.3f %9.2f %10.3f %9.2f %7.2f %10.3f %9.3f  %s%s%s\n", (long long)t,
           (long long)res.routed_pairs, (long long)res.active_experts, 1e3 * tl, flops / tl * 1e-9, 1e3 * ts,
           flops / ts * 1e-9, ts / tl, 1e3 * dq / reps, 1e3 * gm / reps, mmoe_moe_path_name(res.shared_path),
           res.shared_path == MMOE_PATH_SERIAL ? " fallback: " : "",
           res.shared_path == MMOE_PATH_SERIAL ? res.fallback_reason : "");
    rc = 0;
done:
    free(x);
    free(y);
    free(counts);
    free(times);
    free(ref);
    free(a);
    free(c);
    return rc;
}

/**
 * `--backend gpu` goes to the GPU benchmark (src/cli/bench_moe_gpu.c, which measures the
 * PyTorch peer in the same run): hand it the arguments without the --backend option.
 * Returns -1 when the arguments do not ask for the GPU.
 */
static int delegate_gpu(int argc, char **argv)
{
    int want_gpu = 0;
    for (int i = 1; i < argc; i++)
        if ((strcmp(argv[i], "--backend") == 0 && i + 1 < argc && strcmp(argv[i + 1], "gpu") == 0) ||
            strcmp(argv[i], "--backend=gpu") == 0)
            want_gpu = 1;
    if (!want_gpu)
        return -1;
    char **rest = malloc((size_t)(argc + 1) * sizeof *rest);
    if (rest == NULL) {
        fprintf(stderr, "megamoe bench moe: out of memory\n");
        return 1;
    }
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
            i++;
            continue;
        }
        if (i > 0 && strncmp(argv[i], "--backend=", 10) == 0)
            continue;
        rest[n++] = argv[i];
    }
    rest[n] = NULL;
    optind = 1;
    int rc = mmoe_bench_moe_gpu(n, rest);
    free(rest);
    return rc == 77 ? 1 : rc; /* 77 (no device) is the test driver's SKIP; the CLI fails */
}

int mmoe_cmd_bench_moe(int argc, char **argv)
{
    int ep_rc = mmoe_bench_moe_ep(argc, argv);
    if (ep_rc >= 0)
        return ep_rc;
    int gpu_rc = delegate_gpu(argc, argv);
    if (gpu_rc >= 0)
        return gpu_rc;
    enum { O_THREADS = 256 };
    static const struct option longopts[] = {
        {"shape", required_argument, 0, 'S'}, {"experts", required_argument, 0, 'e'},
        {"tokens", required_argument, 0, 't'}, {"reps", required_argument, 0, 'n'},
        {"backend", required_argument, 0, 'b'}, {"recipe", required_argument, 0, 'r'},
        {"shared", required_argument, 0, 's'}, {"pad-to", required_argument, 0, 'p'},
        {"seed", required_argument, 0, 'x'}, {"threads", required_argument, 0, O_THREADS},
        {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *cmd = "bench moe", *shape = "v4-flash", *tokens = "1,8,64", *backend = "cpu", *recipe = NULL,
               *shared = NULL;
    int64_t experts = 0, pad_to = 0; /* 0: BENCH_DEFAULT_EXPERTS, or all of a smaller shape's */
    int reps = 5, threads = 0, c, rc = 0, json = 0;
    uint64_t seed = 1;
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'S': shape = optarg; break;
        case 'e': rc = mmoe_cli_opt_i64(cmd, "experts", optarg, 1, 1 << 16, &experts); break;
        case 't': tokens = optarg; break;
        case 'n': rc = mmoe_cli_opt_int(cmd, "reps", optarg, 1, 100000, &reps); break;
        case 'b': backend = optarg; break;
        case 'r': recipe = optarg; break;
        case 's': shared = optarg; break;
        case 'p':
            if ((rc = mmoe_cli_opt_i64(cmd, "pad-to", optarg, 0, INT64_C(1) << 40, &pad_to)) == 0 && pad_to % 128) {
                fprintf(stderr, "megamoe bench moe: --pad-to: expected a multiple of 128, got '%s'\n", optarg);
                rc = MMOE_EXIT_USAGE;
            }
            break;
        case 'x': rc = mmoe_cli_opt_u64(cmd, "seed", optarg, 0, UINT64_MAX, &seed); break;
        case O_THREADS: rc = mmoe_cli_opt_int(cmd, "threads", optarg, 1, MMOE_CLI_MAX_THREADS, &threads); break;
        case 'j': json = 1; break;
        case 'h': bench_usage(stdout); return 0;
        default: bench_usage(stderr); return MMOE_EXIT_USAGE;
        }
    }
    if (rc != 0)
        return rc;
    if (optind < argc) {
        fprintf(stderr, "megamoe bench moe: unexpected argument '%s'\n", argv[optind]);
        return MMOE_EXIT_USAGE;
    }
    if (strcmp(backend, "cpu") != 0) {
        fprintf(stderr, "megamoe bench moe: --backend: expected cpu or gpu, got '%s'\n", backend);
        return MMOE_EXIT_USAGE;
    }
    int64_t *tv = NULL;
    size_t nt = 0;
    if ((rc = mmoe_cli_opt_i64_list(cmd, "tokens", tokens, 0, BENCH_MAX_TOKENS, BENCH_MAX_T, &tv, &nt)) != 0)
        return rc;
    mmoe_cli_set_threads(threads);
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_moe_desc d;
    mmoe_moe_desc full;
    mmoe_status st = mmoe_moe_desc_from_shape(shape, 0, &full, &err);
    if (st == MMOE_OK && experts == 0)
        experts = full.n_experts < BENCH_DEFAULT_EXPERTS ? full.n_experts : BENCH_DEFAULT_EXPERTS;
    if (st == MMOE_OK)
        st = mmoe_moe_desc_from_shape(shape, experts, &d, &err);
    if (st == MMOE_OK && recipe != NULL)
        st = mmoe_moe_recipe_from_name(recipe, &d.recipe, &err);
    if (st == MMOE_OK && shared != NULL)
        st = mmoe_moe_shared_mode_from_name(shared, &d.shared_mode, &err);
    d.pad_to = pad_to;
    mmoe_moe_synth *s = NULL;
    mmoe_moe_layer *layer = NULL;
    double t0 = mmoe_clock_s();
    if (st == MMOE_OK)
        st = mmoe_moe_synth_create(&d, seed, MMOE_SYNTH_NORMAL, &s, &err);
    if (st == MMOE_OK)
        st = mmoe_moe_layer_create(&d, &layer, &err);
    if (st == MMOE_OK)
        st = mmoe_moe_layer_set_weights(layer, mmoe_moe_synth_weights(s), &err);
    float *w13 = NULL, *w2 = NULL;
    if (st == MMOE_OK) {
        const mmoe_moe_expert_weights *x0 = &mmoe_moe_synth_weights(s)->experts[0];
        w13 = dequant_fp4(&x0->w1, &x0->w1_scale);
        w2 = dequant_fp4(&x0->w2, &x0->w2_scale);
        if (w13 == NULL || w2 == NULL)
            st = mmoe_error_set(&err, MMOE_ENOMEM, "out of memory for the FP32 reference weights");
    }
    if (st == MMOE_OK && json) {
        for (size_t i = 0; i < nt && rc == 0; i++)
            rc = bench_one(&d, layer, s, tv[i], reps, seed, w13, w2, shape, 1);
    } else if (st == MMOE_OK) {
        printf("bench moe: shape %s with %lld of its %lld routed experts (--experts), D %lld, I %lld, topk %d, "
               "recipe %s, shared %s, pad-to %lld, reps %d, OpenBLAS %s x%d threads (setup %.1f s)\n",
               shape, (long long)d.n_experts, (long long)full.n_experts, (long long)d.hidden, (long long)d.inter,
               d.topk, mmoe_moe_recipe_name(d.recipe), mmoe_moe_shared_mode_name(d.shared_mode), (long long)pad_to,
               reps, openblas_get_corename(), openblas_get_num_threads(), mmoe_clock_s() - t0);
        printf("     T    pairs  active   layer_ms  layer_GF   sgemm_ms  sgemm_GF   ratio dequant_ms   gemm_ms  shared\n");
        for (size_t i = 0; i < nt && rc == 0; i++)
            rc = bench_one(&d, layer, s, tv[i], reps, seed, w13, w2, shape, 0);
        printf("ratio = SGEMM time / layer time for the same GEMM FLOPs (target at T=64: >= 0.5); "
               "dequant_ms / gemm_ms: mean per call inside the layer\n");
    } else {
        fprintf(stderr, "megamoe bench moe: %s\n", err.msg);
        rc = 1;
    }
    free(tv);
    free(w13);
    free(w2);
    mmoe_moe_layer_destroy(layer);
    mmoe_moe_synth_destroy(s);
    return rc;
}
