/**
 * @file gpu_moe_compare.c
 * @brief The comparison of test_gpu_moe, with its flip explanation (gpu_moe_compare.h says
 *        what is bounded and why).
 *
 * The W2 values are decoded here from the checkpoint layout with the scalar format tables
 * (mmoe_formats.h): a routed expert's W2 is [D, I] E2M1 codes, two a byte (element 2j in the
 * low nibble), with a UE8M0 scale per 32 of a row; the shared expert's is [D, S] E4M3 with a
 * UE8M0 scale per square block of the description's shared_block.
 */
#include "gpu_moe_compare.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"

int64_t gmc_beyond_ulps(const double *err, const uint16_t *ref, int64_t D, double rms, int ulps)
{
    int64_t beyond = 0;
    for (int64_t j = 0; j < D; j++) {
        const double r = mmoe_bf16_to_f32(ref[j]);
        if (isnan(r) || isnan(err[j]))
            continue;
        const double ulp = ldexp(1.0, ilogb(fmax(fmax(fabs(r), rms), 1e-30)) - 7);
        beyond += fabs(err[j]) > ulps * ulp;
    }
    return beyond;
}

/** Sum of squares of a token's reference row (NaN left out) and of its error. */
static void token_sums(const double *err, const uint16_t *ref, int64_t D, double *ref_sq, double *err_sq)
{
    double rs = 0.0, es = 0.0;
    for (int64_t j = 0; j < D; j++) {
        const double r = mmoe_bf16_to_f32(ref[j]);
        if (isnan(r) || isnan(err[j]))
            continue;
        rs += r * r;
        es += err[j] * err[j];
    }
    *ref_sq = rs;
    *err_sq = es;
}

static double rel_of(double err_sq, double ref_sq)
{
    return ref_sq > 0.0 ? sqrt(err_sq / ref_sq) : sqrt(err_sq);
}

/** Does one token's error pass a normwise bound @p norm_tol and the element count at @p ulps? */
static int token_passes(const double *err, const uint16_t *ref, int64_t D, double norm_tol, int ulps)
{
    double ref_sq, err_sq;
    token_sums(err, ref, D, &ref_sq, &err_sq);
    const int64_t beyond = gmc_beyond_ulps(err, ref, D, sqrt(ref_sq / (double)D), ulps);
    return rel_of(err_sq, ref_sq) <= norm_tol && (double)beyond <= GMC_ELEM_FRAC * (double)D;
}

/** W2 of one expert, decoded on demand: routed (E2M1 + UE8M0 per group) or shared (E4M3 + UE8M0 blocks). */
typedef struct w2_view {
    const uint8_t *codes, *scales;
    int64_t rows, cols;       /**< D and the expert's intermediate width */
    int64_t scale_cols;       /**< scale bytes per row (routed) or per block row (shared) */
    int64_t group;            /**< columns per scale (routed) or the block edge (shared) */
    int shared;
} w2_view;

static int w2_of(const gmc_layer *L, int64_t expert, w2_view *v)
{
    const mmoe_moe_expert_weights *x = expert >= 0 ? &L->w->experts[expert] : &L->w->shared;
    if (x->w2.data == NULL || x->w2_scale.data == NULL || x->w2.ndim != 2 || x->w2_scale.ndim != 2)
        return -1;
    v->codes = x->w2.data;
    v->scales = x->w2_scale.data;
    v->rows = x->w2.shape[0];
    v->shared = expert < 0;
    v->scale_cols = x->w2_scale.shape[1];
    if (v->shared) {
        v->cols = x->w2.shape[1];
        v->group = L->desc->shared_block;
    } else {
        v->cols = x->w2.shape[1] * 2;
        v->group = v->scale_cols > 0 ? v->cols / v->scale_cols : 0;
    }
    return v->rows > 0 && v->cols > 0 && v->group > 0 ? 0 : -1;
}

/** Row @p j of @p v decoded into @p out [cols]. */
static void w2_row(const w2_view *v, int64_t j, double *out)
{
    if (v->shared) {
        const float *e4m3 = mmoe_fp8_e4m3_table();
        const uint8_t *row = v->codes + j * v->cols, *sc = v->scales + (j / v->group) * v->scale_cols;
        for (int64_t c = 0; c < v->cols; c++)
            out[c] = (double)e4m3[row[c]] * (double)mmoe_ue8m0_to_f32(sc[c / v->group]);
    } else {
        const float *fp4_pairs = mmoe_fp4_e2m1_pair_table();
        const uint8_t *row = v->codes + j * (v->cols / 2), *sc = v->scales + j * v->scale_cols;
        for (int64_t c = 0; c < v->cols; c++)
            out[c] = (double)fp4_pairs[2 * row[c >> 1] + (c & 1)] * (double)mmoe_ue8m0_to_f32(sc[c / v->group]);
    }
}

/** The experts of token @p t (routed ones once each, then -1 for the shared expert); returns their count. */
static int experts_of(const gmc_layer *L, int64_t t, int64_t *out)
{
    const int K = L->desc->topk;
    int n = 0;
    for (int k = 0; k < K; k++) {
        const int64_t e = L->topk_idx[t * K + k];
        int seen = e < 0;
        for (int i = 0; i < n && !seen; i++)
            seen = out[i] == e;
        if (!seen)
            out[n++] = e;
    }
    if (L->desc->n_shared > 0)
        out[n++] = -1;
    return n;
}

/**
 * The multiples alpha_i of the @p k columns @p cols [k, D] closest to @p err0 (the normal
 * equations, solved by Gaussian elimination with partial pivoting); @p err = err0 - sum_i
 * alpha_i col_i, NaN elements left as they are.
 */
static void fit_columns(const double *cols, int k, int64_t D, const double *err0, double *err, gmc_flip *flips)
{
    double g[GMC_MAX_FLIPS][GMC_MAX_FLIPS + 1];
    for (int a = 0; a < k; a++) {
        for (int b = 0; b <= k; b++)
            g[a][b] = 0.0;
        for (int64_t j = 0; j < D; j++) {
            if (isnan(err0[j]))
                continue;
            for (int b = 0; b < k; b++)
                g[a][b] += cols[(size_t)a * D + j] * cols[(size_t)b * D + j];
            g[a][k] += cols[(size_t)a * D + j] * err0[j];
        }
    }
    for (int p = 0; p < k; p++) {
        int piv = p;
        for (int a = p + 1; a < k; a++)
            if (fabs(g[a][p]) > fabs(g[piv][p]))
                piv = a;
        for (int b = 0; b <= k; b++) {
            const double tmp = g[p][b];
            g[p][b] = g[piv][b];
            g[piv][b] = tmp;
        }
        for (int a = p + 1; a < k; a++) {
            const double m = g[p][p] != 0.0 ? g[a][p] / g[p][p] : 0.0;
            for (int b = p; b <= k; b++)
                g[a][b] -= m * g[p][b];
        }
    }
    for (int p = k - 1; p >= 0; p--) {
        double s = g[p][k];
        for (int b = p + 1; b < k; b++)
            s -= g[p][b] * flips[b].alpha;
        flips[p].alpha = g[p][p] != 0.0 ? s / g[p][p] : 0.0;
    }
    for (int64_t j = 0; j < D; j++) {
        double e = err0[j];
        for (int a = 0; a < k; a++)
            e -= flips[a].alpha * cols[(size_t)a * D + j];
        err[j] = e;
    }
}

/**
 * The W2 column of the token's experts @p experts [n] that removes the most squared error from
 * @p err (<e, v>^2 / <v, v>, NaN elements left out): its expert into @p expert and the column
 * into @p col [D]; returns its index, or -1 when none removes any.
 */
static int64_t best_column(const gmc_layer *L, const int64_t *experts, int n, const double *err, int64_t *expert,
                           double *col)
{
    const int64_t D = L->desc->hidden;
    double best_gain = 0.0;
    int64_t best_c = -1;
    w2_view best = {0};
    for (int i = 0; i < n; i++) {
        w2_view v;
        if (w2_of(L, experts[i], &v) != 0 || v.rows != D)
            continue;
        double *row = malloc((size_t)v.cols * sizeof *row), *dot = calloc((size_t)v.cols, sizeof *dot),
               *nn = calloc((size_t)v.cols, sizeof *nn);
        if (row != NULL && dot != NULL && nn != NULL) {
            for (int64_t j = 0; j < D; j++) {
                if (isnan(err[j]))
                    continue;
                w2_row(&v, j, row);
                for (int64_t c = 0; c < v.cols; c++) {
                    dot[c] += err[j] * row[c];
                    nn[c] += row[c] * row[c];
                }
            }
            for (int64_t c = 0; c < v.cols; c++)
                if (nn[c] > 0.0 && dot[c] * dot[c] / nn[c] > best_gain) {
                    best_gain = dot[c] * dot[c] / nn[c];
                    best_c = c;
                    best = v;
                    *expert = experts[i];
                }
        }
        free(row);
        free(dot);
        free(nn);
    }
    double *row = best_c >= 0 ? malloc((size_t)best.cols * sizeof *row) : NULL;
    if (row == NULL)
        return -1;
    for (int64_t j = 0; j < D; j++) {
        w2_row(&best, j, row);
        col[j] = row[best_c];
    }
    free(row);
    return best_c;
}

int gmc_explain_token(const gmc_layer *L, int64_t t, double *err, const uint16_t *ref, int max_flips,
                      gmc_flip *flips)
{
    const int64_t D = L->desc->hidden;
    if (token_passes(err, ref, D, GMC_NORM_TOL, GMC_ULPS))
        return 0;
    int64_t *experts = malloc((size_t)(L->desc->topk + 1) * sizeof *experts);
    double *cols = malloc((size_t)max_flips * (size_t)D * sizeof *cols), *err0 = malloc((size_t)D * sizeof *err0);
    int result = -1;
    if (experts != NULL && cols != NULL && err0 != NULL) {
        const int n_experts = experts_of(L, t, experts);
        memcpy(err0, err, (size_t)D * sizeof *err);
        for (int f = 0; f < max_flips && result < 0; f++) {
            flips[f].channel = best_column(L, experts, n_experts, err, &flips[f].expert, cols + (size_t)f * D);
            if (flips[f].channel < 0)
                break;
            /* the chosen columns' multiples fitted together (least squares), from the first error */
            fit_columns(cols, f + 1, D, err0, err, flips);
            if (token_passes(err, ref, D, GMC_FLIP_NORM_TOL, GMC_FLIP_ULPS))
                result = f + 1;
        }
    }
    free(cols);
    free(err0);
    free(experts);
    return result;
}

/** The error of token @p t: gpu - ref per element, NaN where either is NaN. */
static void token_error(const uint16_t *gpu, const uint16_t *ref, int64_t t, int64_t D, double *err)
{
    for (int64_t j = 0; j < D; j++)
        err[j] = (double)mmoe_bf16_to_f32(gpu[t * D + j]) - (double)mmoe_bf16_to_f32(ref[t * D + j]);
}

/**
 * Where a failing comparison's error sits, to locate the defect from one run: per token, its
 * relative L2 error, the elements beyond 2 BF16 ulp of the row's scale and the worst element.
 */
static void print_error_by_token(const uint16_t *gpu, const uint16_t *ref, int64_t T, int64_t D, double *err)
{
    for (int64_t t = 0; t < T; t++) {
        token_error(gpu, ref, t, D, err);
        double ref_sq, err_sq;
        token_sums(err, ref + t * D, D, &ref_sq, &err_sq);
        int64_t worst_j = 0;
        for (int64_t j = 1; j < D; j++)
            if (fabs(err[j]) > fabs(err[worst_j]))
                worst_j = j;
        printf("    token %lld: rel L2 %.3g, beyond 2 ulp %lld, worst channel %lld: gpu %.6g ref %.6g\n", (long long)t,
               rel_of(err_sq, ref_sq), (long long)gmc_beyond_ulps(err, ref + t * D, D, sqrt(ref_sq / (double)D), GMC_ULPS),
               (long long)worst_j, (double)mmoe_bf16_to_f32(gpu[t * D + worst_j]),
               (double)mmoe_bf16_to_f32(ref[t * D + worst_j]));
    }
}

/** The call's bounds over the tokens not explained by flips (@p explained NULL: all of them). */
static void call_sums(gmc_verdict *v, int64_t T, int64_t D, const double *tok_ref_sq, const double *tok_err_sq,
                      const int64_t *tok_beyond, const int *explained)
{
    double ref_sq = 0.0, err_sq = 0.0;
    v->beyond = 0;
    v->n = 0;
    for (int64_t t = 0; t < T; t++) {
        if (explained != NULL && explained[t])
            continue;
        ref_sq += tok_ref_sq[t];
        err_sq += tok_err_sq[t];
        v->beyond += tok_beyond[t];
        v->n += D;
    }
    v->rel_l2 = rel_of(err_sq, ref_sq);
    v->pass = v->nan_count == 0 && v->rel_l2 <= GMC_NORM_TOL && (double)v->beyond <= GMC_ELEM_FRAC * (double)v->n;
}

gmc_verdict gmc_compare(const char *what, const gmc_layer *L, const uint16_t *gpu, const uint16_t *ref, int64_t T,
                        int64_t D)
{
    gmc_verdict v;
    memset(&v, 0, sizeof v);
    const size_t nt = (size_t)(T > 0 ? T : 1);
    double *err = malloc((size_t)(D > 0 ? D : 1) * sizeof *err);
    double *tok_ref_sq = calloc(nt, sizeof *tok_ref_sq), *tok_err_sq = calloc(nt, sizeof *tok_err_sq);
    int64_t *tok_beyond = calloc(nt, sizeof *tok_beyond);
    int *explained = calloc(nt, sizeof *explained);
    if (err == NULL || tok_ref_sq == NULL || tok_err_sq == NULL || tok_beyond == NULL || explained == NULL) {
        printf("  %s: out of memory in the comparison\n", what);
        v.nan_count = -1;
        goto done;
    }
    for (int64_t t = 0; t < T; t++) {
        token_error(gpu, ref, t, D, err);
        for (int64_t j = 0; j < D; j++)
            v.nan_count += isnan(err[j]);
        token_sums(err, ref + t * D, D, &tok_ref_sq[t], &tok_err_sq[t]);
        tok_beyond[t] = gmc_beyond_ulps(err, ref + t * D, D, sqrt(tok_ref_sq[t] / (double)D), GMC_ULPS);
    }
    call_sums(&v, T, D, tok_ref_sq, tok_err_sq, tok_beyond, NULL);
    printf("  %s: rel L2 %.3g, elements beyond 2 bf16 ulp %lld / %lld\n", what, v.rel_l2, (long long)v.beyond,
           (long long)v.n);
    if (!v.pass && L != NULL && v.nan_count == 0) {
        for (int64_t t = 0; t < T; t++) {
            token_error(gpu, ref, t, D, err);
            gmc_flip flips[GMC_MAX_FLIPS];
            const int k = gmc_explain_token(L, t, err, ref + t * D, GMC_MAX_FLIPS, flips);
            if (k == 0)
                continue;
            if (k < 0) {
                printf("    token %lld: its error is not %d W2 columns of its experts or fewer\n", (long long)t,
                       GMC_MAX_FLIPS);
                continue;
            }
            double ref_sq, err_sq;
            token_sums(err, ref + t * D, D, &ref_sq, &err_sq);
            printf("    token %lld: explained by %d requantization flip%s:", (long long)t, k, k > 1 ? "s" : "");
            for (int f = 0; f < k; f++)
                printf(" %s %lld channel %lld (alpha %.4g)%s", flips[f].expert < 0 ? "shared expert" : "expert",
                       (long long)(flips[f].expert < 0 ? 0 : flips[f].expert), (long long)flips[f].channel,
                       flips[f].alpha, f + 1 < k ? "," : "");
            printf("; rel L2 %.3g -> %.3g, beyond 2 ulp %lld, beyond %d ulp after %lld\n",
                   rel_of(tok_err_sq[t], ref_sq), rel_of(err_sq, ref_sq), (long long)tok_beyond[t], GMC_FLIP_ULPS,
                   (long long)gmc_beyond_ulps(err, ref + t * D, D, sqrt(ref_sq / (double)D), GMC_FLIP_ULPS));
            explained[t] = 1;
            v.explained++;
        }
        if (v.explained > 0) {
            call_sums(&v, T, D, tok_ref_sq, tok_err_sq, tok_beyond, explained);
            printf("  %s: the %lld token%s not explained: rel L2 %.3g, elements beyond 2 bf16 ulp %lld / %lld\n",
                   what, (long long)(T - v.explained), T - v.explained == 1 ? "" : "s", v.rel_l2, (long long)v.beyond,
                   (long long)v.n);
        }
    }
    if (!v.pass)
        print_error_by_token(gpu, ref, T, D, err);
done:
    free(err);
    free(tok_ref_sq);
    free(tok_err_sq);
    free(tok_beyond);
    free(explained);
    return v;
}

void gmc_assert_close(const char *what, const gmc_layer *L, const uint16_t *gpu, const uint16_t *ref, int64_t T,
                      int64_t D, uint64_t seed)
{
    const gmc_verdict v = gmc_compare(what, L, gpu, ref, T, D);
    ck_assert_msg(v.nan_count == 0, "%s: %lld NaN outputs (seed %llu)", what, (long long)v.nan_count,
                  (unsigned long long)seed);
    ck_assert_msg(v.rel_l2 <= GMC_NORM_TOL, "%s: relative L2 error %g > %g (seed %llu)", what, v.rel_l2, GMC_NORM_TOL,
                  (unsigned long long)seed);
    ck_assert_msg((double)v.beyond <= GMC_ELEM_FRAC * (double)v.n,
                  "%s: %lld of %lld elements beyond 2 bf16 ulp (seed %llu)", what, (long long)v.beyond,
                  (long long)v.n, (unsigned long long)seed);
    ck_assert_msg(v.pass, "%s: the comparison failed (seed %llu)", what, (unsigned long long)seed);
}
