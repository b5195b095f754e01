/**
 * @file test_sum_order.c
 * @brief Suite "sum_order": the chunked pairwise order of the forward's double sums
 *        (docs/spec/architecture.md, "The order of the double sums") and the oracle's blocks that use it.
 *
 * The reference here is a recursive evaluation written from the spec's text (chunks of 16
 * from +0 in ascending order; P splits at the largest power of two below the count), not the
 * streaming binary counter of mmoe_sum_order.h.  Terms of widely spread magnitudes make the
 * order visible: the tests also count how often the sequential sum differs, so a test that
 * could not tell the orders apart fails.  Hand-derived values pin the definition down.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "attn_ref.h"
#include "mmoe_formats.h"
#include "mmoe_linear.h"
#include "mmoe_mhc.h"
#include "mmoe_sum_order.h"
#include "mmoe_test.h"

static uint64_t g_seed;

/** P(c[0 .. m-1]) as the spec defines it, recursively. */
static double ref_tree(const double *c, int64_t m)
{
    if (m == 1)
        return c[0];
    int64_t h = 1;
    while (2 * h < m)
        h *= 2;
    return ref_tree(c, h) + ref_tree(c + h, m - h);
}

/** The spec's sum of t[0 .. n-1]: chunk sums of 16 from +0, then P. */
static double ref_sum(const double *t, int64_t n)
{
    if (n == 0)
        return 0.0;
    const int64_t m = (n + 15) / 16;
    double *c = malloc(sizeof(double) * (size_t)m);
    ck_assert_ptr_nonnull(c);
    for (int64_t k = 0; k < m; k++) {
        double s = 0.0;
        for (int64_t i = 16 * k; i < n && i < 16 * k + 16; i++)
            s += t[i];
        c[k] = s;
    }
    const double r = ref_tree(c, m);
    free(c);
    return r;
}

/** The same sum through mmoe_sum_order.h's streaming form. */
static double stream_sum(const double *t, int64_t n)
{
    mmoe_pairwise pw;
    mmoe_pairwise_init(&pw);
    for (int64_t i0 = 0; i0 < n; i0 += MMOE_SUM_CHUNK) {
        double c = 0.0;
        for (int64_t i = i0; i < n && i < i0 + MMOE_SUM_CHUNK; i++)
            c += t[i];
        mmoe_pairwise_push(&pw, c);
    }
    return mmoe_pairwise_result(&pw);
}

/** A term of random sign and a magnitude spread over 2^-60 .. 2^20 (the order matters). */
static double spread_term(mmoe_rng *r)
{
    const double mag = ldexp(1.0 + mmoe_rng_uniform(r), (int)(mmoe_rng_uniform(r) * 80.0) - 60);
    return mmoe_rng_uniform(r) < 0.5 ? -mag : mag;
}

/*
 * Hand-derived values (u = 2^-53, half an ulp of 1.0; 1 + u rounds to 1, ties to even):
 * - 32 terms 1, u, u, ..., u: chunk 0 = 1 (each + u rounds back to 1), chunk 1 = 16u = 2^-49
 *   exactly, P = 1 + 2^-49 (representable).  Summed in sequence: 1.
 * - chunk sums 1, u, u (m = 3, h = 2): (1 + u) + u = 1 + u = 1; folded the other way it would be
 *   1 + 2u = 1 + 2^-52.
 * - chunk sums 1, u, u, u, u (m = 5, h = 4): ((1 + u) + (u + u)) + u = (1 + 2^-52) + u, a tie
 *   between 1 + 2^-52 (odd) and 1 + 2^-51 (even): 1 + 2^-51.  Summed in sequence: 1.
 * - no terms: +0.
 */
START_TEST(hand_values)
{
    const double u = ldexp(1.0, -53);
    double t[80];
    t[0] = 1.0;
    for (int i = 1; i < 32; i++)
        t[i] = u;
    ck_assert(stream_sum(t, 32) == 1.0 + ldexp(1.0, -49));
    /* chunk sums 1, u, u: each chunk one term then zeros */
    memset(t, 0, sizeof t);
    t[0] = 1.0;
    t[16] = u;
    t[32] = u;
    ck_assert(stream_sum(t, 48) == 1.0);
    ck_assert(stream_sum(t, 33) == 1.0);
    for (int k = 3; k <= 4; k++)
        t[16 * k] = u;
    ck_assert(stream_sum(t, 80) == 1.0 + ldexp(1.0, -51));
    ck_assert(stream_sum(t, 0) == 0.0 && !signbit(stream_sum(t, 0)));
    /* the bf16 dot product of the attention scores: a = (1, 2^-27, ...), b = (1, 2^-26, ...) */
    uint16_t a[32], b[32];
    a[0] = b[0] = mmoe_bf16_from_f32(1.0f);
    for (int i = 1; i < 32; i++) {
        a[i] = mmoe_bf16_from_f32(ldexpf(1.0f, -27));
        b[i] = mmoe_bf16_from_f32(ldexpf(1.0f, -26));
    }
    ck_assert(attn_dot_bf16(a, b, 32) == 1.0 + ldexp(1.0, -49));
}
END_TEST

START_TEST(streaming_equals_recursive)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed);
    double *t = malloc(sizeof(double) * 20000);
    ck_assert_ptr_nonnull(t);
    int differs_from_sequential = 0;
    for (int trial = 0; trial < 300; trial++) {
        const int64_t n = trial < 40 ? trial : 1 + (int64_t)(mmoe_rng_uniform(&r) * (trial % 3 ? 2000 : 20000));
        double seq = 0.0;
        for (int64_t i = 0; i < n; i++) {
            t[i] = spread_term(&r);
            seq += t[i];
        }
        const double want = ref_sum(t, n), got = stream_sum(t, n);
        ck_assert_msg(memcmp(&want, &got, sizeof want) == 0, "n = %lld: %a, expected %a (seed %llu)", (long long)n,
                      got, want, (unsigned long long)g_seed);
        differs_from_sequential += seq != want;
    }
    free(t);
    ck_assert_msg(differs_from_sequential > 50, "only %d of 300 sums differ from the sequential order",
                  differs_from_sequential);
}
END_TEST

/** bf16 outputs of RMSNorm (w, eps 0) of row @p x of n values, given its double sum of squares. */
static void ref_rmsnorm(const uint16_t *x, const uint16_t *w, int n, double sumsq, uint16_t *y)
{
    const float mean = (float)(sumsq / (double)n);
    const float rs = 1.0f / sqrtf(mean + 0.0f);
    for (int i = 0; i < n; i++)
        y[i] = mmoe_bf16_from_f32(mmoe_bf16_to_f32(w[i]) * (mmoe_bf16_to_f32(x[i]) * rs));
}

/*
 * RMSNorm rows whose order shows in the bf16 output (mmoe_test_sum_order_row()).  Row (p, q):
 * x0 = 1 + p/128, x2 = 1 + q/16, then 4080 tiny values t in 2^-27 [1, 1.4) from index 16 on,
 * and x1 (and x3) chosen so that M = x0^2 + x2^2 + x1^2 (+ x3^2) is exact in double and the
 * midpoint between two fp32 numbers: with 2^e <= x0^2 + x2^2 < 2^(e+1) (e = 1 or 2) the
 * squares add half an fp32 ulp, 2^(e-24), as x1 = 2^((e-24)/2) when e is even, else
 * x1 = x3 = 2^((e-25)/2).  Summed in sequence every t^2 < 2^(e-53) is less than half a double
 * ulp of M and is lost, so the mean is a tie, rounded to even; in the spec's order the t^2 of a
 * chunk add up first (16 t^2 > 2^-50) and survive: the sum is above M and the mean may round
 * up.  Then rs may differ by an ulp, and the outputs w t rs may cross a bf16 rounding boundary.
 * The test finds such rows with its own two references and requires some, so an oracle summing
 * in sequence fails it (the GPU block test runs the same rows).
 */
START_TEST(rmsnorm_order_visible)
{
    enum { N = 4096 };
    uint16_t x[N], w[N], y[N], want[N], seq_out[N];
    double terms[N];
    int rows_that_differ = 0;
    mmoe_test_sum_order_weight(N, w);
    mmoe_tensor wt = {MMOE_DT_BF16, 1, {N}, w, sizeof w};
    for (int row = 0; row < MMOE_TEST_SUM_ORDER_ROWS; row++) {
        mmoe_test_sum_order_row(row, N, x);
        double seq = 0.0;
        for (int i = 0; i < N; i++) {
            const double v = mmoe_bf16_to_f32(x[i]);
            terms[i] = v * v;
            seq += terms[i];
        }
        ref_rmsnorm(x, w, N, ref_sum(terms, N), want);
        ref_rmsnorm(x, w, N, seq, seq_out);
        rows_that_differ += memcmp(want, seq_out, sizeof want) != 0;
        mmoe_test_poison_bf16(y, N);
        mmoe_rmsnorm_bf16(x, 1, N, &wt, 0.0f, y);
        int bad = -1; /* one assertion per row (Check records each one) */
        for (int i = 0; i < N && bad < 0; i++)
            bad = y[i] != want[i] ? i : -1;
        ck_assert_msg(bad < 0, "rmsnorm row %d col %d: %04x, expected %04x", row, bad, y[bad < 0 ? 0 : bad],
                      want[bad < 0 ? 0 : bad]);
    }
    printf("rmsnorm_order_visible: %d of %d rows tell the orders apart\n", rows_that_differ, MMOE_TEST_SUM_ORDER_ROWS);
    ck_assert_msg(rows_that_differ > 0, "no row tells the spec's order from the sequential one");
}
END_TEST

/*
 * Dense linear rows (mmoe_test_sum_order_sum_row()) against a weight row of ones: x0 = 1 + p/128
 * and x2 = 1 + q/16 sum to s in [2, 4) with no bit below 2^-7, x1 = 2^-23 is half an fp32 ulp
 * there, so M = s + x1 is exact in double and an fp32 midpoint whose lower neighbour s is even;
 * the 4080 values t in 2^-54 [1, 1.4) from index 16 on are each less than half a double ulp of
 * M (2^-52).  In sequence every t is lost, the sum is the tie M and rounds to s; in the spec's
 * order a chunk's 16 t add up first (> 2^-50), survive, and the sum rounds up to s + 2^-22.  So
 * every row tells the orders apart, in the fp32 output itself (a sequential oracle fails here).
 */
START_TEST(dense_order_visible)
{
    enum { N = 4096 };
    uint16_t x[N], ones[N];
    double terms[N];
    for (int i = 0; i < N; i++)
        ones[i] = mmoe_bf16_from_f32(1.0f);
    mmoe_tensor wt = {MMOE_DT_BF16, 2, {1, N}, ones, sizeof ones};
    int rows_that_differ = 0;
    for (int row = 0; row < MMOE_TEST_SUM_ORDER_ROWS; row++) {
        mmoe_test_sum_order_sum_row(row, N, x);
        double seq = 0.0;
        for (int i = 0; i < N; i++) {
            terms[i] = mmoe_bf16_to_f32(x[i]);
            seq += terms[i];
        }
        const float want = (float)ref_sum(terms, N);
        rows_that_differ += want != (float)seq;
        float y = NAN;
        mmoe_error err;
        ck_assert_int_eq(mmoe_linear_dense(x, 1, N, &wt, 1, &y, NULL, &err), MMOE_OK);
        ck_assert_msg(memcmp(&y, &want, sizeof y) == 0, "dense row %d: %a, expected %a", row, y, want);
    }
    ck_assert_msg(rows_that_differ == MMOE_TEST_SUM_ORDER_ROWS, "only %d rows tell the orders apart",
                  rows_that_differ);
}
END_TEST

/** The attention and indexer dot product follows the order (bf16 inputs spread over 2^-50 .. 2^20). */
START_TEST(dot_follows_the_order)
{
    enum { N = 4096 + 48, ROWS = 40 };
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed + 1);
    uint16_t *x = malloc(2 * (size_t)(ROWS * N)), *bneg = malloc(2 * (size_t)N);
    double *terms = malloc(sizeof(double) * N);
    ck_assert(x && bneg && terms);
    for (int i = 0; i < ROWS * N; i++)
        x[i] = mmoe_bf16_from_f32(ldexpf(1.0f + (float)mmoe_rng_uniform(&r), (int)(mmoe_rng_uniform(&r) * 70) - 50));
    int dot_differs = 0;
    for (int t = 0; t < ROWS; t++) {
        /* row t against row (t + 1) % ROWS with every third sign flipped */
        const uint16_t *xr = x + (size_t)t * N, *br = x + (size_t)((t + 1) % ROWS) * N;
        double seq = 0.0;
        for (int i = 0; i < N; i++) {
            bneg[i] = (uint16_t)(br[i] ^ (i % 3 ? 0u : 0x8000u));
            terms[i] = (double)mmoe_bf16_to_f32(xr[i]) * (double)mmoe_bf16_to_f32(bneg[i]);
            seq += terms[i];
        }
        const double want = ref_sum(terms, N), got = attn_dot_bf16(xr, bneg, N);
        ck_assert_msg(want == got, "dot row %d: %a, expected %a (seed %llu)", t, got, want, (unsigned long long)g_seed);
        dot_differs += seq != want;
    }
    ck_assert_msg(dot_differs > 0, "no dot product differs from the sequential order");
    free(x);
    free(bneg);
    free(terms);
}
END_TEST

/** A bf16 value of random sign spread over 2^-40 .. 2^20 (wide enough that the order shows). */
static uint16_t spread_bf16(mmoe_rng *r)
{
    const float mag = ldexpf(1.0f + (float)mmoe_rng_uniform(r), (int)(mmoe_rng_uniform(r) * 60) - 40);
    return mmoe_bf16_from_f32(mmoe_rng_uniform(r) < 0.5 ? -mag : mag);
}

/*
 * The attention's scores of one query head against a list of rows (attn_dot_rows_bf16()) with
 * every variant that runs here against the spec's order (ref_sum), bit for bit: widths with no
 * full node of 64 terms (16, 40), with a partial chunk after the nodes (77, 512 + 48) and without
 * (128, 512); lists of 1 to 11 rows (the kernels take four at once, then one at a time), the rows
 * in no order of their addresses; terms spread over 2^-80 .. 2^40 with random signs.
 */
START_TEST(dot_rows_follow_the_order)
{
    enum { ROWS = 11, KMAX = 512 + 48 };
    const int64_t widths[] = {16, 40, 77, 128, 512, 512 + 48};
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed + 3);
    uint16_t *q = malloc(2 * (size_t)KMAX), *kv = malloc(2 * (size_t)(ROWS * KMAX));
    double *qd = malloc(sizeof(double) * KMAX), *qp = malloc(sizeof(double) * KMAX);
    double *tmp = malloc(sizeof(double) * KMAX), *terms = malloc(sizeof(double) * KMAX);
    double *out = malloc(sizeof(double) * ROWS);
    ck_assert(q && kv && qd && qp && tmp && terms && out);
    int checked = 0, seq_differs = 0;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const int64_t K = widths[wi];
        for (int64_t k = 0; k < K; k++) {
            q[k] = spread_bf16(&r);
            qd[k] = mmoe_bf16_to_f32(q[k]);
        }
        for (int64_t i = 0; i < ROWS * K; i++)
            kv[i] = spread_bf16(&r);
        const uint16_t *rows[ROWS];
        for (int i = 0; i < ROWS; i++)
            rows[i] = kv + (size_t)(((i * 5) % ROWS) * K);
        for (int64_t k = 0; k < KMAX; k++)
            qp[k] = NAN;
        attn_dot_chunk_x(qd, K, qp);
        for (int isa_i = 0; isa_i < MOE_DOT_ISA_COUNT; isa_i++) {
            const moe_dot_isa isa = (moe_dot_isa)isa_i;
            if (!moe_dot_isa_runs_here(isa))
                continue;
            for (int n = 1; n <= ROWS; n += n < 5 ? 1 : 6) { /* 1 .. 5, then 11 */
                for (int i = 0; i < ROWS; i++)
                    out[i] = NAN;
                attn_dot_rows_bf16(isa, qd, qp, K, rows, n, tmp, out);
                for (int i = 0; i < ROWS; i++) {
                    if (i >= n) {
                        ck_assert_msg(isnan(out[i]), "%s: row %d written past the %d of the list",
                                      moe_dot_isa_name(isa), i, n);
                        continue;
                    }
                    double seq = 0.0;
                    for (int64_t k = 0; k < K; k++) {
                        terms[k] = qd[k] * (double)mmoe_bf16_to_f32(rows[i][k]);
                        seq += terms[k];
                    }
                    const double want = ref_sum(terms, K);
                    ck_assert_msg(memcmp(&want, &out[i], sizeof want) == 0,
                                  "%s, K %lld, %d rows, row %d: %a, expected %a (seed %llu)", moe_dot_isa_name(isa),
                                  (long long)K, n, i, out[i], want, (unsigned long long)g_seed);
                    checked++;
                    seq_differs += seq != want;
                }
            }
        }
    }
    printf("sum_order: attention score rows, %d checked, %d differ from the sequential order\n", checked,
           seq_differs);
    ck_assert_msg(seq_differs * 5 > checked, "only %d of %d scores differ from the sequential order", seq_differs,
                  checked);
    free(q);
    free(kv);
    free(qd);
    free(qp);
    free(tmp);
    free(terms);
    free(out);
}
END_TEST

/** The value of weight element (n, k) as the spec reads it (an F8 weight: e4m3 * scale in fp32, then bf16). */
static double dense_weight_value(const mmoe_tensor *w, const mmoe_tensor *sc, int block, int64_t n, int64_t k)
{
    const int64_t K = w->shape[1];
    switch (w->dtype) {
    case MMOE_DT_BF16: return mmoe_bf16_to_f32(((const uint16_t *)w->data)[n * K + k]);
    case MMOE_DT_F32: return ((const float *)w->data)[n * K + k];
    default: {
        const int64_t i = (n / block) * sc->shape[1] + k / block;
        const float s = sc->dtype == MMOE_DT_F32 ? ((const float *)sc->data)[i]
                                                 : ldexpf(1.0f, ((const uint8_t *)sc->data)[i] - 127);
        const float e = (float)attn_ref_e4m3_value(((const uint8_t *)w->data)[n * K + k]);
        return mmoe_bf16_round(e * s);
    }
    }
}

/*
 * The double sums of attn_dense_rows() (attn_dense_sums()) with every variant that runs
 * here against the spec's order (ref_sum), bit for bit: BF16, F32 and F8 weights (E8M0 scales over 1..254, so that some products leave
 * the normal fp32 range before the bf16 rounding, and F32 scales), widths with and without a
 * partial node of 64 terms and a partial chunk, 37 rows (two passes of the AVX-512 kernel's
 * sixteen, then the AVX2 kernels' eight and four, then one), an offset row0 crossing F8 row
 * blocks, seven x rows with a stride (a pass of four at once, then three together) and each x row
 * alone (one-row calls: the chunk-lane kernel, for F8 with blocks of 64 and 128); each on the caller alone
 * and with its rows shared out over a pool of 3 threads.  The terms are spread
 * over 2^-40 .. 2^20 so that the order shows: the test counts sums that differ from the
 * sequential sum and requires a fifth of them to.
 */
START_TEST(dense_rows_follow_the_order)
{
    enum { T = 7, LDX = 1100, N = 37, MAX_ROWS = 128 - 2 + N };
    const int64_t widths[] = {16, 64, 77, 200, 256 + 48, 1000}; /* 77: columns past the last 8 */
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed + 2);
    uint16_t *xb = malloc(2 * (size_t)(T * LDX));
    double *x = malloc(sizeof(double) * (size_t)(T * LDX)), *terms = malloc(sizeof(double) * 1000);
    void *wd = malloc(4 * (size_t)(MAX_ROWS * 1000));
    uint8_t *sd = malloc(4 * 4096); /* scales: up to ceil(rows / 4) x 250 fp32 */
    double *y = malloc(sizeof(double) * (size_t)(T * N)), *y1 = malloc(sizeof(double) * (size_t)(T * N));
    ck_assert(xb && x && terms && wd && sd && y && y1);
    moe_dequant_pool *pools;
    mmoe_error perr;
    ck_assert_msg(moe_dequant_pool_create(3, &pools, &perr) == MMOE_OK, "%s", perr.msg);
    for (int i = 0; i < T * LDX; i++) {
        xb[i] = spread_bf16(&r);
        x[i] = mmoe_bf16_to_f32(xb[i]);
    }
    int checked = 0, seq_differs = 0;
    const struct {
        mmoe_dtype dtype;
        int f32_scale; /* F8: F32 scales instead of E8M0 */
        int block;     /* F8: the block edge (4: the value tables only; 8: E8M0 also through the AVX2 decoder;
                          64 and 128: one-row calls also through the chunk-lane kernel) */
        int tiny;      /* F8 E8M0: scale bytes 1..12 only, around the decoder's lower limit (subnormal products) */
    } kinds[] = {{MMOE_DT_BF16, 0, 4, 0},    {MMOE_DT_F32, 0, 4, 0},     {MMOE_DT_F8_E4M3, 0, 4, 0},
                 {MMOE_DT_F8_E4M3, 1, 4, 0}, {MMOE_DT_F8_E4M3, 0, 8, 0}, {MMOE_DT_F8_E4M3, 0, 8, 1},
                 {MMOE_DT_F8_E4M3, 0, 64, 0}, {MMOE_DT_F8_E4M3, 0, 128, 0}, {MMOE_DT_F8_E4M3, 0, 128, 1}};
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
        for (size_t di = 0; di < sizeof kinds / sizeof kinds[0]; di++) {
            const int64_t K = widths[wi];
            const int block = kinds[di].block;
            const int f32_scale = kinds[di].f32_scale;
            /* the first row: 5, or for blocks of 64 and more two rows before a row block's end, so
               that a kernel's group of four rows straddles two scale rows */
            const int64_t row0 = block >= 64 ? block - 2 : 5, rows = row0 + N;
            mmoe_tensor w = {kinds[di].dtype, 2, {rows, K}, wd, 0};
            mmoe_tensor sc = {f32_scale ? MMOE_DT_F32 : MMOE_DT_F8_E8M0, 2, {(rows + block - 1) / block, (K + block - 1) / block}, sd, 0};
            for (int64_t i = 0; i < rows * K; i++) {
                if (kinds[di].dtype == MMOE_DT_BF16)
                    ((uint16_t *)wd)[i] = spread_bf16(&r);
                else if (kinds[di].dtype == MMOE_DT_F32)
                    ((float *)wd)[i] = ldexpf(1.0f + (float)mmoe_rng_uniform(&r), (int)(mmoe_rng_uniform(&r) * 60) - 40);
                else {
                    const uint8_t c = (uint8_t)mmoe_rng_below(&r, 254); /* no NaN code */
                    ((uint8_t *)wd)[i] = (uint8_t)(c >= 0x7F ? c + 1 : c);
                }
            }
            if (kinds[di].dtype == MMOE_DT_F8_E4M3) {
                for (int64_t i = 0; i < sc.shape[0] * sc.shape[1]; i++) {
                    if (f32_scale)
                        ((float *)sd)[i] = (float)(mmoe_rng_uniform(&r) * 3.0 + 0.01);
                    else
                        sd[i] = (uint8_t)(1 + mmoe_rng_below(&r, kinds[di].tiny ? 12 : 254));
                }
            }
            for (int run = 0; run < 2 * MOE_DOT_ISA_COUNT; run++) {
                const moe_dot_isa isa = (moe_dot_isa)(run / 2);
                moe_dequant_pool *pool = run % 2 ? pools : NULL; /* the caller alone, then 3 threads */
                if (!moe_dot_isa_runs_here(isa))
                    continue;
                for (int i = 0; i < T * N; i++)
                    y[i] = NAN;
                mmoe_error err;
                ck_assert_msg(attn_dense_sums(pool, isa, x, T, LDX, K, &w, &sc, block, row0, N, y, N, &err) == MMOE_OK,
                              "%s", err.msg);
                for (int t = 0; t < T; t++) { /* each x row alone too (decode's one-row calls) */
                    for (int64_t n = 0; n < N; n++)
                        y1[t * N + n] = NAN;
                    ck_assert_msg(attn_dense_sums(pool, isa, x + t * LDX, 1, LDX, K, &w, &sc, block, row0, N, y1 + t * N,
                                                  N, &err) == MMOE_OK,
                                  "%s", err.msg);
                }
                for (int t = 0; t < T; t++)
                    for (int64_t n = 0; n < N; n++) {
                        double seq = 0.0;
                        for (int64_t k = 0; k < K; k++) {
                            terms[k] = x[t * LDX + k] * dense_weight_value(&w, &sc, block, row0 + n, k);
                            seq += terms[k];
                        }
                        const double want = ref_sum(terms, K), got = y[t * N + n], got1 = y1[t * N + n];
                        ck_assert_msg(memcmp(&want, &got1, sizeof want) == 0,
                                      "%s, %d threads, %s weight (block %d), K %lld, row %lld, x row %d alone: %a, "
                                      "expected %a (seed %llu)",
                                      moe_dot_isa_name(isa), moe_dequant_pool_threads(pool),
                                      mmoe_dtype_name(kinds[di].dtype), block, (long long)K, (long long)n, t, got1,
                                      want, (unsigned long long)g_seed);
                        ck_assert_msg(memcmp(&want, &got, sizeof want) == 0,
                                      "%s, %d threads, %s weight, K %lld, row %lld, x row %d: %a, expected %a (seed %llu)",
                                      moe_dot_isa_name(isa), moe_dequant_pool_threads(pool), mmoe_dtype_name(kinds[di].dtype),
                                      (long long)K,
                                      (long long)n, t, got, want, (unsigned long long)g_seed);
                        checked++;
                        seq_differs += seq != want;
                    }
            }
        }
    printf("sum_order: dense rows, %d outputs checked, %d of them differ from the sequential order\n", checked,
           seq_differs);
    ck_assert_msg(seq_differs * 5 > checked, "only %d of %d dense sums differ from the sequential order", seq_differs,
                  checked);
    moe_dequant_pool_release(pools);
    free(xb);
    free(x);
    free(terms);
    free(wd);
    free(sd);
    free(y);
    free(y1);
}
END_TEST

/*
 * attn_dense_sums() with more x rows than the AVX-512 kernel's block of 64 (70: a block of 64,
 * then one of 6), a width of five full nodes and a tail (333: the kernel's chunks of four nodes,
 * then one), 37 BF16 rows, with every variant that runs here, against the spec's order.
 */
START_TEST(dense_rows_many_x_rows)
{
    enum { T = 70, K = 333, N = 37 };
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed + 4);
    double *x = malloc(sizeof(double) * T * K), *y = malloc(sizeof(double) * T * N), terms[K];
    uint16_t *wd = malloc(2 * (size_t)(N * K));
    ck_assert(x && y && wd);
    for (int i = 0; i < T * K; i++)
        x[i] = mmoe_bf16_to_f32(spread_bf16(&r));
    for (int i = 0; i < N * K; i++)
        wd[i] = spread_bf16(&r);
    mmoe_tensor w = {MMOE_DT_BF16, 2, {N, K}, wd, 0};
    for (int isa = 0; isa < MOE_DOT_ISA_COUNT; isa++) {
        if (!moe_dot_isa_runs_here((moe_dot_isa)isa))
            continue;
        for (int i = 0; i < T * N; i++)
            y[i] = NAN;
        mmoe_error err;
        ck_assert_msg(attn_dense_sums(NULL, (moe_dot_isa)isa, x, T, K, K, &w, NULL, 0, 0, N, y, N, &err) == MMOE_OK,
                      "%s", err.msg);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++) {
                for (int k = 0; k < K; k++)
                    terms[k] = x[t * K + k] * mmoe_bf16_to_f32(wd[n * K + k]);
                const double want = ref_sum(terms, K);
                ck_assert_msg(memcmp(&want, &y[t * N + n], sizeof want) == 0,
                              "%s, x row %d, row %d: %a, expected %a (seed %llu)", moe_dot_isa_name((moe_dot_isa)isa), t,
                              n, y[t * N + n], want, (unsigned long long)g_seed);
            }
    }
    free(x);
    free(y);
    free(wd);
}
END_TEST

/*
 * mHC's logits: attn_dot_f32_rows() (F32 rows with a stride against one BF16 x) with every variant
 * that runs here against the spec's order, bit for bit: widths 16 (no node), 77 and 560 (nodes
 * and a tail), 1 to 9 rows (four at a time, then one at a time), F32 values spread over 2^-40 ..
 * 2^20 with random signs.
 */
START_TEST(f32_rows_follow_the_order)
{
    enum { KMAX = 560, LDR = 600, ROWS = 9 };
    const int64_t widths[] = {16, 77, 560};
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed + 5);
    uint16_t x[KMAX];
    float *rows = malloc(sizeof(float) * ROWS * LDR);
    double out[ROWS], terms[KMAX];
    ck_assert(rows);
    int checked = 0, seq_differs = 0;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const int64_t K = widths[wi];
        for (int64_t k = 0; k < K; k++)
            x[k] = spread_bf16(&r);
        for (int i = 0; i < ROWS * LDR; i++) {
            const float mag = ldexpf(1.0f + (float)mmoe_rng_uniform(&r), (int)(mmoe_rng_uniform(&r) * 60) - 40);
            rows[i] = mmoe_rng_uniform(&r) < 0.5 ? -mag : mag;
        }
        for (int isa = 0; isa < MOE_DOT_ISA_COUNT; isa++) {
            if (!moe_dot_isa_runs_here((moe_dot_isa)isa))
                continue;
            for (int n = 1; n <= ROWS; n++) {
                for (int i = 0; i < ROWS; i++)
                    out[i] = NAN;
                attn_dot_f32_rows((moe_dot_isa)isa, x, K, rows, LDR, n, out);
                for (int i = 0; i < ROWS; i++) {
                    if (i >= n) {
                        ck_assert_msg(isnan(out[i]), "%s: row %d written past %d", moe_dot_isa_name((moe_dot_isa)isa),
                                      i, n);
                        continue;
                    }
                    double seq = 0.0;
                    for (int64_t k = 0; k < K; k++) {
                        terms[k] = (double)rows[i * LDR + k] * (double)mmoe_bf16_to_f32(x[k]);
                        seq += terms[k];
                    }
                    const double want = ref_sum(terms, K);
                    ck_assert_msg(memcmp(&want, &out[i], sizeof want) == 0,
                                  "%s, K %lld, %d rows, row %d: %a, expected %a (seed %llu)",
                                  moe_dot_isa_name((moe_dot_isa)isa), (long long)K, n, i, out[i], want,
                                  (unsigned long long)g_seed);
                    checked++;
                    seq_differs += seq != want;
                }
            }
        }
    }
    ck_assert_msg(seq_differs * 5 > checked, "only %d of %d sums differ from the sequential order", seq_differs,
                  checked);
    free(rows);
}
END_TEST

static Suite *sum_order_suite(void)
{
    Suite *s = suite_create("sum_order");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, hand_values);
    tcase_add_test(tc, streaming_equals_recursive);
    tcase_add_test(tc, rmsnorm_order_visible);
    tcase_add_test(tc, dot_follows_the_order);
    tcase_add_test(tc, dot_rows_follow_the_order);
    tcase_add_test(tc, dense_order_visible);
    tcase_add_test(tc, dense_rows_follow_the_order);
    tcase_add_test(tc, dense_rows_many_x_rows);
    tcase_add_test(tc, f32_rows_follow_the_order);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("sum_order");
    return mmoe_test_run(sum_order_suite());
}
