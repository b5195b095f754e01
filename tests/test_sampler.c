/**
 * @file test_sampler.c
 * @brief Suite "sampler": greedy ties, temperature and top-p distributions (chi-square), seeding, errors.
 *
 * Distribution tests draw N tokens and compare the counts with the expected
 * probabilities, computed independently here in float64, by Pearson's chi-square
 * statistic.  The bound is the chi-square quantile with tail probability 1e-6 for
 * the test's degrees of freedom (df 1: 23.93, df 3: 30.66, df 5: 35.89; computed with
 * the regularized incomplete gamma function), so a correct sampler fails a run with
 * probability 1e-6, while a sampler that is off by a few percent in one category
 * fails almost surely at N = 40000.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_sampler.h"
#include "mmoe_test.h"

#define CHI2_DF1_1EM6 23.93
#define CHI2_DF3_1EM6 30.66
#define CHI2_DF5_1EM6 35.89

/** Draw @p n_draws tokens from @p logits and return Pearson's chi-square against @p expect. */
static double chi_square(mmoe_sampler *s, const float *logits, const double *expect, size_t n, int n_draws)
{
    long counts[16] = {0};
    for (int d = 0; d < n_draws; d++) {
        int32_t id = -1;
        ck_assert_int_eq(mmoe_sampler_sample(s, logits, n, &id, NULL), MMOE_OK);
        ck_assert(id >= 0 && (size_t)id < n);
        counts[id]++;
    }
    double chi2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (expect[i] == 0.0) {
            ck_assert_msg(counts[i] == 0, "token %zu has probability 0 but was drawn %ld times", i, counts[i]);
            continue;
        }
        double e = expect[i] * n_draws, diff = (double)counts[i] - e;
        chi2 += diff * diff / e;
    }
    return chi2;
}

START_TEST(greedy)
{
    mmoe_sampler s;
    ck_assert_int_eq(mmoe_sampler_init(&s, 0.0f, 1.0f, 1, NULL), MMOE_OK);
    float logits[6] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, -INFINITY};
    int32_t id = -7;
    ck_assert_int_eq(mmoe_sampler_sample(&s, logits, 6, &id, NULL), MMOE_OK);
    ck_assert_int_eq(id, 1); /* tie between 1 and 3: the lower id */
    float probs[6];
    mmoe_test_poison_f32(probs, 6);
    ck_assert_int_eq(mmoe_sampler_probs(&s, logits, 6, probs, NULL), MMOE_OK);
    for (int i = 0; i < 6; i++)
        ck_assert(probs[i] == (i == 1 ? 1.0f : 0.0f));
    logits[2] = NAN;
    mmoe_error err;
    ck_assert_int_eq(mmoe_sampler_sample(&s, logits, 6, &id, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "logit 2"));
    ck_assert_int_eq(mmoe_sampler_sample(&s, logits, 0, &id, &err), MMOE_EINVAL);
    mmoe_sampler_free(&s);
}
END_TEST

START_TEST(temperature_distribution)
{
    uint64_t seed = mmoe_test_seed("sampler/temperature");
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed);
    /* random logits each run; expected p = softmax(l / T) in float64 */
    const float temps[2] = {1.0f, 0.7f};
    for (int t = 0; t < 2; t++) {
        float logits[6];
        double expect[6], sum = 0.0, mx = -INFINITY;
        for (int i = 0; i < 6; i++) {
            logits[i] = (float)(mmoe_rng_normal(&rng) * 0.8);
            mx = fmax(mx, (double)logits[i]);
        }
        for (int i = 0; i < 6; i++)
            sum += expect[i] = exp(((double)logits[i] - mx) / temps[t]);
        for (int i = 0; i < 6; i++)
            expect[i] /= sum;
        mmoe_sampler s;
        ck_assert_int_eq(mmoe_sampler_init(&s, temps[t], 1.0f, mmoe_rng_u64(&rng), NULL), MMOE_OK);
        /* the probabilities themselves: FP32 softmax, within 1e-6 absolute of float64
           (each term has a few FP32 roundings of relative size 2^-24 and is <= 1) */
        float probs[6];
        mmoe_test_poison_f32(probs, 6);
        ck_assert_int_eq(mmoe_sampler_probs(&s, logits, 6, probs, NULL), MMOE_OK);
        for (int i = 0; i < 6; i++)
            ck_assert_msg(fabs(probs[i] - expect[i]) < 1e-6, "p[%d] = %g, expected %g", i, probs[i], expect[i]);
        double chi2 = chi_square(&s, logits, expect, 6, 40000);
        ck_assert_msg(chi2 < CHI2_DF5_1EM6, "T=%g: chi-square %g >= %g", temps[t], chi2, CHI2_DF5_1EM6);
        mmoe_sampler_free(&s);
    }
}
END_TEST

START_TEST(top_p_distribution)
{
    uint64_t seed = mmoe_test_seed("sampler/top_p");
    /* p = (0.1, 0.4, 0.2, 0.3): sorted 0.4 (id 1), 0.3 (id 3), 0.2, 0.1; with top_p = 0.6 the
       cumulative mass reaches 0.6 at the second one (0.7), so the nucleus is {1, 3},
       renormalized to 4/7 and 3/7 */
    float logits[4] = {logf(0.1f), logf(0.4f), logf(0.2f), logf(0.3f)};
    double expect[4] = {0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0};
    mmoe_sampler s;
    ck_assert_int_eq(mmoe_sampler_init(&s, 1.0f, 0.6f, seed, NULL), MMOE_OK);
    float probs[4];
    mmoe_test_poison_f32(probs, 4);
    ck_assert_int_eq(mmoe_sampler_probs(&s, logits, 4, probs, NULL), MMOE_OK);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(fabs(probs[i] - expect[i]) < 1e-6, "p[%d] = %g, expected %g", i, probs[i], expect[i]);
    double chi2 = chi_square(&s, logits, expect, 4, 40000);
    ck_assert_msg(chi2 < CHI2_DF1_1EM6, "chi-square %g", chi2);
    mmoe_sampler_free(&s);
    /* top_p = 0.95 keeps three tokens: 0.4 + 0.3 + 0.2 = 0.9 < 0.95, + 0.1 reaches it: all four;
       top_p = 0.85 stops at the third: {1, 3, 2} renormalized by 0.9 */
    double expect3[4] = {0.0, 0.4 / 0.9, 0.2 / 0.9, 0.3 / 0.9};
    ck_assert_int_eq(mmoe_sampler_init(&s, 1.0f, 0.85f, seed + 1, NULL), MMOE_OK);
    chi2 = chi_square(&s, logits, expect3, 4, 40000);
    ck_assert_msg(chi2 < CHI2_DF3_1EM6, "chi-square %g", chi2); /* 3 categories: df 2 < df 3 bound, conservative */
    mmoe_sampler_free(&s);
}
END_TEST

START_TEST(seeded_and_errors)
{
    float logits[5] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
    mmoe_sampler a, b;
    ck_assert_int_eq(mmoe_sampler_init(&a, 0.8f, 0.9f, 42, NULL), MMOE_OK);
    ck_assert_int_eq(mmoe_sampler_init(&b, 0.8f, 0.9f, 42, NULL), MMOE_OK);
    for (int i = 0; i < 200; i++) {
        int32_t x, y;
        ck_assert_int_eq(mmoe_sampler_sample(&a, logits, 5, &x, NULL), MMOE_OK);
        ck_assert_int_eq(mmoe_sampler_sample(&b, logits, 5, &y, NULL), MMOE_OK);
        ck_assert_int_eq(x, y);
    }
    mmoe_sampler_free(&a);
    mmoe_sampler_free(&b);
    mmoe_error err;
    ck_assert_int_eq(mmoe_sampler_init(&a, -1.0f, 1.0f, 1, &err), MMOE_ERANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "temperature"));
    ck_assert_int_eq(mmoe_sampler_init(&a, 1.0f, 0.0f, 1, &err), MMOE_ERANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "top_p"));
    ck_assert_int_eq(mmoe_sampler_init(&a, NAN, 1.0f, 1, &err), MMOE_ERANGE);
}
END_TEST

static Suite *sampler_suite(void)
{
    Suite *s = suite_create("sampler");
    TCase *tc = tcase_create("sample");
    tcase_add_test(tc, greedy);
    tcase_add_test(tc, temperature_distribution);
    tcase_add_test(tc, top_p_distribution);
    tcase_add_test(tc, seeded_and_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(sampler_suite());
}
