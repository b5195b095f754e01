/**
 * @file test_gpu_forward_blocks.c
 * @brief Suite "gpu_forward_blocks": each block of the GPU forward against the same CPU block, on
 *        random inputs at tiny and V4-Flash widths (skipped, exit 77, without a GPU).
 *
 * The GPU entry points (gpu_forward_internal.h, gfw_test_*) run exactly the kernels of the
 * forward.  Inputs are drawn from a printed seed; outputs are NaN-poisoned first.
 *
 * **Bit-exact** (same operations in the same order, or exact sums whose order does not
 * matter): RMSNorm, the FP8 block-scaled linear, the dense linear (BF16 and F32 weights),
 * the mHC write-back, the FP8 and Hadamard + FP4 round trips (the indexer queries' kernel and
 * the compressor's device code), the indexer scores and the top-k order (ties included).
 *
 * **exp.**  The device's expf (gfw_expf) is glibc's algorithm (the build for CPUs with FMA),
 * so that it returns the host's expf bit for bit there; test_expf checks that on 2^22 inputs
 * over the whole range (and +-inf, NaN).  Where every input agrees (exp_probe()), the
 * exp-based blocks below must be bit-exact too; with another C library they are held to the
 * bounds below.  The router's log1p (mmoe_log1p.h) uses no library: test_log1pf holds the
 * device's to the host's bit for bit on any machine.
 *
 * **Bounded** (two fp32 exps that differ by at most one ulp per call):
 * - hc_pre: pre = sigmoid(.) + eps and post = 2 sigmoid(.) move by a few fp32 ulp
 *   (|d| <= 2^-20 here, values <= 2); the Sinkhorn matrix, built from exps and 39 rounds of
 *   normalization, moves by |d| <= 2^-16 (entries in [0, 1]); y = bf16(sum pre X) may round
 *   the other way: |dy| <= 2^-7 |y| + 2^-20 max|X|.
 * - attention: each exp(s - m) moves by one ulp, which may flip its bf16 rounding for P.V
 *   (2^-8 relative of that term); summed over the list this moves acc/den by at most
 *   2^-8 max|kv|, and the output's own bf16 rounding may flip: |do| <= 2^-7 (max|kv| + |o|).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "gpu_forward_internal.h"
#include "mmoe_formats.h"
#include "mmoe_gpu_moe.h"
#include "mmoe_linear.h"
#include "mmoe_log1p.h"
#include "mmoe_mhc.h"
#include "mmoe_rng.h"
#include "mmoe_sum_order.h"
#include "mmoe_test.h"
#include "moe_internal.h"

static uint64_t g_seed;

/** A tensor view. */
static mmoe_tensor view(mmoe_dtype dt, int ndim, int64_t r, int64_t c, void *data)
{
    mmoe_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    t.shape[0] = r;
    t.shape[1] = c;
    t.data = data;
    t.nbytes = (size_t)(ndim == 1 ? r : r * c) * mmoe_dtype_size(dt);
    return t;
}

/** Uniform in [-a, a). */
static float unif(mmoe_rng *r, float a)
{
    return (float)((mmoe_rng_below(r, 1u << 24) / (double)(1u << 24)) * 2.0 - 1.0) * a;
}

/** n random bf16 values of magnitude about @p a. */
static uint16_t *rand_bf16(mmoe_rng *r, size_t n, float a)
{
    uint16_t *p = malloc(2 * n);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = mmoe_bf16_from_f32(unif(r, a));
    return p;
}

/** n random finite E4M3 codes. */
static uint8_t *rand_e4m3(mmoe_rng *r, size_t n)
{
    uint8_t *p = malloc(n);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)mmoe_rng_below(r, 256);
        p[i] = (c & 0x7F) == 0x7F ? 0x7E : c;
    }
    return p;
}

/** Bitwise equal bf16 arrays, or fail naming the first difference. */
static void expect_same_u16(const char *what, const uint16_t *g, const uint16_t *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(g[i] == c[i], "%s: element %zu: gpu 0x%04x, cpu 0x%04x (seed %llu)", what, i, g[i], c[i],
                      (unsigned long long)g_seed);
}

/** Bitwise equal floats. */
static void expect_same_f32(const char *what, const float *g, const float *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&g[i], &c[i], 4) == 0, "%s: element %zu: gpu %a, cpu %a (seed %llu)", what, i, g[i], c[i],
                      (unsigned long long)g_seed);
}

static void check_rmsnorm(int64_t T, int64_t n)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)n);
    uint16_t *x = rand_bf16(&r, (size_t)(T * n), 3.0f), *w = rand_bf16(&r, (size_t)n, 1.5f);
    uint16_t *yc = malloc(2 * (size_t)(T * n)), *yg = malloc(2 * (size_t)(T * n));
    mmoe_tensor wt = view(MMOE_DT_BF16, 1, n, 0, w);
    mmoe_rmsnorm_bf16(x, T, n, &wt, 1e-6f, yc);
    mmoe_test_poison_bf16(yg, (size_t)(T * n));
    mmoe_error err;
    ck_assert_msg(gfw_test_rmsnorm(x, T, n, w, 1e-6f, yg, &err) == MMOE_OK, "%s", err.msg);
    expect_same_u16("rmsnorm", yg, yc, (size_t)(T * n));
    free(x), free(w), free(yc), free(yg);
}

/**
 * glibc's expf as built for CPUs with FMA, written out here from its published algorithm (N = 32
 * table of 2^(i/32), k by the 1.5*2^52 shift, cubic in r, fused multiply-adds): the test's
 * own statement of what "the host's expf" is on such a machine.
 */
static float glibc_fma_expf(float x)
{
    if (isnan(x))
        return x + x;
    if (isinf(x))
        return x > 0.0f ? x : 0.0f;
    const double inv = 0x1.71547652b82fep+0 * 32, shift = 0x1.8p+52;
    const double c0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32, c1 = 0x1.ebfce50fac4f3p-3 / 32 / 32, c2 = 0x1.62e42ff0c52d6p-1 / 32;
    double kd = fma(inv, (double)x, shift);
    uint64_t ki;
    memcpy(&ki, &kd, 8);
    kd -= shift;
    const double r = fma(inv, (double)x, -kd);
    const double e = (double)exp2l((long double)(ki % 32) / 32.0L);
    uint64_t t;
    memcpy(&t, &e, 8);
    t = t - ((ki % 32) << 47) + (ki << 47);
    double s;
    memcpy(&s, &t, 8);
    const double z = fma(c0, r, c1), r2 = r * r;
    double y = fma(c2, r, 1.0);
    y = fma(z, r2, y);
    return (float)(y * s);
}

/**
 * The device's expf against the host's on 2^22 random inputs of the whole range and the specials.
 * Fails when one differs by more than one ulp, and when the host's expf is glibc's FMA build
 * (it equals glibc_fma_expf() on the whole sample) but the device's differs anywhere.  Returns 1
 * when the device equals the host everywhere (then the exp-based blocks must be exact).
 */
static int exp_probe(void)
{
    const int64_t n = 1 << 22;
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    ck_assert(x && y);
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ 0xe4f);
    const float special[6] = {INFINITY, -INFINITY, 0.0f, -0.0f, 88.72283f, -103.97208f};
    for (int64_t i = 0; i < n; i++)
        x[i] = i < 6 ? special[i] : (i & 1 ? unif(&r, 110.0f) : unif(&r, 12.0f));
    mmoe_test_poison_f32(y, (size_t)n);
    mmoe_error err;
    ck_assert_msg(gfw_test_unary(GFW_TEST_EXPF, x, n, y, &err) == MMOE_OK, "%s", err.msg);
    int64_t diff = 0, far = 0, host_glibc = 1;
    for (int64_t i = 0; i < n; i++) {
        const float h = expf(x[i]), ref = glibc_fma_expf(x[i]);
        host_glibc &= memcmp(&h, &ref, 4) == 0;
        if (memcmp(&h, &y[i], 4) != 0) {
            diff++;
            far += mmoe_test_ulp_f32(h, y[i]) > 1;
        }
    }
    fprintf(stderr, "gpu_forward_blocks: expf: %lld of %lld differ from the host's (by more than 1 ulp: %lld); "
            "host expf %s glibc's FMA build\n", (long long)diff, (long long)n, (long long)far,
            host_glibc ? "is" : "is not");
    ck_assert_msg(far == 0 && y[1] == 0.0f && isinf(y[0]), "device expf is off by more than one ulp (seed %llu)",
                  (unsigned long long)g_seed);
    ck_assert_msg(!host_glibc || diff == 0, "device expf differs from glibc's on %lld inputs (seed %llu)",
                  (long long)diff, (unsigned long long)g_seed);
    free(x);
    free(y);
    return diff == 0;
}

START_TEST(test_expf)
{
    exp_probe();
}
END_TEST

/*
 * The router's log1p on the device against the host's, bit for bit, always: mmoe_log1p.h is one
 * fixed sequence of IEEE float64 operations (fma written out, the device's _rn intrinsics), so
 * no compiler or library may make the two differ.  2^22 arguments: e^z for z uniform in
 * [-110, 20] (what the router gives it: subnormals to 4.9e8), uniform in (-1, 1), and the
 * special values.
 */
START_TEST(test_log1pf)
{
    const int64_t n = 1 << 22;
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    ck_assert(x && y);
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ 0x1091);
    const float special[8] = {0.0f, -0.0f, -1.0f, -2.0f, INFINITY, NAN, 0x1p-149f, 1.0f};
    for (int64_t i = 0; i < n; i++)
        x[i] = i < 8 ? special[i]
                     : (i & 1 ? expf(unif(&r, 65.0f) - 45.0f) : unif(&r, 1.0f)); /* z in [-110, 20]; (-1, 1) */
    mmoe_test_poison_f32(y, (size_t)n);
    mmoe_error err;
    ck_assert_msg(gfw_test_unary(GFW_TEST_LOG1PF, x, n, y, &err) == MMOE_OK, "%s", err.msg);
    int64_t diff = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        const float h = mmoe_log1pf(x[i]);
        const int same = memcmp(&h, &y[i], 4) == 0 || (isnan(h) && isnan(y[i]));
        diff += !same;
        if (!same && first < 0)
            first = i;
    }
    fprintf(stderr, "gpu_forward_blocks: log1pf: %lld of %lld differ from the host's\n", (long long)diff,
            (long long)n);
    ck_assert_msg(diff == 0, "device mmoe_log1pf differs from the host's at %lld inputs, first x = %a: %a vs %a "
                  "(seed %llu)", (long long)diff, first >= 0 ? (double)x[first] : 0.0,
                  first >= 0 ? (double)y[first] : 0.0, first >= 0 ? (double)mmoe_log1pf(x[first]) : 0.0,
                  (unsigned long long)g_seed);
    free(x);
    free(y);
}
END_TEST

/**
 * The rows of mmoe_test_sum_order_row(), whose bf16 output depends on the order of the double
 * sum of squares (tests/test_sum_order.c checks that some rows do): the GPU's parallel sum must
 * be the oracle's order, not only close to it.
 */
static void check_rmsnorm_order(void)
{
    const int64_t T = MMOE_TEST_SUM_ORDER_ROWS, n = 4096;
    uint16_t *x = malloc(2 * (size_t)(T * n)), *w = malloc(2 * (size_t)n);
    uint16_t *yc = malloc(2 * (size_t)(T * n)), *yg = malloc(2 * (size_t)(T * n));
    ck_assert(x && w && yc && yg);
    for (int64_t r = 0; r < T; r++)
        mmoe_test_sum_order_row((int)r, n, x + r * n);
    mmoe_test_sum_order_weight(n, w);
    mmoe_tensor wt = view(MMOE_DT_BF16, 1, n, 0, w);
    mmoe_rmsnorm_bf16(x, T, n, &wt, 0.0f, yc);
    mmoe_test_poison_bf16(yg, (size_t)(T * n));
    mmoe_error err;
    ck_assert_msg(gfw_test_rmsnorm(x, T, n, w, 0.0f, yg, &err) == MMOE_OK, "%s", err.msg);
    size_t bad = 0;
    while (bad < (size_t)(T * n) && yg[bad] == yc[bad])
        bad++;
    ck_assert_msg(bad == (size_t)(T * n), "rmsnorm order rows: element %zu: gpu %04x, cpu %04x", bad,
                  yg[bad < (size_t)(T * n) ? bad : 0], yc[bad < (size_t)(T * n) ? bad : 0]);
    free(x), free(w), free(yc), free(yg);
}

START_TEST(test_rmsnorm)
{
    check_rmsnorm(3, 128);
    check_rmsnorm(5, 4096);
    check_rmsnorm(2, 1024);
    check_rmsnorm(2, 100);  /* a short last chunk */
    check_rmsnorm(2, 7168); /* 448 chunks: 512 threads, the last 64 past the row */
    check_rmsnorm(1, 4096); /* one token (decode) */
    check_rmsnorm(2, 8192);  /* 512 chunks: 512 threads, the most of the register path */
    check_rmsnorm(2, 16384); /* 1024 chunks, more than 512: 256 threads of four chunks */
    check_rmsnorm(2, 20000); /* 1250 chunks, more than 1024: 256 threads of eight chunks */
    check_rmsnorm_order();
}
END_TEST

/** Kinds of FP8 linear inputs. */
typedef enum {
    FP8_RANDOM,  /**< uniform x, random finite codes */
    FP8_EXTREME, /**< x over 2^-24..2^8 (the full code range after quantization), codes +-448,
                      +-2^-9, zeros and random ones */
    FP8_NAN      /**< x over 2^0..2^8, FP8_EXTREME's codes with about one NaN in 4096 */
} fp8_kind;

/** A weight code of the FP8_EXTREME / FP8_NAN kinds. */
static uint8_t extreme_e4m3(mmoe_rng *r, int nan)
{
    static const uint8_t pick[8] = {0x7E, 0xFE, 0x01, 0x81, 0x00, 0x80, 0x08, 0x77};
    const uint32_t u = mmoe_rng_below(r, 4096);
    if (nan && u == 0)
        return (uint8_t)(0x7F | (mmoe_rng_below(r, 2) << 7));
    if (u < 2048)
        return pick[u % 8];
    const uint8_t c = (uint8_t)mmoe_rng_below(r, 256);
    return (c & 0x7F) == 0x7F ? 0x7E : c;
}

/**
 * n x values: random sign, (1 + m/8) 2^(-24..8) and some zeros (FP8_EXTREME), or (1 + m/8)
 * 2^(0..8) (FP8_NAN: no zero code after quantization, so that a NaN weight meets no 0 x NaN
 * product, whose treatment a BLAS may shortcut).
 */
static uint16_t *extreme_bf16(mmoe_rng *r, size_t n, fp8_kind kind)
{
    uint16_t *p = malloc(2 * n);
    ck_assert_ptr_nonnull(p);
    const int lo = kind == FP8_NAN ? 0 : -24;
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = kind == FP8_NAN ? 1 : mmoe_rng_below(r, 64);
        const float v = u == 0 ? 0.0f
                               : ldexpf(1.0f + (float)mmoe_rng_below(r, 8) / 8.0f, (int)mmoe_rng_below(r, 9 - lo) + lo);
        p[i] = mmoe_bf16_from_f32(mmoe_rng_below(r, 2) ? -v : v);
    }
    return p;
}

/** Equal bf16 arrays where NaN matches any NaN (the NaN payloads of CPU and GPU differ), else bitwise. */
static void expect_same_u16_nan(const char *what, const uint16_t *g, const uint16_t *c, size_t n)
{
    size_t nans = 0;
    for (size_t i = 0; i < n; i++) {
        const int gn = (g[i] & 0x7FFF) > 0x7F80, cn = (c[i] & 0x7FFF) > 0x7F80;
        nans += (size_t)cn;
        ck_assert_msg(gn == cn && (cn || g[i] == c[i]), "%s: element %zu: gpu 0x%04x, cpu 0x%04x (seed %llu)", what, i,
                      g[i], c[i], (unsigned long long)g_seed);
    }
    ck_assert_msg(nans > 0 && nans < n, "%s: %zu NaN outputs of %zu (the test wants some)", what, nans, n);
}

/**
 * A NaN case's outputs made partly NaN whatever the seed: a NaN code at a random place of a
 * random row @p a of the weight w [N, K] (N >= 2), so that every output of row a is NaN (the
 * x values of the NaN cases are finite), and the NaN codes of another row b turned into 0x7E
 * (the largest finite magnitude, same sign), so that row b's outputs are finite.  The check
 * "some NaN outputs, not all" then holds by construction, not with a probability per seed.
 */
static void pin_nan_rows(mmoe_rng *r, uint8_t *w, int64_t N, int64_t K)
{
    const int64_t a = (int64_t)mmoe_rng_below(r, (uint64_t)N);
    const int64_t b = (a + 1 + (int64_t)mmoe_rng_below(r, (uint64_t)(N - 1))) % N;
    w[a * K + (int64_t)mmoe_rng_below(r, (uint64_t)K)] = 0x7F;
    for (int64_t k = 0; k < K; k++)
        if ((w[b * K + k] & 0x7F) == 0x7F)
            w[b * K + k] = (uint8_t)((w[b * K + k] & 0x80) | 0x7E);
}

/** Weight codes [N, K] and scale bytes of @p block blocks of a kind (random finite or extreme codes). */
static void make_fp8_weight(mmoe_rng *r, int64_t N, int64_t K, int block, fp8_kind kind, uint8_t **w, uint8_t **s)
{
    if (kind == FP8_RANDOM) {
        *w = rand_e4m3(r, (size_t)(N * K));
    } else {
        *w = malloc((size_t)(N * K));
        ck_assert_ptr_nonnull(*w);
        for (int64_t i = 0; i < N * K; i++)
            (*w)[i] = extreme_e4m3(r, kind == FP8_NAN);
        if (kind == FP8_NAN)
            pin_nan_rows(r, *w, N, K);
    }
    const int64_t sr = (N + block - 1) / block, sc = (K + block - 1) / block;
    *s = malloc((size_t)(sr * sc));
    ck_assert_ptr_nonnull(*s);
    for (int64_t i = 0; i < sr * sc; i++)
        (*s)[i] = (uint8_t)(112 + mmoe_rng_below(r, 12));
}

/** x [T, K] of a kind (fp8_kind). */
static uint16_t *make_fp8_x(mmoe_rng *r, int64_t T, int64_t K, fp8_kind kind)
{
    return kind == FP8_RANDOM ? rand_bf16(r, (size_t)(T * K), 4.0f) : extreme_bf16(r, (size_t)(T * K), kind);
}

/** The oracle's fp8 linear of x [T, K] with weight @p w, scales @p s into @p yc [T, N]. */
static void oracle_fp8(const uint16_t *x, int64_t T, int64_t N, int64_t K, int block, uint8_t *w, uint8_t *s,
                       uint16_t *yc)
{
    const int64_t sr = (N + block - 1) / block, sc = (K + block - 1) / block;
    mmoe_tensor wt = view(MMOE_DT_F8_E4M3, 2, N, K, w), st = view(MMOE_DT_F8_E8M0, 2, sr, sc, s);
    mmoe_error err;
    ck_assert_msg(mmoe_linear_fp8(x, T, &wt, &st, block, yc, &err) == MMOE_OK, "%s", err.msg);
}

/** GPU outputs @p yg [n] against the oracle's @p yc: bit for bit, NaN for NaN where @p kind has NaN codes. */
static void expect_fp8_outputs(const char *what, fp8_kind kind, const uint16_t *yg, const uint16_t *yc, size_t n)
{
    if (kind == FP8_NAN)
        expect_same_u16_nan(what, yg, yc, n);
    else
        expect_same_u16(what, yg, yc, n);
}

static void check_fp8_kind(int64_t T, int64_t N, int64_t K, int block, fp8_kind kind)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)(N * 7 + K + 1000003 * kind));
    uint16_t *x = make_fp8_x(&r, T, K, kind);
    uint8_t *w, *s;
    make_fp8_weight(&r, N, K, block, kind, &w, &s);
    uint16_t *yc = malloc(2 * (size_t)(T * N)), *yg = malloc(2 * (size_t)(T * N));
    oracle_fp8(x, T, N, K, block, w, s, yc);
    mmoe_error err;
    mmoe_test_poison_bf16(yg, (size_t)(T * N));
    ck_assert_msg(gfw_test_linear_fp8(x, T, w, s, N, K, block, yg, &err) == MMOE_OK, "%s", err.msg);
    char what[64];
    snprintf(what, sizeof what, "fp8 linear %lldx%lld kind %d", (long long)N, (long long)K, (int)kind);
    expect_fp8_outputs(what, kind, yg, yc, (size_t)(T * N));
    free(x), free(w), free(s), free(yc), free(yg);
}

/**
 * Two FP8 linears of the same x in one launch (the forward's wq_a with wkv, wq_b with the
 * indexer's wq_b): each output against the oracle's linear of its own weight.
 */
static void check_fp8_pair(int64_t T, int64_t N0, int64_t N1, int64_t K, fp8_kind kind)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)(N0 * 5 + N1 * 11 + K + 1000033 * kind));
    uint16_t *x = make_fp8_x(&r, T, K, kind);
    uint8_t *w0, *s0, *w1, *s1;
    make_fp8_weight(&r, N0, K, 128, kind, &w0, &s0);
    make_fp8_weight(&r, N1, K, 128, kind, &w1, &s1);
    uint16_t *yc0 = malloc(2 * (size_t)(T * N0)), *yg0 = malloc(2 * (size_t)(T * N0));
    uint16_t *yc1 = malloc(2 * (size_t)(T * N1)), *yg1 = malloc(2 * (size_t)(T * N1));
    oracle_fp8(x, T, N0, K, 128, w0, s0, yc0);
    oracle_fp8(x, T, N1, K, 128, w1, s1, yc1);
    mmoe_test_poison_bf16(yg0, (size_t)(T * N0));
    mmoe_test_poison_bf16(yg1, (size_t)(T * N1));
    mmoe_error err;
    ck_assert_msg(gfw_test_linear_fp8_pair(x, T, K, w0, s0, N0, w1, s1, N1, yg0, yg1, &err) == MMOE_OK, "%s",
                  err.msg);
    char what[80];
    snprintf(what, sizeof what, "fp8 pair %lld+%lldx%lld T=%lld, first", (long long)N0, (long long)N1, (long long)K,
             (long long)T);
    expect_fp8_outputs(what, kind, yg0, yc0, (size_t)(T * N0));
    snprintf(what, sizeof what, "fp8 pair %lld+%lldx%lld T=%lld, second", (long long)N0, (long long)N1, (long long)K,
             (long long)T);
    expect_fp8_outputs(what, kind, yg1, yc1, (size_t)(T * N1));
    free(x), free(w0), free(s0), free(w1), free(s1), free(yc0), free(yg0), free(yc1), free(yg1);
}

static void check_fp8(int64_t T, int64_t N, int64_t K, int block)
{
    check_fp8_kind(T, N, K, block, FP8_RANDOM);
}

START_TEST(test_linear_fp8)
{
    check_fp8(3, 128, 256, 128);    /* tiny */
    check_fp8(5, 1024, 4096, 128);  /* wq_a */
    check_fp8(2, 32768, 1024, 128); /* wq_b */
    check_fp8(3, 4096, 8192, 128);  /* wo_b */
    check_fp8(2, 256, 512, 32);     /* 32x32 scale blocks */
    check_fp8(3, 201, 384, 128);    /* a short 512-code step, an odd last output */
    check_fp8(2, 40, 1536, 128);    /* a partial batch of steps, a partial block of warps */
    check_fp8(2, 24, 2560, 128);    /* five steps: the last batch half empty */
    check_fp8(1, 1, 128, 128);      /* one step, one output: a block of one live warp */
    /* decode (T = 1): on a 132-multiprocessor device the kernel shares a row pair's steps over
       4 warps (wq_a), over 8 (wkv), over 2 and 4 with a short and an empty slice, and streams
       8 pairs per warp (wq_b, 256 blocks), or 2 and 4 with an odd last row */
    check_fp8(1, 1024, 4096, 128);  /* wq_a */
    check_fp8(1, 512, 4096, 128);   /* wkv */
    check_fp8(1, 40, 1536, 128);    /* 3 steps over 2 warps */
    check_fp8(1, 24, 2560, 128);    /* 5 steps over 4 warps: 2, 2, 1, 0 */
    check_fp8(1, 32768, 1024, 128); /* wq_b */
    check_fp8(1, 8191, 512, 128);   /* 2 pairs per warp, the last pair one row */
    check_fp8(1, 16383, 1024, 128); /* 4 pairs per warp, the last pair one row */
    check_fp8(1, 4096, 8192, 128);  /* wo_b: two blocks per multiprocessor, 16 units per warp through the ring */
    check_fp8(2, 4095, 8192, 128);  /* 2 pairs per warp at K = 8192, an odd last row */
    check_fp8(1, 7, 128, 128);      /* K = 128: one short step, 3 of 4 ring slots never filled */
    check_fp8(4, 1023, 4096, 128);  /* T = 4: pairs per warp at K = 4096, the ring across pairs */
    check_fp8(7, 2049, 1024, 128);  /* T = 7, the most tokens of the one-token kernel: pairs per warp, an odd last row */
    /* from 8 tokens on: k_linear_fp8_tokens (FP64 MMAs over 32-token tiles) */
    check_fp8(8, 1024, 4096, 128);   /* one full n-tile (K split over the warps, on 132 multiprocessors) */
    check_fp8(64, 32768, 1024, 128); /* wq_b, a 64-token prefill: two token tiles */
    check_fp8(33, 4096, 8192, 128);  /* wo_b; the second token tile holds one token */
    check_fp8(13, 201, 384, 128);    /* a partial second n-tile, a warp with one live row; 3 K blocks */
    check_fp8(40, 7, 128, 128);      /* fewer rows than a warp's 8, one K block */
    check_fp8(9, 40, 640, 128);      /* 5 K blocks: K split, the second round with one live warp */
    check_fp8(64, 1024, 4096, 128);  /* wq_a at a 64-token prefill (K split on 132 multiprocessors) */
    check_fp8_kind(16, 96, 2048, 128, FP8_EXTREME);
    check_fp8_kind(24, 96, 1024, 128, FP8_NAN);
    /* on 132 multiprocessors: 16-token blocks (two MMA chains per n-tile), NaN and finite K blocks */
    check_fp8_kind(48, 4096, 1024, 128, FP8_NAN);
    /* on 132 multiprocessors: 32-token blocks with three live n-tiles (one chain each) */
    check_fp8_kind(24, 8480, 256, 128, FP8_EXTREME);
    check_fp8_kind(1, 96, 2048, 128, FP8_EXTREME); /* 4 steps over 4 warps */
    check_fp8_kind(1, 96, 2048, 128, FP8_NAN);
    check_fp8_kind(2, 96, 2048, 128, FP8_EXTREME);
    check_fp8_kind(2, 96, 1024, 128, FP8_NAN);
    check_fp8_kind(2, 256, 512, 32, FP8_NAN); /* the 32-block kernel's NaN path */
    /* two linears in one launch: wq_a + wkv and wq_b + the indexer's wq_b at decode (on 132
       multiprocessors: 4 slices each, 256 + 128 blocks; 7 pairs per warp each), odd rows and
       a short step in both halves, extreme and NaN codes, and from 8 tokens on two launches */
    check_fp8_pair(1, 1024, 512, 4096, FP8_RANDOM);
    check_fp8_pair(1, 32768, 8192, 1024, FP8_RANDOM);
    check_fp8_pair(3, 201, 41, 384, FP8_RANDOM);
    check_fp8_pair(1, 96, 40, 2048, FP8_EXTREME);
    check_fp8_pair(2, 96, 33, 1024, FP8_NAN);
    check_fp8_pair(9, 40, 24, 640, FP8_RANDOM);
}
END_TEST

static void check_dense(int64_t T, int64_t N, int64_t K, int f32)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)(N * 3 + K + f32));
    uint16_t *x = rand_bf16(&r, (size_t)(T * K), 2.0f);
    void *w;
    if (f32) {
        float *wf = malloc(sizeof(float) * (size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++)
            wf[i] = unif(&r, 0.05f);
        w = wf;
    } else {
        w = rand_bf16(&r, (size_t)(N * K), 0.05f);
    }
    float *yc = malloc(sizeof(float) * (size_t)(T * N)), *yg = malloc(sizeof(float) * (size_t)(T * N));
    mmoe_tensor wt = view(f32 ? MMOE_DT_F32 : MMOE_DT_BF16, 2, N, K, w);
    mmoe_error err;
    ck_assert_msg(mmoe_linear_dense(x, T, K, &wt, N, yc, NULL, &err) == MMOE_OK, "%s", err.msg);
    mmoe_test_poison_f32(yg, (size_t)(T * N));
    ck_assert_msg(gfw_test_linear_dense(x, T, K, w, f32, N, yg, &err) == MMOE_OK, "%s", err.msg);
    char what[64];
    snprintf(what, sizeof what, "dense linear %s %lldx%lld", f32 ? "f32" : "bf16", (long long)N, (long long)K);
    expect_same_f32(what, yg, yc, (size_t)(T * N));
    free(x), free(w), free(yc), free(yg);
}

/** Tokens per call of dense_ones_compare()'s few-token calls: a decode step's few. */
#define DENSE_ONES_CALL 4

/**
 * The oracle's dense linear of the T x rows [T, K] (bf16) against a weight row of ones into
 * @p yc; the GPU's into a poisoned buffer, compared bit for bit under @p what: with a BF16 row
 * of ones for all T rows in one call, then DENSE_ONES_CALL rows a call (the few-token form),
 * then an FP8 row of ones (code 0x38 = 1.0, scale byte 127 = 2^0: the same weights, so the same
 * oracle values) DENSE_ONES_CALL rows a call.
 */
static void dense_ones_compare(const char *what, const uint16_t *x, int64_t T, int64_t K, float *yc)
{
    const int block = 128;
    const int64_t sc = (K + block - 1) / block;
    uint16_t *w = malloc(2 * (size_t)K);
    uint8_t *w8 = malloc((size_t)K), *s8 = malloc((size_t)sc);
    float *yg = malloc(sizeof(float) * (size_t)T);
    ck_assert(w && w8 && s8 && yg);
    for (int64_t k = 0; k < K; k++)
        w[k] = mmoe_bf16_from_f32(1.0f), w8[k] = 0x38;
    memset(s8, 127, (size_t)sc);
    mmoe_tensor wt = view(MMOE_DT_BF16, 2, 1, K, w);
    mmoe_error err;
    ck_assert_msg(mmoe_linear_dense(x, T, K, &wt, 1, yc, NULL, &err) == MMOE_OK, "%s", err.msg);
    mmoe_test_poison_f32(yg, (size_t)T);
    ck_assert_msg(gfw_test_linear_dense(x, T, K, w, 0, 1, yg, &err) == MMOE_OK, "%s", err.msg);
    expect_same_f32(what, yg, yc, (size_t)T);
    char what_few[160];
    for (int f8 = 0; f8 < 2; f8++) {
        mmoe_test_poison_f32(yg, (size_t)T);
        for (int64_t r0 = 0; r0 < T; r0 += DENSE_ONES_CALL) {
            const int64_t n = T - r0 < DENSE_ONES_CALL ? T - r0 : DENSE_ONES_CALL;
            const mmoe_status st = f8 ? gfw_test_linear_dense_f8(x + r0 * K, n, K, w8, s8, block, 1, yg + r0, &err)
                                      : gfw_test_linear_dense(x + r0 * K, n, K, w, 0, 1, yg + r0, &err);
            ck_assert_msg(st == MMOE_OK, "%s", err.msg);
        }
        snprintf(what_few, sizeof what_few, "%s, %s ones, %d rows a call", what, f8 ? "fp8" : "bf16", DENSE_ONES_CALL);
        expect_same_f32(what_few, yg, yc, (size_t)T);
    }
    free(w), free(w8), free(s8), free(yg);
}

/**
 * The rows of mmoe_test_sum_order_sum_row() against a weight row of ones: each output's fp32
 * rounding depends on the order of its double sum (tests/test_sum_order.c), so the GPU must
 * sum in the oracle's order.
 */
static void check_dense_order(void)
{
    const int64_t T = MMOE_TEST_SUM_ORDER_ROWS, K = 4096;
    uint16_t *x = malloc(2 * (size_t)(T * K));
    float *yc = malloc(sizeof(float) * (size_t)T);
    ck_assert(x && yc);
    for (int64_t r = 0; r < T; r++)
        mmoe_test_sum_order_sum_row((int)r, K, x + r * K);
    dense_ones_compare("dense linear, order rows", x, T, K, yc);
    free(x), free(yc);
}

/**
 * The tree over the round nodes (a round is 32 chunks, 512 values): a weight row of ones
 * against x rows holding 2^60, 1, -2^60 and 1 at values 512 q, 512 (q + 1), 512 (q + 2),
 * 512 (q + 3) (q = 0, or 4 on odd rows) and zeros elsewhere.  Every round node is then one
 * of those values exactly, and the spec's tree adds (2^60 + 1) + (-2^60 + 1) = 2^60 + -2^60
 * = +0 (2^60 + 1 rounds to 2^60 in double), while a left fold of the nodes gives
 * ((2^60 + 1) + -2^60) + 1 = 1.  So every output is +0, derived here, and an order of the
 * nodes other than the spec's shows.
 */
static void check_dense_round_order(int64_t T, int64_t K)
{
    uint16_t *x = calloc((size_t)(T * K), 2);
    float *yc = malloc(sizeof(float) * (size_t)T);
    ck_assert(x && yc);
    const float v[4] = {0x1p60f, 1.0f, -0x1p60f, 1.0f};
    for (int64_t r = 0; r < T; r++)
        for (int i = 0; i < 4; i++)
            x[r * K + 512 * ((r & 1) * 4 + i)] = mmoe_bf16_from_f32(v[i]);
    dense_ones_compare("dense linear, round order rows", x, T, K, yc);
    for (int64_t r = 0; r < T; r++)
        ck_assert_msg(yc[r] == 0.0f && !signbit(yc[r]), "oracle, round order row %lld: %a, want +0", (long long)r,
                      yc[r]);
    free(x), free(yc);
}

/**
 * Dense linear with an FP8 weight (the grouped output projection's form) against the oracle's
 * attn_dense_rows: scale bytes over 1..160, so that chunks with scales inside and outside the
 * kernel's direct-decode range (10..134, with fp32 subnormals below it) both occur.  @p mode:
 * DF8_NAN, one weight code in 2048 is a NaN code and NaN outputs match any NaN; DF8_WIDE_X, one
 * x value in 32 is a BF16 of any exponent (subnormals and values near the largest included),
 * so that the products span the whole range the few-token kernel's scaled doubles must hold.
 */
enum { DF8_NAN = 1, DF8_WIDE_X = 2 };
static void check_dense_f8(int64_t T, int64_t N, int64_t K, int block, int mode)
{
    const int nan = mode & DF8_NAN;
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)(N * 5 + K + 77 * mode));
    uint16_t *x = rand_bf16(&r, (size_t)(T * K), 2.0f);
    for (int64_t i = 0; (mode & DF8_WIDE_X) && i < T * K; i++)
        if (mmoe_rng_below(&r, 32) == 0) /* sign, exponent field 0..254, mantissa: any finite bf16 */
            x[i] = (uint16_t)((mmoe_rng_below(&r, 2) << 15) | (mmoe_rng_below(&r, 255) << 7) | mmoe_rng_below(&r, 128));
    uint8_t *w = rand_e4m3(&r, (size_t)(N * K));
    for (int64_t i = 0; nan && i < N * K; i++)
        if (mmoe_rng_below(&r, 2048) == 0)
            w[i] = (uint8_t)(0x7F | (mmoe_rng_below(&r, 2) << 7));
    if (nan)
        pin_nan_rows(&r, w, N, K);
    const int64_t sr = (N + block - 1) / block, sc = (K + block - 1) / block;
    uint8_t *s = malloc((size_t)(sr * sc));
    double *xd = malloc(sizeof(double) * (size_t)(T * K));
    float *yc = malloc(sizeof(float) * (size_t)(T * N)), *yg = malloc(sizeof(float) * (size_t)(T * N));
    ck_assert(s && xd && yc && yg);
    for (int64_t i = 0; i < sr * sc; i++)
        s[i] = (uint8_t)(1 + mmoe_rng_below(&r, 160));
    for (int64_t i = 0; i < T * K; i++)
        xd[i] = (double)mmoe_bf16_to_f32(x[i]);
    mmoe_tensor wt = view(MMOE_DT_F8_E4M3, 2, N, K, w), st = view(MMOE_DT_F8_E8M0, 2, sr, sc, s);
    mmoe_error err;
    ck_assert_msg(attn_dense_rows(NULL, xd, T, K, K, &wt, &st, block, 0, N, yc, N, &err) == MMOE_OK, "%s", err.msg);
    mmoe_test_poison_f32(yg, (size_t)(T * N));
    ck_assert_msg(gfw_test_linear_dense_f8(x, T, K, w, s, block, N, yg, &err) == MMOE_OK, "%s", err.msg);
    size_t nans = 0;
    for (int64_t i = 0; i < T * N; i++) {
        const int gn = isnan(yg[i]), cn = isnan(yc[i]);
        nans += (size_t)cn;
        ck_assert_msg(gn == cn && (cn || memcmp(&yg[i], &yc[i], 4) == 0),
                      "dense linear f8 %lldx%lld: element %lld: gpu %a, cpu %a (seed %llu)", (long long)N,
                      (long long)K, (long long)i, yg[i], yc[i], (unsigned long long)g_seed);
    }
    ck_assert_msg(!nan || (nans > 0 && nans < (size_t)(T * N)), "dense linear f8: %zu NaN outputs (the test wants some)",
                  nans);
    free(x), free(w), free(s), free(xd), free(yc), free(yg);
}

/**
 * The order inside a chunk: row r (r = 0 .. 13) holds 2^60, 1 and -2^60 at values j - 1, j, j + 1
 * (j = r + 1) of one chunk (chunk (5 + 37 r) mod m, so that the rows fall on different lanes
 * and rounds) and zeros elsewhere, against a weight row of ones.  Summed in the spec's order
 * the chunk is (2^60 + 1) + -2^60 = +0 (2^60 + 1 rounds to 2^60 in double), and so is the row;
 * adding value j + 1 before value j gives (2^60 + -2^60) + 1 = 1.  So every output is +0,
 * derived here, and a swap of any two neighbouring values but the first two (whose sum from
 * +0 is the same either way) shows.
 */
static void check_dense_chunk_order(int64_t K)
{
    const int64_t T = MMOE_SUM_CHUNK - 2, m = K / MMOE_SUM_CHUNK;
    uint16_t *x = calloc((size_t)(T * K), 2);
    float *yc = malloc(sizeof(float) * (size_t)T);
    ck_assert(x && yc && m > 0);
    const float v[3] = {0x1p60f, 1.0f, -0x1p60f};
    for (int64_t r = 0; r < T; r++)
        for (int i = 0; i < 3; i++)
            x[r * K + ((5 + 37 * r) % m) * MMOE_SUM_CHUNK + r + i] = mmoe_bf16_from_f32(v[i]);
    dense_ones_compare("dense linear, chunk order rows", x, T, K, yc);
    for (int64_t r = 0; r < T; r++)
        ck_assert_msg(yc[r] == 0.0f && !signbit(yc[r]), "oracle, chunk order row %lld: %a, want +0", (long long)r,
                      yc[r]);
    free(x), free(yc);
}

/* ------------------------------------------------------------------ the FP8 linear's `tc` recipe */

/**
 * The dequantized inputs of the oracle's FP8 linear, in double: x̂ [T, K] (the V4 act_quant of
 * each row, mmoe_quant_row_fp8_ue8m0()) and ŵ [N, K] (code times its 128x128 block's scale),
 * for the bound A = sum_k |x̂_k ŵ_k| of gpu_linear_fp8_tc.cuh.
 */
static void tc_dequant(const uint16_t *x, int64_t T, int64_t N, int64_t K, const uint8_t *w, const uint8_t *s,
                       double *xd, double *wd)
{
    const float *e4m3 = mmoe_fp8_e4m3_table();
    float *row = malloc(sizeof(float) * (size_t)K);
    uint8_t *codes = malloc((size_t)K), *sf = malloc((size_t)(K / 128));
    ck_assert(row && codes && sf);
    mmoe_error err;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t k = 0; k < K; k++)
            row[k] = mmoe_bf16_to_f32(x[t * K + k]);
        ck_assert(mmoe_quant_row_fp8_ue8m0(row, (size_t)K, 128, MMOE_SF_RULE_V4, codes, sf, &err) == MMOE_OK);
        for (int64_t k = 0; k < K; k++)
            xd[t * K + k] = (double)e4m3[codes[k]] * ldexp(1.0, (int)sf[k / 128] - 127);
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            wd[n * K + k] = (double)e4m3[w[n * K + k]] * ldexp(1.0, (int)s[(n / 128) * (K / 128) + k / 128] - 127);
    free(row), free(codes), free(sf);
}

/** One unit in the last place of a bf16 value of magnitude @p m (the smallest normal's below it). */
static double bf16_ulp(double m)
{
    int e = 0;
    frexp(m > 0x1p-126 ? m : 0x1p-126, &e); /* m = f 2^e, f in [0.5, 1) */
    return ldexp(1.0, e - 8);
}

/**
 * GPU outputs @p yg [T, N] of the `tc` recipe against the oracle's @p yc: NaN where the oracle
 * has NaN, else |gpu - cpu| <= 2^-14 A + ulp_bf16(max(|gpu|, |cpu|)) (the bound derived in
 * gpu_linear_fp8_tc.cuh; A from the dequantized inputs).  Prints how many outputs are
 * bit-exact and the largest error as a fraction of its bound.
 */
static void expect_tc_bound(const char *what, const uint16_t *yg, const uint16_t *yc, const double *xd,
                            const double *wd, int64_t T, int64_t N, int64_t K)
{
    int64_t exact = 0, nans = 0;
    double worst = 0.0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            const int64_t i = t * N + n;
            const int gn = (yg[i] & 0x7FFF) > 0x7F80, cn = (yc[i] & 0x7FFF) > 0x7F80;
            ck_assert_msg(gn == cn, "%s: output [%lld, %lld]: gpu 0x%04x, cpu 0x%04x (seed %llu)", what, (long long)t,
                          (long long)n, yg[i], yc[i], (unsigned long long)g_seed);
            if (cn) {
                nans++;
                continue;
            }
            double A = 0.0;
            for (int64_t k = 0; k < K; k++)
                A += fabs(xd[t * K + k] * wd[n * K + k]);
            const double g = mmoe_bf16_to_f32(yg[i]), c = mmoe_bf16_to_f32(yc[i]);
            const double bound = 0x1p-14 * A + bf16_ulp(fmax(fabs(g), fabs(c)));
            const double e = fabs(g - c);
            ck_assert_msg(e <= bound, "%s: output [%lld, %lld]: gpu %a, cpu %a, error %.3g > bound %.3g (A = %.3g, "
                          "seed %llu)", what, (long long)t, (long long)n, g, c, e, bound, A,
                          (unsigned long long)g_seed);
            exact += yg[i] == yc[i];
            worst = fmax(worst, e / bound);
        }
    fprintf(stderr, "gpu_forward_blocks: %s: %lld of %lld outputs bit-exact, %lld NaN, worst error %.3f of its bound\n",
            what, (long long)exact, (long long)(T * N), (long long)nans, worst);
}

/**
 * A case whose block sums cancel (for the `tc` recipe's bound): every x is 1 (code 2^8 at scale
 * 2^-8), and in every 128-wide block of every row codes 0..3 are +448 and codes 4..7 are -448,
 * the other 120 small (2^-6 to 2^-4.1, random signs).  The exact partial is the sum of the small
 * products (4 to 15, multiples of 1/2), added to running sums of magnitude up to 4 x 448 x 2^8
 * (2^18.8).  An accumulator that keeps FP32's 24 bits (the chapter's model) keeps them all and
 * the outputs are the oracle's; one that kept about 14 bits (as reported for FP8 tensor-core
 * sums) would drop them, and the error, their sum, exceeds 2^-14 A for most rows (a float64
 * model of that accumulator: 445 of 512 rows): so the case fails exactly when the device sums
 * less precisely than the bound assumes.
 */
static void make_tc_cancel(mmoe_rng *r, uint16_t *x, int64_t T, uint8_t *w, int64_t N, int64_t K)
{
    for (int64_t i = 0; i < T * K; i++)
        x[i] = mmoe_bf16_from_f32(1.0f);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            const int64_t j = k % 128;
            const uint8_t small = (uint8_t)((mmoe_rng_below(r, 2) << 7) | ((1 + mmoe_rng_below(r, 2)) << 3) |
                                            mmoe_rng_below(r, 8));
            w[n * K + k] = j < 4 ? 0x7E : j < 8 ? 0xFE : small;
        }
}

/**
 * One case of the `tc` FP8 linear: weight(s) and x of @p kind, T tokens, N0 (and N1 > 0: a
 * second weight in the same launch) rows, K wide, @p post: the first linear's hc_post (N0 is
 * then the streams' width), @p cancel: the first weight and x made by make_tc_cancel(); every
 * case launched twice (so a count left behind shows as NaN).
 */
static void check_tc(int64_t T, int64_t N0, int64_t N1, int64_t K, fp8_kind kind, int post, int cancel)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)(N0 * 13 + N1 * 17 + K + 1000099 * kind + 7 * T + post + 31 * cancel));
    uint16_t *x = make_fp8_x(&r, T, K, kind);
    uint8_t *w0, *s0, *w1 = NULL, *s1 = NULL;
    make_fp8_weight(&r, N0, K, 128, kind, &w0, &s0);
    if (cancel)
        make_tc_cancel(&r, x, T, w0, N0, K);
    if (N1 > 0)
        make_fp8_weight(&r, N1, K, 128, kind, &w1, &s1);
    const int64_t hc = 4;
    uint16_t *yc0 = malloc(2 * (size_t)(T * N0)), *yg0 = malloc(2 * (size_t)(T * N0));
    uint16_t *yc1 = malloc(2 * (size_t)(T * (N1 > 0 ? N1 : 1))), *yg1 = malloc(2 * (size_t)(T * (N1 > 0 ? N1 : 1)));
    uint16_t *X = post ? rand_bf16(&r, (size_t)(T * hc * N0), 3.0f) : NULL;
    uint16_t *Xg = post ? malloc(2 * (size_t)(T * hc * N0)) : NULL, *Xc = post ? malloc(2 * (size_t)(T * hc * N0)) : NULL;
    float *pv = malloc(sizeof(float) * (size_t)(T * hc)), *cv = malloc(sizeof(float) * (size_t)(T * hc * hc));
    for (int64_t i = 0; i < T * hc; i++)
        pv[i] = unif(&r, 2.0f);
    for (int64_t i = 0; i < T * hc * hc; i++)
        cv[i] = unif(&r, 1.0f);
    oracle_fp8(x, T, N0, K, 128, w0, s0, yc0);
    if (N1 > 0)
        oracle_fp8(x, T, N1, K, 128, w1, s1, yc1);
    mmoe_test_poison_bf16(yg0, (size_t)(T * N0));
    mmoe_test_poison_bf16(yg1, (size_t)(T * (N1 > 0 ? N1 : 1)));
    if (post)
        mmoe_test_poison_bf16(Xg, (size_t)(T * hc * N0));
    gfw_test_tc_args a = {x, T, K, w0, s0, N0, w1, s1, N1, X, pv, cv, 2, yg0, yg1, Xg};
    mmoe_error err;
    ck_assert_msg(gfw_test_linear_fp8_tc(&a, &err) == MMOE_OK, "%s", err.msg);
    double *xd = malloc(sizeof(double) * (size_t)(T * K));
    double *wd = malloc(sizeof(double) * (size_t)((N0 > N1 ? N0 : N1) * K));
    ck_assert(xd && wd);
    char what[96];
    tc_dequant(x, T, N0, K, w0, s0, xd, wd);
    snprintf(what, sizeof what, "fp8 tc %lldx%lld T=%lld kind %d%s%s", (long long)N0, (long long)K, (long long)T,
             (int)kind, post ? " (hc_post)" : "", cancel ? " (cancelling)" : "");
    expect_tc_bound(what, yg0, yc0, xd, wd, T, N0, K);
    if (N1 > 0) {
        tc_dequant(x, T, N1, K, w1, s1, xd, wd);
        snprintf(what, sizeof what, "fp8 tc second %lldx%lld T=%lld kind %d", (long long)N1, (long long)K,
                 (long long)T, (int)kind);
        expect_tc_bound(what, yg1, yc1, xd, wd, T, N1, K);
    }
    if (post) { /* the streams' update from the GPU's own outputs: exact */
        const mmoe_hc_params hp = {(int)hc, N0, 20, 1e-6f, 1e-6f};
        mmoe_hc_post(&hp, yg0, X, T, pv, cv, Xc);
        expect_same_u16("fp8 tc hc_post", Xg, Xc, (size_t)(T * hc * N0));
    }
    free(x), free(w0), free(s0), free(w1), free(s1), free(yc0), free(yg0), free(yc1), free(yg1), free(X), free(Xg);
    free(Xc), free(pv), free(cv), free(xd), free(wd);
}

START_TEST(test_linear_fp8_tc)
{
    check_tc(1, 1024, 512, 4096, FP8_RANDOM, 0, 0); /* wq_a with wkv: tiles shared by warps */
    check_tc(1, 32768, 0, 1024, FP8_RANDOM, 0, 0);  /* wq_b */
    check_tc(1, 4096, 0, 8192, FP8_RANDOM, 1, 0);   /* wo_b with hc_post */
    check_tc(2, 4096, 0, 8192, FP8_RANDOM, 1, 0);   /* two tokens (MTP) */
    check_tc(8, 1000, 0, 2048, FP8_RANDOM, 0, 0);   /* eight tokens, a partial last tile */
    check_tc(3, 201, 37, 384, FP8_EXTREME, 0, 0);   /* codes and x values over the whole range */
    check_tc(5, 96, 0, 1024, FP8_NAN, 0, 0);        /* NaN codes: NaN rows */
    check_tc(1, 8, 0, 128, FP8_RANDOM, 0, 0);       /* a tile of 8 live rows, one block */
    check_tc(1, 512, 0, 4096, FP8_RANDOM, 0, 1);    /* cancelling block sums: the bound itself */
    /* what it does not serve is refused, not run differently */
    uint16_t x[9 * 128] = {0};
    uint8_t w[16 * 128] = {0}, s[1] = {127};
    uint16_t y[9 * 16];
    gfw_test_tc_args a = {x, 9, 128, w, s, 16, NULL, NULL, 0, NULL, NULL, NULL, 1, y, NULL, NULL};
    mmoe_error err;
    ck_assert_int_eq(gfw_test_linear_fp8_tc(&a, &err), MMOE_EUNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "T = 9"), "%s", err.msg);
}
END_TEST


START_TEST(test_linear_dense)
{
    /* below 8 tokens, K a multiple of 16: k_linear_dense_f8_rows (x staged with the scales, 16 rows a block) */
    check_dense_f8(2, 256, 1024, 128, 0);        /* wo_a's form */
    check_dense_f8(2, 256, 1024, 128, DF8_NAN);
    check_dense_f8(2, 64, 4096, 128, DF8_NAN);   /* wo_a's K: 8 rounds */
    check_dense_f8(2, 64, 4096, 128, DF8_WIDE_X);
    check_dense_f8(1, 40, 4096, 128, DF8_NAN | DF8_WIDE_X); /* a block 8 rows past N */
    check_dense_f8(2, 64, 200, 128, 0);          /* a short last chunk: k_linear_dense_split */
    check_dense_f8(3, 37, 8320, 128, 0);         /* 520 chunks: rounds past the chunks, odd outputs */
    check_dense_f8(2, 96, 1024, 48, DF8_NAN);    /* 3 chunks a scale column: a lane's column by division */
    check_dense_f8(1, 64, 8192, 1024, 0);        /* 64 chunks a column: one column for two rounds */
    check_dense(3, 256, 128, 1);         /* tiny compressor */
    check_dense(3, 1024, 4096, 1);       /* V4-Flash ratio-4 compressor wkv */
    check_dense(4, 64, 4096, 0);         /* indexer weights_proj */
    check_dense(2, 1024, 4097, 0);       /* a K that is not a multiple of 16: a short last chunk */
    check_dense(2, 16, 8192, 0);         /* 512 chunks: 16 rounds in batches of two */
    check_dense(2, 9, 1040, 0);          /* 65 chunks: two rounds, the second nearly empty */
    check_dense(2, 5, 48, 1);            /* 3 chunks: one round, most lanes +0 */
    /* decode (T = 1) at V4-Flash widths, each read kind through its copy ring */
    check_dense_f8(1, 1024, 4096, 128, 0); /* one head group of wo_a: 8 rounds */
    check_dense(1, 1024, 4096, 1);         /* compressor wkv (F32): 8 rounds, 2 in flight */
    check_dense(1, 64, 4096, 0);           /* indexer weights_proj (BF16): 8 rounds, 3 in flight */
    check_dense(1, 129, 1024, 0);          /* 2 rounds, fewer than the ring's slots; odd outputs */
    /* from 8 tokens on: k_linear_dense_tokens (a weight chunk decoded once for 8 tokens, 32 rows a block) */
    check_dense_f8(16, 256, 1024, 128, 0); /* two token groups, 8 row blocks */
    check_dense_f8(9, 64, 4096, 128, DF8_NAN); /* 32 groups of 8 chunks; a token group of one token; NaN codes */
    check_dense_f8(12, 37, 8192, 128, 0);  /* 64 groups, the most it folds; a row block 27 rows past N */
    check_dense(24, 64, 4096, 0);          /* BF16 */
    check_dense(64, 100, 1024, 0);         /* a 64-token prefill: 8 token groups; 100 rows, odd ones */
    check_dense(8, 9, 1040, 0);            /* 65 chunks: 16 groups, the last 7 groups +0 past the chunks */
    check_dense(10, 5, 48, 0);             /* 3 chunks: 4 groups, the 29 slots past them +0 */
    check_dense(15, 33, 16, 0);            /* one chunk; 7 tokens in the second group, the last pair half empty */
    check_dense(8, 1024, 4097, 0);         /* a short last chunk: the one-token kernel */
    check_dense(8, 64, 4096, 1);           /* F32: the one-token kernel */
    check_dense_round_order(1, 4096); /* the one-token kernel: 8 rounds in batches of four */
    check_dense_round_order(2, 8192); /* 16 rounds in batches of two */
    check_dense_round_order(8, 4096); /* k_linear_dense_tokens: 32 groups of 8 chunks */
    check_dense_round_order(9, 8192); /* 64 groups; a token group of one token */
    check_dense_order();
    check_dense_chunk_order(4096);
}
END_TEST

/**
 * hc_pre and hc_post at @p hc streams (<= 8: with hc > 5 the warp's Sinkhorn holds two entries
 * per lane) and width D.
 */
static void check_mhc(int hc, int64_t T, int64_t D)
{
    const int n_mix = (2 + hc) * hc;
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)D ^ 0x3c ^ ((uint64_t)hc << 20));
    uint16_t *X = rand_bf16(&r, (size_t)(T * hc * D), 2.0f);
    float *fn = malloc(sizeof(float) * (size_t)(n_mix * hc * D)), base[(2 + 8) * 8], scale[3] = {0.5f, 0.7f, 1.3f};
    for (int64_t i = 0; i < n_mix * hc * D; i++)
        fn[i] = unif(&r, 0.02f);
    for (int i = 0; i < n_mix; i++)
        base[i] = unif(&r, 1.0f);
    mmoe_hc_params p = {hc, D, 20, 1e-6f, 1e-6f};
    uint16_t *yc = malloc(2 * (size_t)(T * D)), *yg = malloc(2 * (size_t)(T * D));
    float *pc = malloc(sizeof(float) * (size_t)(T * hc)), *pg = malloc(sizeof(float) * (size_t)(T * hc));
    float *cc = malloc(sizeof(float) * (size_t)(T * hc * hc)), *cg = malloc(sizeof(float) * (size_t)(T * hc * hc));
    mmoe_hc_pre(&p, X, T, fn, base, scale, yc, pc, cc);
    mmoe_test_poison_bf16(yg, (size_t)(T * D));
    mmoe_test_poison_f32(pg, (size_t)(T * hc));
    mmoe_test_poison_f32(cg, (size_t)(T * hc * hc));
    mmoe_error err;
    ck_assert_msg(gfw_test_hc_pre(hc, D, 20, 1e-6f, 1e-6f, X, T, fn, base, scale, yg, pg, cg, &err) == MMOE_OK,
                  "%s", err.msg);
    float xmax = 0.0f;
    for (int64_t i = 0; i < T * hc * D; i++)
        xmax = fmaxf(xmax, fabsf(mmoe_bf16_to_f32(X[i])));
    int64_t exact = 0;
    for (int64_t i = 0; i < T * hc; i++)
        ck_assert_msg(fabsf(pg[i] - pc[i]) <= 0x1.0p-20f, "hc_pre post[%lld]: gpu %a cpu %a (seed %llu)", (long long)i,
                      pg[i], pc[i], (unsigned long long)g_seed);
    for (int64_t i = 0; i < T * hc * hc; i++)
        ck_assert_msg(fabsf(cg[i] - cc[i]) <= 0x1.0p-16f, "hc_pre comb[%lld]: gpu %a cpu %a (seed %llu)", (long long)i,
                      cg[i], cc[i], (unsigned long long)g_seed);
    for (int64_t i = 0; i < T * D; i++) {
        const float g = mmoe_bf16_to_f32(yg[i]), c = mmoe_bf16_to_f32(yc[i]);
        ck_assert_msg(fabsf(g - c) <= 0x1.0p-7f * fabsf(c) + 0x1.0p-20f * xmax, "hc_pre y[%lld]: gpu %g cpu %g (seed %llu)",
                      (long long)i, g, c, (unsigned long long)g_seed);
        exact += yg[i] == yc[i];
    }
    fprintf(stderr, "gpu_forward_blocks: hc_pre hc=%d D=%lld: %lld of %lld y values bit-exact\n", hc, (long long)D,
            (long long)exact, (long long)(T * D));
    if (exp_probe()) {
        expect_same_u16("hc_pre y (exact exp)", yg, yc, (size_t)(T * D));
        expect_same_f32("hc_pre post (exact exp)", pg, pc, (size_t)(T * hc));
        expect_same_f32("hc_pre comb (exact exp)", cg, cc, (size_t)(T * hc * hc));
    }
    /* hc_post on the CPU's post and comb: exact */
    uint16_t *out = rand_bf16(&r, (size_t)(T * D), 2.0f);
    uint16_t *Xc = malloc(2 * (size_t)(T * hc * D)), *Xg = malloc(2 * (size_t)(T * hc * D));
    mmoe_hc_post(&p, out, X, T, pc, cc, Xc);
    memcpy(Xg, X, 2 * (size_t)(T * hc * D));
    ck_assert_msg(gfw_test_hc_post(hc, D, out, Xg, T, pc, cc, &err) == MMOE_OK, "%s", err.msg);
    expect_same_u16("hc_post", Xg, Xc, (size_t)(T * hc * D));
    free(X), free(fn), free(yc), free(yg), free(pc), free(pg), free(cc), free(cg), free(out), free(Xc), free(Xg);
}

START_TEST(test_mhc)
{
    check_mhc(4, 3, 128);
    check_mhc(4, 3, 4096);
    check_mhc(4, 1, 4096); /* one token (decode) */
    check_mhc(6, 2, 128); /* 36 entries: a row across the two registers of a lane */
    check_mhc(8, 2, 1100);
    check_mhc(4, 2, 37); /* n = 148: a short last chunk; token 1's streams off 16-byte alignment (scalar chunks) */
    check_mhc(4, 1, 8448); /* 9 block sums a reduction: more than hc_fold_parts() folds in registers */
}
END_TEST

/** Finite bf16 values only (k_hc_pre_norm wrote every one). */
static void expect_finite_u16(const char *what, const uint16_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg((v[i] & 0x7F80) != 0x7F80, "%s: element %zu is 0x%04x (seed %llu)", what, i, v[i],
                      (unsigned long long)g_seed);
}

/**
 * The fused hc_pre + RMSNorm (k_hc_pre_norm) against the three kernels it replaces (k_hc_part,
 * k_hc_finish_split, k_rmsnorm, each checked against the CPU above): every output bit for bit,
 * for T tokens of width D, an hc_pre (@p n_out 24: post and comb too) or an hc_head (4), with
 * output @p out 0 (y), 1 (y and its FP8 quantization) or 2 (y and the MoE's quantized input).
 * The fused kernel runs twice, each time from NaN outputs (the first launch must reset its block
 * counts for the second to finish); so does the fused kernel with its Sinkhorn apart (the
 * logits handed to k_hc_sinkhorn, as one-token forward calls run it), which must give the same
 * bits again.
 *
 * With @p cancel the mix's order shows in its bf16 result: fn = 0 and one base value make the
 * four pre weights one number p, stream 1 is stream 0 negated and streams 2 and 3 are about
 * 2^-20 of it, so ((p x0 + p x1) + p x2) + p x3 is p x2 + p x3 almost exactly, where any other
 * order rounds the small terms away against p x0 (random inputs leave the order to the last
 * fp32 bit, which the bf16 output hides but for about one value in 2^16).
 */
static void check_hc_pre_norm(int64_t T, int64_t D, int n_out, int out, int cancel)
{
    const int hc = 4;
    const int64_t n = hc * D;
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)D ^ 0x9e ^ ((uint64_t)(n_out * 8 + out * 2 + cancel) << 24) ^ ((uint64_t)T << 40));
    uint16_t *X = rand_bf16(&r, (size_t)(T * n), 2.0f), *w = malloc(2 * (size_t)D);
    float *fn = malloc(sizeof(float) * (size_t)(n_out * n)), base[24], scale[3] = {0.5f, 0.7f, 1.3f};
    ck_assert(w && fn);
    for (int64_t i = 0; i < n_out * n; i++)
        fn[i] = cancel ? 0.0f : unif(&r, 0.02f);
    for (int i = 0; i < n_out; i++)
        base[i] = cancel ? 0.3f : unif(&r, 1.0f);
    for (int64_t t = 0; cancel && t < T; t++)
        for (int64_t c = 0; c < D; c++) {
            uint16_t *xt = X + t * n;
            xt[D + c] = xt[c] ^ 0x8000u; /* -x0 */
            xt[2 * D + c] = mmoe_bf16_from_f32(unif(&r, 0x1p-20f));
            xt[3 * D + c] = mmoe_bf16_from_f32(unif(&r, 0x1p-20f));
        }
    for (int64_t i = 0; i < D; i++)
        w[i] = mmoe_bf16_from_f32(1.0f + unif(&r, 0.5f));
    enum { MODES = 3 }; /* gfw_test_hc_pre_norm's fused: three kernels, fused, fused with the Sinkhorn apart */
    uint16_t *y[MODES];
    float *post[MODES], *comb[MODES], *qs[MODES], *mq[MODES];
    uint8_t *q[MODES];
    for (int f = 0; f < MODES; f++) {
        y[f] = malloc(2 * (size_t)(T * D));
        post[f] = malloc(sizeof(float) * (size_t)(T * hc));
        comb[f] = malloc(sizeof(float) * (size_t)(T * hc * hc));
        q[f] = malloc((size_t)(T * D));
        qs[f] = malloc(sizeof(float) * (size_t)(T * D / 128));
        mq[f] = malloc(sizeof(float) * (size_t)(T * D));
        ck_assert(y[f] && post[f] && comb[f] && q[f] && qs[f] && mq[f]);
        mmoe_error err;
        ck_assert_msg(gfw_test_hc_pre_norm(D, n_out, 20, 1e-6f, 1e-6f, X, T, fn, base, scale, w, 1e-6f, out, f, y[f],
                                           post[f], comb[f], q[f], qs[f], mq[f], &err) == MMOE_OK,
                      "%s", err.msg);
    }
    for (int f = 1; f < MODES; f++) {
        expect_finite_u16(f == 1 ? "hc_pre_norm y (fused)" : "hc_pre_norm y (Sinkhorn apart)", y[f], (size_t)(T * D));
        expect_same_u16("hc_pre_norm y", y[f], y[0], (size_t)(T * D));
        expect_same_f32("hc_pre_norm post", post[f], post[0], (size_t)(T * hc));
        expect_same_f32(f == 1 ? "hc_pre_norm comb" : "hc_pre_norm comb (Sinkhorn apart)", comb[f], comb[0],
                        (size_t)(T * hc * hc));
        ck_assert_msg(memcmp(q[f], q[0], (size_t)(T * D)) == 0, "hc_pre_norm q differs (seed %llu)",
                      (unsigned long long)g_seed);
        expect_same_f32("hc_pre_norm qs", qs[f], qs[0], (size_t)(T * D / 128));
        expect_same_f32("hc_pre_norm mq", mq[f], mq[0], (size_t)(T * D));
        if (n_out > hc)
            ck_assert_msg(isfinite(post[f][0]) && isfinite(comb[f][T * hc * hc - 1]),
                          "hc_pre_norm: post or comb not written");
        if (out == 1)
            ck_assert_msg(isfinite(qs[f][0]) && isfinite(qs[f][T * D / 128 - 1]), "hc_pre_norm: qs not written");
        if (out == 2)
            ck_assert_msg(isfinite(mq[f][0]) && isfinite(mq[f][T * D - 1]), "hc_pre_norm: mq not written");
    }
    fprintf(stderr,
            "gpu_forward_blocks: hc_pre_norm T=%lld D=%lld n_out=%d out=%d%s: fused (Sinkhorn in it and apart) = three "
            "kernels, bit for bit\n",
            (long long)T, (long long)D, n_out, out, cancel ? " (cancelling streams)" : "");
    for (int f = 0; f < MODES; f++)
        free(y[f]), free(post[f]), free(comb[f]), free(q[f]), free(qs[f]), free(mq[f]);
    free(X), free(w), free(fn);
}

START_TEST(test_hc_pre_norm)
{
    check_hc_pre_norm(1, 4096, 24, 1, 0); /* decode, attention side (V4-Flash width) */
    check_hc_pre_norm(1, 4096, 24, 2, 0); /* decode, MoE side */
    check_hc_pre_norm(3, 4096, 24, 1, 0);
    check_hc_pre_norm(2, 128, 24, 2, 0);  /* one warp of chunks partly idle */
    check_hc_pre_norm(2, 4096, 4, 0, 0);  /* hc_head and the final norm */
    check_hc_pre_norm(1, 384, 4, 0, 0);
    check_hc_pre_norm(1, 4096, 24, 1, 1); /* the mix's order visible in y */
}
END_TEST

/**
 * The attention of one token over n kv rows (the window path), the GPU's against
 * attn_sparse_attention(); with @p rope_dim > 0 the output then gets the inverse RoPE of
 * attn_rope_rotate_bf16() at random angles (the GPU's table holds NaN at every other position).
 */
static void check_attend(int64_t T, int H, int d, int64_t n, int rope_dim)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)(T * 1000003 + H * 1000 + n));
    const size_t q_elems = (size_t)T * (size_t)H * (size_t)d;
    uint16_t *q = rand_bf16(&r, q_elems, 1.0f), *rows = rand_bf16(&r, (size_t)(n * d), 1.0f);
    float *sink = malloc(sizeof(float) * (size_t)H);
    for (int h = 0; h < H; h++)
        sink[h] = unif(&r, 2.0f);
    ck_assert_int_le(rope_dim, 128);
    /* token t's (cos, sin) pairs: cs[t][2 i], cs[t][2 i + 1] */
    float *cs = malloc(sizeof(float) * (size_t)(T * 128 + 1)), cos_v[64], sin_v[64];
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < rope_dim / 2; i++) {
            const float angle = unif(&r, 3.2f);
            cs[t * rope_dim + 2 * i] = cosf(angle), cs[t * rope_dim + 2 * i + 1] = sinf(angle);
        }
    const uint16_t **ptr = malloc(sizeof(uint16_t *) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        ptr[i] = rows + i * d;
    float *acc = malloc(sizeof(float) * (size_t)ATTN_SPARSE_SCRATCH_FLOATS(d)), scores[ATTN_SPARSE_CHUNK];
    uint16_t *oc = malloc(2 * q_elems), *og = malloc(2 * q_elems);
    for (int64_t t = 0; t < T; t++) { /* token t at position n - T + t attends rows 0 .. n - T + t */
        uint16_t *o = oc + t * H * d;
        attn_sparse_attention(q + t * H * d, H, d, ptr, n - T + t + 1, sink, (float)(1.0 / sqrt((double)d)), acc,
                              scores, o);
        for (int i = 0; i < rope_dim / 2; i++)
            cos_v[i] = cs[t * rope_dim + 2 * i], sin_v[i] = cs[t * rope_dim + 2 * i + 1];
        for (int h = 0; rope_dim > 0 && h < H; h++)
            attn_rope_rotate_bf16(o + (int64_t)h * d + d - rope_dim, rope_dim, cos_v, sin_v, 1);
    }
    mmoe_test_poison_bf16(og, q_elems);
    mmoe_error err;
    ck_assert_msg(gfw_test_attend(q, T, H, d, rows, n, sink, rope_dim, rope_dim > 0 ? cs : NULL, og, &err) == MMOE_OK,
                  "%s", err.msg);
    float kvmax = 0.0f;
    for (int64_t i = 0; i < n * d; i++)
        kvmax = fmaxf(kvmax, fabsf(mmoe_bf16_to_f32(rows[i])));
    int64_t exact = 0;
    for (size_t i = 0; i < q_elems; i++) {
        const float g = mmoe_bf16_to_f32(og[i]), c = mmoe_bf16_to_f32(oc[i]);
        ck_assert_msg(fabsf(g - c) <= 0x1.0p-7f * (kvmax + fabsf(c)), "attention [%zu]: gpu %g cpu %g (seed %llu)", i,
                      g, c, (unsigned long long)g_seed);
        exact += og[i] == oc[i];
    }
    fprintf(stderr, "gpu_forward_blocks: attention T=%lld H=%d d=%d n=%lld rope %d: %lld of %zu bit-exact\n",
            (long long)T, H, d, (long long)n, rope_dim, (long long)exact, q_elems);
    if (exp_probe())
        expect_same_u16("attention (exact exp)", og, oc, q_elems);
    free(q), free(rows), free(sink), free(cs), free(ptr), free(acc), free(oc), free(og);
}

START_TEST(test_attend)
{
    check_attend(1, 2, 128, 20, 64);   /* tiny: window 16 + 4 blocks */
    check_attend(1, 64, 512, 640, 64); /* V4-Flash: window 128 + top-512 (two whole passes of the one-token kernel) */
    check_attend(1, 64, 512, 1, 0);    /* the first token */
    check_attend(1, 64, 512, 256, 64); /* one pass of four whole chunks */
    check_attend(1, 64, 512, 300, 0);  /* one pass, its fifth chunk partial */
    check_attend(1, 64, 512, 330, 64); /* a second pass of one partial chunk */
    check_attend(1, 64, 512, 97, 64);  /* one pass, its second chunk partial */
    /* calls of several tokens (k_attend's instances), each token over its own window */
    check_attend(5, 2, 128, 20, 64);    /* tiny: the call's rows and the ring's */
    check_attend(24, 64, 512, 200, 64); /* V4 widths: a prefill chunk, lists of 177 to 200 rows */
    check_attend(3, 64, 512, 70, 0);    /* a short call, no RoPE */
}
END_TEST

/**
 * The split indexer kernel's Hadamard (kind 3) and Hadamard + FP4 (kind 2) on @p rows heads of
 * width @p w against the oracle's attn_hadamard_bf16 and mmoe_roundtrip_fp4_bf16.  Values with
 * exponents over [-30, 30] make the fp32 butterflies round, so another stage order would show
 * in the bf16 outputs of kind 3.
 */
static void check_qat_split(mmoe_rng *r, int kind, int64_t rows, int w)
{
    uint16_t *x = malloc(2 * (size_t)(rows * w)), *xg = malloc(2 * (size_t)(rows * w));
    ck_assert(x && xg);
    for (int64_t i = 0; i < rows * w; i++)
        x[i] = mmoe_bf16_from_f32(ldexpf(unif(r, 1.0f), (int)mmoe_rng_below(r, 61) - 30));
    for (int64_t i = 0; i < w; i++) /* a row of tiny values: the FP4 scale clamps */
        x[i] = mmoe_bf16_from_f32(unif(r, 1e-30f));
    memcpy(xg, x, 2 * (size_t)(rows * w));
    for (int64_t i = 0; i < rows; i++) {
        attn_hadamard_bf16(x + i * w, w);
        if (kind == 2)
            mmoe_roundtrip_fp4_bf16(x + i * w, w, 32);
    }
    mmoe_error err;
    ck_assert_msg(gfw_test_qat(xg, rows, w, kind, &err) == MMOE_OK, "%s", err.msg);
    char what[96];
    snprintf(what, sizeof what, "split indexer kernel, width %d: %s", w, kind == 2 ? "hadamard + fp4" : "hadamard");
    expect_same_u16(what, xg, x, (size_t)(rows * w));
    free(x), free(xg);
}

START_TEST(test_qat)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ 0x9a7);
    for (int w = 32; w <= 1024; w *= 2) /* every register count of k_indexer_q_split */
        for (int kind = 2; kind <= 3; kind++)
            check_qat_split(&r, kind, w == 128 ? 64 : 7, w);
    const int widths[2] = {512, 128};
    for (int kind = 0; kind < 2; kind++) {
        const int w = widths[kind];
        const int64_t rows = 37;
        uint16_t *x = rand_bf16(&r, (size_t)(rows * w), 8.0f);
        for (int64_t i = 0; i < w; i++) /* a row of tiny values: the scale clamps */
            x[i] = mmoe_bf16_from_f32(unif(&r, 1e-30f));
        uint16_t *xg = malloc(2 * (size_t)(rows * w));
        memcpy(xg, x, 2 * (size_t)(rows * w));
        for (int64_t i = 0; i < rows; i++) {
            if (kind == 0) {
                mmoe_roundtrip_fp8_bf16(x + i * w, w - 64, 64);
            } else {
                attn_hadamard_bf16(x + i * w, w);
                mmoe_roundtrip_fp4_bf16(x + i * w, w, 32);
            }
        }
        mmoe_error err;
        ck_assert_msg(gfw_test_qat(xg, rows, w, kind, &err) == MMOE_OK, "%s", err.msg);
        expect_same_u16(kind ? "hadamard + fp4" : "fp8 round trip", xg, x, (size_t)(rows * w));
        free(x), free(xg);
    }
}
END_TEST

/** The indexer scores and top-k (k_topk_split) of one token over @p nb blocks. */
static void check_indexer(int ih, int id, int64_t nb, int topk, int ties)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)(nb * 31 + ties));
    uint16_t *qi = rand_bf16(&r, (size_t)ih * (size_t)id, 1.0f), *wi = rand_bf16(&r, (size_t)ih, 0.1f);
    uint16_t *keys = rand_bf16(&r, (size_t)(nb * id), 1.0f);
    if (ties) /* few distinct keys: equal scores everywhere */
        for (int64_t j = 0; j < nb; j++)
            memcpy(keys + j * id, keys + (j % 3) * id, 2 * (size_t)id);
    float *sc = malloc(sizeof(float) * (size_t)nb), *sg = malloc(sizeof(float) * (size_t)nb);
    attn_scored *work = malloc(sizeof(attn_scored) * (size_t)nb);
    int64_t *ic = malloc(sizeof(int64_t) * (size_t)topk);
    int32_t *ig = malloc(sizeof(int32_t) * (size_t)topk);
    attn_indexer_scores(qi, wi, keys, ih, id, nb, sc);
    const int64_t k = attn_topk_desc(sc, nb, topk, work, ic);
    mmoe_test_poison_f32(sg, (size_t)nb);
    for (int i = 0; i < topk; i++)
        ig[i] = -7;
    mmoe_error err;
    ck_assert_msg(gfw_test_indexer(qi, wi, keys, ih, id, nb, topk, sg, ig, &err) == MMOE_OK, "%s", err.msg);
    expect_same_f32("indexer scores", sg, sc, (size_t)nb);
    for (int64_t i = 0; i < k; i++)
        ck_assert_msg(ig[i] == ic[i], "indexer top-k rank %lld: gpu %d cpu %lld (seed %llu)", (long long)i, ig[i],
                      (long long)ic[i], (unsigned long long)g_seed);
    free(qi), free(wi), free(keys), free(sc), free(sg), free(work), free(ic), free(ig);
}

START_TEST(test_indexer)
{
    check_indexer(2, 64, 9, 4, 0);
    check_indexer(4, 128, 35, 4, 1);
    check_indexer(64, 128, 600, 512, 0);
    check_indexer(64, 128, 700, 512, 1);
    check_indexer(64, 128, 300, 512, 0); /* fewer blocks than top-k */
    check_indexer(8, 128, 2900, 512, 1); /* the top-k over 12 blocks, with ties */
}
END_TEST

/**
 * The one-token router and plan (and the general one, T > 1) against the oracle's rules:
 * scores sqrt(softplus(z)) with glibc's FMA expf (the device's, bit for bit: test_expf) and
 * mmoe_log1pf; the top-k of s + bias by moe_topk_select(); weights (s / sum) * scale with the
 * sum in slot order; then the plan written out here: the valid tasks (every routed one, and
 * the shared expert's tasks, key -1) sorted by (key, task), each expert's run cut into items
 * of at most TT tasks.  With @p ties the logits take five values (one of them past the
 * softplus's cut at 20, one -inf) and the bias two, so equal selection values are everywhere
 * (the lower id must win), and a few logits are NaN (never chosen over a number).
 */
static void check_route(int64_t T, int64_t E, int k, int shared, int with_bias, int ties)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed ^ (uint64_t)(E * 131 + T * 7 + k * 3 + shared + 2 * with_bias + 1000 * ties));
    const int64_t n = T * (k + 1);
    const float levels[5] = {-1.5f, 0.25f, 3.0f, 24.0f, -INFINITY};
    float *z = malloc(sizeof(float) * (size_t)(T * E)), *bias = with_bias ? malloc(sizeof(float) * (size_t)E) : NULL;
    float *sg = malloc(sizeof(float) * (size_t)(T * E)), *wg = malloc(sizeof(float) * (size_t)(T * k));
    float *s = malloc(sizeof(float) * (size_t)E), *sel = malloc(sizeof(float) * (size_t)E);
    int32_t *ig = malloc(sizeof(int32_t) * (size_t)(T * k)), *order = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *flag = malloc(sizeof(int32_t) * (size_t)n), *items = malloc(sizeof(int32_t) * 4 * (size_t)n);
    int64_t *ci = malloc(sizeof(int64_t) * (size_t)(T * k)), *keys = malloc(sizeof(int64_t) * (size_t)n);
    ck_assert(z && (bias || !with_bias) && sg && wg && s && sel && ig && order && flag && items && ci && keys);
    for (int64_t i = 0; i < T * E; i++) {
        z[i] = ties ? levels[mmoe_rng_below(&r, 5)] : unif(&r, 8.0f);
        if (ties && i % 97 == 5)
            z[i] = NAN;
    }
    for (int64_t e = 0; with_bias && e < E; e++)
        bias[e] = ties ? (mmoe_rng_below(&r, 2) ? 0.125f : -0.125f) : unif(&r, 0.5f);
    mmoe_test_poison_f32(sg, (size_t)(T * E));
    int32_t n_items = -7;
    int tt = 0;
    const float scale = 1.5f;
    gfw_test_route_args a = {z, bias, T, E, k, shared, scale, sg, ig, wg, order, flag, items, &n_items, &tt};
    mmoe_error err;
    ck_assert_msg(gfw_test_route(&a, &err) == MMOE_OK, "%s", err.msg);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < E; e++) {
            const float zz = z[t * E + e];
            s[e] = sqrtf(zz > 20.0f ? zz : mmoe_log1pf(glibc_fma_expf(zz)));
            sel[e] = with_bias ? s[e] + bias[e] : s[e] + 0.0f;
            const float g = sg[t * E + e];
            ck_assert_msg(memcmp(&g, &s[e], 4) == 0 || (isnan(g) && isnan(s[e])),
                          "route T %lld E %lld: score [%lld, %lld] gpu %a cpu %a (seed %llu)", (long long)T,
                          (long long)E, (long long)t, (long long)e, g, s[e], (unsigned long long)g_seed);
        }
        int64_t *ti = ci + t * k;
        moe_topk_select(sel, E, k, ti);
        float sum = 0.0f;
        for (int j = 0; j < k; j++)
            sum += s[ti[j]];
        for (int j = 0; j < k; j++) {
            const float w = (s[ti[j]] / sum) * scale;
            ck_assert_msg(ig[t * k + j] == ti[j] && memcmp(&wg[t * k + j], &w, 4) == 0,
                          "route T %lld E %lld k %d%s: token %lld slot %d: gpu expert %d weight %a, cpu %lld %a "
                          "(seed %llu)", (long long)T, (long long)E, k, ties ? " ties" : "", (long long)t, j,
                          ig[t * k + j], wg[t * k + j], (long long)ti[j], w, (unsigned long long)g_seed);
        }
    }
    /* the plan: tasks by (key, task); items of at most tt tasks of one key */
    const int64_t n_tasks = T * k + (shared ? T : 0);
    for (int64_t p = 0; p < n_tasks; p++)
        keys[p] = p < T * k ? ci[p] : -1;
    int64_t rank = 0, item = 0;
    for (int64_t key = -1; key < E; key++) {
        int64_t run = 0;
        for (int64_t p = 0; p < n_tasks; p++) {
            if (keys[p] != key)
                continue;
            ck_assert_msg(order[rank] == p, "route T %lld E %lld: plan rank %lld: task %d, expected %lld (seed %llu)",
                          (long long)T, (long long)E, (long long)rank, order[rank], (long long)p,
                          (unsigned long long)g_seed);
            int64_t left = 0;
            for (int64_t q = p; q < n_tasks; q++)
                left += keys[q] == key;
            const int64_t f = run % tt == 0 ? (left < tt ? left : tt) : 0;
            ck_assert_msg(flag[rank] == f, "route T %lld E %lld: plan rank %lld: flag %d, expected %lld (seed %llu)",
                          (long long)T, (long long)E, (long long)rank, flag[rank], (long long)f,
                          (unsigned long long)g_seed);
            if (f > 0) {
                const int32_t *it = items + 4 * item++;
                ck_assert_msg(it[0] == (key < 0 ? E : key) && it[1] == rank && it[2] == f,
                              "route T %lld E %lld: item %lld: (%d, %d, %d), expected (%lld, %lld, %lld) (seed %llu)",
                              (long long)T, (long long)E, (long long)(item - 1), it[0], it[1], it[2],
                              (long long)(key < 0 ? E : key), (long long)rank, (long long)f, (unsigned long long)g_seed);
            }
            run++;
            rank++;
        }
    }
    ck_assert_msg(n_items == item, "route T %lld E %lld: %d items, expected %lld (seed %llu)", (long long)T,
                  (long long)E, n_items, (long long)item, (unsigned long long)g_seed);
    free(z), free(bias), free(sg), free(wg), free(s), free(sel), free(ig), free(order), free(flag), free(items);
    free(ci), free(keys);
}

START_TEST(test_route)
{
    static const struct {
        int64_t T, E;
        int k, shared, bias;
    } cases[] = {{1, 8, 2, 0, 0},  {1, 8, 6, 1, 1},   {1, 256, 6, 0, 1}, {1, 256, 8, 1, 1}, {1, 384, 6, 1, 1},
                 {1, 512, 8, 0, 1}, {1, 600, 6, 1, 1}, {3, 256, 6, 1, 1}, {20, 256, 6, 1, 1},
                 /* a prefill's plan: many tasks a warp; the most experts held (its shared memory past 48 KB) */
                 {512, 256, 6, 1, 1}, {700, 384, 8, 0, 1}, {48, 2048, 8, 1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ties = 0; ties < 2; ties++)
            check_route(cases[i].T, cases[i].E, cases[i].k, cases[i].shared, cases[i].bias, ties);
}
END_TEST

static Suite *blocks_suite(void)
{
    Suite *s = suite_create("gpu_forward_blocks");
    TCase *tc = tcase_create("blocks");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_expf);
    tcase_add_test(tc, test_log1pf);
    tcase_add_test(tc, test_rmsnorm);
    tcase_add_test(tc, test_linear_fp8);
    tcase_add_test(tc, test_linear_fp8_tc);
    tcase_add_test(tc, test_linear_dense);
    tcase_add_test(tc, test_mhc);
    tcase_add_test(tc, test_hc_pre_norm);
    tcase_add_test(tc, test_attend);
    tcase_add_test(tc, test_qat);
    tcase_add_test(tc, test_indexer);
    tcase_add_test(tc, test_route);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    mmoe_error err;
    int cc = 0;
    if (mmoe_gpu_available(&cc, &err) != MMOE_OK) {
        fprintf(stderr, "gpu_forward_blocks: %s: skipped\n", err.msg);
        return MMOE_TEST_SKIP;
    }
    /* CUDA state does not survive fork(): run the tests in this process */
    setenv("CK_FORK", "no", 1);
    setvbuf(stderr, NULL, _IONBF, 0);
    g_seed = mmoe_test_seed("gpu_forward_blocks");
    return mmoe_test_run(blocks_suite());
}
