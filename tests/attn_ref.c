/**
 * @file attn_ref.c
 * @brief Implementation of attn_ref.h.
 */
#include "attn_ref.h"

#include <math.h>

double attn_ref_e4m3_value(uint8_t code)
{
    const int e = (code >> 3) & 15, m = code & 7;
    const double mag = e == 0 ? m / 8.0 * ldexp(1.0, -6) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return code & 0x80 ? -mag : mag;
}

double attn_ref_round_to_grid(double x, const double *grid, int n)
{
    const double a = fabs(x);
    int best = 0;
    for (int i = 1; i < n; i++) {
        const double di = fabs(grid[i] - a), db = fabs(grid[best] - a);
        if (di < db || (di == db && (i % 2) == 0 && (best % 2) != 0))
            best = i;
    }
    return x < 0 ? -grid[best] : grid[best];
}

double attn_ref_e4m3_round(double x)
{
    double grid[127];
    for (int c = 0; c < 127; c++)
        grid[c] = attn_ref_e4m3_value((uint8_t)c);
    return attn_ref_round_to_grid(x, grid, 127);
}

double attn_ref_pow2_scale(double amax, double fmax)
{
    int e = -160;
    while (fmax * ldexp(1.0, e) < amax)
        e++;
    return ldexp(1.0, e);
}

double attn_ref_fp8_block(const double *x, int n, double *xq)
{
    double amax = (double)1e-4f; /* the reference clamps amax at fp32(1e-4) */
    for (int i = 0; i < n; i++)
        amax = fmax(amax, fabs(x[i]));
    const double s = attn_ref_pow2_scale(amax, 448.0);
    for (int i = 0; i < n; i++)
        xq[i] = attn_ref_e4m3_round(fmin(fmax(x[i] / s, -448.0), 448.0));
    return s;
}

double attn_ref_softmax_pool(const double *gate, const double *val, int n)
{
    double m = -INFINITY, den = 0.0, acc = 0.0;
    for (int i = 0; i < n; i++)
        m = fmax(m, gate[i]);
    if (m == -INFINITY)
        return 0.0;
    for (int i = 0; i < n; i++)
        den += exp(gate[i] - m);
    for (int i = 0; i < n; i++)
        acc += exp(gate[i] - m) / den * val[i];
    return acc;
}
