/**
 * @file test_mhc.c
 * @brief Suite "mhc": stream expansion, Sinkhorn, hc_pre, hc_post, hc_head and RMSNorm against float64 references.
 *
 * The references below are written from docs/spec/architecture.md (mHC, head, RMSNorm) in double precision.
 * Tolerances (GSL style, named):
 * - TOL_SINKHORN: the fp32 Sinkhorn does ~40 normalization steps on values in (0, 1];
 *   each step adds at most a few fp32 roundings (2^-24 relative) that partly propagate,
 *   so 64 * 2^-24 * 40 ~ 1.5e-4 bounds the absolute error with a wide margin (seen ~1e-6).
 * - TOL_F32_MIX: pre/post weights come from a sigmoid of an fp32 dot product of 4D
 *   terms with one rounding: 8 fp32 ulps of relative error.
 * - a bf16 output may differ from the double reference by one bf16 ulp (when the fp32
 *   value lies within fp32 noise of a rounding boundary) plus TOL_SUM_F32 times the sum of
 *   the magnitudes of the terms (when the terms cancel): bf16_close_mag().
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"
#include "mmoe_linear.h"
#include "mmoe_mhc.h"
#include "mmoe_moe.h"
#include "mmoe_test.h"

#define TOL_SINKHORN 1.5e-4
#define TOL_F32_MIX (8 * MMOE_EPS_F32)
/** fp32 error of a short sum (<= 5 terms) whose weights carry TOL_F32_MIX-sized errors, relative to sum |terms|. */
#define TOL_SUM_F32 (64 * MMOE_EPS_F32)

enum { HC = 4, D = 256, T = 5 };

static uint64_t g_seed;

static uint16_t rand_bf16(mmoe_rng *r, double std) { return mmoe_bf16_from_f32((float)(std * mmoe_rng_normal(r))); }

/**
 * Is bf16 @p got within one bf16 ulp of the exact value @p ref, plus the fp32 error of
 * the sum that made it?  @p mag is the sum of the magnitudes of the summed terms: when
 * they cancel, the fp32 roundings of the terms (TOL_SUM_F32 * mag) can exceed a bf16 ulp
 * of the small result.
 */
static int bf16_close_mag(uint16_t got, double ref, double mag)
{
    double g = mmoe_bf16_to_f32(got);
    double ulp = ldexp(1.0, ilogb(ref == 0 ? 1e-30 : ref) - 7);
    return fabs(g - ref) <= ulp + TOL_SUM_F32 * mag + 1e-30;
}

/** bf16_close_mag() for a value computed without cancellation (the magnitude is the value). */
static int bf16_close(uint16_t got, double ref) { return bf16_close_mag(got, ref, fabs(ref)); }

static void ref_sinkhorn(double *C, int iters, double eps)
{
    for (int j = 0; j < HC; j++) {
        double mx = C[j * HC], s = 0;
        for (int k = 1; k < HC; k++)
            mx = fmax(mx, C[j * HC + k]);
        for (int k = 0; k < HC; k++)
            s += exp(C[j * HC + k] - mx);
        for (int k = 0; k < HC; k++)
            C[j * HC + k] = exp(C[j * HC + k] - mx) / s + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it) {
            for (int j = 0; j < HC; j++) {
                double s = 0;
                for (int k = 0; k < HC; k++)
                    s += C[j * HC + k];
                for (int k = 0; k < HC; k++)
                    C[j * HC + k] /= s + eps;
            }
        }
        for (int k = 0; k < HC; k++) {
            double s = 0;
            for (int j = 0; j < HC; j++)
                s += C[j * HC + k];
            for (int j = 0; j < HC; j++)
                C[j * HC + k] /= s + eps;
        }
    }
}

START_TEST(sinkhorn_vs_f64)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed);
    for (int trial = 0; trial < 200; trial++) {
        float C[HC * HC];
        double R[HC * HC];
        double spread = trial % 2 ? 1.0 : 8.0;
        for (int i = 0; i < HC * HC; i++) {
            C[i] = (float)(spread * mmoe_rng_normal(&r));
            R[i] = C[i];
        }
        mmoe_hc_sinkhorn(C, HC, 20, 1e-6f);
        ref_sinkhorn(R, 20, 1e-6);
        for (int i = 0; i < HC * HC; i++)
            ck_assert_msg(fabs(C[i] - R[i]) <= TOL_SINKHORN, "trial %d entry %d: %.9g vs %.9g", trial, i, C[i], R[i]);
        /* the last step is a column normalization: every column sums to 1 - O(eps) */
        for (int k = 0; k < HC; k++) {
            double s = 0;
            for (int j = 0; j < HC; j++)
                s += C[j * HC + k];
            ck_assert_msg(fabs(s - 1.0) < 1e-5, "column %d sums to %.9g", k, s);
        }
    }
    /* hand case: all-equal logits give the uniform matrix (1/4 + eps, normalized) */
    float U[HC * HC];
    for (int i = 0; i < HC * HC; i++)
        U[i] = 0.3f;
    mmoe_hc_sinkhorn(U, HC, 20, 1e-6f);
    for (int i = 0; i < HC * HC; i++)
        ck_assert(fabs(U[i] - 0.25) < 1e-6);
}
END_TEST

/** The double reference of hc_pre / hc_head's mixing logits. */
static void ref_logits(const uint16_t *Xt, const float *fn, int n_out, double eps, double *m)
{
    double ss = 0;
    for (int i = 0; i < HC * D; i++) {
        double v = mmoe_bf16_to_f32(Xt[i]);
        ss += v * v;
    }
    double rs = 1.0 / sqrt(ss / (HC * D) + eps);
    for (int o = 0; o < n_out; o++) {
        double acc = 0;
        for (int i = 0; i < HC * D; i++)
            acc += (double)fn[o * HC * D + i] * mmoe_bf16_to_f32(Xt[i]);
        m[o] = acc * rs;
    }
}

static double sig(double z) { return 1.0 / (1.0 + exp(-z)); }

/** Random hc_pre weights: fn [(2+HC)*HC, HC*D] of rows O(1) against O(1) streams, base [(2+HC)*HC], scale [3]. */
static void rand_pre_weights(mmoe_rng *r, float *fn, float *base, float *scale)
{
    const int NM = (2 + HC) * HC;
    for (int i = 0; i < NM * HC * D; i++)
        fn[i] = (float)(mmoe_rng_normal(r) / sqrt(HC * D));
    for (int i = 0; i < NM; i++)
        base[i] = (float)(0.5 * mmoe_rng_normal(r));
    for (int i = 0; i < 3; i++)
        scale[i] = (float)(0.5 + mmoe_rng_uniform(r));
}

START_TEST(expand_pre_post_head_vs_f64)
{
    const int NM = (2 + HC) * HC;
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed + 1);
    mmoe_hc_params p = {HC, D, 20, 1e-6f, 1e-6f};
    uint16_t h[T * D], X[T * HC * D], y[T * D], Xn[T * HC * D], out[T * D];
    float *fn = malloc(sizeof(float) * NM * HC * D), base[(2 + HC) * HC], scale[3], post[T * HC], comb[T * HC * HC];
    for (int i = 0; i < T * D; i++)
        h[i] = rand_bf16(&r, 1.0);
    mmoe_test_poison_bf16(X, T * HC * D);
    mmoe_hc_expand(&p, h, T, X);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < HC; j++)
            ck_assert_mem_eq(X + (t * HC + j) * D, h + t * D, sizeof(uint16_t) * D);
    /* make the streams differ, as they do after the first block */
    for (int i = 0; i < T * HC * D; i++)
        X[i] = rand_bf16(&r, 1.0 + (i / D) % HC);
    rand_pre_weights(&r, fn, base, scale);
    mmoe_test_poison_bf16(y, T * D);
    mmoe_test_poison_f32(post, T * HC);
    mmoe_test_poison_f32(comb, T * HC * HC);
    mmoe_hc_pre(&p, X, T, fn, base, scale, y, post, comb);
    double Cref[T][HC * HC];
    for (int t = 0; t < T; t++) {
        double m[(2 + HC) * HC], pre[HC];
        ref_logits(X + t * HC * D, fn, NM, 1e-6, m);
        for (int j = 0; j < HC; j++) {
            pre[j] = sig(m[j] * scale[0] + base[j]) + 1e-6;
            double pst = 2 * sig(m[HC + j] * scale[1] + base[HC + j]);
            ck_assert_msg(fabs(post[t * HC + j] - pst) <= TOL_F32_MIX * 8 * fabs(pst) + 1e-7, "post %d %d", t, j);
        }
        for (int i = 0; i < HC * HC; i++)
            Cref[t][i] = m[2 * HC + i] * scale[2] + base[2 * HC + i];
        ref_sinkhorn(Cref[t], 20, 1e-6);
        for (int i = 0; i < HC * HC; i++)
            ck_assert_msg(fabs(comb[t * HC * HC + i] - Cref[t][i]) <= TOL_SINKHORN, "comb %d %d", t, i);
        for (int c = 0; c < D; c++) {
            double acc = 0, mag = 0;
            for (int j = 0; j < HC; j++) {
                acc += pre[j] * mmoe_bf16_to_f32(X[(t * HC + j) * D + c]);
                mag += fabs(pre[j] * mmoe_bf16_to_f32(X[(t * HC + j) * D + c]));
            }
            ck_assert_msg(bf16_close_mag(y[t * D + c], acc, mag), "y[%d,%d] = %g, ref %.9g", t, c,
                          mmoe_bf16_to_f32(y[t * D + c]), acc);
        }
    }
    /* hc_post, out of place and in place (Xn aliasing R) give the same bits */
    for (int i = 0; i < T * D; i++)
        out[i] = rand_bf16(&r, 0.5);
    mmoe_test_poison_bf16(Xn, T * HC * D);
    mmoe_hc_post(&p, out, X, T, post, comb, Xn);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < HC; k++)
            for (int c = 0; c < D; c++) {
                double acc = (double)post[t * HC + k] * mmoe_bf16_to_f32(out[t * D + c]);
                double mag = fabs(acc);
                for (int j = 0; j < HC; j++) {
                    double term = (double)comb[t * HC * HC + j * HC + k] * mmoe_bf16_to_f32(X[(t * HC + j) * D + c]);
                    acc += term;
                    mag += fabs(term);
                }
                ck_assert_msg(bf16_close_mag(Xn[(t * HC + k) * D + c], acc, mag), "Xn[%d,%d,%d]", t, k, c);
            }
    uint16_t Xi[T * HC * D];
    memcpy(Xi, X, sizeof Xi);
    mmoe_hc_post(&p, out, Xi, T, post, comb, Xi);
    ck_assert_mem_eq(Xi, Xn, sizeof Xi);
    /* hc_head: sigmoid weights only */
    float hfn[HC * HC * D], hbase[HC], hscale[1] = {0.8f};
    for (int i = 0; i < HC * HC * D; i++)
        hfn[i] = (float)(mmoe_rng_normal(&r) / sqrt(HC * D));
    for (int i = 0; i < HC; i++)
        hbase[i] = (float)(0.5 * mmoe_rng_normal(&r));
    mmoe_test_poison_bf16(y, T * D);
    mmoe_hc_head(&p, X, T, hfn, hbase, hscale, y);
    for (int t = 0; t < T; t++) {
        double m[HC];
        ref_logits(X + t * HC * D, hfn, HC, 1e-6, m);
        for (int c = 0; c < D; c++) {
            double acc = 0, mag = 0;
            for (int j = 0; j < HC; j++) {
                double term = (sig(m[j] * hscale[0] + hbase[j]) + 1e-6) * mmoe_bf16_to_f32(X[(t * HC + j) * D + c]);
                acc += term;
                mag += fabs(term);
            }
            ck_assert_msg(bf16_close_mag(y[t * D + c], acc, mag), "head y[%d,%d]", t, c);
        }
    }
    /* one row alone gives the same bits as inside the batch (prefill = decode) */
    uint16_t y1[D];
    mmoe_hc_head(&p, X + 3 * HC * D, 1, hfn, hbase, hscale, y1);
    ck_assert_mem_eq(y1, y + 3 * D, sizeof y1);
    free(fn);
}
END_TEST

/*
 * The _pool variants (tokens shared out over a pool of 3 threads) against the plain functions, bit
 * for bit, with enough tokens that both share them out (hc_post's tokens are light: grabs of
 * several), hc_post in place as the forward calls it.
 */
START_TEST(pool_variants_same_bits)
{
    enum { TP = 40, NM = (2 + HC) * HC };
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed + 3);
    mmoe_hc_params p = {HC, D, 20, 1e-6f, 1e-6f};
    static uint16_t X[TP * HC * D], out[TP * D], y[2][TP * D], Xn[2][TP * HC * D];
    static float fn[NM * HC * D], post[2][TP * HC], comb[2][TP * HC * HC];
    float base[NM], scale[3];
    for (int i = 0; i < TP * HC * D; i++)
        X[i] = rand_bf16(&r, 1.0 + (i / D) % HC);
    for (int i = 0; i < TP * D; i++)
        out[i] = rand_bf16(&r, 0.5);
    rand_pre_weights(&r, fn, base, scale);
    mmoe_moe_pool *pool = NULL;
    mmoe_error err;
    ck_assert_msg(mmoe_moe_pool_create(3, &pool, &err) == MMOE_OK, "%s", err.msg);
    for (int v = 0; v < 2; v++) {
        mmoe_test_poison_bf16(y[v], TP * D);
        mmoe_test_poison_f32(post[v], TP * HC);
        mmoe_test_poison_f32(comb[v], TP * HC * HC);
        memcpy(Xn[v], X, sizeof X);
        if (v == 0) {
            mmoe_hc_pre(&p, X, TP, fn, base, scale, y[v], post[v], comb[v]);
            mmoe_hc_post(&p, out, Xn[v], TP, post[v], comb[v], Xn[v]);
        } else {
            mmoe_hc_pre_pool(pool, &p, X, TP, fn, base, scale, y[v], post[v], comb[v]);
            mmoe_hc_post_pool(pool, &p, out, Xn[v], TP, post[v], comb[v], Xn[v]);
        }
    }
    ck_assert_mem_eq(y[0], y[1], sizeof y[0]);
    ck_assert_mem_eq(post[0], post[1], sizeof post[0]);
    ck_assert_mem_eq(comb[0], comb[1], sizeof comb[0]);
    ck_assert_mem_eq(Xn[0], Xn[1], sizeof Xn[0]);
    mmoe_moe_pool_destroy(pool);
}
END_TEST

START_TEST(rmsnorm_vs_f64)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, g_seed + 2);
    uint16_t x[T * D], y[T * D], w[D];
    for (int i = 0; i < T * D; i++)
        x[i] = rand_bf16(&r, 3.0);
    for (int i = 0; i < D; i++)
        w[i] = mmoe_bf16_from_f32((float)(1.0 + 0.1 * mmoe_rng_normal(&r)));
    mmoe_tensor wt = {MMOE_DT_BF16, 1, {D}, w, sizeof w};
    mmoe_test_poison_bf16(y, T * D);
    mmoe_rmsnorm_bf16(x, T, D, &wt, 1e-6f, y);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int c = 0; c < D; c++)
            ss += pow(mmoe_bf16_to_f32(x[t * D + c]), 2);
        double rs = 1.0 / sqrt(ss / D + 1e-6);
        for (int c = 0; c < D; c++) {
            double ref = mmoe_bf16_to_f32(w[c]) * mmoe_bf16_to_f32(x[t * D + c]) * rs;
            ck_assert_msg(bf16_close(y[t * D + c], ref), "rmsnorm [%d,%d]", t, c);
        }
    }
}
END_TEST

/*
 * The logits' sums follow the order of the forward's double sums (chunks of 16 from +0, then the
 * pairwise tree), hand-derived.  Streams of width 16 (hc * D = 64 values: one node of four chunks)
 * hold 1 at positions 0, 16, 32 and 48 and 0 elsewhere; the fn row of post logit 0 (row hc) holds
 * 1, u, -1, u there (u = 2^-60), so that the chunk sums are c0 = 1, c1 = u, c2 = -1, c3 = u, and
 * every other fn row is 0.  In the spec's order the sum is (1 + u) + (-1 + u) = 1 + (-1) = 0
 * (1 + u rounds to 1), so the logit is 0 and, with base 0, post[0] = 2 sigmoid(0) = 1 exactly.
 * Summed in sequence it is ((1 + u) - 1) + u = u, with the node's chunks paired the other way
 * (c0 + c2) + (c1 + c3) = 2u: with scale[1] = 2^60 the logit times the scale is then rs or 2 rs
 * (rs = 1/sqrt(4/64 + eps), about 4), and post[0] = 2 sigmoid(4) or 2 sigmoid(8), not 1.
 */
START_TEST(logits_follow_the_sum_order)
{
    enum { W = 16, N = HC * W, NMIX = (2 + HC) * HC };
    const mmoe_hc_params p = {HC, W, 20, 1e-6f, 1e-6f};
    uint16_t X[N], y[W];
    float fn[NMIX * N], base[NMIX], post[HC], comb[HC * HC];
    const float scale[3] = {1.0f, 0x1p60f, 1.0f};
    memset(fn, 0, sizeof fn);
    memset(base, 0, sizeof base);
    for (int i = 0; i < N; i++)
        X[i] = mmoe_bf16_from_f32(i % 16 == 0 ? 1.0f : 0.0f);
    float *row = fn + HC * N; /* the logit of post[0] */
    row[0] = 1.0f;
    row[16] = 0x1p-60f;
    row[32] = -1.0f;
    row[48] = 0x1p-60f;
    for (int j = 0; j < HC; j++)
        post[j] = NAN;
    mmoe_hc_pre(&p, X, 1, fn, base, scale, y, post, comb);
    ck_assert_msg(post[0] == 1.0f, "post[0] = %a: the logit's sum is not (c0 + c1) + (c2 + c3)", post[0]);
    for (int j = 1; j < HC; j++)
        ck_assert_msg(post[j] == 1.0f, "post[%d] = %a, expected 1 (a zero logit)", j, post[j]);
}
END_TEST

static Suite *mhc_suite(void)
{
    Suite *s = suite_create("mhc");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, sinkhorn_vs_f64);
    tcase_add_test(tc, expand_pre_post_head_vs_f64);
    tcase_add_test(tc, rmsnorm_vs_f64);
    tcase_add_test(tc, logits_follow_the_sum_order);
    tcase_add_test(tc, pool_variants_same_bits);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("mhc");
    return mmoe_test_run(mhc_suite());
}
