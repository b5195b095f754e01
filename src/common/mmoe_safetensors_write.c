/**
 * @file mmoe_safetensors_write.c
 * @brief The safetensors writer and the checkpoint index writer.
 *
 * A writer is a list of (name, dtype, shape, borrowed bytes) plus a string
 * map of metadata.  Nothing touches the disk before mmoe_st_writer_finish(),
 * which lays the file out in three steps:
 *
 * 1. **Order.**  Tensors are sorted by element size, largest first, then by
 *    name (strcmp).  With the header padded to a multiple of 8 this keeps
 *    every tensor aligned to its own element size: all 8-byte tensors come
 *    first (offsets are multiples of 8), then the 4-byte ones (offsets are
 *    still multiples of 4), and so on.  Pure name order, the naive choice,
 *    would put an F32 tensor after an odd-length BF16 one at a misaligned
 *    address.  (The reference implementation orders the same way, by dtype
 *    then name.)
 * 2. **Header.**  One JSON object, written compactly by jansson:
 *    "__metadata__" first (if any), then the tensors in data order, each
 *    `{"dtype","shape","data_offsets"}`.  Spaces pad it to a multiple of 8.
 * 3. **Bytes.**  The 8-byte little-endian header length, the header, then
 *    each tensor's bytes, through mmoe_atomic_file (temporary file, fsync,
 *    rename), so that an error leaves no file behind.
 *
 * A deferred tensor (mmoe_st_writer_add_deferred()) has its shape but not yet its
 * bytes: the header needs only the shapes, so mmoe_st_writer_finish_streamed() writes
 * the header and asks a supplier for each deferred tensor's bytes in data order, just
 * before writing them.  A producer of many tensors (the synthetic checkpoint writer)
 * makes them in that order on other threads while the file is being written.
 *
 * Names are checked when added (non-empty, valid UTF-8, no NUL, not
 * "__metadata__", unique); a jansson object serves as the set of names seen,
 * so adding is O(1) even for checkpoints of many thousand tensors.
 */
#include "mmoe_safetensors.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_atomic_file.h"
#include "mmoe_utf8.h"

/** One tensor to write. */
typedef struct writer_item {
    char *name;                   /**< owned copy */
    mmoe_dtype dtype;             /**< element type */
    int ndim;                     /**< number of dimensions */
    int64_t shape[MMOE_MAX_DIMS]; /**< extents */
    const void *data;             /**< borrowed (NULL for a deferred tensor until it is written) */
    size_t nbytes;                /**< = numel * dtype size */
    int deferred;                 /**< its bytes come from the supplier of mmoe_st_writer_finish_streamed() */
} writer_item;

/** The tensors and metadata of a file to be written. */
struct mmoe_st_writer {
    writer_item *items;   /**< in the order added */
    size_t n_items;       /**< tensors added */
    size_t cap_items;     /**< capacity of @c items */
    uint64_t data_bytes;  /**< sum of nbytes */
    size_t n_deferred;    /**< deferred tensors among them */
    json_t *names;    /**< set of the names added (values are null) */
    json_t *metadata; /**< "__metadata__" object */
};

mmoe_status mmoe_st_writer_create(mmoe_st_writer **out, mmoe_error *err)
{
    mmoe_st_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->names = json_object();
        w->metadata = json_object();
    }
    if (!w || !w->names || !w->metadata) {
        mmoe_st_writer_destroy(w);
        *out = NULL;
        return mmoe_error_set(err, MMOE_ENOMEM, "safetensors writer: out of memory");
    }
    *out = w;
    return MMOE_OK;
}

void mmoe_st_writer_destroy(mmoe_st_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_items; i++)
        free(w->items[i].name);
    free(w->items);
    json_decref(w->names);
    json_decref(w->metadata);
    free(w);
}

size_t mmoe_st_writer_count(const mmoe_st_writer *w)
{
    return w->n_items;
}

uint64_t mmoe_st_writer_data_bytes(const mmoe_st_writer *w)
{
    return w->data_bytes;
}

/** Is @p s a usable name: non-empty, valid UTF-8 (NUL-terminated, so no NUL inside)? */
static int valid_text(const char *s)
{
    return s && s[0] != '\0' && mmoe_utf8_valid(s, strlen(s), NULL);
}

/** Add a tensor: its bytes @p data, or (@p deferred) none yet. */
static mmoe_status add_item(mmoe_st_writer *w, const char *name, mmoe_dtype dtype, int ndim, const int64_t *shape,
                            const void *data, size_t nbytes, int deferred, mmoe_error *err)
{
    if (!valid_text(name))
        return mmoe_error_set(err, MMOE_EINVAL,
                              "safetensors writer: tensor name must be non-empty UTF-8");
    if (strcmp(name, "__metadata__") == 0)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "safetensors writer: '__metadata__' is reserved, not a tensor name");
    if (json_object_get(w->names, name))
        return mmoe_error_set(err, MMOE_EINVAL,
                              "safetensors writer: tensor '%s' added twice", name);
    if ((unsigned)dtype >= MMOE_DT_COUNT)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "safetensors writer: tensor '%s': invalid dtype %d", name,
                              (int)dtype);
    if (ndim < 0 || ndim > MMOE_MAX_DIMS || (ndim > 0 && !shape))
        return mmoe_error_set(err, MMOE_EINVAL,
                              "safetensors writer: tensor '%s': ndim %d outside 0..%d", name, ndim,
                              MMOE_MAX_DIMS);
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[d], &numel))
            return mmoe_error_set(err, MMOE_EINVAL,
                                  "safetensors writer: tensor '%s': shape[%d] = %" PRId64
                                  " is negative or overflows",
                                  name, d, shape[d]);
    }
    uint64_t want_bytes;
    if (numel > (uint64_t)INT64_MAX ||
        __builtin_mul_overflow(numel, (uint64_t)mmoe_dtype_size(dtype), &want_bytes))
        return mmoe_error_set(err, MMOE_EINVAL,
                              "safetensors writer: tensor '%s': byte count overflows", name);
    if (want_bytes != nbytes) {
        char buf[256];
        return mmoe_error_set(err, MMOE_EINVAL,
                              "safetensors writer: tensor '%s': shape %s of %s needs %" PRIu64
                              " bytes, got %zu",
                              name, mmoe_shape_str(ndim, shape, buf, sizeof buf),
                              mmoe_dtype_name(dtype), want_bytes, nbytes);
    }
    if (!deferred && !data && nbytes > 0)
        return mmoe_error_set(err, MMOE_EINVAL, "safetensors writer: tensor '%s': NULL data",
                              name);
    if (w->n_items == w->cap_items) {
        size_t cap = w->cap_items ? 2 * w->cap_items : 16;
        writer_item *grown = realloc(w->items, cap * sizeof *grown);
        if (!grown)
            return mmoe_error_set(err, MMOE_ENOMEM, "safetensors writer: out of memory");
        w->items = grown;
        w->cap_items = cap;
    }
    writer_item *it = &w->items[w->n_items];
    memset(it, 0, sizeof *it);
    it->name = strdup(name);
    if (!it->name || json_object_set_new(w->names, name, json_null()) != 0) {
        free(it->name);
        return mmoe_error_set(err, MMOE_ENOMEM, "safetensors writer: out of memory");
    }
    it->dtype = dtype;
    it->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        it->shape[d] = shape[d];
    it->data = data;
    it->nbytes = nbytes;
    it->deferred = deferred;
    w->n_items++;
    w->data_bytes += nbytes;
    w->n_deferred += deferred != 0;
    return MMOE_OK;
}

mmoe_status mmoe_st_writer_add(mmoe_st_writer *w, const char *name, mmoe_dtype dtype, int ndim,
                               const int64_t *shape, const void *data, size_t nbytes,
                               mmoe_error *err)
{
    return add_item(w, name, dtype, ndim, shape, data, nbytes, 0, err);
}

mmoe_status mmoe_st_writer_add_deferred(mmoe_st_writer *w, const char *name, mmoe_dtype dtype, int ndim,
                                        const int64_t *shape, size_t nbytes, mmoe_error *err)
{
    return add_item(w, name, dtype, ndim, shape, NULL, nbytes, 1, err);
}

mmoe_status mmoe_st_writer_add_tensor(mmoe_st_writer *w, const char *name, const mmoe_tensor *t,
                                      mmoe_error *err)
{
    return mmoe_st_writer_add(w, name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, err);
}

mmoe_status mmoe_st_writer_set_metadata(mmoe_st_writer *w, const char *key, const char *value,
                                        mmoe_error *err)
{
    if (!valid_text(key) || !value || !mmoe_utf8_valid(value, strlen(value), NULL))
        return mmoe_error_set(err, MMOE_EINVAL,
                              "safetensors writer: metadata key '%s': key must be non-empty "
                              "UTF-8 and the value UTF-8",
                              key ? key : "(null)");
    json_t *jv = json_string(value);
    if (!jv || json_object_set_new(w->metadata, key, jv) != 0)
        return mmoe_error_set(err, MMOE_ENOMEM, "safetensors writer: out of memory");
    return MMOE_OK;
}

/* ------------------------------------------------------------------------- */
/* finish                                                                     */
/* ------------------------------------------------------------------------- */

/** Layout order: larger elements first, then by name. */
static int cmp_item_layout(const void *a, const void *b)
{
    const writer_item *x = *(const writer_item *const *)a, *y = *(const writer_item *const *)b;
    size_t sx = mmoe_dtype_size(x->dtype), sy = mmoe_dtype_size(y->dtype);
    if (sx != sy)
        return sx > sy ? -1 : 1; /* larger elements first: keeps every tensor aligned */
    return strcmp(x->name, y->name);
}

/** Build the header text in data order; returns a malloc'd, space-padded string. */
static char *build_header(const mmoe_st_writer *w, writer_item *const *order, size_t n,
                          size_t *len_out)
{
    json_t *root = json_object();
    if (!root)
        return NULL;
    int bad = 0;
    if (json_object_size(w->metadata) > 0)
        bad |= json_object_set(root, "__metadata__", w->metadata);
    uint64_t offset = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        const writer_item *it = order[i];
        json_t *shape = json_array();
        json_t *offs = json_array();
        bad |= !shape || !offs;
        for (int d = 0; d < it->ndim && !bad; d++)
            bad |= json_array_append_new(shape, json_integer((json_int_t)it->shape[d]));
        if (!bad) {
            bad |= json_array_append_new(offs, json_integer((json_int_t)offset));
            bad |= json_array_append_new(offs, json_integer((json_int_t)(offset + it->nbytes)));
        }
        json_t *entry = bad ? NULL
                            : json_pack("{s:s, s:o, s:o}", "dtype", mmoe_dtype_name(it->dtype),
                                        "shape", shape, "data_offsets", offs);
        if (!entry) {
            /* json_pack with "o" steals the references even on failure */
            if (bad) {
                json_decref(shape);
                json_decref(offs);
            }
            bad = 1;
            break;
        }
        bad |= json_object_set_new(root, it->name, entry);
        offset += it->nbytes;
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text)
        return NULL;
    size_t len = strlen(text);
    size_t padded = (len + 7) / 8 * 8;
    char *out = realloc(text, padded + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    memset(out + len, ' ', padded - len);
    out[padded] = '\0';
    *len_out = padded;
    return out;
}

/**
 * Write the @p n items at @p order (re-sorted here into layout order) as one
 * file at @p path, atomically; a deferred item's bytes come from @p bytes (with @p ctx).
 */
static mmoe_status write_items(const mmoe_st_writer *w, writer_item **order, size_t n,
                               const char *path, mmoe_st_bytes_fn bytes, void *ctx, mmoe_error *err)
{
    qsort(order, n, sizeof *order, cmp_item_layout);
    size_t header_len = 0;
    char *header = build_header(w, order, n, &header_len);
    if (!header)
        return mmoe_error_set(err, MMOE_ENOMEM, "safetensors writer: %s: cannot build the header",
                              path);
    uint8_t len_field[8];
    for (int i = 0; i < 8; i++)
        len_field[i] = (uint8_t)((uint64_t)header_len >> (8 * i));

    mmoe_atomic_file af;
    mmoe_status st = mmoe_atomic_open(&af, path, err);
    if (st == MMOE_OK)
        st = mmoe_atomic_write(&af, len_field, sizeof len_field, err);
    if (st == MMOE_OK)
        st = mmoe_atomic_write(&af, header, header_len, err);
    int supplier_failed = 0;
    for (size_t i = 0; st == MMOE_OK && i < n; i++) {
        const void *data = order[i]->data;
        if (order[i]->deferred) {
            st = bytes(ctx, (size_t)(order[i] - w->items), &data, err);
            if (st != MMOE_OK) {
                supplier_failed = 1;
                mmoe_atomic_abort(&af);
                break;
            }
        }
        if (order[i]->nbytes > 0)
            st = mmoe_atomic_write(&af, data, order[i]->nbytes, err);
    }
    if (st == MMOE_OK)
        st = mmoe_atomic_commit(&af, err);
    /* on failure the atomic helpers have already removed the temporary file */
    free(header);
    if (st != MMOE_OK && !supplier_failed)
        mmoe_error_prefix(err, "safetensors writer: ");
    return st;
}

/** All items as an array of pointers (malloc'd; NULL if out of memory). */
static writer_item **item_pointers(mmoe_st_writer *w)
{
    writer_item **order = malloc((w->n_items ? w->n_items : 1) * sizeof *order);
    for (size_t i = 0; order && i < w->n_items; i++)
        order[i] = &w->items[i];
    return order;
}

mmoe_status mmoe_st_writer_finish(mmoe_st_writer *w, const char *path, mmoe_error *err)
{
    if (w->n_deferred > 0)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "safetensors writer: %s: %zu deferred tensors need mmoe_st_writer_finish_streamed()",
                              path, w->n_deferred);
    return mmoe_st_writer_finish_streamed(w, path, NULL, NULL, err); /* every tensor has its bytes */
}

mmoe_status mmoe_st_writer_finish_streamed(mmoe_st_writer *w, const char *path, mmoe_st_bytes_fn bytes, void *ctx,
                                           mmoe_error *err)
{
    if (w->n_deferred > 0 && !bytes)
        return mmoe_error_set(err, MMOE_EINVAL, "safetensors writer: %s: deferred tensors but no supplier", path);
    writer_item **order = item_pointers(w);
    if (!order)
        return mmoe_error_set(err, MMOE_ENOMEM, "safetensors writer: %s: out of memory", path);
    mmoe_status st = write_items(w, order, w->n_items, path, bytes, ctx, err);
    free(order);
    return st;
}

mmoe_status mmoe_st_writer_data_order(const mmoe_st_writer *w, size_t *order, mmoe_error *err)
{
    writer_item **items = item_pointers((mmoe_st_writer *)w);
    if (!items)
        return mmoe_error_set(err, MMOE_ENOMEM, "safetensors writer: out of memory");
    qsort(items, w->n_items, sizeof *items, cmp_item_layout);
    for (size_t k = 0; k < w->n_items; k++)
        order[k] = (size_t)(items[k] - w->items);
    free(items);
    return MMOE_OK;
}

/* ------------------------------------------------------------------------- */
/* sharded checkpoints                                                        */
/* ------------------------------------------------------------------------- */

/** Order of items by name (strcmp). */
static int cmp_item_name(const void *a, const void *b)
{
    return strcmp((*(const writer_item *const *)a)->name, (*(const writer_item *const *)b)->name);
}

/** Length of the shard file names "model-00001-of-00003.safetensors" plus slack. */
#define SHARD_NAME_LEN 64

mmoe_status mmoe_st_writer_finish_sharded(mmoe_st_writer *w, const char *dir,
                                          uint64_t max_shard_bytes, size_t *n_shards_out,
                                          mmoe_error *err)
{
    if (w->n_deferred > 0)
        return mmoe_error_set(err, MMOE_EINVAL, "safetensors writer: %s: %zu deferred tensors cannot be sharded", dir,
                              w->n_deferred);
    size_t n = w->n_items;
    writer_item **order = item_pointers(w);
    size_t *shard_of = calloc(n ? n : 1, sizeof *shard_of);
    const char **names = calloc(n ? n : 1, sizeof *names);
    const char **files = calloc(n ? n : 1, sizeof *files);
    char(*shard_names)[SHARD_NAME_LEN] = calloc(n ? n : 1, sizeof *shard_names);
    size_t path_len = strlen(dir) + SHARD_NAME_LEN + 2;
    char *path = malloc(path_len);
    mmoe_status st = MMOE_OK;
    if (!order || !shard_of || !names || !files || !shard_names || !path)
        st = mmoe_error_set(err, MMOE_ENOMEM, "safetensors writer: %s: out of memory", dir);
    /* 1. greedy partition in name order: a new shard when the next tensor would overflow */
    size_t n_shards = 0;
    if (st == MMOE_OK) {
        qsort(order, n, sizeof *order, cmp_item_name);
        uint64_t in_shard = 0;    /* bytes in the current shard */
        size_t items_in_shard = 0; /* tensors in it: an empty tensor counts, so a shard that
                                      holds one cannot take a second tensor past the limit */
        for (size_t i = 0; i < n; i++) {
            if (i == 0 || (items_in_shard > 0 && in_shard + order[i]->nbytes > max_shard_bytes)) {
                n_shards++;
                in_shard = 0;
                items_in_shard = 0;
            }
            shard_of[i] = n_shards - 1;
            in_shard += order[i]->nbytes;
            items_in_shard++;
            names[i] = order[i]->name;
        }
        for (size_t s = 0; s < n_shards; s++)
            snprintf(shard_names[s], SHARD_NAME_LEN, "model-%05zu-of-%05zu.safetensors", s + 1,
                     n_shards);
        for (size_t i = 0; i < n; i++)
            files[i] = shard_names[shard_of[i]];
    }
    /* 2. the shards (each slice of `order` is re-sorted into layout order by write_items) */
    size_t n_ok = 0; /* shards written so far (they are written in order) */
    for (size_t begin = 0; st == MMOE_OK && begin < n;) {
        size_t end = begin;
        while (end < n && shard_of[end] == shard_of[begin])
            end++;
        snprintf(path, path_len, "%s/%s", dir, shard_names[shard_of[begin]]);
        st = write_items(w, order + begin, end - begin, path, NULL, NULL, err);
        n_ok += st == MMOE_OK;
        begin = end;
    }
    /* 3. the index last: until it is in place, the directory is not a new checkpoint */
    if (st == MMOE_OK) {
        snprintf(path, path_len, "%s/%s", dir, MMOE_ST_INDEX_NAME);
        st = mmoe_st_write_index(path, n, names, files, w->data_bytes, err);
    }
    /* on failure remove the shards this call wrote: no half-written checkpoint remains */
    for (size_t s = 0; st != MMOE_OK && path && s < n_ok; s++) {
        snprintf(path, path_len, "%s/%s", dir, shard_names[s]);
        remove(path);
    }
    if (n_shards_out)
        *n_shards_out = st == MMOE_OK ? n_shards : 0;
    free(order);
    free(shard_of);
    free(names);
    free(files);
    free(shard_names);
    free(path);
    return st;
}

/* ------------------------------------------------------------------------- */
/* index                                                                      */
/* ------------------------------------------------------------------------- */

mmoe_status mmoe_st_write_index(const char *path, size_t n, const char *const *names,
                                const char *const *shard_files, uint64_t total_size,
                                mmoe_error *err)
{
    json_t *root = json_object();
    json_t *meta = json_object();
    json_t *map = json_object();
    mmoe_status st = MMOE_OK;
    if (!root || !meta || !map)
        st = mmoe_error_set(err, MMOE_ENOMEM, "safetensors index: %s: out of memory", path);
    for (size_t i = 0; st == MMOE_OK && i < n; i++) {
        if (!valid_text(names[i]) || !valid_text(shard_files[i]))
            st = mmoe_error_set(err, MMOE_EINVAL,
                                "safetensors index: %s: entry %zu: tensor and shard names must "
                                "be non-empty UTF-8",
                                path, i);
        else if (strchr(shard_files[i], '/'))
            st = mmoe_error_set(err, MMOE_EINVAL,
                                "safetensors index: %s: tensor '%s': shard '%s' must be a plain "
                                "file name in the index's directory",
                                path, names[i], shard_files[i]);
        else if (json_object_get(map, names[i]))
            st = mmoe_error_set(err, MMOE_EINVAL, "safetensors index: %s: tensor '%s' listed twice",
                                path, names[i]);
        else if (json_object_set_new(map, names[i], json_string(shard_files[i])) != 0)
            st = mmoe_error_set(err, MMOE_ENOMEM, "safetensors index: %s: out of memory", path);
    }
    char *text = NULL;
    if (st == MMOE_OK) {
        json_object_set_new(meta, "total_size", json_integer((json_int_t)total_size));
        json_object_set(root, "metadata", meta);
        json_object_set(root, "weight_map", map);
        text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
        if (!text)
            st = mmoe_error_set(err, MMOE_ENOMEM, "safetensors index: %s: out of memory", path);
    }
    json_decref(root);
    json_decref(meta);
    json_decref(map);
    mmoe_atomic_file af;
    if (st == MMOE_OK)
        st = mmoe_atomic_open(&af, path, err);
    if (st == MMOE_OK)
        st = mmoe_atomic_write(&af, text, strlen(text), err);
    if (st == MMOE_OK)
        st = mmoe_atomic_write(&af, "\n", 1, err);
    if (st == MMOE_OK)
        st = mmoe_atomic_commit(&af, err);
    free(text);
    return st;
}
