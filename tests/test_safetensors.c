/**
 * @file test_safetensors.c
 * @brief Suite "safetensors": round trips, byte-level malformed files, atomic writes, checkpoints.
 *
 * The malformed files are built byte by byte in the tests (length field,
 * header text, data), so the expectations come from the format description,
 * not from the writer under test.  Every error case checks the status code and
 * that the message names the file and, where there is one, the tensor.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <math.h>

#include "mmoe_atomic_file.h"
#include "mmoe_cleanup.h"
#include "mmoe_safetensors.h"
#include "mmoe_tensor_stats.h"
#include "mmoe_test.h"
#include "mmoe_utf8.h"

static uint64_t g_seed;

/* ------------------------------------------------------------------------- */
/* helpers                                                                    */
/* ------------------------------------------------------------------------- */

/**
 * A safetensors image made by hand: 8-byte little-endian length (the real
 * length of @p header unless @p len_field is not UINT64_MAX), the header
 * text, then @p data_len bytes of a counting pattern.
 */
static uint8_t *make_image(const char *header, size_t header_len, uint64_t len_field,
                           size_t data_len, size_t *size)
{
    *size = 8 + header_len + data_len;
    uint8_t *img = malloc(*size ? *size : 1);
    uint64_t n = len_field == UINT64_MAX ? header_len : len_field;
    for (int i = 0; i < 8; i++)
        img[i] = (uint8_t)(n >> (8 * i));
    memcpy(img + 8, header, header_len);
    for (size_t i = 0; i < data_len; i++)
        img[8 + header_len + i] = (uint8_t)(i * 7 + 1);
    return img;
}

static int count_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(d);
    return n;
}

/**
 * Write a hand-built file and require mmoe_st_open() to fail with @p code and
 * a message holding the file's path and each of the (up to two) needles.
 */
static void expect_bad(const char *header, uint64_t len_field, size_t data_len, mmoe_status code,
                       const char *needle1, const char *needle2)
{
    char dir[512], path[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    size_t size;
    uint8_t *img = make_image(header, strlen(header), len_field, data_len, &size);
    mmoe_test_write_file(path, img, size);
    mmoe_st_file *f = (mmoe_st_file *)1;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_status st = mmoe_st_open(path, &f, &err);
    if (st != code || !strstr(err.msg, path) || (needle1 && !strstr(err.msg, needle1)) ||
        (needle2 && !strstr(err.msg, needle2)))
        ck_abort_msg("header %s: expected %s with '%s' '%s', got %s: %s", header,
                     mmoe_status_name(code), needle1 ? needle1 : "", needle2 ? needle2 : "",
                     mmoe_status_name(st), err.msg);
    ck_assert_ptr_null(f);
    ck_assert_int_eq(err.code, code);
    /* the in-memory parser agrees */
    st = mmoe_st_open_memory(img, size, "mem", &f, &err);
    ck_assert_int_eq(st, code);
    free(img);
    mmoe_test_rmtree(dir);
}

/* ------------------------------------------------------------------------- */
/* round trips                                                                */
/* ------------------------------------------------------------------------- */

typedef struct rt_tensor {
    char name[64];
    mmoe_dtype dtype;
    int ndim;
    int64_t shape[MMOE_MAX_DIMS];
    uint8_t *data;
    size_t nbytes;
} rt_tensor;

static void random_tensor(mmoe_rng *rng, rt_tensor *t, mmoe_dtype dt, int k)
{
    t->dtype = dt;
    snprintf(t->name, sizeof t->name, "layers.%d.%s.w%u", k, mmoe_dtype_name(dt),
             (unsigned)mmoe_rng_below(rng, 1000));
    t->ndim = (int)mmoe_rng_below(rng, 5); /* 0..4, 0 is a scalar */
    size_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        /* mostly 1..9, sometimes an empty dimension */
        t->shape[d] = mmoe_rng_below(rng, 12) == 0 ? 0 : 1 + (int64_t)mmoe_rng_below(rng, 9);
        numel *= (size_t)t->shape[d];
    }
    t->nbytes = numel * mmoe_dtype_size(dt);
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    for (size_t i = 0; i < t->nbytes; i++)
        t->data[i] = (uint8_t)mmoe_rng_u32(rng);
}

START_TEST(round_trip_every_dtype)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 1);
    char dir[512], path[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    enum { PER_DTYPE = 3, N = PER_DTYPE * MMOE_DT_COUNT };
    rt_tensor ts[N];
    mmoe_st_writer *w;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    for (int i = 0; i < N; i++) {
        random_tensor(&rng, &ts[i], (mmoe_dtype)(i % MMOE_DT_COUNT), i);
        ck_assert_int_eq(mmoe_st_writer_add(w, ts[i].name, ts[i].dtype, ts[i].ndim, ts[i].shape,
                                            ts[i].data, ts[i].nbytes, &err),
                         MMOE_OK);
    }
    ck_assert_int_eq(mmoe_st_writer_set_metadata(w, "format", "pt", &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_set_metadata(w, "note", "h\xc3\xa9llo", &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_set_metadata(w, "format", "megamoe", &err), MMOE_OK);
    ck_assert_uint_eq(mmoe_st_writer_count(w), N);
    ck_assert_int_eq(mmoe_st_writer_finish(w, path, &err), MMOE_OK);
    mmoe_st_writer_destroy(w);
    ck_assert_int_eq(count_dir_entries(dir), 1); /* no temporary file left */

    mmoe_st_file *f;
    ck_assert_msg(mmoe_st_open(path, &f, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_uint_eq(mmoe_st_count(f), N);
    uint64_t data_total = 0;
    for (int i = 0; i < N; i++) {
        const mmoe_st_entry *e = mmoe_st_find_entry(f, ts[i].name);
        ck_assert_ptr_nonnull(e);
        ck_assert_str_eq(e->name, ts[i].name);
        ck_assert_int_eq(e->view.dtype, ts[i].dtype);
        ck_assert_int_eq(e->view.ndim, ts[i].ndim);
        for (int d = 0; d < ts[i].ndim; d++)
            ck_assert_int_eq(e->view.shape[d], ts[i].shape[d]);
        ck_assert_uint_eq(e->view.nbytes, ts[i].nbytes);
        ck_assert(ts[i].nbytes == 0 || memcmp(e->view.data, ts[i].data, ts[i].nbytes) == 0);
        /* every tensor is aligned to its element size, in the file and in memory */
        ck_assert_uint_eq(e->file_offset % mmoe_dtype_size(ts[i].dtype), 0);
        ck_assert_uint_eq((uintptr_t)e->view.data % mmoe_dtype_size(ts[i].dtype), 0);
        ck_assert_ptr_eq(mmoe_st_find(f, ts[i].name), &e->view);
        data_total += ts[i].nbytes;
    }
    /* the header is padded to a multiple of 8, the file has nothing else */
    const mmoe_st_entry *first = mmoe_st_get(f, 0);
    ck_assert_ptr_nonnull(first);
    ck_assert_ptr_null(mmoe_st_get(f, N));
    ck_assert_ptr_null(mmoe_st_find(f, "no.such.tensor"));
    size_t size;
    uint8_t *raw = mmoe_test_read_file(path, &size);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--)
        header_len = (header_len << 8) | raw[i];
    ck_assert_uint_eq(header_len % 8, 0);
    ck_assert_uint_eq(size, 8 + header_len + data_total);
    ck_assert_uint_eq(mmoe_st_file_size(f), size);
    free(raw);
    /* sorted name order */
    for (size_t i = 1; i < mmoe_st_count(f); i++)
        ck_assert_int_lt(strcmp(mmoe_st_get(f, i - 1)->name, mmoe_st_get(f, i)->name), 0);
    /* metadata: the later value of "format" wins */
    ck_assert_uint_eq(mmoe_st_metadata_count(f), 2);
    ck_assert_str_eq(mmoe_st_metadata(f, "format"), "megamoe");
    ck_assert_str_eq(mmoe_st_metadata(f, "note"), "h\xc3\xa9llo");
    ck_assert_ptr_null(mmoe_st_metadata(f, "absent"));
    const char *k, *v;
    ck_assert_int_eq(mmoe_st_metadata_at(f, 0, &k, &v), MMOE_OK);
    ck_assert_str_eq(k, "format");
    ck_assert_int_eq(mmoe_st_metadata_at(f, 2, &k, &v), MMOE_EINVAL);
    mmoe_st_close(f);
    for (int i = 0; i < N; i++)
        free(ts[i].data);
    mmoe_test_rmtree(dir);
}
END_TEST

/** A file built by hand (unpadded header, keys not in data order) reads as the format says. */
START_TEST(reads_hand_built_file)
{
    /* data: a = F32 [2] = {1.0, -2.0} at [8, 16); b = I64 scalar 5 at [0, 8); e = U8 [0] */
    const char *header = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                         "\"__metadata__\":{\"k\":\"v\"},"
                         "\"b\":{\"shape\":[],\"dtype\":\"I64\",\"data_offsets\":[0,8],\"x\":1},"
                         "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[16,16]}}";
    size_t size;
    uint8_t *img = make_image(header, strlen(header), UINT64_MAX, 16, &size);
    uint8_t *data = img + 8 + strlen(header);
    const uint8_t b_le[8] = {5, 0, 0, 0, 0, 0, 0, 0};
    const uint8_t a_le[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0}; /* 1.0f, -2.0f */
    memcpy(data, b_le, 8);
    memcpy(data + 8, a_le, 8);
    mmoe_st_file *f;
    mmoe_error err;
    ck_assert_msg(mmoe_st_open_memory(img, size, "hand", &f, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_uint_eq(mmoe_st_count(f), 3);
    ck_assert_str_eq(mmoe_st_get(f, 0)->name, "a");
    ck_assert_str_eq(mmoe_st_get(f, 1)->name, "b");
    ck_assert_str_eq(mmoe_st_get(f, 2)->name, "e");
    const mmoe_tensor *a = mmoe_st_find(f, "a");
    float av[2];
    memcpy(av, a->data, sizeof av);
    ck_assert(av[0] == 1.0f && av[1] == -2.0f);
    const mmoe_tensor *b = mmoe_st_find(f, "b");
    ck_assert_int_eq(b->ndim, 0);
    int64_t bv;
    memcpy(&bv, b->data, 8);
    ck_assert_int_eq(bv, 5);
    ck_assert_uint_eq(mmoe_st_find_entry(f, "a")->file_offset, 8 + strlen(header) + 8);
    ck_assert_uint_eq(mmoe_st_find(f, "e")->nbytes, 0);
    ck_assert_str_eq(mmoe_st_metadata(f, "k"), "v");
    ck_assert_str_eq(mmoe_st_path(f), "hand");
    mmoe_st_close(f);
    free(img);
    /* an empty header object with no data is a valid empty file */
    img = make_image("{}", 2, UINT64_MAX, 0, &size);
    ck_assert_int_eq(mmoe_st_open_memory(img, size, "empty", &f, &err), MMOE_OK);
    ck_assert_uint_eq(mmoe_st_count(f), 0);
    ck_assert_ptr_null(mmoe_st_find(f, "a"));
    mmoe_st_close(f);
    free(img);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* malformed files, one per check                                             */
/* ------------------------------------------------------------------------- */

#define T1(name_, dtype_, shape_, offs_)                                                          \
    "{\"" name_ "\":{\"dtype\":" dtype_ ",\"shape\":" shape_ ",\"data_offsets\":" offs_ "}}"

START_TEST(bad_length_field)
{
    char dir[512], path[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/short.safetensors", dir);
    mmoe_test_write_file(path, "\x02\x00\x00\x00\x00", 5);
    mmoe_st_file *f;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_open(path, &f, &err), MMOE_EFORMAT);
    ck_assert(strstr(err.msg, path) && strstr(err.msg, "5 bytes"));
    mmoe_test_write_file(path, "", 0);
    ck_assert_int_eq(mmoe_st_open(path, &f, &err), MMOE_EFORMAT);
    ck_assert(strstr(err.msg, path) && strstr(err.msg, "0 bytes"));
    /* a missing file and a directory are I/O errors naming the path */
    snprintf(path, sizeof path, "%s/absent.safetensors", dir);
    ck_assert_int_eq(mmoe_st_open(path, &f, &err), MMOE_ENOTFOUND);
    ck_assert(strstr(err.msg, path));
    ck_assert_int_eq(mmoe_st_open(dir, &f, &err), MMOE_EIO);
    ck_assert(strstr(err.msg, dir) && strstr(err.msg, "regular file"));
    mmoe_test_rmtree(dir);
    /* header length past the end; absurdly large */
    expect_bad("{}", 3, 0, MMOE_EFORMAT, "runs past the end", NULL);
    expect_bad("{}", 1000, 0, MMOE_EFORMAT, "header length 1000", NULL);
    expect_bad("{}", (uint64_t)1 << 63, 0, MMOE_EFORMAT, "exceeds the limit", NULL);
    expect_bad("{}", MMOE_ST_MAX_HEADER_BYTES + 1ull, 0, MMOE_EFORMAT, "exceeds the limit", NULL);
}
END_TEST

START_TEST(bad_text)
{
    expect_bad("{\"a\xff\":{}}", UINT64_MAX, 0, MMOE_EFORMAT, "UTF-8", "0xff");
    expect_bad("{\"\xc0\x80\":{}}", UINT64_MAX, 0, MMOE_EFORMAT, "UTF-8", "offset 2");
    expect_bad("{not json}", UINT64_MAX, 0, MMOE_EFORMAT, "not valid JSON", NULL);
    expect_bad("", UINT64_MAX, 0, MMOE_EFORMAT, "not valid JSON", NULL);
    expect_bad("{} trailing", UINT64_MAX, 0, MMOE_EFORMAT, "not valid JSON", NULL);
    expect_bad("[1, 2]", UINT64_MAX, 0, MMOE_EFORMAT, "must be a JSON object", "array");
    expect_bad("\"str\"", UINT64_MAX, 0, MMOE_EFORMAT, "must be a JSON object", "string");
    expect_bad("12", UINT64_MAX, 0, MMOE_EFORMAT, "must be a JSON object", "scalar");
    /* duplicate names: jansson's message quotes the key */
    expect_bad("{\"w.dup\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"w.dup\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               UINT64_MAX, 2, MMOE_EFORMAT, "duplicate", "w.dup");
    /* padding spaces after the object are fine */
    size_t size;
    uint8_t *img = make_image("{}      ", 8, UINT64_MAX, 0, &size);
    mmoe_st_file *f;
    ck_assert_int_eq(mmoe_st_open_memory(img, size, "pad", &f, NULL), MMOE_OK);
    mmoe_st_close(f);
    free(img);
}
END_TEST

START_TEST(bad_entries)
{
    /* the entry itself */
    expect_bad("{\"w.x\":[1]}", UINT64_MAX, 0, MMOE_EFORMAT, "'w.x'", "expected an object");
    expect_bad("{\"w.x\":{\"shape\":[1],\"data_offsets\":[0,1]}}", UINT64_MAX, 1, MMOE_EFORMAT,
               "'w.x'", "missing 'dtype'");
    expect_bad("{\"w.x\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", UINT64_MAX, 1,
               MMOE_EFORMAT, "'w.x'", "missing 'shape'");
    expect_bad("{\"w.x\":{\"dtype\":\"U8\",\"shape\":[1]}}", UINT64_MAX, 1, MMOE_EFORMAT,
               "'w.x'", "missing 'data_offsets'");
    /* ill-typed fields */
    expect_bad(T1("w.x", "5", "[1]", "[0,1]"), UINT64_MAX, 1, MMOE_EFORMAT, "'w.x'",
               "'dtype' must be a string");
    expect_bad(T1("w.x", "\"F4\"", "[1]", "[0,1]"), UINT64_MAX, 1, MMOE_EFORMAT, "'w.x'",
               "unknown dtype 'F4'");
    expect_bad(T1("w.x", "\"f32\"", "[1]", "[0,4]"), UINT64_MAX, 4, MMOE_EFORMAT, "'w.x'",
               "unknown dtype 'f32'");
    expect_bad(T1("w.x", "\"U8\"", "\"1\"", "[0,1]"), UINT64_MAX, 1, MMOE_EFORMAT, "'w.x'",
               "'shape' must be an array");
    expect_bad(T1("w.x", "\"U8\"", "[-1]", "[0,1]"), UINT64_MAX, 1, MMOE_EFORMAT, "'w.x'",
               "shape[0]");
    expect_bad(T1("w.x", "\"U8\"", "[1, 1.5]", "[0,1]"), UINT64_MAX, 1, MMOE_EFORMAT, "'w.x'",
               "shape[1]");
    expect_bad(T1("w.x", "\"U8\"", "[1,1,1,1,1,1,1,1,1]", "[0,1]"), UINT64_MAX, 1,
               MMOE_EUNSUPPORTED, "'w.x'", "9 dimensions");
    expect_bad(T1("w.x", "\"U8\"", "[1]", "[0]"), UINT64_MAX, 1, MMOE_EFORMAT, "'w.x'",
               "two integers");
    expect_bad(T1("w.x", "\"U8\"", "[1]", "[\"0\",1]"), UINT64_MAX, 1, MMOE_EFORMAT, "'w.x'",
               "two integers");
    expect_bad(T1("w.x", "\"U8\"", "[1]", "[-1,0]"), UINT64_MAX, 1, MMOE_EFORMAT, "'w.x'",
               "two integers");
    expect_bad(T1("w.x", "\"U8\"", "[1]", "{}"), UINT64_MAX, 1, MMOE_EFORMAT, "'w.x'",
               "two integers");
    /* metadata */
    expect_bad("{\"__metadata__\":[]}", UINT64_MAX, 0, MMOE_EFORMAT, "__metadata__", "object");
    expect_bad("{\"__metadata__\":{\"epoch\":3}}", UINT64_MAX, 0, MMOE_EFORMAT, "'epoch'",
               "string");
}
END_TEST

START_TEST(bad_sizes_and_offsets)
{
    /* byte count != numel * size: F32 [3] needs 12 bytes, offsets span 8 */
    expect_bad(T1("w.f", "\"F32\"", "[3]", "[0,8]"), UINT64_MAX, 8, MMOE_EFORMAT, "'w.f'",
               "needs 12 bytes");
    expect_bad(T1("w.f", "\"BF16\"", "[2,2]", "[0,9]"), UINT64_MAX, 9, MMOE_EFORMAT, "'w.f'",
               "needs 8 bytes");
    /* numel overflows: 2^32 * 2^32 elements */
    expect_bad(T1("w.big", "\"U8\"", "[4294967296,4294967296]", "[0,1]"), UINT64_MAX, 1,
               MMOE_EFORMAT, "'w.big'", "overflows");
    /* numel fits, numel * 8 does not */
    expect_bad(T1("w.big", "\"F64\"", "[4611686018427387904]", "[0,1]"), UINT64_MAX, 1,
               MMOE_EFORMAT, "'w.big'", "overflows");
    /* offsets reversed, past the data section */
    expect_bad(T1("w.r", "\"U8\"", "[0]", "[4,2]"), UINT64_MAX, 4, MMOE_EFORMAT, "'w.r'",
               "reversed");
    expect_bad(T1("w.p", "\"U8\"", "[4]", "[2,6]"), UINT64_MAX, 4, MMOE_EFORMAT, "'w.p'",
               "run past the data section of 4 bytes");
    /* overlap: b starts inside a */
    expect_bad("{\"a.w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"b.w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
               UINT64_MAX, 6, MMOE_EFORMAT, "'b.w'", "overlap tensor 'a.w'");
    /* two tensors on the same bytes */
    expect_bad("{\"a.w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"b.w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
               UINT64_MAX, 4, MMOE_EFORMAT, "overlap", "'a.w'");
    /* hole between tensors, hole at the start, trailing bytes */
    expect_bad("{\"a.w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
               "\"b.w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
               UINT64_MAX, 5, MMOE_EFORMAT, "'b.w'", "hole");
    expect_bad(T1("w.h", "\"U8\"", "[2]", "[1,3]"), UINT64_MAX, 3, MMOE_EFORMAT, "'w.h'",
               "begin at 0");
    expect_bad(T1("w.t", "\"U8\"", "[2]", "[0,2]"), UINT64_MAX, 5, MMOE_EFORMAT,
               "3 trailing bytes", NULL);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* writer errors and atomicity                                                */
/* ------------------------------------------------------------------------- */

START_TEST(writer_rejects_bad_tensors)
{
    mmoe_st_writer *w;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    uint8_t buf[64] = {0};
    int64_t shape[2] = {2, 3};
    ck_assert_int_eq(mmoe_st_writer_add(w, "w.a", MMOE_DT_F32, 2, shape, buf, 24, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_add(w, "w.a", MMOE_DT_F32, 2, shape, buf, 24, &err),
                     MMOE_EINVAL);
    ck_assert(strstr(err.msg, "'w.a'") && strstr(err.msg, "twice"));
    ck_assert_int_eq(mmoe_st_writer_add(w, "w.b", MMOE_DT_F32, 2, shape, buf, 20, &err),
                     MMOE_EINVAL);
    ck_assert(strstr(err.msg, "'w.b'") && strstr(err.msg, "needs 24 bytes, got 20"));
    int64_t neg[1] = {-2};
    ck_assert_int_eq(mmoe_st_writer_add(w, "w.c", MMOE_DT_U8, 1, neg, buf, 0, &err), MMOE_EINVAL);
    ck_assert(strstr(err.msg, "'w.c'"));
    int64_t huge[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
    ck_assert_int_eq(mmoe_st_writer_add(w, "w.h", MMOE_DT_U8, 2, huge, buf, 0, &err),
                     MMOE_EINVAL);
    ck_assert(strstr(err.msg, "'w.h'"));
    ck_assert_int_eq(mmoe_st_writer_add(w, "w.d", MMOE_DT_U8, 9, shape, buf, 1, &err),
                     MMOE_EINVAL);
    ck_assert_int_eq(mmoe_st_writer_add(w, "w.e", MMOE_DT_COUNT, 1, shape, buf, 2, &err),
                     MMOE_EINVAL);
    ck_assert_int_eq(mmoe_st_writer_add(w, "", MMOE_DT_U8, 0, NULL, buf, 1, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_st_writer_add(w, "__metadata__", MMOE_DT_U8, 0, NULL, buf, 1, &err),
                     MMOE_EINVAL);
    ck_assert_int_eq(mmoe_st_writer_add(w, "bad\xff", MMOE_DT_U8, 0, NULL, buf, 1, &err),
                     MMOE_EINVAL);
    ck_assert_int_eq(mmoe_st_writer_set_metadata(w, "k", "\xc3", &err), MMOE_EINVAL);
    ck_assert_uint_eq(mmoe_st_writer_count(w), 1);
    ck_assert_uint_eq(mmoe_st_writer_data_bytes(w), 24);
    /* a view goes in as it is; an inconsistent view is refused */
    mmoe_tensor view = {MMOE_DT_BF16, 2, {4, 2}, buf, 16};
    ck_assert_int_eq(mmoe_st_writer_add_tensor(w, "w.view", &view, &err), MMOE_OK);
    view.nbytes = 15;
    ck_assert_int_eq(mmoe_st_writer_add_tensor(w, "w.view2", &view, &err), MMOE_EINVAL);
    ck_assert(strstr(err.msg, "'w.view2'"));
    ck_assert_uint_eq(mmoe_st_writer_count(w), 2);
    ck_assert_uint_eq(mmoe_st_writer_data_bytes(w), 40);
    mmoe_st_writer_destroy(w);
}
END_TEST

/** The supplier of streamed_finish_asks_in_data_order: records each call, fails at index fail_at. */
typedef struct supplier_log {
    const uint8_t *const *bytes; /**< per add index: the bytes to hand out */
    size_t calls[8];             /**< the indices asked for, in call order */
    size_t n_calls;              /**< their count */
    size_t fail_at;              /**< the index whose call fails (SIZE_MAX: none) */
} supplier_log;

static mmoe_status log_supplier(void *ctx, size_t index, const void **data, mmoe_error *err)
{
    supplier_log *log = ctx;
    ck_assert_uint_lt(log->n_calls, 8);
    log->calls[log->n_calls++] = index;
    if (index == log->fail_at)
        return mmoe_error_set(err, MMOE_EIO, "supplier: no bytes for %zu", index);
    *data = log->bytes[index];
    return MMOE_OK;
}

START_TEST(streamed_finish_asks_in_data_order)
{
    /* add order: 0 b.f32 (given), 1 a.u8 (deferred), 2 c.i64 (deferred), 3 a.bf16 (given),
     * 4 z.u8 (deferred), 5 b.u8 (deferred).  Data order by the format description (larger
     * elements first, then by name): c.i64, b.f32, a.bf16, a.u8, b.u8, z.u8 = 2, 0, 3, 1, 5, 4;
     * the supplier is asked for the deferred ones in that order: 2, 1, 5, 4. */
    static const uint8_t f32[8] = {1, 2, 3, 4, 5, 6, 7, 8}, u8a[3] = {9, 10, 11},
                         i64[8] = {12, 13, 14, 15, 16, 17, 18, 19}, bf16[4] = {20, 21, 22, 23}, u8z[1] = {24},
                         u8b[2] = {25, 26};
    static const uint8_t *const bytes[6] = {f32, u8a, i64, bf16, u8z, u8b};
    static const struct {
        const char *name;
        mmoe_dtype dtype;
        int64_t n;
        int deferred;
    } t[6] = {{"b.f32", MMOE_DT_F32, 2, 0}, {"a.u8", MMOE_DT_U8, 3, 1},  {"c.i64", MMOE_DT_I64, 1, 1},
              {"a.bf16", MMOE_DT_BF16, 2, 0}, {"z.u8", MMOE_DT_U8, 1, 1}, {"b.u8", MMOE_DT_U8, 2, 1}};
    char dir[512], streamed[700], plain[700];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(streamed, sizeof streamed, "%s/streamed.safetensors", dir);
    snprintf(plain, sizeof plain, "%s/plain.safetensors", dir);
    mmoe_error err;
    mmoe_st_writer *ws, *wp;
    ck_assert_int_eq(mmoe_st_writer_create(&ws, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_create(&wp, &err), MMOE_OK);
    for (int i = 0; i < 6; i++) {
        const size_t nb = (size_t)t[i].n * mmoe_dtype_size(t[i].dtype);
        if (t[i].deferred)
            ck_assert_int_eq(mmoe_st_writer_add_deferred(ws, t[i].name, t[i].dtype, 1, &t[i].n, nb, &err), MMOE_OK);
        else
            ck_assert_int_eq(mmoe_st_writer_add(ws, t[i].name, t[i].dtype, 1, &t[i].n, bytes[i], nb, &err), MMOE_OK);
        ck_assert_int_eq(mmoe_st_writer_add(wp, t[i].name, t[i].dtype, 1, &t[i].n, bytes[i], nb, &err), MMOE_OK);
    }
    /* the deferred checks are those of add: a wrong byte count is refused */
    const int64_t two = 2;
    ck_assert_int_eq(mmoe_st_writer_add_deferred(ws, "bad", MMOE_DT_F32, 1, &two, 7, &err), MMOE_EINVAL);
    ck_assert_msg(strstr(err.msg, "'bad'") && strstr(err.msg, "needs 8 bytes, got 7"), "%s", err.msg);
    size_t order[6];
    ck_assert_int_eq(mmoe_st_writer_data_order(ws, order, &err), MMOE_OK);
    static const size_t want_order[6] = {2, 0, 3, 1, 5, 4};
    for (int k = 0; k < 6; k++)
        ck_assert_uint_eq(order[k], want_order[k]);
    /* a writer with deferred tensors has no bytes for the plain finishes */
    ck_assert_int_eq(mmoe_st_writer_finish(ws, streamed, &err), MMOE_EINVAL);
    ck_assert_msg(strstr(err.msg, "deferred"), "%s", err.msg);
    ck_assert_int_eq(mmoe_st_writer_finish_sharded(ws, dir, 1 << 20, NULL, &err), MMOE_EINVAL);
    ck_assert_msg(strstr(err.msg, "deferred"), "%s", err.msg);
    ck_assert_int_eq(count_dir_entries(dir), 0);
    /* a failing supplier: its status and message, no file, no temporary */
    supplier_log log = {.bytes = bytes, .fail_at = 5};
    ck_assert_int_eq(mmoe_st_writer_finish_streamed(ws, streamed, log_supplier, &log, &err), MMOE_EIO);
    ck_assert_str_eq(err.msg, "supplier: no bytes for 5");
    ck_assert_uint_eq(log.n_calls, 3); /* 2, 1, then 5 fails */
    ck_assert_int_eq(count_dir_entries(dir), 0);
    /* the streamed file is the plain one, byte for byte; the supplier was asked in data order */
    log = (supplier_log){.bytes = bytes, .fail_at = SIZE_MAX};
    ck_assert_int_eq(mmoe_st_writer_finish_streamed(ws, streamed, log_supplier, &log, &err), MMOE_OK);
    static const size_t want_calls[4] = {2, 1, 5, 4};
    ck_assert_uint_eq(log.n_calls, 4);
    for (int k = 0; k < 4; k++)
        ck_assert_uint_eq(log.calls[k], want_calls[k]);
    ck_assert_int_eq(mmoe_st_writer_finish(wp, plain, &err), MMOE_OK);
    size_t ns = 0, np = 0;
    uint8_t *fs = mmoe_test_read_file(streamed, &ns), *fp = mmoe_test_read_file(plain, &np);
    ck_assert(fs && fp);
    ck_assert_uint_eq(ns, np);
    ck_assert_msg(memcmp(fs, fp, ns) == 0, "the streamed file differs from the plain one");
    free(fs);
    free(fp);
    mmoe_st_writer_destroy(ws);
    mmoe_st_writer_destroy(wp);
    mmoe_test_rmtree(dir);
}
END_TEST

/** A writer with one small tensor, finished to @p path; returns the status. */
static mmoe_status write_small(const char *path, mmoe_error *err)
{
    static const uint8_t bytes[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    int64_t shape[1] = {4};
    mmoe_st_writer *w;
    mmoe_status st = mmoe_st_writer_create(&w, err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_add(w, "w.small", MMOE_DT_F32, 1, shape, bytes, 16, err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_finish(w, path, err);
    mmoe_st_writer_destroy(w);
    return st;
}

START_TEST(atomic_write_failures)
{
    char dir[512], path[700];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    mmoe_error err;
    /* 1. the directory does not exist */
    snprintf(path, sizeof path, "%s/no/such/dir/x.safetensors", dir);
    ck_assert_int_eq(write_small(path, &err), MMOE_EIO);
    ck_assert(strstr(err.msg, path));
    ck_assert_int_eq(count_dir_entries(dir), 0);
    /* 2. the target is a directory: refused before a temporary file exists */
    snprintf(path, sizeof path, "%s/target", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    ck_assert_int_eq(write_small(path, &err), MMOE_EIO);
    ck_assert(strstr(err.msg, "is not a regular file (a directory)"));
    ck_assert_int_eq(count_dir_entries(dir), 1);
    struct stat sb;
    ck_assert(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode));
    /* 3. a read-only directory (not enforced for root, who may write anywhere) */
    if (geteuid() != 0) {
        char ro[600];
        snprintf(ro, sizeof ro, "%s/ro", dir);
        ck_assert_int_eq(mkdir(ro, 0555), 0);
        snprintf(path, sizeof path, "%s/x.safetensors", ro);
        ck_assert_int_eq(write_small(path, &err), MMOE_EIO);
        ck_assert_int_eq(count_dir_entries(ro), 0);
        chmod(ro, 0755);
    }
    /* 4. the disk "fills up" half-way (RLIMIT_FSIZE in a child): an existing
     *    file at the target survives unchanged and no temporary file remains */
    snprintf(path, sizeof path, "%s/keep.safetensors", dir);
    mmoe_test_write_file(path, "old contents", 12);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {20, 20}; /* the header alone is longer than 20 bytes */
        setrlimit(RLIMIT_FSIZE, &rl);
        mmoe_error cerr;
        mmoe_status st = write_small(path, &cerr);
        _exit(st == MMOE_EIO && strstr(cerr.msg, "write") ? 0 : 1);
    }
    int wstatus;
    ck_assert_int_eq(waitpid(pid, &wstatus, 0), pid);
    ck_assert(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
    size_t n;
    uint8_t *old = mmoe_test_read_file(path, &n);
    ck_assert_uint_eq(n, 12);
    ck_assert(memcmp(old, "old contents", 12) == 0);
    free(old);
    ck_assert_int_eq(count_dir_entries(dir), 2); /* target/ and keep.safetensors */
    /* 5. a good write replaces the old file */
    ck_assert_int_eq(write_small(path, &err), MMOE_OK);
    mmoe_st_file *f;
    ck_assert_int_eq(mmoe_st_open(path, &f, &err), MMOE_OK);
    ck_assert_uint_eq(mmoe_st_find(f, "w.small")->nbytes, 16);
    mmoe_st_close(f);
    ck_assert_int_eq(count_dir_entries(dir), 2);
    mmoe_test_rmtree(dir);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* checkpoints                                                                */
/* ------------------------------------------------------------------------- */

/** Write shard @p file in @p dir with tensors @p names (F32 [k+1], value = k + shard*100). */
static void write_shard(const char *dir, const char *file, const char *const *names, int n,
                        float storage[][8], int shard)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    mmoe_st_writer *w;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    for (int k = 0; k < n; k++) {
        int64_t shape[1] = {k + 1};
        for (int j = 0; j < 8; j++)
            storage[k][j] = (float)(k + shard * 100) + 0.25f * (float)j;
        ck_assert_int_eq(mmoe_st_writer_add(w, names[k], MMOE_DT_F32, 1, shape, storage[k],
                                            (size_t)(k + 1) * 4, &err),
                         MMOE_OK);
    }
    ck_assert_msg(mmoe_st_writer_finish(w, path, &err) == MMOE_OK, "%s", err.msg);
    mmoe_st_writer_destroy(w);
}

static void write_text(const char *dir, const char *file, const char *text)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    mmoe_test_write_file(path, text, strlen(text));
}

static void expect_ckpt_bad(const char *path, mmoe_status code, const char *n1, const char *n2)
{
    mmoe_ckpt *ck = (mmoe_ckpt *)1;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_status st = mmoe_ckpt_open(path, &ck, &err);
    if (st != code || (n1 && !strstr(err.msg, n1)) || (n2 && !strstr(err.msg, n2)))
        ck_abort_msg("checkpoint %s: expected %s with '%s' '%s', got %s: %s", path,
                     mmoe_status_name(code), n1 ? n1 : "", n2 ? n2 : "", mmoe_status_name(st),
                     err.msg);
    ck_assert_ptr_null(ck);
}

START_TEST(checkpoint_with_index)
{
    char dir[512], path[700];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    static const char *const s1[] = {"embed.weight", "layers.0.attn_norm.weight"};
    static const char *const s2[] = {"layers.0.ffn.gate.weight", "head.weight", "norm.weight"};
    float st1[2][8], st2[3][8];
    write_shard(dir, "model-00001-of-00002.safetensors", s1, 2, st1, 1);
    write_shard(dir, "model-00002-of-00002.safetensors", s2, 3, st2, 2);
    const char *names[5] = {s1[0], s1[1], s2[0], s2[1], s2[2]};
    const char *files[5] = {"model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors",
                            "model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors",
                            "model-00002-of-00002.safetensors"};
    snprintf(path, sizeof path, "%s/%s", dir, MMOE_ST_INDEX_NAME);
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_write_index(path, 5, names, files, 4 * (1 + 2 + 1 + 2 + 3), &err),
                     MMOE_OK);
    mmoe_ckpt *ck;
    ck_assert_msg(mmoe_ckpt_open(dir, &ck, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_uint_eq(mmoe_ckpt_count(ck), 5);
    ck_assert_uint_eq(mmoe_ckpt_shard_count(ck), 2);
    ck_assert_ptr_nonnull(mmoe_ckpt_shard(ck, 1));
    ck_assert_ptr_null(mmoe_ckpt_shard(ck, 2));
    for (int i = 0; i < 5; i++) {
        const mmoe_ckpt_entry *e = mmoe_ckpt_find_entry(ck, names[i]);
        ck_assert_ptr_nonnull(e);
        ck_assert_str_eq(e->shard, files[i]);
        ck_assert_int_eq(e->shard_index, i < 2 ? 0 : 1);
        int k = i < 2 ? i : i - 2;
        const float *want = i < 2 ? st1[k] : st2[k];
        ck_assert_int_eq(e->view.shape[0], k + 1);
        ck_assert(memcmp(e->view.data, want, (size_t)(k + 1) * 4) == 0);
    }
    for (size_t i = 1; i < mmoe_ckpt_count(ck); i++)
        ck_assert_int_lt(strcmp(mmoe_ckpt_get(ck, i - 1)->name, mmoe_ckpt_get(ck, i)->name), 0);
    ck_assert_ptr_null(mmoe_ckpt_get(ck, 5));
    /* require: found, wrong dtype, wrong shape, missing, any shape */
    mmoe_tensor v;
    int64_t shape3[1] = {3};
    ck_assert_int_eq(mmoe_ckpt_require(ck, "norm.weight", MMOE_DT_F32, 1, shape3, &v, &err),
                     MMOE_OK);
    ck_assert_int_eq(v.shape[0], 3);
    ck_assert_int_eq(mmoe_ckpt_require(ck, "norm.weight", MMOE_DT_BF16, 1, shape3, &v, &err),
                     MMOE_EDTYPE);
    ck_assert(strstr(err.msg, "'norm.weight'") && strstr(err.msg, "expected dtype BF16, found F32") &&
              strstr(err.msg, "model-00002-of-00002.safetensors") && strstr(err.msg, dir));
    int64_t shape4[2] = {4, 1};
    ck_assert_int_eq(mmoe_ckpt_require(ck, "norm.weight", MMOE_DT_F32, 2, shape4, &v, &err),
                     MMOE_ESHAPE);
    ck_assert(strstr(err.msg, "expected shape [4, 1], found [3]") &&
              strstr(err.msg, "model-00002-of-00002.safetensors"));
    ck_assert_int_eq(mmoe_ckpt_require(ck, "nope", MMOE_DT_F32, -1, NULL, &v, &err),
                     MMOE_ENOTFOUND);
    ck_assert(strstr(err.msg, "'nope'") && strstr(err.msg, dir));
    ck_assert_int_eq(mmoe_ckpt_require(ck, "head.weight", MMOE_DT_F32, -1, NULL, NULL, &err),
                     MMOE_OK);
    ck_assert_int_eq(mmoe_ckpt_require(ck, "head.weight", MMOE_DT_I32, -1, NULL, NULL, &err),
                     MMOE_EDTYPE);
    ck_assert_ptr_null(mmoe_ckpt_find(ck, "nope"));
    mmoe_ckpt_close(ck);

    /* the same shard opened as a single file */
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    ck_assert_int_eq(mmoe_ckpt_open(path, &ck, &err), MMOE_OK);
    ck_assert_uint_eq(mmoe_ckpt_count(ck), 2);
    ck_assert_str_eq(mmoe_ckpt_get(ck, 0)->shard, path);
    mmoe_ckpt_close(ck);

    /* index errors: tensor listed but absent from its shard */
    char idx[700];
    snprintf(idx, sizeof idx, "%s/%s", dir, MMOE_ST_INDEX_NAME);
    const char *names6[6] = {names[0], names[1], names[2], names[3], names[4], "ghost.weight"};
    const char *files6[6] = {files[0], files[1], files[2], files[3], files[4], files[0]};
    ck_assert_int_eq(mmoe_st_write_index(idx, 6, names6, files6, 0, &err), MMOE_OK);
    expect_ckpt_bad(dir, MMOE_ENOTFOUND, "'ghost.weight'", "model-00001-of-00002.safetensors");
    /* a shard that does not exist */
    files6[5] = "model-00003-of-00002.safetensors";
    ck_assert_int_eq(mmoe_st_write_index(idx, 6, names6, files6, 0, &err), MMOE_OK);
    expect_ckpt_bad(dir, MMOE_ENOTFOUND, "model-00003-of-00002.safetensors", "not a file");
    /* a tensor in a shard that the index omits, or assigns elsewhere */
    ck_assert_int_eq(mmoe_st_write_index(idx, 4, names, files, 0, &err), MMOE_OK);
    expect_ckpt_bad(dir, MMOE_EFORMAT, "'norm.weight'", "does not list");
    const char *files_swapped[5] = {files[0], files[2], files[2], files[3], files[4]};
    ck_assert_int_eq(mmoe_st_write_index(idx, 5, names, files_swapped, 0, &err), MMOE_OK);
    expect_ckpt_bad(dir, MMOE_ENOTFOUND, "'layers.0.attn_norm.weight'",
                    "model-00002-of-00002.safetensors");
    /* a third shard that also holds norm.weight, which the index places in shard 2 */
    static const char *const s3[] = {"extra.weight", "norm.weight"};
    float st3[2][8];
    write_shard(dir, "model-extra.safetensors", s3, 2, st3, 3);
    const char *names7[6] = {names[0], names[1], names[2], names[3], names[4], "extra.weight"};
    const char *files7[6] = {files[0], files[1], files[2], files[3], files[4],
                             "model-extra.safetensors"};
    ck_assert_int_eq(mmoe_st_write_index(idx, 6, names7, files7, 0, &err), MMOE_OK);
    expect_ckpt_bad(dir, MMOE_EFORMAT, "'norm.weight'",
                    "assigns to shard 'model-00002-of-00002.safetensors'");
    /* malformed index files */
    write_text(dir, MMOE_ST_INDEX_NAME, "{\"weight_map\": {\"a\": \"x\",}}");
    expect_ckpt_bad(dir, MMOE_EFORMAT, MMOE_ST_INDEX_NAME, "not valid JSON");
    write_text(dir, MMOE_ST_INDEX_NAME, "{\"metadata\": {}}");
    expect_ckpt_bad(dir, MMOE_EFORMAT, MMOE_ST_INDEX_NAME, "weight_map");
    write_text(dir, MMOE_ST_INDEX_NAME, "{\"weight_map\": {\"a\": 3}}");
    expect_ckpt_bad(dir, MMOE_EFORMAT, "'a'", "shard file name");
    write_text(dir, MMOE_ST_INDEX_NAME, "{\"weight_map\": {\"a\": \"../x.safetensors\"}}");
    expect_ckpt_bad(dir, MMOE_EFORMAT, "'a'", "../x.safetensors");
    write_text(dir, MMOE_ST_INDEX_NAME, "{\"weight_map\": {\"a\": \"s\", \"a\": \"s\"}}");
    expect_ckpt_bad(dir, MMOE_EFORMAT, "duplicate", "'\"a\"'");
    /* the index writer refuses duplicates and paths */
    const char *dupn[2] = {"a", "a"}, *dupf[2] = {"s", "s"}, *slash[1] = {"d/s"};
    ck_assert_int_eq(mmoe_st_write_index(idx, 2, dupn, dupf, 0, &err), MMOE_EINVAL);
    ck_assert(strstr(err.msg, "'a'"));
    ck_assert_int_eq(mmoe_st_write_index(idx, 1, dupn, slash, 0, &err), MMOE_EINVAL);
    mmoe_test_rmtree(dir);
}
END_TEST

START_TEST(checkpoint_layouts)
{
    char dir[512], path[700];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    /* an empty directory, a missing path */
    expect_ckpt_bad(dir, MMOE_ENOTFOUND, MMOE_ST_INDEX_NAME, MMOE_ST_SINGLE_NAME);
    snprintf(path, sizeof path, "%s/absent", dir);
    expect_ckpt_bad(path, MMOE_ENOTFOUND, path, NULL);
    /* a directory with a lone model.safetensors */
    static const char *const names[] = {"a", "b"};
    float storage[2][8];
    write_shard(dir, MMOE_ST_SINGLE_NAME, names, 2, storage, 0);
    mmoe_ckpt *ck;
    mmoe_error err;
    ck_assert_msg(mmoe_ckpt_open(dir, &ck, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_uint_eq(mmoe_ckpt_count(ck), 2);
    ck_assert_ptr_nonnull(mmoe_ckpt_find(ck, "b"));
    ck_assert(strstr(mmoe_ckpt_get(ck, 0)->shard, MMOE_ST_SINGLE_NAME));
    mmoe_ckpt_close(ck);
    /* a corrupt shard: the error names it */
    snprintf(path, sizeof path, "%s/%s", dir, MMOE_ST_SINGLE_NAME);
    mmoe_test_write_file(path, "\x01\x00\x00", 3);
    expect_ckpt_bad(dir, MMOE_EFORMAT, MMOE_ST_SINGLE_NAME, "3 bytes");
    mmoe_test_rmtree(dir);
}
END_TEST

/** Sharded writing: greedy split in name order, content intact, failures leave nothing. */
START_TEST(checkpoint_sharded_writer)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 7);
    char dir[512], path[700];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    enum { N = 20 };
    const uint64_t max_bytes = 300;
    rt_tensor ts[N];
    mmoe_st_writer *w;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    for (int i = 0; i < N; i++) {
        random_tensor(&rng, &ts[i], (mmoe_dtype)mmoe_rng_below(&rng, MMOE_DT_COUNT), i);
        ck_assert_int_eq(mmoe_st_writer_add(w, ts[i].name, ts[i].dtype, ts[i].ndim, ts[i].shape,
                                            ts[i].data, ts[i].nbytes, &err),
                         MMOE_OK);
    }
    ck_assert_int_eq(mmoe_st_writer_set_metadata(w, "format", "pt", &err), MMOE_OK);
    size_t n_shards = 0;
    ck_assert_msg(mmoe_st_writer_finish_sharded(w, dir, max_bytes, &n_shards, &err) == MMOE_OK,
                  "%s", err.msg);
    ck_assert_int_eq(count_dir_entries(dir), (int)n_shards + 1); /* + the index */
    mmoe_ckpt *ck;
    ck_assert_msg(mmoe_ckpt_open(dir, &ck, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_uint_eq(mmoe_ckpt_shard_count(ck), n_shards);
    ck_assert_uint_eq(mmoe_ckpt_count(ck), N);
    for (int i = 0; i < N; i++) {
        const mmoe_ckpt_entry *e = mmoe_ckpt_find_entry(ck, ts[i].name);
        ck_assert_ptr_nonnull(e);
        ck_assert_int_eq(e->view.dtype, ts[i].dtype);
        ck_assert_uint_eq(e->view.nbytes, ts[i].nbytes);
        ck_assert(ts[i].nbytes == 0 || memcmp(e->view.data, ts[i].data, ts[i].nbytes) == 0);
    }
    /* shard properties: name ranges do not interleave; each shard is within the limit
     * unless it holds one tensor; and the split is greedy (the next shard's first tensor
     * would not have fitted into the previous one) */
    uint64_t shard_bytes[N] = {0};
    size_t shard_count[N] = {0};
    const char *first_name[N] = {0};
    int prev_shard = -1;
    for (size_t i = 0; i < mmoe_ckpt_count(ck); i++) { /* name order */
        const mmoe_ckpt_entry *e = mmoe_ckpt_get(ck, i);
        ck_assert_int_ge(e->shard_index, prev_shard);
        if (e->shard_index != prev_shard)
            first_name[e->shard_index] = e->name;
        prev_shard = e->shard_index;
        shard_bytes[e->shard_index] += e->view.nbytes;
        shard_count[e->shard_index]++;
        ck_assert_str_eq(mmoe_st_metadata(mmoe_ckpt_shard(ck, (size_t)e->shard_index), "format"),
                         "pt");
    }
    for (size_t s = 0; s < n_shards; s++) {
        ck_assert(shard_bytes[s] <= max_bytes || shard_count[s] == 1);
        if (s > 0)
            ck_assert_uint_gt(shard_bytes[s - 1] + mmoe_ckpt_find(ck, first_name[s])->nbytes,
                              max_bytes);
    }
    ck_assert_uint_ge(n_shards, 2);
    mmoe_ckpt_close(ck);
    mmoe_st_writer_destroy(w);
    for (int i = 0; i < N; i++)
        free(ts[i].data);
    mmoe_test_rmtree(dir);

    /* failure half-way (the second shard exceeds RLIMIT_FSIZE): the first shard is removed */
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        static uint8_t small[8], big[4000];
        int64_t s8[1] = {8}, s4000[1] = {4000};
        mmoe_st_writer *cw;
        mmoe_error cerr;
        if (mmoe_st_writer_create(&cw, &cerr) != MMOE_OK ||
            mmoe_st_writer_add(cw, "a.small", MMOE_DT_U8, 1, s8, small, 8, &cerr) != MMOE_OK ||
            mmoe_st_writer_add(cw, "z.big", MMOE_DT_U8, 1, s4000, big, 4000, &cerr) != MMOE_OK)
            _exit(2);
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {1000, 1000};
        setrlimit(RLIMIT_FSIZE, &rl);
        mmoe_status st = mmoe_st_writer_finish_sharded(cw, dir, 100, NULL, &cerr);
        _exit(st == MMOE_EIO && strstr(cerr.msg, "model-00002-of-00002") ? 0 : 1);
    }
    int wstatus;
    ck_assert_int_eq(waitpid(pid, &wstatus, 0), pid);
    ck_assert(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
    ck_assert_int_eq(count_dir_entries(dir), 0);
    /* a missing directory */
    snprintf(path, sizeof path, "%s/absent", dir);
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    uint8_t one[1] = {1};
    int64_t s1[1] = {1};
    ck_assert_int_eq(mmoe_st_writer_add(w, "x", MMOE_DT_U8, 1, s1, one, 1, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_finish_sharded(w, path, 100, NULL, &err), MMOE_EIO);
    ck_assert(strstr(err.msg, path));
    ck_assert_int_eq(count_dir_entries(dir), 0);
    mmoe_st_writer_destroy(w);
    /* no tensors: an index with an empty weight_map, a valid empty checkpoint */
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    size_t n0 = 99;
    ck_assert_int_eq(mmoe_st_writer_finish_sharded(w, dir, 100, &n0, &err), MMOE_OK);
    ck_assert_uint_eq(n0, 0);
    ck_assert_int_eq(mmoe_ckpt_open(dir, &ck, &err), MMOE_OK);
    ck_assert_uint_eq(mmoe_ckpt_count(ck), 0);
    mmoe_ckpt_close(ck);
    mmoe_st_writer_destroy(w);
    mmoe_test_rmtree(dir);
}
END_TEST

/** Unaligned data (from a foreign writer) is copied once into aligned memory, values intact. */
START_TEST(unaligned_tensors_are_copied_aligned)
{
    char dir[512], path[700];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/u.safetensors", dir);
    /* header of odd length: the F32 data starts at an odd file offset */
    const char *header = T1("w.f1", "\"F32\"", "[1]", "[0,4]");
    ck_assert_uint_eq(strlen(header) % 2, 1);
    size_t size;
    uint8_t *img = make_image(header, strlen(header), UINT64_MAX, 4, &size);
    mmoe_test_write_file(path, img, size);
    free(img);
    mmoe_ckpt *ck;
    mmoe_error err;
    ck_assert_int_eq(mmoe_ckpt_open(path, &ck, &err), MMOE_OK);
    const mmoe_tensor *t = mmoe_ckpt_find(ck, "w.f1");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq((uintptr_t)t->data % 4, 0);
    int64_t one[1] = {1};
    mmoe_tensor view;
    ck_assert_int_eq(mmoe_ckpt_require(ck, "w.f1", MMOE_DT_F32, 1, one, &view, &err), MMOE_OK);
    /* the bytes are the file's: the 4 data bytes make_image() wrote after the header */
    const uint8_t *raw = mmoe_test_read_file(path, &size);
    ck_assert(memcmp(view.data, raw + size - 4, 4) == 0);
    free((void *)raw);
    ck_assert_int_eq(mmoe_ckpt_find_entry(ck, "w.f1")->realigned, 1);
    ck_assert_uint_eq(mmoe_st_realigned_bytes(mmoe_ckpt_shard(ck, 0)), 4);
    mmoe_ckpt_close(ck);
    mmoe_test_rmtree(dir);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* UTF-8                                                                      */
/* ------------------------------------------------------------------------- */

START_TEST(utf8_vectors)
{
    /* valid: ASCII, 2-byte (U+00E9), 3-byte (U+20AC), 4-byte (U+1F600), edges U+FFFF, U+10FFFF */
    static const char *const good[] = {"abc", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                                       "\xef\xbf\xbf", "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf", ""};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        ck_assert_msg(mmoe_utf8_valid(good[i], strlen(good[i]), NULL), "good[%zu]", i);
    /* invalid, with the offset of the first bad sequence */
    static const struct { const char *s; size_t off; } bad[] = {
        {"ab\x80", 2},             /* stray continuation */
        {"\xc0\x80", 0},           /* overlong NUL */
        {"\xc1\xbf", 0},           /* overlong */
        {"x\xe0\x9f\xbf", 1},      /* overlong 3-byte */
        {"\xed\xa0\x80", 0},       /* surrogate U+D800 */
        {"\xf0\x8f\xbf\xbf", 0},   /* overlong 4-byte */
        {"\xf4\x90\x80\x80", 0},   /* U+110000 */
        {"\xf5\x80\x80\x80", 0},   /* lead F5 */
        {"ok\xe2\x82", 2},         /* truncated */
        {"\xc3(", 0},              /* bad continuation */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t off = 99;
        ck_assert_msg(!mmoe_utf8_valid(bad[i].s, strlen(bad[i].s), &off), "bad[%zu]", i);
        ck_assert_uint_eq(off, bad[i].off);
    }
}
END_TEST


/* Every scalar value: the encoder writes the RFC 3629 bytes (lengths by range, the lead and
 * continuation bit patterns), the classifier reads back the same code point and length. */
START_TEST(utf8_put_next_roundtrip)
{
    for (uint32_t cp = 0; cp <= 0x10FFFFu; cp++) {
        if (cp >= 0xD800u && cp <= 0xDFFFu)
            continue;
        char buf[5];
        memset(buf, 0x55, sizeof buf);
        size_t want_len = cp < 0x80u ? 1 : cp < 0x800u ? 2 : cp < 0x10000u ? 3 : 4;
        size_t n = mmoe_utf8_put(cp, buf);
        ck_assert_uint_eq(n, want_len);
        ck_assert_int_eq(buf[n], 0x55); /* nothing past the character */
        static const unsigned char lead_bits[5] = {0, 0x00, 0xC0, 0xE0, 0xF0};
        unsigned char b0 = (unsigned char)buf[0];
        ck_assert_uint_eq(b0 & (n == 1 ? 0x80u : n == 2 ? 0xE0u : n == 3 ? 0xF0u : 0xF8u), lead_bits[n]);
        for (size_t k = 1; k < n; k++)
            ck_assert_uint_eq((unsigned char)buf[k] & 0xC0u, 0x80u);
        size_t len = 0;
        uint32_t back = UINT32_MAX;
        ck_assert_int_eq(mmoe_utf8_next((const unsigned char *)buf, n, &len, &back), MMOE_UTF8_VALID);
        ck_assert_uint_eq(len, n);
        ck_assert_uint_eq(back, cp);
        if (n > 1) /* one byte short: an unfinished prefix, not an error */
            ck_assert_int_eq(mmoe_utf8_next((const unsigned char *)buf, n - 1, &len, NULL), MMOE_UTF8_INCOMPLETE);
        ck_assert_uint_eq(mmoe_utf8_first_invalid(buf, n), n);
    }
}
END_TEST

/* ------------------------------------------------------------------------- */
/* statistics (what `inspect --stats` prints)                                 */
/* ------------------------------------------------------------------------- */

static mmoe_tensor_stats stats_of(mmoe_dtype dt, const void *data, int64_t n)
{
    mmoe_tensor t = {dt, 1, {n}, (void *)data, (size_t)n * mmoe_dtype_size(dt)};
    mmoe_tensor_stats s;
    mmoe_error err;
    ck_assert_msg(mmoe_tensor_stats_compute(&t, &s, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(s.count, n);
    return s;
}

START_TEST(tensor_stats_hand_values)
{
    /* F32 {1, -3, NaN, +Inf, 2.5, -Inf}: finite values 1, -3, 2.5 */
    const float f32[6] = {1.0f, -3.0f, NAN, INFINITY, 2.5f, -INFINITY};
    mmoe_tensor_stats s = stats_of(MMOE_DT_F32, f32, 6);
    ck_assert_int_eq(s.n_finite, 3);
    ck_assert_int_eq(s.n_nan, 1);
    ck_assert_int_eq(s.n_inf, 2);
    ck_assert(s.min == -3.0 && s.max == 2.5 && s.absmax == 3.0);
    ck_assert(fabs(s.mean - 0.5 / 3.0) < 1e-15);
    /* BF16 bits: 0x3F80 = 1.0, 0xC040 = -3.0, 0x7FC0 = NaN, 0x0001 = 2^-133 */
    const uint16_t bf16[4] = {0x3F80, 0xC040, 0x7FC0, 0x0001};
    s = stats_of(MMOE_DT_BF16, bf16, 4);
    ck_assert(s.min == -3.0 && s.max == 1.0 && s.absmax == 3.0 && s.n_nan == 1);
    ck_assert(s.mean == (1.0 - 3.0 + ldexp(1.0, -133)) / 3.0);
    /* F16 bits: 1.0, smallest subnormal 2^-24, -65504 (lowest), +Inf, NaN, -0 */
    const uint16_t f16[6] = {0x3C00, 0x0001, 0xFBFF, 0x7C00, 0x7E00, 0x8000};
    s = stats_of(MMOE_DT_F16, f16, 6);
    ck_assert(s.min == -65504.0 && s.max == 1.0 && s.absmax == 65504.0);
    ck_assert(s.n_inf == 1 && s.n_nan == 1 && s.n_finite == 4);
    ck_assert(s.mean == (1.0 + ldexp(1.0, -24) - 65504.0) / 4.0);
    /* integers: extremes of I8, U8; I64 beyond 32 bits */
    const int8_t i8[3] = {-128, 127, 0};
    s = stats_of(MMOE_DT_I8, i8, 3);
    ck_assert(s.min == -128.0 && s.max == 127.0 && s.absmax == 128.0 && s.mean == -1.0 / 3.0);
    const uint8_t u8[2] = {255, 0};
    s = stats_of(MMOE_DT_U8, u8, 2);
    ck_assert(s.min == 0.0 && s.max == 255.0 && s.mean == 127.5);
    const int64_t i64[2] = {-(INT64_C(1) << 40), 5};
    s = stats_of(MMOE_DT_I64, i64, 2);
    ck_assert(s.min == -ldexp(1.0, 40) && s.max == 5.0);
    const int16_t i16[2] = {-32768, 7};
    s = stats_of(MMOE_DT_I16, i16, 2);
    ck_assert(s.min == -32768.0 && s.max == 7.0);
    const int32_t i32[2] = {INT32_MIN, 9};
    s = stats_of(MMOE_DT_I32, i32, 2);
    ck_assert(s.min == (double)INT32_MIN && s.max == 9.0);
    const double f64[2] = {-0.125, 1e300};
    s = stats_of(MMOE_DT_F64, f64, 2);
    ck_assert(s.min == -0.125 && s.max == 1e300);
    /* nothing finite: the range is NaN, never a made-up zero */
    const float nan2[2] = {NAN, INFINITY};
    s = stats_of(MMOE_DT_F32, nan2, 2);
    ck_assert(isnan(s.min) && isnan(s.max) && isnan(s.mean) && isnan(s.absmax));
    /* empty tensor */
    s = stats_of(MMOE_DT_F32, f32, 0);
    ck_assert(s.n_finite == 0 && isnan(s.mean));
    /* E4M3FN (bias 7): 0x38 = 1.0, 0xC0 = -2.0, 0x7E = 448 (max), 0x7F = NaN, 0x01 = 2^-9 */
    const uint8_t e4m3[5] = {0x38, 0xC0, 0x7E, 0x7F, 0x01};
    s = stats_of(MMOE_DT_F8_E4M3, e4m3, 5);
    ck_assert(s.min == -2.0 && s.max == 448.0 && s.n_nan == 1 && s.n_inf == 0);
    ck_assert(s.mean == (1.0 - 2.0 + 448.0 + ldexp(1.0, -9)) / 4.0);
    /* E5M2 (bias 15): 0x3C = 1.0, 0x7B = 57344 (max), 0xFC = -Inf, 0x7E = NaN, 0xC4 = -4.0 */
    const uint8_t e5m2[5] = {0x3C, 0x7B, 0xFC, 0x7E, 0xC4};
    s = stats_of(MMOE_DT_F8_E5M2, e5m2, 5);
    ck_assert(s.min == -4.0 && s.max == 57344.0 && s.n_nan == 1 && s.n_inf == 1);
    /* E8M0: 127 = 1, 130 = 8, 0 = 2^-127, 255 = NaN */
    const uint8_t e8m0[4] = {127, 130, 0, 255};
    s = stats_of(MMOE_DT_F8_E8M0, e8m0, 4);
    ck_assert(s.min == ldexp(1.0, -127) && s.max == 8.0 && s.n_nan == 1);
    /* every dtype is supported; an invalid one is an explicit error */
    for (int d = 0; d < MMOE_DT_COUNT; d++)
        ck_assert(mmoe_tensor_stats_supported((mmoe_dtype)d));
    const uint8_t one[1] = {0};
    mmoe_tensor t = {MMOE_DT_COUNT, 1, {1}, (void *)one, 1};
    mmoe_error err;
    ck_assert_int_eq(mmoe_tensor_stats_compute(&t, &s, &err), MMOE_EUNSUPPORTED);
    t.nbytes = 2; /* inconsistent view */
    t.dtype = MMOE_DT_U8;
    ck_assert_int_eq(mmoe_tensor_stats_compute(&t, &s, &err), MMOE_EINVAL);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Signals, modes and links of outputs                                        */
/* ------------------------------------------------------------------------- */

/** Child of signal_removes_temporaries: start an atomic file and a partial directory, then SIGINT. */
static void interrupted_writer(const char *dir)
{
    mmoe_error err;
    if (mmoe_cleanup_install(&err) != MMOE_OK)
        _exit(10);
    char path[700], part[700], inner[800];
    snprintf(path, sizeof path, "%s/out.safetensors", dir);
    mmoe_atomic_file af;
    if (mmoe_atomic_open(&af, path, &err) != MMOE_OK || mmoe_atomic_write(&af, "12345678", 8, &err) != MMOE_OK)
        _exit(11);
    snprintf(part, sizeof part, "%s/ck.partial-1", dir);
    snprintf(inner, sizeof inner, "%s/model.safetensors", part);
    if (mkdir(part, 0777) != 0)
        _exit(12);
    FILE *f = fopen(inner, "w");
    if (f == NULL || fputs("partial", f) < 0 || fclose(f) != 0)
        _exit(13);
    if (mmoe_cleanup_add(part, MMOE_CLEANUP_DIR) < 0)
        _exit(14);
    raise(SIGINT);
    _exit(15); /* not reached: the handler re-raises with the default action */
}

START_TEST(signal_removes_temporaries)
{
    char dir[512];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0)
        interrupted_writer(dir);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT, "child status 0x%x: not killed by SIGINT",
                  status);
    ck_assert_int_eq(count_dir_entries(dir), 0); /* neither out.safetensors.tmp.* nor ck.partial-1/ */
    mmoe_test_rmtree(dir);
}
END_TEST

START_TEST(truncated_mapping_is_named_not_sigbus)
{
    char dir[512], path[700], errpath[700];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/shrinks.safetensors", dir);
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", dir);
    /* one 1 MiB tensor: most of its pages lie beyond 64 KiB */
    const size_t n = (size_t)1 << 20;
    uint8_t *bytes = calloc(n, 1);
    ck_assert_ptr_nonnull(bytes);
    int64_t shape[1] = {(int64_t)n};
    mmoe_st_writer *w;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_add(w, "big", MMOE_DT_U8, 1, shape, bytes, n, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_finish(w, path, &err), MMOE_OK);
    mmoe_st_writer_destroy(w);
    free(bytes);
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0 || mmoe_cleanup_install(&err) != MMOE_OK)
            _exit(10);
        mmoe_st_file *f;
        if (mmoe_st_open(path, &f, &err) != MMOE_OK || truncate(path, 65536) != 0)
            _exit(11);
        const volatile uint8_t *p = mmoe_st_find(f, "big")->data;
        uint8_t sum = 0;
        for (size_t i = 0; i < n; i += 4096)
            sum = (uint8_t)(sum + p[i]);
        _exit(20 + (sum & 1)); /* not reached: the pages past 64 KiB are gone */
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1, "child status 0x%x: expected exit 1", status);
    size_t len;
    char *msg = (char *)mmoe_test_read_file(errpath, &len);
    char want[800];
    snprintf(want, sizeof want, "megamoe: %s: the file shrank while it was being read (bus error at byte ", path);
    ck_assert_msg(strncmp(msg, want, strlen(want)) == 0, "stderr: %s", msg);
    free(msg);
    mmoe_test_rmtree(dir);
}
END_TEST

START_TEST(outputs_keep_mode_and_links)
{
    char dir[512], path[700], target[700], link_path[700], dangling[700];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    mmoe_error err;
    /* an existing 0600 file stays 0600 (and a new file is not made 0600 by mkstemp habits) */
    snprintf(path, sizeof path, "%s/private.safetensors", dir);
    ck_assert_int_eq(write_small(path, &err), MMOE_OK);
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(write_small(path, &err), MMOE_OK);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_uint_eq(sb.st_mode & 07777, 0600);
    ck_assert_int_eq(chmod(path, 0640), 0);
    ck_assert_int_eq(write_small(path, &err), MMOE_OK);
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_uint_eq(sb.st_mode & 07777, 0640);
    /* a symbolic link is written through: the link stays, its target gets the new bytes */
    snprintf(target, sizeof target, "%s/target.safetensors", dir);
    snprintf(link_path, sizeof link_path, "%s/link.safetensors", dir);
    mmoe_test_write_file(target, "old", 3);
    ck_assert_int_eq(symlink("target.safetensors", link_path), 0);
    ck_assert_int_eq(write_small(link_path, &err), MMOE_OK);
    ck_assert_int_eq(lstat(link_path, &sb), 0);
    ck_assert(S_ISLNK(sb.st_mode));
    ck_assert_int_eq(stat(target, &sb), 0);
    ck_assert_int_gt(sb.st_size, 3);
    mmoe_st_file *f;
    ck_assert_int_eq(mmoe_st_open(target, &f, &err), MMOE_OK);
    ck_assert_ptr_nonnull(mmoe_st_find(f, "w.small"));
    mmoe_st_close(f);
    /* a link to nothing is refused, named, and nothing is created */
    snprintf(dangling, sizeof dangling, "%s/dangling.safetensors", dir);
    ck_assert_int_eq(symlink("nowhere/x.safetensors", dangling), 0);
    ck_assert_int_eq(write_small(dangling, &err), MMOE_EIO);
    ck_assert_msg(strstr(err.msg, "a symbolic link to a file that does not exist") != NULL, "%s", err.msg);
    ck_assert_int_eq(count_dir_entries(dir), 4); /* private, target, link, dangling */
    mmoe_test_rmtree(dir);
}
END_TEST

START_TEST(fifo_and_foreign_files_are_named)
{
    char dir[512], path[700];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/pipe", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    mmoe_st_file *f = NULL;
    mmoe_error err;
    alarm(20); /* an open that waits for a writer would hang here: let the alarm fail the test */
    ck_assert_int_eq(mmoe_st_open(path, &f, &err), MMOE_EIO);
    alarm(0);
    ck_assert_msg(strstr(err.msg, "not a regular file (a FIFO)") != NULL, "%s", err.msg);
    /* a GGUF file: its "header length" is the magic and version, not a length */
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    mmoe_test_write_file(path, "GGUF\x03\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00", 16);
    ck_assert_int_eq(mmoe_st_open(path, &f, &err), MMOE_EFORMAT);
    ck_assert_msg(strstr(err.msg, "not a safetensors file") != NULL && strstr(err.msg, "'GGUF....'") != NULL, "%s",
                  err.msg);
    mmoe_test_rmtree(dir);
}
END_TEST

static Suite *safetensors_suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, round_trip_every_dtype);
    tcase_add_test(tc, streamed_finish_asks_in_data_order);
    tcase_add_test(tc, reads_hand_built_file);
    tcase_add_test(tc, bad_length_field);
    tcase_add_test(tc, bad_text);
    tcase_add_test(tc, bad_entries);
    tcase_add_test(tc, bad_sizes_and_offsets);
    tcase_add_test(tc, writer_rejects_bad_tensors);
    tcase_add_test(tc, atomic_write_failures);
    tcase_add_test(tc, checkpoint_with_index);
    tcase_add_test(tc, checkpoint_layouts);
    tcase_add_test(tc, checkpoint_sharded_writer);
    tcase_add_test(tc, unaligned_tensors_are_copied_aligned);
    tcase_add_test(tc, utf8_vectors);
    tcase_add_test(tc, utf8_put_next_roundtrip);
    tcase_add_test(tc, tensor_stats_hand_values);
    tcase_add_test(tc, signal_removes_temporaries);
    tcase_add_test(tc, truncated_mapping_is_named_not_sigbus);
    tcase_add_test(tc, outputs_keep_mode_and_links);
    tcase_add_test(tc, fifo_and_foreign_files_are_named);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("safetensors");
    return mmoe_test_run(safetensors_suite());
}
