/**
 * @file mmoe_safetensors_ckpt.c
 * @brief Checkpoints: one name -> tensor map over a set of safetensors shards.
 *
 * Large models ship as several shards plus `model.safetensors.index.json`:
 *
 *     {"metadata": {"total_size": 123},
 *      "weight_map": {"embed.weight": "model-00001-of-00002.safetensors", ...}}
 *
 * Opening a checkpoint resolves the three layouts (one file; a directory with
 * an index; a directory with a lone model.safetensors), opens and validates
 * every shard at once (the mapping is virtual: nothing is read until used),
 * and cross-checks the index against the shards in both directions:
 *
 * - every shard named in the index exists (ENOTFOUND otherwise);
 * - every tensor the index lists is in the shard it names (ENOTFOUND);
 * - every tensor of a shard is listed by the index *for that shard*
 *   (EFORMAT): a stray tensor is a sign of a stale index or a mixed-up
 *   directory, and silently ignoring it would hide the mistake.
 *
 * Shard names in the index must be plain file names (no '/'): the index
 * cannot point outside its own directory.  The "metadata" object of the
 * index, total_size included, is informational and not checked.
 *
 * The merged entry table is sorted by name, so lookups are a binary search.
 */
#include "mmoe_safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

/** A checkpoint: its shards and the merged entry table. */
struct mmoe_ckpt {
    char *path;              /**< as given */
    mmoe_st_file **shards;   /**< sorted by shard name */
    char **shard_names;      /**< file names as in the index (or the path) */
    size_t n_shards;         /**< number of shards */
    mmoe_ckpt_entry *entries; /**< sorted by name */
    size_t n_entries;        /**< number of tensors over all shards */
};

/** qsort/bsearch order of string pointers. */
static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/** qsort/bsearch order of entries: strcmp of the names. */
static int cmp_ckpt_entry(const void *a, const void *b)
{
    return strcmp(((const mmoe_ckpt_entry *)a)->name, ((const mmoe_ckpt_entry *)b)->name);
}

/** "dir/file", malloc'd (NULL if out of memory). */
static char *join_path(const char *dir, const char *file)
{
    size_t len = strlen(dir) + strlen(file) + 2;
    char *out = malloc(len);
    if (out)
        snprintf(out, len, "%s/%s", dir, file);
    return out;
}

/** 1 if @p path exists and is a regular file (after symlinks). */
static int is_regular_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/** Allocate the shard arrays for @p n shards. */
static mmoe_status alloc_shards(mmoe_ckpt *ck, size_t n, mmoe_error *err)
{
    ck->shards = calloc(n ? n : 1, sizeof *ck->shards);
    ck->shard_names = calloc(n ? n : 1, sizeof *ck->shard_names);
    if (!ck->shards || !ck->shard_names)
        return mmoe_error_set(err, MMOE_ENOMEM, "checkpoint %s: out of memory", ck->path);
    ck->n_shards = n;
    return MMOE_OK;
}

/** Build the merged, sorted entry table from all shards (every tensor of every shard). */
static mmoe_status collect_entries(mmoe_ckpt *ck, mmoe_error *err)
{
    size_t total = 0;
    for (size_t s = 0; s < ck->n_shards; s++)
        total += mmoe_st_count(ck->shards[s]);
    ck->entries = calloc(total ? total : 1, sizeof *ck->entries);
    if (!ck->entries)
        return mmoe_error_set(err, MMOE_ENOMEM, "checkpoint %s: out of memory", ck->path);
    for (size_t s = 0; s < ck->n_shards; s++) {
        for (size_t i = 0; i < mmoe_st_count(ck->shards[s]); i++) {
            const mmoe_st_entry *e = mmoe_st_get(ck->shards[s], i);
            mmoe_ckpt_entry *c = &ck->entries[ck->n_entries++];
            c->name = e->name;
            c->view = e->view;
            c->realigned = e->realigned;
            c->shard = ck->shard_names[s];
            c->shard_index = (int)s;
        }
    }
    qsort(ck->entries, ck->n_entries, sizeof *ck->entries, cmp_ckpt_entry);
    return MMOE_OK;
}

/** Layout 1 and 3: one file. */
static mmoe_status open_single(mmoe_ckpt *ck, const char *file, mmoe_error *err)
{
    mmoe_status st = alloc_shards(ck, 1, err);
    if (st != MMOE_OK)
        return st;
    ck->shard_names[0] = strdup(file);
    if (!ck->shard_names[0])
        return mmoe_error_set(err, MMOE_ENOMEM, "checkpoint %s: out of memory", ck->path);
    return mmoe_st_open(file, &ck->shards[0], err);
}

/** Parse the index into its weight_map object (a new reference). */
static mmoe_status load_index(const char *index_path, json_t **root_out, json_t **map_out,
                              mmoe_error *err)
{
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "checkpoint index %s: not valid JSON: %s (line %d, column %d)",
                              index_path, jerr.text, jerr.line, jerr.column);
    json_t *map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(map)) {
        json_decref(root);
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "checkpoint index %s: expected an object with a 'weight_map' object",
                              index_path);
    }
    const char *name;
    json_t *shard;
    json_object_foreach(map, name, shard)
    {
        const char *file = json_is_string(shard) ? json_string_value(shard) : NULL;
        if (!file || !file[0] || strchr(file, '/') || strcmp(file, ".") == 0 ||
            strcmp(file, "..") == 0) {
            mmoe_status st = mmoe_error_set(err, MMOE_EFORMAT,
                                            "checkpoint index %s: tensor '%s': expected a shard "
                                            "file name (a string without '/'), found %s",
                                            index_path, name, file ? file : "a non-string");
            json_decref(root); /* frees name and file: the message is written first */
            return st;
        }
    }
    *root_out = root;
    *map_out = map;
    return MMOE_OK;
}

/** Layout 2: a directory with model.safetensors.index.json. */
static mmoe_status open_indexed(mmoe_ckpt *ck, const char *dir, const char *index_path,
                                mmoe_error *err)
{
    json_t *root = NULL, *map = NULL;
    mmoe_status st = load_index(index_path, &root, &map, err);
    if (st != MMOE_OK)
        return st;
    /* the distinct shard names, sorted */
    size_t n_map = json_object_size(map);
    const char **names = calloc(n_map ? n_map : 1, sizeof *names);
    if (!names) {
        json_decref(root);
        return mmoe_error_set(err, MMOE_ENOMEM, "checkpoint %s: out of memory", ck->path);
    }
    size_t n_names = 0;
    const char *tensor;
    json_t *shard;
    json_object_foreach(map, tensor, shard)
        names[n_names++] = json_string_value(shard);
    qsort(names, n_names, sizeof *names, cmp_str_ptr);
    size_t n_unique = 0;
    for (size_t i = 0; i < n_names; i++)
        if (n_unique == 0 || strcmp(names[i], names[n_unique - 1]) != 0)
            names[n_unique++] = names[i];
    st = alloc_shards(ck, n_unique, err);
    /* open each shard */
    for (size_t s = 0; st == MMOE_OK && s < n_unique; s++) {
        ck->shard_names[s] = strdup(names[s]);
        char *file = join_path(dir, names[s]);
        if (!ck->shard_names[s] || !file)
            st = mmoe_error_set(err, MMOE_ENOMEM, "checkpoint %s: out of memory", ck->path);
        else if (!is_regular_file(file))
            st = mmoe_error_set(err, MMOE_ENOTFOUND,
                                "checkpoint index %s: lists shard '%s', but %s is not a file",
                                index_path, names[s], file);
        else
            st = mmoe_st_open(file, &ck->shards[s], err);
        free(file);
    }
    free(names);
    /* index -> shards: every listed tensor is where the index says */
    json_object_foreach(map, tensor, shard)
    {
        if (st != MMOE_OK)
            break;
        const char *file = json_string_value(shard);
        const char **hit = bsearch(&file, ck->shard_names, ck->n_shards, sizeof(char *),
                                   cmp_str_ptr);
        if (!mmoe_st_find(ck->shards[hit - (const char **)ck->shard_names], tensor))
            st = mmoe_error_set(err, MMOE_ENOTFOUND,
                                "checkpoint index %s: lists tensor '%s' in shard '%s', but that "
                                "shard has no such tensor",
                                index_path, tensor, file);
    }
    /* shards -> index: every tensor of a shard is listed for that shard */
    for (size_t s = 0; st == MMOE_OK && s < ck->n_shards; s++) {
        for (size_t i = 0; st == MMOE_OK && i < mmoe_st_count(ck->shards[s]); i++) {
            const char *name = mmoe_st_get(ck->shards[s], i)->name;
            const json_t *listed = json_object_get(map, name);
            if (!listed)
                st = mmoe_error_set(err, MMOE_EFORMAT,
                                    "checkpoint %s: shard '%s' holds tensor '%s', which the index "
                                    "does not list",
                                    ck->path, ck->shard_names[s], name);
            else if (strcmp(json_string_value(listed), ck->shard_names[s]) != 0)
                st = mmoe_error_set(err, MMOE_EFORMAT,
                                    "checkpoint %s: shard '%s' holds tensor '%s', which the index "
                                    "assigns to shard '%s'",
                                    ck->path, ck->shard_names[s], name, json_string_value(listed));
        }
    }
    json_decref(root);
    return st;
}

mmoe_status mmoe_ckpt_open(const char *path, mmoe_ckpt **out, mmoe_error *err)
{
    *out = NULL;
    mmoe_ckpt *ck = calloc(1, sizeof *ck);
    if (ck)
        ck->path = strdup(path);
    if (!ck || !ck->path) {
        free(ck);
        return mmoe_error_set(err, MMOE_ENOMEM, "checkpoint %s: out of memory", path);
    }
    struct stat sb;
    mmoe_status st;
    if (stat(path, &sb) != 0)
        st = mmoe_error_set(err, errno == ENOENT ? MMOE_ENOTFOUND : MMOE_EIO,
                            "checkpoint %s: %s", path, strerror(errno));
    else if (!S_ISDIR(sb.st_mode))
        st = open_single(ck, path, err);
    else {
        char *index = join_path(path, MMOE_ST_INDEX_NAME);
        char *single = join_path(path, MMOE_ST_SINGLE_NAME);
        if (!index || !single)
            st = mmoe_error_set(err, MMOE_ENOMEM, "checkpoint %s: out of memory", path);
        else if (is_regular_file(index))
            st = open_indexed(ck, path, index, err);
        else if (is_regular_file(single))
            st = open_single(ck, single, err);
        else
            st = mmoe_error_set(err, MMOE_ENOTFOUND,
                                "checkpoint %s: directory has neither %s nor %s", path,
                                MMOE_ST_INDEX_NAME, MMOE_ST_SINGLE_NAME);
        free(index);
        free(single);
    }
    if (st == MMOE_OK)
        st = collect_entries(ck, err);
    if (st != MMOE_OK) {
        mmoe_ckpt_close(ck);
        return st;
    }
    *out = ck;
    return MMOE_OK;
}

void mmoe_ckpt_close(mmoe_ckpt *ck)
{
    if (!ck)
        return;
    for (size_t s = 0; s < ck->n_shards; s++) {
        mmoe_st_close(ck->shards[s]);
        free(ck->shard_names[s]);
    }
    free(ck->shards);
    free(ck->shard_names);
    free(ck->entries);
    free(ck->path);
    free(ck);
}

size_t mmoe_ckpt_count(const mmoe_ckpt *ck)
{
    return ck->n_entries;
}

const mmoe_ckpt_entry *mmoe_ckpt_get(const mmoe_ckpt *ck, size_t i)
{
    return i < ck->n_entries ? &ck->entries[i] : NULL;
}

size_t mmoe_ckpt_shard_count(const mmoe_ckpt *ck)
{
    return ck->n_shards;
}

const mmoe_st_file *mmoe_ckpt_shard(const mmoe_ckpt *ck, size_t i)
{
    return i < ck->n_shards ? ck->shards[i] : NULL;
}

const mmoe_ckpt_entry *mmoe_ckpt_find_entry(const mmoe_ckpt *ck, const char *name)
{
    if (ck->n_entries == 0)
        return NULL;
    mmoe_ckpt_entry key = {.name = name};
    return bsearch(&key, ck->entries, ck->n_entries, sizeof *ck->entries, cmp_ckpt_entry);
}

const mmoe_tensor *mmoe_ckpt_find(const mmoe_ckpt *ck, const char *name)
{
    const mmoe_ckpt_entry *e = mmoe_ckpt_find_entry(ck, name);
    return e ? &e->view : NULL;
}

mmoe_status mmoe_ckpt_lookup(void *ckpt, const char *name, mmoe_tensor *out, mmoe_error *err)
{
    const mmoe_ckpt *ck = ckpt;
    const mmoe_tensor *t = mmoe_ckpt_find(ck, name);
    if (t == NULL)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "checkpoint %s: no tensor '%s'", ck->path, name);
    *out = *t;
    return MMOE_OK;
}

mmoe_status mmoe_ckpt_require(const mmoe_ckpt *ck, const char *name, mmoe_dtype dtype, int ndim,
                              const int64_t *shape, mmoe_tensor *view, mmoe_error *err)
{
    const mmoe_ckpt_entry *e = mmoe_ckpt_find_entry(ck, name);
    if (!e)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "checkpoint %s: no tensor '%s'", ck->path,
                              name);
    mmoe_status st;
    if (ndim < 0)
        st = e->view.dtype == dtype
                 ? MMOE_OK
                 : mmoe_error_set(err, MMOE_EDTYPE, "tensor '%s': expected dtype %s, found %s",
                                  name, mmoe_dtype_name(dtype), mmoe_dtype_name(e->view.dtype));
    else
        st = mmoe_tensor_expect(&e->view, name, dtype, ndim, shape, err);
    if (st != MMOE_OK)
        return mmoe_error_prefix(err, "checkpoint %s (shard %s): ", ck->path, e->shard);
    /* zero-copy views are only usable as typed arrays when aligned */
    size_t elem = mmoe_dtype_size(dtype);
    if (e->view.nbytes > 0 && (uintptr_t)e->view.data % elem != 0)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                              "checkpoint %s (shard %s): tensor '%s': data is not aligned to its "
                              "%zu-byte elements (the file's writer did not align tensors; "
                              "rewrite it with megamoe or the safetensors library)",
                              ck->path, e->shard, name, elem);
    if (view)
        *view = e->view;
    return MMOE_OK;
}
