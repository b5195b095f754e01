/**
 * @file mmoe_sampler.c
 * @brief Greedy, temperature and top-p sampling with the exponential race (see mmoe_sampler.h).
 *
 * Numerics: the logits are divided by max(T, 1e-5) and the softmax is taken in FP32
 * after subtracting the maximum (so exp never overflows and the largest term is 1);
 * the sum is accumulated in double, then each probability is rounded once to FP32.
 * For the draw, E_i = -log(1 - U) with U uniform in [0, 1) (53 bits), so E_i > 0;
 * p_i / E_i is compared in double.  Zero-probability entries can never win.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_sampler.h"

mmoe_status mmoe_sampler_init(mmoe_sampler *s, float temperature, float top_p, uint64_t seed, mmoe_error *err)
{
    memset(s, 0, sizeof *s);
    if (!(temperature >= 0.0f) || isinf(temperature))
        return mmoe_error_set(err, MMOE_ERANGE, "sampler: temperature: expected a finite value >= 0, found %g",
                              (double)temperature);
    if (!(top_p > 0.0f && top_p <= 1.0f))
        return mmoe_error_set(err, MMOE_ERANGE, "sampler: top_p: expected a value in (0, 1], found %g", (double)top_p);
    s->temperature = temperature;
    s->top_p = top_p;
    mmoe_rng_seed(&s->rng, seed);
    return MMOE_OK;
}

void mmoe_sampler_free(mmoe_sampler *s)
{
    free(s->probs);
    free(s->order);
    s->probs = NULL;
    s->order = NULL;
    s->cap = 0;
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

/** Index of the largest value, the lowest index on ties. */
static size_t argmax(const float *v, size_t n)
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
    if (p == NULL || o == NULL)
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

/** Zero every probability outside the top-p nucleus and renormalize the rest. */
static mmoe_status apply_top_p(mmoe_sampler *s, float *probs, size_t n, mmoe_error *err)
{
    int32_t *tmp = malloc(n * sizeof *tmp);
    if (tmp == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "sampler: out of memory (%zu entries)", n);
    for (size_t i = 0; i < n; i++)
        s->order[i] = (int32_t)i;
    sort_by_prob(probs, s->order, tmp, n);
    free(tmp);
    double cum = 0.0;
    size_t keep = n;
    for (size_t k = 0; k < n; k++) {
        cum += probs[s->order[k]];
        if (cum >= (double)s->top_p) {
            keep = k + 1;
            break;
        }
    }
    for (size_t k = keep; k < n; k++)
        probs[s->order[k]] = 0.0f;
    double kept = 0.0;
    for (size_t k = 0; k < keep; k++)
        kept += probs[s->order[k]];
    for (size_t k = 0; k < keep; k++)
        probs[s->order[k]] = (float)(probs[s->order[k]] / kept);
    return MMOE_OK;
}

mmoe_status mmoe_sampler_probs(mmoe_sampler *s, const float *logits, size_t n, float *probs, mmoe_error *err)
{
    mmoe_status st = check_logits(logits, n, err);
    if (st != MMOE_OK)
        return st;
    if (s->temperature == 0.0f) {
        memset(probs, 0, n * sizeof *probs);
        probs[argmax(logits, n)] = 1.0f;
        return MMOE_OK;
    }
    float inv_t = 1.0f / fmaxf(s->temperature, 1e-5f);
    float max_scaled = logits[argmax(logits, n)] * inv_t;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        probs[i] = expf(logits[i] * inv_t - max_scaled);
        sum += probs[i];
    }
    for (size_t i = 0; i < n; i++)
        probs[i] = (float)(probs[i] / sum);
    if (s->top_p < 1.0f) {
        if ((st = reserve(s, n, err)) != MMOE_OK)
            return st;
        return apply_top_p(s, probs, n, err);
    }
    return MMOE_OK;
}

mmoe_status mmoe_sampler_sample(mmoe_sampler *s, const float *logits, size_t n, int32_t *out, mmoe_error *err)
{
    mmoe_status st = check_logits(logits, n, err);
    if (st != MMOE_OK)
        return st;
    if (s->temperature == 0.0f) {
        *out = (int32_t)argmax(logits, n);
        return MMOE_OK;
    }
    if ((st = reserve(s, n, err)) != MMOE_OK)
        return st;
    if ((st = mmoe_sampler_probs(s, logits, n, s->probs, err)) != MMOE_OK)
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
