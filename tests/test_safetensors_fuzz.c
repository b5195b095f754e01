/**
 * @file test_safetensors_fuzz.c
 * @brief Suite "safetensors_fuzz": random mutations of valid files must fail cleanly or read safely.
 *
 * Valid files from the writer are mutated at random (seeded, the seed is
 * printed) by a mix of edits that aim at each layer of the format:
 *
 * - bit flips anywhere (mostly in the header);
 * - truncation to a random length, or appended garbage;
 * - header byte edits with JSON-significant characters (quotes, braces,
 *   digits, '-', '.', 'e') and bytes that break UTF-8;
 * - digit edits inside the header (these reach shapes and data_offsets and
 *   produce overlaps, holes, and size mismatches);
 * - edits of the 8-byte length field (off by a little, zero, huge).
 *
 * Each mutant is parsed from an exactly-sized heap buffer (so ASan sees any
 * read past the end), every 8th also through a real file (mmap path).  The
 * reader must either return an error with a message, or a result whose every
 * view lies inside the data section, has nbytes = numel * dtype size, does
 * not overlap another view, and can be read in full.
 * The index of a checkpoint is mutated the same way (text edits only).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_safetensors.h"
#include "mmoe_test.h"

/** Number of mutated files per base file. */
#define FUZZ_CASES_PER_BASE 4000
/** Number of mutated index files. */
#define FUZZ_INDEX_CASES 300

static uint64_t g_seed;

/** Write a valid base file with @p n_tensors random tensors of mixed dtypes. */
static void make_base(mmoe_rng *rng, const char *path, int n_tensors, int with_meta)
{
    mmoe_st_writer *w;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    uint8_t *bufs[32];
    ck_assert_int_le(n_tensors, 32);
    for (int i = 0; i < n_tensors; i++) {
        mmoe_dtype dt = (mmoe_dtype)mmoe_rng_below(rng, MMOE_DT_COUNT);
        int ndim = (int)mmoe_rng_below(rng, 4);
        int64_t shape[MMOE_MAX_DIMS];
        size_t numel = 1;
        for (int d = 0; d < ndim; d++) {
            shape[d] = (int64_t)mmoe_rng_below(rng, 6);
            numel *= (size_t)shape[d];
        }
        size_t nbytes = numel * mmoe_dtype_size(dt);
        bufs[i] = malloc(nbytes + 1);
        for (size_t k = 0; k < nbytes; k++)
            bufs[i][k] = (uint8_t)mmoe_rng_u32(rng);
        char name[64];
        snprintf(name, sizeof name, "layers.%d.w%d.weight", i, (int)mmoe_rng_below(rng, 100));
        ck_assert_int_eq(mmoe_st_writer_add(w, name, dt, ndim, shape, bufs[i], nbytes, &err),
                         MMOE_OK);
    }
    if (with_meta)
        ck_assert_int_eq(mmoe_st_writer_set_metadata(w, "format", "pt", &err), MMOE_OK);
    ck_assert_msg(mmoe_st_writer_finish(w, path, &err) == MMOE_OK, "%s", err.msg);
    mmoe_st_writer_destroy(w);
    for (int i = 0; i < n_tensors; i++)
        free(bufs[i]);
}

static const char fuzz_chars[] = "\"{}[],:-.e0123456789 \\\xff\xc3\x80";

/** Apply one random mutation to @p buf (length *len, capacity cap). */
static void mutate(mmoe_rng *rng, uint8_t *buf, size_t *len, size_t cap)
{
    size_t n = *len;
    uint64_t header_len = 0;
    for (int i = 7; i >= 0 && n >= 8; i--)
        header_len = (header_len << 8) | buf[i];
    /* a position inside the header when there is one, else anywhere */
    size_t hdr_end = n >= 8 && header_len <= n - 8 ? 8 + (size_t)header_len : n;
    size_t pos_any = n ? (size_t)mmoe_rng_below(rng, n) : 0;
    size_t pos_hdr = hdr_end > 8 ? 8 + (size_t)mmoe_rng_below(rng, hdr_end - 8) : pos_any;
    switch (mmoe_rng_below(rng, 7)) {
    case 0: /* bit flip anywhere */
        if (n)
            buf[pos_any] ^= (uint8_t)(1u << mmoe_rng_below(rng, 8));
        break;
    case 1: /* bit flip in the header */
        if (n)
            buf[pos_hdr] ^= (uint8_t)(1u << mmoe_rng_below(rng, 8));
        break;
    case 2: /* truncate */
        *len = n ? (size_t)mmoe_rng_below(rng, n) : 0;
        break;
    case 3: /* append garbage */
        while (*len < cap && mmoe_rng_below(rng, 4) != 0)
            buf[(*len)++] = (uint8_t)mmoe_rng_u32(rng);
        break;
    case 4: /* JSON-significant byte in the header */
        if (n)
            buf[pos_hdr] = (uint8_t)fuzz_chars[mmoe_rng_below(rng, sizeof fuzz_chars - 1)];
        break;
    case 5: { /* nudge a digit in the header (shapes, offsets) */
        for (size_t k = 0; k < 16 && n; k++) {
            size_t p = hdr_end > 8 ? 8 + (size_t)mmoe_rng_below(rng, hdr_end - 8) : pos_any;
            if (buf[p] >= '0' && buf[p] <= '9') {
                buf[p] = (uint8_t)('0' + mmoe_rng_below(rng, 10));
                break;
            }
        }
        break;
    }
    default: { /* edit the length field */
        uint64_t v;
        switch (mmoe_rng_below(rng, 4)) {
        case 0: v = header_len + mmoe_rng_below(rng, 17) - 8; break;
        case 1: v = 0; break;
        case 2: v = mmoe_rng_u64(rng); break;
        default: v = n; break;
        }
        for (int i = 0; i < 8 && (size_t)i < n; i++)
            buf[i] = (uint8_t)(v >> (8 * i));
        break;
    }
    }
}

/**
 * On success, check every invariant the reader promises.  @p img holds the file's bytes;
 * @p views is where the reader's views of aligned tensors point (@p img for an image read from
 * memory, the mapping for a file; NULL: unknown, not checked).
 */
static void check_result(const mmoe_st_file *f, const uint8_t *img, size_t size, const uint8_t *views)
{
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--)
        header_len = (header_len << 8) | img[i];
    const uint8_t *data_lo = img + 8 + header_len, *data_hi = img + size;
    ck_assert_uint_eq(mmoe_st_file_size(f), size);
    uint64_t covered = 0;
    unsigned sink = 0;
    for (size_t i = 0; i < mmoe_st_count(f); i++) {
        const mmoe_st_entry *e = mmoe_st_get(f, i);
        /* the tensor's bytes in the file; a view not aligned to its dtype there is an aligned
         * copy of exactly those bytes (mmoe_st_entry::realigned), any other view points at them */
        ck_assert_uint_le(e->file_offset, (uint64_t)size);
        const uint8_t *p = img + e->file_offset;
        ck_assert(p >= data_lo && p <= data_hi);
        ck_assert_uint_le(e->view.nbytes, (size_t)(data_hi - p));
        ck_assert_uint_eq((uint64_t)mmoe_tensor_numel(&e->view) * mmoe_dtype_size(e->view.dtype),
                          e->view.nbytes);
        if (e->realigned) {
            ck_assert(e->view.data != p);
            ck_assert((uintptr_t)e->view.data % mmoe_dtype_size(e->view.dtype) == 0);
            ck_assert_int_eq(memcmp(e->view.data, p, e->view.nbytes), 0);
        } else if (views) {
            ck_assert_ptr_eq(e->view.data, views + e->file_offset);
        }
        for (size_t k = 0; k < e->view.nbytes; k++)
            sink += p[k];
        if (i > 0)
            ck_assert_int_lt(strcmp(mmoe_st_get(f, i - 1)->name, e->name), 0);
        ck_assert_ptr_eq(mmoe_st_find_entry(f, e->name), e);
        covered += e->view.nbytes;
    }
    /* the views tile the data section, so their sizes add up to it */
    ck_assert_uint_eq(covered, (uint64_t)(data_hi - data_lo));
    (void)sink;
}

START_TEST(fuzz_mutated_files)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed);
    char dir[512], path[600], mpath[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(mpath, sizeof mpath, "%s/mutant.safetensors", dir);
    int n_ok = 0, n_err = 0;
    for (int base = 0; base < 3; base++) {
        snprintf(path, sizeof path, "%s/base%d.safetensors", dir, base);
        make_base(&rng, path, base == 0 ? 1 : base == 1 ? 6 : 20, base != 0);
        size_t base_len;
        uint8_t *orig = mmoe_test_read_file(path, &base_len);
        size_t cap = base_len + 64;
        uint8_t *work = malloc(cap);
        for (int c = 0; c < FUZZ_CASES_PER_BASE; c++) {
            size_t len = base_len;
            memcpy(work, orig, base_len);
            int n_mut = 1 + (int)mmoe_rng_below(&rng, 3);
            for (int m = 0; m < n_mut; m++)
                mutate(&rng, work, &len, cap);
            /* an exactly-sized copy, so that reading past the end is an ASan error */
            uint8_t *img = malloc(len ? len : 1);
            memcpy(img, work, len);
            mmoe_st_file *f = NULL;
            mmoe_error err;
            mmoe_error_clear(&err);
            mmoe_status st = mmoe_st_open_memory(img, len, "mutant", &f, &err);
            if (st == MMOE_OK) {
                check_result(f, img, len, img);
                mmoe_st_close(f);
                n_ok++;
            } else {
                ck_assert_ptr_null(f);
                ck_assert_int_eq(err.code, st);
                ck_assert(st == MMOE_EFORMAT || st == MMOE_EUNSUPPORTED);
                ck_assert(strstr(err.msg, "mutant") != NULL);
                n_err++;
            }
            if (c % 8 == 0) { /* the mmap path agrees */
                mmoe_test_write_file(mpath, img, len);
                mmoe_status st2 = mmoe_st_open(mpath, &f, &err);
                ck_assert_int_eq(st2, st);
                if (st2 == MMOE_OK) {
                    /* aligned views point into the mapping now: find its base from one of them */
                    const uint8_t *mapping = NULL;
                    for (size_t i = 0; i < mmoe_st_count(f) && !mapping; i++)
                        if (!mmoe_st_get(f, i)->realigned)
                            mapping = (const uint8_t *)mmoe_st_get(f, i)->view.data - mmoe_st_get(f, i)->file_offset;
                    check_result(f, img, len, mapping);
                    mmoe_st_close(f);
                }
            }
            free(img);
        }
        free(work);
        free(orig);
    }
    fprintf(stderr, "safetensors_fuzz: %d mutants read as valid, %d rejected\n", n_ok, n_err);
    /* the mutations are strong enough to break most files, weak enough to leave some valid */
    ck_assert_int_gt(n_err, n_ok);
    ck_assert_int_gt(n_ok, 0);
    mmoe_test_rmtree(dir);
}
END_TEST

START_TEST(fuzz_mutated_index)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 0x5eed);
    char dir[512], path[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    make_base(&rng, path, 3, 0);
    mmoe_st_file *a;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_open(path, &a, &err), MMOE_OK);
    const char *names[3], *files[3] = {"a.safetensors", "a.safetensors", "a.safetensors"};
    for (int i = 0; i < 3; i++)
        names[i] = mmoe_st_get(a, (size_t)i)->name;
    snprintf(path, sizeof path, "%s/%s", dir, MMOE_ST_INDEX_NAME);
    ck_assert_int_eq(mmoe_st_write_index(path, 3, names, files, 0, &err), MMOE_OK);
    mmoe_st_close(a);
    size_t base_len;
    uint8_t *orig = mmoe_test_read_file(path, &base_len);
    uint8_t *work = malloc(base_len + 64);
    int n_ok = 0;
    for (int c = 0; c < FUZZ_INDEX_CASES; c++) {
        size_t len = base_len;
        memcpy(work, orig, base_len);
        for (int m = 0; m < 2; m++) {
            size_t p = (size_t)mmoe_rng_below(&rng, len);
            if (mmoe_rng_below(&rng, 2))
                work[p] = (uint8_t)fuzz_chars[mmoe_rng_below(&rng, sizeof fuzz_chars - 1)];
            else
                work[p] ^= (uint8_t)(1u << mmoe_rng_below(&rng, 8));
        }
        mmoe_test_write_file(path, work, len);
        mmoe_ckpt *ck = NULL;
        mmoe_status st = mmoe_ckpt_open(dir, &ck, &err);
        if (st == MMOE_OK) {
            for (size_t i = 0; i < mmoe_ckpt_count(ck); i++)
                ck_assert_ptr_nonnull(mmoe_ckpt_find(ck, mmoe_ckpt_get(ck, i)->name));
            mmoe_ckpt_close(ck);
            n_ok++;
        } else {
            ck_assert_ptr_null(ck);
            ck_assert(err.msg[0] != '\0');
        }
    }
    fprintf(stderr, "safetensors_fuzz: %d index mutants accepted of %d\n", n_ok,
            FUZZ_INDEX_CASES);
    free(work);
    free(orig);
    mmoe_test_rmtree(dir);
}
END_TEST

static Suite *fuzz_suite(void)
{
    Suite *s = suite_create("safetensors_fuzz");
    TCase *tc = tcase_create("fuzz");
    /* about 1-5 s here; Check's default limit of 4 s is too tight on a loaded or sanitized run */
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, fuzz_mutated_files);
    tcase_add_test(tc, fuzz_mutated_index);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("safetensors_fuzz");
    return mmoe_test_run(fuzz_suite());
}
