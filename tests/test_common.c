/**
 * @file test_common.c
 * @brief Suite "common": error messages, dtype table, shape checks, the RNG.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_error.h"
#include "mmoe_rng.h"
#include "mmoe_tensor.h"
#include "mmoe_test.h"

START_TEST(error_set_and_prefix)
{
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(err.code, MMOE_OK);
    ck_assert_int_eq(mmoe_error_set(&err, MMOE_ESHAPE, "tensor '%s' bad", "w1"), MMOE_ESHAPE);
    ck_assert_str_eq(err.msg, "tensor 'w1' bad");
    mmoe_error_prefix(&err, "layer %d: ", 3);
    ck_assert_str_eq(err.msg, "layer 3: tensor 'w1' bad");
    ck_assert_int_eq(err.code, MMOE_ESHAPE);
    ck_assert_str_eq(mmoe_status_name(MMOE_EDTYPE), "MMOE_EDTYPE");
    /* a message longer than the buffer is truncated, not overflowed */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    mmoe_error_set(&err, MMOE_EINVAL, "%s", big);
    ck_assert_uint_eq(strlen(err.msg), MMOE_ERROR_MSG_LEN - 1);
    ck_assert_int_eq(mmoe_error_set(NULL, MMOE_EIO, "ignored"), MMOE_EIO);
}
END_TEST

START_TEST(dtype_table)
{
    /* sizes from the safetensors format description */
    static const struct { const char *name; size_t size; } want[] = {
        {"BF16", 2}, {"F16", 2}, {"F32", 4}, {"F64", 8}, {"I8", 1}, {"U8", 1},
        {"I16", 2}, {"I32", 4}, {"I64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        mmoe_dtype dt;
        ck_assert_int_eq(mmoe_dtype_from_name(want[i].name, &dt), MMOE_OK);
        ck_assert_uint_eq(mmoe_dtype_size(dt), want[i].size);
        ck_assert_str_eq(mmoe_dtype_name(dt), want[i].name);
    }
    mmoe_dtype dt;
    ck_assert_int_eq(mmoe_dtype_from_name("F4", &dt), MMOE_EFORMAT);
    ck_assert_uint_eq(mmoe_dtype_size(MMOE_DT_COUNT), 0);
}
END_TEST

START_TEST(tensor_expect_messages)
{
    float data[6] = {1, 2, 3, 4, 5, 6};
    mmoe_tensor t = {MMOE_DT_F32, 2, {2, 3}, data, sizeof data};
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_tensor_numel(&t), 6);
    int64_t ok_shape[2] = {2, 3}, bad_shape[2] = {3, 2};
    ck_assert_int_eq(mmoe_tensor_expect(&t, "x", MMOE_DT_F32, 2, ok_shape, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_tensor_expect(&t, "x", MMOE_DT_F32, 2, bad_shape, &err), MMOE_ESHAPE);
    ck_assert_str_eq(err.msg, "tensor 'x': expected shape [3, 2], found [2, 3]");
    ck_assert_int_eq(mmoe_tensor_expect(&t, "x", MMOE_DT_BF16, 2, ok_shape, &err), MMOE_EDTYPE);
    ck_assert_str_eq(err.msg, "tensor 'x': expected dtype BF16, found F32");
}
END_TEST

START_TEST(rng_reproducible_and_uniform)
{
    uint64_t seed = mmoe_test_seed("common/rng");
    mmoe_rng a, b;
    mmoe_rng_seed(&a, seed);
    mmoe_rng_seed(&b, seed);
    for (int i = 0; i < 1000; i++)
        ck_assert_uint_eq(mmoe_rng_u64(&a), mmoe_rng_u64(&b));
    /* below(n) stays in range and hits every residue of a small n */
    int seen[7] = {0};
    for (int i = 0; i < 7000; i++) {
        uint64_t r = mmoe_rng_below(&a, 7);
        ck_assert_uint_lt(r, 7);
        seen[r]++;
    }
    for (int i = 0; i < 7; i++)
        ck_assert_int_gt(seen[i], 800); /* expected 1000, sd ~29: 800 is > 6 sd away */
    /* mean and variance of the normal deviate: n = 200000, se(mean) ~ 0.0022 */
    double sum = 0, sum2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double z = mmoe_rng_normal(&a);
        sum += z;
        sum2 += z * z;
    }
    ck_assert_double_lt(fabs(sum / n), 0.02);
    ck_assert_double_lt(fabs(sum2 / n - 1.0), 0.03);
}
END_TEST

START_TEST(ulp_distance)
{
    ck_assert_uint_eq(mmoe_test_ulp_f32(1.0f, nextafterf(1.0f, 2.0f)), 1);
    ck_assert_uint_eq(mmoe_test_ulp_f32(0.0f, -0.0f), 0);
    ck_assert_uint_eq(mmoe_test_ulp_f32(-0x1p-149f, 0x1p-149f), 2);
    ck_assert_uint_eq(mmoe_test_ulp_f32(NAN, 1.0f), UINT32_MAX);
}
END_TEST

static Suite *common_suite(void)
{
    Suite *s = suite_create("common");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, error_set_and_prefix);
    tcase_add_test(tc, dtype_table);
    tcase_add_test(tc, tensor_expect_messages);
    tcase_add_test(tc, rng_reproducible_and_uniform);
    tcase_add_test(tc, ulp_distance);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(common_suite());
}
