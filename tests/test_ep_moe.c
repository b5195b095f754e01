/**
 * @file test_ep_moe.c
 * @brief Suite "ep_moe": expert parallelism over N in-process ranks, against the unsplit layer.
 *
 * Cases:
 *  - the partition of E experts over N ranks against a hand derivation (E = 10, N = 4: sizes
 *    3 3 2 2), and the owner of every expert against a search of the blocks, for E, N <= 12;
 *    N > E and N = 0 refused, naming the counts;
 *  - the dispatch bookkeeping of a hand-made routing (E = 4, N = 2, masked slots);
 *  - the in-process exchange: random batch sizes (zero included) between N = 1..8 ranks arrive
 *    intact; a size the receiver does not expect is refused on its rank; a rank that fails
 *    before the exchange is reported by every rank and nothing hangs;
 *  - the EP layer against the unsplit oracle layer, bit for bit (output, routing, weights):
 *    every recipe, N = 1, 2, 3, 8, biased and hash routing, fused and serial shared expert,
 *    no shared expert, padding, E not divisible by N (9 experts), T = 0 and 1; given routings
 *    that put every token on one rank's experts (the other ranks get none), that leave some
 *    experts without tokens, and that mask slots (whole tokens too);
 *  - a failing executor on one rank: create and run return that rank's error, prefixed
 *    "rank R: ", and the team stays usable;
 *  - the memory plan per GPU: replicated + the largest rank's experts, by hand; the refusal
 *    message gives the GiB per GPU and the fewest GPUs that fit.
 * The reference is the unsplit oracle layer itself (mmoe_moe_layer_run): EP must reproduce it
 * exactly, so no tolerance applies.  Seeds are printed (replay with MMOE_SEED=n).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_ep.h"
#include "mmoe_moe.h"
#include "mmoe_moe_synth.h"
#include "mmoe_rng.h"
#include "mmoe_test.h"

static uint64_t g_seed;

/* ------------------------------------------------------------------ partition, dispatch */

START_TEST(partition_by_hand)
{
    mmoe_ep_partition p;
    mmoe_error err;
    ck_assert_int_eq(mmoe_ep_partition_make(10, 4, &p, &err), MMOE_OK);
    const int64_t want[] = {0, 3, 6, 8, 10}; /* 10 = 2*4 + 2: two ranks of 3, two of 2 */
    for (int r = 0; r <= 4; r++)
        ck_assert_int_eq(p.first[r], want[r]);
    for (int64_t e = 0; e < 10; e++)
        ck_assert_int_eq(mmoe_ep_partition_owner(&p, e), e < 3 ? 0 : e < 6 ? 1 : e < 8 ? 2 : 3);
    /* every E, N <= 12: blocks cover [0, E), sizes differ by at most one, owner = the block */
    for (int64_t e_n = 1; e_n <= 12; e_n++)
        for (int n = 1; n <= e_n; n++) {
            ck_assert_int_eq(mmoe_ep_partition_make(e_n, n, &p, &err), MMOE_OK);
            ck_assert_int_eq(p.first[0], 0);
            ck_assert_int_eq(p.first[n], e_n);
            for (int r = 0; r < n; r++) {
                const int64_t size = p.first[r + 1] - p.first[r];
                ck_assert(size == e_n / n || size == e_n / n + 1);
                for (int64_t e = p.first[r]; e < p.first[r + 1]; e++)
                    ck_assert_int_eq(mmoe_ep_partition_owner(&p, e), r);
            }
        }
    ck_assert_int_eq(mmoe_ep_partition_make(4, 8, &p, &err), MMOE_EINVAL);
    ck_assert_msg(strstr(err.msg, "8 ranks for 4 routed experts") != NULL, "%s", err.msg);
    ck_assert_int_eq(mmoe_ep_partition_make(4, 0, &p, &err), MMOE_EINVAL);
}
END_TEST

START_TEST(dispatch_by_hand)
{
    /* E = 4 over N = 2: rank 0 holds experts 0, 1; rank 1 holds 2, 3.  T = 3, topk = 2 */
    const int64_t idx[] = {3, 0, 1, -1, 2, 3};
    mmoe_ep_partition p;
    mmoe_ep_dispatch d;
    mmoe_error err;
    ck_assert_int_eq(mmoe_ep_partition_make(4, 2, &p, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_ep_dispatch_build(&p, idx, 3, 2, &d, &err), MMOE_OK);
    /* rank 0: (0,1)->0, (1,0)->1 = pairs 1, 2; rank 1: (0,0)->3, (2,0)->2, (2,1)->3 = pairs 0, 4, 5 */
    const int64_t start[] = {0, 2, 5}, pair[] = {1, 2, 0, 4, 5}, pos[] = {0, 0, 1, -1, 1, 2};
    const int32_t rank_of[] = {1, 0, 0, -1, 1, 1};
    for (int r = 0; r <= 2; r++)
        ck_assert_int_eq(d.start[r], start[r]);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(d.pair[i], pair[i]);
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(d.pos[i], pos[i]);
        ck_assert_int_eq(d.rank_of[i], rank_of[i]);
    }
    ck_assert_int_eq(d.active[0], 2); /* experts 0 and 1 */
    ck_assert_int_eq(d.active[1], 2); /* experts 2 and 3 */
    mmoe_ep_dispatch_free(&d);
    const int64_t bad[] = {4, 0};
    ck_assert_int_eq(mmoe_ep_dispatch_build(&p, bad, 1, 2, &d, &err), MMOE_EINVAL);
    ck_assert_msg(strstr(err.msg, "topk_idx[0][0] = 4") != NULL, "%s", err.msg);
}
END_TEST

/* ------------------------------------------------------------------ the in-process exchange */

/** Size of the batch from rank s to rank q in exchange round k (zero for some pairs). */
static size_t batch_size(int s, int q, int k)
{
    return (size_t)((s * 7 + q * 3 + k * 5) % 6) * 13; /* 0 .. 65 bytes */
}

/** Byte i of the batch from s to q. */
static uint8_t batch_byte(int s, int q, size_t i)
{
    return (uint8_t)(s * 31 + q * 17 + i * 7 + 1);
}

typedef struct xchg_job {
    mmoe_ep_group *g;
    int fail_rank;       /**< rank that brings a failure, -1: none */
    int wrong_size_rank; /**< rank that expects one byte more from rank 0, -1: none */
    int bad[MMOE_EP_MAX_RANKS];
    int peer_failed[MMOE_EP_MAX_RANKS];
} xchg_job;

static mmoe_status xchg_rank(void *vctx, int r, mmoe_error *err)
{
    xchg_job *j = vctx;
    mmoe_ep_comm *c = mmoe_ep_group_comm(j->g, r);
    const int n = c->size;
    for (int k = 0; k < 3; k++) {
        mmoe_ep_batch send[MMOE_EP_MAX_RANKS], recv[MMOE_EP_MAX_RANKS];
        uint8_t *sbuf[MMOE_EP_MAX_RANKS], *rbuf[MMOE_EP_MAX_RANKS];
        for (int q = 0; q < n; q++) {
            const size_t ns = batch_size(r, q, k), nr = batch_size(q, r, k) + (r == j->wrong_size_rank && q == 0);
            sbuf[q] = malloc(ns + 1);
            rbuf[q] = malloc(nr + 1);
            for (size_t i = 0; i < ns; i++)
                sbuf[q][i] = batch_byte(r, q, i);
            memset(rbuf[q], 0xee, nr + 1);
            send[q] = (mmoe_ep_batch){sbuf[q], ns};
            recv[q] = (mmoe_ep_batch){rbuf[q], nr};
        }
        int pf = 0;
        mmoe_status local = r == j->fail_rank ? MMOE_ENOMEM : MMOE_OK;
        mmoe_status st = c->ops->exchange(c, send, recv, local, &pf, err);
        j->peer_failed[r] |= pf;
        for (int q = 0; q < n && st == MMOE_OK; q++) {
            if (q == r)
                continue;
            for (size_t i = 0; i < recv[q].bytes; i++)
                j->bad[r] |= rbuf[q][i] != batch_byte(q, r, i);
            j->bad[r] |= rbuf[q][recv[q].bytes] != 0xee; /* nothing written past the batch */
        }
        for (int q = 0; q < n; q++) {
            free(sbuf[q]);
            free(rbuf[q]);
        }
        if (st != MMOE_OK)
            return st;
    }
    return MMOE_OK;
}

START_TEST(inproc_exchange)
{
    mmoe_error err;
    for (int n = 1; n <= 8; n++) {
        mmoe_ep_group *g;
        mmoe_ep_team *team;
        ck_assert_int_eq(mmoe_ep_group_create_inproc(n, &g, &err), MMOE_OK);
        ck_assert_int_eq(mmoe_ep_team_create(g, &team, &err), MMOE_OK);
        xchg_job j = {.g = g, .fail_rank = -1, .wrong_size_rank = -1};
        ck_assert_msg(mmoe_ep_team_run(team, xchg_rank, &j, &err) == MMOE_OK, "N = %d: %s", n, err.msg);
        for (int r = 0; r < n; r++)
            ck_assert_msg(!j.bad[r] && !j.peer_failed[r], "N = %d: rank %d received wrong bytes", n, r);
        if (n >= 3) {
            /* rank 2 fails: every rank learns it in the same exchange, no one hangs */
            xchg_job f = {.g = g, .fail_rank = 2, .wrong_size_rank = -1};
            ck_assert_int_ne(mmoe_ep_team_run(team, xchg_rank, &f, &err), MMOE_OK);
            for (int r = 0; r < n; r++)
                ck_assert_msg(f.peer_failed[r], "N = %d: rank %d did not see rank 2's failure", n, r);
            ck_assert_msg(strstr(err.msg, "rank 2 failed") != NULL, "%s", err.msg);
            /* rank 1 expects one byte more from rank 0 than it sends */
            xchg_job w = {.g = g, .fail_rank = -1, .wrong_size_rank = 1};
            ck_assert_int_eq(mmoe_ep_team_run(team, xchg_rank, &w, &err), MMOE_EINTERNAL);
            ck_assert_msg(strstr(err.msg, "rank 0 sends") != NULL && strstr(err.msg, "to rank 1, which expects") != NULL,
                          "%s", err.msg);
        }
        mmoe_ep_team_destroy(team);
        mmoe_ep_group_destroy(g);
    }
}
END_TEST

/* ------------------------------------------------------------------ the EP layer */

/** How the tokens of a case are routed. */
typedef enum route_kind {
    ROUTE_ROUTER = 0,  /**< the layer's router (or hash table) */
    ROUTE_ONE_RANK,    /**< given: every slot to experts of rank 0 (the others get no pair) */
    ROUTE_FEW,         /**< given: only the last expert and expert 0 (all others empty) */
    ROUTE_MASKED       /**< the router's routing with slots masked, token 0 entirely */
} route_kind;

typedef struct ep_case {
    const char *name;
    int64_t d, inter, e;
    int topk, n_shared;
    mmoe_moe_routing routing;
    mmoe_moe_shared_mode shared_mode;
    int64_t pad_to;
    int64_t t;
    route_kind route;
} ep_case;

static const ep_case k_cases[] = {
    {"D=256 E=8 topk 2, shared", 256, 256, 8, 2, 1, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 0, 13, ROUTE_ROUTER},
    {"D=128 E=9 (uneven) topk 3, hash, serial shared", 128, 128, 9, 3, 1, MMOE_ROUTING_HASH, MMOE_SHARED_SERIAL, 0, 11,
     ROUTE_ROUTER},
    {"D=128 E=16 topk 6 (V4's), shared", 128, 128, 16, 6, 1, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 0, 16,
     ROUTE_ROUTER},
    {"D=128 E=8 no shared, T=1", 128, 128, 8, 2, 0, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 0, 1, ROUTE_ROUTER},
    {"D=128 E=8 T=0", 128, 128, 8, 2, 1, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 0, 0, ROUTE_ROUTER},
    {"D=128 I=128 padded to 256, E=8", 128, 128, 8, 2, 1, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 256, 7, ROUTE_ROUTER},
    {"all tokens on rank 0's experts", 128, 128, 8, 2, 1, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 0, 9, ROUTE_ONE_RANK},
    {"two experts used, the rest empty", 128, 128, 8, 2, 1, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 0, 9, ROUTE_FEW},
    {"masked slots and a masked token", 128, 128, 8, 3, 1, MMOE_ROUTING_BIASED, MMOE_SHARED_AUTO, 0, 8, ROUTE_MASKED},
};
enum { N_CASES = sizeof k_cases / sizeof k_cases[0] };
static const int k_ranks[] = {1, 2, 3, 8};
enum { N_RANKS = sizeof k_ranks / sizeof k_ranks[0] };

/** The given routing of a case (NULL for the router), from the router's when masking. */
static void make_routing(const ep_case *c, const int64_t *router_idx, const float *router_w, int64_t *idx, float *w,
                         mmoe_rng *rng)
{
    for (int64_t i = 0; i < c->t * c->topk; i++) {
        const int k = (int)(i % c->topk);
        switch (c->route) {
        case ROUTE_ONE_RANK: /* with N = 8 and E = 8 rank 0 holds expert 0 only: repeated ids are allowed */
            idx[i] = 0;
            w[i] = (float)(0.25 + 0.5 * mmoe_rng_uniform(rng));
            break;
        case ROUTE_FEW:
            idx[i] = k == 0 ? c->e - 1 : 0;
            w[i] = (float)(0.25 + 0.5 * mmoe_rng_uniform(rng));
            break;
        case ROUTE_MASKED:
            idx[i] = (i < c->topk || mmoe_rng_below(rng, 3) == 0) ? -1 : router_idx[i];
            w[i] = router_w[i];
            break;
        case ROUTE_ROUTER:
            break;
        }
    }
}

START_TEST(ep_matches_unsplit)
{
    const ep_case *c = &k_cases[_i / MMOE_RECIPE_COUNT];
    const mmoe_moe_recipe recipe = (mmoe_moe_recipe)(_i % MMOE_RECIPE_COUNT);
    const uint64_t seed = g_seed + 7919u * (uint64_t)_i;
    mmoe_moe_desc d;
    mmoe_moe_desc_init(&d);
    d.hidden = c->d;
    d.inter = c->inter;
    d.n_experts = c->e;
    d.topk = c->topk;
    d.n_shared = c->n_shared;
    d.shared_inter = c->inter;
    d.routing = c->routing;
    d.shared_mode = c->shared_mode;
    d.routed_scaling_factor = 1.5f;
    d.vocab = 64;
    d.recipe = recipe;
    d.pad_to = c->pad_to;
    mmoe_error err;
    mmoe_moe_synth *synth;
    mmoe_moe_layer *ref;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, seed, MMOE_SYNTH_NORMAL, &synth, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_moe_layer_create(&d, &ref, &err), MMOE_OK);
    ck_assert_msg(mmoe_moe_layer_set_weights(ref, mmoe_moe_synth_weights(synth), &err) == MMOE_OK, "%s", err.msg);
    const int64_t t = c->t, D = c->d, slots = t * c->topk;
    uint16_t *x = malloc((size_t)(t * D + 1) * 2), *y_ref = malloc((size_t)(t * D + 1) * 2);
    uint16_t *y = malloc((size_t)(t * D + 1) * 2);
    int32_t *ids = malloc((size_t)(t + 1) * sizeof(int32_t));
    int64_t *idx_ref = malloc((size_t)(slots + 1) * sizeof(int64_t)), *idx = malloc((size_t)(slots + 1) * sizeof(int64_t));
    int64_t *given_idx = malloc((size_t)(slots + 1) * sizeof(int64_t));
    float *w_ref = malloc((size_t)(slots + 1) * sizeof(float)), *w = malloc((size_t)(slots + 1) * sizeof(float));
    float *given_w = malloc((size_t)(slots + 1) * sizeof(float));
    ck_assert(x && y_ref && y && ids && idx_ref && idx && given_idx && w_ref && w && given_w);
    mmoe_moe_synth_input(&d, t, seed ^ 0xe9u, MMOE_SYNTH_NORMAL, x, ids);
    const int32_t *ids_or_null = d.routing == MMOE_ROUTING_HASH ? ids : NULL;

    /* the unsplit reference; for given routings, first route, then run with the given ones */
    mmoe_moe_input in = {t, x, ids_or_null, NULL, NULL};
    mmoe_moe_output out = {y_ref, idx_ref, w_ref};
    ck_assert_msg(mmoe_moe_layer_run(ref, &in, &out, NULL, &err) == MMOE_OK, "%s", err.msg);
    if (c->route != ROUTE_ROUTER) {
        mmoe_rng rng;
        mmoe_rng_seed(&rng, seed ^ 0x40u);
        make_routing(c, idx_ref, w_ref, given_idx, given_w, &rng);
        in.topk_idx = given_idx;
        in.topk_weights = given_w;
        mmoe_test_poison_bf16(y_ref, (size_t)(t * D));
        ck_assert_msg(mmoe_moe_layer_run(ref, &in, &out, NULL, &err) == MMOE_OK, "%s", err.msg);
    }

    for (int ni = 0; ni < N_RANKS; ni++) {
        const int n = k_ranks[ni];
        if (n > c->e)
            continue;
        mmoe_ep_group *g;
        mmoe_ep_team *team;
        mmoe_ep_moe *ep;
        ck_assert_int_eq(mmoe_ep_group_create_inproc(n, &g, &err), MMOE_OK);
        ck_assert_int_eq(mmoe_ep_team_create(g, &team, &err), MMOE_OK);
        ck_assert_msg(mmoe_ep_moe_create(&d, mmoe_moe_synth_weights(synth), team, mmoe_ep_executor_cpu, NULL, &ep,
                                         &err) == MMOE_OK,
                      "%s: %s", c->name, err.msg);
        mmoe_test_poison_bf16(y, (size_t)(t * D));
        mmoe_test_poison_f32(w, (size_t)slots);
        memset(idx, 0x5a, (size_t)slots * sizeof(int64_t));
        mmoe_moe_output eout = {y, idx, w};
        mmoe_ep_result res;
        ck_assert_msg(mmoe_ep_moe_run(ep, &in, &eout, &res, &err) == MMOE_OK, "%s N=%d: %s", c->name, n, err.msg);
        ck_assert_int_eq(memcmp(idx, out.topk_idx, (size_t)slots * sizeof(int64_t)), 0);
        ck_assert_int_eq(memcmp(w, out.topk_weights, (size_t)slots * sizeof(float)), 0);
        for (int64_t i = 0; i < t * D; i++)
            ck_assert_msg(y[i] == y_ref[i], "%s, recipe %s, N = %d: token %lld channel %lld: EP 0x%04x, unsplit 0x%04x",
                          c->name, mmoe_moe_recipe_name(recipe), n, (long long)(i / D), (long long)(i % D), y[i],
                          y_ref[i]);
        ck_assert(res.ranks_agree);
        int64_t pairs = 0;
        for (int r = 0; r < n; r++)
            pairs += res.pairs[r];
        ck_assert_int_eq(pairs, res.routed_pairs);
        if (c->route == ROUTE_ONE_RANK && t > 0)
            for (int r = 1; r < n; r++)
                ck_assert_int_eq(res.pairs[r], 0);
        mmoe_ep_moe_destroy(ep);
        mmoe_ep_team_destroy(team);
        mmoe_ep_group_destroy(g);
    }
    free(x);
    free(y_ref);
    free(y);
    free(ids);
    free(idx_ref);
    free(idx);
    free(given_idx);
    free(w_ref);
    free(w);
    free(given_w);
    mmoe_moe_layer_destroy(ref);
    mmoe_moe_synth_destroy(synth);
}
END_TEST


/* ------------------------------------------------------------------ the combine order */

/* The combine's FP32 sums of BF16 rows are exact for rows of similar magnitude, so the layer
 * cases above cannot see a wrong order.  Here an executor returns designed rows: expert e's
 * row holds +1, -1 or 3 * 2^-24 by e mod 3 (1 + 3 * 2^-24 rounds to 1 in FP32, so the sum of
 * the three depends on the order), and the shared row 2^-30.  The expected output is this
 * test's own combine: the recipe's order (slots ascending for sm100/sm90, expert ids ascending
 * for dsv4-ref), FP32 from +0, shared last, rounded to BF16 once. */

static float designed_value(int64_t e)
{
    return e % 3 == 0 ? 1.0f : e % 3 == 1 ? -1.0f : 0x3p-24f;
}

static uint16_t bf16_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)(u >> 16); /* the designed values are exact in BF16 */
}

typedef struct designed_exec {
    mmoe_ep_executor head;
    int64_t first;
    int64_t d;
} designed_exec;

static mmoe_status designed_pairs(mmoe_ep_executor *x, int64_t n, const uint16_t *xr, const int64_t *lid,
                                  const float *w, uint16_t *y, mmoe_error *err)
{
    designed_exec *de = (designed_exec *)x;
    for (int64_t j = 0; j < n; j++)
        for (int64_t c = 0; c < de->d; c++)
            y[j * de->d + c] = bf16_bits(designed_value(de->first + lid[j]));
    return MMOE_OK;
}

static mmoe_status designed_shared(mmoe_ep_executor *x, int64_t n, const uint16_t *xr, uint16_t *y, mmoe_error *err)
{
    designed_exec *de = (designed_exec *)x;
    for (int64_t i = 0; i < n * de->d; i++)
        y[i] = bf16_bits(0x1p-30f);
    return MMOE_OK;
}

static void designed_destroy(mmoe_ep_executor *x)
{
    free(x);
}

static const mmoe_ep_executor_ops designed_ops = {designed_pairs, designed_shared, designed_destroy};

static mmoe_status designed_factory(void *ctx, const mmoe_moe_desc *desc, const mmoe_moe_weights *w, int rank,
                                    int64_t first, int64_t n_local, mmoe_ep_executor **out, mmoe_error *err)
{
    designed_exec *de = calloc(1, sizeof *de);
    ck_assert_ptr_nonnull(de);
    de->head.ops = &designed_ops;
    de->head.backend = "designed";
    de->first = first;
    de->d = desc->hidden;
    *out = &de->head;
    return MMOE_OK;
}

START_TEST(combine_order)
{
    const mmoe_moe_recipe recipe = (mmoe_moe_recipe)_i;
    mmoe_moe_desc d;
    mmoe_error err;
    ck_assert_int_eq(mmoe_moe_desc_from_shape("tiny", 9, &d, &err), MMOE_OK);
    d.topk = 3;
    d.recipe = recipe;
    mmoe_moe_synth *synth;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, g_seed, MMOE_SYNTH_NORMAL, &synth, &err), MMOE_OK);
    /* every ordering of three experts of classes +1, -1, tiny, and one with a masked slot */
    const int64_t routes[][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0},
                                 {3, 8, 4}, {7, 5, 6}, {-1, 2, 0}, {2, -1, 3}};
    enum { T = sizeof routes / sizeof routes[0] };
    int64_t idx[T * 3];
    float w[T * 3];
    for (int i = 0; i < T * 3; i++) {
        idx[i] = routes[i / 3][i % 3];
        w[i] = 1.0f;
    }
    const int64_t D = d.hidden;
    uint16_t *x = calloc((size_t)(T * D), 2), *y = malloc((size_t)(T * D) * 2);
    ck_assert(x && y);
    for (int ni = 0; ni < N_RANKS; ni++) {
        const int n = k_ranks[ni];
        mmoe_ep_group *g;
        mmoe_ep_team *team;
        mmoe_ep_moe *ep;
        ck_assert_int_eq(mmoe_ep_group_create_inproc(n, &g, &err), MMOE_OK);
        ck_assert_int_eq(mmoe_ep_team_create(g, &team, &err), MMOE_OK);
        ck_assert_int_eq(mmoe_ep_moe_create(&d, mmoe_moe_synth_weights(synth), team, designed_factory, NULL, &ep, &err),
                         MMOE_OK);
        mmoe_test_poison_bf16(y, (size_t)(T * D));
        mmoe_moe_input in = {T, x, NULL, idx, w};
        mmoe_moe_output out = {y, NULL, NULL};
        ck_assert_msg(mmoe_ep_moe_run(ep, &in, &out, NULL, &err) == MMOE_OK, "%s", err.msg);
        for (int t = 0; t < T; t++) {
            int order[3] = {0, 1, 2};
            if (recipe == MMOE_RECIPE_DSV4_REF) /* ascending expert id (masked slots are skipped anyway) */
                for (int a = 0; a < 3; a++)
                    for (int b = a + 1; b < 3; b++)
                        if (routes[t][order[b]] < routes[t][order[a]]) {
                            int tmp = order[a];
                            order[a] = order[b];
                            order[b] = tmp;
                        }
            float acc = 0.0f;
            for (int k = 0; k < 3; k++)
                if (routes[t][order[k]] >= 0)
                    acc += designed_value(routes[t][order[k]]);
            acc += 0x1p-30f;
            /* BF16 round to nearest even, written here (acc is finite) */
            uint32_t u;
            memcpy(&u, &acc, 4);
            const uint16_t want = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            ck_assert_msg(y[t * D] == want, "recipe %s, N = %d, token %d: got 0x%04x, expected 0x%04x (%a)",
                          mmoe_moe_recipe_name(recipe), n, t, y[t * D], want, (double)acc);
            for (int64_t c = 1; c < D; c++)
                ck_assert_int_eq(y[t * D + c], y[t * D]);
        }
        mmoe_ep_moe_destroy(ep);
        mmoe_ep_team_destroy(team);
        mmoe_ep_group_destroy(g);
    }
    free(x);
    free(y);
    mmoe_moe_synth_destroy(synth);
}
END_TEST

/* ------------------------------------------------------------------ failures */

/** An executor that wraps the CPU one and fails on one rank (at creation or in a call). */
typedef struct flaky_ctx {
    int fail_create_rank; /**< -1: none */
    int fail_run_rank;    /**< -1: none */
} flaky_ctx;

typedef struct flaky_exec {
    mmoe_ep_executor head;
    mmoe_ep_executor *inner;
    int fail;
} flaky_exec;

static mmoe_status flaky_pairs(mmoe_ep_executor *x, int64_t n, const uint16_t *xr, const int64_t *lid, const float *w,
                               uint16_t *y, mmoe_error *err)
{
    flaky_exec *f = (flaky_exec *)x;
    if (f->fail)
        return mmoe_error_set(err, MMOE_ENOMEM, "flaky: out of memory on purpose");
    return f->inner->ops->run_pairs(f->inner, n, xr, lid, w, y, err);
}

static mmoe_status flaky_shared(mmoe_ep_executor *x, int64_t n, const uint16_t *xr, uint16_t *y, mmoe_error *err)
{
    flaky_exec *f = (flaky_exec *)x;
    return f->inner->ops->run_shared(f->inner, n, xr, y, err);
}

static void flaky_destroy(mmoe_ep_executor *x)
{
    flaky_exec *f = (flaky_exec *)x;
    f->inner->ops->destroy(f->inner);
    free(f);
}

static const mmoe_ep_executor_ops flaky_ops = {flaky_pairs, flaky_shared, flaky_destroy};

static mmoe_status flaky_factory(void *ctx, const mmoe_moe_desc *desc, const mmoe_moe_weights *w, int rank,
                                 int64_t first, int64_t n_local, mmoe_ep_executor **out, mmoe_error *err)
{
    const flaky_ctx *fc = ctx;
    if (rank == fc->fail_create_rank)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "flaky: no executor on purpose");
    flaky_exec *f = calloc(1, sizeof *f);
    ck_assert_ptr_nonnull(f);
    mmoe_status st = mmoe_ep_executor_cpu(NULL, desc, w, rank, first, n_local, &f->inner, err);
    if (st != MMOE_OK) {
        free(f);
        return st;
    }
    f->head = *f->inner;
    f->head.ops = &flaky_ops;
    f->fail = rank == fc->fail_run_rank;
    *out = &f->head;
    return MMOE_OK;
}

START_TEST(rank_failures)
{
    mmoe_moe_desc d;
    mmoe_error err;
    ck_assert_int_eq(mmoe_moe_desc_from_shape("tiny", 8, &d, &err), MMOE_OK);
    mmoe_moe_synth *synth;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, g_seed, MMOE_SYNTH_NORMAL, &synth, &err), MMOE_OK);
    mmoe_ep_group *g;
    mmoe_ep_team *team;
    mmoe_ep_moe *ep = NULL;
    ck_assert_int_eq(mmoe_ep_group_create_inproc(4, &g, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_ep_team_create(g, &team, &err), MMOE_OK);
    flaky_ctx fc = {2, -1};
    ck_assert_int_eq(mmoe_ep_moe_create(&d, mmoe_moe_synth_weights(synth), team, flaky_factory, &fc, &ep, &err),
                     MMOE_EUNSUPPORTED);
    ck_assert_ptr_null(ep);
    ck_assert_msg(strstr(err.msg, "rank 2: flaky: no executor") != NULL, "%s", err.msg);
    fc = (flaky_ctx){-1, 3};
    ck_assert_int_eq(mmoe_ep_moe_create(&d, mmoe_moe_synth_weights(synth), team, flaky_factory, &fc, &ep, &err),
                     MMOE_OK);
    const int64_t t = 16;
    uint16_t *x = malloc((size_t)(t * d.hidden) * 2), *y = malloc((size_t)(t * d.hidden) * 2);
    ck_assert(x && y);
    mmoe_moe_synth_input(&d, t, g_seed ^ 3u, MMOE_SYNTH_NORMAL, x, NULL);
    /* every token to expert 7 (rank 3) and 0 */
    int64_t idx[2 * 16];
    float w[2 * 16];
    for (int i = 0; i < 2 * 16; i++) {
        idx[i] = i % 2 ? 7 : 0;
        w[i] = 0.5f;
    }
    mmoe_moe_input in = {t, x, NULL, idx, w};
    mmoe_moe_output out = {y, NULL, NULL};
    ck_assert_int_eq(mmoe_ep_moe_run(ep, &in, &out, NULL, &err), MMOE_ENOMEM);
    ck_assert_msg(strstr(err.msg, "rank 3: flaky: out of memory on purpose") != NULL, "%s", err.msg);
    /* the team is still usable: a bad routing is refused before any rank runs */
    idx[5] = 8;
    ck_assert_int_eq(mmoe_ep_moe_run(ep, &in, &out, NULL, &err), MMOE_EINVAL);
    ck_assert_msg(strstr(err.msg, "topk_idx[2][1] = 8") != NULL, "%s", err.msg);
    mmoe_ep_moe_destroy(ep);
    mmoe_ep_team_destroy(team);
    mmoe_ep_group_destroy(g);
    mmoe_moe_synth_destroy(synth);
    free(x);
    free(y);
}
END_TEST

/* ------------------------------------------------------------------ memory plan */

START_TEST(memory_plan_by_hand)
{
    /* 2 layers x 3 experts of 100 bytes per tensor pair, a shared expert, and globals */
    const char *names[] = {"embed.weight",
                           "layers.0.ffn.experts.0.w1.weight", "layers.0.ffn.experts.1.w1.weight",
                           "layers.0.ffn.experts.2.w1.weight", "layers.0.ffn.shared_experts.w1.weight",
                           "layers.1.ffn.experts.0.w1.scale", "layers.1.ffn.experts.1.w1.scale",
                           "layers.1.ffn.experts.2.w1.scale", "mtp.0.ffn.experts.2.w2.weight"};
    const uint64_t bytes[] = {1000, 100, 100, 100, 50, 10, 10, 10, 7};
    mmoe_ep_memory_plan p;
    mmoe_error err;
    /* N = 2: rank 0 holds experts 0, 1 (220 bytes), rank 1 expert 2 (117): per GPU 1050 + 220 */
    ck_assert_int_eq(mmoe_ep_memory_plan_make(names, bytes, 9, 3, 2, 1200, &p, &err), MMOE_OK);
    ck_assert_uint_eq(p.replicated_bytes, 1050);
    ck_assert_uint_eq(p.expert_bytes, 337);
    ck_assert_uint_eq(p.per_gpu_bytes, 1270);
    ck_assert_int_eq(p.min_gpus, 3); /* N = 3: 1050 + 117 = 1167 <= 1200 */
    ck_assert_int_eq(mmoe_ep_memory_check(&p, &err), MMOE_EUNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "per GPU on 2 GPUs") != NULL && strstr(err.msg, "at least 3 GPUs") != NULL, "%s",
                  err.msg);
    ck_assert_int_eq(mmoe_ep_memory_plan_make(names, bytes, 9, 3, 3, 1200, &p, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_ep_memory_check(&p, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_ep_memory_plan_make(names, bytes, 9, 3, 4, 1200, &p, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_ep_memory_plan_make(names, bytes, 9, 2, 1, 1200, &p, &err), MMOE_EINVAL);
    ck_assert_msg(strstr(err.msg, "names expert 2 of 2") != NULL, "%s", err.msg);
}
END_TEST

static Suite *ep_suite(void)
{
    Suite *s = suite_create("ep_moe");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, partition_by_hand);
    tcase_add_test(tc, dispatch_by_hand);
    tcase_add_test(tc, memory_plan_by_hand);
    suite_add_tcase(s, tc);
    tc = tcase_create("comm");
    tcase_add_test(tc, inproc_exchange);
    tcase_add_test(tc, rank_failures);
    suite_add_tcase(s, tc);
    tc = tcase_create("layer");
    tcase_add_loop_test(tc, ep_matches_unsplit, 0, N_CASES * MMOE_RECIPE_COUNT);
    tcase_add_loop_test(tc, combine_order, 0, MMOE_RECIPE_COUNT);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("ep_moe");
    return mmoe_test_run(ep_suite());
}
