/**
 * @file test_moe_dot.c
 * @brief Suite "moe_dot": the MoE oracle's fixed-order GEMM (src/cpu_ref/moe_dot.c) gives the
 *        bits of its definition in every variant the CPU runs.
 *
 * The definition, written out here independently of the code under test: output (t, j) has
 * eight FP32 lanes p_l = +0; for k = 0 .. K-1 in order, p_{k mod 8} = fmaf(a_k, w_k, p_{k mod 8})
 * (C's fmaf: one rounding); then ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)).
 *
 * - Every variant that runs on this CPU (generic always; AVX2+FMA where the CPU has both; the
 *   others are named as not run) against that loop, bit for bit, on random shapes that hit every
 *   register-block remainder (m up to 9 tokens, n up to 26 rows, K with and without a remainder
 *   modulo 8, leading dimensions larger than K), on random normal values whose products are
 *   *not* exact in FP32, so a multiply-then-add or another lane order would show.  Outputs are
 *   NaN-poisoned, including the gaps of a leading dimension that must stay untouched.
 * - Hand-derived values: the lane order (a sum where sequential order gives 3 and the lanes 6)
 *   and the single rounding of the fused multiply-add (2^-24, where mul + add gives 0).
 * - Zero runs of a multiple of 8 inserted into K (the padding of I) change no bit.
 * - The FP4 and FP8 variants that decode weights in registers equal the definition applied to
 *   the rows decoded by moe_weight_tile_f32() (tested against the formats' formulas in
 *   moe_dequant), for every code (FP8: the NaN codes and -0 too) and scale bytes from 0 to 254,
 *   the extremes included, and (FP8) F32 block scales whose products round.
 * Seeds are printed (replay with MMOE_SEED=n).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_rng.h"
#include "mmoe_test.h"
#include "moe_internal.h"

static uint64_t g_seed;

/** The definition of one output (written independently of moe_dot.c). */
static float reference_dot(const float *a, const float *w, int64_t k)
{
    float p[8] = {0};
    for (int64_t i = 0; i < k; i++)
        p[i & 7] = fmaf(a[i], w[i], p[i & 7]);
    float lo = (p[0] + p[4]) + (p[2] + p[6]);
    float hi = (p[1] + p[5]) + (p[3] + p[7]);
    return lo + hi;
}

/** Bits of a float (for messages and comparisons that tell -0 from +0). */
static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/** One random GEMM of shape (m, n, k) through @p isa, every output against the definition. */
static void check_random_gemm(moe_dot_isa isa, mmoe_rng *rng, int64_t m, int64_t n, int64_t k)
{
    const int64_t lda = k + (int64_t)(mmoe_rng_u64(rng) % 5), ldw = k + (int64_t)(mmoe_rng_u64(rng) % 5);
    const int64_t ldc = n + 3;
    float *a = malloc((size_t)(m * lda) * sizeof(float)), *w = malloc((size_t)(n * ldw) * sizeof(float));
    float *c = malloc((size_t)(m * ldc) * sizeof(float));
    ck_assert(a && w && c);
    for (int64_t i = 0; i < m * lda; i++)
        a[i] = (float)mmoe_rng_normal(rng);
    for (int64_t i = 0; i < n * ldw; i++)
        w[i] = (float)mmoe_rng_normal(rng);
    mmoe_test_poison_f32(c, (size_t)(m * ldc));
    moe_dot_gemm(isa, a, lda, m, w, ldw, n, k, c, ldc);
    for (int64_t t = 0; t < m; t++) {
        for (int64_t j = 0; j < n; j++) {
            const float want = reference_dot(a + t * lda, w + j * ldw, k);
            const float got = c[t * ldc + j];
            ck_assert_msg(bits_of(got) == bits_of(want),
                          "%s m=%lld n=%lld k=%lld: c[%lld][%lld] = %a, definition %a", moe_dot_isa_name(isa),
                          (long long)m, (long long)n, (long long)k, (long long)t, (long long)j, (double)got,
                          (double)want);
        }
        for (int64_t j = n; j < ldc; j++) /* the gap of the leading dimension is never written */
            ck_assert(isnan(c[t * ldc + j]));
    }
    free(a);
    free(w);
    free(c);
}

/* Every variant that runs here, bit-identical to the definition on random shapes. */
START_TEST(variants_match_the_definition)
{
    const moe_dot_isa isa = (moe_dot_isa)_i;
    if (!moe_dot_isa_runs_here(isa)) {
        fprintf(stderr, "moe_dot: variant %s does not run on this CPU: not tested here\n", moe_dot_isa_name(isa));
        return;
    }
    static const int64_t ks[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 64, 100, 128, 130, 257, 1000, 2048};
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 101u * (uint64_t)_i);
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
        for (int64_t m = 1; m <= 9; m++) {
            const int64_t n = 1 + (int64_t)(mmoe_rng_u64(&rng) % 26);
            check_random_gemm(isa, &rng, m, n, ks[ki]);
        }
    /* a row block boundary of the vector variant (K = 256: blocks of 192 rows) */
    check_random_gemm(isa, &rng, 5, 400, 256);
    /* the blocked AVX-512 GEMM's edges: two token blocks of 64 (the second of 6), an odd row
       count over three row blocks of 24, four chunks of 256 k (the last partial) and a tail */
    check_random_gemm(isa, &rng, 70, 51, 1003);
}
END_TEST

/*
 * Lane order, derived by hand: k = 0 .. 7 with a = (2^27, 1, 1, 1, -2^27, 1, 1, 1), w = 1.
 * Lanes: p0 = 2^27, p4 = -2^27, the other six 1.  Combine: (0 + 2) + (2 + 2) = 6.  (A sequential
 * sum gives 2^27 + 1 + 1 + 1 = 2^27, since 1 is below half an ulp there, then 2^27 - 2^27 + 3 = 3.)
 * Fused rounding: K = 16, a0 = -(1 + 2^-11), w0 = 1; a8 = w8 = 1 + 2^-12; the rest 0.  Lane 0 ends at
 * fma(1 + 2^-12, 1 + 2^-12, -(1 + 2^-11)) = 2^-24 exactly (the product 1 + 2^-11 + 2^-24 is not
 * an FP32 number; rounded first it would be 1 + 2^-11 and the sum 0).
 */
START_TEST(hand_derived_order_and_rounding)
{
    const float one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    const float lanes[8] = {0x1p27f, 1, 1, 1, -0x1p27f, 1, 1, 1};
    const float fa[16] = {-(1.0f + 0x1p-11f), 0, 0, 0, 0, 0, 0, 0, 1.0f + 0x1p-12f};
    const float fw[16] = {1, 0, 0, 0, 0, 0, 0, 0, 1.0f + 0x1p-12f};
    for (int v = 0; v < MOE_DOT_ISA_COUNT; v++) {
        if (!moe_dot_isa_runs_here((moe_dot_isa)v))
            continue;
        float c = NAN;
        moe_dot_gemm((moe_dot_isa)v, lanes, 8, 1, one, 8, 1, 8, &c, 1);
        ck_assert_msg(c == 6.0f, "%s: lane order gives %a, want 6", moe_dot_isa_name((moe_dot_isa)v), (double)c);
        c = NAN;
        moe_dot_gemm((moe_dot_isa)v, fa, 16, 1, fw, 16, 1, 16, &c, 1);
        ck_assert_msg(c == 0x1p-24f, "%s: fused rounding gives %a, want 0x1p-24", moe_dot_isa_name((moe_dot_isa)v),
                      (double)c);
    }
}
END_TEST

/* Zero runs of 8, 128 or 256 values inserted at random multiples of 8 (in both operands) change
 * no bit of any variant. */
START_TEST(zero_runs_of_eight_change_no_bit)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 7u);
    const int64_t k = 384, m = 5, n = 11;
    static const int64_t runs[] = {8, 128, 256};
    float *a = malloc((size_t)(m * k) * sizeof(float)), *w = malloc((size_t)(n * k) * sizeof(float));
    float *c = malloc((size_t)(m * n) * sizeof(float)), *cp = malloc((size_t)(m * n) * sizeof(float));
    const int64_t kp_max = k + 256;
    float *ap = malloc((size_t)(m * kp_max) * sizeof(float)), *wp = malloc((size_t)(n * kp_max) * sizeof(float));
    ck_assert(a && w && c && cp && ap && wp);
    for (int64_t i = 0; i < m * k; i++)
        a[i] = (float)mmoe_rng_normal(&rng);
    for (int64_t i = 0; i < n * k; i++)
        w[i] = (float)mmoe_rng_normal(&rng);
    for (int v = 0; v < MOE_DOT_ISA_COUNT; v++) {
        if (!moe_dot_isa_runs_here((moe_dot_isa)v))
            continue;
        moe_dot_gemm((moe_dot_isa)v, a, k, m, w, k, n, k, c, n);
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            const int64_t run = runs[r], kp = k + run;
            const int64_t at = 8 * (int64_t)(mmoe_rng_u64(&rng) % (uint64_t)(k / 8 + 1)); /* 0 .. k */
            for (int64_t t = 0; t < m; t++) { /* a zero run at 'at'; the activations there are -0 */
                memcpy(ap + t * kp, a + t * k, (size_t)at * sizeof(float));
                for (int64_t i = 0; i < run; i++)
                    ap[t * kp + at + i] = -0.0f;
                memcpy(ap + t * kp + at + run, a + t * k + at, (size_t)(k - at) * sizeof(float));
            }
            for (int64_t j = 0; j < n; j++) {
                memcpy(wp + j * kp, w + j * k, (size_t)at * sizeof(float));
                memset(wp + j * kp + at, 0, (size_t)run * sizeof(float));
                memcpy(wp + j * kp + at + run, w + j * k + at, (size_t)(k - at) * sizeof(float));
            }
            mmoe_test_poison_f32(cp, (size_t)(m * n));
            moe_dot_gemm((moe_dot_isa)v, ap, kp, m, wp, kp, n, kp, cp, n);
            ck_assert_msg(memcmp(c, cp, (size_t)(m * n) * sizeof(float)) == 0,
                          "%s: %lld zeros at k = %lld changed the result", moe_dot_isa_name((moe_dot_isa)v),
                          (long long)run, (long long)at);
        }
    }
    free(a);
    free(w);
    free(c);
    free(cp);
    free(ap);
    free(wp);
}
END_TEST

/**
 * Run moe_dot_gemm_coded() on rows [r0, r0 + n) of @p w for @p m tokens and compare every output
 * with the definition applied to the rows decoded by moe_weight_tile_f32(), bit for bit (NaN with
 * NaN); the gaps of the leading dimension must stay NaN-poisoned.  @p what names the case.
 */
static void check_coded(moe_dot_isa isa, const float *a, int64_t lda, int64_t m, const moe_mat *w, int64_t r0,
                        int64_t n, const char *what)
{
    const int64_t k = w->cols, ldc = n + 2;
    float *row = malloc((size_t)k * sizeof(float)), *c = malloc((size_t)(m * ldc) * sizeof(float));
    ck_assert(row && c);
    mmoe_test_poison_f32(c, (size_t)(m * ldc));
    ck_assert_int_eq(moe_dot_gemm_coded(isa, a, lda, m, w, r0, n, c, ldc), 0);
    for (int64_t j = 0; j < n; j++) {
        moe_weight_tile_f32(w, r0 + j, 1, 0, k, row);
        for (int64_t t = 0; t < m; t++) {
            const float want = reference_dot(a + t * lda, row, k), got = c[t * ldc + j];
            ck_assert_msg(bits_of(got) == bits_of(want) || (isnan(got) && isnan(want)),
                          "%s %s k=%lld m=%lld: c[%lld][%lld] = %a, decoded rows give %a (seed %llu)",
                          moe_dot_isa_name(isa), what, (long long)k, (long long)m, (long long)t, (long long)j,
                          (double)got, (double)want, (unsigned long long)g_seed);
        }
    }
    for (int64_t t = 0; t < m; t++)
        for (int64_t j = n; j < ldc; j++)
            ck_assert(isnan(c[t * ldc + j]));
    free(row);
    free(c);
}

/* FP4 weights decoded on the fly: the same bits as decoding the rows first. */
START_TEST(fp4_on_the_fly_matches_decoded_rows)
{
    const moe_dot_isa isa = (moe_dot_isa)_i;
    if (!moe_dot_isa_runs_here(isa))
        return;
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 977u * (uint64_t)(_i + 1));
    static const int64_t ks[] = {32, 64, 96, 512, 4096};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        for (int64_t m = 1; m <= 5; m++) {
            const int64_t k = ks[ki], rows = 2 + (int64_t)mmoe_rng_below(&rng, 30);
            const int64_t r0 = (int64_t)mmoe_rng_below(&rng, 2), n = rows - r0 - (int64_t)mmoe_rng_below(&rng, 2);
            const int64_t lda = k + 3;
            uint8_t *wb = malloc((size_t)(rows * k / 2)), *sb = malloc((size_t)(rows * k / 32));
            float *a = malloc((size_t)(m * lda) * sizeof(float));
            ck_assert(wb && sb && a);
            for (int64_t i = 0; i < rows * k / 2; i++)
                wb[i] = (uint8_t)mmoe_rng_below(&rng, 256);
            /* mostly realistic scales; every 7th an extreme (0 and 1: subnormal half scales, 254:
               overflow with large a, 255: NaN) */
            static const uint8_t extreme[4] = {0, 1, 254, 255};
            for (int64_t i = 0; i < rows * k / 32; i++)
                sb[i] = (uint8_t)(i % 7 == 3 ? extreme[(i / 7) % 4] : 110 + mmoe_rng_below(&rng, 30));
            for (int64_t i = 0; i < m * lda; i++)
                a[i] = (float)mmoe_rng_normal(&rng);
            moe_mat w = {.fmt = MOE_W_FP4, .rows = rows, .cols = k, .w = wb, .sf = sb, .block_n = 1,
                         .block_k = 32, .sf_rows = rows, .sf_cols = k / 32};
            check_coded(isa, a, lda, m, &w, r0, n, "fp4");
            free(wb);
            free(sb);
            free(a);
        }
    }
}
END_TEST

/*
 * FP8 weights decoded on the fly: the same bits as decoding the rows first, for every code (the
 * two NaN codes and -0 included; a few rows of all 256), UE8M0 scale bytes 0 to 254 and F32
 * scales that make e4m3 x scale round, scale blocks of 8 to 128 columns and 1 to 3 rows.
 */
START_TEST(fp8_on_the_fly_matches_decoded_rows)
{
    const moe_dot_isa isa = (moe_dot_isa)_i;
    if (!moe_dot_isa_runs_here(isa))
        return;
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 1931u * (uint64_t)(_i + 1));
    static const int64_t ks[] = {8, 64, 256, 1024};
    static const int64_t bks[] = {8, 24, 128, 128};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        for (int64_t m = 1; m <= 5; m++) {
            const int64_t k = ks[ki], bk = bks[ki], bn = 1 + (int64_t)mmoe_rng_below(&rng, 3);
            const int64_t rows = 2 + (int64_t)mmoe_rng_below(&rng, 30);
            const int64_t r0 = (int64_t)mmoe_rng_below(&rng, 2), n = rows - r0 - (int64_t)mmoe_rng_below(&rng, 2);
            const int64_t lda = k + 3, sr = (rows + bn - 1) / bn, sc = (k + bk - 1) / bk;
            const int f32 = (int)(m % 2);
            uint8_t *wb = malloc((size_t)(rows * k)), *sb = malloc((size_t)(sr * sc));
            float *sf = malloc((size_t)(sr * sc) * sizeof(float)), *a = malloc((size_t)(m * lda) * sizeof(float));
            ck_assert(wb && sb && sf && a);
            for (int64_t i = 0; i < rows * k; i++)
                /* rows 0 and 1 hold every code */
                wb[i] = (uint8_t)(k >= 256 && i < 2 * k ? i : (int64_t)mmoe_rng_below(&rng, 256));
            for (int64_t i = 0; i < sr * sc; i++) {
                sb[i] = (uint8_t)(i % 5 == 2 ? (i % 2 ? 0 : 254) : 115 + mmoe_rng_below(&rng, 20));
                sf[i] = (float)(0.001 + mmoe_rng_uniform(&rng)); /* not powers of two: e4m3 x s rounds */
            }
            for (int64_t i = 0; i < m * lda; i++)
                a[i] = (float)mmoe_rng_normal(&rng);
            moe_mat w = {.fmt = MOE_W_FP8, .rows = rows, .cols = k, .w = wb, .sf = f32 ? (const void *)sf : sb,
                         .sf_f32 = f32, .block_n = bn, .block_k = bk, .sf_rows = sr, .sf_cols = sc};
            char what[64];
            snprintf(what, sizeof what, "fp8 (blocks %lldx%lld, %s scales)", (long long)bn, (long long)bk,
                     f32 ? "f32" : "ue8m0");
            check_coded(isa, a, lda, m, &w, r0, n, what);
            free(wb);
            free(sb);
            free(sf);
            free(a);
        }
    }
}
END_TEST

static Suite *dot_suite(void)
{
    Suite *s = suite_create("moe_dot");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, variants_match_the_definition, 0, MOE_DOT_ISA_COUNT);
    tcase_add_test(tc, hand_derived_order_and_rounding);
    tcase_add_test(tc, zero_runs_of_eight_change_no_bit);
    tcase_add_loop_test(tc, fp4_on_the_fly_matches_decoded_rows, 0, MOE_DOT_ISA_COUNT);
    tcase_add_loop_test(tc, fp8_on_the_fly_matches_decoded_rows, 0, MOE_DOT_ISA_COUNT);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("moe_dot");
    fprintf(stderr, "moe_dot: the oracle uses variant %s on this CPU\n", moe_dot_isa_name(moe_dot_isa_best()));
    return mmoe_test_run(dot_suite());
}
