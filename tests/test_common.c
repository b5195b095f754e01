/**
 * @file test_common.c
 * @brief Suite "common": error messages, dtype table, shape checks, the RNG and its normal table.
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
    /* the 2-D view constructor gives the same view as the literal above; its bytes from the dtype */
    const mmoe_tensor v = mmoe_tensor_view2(MMOE_DT_F32, 2, 3, data);
    ck_assert_int_eq(mmoe_tensor_expect(&v, "v", MMOE_DT_F32, 2, ok_shape, &err), MMOE_OK);
    ck_assert_ptr_eq(v.data, data);
    ck_assert_uint_eq(v.nbytes, sizeof data);
    ck_assert_uint_eq(mmoe_tensor_view2(MMOE_DT_BF16, 4, 5, data).nbytes, 40);
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

/*
 * Acklam's quantile has a relative error below 1.15e-9 in x; Phi moves by phi(x) * dx, so
 * |Phi(x) - p| <= QUANTILE_REL_TOL * phi(x) * |x| (with margin), plus the rounding of erfc
 * (a few ulps of p, bounded by QUANTILE_ABS_TOL).
 */
#define QUANTILE_REL_TOL 4e-9
#define QUANTILE_ABS_TOL 1e-15

/* The quantile against libm's erfc: Phi(x) = erfc(-x / sqrt 2) / 2 (an independent oracle). */
START_TEST(normal_quantile_inverts_phi)
{
    static const double tails[] = {1e-12, 1e-9, 1e-6, 1e-4, 1e-3, 0.01, 0.02, 0.0242, 0.02425, 0.0243};
    double ps[64];
    int n = 0;
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        ps[n++] = tails[i];
        ps[n++] = 1 - tails[i];
    }
    for (int i = 1; i < 20; i++)
        ps[n++] = 0.05 * i;
    for (int i = 0; i < n; i++) {
        double p = ps[i], x = mmoe_normal_quantile(p);
        double phi = exp(-0.5 * x * x) / sqrt(6.283185307179586);
        double cdf = 0.5 * erfc(-x / sqrt(2.0));
        double tol = QUANTILE_REL_TOL * phi * fabs(x) + QUANTILE_ABS_TOL + 1e-13 * fmin(p, 1 - p);
        ck_assert_msg(fabs(cdf - p) <= tol, "p = %.17g: x = %.17g, Phi(x) = %.17g (tol %g)", p, x, cdf, tol);
    }
    ck_assert(mmoe_normal_quantile(0.5) == 0.0);
    ck_assert(mmoe_normal_quantile(0x1p-20) == -mmoe_normal_quantile(1 - 0x1p-20)); /* both p exact */
}
END_TEST

START_TEST(normal_table_quantiles_and_draws)
{
    mmoe_normal_table *t = malloc(sizeof *t);
    ck_assert_ptr_nonnull(t);
    mmoe_test_poison_f32(t->v, MMOE_NORMAL_TABLE_SIZE);
    mmoe_normal_table_fill_quantiles(t);
    /* increasing, exactly odd (p_i and 1 - p_i are both exact), variance ~1: the tails past
     * 4.3 sigma hold ~3.4e-4 of it, the midpoint rule moves it by far less */
    double sum2 = 0;
    for (int i = 0; i < MMOE_NORMAL_TABLE_SIZE; i++) {
        ck_assert(isfinite(t->v[i]));
        if (i > 0)
            ck_assert_float_gt(t->v[i], t->v[i - 1]);
        ck_assert_float_eq(t->v[i], -t->v[MMOE_NORMAL_TABLE_SIZE - 1 - i]);
        sum2 += (double)t->v[i] * t->v[i];
    }
    ck_assert_double_lt(fabs(sum2 / MMOE_NORMAL_TABLE_SIZE - 1.0), 2e-3);
    ck_assert_double_lt(t->v[MMOE_NORMAL_TABLE_SIZE - 1], 4.4);
    ck_assert_double_gt(t->v[MMOE_NORMAL_TABLE_SIZE - 1], 4.2);

    /* the random table is the generator's Box-Muller sequence, in order */
    uint64_t seed = mmoe_test_seed("common/normal_table");
    mmoe_rng a, b;
    mmoe_rng_seed(&a, seed);
    mmoe_rng_seed(&b, seed);
    mmoe_test_poison_f32(t->v, MMOE_NORMAL_TABLE_SIZE);
    mmoe_normal_table_fill_random(t, &a);
    double sum = 0;
    sum2 = 0;
    for (int i = 0; i < MMOE_NORMAL_TABLE_SIZE; i++) {
        ck_assert_float_eq(t->v[i], (float)mmoe_rng_normal(&b));
        sum += t->v[i];
        sum2 += (double)t->v[i] * t->v[i];
    }
    /* n = 65536: se(mean) ~ 0.004, se(var) ~ 0.0055; bounds are > 5 se */
    ck_assert_double_lt(fabs(sum / MMOE_NORMAL_TABLE_SIZE), 0.03);
    ck_assert_double_lt(fabs(sum2 / MMOE_NORMAL_TABLE_SIZE - 1.0), 0.04);

    /* a draw is the entry at the low 16 bits of one 32-bit step */
    for (int i = 0; i < 1000; i++) {
        uint32_t bits = mmoe_rng_u32(&b);
        ck_assert_float_eq(mmoe_normal_table_draw(t, &a), t->v[bits & 0xFFFFu]);
    }
    free(t);
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
    tcase_add_test(tc, normal_quantile_inverts_phi);
    tcase_add_test(tc, normal_table_quantiles_and_draws);
    tcase_add_test(tc, ulp_distance);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(common_suite());
}
