/**
 * @file cmd_bench_forward.c
 * @brief `megamoe bench forward`: prefill tokens/s, decode ms/token and the layer-by-layer split of the CPU oracle.
 *
 *     megamoe bench forward --model DIR [--tokens 64] [--decode 8] [--seed S] [--backend cpu|gpu|auto]
 *
 * Prefills --tokens random token ids from position 0 (one call), then decodes --decode
 * more tokens one call each (greedy from the logits).  Reports the wall times, the
 * split per layer (attention, MoE, mHC) and per global part (embedding, head), the
 * resident-set peak (getrusage) against the checkpoint's tensor bytes and the KV-cache
 * bytes.  The weights are mmapped, so the RSS counts only the pages actually touched.
 *
 * With the GPU (mmoe_gpu_forward.h) the totals come from a run without synchronization
 * between the parts (after one untimed warm-up run of the same tokens, so that the kernels
 * are loaded), and the split from a second run that synchronizes the device around each
 * part (which adds a few microseconds per part).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "mmoe_cli.h"
#include "mmoe_clock.h"
#include "mmoe_fwd_backend.h"
#include "mmoe_model.h"
#include "mmoe_rng.h"

/** Print the usage text to @p out. */
static void usage(FILE *out)
{
    fprintf(out, "usage: megamoe bench forward --model DIR [--tokens N] [--decode K] [--seed S] [--backend B]\n"
                 "  Prefill N random tokens (default 64), then decode K tokens one by one (default 8);\n"
                 "  prints prefill tokens/s, decode ms/token, the per-layer split and peak RSS.\n"
                 "  --backend cpu (default), gpu or auto (the GPU when there is one)\n");
}

/** Progress line on stderr. */
static void progress(void *ctx, int done, int total, const char *what)
{
    (void)ctx;
    fprintf(stderr, "\rloading: %d/%d layers (%s)%s", done, total, what, done == total ? "\n" : "   ");
}

/** Print one phase's split: per layer attention / MoE / mHC seconds (differences of two snapshots). */
static void print_split(const char *phase, const mmoe_model_timings *a, const double *a0, const double *m0,
                        const double *h0, double e0, double hd0, double total)
{
    printf("%s split (seconds; %% of %.3f s):\n", phase, total);
    printf("  %-8s %10s %10s %10s\n", "layer", "attention", "moe", "mhc");
    for (int L = 0; L < a->n_layers; L++) {
        double at = a->attn_s[L] - a0[L], mo = a->moe_s[L] - m0[L], hc = a->mhc_s[L] - h0[L];
        if (at == 0 && mo == 0 && hc == 0)
            continue;
        printf("  %-8d %10.4f %10.4f %10.4f\n", L, at, mo, hc);
    }
    double sa = 0, sm = 0, sh = 0;
    for (int L = 0; L < a->n_layers; L++) {
        sa += a->attn_s[L] - a0[L];
        sm += a->moe_s[L] - m0[L];
        sh += a->mhc_s[L] - h0[L];
    }
    double t = total > 0 ? total : 1;
    printf("  total: attention %.4f (%.0f%%), moe %.4f (%.0f%%), mhc %.4f (%.0f%%), embed %.4f, head %.4f (%.0f%%)\n",
           sa, 100 * sa / t, sm, 100 * sm / t, sh, 100 * sh / t, a->embed_s - e0, a->head_s - hd0,
           100 * (a->head_s - hd0) / t);
}

/** The greedy next token of @p logits. */
static int32_t greedy(const float *logits, int64_t V)
{
    int32_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best])
            best = (int32_t)v;
    return best;
}

/** The GPU model's timings in the CPU's struct (same fields). */
static void gpu_timings(const mmoe_gpu_model *g, mmoe_model_timings *tm)
{
    mmoe_gpu_model_timings gt;
    mmoe_gpu_model_timings_get(g, &gt);
    tm->n_layers = gt.n_layers;
    tm->attn_s = gt.attn_s;
    tm->moe_s = gt.moe_s;
    tm->mhc_s = gt.mhc_s;
    tm->embed_s = gt.embed_s;
    tm->head_s = gt.head_s;
}

/** One prefill of ids[0, n_prefill) and n_decode greedy steps on the GPU; the two wall times. */
static mmoe_status gpu_pass(mmoe_gpu_model *g, int32_t *ids, long n_prefill, long n_decode, int64_t V, float *logits,
                            double *t_prefill, double *t_decode, mmoe_error *err)
{
    mmoe_status st = mmoe_gpu_model_reset(g, err);
    double t0 = mmoe_clock_s();
    if (st == MMOE_OK)
        st = mmoe_gpu_model_forward(g, ids, n_prefill, logits, 1, NULL, err);
    *t_prefill = mmoe_clock_s() - t0;
    t0 = mmoe_clock_s();
    for (long i = 0; i < n_decode && st == MMOE_OK; i++) {
        ids[n_prefill + i] = greedy(logits, V);
        st = mmoe_gpu_model_forward(g, &ids[n_prefill + i], 1, logits, 1, NULL, err);
    }
    *t_decode = mmoe_clock_s() - t0;
    return st;
}

/** The GPU benchmark: warm-up, an unsynchronized pass for the totals, a synchronized pass for the split. */
static mmoe_status bench_gpu(mmoe_gpu_model *g, int32_t *ids, long n_prefill, long n_decode, int64_t V, float *logits,
                             mmoe_error *err)
{
    double tp, td, sp, sd;
    mmoe_status st = gpu_pass(g, ids, n_prefill, n_decode, V, logits, &tp, &td, err);
    if (st == MMOE_OK)
        st = gpu_pass(g, ids, n_prefill, n_decode, V, logits, &tp, &td, err);
    if (st != MMOE_OK)
        return st;
    mmoe_gpu_model_bytes b;
    mmoe_gpu_model_bytes_held(g, &b);
    printf("gpu: %.1f MiB on the device (weights %.1f, caches %.1f, work %.1f)\n", (double)b.total / 1048576.0,
           (double)b.weights / 1048576.0, (double)b.caches / 1048576.0, (double)b.work / 1048576.0);
    printf("prefill: %ld tokens in %.4f s = %.2f tokens/s\n", n_prefill, tp, (double)n_prefill / tp);
    if (n_decode > 0)
        printf("decode: %ld tokens in %.4f s = %.3f ms/token\n", n_decode, td, 1e3 * td / (double)n_decode);
    mmoe_gpu_model_set_timing(g, 1);
    st = gpu_pass(g, ids, n_prefill, 0, V, logits, &sp, &sd, err);
    if (st != MMOE_OK)
        return st;
    mmoe_model_timings tm;
    gpu_timings(g, &tm);
    const int nb = tm.n_layers;
    double *snap = calloc((size_t)(3 * nb), sizeof(double));
    if (!snap)
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
    print_split("prefill (synchronized per part)", &tm, snap, snap + nb, snap + 2 * nb, 0, 0, sp);
    memcpy(snap, tm.attn_s, sizeof(double) * (size_t)nb);
    memcpy(snap + nb, tm.moe_s, sizeof(double) * (size_t)nb);
    memcpy(snap + 2 * nb, tm.mhc_s, sizeof(double) * (size_t)nb);
    const double e0 = tm.embed_s, h0 = tm.head_s;
    double t0 = mmoe_clock_s();
    for (long i = 0; i < n_decode && st == MMOE_OK; i++) {
        ids[n_prefill + i] = greedy(logits, V);
        st = mmoe_gpu_model_forward(g, &ids[n_prefill + i], 1, logits, 1, NULL, err);
    }
    sd = mmoe_clock_s() - t0;
    if (st == MMOE_OK && n_decode > 0) {
        gpu_timings(g, &tm);
        print_split("decode (synchronized per part)", &tm, snap, snap + nb, snap + 2 * nb, e0, h0, sd);
    }
    free(snap);
    return st;
}

int mmoe_cmd_bench_forward(int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"tokens", required_argument, 0, 't'},
                                         {"decode", required_argument, 0, 'd'}, {"seed", required_argument, 0, 's'},
                                         {"backend", required_argument, 0, 'b'}, {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model_dir = NULL;
    long n_prefill = 64, n_decode = 8;
    unsigned long long seed = 1;
    mmoe_backend backend = MMOE_BACKEND_CPU;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': n_prefill = strtol(optarg, &end, 10); break;
        case 'd': n_decode = strtol(optarg, &end, 10); break;
        case 's': seed = strtoull(optarg, &end, 10); break;
        case 'b':
            if (mmoe_backend_parse(optarg, &backend) != 0) {
                fprintf(stderr, "megamoe bench forward: --backend '%s': expected cpu, gpu or auto\n", optarg);
                return MMOE_EXIT_USAGE;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return MMOE_EXIT_USAGE;
        }
        if (end && (*end || end == optarg)) {
            fprintf(stderr, "megamoe bench forward: '%s' is not a number\n", optarg);
            return MMOE_EXIT_USAGE;
        }
    }
    if (!model_dir || optind != argc || n_prefill < 1 || n_decode < 0 || n_prefill > 1000000 || n_decode > 100000) {
        fprintf(stderr, "megamoe bench forward: --model is required; --tokens >= 1, --decode >= 0\n");
        usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_model *m = NULL;
    mmoe_model_state *s = NULL;
    mmoe_gpu_model *gpu = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    double *snap = NULL;
    int rc = 1;
    double t0 = mmoe_clock_s();
    mmoe_status st = mmoe_model_open(model_dir, progress, NULL, &m, &err);
    if (st != MMOE_OK)
        goto done;
    double t_load = mmoe_clock_s() - t0;
    const mmoe_config *cfg = mmoe_model_config(m);
    const int64_t V = cfg->vocab_size, T = n_prefill + n_decode;
    if ((st = mmoe_model_state_create(m, T, &s, &err)) != MMOE_OK ||
        (st = mmoe_backend_open(backend, m, T, n_prefill, "megamoe bench forward", 0, &gpu, &err)) != MMOE_OK)
        goto done;
    ids = malloc(sizeof(int32_t) * (size_t)T);
    logits = malloc(sizeof(float) * (size_t)V);
    int nb = cfg->n_layers + cfg->n_mtp_layers;
    snap = calloc((size_t)(3 * nb), sizeof(double));
    if (!ids || !logits || !snap) {
        st = mmoe_error_set(&err, MMOE_ENOMEM, "out of memory");
        goto done;
    }
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed);
    for (int64_t i = 0; i < n_prefill; i++)
        ids[i] = (int32_t)mmoe_rng_below(&rng, (uint64_t)V);
    if (gpu) {
        printf("model %s: %d layers + %d MTP, D %lld, %d experts top-%d, weights %.2f GiB; backend gpu\n", model_dir,
               cfg->n_layers, cfg->n_mtp_layers, (long long)cfg->dim, cfg->n_routed_experts, cfg->n_activated_experts,
               (double)mmoe_model_weight_bytes(m) / (1u << 30));
        st = bench_gpu(gpu, ids, n_prefill, n_decode, V, logits, &err);
        rc = st == MMOE_OK ? 0 : 1;
        goto done;
    }
    t0 = mmoe_clock_s();
    st = mmoe_model_forward(m, s, ids, n_prefill, logits, 1, NULL, &err);
    double t_prefill = mmoe_clock_s() - t0;
    if (st != MMOE_OK)
        goto done;
    mmoe_model_timings tm;
    mmoe_model_state_timings(s, &tm);
    printf("model %s: %d layers + %d MTP, D %lld, %d experts top-%d, weights %.2f GiB\n", model_dir, cfg->n_layers,
           cfg->n_mtp_layers, (long long)cfg->dim, cfg->n_routed_experts, cfg->n_activated_experts,
           (double)mmoe_model_weight_bytes(m) / (1u << 30));
    printf("load (mmap + checks): %.3f s\n", t_load);
    printf("prefill: %ld tokens in %.3f s = %.2f tokens/s\n", n_prefill, t_prefill, (double)n_prefill / t_prefill);
    double *a0 = snap, *m0 = snap + nb, *h0 = snap + 2 * nb;
    print_split("prefill", &tm, a0, m0, h0, 0, 0, t_prefill);
    memcpy(a0, tm.attn_s, sizeof(double) * (size_t)nb);
    memcpy(m0, tm.moe_s, sizeof(double) * (size_t)nb);
    memcpy(h0, tm.mhc_s, sizeof(double) * (size_t)nb);
    double e0 = tm.embed_s, hd0 = tm.head_s;
    t0 = mmoe_clock_s();
    for (long i = 0; i < n_decode && st == MMOE_OK; i++) {
        int32_t best = 0; /* greedy next token */
        for (int64_t v = 1; v < V; v++)
            if (logits[v] > logits[best])
                best = (int32_t)v;
        ids[n_prefill + i] = best;
        st = mmoe_model_forward(m, s, &ids[n_prefill + i], 1, logits, 1, NULL, &err);
    }
    double t_decode = mmoe_clock_s() - t0;
    if (st != MMOE_OK)
        goto done;
    if (n_decode > 0) {
        printf("decode: %ld tokens in %.3f s = %.2f ms/token\n", n_decode, t_decode, 1e3 * t_decode / (double)n_decode);
        mmoe_model_state_timings(s, &tm);
        print_split("decode", &tm, a0, m0, h0, e0, hd0, t_decode);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("memory: peak RSS %.1f MiB, checkpoint tensors %.1f MiB (ratio %.2f), KV caches %.1f MiB\n",
           (double)ru.ru_maxrss / 1024.0, (double)mmoe_model_weight_bytes(m) / (1 << 20),
           (double)ru.ru_maxrss * 1024.0 / (double)mmoe_model_weight_bytes(m),
           (double)mmoe_model_state_bytes(s) / (1 << 20));
    rc = 0;
done:
    if (st != MMOE_OK)
        fprintf(stderr, "megamoe bench forward: %s\n", err.msg);
    free(ids);
    free(logits);
    free(snap);
    mmoe_gpu_model_destroy(gpu);
    mmoe_model_state_destroy(s);
    mmoe_model_close(m);
    return rc;
}
