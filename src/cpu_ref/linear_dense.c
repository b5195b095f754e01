/**
 * @file linear_dense.c
 * @brief Linear layers with BF16 or FP32 weights: a fixed-order, double-accumulated dot product.
 *
 * The reference runs these as plain matmuls (`F.linear`) with fp32 accumulation:
 * the compressors' wkv/wgate (held in fp32, values from bf16), the indexer's
 * weights_proj (bf16) and the wo_a einsum of the output projection (bf16, from
 * convert.py's exact FP8 dequantization).  The accumulation order of a GEMM is not
 * specified, so the oracle picks the most accurate deterministic one: every product
 * of two bf16 values is exact in double (16 significant bits; 32 for a bf16 input
 * times an fp32 weight), the products are summed in double in the order of
 * @ref spec_arch_sum_order (chunks of 16, then a pairwise tree: a GPU sums them in
 * parallel to the same bits), and the sum is rounded once to fp32.  The error against
 * the exact dot product is below K * 2^-53 relative to sum |x_k w_k| before the final
 * fp32 rounding, i.e. within any fp32-accumulated result's error bound, and an output
 * row depends only on its input row (prefill and decode agree bit for bit).
 *
 * Weight rows are converted to double once per call and reused for all T rows.
 * An F8_E4M3 weight (the published, unconverted wo_a) is dequantized row by row
 * with its E8M0 scales and rounded to bf16 -- exactly what convert.py stores.
 */
#include "attn_internal.h"

#include <stdlib.h>

#include "mmoe_formats.h"
#include "mmoe_sum_order.h"

float attn_tensor_f32_at(const mmoe_tensor *t, int64_t i)
{
    if (t->dtype == MMOE_DT_F32)
        return ((const float *)t->data)[i];
    return mmoe_bf16_to_f32(((const uint16_t *)t->data)[i]);
}

/** Load weight row @p row (K values) as doubles. */
static mmoe_status load_row(const mmoe_tensor *w, const mmoe_tensor *scale, int block, int64_t row,
                            int64_t K, float *tmp, double *out, mmoe_error *err)
{
    switch (w->dtype) {
    case MMOE_DT_BF16: {
        const uint16_t *r = (const uint16_t *)w->data + row * K;
        for (int64_t k = 0; k < K; k++)
            out[k] = (double)mmoe_bf16_to_f32(r[k]);
        return MMOE_OK;
    }
    case MMOE_DT_F32: {
        const float *r = (const float *)w->data + row * K;
        for (int64_t k = 0; k < K; k++)
            out[k] = (double)r[k];
        return MMOE_OK;
    }
    case MMOE_DT_F8_E4M3: {
        if (scale == NULL || scale->data == NULL)
            return mmoe_error_set(err, MMOE_ENOTFOUND, "dense linear: F8 weight without a scale");
        mmoe_status st = mmoe_dequant_fp8_weight_row((const uint8_t *)w->data, (size_t)w->shape[0],
                                                     (size_t)K, (size_t)row, scale->data,
                                                     scale->dtype, (size_t)block, tmp, err);
        if (st != MMOE_OK)
            return st;
        for (int64_t k = 0; k < K; k++)
            out[k] = (double)mmoe_bf16_round(tmp[k]);
        return MMOE_OK;
    }
    default:
        return mmoe_error_set(err, MMOE_EDTYPE, "dense linear: weight dtype %s, expected BF16, F32 or F8_E4M3",
                              mmoe_dtype_name(w->dtype));
    }
}

/**
 * The double dot product of the file comment: chunks of 16 exact products, four chunks at a
 * time (four independent chains for the CPU's pipelines; each chunk still ascending from +0;
 * k0 a multiple of 64, so the four form a node of the tree), the chunk sums folded by the
 * pairwise tree of mmoe_sum_order.h.
 */
static double dot_f64(const double *a, const double *b, int64_t K)
{
    mmoe_pairwise pw;
    mmoe_pairwise_init(&pw);
    int64_t k0 = 0;
    for (; k0 + 4 * MMOE_SUM_CHUNK <= K; k0 += 4 * MMOE_SUM_CHUNK) {
        const double *a0 = a + k0, *b0 = b + k0;
        double c0 = 0.0, c1 = 0.0, c2 = 0.0, c3 = 0.0;
        for (int i = 0; i < MMOE_SUM_CHUNK; i++) {
            c0 += a0[i] * b0[i];
            c1 += a0[MMOE_SUM_CHUNK + i] * b0[MMOE_SUM_CHUNK + i];
            c2 += a0[2 * MMOE_SUM_CHUNK + i] * b0[2 * MMOE_SUM_CHUNK + i];
            c3 += a0[3 * MMOE_SUM_CHUNK + i] * b0[3 * MMOE_SUM_CHUNK + i];
        }
        mmoe_pairwise_push_node(&pw, (c0 + c1) + (c2 + c3), 2); /* an aligned run of four chunks */
    }
    for (; k0 < K; k0 += MMOE_SUM_CHUNK) {
        const int64_t k1 = K - k0 < MMOE_SUM_CHUNK ? K : k0 + MMOE_SUM_CHUNK;
        double c = 0.0;
        for (int64_t k = k0; k < k1; k++)
            c += a[k] * b[k];
        mmoe_pairwise_push(&pw, c);
    }
    return mmoe_pairwise_result(&pw);
}

mmoe_status attn_dense_rows(const double *x, int64_t T, int64_t ldx, int64_t K, const mmoe_tensor *w,
                            const mmoe_tensor *scale, int block, int64_t row0, int64_t N, float *y,
                            int64_t ldy, mmoe_error *err)
{
    double *wrow = malloc(sizeof(double) * (size_t)K);
    float *tmp = malloc(sizeof(float) * (size_t)K);
    mmoe_status st = MMOE_OK;
    if (wrow == NULL || tmp == NULL) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "dense linear: out of memory (K=%lld)", (long long)K);
        goto done;
    }
    for (int64_t n = 0; n < N; n++) {
        st = load_row(w, scale, block, row0 + n, K, tmp, wrow, err);
        if (st != MMOE_OK)
            goto done;
        for (int64_t t = 0; t < T; t++)
            y[t * ldy + n] = (float)dot_f64(x + t * ldx, wrow, K);
    }
done:
    free(wrow);
    free(tmp);
    return st;
}

mmoe_status mmoe_linear_dense(const uint16_t *x, int64_t T, int64_t K, const mmoe_tensor *w,
                              int64_t N, float *y_f32, uint16_t *y_bf16, mmoe_error *err)
{
    if (w->dtype != MMOE_DT_BF16 && w->dtype != MMOE_DT_F32)
        return mmoe_error_set(err, MMOE_EDTYPE, "dense linear: weight dtype %s, expected BF16 or F32",
                              mmoe_dtype_name(w->dtype));
    if (w->ndim != 2 || w->shape[0] != N || w->shape[1] != K)
        return mmoe_error_set(err, MMOE_ESHAPE, "dense linear: weight must be [%lld, %lld]",
                              (long long)N, (long long)K);
    if (T <= 0)
        return MMOE_OK;
    double *xd = malloc(sizeof(double) * (size_t)(T * K));
    float *y = y_f32 != NULL ? y_f32 : malloc(sizeof(float) * (size_t)(T * N));
    mmoe_status st = MMOE_OK;
    if (xd == NULL || y == NULL) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "dense linear: out of memory (T=%lld, K=%lld)",
                            (long long)T, (long long)K);
        goto done;
    }
    for (int64_t i = 0; i < T * K; i++)
        xd[i] = (double)mmoe_bf16_to_f32(x[i]);
    st = attn_dense_rows(xd, T, K, K, w, NULL, 0, 0, N, y, N, err);
    if (st == MMOE_OK && y_bf16 != NULL)
        mmoe_bf16_from_f32_row(y, (size_t)(T * N), y_bf16);
done:
    free(xd);
    if (y != y_f32)
        free(y);
    return st;
}
