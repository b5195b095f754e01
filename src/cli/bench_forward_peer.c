/**
 * @file bench_forward_peer.c
 * @brief The CPU forward's peer in `megamoe bench forward --peer`: one forward step's matrix
 *        products as OpenBLAS SGEMM on FP32 weights.
 *
 * The oracle's step against the plainest fast implementation of its arithmetic: every matrix
 * product of one step of the model's main layers and head, at the same shapes, as OpenBLAS
 * SGEMM with FP32 weights and activations.  Per layer (its compress ratio r):
 *
 * | product | weight [N, K] | rows |
 * |---|---|---|
 * | wq_a, wkv, wq_b | [q_lora, D], [d, D], [H d, q_lora] | T |
 * | wo_a, per group | G times [R, H d / G] | T |
 * | wo_b | [D, G R] | T |
 * | compressor wkv and wgate (r > 0) | [c d, D] twice, c = 2 for r = 4, else 1 | T |
 * | indexer wq_b, weights_proj, its compressor (r = 4) | [ih id, q_lora], [ih, D], [2 id, D] twice | T |
 * | the experts: w1 and w3 as one, w2 | [2 I, D], [D, I] | see below |
 * | head (once) | [V, D] | 1 (the last position's logits) |
 *
 * The experts: a step of T tokens sends T top-k pairs to the routed experts and T rows to the
 * shared one; the peer spreads the pairs evenly over min(E, T top-k) experts (one row each at
 * decode: the top-k experts a token reaches).  Left out: the attention's scores and P.V, the
 * norms, mHC, the routing and the quantizations, which the oracle does and the peer does not.
 *
 * The weights: one FP32 buffer as large as the largest product's, filled once with small
 * values, every product reading its own [N, K] from the buffer's start.  The peer thus reads 4
 * bytes a weight where the checkpoint has 1 (FP8) or about 0.53 (FP4); a product smaller than
 * the cache may be read from it, which favours the peer.  A product of one row is OpenBLAS's
 * SGEMV (its SGEMM is several times slower there).  The step is run once to warm up, then
 * @p reps times; the median is reported.
 */
#include <cblas.h>
#include <stdlib.h>

#include "mmoe_cli.h"
#include "mmoe_clock.h"
#include "mmoe_config.h"

/** One matrix product of the step: @p rows x [k] times [n, k]^T, @p count times. */
typedef struct {
    int64_t n;     /**< weight rows (outputs) */
    int64_t k;     /**< weight columns (inputs) */
    int64_t rows;  /**< activation rows */
    int64_t count; /**< how many such products */
} peer_gemm;

/** Most products of one step's list: per layer at most 10 kinds, plus the head. */
#define PEER_MAX_GEMMS (10 * MMOE_CONFIG_MAX_LAYERS + 1)

/** Append a product to @p g (count > 0 and every extent positive), returning the new count. */
static int peer_add(peer_gemm *g, int n_g, int64_t n, int64_t k, int64_t rows, int64_t count)
{
    if (n > 0 && k > 0 && rows > 0 && count > 0)
        g[n_g++] = (peer_gemm){n, k, rows, count};
    return n_g;
}

/** The products of one step of @p T tokens (the table of the file comment). */
static int peer_gemms(const mmoe_config *c, int64_t T, peer_gemm *g)
{
    const int64_t D = c->dim, d = c->head_dim, hd = (int64_t)c->n_heads * c->head_dim, q = c->q_lora_rank;
    const int64_t G = c->o_groups, R = c->o_lora_rank, inter = c->moe_inter_dim;
    const int64_t ih = c->index_n_heads, id = c->index_head_dim;
    const int64_t pairs = T * c->n_activated_experts;
    const int64_t experts = pairs < c->n_routed_experts ? pairs : c->n_routed_experts;
    const int64_t expert_rows = (pairs + experts - 1) / experts;
    int n_g = 0;
    for (int L = 0; L < c->n_layers; L++) {
        const int r = c->compress_ratios[L];
        n_g = peer_add(g, n_g, q, D, T, 1);
        n_g = peer_add(g, n_g, d, D, T, 1);
        n_g = peer_add(g, n_g, hd, q, T, 1);
        n_g = peer_add(g, n_g, R, hd / G, T, G);
        n_g = peer_add(g, n_g, D, G * R, T, 1);
        if (r > 0)
            n_g = peer_add(g, n_g, (r == 4 ? 2 : 1) * d, D, T, 2);
        if (r == 4) {
            n_g = peer_add(g, n_g, ih * id, q, T, 1);
            n_g = peer_add(g, n_g, ih, D, T, 1);
            n_g = peer_add(g, n_g, 2 * id, D, T, 2);
        }
        n_g = peer_add(g, n_g, 2 * inter, D, expert_rows, experts);
        n_g = peer_add(g, n_g, D, inter, expert_rows, experts);
        n_g = peer_add(g, n_g, 2 * inter, D, T, c->n_shared_experts);
        n_g = peer_add(g, n_g, D, inter, T, c->n_shared_experts);
    }
    return peer_add(g, n_g, c->vocab_size, D, 1, 1);
}

/** Compare two doubles for qsort. */
static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

mmoe_status mmoe_bench_forward_peer(const struct mmoe_config *c, int64_t T, int reps, double *seconds, double *flops,
                                    mmoe_error *err)
{
    if (c->n_layers > MMOE_CONFIG_MAX_LAYERS || reps < 1 || T < 1)
        return mmoe_error_set(err, MMOE_EINVAL, "peer: %d layers, %d repetitions, %lld tokens", c->n_layers, reps,
                              (long long)T);
    peer_gemm *g = malloc(sizeof(peer_gemm) * PEER_MAX_GEMMS);
    if (g == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "peer: out of memory");
    const int n_g = peer_gemms(c, T, g);
    int64_t w_max = 0, a_max = 0, c_max = 0;
    *flops = 0.0;
    for (int i = 0; i < n_g; i++) {
        w_max = g[i].n * g[i].k > w_max ? g[i].n * g[i].k : w_max;
        a_max = g[i].rows * g[i].k > a_max ? g[i].rows * g[i].k : a_max;
        c_max = g[i].rows * g[i].n > c_max ? g[i].rows * g[i].n : c_max;
        *flops += 2.0 * (double)g[i].n * (double)g[i].k * (double)g[i].rows * (double)g[i].count;
    }
    float *w = malloc(sizeof(float) * (size_t)w_max), *a = malloc(sizeof(float) * (size_t)a_max);
    float *out = malloc(sizeof(float) * (size_t)c_max);
    double *times = malloc(sizeof(double) * (size_t)reps);
    mmoe_status st = MMOE_OK;
    if (w == NULL || a == NULL || out == NULL || times == NULL) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "peer: out of memory for %.1f MiB of FP32 weights",
                            (double)w_max * 4.0 / (1u << 20));
        goto done;
    }
    for (int64_t i = 0; i < w_max; i++)
        w[i] = (float)((i % 61) - 30) * 0x1p-10f;
    for (int64_t i = 0; i < a_max; i++)
        a[i] = (float)((i % 37) - 18) * 0x1p-6f;
    for (int rep = -1; rep < reps; rep++) { /* rep -1: the warm-up */
        const double t0 = mmoe_clock_s();
        for (int i = 0; i < n_g; i++)
            for (int64_t j = 0; j < g[i].count; j++) {
                if (g[i].rows == 1) /* a row: OpenBLAS's matrix-vector product, its faster routine there */
                    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)g[i].n, (int)g[i].k, 1.0f, w, (int)g[i].k, a, 1, 0.0f,
                                out, 1);
                else
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g[i].rows, (int)g[i].n, (int)g[i].k, 1.0f,
                                a, (int)g[i].k, w, (int)g[i].k, 0.0f, out, (int)g[i].n);
            }
        if (rep >= 0)
            times[rep] = mmoe_clock_s() - t0;
    }
    qsort(times, (size_t)reps, sizeof(double), cmp_double);
    *seconds = times[reps / 2];
done:
    free(g);
    free(w);
    free(a);
    free(out);
    free(times);
    return st;
}
