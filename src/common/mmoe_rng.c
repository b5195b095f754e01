/**
 * @file mmoe_rng.c
 * @brief xoshiro256** with splitmix64 seeding (public-domain algorithms by Blackman and Vigna,
 *        written here from their published description).
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
