/**
 * @file st_test_files.c
 * @brief Whole-file read and write helpers of the safetensors suites (see st_test_files.h).
 */
#include "st_test_files.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

uint8_t *st_test_slurp(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    ck_assert_int_eq(fseek(fp, 0, SEEK_END), 0);
    long len = ftell(fp);
    ck_assert_int_ge(len, 0);
    ck_assert_int_eq(fseek(fp, 0, SEEK_SET), 0);
    uint8_t *buf = malloc((size_t)len + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)len, fp), (size_t)len);
    fclose(fp);
    buf[len] = 0; /* so that text files can be used as strings */
    *n = (size_t)len;
    return buf;
}

void st_test_spill(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_msg(fp != NULL, "cannot create %s", path);
    ck_assert_uint_eq(fwrite(p, 1, n, fp), n);
    ck_assert_int_eq(fclose(fp), 0);
}
