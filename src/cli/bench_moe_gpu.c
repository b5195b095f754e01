/**
 * @file bench_moe_gpu.c
 * @brief The GPU layer's benchmark (`megamoe bench moe --backend gpu`) and its PyTorch peer.
 *
 * For each token count T the benchmark draws inputs on the host (x ~ N(0,1)
 * in BF16; top-6 distinct experts uniform at random, weights uniform), builds
 * the layer once with random weights drawn on the device (a full V4-Flash
 * layer is 3.4 GB of MXFP4; uploading it from the host would only slow the
 * benchmark down), and times mmoe_gpu_moe_time(): one call captured into a
 * CUDA graph, warm-up replays, then many replays each between two CUDA events;
 * the median is reported.
 *
 * Work and bytes are counted as the issue defines them:
 *   FLOP  = 42 * D * I per token: 6 routed + 1 shared expert, 3 matrices,
 *           2 FLOP per multiply-add (masked slots: none here);
 *   bytes = weight bytes of the distinct routed experts the call touches
 *           (E2M1 codes 3*D*I/2 + UE8M0 scales 3*D*I/32) + the shared expert
 *           (E4M3 3*D*S*I + its scales).
 * The peer (bench/torch_peer.py) receives the same x, topk_idx and topk_w
 * through files in a temporary directory, measures the two ceilings (copy
 * bandwidth, dense FP8 rate) and times its variants; the fastest variant per T
 * is "the peer".  After it, one table (or, with --json, one JSON object per
 * line and T) gives per T: our median, TFLOP/s, GB/s of weights, the peer's
 * median and variant, the ratio ours / peer (below 1: we are faster; the JSON
 * key ratio_to_peer is peer / ours, as in the CPU bench), and the
 * speed of light: max(weight bytes / copy bandwidth, FLOP / FP8 rate).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_moe_gpu.h"
#include "mmoe_cli.h"
#include "mmoe_formats.h"
#include "mmoe_gpu_moe.h"
#include "mmoe_rng.h"

/** Most token counts in one run. */
#define BENCH_MAX_T 64

/** A named layer shape. */
typedef struct bench_shape {
    const char *name; /**< --shape name */
    int D;            /**< hidden */
    int I;            /**< routed width */
    int E;            /**< routed experts */
    int topk;         /**< slots per token */
    int SI;           /**< shared width */
} bench_shape;

/** The layer shapes of the V4 configurations (@ref spec_arch). */
static const bench_shape shapes[] = {
    {"v4-flash", 4096, 2048, 256, 6, 2048},
    {"v4.1-flash", 5120, 2304, 384, 6, 2304},
    {"v4-pro", 7168, 3072, 384, 6, 3072},
    {"tiny", 256, 256, 8, 2, 256},
};

/** Write the inputs of one T for the peer: x.bf16, idx.i32, w.f32 in @p dir. */
static int dump_inputs(const char *dir, int T, int D, int K, const uint16_t *x, const int32_t *idx, const float *w)
{
    char path[512];
    struct { const char *name; const void *p; size_t n; } f[3] = {
        {"x", x, (size_t)T * D * 2}, {"idx", idx, (size_t)T * K * 4}, {"w", w, (size_t)T * K * 4}};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s_%d.bin", dir, f[i].name, T);
        FILE *fp = fopen(path, "wb");
        if (fp == NULL)
            return -1;
        size_t wrote = fwrite(f[i].p, 1, f[i].n, fp);
        if (fclose(fp) != 0 || wrote != f[i].n)
            return -1;
    }
    return 0;
}

/** The options of one benchmark run. */
typedef struct bench_opts {
    const bench_shape *shape; /**< layer shape */
    int experts;              /**< routed experts (0: the shape's) */
    int Ts[BENCH_MAX_T];      /**< token counts */
    int nT;                   /**< how many */
    const char *tokens_s;     /**< the same as given (for the peer) */
    int iters;                /**< timed calls per point */
    int block_m;              /**< forced tile height, 0: auto */
    unsigned long long seed;  /**< input seed */
    mmoe_gpu_recipe recipe;   /**< activation formats */
    mmoe_gpu_gemm gemm;       /**< GEMM kernel family */
    const char *peer;         /**< peer script, "none", or NULL (default) */
    int json;                 /**< 1: JSON lines on stdout, the table on stderr */
} bench_opts;

/** What one token count measured. */
typedef struct bench_point {
    int T;                    /**< tokens */
    double us, min_us;        /**< our median and minimum */
    /** @var bench_point::us
     *  our median (microseconds) */
    double weight_bytes;      /**< weight bytes the call must read (touched experts + shared) */
    int touched;              /**< distinct routed experts */
    int block_m;              /**< tile height that ran */
    mmoe_gpu_gemm gemm;       /**< GEMM kernel family that ran */
    int decode_launches;      /**< decode16: kernel launches of a call (3 fused, 5), else 0 */
    double peer_us;           /**< the fastest peer variant's median, < 0: none */
    const char *peer_name;    /**< its name */
} bench_point;

/** The peer's ceilings and weight bytes. */
typedef struct bench_ceilings {
    double copy_gbps;         /**< device copy bandwidth, bytes read + written; 0: not measured */
    double fp8_tflops;        /**< dense FP8 GEMM rate; 0: not measured */
    double peer_fp8_bytes;    /**< the peer's FP8 weight bytes */
    double peer_bf16_bytes;   /**< the peer's BF16 weight bytes */
} bench_ceilings;

/** The usage text of bench moe --backend gpu. */
static const char *const usage_text =
    "usage: bench moe --backend gpu [--shape S] [--experts N] [--tokens LIST] [--iters N]\n"
    "       [--recipe sm90|sm100] [--block-m 16|64|128] [--gemm auto|mma|wgmma|decode16]\n"
    "       [--peer PATH|none] [--seed S] [--json]\n";

/** Parse the command line into @p o; 0, or 2 on a usage error (message on stderr). */
static int parse_opts(int argc, char **argv, bench_opts *o)
{
    const char *shape_name = "v4-flash", *tokens_s = "1,8,32,128,512,2048,8192";
    const char *cmd_name = "bench moe";
    memset(o, 0, sizeof *o);
    o->iters = 50;
    o->seed = 1234;
    o->recipe = MMOE_GPU_RECIPE_AUTO;
    o->gemm = MMOE_GPU_GEMM_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--backend") == 0 && v) {
            i++;
        } else if (strcmp(a, "--shape") == 0 && v) {
            shape_name = v, i++;
        } else if (strcmp(a, "--tokens") == 0 && v) {
            tokens_s = v, i++;
        } else if ((strcmp(a, "--iters") == 0 || strcmp(a, "--reps") == 0) && v) {
            if (mmoe_cli_opt_int(cmd_name, a + 2, v, 1, 1000000, &o->iters) != 0)
                return MMOE_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--block-m") == 0 && v) {
            if (mmoe_cli_opt_int(cmd_name, "block-m", v, 0, 1024, &o->block_m) != 0)
                return MMOE_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--gemm") == 0 && v) {
            if (mmoe_gpu_gemm_parse(v, &o->gemm) != 0) {
                fprintf(stderr, "megamoe bench moe: --gemm must be one of %s, got '%s'\n", mmoe_gpu_gemm_names(), v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--experts") == 0 && v) {
            if (mmoe_cli_opt_int(cmd_name, "experts", v, 1, 1 << 16, &o->experts) != 0)
                return MMOE_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--peer") == 0 && v) {
            o->peer = v, i++;
        } else if (strcmp(a, "--seed") == 0 && v) {
            uint64_t seed;
            if (mmoe_cli_opt_u64(cmd_name, "seed", v, 0, UINT64_MAX, &seed) != 0)
                return MMOE_EXIT_USAGE;
            o->seed = seed;
            i++;
        } else if (strcmp(a, "--shared") == 0 && v) {
            if (strcmp(v, "serial") == 0) {
                fprintf(stderr, "megamoe bench moe: the GPU layer has no serial shared path (--shared fused|auto)\n");
                return 2;
            }
            i++;
        } else if (strcmp(a, "--recipe") == 0 && v) {
            if (strcmp(v, "sm90") == 0)
                o->recipe = MMOE_GPU_RECIPE_SM90;
            else if (strcmp(v, "sm100") == 0)
                o->recipe = MMOE_GPU_RECIPE_SM100;
            else {
                fprintf(stderr, "megamoe bench moe: --recipe must be sm90 or sm100, got '%s'\n", v);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "megamoe bench moe: unknown or incomplete option '%s'\n%s", a, usage_text);
            return 2;
        }
    }
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shapes[i].name, shape_name) == 0)
            o->shape = &shapes[i];
    if (o->shape == NULL) {
        fprintf(stderr, "megamoe bench moe: unknown shape '%s' (v4-flash, v4.1-flash, v4-pro, tiny)\n", shape_name);
        return 2;
    }
    o->tokens_s = tokens_s;
    int64_t *tlist = NULL;
    size_t nlist = 0;
    if (mmoe_cli_opt_i64_list(cmd_name, "tokens", tokens_s, 1, 1 << 20, BENCH_MAX_T, &tlist, &nlist) != 0)
        return MMOE_EXIT_USAGE;
    o->nT = (int)nlist;
    for (int it = 0; it < o->nT; it++)
        o->Ts[it] = (int)tlist[it];
    free(tlist);
    return 0;
}

/**
 * The inputs of one token count: x ~ N(0,1) in BF16, top-k distinct experts uniform at random,
 * weights uniform in [0.1, 0.3); marks the experts touched.  0, or -1 out of memory.
 */
static int make_inputs(const bench_opts *o, const mmoe_gpu_moe_desc *d, int T, uint16_t **x, int32_t **idx,
                       float **w, int *touched)
{
    const int K = d->topk;
    mmoe_rng rng;
    mmoe_rng_seed(&rng, o->seed + (uint64_t)T);
    *x = malloc((size_t)T * d->hidden * 2);
    *idx = malloc((size_t)T * K * 4);
    *w = malloc((size_t)T * K * 4);
    char *mark = calloc((size_t)d->n_experts, 1);
    if (*x == NULL || *idx == NULL || *w == NULL || mark == NULL) {
        free(*x), free(*idx), free(*w), free(mark);
        *x = NULL, *idx = NULL, *w = NULL;
        return -1;
    }
    for (size_t i = 0; i < (size_t)T * d->hidden; i++)
        (*x)[i] = mmoe_bf16_from_f32((float)mmoe_rng_normal(&rng));
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e, again;
            do {
                e = (int)mmoe_rng_below(&rng, (uint64_t)d->n_experts);
                again = 0;
                for (int j = 0; j < k; j++)
                    again |= (*idx)[t * K + j] == e;
            } while (again);
            (*idx)[t * K + k] = e;
            (*w)[t * K + k] = (float)(0.1 + 0.2 * mmoe_rng_uniform(&rng));
            mark[e] = 1;
        }
    *touched = 0;
    for (int e = 0; e < d->n_experts; e++)
        *touched += mark[e];
    free(mark);
    return 0;
}

/** The peer script to run: --peer PATH, nothing for "none", else $MMOE_SRCDIR/bench/torch_peer.py if readable. */
static void peer_script(const char *peer, char *path, size_t size)
{
    path[0] = '\0';
    if (peer == NULL) {
        const char *src = getenv("MMOE_SRCDIR");
        snprintf(path, size, "%s/bench/torch_peer.py", src ? src : ".");
        if (access(path, R_OK) != 0)
            path[0] = '\0';
    } else if (strcmp(peer, "none") != 0) {
        snprintf(path, size, "%s", peer);
    }
}

/**
 * Run the peer on the inputs in @p dir and merge what it prints: the ceilings, its weight bytes,
 * and per T the fastest of its variants.  Lines it prints otherwise are echoed as comments to
 * @p log.
 */
static void run_peer(const char *script, const char *dir, const mmoe_gpu_moe_desc *d, const char *tokens_s,
                     int iters, bench_point *pts, int nT, bench_ceilings *c, FILE *log)
{
    const char *py = getenv("PYTHON3");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s --dir %s --D %d --I %d --E %d --topk %d --SI %d --tokens %s --iters %d 2>&1",
             py && *py ? py : "python3", script, dir, d->hidden, d->inter, d->n_experts, d->topk, d->shared_inter,
             tokens_s, iters);
    fflush(stdout);
    fflush(log);
    FILE *pp = popen(cmd, "r");
    char line[1024];
    fprintf(log, "# peer: %s\n", script);
    while (pp != NULL && fgets(line, sizeof line, pp) != NULL) {
        int T, graph = 0;
        double g, e, b, promoted;
        if (sscanf(line, "PEER T=%d fp8_grouped_us=%lf fp8_expert_us=%lf bf16_grouped_us=%lf graph=%d", &T, &g, &e,
                   &b, &graph) >= 4) {
            const double v[3] = {g, e, b};
            static const char *const names[3] = {"torch fp8 grouped", "torch fp8 per-expert", "torch bf16 grouped"};
            fprintf(log, "# peer T=%d: fp8 grouped %.1f us, fp8 per-expert %.1f us, bf16 grouped %.1f us%s\n", T, g,
                    e, b, graph ? " (CUDA graphs)" : " (not all graphed)");
            for (int it = 0; it < nT; it++)
                if (pts[it].T == T)
                    for (int k = 0; k < 3; k++)
                        if (v[k] > 0 && (pts[it].peer_us < 0 || v[k] < pts[it].peer_us)) {
                            pts[it].peer_us = v[k];
                            pts[it].peer_name = names[k];
                        }
        } else if (sscanf(line, "CEIL copy_gbps=%lf fp8_tflops=%lf fp8_tflops_promoted=%lf", &c->copy_gbps,
                          &c->fp8_tflops, &promoted) == 3) {
            fprintf(log, "# ceilings (measured now): copy %.0f GB/s (read + write), FP8 dense %.0f TFLOP/s "
                         "(%.0f with promoted accumulation)\n", c->copy_gbps, c->fp8_tflops, promoted);
        } else if (sscanf(line, "PEERBYTES fp8=%lf bf16=%lf", &c->peer_fp8_bytes, &c->peer_bf16_bytes) == 2) {
            fprintf(log, "# peer weight bytes: FP8 %.3f GB, BF16 %.3f GB\n", c->peer_fp8_bytes / 1e9,
                    c->peer_bf16_bytes / 1e9);
        } else {
            fprintf(log, "# peer says: %s", line);
        }
    }
    if (pp != NULL)
        pclose(pp);
}

/** FLOP of one call: 42 * D * I per token (6 routed + 1 shared expert, 3 matrices, 2 per MAC). */
static double call_flop(const mmoe_gpu_moe_desc *d, int T)
{
    return 42.0 * d->hidden * (double)d->inter * T;
}

/** Speed of light of one point in us: the larger of weight bytes / copy bandwidth and FLOP / FP8 rate. */
static double sol_us(const bench_point *p, const mmoe_gpu_moe_desc *d, const bench_ceilings *c)
{
    if (c->copy_gbps <= 0 || c->fp8_tflops <= 0)
        return NAN;
    const double t_bytes = p->weight_bytes / (c->copy_gbps * 1e9) * 1e6;
    const double t_flop = call_flop(d, p->T) / (c->fp8_tflops * 1e12) * 1e6;
    return t_bytes > t_flop ? t_bytes : t_flop;
}

/** The table of all points (ours, the peer, the speed of light) to @p f. */
static void print_table(FILE *f, const bench_point *pts, int nT, const mmoe_gpu_moe_desc *d, const bench_ceilings *c)
{
    fprintf(f, "%-6s %11s %11s %9s %9s %8s %8s %11s %9s %10s %6s  %s\n", "T", "ours us", "min us", "TFLOP/s", "GB/s w",
            "gemm", "block_m", "peer us", "ours/peer", "SOL us", "%SOL", "peer variant");
    for (int i = 0; i < nT; i++) {
        const bench_point *p = &pts[i];
        const double sol = sol_us(p, d, c);
        fprintf(f, "%-6d %11.1f %11.1f %9.1f %9.0f %8s %8d %11.1f %9.2f %10.1f %5.0f%%  %s\n", p->T, p->us, p->min_us,
                call_flop(d, p->T) / (p->us * 1e-6) / 1e12, p->weight_bytes / (p->us * 1e-6) / 1e9,
                mmoe_gpu_gemm_name(p->gemm), p->block_m,
                p->peer_us, p->peer_us > 0 ? p->us / p->peer_us : NAN, sol, 100.0 * sol / p->us,
                p->peer_us > 0 ? p->peer_name : "-");
    }
}

/** A double as JSON: null when not finite. */
static void json_num(FILE *f, const char *key, double v)
{
    if (isfinite(v))
        fprintf(f, ",\"%s\":%.6g", key, v);
    else
        fprintf(f, ",\"%s\":null", key);
}

/** One JSON object per line and point. */
static void print_json(FILE *f, const bench_point *pts, int nT, const bench_opts *o, const mmoe_gpu_moe_desc *d,
                       const bench_ceilings *c, const mmoe_gpu_moe_result *res)
{
    for (int i = 0; i < nT; i++) {
        const bench_point *p = &pts[i];
        const double sol = sol_us(p, d, c);
        fprintf(f, "{\"bench\":\"moe\",\"backend\":\"gpu\",\"shape\":\"%s\",\"tokens\":%d", o->shape->name, p->T);
        json_num(f, "median_ms", p->us / 1e3);
        json_num(f, "min_ms", p->min_us / 1e3);
        json_num(f, "tflops", call_flop(d, p->T) / (p->us * 1e-6) / 1e12);
        json_num(f, "weight_gbps", p->weight_bytes / (p->us * 1e-6) / 1e9);
        fprintf(f, ",\"peer\":\"%s\"", p->peer_us > 0 ? p->peer_name : "none");
        json_num(f, "peer_median_ms", p->peer_us > 0 ? p->peer_us / 1e3 : NAN);
        json_num(f, "ratio_to_peer", p->peer_us > 0 ? p->peer_us / p->us : NAN); /* as the CPU bench: > 1 is faster than the peer */
        json_num(f, "sol_ms", sol / 1e3);
        json_num(f, "weight_bytes", p->weight_bytes);
        json_num(f, "copy_gbps", c->copy_gbps > 0 ? c->copy_gbps : NAN);
        json_num(f, "fp8_dense_tflops", c->fp8_tflops > 0 ? c->fp8_tflops : NAN);
        json_num(f, "peer_weight_bytes", c->peer_fp8_bytes > 0 ? c->peer_fp8_bytes : NAN);
        json_num(f, "gpu_weight_bytes", (double)res->gpu_weight_bytes);
        json_num(f, "decode_launches", p->decode_launches > 0 ? p->decode_launches : NAN); /* null: tile families */
        fprintf(f, ",\"experts_touched\":%d,\"block_m\":%d,\"gemm\":\"%s\",\"recipe\":\"%s\",\"device_cc\":%d}\n",
                p->touched, p->block_m, mmoe_gpu_gemm_name(p->gemm), mmoe_gpu_recipe_name(res->recipe),
                res->device_cc);
    }
}

/** Write the points' inputs for the peer, then run it; the directory is removed after. */
static void peer_points(const bench_opts *o, const mmoe_gpu_moe_desc *d, bench_point *pts, bench_ceilings *c,
                        FILE *log)
{
    char script[1024];
    peer_script(o->peer, script, sizeof script);
    if (script[0] == '\0')
        return;
    char dir[] = "/tmp/mmoe-bench-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        fprintf(log, "# peer not run: cannot create a temporary directory\n");
        return;
    }
    int ok = 1;
    for (int it = 0; it < o->nT && ok; it++) {
        uint16_t *x;
        int32_t *idx;
        float *w;
        int touched;
        if (make_inputs(o, d, pts[it].T, &x, &idx, &w, &touched) != 0 ||
            dump_inputs(dir, pts[it].T, d->hidden, d->topk, x, idx, w) != 0)
            ok = 0;
        free(x), free(idx), free(w);
    }
    if (ok)
        run_peer(script, dir, d, o->tokens_s, o->iters, pts, o->nT, c, log);
    else
        fprintf(log, "# peer not run: could not write its inputs to %s\n", dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "megamoe bench moe: could not remove %s\n", dir);
}

/** Time the layer at every token count into @p pts; 0, or 1 on a run-time error. */
static int time_points(const bench_opts *o, mmoe_gpu_moe *L, const mmoe_gpu_moe_desc *d, bench_point *pts,
                       mmoe_gpu_moe_result *res, FILE *log)
{
    const double D = d->hidden, I = d->inter, SI = d->shared_inter;
    const double routed_bytes_per_expert = 3.0 * D * I / 2.0 + 3.0 * D * I / 32.0;
    const double shared_bytes = 3.0 * D * SI + 3.0 * D * SI / 32.0;
    for (int it = 0; it < o->nT; it++) {
        bench_point *p = &pts[it];
        p->T = o->Ts[it];
        p->peer_us = -1.0;
        uint16_t *x;
        int32_t *idx;
        float *w;
        if (make_inputs(o, d, p->T, &x, &idx, &w, &p->touched) != 0) {
            fprintf(stderr, "megamoe bench moe: out of memory\n");
            return 1;
        }
        mmoe_error err;
        const int n = p->T >= 2048 ? (o->iters + 3) / 4 : o->iters;
        const mmoe_status st = mmoe_gpu_moe_time(L, p->T, x, idx, w, 3, n, &p->us, &p->min_us, res, &err);
        free(x), free(idx), free(w);
        if (st != MMOE_OK) {
            fprintf(stderr, "megamoe bench moe: T=%d: %s\n", p->T, err.msg);
            return 1;
        }
        p->weight_bytes = p->touched * routed_bytes_per_expert + shared_bytes;
        p->block_m = res->block_m;
        p->gemm = res->gemm;
        p->decode_launches = res->decode_launches;
        fprintf(log, "T=%-5d  %10.1f us (min %.1f)  %7.1f TFLOP/s  %7.0f GB/s weights  block_m %d  experts touched %d%s%s\n",
                p->T, p->us, p->min_us, call_flop(d, p->T) / (p->us * 1e-6) / 1e12,
                p->weight_bytes / (p->us * 1e-6) / 1e9, p->block_m, p->touched,
                p->decode_launches == 3 ? "  3 launches (fused)" : p->decode_launches == 5 ? "  5 launches" : "",
                res->graph ? "" : "  (no CUDA graph)");
        fflush(log);
    }
    return 0;
}

int mmoe_bench_moe_gpu(int argc, char **argv)
{
    bench_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc != 0)
        return rc;
    FILE *log = o.json ? stderr : stdout;
    mmoe_error err;
    int cc = 0;
    if (mmoe_gpu_available(&cc, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe bench moe: %s\n", err.msg);
        return 77;
    }
    mmoe_gpu_moe_desc d;
    memset(&d, 0, sizeof d);
    d.hidden = o.shape->D;
    d.inter = o.shape->I;
    d.n_experts = o.experts > 0 ? o.experts : o.shape->E;
    d.topk = o.shape->topk;
    d.shared_inter = o.shape->SI;
    d.swiglu_limit = 10.0f;
    d.recipe = o.recipe;
    d.block_m = o.block_m;
    d.gemm = o.gemm;
    mmoe_gpu_moe *L = NULL;
    if (mmoe_gpu_moe_create(&d, NULL, o.seed, &L, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe bench moe: %s\n", err.msg);
        return 1;
    }
    fprintf(log, "# megamoe bench moe --backend gpu: shape %s (D %d, I %d, E %d, top-%d, shared %d), %d timed calls each\n",
            o.shape->name, d.hidden, d.inter, d.n_experts, d.topk, d.shared_inter, o.iters);
    bench_point pts[BENCH_MAX_T];
    memset(pts, 0, sizeof pts);
    mmoe_gpu_moe_result res;
    memset(&res, 0, sizeof res);
    rc = time_points(&o, L, &d, pts, &res, log);
    fprintf(log, "# device sm_%d, recipe %s, kernel of the last call: %s%s%s\n# GPU weight bytes %.3f GB, exact-path blocks L1 %lld L2 %lld\n",
            res.device_cc, mmoe_gpu_recipe_name(res.recipe), res.kernel ? res.kernel : "?",
            res.fallback ? "; FALLBACK: " : "", res.fallback_reason, (double)res.gpu_weight_bytes / 1e9,
            (long long)res.exact_path_blocks_l1, (long long)res.exact_path_blocks_l2);
    mmoe_gpu_moe_destroy(L); /* free the GPU for the peer */
    if (rc != 0)
        return rc;
    bench_ceilings c;
    memset(&c, 0, sizeof c);
    peer_points(&o, &d, pts, &c, log);
    print_table(log, pts, o.nT, &d, &c);
    if (o.json)
        print_json(stdout, pts, o.nT, &o, &d, &c, &res);
    return 0;
}
