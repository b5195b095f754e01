/**
 * @file mmoe_rng.h
 * @brief A small, explicit random number generator for tests, fixtures and synthetic layers.
 *
 * xoshiro256** seeded through splitmix64: fast, reproducible on every platform
 * (no libc rand()), and carried by value so there is no global state.  A seed
 * is a uint64; every test prints the seed it used so that a failure can be
 * replayed (`MMOE_SEED=... make check`).
 */
#ifndef MMOE_RNG_H
#define MMOE_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Generator state; initialise with mmoe_rng_seed(). */
typedef struct mmoe_rng {
    uint64_t s[4]; /**< xoshiro256** state words */
} mmoe_rng;

/** Seed @p rng from a 64-bit seed (any value, 0 included). */
void mmoe_rng_seed(mmoe_rng *rng, uint64_t seed);

/** Next 64 random bits. */
uint64_t mmoe_rng_u64(mmoe_rng *rng);

/** Next 32 random bits. */
uint32_t mmoe_rng_u32(mmoe_rng *rng);

/** Uniform integer in [0, n) (n > 0), without modulo bias. */
uint64_t mmoe_rng_below(mmoe_rng *rng, uint64_t n);

/** Uniform double in [0, 1) with 53 random bits. */
double mmoe_rng_uniform(mmoe_rng *rng);

/** Standard normal deviate (Box-Muller, double precision). */
double mmoe_rng_normal(mmoe_rng *rng);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_RNG_H */
