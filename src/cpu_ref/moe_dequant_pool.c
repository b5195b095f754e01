/**
 * @file moe_dequant_pool.c
 * @brief Weight-tile dequantization split over a few threads: a small worker pool owned by the
 *        layer object.
 *
 * ## The idea
 * Dequantization (moe_weight_tile.c) is exact: every output float is a function of its own
 * code byte and scale only, so the rows of a tile can be decoded in any order, by any thread,
 * and the tile has the same bits.  The GEMMs are not touched at all: they still run on the
 * caller's thread (OpenBLAS uses its own threads inside each call), with exactly the shapes,
 * leading dimensions and K order of moe_expert_gemm.c, on a tile that holds the same values.
 * Batch invariance and padding invariance are therefore preserved by construction.
 *
 * A job is "decode rows [r0, r0 + nr) of columns [c0, c0 + nc) as nc / chunk tiles of
 * [nr, chunk] floats, tile t at out + t * nr * chunk".  L1 uses one tile (chunk = nc = D); L2
 * decodes all its K chunks of one row tile at once (chunk = 128), so that a job is large enough
 * to be worth a wake-up (one 256 x 128 L2 tile alone takes about 15 us).  The job's rows are cut
 * into n_threads contiguous ranges; the caller decodes range 0 itself and waits for the others.
 *
 * ## The pool
 * n_threads - 1 POSIX threads are created with the layer (mmoe_moe_layer_create) and joined by
 * mmoe_moe_layer_destroy; between jobs they sleep on a condition variable.  One mutex guards the
 * job description, a generation counter (a new job is a new generation) and the count of
 * workers still busy; nothing else is shared, and each worker writes only its own rows.  There
 * is no global state: two layers have two pools.  The pool is not reentrant (one job at a time),
 * like the layer's scratch buffers.
 *
 * ## Thread count
 * The environment variable MMOE_DEQUANT_THREADS (an integer 1..::MOE_DEQUANT_MAX_THREADS) sets
 * the number of threads including the caller; 1 decodes on the caller only (no threads are
 * created).  Unset, the count is the number of online CPUs, capped at
 * ::MOE_DEQUANT_DEFAULT_CAP.  An invalid value is an error of mmoe_moe_layer_create (MMOE_EINVAL
 * naming the variable), not a silent default.  Jobs of fewer than ::MOE_DEQUANT_MIN_PARALLEL
 * weights run on the caller alone (the wake-up would cost more than it saves).
 *
 * ## Measurements
 * See docs/moe-oracle.md (performance) for the layer benchmark before and after.
 */
#include "moe_internal.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/** One job: the arguments of moe_dequant_tiles(). */
typedef struct dequant_job {
    const moe_mat *m; /**< the matrix (borrowed for the job's duration) */
    int64_t r0;       /**< first row */
    int64_t nr;       /**< rows */
    int64_t c0;       /**< first column */
    int64_t nc;       /**< columns (a multiple of chunk) */
    int64_t chunk;    /**< columns per output tile */
    float *out;       /**< nc / chunk tiles of [nr, chunk] */
    int parts;        /**< number of row ranges the job is cut into */
} dequant_job;

/** A worker's handle: the pool and its part index (1..n_threads-1). */
typedef struct dequant_worker {
    struct moe_dequant_pool *pool; /**< the owning pool */
    int part;                      /**< which row range this worker decodes */
    pthread_t thread;              /**< the thread */
} dequant_worker;

struct moe_dequant_pool {
    int n_threads;              /**< threads including the caller */
    dequant_worker *workers;    /**< [n_threads - 1] */
    pthread_mutex_t mu;         /**< guards the sleeping side: work_cv and stop */
    pthread_cond_t work_cv;     /**< signalled when a new generation starts (or stop) */
    atomic_ulong generation;    /**< incremented per job (written under mu, read by spinners) */
    atomic_int busy;            /**< workers still decoding the current job */
    atomic_int stop;            /**< set by destroy */
    dequant_job job;            /**< the current job (published by the generation's release store) */
};

/** Seconds a worker spins on the generation before it sleeps on the condition variable. */
#define DEQUANT_SPIN_S 100e-6

/** Wait (spin, then sleep) until the generation differs from @p seen or stop; return the new one. */
static unsigned long wait_for_job(moe_dequant_pool *p, unsigned long seen)
{
    const double t0 = mmoe_clock_s();
    for (unsigned spins = 0;; spins++) {
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return seen;
        unsigned long g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen)
            return g;
        if ((spins & 63u) == 63u && mmoe_clock_s() - t0 > DEQUANT_SPIN_S)
            break;
    }
    pthread_mutex_lock(&p->mu);
    unsigned long g;
    while (!atomic_load_explicit(&p->stop, memory_order_acquire) &&
           (g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen)
        pthread_cond_wait(&p->work_cv, &p->mu);
    g = atomic_load_explicit(&p->generation, memory_order_acquire);
    pthread_mutex_unlock(&p->mu);
    return g;
}

/** Decode row range @p part of @p parts of the job (possibly empty). */
static void run_part(const dequant_job *j, int part)
{
    const int64_t a = j->nr * part / j->parts, b = j->nr * (part + 1) / j->parts;
    if (b <= a)
        return;
    const int64_t n_tiles = j->nc / j->chunk;
    for (int64_t t = 0; t < n_tiles; t++)
        moe_weight_tile_f32(j->m, j->r0 + a, b - a, j->c0 + t * j->chunk, j->chunk,
                            j->out + t * j->nr * j->chunk + a * j->chunk);
}

/** Worker loop: wait for a new generation, decode its part, report, repeat until stop. */
static void *worker_main(void *arg)
{
    dequant_worker *w = arg;
    moe_dequant_pool *p = w->pool;
    unsigned long seen = 0;
    for (;;) {
        unsigned long g = wait_for_job(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        seen = g;
        run_part(&p->job, w->part);
        atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
    }
}

mmoe_status moe_dequant_threads_from_env(int *n_threads, mmoe_error *err)
{
    const char *v = getenv("MMOE_DEQUANT_THREADS");
    if (v == NULL || v[0] == '\0') {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        if (online < 1)
            online = 1;
        *n_threads = online > MOE_DEQUANT_DEFAULT_CAP ? MOE_DEQUANT_DEFAULT_CAP : (int)online;
        return MMOE_OK;
    }
    char *end = NULL;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < 1 || n > MOE_DEQUANT_MAX_THREADS)
        return mmoe_error_set(err, MMOE_EINVAL, "moe: MMOE_DEQUANT_THREADS='%s': expected an integer 1..%d", v,
                              MOE_DEQUANT_MAX_THREADS);
    *n_threads = (int)n;
    return MMOE_OK;
}

/** Stop and join the first @p n_started workers, then free the pool. */
static void pool_teardown(moe_dequant_pool *p, int n_started)
{
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < n_started; i++)
        pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

mmoe_status moe_dequant_pool_create(int n_threads, moe_dequant_pool **out, mmoe_error *err)
{
    *out = NULL;
    if (n_threads < 1 || n_threads > MOE_DEQUANT_MAX_THREADS)
        return mmoe_error_set(err, MMOE_EINVAL, "moe: dequantization threads %d: expected 1..%d", n_threads,
                              MOE_DEQUANT_MAX_THREADS);
    moe_dequant_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "moe: out of memory for the dequantization pool");
    p->n_threads = n_threads;
    if (n_threads > 1) {
        p->workers = calloc((size_t)(n_threads - 1), sizeof *p->workers);
        if (p->workers == NULL) {
            free(p);
            return mmoe_error_set(err, MMOE_ENOMEM, "moe: out of memory for %d dequantization workers",
                                  n_threads - 1);
        }
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->busy, 0);
    atomic_init(&p->stop, 0);
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i] = (dequant_worker){.pool = p, .part = i + 1};
        int rc = pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]);
        if (rc != 0) {
            pool_teardown(p, i);
            return mmoe_error_set(err, MMOE_ENOMEM,
                                  "moe: cannot start dequantization thread %d of %d (%s); "
                                  "set MMOE_DEQUANT_THREADS=1 to decode on the caller only",
                                  i + 2, n_threads, strerror(rc));
        }
    }
    *out = p;
    return MMOE_OK;
}

void moe_dequant_pool_destroy(moe_dequant_pool *p)
{
    if (p != NULL)
        pool_teardown(p, p->n_threads - 1);
}

int moe_dequant_pool_threads(const moe_dequant_pool *p)
{
    return p != NULL ? p->n_threads : 1;
}

void moe_dequant_tiles(moe_dequant_pool *p, const moe_mat *m, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                       int64_t chunk, float *out)
{
    dequant_job job = {.m = m, .r0 = r0, .nr = nr, .c0 = c0, .nc = nc, .chunk = chunk, .out = out, .parts = 1};
    if (p == NULL || p->n_threads == 1 || nr < 2 || nr * nc < MOE_DEQUANT_MIN_PARALLEL) {
        run_part(&job, 0);
        return;
    }
    job.parts = p->n_threads;
    /* publish: the job, then the generation (release) under the mutex, so that a sleeper cannot miss it */
    p->job = job;
    atomic_store_explicit(&p->busy, p->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);

    run_part(&job, 0);

    /* the workers' shares are as large as ours: spin, yielding the CPU to them when they are late */
    for (unsigned spins = 0; atomic_load_explicit(&p->busy, memory_order_acquire) > 0; spins++)
        if (spins >= 1024u)
            sched_yield();
}
