/**
 * @file test_attn_linear.c
 * @brief Suite "attn_linear": FP8 block-scaled and dense linears, RMSNorm, the FP8/FP4 QAT round trips.
 *
 * The oracles are written here from docs/spec/architecture.md (linear layers), in float64, without the
 * code under test: the E4M3 and E2M1 grids are enumerated from their bit layouts,
 * rounding is a brute-force nearest search (ties to the even code), and the
 * power-of-two scales are found by exact comparisons with 448 * 2^e (resp. 6 * 2^e).
 * Where the oracle defines the result exactly (FP8 linear: exact block partials,
 * then the specified fp32 accumulation; round trips) the comparison is bit for bit.
 */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "attn_ref.h"
#include "attn_test_util.h"
#include "mmoe_formats.h"
#include "mmoe_linear.h"
#include "mmoe_test.h"

/* ---------------------------------------------------------------- float64 oracles */

/** The non-negative grid of E2M1: 0, .5, 1, 1.5, 2, 3, 4, 6. */
static const double e2m1_grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

/** y = bf16(x W^T) from the spec, with exact block partials. */
static void oracle_linear_fp8(const uint16_t *x, int64_t T, int64_t N, int64_t K, const uint8_t *w,
                              const uint8_t *sw, int block, uint16_t *y)
{
    double *xr = malloc(sizeof(double) * (size_t)K), *xq = malloc(sizeof(double) * (size_t)K);
    double *sx = malloc(sizeof(double) * (size_t)(K / 128));
    const int64_t sw_cols = (K + block - 1) / block;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t k = 0; k < K; k++)
            xr[k] = mmoe_bf16_to_f32(x[t * K + k]);
        for (int64_t b = 0; b < K / 128; b++)
            sx[b] = attn_ref_fp8_block(xr + b * 128, 128, xq + b * 128);
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int64_t kb = 0; kb < K / block; kb++) {
                double partial = 0.0; /* exact: <= 43 significant bits */
                for (int64_t k = kb * block; k < (kb + 1) * block; k++)
                    partial += xq[k] * ((w[n * K + k] & 0x7F) == 0x7F ? NAN : attn_ref_e4m3_value(w[n * K + k]));
                const double s = sx[kb * block / 128] *
                                 ldexp(1.0, (int)sw[(n / block) * sw_cols + kb] - 127);
                acc += (float)partial * (float)s;
            }
            y[t * N + n] = mmoe_bf16_from_f32(acc);
        }
    }
    free(xr);
    free(xq);
    free(sx);
}

/* ---------------------------------------------------------------- tests */

/** Weight codes of a check: the layer's normal-looking weights, or every finite code alike. */
typedef enum {
    FP8_CODES_NORMAL, /**< e4m3(64 z), z standard normal: few subnormal codes */
    FP8_CODES_ALL,    /**< uniform over the 254 finite codes (1 in 8 subnormal or zero) */
    FP8_CODES_ALL_WIDE_SCALES, /**< every finite code, and weight scale bytes over 1..254 (scaled partials
                                    from far below the normal fp32 range to far above 1) */
    FP8_CODES_SOME_NAN /**< normal codes, and in about one weight row of three a NaN code (0x7F or 0xFF) */
} fp8_codes;

/** Whether the BF16 bits @p v are a NaN. */
static int bf16_is_nan(uint16_t v)
{
    return (v & 0x7F80u) == 0x7F80u && (v & 0x7Fu) != 0;
}

/**
 * mmoe_linear_fp8 through the kernels of @p isa (its rows shared out over @p pool's threads,
 * or NULL) against the float64 oracle, bit for bit, and each row alone against the batch
 * (prefill == decode).
 */
static void check_fp8_linear_isa(uint64_t seed, moe_dequant_pool *pool, moe_dot_isa isa, int block, int64_t T,
                                 int64_t N, int64_t K, fp8_codes codes)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed);
    attn_test_layer L = {0};
    mmoe_tensor w, s;
    attn_test_fp8_weight(&L, &rng, N, K, block, &w, &s);
    if (codes != FP8_CODES_NORMAL) {
        uint8_t *wd = w.data;
        for (int64_t i = 0; i < N * K; i++) {
            uint8_t c = (uint8_t)mmoe_rng_below(&rng, 254); /* 0x00..0xFD: skip the NaN codes 0x7F, 0xFF */
            wd[i] = (uint8_t)(c >= 0x7F ? c + 1 : c);
        }
    }
    if (codes == FP8_CODES_SOME_NAN) {
        uint8_t *wd = w.data;
        for (int64_t n = 0; n < N; n++)
            if (mmoe_rng_below(&rng, 3) == 0)
                wd[n * K + (int64_t)mmoe_rng_below(&rng, (uint64_t)K)] = mmoe_rng_below(&rng, 2) ? 0x7F : 0xFF;
    }
    if (codes == FP8_CODES_ALL_WIDE_SCALES) {
        uint8_t *sd = s.data;
        for (int64_t i = 0; i < s.shape[0] * s.shape[1]; i++)
            sd[i] = (uint8_t)(1 + mmoe_rng_below(&rng, 254));
    }
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(T * K));
    uint16_t *y = malloc(sizeof(uint16_t) * (size_t)(T * N));
    uint16_t *y1 = malloc(sizeof(uint16_t) * (size_t)N);
    uint16_t *ref = malloc(sizeof(uint16_t) * (size_t)(T * N));
    /* rows of very different magnitudes exercise the scales; one tiny row hits the 1e-4 clamp */
    for (int64_t t = 0; t < T; t++)
        attn_test_fill_bf16(&rng, x + t * K, K, 0.0, t == 0 ? 1e-6 : ldexp(1.0, (int)(t % 9) - 4));
    mmoe_test_poison_bf16(y, (size_t)(T * N));
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(attn_linear_fp8(pool, isa, x, T, &w, &s, block, y, &err), MMOE_OK);
    oracle_linear_fp8(x, T, N, K, w.data, s.data, block, ref);
    for (int64_t i = 0; i < T * N; i++) /* a NaN's sign and payload are not specified */
        ck_assert_msg(y[i] == ref[i] || (bf16_is_nan(y[i]) && bf16_is_nan(ref[i])),
                      "%s, %d threads, block %d, T %lld: y[%lld] = 0x%04x, oracle 0x%04x",
                      moe_dot_isa_name(isa), moe_dequant_pool_threads(pool), block, (long long)T, (long long)i, y[i],
                      ref[i]);
    /* a row alone gives the same bits as inside a batch (prefill == decode) */
    for (int64_t t = 0; t < T; t++) {
        mmoe_test_poison_bf16(y1, (size_t)N);
        ck_assert_int_eq(attn_linear_fp8(pool, isa, x + t * K, 1, &w, &s, block, y1, &err), MMOE_OK);
        ck_assert_int_eq(memcmp(y1, y + t * N, sizeof(uint16_t) * (size_t)N), 0);
    }
    free(x);
    free(y);
    free(y1);
    free(ref);
    attn_test_layer_free(&L);
}

/**
 * check_fp8_linear_isa() with every variant that runs on this CPU, alone and with a pool of 3
 * threads, the latter once with OpenBLAS on one thread (the tile path then shares its tiles out
 * over the pool) and once with two (the tiles stay on the caller).
 */
static void check_fp8_linear(uint64_t seed, int block, int64_t T, int64_t N, int64_t K, fp8_codes codes)
{
    moe_dequant_pool *pool;
    mmoe_error err;
    ck_assert_msg(moe_dequant_pool_create(3, &pool, &err) == MMOE_OK, "%s", err.msg);
    const int blas_threads = openblas_get_num_threads();
    for (int isa = 0; isa < MOE_DOT_ISA_COUNT; isa++)
        if (moe_dot_isa_runs_here((moe_dot_isa)isa)) {
            check_fp8_linear_isa(seed, NULL, (moe_dot_isa)isa, block, T, N, K, codes);
            for (int bt = 1; bt <= 2; bt++) {
                openblas_set_num_threads(bt);
                check_fp8_linear_isa(seed, pool, (moe_dot_isa)isa, block, T, N, K, codes);
            }
            openblas_set_num_threads(blas_threads);
        }
    moe_dequant_pool_release(pool);
}

START_TEST(fp8_linear_128_blocks)
{
    /* N not a multiple of 128 (partial scale row) and above the 512-row weight tile, several K
       blocks, T > the 64-row activation tile */
    check_fp8_linear(mmoe_test_seed("attn_linear/fp8"), 128, 70, 600, 384, FP8_CODES_NORMAL);
}
END_TEST

START_TEST(fp8_linear_32_blocks)
{
    check_fp8_linear(mmoe_test_seed("attn_linear/fp8"), 32, 5, 96, 256, FP8_CODES_NORMAL);
}
END_TEST

/*
 * Calls of 1 to 9 rows: up to FP8_REG_MAX_T (4) the AVX2 variant sums the partials in
 * registers, above it (and the generic variant always) the decoded tile's dgemm; every finite
 * code, both block widths, weight row counts that are not a multiple of 4.
 */
START_TEST(fp8_linear_few_rows_every_code)
{
    printf("attn_linear: the oracle's linears use variant %s on this CPU\n", moe_dot_isa_name(moe_dot_isa_best()));
    const uint64_t seed = mmoe_test_seed("attn_linear/fp8 few rows");
    for (int64_t T = 1; T <= 9; T++) {
        check_fp8_linear(seed + (uint64_t)T, 128, T, 138, 512, FP8_CODES_ALL);
        check_fp8_linear(seed + 100 + (uint64_t)T, 32, T, 42, 256, FP8_CODES_ALL);
    }
}
END_TEST

/*
 * Weight scale bytes over 1..254 and every finite code, rows of magnitudes 1e-6 .. 16: step 3's
 * scale products and scaled partials range from 0 and subnormal fp32 numbers to overflow, each
 * weight row block with its own scale.  Calls of 3 and 7 rows (the register path and the tile
 * path of the AVX2 variant), N across two weight tiles.  (A fused multiply-add in step 3 could
 * differ from its rounded product and sum only where the product is subnormal and the sum
 * crosses into the normal range; the case does not claim to catch that.)
 */
START_TEST(fp8_linear_wide_scales)
{
    const uint64_t seed = mmoe_test_seed("attn_linear/fp8 wide scales");
    check_fp8_linear(seed, 128, 3, 640, 512, FP8_CODES_ALL_WIDE_SCALES);
    check_fp8_linear(seed + 1, 128, 7, 640, 512, FP8_CODES_ALL_WIDE_SCALES);
}
END_TEST

/*
 * NaN weight codes (0x7F, 0xFF) in about a third of the weight rows: those rows' outputs are NaN
 * and every other output keeps its bits, in calls of 1 to 9 rows (the register paths and the
 * tile path), both block widths.
 */
START_TEST(fp8_linear_nan_codes)
{
    const uint64_t seed = mmoe_test_seed("attn_linear/fp8 nan codes");
    for (int64_t T = 1; T <= 9; T += 2) {
        check_fp8_linear(seed + (uint64_t)T, 128, T, 138, 512, FP8_CODES_SOME_NAN);
        check_fp8_linear(seed + 100 + (uint64_t)T, 32, T, 42, 256, FP8_CODES_SOME_NAN);
    }
}
END_TEST

/*
 * Step 1 (attn_fp8_quantize_rows()) with every kernel variant that runs here gives the generic
 * variant's values and scales, bit for bit (the generic one is mmoe_quant_row_fp8_ue8m0() and the
 * E4M3 table).  Each 128-wide block holds 256 * 2^e (e from -30 to 30, so that the scale is 2^e
 * or 2^(e+1)) and, times 2^e, every E4M3 value, every midpoint between neighbours (the ties of
 * the rounding, on both sides of 2^-6 where the step changes from 2^-9 to the binade's) and the
 * BF16 neighbours of the midpoints, with random signs, zeros of both signs, values that round to
 * zero, and in some blocks -500 * 2^e (then the block's amax); a row with a NaN and one with an
 * infinity take the definition.  Widths 128 and 384.  (The clamp to +-448 never acts on BF16
 * inputs: amax / s exceeds 448 only for amax within 2^-24 relative of 448 * 2^e, where BF16 has
 * no value; a break removing it passes.)
 */
START_TEST(fp8_quantize_every_kernel)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_linear/quantize"));
    enum { T = 24, KMAX = 384 };
    const float *e4m3 = mmoe_fp8_e4m3_table();
    float cand[1024];
    int nc = 0;
    for (int c = 0; c < 0x7E; c++) { /* positive finite codes and the midpoint above each */
        const float a = e4m3[c], b = e4m3[c + 1], mid = 0.5f * (a + b);
        cand[nc++] = a;
        cand[nc++] = mid;
        cand[nc++] = mmoe_bf16_to_f32((uint16_t)(mmoe_bf16_from_f32(mid) + 1));
        cand[nc++] = mmoe_bf16_to_f32((uint16_t)(mmoe_bf16_from_f32(mid) - 1));
    }
    cand[nc++] = 448.0f;
    cand[nc++] = 0.0f;
    cand[nc++] = 0x1p-11f; /* rounds to zero */
    cand[nc++] = 0x1p-10f; /* the tie between 0 and 2^-9: to 0 */
    cand[nc++] = 0x1.8p-10f;
    uint16_t *x = malloc(2 * (size_t)(T * KMAX));
    double *want = malloc(sizeof(double) * T * KMAX), *got = malloc(sizeof(double) * T * KMAX);
    float *sw = malloc(sizeof(float) * T * 3), *sg = malloc(sizeof(float) * T * 3);
    ck_assert(x && want && got && sw && sg);
    const int64_t widths[] = {128, 384};
    int compared = 0;
    for (size_t wi = 0; wi < 2; wi++) {
        const int64_t K = widths[wi];
        for (int64_t t = 0; t < T; t++)
            for (int64_t b = 0; b < K / 128; b++) {
                const int e = (int)mmoe_rng_below(&rng, 61) - 30;
                uint16_t *xb = x + t * K + b * 128;
                xb[0] = mmoe_bf16_from_f32(ldexpf(256.0f, e));
                for (int i = 1; i < 128; i++) {
                    const float v = cand[mmoe_rng_below(&rng, (uint64_t)nc)] * (mmoe_rng_below(&rng, 2) ? -1.0f : 1.0f);
                    xb[i] = mmoe_bf16_from_f32(ldexpf(v, e));
                }
                if (mmoe_rng_below(&rng, 8) == 0) /* above the block's 256: a new amax */
                    xb[1 + mmoe_rng_below(&rng, 127)] = mmoe_bf16_from_f32(ldexpf(-500.0f, e));
            }
        x[3 * K + 77] = 0x7FC0;  /* a NaN */
        x[5 * K + 5] = 0xFF80;   /* -Inf */
        x[7 * K + 9] = 0x8000;   /* -0 */
        mmoe_error err;
        for (int i = 0; i < T * KMAX; i++)
            want[i] = NAN;
        ck_assert_msg(attn_fp8_quantize_rows(MOE_DOT_ISA_GENERIC, x, T, K, want, sw, &err) == MMOE_OK, "%s", err.msg);
        for (int isa = 1; isa < MOE_DOT_ISA_COUNT; isa++) {
            if (!moe_dot_isa_runs_here((moe_dot_isa)isa))
                continue;
            for (int i = 0; i < T * KMAX; i++)
                got[i] = 0.5;
            ck_assert_msg(attn_fp8_quantize_rows((moe_dot_isa)isa, x, T, K, got, sg, &err) == MMOE_OK, "%s", err.msg);
            for (int64_t i = 0; i < T * K; i++)
                ck_assert_msg(memcmp(&got[i], &want[i], sizeof got[i]) == 0,
                              "%s, K %lld, row %lld, column %lld: x %04x -> %a, expected %a",
                              moe_dot_isa_name((moe_dot_isa)isa), (long long)K, (long long)(i / K), (long long)(i % K),
                              x[i], got[i], want[i]);
            ck_assert(memcmp(sg, sw, sizeof(float) * (size_t)(T * K / 128)) == 0);
            compared++;
        }
    }
    printf("attn_linear: quantization compared under %d kernel variants\n", compared / 2);
    free(x);
    free(want);
    free(got);
    free(sw);
    free(sg);
}
END_TEST

START_TEST(fp8_linear_rejects_bad_input)
{
    attn_test_layer L = {0};
    mmoe_rng rng;
    mmoe_rng_seed(&rng, 1);
    mmoe_tensor w, s;
    attn_test_fp8_weight(&L, &rng, 64, 96, 32, &w, &s);
    uint16_t x[96], y[64];
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_linear_fp8(x, 1, &w, &s, 32, y, &err), MMOE_ERANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "multiple of 128"));
    attn_test_fp8_weight(&L, &rng, 64, 128, 128, &w, &s);
    ((uint8_t *)s.data)[0] = 0xFF;
    ck_assert_int_eq(mmoe_linear_fp8(x, 1, &w, &s, 128, y, &err), MMOE_ERANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "255"));
    s.shape[1] = 2;
    ck_assert_int_eq(mmoe_linear_fp8(x, 1, &w, &s, 128, y, &err), MMOE_ESHAPE);
    ck_assert_ptr_nonnull(strstr(err.msg, "expected shape [1, 1]"));
    attn_test_layer_free(&L);
}
END_TEST

START_TEST(dense_linear_matches_f64)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_linear/dense"));
    attn_test_layer L = {0};
    const int64_t T = 7, N = 33, K = 200;
    mmoe_tensor w = attn_test_bf16_tensor(&L, &rng, N, K, 0.0, 0.3);
    uint16_t x[7 * 200], yb[7 * 33];
    float y[7 * 33];
    attn_test_fill_bf16(&rng, x, T * K, 0.5, 1.0);
    mmoe_test_poison_f32(y, (size_t)(T * N));
    mmoe_test_poison_bf16(yb, (size_t)(T * N));
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_linear_dense(x, T, K, &w, N, y, yb, &err), MMOE_OK);
    const uint16_t *wd = w.data;
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            long double ref = 0.0L, mag = 0.0L;
            for (int64_t k = 0; k < K; k++) {
                const long double pr = (long double)mmoe_bf16_to_f32(x[t * K + k]) *
                                       (long double)mmoe_bf16_to_f32(wd[n * K + k]);
                ref += pr;
                mag += fabsl(pr);
            }
            /* bound: half an fp32 ulp of the result plus the double accumulation error
               (K * 2^-53 * sum|x w|, generous) */
            const double tol = 0.5 * ldexp(1.0, ilogb((double)ref) - 23) + K * ldexp((double)mag, -53);
            ck_assert_msg(fabs((double)y[t * N + n] - (double)ref) <= tol, "y %.9g ref %.9Lg", y[t * N + n], ref);
            ck_assert_uint_eq(yb[t * N + n], mmoe_bf16_from_f32(y[t * N + n]));
        }
    /* a wrong weight shape is reported */
    ck_assert_int_eq(mmoe_linear_dense(x, T, K, &w, N + 1, y, NULL, &err), MMOE_ESHAPE);
    attn_test_layer_free(&L);
}
END_TEST

START_TEST(rmsnorm_matches_f64)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_linear/rmsnorm"));
    attn_test_layer L = {0};
    const int64_t T = 5, n = 256;
    mmoe_tensor wt = attn_test_bf16_tensor(&L, &rng, n, 0, 1.0, 0.2);
    uint16_t x[5 * 256], y[5 * 256];
    for (int64_t t = 0; t < T; t++)
        attn_test_fill_bf16(&rng, x + t * n, n, 0.0, ldexp(1.0, 3 * (int)t - 6));
    mmoe_test_poison_bf16(y, (size_t)(T * n));
    const float eps = 1e-6f;
    mmoe_rmsnorm_bf16(x, T, n, &wt, eps, y);
    for (int64_t t = 0; t < T; t++) {
        double ss = 0.0;
        for (int64_t i = 0; i < n; i++)
            ss += (double)mmoe_bf16_to_f32(x[t * n + i]) * mmoe_bf16_to_f32(x[t * n + i]);
        const double rs = 1.0 / sqrt(ss / n + (double)eps);
        for (int64_t i = 0; i < n; i++) {
            const double ref = mmoe_bf16_to_f32(((uint16_t *)wt.data)[i]) * mmoe_bf16_to_f32(x[t * n + i]) * rs;
            /* bf16 rounding (unit roundoff 2^-8: 8 significant bits) plus a few fp32
               roundings inside (< 2^-20) */
            ck_assert_msg(fabs(mmoe_bf16_to_f32(y[t * n + i]) - ref) <= fabs(ref) * (ldexp(1.0, -8) + ldexp(1.0, -20)),
                          "row %lld elt %lld: %g vs %g", (long long)t, (long long)i,
                          mmoe_bf16_to_f32(y[t * n + i]), ref);
        }
    }
    attn_test_layer_free(&L);
}
END_TEST

START_TEST(fp8_roundtrip_bit_exact)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_linear/rt8"));
    enum { N = 64 * 6 };
    uint16_t x[N], orig[N];
    for (int b = 0; b < 6; b++) /* magnitudes from tiny (clamped amax) to large */
        attn_test_fill_bf16(&rng, x + b * 64, 64, 0.0, ldexp(1.0, 4 * b - 16));
    memcpy(orig, x, sizeof x);
    mmoe_roundtrip_fp8_bf16(x, N, 64);
    double xr[64], xq[64];
    for (int b = 0; b < 6; b++) {
        for (int i = 0; i < 64; i++)
            xr[i] = mmoe_bf16_to_f32(orig[b * 64 + i]);
        const double s = attn_ref_fp8_block(xr, 64, xq);
        for (int i = 0; i < 64; i++)
            ck_assert_uint_eq(x[b * 64 + i], mmoe_bf16_from_f32((float)(xq[i] * s)));
    }
}
END_TEST

START_TEST(fp4_roundtrip_bit_exact)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_linear/rt4"));
    enum { N = 32 * 6 };
    uint16_t x[N], orig[N];
    for (int b = 0; b < 6; b++)
        attn_test_fill_bf16(&rng, x + b * 32, 32, 0.0, ldexp(1.0, 3 * b - 8));
    /* exact ties of the E2M1 grid after scaling: 0.75 -> 1, 1.75 -> 2, 5 -> 4 (scale 1: amax 6) */
    attn_test_fill_bf16(&rng, x + 5 * 32, 32, 0.0, 0.5);
    const float ties[5] = {6.0f, 0.75f, 1.75f, 5.0f, -2.5f};
    for (int i = 0; i < 5; i++)
        x[5 * 32 + i] = mmoe_bf16_from_f32(ties[i]);
    memcpy(orig, x, sizeof x);
    mmoe_roundtrip_fp4_bf16(x, N, 32);
    for (int b = 0; b < 6; b++) {
        double amax = 6.0 * ldexp(1.0, -126);
        for (int i = 0; i < 32; i++)
            amax = fmax(amax, fabs((double)mmoe_bf16_to_f32(orig[b * 32 + i])));
        const double s = attn_ref_pow2_scale(amax, 6.0);
        for (int i = 0; i < 32; i++) {
            const double v = mmoe_bf16_to_f32(orig[b * 32 + i]) / s;
            const double q = attn_ref_round_to_grid(fmin(fmax(v, -6.0), 6.0), e2m1_grid, 8);
            ck_assert_uint_eq(x[b * 32 + i], mmoe_bf16_from_f32((float)(q * s)));
        }
    }
    /* hand-checked ties (scale 1): 0.75 -> 1.0, 1.75 -> 2.0, 5.0 -> 4.0, -2.5 -> -2.0 */
    ck_assert_float_eq(mmoe_bf16_to_f32(x[5 * 32 + 1]), 1.0f);
    ck_assert_float_eq(mmoe_bf16_to_f32(x[5 * 32 + 2]), 2.0f);
    ck_assert_float_eq(mmoe_bf16_to_f32(x[5 * 32 + 3]), 4.0f);
    ck_assert_float_eq(mmoe_bf16_to_f32(x[5 * 32 + 4]), -2.0f);
}
END_TEST

static Suite *attn_linear_suite(void)
{
    Suite *s = suite_create("attn_linear");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, fp8_linear_128_blocks);
    tcase_add_test(tc, fp8_linear_32_blocks);
    tcase_add_test(tc, fp8_linear_few_rows_every_code);
    tcase_add_test(tc, fp8_linear_wide_scales);
    tcase_add_test(tc, fp8_linear_nan_codes);
    tcase_add_test(tc, fp8_quantize_every_kernel);
    tcase_add_test(tc, fp8_linear_rejects_bad_input);
    tcase_add_test(tc, dense_linear_matches_f64);
    tcase_add_test(tc, rmsnorm_matches_f64);
    tcase_add_test(tc, fp8_roundtrip_bit_exact);
    tcase_add_test(tc, fp4_roundtrip_bit_exact);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(attn_linear_suite());
}
