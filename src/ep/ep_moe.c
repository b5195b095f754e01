/**
 * @file ep_moe.c
 * @brief The expert-parallel MoE layer: route once, every rank computes its pairs, one
 *        exchange, every rank combines (mmoe_ep.h explains the design and its exactness).
 *
 * ## Data of one call
 *
 * On the caller (the router is replicated; one evaluation stands for all ranks):
 *
 *     idx, wts [T, topk]      the routing (given, or the oracle's router on the full gate)
 *     dispatch                 pairs per rank, rank and position of every (token, slot)
 *
 * On rank r, with n_r = its pairs and P = all pairs:
 *
 *     xr   [n_r, D] BF16       x rows of its pairs (a token routed to two local experts twice)
 *     lid  [n_r], w [n_r]      local expert id and routing weight of each pair
 *     yr   [n_r, D] BF16       its pair rows (the executor)
 *     sh   [T, D]   BF16       the shared expert's rows of all tokens (replicated)
 *     rx   [P - n_r, D] BF16   the other ranks' pair rows, rank by rank in rank order
 *     y    [T, D]   BF16       the combined output (rank 0: the caller's buffer)
 *
 * The exchange sends yr whole to every peer (a rank's rows are wanted by every rank, since every
 * rank combines every token) and receives each peer q's n_q rows into its slice of rx.  The
 * combine then finds the row of (t, k) from the dispatch: in yr when its rank is r, else at
 * rx[offset of its rank + its position].
 *
 * ## Replicated output
 *
 * Every rank's y is the same bytes by construction (the same rows, the same order, the same
 * function).  The call checks it (::mmoe_ep_result::ranks_agree): a cheap guard of the
 * bookkeeping, as a wrong row anywhere shows up as a disagreement.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"
#include "mmoe_clock.h"
#include "mmoe_ep.h"
#include "mmoe_formats.h"
#include "moe_internal.h"

/** The EP layer: the unsplit description, the router views, the partition and the executors. */
struct mmoe_ep_moe {
    mmoe_moe_desc desc;                        /**< the unsplit description */
    mmoe_moe_weights router;                   /**< gate, bias, tid2eid views (borrowed); experts unused */
    mmoe_ep_team *team;                        /**< the ranks (borrowed) */
    mmoe_ep_partition part;                    /**< which rank holds which experts */
    mmoe_ep_executor *exec[MMOE_EP_MAX_RANKS]; /**< [N] each rank's executor */
};

/** What the creation job needs. */
typedef struct create_job {
    mmoe_ep_moe *ep;                  /**< the layer being made */
    const mmoe_moe_weights *w;        /**< all weights */
    mmoe_ep_executor_factory factory; /**< the executor maker */
    void *factory_ctx;                /**< its context */
} create_job;

/** Rank r makes its executor on its own thread (its own GPU). */
static mmoe_status create_rank(void *vctx, int r, mmoe_error *err)
{
    create_job *j = vctx;
    mmoe_ep_moe *ep = j->ep;
    const int64_t first = ep->part.first[r], n = ep->part.first[r + 1] - first;
    return j->factory(j->factory_ctx, &ep->desc, j->w, r, first, n, &ep->exec[r], err);
}

/** Free the executors (on the ranks' threads: a GPU executor frees on its GPU). */
static mmoe_status destroy_rank(void *vctx, int r, mmoe_error *err)
{
    (void)err;
    mmoe_ep_moe *ep = vctx;
    if (ep->exec[r] != NULL)
        ep->exec[r]->ops->destroy(ep->exec[r]);
    ep->exec[r] = NULL;
    return MMOE_OK;
}

void mmoe_ep_moe_destroy(mmoe_ep_moe *ep)
{
    if (ep == NULL)
        return;
    mmoe_ep_team_run(ep->team, destroy_rank, ep, NULL);
    free(ep);
}

mmoe_status mmoe_ep_moe_create(const mmoe_moe_desc *desc, const mmoe_moe_weights *w, mmoe_ep_team *team,
                               mmoe_ep_executor_factory factory, void *factory_ctx, mmoe_ep_moe **out,
                               mmoe_error *err)
{
    *out = NULL;
    mmoe_status st = mmoe_moe_desc_validate(desc, err);
    if (st == MMOE_OK)
        st = moe_weights_validate(desc, w, err);
    if (st != MMOE_OK)
        return st;
    mmoe_ep_moe *ep = calloc(1, sizeof *ep);
    if (ep == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "ep: out of memory for a layer");
    ep->desc = *desc;
    ep->router.gate = w->gate;
    ep->router.gate_bias = w->gate_bias;
    ep->router.tid2eid = w->tid2eid;
    ep->team = team;
    st = mmoe_ep_partition_make(desc->n_experts, mmoe_ep_group_size(mmoe_ep_team_group(team)), &ep->part, err);
    if (st == MMOE_OK) {
        create_job j = {ep, w, factory, factory_ctx};
        st = mmoe_ep_team_run(team, create_rank, &j, err);
    }
    if (st != MMOE_OK) {
        mmoe_ep_moe_destroy(ep);
        return st;
    }
    *out = ep;
    return MMOE_OK;
}

const mmoe_ep_partition *mmoe_ep_moe_partition(const mmoe_ep_moe *ep)
{
    return &ep->part;
}

/* ------------------------------------------------------------------ one call */

/** One rank's buffers and figures in a call. */
typedef struct rank_work {
    uint16_t *y;        /**< [T, D] its combined output (rank 0: the caller's) */
    int y_owned;        /**< 1 when y was allocated by the call */
    double compute_s;   /**< executor seconds */
    double exchange_s;  /**< exchange seconds */
    double combine_s;   /**< combine seconds */
    uint64_t sent;      /**< payload bytes sent */
    int produced;       /**< 1 when y was written */
} rank_work;

/** The shared state of a call's job. */
typedef struct call_job {
    mmoe_ep_moe *ep;                   /**< the layer */
    int64_t t;                         /**< tokens */
    const uint16_t *x;                 /**< [T, D] input */
    const int64_t *idx;                /**< [T, topk] routing */
    const float *wts;                  /**< [T, topk] routing weights */
    const mmoe_ep_dispatch *disp;      /**< bookkeeping */
    rank_work work[MMOE_EP_MAX_RANKS]; /**< per rank */
} call_job;

/** Rank r's buffers of a call, freed together. */
typedef struct rank_bufs {
    uint16_t *xr;  /**< [n_r, D] */
    int64_t *lid;  /**< [n_r] */
    float *w;      /**< [n_r] */
    uint16_t *yr;  /**< [n_r, D] */
    uint16_t *sh;  /**< [T, D] or NULL */
    uint16_t *rx;  /**< [P - n_r, D] */
} rank_bufs;

/** Free the buffers of a rank's call. */
static void rank_bufs_free(rank_bufs *b)
{
    free(b->xr);
    free(b->lid);
    free(b->w);
    free(b->yr);
    free(b->sh);
    free(b->rx);
}

/** malloc of @p n elements of @p size (at least one byte); sets *fail. */
static void *alloc_n(size_t n, size_t size, int *fail)
{
    void *p = malloc(n * size > 0 ? n * size : 1);
    *fail |= p == NULL;
    return p;
}

/** Rank r: gather, compute its pairs and the shared rows (returns the executor's status). */
static mmoe_status rank_compute(call_job *j, int r, rank_bufs *b, mmoe_error *err)
{
    const mmoe_ep_moe *ep = j->ep;
    const mmoe_ep_dispatch *d = j->disp;
    const int64_t D = ep->desc.hidden, n = d->start[r + 1] - d->start[r];
    const int64_t *pairs = d->pair + d->start[r];
    const int topk = ep->desc.topk;
    for (int64_t i = 0; i < n; i++) {
        const int64_t token = pairs[i] / topk;
        memcpy(b->xr + i * D, j->x + token * D, (size_t)D * sizeof(uint16_t));
        b->lid[i] = j->idx[pairs[i]] - ep->part.first[r];
        b->w[i] = j->wts[pairs[i]];
    }
    mmoe_ep_executor *x = ep->exec[r];
    mmoe_status st = x->ops->run_pairs(x, n, b->xr, b->lid, b->w, b->yr, err);
    if (st == MMOE_OK && b->sh != NULL)
        st = x->ops->run_shared(x, j->t, j->x, b->sh, err);
    return st;
}

/** Rank r: combine every token from its own rows, the received rows and the shared rows. */
static void rank_combine(const call_job *j, int r, const rank_bufs *b, const int64_t *rx_off, uint16_t *y)
{
    const mmoe_ep_moe *ep = j->ep;
    const mmoe_ep_dispatch *d = j->disp;
    const int64_t D = ep->desc.hidden;
    const int topk = ep->desc.topk;
    const moe_combine_order order = moe_recipe_rules(ep->desc.recipe)->combine;
    const uint16_t *rows[MMOE_MOE_MAX_TOPK];
    for (int64_t t = 0; t < j->t; t++) {
        for (int k = 0; k < topk; k++) {
            const int64_t i = t * topk + k;
            const int q = d->rank_of[i];
            rows[k] = q < 0 ? NULL : q == r ? b->yr + d->pos[i] * D : b->rx + (rx_off[q] + d->pos[i]) * D;
        }
        moe_combine_token(order, topk, j->idx + t * topk, rows, b->sh != NULL ? b->sh + t * D : NULL, D, y + t * D);
    }
}

/** The job of rank r in a call: compute, exchange, combine. */
static mmoe_status call_rank(void *vctx, int r, mmoe_error *err)
{
    call_job *j = vctx;
    const mmoe_ep_moe *ep = j->ep;
    const mmoe_ep_dispatch *d = j->disp;
    const int n_ranks = d->n_ranks;
    const int64_t D = ep->desc.hidden, n = d->start[r + 1] - d->start[r];
    const int64_t all = d->start[n_ranks];
    rank_work *wk = &j->work[r];
    rank_bufs b = {0};
    int oom = 0;
    b.xr = alloc_n((size_t)(n * D), sizeof(uint16_t), &oom);
    b.lid = alloc_n((size_t)n, sizeof(int64_t), &oom);
    b.w = alloc_n((size_t)n, sizeof(float), &oom);
    b.yr = alloc_n((size_t)(n * D), sizeof(uint16_t), &oom);
    b.rx = alloc_n((size_t)((all - n) * D), sizeof(uint16_t), &oom);
    if (ep->desc.n_shared > 0)
        b.sh = alloc_n((size_t)(j->t * D), sizeof(uint16_t), &oom);
    if (wk->y == NULL) {
        wk->y = alloc_n((size_t)(j->t * D), sizeof(uint16_t), &oom);
        wk->y_owned = 1;
    }
    double t0 = mmoe_clock_s();
    mmoe_status local = oom ? mmoe_error_set(err, MMOE_ENOMEM, "ep: out of memory for the rows of %lld pairs",
                                             (long long)n)
                            : rank_compute(j, r, &b, err);
    double t1 = mmoe_clock_s();
    /* the exchange: every peer gets all of yr; the rows of peer q land at rx_off[q] */
    mmoe_ep_batch send[MMOE_EP_MAX_RANKS], recv[MMOE_EP_MAX_RANKS];
    int64_t rx_off[MMOE_EP_MAX_RANKS];
    int64_t off = 0;
    for (int q = 0; q < n_ranks; q++) {
        const int64_t nq = d->start[q + 1] - d->start[q];
        send[q] = (mmoe_ep_batch){b.yr, (size_t)(n * D) * sizeof(uint16_t)};
        rx_off[q] = off;
        recv[q] = (mmoe_ep_batch){q == r ? NULL : b.rx + off * D, q == r ? 0 : (size_t)(nq * D) * sizeof(uint16_t)};
        if (q != r)
            off += nq;
    }
    mmoe_ep_comm *c = mmoe_ep_group_comm(mmoe_ep_team_group(ep->team), r);
    const uint64_t sent0 = c->ops->bytes_sent(c);
    int peer_failed = 0;
    mmoe_error xerr;
    mmoe_error_clear(&xerr);
    mmoe_status st = c->ops->exchange(c, send, recv, local, &peer_failed, &xerr);
    double t2 = mmoe_clock_s();
    wk->compute_s = t1 - t0;
    wk->exchange_s = t2 - t1;
    wk->sent = c->ops->bytes_sent(c) - sent0;
    if (local == MMOE_OK && st == MMOE_OK) {
        rank_combine(j, r, &b, rx_off, wk->y);
        wk->produced = 1;
    }
    wk->combine_s = mmoe_clock_s() - t2;
    rank_bufs_free(&b);
    if (local != MMOE_OK)
        return local; /* its own message is in err */
    if (st != MMOE_OK && peer_failed)
        return MMOE_OK; /* the failed rank reports the cause (mmoe_ep_comm.h, failure agreement) */
    if (st != MMOE_OK && err != NULL)
        *err = xerr;
    return st;
}

/** Check a caller's routing (ids in [-1, E), finite weights where unmasked), as the oracle does. */
static mmoe_status check_routing(const mmoe_moe_desc *d, const mmoe_moe_input *in, mmoe_error *err)
{
    if (in->topk_weights == NULL)
        return mmoe_error_set(err, MMOE_EINVAL, "ep: topk_idx given without topk_weights");
    for (int64_t i = 0; i < in->n_tokens * d->topk; i++) {
        const int64_t e = in->topk_idx[i];
        if (e < -1 || e >= d->n_experts)
            return mmoe_error_set(err, MMOE_EINVAL, "ep: topk_idx[%lld][%lld] = %lld is not an expert id in [0, %lld) or -1",
                                  (long long)(i / d->topk), (long long)(i % d->topk), (long long)e,
                                  (long long)d->n_experts);
        if (e >= 0 && !isfinite(in->topk_weights[i]))
            return mmoe_error_set(err, MMOE_EINVAL, "ep: topk_weights[%lld][%lld] is not finite",
                                  (long long)(i / d->topk), (long long)(i % d->topk));
    }
    return MMOE_OK;
}

/** The routing of a call into @p idx / @p wts: the caller's, or the oracle's router once. */
static mmoe_status route(const mmoe_ep_moe *ep, const mmoe_moe_input *in, int64_t *idx, float *wts, mmoe_error *err)
{
    const mmoe_moe_desc *d = &ep->desc;
    const size_t slots = (size_t)in->n_tokens * (size_t)d->topk;
    if (in->topk_idx != NULL) {
        mmoe_status st = check_routing(d, in, err);
        if (st == MMOE_OK) {
            memcpy(idx, in->topk_idx, slots * sizeof *idx);
            memcpy(wts, in->topk_weights, slots * sizeof *wts);
        }
        return st;
    }
    const size_t td = (size_t)in->n_tokens * (size_t)d->hidden;
    float *xf = malloc((td > 0 ? td : 1) * sizeof *xf);
    float *logits = malloc(((size_t)in->n_tokens * (size_t)d->n_experts + 1) * sizeof *logits);
    mmoe_status st;
    if (xf == NULL || logits == NULL) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "ep: out of memory for the router of %lld tokens", (long long)in->n_tokens);
    } else {
        mmoe_bf16_to_f32_row(in->x, td, xf);
        const float *bias = d->routing == MMOE_ROUTING_BIASED ? ep->router.gate_bias.data : NULL;
        st = moe_route(d, xf, in->n_tokens, ep->router.gate.data, bias, &ep->router.tid2eid, in->token_ids, idx, wts,
                       logits, err);
    }
    free(xf);
    free(logits);
    return st;
}

/** Fill the statistics of a call. */
static void fill_result(const mmoe_ep_moe *ep, const call_job *j, const mmoe_ep_dispatch *disp, mmoe_ep_result *res)
{
    const int n = ep->part.n_ranks;
    res->n_ranks = n;
    res->backend = ep->exec[0]->backend;
    res->shared_path = ep->exec[0]->shared_path;
    res->routed_pairs = disp->start[n];
    for (int r = 0; r < n; r++) {
        res->pairs[r] = disp->start[r + 1] - disp->start[r];
        res->active[r] = disp->active[r];
        res->bytes_sent[r] = j->work[r].sent;
        res->compute_s[r] = j->work[r].compute_s;
        res->exchange_s[r] = j->work[r].exchange_s;
        res->combine_s[r] = j->work[r].combine_s;
    }
}

mmoe_status mmoe_ep_moe_run(mmoe_ep_moe *ep, const mmoe_moe_input *in, const mmoe_moe_output *out,
                            mmoe_ep_result *res, mmoe_error *err)
{
    const double t_start = mmoe_clock_s();
    if (res != NULL)
        memset(res, 0, sizeof *res);
    if (ep == NULL || in == NULL || out == NULL)
        return mmoe_error_set(err, MMOE_EINVAL, "ep run: layer, input and output are required");
    const mmoe_moe_desc *d = &ep->desc;
    const int64_t t = in->n_tokens, D = d->hidden;
    if (t < 0 || (t > 0 && (in->x == NULL || out->y == NULL)))
        return mmoe_error_set(err, MMOE_EINVAL, "ep run: need n_tokens >= 0, x and y (T = %lld)", (long long)t);
    const size_t slots = (size_t)t * (size_t)d->topk;
    int64_t *idx = malloc((slots > 0 ? slots : 1) * sizeof *idx);
    float *wts = malloc((slots > 0 ? slots : 1) * sizeof *wts);
    call_job *j = calloc(1, sizeof *j);
    mmoe_ep_dispatch disp = {0};
    mmoe_status st = idx == NULL || wts == NULL || j == NULL
                         ? mmoe_error_set(err, MMOE_ENOMEM, "ep run: out of memory for T = %lld", (long long)t)
                         : route(ep, in, idx, wts, err);
    if (st == MMOE_OK)
        st = mmoe_ep_dispatch_build(&ep->part, idx, t, d->topk, &disp, err);
    const double t_routed = mmoe_clock_s();
    if (st == MMOE_OK) {
        *j = (call_job){.ep = ep, .t = t, .x = in->x, .idx = idx, .wts = wts, .disp = &disp};
        j->work[0].y = out->y;
        st = mmoe_ep_team_run(ep->team, call_rank, j, err);
    }
    int agree = 1;
    if (st == MMOE_OK) {
        for (int r = 1; r < ep->part.n_ranks; r++)
            agree &= memcmp(j->work[r].y, out->y, (size_t)(t * D) * sizeof(uint16_t)) == 0;
        if (out->topk_idx != NULL)
            memcpy(out->topk_idx, idx, slots * sizeof *idx);
        if (out->topk_weights != NULL)
            memcpy(out->topk_weights, wts, slots * sizeof *wts);
        if (res != NULL) {
            fill_result(ep, j, &disp, res);
            res->route_s = t_routed - t_start;
            res->ranks_agree = agree;
        }
        if (!agree)
            st = mmoe_error_set(err, MMOE_EINTERNAL, "ep run: the ranks' combined outputs differ (a bookkeeping bug)");
    }
    if (j != NULL)
        for (int r = 0; r < ep->part.n_ranks; r++)
            if (j->work[r].y_owned)
                free(j->work[r].y);
    free(j);
    free(idx);
    free(wts);
    mmoe_ep_dispatch_free(&disp);
    if (res != NULL)
        res->total_s = mmoe_clock_s() - t_start;
    return st;
}
