/**
 * @file bench_forward_ep.c
 * @brief `megamoe bench forward --gpus N`: the whole GPU forward over N GPUs (expert parallel),
 *        its prefill tokens/s and decode ms/token, and what the MoE exchanges cost.
 *
 *     megamoe bench forward --model DIR --gpus N [--gpu-memory GIB] [--prefill 64] [--decode 8]
 *                           [--seed S] [--json]
 *
 * The model is planned and uploaded as `logits --gpus N` does it (cli_ep.h); then the same
 * passes as the one-GPU benchmark: a warm-up pass (prefill of the random prompt, then the greedy
 * decode steps), and the timed pass of the same tokens after a reset.  The timed pass is not
 * synchronized between the parts: its wall times are the totals.  Around each of its two
 * phases the model's counters are read (mmoe_ep_gpu_forward.h), so each phase reports:
 *
 *  - the routed pairs each rank computed and the exchanges in which a rank had none (idle);
 *  - the payload bytes rank 0 sent to its peers;
 *  - per MoE sub-layer, each rank's exchange seconds: from its routing on the host (its own
 *    rows done) to its peers' rows on its device.  That holds the wait for the slowest rank, so
 *    the spread between the ranks' times is the load imbalance, and the smallest rank time of
 *    a layer bounds what the transfer itself cost.
 *
 * The text report gives per layer the smallest and largest rank time (prefill: ms for the
 * whole prompt; decode: ms per token) and each phase's total against its wall time.  With
 * --json the report is one JSON object on stdout: {"bench": "forward", "backend": "gpu",
 * "gpus", "comm", "cuda_graph" (false), "fp8_linears" (the FP8 linears' recipe), "model", "layers",
 * "mtp_layers", "load_s", "prefill_tokens", "prefill_s", "prefill_tokens_per_s",
 * "decode_tokens", "decode_s", "decode_ms_per_token", "ranks": [{"rank", "first_expert",
 * "end_expert", "device_bytes"}], "prefill_exchange", "decode_exchange"}; a phase's exchange
 * object is {"exchanges", "bytes_sent", "pairs": [per rank], "idle": [per rank], "exchange_s":
 * [per rank, summed over the layers], "layers": [{"layer", "exchange_s": [per rank]}]}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_ep.h"
#include "mmoe_clock.h"
#include "mmoe_json_report.h"
#include "mmoe_sampler.h"

/** The model's counters at one moment: statistics and every rank's exchange seconds per sub-layer. */
typedef struct ep_snapshot {
    mmoe_ep_gpu_stats stats; /**< the exchanges' statistics */
    double *xs;              /**< [N][n_layers + 1] exchange seconds per rank and sub-layer */
} ep_snapshot;

/** What the benchmark holds: the model over N GPUs and its shape. */
typedef struct ep_bench {
    mmoe_ep_gpu_model *e;  /**< the model */
    int n;                 /**< ranks */
    int n_layers;          /**< main layers: one MoE sub-layer each */
    int64_t V;             /**< vocabulary */
} ep_bench;

/** Read the counters of @p b into @p s (s->xs allocated by the caller). */
static void snapshot(const ep_bench *b, ep_snapshot *s)
{
    mmoe_ep_gpu_model_stats(b->e, &s->stats);
    for (int r = 0; r < b->n; r++)
        mmoe_ep_gpu_model_exchange_seconds(b->e, r, s->xs + (size_t)r * (size_t)(b->n_layers + 1));
}

/** Rank @p r's exchange seconds of layer @p L between snapshots @p a and @p z. */
static double layer_s(const ep_bench *b, const ep_snapshot *a, const ep_snapshot *z, int r, int L)
{
    const size_t i = (size_t)r * (size_t)(b->n_layers + 1) + (size_t)L;
    return z->xs[i] - a->xs[i];
}

/** Rank @p r's exchange seconds over all main layers between @p a and @p z. */
static double rank_total_s(const ep_bench *b, const ep_snapshot *a, const ep_snapshot *z, int r)
{
    double s = 0;
    for (int L = 0; L < b->n_layers; L++)
        s += layer_s(b, a, z, r, L);
    return s;
}

/**
 * One pass: reset, prefill of ids[0, n_prefill), n_decode greedy steps; the wall time of each
 * phase, and (when @p snap is not NULL) the counters before, between and after the phases.
 */
static mmoe_status pass(const ep_bench *b, int32_t *ids, int64_t n_prefill, int64_t n_decode, float *logits,
                        double *t_prefill, double *t_decode, ep_snapshot *snap, mmoe_error *err)
{
    mmoe_status st = mmoe_ep_gpu_model_reset(b->e, err);
    if (snap)
        snapshot(b, &snap[0]);
    double t0 = mmoe_clock_s();
    if (st == MMOE_OK)
        st = mmoe_ep_gpu_model_forward(b->e, ids, n_prefill, logits, 1, NULL, err);
    *t_prefill = mmoe_clock_s() - t0;
    if (snap)
        snapshot(b, &snap[1]);
    t0 = mmoe_clock_s();
    for (int64_t i = 0; i < n_decode && st == MMOE_OK; i++) {
        ids[n_prefill + i] = (int32_t)mmoe_argmax_f32(logits, (size_t)b->V);
        st = mmoe_ep_gpu_model_forward(b->e, &ids[n_prefill + i], 1, logits, 1, NULL, err);
    }
    *t_decode = mmoe_clock_s() - t0;
    if (snap)
        snapshot(b, &snap[2]);
    return st;
}

/** One phase's exchange lines of the text report; @p per_token: the times per token of @p tokens (decode). */
static void print_phase(const ep_bench *b, const char *phase, const ep_snapshot *a, const ep_snapshot *z, double wall,
                        int per_token, int64_t tokens)
{
    const mmoe_ep_gpu_stats *s0 = &a->stats, *s1 = &z->stats;
    printf("%s exchanges: %lld, payload sent by rank 0 %.1f KiB; routed pairs per rank:", phase,
           (long long)(s1->exchanges - s0->exchanges), (double)(s1->bytes_sent - s0->bytes_sent) / 1024.0);
    for (int r = 0; r < b->n; r++)
        printf(" %lld", (long long)(s1->pairs[r] - s0->pairs[r]));
    printf("; idle rank-exchanges:");
    for (int r = 0; r < b->n; r++)
        printf(" %lld", (long long)(s1->idle[r] - s0->idle[r]));
    double lo = INFINITY, hi = 0;
    for (int r = 0; r < b->n; r++) {
        const double t = rank_total_s(b, a, z, r);
        lo = fmin(lo, t);
        hi = fmax(hi, t);
    }
    const double per = per_token ? (double)tokens : 1.0;
    printf("\n%s exchange time, all layers: %.3f to %.3f ms%s over the ranks (%.0f%% to %.0f%% of the phase)\n", phase,
           1e3 * lo / per, 1e3 * hi / per, per_token ? " per token" : "", 100 * lo / wall, 100 * hi / wall);
}

/** The per-layer table of the text report: smallest and largest rank time per layer and phase. */
static void print_layers(const ep_bench *b, const ep_snapshot *snap, int64_t n_decode)
{
    printf("exchange ms per MoE sub-layer, smallest / largest over the ranks (prefill: the prompt; decode: per token):\n");
    printf("  %-6s %21s", "layer", "prefill");
    printf(n_decode > 0 ? " %21s\n" : "\n", "decode");
    for (int L = 0; L < b->n_layers; L++) {
        double lo[2] = {INFINITY, INFINITY}, hi[2] = {0, 0};
        for (int p = 0; p < 2; p++)
            for (int r = 0; r < b->n; r++) {
                const double t = layer_s(b, &snap[p], &snap[p + 1], r, L) / (p == 1 ? (double)n_decode : 1.0);
                lo[p] = fmin(lo[p], t);
                hi[p] = fmax(hi[p], t);
            }
        printf("  %-6d %10.4f / %8.4f", L, 1e3 * lo[0], 1e3 * hi[0]);
        if (n_decode > 0)
            printf(" %10.4f / %8.4f", 1e3 * lo[1], 1e3 * hi[1]);
        putchar('\n');
    }
}

/** Per-rank integer array of @p n values. */
static json_t *int_array(const int64_t *v, const int64_t *v0, int n)
{
    json_t *a = json_array();
    for (int r = 0; r < n; r++)
        json_array_append_new(a, json_integer(v[r] - v0[r]));
    return a;
}

/** One phase's exchange object of the JSON report. */
static json_t *phase_json(const ep_bench *b, const ep_snapshot *a, const ep_snapshot *z)
{
    json_t *o = json_object(), *tot = json_array(), *layers = json_array();
    mmoe_json_set_int(o, "exchanges", z->stats.exchanges - a->stats.exchanges);
    mmoe_json_set_int(o, "bytes_sent", (int64_t)(z->stats.bytes_sent - a->stats.bytes_sent));
    json_object_set_new(o, "pairs", int_array(z->stats.pairs, a->stats.pairs, b->n));
    json_object_set_new(o, "idle", int_array(z->stats.idle, a->stats.idle, b->n));
    for (int r = 0; r < b->n; r++)
        json_array_append_new(tot, json_real(rank_total_s(b, a, z, r)));
    json_object_set_new(o, "exchange_s", tot);
    for (int L = 0; L < b->n_layers; L++) {
        json_t *l = json_object(), *per = json_array();
        mmoe_json_set_int(l, "layer", L);
        for (int r = 0; r < b->n; r++)
            json_array_append_new(per, json_real(layer_s(b, a, z, r, L)));
        json_object_set_new(l, "exchange_s", per);
        json_array_append_new(layers, l);
    }
    json_object_set_new(o, "layers", layers);
    return o;
}

/** The JSON report of the timed pass. */
static mmoe_status report_json(const ep_bench *b, const mmoe_config *cfg, const char *model_dir, double t_load,
                               int64_t n_prefill, int64_t n_decode, double tp, double td, const ep_snapshot *snap,
                               mmoe_error *err)
{
    json_t *o = json_object(), *ranks = json_array();
    json_object_set_new(o, "bench", json_string("forward"));
    json_object_set_new(o, "backend", json_string("gpu"));
    mmoe_json_set_int(o, "gpus", b->n);
    mmoe_json_set_str(o, "comm", mmoe_ep_comm_kind_name(mmoe_ep_gpu_model_kind(b->e)));
    json_object_set_new(o, "cuda_graph", json_false()); /* the ranks' steps run kernel by kernel */
    /* every rank reads MMOE_GPU_FP8_LINEARS when it is created: rank 0's is all ranks' */
    mmoe_json_set_str(o, "fp8_linears",
                      mmoe_gpu_fp8_linears_name(mmoe_gpu_model_fp8_linears(mmoe_ep_gpu_model_rank(b->e, 0))));
    mmoe_json_bench_forward_model(o, model_dir, cfg->n_layers, cfg->n_mtp_layers, t_load);
    mmoe_json_bench_forward_prefill(o, n_prefill, tp);
    mmoe_json_bench_forward_decode(o, n_decode, td);
    const mmoe_ep_partition *p = mmoe_ep_gpu_model_partition(b->e);
    for (int r = 0; r < b->n; r++) {
        json_t *x = json_object();
        mmoe_gpu_model_bytes by;
        mmoe_gpu_model_bytes_held(mmoe_ep_gpu_model_rank(b->e, r), &by);
        mmoe_json_set_int(x, "rank", r);
        mmoe_json_set_int(x, "first_expert", p->first[r]);
        mmoe_json_set_int(x, "end_expert", p->first[r + 1]);
        mmoe_json_set_int(x, "device_bytes", (int64_t)by.total);
        json_array_append_new(ranks, x);
    }
    json_object_set_new(o, "ranks", ranks);
    json_object_set_new(o, "prefill_exchange", phase_json(b, &snap[0], &snap[1]));
    json_object_set_new(o, "decode_exchange", phase_json(b, &snap[1], &snap[2]));
    return mmoe_json_print_line(stdout, o, err);
}

mmoe_status mmoe_bench_forward_gpus(mmoe_ep_gpu_model *e, const mmoe_config *cfg, const char *model_dir,
                                    double t_load, int32_t *ids, int64_t n_prefill, int64_t n_decode, int json,
                                    mmoe_error *err)
{
    const ep_bench b = {e, mmoe_ep_gpu_model_ranks(e), (int)cfg->n_layers, cfg->vocab_size};
    const size_t nx = (size_t)b.n * (size_t)(b.n_layers + 1);
    ep_snapshot snap[3];
    memset(snap, 0, sizeof snap);
    float *logits = malloc(sizeof(float) * (size_t)b.V);
    double *xs = calloc(3 * nx, sizeof(double));
    if (logits == NULL || xs == NULL) {
        free(logits);
        free(xs);
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
    }
    for (int i = 0; i < 3; i++)
        snap[i].xs = xs + (size_t)i * nx;
    double tp, td;
    mmoe_status st = pass(&b, ids, n_prefill, n_decode, logits, &tp, &td, NULL, err); /* warm-up */
    if (st == MMOE_OK)
        st = pass(&b, ids, n_prefill, n_decode, logits, &tp, &td, snap, err);
    if (st == MMOE_OK && json) {
        st = report_json(&b, cfg, model_dir, t_load, n_prefill, n_decode, tp, td, snap, err);
    } else if (st == MMOE_OK) {
        printf("model %s: %d layers + %d MTP, D %lld, %d experts top-%d; backend gpu over %d GPU(s) (expert parallel, "
               "%s)\n",
               model_dir, cfg->n_layers, cfg->n_mtp_layers, (long long)cfg->dim, cfg->n_routed_experts,
               cfg->n_activated_experts, b.n, mmoe_ep_comm_kind_name(mmoe_ep_gpu_model_kind(e)));
        printf("prefill: %lld tokens in %.4f s = %.2f tokens/s\n", (long long)n_prefill, tp, (double)n_prefill / tp);
        print_phase(&b, "prefill", &snap[0], &snap[1], tp, 0, n_prefill);
        if (n_decode > 0) {
            printf("decode: %lld tokens in %.4f s = %.3f ms/token\n", (long long)n_decode, td,
                   1e3 * td / (double)n_decode);
            print_phase(&b, "decode", &snap[1], &snap[2], td, 1, n_decode);
        }
        print_layers(&b, snap, n_decode);
    }
    free(logits);
    free(xs);
    return st;
}
