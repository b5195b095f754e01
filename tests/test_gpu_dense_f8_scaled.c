/**
 * @file test_gpu_dense_f8_scaled.c
 * @brief The scaled arithmetic of the few-token dense FP8 linear (gpu_dense_f8_scaled.h) on the
 *        CPU, against the oracle's dense linear: runs on every machine, no GPU needed.
 *
 * The GPU kernel (gpu_linear_dense_f8_rows.cuh) computes each chunk sum of x w as an fma chain
 * of (x 2^(sb + 377)) (e 2^-1016) for a direct scale byte sb, of (x 2^-512) w otherwise, and
 * multiplies the tree's result by 2^512.  Here the same chain runs in C (fma() is the correctly
 * rounded double fma, as DFMA), with x of every BF16 exponent, every scale byte 0..255 once per
 * weight, NaN codes and a few infinite x, and each output must equal the oracle's
 * (attn_dense_rows) bit for bit: the claim "every value is the oracle's times 2^-512" for all of
 * them, whatever the kernel's launch shape; and before that each chunk sum and each row's tree
 * must equal the spec's (spec_chunk(), written here) times 2^-512 bit for bit in double, where
 * no fp32 rounding can hide a difference.  The weight's bits (mmoe_df8_e4m3_hi()) are checked
 * for every code against the E4M3 table times 2^-1016, and the header's constants against values
 * derived by hand here.  Built with -ffp-contract=off (gpu.am): every product is one rounding.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "gpu_dense_f8_scaled.h"
#include "mmoe_formats.h"
#include "mmoe_rng.h"
#include "mmoe_sum_order.h"
#include "mmoe_test.h"

static uint64_t g_seed;

/** The double with high word @p hi and low word 0. */
static double double_of_hi(uint32_t hi)
{
    const uint64_t u = (uint64_t)hi << 32;
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/** The bits of @p d. */
static uint64_t bits_of(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

START_TEST(constants_by_hand)
{
    /* x 2^(sb - 127) times 2^1016 times 2^-512: sb + 377 */
    ck_assert_int_eq(mmoe_df8_x_exponent(127), 504);
    ck_assert_int_eq(mmoe_df8_x_exponent(10), 387);
    ck_assert_int_eq(mmoe_df8_x_exponent(134), 511);
    ck_assert_int_eq(mmoe_df8_x_exponent(9), -512);
    ck_assert_int_eq(mmoe_df8_x_exponent(135), -512);
    ck_assert_int_eq(mmoe_df8_x_exponent(0), -512);
    ck_assert_int_eq(mmoe_df8_x_exponent(255), -512);
    /* codes by hand: 0x38 = 1.0, 0x01 = 2^-9 (the smallest subnormal), 0x7E = 448, 0xB8 = -1.0 */
    ck_assert(double_of_hi(mmoe_df8_e4m3_hi(0x38)) == ldexp(1.0, -1016));
    ck_assert(double_of_hi(mmoe_df8_e4m3_hi(0x01)) == ldexp(1.0, -1025));
    ck_assert(double_of_hi(mmoe_df8_e4m3_hi(0x7E)) == ldexp(448.0, -1016));
    ck_assert(double_of_hi(mmoe_df8_e4m3_hi(0xB8)) == ldexp(-1.0, -1016));
}
END_TEST

START_TEST(code_bits_every_code)
{
    const float *e4m3 = mmoe_fp8_e4m3_table();
    for (uint32_t code = 0; code < 256; code++) {
        if ((code & 0x7Fu) == 0x7Fu)
            continue; /* NaN: the kernel sums such a chunk to NaN */
        const double got = double_of_hi(mmoe_df8_e4m3_hi(code)), want = ldexp((double)e4m3[code], -1016);
        ck_assert_msg(bits_of(got) == bits_of(want), "code 0x%02x: %a, want %a", code, got, want);
    }
}
END_TEST

/** The oracle's weight of @p code under scale byte @p sb: bf16(fl32(e4m3 * ue8m0)). */
static float oracle_weight(uint32_t code, uint32_t sb)
{
    return mmoe_bf16_round(mmoe_fp8_e4m3_table()[code] * mmoe_ue8m0_to_f32((uint8_t)sb));
}

/**
 * Chunk @p c of x row @p xr and weight row @p wr (scale byte @p sb) as the kernel sums it: the
 * fma chain of (x 2^x_exponent) (e 2^-1016) for a direct scale byte without NaN codes, of
 * (x 2^-512) w otherwise (NaN when a code is NaN).
 */
static double scaled_chunk(const uint16_t *xr, const uint8_t *wr, uint32_t sb, int64_t c)
{
    int nan = 0;
    for (int i = 0; i < MMOE_SUM_CHUNK; i++)
        nan |= (wr[c * MMOE_SUM_CHUNK + i] & 0x7F) == 0x7F;
    const int direct = mmoe_df8_scale_direct(sb) && !nan;
    double s = 0.0;
    for (int i = 0; i < MMOE_SUM_CHUNK; i++) {
        const int64_t k = c * MMOE_SUM_CHUNK + i;
        const double x = (double)mmoe_bf16_to_f32(xr[k]);
        s = direct ? fma(ldexp(x, mmoe_df8_x_exponent(sb)), double_of_hi(mmoe_df8_e4m3_hi(wr[k])), s)
                   : fma(ldexp(x, -MMOE_DF8_SHIFT), (double)oracle_weight(wr[k], sb), s);
    }
    return s;
}

/** The spec's chunk sum (@ref spec_arch_sum_order): the exact products x w ascending from +0, one rounding each. */
static double spec_chunk(const uint16_t *xr, const uint8_t *wr, uint32_t sb, int64_t c)
{
    double s = 0.0;
    for (int i = 0; i < MMOE_SUM_CHUNK; i++) {
        const int64_t k = c * MMOE_SUM_CHUNK + i;
        s = fma((double)mmoe_bf16_to_f32(xr[k]), (double)oracle_weight(wr[k], sb), s);
    }
    return s;
}

/** Same double, or both NaN. */
static int same_double(double a, double b)
{
    return (isnan(a) && isnan(b)) || bits_of(a) == bits_of(b);
}

/**
 * The kernel's arithmetic for output row @p n of x row @p xr (K values, K a multiple of 16):
 * every chunk as scaled_chunk() (checked against spec_chunk() times 2^-512, bit for bit, the
 * direct chunks counted in @p n_direct), the spec's tree over them (checked the same way),
 * times 2^512, to fp32.
 */
static float scaled_row(const uint16_t *xr, int64_t K, const uint8_t *w, const uint8_t *scale, int64_t scols,
                        int block, int64_t n, int64_t *n_direct)
{
    const uint8_t *wr = w + n * K, *sr = scale + (n / block) * scols;
    mmoe_pairwise pw, ps;
    mmoe_pairwise_init(&pw);
    mmoe_pairwise_init(&ps);
    for (int64_t c = 0; c < K / MMOE_SUM_CHUNK; c++) {
        const uint32_t sb = sr[(c * MMOE_SUM_CHUNK) / block];
        const double got = scaled_chunk(xr, wr, sb, c), want = spec_chunk(xr, wr, sb, c);
        ck_assert_msg(same_double(ldexp(got, MMOE_DF8_SHIFT), want),
                      "row %lld, chunk %lld, scale byte %u: scaled chunk %a x 2^512, spec %a (seed %llu)",
                      (long long)n, (long long)c, sb, got, want, (unsigned long long)g_seed);
        *n_direct += mmoe_df8_scale_direct(sb) && !isnan(want);
        mmoe_pairwise_push(&pw, got);
        mmoe_pairwise_push(&ps, want);
    }
    const double tree = ldexp(mmoe_pairwise_result(&pw), MMOE_DF8_SHIFT), spec = mmoe_pairwise_result(&ps);
    ck_assert_msg(same_double(tree, spec), "row %lld: scaled tree %a, spec %a (seed %llu)", (long long)n, tree, spec,
                  (unsigned long long)g_seed);
    return (float)tree;
}

START_TEST(rows_match_oracle)
{
    const int block = 128;
    const int64_t T = 4, N = 1024, K = 4096, scols = K / block, srows = N / block;
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed);
    uint16_t *x = malloc(2 * (size_t)(T * K));
    uint8_t *w = malloc((size_t)(N * K)), *s = malloc((size_t)(srows * scols));
    double *xd = malloc(sizeof(double) * (size_t)(T * K));
    float *y = malloc(sizeof(float) * (size_t)(T * N));
    ck_assert(x && w && s && xd && y && srows * scols == 256);
    /* one value in 32 of token 0 has an exponent field 0..150 (up to 2^24), of token 1 one of
     * 0..20 (subnormals and the smallest normals), of token 3 any (up to 2^128, so that some
     * outputs overflow fp32); token 2 holds plain values and one +inf */
    const uint64_t exp_fields[4] = {151, 21, 0, 255};
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++) {
            uint16_t v = mmoe_bf16_from_f32((float)ldexp((double)mmoe_rng_u32(&r), -31) - 1.0f);
            if (exp_fields[t] > 0 && mmoe_rng_below(&r, 32) == 0)
                v = (uint16_t)((mmoe_rng_below(&r, 2) << 15) | (mmoe_rng_below(&r, exp_fields[t]) << 7) |
                               mmoe_rng_below(&r, 128));
            if (t == 2 && k == 100)
                v = 0x7F80u;
            x[t * K + k] = v;
            xd[t * K + k] = (double)mmoe_bf16_to_f32(v);
        }
    for (int64_t i = 0; i < N * K; i++) {
        w[i] = (uint8_t)mmoe_rng_below(&r, 256);
        if ((w[i] & 0x7F) == 0x7F && mmoe_rng_below(&r, 320) != 0) /* NaN codes: about 1 in 41000 */
            w[i] ^= 1u;
    }
    /* every scale byte once: 0..223 shuffled over the first seven row blocks, 224..255 (weights
     * that overflow fp32 from 247 on, NaN at 255) shuffled over the last, so that most rows keep
     * finite weights */
    for (int i = 0; i < 256; i++)
        s[i] = (uint8_t)i;
    for (int lo = 0; lo < 256; lo += 224) {
        const int hi = lo == 0 ? 224 : 256;
        for (int i = hi - 1; i > lo; i--) {
            const int j = lo + (int)mmoe_rng_below(&r, (uint64_t)(i - lo + 1));
            const uint8_t tmp = s[i];
            s[i] = s[j], s[j] = tmp;
        }
    }
    mmoe_tensor wt, st;
    memset(&wt, 0, sizeof wt);
    memset(&st, 0, sizeof st);
    wt.dtype = MMOE_DT_F8_E4M3, wt.ndim = 2, wt.shape[0] = N, wt.shape[1] = K, wt.data = w, wt.nbytes = (size_t)(N * K);
    st.dtype = MMOE_DT_F8_E8M0, st.ndim = 2, st.shape[0] = srows, st.shape[1] = scols, st.data = s;
    st.nbytes = (size_t)(srows * scols);
    mmoe_error err;
    ck_assert_msg(attn_dense_rows(NULL, xd, T, K, K, &wt, &st, block, 0, N, y, N, &err) == MMOE_OK, "%s", err.msg);
    int64_t nans = 0, finite[4] = {0, 0, 0, 0}, n_direct = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            const float got = scaled_row(x + t * K, K, w, s, scols, block, n, &n_direct), want = y[t * N + n];
            nans += isnan(want), finite[t] += isfinite(want);
            ck_assert_msg((isnan(got) && isnan(want)) || memcmp(&got, &want, sizeof got) == 0,
                          "token %lld, row %lld: scaled %a, oracle %a (seed %llu)", (long long)t, (long long)n,
                          (double)got, (double)want, (unsigned long long)g_seed);
        }
    /* the inputs must reach NaN, infinite and finite outputs, or the test says little */
    ck_assert_msg(nans > 0 && finite[0] > N / 4 && finite[1] > N / 2 && finite[2] < N && finite[3] < N &&
                      n_direct > T * N * (K / MMOE_SUM_CHUNK) / 4,
                  "%lld NaN outputs; finite per token %lld, %lld, %lld, %lld of %lld; %lld direct chunks",
                  (long long)nans, (long long)finite[0], (long long)finite[1], (long long)finite[2],
                  (long long)finite[3], (long long)N, (long long)n_direct);
    free(x), free(w), free(s), free(xd), free(y);
}
END_TEST

static Suite *dense_f8_scaled_suite(void)
{
    Suite *s = suite_create("gpu_dense_f8_scaled");
    TCase *tc = tcase_create("scaled");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, constants_by_hand);
    tcase_add_test(tc, code_bits_every_code);
    tcase_add_test(tc, rows_match_oracle);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("gpu_dense_f8_scaled");
    return mmoe_test_run(dense_f8_scaled_suite());
}
