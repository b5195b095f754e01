/**
 * @file mmoe_sampler.h
 * @brief Choosing the next token from logits: greedy, temperature, top-p (nucleus), seeded.
 *
 * The generation loop's last step.  With temperature T = 0 the sampler is greedy:
 * the id of the largest logit, the lowest such id on ties (deterministic).  With
 * T > 0 it follows DeepSeek-V4's generate.py (@ref spec_arch_generate):
 *
 *     p = softmax_fp32(logits / max(T, 1e-5)),   E_i ~ Exp(1) i.i.d.,   token = argmax_i p_i / E_i
 *
 * (the exponential race: P(token = i) = p_i exactly).  With top_p < 1 only the
 * nucleus takes part: the most probable tokens, in decreasing order (ties: lower id
 * first), up to and including the first one at which the cumulative probability
 * reaches top_p.  Randomness comes from ::mmoe_rng, so a seed replays a generation.
 */
#ifndef MMOE_SAMPLER_H
#define MMOE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A sampler: its parameters, its random state and its scratch buffers (owned). */
typedef struct mmoe_sampler {
    float temperature; /**< 0: greedy; > 0: sample from softmax(logits / T) */
    float top_p;       /**< nucleus mass in (0, 1]; 1 disables the cut */
    mmoe_rng rng;      /**< the random state (advanced by every sampled token) */
    float *probs;      /**< scratch: probabilities, one per vocabulary entry */
    int32_t *order;    /**< scratch: ids sorted by probability (top-p only) */
    size_t cap;        /**< allocated entries of the scratch buffers */
} mmoe_sampler;

/**
 * Set up a sampler.
 * @param s            the sampler to initialise (free with mmoe_sampler_free())
 * @param temperature  >= 0 (0 is greedy); finite
 * @param top_p        in (0, 1]
 * @param seed         seed of the random state
 * @param err          message on failure
 * @return MMOE_OK or MMOE_ERANGE naming the bad parameter
 */
mmoe_status mmoe_sampler_init(mmoe_sampler *s, float temperature, float top_p, uint64_t seed, mmoe_error *err);

/** Free the scratch buffers (the struct itself is the caller's). */
void mmoe_sampler_free(mmoe_sampler *s);

/**
 * The probabilities the sampler draws from, written to @p probs (n entries): softmax of
 * logits / max(T, 1e-5) in FP32, restricted to the top-p nucleus and renormalized.
 * For T = 0 a one-hot vector at the greedy id.  Exposed for tests and for `--verbose` output.
 */
mmoe_status mmoe_sampler_probs(mmoe_sampler *s, const float *logits, size_t n, float *probs, mmoe_error *err);

/**
 * Choose the next token.
 * @param s       the sampler (its random state advances)
 * @param logits  @p n logits (FP32); a NaN is an error
 * @param n       number of logits (vocabulary size)
 * @param out     the chosen id
 * @param err     message on failure
 * @return MMOE_OK, MMOE_EINVAL (n = 0 or a NaN logit, the message gives its index), MMOE_ENOMEM
 */
mmoe_status mmoe_sampler_sample(mmoe_sampler *s, const float *logits, size_t n, int32_t *out, mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_SAMPLER_H */
