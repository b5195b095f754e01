/**
 * @file cmd_bench_forward.c
 * @brief `megamoe bench forward`: prefill tokens/s, decode ms/token and the layer-by-layer split of the CPU oracle.
 *
 *     megamoe bench forward --model DIR [--prefill 64] [--decode 8] [--seed S] [--threads N] [--json] [--peer]
 *                           [--backend cpu|gpu|auto] [--cuda-graph on|off] [--gpus N [--gpu-memory GIB]]
 *
 * Prefills --prefill random token ids from position 0 (one call), then decodes --decode
 * more tokens one call each (greedy from the logits).  Reports the wall times, the
 * split per layer (attention, MoE, mHC) and per global part (embedding, head), the
 * resident-set peak (getrusage) against the checkpoint's tensor bytes and the KV-cache
 * bytes.  The weights are mmapped, so the RSS counts only the pages actually touched.
 *
 * With --json the report is one JSON object on stdout (mmoe_json_report.h): {"bench":
 * "forward", "backend": "cpu", "model", "layers", "load_s", "prefill_tokens", "prefill_s",
 * "prefill_tokens_per_s", "decode_tokens", "decode_s", "decode_ms_per_token",
 * "peak_rss_bytes", "weight_bytes", "kv_cache_bytes", "cuda_graph", "prefill_split",
 * "decode_split", "cpu_kernels", "worker_threads", "openblas_core", "openblas_threads"}; a split
 * is {"attention_s", "moe_s", "mhc_s", "embed_s", "head_s", "layers": [{"layer", "attention_s",
 * "moe_s", "mhc_s"}]}.
 *
 * With --peer (CPU only) the same step's matrix products also run as OpenBLAS SGEMM on FP32
 * weights (bench_forward_peer.c), after the oracle and after the peak RSS is read, on as many
 * OpenBLAS threads as the oracle has worker threads: the text gets a "peer" line, the JSON
 * "peer": "openblas-sgemm", "peer_threads", "peer_prefill_s", "peer_prefill_gflop",
 * "peer_decode_ms_per_token", "ratio_to_peer_prefill" and "ratio_to_peer_decode" (peer time /
 * the oracle's: above 1, the oracle is faster).
 *
 * With the GPU (mmoe_gpu_forward.h) the totals come from a run without synchronization
 * between the parts (after one untimed warm-up run of the same tokens, so that the kernels
 * are loaded), and the split from a second run that synchronizes the device around each
 * part (which adds a few microseconds per part).  Its JSON report has "backend": "gpu", the
 * same model, prefill and decode keys, "device_bytes", "cuda_graph" (true when every timed
 * decode step was one replay of the captured graph, `--cuda-graph on`), "cuda_graph_replays"
 * and the two synchronized splits.  The split run always launches kernel by kernel (a graph
 * has no points to synchronize between parts); "cuda_graph" is false for the CPU.  The GPU's
 * report also names the recipe of its FP8 linears, "fp8_linears" ("exact" or "tc",
 * MMOE_GPU_FP8_LINEARS).
 *
 * With --gpus N the GPU forward runs over N GPUs, expert parallel (cli_ep.h; planned and
 * refused before loading as `logits --gpus N` is); its report (bench_forward_ep.c) gives the
 * totals, the routed pairs of each GPU and each MoE sub-layer's exchange time, in text or JSON.
 */
#include <cblas.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli_ep.h"
#include "mmoe_cli.h"
#include "mmoe_sampler.h"
#include "mmoe_clock.h"
#include "mmoe_json_report.h"
#include "mmoe_fwd_backend.h"
#include "mmoe_model.h"
#include "mmoe_rng.h"

/** Print the usage text to @p out. */
static void usage(FILE *out)
{
    fprintf(out, "usage: megamoe bench forward --model DIR [options]\n\n"
                 "Prefill random tokens, then decode tokens one by one (greedy); prints prefill tokens/s,\n"
                 "decode ms/token, the per-layer split and the peak RSS.\n\n"
                 "  --model DIR     checkpoint directory (required)\n"
                 "  --prefill N     prompt tokens, 1..1000000 (default 64)\n"
                 "  --decode K      tokens decoded one at a time, 0..100000 (default 8)\n"
                 "  --seed S        RNG seed of the prompt (default 1)\n"
                 "  --threads N     worker threads of the forward (OpenBLAS then runs one), 1..%d (default: MMOE_DEQUANT_THREADS, else the cores up to 16)\n"
                 "  --json          the report as one JSON object (default: text)\n"
                 "  --peer          also time the step's matrix products as OpenBLAS SGEMM on FP32 weights,\n"
                 "                  the CPU oracle's peer (CPU only; needs the largest product's FP32 weights\n"
                 "                  in memory) (default off)\n"
                 "  --backend B     cpu (the oracle), gpu or auto (the GPU when there is one) (default cpu)\n"
                 MMOE_CUDA_GRAPH_USAGE
                 "  --gpus N        the GPU forward over N GPUs (expert parallel, NCCL): adds the routed pairs\n"
                 "                  per GPU and the exchange time per MoE sub-layer (default: none)\n"
                 "  --gpu-memory G  GPU size in GiB for the --gpus plan (default: GPU 0's memory)\n\n"
                 "example:\n"
                 "  megamoe bench forward --model fixtures/tiny-dsv4 --prefill 64 --decode 8\n",
            MMOE_CLI_MAX_THREADS);
}

/** Progress line on stderr, rewritten in place: only on a terminal. */
static void progress(void *ctx, int done, int total, const char *what)
{
    (void)ctx;
    if (mmoe_cli_progress_allowed())
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

/** One phase's split as JSON (the differences of two snapshots, as print_split()). */
static json_t *split_json(const mmoe_model_timings *a, const double *a0, const double *m0, const double *h0, double e0,
                          double hd0)
{
    json_t *o = json_object(), *layers = json_array();
    double sa = 0, sm = 0, sh = 0;
    for (int L = 0; L < a->n_layers; L++) {
        double at = a->attn_s[L] - a0[L], mo = a->moe_s[L] - m0[L], hc = a->mhc_s[L] - h0[L];
        sa += at, sm += mo, sh += hc;
        json_t *l = json_object();
        mmoe_json_set_int(l, "layer", L);
        mmoe_json_set_real(l, "attention_s", at);
        mmoe_json_set_real(l, "moe_s", mo);
        mmoe_json_set_real(l, "mhc_s", hc);
        json_array_append_new(layers, l);
    }
    mmoe_json_set_real(o, "attention_s", sa);
    mmoe_json_set_real(o, "moe_s", sm);
    mmoe_json_set_real(o, "mhc_s", sh);
    mmoe_json_set_real(o, "embed_s", a->embed_s - e0);
    mmoe_json_set_real(o, "head_s", a->head_s - hd0);
    json_object_set_new(o, "layers", layers);
    return o;
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
        ids[n_prefill + i] = (int32_t)mmoe_argmax_f32(logits, (size_t)V);
        st = mmoe_gpu_model_forward(g, &ids[n_prefill + i], 1, logits, 1, NULL, err);
    }
    *t_decode = mmoe_clock_s() - t0;
    return st;
}

/**
 * The GPU benchmark: warm-up, an unsynchronized pass for the totals, a synchronized pass for
 * the split; the report as text, or into @p report (JSON) when given.
 */
static mmoe_status bench_gpu(mmoe_gpu_model *g, int32_t *ids, long n_prefill, long n_decode, int64_t V, float *logits,
                             json_t *report, mmoe_error *err)
{
    double tp, td, sp, sd;
    mmoe_status st = gpu_pass(g, ids, n_prefill, n_decode, V, logits, &tp, &td, err);
    mmoe_gpu_graph_stats g0, g1;
    mmoe_gpu_model_graph_stats(g, &g0);
    if (st == MMOE_OK)
        st = gpu_pass(g, ids, n_prefill, n_decode, V, logits, &tp, &td, err);
    if (st != MMOE_OK)
        return st;
    mmoe_gpu_model_graph_stats(g, &g1);
    const int64_t replays = g1.replays - g0.replays; /* of the timed pass */
    const int graphed = n_decode > 0 && replays == n_decode;
    mmoe_gpu_model_bytes b;
    mmoe_gpu_model_bytes_held(g, &b);
    if (report) {
        mmoe_json_bench_forward_prefill(report, n_prefill, tp);
        mmoe_json_bench_forward_decode(report, n_decode, td);
        mmoe_json_set_int(report, "device_bytes", (int64_t)b.total);
        json_object_set_new(report, "cuda_graph", json_boolean(graphed));
        mmoe_json_set_int(report, "cuda_graph_replays", replays);
        json_object_set_new(report, "fp8_linears", json_string(mmoe_gpu_fp8_linears_name(mmoe_gpu_model_fp8_linears(g))));
    } else {
        printf("gpu: %.1f MiB on the device (weights %.1f, caches %.1f, work %.1f)\n", (double)b.total / 1048576.0,
               (double)b.weights / 1048576.0, (double)b.caches / 1048576.0, (double)b.work / 1048576.0);
        printf("prefill: %ld tokens in %.4f s = %.2f tokens/s\n", n_prefill, tp, (double)n_prefill / tp);
        if (n_decode > 0)
            printf("decode: %ld tokens in %.4f s = %.3f ms/token\n", n_decode, td, 1e3 * td / (double)n_decode);
        printf("cuda graph: %s (%lld of %ld timed decode steps replayed the captured graph; %lld capture(s))\n",
               graphed ? "on" : "off", (long long)replays, n_decode, (long long)g1.captures);
        printf("fp8 linears: %s%s\n", mmoe_gpu_fp8_linears_name(mmoe_gpu_model_fp8_linears(g)),
               mmoe_gpu_model_fp8_linears(g) == MMOE_GPU_FP8_LINEARS_TC
                   ? " (tensor-core block partials for calls of 1 to 8 tokens, within the stated bound; exact above)"
                   : " (the oracle's bits)");
    }
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
    if (report)
        json_object_set_new(report, "prefill_split", split_json(&tm, snap, snap + nb, snap + 2 * nb, 0, 0));
    else
        print_split("prefill (synchronized per part)", &tm, snap, snap + nb, snap + 2 * nb, 0, 0, sp);
    memcpy(snap, tm.attn_s, sizeof(double) * (size_t)nb);
    memcpy(snap + nb, tm.moe_s, sizeof(double) * (size_t)nb);
    memcpy(snap + 2 * nb, tm.mhc_s, sizeof(double) * (size_t)nb);
    const double e0 = tm.embed_s, h0 = tm.head_s;
    double t0 = mmoe_clock_s();
    for (long i = 0; i < n_decode && st == MMOE_OK; i++) {
        ids[n_prefill + i] = (int32_t)mmoe_argmax_f32(logits, (size_t)V);
        st = mmoe_gpu_model_forward(g, &ids[n_prefill + i], 1, logits, 1, NULL, err);
    }
    sd = mmoe_clock_s() - t0;
    if (st == MMOE_OK && report) {
        gpu_timings(g, &tm);
        json_object_set_new(report, "decode_split", split_json(&tm, snap, snap + nb, snap + 2 * nb, e0, h0));
    } else if (st == MMOE_OK && n_decode > 0) {
        gpu_timings(g, &tm);
        print_split("decode (synchronized per part)", &tm, snap, snap + nb, snap + 2 * nb, e0, h0, sd);
    }
    free(snap);
    return st;
}

int mmoe_cmd_bench_forward(int argc, char **argv)
{
    enum { O_THREADS = 256, O_TOKENS, O_GPUS, O_GPU_MEM, O_GRAPH, O_PEER };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"prefill", required_argument, 0, 't'},
                                         {"decode", required_argument, 0, 'd'}, {"seed", required_argument, 0, 's'},
                                         {"threads", required_argument, 0, O_THREADS},
                                         {"tokens", required_argument, 0, O_TOKENS},
                                         {"json", no_argument, 0, 'j'}, {"backend", required_argument, 0, 'b'},
                                         {"gpus", required_argument, 0, O_GPUS},
                                         {"gpu-memory", required_argument, 0, O_GPU_MEM},
                                         {"cuda-graph", required_argument, 0, O_GRAPH},
                                         {"peer", no_argument, 0, O_PEER},
                                         {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    const char *cmd = "bench forward", *model_dir = NULL;
    int64_t n_prefill = 64, n_decode = 8;
    uint64_t seed = 1;
    int c, rc = 0, threads = 0, json = 0, backend_given = 0, peer = 0;
    mmoe_backend backend = MMOE_BACKEND_CPU;
    mmoe_cli_ep ep_opt = {0};
    mmoe_cuda_graph_opt graph = {0, 0};
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': rc = mmoe_cli_opt_i64(cmd, "prefill", optarg, 1, 1000000, &n_prefill); break;
        case 'd': rc = mmoe_cli_opt_i64(cmd, "decode", optarg, 0, 100000, &n_decode); break;
        case 's': rc = mmoe_cli_opt_u64(cmd, "seed", optarg, 0, UINT64_MAX, &seed); break;
        case O_THREADS: rc = mmoe_cli_opt_int(cmd, "threads", optarg, 1, MMOE_CLI_MAX_THREADS, &threads); break;
        case O_TOKENS:
            fprintf(stderr, "megamoe bench forward: --tokens is now --prefill N (the prompt's token count)\n");
            rc = MMOE_EXIT_USAGE;
            break;
        case 'j': json = 1; break;
        case 'b':
            if (mmoe_backend_parse(optarg, &backend) != 0) {
                fprintf(stderr, "megamoe bench forward: --backend '%s': expected cpu, gpu or auto\n", optarg);
                rc = MMOE_EXIT_USAGE;
            }
            backend_given = 1;
            break;
        case O_GPUS: rc = mmoe_cli_ep_option("bench forward", "gpus", optarg, &ep_opt); break;
        case O_GPU_MEM: rc = mmoe_cli_ep_option("bench forward", "gpu-memory", optarg, &ep_opt); break;
        case O_GRAPH: rc = mmoe_cuda_graph_option(cmd, optarg, &graph); break;
        case O_PEER: peer = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return MMOE_EXIT_USAGE;
        }
    }
    if (rc != 0)
        return rc;
    if (!model_dir || optind != argc) {
        fprintf(stderr, "megamoe bench forward: %s\n", !model_dir ? "--model DIR is required" : "unexpected argument");
        usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    if (ep_opt.gpus > 0 && backend_given && backend != MMOE_BACKEND_GPU) {
        fprintf(stderr, "megamoe bench forward: --gpus runs the GPU forward over N GPUs: --backend cpu or auto "
                        "contradicts it\n");
        return MMOE_EXIT_USAGE;
    }
    if (peer && (backend != MMOE_BACKEND_CPU || ep_opt.gpus > 0)) {
        fprintf(stderr, "megamoe bench forward: --peer times the CPU oracle's peer (OpenBLAS); it needs --backend cpu "
                        "(the GPU layer's peer is bench moe's PyTorch layer)\n");
        return MMOE_EXIT_USAGE;
    }
    if ((rc = mmoe_cuda_graph_resolve(cmd, &graph, backend, ep_opt.gpus)) != 0)
        return rc;
    mmoe_cli_set_forward_threads(threads);
    mmoe_error err;
    mmoe_error_clear(&err);
    if (mmoe_cli_ep_before_load(&ep_opt, model_dir, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe bench forward: %s\n", err.msg);
        return 1;
    }
    mmoe_model *m = NULL;
    mmoe_model_state *s = NULL;
    mmoe_gpu_model *gpu = NULL;
    mmoe_ep_gpu_model *gpus = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    double *snap = NULL;
    json_t *report = json ? json_object() : NULL;
    rc = 1;
    double t0 = mmoe_clock_s();
    mmoe_status st = mmoe_model_open(model_dir, progress, NULL, &m, &err);
    if (st != MMOE_OK)
        goto done;
    double t_load = mmoe_clock_s() - t0;
    const mmoe_config *cfg = mmoe_model_config(m);
    const int64_t V = cfg->vocab_size, T = n_prefill + n_decode;
    if (ep_opt.gpus > 0)
        st = mmoe_cli_ep_open_gpus(&ep_opt, m, T, n_prefill, "megamoe bench forward", 0, &gpus, &err);
    else if ((st = mmoe_model_state_create(m, T, &s, &err)) == MMOE_OK)
        st = mmoe_backend_open(backend, m, T, n_prefill, graph.on, "megamoe bench forward", 0, &gpu, &err);
    if (st != MMOE_OK)
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
    if (gpus) {
        st = mmoe_bench_forward_gpus(gpus, cfg, model_dir, t_load, ids, n_prefill, n_decode, json, &err);
        rc = st == MMOE_OK ? 0 : 1;
        goto done;
    }
    if (gpu && json) {
        json_object_set_new(report, "bench", json_string("forward"));
        json_object_set_new(report, "backend", json_string("gpu"));
        mmoe_json_bench_forward_model(report, model_dir, cfg->n_layers, cfg->n_mtp_layers, t_load);
        if ((st = bench_gpu(gpu, ids, n_prefill, n_decode, V, logits, report, &err)) == MMOE_OK) {
            st = mmoe_json_print_line(stdout, report, &err); /* takes the object */
            report = NULL;
        }
        rc = st == MMOE_OK ? 0 : 1;
        goto done;
    }
    if (gpu) {
        printf("model %s: %d layers + %d MTP, D %lld, %d experts top-%d, weights %.2f GiB; backend gpu\n",
               model_dir, cfg->n_layers, cfg->n_mtp_layers, (long long)cfg->dim, cfg->n_routed_experts,
               cfg->n_activated_experts, (double)mmoe_model_weight_bytes(m) / (1u << 30));
        st = bench_gpu(gpu, ids, n_prefill, n_decode, V, logits, NULL, &err);
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
    double *a0 = snap, *m0 = snap + nb, *h0 = snap + 2 * nb;
    if (json) {
        json_object_set_new(report, "bench", json_string("forward"));
        json_object_set_new(report, "backend", json_string("cpu"));
        mmoe_json_bench_forward_model(report, model_dir, cfg->n_layers, cfg->n_mtp_layers, t_load);
        mmoe_json_bench_forward_prefill(report, n_prefill, t_prefill);
        json_object_set_new(report, "prefill_split", split_json(&tm, a0, m0, h0, 0, 0));
        mmoe_json_set_str(report, "cpu_kernels", mmoe_cpu_kernels());
        mmoe_json_set_int(report, "worker_threads", mmoe_model_worker_threads(m));
        mmoe_json_set_str(report, "openblas_core", openblas_get_corename());
        mmoe_json_set_int(report, "openblas_threads", openblas_get_num_threads());
    } else {
        printf("model %s: %d layers + %d MTP, D %lld, %d experts top-%d, weights %.2f GiB\n", model_dir,
               cfg->n_layers, cfg->n_mtp_layers, (long long)cfg->dim, cfg->n_routed_experts,
               cfg->n_activated_experts, (double)mmoe_model_weight_bytes(m) / (1u << 30));
        printf("load (mmap + checks): %.3f s\n", t_load);
        printf("cpu: kernels %s, %d worker threads, OpenBLAS %s x%d threads\n", mmoe_cpu_kernels(),
               mmoe_model_worker_threads(m), openblas_get_corename(), openblas_get_num_threads());
        printf("prefill: %lld tokens in %.3f s = %.2f tokens/s\n", (long long)n_prefill, t_prefill,
               (double)n_prefill / t_prefill);
        print_split("prefill", &tm, a0, m0, h0, 0, 0, t_prefill);
    }
    memcpy(a0, tm.attn_s, sizeof(double) * (size_t)nb);
    memcpy(m0, tm.moe_s, sizeof(double) * (size_t)nb);
    memcpy(h0, tm.mhc_s, sizeof(double) * (size_t)nb);
    double e0 = tm.embed_s, hd0 = tm.head_s;
    t0 = mmoe_clock_s();
    for (int64_t i = 0; i < n_decode && st == MMOE_OK; i++) {
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
    if (n_decode > 0 && !json) {
        printf("decode: %lld tokens in %.3f s = %.2f ms/token\n", (long long)n_decode, t_decode, 1e3 * t_decode / (double)n_decode);
        mmoe_model_state_timings(s, &tm);
        print_split("decode", &tm, a0, m0, h0, e0, hd0, t_decode);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru); /* before the peer's FP32 weights */
    double peer_prefill_s = 0, peer_decode_s = 0, peer_flops = 0, flops1 = 0;
    /* the peer's SGEMMs get as many OpenBLAS threads as the oracle has workers */
    const int oracle_blas_threads = openblas_get_num_threads(), peer_threads = mmoe_model_worker_threads(m);
    if (peer)
        openblas_set_num_threads(peer_threads);
    if (peer && ((st = mmoe_bench_forward_peer(cfg, n_prefill, 3, &peer_prefill_s, &peer_flops, &err)) != MMOE_OK ||
                 (st = mmoe_bench_forward_peer(cfg, 1, 5, &peer_decode_s, &flops1, &err)) != MMOE_OK)) {
        openblas_set_num_threads(oracle_blas_threads);
        goto done;
    }
    if (peer)
        openblas_set_num_threads(oracle_blas_threads);
    /* peer time / ours (above 1: the oracle is faster); decode only with decoded tokens */
    const double ratio_prefill = peer_prefill_s / t_prefill;
    const double ratio_decode = n_decode > 0 ? peer_decode_s / (t_decode / (double)n_decode) : 0.0;
    if (peer && !json) {
        printf("peer (OpenBLAS %s x%d, the step's matrix products as SGEMM or SGEMV on FP32 weights): prefill %.2f tokens/s "
               "(%.1f GFLOP), decode %.2f ms/token; ratio (peer time / ours): prefill %.2f",
               openblas_get_corename(), peer_threads, (double)n_prefill / peer_prefill_s,
               peer_flops * 1e-9, 1e3 * peer_decode_s, ratio_prefill);
        if (n_decode > 0)
            printf(", decode %.2f", ratio_decode);
        printf("\n");
    }
    if (json) {
        if (peer) {
            json_object_set_new(report, "peer", json_string("openblas-sgemm"));
            mmoe_json_set_int(report, "peer_threads", peer_threads);
            mmoe_json_set_real(report, "peer_prefill_s", peer_prefill_s);
            mmoe_json_set_real(report, "peer_prefill_gflop", peer_flops * 1e-9);
            mmoe_json_set_real(report, "peer_decode_ms_per_token", 1e3 * peer_decode_s);
            mmoe_json_set_real(report, "ratio_to_peer_prefill", ratio_prefill);
            if (n_decode > 0)
                mmoe_json_set_real(report, "ratio_to_peer_decode", ratio_decode);
        }
        mmoe_model_state_timings(s, &tm);
        mmoe_json_bench_forward_decode(report, n_decode, t_decode);
        json_object_set_new(report, "decode_split", split_json(&tm, a0, m0, h0, e0, hd0));
        mmoe_json_set_int(report, "peak_rss_bytes", (int64_t)ru.ru_maxrss * 1024);
        mmoe_json_set_int(report, "weight_bytes", (int64_t)mmoe_model_weight_bytes(m));
        mmoe_json_set_int(report, "kv_cache_bytes", (int64_t)mmoe_model_state_bytes(s));
        json_object_set_new(report, "cuda_graph", json_false());
        st = mmoe_json_print_line(stdout, report, &err);
        report = NULL;
        rc = st == MMOE_OK ? 0 : 1;
        goto done;
    }
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
    json_decref(report);
    mmoe_gpu_model_destroy(gpu);
    mmoe_ep_gpu_model_destroy(gpus);
    mmoe_model_state_destroy(s);
    mmoe_model_close(m);
    return rc;
}
