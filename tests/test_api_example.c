/**
 * @file test_api_example.c
 * @brief Suite "api_example": the README's C API example (examples/moe_layer.c) builds against
 *        the public headers alone and computes the same layer as `megamoe moe`, bit for bit.
 *
 * examples/moe_layer is compiled with only examples/include (a copy of the installed headers
 * under megamoe/) and linked without CUDA or NCCL (examples/examples.am).  Here it runs on a
 * random tiny layer from `megamoe synth-layer`; its `y` must equal the `y` of `megamoe moe` on
 * the same weights and input (the same oracle, so the bits agree; an independent check of the
 * values is the oracle suites' job).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_safetensors.h"
#include "mmoe_test.h"

/** The bytes of tensor "y" of @p path (malloc'd), and their count. */
static void *read_y(const char *path, size_t *n)
{
    mmoe_st_file *f;
    mmoe_error err;
    ck_assert_msg(mmoe_st_open(path, &f, &err) == MMOE_OK, "%s", err.msg);
    const mmoe_tensor *y = mmoe_st_find(f, "y");
    ck_assert_ptr_nonnull(y);
    void *copy = malloc(y->nbytes);
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, y->data, y->nbytes);
    *n = y->nbytes;
    mmoe_st_close(f);
    return copy;
}

START_TEST(example_matches_the_cli)
{
    const char *bin = getenv("MMOE_BIN"), *build = getenv("MMOE_BUILDDIR");
    ck_assert_msg(bin != NULL && build != NULL, "run through make check");
    char dir[512], cmd[4096], a[700], b[700];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    uint64_t seed = mmoe_test_seed("api_example");
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' synth-layer --shape tiny --seed %llu --layer 3 --input-tokens 7 "
             "--out l.safetensors && '%s/examples/moe_layer' tiny l.safetensors 3 l.input.safetensors ya.safetensors && "
             "'%s' moe --weights l.safetensors --input l.input.safetensors --out yb.safetensors --recipe sm100",
             dir, bin, (unsigned long long)seed, build, bin);
    ck_assert_int_eq(mmoe_test_system(cmd), 0);
    snprintf(a, sizeof a, "%s/ya.safetensors", dir);
    snprintf(b, sizeof b, "%s/yb.safetensors", dir);
    size_t na, nb;
    void *ya = read_y(a, &na), *yb = read_y(b, &nb);
    ck_assert_uint_eq(na, (size_t)7 * 256 * 2);
    ck_assert_uint_eq(na, nb);
    ck_assert(memcmp(ya, yb, na) == 0);
    free(ya);
    free(yb);
    mmoe_test_rmtree(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("api_example");
    TCase *tc = tcase_create("example");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, example_matches_the_cli);
    suite_add_tcase(s, tc);
    return mmoe_test_run(s);
}
