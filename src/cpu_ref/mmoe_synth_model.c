/**
 * @file mmoe_synth_model.c
 * @brief Writing a random checkpoint: plan shards, generate each tensor, write shards, index and config.
 *
 * The tensor list is walked once to assign shards (consecutive tensors until a
 * shard reaches the size target), then shard by shard: generate the shard's
 * tensors into owned buffers, hand them to a safetensors writer (which borrows
 * them), finish the shard atomically, free the buffers.  Peak memory is one
 * shard.  An FP8 or FP4 weight and its scale are generated together (the scale
 * depends on the weight's block maxima); the scale entry, which always follows its
 * weight in the list, picks up the bytes kept from the weight.
 */
#include "mmoe_synth_model.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
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
    uint64_t bits = 0;
    for (uint64_t i = 0; i < nlog; i++) {
        if (i % 4 == 0)
            bits = mmoe_rng_u64(&rng);
        double z = normals->v[bits & 0xFFFF];
        bits >>= 16;
        double v;
        switch (s->role) {
        case MMOE_ROLE_EMBED: v = z; break;
        case MMOE_ROLE_LINEAR: v = z / sqrt((double)cols); break;
        case MMOE_ROLE_NORM: v = 1.0 + 0.1 * z; break;
        case MMOE_ROLE_HC_FN: v = z / sqrt((double)cols); break;
        case MMOE_ROLE_HC_BASE: v = 0.5 * z; break;
        case MMOE_ROLE_HC_SCALE: v = 0.5 + mmoe_rng_uniform(&rng); break;
        case MMOE_ROLE_SINK: v = z; break;
        case MMOE_ROLE_APE: v = 0.5 * z; break;
        case MMOE_ROLE_BIAS: v = 0.1 * z; break;
        default: v = z; break;
        }
        tmp[i] = (float)v;
    }
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

/** Write the tensors [first, last) into one shard file. */
static mmoe_status write_shard(const mmoe_config *c, const mmoe_tensor_spec *specs, size_t n_specs, size_t first,
                               size_t last, uint64_t seed, const mmoe_normal_table *normals, const char *path,
                               mmoe_error *err)
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
    for (size_t i = first; i < last && st == MMOE_OK; i++) {
        const mmoe_tensor_spec *s = &specs[i];
        gen_out *g = &outs[i - first];
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
        } else {
            st = gen_tensor(c, s, i + 1 < n_specs ? &specs[i + 1] : NULL, seed, normals, g, err);
            if (st != MMOE_OK)
                break;
        }
        st = mmoe_st_writer_add(w, s->name, s->dtype, s->ndim, s->shape, g->data, g->nbytes, err);
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

mmoe_status mmoe_synth_model_write(const mmoe_config *cfg, uint64_t seed, const char *dir,
                                   uint64_t max_shard_bytes, mmoe_synth_progress_fn progress,
                                   void *progress_ctx, mmoe_error *err)
{
    mmoe_status st = mmoe_config_validate(cfg, err);
    if (st != MMOE_OK)
        return st;
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
            st = write_shard(cfg, specs, n, first, last, seed, normals, path, err);
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
