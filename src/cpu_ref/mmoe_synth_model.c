/**
 * @file mmoe_synth_model.c
 * @brief Writing a random checkpoint: plan shards, generate each shard's tensors on a pool of
 *        threads while the shard is written, then the index and config.
 *
 * The tensor list is walked once to assign shards (consecutive tensors until a
 * shard reaches the size target), then shard by shard: declare the shard's tensors
 * to a safetensors writer (names, dtypes, shapes: the header needs nothing else),
 * stream the file while the tensors are generated into owned buffers, free the
 * buffers.  Peak memory is one shard (plus one float copy of the tensor each thread
 * is generating).  An FP8 or FP4 weight and its scale are generated together (the
 * scale depends on the weight's block maxima); the scale entry, which always follows
 * its weight in the list, takes its bytes from the weight's slot.
 *
 * ## Threads
 *
 * Each tensor draws from its own generator, seeded with `seed ^ FNV-1a(name)`, so the
 * tensors of a shard are independent and their bytes do not depend on which thread makes
 * them or when.  The file's data section has its own order (mmoe_st_writer_data_order():
 * larger elements first, then by name); the tensors are handed out in that order (a weight
 * and its scale at the first of their two places), to `n_threads - 1` workers and to the
 * writing thread.  The writing thread streams the file
 * (mmoe_st_writer_finish_streamed()): for each tensor it waits until the tensor is made,
 * or, if the tensor has not been handed out yet, generates the next ones itself, so that
 * with one thread it generates everything, in order.  Writing a tensor (and the kernel's
 * write-back behind it) thus overlaps the generation of the tensors that follow.  Each
 * slot's state (waiting, making, ready, failed) and the hand-out position sit under one
 * mutex, with a condition variable for "a slot changed"; a slot's buffers are written by
 * the thread that makes it before it is marked ready, and read by the writer after.  The
 * workers block the signals, so the cleanup handler (mmoe_cleanup.h) always runs on the
 * calling thread.
 *
 * Errors: a thread that fails on a tensor records its status and message, marks the slot
 * failed and stops the hand-out.  Every tensor before it in data order was handed out
 * earlier, so the writer reaches the failed slot (and reports that tensor) before any slot
 * that was never handed out: the error is that of the first failing tensor in data order,
 * for every thread count.  The writer removes its temporary file; the workers finish their
 * tensor and are joined.
 *
 * ## Values
 *
 * A tensor's floats are drawn in two passes: the deviates (four 16-bit table indices
 * per 64-bit draw, in element order), then the role's affine map, evaluated in double
 * and rounded to float once: `z` (embedding, sink), `z / sqrt(fan_in)` (linear, mHC
 * function), `1 + 0.1 z` (norm), `0.5 z` (mHC base, compressor position bias), `0.1 z`
 * (bias).  The mHC scale vectors interleave their uniform draws with the deviate draws
 * (`0.5 + U[0, 1)`), in one pass.
 */
#include "mmoe_synth_model.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mmoe_atomic_file.h"
#include "mmoe_cleanup.h"
#include "mmoe_formats.h"
#include "mmoe_model_tensors.h"
#include "mmoe_rng.h"
#include "mmoe_safetensors.h"

/** FNV-1a of a name, mixed into the seed so every tensor has its own stream. */
static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/** Element count of a spec (packed FP4: bytes). */
static uint64_t numel_of(const mmoe_tensor_spec *s)
{
    return (uint64_t)s->shape[0] * (uint64_t)(s->ndim == 2 ? s->shape[1] : 1);
}

/** The bytes of one tensor (and, for quantized weights, of its scale). */
typedef struct gen_out {
    void *data;           /**< the tensor's bytes (owned) */
    size_t nbytes;        /**< their count */
    void *scale;          /**< bytes of the following scale tensor, or NULL */
    size_t scale_nbytes;  /**< their count */
} gen_out;

/**
 * The deviates of a tensor, in element order: each 64-bit draw gives four 16-bit indices
 * into the normal table, low bits first.
 */
static void draw_deviates(mmoe_rng *rng, const mmoe_normal_table *normals, float *z, uint64_t n)
{
    uint64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const uint64_t bits = mmoe_rng_u64(rng);
        z[i] = normals->v[bits & 0xFFFF];
        z[i + 1] = normals->v[(bits >> 16) & 0xFFFF];
        z[i + 2] = normals->v[(bits >> 32) & 0xFFFF];
        z[i + 3] = normals->v[bits >> 48];
    }
    if (i < n) {
        uint64_t bits = mmoe_rng_u64(rng);
        for (; i < n; i++, bits >>= 16)
            z[i] = normals->v[bits & 0xFFFF];
    }
}

/** mHC scale values 0.5 + U[0, 1): one uniform draw per element, after the deviate draw of each group of four. */
static void fill_hc_scale(mmoe_rng *rng, float *v, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        if (i % 4 == 0)
            (void)mmoe_rng_u64(rng); /* the deviates' draw, which this role does not use */
        v[i] = (float)(0.5 + mmoe_rng_uniform(rng));
    }
}

/** Elements per step of the maps below: a fixed count the compiler turns into vector instructions. */
enum { MAP_STEP = 8 };

/** v = (float)(z / d), in double, for the @p n deviates z in @p v. */
static void map_over_fan_in(float *v, uint64_t n, double d)
{
    uint64_t i = 0;
    for (; i + MAP_STEP <= n; i += MAP_STEP)
        for (int j = 0; j < MAP_STEP; j++)
            v[i + j] = (float)((double)v[i + j] / d);
    for (; i < n; i++)
        v[i] = (float)((double)v[i] / d);
}

/** v = (float)(mul * z), in double, for the @p n deviates z in @p v. */
static void map_scaled(float *v, uint64_t n, double mul)
{
    uint64_t i = 0;
    for (; i + MAP_STEP <= n; i += MAP_STEP)
        for (int j = 0; j < MAP_STEP; j++)
            v[i + j] = (float)(mul * (double)v[i + j]);
    for (; i < n; i++)
        v[i] = (float)(mul * (double)v[i]);
}

/** v = (float)(1 + 0.1 z), in double, for the @p n deviates z in @p v (norm weights). */
static void map_near_one(float *v, uint64_t n)
{
    uint64_t i = 0;
    for (; i + MAP_STEP <= n; i += MAP_STEP)
        for (int j = 0; j < MAP_STEP; j++)
            v[i + j] = (float)(1.0 + 0.1 * (double)v[i + j]);
    for (; i < n; i++)
        v[i] = (float)(1.0 + 0.1 * (double)v[i]);
}

/**
 * The @p n values of a tensor of role @p role with @p cols columns (its fan-in) into @p v:
 * the deviates, then the role's map in double, rounded to float once (see the chapter).
 */
static void fill_values(mmoe_tensor_role role, int64_t cols, mmoe_rng *rng, const mmoe_normal_table *normals,
                        float *v, uint64_t n)
{
    if (role == MMOE_ROLE_HC_SCALE) {
        fill_hc_scale(rng, v, n);
        return;
    }
    draw_deviates(rng, normals, v, n);
    switch (role) {
    case MMOE_ROLE_LINEAR:
    case MMOE_ROLE_HC_FN: map_over_fan_in(v, n, sqrt((double)cols)); break;
    case MMOE_ROLE_NORM: map_near_one(v, n); break;
    case MMOE_ROLE_HC_BASE:
    case MMOE_ROLE_APE: map_scaled(v, n, 0.5); break;
    case MMOE_ROLE_BIAS: map_scaled(v, n, 0.1); break;
    default: break; /* embedding, sink: the deviates themselves */
    }
}

/** Generate the bytes of tensor @p s (and of its scale @p next, for FP8/FP4 weights). */
static mmoe_status gen_tensor(const mmoe_config *c, const mmoe_tensor_spec *s, const mmoe_tensor_spec *next,
                              uint64_t seed, const mmoe_normal_table *normals, gen_out *g, mmoe_error *err)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed ^ name_hash(s->name));
    const uint64_t n = numel_of(s);
    memset(g, 0, sizeof *g);
    g->nbytes = n * mmoe_dtype_size(s->dtype);
    g->data = malloc(g->nbytes ? g->nbytes : 1);
    float *tmp = NULL;
    if (!g->data)
        goto oom;
    if (s->role == MMOE_ROLE_TID2EID) {
        int64_t *t = g->data;
        int E = c->n_routed_experts, k = (int)s->shape[1];
        int *perm = malloc(sizeof(int) * (size_t)E);
        if (!perm)
            goto oom;
        for (int64_t r = 0; r < s->shape[0]; r++) {
            for (int e = 0; e < E; e++)
                perm[e] = e;
            for (int j = 0; j < k; j++) { /* partial Fisher-Yates: k distinct experts */
                int pick = j + (int)mmoe_rng_below(&rng, (uint64_t)(E - j));
                int tmpv = perm[j];
                perm[j] = perm[pick];
                perm[pick] = tmpv;
                t[r * k + j] = perm[j];
            }
        }
        free(perm);
        return MMOE_OK;
    }
    /* logical element count (packed FP4 holds two per byte) */
    const int packed = s->dtype == MMOE_DT_I8;
    const int64_t rows = s->shape[0], cols = s->ndim == 2 ? s->shape[1] * (packed ? 2 : 1) : 1;
    const uint64_t nlog = (uint64_t)rows * (uint64_t)cols;
    tmp = malloc(sizeof(float) * nlog);
    if (!tmp)
        goto oom;
    fill_values(s->role, cols, &rng, normals, tmp, nlog);
    if (s->dtype == MMOE_DT_F32) {
        memcpy(g->data, tmp, g->nbytes);
    } else if (s->dtype == MMOE_DT_BF16) {
        mmoe_bf16_from_f32_row(tmp, nlog, g->data);
    } else if (s->dtype == MMOE_DT_F8_E4M3 || packed) {
        if (!next || next->role != MMOE_ROLE_SCALE)
            goto internal;
        g->scale_nbytes = numel_of(next);
        g->scale = malloc(g->scale_nbytes);
        if (!g->scale)
            goto oom;
        if (packed) {
            for (int64_t r = 0; r < rows; r++) {
                mmoe_status st = mmoe_quant_row_fp4_1x32_ue8m0(
                    tmp + r * cols, (size_t)cols, MMOE_FP4_RNE, (uint8_t *)g->data + r * (cols / 2),
                    (uint8_t *)g->scale + r * (cols / 32), err);
                if (st != MMOE_OK) {
                    free(tmp);
                    return mmoe_error_prefix(err, "synth-model: tensor '%s': ", s->name);
                }
            }
        } else {
            mmoe_status st = mmoe_quant_fp8_weight_blocks(tmp, (size_t)rows, (size_t)cols, (size_t)c->weight_block_n,
                                                          (size_t)c->weight_block_k, g->data, g->scale, err);
            if (st != MMOE_OK) {
                free(tmp);
                return mmoe_error_prefix(err, "synth-model: tensor '%s': ", s->name);
            }
        }
    } else {
        goto internal;
    }
    free(tmp);
    return MMOE_OK;
oom:
    free(tmp);
    return mmoe_error_set(err, MMOE_ENOMEM, "synth-model: out of memory for tensor '%s'", s->name);
internal:
    free(tmp);
    return mmoe_error_set(err, MMOE_EINTERNAL, "synth-model: tensor '%s' (%s) has no generator", s->name,
                          mmoe_dtype_name(s->dtype));
}

/** Remove a directory and the plain files in it (the partial output). */
static void remove_partial(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4096 + 512];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/** Write @p text to @p path atomically. */
static mmoe_status write_text_file(const char *path, const char *text, mmoe_error *err)
{
    mmoe_atomic_file af;
    mmoe_status st = mmoe_atomic_open(&af, path, err);
    if (st == MMOE_OK)
        st = mmoe_atomic_write(&af, text, strlen(text), err);
    if (st == MMOE_OK)
        st = mmoe_atomic_commit(&af, err);
    return st;
}

/** Where a tensor of the shard stands. */
typedef enum slot_state {
    SLOT_WAITING = 0, /**< not yet taken by a thread */
    SLOT_MAKING,      /**< a thread is generating it */
    SLOT_READY,       /**< its bytes (and its scale's) are in its slot */
    SLOT_FAILED       /**< its generation failed (the message in the failing thread's record) */
} slot_state;

struct shard_job;

/** A thread of the shard (a worker, or the writing thread when it generates) and its first failure. */
typedef struct shard_thread {
    struct shard_job *job; /**< the shared job */
    pthread_t thread;      /**< the thread (unused for the writing thread) */
    size_t failed_slot;    /**< the slot whose generation failed */
    mmoe_status st;        /**< its status; MMOE_OK while none failed */
    mmoe_error err;        /**< its message */
} shard_thread;

/**
 * One shard being generated and written: the read-only inputs, the output slots, the order in
 * which the tensors are handed out, and (under @c lock) the hand-out position and each slot's
 * state.  Slot i holds tensor first + i.
 */
typedef struct shard_job {
    const mmoe_config *cfg;           /**< the configuration */
    const mmoe_tensor_spec *specs;    /**< the whole tensor list */
    size_t n_specs;                   /**< its length */
    size_t first;                     /**< the shard's first tensor */
    size_t count;                     /**< its tensors: [first, first + count) */
    uint64_t seed;                    /**< the run's seed */
    const mmoe_normal_table *normals; /**< the deviate table */
    gen_out *outs;                    /**< the slots */
    size_t *make_order;               /**< the slots that generate (a weight makes its scale), in data order */
    size_t n_make;                    /**< their count */
    shard_thread *threads;            /**< n_threads: the workers, then the writing thread */
    size_t n_threads;                 /**< their count */
    pthread_mutex_t lock;             /**< guards the fields below */
    pthread_cond_t changed;           /**< broadcast when a slot becomes ready or failed */
    size_t next_make;                 /**< the next position of make_order to hand out */
    bool stop;                        /**< a slot failed or the writer stopped: hand out nothing more */
    slot_state *state;                /**< per slot */
} shard_job;

/** The slot whose generation makes the bytes of slot @p i: its weight's for a scale, else its own. */
static size_t maker_of(const shard_job *job, size_t i)
{
    return job->specs[job->first + i].role == MMOE_ROLE_SCALE && i > 0 ? i - 1 : i;
}

/** Take the next slot to generate (lock held). @return 0 when none is left or the job stopped */
static int take_slot(shard_job *job, size_t *slot)
{
    if (job->stop || job->next_make == job->n_make)
        return 0;
    *slot = job->make_order[job->next_make++];
    job->state[*slot] = SLOT_MAKING;
    return 1;
}

/** Generate slot @p slot (taken with take_slot(); lock not held); a failure goes to @p th's record. */
static void make_slot(shard_job *job, size_t slot, shard_thread *th)
{
    const size_t i = job->first + slot;
    const mmoe_tensor_spec *s = &job->specs[i];
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_status st;
    if (s->role == MMOE_ROLE_SCALE) /* a scale first in its shard (plan_shards keeps pairs together) */
        st = mmoe_error_set(&err, MMOE_EINTERNAL, "synth-model: scale '%s' without its weight", s->name);
    else
        st = gen_tensor(job->cfg, s, i + 1 < job->n_specs ? &job->specs[i + 1] : NULL, job->seed, job->normals,
                        &job->outs[slot], &err);
    pthread_mutex_lock(&job->lock);
    job->state[slot] = st == MMOE_OK ? SLOT_READY : SLOT_FAILED;
    if (st != MMOE_OK) {
        job->stop = true;
        if (th->st == MMOE_OK) {
            th->failed_slot = slot;
            th->st = st;
            th->err = err;
        }
    }
    pthread_cond_broadcast(&job->changed);
    pthread_mutex_unlock(&job->lock);
}

/** A worker: generate slots in hand-out order until none is left or the job stops. */
static void *shard_worker_run(void *arg)
{
    shard_thread *th = arg;
    shard_job *job = th->job;
    for (;;) {
        size_t slot;
        pthread_mutex_lock(&job->lock);
        const int took = take_slot(job, &slot);
        pthread_mutex_unlock(&job->lock);
        if (!took)
            break;
        make_slot(job, slot, th);
    }
    return NULL;
}

/**
 * The writer's supplier (mmoe_st_bytes_fn): the bytes of slot @p index, once made.  While the
 * slot's maker is still waiting to be handed out, the writing thread generates the next slots
 * itself (with one thread it generates every slot; the hand-out follows the data order, so it
 * reaches the maker); while another thread makes it, it waits.
 */
static mmoe_status supply_slot(void *ctx, size_t index, const void **data, mmoe_error *err)
{
    shard_job *job = ctx;
    shard_thread *self = &job->threads[job->n_threads - 1];
    const size_t maker = maker_of(job, index);
    pthread_mutex_lock(&job->lock);
    while (job->state[maker] == SLOT_WAITING || job->state[maker] == SLOT_MAKING) {
        size_t slot;
        if (job->state[maker] == SLOT_MAKING) {
            pthread_cond_wait(&job->changed, &job->lock);
        } else if (take_slot(job, &slot)) {
            pthread_mutex_unlock(&job->lock);
            make_slot(job, slot, self);
            pthread_mutex_lock(&job->lock);
        } else {
            break; /* stopped before the maker was handed out: an earlier slot failed */
        }
    }
    const slot_state state = job->state[maker];
    mmoe_status failed_st = MMOE_EINTERNAL;
    for (size_t t = 0; state == SLOT_FAILED && t < job->n_threads; t++) /* the thread that failed on it */
        if (job->threads[t].st != MMOE_OK && job->threads[t].failed_slot == maker) {
            failed_st = job->threads[t].st;
            if (err)
                *err = job->threads[t].err;
        }
    pthread_mutex_unlock(&job->lock);
    const mmoe_tensor_spec *s = &job->specs[job->first + index];
    if (state == SLOT_FAILED)
        return failed_st;
    if (state != SLOT_READY)
        return mmoe_error_set(err, MMOE_EINTERNAL, "synth-model: tensor '%s' was never generated", s->name);
    const gen_out *g = &job->outs[maker];
    const void *bytes = maker == index ? g->data : g->scale;
    const size_t nbytes = maker == index ? g->nbytes : g->scale_nbytes;
    if (!bytes || nbytes != numel_of(s) * mmoe_dtype_size(s->dtype))
        return mmoe_error_set(err, MMOE_EINTERNAL, "synth-model: tensor '%s': %zu bytes made for %llu", s->name,
                              bytes ? nbytes : 0, (unsigned long long)(numel_of(s) * mmoe_dtype_size(s->dtype)));
    *data = bytes;
    return MMOE_OK;
}

/**
 * Start the job's workers (n_threads - 1 threads, signals blocked so that they go to the writing
 * thread).  @return the number started; *@p rc the pthread_create error that stopped the start, or 0
 */
static size_t start_workers(shard_job *job, int *rc)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    size_t started = 0;
    *rc = 0;
    while (started + 1 < job->n_threads &&
           (*rc = pthread_create(&job->threads[started].thread, NULL, shard_worker_run, &job->threads[started])) == 0)
        started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return started;
}

/** Stop handing out slots and join the @p started workers. */
static void stop_workers(shard_job *job, size_t started)
{
    pthread_mutex_lock(&job->lock);
    job->stop = true;
    pthread_mutex_unlock(&job->lock);
    for (size_t t = 0; t < started; t++)
        pthread_join(job->threads[t].thread, NULL);
}

/**
 * The slots that generate, in the data order of the writer's file: a weight and its scale are
 * made together, at the place of whichever of the two is written first.
 */
static mmoe_status plan_make_order(shard_job *job, const mmoe_st_writer *w, mmoe_error *err)
{
    size_t *order = malloc(sizeof(size_t) * (job->count ? job->count : 1));
    unsigned char *planned = calloc(job->count ? job->count : 1, 1);
    if (!order || !planned) {
        free(order);
        free(planned);
        return mmoe_error_set(err, MMOE_ENOMEM, "synth-model: out of memory");
    }
    mmoe_status st = mmoe_st_writer_data_order(w, order, err);
    job->n_make = 0;
    for (size_t k = 0; st == MMOE_OK && k < job->count; k++) {
        const size_t maker = maker_of(job, order[k]);
        if (!planned[maker]) {
            planned[maker] = 1;
            job->make_order[job->n_make++] = maker;
        }
    }
    free(order);
    free(planned);
    return st;
}

/**
 * Write the tensors [first, last) into one shard file: declare them all (shapes only), then
 * stream the file while @p n_threads threads generate the tensors in its data order.
 */
static mmoe_status write_shard(const mmoe_config *c, const mmoe_tensor_spec *specs, size_t n_specs, size_t first,
                               size_t last, uint64_t seed, const mmoe_normal_table *normals, int n_threads,
                               const char *path, mmoe_error *err)
{
    const size_t count = last - first;
    shard_job job = {.cfg = c, .specs = specs, .n_specs = n_specs, .first = first, .count = count, .seed = seed,
                     .normals = normals};
    job.n_threads = count == 0 ? 1 : (size_t)n_threads < count ? (size_t)n_threads : count;
    job.outs = calloc(count ? count : 1, sizeof *job.outs);
    job.make_order = malloc(sizeof(size_t) * (count ? count : 1));
    job.state = calloc(count ? count : 1, sizeof *job.state);
    job.threads = calloc(job.n_threads, sizeof *job.threads);
    mmoe_st_writer *w = NULL;
    mmoe_status st = MMOE_OK;
    if (!job.outs || !job.make_order || !job.state || !job.threads)
        st = mmoe_error_set(err, MMOE_ENOMEM, "synth-model: out of memory");
    if (st == MMOE_OK)
        st = mmoe_st_writer_create(&w, err);
    for (size_t i = first; i < last && st == MMOE_OK; i++) {
        const mmoe_tensor_spec *s = &specs[i];
        st = mmoe_st_writer_add_deferred(w, s->name, s->dtype, s->ndim, s->shape,
                                         numel_of(s) * mmoe_dtype_size(s->dtype), err);
    }
    if (st == MMOE_OK)
        st = mmoe_st_writer_set_metadata(w, "format", "pt", err);
    if (st == MMOE_OK)
        st = plan_make_order(&job, w, err);
    if (st == MMOE_OK) {
        pthread_mutex_init(&job.lock, NULL);
        pthread_cond_init(&job.changed, NULL);
        for (size_t t = 0; t < job.n_threads; t++)
            job.threads[t].job = &job;
        int rc;
        const size_t started = start_workers(&job, &rc);
        if (rc != 0)
            st = mmoe_error_set(err, MMOE_ENOMEM, "synth-model: cannot start worker thread %zu of %zu: %s",
                                started + 1, job.n_threads - 1, strerror(rc));
        else
            st = mmoe_st_writer_finish_streamed(w, path, supply_slot, &job, err);
        stop_workers(&job, started);
        pthread_cond_destroy(&job.changed);
        pthread_mutex_destroy(&job.lock);
    }
    mmoe_st_writer_destroy(w);
    for (size_t i = 0; job.outs && i < count; i++) {
        free(job.outs[i].data);
        free(job.outs[i].scale);
    }
    free(job.outs);
    free(job.make_order);
    free(job.state);
    free(job.threads);
    return st;
}

int mmoe_synth_model_online_threads(void)
{
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MMOE_SYNTH_MAX_THREADS ? MMOE_SYNTH_MAX_THREADS : (int)n;
}

mmoe_status mmoe_synth_model_write(const mmoe_config *cfg, uint64_t seed, const char *dir,
                                   uint64_t max_shard_bytes, int n_threads, mmoe_synth_progress_fn progress,
                                   void *progress_ctx, mmoe_error *err)
{
    mmoe_status st = mmoe_config_validate(cfg, err);
    if (st != MMOE_OK)
        return st;
    if (n_threads < 0 || n_threads > MMOE_SYNTH_MAX_THREADS)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "synth-model: thread count %d is not in [1, %d] (or 0: every online CPU)", n_threads,
                              MMOE_SYNTH_MAX_THREADS);
    if (n_threads == 0)
        n_threads = mmoe_synth_model_online_threads();
    if (max_shard_bytes == 0)
        max_shard_bytes = (uint64_t)4 << 30;
    /* the target must not exist, or be an empty directory */
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        int empty = 1;
        while ((e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                empty = 0;
        closedir(d);
        if (!empty)
            return mmoe_error_set(err, MMOE_EINVAL, "synth-model: '%s' exists and is not empty", dir);
    }
    mmoe_tensor_spec *specs = NULL;
    size_t n = 0;
    st = mmoe_model_tensor_list(cfg, &specs, &n, err);
    if (st != MMOE_OK)
        return st;
    /* plan: shard index per tensor; a weight and its scale stay together */
    int *shard_of = malloc(sizeof(int) * n);
    mmoe_normal_table *normals = malloc(sizeof *normals);
    if (normals)
        mmoe_normal_table_fill_quantiles(normals);
    char **shard_names = NULL;
    const char **names = malloc(sizeof(char *) * n), **files = malloc(sizeof(char *) * n);
    char partial[4096], path[4200];
    int n_shards = 0;
    if (!shard_of || !names || !files || !normals) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "synth-model: out of memory");
        goto done;
    }
    {
        uint64_t cur = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t b = mmoe_model_tensor_bytes(&specs[i], 1);
            int keep = specs[i].role == MMOE_ROLE_SCALE; /* never split a pair */
            if (i == 0 || (!keep && cur > 0 && cur + b > max_shard_bytes)) {
                n_shards++;
                cur = 0;
            }
            shard_of[i] = n_shards - 1;
            cur += b;
        }
    }
    shard_names = calloc((size_t)n_shards, sizeof(char *));
    if (!shard_names) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "synth-model: out of memory");
        goto done;
    }
    for (int s = 0; s < n_shards; s++) {
        shard_names[s] = malloc(64);
        if (!shard_names[s]) {
            st = mmoe_error_set(err, MMOE_ENOMEM, "synth-model: out of memory");
            goto done;
        }
        snprintf(shard_names[s], 64, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
    }
    snprintf(partial, sizeof partial, "%s.partial-%ld", dir, (long)getpid());
    if (mkdir(partial, 0777) != 0) {
        st = mmoe_error_set(err, MMOE_EIO, "synth-model: cannot create '%s': %s", partial, strerror(errno));
        goto done;
    }
    const int cleanup_slot = mmoe_cleanup_add(partial, MMOE_CLEANUP_DIR); /* a signal removes it */
    {
        uint64_t written = 0;
        size_t first = 0;
        for (int s = 0; s < n_shards && st == MMOE_OK; s++) {
            size_t last = first;
            while (last < n && shard_of[last] == s)
                last++;
            snprintf(path, sizeof path, "%s/%s", partial, shard_names[s]);
            st = write_shard(cfg, specs, n, first, last, seed, normals, n_threads, path, err);
            written += mmoe_model_tensor_bytes(specs + first, last - first);
            if (st == MMOE_OK && progress)
                progress(progress_ctx, s + 1, n_shards, written);
            first = last;
        }
        for (size_t i = 0; i < n; i++) {
            names[i] = specs[i].name;
            files[i] = shard_names[shard_of[i]];
        }
        if (st == MMOE_OK) {
            snprintf(path, sizeof path, "%s/%s", partial, MMOE_ST_INDEX_NAME);
            st = mmoe_st_write_index(path, n, names, files, mmoe_model_tensor_bytes(specs, n), err);
        }
    }
    if (st == MMOE_OK) {
        char *json = NULL;
        st = mmoe_config_to_json(cfg, &json, err);
        if (st == MMOE_OK) {
            snprintf(path, sizeof path, "%s/config.json", partial);
            st = write_text_file(path, json, err);
        }
        free(json);
    }
    if (st == MMOE_OK) {
        rmdir(dir); /* an empty target directory is replaced */
        if (rename(partial, dir) != 0)
            st = mmoe_error_set(err, MMOE_EIO, "synth-model: cannot rename '%s' to '%s': %s", partial, dir,
                                strerror(errno));
    }
    if (st != MMOE_OK)
        remove_partial(partial);
    mmoe_cleanup_remove(cleanup_slot);
done:
    if (shard_names)
        for (int s = 0; s < n_shards; s++)
            free(shard_names[s]);
    free(shard_names);
    free(shard_of);
    free(normals);
    free(names);
    free(files);
    free(specs);
    return st;
}
