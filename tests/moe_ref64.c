/**
 * @file moe_ref64.c
 * @brief Float64 reference of the MoE layer with error bounds (tests only).
 *
 * ## The bound
 * With the dyadic test layers every L1 sum is exact in FP32, so everything up to the L2 input
 * is bit-identical between the oracle and this reference (same rounding steps, same libm).
 * What remains is L2 and the combine:
 *  - the oracle's L2 accumulator for slot s differs from the exact sum S_s by at most
 *    gamma * A_s, A_s = sum |terms|, gamma = n u / (1 - n u), u = 2^-24, n = K + K/128 + 2
 *    (K products, one addition per 128-wide chunk, one extra rounding for a non-power-of-two
 *    activation scale);
 *  - each side rounds to BF16 (the reference from double via float): the two BF16 values
 *    differ by at most delta_s = gamma A_s + u |S_s| + ulp_bf16(|S_s| + gamma A_s);
 *  - both combine sums round n_slots times in FP32: 2 * n_slots * u * sum |v| more;
 *  - the final BF16 store: one more ulp_bf16 at the sum's magnitude.
 */
#include "moe_ref64.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"

static const double U32 = 0x1.0p-24;

double ref64_ulp_bf16(double v)
{
    v = fabs(v);
    if (v < 0x1.0p-126)
        return 0x1.0p-133;
    int e;
    frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
    return ldexp(1.0, e - 1 - 7);
}

/** Smallest power of two >= r (r > 0). */
static double ceil_pow2(double r)
{
    int e;
    double m = frexp(r, &e);
    return m == 0.5 ? ldexp(1.0, e - 1) : ldexp(1.0, e);
}

typedef enum { QX_UE8M0_32, QX_UE8M0_128, QX_SM100_REQ, QX_F32_128 } ref_q;

/** Quantize a row of k floats, writing the real values q * sf (double). */
static void ref_quant(const float *v, int64_t k, ref_q rule, double *out)
{
    const int64_t g = (rule == QX_UE8M0_32 || rule == QX_SM100_REQ) ? 32 : 128;
    for (int64_t g0 = 0; g0 < k; g0 += g) {
        float amax = 0.0f;
        for (int64_t i = 0; i < g; i++)
            amax = fmaxf(amax, fabsf(v[g0 + i]));
        if (rule == QX_F32_128) {
            /* SM90: sf = fl(max(amax, 1e-4) / 448); q = e4m3(x * fl(1/sf)) */
            const float sf = fmaxf(amax, 1e-4f) / 448.0f;
            const float inv = 1.0f / sf;
            for (int64_t i = 0; i < g; i++)
                out[g0 + i] = (double)mmoe_fp8_e4m3_to_f32(mmoe_fp8_e4m3_from_f32(v[g0 + i] * inv)) * (double)sf;
            continue;
        }
        double sf;
        if (rule == QX_SM100_REQ) {
            /* kernel: s = fl(amax * fl(1/448)), scale = ceil_pow2(s), no clamps; amax 0 -> 2^-127 */
            const float s = amax * (1.0f / 448.0f);
            sf = s == 0.0f ? 0x1.0p-127 : ceil_pow2((double)s);
        } else {
            sf = ceil_pow2((double)fmaxf(amax, 1e-4f) / 448.0);
        }
        for (int64_t i = 0; i < g; i++) {
            const float scaled = (float)((double)v[g0 + i] / sf); /* exact: power of two */
            out[g0 + i] = (double)mmoe_fp8_e4m3_to_f32(mmoe_fp8_e4m3_from_f32(scaled)) * sf;
        }
    }
}

/** Weight value W[r, c] of a routed FP4 matrix or a shared FP8 one. */
static double wval(const mmoe_tensor *w, const mmoe_tensor *sf, int64_t r, int64_t c, int64_t block)
{
    if (w->dtype == MMOE_DT_F8_E4M3) {
        const int64_t cols = w->shape[1];
        double v = mmoe_fp8_e4m3_to_f32(((const uint8_t *)w->data)[r * cols + c]);
        const int64_t i = (r / block) * sf->shape[1] + c / block;
        double s = sf->dtype == MMOE_DT_F32 ? ((const float *)sf->data)[i]
                                            : ldexp(1.0, ((const uint8_t *)sf->data)[i] - 127);
        return v * s;
    }
    const int64_t bytes = w->shape[1];
    const uint8_t b = ((const uint8_t *)w->data)[r * bytes + c / 2];
    const double v = mmoe_fp4_e2m1_to_f32((uint8_t)(c % 2 ? b >> 4 : b & 15));
    return v * ldexp(1.0, ((const uint8_t *)sf->data)[r * (2 * bytes / 32) + c / 32] - 127);
}

typedef struct ref_rules {
    ref_q xq, hq;
    int kernel_epilogue; /* 1: bf16 clamp bound, sig = 1/(1+e), g*sig; 0: fp32 bound, g/(1+e), bf16(h) */
} ref_rules;

/** One expert on one token: writes its BF16 output and the per-element delta (see file comment). */
static void ref_expert(const mmoe_moe_desc *d, const mmoe_moe_expert_weights *x_w, int64_t width, int64_t block,
                       const double *xq, const ref_rules *rr, float wt, float *ybf, double *delta, float *hbuf,
                       double *hq)
{
    const int64_t D = d->hidden;
    for (int64_t j = 0; j < width; j++) {
        double g = 0, u = 0;
        for (int64_t k = 0; k < D; k++) {
            g += xq[k] * wval(&x_w->w1, &x_w->w1_scale, j, k, block);
            u += xq[k] * wval(&x_w->w3, &x_w->w3_scale, j, k, block);
        }
        float gf = mmoe_bf16_round((float)g), uf = mmoe_bf16_round((float)u);
        const float lim = d->swiglu_limit;
        if (lim > 0 && !isinf(lim)) {
            const float c = rr->kernel_epilogue ? mmoe_bf16_round(lim) : lim;
            gf = gf > c ? c : gf;
            uf = uf > c ? c : (uf < -c ? -c : uf);
        }
        float act;
        if (rr->kernel_epilogue)
            act = gf * (1.0f / (1.0f + expf(-gf)));
        else
            act = gf / (1.0f + expf(-gf));
        float h = (act * uf) * wt;
        if (!rr->kernel_epilogue)
            h = mmoe_bf16_round(h);
        hbuf[j] = h;
    }
    ref_quant(hbuf, width, rr->hq, hq);
    const double n = (double)width + (double)width / 128.0 + 2.0;
    const double gamma = n * U32 / (1.0 - n * U32);
    for (int64_t r = 0; r < D; r++) {
        double s = 0, a = 0;
        for (int64_t j = 0; j < width; j++) {
            double term = hq[j] * wval(&x_w->w2, &x_w->w2_scale, r, j, block);
            s += term;
            a += fabs(term);
        }
        ybf[r] = mmoe_bf16_round((float)s);
        delta[r] = gamma * a + U32 * fabs(s) + ref64_ulp_bf16(fabs(s) + gamma * a);
    }
}

int ref64_layer(const mmoe_moe_desc *d, const mmoe_moe_weights *w, int64_t t, const uint16_t *x, const int64_t *idx,
                const float *wts, mmoe_moe_path shared_path, uint16_t *y, double *bound)
{
    const int64_t D = d->hidden, topk = d->topk;
    const int64_t wmax = d->inter > d->n_shared * d->shared_inter ? d->inter : d->n_shared * d->shared_inter;
    float *xf = malloc((size_t)D * sizeof(float)), *hbuf = malloc((size_t)wmax * sizeof(float));
    double *xq = malloc((size_t)D * sizeof(double)), *xs = malloc((size_t)D * sizeof(double));
    double *hq = malloc((size_t)wmax * sizeof(double));
    float *ys = malloc((size_t)(topk + 1) * (size_t)D * sizeof(float));
    double *ds = malloc((size_t)(topk + 1) * (size_t)D * sizeof(double));
    int rc = -1;
    if (!xf || !hbuf || !xq || !xs || !hq || !ys || !ds)
        goto done;
    ref_rules routed, serial = {QX_UE8M0_128, QX_UE8M0_128, 0};
    switch (d->recipe) {
    case MMOE_RECIPE_SM100: routed = (ref_rules){QX_UE8M0_32, QX_SM100_REQ, 1}; break;
    case MMOE_RECIPE_SM90: routed = (ref_rules){QX_F32_128, QX_F32_128, 1}; break;
    default: routed = serial; break;
    }
    for (int64_t i = 0; i < t; i++) {
        for (int64_t k = 0; k < D; k++)
            xf[k] = mmoe_bf16_to_f32(x[i * D + k]);
        ref_quant(xf, D, routed.xq, xq);
        /* slot order: recipe's combine order; visit[] lists the slots to add */
        int64_t visit[MMOE_MOE_MAX_TOPK + 1];
        int nv = 0;
        for (int64_t k = 0; k < topk; k++)
            if (idx[i * topk + k] >= 0)
                visit[nv++] = k;
        if (d->recipe == MMOE_RECIPE_DSV4_REF) /* ascending expert id, stable */
            for (int a = 1; a < nv; a++)
                for (int b = a; b > 0 && idx[i * topk + visit[b - 1]] > idx[i * topk + visit[b]]; b--) {
                    int64_t tmp = visit[b];
                    visit[b] = visit[b - 1];
                    visit[b - 1] = tmp;
                }
        for (int v = 0; v < nv; v++) {
            const int64_t k = visit[v], e = idx[i * topk + k];
            ref_expert(d, &w->experts[e], d->inter, 32, xq, &routed, wts[i * topk + k], ys + v * D, ds + v * D, hbuf,
                       hq);
        }
        int has_shared = shared_path != MMOE_PATH_NONE;
        if (has_shared) {
            const int64_t width = d->n_shared * d->shared_inter;
            if (shared_path == MMOE_PATH_FUSED) {
                ref_expert(d, &w->shared, width, d->shared_block, xq, &routed, 1.0f, ys + nv * D, ds + nv * D, hbuf, hq);
            } else {
                ref_quant(xf, D, serial.xq, xs);
                ref_expert(d, &w->shared, width, d->shared_block, xs, &serial, 1.0f, ys + nv * D, ds + nv * D, hbuf, hq);
            }
        }
        const int n = nv + has_shared;
        for (int64_t r = 0; r < D; r++) {
            float acc = 0.0f;
            double sum_abs = 0, dsum = 0;
            for (int v = 0; v < n; v++) {
                acc += ys[v * D + r];
                sum_abs += fabs(ys[v * D + r]);
                dsum += ds[v * D + r];
            }
            y[i * D + r] = mmoe_bf16_from_f32(acc);
            const double rnd = 2.0 * n * U32 * (sum_abs + dsum);
            bound[i * D + r] = dsum + rnd + ref64_ulp_bf16(fabs(acc) + dsum + rnd);
        }
    }
    rc = 0;
done:
    free(xf);
    free(hbuf);
    free(xq);
    free(xs);
    free(hq);
    free(ys);
    free(ds);
    return rc;
}
