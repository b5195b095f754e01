/**
 * @file ep_plan.c
 * @brief Where experts live and where pairs go: the partition of the experts over the ranks,
 *        the dispatch bookkeeping of one call, and the weight bytes per GPU of a model.
 *
 * ## Partition
 *
 * Contiguous blocks: with E = q N + m, ranks 0 .. m-1 hold q + 1 experts and the others q,
 *
 * \f[ \mathrm{first}_r = r q + \min(r, m). \f]
 *
 * Contiguous blocks keep each rank's experts one slice of the checkpoint's expert index and
 * of the router's gate rows; any other placement would give the same output bits (the
 * combine does not depend on which rank computed a row), so balance is the only criterion
 * and the routing of a trained model is close to uniform over the experts.
 *
 * ## Dispatch bookkeeping
 *
 * From the routing idx [T, topk] every rank derives the same tables (a counting sort by rank):
 * the pairs of each rank in ascending order of (token, slot), and for every (token, slot) its
 * rank and its position in that rank's list.  The position is the row of the pair in the rank's
 * output batch, which is also the row in the batch that every other rank receives from it:
 * both ends of the exchange index the same table, so no index travels with the data.
 *
 * ## Weights per GPU
 *
 * A model's tensors are either a routed expert's (`<layer>.ffn.experts.<e>.<w>.<weight|scale>`,
 * held by the rank of e) or replicated; a GPU needs the replicated bytes plus its experts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"
#include "mmoe_ep.h"

mmoe_status mmoe_ep_partition_make(int64_t n_experts, int n_ranks, mmoe_ep_partition *p, mmoe_error *err)
{
    memset(p, 0, sizeof *p);
    if (n_ranks < 1 || n_ranks > MMOE_EP_MAX_RANKS)
        return mmoe_error_set(err, MMOE_EINVAL, "ep: %d ranks: expected 1..%d", n_ranks, MMOE_EP_MAX_RANKS);
    if (n_experts < n_ranks)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "ep: %d ranks for %lld routed experts: every rank must hold at least one expert", n_ranks,
                              (long long)n_experts);
    const int64_t q = n_experts / n_ranks, m = n_experts % n_ranks;
    p->n_ranks = n_ranks;
    p->n_experts = n_experts;
    for (int r = 0; r <= n_ranks; r++)
        p->first[r] = r * q + (r < m ? r : m);
    return MMOE_OK;
}

int mmoe_ep_partition_owner(const mmoe_ep_partition *p, int64_t e)
{
    /* the inverse of first_r = r q + min(r, m): the big blocks first, then the small ones */
    const int64_t q = p->n_experts / p->n_ranks, m = p->n_experts % p->n_ranks;
    const int64_t big = m * (q + 1);
    return (int)(e < big ? e / (q + 1) : m + (e - big) / q);
}

void mmoe_ep_dispatch_free(mmoe_ep_dispatch *d)
{
    free(d->pair);
    free(d->rank_of);
    free(d->pos);
    memset(d, 0, sizeof *d);
}

mmoe_status mmoe_ep_dispatch_build(const mmoe_ep_partition *p, const int64_t *idx, int64_t t, int topk,
                                   mmoe_ep_dispatch *d, mmoe_error *err)
{
    memset(d, 0, sizeof *d);
    const int n = p->n_ranks;
    const size_t slots = (size_t)t * (size_t)topk;
    d->n_ranks = n;
    d->n_tokens = t;
    d->topk = topk;
    d->pair = malloc((slots > 0 ? slots : 1) * sizeof *d->pair);
    d->rank_of = malloc((slots > 0 ? slots : 1) * sizeof *d->rank_of);
    d->pos = malloc((slots > 0 ? slots : 1) * sizeof *d->pos);
    uint8_t *seen = calloc((size_t)p->n_experts, 1);
    if (d->pair == NULL || d->rank_of == NULL || d->pos == NULL || seen == NULL) {
        free(seen);
        mmoe_ep_dispatch_free(d);
        return mmoe_error_set(err, MMOE_ENOMEM, "ep: out of memory for the dispatch of %lld tokens", (long long)t);
    }
    int64_t count[MMOE_EP_MAX_RANKS] = {0};
    for (size_t i = 0; i < slots; i++) {
        const int64_t e = idx[i];
        if (e < -1 || e >= p->n_experts) {
            free(seen);
            mmoe_ep_dispatch_free(d);
            return mmoe_error_set(err, MMOE_EINVAL, "ep: topk_idx[%lld][%lld] = %lld is not an expert id in [0, %lld) or -1",
                                  (long long)(i / (size_t)topk), (long long)(i % (size_t)topk), (long long)e,
                                  (long long)p->n_experts);
        }
        const int r = e < 0 ? -1 : mmoe_ep_partition_owner(p, e);
        d->rank_of[i] = r;
        d->pos[i] = r < 0 ? -1 : count[r]++;
        if (e >= 0 && !seen[e]) {
            seen[e] = 1;
            d->active[r]++;
        }
    }
    free(seen);
    d->start[0] = 0;
    for (int r = 0; r < n; r++)
        d->start[r + 1] = d->start[r] + count[r];
    for (size_t i = 0; i < slots; i++)
        if (d->rank_of[i] >= 0)
            d->pair[d->start[d->rank_of[i]] + d->pos[i]] = (int64_t)i;
    return MMOE_OK;
}

/**
 * The routed-expert index e in a tensor name that contains `ffn.experts.e`, or -1 for a tensor
 * that is not a routed expert's (the shared experts are `ffn.shared_experts`).
 */
static int64_t expert_of_name(const char *name)
{
    const char *key = ".ffn.experts.";
    const char *s = strstr(name, key);
    if (s == NULL)
        return -1;
    s += strlen(key);
    char *end;
    long long e = strtoll(s, &end, 10);
    return end != s && *end == '.' && e >= 0 ? (int64_t)e : -1;
}

mmoe_status mmoe_ep_memory_plan_make(const char *const *names, const uint64_t *bytes, size_t n, int64_t n_experts,
                                     int n_gpus, uint64_t capacity_bytes, mmoe_ep_memory_plan *plan,
                                     mmoe_error *err)
{
    memset(plan, 0, sizeof *plan);
    mmoe_ep_partition part;
    mmoe_status st = mmoe_ep_partition_make(n_experts, n_gpus, &part, err);
    if (st != MMOE_OK)
        return st;
    uint64_t *per_expert = calloc((size_t)n_experts, sizeof *per_expert);
    if (per_expert == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "ep: out of memory for the memory plan");
    for (size_t i = 0; i < n; i++) {
        const int64_t e = expert_of_name(names[i]);
        if (e >= n_experts) {
            free(per_expert);
            return mmoe_error_set(err, MMOE_EINVAL, "ep: tensor '%s' names expert %lld of %lld", names[i],
                                  (long long)e, (long long)n_experts);
        }
        if (e < 0)
            plan->replicated_bytes += bytes[i];
        else {
            per_expert[e] += bytes[i];
            plan->expert_bytes += bytes[i];
        }
    }
    plan->n_gpus = n_gpus;
    plan->capacity_bytes = capacity_bytes;
    /* the largest rank's share, for this N and (min_gpus) for every N up to E */
    for (int g = 1; g <= n_experts && g <= MMOE_EP_MAX_RANKS; g++) {
        mmoe_ep_partition pg;
        mmoe_ep_partition_make(n_experts, g, &pg, NULL);
        uint64_t largest = 0;
        for (int r = 0; r < g; r++) {
            uint64_t s = 0;
            for (int64_t e = pg.first[r]; e < pg.first[r + 1]; e++)
                s += per_expert[e];
            largest = s > largest ? s : largest;
        }
        const uint64_t per_gpu = plan->replicated_bytes + largest;
        if (g == n_gpus)
            plan->per_gpu_bytes = per_gpu;
        if (capacity_bytes > 0 && plan->min_gpus == 0 && per_gpu <= capacity_bytes)
            plan->min_gpus = g;
    }
    free(per_expert);
    return MMOE_OK;
}

mmoe_status mmoe_ep_memory_check(const mmoe_ep_memory_plan *plan, mmoe_error *err)
{
    if (plan->per_gpu_bytes <= plan->capacity_bytes)
        return MMOE_OK;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    char need[96];
    if (plan->min_gpus > 0)
        snprintf(need, sizeof need, "at least %d GPUs", plan->min_gpus);
    else
        snprintf(need, sizeof need, "GPUs larger than that (no number of GPUs up to E holds it)");
    return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                          "the model needs %llu bytes (%.2f GiB) of weights per GPU on %d GPUs (%llu bytes replicated "
                          "+ %llu bytes of routed experts), more than the %llu bytes (%.2f GiB) usable on one GPU: "
                          "it needs %s",
                          (unsigned long long)plan->per_gpu_bytes, (double)plan->per_gpu_bytes / gib, plan->n_gpus,
                          (unsigned long long)plan->replicated_bytes,
                          (unsigned long long)(plan->per_gpu_bytes - plan->replicated_bytes),
                          (unsigned long long)plan->capacity_bytes, (double)plan->capacity_bytes / gib, need);
}

mmoe_tensor ep_row_slice(const mmoe_tensor *t, int64_t first, int64_t n)
{
    mmoe_tensor s = *t;
    const size_t row_bytes = t->shape[0] > 0 ? t->nbytes / (size_t)t->shape[0] : 0;
    s.data = (uint8_t *)t->data + (size_t)first * row_bytes;
    s.shape[0] = n;
    s.nbytes = (size_t)n * row_bytes;
    return s;
}

mmoe_status ep_masked_routing(int64_t n, int slots, const char *who, int64_t **idx, float **w, mmoe_error *err)
{
    const size_t count = (size_t)n * (size_t)slots;
    *idx = malloc(count * sizeof **idx);
    *w = calloc(count, sizeof **w);
    if (*idx == NULL || *w == NULL) {
        free(*idx);
        free(*w);
        *idx = NULL, *w = NULL;
        return mmoe_error_set(err, MMOE_ENOMEM, "%s: out of memory for %lld masked rows", who, (long long)n);
    }
    for (size_t i = 0; i < count; i++)
        (*idx)[i] = -1;
    return MMOE_OK;
}
