/**
 * @file mmoe_tensor_stats.c
 * @brief One pass over a tensor: decode each element to double and accumulate.
 *
 * Elements are read with memcpy, so views into a file need not be aligned.
 * BF16, FP8 and E8M0 go through mmoe_formats.h; F16 (which no other part
 * of megamoe needs) is decoded here field by field (sign, 5-bit exponent with
 * bias 15, 10-bit mantissa; exponent 0 is subnormal: m * 2^-24; exponent 31
 * is Inf/NaN).
 */
#include "mmoe_tensor_stats.h"

#include <math.h>
#include <string.h>

#include "mmoe_formats.h"

int mmoe_tensor_stats_supported(mmoe_dtype dt)
{
    switch (dt) {
    case MMOE_DT_BF16:
    case MMOE_DT_F16:
    case MMOE_DT_F32:
    case MMOE_DT_F64:
    case MMOE_DT_I8:
    case MMOE_DT_U8:
    case MMOE_DT_I16:
    case MMOE_DT_I32:
    case MMOE_DT_I64:
    case MMOE_DT_F8_E4M3:
    case MMOE_DT_F8_E5M2:
    case MMOE_DT_F8_E8M0:
    case MMOE_DT_BOOL:
    case MMOE_DT_U16:
    case MMOE_DT_U32:
    case MMOE_DT_U64:
        return 1;
    default:
        return 0;
    }
}

/** IEEE binary16 bits -> double (exact). */
static double f16_to_double(uint16_t h)
{
    int sign = h >> 15;
    int exponent = (h >> 10) & 0x1f;
    int mantissa = h & 0x3ff;
    double mag;
    if (exponent == 0)
        mag = ldexp((double)mantissa, -24); /* zero or subnormal */
    else if (exponent == 31)
        mag = mantissa ? NAN : INFINITY;
    else
        mag = ldexp((double)(mantissa | 0x400), exponent - 25);
    return sign ? -mag : mag;
}

/** Element @p i of @p t as a double. */
static double element(const mmoe_tensor *t, int64_t i)
{
    const uint8_t *p = (const uint8_t *)t->data + (size_t)i * mmoe_dtype_size(t->dtype);
    switch (t->dtype) {
    case MMOE_DT_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return mmoe_bf16_to_f32(h);
    }
    case MMOE_DT_F16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return f16_to_double(h);
    }
    case MMOE_DT_F32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case MMOE_DT_F64: {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    case MMOE_DT_I8:
        return (int8_t)p[0];
    case MMOE_DT_U8:
        return p[0];
    case MMOE_DT_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case MMOE_DT_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case MMOE_DT_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        return (double)v; /* exact up to 2^53 in magnitude */
    }
    case MMOE_DT_F8_E4M3:
        return mmoe_fp8_e4m3_to_f32(p[0]);
    case MMOE_DT_F8_E5M2:
        return mmoe_fp8_e5m2_to_f32(p[0]);
    case MMOE_DT_F8_E8M0:
        return mmoe_ue8m0_to_f32(p[0]);
    case MMOE_DT_BOOL:
        return p[0] != 0;
    case MMOE_DT_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case MMOE_DT_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case MMOE_DT_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        return (double)v; /* exact up to 2^53 */
    }
    default:
        return NAN;
    }
}

mmoe_status mmoe_tensor_stats_compute(const mmoe_tensor *t, mmoe_tensor_stats *out,
                                      mmoe_error *err)
{
    if (!mmoe_tensor_stats_supported(t->dtype))
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "statistics of dtype %s are not supported",
                              mmoe_dtype_name(t->dtype));
    int64_t n = mmoe_tensor_numel(t);
    if ((uint64_t)n * mmoe_dtype_size(t->dtype) != t->nbytes)
        return mmoe_error_set(err, MMOE_EINVAL, "statistics: view of %zu bytes does not match "
                              "its shape", t->nbytes);
    mmoe_tensor_stats s = {.count = n, .min = INFINITY, .max = -INFINITY, .absmax = 0.0};
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double v = element(t, i);
        if (isnan(v)) {
            s.n_nan++;
            continue;
        }
        if (isinf(v)) {
            s.n_inf++;
            continue;
        }
        s.n_finite++;
        sum += v;
        s.min = v < s.min ? v : s.min;
        s.max = v > s.max ? v : s.max;
        s.absmax = fabs(v) > s.absmax ? fabs(v) : s.absmax;
    }
    if (s.n_finite == 0) {
        s.min = s.max = s.mean = s.absmax = NAN;
    } else {
        s.mean = sum / (double)s.n_finite;
    }
    *out = s;
    return MMOE_OK;
}
