/**
 * @file mmoe_mhc.c
 * @brief mHC stream mixing: pre-weights, Sinkhorn, write-back and the head mix (see mmoe_mhc.h).
 *
 * The code follows @ref spec_arch_mhc line by line.  One helper, `stream_mix_logits`,
 * computes the shared first two steps of hc_pre and hc_head: the RMS of all
 * hc*D values of a token and the n_out dot products with the rows of `fn`,
 * both accumulated in double (exact products of fp32 values, fixed order) and
 * rounded once to fp32, then multiplied in fp32.  The dot products are the dense linears' (in
 * the order of @ref spec_arch_sum_order; attn_dot_f32_rows(): under AVX2 the four chunks of a
 * node in a register's lanes, four rows of fn at a time).
 *
 * Every token is computed on its own (its streams, its weights, its outputs), so the _pool
 * variants share the tokens out over a worker pool (moe_pool_rows()) with the same bits.
 */
#include "mmoe_mhc.h"

#include <math.h>
#include <stdlib.h>

#include "attn_internal.h"
#include "fmt_minifloat.h"
#include "mmoe_formats.h"
#include "mmoe_linear.h"
#include "moe_internal.h"

void mmoe_hc_expand(const mmoe_hc_params *p, const uint16_t *h, int64_t T, uint16_t *X)
{
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < p->hc; j++)
            for (int64_t c = 0; c < p->dim; c++)
                X[(t * p->hc + j) * p->dim + c] = h[t * p->dim + c];
}

/** 1 / (1 + exp(-z)) in fp32. */
static float sigmoid_f32(float z) { return 1.0f / (1.0f + expf(-z)); }

/**
 * m[i] = fp32(fn[i] . x) * rs for one token, with x = the hc*D stream values in
 * fp32 and rs = fp32 rsqrt(fp32(mean(x^2)) + norm_eps).
 */
static void stream_mix_logits(const mmoe_hc_params *p, const uint16_t *Xt, const float *fn, int n_out,
                              float *m)
{
    enum { ROWS_A_PASS = 64 };
    const int64_t n = (int64_t)p->hc * p->dim;
    float mean = (float)(mmoe_bf16_sum_of_squares(Xt, n) / (double)n);
    float rs = 1.0f / sqrtf(mean + p->norm_eps);
    const moe_dot_isa isa = moe_dot_isa_best();
    double dots[ROWS_A_PASS];
    for (int r0 = 0; r0 < n_out; r0 += ROWS_A_PASS) {
        const int nr = n_out - r0 < ROWS_A_PASS ? n_out - r0 : ROWS_A_PASS;
        attn_dot_f32_rows(isa, Xt, n, fn + (int64_t)r0 * n, n, nr, dots);
        for (int r = 0; r < nr; r++)
            m[r0 + r] = (float)dots[r] * rs;
    }
}

void mmoe_hc_sinkhorn(float *C, int hc, int iters, float hc_eps)
{
    /* row softmax, then + eps */
    for (int j = 0; j < hc; j++) {
        float *row = C + j * hc;
        float mx = row[0];
        for (int k = 1; k < hc; k++)
            mx = row[k] > mx ? row[k] : mx;
        float sum = 0.0f;
        for (int k = 0; k < hc; k++) {
            row[k] = expf(row[k] - mx);
            sum += row[k];
        }
        for (int k = 0; k < hc; k++)
            row[k] = row[k] / sum + hc_eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0) { /* row normalization (not before the first column step) */
            for (int j = 0; j < hc; j++) {
                float s = 0.0f;
                for (int k = 0; k < hc; k++)
                    s += C[j * hc + k];
                for (int k = 0; k < hc; k++)
                    C[j * hc + k] /= (s + hc_eps);
            }
        }
        for (int k = 0; k < hc; k++) { /* column normalization */
            float s = 0.0f;
            for (int j = 0; j < hc; j++)
                s += C[j * hc + k];
            for (int j = 0; j < hc; j++)
                C[j * hc + k] /= (s + hc_eps);
        }
    }
}

/** y[c] = bf16(sum_j pre[j] * X[j][c]) in fp32, j ascending. */
static void mix_streams(const mmoe_hc_params *p, const uint16_t *Xt, const float *pre, uint16_t *yt)
{
    for (int64_t c = 0; c < p->dim; c++) {
        float acc = 0.0f;
        for (int j = 0; j < p->hc; j++)
            acc += pre[j] * fmt_bf16_to_f32(Xt[j * p->dim + c]);
        yt[c] = mmoe_bf16_from_f32(acc);
    }
}

/** mmoe_hc_pre() for token @p t. */
static void hc_pre_token(const mmoe_hc_params *p, const uint16_t *X, int64_t t, const float *fn, const float *base,
                         const float *scale, uint16_t *y, float *post, float *comb)
{
    const int hc = p->hc, n_mix = (2 + hc) * hc;
    float m[(2 + 64) * 64]; /* hc <= 64 (config limit) */
    float pre[64];
    const uint16_t *Xt = X + t * hc * p->dim;
    stream_mix_logits(p, Xt, fn, n_mix, m);
    for (int j = 0; j < hc; j++) {
        pre[j] = sigmoid_f32(m[j] * scale[0] + base[j]) + p->hc_eps;
        post[t * hc + j] = 2.0f * sigmoid_f32(m[hc + j] * scale[1] + base[hc + j]);
    }
    float *C = comb + t * hc * hc;
    for (int i = 0; i < hc * hc; i++)
        C[i] = m[2 * hc + i] * scale[2] + base[2 * hc + i];
    mmoe_hc_sinkhorn(C, hc, p->sinkhorn_iters, p->hc_eps);
    mix_streams(p, Xt, pre, y + t * p->dim);
}

void mmoe_hc_pre(const mmoe_hc_params *p, const uint16_t *X, int64_t T, const float *fn,
                 const float *base, const float *scale, uint16_t *y, float *post, float *comb)
{
    for (int64_t t = 0; t < T; t++)
        hc_pre_token(p, X, t, fn, base, scale, y, post, comb);
}

/** mmoe_hc_post() for token @p t. */
static void hc_post_token(const mmoe_hc_params *p, const uint16_t *out, const uint16_t *R, int64_t t,
                          const float *post, const float *comb, uint16_t *Xn)
{
    const int hc = p->hc;
    float res[64];
    const uint16_t *Rt = R + t * hc * p->dim;
    uint16_t *Xt = Xn + t * hc * p->dim;
    const float *C = comb + t * hc * hc;
    for (int64_t c = 0; c < p->dim; c++) {
        float o = fmt_bf16_to_f32(out[t * p->dim + c]);
        /* read all input streams of this channel before any is overwritten (Xn may alias R) */
        for (int k = 0; k < hc; k++) {
            float acc = 0.0f;
            for (int j = 0; j < hc; j++)
                acc += C[j * hc + k] * fmt_bf16_to_f32(Rt[j * p->dim + c]);
            res[k] = post[t * hc + k] * o + acc;
        }
        for (int k = 0; k < hc; k++)
            Xt[k * p->dim + c] = mmoe_bf16_from_f32(res[k]);
    }
}

void mmoe_hc_post(const mmoe_hc_params *p, const uint16_t *out, const uint16_t *R, int64_t T,
                  const float *post, const float *comb, uint16_t *Xn)
{
    for (int64_t t = 0; t < T; t++)
        hc_post_token(p, out, R, t, post, comb, Xn);
}

/** The arguments of mmoe_hc_pre(), shared by the threads that take tokens. */
typedef struct {
    const mmoe_hc_params *p; /**< the shape */
    const uint16_t *X;       /**< the streams */
    const float *fn;         /**< the mixing rows */
    const float *base;       /**< the biases */
    const float *scale;      /**< the three scales */
    uint16_t *y;             /**< the mixed input (written) */
    float *post;             /**< the write-back weights (written) */
    float *comb;             /**< the Sinkhorn matrices (written) */
} hc_pre_job;

/** The arguments of mmoe_hc_post(), shared by the threads that take tokens. */
typedef struct {
    const mmoe_hc_params *p; /**< the shape */
    const uint16_t *out;     /**< the sub-layer's output */
    const uint16_t *R;       /**< the streams before the sub-layer */
    const float *post;       /**< the write-back weights */
    const float *comb;       /**< the Sinkhorn matrices */
    uint16_t *Xn;            /**< the new streams (written; may alias R) */
} hc_post_job;

/** moe_rows_fn of mmoe_hc_pre_pool(): tokens [t0, t1). */
static void hc_pre_tokens(void *ctx, int thread, int64_t t0, int64_t t1)
{
    const hc_pre_job *j = ctx;
    (void)thread;
    for (int64_t t = t0; t < t1; t++)
        hc_pre_token(j->p, j->X, t, j->fn, j->base, j->scale, j->y, j->post, j->comb);
}

/** moe_rows_fn of mmoe_hc_post_pool(): tokens [t0, t1). */
static void hc_post_tokens(void *ctx, int thread, int64_t t0, int64_t t1)
{
    const hc_post_job *j = ctx;
    (void)thread;
    for (int64_t t = t0; t < t1; t++)
        hc_post_token(j->p, j->out, j->R, t, j->post, j->comb, j->Xn);
}

void mmoe_hc_pre_pool(mmoe_moe_pool *pool, const mmoe_hc_params *p, const uint16_t *X, int64_t T, const float *fn,
                      const float *base, const float *scale, uint16_t *y, float *post, float *comb)
{
    hc_pre_job j = {p, X, fn, base, scale, y, post, comb};
    const int64_t n_mix = (int64_t)(2 + p->hc) * p->hc;
    moe_pool_rows(pool, T, (int64_t)p->hc * p->dim * n_mix, 1, hc_pre_tokens, &j);
}

void mmoe_hc_post_pool(mmoe_moe_pool *pool, const mmoe_hc_params *p, const uint16_t *out, const uint16_t *R,
                       int64_t T, const float *post, const float *comb, uint16_t *Xn)
{
    hc_post_job j = {p, out, R, post, comb, Xn};
    moe_pool_rows(pool, T, (int64_t)p->hc * p->hc * p->dim, 1, hc_post_tokens, &j);
}

void mmoe_hc_head(const mmoe_hc_params *p, const uint16_t *X, int64_t T, const float *fn,
                  const float *base, const float *scale, uint16_t *y)
{
    const int hc = p->hc;
    float m[64], pre[64];
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *Xt = X + t * hc * p->dim;
        stream_mix_logits(p, Xt, fn, hc, m);
        for (int j = 0; j < hc; j++)
            pre[j] = sigmoid_f32(m[j] * scale[0] + base[j]) + p->hc_eps;
        mix_streams(p, Xt, pre, y + t * p->dim);
    }
}
