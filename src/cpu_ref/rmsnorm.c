/**
 * @file rmsnorm.c
 * @brief RMSNorm as the DeepSeek-V4 reference computes it: fp32 inside, bf16 out.
 *
 *     y = bf16( w_fp32 * (x_fp32 * rsqrt(mean(x_fp32^2) + eps)) )
 *
 * The weight is stored bf16 (or fp32) and upcast.  The mean of the squares is an
 * fp32 reduction in the reference with unspecified order; the oracle sums the
 * (exact) squares of the bf16 inputs in double, in the chunked pairwise order of
 * @ref spec_arch_sum_order (mmoe_sum_order.h), and rounds the mean once to fp32,
 * so a row's result does not depend on how many rows are normalized together and a
 * GPU can sum a row in parallel to the same bits.
 * Products are formed in the reference's order: first x * rsqrt, then w * that.
 */
#include "attn_internal.h"

#include <math.h>

#include "fmt_minifloat.h"
#include "mmoe_formats.h"
#include "mmoe_sum_order.h"

double mmoe_bf16_sum_of_squares(const uint16_t *x, int64_t n)
{
    mmoe_pairwise pw;
    mmoe_pairwise_init(&pw);
    for (int64_t i0 = 0; i0 < n; i0 += MMOE_SUM_CHUNK) {
        const int64_t i1 = n - i0 < MMOE_SUM_CHUNK ? n : i0 + MMOE_SUM_CHUNK;
        double c = 0.0;
        for (int64_t i = i0; i < i1; i++) {
            const double v = (double)fmt_bf16_to_f32(x[i]);
            c += v * v;
        }
        mmoe_pairwise_push(&pw, c);
    }
    return mmoe_pairwise_result(&pw);
}

void mmoe_rmsnorm_bf16(const uint16_t *x, int64_t T, int64_t n, const mmoe_tensor *weight,
                       float eps, uint16_t *y)
{
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *xr = x + t * n;
        uint16_t *yr = y + t * n;
        const double sumsq = mmoe_bf16_sum_of_squares(xr, n);
        const float mean = (float)(sumsq / (double)n);
        const float rs = 1.0f / sqrtf(mean + eps);
        for (int64_t i = 0; i < n; i++) {
            const float xn = fmt_bf16_to_f32(xr[i]) * rs;
            yr[i] = mmoe_bf16_from_f32(attn_tensor_f32_at(weight, i) * xn);
        }
    }
}
