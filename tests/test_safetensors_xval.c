/**
 * @file test_safetensors_xval.c
 * @brief Suite "safetensors_xval": files of the Python `safetensors` package and ours, both ways.
 *
 * The independent implementation is the `safetensors` package (PyPI), driven
 * by tests/xval/safetensors_xval.py:
 * - Python writes a file with random tensors of every dtype plus each
 *   tensor's raw bytes in a side file; the C reader must see the same names,
 *   dtypes, shapes, bytes and metadata;
 * - the C writer writes a file plus the same kind of manifest; Python must
 *   read it back identically (and finds the header padded and every tensor
 *   aligned).
 * The whole suite is skipped (exit 77) without python3, numpy or safetensors.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_safetensors.h"
#include "mmoe_test.h"
#include "st_test_files.h"

static uint64_t g_seed;

/** Run the Python script with @p args; returns its exit status. */
static int run_xval(const char *args)
{
    const char *builddir = getenv("MMOE_BUILDDIR");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "sh '%s/tests/xval/run-xval.sh' safetensors_xval.py %s",
             builddir ? builddir : ".", args);
    return mmoe_test_system(cmd);
}

START_TEST(python_writes_c_reads)
{
    char dir[512], args[1024], path[700];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "write '%s' %llu", dir, (unsigned long long)(g_seed % 1000000007u));
    ck_assert_int_eq(run_xval(args), 0);
    snprintf(path, sizeof path, "%s/py_manifest.json", dir);
    json_error_t jerr;
    json_t *manifest = json_load_file(path, 0, &jerr);
    ck_assert_msg(manifest != NULL, "%s", jerr.text);
    json_t *tensors = json_object_get(manifest, "tensors");
    snprintf(path, sizeof path, "%s/py.safetensors", dir);
    mmoe_st_file *f;
    mmoe_error err;
    ck_assert_msg(mmoe_st_open(path, &f, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_uint_eq(mmoe_st_count(f), json_array_size(tensors));
    ck_assert_uint_ge(json_array_size(tensors), 24); /* at least the numpy dtypes, 3 each */
    size_t i;
    json_t *m;
    json_array_foreach(tensors, i, m)
    {
        const char *name = json_string_value(json_object_get(m, "name"));
        const mmoe_tensor *t = mmoe_st_find(f, name);
        ck_assert_msg(t != NULL, "tensor %s missing", name);
        ck_assert_str_eq(mmoe_dtype_name(t->dtype), json_string_value(json_object_get(m, "dtype")));
        json_t *shape = json_object_get(m, "shape");
        ck_assert_int_eq(t->ndim, (int)json_array_size(shape));
        for (int d = 0; d < t->ndim; d++)
            ck_assert_int_eq(t->shape[d], json_integer_value(json_array_get(shape, (size_t)d)));
        char bin[800];
        snprintf(bin, sizeof bin, "%s/%s", dir, json_string_value(json_object_get(m, "bin")));
        size_t n;
        uint8_t *want = st_test_slurp(bin, &n);
        ck_assert_uint_eq(t->nbytes, n);
        ck_assert_msg(n == 0 || memcmp(t->data, want, n) == 0, "tensor %s: bytes differ", name);
        free(want);
    }
    json_t *meta = json_object_get(manifest, "metadata");
    ck_assert_uint_eq(mmoe_st_metadata_count(f), json_object_size(meta));
    const char *key;
    json_t *value;
    json_object_foreach(meta, key, value)
        ck_assert_str_eq(mmoe_st_metadata(f, key), json_string_value(value));
    mmoe_st_close(f);
    json_decref(manifest);
    mmoe_test_rmtree(dir);
}
END_TEST

START_TEST(c_writes_python_reads)
{
    char dir[512], path[700], mpath[700], args[1600];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 0xc0ffee);
    mmoe_st_writer *w;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    json_t *manifest = json_object(), *list = json_array();
    enum { N = 3 * MMOE_DT_COUNT };
    uint8_t *bufs[N];
    for (int i = 0; i < N; i++) {
        mmoe_dtype dt = (mmoe_dtype)(i % MMOE_DT_COUNT);
        int ndim = (int)mmoe_rng_below(&rng, 4);
        int64_t shape[MMOE_MAX_DIMS];
        json_t *jshape = json_array();
        size_t numel = 1;
        for (int d = 0; d < ndim; d++) {
            shape[d] = mmoe_rng_below(&rng, 10) ? 1 + (int64_t)mmoe_rng_below(&rng, 6) : 0;
            numel *= (size_t)shape[d];
            json_array_append_new(jshape, json_integer(shape[d]));
        }
        size_t nbytes = numel * mmoe_dtype_size(dt);
        bufs[i] = malloc(nbytes + 1);
        for (size_t k = 0; k < nbytes; k++)
            bufs[i][k] = (uint8_t)mmoe_rng_u32(&rng);
        char name[64], bin[32], binpath[800];
        snprintf(name, sizeof name, "c.%d.%s.weight", i, mmoe_dtype_name(dt));
        snprintf(bin, sizeof bin, "c_%d.bin", i);
        snprintf(binpath, sizeof binpath, "%s/%s", dir, bin);
        FILE *fp = fopen(binpath, "wb");
        ck_assert_ptr_nonnull(fp);
        ck_assert_uint_eq(fwrite(bufs[i], 1, nbytes, fp), nbytes);
        fclose(fp);
        ck_assert_int_eq(mmoe_st_writer_add(w, name, dt, ndim, shape, bufs[i], nbytes, &err),
                         MMOE_OK);
        json_array_append_new(list, json_pack("{s:s, s:s, s:o, s:s}", "name", name, "dtype",
                                              mmoe_dtype_name(dt), "shape", jshape, "bin", bin));
    }
    ck_assert_int_eq(mmoe_st_writer_set_metadata(w, "format", "pt", &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_set_metadata(w, "writer", "megamoe \xe2\x9c\x93", &err),
                     MMOE_OK);
    json_object_set_new(manifest, "tensors", list);
    json_object_set_new(manifest, "metadata",
                        json_pack("{s:s, s:s}", "format", "pt", "writer", "megamoe \xe2\x9c\x93"));
    snprintf(mpath, sizeof mpath, "%s/c_manifest.json", dir);
    ck_assert_int_eq(json_dump_file(manifest, mpath, 0), 0);
    json_decref(manifest);
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    ck_assert_msg(mmoe_st_writer_finish(w, path, &err) == MMOE_OK, "%s", err.msg);
    mmoe_st_writer_destroy(w);
    for (int i = 0; i < N; i++)
        free(bufs[i]);
    snprintf(args, sizeof args, "check '%s' '%s'", path, mpath);
    ck_assert_int_eq(run_xval(args), 0);
    mmoe_test_rmtree(dir);
}
END_TEST

static Suite *xval_suite(void)
{
    Suite *s = suite_create("safetensors_xval");
    TCase *tc = tcase_create("python");
    tcase_add_test(tc, python_writes_c_reads);
    tcase_add_test(tc, c_writes_python_reads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int probe = run_xval("probe");
    if (probe == MMOE_TEST_SKIP) {
        fprintf(stderr, "safetensors_xval: SKIP (python3, numpy or safetensors missing)\n");
        return MMOE_TEST_SKIP;
    }
    if (probe != 0) {
        fprintf(stderr, "safetensors_xval: the Python probe failed with status %d\n", probe);
        return EXIT_FAILURE;
    }
    g_seed = mmoe_test_seed("safetensors_xval");
    return mmoe_test_run(xval_suite());
}
