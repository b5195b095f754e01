/**
 * @file mmoe_rng.c
 * @brief xoshiro256** with splitmix64 seeding (public-domain algorithms by Blackman and Vigna,
 *        written here from their published description), and the tabulated normal deviates.
 */
#include "mmoe_rng.h"

#include <math.h>

/** splitmix64: a 64-bit mixer used only to spread a seed over the four state words. */
static uint64_t splitmix64_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/** Rotate @p x left by @p k bits (0 < k < 64). */
static uint64_t rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void mmoe_rng_seed(mmoe_rng *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64_next(&x);
}

uint64_t mmoe_rng_u64(mmoe_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

uint32_t mmoe_rng_u32(mmoe_rng *rng)
{
    return (uint32_t)(mmoe_rng_u64(rng) >> 32);
}

uint64_t mmoe_rng_below(mmoe_rng *rng, uint64_t n)
{
    /* Rejection sampling: discard the top partial range so every residue is equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do {
        r = mmoe_rng_u64(rng);
    } while (r >= limit);
    return r % n;
}

double mmoe_rng_uniform(mmoe_rng *rng)
{
    return (double)(mmoe_rng_u64(rng) >> 11) * 0x1.0p-53;
}

double mmoe_rng_normal(mmoe_rng *rng)
{
    double u1 = 1.0 - mmoe_rng_uniform(rng); /* (0, 1]: log is finite */
    double u2 = mmoe_rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

double mmoe_normal_quantile(double p)
{
    static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                               1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                               6.680131188771972e+01, -1.328068155288572e+01};
    static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                               -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00};
    static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                               3.754408661907416e+00};
    if (p < 0.02425) { /* lower tail: a rational function of sqrt(-2 log p) */
        double q = sqrt(-2 * log(p));
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
               ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    }
    if (p > 1 - 0.02425)
        return -mmoe_normal_quantile(1 - p);
    double q = p - 0.5, r = q * q; /* central region: a rational function of (p - 1/2)^2, times p - 1/2 */
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
           (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

void mmoe_normal_table_fill_quantiles(mmoe_normal_table *t)
{
    for (int i = 0; i < MMOE_NORMAL_TABLE_SIZE; i++)
        t->v[i] = (float)mmoe_normal_quantile((i + 0.5) / MMOE_NORMAL_TABLE_SIZE);
}

void mmoe_normal_table_fill_random(mmoe_normal_table *t, mmoe_rng *rng)
{
    for (int i = 0; i < MMOE_NORMAL_TABLE_SIZE; i++)
        t->v[i] = (float)mmoe_rng_normal(rng);
}

float mmoe_normal_table_draw(const mmoe_normal_table *t, mmoe_rng *rng)
{
    return t->v[mmoe_rng_u32(rng) & (MMOE_NORMAL_TABLE_SIZE - 1)];
}
