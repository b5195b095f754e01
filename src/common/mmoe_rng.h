/**
 * @file mmoe_rng.h
 * @brief A small, explicit random number generator for tests, fixtures and synthetic layers.
 *
 * xoshiro256** seeded through splitmix64: fast, reproducible on every platform
 * (no libc rand()), and carried by value so there is no global state.  A seed
 * is a uint64; every test prints the seed it used so that a failure can be
 * replayed (`MMOE_SEED=... make check`).
 *
 * Synthetic checkpoints and layers need billions of normal deviates; a Box-Muller
 * draw per weight (a log, a sqrt and a cos) would dominate their cost.  A
 * ::mmoe_normal_table holds 65536 deviates once, and one 16-bit random index
 * picks one: the values are normal-shaped (a discrete approximation of the
 * distribution), and drawing costs a table load.
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

/** Entries of a ::mmoe_normal_table: one 16-bit random index picks one. */
#define MMOE_NORMAL_TABLE_SIZE 65536

/** A table of standard normal deviates (256 KiB: allocate it, don't put it on the stack). */
typedef struct mmoe_normal_table {
    float v[MMOE_NORMAL_TABLE_SIZE]; /**< the deviates, indexed by 16 random bits */
} mmoe_normal_table;

/**
 * Inverse of the standard normal CDF (Acklam's rational approximation, relative error below
 * 1.2e-9).  Odd about p = 0.5: the upper tail is computed as the negated lower tail.
 * @param p  a probability in (0, 1)
 * @return x with Phi(x) = p
 */
double mmoe_normal_quantile(double p);

/**
 * Fill @p t with the quantiles of the 65536 midpoints: v[i] = mmoe_normal_quantile((i + 0.5) /
 * 65536).  Deterministic, increasing, exactly odd (v[i] = -v[65535 - i]); the tails are cut at
 * about 4.3 sigma.  Used by the synthetic checkpoint writer (mmoe_synth_model.h).
 */
void mmoe_normal_table_fill_quantiles(mmoe_normal_table *t);

/**
 * Fill @p t with 65536 consecutive mmoe_rng_normal() draws of @p rng (rounded to float), in
 * order: a random sample, different for every seed.  Used by the synthetic MoE layers
 * (mmoe_moe_synth.h).
 */
void mmoe_normal_table_fill_random(mmoe_normal_table *t, mmoe_rng *rng);

/** One deviate: t->v[mmoe_rng_u32(rng) mod 65536] (one generator step). */
float mmoe_normal_table_draw(const mmoe_normal_table *t, mmoe_rng *rng);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_RNG_H */
