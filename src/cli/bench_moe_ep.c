/**
 * @file bench_moe_ep.c
 * @brief `megamoe bench moe --gpus N` (and `--ep-ranks N` on the CPU): the expert-parallel MoE
 *        layer against the unsplit layer on one device, per token count.
 *
 *     megamoe bench moe --gpus N [--shape v4-flash] [--experts E] [--tokens 1,8,64,...]
 *                       [--reps R] [--recipe sm90|sm100] [--seed S] [--no-baseline]
 *     megamoe bench moe --ep-ranks N ...   (the same on the CPU oracle, in-process ranks)
 *
 * Weights: random bytes with the checkpoint's dtypes and shapes (E2M1 codes uniform, scale
 * bytes 2^-9 .. 2^-2, FP8 bytes without NaN codes), drawn on the host in seconds even at the
 * full V4-Flash shape (256 experts, 3.4 GB): the timing does not depend on the values.  Routing:
 * topk distinct experts per token, uniform (a trained router is close to uniform on average).
 *
 * Per T: two warm-up calls, then R timed calls of the EP layer and of the unsplit layer (one
 * GPU holding all experts, when it fits; --no-baseline skips it).  Printed: median wall time per
 * call of both (host in, host out, as the layer objects of this build work), and the EP call's
 * parts, each the median over calls of the slowest rank: compute (its experts and the shared
 * expert), exchange (waiting for the slowest peer included) and combine; the bytes each rank
 * sends; and whether the EP output equals the unsplit output bit for bit (else how many
 * elements differ: the GPU layer chooses split-K by its row count, mmoe_ep.h).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_ep.h"
#include "mmoe_cli.h"
#include "mmoe_clock.h"
#include "mmoe_gpu_layer.h"
#include "mmoe_rng.h"

/** Most token counts in one --tokens list. */
#define EPB_MAX_T 32

/** The random weights of one layer (owning the bytes). */
typedef struct epb_weights {
    mmoe_moe_weights w;               /**< views */
    mmoe_moe_expert_weights *experts; /**< [E] */
    uint8_t *bytes;                   /**< one block for everything */
} epb_weights;

/** Fill @p n bytes with uniform random bytes. */
static void fill_random(mmoe_rng *rng, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = mmoe_rng_u64(rng);
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
}

/** A view of @p rows x @p cols bytes at *cursor (advanced). */
static mmoe_tensor view(uint8_t **cursor, mmoe_dtype dt, int64_t rows, int64_t cols)
{
    mmoe_tensor t = {0};
    t.dtype = dt;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.data = *cursor;
    t.nbytes = (size_t)(rows * cols) * mmoe_dtype_size(dt);
    *cursor += t.nbytes;
    return t;
}

/** Random weights for @p d: FP4 experts with 1x32 scales, FP8 shared expert with 128x128 scales. */
static mmoe_status epb_weights_make(const mmoe_moe_desc *d, uint64_t seed, epb_weights *out, mmoe_error *err)
{
    memset(out, 0, sizeof *out);
    const int64_t D = d->hidden, I = d->inter, E = d->n_experts, S = (int64_t)d->n_shared * d->shared_inter;
    const int64_t B = d->shared_block;
    const size_t expert = (size_t)(3 * I * D / 2 + 3 * I * D / 32);
    const size_t shared = d->n_shared > 0 ? (size_t)(3 * S * D + 3 * ((S + B - 1) / B) * ((D + B - 1) / B)) : 0;
    const size_t total = (size_t)E * expert + shared + (size_t)(E * D) * 2;
    out->bytes = malloc(total);
    out->experts = calloc((size_t)E, sizeof *out->experts);
    if (out->bytes == NULL || out->experts == NULL) {
        free(out->bytes);
        free(out->experts);
        return mmoe_error_set(err, MMOE_ENOMEM, "bench: out of memory for %zu bytes of weights", total);
    }
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed);
    uint8_t *c = out->bytes;
    for (int64_t e = 0; e < E; e++) {
        mmoe_moe_expert_weights *x = &out->experts[e];
        x->w1 = view(&c, MMOE_DT_U8, I, D / 2);
        x->w3 = view(&c, MMOE_DT_U8, I, D / 2);
        x->w2 = view(&c, MMOE_DT_U8, D, I / 2);
        fill_random(&rng, x->w1.data, (size_t)(3 * I * D / 2));
        x->w1_scale = view(&c, MMOE_DT_F8_E8M0, I, D / 32);
        x->w3_scale = view(&c, MMOE_DT_F8_E8M0, I, D / 32);
        x->w2_scale = view(&c, MMOE_DT_F8_E8M0, D, I / 32);
        uint8_t *s = x->w1_scale.data;
        for (size_t i = 0; i < (size_t)(3 * I * D / 32); i++)
            s[i] = (uint8_t)(118 + mmoe_rng_below(&rng, 8)); /* 2^-9 .. 2^-2 */
    }
    if (d->n_shared > 0) {
        mmoe_moe_expert_weights *x = &out->w.shared;
        x->w1 = view(&c, MMOE_DT_F8_E4M3, S, D);
        x->w3 = view(&c, MMOE_DT_F8_E4M3, S, D);
        x->w2 = view(&c, MMOE_DT_F8_E4M3, D, S);
        uint8_t *q = x->w1.data;
        fill_random(&rng, q, (size_t)(3 * S * D));
        for (size_t i = 0; i < (size_t)(3 * S * D); i++)
            q[i] &= 0xbf; /* clears the top exponent bit: never the NaN codes 0x7f / 0xff */
        x->w1_scale = view(&c, MMOE_DT_F8_E8M0, (S + B - 1) / B, (D + B - 1) / B);
        x->w3_scale = view(&c, MMOE_DT_F8_E8M0, (S + B - 1) / B, (D + B - 1) / B);
        x->w2_scale = view(&c, MMOE_DT_F8_E8M0, (D + B - 1) / B, (S + B - 1) / B);
        memset(x->w1_scale.data, 120, x->w1_scale.nbytes + x->w3_scale.nbytes + x->w2_scale.nbytes);
    }
    out->w.gate = view(&c, MMOE_DT_BF16, E, D);
    out->w.gate.ndim = 2;
    memset(out->w.gate.data, 0, out->w.gate.nbytes); /* routing is given: the gate only has to exist */
    out->w.experts = out->experts;
    return MMOE_OK;
}

/** Free the weights of epb_weights_make(). */
static void epb_weights_free(epb_weights *w)
{
    free(w->bytes);
    free(w->experts);
}

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

/** The unsplit baseline: the oracle layer (CPU) or the GPU layer holding every expert. */
typedef struct epb_base {
    mmoe_moe_layer *cpu; /**< the oracle layer (--ep-ranks), or NULL */
    mmoe_gpu_layer *gpu; /**< the GPU layer with every expert (--gpus), or NULL */
} epb_base;

/** One call of the baseline. */
static mmoe_status base_run(epb_base *b, const mmoe_moe_input *in, const mmoe_moe_output *out, mmoe_error *err)
{
    return b->gpu != NULL ? mmoe_gpu_layer_run(b->gpu, in, out, NULL, err)
                          : mmoe_moe_layer_run(b->cpu, in, out, NULL, err);
}

/** Bench one T: returns 0, or 1 after printing an error. */
static int bench_t(const mmoe_moe_desc *d, mmoe_ep_moe *ep, epb_base *base, int64_t t, int reps, uint64_t seed)
{
    const int64_t D = d->hidden, K = d->topk;
    uint16_t *x = malloc((size_t)(t * D + 1) * 2), *y = malloc((size_t)(t * D + 1) * 2);
    uint16_t *yb = malloc((size_t)(t * D + 1) * 2);
    int64_t *idx = malloc((size_t)(t * K + 1) * sizeof *idx);
    float *w = malloc((size_t)(t * K + 1) * sizeof *w);
    double *ep_s = malloc((size_t)reps * sizeof(double) * 5);
    if (!x || !y || !yb || !idx || !w || !ep_s) {
        fprintf(stderr, "megamoe bench moe: out of memory at T = %lld\n", (long long)t);
        return 1;
    }
    double *base_s = ep_s + reps, *comp_s = ep_s + 2 * reps, *xch_s = ep_s + 3 * reps, *comb_s = ep_s + 4 * reps;
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed ^ (uint64_t)t);
    for (int64_t i = 0; i < t * D; i++) {
        float v = (float)mmoe_rng_normal(&rng);
        uint32_t u;
        memcpy(&u, &v, 4);
        x[i] = (uint16_t)(u >> 16);
    }
    for (int64_t i = 0; i < t; i++)
        for (int64_t k = 0; k < K; k++) {
            int64_t e;
            int dup;
            do { /* distinct experts per token */
                e = (int64_t)mmoe_rng_below(&rng, (uint64_t)d->n_experts);
                dup = 0;
                for (int64_t j = 0; j < k; j++)
                    dup |= idx[i * K + j] == e;
            } while (dup);
            idx[i * K + k] = e;
            w[i * K + k] = (float)(0.1 + 0.3 * mmoe_rng_uniform(&rng));
        }
    mmoe_moe_input in = {t, x, NULL, idx, w};
    mmoe_moe_output out = {y, NULL, NULL}, bout = {yb, NULL, NULL};
    mmoe_ep_result res;
    mmoe_error err;
    mmoe_status st = MMOE_OK;
    int rc = 0;
    for (int i = 0; i < 2 + reps && st == MMOE_OK; i++) {
        st = mmoe_ep_moe_run(ep, &in, &out, &res, &err);
        if (st == MMOE_OK && i >= 2) {
            double comp = 0, xch = 0, comb = 0;
            for (int r = 0; r < res.n_ranks; r++) {
                comp = res.compute_s[r] > comp ? res.compute_s[r] : comp;
                xch = res.exchange_s[r] > xch ? res.exchange_s[r] : xch;
                comb = res.combine_s[r] > comb ? res.combine_s[r] : comb;
            }
            ep_s[i - 2] = res.total_s;
            comp_s[i - 2] = comp;
            xch_s[i - 2] = xch;
            comb_s[i - 2] = comb;
        }
    }
    for (int i = 0; i < 2 + reps && st == MMOE_OK && (base->cpu != NULL || base->gpu != NULL); i++) {
        double t0 = mmoe_clock_s();
        st = base_run(base, &in, &bout, &err);
        if (i >= 2)
            base_s[i - 2] = mmoe_clock_s() - t0;
    }
    if (st != MMOE_OK) {
        fprintf(stderr, "megamoe bench moe: T = %lld: %s\n", (long long)t, err.msg);
        rc = 1;
    } else {
        uint64_t sent = 0;
        for (int r = 0; r < res.n_ranks; r++)
            sent = res.bytes_sent[r] > sent ? res.bytes_sent[r] : sent;
        printf("%6lld %8lld %10.3f %9.3f %9.3f %9.3f", (long long)t, (long long)res.routed_pairs,
               1e3 * median(ep_s, reps), 1e3 * median(comp_s, reps), 1e3 * median(xch_s, reps),
               1e3 * median(comb_s, reps));
        printf(" %10.1f", (double)sent / 1024.0);
        if (base->cpu != NULL || base->gpu != NULL) {
            int64_t diff = 0;
            for (int64_t i = 0; i < t * D; i++)
                diff += y[i] != yb[i];
            printf(" %10.3f %6.2f  %s", 1e3 * median(base_s, reps), median(base_s, reps) / median(ep_s, reps),
                   diff == 0 ? "yes" : "no");
            if (diff > 0)
                printf(" (%lld of %lld differ)", (long long)diff, (long long)(t * D));
        }
        printf("\n");
    }
    free(x);
    free(y);
    free(yb);
    free(idx);
    free(w);
    free(ep_s);
    return rc;
}

int mmoe_bench_moe_ep(int argc, char **argv)
{
    int want = 0;
    for (int i = 1; i < argc; i++)
        want |= strncmp(argv[i], "--gpus", 6) == 0 || strncmp(argv[i], "--ep-ranks", 10) == 0;
    if (!want)
        return -1;
    static const struct option longopts[] = {
        {"shape", required_argument, 0, 'S'}, {"experts", required_argument, 0, 'e'},
        {"tokens", required_argument, 0, 't'}, {"reps", required_argument, 0, 'n'},
        {"recipe", required_argument, 0, 'r'}, {"seed", required_argument, 0, 'x'},
        {"gpus", required_argument, 0, 'G'}, {"ep-ranks", required_argument, 0, 'E'},
        {"no-baseline", no_argument, 0, 'B'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *shape = "v4-flash", *tokens = "1,8,64,512", *recipe = NULL;
    int64_t experts = 0, reps = 20;
    int no_base = 0, c, rc = 0;
    uint64_t seed = 1;
    mmoe_cli_ep o = {0};
    const char *cmd = "bench moe";
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'S': shape = optarg; break;
        case 't': tokens = optarg; break;
        case 'r': recipe = optarg; break;
        case 'B': no_base = 1; break;
        case 'e': rc = mmoe_cli_opt_i64(cmd, "experts", optarg, 0, INT32_MAX, &experts); break;
        case 'n': rc = mmoe_cli_opt_i64(cmd, "reps", optarg, 1, 100000, &reps); break;
        case 'x': rc = mmoe_cli_opt_u64(cmd, "seed", optarg, 0, UINT64_MAX, &seed); break;
        case 'G': rc = mmoe_cli_ep_option(cmd, "gpus", optarg, &o); break;
        case 'E': rc = mmoe_cli_ep_option(cmd, "ep-ranks", optarg, &o); break;
        case 'h':
            printf("usage: megamoe bench moe --gpus N | --ep-ranks N [--shape S] [--experts E] [--tokens T1,...]\n"
                   "                         [--reps R] [--recipe sm90|sm100] [--seed S] [--no-baseline]\n");
            return 0;
        default: return MMOE_EXIT_USAGE;
        }
    }
    if (rc != 0)
        return rc;
    if ((o.gpus > 0) == (o.ep_ranks > 0) || optind != argc) {
        fprintf(stderr, "megamoe bench moe: give one of --gpus N and --ep-ranks N (and no other argument)\n");
        return MMOE_EXIT_USAGE;
    }
    int64_t *list = NULL;
    size_t n_list = 0;
    if ((rc = mmoe_cli_opt_i64_list(cmd, "tokens", tokens, 0, INT32_MAX, EPB_MAX_T, &list, &n_list)) != 0)
        return rc;
    long long tv[EPB_MAX_T];
    const int nt = (int)n_list;
    for (int i = 0; i < nt; i++)
        tv[i] = list[i];
    free(list);
    const int gpu = o.gpus > 0, n = gpu ? o.gpus : o.ep_ranks;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_moe_desc d;
    mmoe_status st = mmoe_moe_desc_from_shape(shape, experts, &d, &err);
    d.recipe = gpu ? MMOE_RECIPE_SM90 : MMOE_RECIPE_SM100;
    if (st == MMOE_OK && recipe != NULL)
        st = mmoe_moe_recipe_from_name(recipe, &d.recipe, &err);
    epb_weights w = {0};
    mmoe_ep_group *g = NULL;
    mmoe_ep_team *team = NULL;
    mmoe_ep_moe *ep = NULL;
    epb_base base = {0};
    double t0 = mmoe_clock_s();
    if (st == MMOE_OK)
        st = epb_weights_make(&d, seed, &w, &err);
    if (st == MMOE_OK)
        st = gpu ? mmoe_ep_group_create_nccl(n, &g, &err) : mmoe_ep_group_create_inproc(n, &g, &err);
    if (st == MMOE_OK)
        st = mmoe_ep_team_create(g, &team, &err);
    if (st == MMOE_OK)
        st = mmoe_ep_moe_create(&d, &w.w, team, gpu ? mmoe_ep_executor_gpu : mmoe_ep_executor_cpu, NULL, &ep, &err);
    /* the baseline: on the caller's thread, GPU 0 (where rank 0 also works: run one at a time) */
    if (st == MMOE_OK && !no_base) {
        if (gpu)
            st = mmoe_gpu_layer_create(&d, &w.w, &base.gpu, &err);
        else if ((st = mmoe_moe_layer_create(&d, &base.cpu, &err)) == MMOE_OK)
            st = mmoe_moe_layer_set_weights(base.cpu, &w.w, &err);
    }
    rc = 0;
    if (st == MMOE_OK) {
        printf("bench moe: %s, shape %s, D %lld, I %lld, E %lld (%lld per rank at most), topk %d, recipe %s, %s %d, "
               "reps %d (setup %.1f s)\n",
               gpu ? "expert parallel over GPUs (NCCL)" : "expert parallel over in-process ranks (CPU)", shape,
               (long long)d.hidden, (long long)d.inter, (long long)d.n_experts,
               (long long)((d.n_experts + n - 1) / n), d.topk, mmoe_moe_recipe_name(d.recipe),
               gpu ? "gpus" : "ranks", n, (int)reps, mmoe_clock_s() - t0);
        printf("     T    pairs      ep_ms compute_ms   xchg_ms  comb_ms  sent_KiB    base_ms  speedup  bitexact\n");
        for (int i = 0; i < nt && rc == 0; i++)
            rc = bench_t(&d, ep, &base, tv[i], (int)reps, seed);
        printf("ep_ms: median wall time of an EP call (host in/out); compute/xchg/comb: medians of the slowest rank; "
               "sent_KiB: most bytes one rank sent; base_ms: the unsplit layer on one device\n");
    } else {
        fprintf(stderr, "megamoe bench moe: %s\n", err.msg);
        rc = 1;
    }
    mmoe_gpu_layer_destroy(base.gpu);
    mmoe_moe_layer_destroy(base.cpu);
    mmoe_ep_moe_destroy(ep);
    mmoe_ep_team_destroy(team);
    mmoe_ep_group_destroy(g);
    epb_weights_free(&w);
    return rc;
}
