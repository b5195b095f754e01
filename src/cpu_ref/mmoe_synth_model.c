/**
 * @file mmoe_synth_model.c
 * @brief Writing a random checkpoint: plan shards, generate each shard's tensors on a pool of
 *        threads, write shards, index and config.
 *
 * The tensor list is walked once to assign shards (consecutive tensors until a
 * shard reaches the size target), then shard by shard: generate the shard's
 * tensors into owned buffers, hand them to a safetensors writer (which borrows
 * them), finish the shard atomically, free the buffers.  Peak memory is one
 * shard (plus one float copy of the tensor each thread is generating).  An FP8 or
 * FP4 weight and its scale are generated together (the scale depends on the
 * weight's block maxima); the scale entry, which always follows its weight in the
 * list, picks up the bytes kept from the weight.
 *
 * ## Threads
 *
 * Each tensor draws from its own generator, seeded with `seed ^ FNV-1a(name)`, so the
 * tensors of a shard are independent: a pool of `n_threads` workers (the calling thread
 * is one of them) takes tensor indices in increasing order from a shared counter and
 * generates each into its own slot of the shard's output array.  No worker writes
 * anything another reads; the bytes of a tensor are those of the one-thread run, whatever
 * the thread count or the order in which the workers finish.  The shard file is written
 * by the calling thread alone, after every worker has been joined.  The workers block
 * the signals, so the cleanup handler (mmoe_cleanup.h) always runs on the calling thread.
 *
 * Errors: a worker that fails records its tensor index, status and message and stops
 * the hand-out of further indices.  Indices are handed out in increasing order, so every
 * tensor before the failing one has been (or is being) generated; the error reported is
 * that of the lowest failing index, the one a one-thread run reports.  The writer adds the
 * tensors before it in order (its own errors come first, as in the one-thread run).
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
#include <stdatomic.h>
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

/** What the workers of one shard share: the read-only inputs, the output slots and the hand-out counter. */
typedef struct shard_job {
    const mmoe_config *cfg;               /**< the configuration */
    const mmoe_tensor_spec *specs;        /**< the whole tensor list */
    size_t n_specs;                       /**< its length */
    size_t first, last;                   /**< the shard's tensors [first, last) */
    uint64_t seed;                        /**< the run's seed */
    const mmoe_normal_table *normals;     /**< the deviate table */
    gen_out *outs;                        /**< one slot per tensor of the shard; slot i - first for tensor i */
    atomic_size_t next;                   /**< the next tensor index to hand out */
    atomic_bool stop;                     /**< set by a failing worker: hand out no more indices */
} shard_job;

/** One worker of a shard: its job and its first failure. */
typedef struct shard_worker {
    shard_job *job;     /**< the shared job */
    pthread_t thread;   /**< the thread (unused for the calling thread's worker) */
    size_t failed_at;   /**< the index of the tensor that failed, or job->last */
    mmoe_status st;     /**< its status (MMOE_OK if none failed) */
    mmoe_error err;     /**< its message */
} shard_worker;

/** Generate tensors of the job until the indices run out or one fails (the scale entries are made by their weight). */
static void *shard_worker_run(void *arg)
{
    shard_worker *wk = arg;
    shard_job *job = wk->job;
    for (;;) {
        if (atomic_load(&job->stop))
            break;
        const size_t i = atomic_fetch_add(&job->next, 1);
        if (i >= job->last)
            break;
        const mmoe_tensor_spec *s = &job->specs[i];
        if (s->role == MMOE_ROLE_SCALE)
            continue;
        const mmoe_tensor_spec *next = i + 1 < job->n_specs ? &job->specs[i + 1] : NULL;
        wk->st = gen_tensor(job->cfg, s, next, job->seed, job->normals, &job->outs[i - job->first], &wk->err);
        if (wk->st != MMOE_OK) {
            wk->failed_at = i;
            atomic_store(&job->stop, true);
            break;
        }
    }
    return NULL;
}

/**
 * Generate the tensors [first, last) of @p job->specs into @p job->outs on @p n_threads workers
 * (the calling thread and up to n_threads - 1 new threads, all joined before the return).
 * @param failed_at  where the shard's writer must stop: the lowest index whose generation failed,
 *                   @p job->first when a thread could not be started, else @p job->last
 * @return MMOE_OK, or that failure's status (its message in @p err)
 */
static mmoe_status generate_shard(shard_job *job, int n_threads, size_t *failed_at, mmoe_error *err)
{
    const size_t count = job->last - job->first;
    const size_t n_workers = count == 0 ? 1 : (size_t)n_threads < count ? (size_t)n_threads : count;
    *failed_at = job->first;
    shard_worker *wk = calloc(n_workers, sizeof *wk);
    if (!wk)
        return mmoe_error_set(err, MMOE_ENOMEM, "synth-model: out of memory");
    atomic_init(&job->next, job->first);
    atomic_init(&job->stop, false);
    for (size_t t = 0; t < n_workers; t++) {
        wk[t].job = job;
        wk[t].failed_at = job->last;
        wk[t].st = MMOE_OK;
        mmoe_error_clear(&wk[t].err);
    }
    /* the new threads inherit a mask that blocks every signal: signals go to the calling thread */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    size_t started = 1; /* the calling thread is worker 0 */
    int rc = 0;
    while (started < n_workers && (rc = pthread_create(&wk[started].thread, NULL, shard_worker_run, &wk[started])) == 0)
        started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        atomic_store(&job->stop, true); /* the started workers finish their tensor and return */
    else
        shard_worker_run(&wk[0]);
    for (size_t t = 1; t < started; t++)
        pthread_join(wk[t].thread, NULL);
    mmoe_status st = MMOE_OK;
    if (rc != 0) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "synth-model: cannot start worker thread %zu of %zu: %s", started + 1,
                            n_workers, strerror(rc));
    } else {
        const shard_worker *first_failed = NULL;
        for (size_t t = 0; t < n_workers; t++)
            if (wk[t].st != MMOE_OK && (!first_failed || wk[t].failed_at < first_failed->failed_at))
                first_failed = &wk[t];
        *failed_at = first_failed ? first_failed->failed_at : job->last;
        if (first_failed) {
            st = first_failed->st;
            if (err)
                *err = first_failed->err;
        }
    }
    free(wk);
    return st;
}

/** Write the tensors [first, last) into one shard file, generated on @p n_threads threads. */
static mmoe_status write_shard(const mmoe_config *c, const mmoe_tensor_spec *specs, size_t n_specs, size_t first,
                               size_t last, uint64_t seed, const mmoe_normal_table *normals, int n_threads,
                               const char *path, mmoe_error *err)
{
    mmoe_st_writer *w = NULL;
    mmoe_status st = mmoe_st_writer_create(&w, err);
    if (st != MMOE_OK)
        return st;
    gen_out *outs = calloc(last - first, sizeof *outs);
    if (!outs) {
        mmoe_st_writer_destroy(w);
        return mmoe_error_set(err, MMOE_ENOMEM, "synth-model: out of memory");
    }
    shard_job job = {.cfg = c, .specs = specs, .n_specs = n_specs, .first = first, .last = last, .seed = seed,
                     .normals = normals, .outs = outs};
    size_t failed_at;
    mmoe_error gen_err;
    mmoe_error_clear(&gen_err);
    const mmoe_status gen_st = generate_shard(&job, n_threads, &failed_at, &gen_err);
    /* add in list order up to the first failure: the errors come in the order of a one-thread run */
    for (size_t i = first; i < last && st == MMOE_OK; i++) {
        const mmoe_tensor_spec *s = &specs[i];
        gen_out *g = &outs[i - first];
        if (i == failed_at)
            break;
        if (s->role == MMOE_ROLE_SCALE) {
            /* the preceding weight (in this shard: plan_shards keeps pairs together) made our bytes */
            gen_out *prev = i > first ? &outs[i - first - 1] : NULL;
            if (!prev || !prev->scale) {
                st = mmoe_error_set(err, MMOE_EINTERNAL, "synth-model: scale '%s' without its weight", s->name);
                break;
            }
            g->data = prev->scale;
            g->nbytes = prev->scale_nbytes;
            prev->scale = NULL;
        }
        st = mmoe_st_writer_add(w, s->name, s->dtype, s->ndim, s->shape, g->data, g->nbytes, err);
    }
    if (st == MMOE_OK && gen_st != MMOE_OK) {
        st = gen_st;
        if (err)
            *err = gen_err;
    }
    if (st == MMOE_OK)
        st = mmoe_st_writer_set_metadata(w, "format", "pt", err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_finish(w, path, err);
    mmoe_st_writer_destroy(w);
    for (size_t i = 0; i < last - first; i++) {
        free(outs[i].data);
        free(outs[i].scale);
    }
    free(outs);
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
