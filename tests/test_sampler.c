/**
 * @file test_sampler.c
 * @brief Suite "sampler": greedy ties, temperature, top-p, top-k, min-p and repetition-penalty
 * distributions (chi-square), log-probabilities, seeding, errors.
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

/** Sampler with every parameter; asserts success. */
static void init_full(mmoe_sampler *s, float t, float top_p, int32_t top_k, float min_p, float penalty, uint64_t seed)
{
    mmoe_sampler_params p;
    mmoe_sampler_params_default(&p);
    p.temperature = t;
    p.top_p = top_p;
    p.top_k = top_k;
    p.min_p = min_p;
    p.repeat_penalty = penalty;
    p.seed = seed;
    mmoe_error err = {0};
    ck_assert_msg(mmoe_sampler_init_params(s, &p, &err) == MMOE_OK, "%s", err.msg);
}

/** mmoe_sampler_probs() within 1e-6 of @p expect (float64, derived by hand in the caller). */
static void assert_probs(mmoe_sampler *s, const float *logits, const double *expect, size_t n)
{
    float probs[8];
    mmoe_test_poison_f32(probs, n);
    ck_assert_int_eq(mmoe_sampler_probs(s, logits, n, probs, NULL), MMOE_OK);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabs(probs[i] - expect[i]) < 1e-6, "p[%zu] = %.9g, expected %.9g", i, probs[i], expect[i]);
}

START_TEST(top_k_distribution)
{
    uint64_t seed = mmoe_test_seed("sampler/top_k");
    /* p = (0.1, 0.4, 0.2, 0.3) at T = 1: the two most probable are ids 1 and 3, renormalized
       by 0.7 to 4/7 and 3/7; k = 3 adds id 2: (0.4, 0.2, 0.3) / 0.9 */
    float logits[4] = {logf(0.1f), logf(0.4f), logf(0.2f), logf(0.3f)};
    double expect2[4] = {0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0};
    double expect3[4] = {0.0, 0.4 / 0.9, 0.2 / 0.9, 0.3 / 0.9};
    mmoe_sampler s;
    init_full(&s, 1.0f, 1.0f, 2, 0.0f, 1.0f, seed);
    assert_probs(&s, logits, expect2, 4);
    double chi2 = chi_square(&s, logits, expect2, 4, 40000);
    ck_assert_msg(chi2 < CHI2_DF1_1EM6, "k=2: chi-square %g", chi2);
    mmoe_sampler_free(&s);
    init_full(&s, 1.0f, 1.0f, 3, 0.0f, 1.0f, seed + 1);
    assert_probs(&s, logits, expect3, 4);
    chi2 = chi_square(&s, logits, expect3, 4, 40000);
    ck_assert_msg(chi2 < CHI2_DF3_1EM6, "k=3: chi-square %g", chi2);
    mmoe_sampler_free(&s);
    /* ties: logits (1, 2, 2, 0) with k = 2 keep ids 1 and 2 at 1/2 each; k >= n is no cut */
    float tied[4] = {1.0f, 2.0f, 2.0f, 0.0f};
    double expect_tie[4] = {0.0, 0.5, 0.5, 0.0};
    init_full(&s, 1.0f, 1.0f, 2, 0.0f, 1.0f, seed);
    assert_probs(&s, tied, expect_tie, 4);
    mmoe_sampler_free(&s);
    /* k = 1 is greedy whatever the temperature */
    init_full(&s, 5.0f, 1.0f, 1, 0.0f, 1.0f, seed);
    for (int d = 0; d < 50; d++) {
        int32_t id;
        ck_assert_int_eq(mmoe_sampler_sample(&s, logits, 4, &id, NULL), MMOE_OK);
        ck_assert_int_eq(id, 1);
    }
    mmoe_sampler_free(&s);
}
END_TEST

START_TEST(top_k_then_top_p)
{
    /* p = (0.1, 0.4, 0.2, 0.3); k = 3 gives (0, 4/9, 2/9, 3/9); top-p 0.7 on that: 4/9 = 0.444 < 0.7,
       + 3/9 = 0.778 >= 0.7: nucleus {1, 3}, renormalized to 4/7, 3/7 */
    float logits[4] = {logf(0.1f), logf(0.4f), logf(0.2f), logf(0.3f)};
    double expect[4] = {0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0};
    mmoe_sampler s;
    init_full(&s, 1.0f, 0.7f, 3, 0.0f, 1.0f, 1);
    assert_probs(&s, logits, expect, 4);
    mmoe_sampler_free(&s);
}
END_TEST

START_TEST(min_p_distribution)
{
    uint64_t seed = mmoe_test_seed("sampler/min_p");
    /* p = (0.1, 0.4, 0.2, 0.3), max 0.4: min_p 0.6 keeps p >= 0.24: ids 1 and 3 -> 4/7, 3/7;
       min_p 0.5 keeps p >= 0.2: ids 1, 2, 3 -> (0.4, 0.2, 0.3) / 0.9 */
    float logits[4] = {logf(0.1f), logf(0.4f), logf(0.2f), logf(0.3f)};
    double expect06[4] = {0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0};
    double expect05[4] = {0.0, 0.4 / 0.9, 0.2 / 0.9, 0.3 / 0.9};
    mmoe_sampler s;
    init_full(&s, 1.0f, 1.0f, 0, 0.6f, 1.0f, seed);
    assert_probs(&s, logits, expect06, 4);
    double chi2 = chi_square(&s, logits, expect06, 4, 40000);
    ck_assert_msg(chi2 < CHI2_DF1_1EM6, "min_p 0.6: chi-square %g", chi2);
    mmoe_sampler_free(&s);
    /* 0.5 * 0.4 = 0.2 sits on p_2 = 0.2 up to FP32 rounding of both sides: use 0.45 (p >= 0.18) */
    init_full(&s, 1.0f, 1.0f, 0, 0.45f, 1.0f, seed + 1);
    assert_probs(&s, logits, expect05, 4);
    mmoe_sampler_free(&s);
    /* at T = 2: p ~ sqrt(0.1, 0.4, 0.2, 0.3) / sum; sqrt(0.1) / sqrt(0.4) = 0.5, sqrt(0.2 / 0.4) = 0.707,
       sqrt(0.3 / 0.4) = 0.866: min_p 0.6 keeps ids 1, 2, 3 */
    double r[4] = {0.0, sqrt(0.4), sqrt(0.2), sqrt(0.3)}, sum = r[1] + r[2] + r[3];
    double expect_t2[4] = {0.0, r[1] / sum, r[2] / sum, r[3] / sum};
    init_full(&s, 2.0f, 1.0f, 0, 0.6f, 1.0f, seed);
    assert_probs(&s, logits, expect_t2, 4);
    mmoe_sampler_free(&s);
}
END_TEST

START_TEST(repeat_penalty)
{
    uint64_t seed = mmoe_test_seed("sampler/repeat_penalty");
    /* logits (1, 2, 3, -1), penalty 2, history {2, 3, 2}: id 2 (positive) becomes 3 / 2 = 1.5,
       id 3 (negative) becomes -1 * 2 = -2, id 2 twice in the history is penalized once.
       Greedy moves from id 2 to id 1; at T = 1 p = softmax(1, 2, 1.5, -2). */
    float logits[4] = {1.0f, 2.0f, 3.0f, -1.0f};
    mmoe_sampler s;
    init_full(&s, 0.0f, 1.0f, 0, 0.0f, 2.0f, seed);
    int32_t id;
    ck_assert_int_eq(mmoe_sampler_sample(&s, logits, 4, &id, NULL), MMOE_OK);
    ck_assert_int_eq(id, 2); /* no history yet */
    mmoe_sampler_accept(&s, 2);
    mmoe_sampler_accept(&s, 3);
    mmoe_sampler_accept(&s, 2);
    ck_assert_int_eq(mmoe_sampler_sample(&s, logits, 4, &id, NULL), MMOE_OK);
    ck_assert_int_eq(id, 1);
    ck_assert(logits[2] == 3.0f && logits[3] == -1.0f); /* the caller's logits are not modified */
    mmoe_sampler_reset_history(&s);
    ck_assert_int_eq(mmoe_sampler_sample(&s, logits, 4, &id, NULL), MMOE_OK);
    ck_assert_int_eq(id, 2);
    mmoe_sampler_free(&s);

    init_full(&s, 1.0f, 1.0f, 0, 0.0f, 2.0f, seed);
    mmoe_sampler_accept(&s, 2);
    mmoe_sampler_accept(&s, 3);
    mmoe_sampler_accept(&s, 2);
    double z = exp(1.0) + exp(2.0) + exp(1.5) + exp(-2.0);
    double expect[4] = {exp(1.0) / z, exp(2.0) / z, exp(1.5) / z, exp(-2.0) / z};
    assert_probs(&s, logits, expect, 4);
    double chi2 = chi_square(&s, logits, expect, 4, 40000);
    ck_assert_msg(chi2 < CHI2_DF3_1EM6, "chi-square %g", chi2);
    mmoe_sampler_free(&s);

    /* the window: repeat_last_n = 2 forgets the oldest id: history {2, 3, 0} keeps {3, 0} */
    mmoe_sampler_params p;
    mmoe_sampler_params_default(&p);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 2;
    p.temperature = 1.0f;
    ck_assert_int_eq(mmoe_sampler_init_params(&s, &p, NULL), MMOE_OK);
    mmoe_sampler_accept(&s, 2);
    mmoe_sampler_accept(&s, 3);
    mmoe_sampler_accept(&s, 0);
    z = exp(0.5) + exp(2.0) + exp(3.0) + exp(-2.0);
    double expect_w[4] = {exp(0.5) / z, exp(2.0) / z, exp(3.0) / z, exp(-2.0) / z};
    assert_probs(&s, logits, expect_w, 4);
    mmoe_sampler_free(&s);
}
END_TEST

START_TEST(logprobs)
{
    /* log-softmax of (0, ln 2, ln 3, -inf): p = (1/6, 2/6, 3/6, 0) */
    float logits[4] = {0.0f, logf(2.0f), logf(3.0f), -INFINITY};
    double lp, top_lp[4];
    int32_t top_ids[4];
    ck_assert_int_eq(mmoe_logprobs_top(logits, 4, 1, 4, &lp, top_ids, top_lp, NULL), MMOE_OK);
    ck_assert(fabs(lp - log(2.0 / 6.0)) < 1e-7);
    const int32_t want_ids[4] = {2, 1, 0, 3};
    const double want_lp[3] = {log(0.5), log(2.0 / 6.0), log(1.0 / 6.0)};
    for (int k = 0; k < 4; k++)
        ck_assert_int_eq(top_ids[k], want_ids[k]);
    for (int k = 0; k < 3; k++)
        ck_assert_msg(fabs(top_lp[k] - want_lp[k]) < 1e-7, "top %d: %g vs %g", k, top_lp[k], want_lp[k]);
    ck_assert(isinf(top_lp[3]) && top_lp[3] < 0);
    mmoe_error err;
    ck_assert_int_eq(mmoe_logprobs_top(logits, 4, 4, 0, &lp, NULL, NULL, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_logprobs_top(logits, 4, 0, 5, &lp, top_ids, top_lp, &err), MMOE_EINVAL);
}
END_TEST

START_TEST(params_refused)
{
    mmoe_sampler s;
    mmoe_sampler_params p;
    mmoe_error err;
    mmoe_sampler_params_default(&p);
    p.top_k = -1;
    ck_assert_int_eq(mmoe_sampler_init_params(&s, &p, &err), MMOE_ERANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "top_k"));
    mmoe_sampler_params_default(&p);
    p.min_p = 1.5f;
    ck_assert_int_eq(mmoe_sampler_init_params(&s, &p, &err), MMOE_ERANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "min_p"));
    mmoe_sampler_params_default(&p);
    p.repeat_penalty = 0.0f;
    ck_assert_int_eq(mmoe_sampler_init_params(&s, &p, &err), MMOE_ERANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "repeat_penalty"));
    p.repeat_penalty = NAN;
    ck_assert_int_eq(mmoe_sampler_init_params(&s, &p, &err), MMOE_ERANGE);
    mmoe_sampler_params_default(&p);
    p.repeat_last_n = -3;
    ck_assert_int_eq(mmoe_sampler_init_params(&s, &p, &err), MMOE_ERANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "repeat_last_n"));
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
    tcase_add_test(tc, top_k_distribution);
    tcase_add_test(tc, top_k_then_top_p);
    tcase_add_test(tc, min_p_distribution);
    tcase_add_test(tc, repeat_penalty);
    tcase_add_test(tc, logprobs);
    tcase_add_test(tc, params_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(sampler_suite());
}
