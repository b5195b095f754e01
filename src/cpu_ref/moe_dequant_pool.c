/**
 * @file moe_dequant_pool.c
 * @brief Weight-tile dequantization split over a few threads: a small worker pool, owned by one
 *        layer or shared by several (::mmoe_moe_pool, reference-counted).
 *
 * ## The idea
 * Dequantization (moe_weight_tile.c) is exact: every output float is a function of its own
 * code byte and scale only, so the rows of a tile can be decoded in any order, by any thread,
 * and the tile has the same bits.  The GEMM (moe_dot.c) computes every output element in its
 * fixed order whatever thread runs it, so batch invariance and padding invariance hold by
 * construction.
 *
 * A job is either (moe_pool_gemm_coded()) "multiply the rows of an FP4 or FP8 matrix, decoded in
 * registers, by a few tokens", each output element being one call of the fixed-order kernel
 * (moe_dot.c) whatever thread makes it; or (moe_pool_rows()) "call the caller's function on row
 * ranges", which the experts' GEMMs for more tokens (moe_expert_gemm.c: each thread decodes its
 * rows and multiplies them), the attention's linears and heads use (linear_dense.c,
 * linear_fp8.c, attn_sparse.c) under the same rule.  The job's rows are cut into grabs of
 * about ::MOE_DEQUANT_GRAB_WEIGHTS weights; the workers and the caller take grabs from one
 * atomic counter until none is left, so a thread that is late (descheduled, or busy with
 * something else) simply takes fewer.
 *
 * A job is published to the workers, the caller takes grabs like any worker, and the call
 * returns when every grab is done.
 *
 * ## The pool
 * n_threads - 1 POSIX threads are created with the pool and joined when its last reference is
 * dropped; between jobs they sleep on a condition variable.  One mutex guards the sleeping
 * side, a generation counter (a new job is a new generation) wakes the workers, and one 64-bit
 * ticket (the job's generation, its number of grabs and the next grab) hands out the grabs: a
 * thread takes grab i of generation g by a compare-and-swap of the ticket from (g, n, i) to
 * (g, n, i + 1), and only then reads the job description, which the caller does not rewrite
 * before every grab of the job is done (a count of completed grabs).  A worker that wakes late
 * finds the ticket exhausted or of another generation and goes back to waiting without reading
 * the description, so the caller never waits for a worker that took no grab (a sleeping
 * worker's wake-up can take longer than a small job); nothing
 * else is shared, and each worker writes only its own rows.  There is no global state.
 *
 * ## Sharing: one pool for many layers
 * mmoe_moe_layer_create() makes a pool for its layer alone.  A whole model has one MoE layer
 * per transformer layer (43 + MTP for DeepSeek-V4-Flash) and runs them one after another on
 * one thread, so one pool per layer would start hundreds of threads of which all but one
 * pool's sleep at any time.  mmoe_moe_pool_create() makes a public pool that the caller passes
 * to mmoe_moe_layer_create_on_pool() for every layer.  The pool is reference-counted: the
 * creator holds one reference, each layer created on it one more, and the threads are joined
 * when the last one is dropped, so layers and pool may be destroyed in any order.
 *
 * The pool runs one job at a time (the job description and the counters are single).  The
 * rule is therefore: layers that share a pool must not run concurrently.  Misuse is made safe,
 * not undefined: mmoe_moe_layer_run() holds the pool's run mutex (moe_dequant_pool_lock()) for
 * the whole call, so two threads that run two layers of one pool at once take turns; each
 * gets the same bits as when run alone (no output depends on which thread computes it).  The
 * mutex costs one uncontended lock per layer call, nothing per grab.
 *
 * ## Thread count
 * The environment variable MMOE_DEQUANT_THREADS (an integer 1..::MOE_DEQUANT_MAX_THREADS) sets
 * the number of threads including the caller; 1 decodes on the caller only (no threads are
 * created).  Unset, the count is the number of online CPUs, capped at
 * ::MOE_DEQUANT_DEFAULT_CAP.  An invalid value is an error of mmoe_moe_layer_create and of
 * mmoe_moe_pool_create(0, ...) (MMOE_EINVAL naming the variable), not a silent default.  Jobs of fewer than ::MOE_DEQUANT_MIN_PARALLEL
 * weights run on the caller alone (the wake-up would cost more than it saves).
 *
 * ## Measurements
 * `megamoe bench moe --shape v4-flash --experts 32 --tokens 8,64 --reps 3` on the 2-core
 * development VM (AMD EPYC Zen 4), layer milliseconds with MMOE_DEQUANT_THREADS=1 -> 2: T=8 144
 * -> 89, T=64 553 -> 299 (experts with at most 4 tokens multiply FP4 weights decoded in
 * registers, their rows shared out; the others decode and multiply their rows on every
 * thread, moe_expert_gemm.c).  The layer's current numbers are in docs/perf.md.
 */
#include "moe_internal.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/** What a job does with its rows. */
typedef enum dequant_job_kind {
    JOB_GEMM_CODED, /**< multiply them, decoded in registers, by a few tokens (moe_pool_gemm_coded()) */
    JOB_ROWS        /**< the caller's function of a row range (moe_pool_rows()) */
} dequant_job_kind;

/** One job: the arguments of moe_pool_gemm_coded() or of moe_pool_rows(). */
typedef struct dequant_job {
    dequant_job_kind kind; /**< what is done with the rows */
    const moe_mat *m; /**< the matrix (borrowed for the job's duration) */
    int64_t nr;       /**< rows [0, nr) */
    float *out;       /**< JOB_GEMM_CODED: c, row r at out + r */
    moe_dot_isa isa;  /**< JOB_GEMM_CODED: FMA kernels that take the matrix in registers (they cannot fail) */
    const float *a;   /**< JOB_GEMM_CODED: the tokens' activations [tokens, lda] */
    int64_t lda;      /**< JOB_GEMM_CODED: their leading dimension */
    int64_t tokens;   /**< JOB_GEMM_CODED: how many */
    int64_t ldc;      /**< JOB_GEMM_CODED: the output's leading dimension */
    moe_rows_fn fn;   /**< JOB_ROWS: the work on a row range */
    void *ctx;        /**< JOB_ROWS: its argument */
    int64_t grab_rows; /**< rows per grab */
    int n_grabs;      /**< grabs of the job: ceil(nr / grab_rows) */
} dequant_job;

/** A worker's handle. */
typedef struct dequant_worker {
    struct mmoe_moe_pool *pool; /**< the owning pool */
    int index;                     /**< its thread index, 1 .. n_threads - 1 (0 is the caller) */
    pthread_t thread;              /**< the thread */
} dequant_worker;

/** The pool: the worker threads, the current job and the counters the threads take work from. */
struct mmoe_moe_pool {
    int n_threads;              /**< threads including the caller */
    atomic_int refs;            /**< references: the creator's and each layer's */
    pthread_mutex_t run_mu;     /**< held by a layer call for its duration (one user at a time) */
    dequant_worker *workers;    /**< [n_threads - 1] */
    pthread_mutex_t mu;         /**< guards the sleeping side: work_cv and stop */
    pthread_cond_t work_cv;     /**< signalled when a new generation starts (or stop) */
    atomic_ulong generation;    /**< incremented per job (written under mu, read by spinners) */
    atomic_uint_least64_t ticket; /**< the current job's generation, grab count and next grab (ticket_make()) */
    atomic_int grabs_done;      /**< grabs of the current job completed */
    atomic_int stop;            /**< set by destroy */
    dequant_job job;            /**< the current job (published by the ticket's release store) */
};

/** Stack of a worker thread (it runs the row decoders and the GEMM kernels; the blocked GEMM's buffers take 72 KB). */
#define DEQUANT_STACK_BYTES ((size_t)256 * 1024)

/** Seconds a worker spins on the generation before it sleeps on the condition variable. */
#define DEQUANT_SPIN_S 100e-6

/** Run grab @p g of @p j on thread @p thread: multiply its rows, or call fn on them. */
static void run_grab(const dequant_job *j, int g, int thread)
{
    const int64_t a = (int64_t)g * j->grab_rows;
    const int64_t b = a + j->grab_rows < j->nr ? a + j->grab_rows : j->nr;
    if (j->kind == JOB_ROWS) {
        j->fn(j->ctx, thread, a, b);
        return;
    }
    /* the in-register kernels cannot fail (moe_pool_gemm_coded()'s contract) */
    (void)moe_dot_gemm_coded(j->isa, j->a, j->lda, j->tokens, j->m, a, b - a, j->out + a, j->ldc);
}

/** Bits of the ticket's fields: generation (low bits of the counter), grab count, next grab. */
enum { TICKET_GRAB_BITS = 20, TICKET_GEN_BITS = 64 - 2 * TICKET_GRAB_BITS };

/** Most grabs a job may have (the ticket's field). */
#define TICKET_MAX_GRABS ((1 << TICKET_GRAB_BITS) - 1)

/** The ticket of generation @p gen (its low bits), @p n_grabs grabs, the next one @p next. */
static uint_least64_t ticket_make(unsigned long gen, int n_grabs, int next)
{
    const uint_least64_t g = (uint_least64_t)gen & ((UINT64_C(1) << TICKET_GEN_BITS) - 1);
    return g << (2 * TICKET_GRAB_BITS) | (uint_least64_t)n_grabs << TICKET_GRAB_BITS | (uint_least64_t)next;
}

/** Whether ticket @p t belongs to generation @p gen. */
static int ticket_is_of(uint_least64_t t, unsigned long gen)
{
    return (t >> (2 * TICKET_GRAB_BITS)) == ((uint_least64_t)gen & ((UINT64_C(1) << TICKET_GEN_BITS) - 1));
}

/** The next grab of ticket @p t. */
static int ticket_next(uint_least64_t t) { return (int)(t & TICKET_MAX_GRABS); }

/** The grab count of ticket @p t. */
static int ticket_grabs(uint_least64_t t) { return (int)((t >> TICKET_GRAB_BITS) & TICKET_MAX_GRABS); }

/**
 * Take and run grabs of generation @p gen's job on thread @p thread until none is left (or the
 * ticket is of another generation: the job is over).  The description is read only after a grab
 * is taken: until that grab is done the caller cannot start another job.
 */
static void take_grabs(moe_dequant_pool *p, unsigned long gen, int thread)
{
    uint_least64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    for (;;) {
        if (!ticket_is_of(t, gen) || ticket_next(t) >= ticket_grabs(t))
            return;
        /* on failure t is reloaded: another thread took the grab, or a new job began */
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acquire,
                                                   memory_order_acquire))
            continue;
        run_grab(&p->job, ticket_next(t), thread);
        atomic_fetch_add_explicit(&p->grabs_done, 1, memory_order_release);
        t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    }
}

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

/** Worker loop: wait for a new generation, take grabs of it, repeat until stop. */
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
        take_grabs(p, g, w->index);
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
    pthread_mutex_destroy(&p->run_mu);
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
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    atomic_init(&p->refs, 1);
    atomic_init(&p->generation, 0);
    atomic_init(&p->ticket, ticket_make(0, 0, 0));
    atomic_init(&p->grabs_done, 0);
    atomic_init(&p->stop, 0);
    /* the kernels need little stack (DEQUANT_STACK_BYTES) */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, DEQUANT_STACK_BYTES);
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i] = (dequant_worker){.pool = p, .index = i + 1};
        int rc = pthread_create(&p->workers[i].thread, &attr, worker_main, &p->workers[i]);
        if (rc != 0) {
            pthread_attr_destroy(&attr);
            pool_teardown(p, i);
            return mmoe_error_set(err, MMOE_ENOMEM,
                                  "moe: cannot start dequantization thread %d of %d (%s); "
                                  "set MMOE_DEQUANT_THREADS=1 to decode on the caller only",
                                  i + 2, n_threads, strerror(rc));
        }
    }
    pthread_attr_destroy(&attr);
    *out = p;
    return MMOE_OK;
}

void moe_dequant_pool_retain(moe_dequant_pool *p)
{
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
}

void moe_dequant_pool_release(moe_dequant_pool *p)
{
    /* acq_rel: every use by the other holders happens before the teardown */
    if (p != NULL && atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1)
        pool_teardown(p, p->n_threads - 1);
}

void moe_dequant_pool_lock(moe_dequant_pool *p)
{
    if (p != NULL)
        pthread_mutex_lock(&p->run_mu);
}

void moe_dequant_pool_unlock(moe_dequant_pool *p)
{
    if (p != NULL)
        pthread_mutex_unlock(&p->run_mu);
}

mmoe_status mmoe_moe_pool_create(int n_threads, mmoe_moe_pool **out, mmoe_error *err)
{
    if (out == NULL)
        return mmoe_error_set(err, MMOE_EINVAL, "moe pool: out is required");
    *out = NULL;
    if (n_threads < 0 || n_threads > MOE_DEQUANT_MAX_THREADS)
        return mmoe_error_set(err, MMOE_EINVAL, "moe pool: %d threads: expected 0 (default) or 1..%d", n_threads,
                              MOE_DEQUANT_MAX_THREADS);
    if (n_threads == 0) {
        mmoe_status st = moe_dequant_threads_from_env(&n_threads, err);
        if (st != MMOE_OK)
            return st;
    }
    return moe_dequant_pool_create(n_threads, out, err);
}

void mmoe_moe_pool_destroy(mmoe_moe_pool *pool)
{
    moe_dequant_pool_release(pool);
}

int mmoe_moe_pool_threads(const mmoe_moe_pool *pool)
{
    return moe_dequant_pool_threads(pool);
}

int moe_dequant_pool_threads(const moe_dequant_pool *p)
{
    return p != NULL ? p->n_threads : 1;
}

/**
 * Run @p job (its rows cut into grabs of about ::MOE_DEQUANT_GRAB_WEIGHTS weights of
 * @p row_weights each, a multiple of @p align rows) on the caller and the pool's workers, or on
 * the caller alone when it is too small to share or there are no workers; return when every
 * grab is done.
 */
static void job_run(moe_dequant_pool *p, dequant_job job, int64_t row_weights, int64_t align)
{
    const int64_t nr = job.nr;
    job.grab_rows = MOE_DEQUANT_GRAB_WEIGHTS / (row_weights > 0 ? row_weights : 1);
    job.grab_rows -= job.grab_rows % align;
    if (job.grab_rows < align)
        job.grab_rows = align;
    if (moe_ceil_div(nr, job.grab_rows) > TICKET_MAX_GRABS) /* the ticket's limit: larger grabs */
        job.grab_rows = moe_ceil_div(moe_ceil_div(nr, TICKET_MAX_GRABS), align) * align;
    job.n_grabs = (int)moe_ceil_div(nr, job.grab_rows);
    if (p == NULL || p->n_threads == 1 || job.n_grabs < 2 || nr * row_weights < MOE_DEQUANT_MIN_PARALLEL) {
        /* too small to share (or no workers): run it now, on the caller */
        job.grab_rows = nr > 0 ? nr : 1;
        job.n_grabs = nr > 0 ? 1 : 0;
        if (job.n_grabs == 1)
            run_grab(&job, 0, 0);
        return;
    }
    /* every grab of the previous job is done (its call waited for them), and no thread reads the
       description without a grab, so the job can be rewritten */
    p->job = job;
    atomic_store_explicit(&p->grabs_done, 0, memory_order_relaxed);
    const unsigned long gen = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    /* publish the job with its ticket (release), then wake the workers: the generation under the
       mutex, so that a sleeper cannot miss it; a worker that sees the generation sees the ticket */
    atomic_store_explicit(&p->ticket, ticket_make(gen, job.n_grabs, 0), memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->generation, gen, memory_order_release);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    take_grabs(p, gen, 0);
    /* every grab done (then the next job may rewrite the description: no thread holds a grab of
     * it); a worker that took no grab is not waited for.  The workers' shares are small: spin,
     * yielding the CPU to them when they are late */
    for (unsigned spins = 0; atomic_load_explicit(&p->grabs_done, memory_order_acquire) < p->job.n_grabs; spins++)
        if (spins >= 1024u)
            sched_yield();
}

void moe_pool_gemm_coded(moe_dequant_pool *p, moe_dot_isa isa, const float *a, int64_t lda, int64_t tokens,
                         const moe_mat *w, float *c, int64_t ldc)
{
    /* grabs of about MOE_DEQUANT_GRAB_WEIGHTS weights (a row's weights: its columns); each weight
       is decoded once and feeds one fma per token */
    job_run(p, (dequant_job){.kind = JOB_GEMM_CODED, .m = w, .nr = w->rows, .out = c, .isa = isa, .a = a,
                             .lda = lda, .tokens = tokens, .ldc = ldc},
            w->cols, 1);
}

void moe_pool_rows_held(moe_dequant_pool *p, int64_t nr, int64_t row_weights, int64_t align, moe_rows_fn fn,
                        void *ctx)
{
    job_run(p, (dequant_job){.kind = JOB_ROWS, .nr = nr, .fn = fn, .ctx = ctx}, row_weights,
            align > 0 ? align : 1);
}

void moe_pool_rows(moe_dequant_pool *p, int64_t nr, int64_t row_weights, int64_t align, moe_rows_fn fn, void *ctx)
{
    moe_dequant_pool_lock(p);
    moe_pool_rows_held(p, nr, row_weights, align, fn, ctx);
    moe_dequant_pool_unlock(p);
}
