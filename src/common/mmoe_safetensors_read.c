/**
 * @file mmoe_safetensors_read.c
 * @brief The safetensors reader: map the file, parse the header, trust nothing.
 *
 * Reading is a pipeline of checks, each with its own message, in the order a
 * byte-level reader meets them:
 *
 * 1. **Length field.**  The file must hold at least the 8-byte little-endian
 *    header length N; N must be at most ::MMOE_ST_MAX_HEADER_BYTES and 8 + N
 *    must not run past the end of the file.
 * 2. **Text.**  The N header bytes must be valid UTF-8 (mmoe_utf8_valid()),
 *    then one JSON object (jansson, with JSON_REJECT_DUPLICATES so that a
 *    tensor named twice is an error, not "the last one wins").  Trailing
 *    spaces, the writers' padding, are allowed; anything else after the
 *    object is not.
 * 3. **Entries.**  "__metadata__" must map strings to strings.  Every other
 *    key is a tensor whose value is an object with "dtype" (a known name),
 *    "shape" (an array of at most ::MMOE_MAX_DIMS integers >= 0) and
 *    "data_offsets" (two integers, begin <= end <= size of the data section).
 *    Other keys in an entry are ignored, as the reference implementation does.
 *    numel and numel * element size are computed with overflow checks and
 *    must equal end - begin.
 * 4. **Tiling.**  Sorted by begin, the tensors must cover the data section
 *    exactly: each begins where the previous ended, the last ends at the end
 *    of the file.  An overlap, a hole and trailing bytes each get their own
 *    message naming the tensors involved.  (Rejecting holes follows the
 *    reference implementation; it also means every byte of the file is
 *    accounted for.)
 *
 * 5. **Alignment.**  A tensor whose bytes do not start at a multiple of its
 *    element size is copied into one aligned block owned by the file (see
 *    mmoe_safetensors.h, "Alignment").
 *
 * The entries keep pointers into the jansson tree (names, metadata strings),
 * so the tree lives as long as the file object.
 */
#include "mmoe_safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mmoe_cleanup.h"
#include "mmoe_utf8.h"

/** Alignment of the block that holds the realigned tensors (a cache line: enough for every dtype). */
#define ST_COPY_ALIGN 64

/** Reserved header key of the free-form string map. */
#define ST_METADATA_KEY "__metadata__"

/** An open file: the bytes, the parsed header and the sorted tables. */
struct mmoe_st_file {
    char *path;               /**< path or label, owned */
    const uint8_t *bytes;     /**< the whole file */
    size_t size;              /**< its length */
    int mapped;               /**< 1 if @c bytes is our mmap (munmap on close) */
    json_t *header;           /**< parsed header; names and metadata point into it */
    mmoe_st_entry *entries;   /**< sorted by name */
    size_t n_entries;         /**< number of tensors */
    const char **meta_keys;   /**< sorted by key */
    const char **meta_values; /**< values, same order as the keys */
    size_t n_meta;            /**< number of metadata entries */
    void *aligned_copy;       /**< the realigned tensors' bytes (owned; NULL if none) */
    uint64_t realigned_bytes; /**< their total size */
    int map_slot;             /**< the mapping's slot in mmoe_cleanup.h's table (-1: none) */
};

/* ------------------------------------------------------------------------- */
/* Small helpers                                                              */
/* ------------------------------------------------------------------------- */

/** The 8-byte little-endian integer at @p p. */
static uint64_t read_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/** qsort/bsearch order of entries: strcmp of the names. */
static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp(((const mmoe_st_entry *)a)->name, ((const mmoe_st_entry *)b)->name);
}

/** qsort/bsearch order of string pointers. */
static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/** A JSON integer in [0, INT64_MAX], or -1 with *ok = 0. */
static int64_t json_nonneg_int(const json_t *v, int *ok)
{
    *ok = json_is_integer(v) && json_integer_value(v) >= 0;
    return *ok ? (int64_t)json_integer_value(v) : -1;
}

/* ------------------------------------------------------------------------- */
/* Step 3: one tensor entry                                                   */
/* ------------------------------------------------------------------------- */

/** Where a tensor's bytes lie, relative to the data section. */
typedef struct entry_span {
    uint64_t begin;  /**< first byte, relative to the data section */
    uint64_t end;    /**< one past the last byte */
    size_t index; /**< into f->entries */
} entry_span;

/**
 * Parse and check the entry @p value of tensor @p name; fill @p e (view.data
 * is set later, once the data section's address is known) and @p span.
 */
static mmoe_status parse_entry(const mmoe_st_file *f, const char *name, const json_t *value,
                               uint64_t data_size, mmoe_st_entry *e, entry_span *span,
                               mmoe_error *err)
{
    const char *path = f->path;
    if (!json_is_object(value))
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: tensor '%s': expected an object with dtype, shape "
                              "and data_offsets, found a JSON %s",
                              path, name,
                              json_is_array(value)    ? "array"
                              : json_is_string(value) ? "string"
                                                      : "scalar");
    /* dtype */
    const json_t *jdtype = json_object_get(value, "dtype");
    if (!jdtype)
        return mmoe_error_set(err, MMOE_EFORMAT, "safetensors: %s: tensor '%s': missing 'dtype'",
                              path, name);
    if (!json_is_string(jdtype))
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: tensor '%s': 'dtype' must be a string", path, name);
    if (mmoe_dtype_from_name(json_string_value(jdtype), &e->view.dtype) != MMOE_OK)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: tensor '%s': unknown dtype '%s' (expected one of "
                              "BOOL BF16 F16 F32 F64 I8 U8 I16 U16 I32 U32 I64 U64 F8_E4M3 F8_E5M2 F8_E8M0)",
                              path, name, json_string_value(jdtype));
    /* shape */
    const json_t *jshape = json_object_get(value, "shape");
    if (!jshape)
        return mmoe_error_set(err, MMOE_EFORMAT, "safetensors: %s: tensor '%s': missing 'shape'",
                              path, name);
    if (!json_is_array(jshape))
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: tensor '%s': 'shape' must be an array of integers",
                              path, name);
    size_t ndim = json_array_size(jshape);
    if (ndim > MMOE_MAX_DIMS)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                              "safetensors: %s: tensor '%s': %zu dimensions, at most %d supported",
                              path, name, ndim, MMOE_MAX_DIMS);
    e->view.ndim = (int)ndim;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t d = 0; d < ndim; d++) {
        int ok;
        int64_t extent = json_nonneg_int(json_array_get(jshape, d), &ok);
        if (!ok)
            return mmoe_error_set(err, MMOE_EFORMAT,
                                  "safetensors: %s: tensor '%s': shape[%zu] must be an integer "
                                  ">= 0",
                                  path, name, d);
        e->view.shape[d] = extent;
        if (!overflow && __builtin_mul_overflow(numel, (uint64_t)extent, &numel))
            overflow = 1;
    }
    char shape_buf[256];
    mmoe_shape_str(e->view.ndim, e->view.shape, shape_buf, sizeof shape_buf);
    uint64_t elem_size = mmoe_dtype_size(e->view.dtype);
    uint64_t nbytes = 0;
    if (overflow || numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, elem_size, &nbytes))
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: tensor '%s': shape %s of %s overflows 64 bits",
                              path, name, shape_buf, mmoe_dtype_name(e->view.dtype));
    /* data_offsets */
    const json_t *joff = json_object_get(value, "data_offsets");
    if (!joff)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: tensor '%s': missing 'data_offsets'", path, name);
    int ok_b = 0, ok_e = 0;
    int64_t begin = -1, end = -1;
    if (json_is_array(joff) && json_array_size(joff) == 2) {
        begin = json_nonneg_int(json_array_get(joff, 0), &ok_b);
        end = json_nonneg_int(json_array_get(joff, 1), &ok_e);
    }
    if (!ok_b || !ok_e)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: tensor '%s': 'data_offsets' must be an array of "
                              "two integers >= 0",
                              path, name);
    if (end < begin)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64
                              "] are reversed (begin > end)",
                              path, name, begin, end);
    if ((uint64_t)end > data_size)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64
                              "] run past the data section of %" PRIu64 " bytes",
                              path, name, begin, end, data_size);
    if ((uint64_t)(end - begin) != nbytes)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: tensor '%s': shape %s of %s needs %" PRIu64
                              " bytes, data_offsets [%" PRId64 ", %" PRId64 "] span %" PRId64,
                              path, name, shape_buf, mmoe_dtype_name(e->view.dtype), nbytes, begin,
                              end, end - begin);
    e->name = name;
    e->view.nbytes = (size_t)nbytes;
    span->begin = (uint64_t)begin;
    span->end = (uint64_t)end;
    return MMOE_OK;
}

/* ------------------------------------------------------------------------- */
/* Step 4: tiling of the data section                                         */
/* ------------------------------------------------------------------------- */

/** Order of spans: by begin, then end. */
static int cmp_span(const void *a, const void *b)
{
    const entry_span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/** Sort @p spans and require them to cover [0, data_size) exactly once. */
static mmoe_status check_tiling(const mmoe_st_file *f, entry_span *spans, size_t n,
                                uint64_t data_size, mmoe_error *err)
{
    qsort(spans, n, sizeof *spans, cmp_span);
    uint64_t covered = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        const char *name = f->entries[spans[i].index].name;
        if (spans[i].begin < covered)
            return mmoe_error_set(err, MMOE_EFORMAT,
                                  "safetensors: %s: tensor '%s': data_offsets [%" PRIu64
                                  ", %" PRIu64 "] overlap tensor '%s', which ends at %" PRIu64,
                                  f->path, name, spans[i].begin, spans[i].end, prev, covered);
        if (spans[i].begin > covered)
            return mmoe_error_set(err, MMOE_EFORMAT,
                                  "safetensors: %s: tensor '%s': expected data to begin at %" PRIu64
                                  " (end of %s%s%s), found %" PRIu64
                                  " (a hole of unused bytes is not allowed)",
                                  f->path, name, covered, prev ? "tensor '" : "the header",
                                  prev ? prev : "", prev ? "'" : "", spans[i].begin);
        covered = spans[i].end;
        prev = name;
    }
    if (covered != data_size)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: the tensors cover %" PRIu64
                              " bytes of the data section, but it has %" PRIu64
                              " (%" PRIu64 " trailing bytes)",
                              f->path, covered, data_size, data_size - covered);
    return MMOE_OK;
}

/* ------------------------------------------------------------------------- */
/* Steps 1-2 and the whole parse                                              */
/* ------------------------------------------------------------------------- */

/** Check "__metadata__" (an object of strings) and index it by key. */
static mmoe_status parse_metadata(mmoe_st_file *f, const json_t *meta, mmoe_error *err)
{
    if (!json_is_object(meta))
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: '__metadata__' must be an object of strings",
                              f->path);
    size_t n = json_object_size(meta);
    f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
    f->meta_values = calloc(n ? n : 1, sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values)
        return mmoe_error_set(err, MMOE_ENOMEM, "safetensors: %s: out of memory", f->path);
    const char *key;
    json_t *value;
    size_t i = 0;
    json_object_foreach((json_t *)meta, key, value)
    {
        if (!json_is_string(value))
            return mmoe_error_set(err, MMOE_EFORMAT,
                                  "safetensors: %s: '__metadata__' key '%s': expected a string "
                                  "value",
                                  f->path, key);
        f->meta_keys[i++] = key;
    }
    f->n_meta = i;
    qsort(f->meta_keys, f->n_meta, sizeof *f->meta_keys, cmp_str_ptr);
    for (i = 0; i < f->n_meta; i++)
        f->meta_values[i] = json_string_value(json_object_get(meta, f->meta_keys[i]));
    return MMOE_OK;
}

/** Is the view's data aligned to its element size? */
static int view_aligned(const mmoe_tensor *t)
{
    const size_t a = mmoe_dtype_size(t->dtype);
    return a <= 1 || (uintptr_t)t->data % a == 0;
}

/** Copy the tensors that are not aligned to their dtype into one aligned block (see the file comment). */
static mmoe_status realign(mmoe_st_file *f, mmoe_error *err)
{
    uint64_t total = 0;
    for (size_t i = 0; i < f->n_entries; i++)
        if (!view_aligned(&f->entries[i].view))
            total += (f->entries[i].view.nbytes + ST_COPY_ALIGN - 1) / ST_COPY_ALIGN * ST_COPY_ALIGN;
    if (total == 0)
        return MMOE_OK;
    if (total > SIZE_MAX || posix_memalign(&f->aligned_copy, ST_COPY_ALIGN, (size_t)total) != 0) {
        f->aligned_copy = NULL;
        return mmoe_error_set(err, MMOE_ENOMEM, "safetensors: %s: out of memory for an aligned copy of the %" PRIu64
                              " bytes of tensors that are not aligned to their dtype in the file", f->path, total);
    }
    uint8_t *dst = f->aligned_copy;
    for (size_t i = 0; i < f->n_entries; i++) {
        mmoe_st_entry *e = &f->entries[i];
        if (view_aligned(&e->view))
            continue;
        memcpy(dst, e->view.data, e->view.nbytes);
        e->view.data = dst;
        e->realigned = 1;
        f->realigned_bytes += e->view.nbytes;
        dst += (e->view.nbytes + ST_COPY_ALIGN - 1) / ST_COPY_ALIGN * ST_COPY_ALIGN;
    }
    return MMOE_OK;
}

/** Parse the image in f->bytes / f->size; fill everything else in @p f. */
static mmoe_status st_parse(mmoe_st_file *f, mmoe_error *err)
{
    if (f->size < 8)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: file has %zu bytes, fewer than the 8-byte header "
                              "length field",
                              f->path, f->size);
    uint64_t header_len = read_le64(f->bytes);
    if ((header_len > MMOE_ST_MAX_HEADER_BYTES || header_len > f->size - 8) && (f->size < 9 || f->bytes[8] != '{')) {
        char start[9];
        size_t n = f->size < 8 ? f->size : 8;
        for (size_t i = 0; i < n; i++)
            start[i] = f->bytes[i] >= 0x20 && f->bytes[i] < 0x7f ? (char)f->bytes[i] : '.';
        start[n] = '\0';
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: not a safetensors file (a safetensors file starts with an "
                              "8-byte header length and a JSON header '{...'; this one starts with '%s')",
                              f->path, start);
    }
    if (header_len > MMOE_ST_MAX_HEADER_BYTES)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: header length %" PRIu64
                              " exceeds the limit of %u bytes",
                              f->path, header_len, MMOE_ST_MAX_HEADER_BYTES);
    if (header_len > f->size - 8)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: header length %" PRIu64
                              " runs past the end of the file (%zu bytes after the length field)",
                              f->path, header_len, f->size - 8);
    const char *text = (const char *)f->bytes + 8;
    size_t bad;
    if (!mmoe_utf8_valid(text, (size_t)header_len, &bad))
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: header is not valid UTF-8 (byte 0x%02x at header "
                              "offset %zu)",
                              f->path, (unsigned)(uint8_t)text[bad], bad);
    json_error_t jerr;
    f->header =
        json_loadb(text, (size_t)header_len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!f->header)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: header is not valid JSON: %s (header offset %d)",
                              f->path, jerr.text, jerr.position);
    if (!json_is_object(f->header))
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "safetensors: %s: header must be a JSON object, found a JSON %s",
                              f->path, json_is_array(f->header)    ? "array"
                              : json_is_string(f->header) ? "string"
                                                          : "scalar");

    uint64_t data_start = 8 + header_len;
    uint64_t data_size = f->size - data_start;
    size_t n_keys = json_object_size(f->header);
    f->entries = calloc(n_keys ? n_keys : 1, sizeof *f->entries);
    entry_span *spans = calloc(n_keys ? n_keys : 1, sizeof *spans);
    if (!f->entries || !spans) {
        free(spans);
        return mmoe_error_set(err, MMOE_ENOMEM, "safetensors: %s: out of memory", f->path);
    }
    mmoe_status st = MMOE_OK;
    const char *key;
    json_t *value;
    json_object_foreach(f->header, key, value)
    {
        if (strcmp(key, ST_METADATA_KEY) == 0)
            st = parse_metadata(f, value, err);
        else {
            size_t i = f->n_entries;
            st = parse_entry(f, key, value, data_size, &f->entries[i], &spans[i], err);
            spans[i].index = i;
            f->n_entries += st == MMOE_OK;
        }
        if (st != MMOE_OK)
            break;
    }
    if (st == MMOE_OK)
        st = check_tiling(f, spans, f->n_entries, data_size, err);
    if (st == MMOE_OK) {
        for (size_t i = 0; i < f->n_entries; i++) {
            uint64_t off = data_start + spans[i].begin;
            mmoe_st_entry *e = &f->entries[spans[i].index];
            e->file_offset = off;
            e->view.data = (void *)(f->bytes + off);
        }
        qsort(f->entries, f->n_entries, sizeof *f->entries, cmp_entry_name);
        st = realign(f, err);
    }
    free(spans);
    return st;
}

/* ------------------------------------------------------------------------- */
/* Public functions                                                           */
/* ------------------------------------------------------------------------- */

/** A new, empty file object labelled @p label. */
static mmoe_st_file *st_new(const char *label, mmoe_error *err)
{
    mmoe_st_file *f = calloc(1, sizeof *f);
    if (f) {
        f->path = strdup(label ? label : "(memory)");
        f->map_slot = -1;
    }
    if (!f || !f->path) {
        free(f);
        mmoe_error_set(err, MMOE_ENOMEM, "safetensors: %s: out of memory", label ? label : "");
        return NULL;
    }
    return f;
}

mmoe_status mmoe_st_open_memory(const void *data, size_t size, const char *label,
                                mmoe_st_file **out, mmoe_error *err)
{
    *out = NULL;
    if (!data && size > 0)
        return mmoe_error_set(err, MMOE_EINVAL, "safetensors: %s: NULL data", label);
    mmoe_st_file *f = st_new(label, err);
    if (!f)
        return MMOE_ENOMEM;
    f->bytes = data;
    f->size = size;
    mmoe_status st = st_parse(f, err);
    if (st != MMOE_OK) {
        mmoe_st_close(f);
        return st;
    }
    *out = f;
    return MMOE_OK;
}

mmoe_status mmoe_st_open(const char *path, mmoe_st_file **out, mmoe_error *err)
{
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return mmoe_error_set(err, errno == ENOENT ? MMOE_ENOTFOUND : MMOE_EIO,
                              "safetensors: %s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return mmoe_error_set(err, MMOE_EIO, "safetensors: %s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return mmoe_error_set(err, MMOE_EIO, "safetensors: %s: not a regular file (%s)", path,
                              S_ISDIR(sb.st_mode)    ? "a directory"
                              : S_ISFIFO(sb.st_mode) ? "a FIFO"
                              : S_ISSOCK(sb.st_mode) ? "a socket"
                                                     : "a device");
    }
    mmoe_st_file *f = st_new(path, err);
    if (!f) {
        close(fd);
        return MMOE_ENOMEM;
    }
    f->size = (size_t)sb.st_size;
    if (f->size > 0) {
        void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            mmoe_status st = mmoe_error_set(err, MMOE_EIO, "safetensors: %s: mmap of %zu bytes "
                                            "failed: %s", path, f->size, strerror(errno));
            close(fd);
            mmoe_st_close(f);
            return st;
        }
        f->bytes = map;
        f->mapped = 1;
        f->map_slot = mmoe_cleanup_map(map, f->size, path);
    }
    close(fd); /* the mapping keeps the file alive */
    mmoe_status st = st_parse(f, err);
    if (st != MMOE_OK) {
        mmoe_st_close(f);
        return st;
    }
    *out = f;
    return MMOE_OK;
}

void mmoe_st_close(mmoe_st_file *f)
{
    if (!f)
        return;
    if (f->mapped) {
        mmoe_cleanup_unmap(f->map_slot);
        munmap((void *)f->bytes, f->size);
    }
    free(f->aligned_copy);
    json_decref(f->header);
    free(f->entries);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    free(f);
}

const char *mmoe_st_path(const mmoe_st_file *f)
{
    return f->path;
}

uint64_t mmoe_st_file_size(const mmoe_st_file *f)
{
    return f->size;
}

uint64_t mmoe_st_realigned_bytes(const mmoe_st_file *f)
{
    return f->realigned_bytes;
}

size_t mmoe_st_count(const mmoe_st_file *f)
{
    return f->n_entries;
}

const mmoe_st_entry *mmoe_st_get(const mmoe_st_file *f, size_t i)
{
    return i < f->n_entries ? &f->entries[i] : NULL;
}

const mmoe_st_entry *mmoe_st_find_entry(const mmoe_st_file *f, const char *name)
{
    if (f->n_entries == 0)
        return NULL;
    mmoe_st_entry key = {.name = name};
    return bsearch(&key, f->entries, f->n_entries, sizeof *f->entries, cmp_entry_name);
}

const mmoe_tensor *mmoe_st_find(const mmoe_st_file *f, const char *name)
{
    const mmoe_st_entry *e = mmoe_st_find_entry(f, name);
    return e ? &e->view : NULL;
}

const char *mmoe_st_metadata(const mmoe_st_file *f, const char *key)
{
    if (f->n_meta == 0)
        return NULL;
    const char **hit = bsearch(&key, f->meta_keys, f->n_meta, sizeof *f->meta_keys, cmp_str_ptr);
    return hit ? f->meta_values[hit - f->meta_keys] : NULL;
}

size_t mmoe_st_metadata_count(const mmoe_st_file *f)
{
    return f->n_meta;
}

mmoe_status mmoe_st_metadata_at(const mmoe_st_file *f, size_t i, const char **key,
                                const char **value)
{
    if (i >= f->n_meta)
        return MMOE_EINVAL;
    *key = f->meta_keys[i];
    *value = f->meta_values[i];
    return MMOE_OK;
}
