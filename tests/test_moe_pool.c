/**
 * @file test_moe_pool.c
 * @brief A dequantization pool shared by several MoE layers (::mmoe_moe_pool) gives the same bits
 *        as a pool per layer, and a whole model starts one pool, not one per layer.
 *
 * The reference of every comparison is the same layer on a pool of its own
 * (mmoe_moe_layer_create()), the behaviour the oracle had before pools could be shared; its
 * exactness against the formats' definitions is test_moe_dequant's subject.  Dequantization is
 * exact and the GEMMs are untouched, so every comparison is bit for bit (no tolerance).
 *
 * Cases: one layer on a shared pool; two layers of different weights on one pool, run
 * alternately, with the creator's reference dropped first (the layers keep the pool alive);
 * the same two layers run at once from two threads (misuse that the pool serializes: same
 * bits, and under ThreadSanitizer no race); the argument errors; one layer on pools of 1, 2 and
 * 3 threads (the experts' tiled GEMMs take another path with more than one thread: same bits);
 * and the thread count of a
 * model, read from /proc/self/task around mmoe_model_open(): one pool's workers for any number
 * of layers, where one pool per layer (measured here with layers on their own pools) starts
 * (threads - 1) workers per layer.
 *
 * Inputs are fresh random values each run (seed printed); outputs are poisoned with NaN
 * patterns before each call.
 */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_config.h"
#include "mmoe_model.h"
#include "mmoe_moe.h"
#include "mmoe_moe_synth.h"
#include "mmoe_synth_model.h"
#include "mmoe_test.h"

static uint64_t g_seed;

/** Threads including the caller that every pool of this test gets (workers: POOL_THREADS - 1). */
#define POOL_THREADS 3
/** Tokens per call: enough for several experts per call. */
#define N_TOKENS 13

/** A synthetic layer's weights and one input batch, with the tiny shape. */
typedef struct fixture {
    mmoe_moe_desc desc;
    mmoe_moe_synth *synth;
    uint16_t x[N_TOKENS * 256];
    int32_t ids[N_TOKENS];
} fixture;

static void fixture_init(fixture *f, uint64_t seed)
{
    mmoe_error err;
    ck_assert_int_eq(mmoe_moe_desc_from_shape("tiny", 0, &f->desc, &err), MMOE_OK);
    ck_assert_int_eq(f->desc.hidden, 256);
    f->desc.vocab = 64;
    ck_assert_msg(mmoe_moe_synth_create(&f->desc, seed, MMOE_SYNTH_NORMAL, &f->synth, &err) == MMOE_OK, "%s",
                  err.msg);
    mmoe_moe_synth_input(&f->desc, N_TOKENS, seed ^ 0x5eedu, MMOE_SYNTH_NORMAL, f->x, f->ids);
}

/** Attach @p f's weights to @p layer. */
static void attach(mmoe_moe_layer *layer, const fixture *f)
{
    mmoe_error err;
    ck_assert_msg(mmoe_moe_layer_set_weights(layer, mmoe_moe_synth_weights(f->synth), &err) == MMOE_OK, "%s",
                  err.msg);
}

/** Run @p layer on @p f's batch into @p y (poisoned first). */
static void run_layer(mmoe_moe_layer *layer, const fixture *f, uint16_t *y)
{
    mmoe_error err;
    mmoe_test_poison_bf16(y, N_TOKENS * 256);
    mmoe_moe_input in = {.n_tokens = N_TOKENS, .x = f->x,
                         .token_ids = f->desc.routing == MMOE_ROUTING_HASH ? f->ids : NULL};
    mmoe_moe_output out = {.y = y};
    ck_assert_msg(mmoe_moe_layer_run(layer, &in, &out, NULL, &err) == MMOE_OK, "%s", err.msg);
}

/** The reference: @p f on a layer with a pool of its own. */
static void run_own_pool(const fixture *f, uint16_t *y)
{
    mmoe_error err;
    mmoe_moe_layer *layer = NULL;
    ck_assert_int_eq(mmoe_moe_layer_create(&f->desc, &layer, &err), MMOE_OK);
    attach(layer, f);
    run_layer(layer, f, y);
    mmoe_moe_layer_destroy(layer);
}

static void assert_n_same_bits(const char *what, const uint16_t *a, const uint16_t *b, int n)
{
    for (int i = 0; i < n; i++)
        ck_assert_msg(a[i] == b[i], "%s: element %d differs: 0x%04x vs 0x%04x (seed %llu)", what, i, a[i], b[i],
                      (unsigned long long)g_seed);
}

static void assert_same_bits(const char *what, const uint16_t *a, const uint16_t *b)
{
    assert_n_same_bits(what, a, b, N_TOKENS * 256);
}

static void set_pool_env(void)
{
    char v[8];
    snprintf(v, sizeof v, "%d", POOL_THREADS);
    setenv("MMOE_DEQUANT_THREADS", v, 1);
}

START_TEST(shared_pool_same_bits)
{
    set_pool_env();
    fixture f;
    fixture_init(&f, g_seed);
    static uint16_t ref[N_TOKENS * 256], got[N_TOKENS * 256];
    run_own_pool(&f, ref);

    mmoe_error err;
    mmoe_moe_pool *pool = NULL;
    ck_assert_int_eq(mmoe_moe_pool_create(POOL_THREADS, &pool, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_moe_pool_threads(pool), POOL_THREADS);
    mmoe_moe_layer *layer = NULL;
    ck_assert_int_eq(mmoe_moe_layer_create_on_pool(&f.desc, pool, &layer, &err), MMOE_OK);
    attach(layer, &f);
    for (int rep = 0; rep < 2; rep++) {
        run_layer(layer, &f, got);
        assert_same_bits("layer on a shared pool", ref, got);
    }
    mmoe_moe_layer_destroy(layer);
    mmoe_moe_pool_destroy(pool);
    mmoe_moe_synth_destroy(f.synth);
    unsetenv("MMOE_DEQUANT_THREADS");
}
END_TEST

/** Two layers of different weights and their own-pool references. */
typedef struct two_layers {
    fixture f[2];
    uint16_t ref[2][N_TOKENS * 256];
    mmoe_moe_layer *layer[2];
} two_layers;

/** Make two layers on one pool; the creator's reference is dropped at once (the layers keep it). */
static void two_layers_init(two_layers *t)
{
    set_pool_env();
    mmoe_error err;
    mmoe_moe_pool *pool = NULL;
    ck_assert_int_eq(mmoe_moe_pool_create(0, &pool, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_moe_pool_threads(pool), POOL_THREADS); /* 0: MMOE_DEQUANT_THREADS */
    for (int i = 0; i < 2; i++) {
        fixture_init(&t->f[i], g_seed + 1000u * (uint64_t)(i + 1));
        run_own_pool(&t->f[i], t->ref[i]);
        ck_assert_int_eq(mmoe_moe_layer_create_on_pool(&t->f[i].desc, pool, &t->layer[i], &err), MMOE_OK);
        attach(t->layer[i], &t->f[i]);
    }
    mmoe_moe_pool_destroy(pool);
    /* different weights: the two references differ (else the test could not see a mix-up) */
    ck_assert(memcmp(t->ref[0], t->ref[1], sizeof t->ref[0]) != 0);
}

static void two_layers_free(two_layers *t)
{
    for (int i = 0; i < 2; i++) {
        mmoe_moe_layer_destroy(t->layer[i]);
        mmoe_moe_synth_destroy(t->f[i].synth);
    }
    unsetenv("MMOE_DEQUANT_THREADS");
}

START_TEST(two_layers_alternate)
{
    static two_layers t;
    two_layers_init(&t);
    static uint16_t got[N_TOKENS * 256];
    for (int call = 0; call < 6; call++) {
        const int i = call % 2;
        run_layer(t.layer[i], &t.f[i], got);
        assert_same_bits(i == 0 ? "layer A (alternating)" : "layer B (alternating)", t.ref[i], got);
    }
    two_layers_free(&t);
}
END_TEST

/** Calls per thread in the concurrent case (enough for the two threads' calls to overlap often). */
#define CONCURRENT_REPS 40

/** A thread's share of the concurrent case: run one layer a few times, compare each result. */
typedef struct runner {
    two_layers *t;
    int which;
    int mismatches;
    uint16_t y[N_TOKENS * 256];
} runner;

static void *runner_main(void *arg)
{
    runner *r = arg;
    mmoe_error err;
    for (int rep = 0; rep < CONCURRENT_REPS; rep++) {
        mmoe_test_poison_bf16(r->y, N_TOKENS * 256);
        const fixture *f = &r->t->f[r->which];
        mmoe_moe_input in = {.n_tokens = N_TOKENS, .x = f->x,
                             .token_ids = f->desc.routing == MMOE_ROUTING_HASH ? f->ids : NULL};
        mmoe_moe_output out = {.y = r->y};
        if (mmoe_moe_layer_run(r->t->layer[r->which], &in, &out, NULL, &err) != MMOE_OK ||
            memcmp(r->y, r->t->ref[r->which], sizeof r->y) != 0)
            r->mismatches++;
    }
    return NULL;
}

START_TEST(two_threads_are_serialized)
{
    static two_layers t;
    two_layers_init(&t);
    static runner r[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (runner){.t = &t, .which = i};
        ck_assert_int_eq(pthread_create(&th[i], NULL, runner_main, &r[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    ck_assert_int_eq(r[0].mismatches, 0);
    ck_assert_int_eq(r[1].mismatches, 0);
    two_layers_free(&t);
}
END_TEST

START_TEST(argument_errors)
{
    mmoe_error err;
    mmoe_moe_pool *pool = (mmoe_moe_pool *)&err; /* must be reset to NULL */
    ck_assert_int_eq(mmoe_moe_pool_create(-1, &pool, &err), MMOE_EINVAL);
    ck_assert_ptr_null(pool);
    ck_assert_int_eq(mmoe_moe_pool_create(65, &pool, &err), MMOE_EINVAL);
    setenv("MMOE_DEQUANT_THREADS", "abc", 1);
    ck_assert_int_eq(mmoe_moe_pool_create(0, &pool, &err), MMOE_EINVAL);
    ck_assert_msg(strstr(err.msg, "MMOE_DEQUANT_THREADS") != NULL, "message: %s", err.msg);
    ck_assert_ptr_null(pool);
    unsetenv("MMOE_DEQUANT_THREADS");
    mmoe_moe_desc d;
    ck_assert_int_eq(mmoe_moe_desc_from_shape("tiny", 0, &d, &err), MMOE_OK);
    mmoe_moe_layer *layer = (mmoe_moe_layer *)&err;
    ck_assert_int_eq(mmoe_moe_layer_create_on_pool(&d, NULL, &layer, &err), MMOE_EINVAL);
    ck_assert_ptr_null(layer);
    ck_assert_msg(strstr(err.msg, "pool") != NULL, "message: %s", err.msg);
    /* an invalid description is reported before the pool is touched; the pool is intact after */
    ck_assert_int_eq(mmoe_moe_pool_create(1, &pool, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_moe_pool_threads(pool), 1);
    mmoe_moe_desc bad = d;
    bad.hidden = 100;
    ck_assert_int_eq(mmoe_moe_layer_create_on_pool(&bad, pool, &layer, &err), MMOE_EINVAL);
    ck_assert_ptr_null(layer);
    mmoe_moe_pool_destroy(pool);
    mmoe_moe_pool_destroy(NULL);
    ck_assert_int_eq(mmoe_moe_pool_threads(NULL), 1);
}
END_TEST

/** Tokens of the thread-count case: enough that routed experts get more than 4 (their tiled path). */
#define MANY_TOKENS 96

/**
 * The layer on pools of 1, 2 and 3 threads gives the same bits.  With one thread the experts
 * that get more than 4 tokens (and the shared expert) decode a weight tile ahead on the caller
 * and multiply it; with more, every thread decodes and multiplies its own rows
 * (moe_expert_gemm.c).  The case checks that some routed expert got more than 4 tokens, so that
 * both paths run.
 */
START_TEST(thread_counts_same_bits)
{
    mmoe_error err;
    mmoe_moe_desc desc;
    ck_assert_int_eq(mmoe_moe_desc_from_shape("tiny", 0, &desc, &err), MMOE_OK);
    desc.vocab = 64;
    mmoe_moe_synth *synth = NULL;
    ck_assert_msg(mmoe_moe_synth_create(&desc, g_seed + 7, MMOE_SYNTH_NORMAL, &synth, &err) == MMOE_OK, "%s",
                  err.msg);
    static uint16_t x[MANY_TOKENS * 256], y[3][MANY_TOKENS * 256];
    static int32_t ids[MANY_TOKENS];
    mmoe_moe_synth_input(&desc, MANY_TOKENS, g_seed ^ 0x7ead5u, MMOE_SYNTH_NORMAL, x, ids);
    int64_t stats[64] = {0};
    ck_assert_int_le(desc.n_experts, 64);
    for (int threads = 1; threads <= 3; threads++) {
        mmoe_moe_pool *pool = NULL;
        ck_assert_int_eq(mmoe_moe_pool_create(threads, &pool, &err), MMOE_OK);
        mmoe_moe_layer *layer = NULL;
        ck_assert_int_eq(mmoe_moe_layer_create_on_pool(&desc, pool, &layer, &err), MMOE_OK);
        ck_assert_msg(mmoe_moe_layer_set_weights(layer, mmoe_moe_synth_weights(synth), &err) == MMOE_OK, "%s",
                      err.msg);
        mmoe_test_poison_bf16(y[threads - 1], MANY_TOKENS * 256);
        mmoe_moe_input in = {.n_tokens = MANY_TOKENS, .x = x,
                             .token_ids = desc.routing == MMOE_ROUTING_HASH ? ids : NULL};
        mmoe_moe_output out = {.y = y[threads - 1]};
        mmoe_moe_result result;
        mmoe_moe_result_init(&result);
        int64_t counts[64] = {0};
        result.expert_recv_stats = counts;
        ck_assert_msg(mmoe_moe_layer_run(layer, &in, &out, &result, &err) == MMOE_OK, "%s", err.msg);
        if (threads == 1)
            memcpy(stats, counts, sizeof stats);
        else
            assert_n_same_bits("pool of more threads against one", y[0], y[threads - 1], MANY_TOKENS * 256);
        mmoe_moe_layer_destroy(layer);
        mmoe_moe_pool_destroy(pool);
    }
    int64_t most = 0;
    for (int e = 0; e < desc.n_experts; e++)
        most = stats[e] > most ? stats[e] : most;
    printf("moe_pool: %d tokens, the busiest routed expert got %lld\n", MANY_TOKENS, (long long)most);
    ck_assert_msg(most > 4, "no routed expert got more than 4 tokens (%lld): the tiled path did not run",
                  (long long)most);
    mmoe_moe_synth_destroy(synth);
}
END_TEST

/** Threads of this process now (entries of /proc/self/task); -1 when /proc is not there. */
static int count_threads(void)
{
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        if (e->d_name[0] != '.')
            n++;
    closedir(dir);
    return n;
}

/** Threads started by opening a tiny model of @p layers layers (+ its MTP block), and its block count. */
static int threads_of_model(int layers, int *n_blocks)
{
    char root[4096], dir[4200];
    mmoe_config cfg;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    ck_assert(mmoe_config_preset("tiny", layers, &cfg, &err) == MMOE_OK);
    ck_assert_msg(mmoe_synth_model_write(&cfg, g_seed, dir, 0, 0, NULL, NULL, &err) == MMOE_OK, "%s", err.msg);
    *n_blocks = cfg.n_layers + cfg.n_mtp_layers;
    const int before = count_threads();
    mmoe_model *m = NULL;
    ck_assert_msg(mmoe_model_open(dir, NULL, NULL, &m, &err) == MMOE_OK, "%s", err.msg);
    const int started = count_threads() - before;
    mmoe_model_close(m);
    ck_assert_int_eq(count_threads(), before); /* all joined */
    mmoe_test_rmtree(root);
    return started;
}

/** Threads started by @p n layers on pools of their own (what a model did before sharing). */
static int threads_of_own_pools(int n)
{
    mmoe_error err;
    mmoe_moe_desc d;
    ck_assert_int_eq(mmoe_moe_desc_from_shape("tiny", 0, &d, &err), MMOE_OK);
    mmoe_moe_layer *layers[16];
    ck_assert(n <= 16);
    const int before = count_threads();
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(mmoe_moe_layer_create(&d, &layers[i], &err), MMOE_OK);
    const int started = count_threads() - before;
    for (int i = 0; i < n; i++)
        mmoe_moe_layer_destroy(layers[i]);
    return started;
}

START_TEST(model_starts_one_pool)
{
    if (count_threads() < 0) {
        fprintf(stderr, "model_starts_one_pool: no /proc/self/task, thread count not checked\n");
        return;
    }
    set_pool_env();
    static const int layer_counts[2] = {1, 6};
    for (int i = 0; i < 2; i++) {
        int n_blocks = 0;
        const int shared = threads_of_model(layer_counts[i], &n_blocks);
        const int own = threads_of_own_pools(n_blocks);
        fprintf(stderr, "model of %d blocks (MMOE_DEQUANT_THREADS=%d): %d threads started with one shared pool; "
                        "%d with one pool per layer\n",
                n_blocks, POOL_THREADS, shared, own);
        ck_assert_int_eq(shared, POOL_THREADS - 1);
        ck_assert_int_eq(own, n_blocks * (POOL_THREADS - 1));
    }
    unsetenv("MMOE_DEQUANT_THREADS");
}
END_TEST

static Suite *pool_suite(void)
{
    Suite *s = suite_create("moe_pool");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, shared_pool_same_bits);
    tcase_add_test(tc, two_layers_alternate);
    tcase_add_test(tc, two_threads_are_serialized);
    tcase_add_test(tc, argument_errors);
    tcase_add_test(tc, thread_counts_same_bits);
    tcase_add_test(tc, model_starts_one_pool);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("moe_pool");
    return mmoe_test_run(pool_suite());
}
