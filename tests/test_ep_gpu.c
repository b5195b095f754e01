/**
 * @file test_ep_gpu.c
 * @brief Suite "ep_gpu": expert parallelism on GPUs through NCCL (skipped, exit 77, without a
 *        GPU or without NCCL in the build).
 *
 * Run it alone with `./tests/test_ep_gpu` (or `make check TESTS=tests/test_ep_gpu`); it uses
 * every GPU of the machine, up to 8 and up to E, as ranks (MMOE_EP_GPUS=n uses n).
 *
 *  - the NCCL exchange: random batch sizes (zero included) between the ranks arrive intact,
 *    and a rank that fails before the exchange is reported by all (with one GPU: the one-rank
 *    communicator, whose exchange moves nothing but runs the whole staging path);
 *  - the EP layer with GPU executors over the NCCL group against the CPU oracle's unsplit layer
 *    on the same weights and routing, recipes sm90 and sm100, with the GPU suite's comparison
 *    (tests/gpu_moe_compare.h: the GPU and the oracle differ only in the order of FP32
 *    additions inside the GEMMs: relative L2 <= 2^-8, at most 0.5 % of the elements beyond 2
 *    BF16 ulps, a token first explained by requantization flips where it needs them);
 *    T = 0, 1, 3 (split-K), 40 and 300; random routing, every token on rank 0's experts, masked
 *    slots;
 *  - the same layer over the in-process group with one rank (the same GPU executor, no NCCL):
 *    with one GPU the two outputs must be the same bits, as only the transport differs; with
 *    several GPUs the count of elements that differ from the one-rank result is printed (the
 *    GPU layer picks split-K by its row count, so the N-GPU result may differ within the bound).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"
#include "mmoe_ep.h"
#include "mmoe_formats.h"
#include "mmoe_gpu_moe.h"
#include "mmoe_moe.h"
#include "mmoe_moe_synth.h"
#include "mmoe_rng.h"
#include "mmoe_test.h"
#include "gpu_moe_compare.h"

static uint64_t g_seed;
static int g_gpus;

/* ------------------------------------------------------------------ the NCCL exchange */

static size_t batch_size(int s, int q, int k)
{
    return (size_t)((s * 7 + q * 3 + k * 5) % 6) * 4099; /* 0 .. 20 KB, odd sizes */
}

static uint8_t batch_byte(int s, int q, size_t i)
{
    return (uint8_t)(s * 31 + q * 17 + i * 7 + 1);
}

typedef struct xchg_job {
    mmoe_ep_group *g;
    int fail_rank;
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
            const size_t ns = batch_size(r, q, k), nr = batch_size(q, r, k);
            sbuf[q] = malloc(ns + 1);
            rbuf[q] = malloc(nr + 1);
            for (size_t i = 0; i < ns; i++)
                sbuf[q][i] = batch_byte(r, q, i);
            memset(rbuf[q], 0xee, nr + 1);
            send[q] = (mmoe_ep_batch){sbuf[q], ns};
            recv[q] = (mmoe_ep_batch){rbuf[q], nr};
        }
        int pf = 0;
        mmoe_status st = c->ops->exchange(c, send, recv, r == j->fail_rank ? MMOE_ENOMEM : MMOE_OK, &pf, err);
        j->peer_failed[r] |= pf;
        for (int q = 0; q < n && st == MMOE_OK; q++) {
            if (q == r)
                continue;
            for (size_t i = 0; i < recv[q].bytes; i++)
                j->bad[r] |= rbuf[q][i] != batch_byte(q, r, i);
            j->bad[r] |= rbuf[q][recv[q].bytes] != 0xee;
        }
        for (int q = 0; q < n; q++) {
            free(sbuf[q]);
            free(rbuf[q]);
        }
        if (st != MMOE_OK)
            return r == j->fail_rank ? MMOE_ENOMEM : pf ? MMOE_OK : st; /* the failed rank reports its cause */
    }
    return MMOE_OK;
}

START_TEST(nccl_exchange)
{
    mmoe_error err;
    mmoe_ep_group *g;
    mmoe_ep_team *team;
    ck_assert_msg(mmoe_ep_group_create_nccl(g_gpus, &g, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(mmoe_ep_team_create(g, &team, &err), MMOE_OK);
    xchg_job j = {.g = g, .fail_rank = -1};
    ck_assert_msg(mmoe_ep_team_run(team, xchg_rank, &j, &err) == MMOE_OK, "%s", err.msg);
    for (int r = 0; r < g_gpus; r++)
        ck_assert_msg(!j.bad[r] && !j.peer_failed[r], "rank %d received wrong bytes", r);
    xchg_job f = {.g = g, .fail_rank = g_gpus - 1};
    ck_assert_int_eq(mmoe_ep_team_run(team, xchg_rank, &f, &err), MMOE_ENOMEM);
    for (int r = 0; r < g_gpus; r++)
        ck_assert_msg(f.peer_failed[r], "rank %d did not see the failure", r);
    printf("  nccl exchange over %d GPU(s): ok\n", g_gpus);
    mmoe_ep_team_destroy(team);
    mmoe_ep_group_destroy(g);
}
END_TEST

/* ------------------------------------------------------------------ the EP layer on GPUs */

/** Make an EP layer over @p g with GPU executors. */
static mmoe_ep_moe *make_ep(const mmoe_moe_desc *d, const mmoe_moe_weights *w, mmoe_ep_group *g, mmoe_ep_team **team)
{
    mmoe_error err;
    mmoe_ep_moe *ep;
    ck_assert_int_eq(mmoe_ep_team_create(g, team, &err), MMOE_OK);
    ck_assert_msg(mmoe_ep_moe_create(d, w, *team, mmoe_ep_executor_gpu, NULL, &ep, &err) == MMOE_OK, "%s", err.msg);
    return ep;
}

/* loop index: recipe (sm90, sm100) */
START_TEST(ep_layer_on_gpus)
{
    const mmoe_moe_recipe recipe = _i == 0 ? MMOE_RECIPE_SM90 : MMOE_RECIPE_SM100;
    mmoe_moe_desc d;
    mmoe_error err;
    mmoe_moe_desc_init(&d);
    d.hidden = 512;
    d.inter = 256;
    d.n_experts = 16;
    d.topk = 6;
    d.n_shared = 1;
    d.shared_inter = 256;
    d.routed_scaling_factor = 1.5f;
    d.recipe = recipe;
    mmoe_moe_synth *synth;
    ck_assert_int_eq(mmoe_moe_synth_create(&d, g_seed + (uint64_t)_i, MMOE_SYNTH_NORMAL, &synth, &err), MMOE_OK);
    const mmoe_moe_weights *w = mmoe_moe_synth_weights(synth);
    mmoe_moe_layer *oracle;
    ck_assert_int_eq(mmoe_moe_layer_create(&d, &oracle, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_moe_layer_set_weights(oracle, w, &err), MMOE_OK);
    mmoe_ep_group *gn, *g1;
    mmoe_ep_team *tn, *t1;
    ck_assert_msg(mmoe_ep_group_create_nccl(g_gpus, &gn, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(mmoe_ep_group_create_inproc(1, &g1, &err), MMOE_OK);
    mmoe_ep_moe *epn = make_ep(&d, w, gn, &tn), *ep1 = make_ep(&d, w, g1, &t1);
    static const int64_t ts[] = {0, 1, 3, 40, 300};
    const int64_t D = d.hidden, K = d.topk;
    for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++)
        for (int route = 0; route < 3; route++) {
            const int64_t t = ts[ti];
            uint16_t *x = malloc((size_t)(t * D + 1) * 2), *y_ref = malloc((size_t)(t * D + 1) * 2);
            uint16_t *yn = malloc((size_t)(t * D + 1) * 2), *y1 = malloc((size_t)(t * D + 1) * 2);
            int64_t *idx = malloc((size_t)(t * K + 1) * sizeof *idx);
            float *wt = malloc((size_t)(t * K + 1) * sizeof *wt);
            ck_assert(x && y_ref && yn && y1 && idx && wt);
            mmoe_moe_synth_input(&d, t, g_seed ^ (uint64_t)(ti * 3 + (size_t)route), MMOE_SYNTH_NORMAL, x, NULL);
            /* route 0: the oracle's router; 1: every slot on rank 0's experts; 2: router + masks */
            mmoe_moe_input rin = {t, x, NULL, NULL, NULL};
            mmoe_moe_output rout = {y_ref, idx, wt};
            ck_assert_int_eq(mmoe_moe_layer_run(oracle, &rin, &rout, NULL, &err), MMOE_OK);
            mmoe_rng rng;
            mmoe_rng_seed(&rng, g_seed + 5u * ti + (uint64_t)route);
            for (int64_t i = 0; i < t * K; i++) {
                if (route == 1)
                    idx[i] = (int64_t)(i % K) % (16 / g_gpus); /* experts of rank 0 (repeats allowed) */
                if (route == 2 && mmoe_rng_below(&rng, 3) == 0)
                    idx[i] = -1;
            }
            mmoe_moe_input in = {t, x, NULL, idx, wt};
            mmoe_moe_output out = {y_ref, NULL, NULL};
            ck_assert_int_eq(mmoe_moe_layer_run(oracle, &in, &out, NULL, &err), MMOE_OK);
            mmoe_test_poison_bf16(yn, (size_t)(t * D));
            mmoe_test_poison_bf16(y1, (size_t)(t * D));
            mmoe_moe_output on = {yn, NULL, NULL}, o1 = {y1, NULL, NULL};
            mmoe_ep_result res;
            ck_assert_msg(mmoe_ep_moe_run(epn, &in, &on, &res, &err) == MMOE_OK, "%s", err.msg);
            ck_assert(res.ranks_agree);
            ck_assert_msg(mmoe_ep_moe_run(ep1, &in, &o1, NULL, &err) == MMOE_OK, "%s", err.msg);
            char what[160];
            snprintf(what, sizeof what, "%s, %d GPU(s), T = %lld, routing %s", mmoe_moe_recipe_name(recipe), g_gpus,
                     (long long)t, route == 0 ? "router" : route == 1 ? "all on rank 0" : "masked");
            const gmc_layer layer = {&d, w, idx};
            gmc_assert_close(what, &layer, yn, y_ref, t, D, g_seed);
            int64_t differ = 0;
            for (int64_t i = 0; i < t * D; i++)
                differ += yn[i] != y1[i];
            printf("    vs one rank: %lld of %lld elements differ\n", (long long)differ, (long long)(t * D));
            if (g_gpus == 1)
                ck_assert_msg(differ == 0, "%s: NCCL one rank and in-process one rank differ", what);
            free(x);
            free(y_ref);
            free(yn);
            free(y1);
            free(idx);
            free(wt);
        }
    mmoe_ep_moe_destroy(epn);
    mmoe_ep_moe_destroy(ep1);
    mmoe_ep_team_destroy(tn);
    mmoe_ep_team_destroy(t1);
    mmoe_ep_group_destroy(gn);
    mmoe_ep_group_destroy(g1);
    mmoe_moe_layer_destroy(oracle);
    mmoe_moe_synth_destroy(synth);
}
END_TEST

static Suite *ep_gpu_suite(void)
{
    Suite *s = suite_create("ep_gpu");
    TCase *tc = tcase_create("nccl");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, nccl_exchange);
    tcase_add_loop_test(tc, ep_layer_on_gpus, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    mmoe_error err;
    uint64_t mem = 0;
    if (ep_cuda_devices(&g_gpus, &mem, &err) != MMOE_OK) {
        printf("SKIP: %s\n", err.msg);
        return MMOE_TEST_SKIP;
    }
    mmoe_ep_group *probe;
    if (g_gpus > 8)
        g_gpus = 8;
    const char *env = getenv("MMOE_EP_GPUS");
    if (env != NULL && atoi(env) >= 1 && atoi(env) <= g_gpus)
        g_gpus = atoi(env);
    if (mmoe_ep_group_create_nccl(1, &probe, &err) != MMOE_OK) {
        printf("SKIP: %s\n", err.msg);
        return MMOE_TEST_SKIP;
    }
    mmoe_ep_group_destroy(probe);
    setvbuf(stdout, NULL, _IONBF, 0);
    setenv("CK_FORK", "no", 1); /* CUDA state does not survive fork() */
    g_seed = mmoe_test_seed("ep_gpu");
    printf("GPUs used as ranks: %d\n", g_gpus);
    return mmoe_test_run(ep_gpu_suite());
}
