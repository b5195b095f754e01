/**
 * @file mmoe_sampler.c
 * @brief Repetition penalty, greedy, temperature, top-k, top-p and min-p sampling with the exponential race (see mmoe_sampler.h).
 *
 * Numerics: the logits are divided by max(T, 1e-5) and the softmax is taken in FP32
 * after subtracting the maximum (so exp never overflows and the largest term is 1);
 * the sum is accumulated in double, then each probability is rounded once to FP32.
 * For the draw, E_i = -log(1 - U) with U uniform in [0, 1) (53 bits), so E_i > 0;
 * p_i / E_i is compared in double.  Zero-probability entries can never win.
 * Each cut zeroes entries and renormalizes once: the kept sum in double, each kept
 * probability divided and rounded once to FP32.  The penalty writes a copy of the logits
 * (the caller's are never modified); with penalty 1 the logits are used as given.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_sampler.h"

void mmoe_sampler_params_default(mmoe_sampler_params *p)
{
    p->temperature = 0.0f;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = MMOE_SAMPLER_REPEAT_LAST_N;
    p->seed = 1;
}

/** Refuse a parameter outside its range, naming it. */
static mmoe_status check_params(const mmoe_sampler_params *p, mmoe_error *err)
{
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return mmoe_error_set(err, MMOE_ERANGE, "sampler: temperature: expected a finite value >= 0, found %g",
                              (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return mmoe_error_set(err, MMOE_ERANGE, "sampler: top_p: expected a value in (0, 1], found %g",
                              (double)p->top_p);
    if (p->top_k < 0)
        return mmoe_error_set(err, MMOE_ERANGE, "sampler: top_k: expected a value >= 0, found %d", p->top_k);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return mmoe_error_set(err, MMOE_ERANGE, "sampler: min_p: expected a value in [0, 1], found %g",
                              (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty))
        return mmoe_error_set(err, MMOE_ERANGE, "sampler: repeat_penalty: expected a finite value > 0, found %g",
                              (double)p->repeat_penalty);
    if (p->repeat_last_n < 0 || p->repeat_last_n > MMOE_SAMPLER_REPEAT_LAST_N_MAX)
        return mmoe_error_set(err, MMOE_ERANGE, "sampler: repeat_last_n: expected a value in [0, %d], found %d",
                              MMOE_SAMPLER_REPEAT_LAST_N_MAX, p->repeat_last_n);
    return MMOE_OK;
}

mmoe_status mmoe_sampler_init_params(mmoe_sampler *s, const mmoe_sampler_params *p, mmoe_error *err)
{
    memset(s, 0, sizeof *s);
    mmoe_status st = check_params(p, err);
    if (st != MMOE_OK)
        return st;
    s->temperature = p->temperature;
    s->top_p = p->top_p;
    s->top_k = p->top_k;
    s->min_p = p->min_p;
    s->repeat_penalty = p->repeat_penalty;
    mmoe_rng_seed(&s->rng, p->seed);
    if (p->repeat_penalty != 1.0f && p->repeat_last_n > 0) {
        s->history = malloc((size_t)p->repeat_last_n * sizeof *s->history);
        if (s->history == NULL)
            return mmoe_error_set(err, MMOE_ENOMEM, "sampler: out of memory (history of %d tokens)",
                                  p->repeat_last_n);
        s->history_cap = p->repeat_last_n;
    }
    return MMOE_OK;
}

mmoe_status mmoe_sampler_init(mmoe_sampler *s, float temperature, float top_p, uint64_t seed, mmoe_error *err)
{
    mmoe_sampler_params p;
    mmoe_sampler_params_default(&p);
    p.temperature = temperature;
    p.top_p = top_p;
    p.seed = seed;
    return mmoe_sampler_init_params(s, &p, err);
}

void mmoe_sampler_free(mmoe_sampler *s)
{
    free(s->probs);
    free(s->order);
    free(s->penalized);
    free(s->history);
    s->probs = NULL;
    s->order = NULL;
    s->penalized = NULL;
    s->history = NULL;
    s->history_cap = s->history_len = s->history_next = 0;
    s->cap = 0;
}

void mmoe_sampler_accept(mmoe_sampler *s, int32_t id)
{
    if (s->history_cap == 0)
        return;
    s->history[s->history_next] = id;
    s->history_next = (s->history_next + 1) % s->history_cap;
    if (s->history_len < s->history_cap)
        s->history_len++;
}

void mmoe_sampler_reset_history(mmoe_sampler *s)
{
    s->history_len = s->history_next = 0;
}

/** Refuse an empty vector and NaN logits (naming the first NaN). */
static mmoe_status check_logits(const float *logits, size_t n, mmoe_error *err)
{
    if (n == 0)
        return mmoe_error_set(err, MMOE_EINVAL, "sampler: empty logits vector");
    for (size_t i = 0; i < n; i++)
        if (isnan(logits[i]))
            return mmoe_error_set(err, MMOE_EINVAL, "sampler: logit %zu is NaN", i);
    return MMOE_OK;
}

size_t mmoe_argmax_f32(const float *v, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/** Grow the scratch buffers to @p n entries. */
static mmoe_status reserve(mmoe_sampler *s, size_t n, mmoe_error *err)
{
    if (n <= s->cap)
        return MMOE_OK;
    float *p = realloc(s->probs, n * sizeof *p);
    if (p != NULL)
        s->probs = p;
    int32_t *o = realloc(s->order, n * sizeof *o);
    if (o != NULL)
        s->order = o;
    float *q = realloc(s->penalized, n * sizeof *q);
    if (q != NULL)
        s->penalized = q;
    if (p == NULL || o == NULL || q == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "sampler: out of memory (%zu entries)", n);
    s->cap = n;
    return MMOE_OK;
}

/** Order of the nucleus: higher probability first, lower id first on ties. */
static int before(const float *probs, int32_t i, int32_t j)
{
    return probs[i] != probs[j] ? probs[i] > probs[j] : i < j;
}

/** Stable bottom-up merge sort of ids by before(); @p tmp has room for @p n ids. */
static void sort_by_prob(const float *probs, int32_t *ids, int32_t *tmp, size_t n)
{
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi)
                tmp[k++] = before(probs, ids[b], ids[a]) ? ids[b++] : ids[a++];
            while (a < mid)
                tmp[k++] = ids[a++];
            while (b < hi)
                tmp[k++] = ids[b++];
        }
        memcpy(ids, tmp, n * sizeof *ids);
    }
}

/** Sort every id by probability into s->order (ties: lower id first). */
static mmoe_status order_by_prob(mmoe_sampler *s, const float *probs, size_t n, mmoe_error *err)
{
    int32_t *tmp = malloc(n * sizeof *tmp);
    if (tmp == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "sampler: out of memory (%zu entries)", n);
    for (size_t i = 0; i < n; i++)
        s->order[i] = (int32_t)i;
    sort_by_prob(probs, s->order, tmp, n);
    free(tmp);
    return MMOE_OK;
}

/** Divide every probability by their sum (double), rounding each once to FP32. */
static void renormalize(float *probs, size_t n)
{
    double kept = 0.0;
    for (size_t i = 0; i < n; i++)
        kept += probs[i];
    for (size_t i = 0; i < n; i++)
        probs[i] = (float)(probs[i] / kept);
}

/** Keep the first @p keep ids of s->order, zero the rest, renormalize. */
static void keep_first(mmoe_sampler *s, float *probs, size_t n, size_t keep)
{
    for (size_t k = keep; k < n; k++)
        probs[s->order[k]] = 0.0f;
    renormalize(probs, n);
}

/** How many of the ordered ids form the top-p nucleus (the first at which the mass reaches top_p, included). */
static size_t nucleus_size(const mmoe_sampler *s, const float *probs, size_t n)
{
    double cum = 0.0;
    for (size_t k = 0; k < n; k++) {
        cum += probs[s->order[k]];
        if (cum >= (double)s->top_p)
            return k + 1;
    }
    return n;
}

/** Zero the probabilities below min_p times the largest one, renormalize. */
static void apply_min_p(const mmoe_sampler *s, float *probs, size_t n)
{
    float threshold = s->min_p * probs[mmoe_argmax_f32(probs, n)];
    for (size_t i = 0; i < n; i++)
        if (probs[i] < threshold)
            probs[i] = 0.0f;
    renormalize(probs, n);
}

/** Apply the top-k, top-p and min-p cuts, in this order, to normalized @p probs. */
static mmoe_status apply_cuts(mmoe_sampler *s, float *probs, size_t n, mmoe_error *err)
{
    int top_k = s->top_k > 0 && (size_t)s->top_k < n;
    if (top_k || s->top_p < 1.0f) {
        mmoe_status st = order_by_prob(s, probs, n, err);
        if (st != MMOE_OK)
            return st;
        if (top_k)
            keep_first(s, probs, n, (size_t)s->top_k); /* the order stays valid: zeros go last */
        if (s->top_p < 1.0f)
            keep_first(s, probs, n, nucleus_size(s, probs, n));
    }
    if (s->min_p > 0.0f)
        apply_min_p(s, probs, n);
    return MMOE_OK;
}

/**
 * The logits after the repetition penalty: @p logits itself without penalty or history,
 * else s->penalized (each distinct id of the history penalized once).
 */
static const float *penalize(mmoe_sampler *s, const float *logits, size_t n, mmoe_error *err, mmoe_status *st)
{
    *st = MMOE_OK;
    if (s->history_len == 0 || s->repeat_penalty == 1.0f)
        return logits;
    if ((*st = reserve(s, n, err)) != MMOE_OK)
        return NULL;
    memcpy(s->penalized, logits, n * sizeof *logits);
    for (int32_t k = 0; k < s->history_len; k++) {
        int32_t id = s->history[k];
        if (id < 0 || (size_t)id >= n)
            continue;
        /* computed from the caller's logit: an id repeated in the history is penalized once */
        float l = logits[id];
        s->penalized[id] = l > 0.0f ? l / s->repeat_penalty : l * s->repeat_penalty;
    }
    return s->penalized;
}

/** The softmax of @p logits / max(T, 1e-5) and the cuts (T > 0; @p logits already penalized). */
static mmoe_status tempered_probs(mmoe_sampler *s, const float *logits, size_t n, float *probs, mmoe_error *err)
{
    float inv_t = 1.0f / fmaxf(s->temperature, 1e-5f);
    float max_scaled = logits[mmoe_argmax_f32(logits, n)] * inv_t;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        probs[i] = expf(logits[i] * inv_t - max_scaled);
        sum += probs[i];
    }
    for (size_t i = 0; i < n; i++)
        probs[i] = (float)(probs[i] / sum);
    if (s->top_k > 0 || s->top_p < 1.0f) {
        mmoe_status st = reserve(s, n, err);
        if (st != MMOE_OK)
            return st;
    }
    return apply_cuts(s, probs, n, err);
}

mmoe_status mmoe_sampler_probs(mmoe_sampler *s, const float *logits, size_t n, float *probs, mmoe_error *err)
{
    mmoe_status st = check_logits(logits, n, err);
    if (st != MMOE_OK)
        return st;
    const float *l = penalize(s, logits, n, err, &st);
    if (l == NULL)
        return st;
    if (s->temperature == 0.0f) {
        memset(probs, 0, n * sizeof *probs);
        probs[mmoe_argmax_f32(l, n)] = 1.0f;
        return MMOE_OK;
    }
    return tempered_probs(s, l, n, probs, err);
}

mmoe_status mmoe_sampler_sample(mmoe_sampler *s, const float *logits, size_t n, int32_t *out, mmoe_error *err)
{
    mmoe_status st = check_logits(logits, n, err);
    if (st != MMOE_OK)
        return st;
    const float *l = penalize(s, logits, n, err, &st);
    if (l == NULL)
        return st;
    if (s->temperature == 0.0f) {
        *out = (int32_t)mmoe_argmax_f32(l, n);
        return MMOE_OK;
    }
    if ((st = reserve(s, n, err)) != MMOE_OK)
        return st;
    if ((st = tempered_probs(s, l, n, s->probs, err)) != MMOE_OK)
        return st;
    size_t best = 0;
    double best_score = -1.0;
    for (size_t i = 0; i < n; i++) {
        double e = -log1p(-mmoe_rng_uniform(&s->rng)); /* Exp(1), > 0 */
        double score = s->probs[i] / e;
        if (score > best_score) {
            best_score = score;
            best = i;
        }
    }
    *out = (int32_t)best;
    return MMOE_OK;
}

mmoe_status mmoe_logprobs_top(const float *logits, size_t n, int32_t chosen, size_t top_n, double *chosen_lp,
                              int32_t *top_ids, double *top_lp, mmoe_error *err)
{
    mmoe_status st = check_logits(logits, n, err);
    if (st != MMOE_OK)
        return st;
    if (chosen < 0 || (size_t)chosen >= n || top_n > n)
        return mmoe_error_set(err, MMOE_EINVAL, "logprobs: token %d or top %zu out of range for %zu logits", chosen,
                              top_n, n);
    double mx = logits[mmoe_argmax_f32(logits, n)], sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += exp((double)logits[i] - mx);
    double log_z = mx + log(sum);
    *chosen_lp = (double)logits[chosen] - log_z;
    /* top_n selections by repeated scans: top_n is small (OpenAI allows at most 20) */
    for (size_t k = 0; k < top_n; k++) {
        size_t best = n;
        for (size_t i = 0; i < n; i++) {
            int taken = 0;
            for (size_t j = 0; j < k && !taken; j++)
                taken = (size_t)top_ids[j] == i;
            if (!taken && (best == n || logits[i] > logits[best]))
                best = i;
        }
        top_ids[k] = (int32_t)best;
        top_lp[k] = (double)logits[best] - log_z;
    }
    return MMOE_OK;
}
