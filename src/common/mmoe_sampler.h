/**
 * @file mmoe_sampler.h
 * @brief Choosing the next token from logits: repetition penalty, greedy, temperature, top-k, top-p, min-p, seeded.
 *
 * The generation loop's last step.  The logits first pass the **repetition penalty**
 * (when it is not 1): every distinct id among the last `repeat_last_n` tokens the
 * sampler was told about (mmoe_sampler_accept(): the prompt and the generated tokens)
 * has its logit l replaced by l / penalty when l > 0 and by l * penalty otherwise (the
 * CTRL rule, as llama.cpp), so a penalty > 1 makes repeats less likely whatever the sign.
 *
 * With temperature T = 0 the sampler is greedy:
 * the id of the largest logit, the lowest such id on ties (deterministic).  With
 * T > 0 it follows DeepSeek-V4's generate.py (@ref spec_arch_generate):
 *
 *     p = softmax_fp32(logits / max(T, 1e-5)),   E_i ~ Exp(1) i.i.d.,   token = argmax_i p_i / E_i
 *
 * (the exponential race: P(token = i) = p_i exactly).  With top_p < 1 only the
 * nucleus takes part: the most probable tokens, in decreasing order (ties: lower id
 * first), up to and including the first one at which the cumulative probability
 * reaches top_p.  Randomness comes from ::mmoe_rng, so a seed replays a generation.
 *
 * The three cuts apply in this order, each followed by a renormalization of what is left:
 *
 *  1. **top-k** (k > 0): only the k most probable tokens (ties: lower id first);
 *  2. **top-p** as above, on the top-k distribution;
 *  3. **min-p** (m > 0): only the tokens with \f$p_i \ge m \cdot \max_j p_j\f$.
 *
 * The most probable token survives every cut, so none of them changes the greedy choice.
 *
 * **Log-probabilities** (mmoe_logprobs_top()) are those of the model, not of the sampler:
 * the log-softmax of the raw logits at temperature 1, in double, before penalty and cuts
 * (as OpenAI's `logprobs` and vLLM's default).
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

/** Default number of recent tokens the repetition penalty looks at (llama.cpp's default). */
#define MMOE_SAMPLER_REPEAT_LAST_N 64

/** Most recent tokens the repetition penalty may look at. */
#define MMOE_SAMPLER_REPEAT_LAST_N_MAX (1 << 20)

/**
 * Index of the largest of @p n >= 1 values, the lowest index on ties (the greedy choice; a NaN
 * is never larger, so it wins only at index 0 when nothing beats it).
 */
size_t mmoe_argmax_f32(const float *v, size_t n);

/** Every parameter of a sampler (mmoe_sampler_params_default() gives greedy, no cut, no penalty). */
typedef struct mmoe_sampler_params {
    float temperature;     /**< >= 0, finite; 0 is greedy */
    float top_p;           /**< nucleus mass in (0, 1]; 1 disables the cut */
    int32_t top_k;         /**< >= 0; 0 disables the cut */
    float min_p;           /**< in [0, 1]; 0 disables the cut */
    float repeat_penalty;  /**< > 0, finite; 1 disables the penalty */
    int32_t repeat_last_n; /**< in [0, ::MMOE_SAMPLER_REPEAT_LAST_N_MAX]: recent tokens penalized */
    uint64_t seed;         /**< seed of the random state */
} mmoe_sampler_params;

/** A sampler: its parameters, its random state, its token history and its scratch buffers (owned). */
typedef struct mmoe_sampler {
    float temperature;     /**< 0: greedy; > 0: sample from softmax(logits / T) */
    float top_p;           /**< nucleus mass in (0, 1]; 1 disables the cut */
    int32_t top_k;         /**< 0: no top-k cut */
    float min_p;           /**< 0: no min-p cut */
    float repeat_penalty;  /**< 1: no penalty */
    mmoe_rng rng;          /**< the random state (advanced by every sampled token) */
    float *probs;          /**< scratch: probabilities, one per vocabulary entry */
    int32_t *order;        /**< scratch: ids sorted by probability (top-k and top-p only) */
    float *penalized;      /**< scratch: the logits after the repetition penalty */
    size_t cap;            /**< allocated entries of the scratch buffers */
    int32_t *history;      /**< ring of the last repeat_last_n accepted ids (NULL without penalty) */
    int32_t history_cap;   /**< repeat_last_n */
    int32_t history_len;   /**< ids held (<= history_cap) */
    int32_t history_next;  /**< ring slot of the next id */
} mmoe_sampler;

/** Greedy (temperature 0), top-p 1, no top-k, no min-p, penalty 1 over ::MMOE_SAMPLER_REPEAT_LAST_N, seed 1. */
void mmoe_sampler_params_default(mmoe_sampler_params *p);

/**
 * Set up a sampler from every parameter.
 * @return MMOE_OK, MMOE_ERANGE naming the bad parameter, MMOE_ENOMEM
 */
mmoe_status mmoe_sampler_init_params(mmoe_sampler *s, const mmoe_sampler_params *p, mmoe_error *err);

/** Record @p id in the history the repetition penalty reads (a no-op without penalty). */
void mmoe_sampler_accept(mmoe_sampler *s, int32_t id);

/** Forget the history (a new, unrelated sequence starts). */
void mmoe_sampler_reset_history(mmoe_sampler *s);

/**
 * Set up a sampler with temperature and top-p only (the others as mmoe_sampler_params_default()).
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
 * The probabilities the sampler draws from, written to @p probs (n entries): softmax of the
 * penalized logits / max(T, 1e-5) in FP32, after the top-k, top-p and min-p cuts, renormalized.
 * For T = 0 a one-hot vector at the greedy id (of the penalized logits).  Exposed for tests and for `--verbose` output.
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

/**
 * The model's log-probabilities (see the file comment): log-softmax of @p logits in double.
 * @param logits    @p n logits (a NaN is an error; -inf entries have log-probability -inf)
 * @param n         vocabulary size
 * @param chosen    the id whose log-probability goes to @p chosen_lp
 * @param top_n     how many of the most probable ids to list (0..n; ties: lower id first)
 * @param chosen_lp log-probability of @p chosen
 * @param top_ids   [top_n] ids, most probable first (may be NULL when top_n = 0)
 * @param top_lp    [top_n] their log-probabilities
 * @param err       message on failure
 * @return MMOE_OK or MMOE_EINVAL (n = 0, chosen or top_n out of range, a NaN logit)
 */
mmoe_status mmoe_logprobs_top(const float *logits, size_t n, int32_t chosen, size_t top_n, double *chosen_lp,
                              int32_t *top_ids, double *top_lp, mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_SAMPLER_H */
