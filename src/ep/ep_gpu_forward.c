/**
 * @file ep_gpu_forward.c
 * @brief The whole GPU forward over N ranks (mmoe_ep_gpu_forward.h): one GPU model per rank,
 *        driven by the rank's thread of a team, and the exchange its MoE sub-layers call.
 *
 * ## Objects
 *
 *     mmoe_ep_gpu_model: group (communicators), team (one thread per rank), partition,
 *                        and per rank:
 *       ep_fwd_rank:     the rank's GPU model (replicated tensors + its experts), created on
 *                        the rank's thread with a gfw_ep_part whose exchange is rank_exchange();
 *                        device scratch for its rows; host buffers for the routing
 *
 * Host buffers and device scratch are sized once, for the largest call: max_tokens tokens of
 * topk slots, rows of D BF16 values.  A rank sends at most all pairs and receives at most all
 * pairs but its own, so one device scratch of max_tokens * topk rows holds its outgoing rows
 * followed by its incoming ones.
 *
 * ## A call
 *
 * The caller's thread hands the call to the team; every rank's thread runs the GPU forward on
 * its model with the same ids (rank 0 alone writes logits and streams), and the forward calls
 * rank_exchange() once per MoE sub-layer:
 *
 *     routing -> host (int32 [T, k]); dispatch table (mmoe_ep_dispatch_build)
 *     gather the rank's pairs' rows (dispatch order) into the scratch
 *     exchange_device: the batch to every peer; every peer's batch into the scratch after it
 *     scatter the received rows to their slot positions
 *
 * The rows stay on the devices: the routing is the only thing copied to the host.
 *
 * Each rank adds up the wall time of its exchanges per MoE sub-layer
 * (mmoe_ep_gpu_model_exchange_seconds()): from the routing on the host (the download waits for
 * the rank's own rows, so the rank's compute is not in it) to the received rows on its device
 * (the exchange synchronizes its stream).  It holds the dispatch table, the gather, the size
 * table's host exchange (where the rank waits for the slowest peer to finish its rows: load
 * imbalance shows here), the device send/receive; not the scatter, queued after it.
 *
 * ## Failure agreement
 *
 * rank_exchange() always takes part in the exchange: a failure before it (routing download,
 * dispatch, gather) goes into the exchange as the rank's status.  A failure elsewhere in the
 * forward (attention, a launch) returns from the forward before the layer's exchange; the job
 * then takes part in that one exchange with its failure (::drain), if the call still had one
 * ahead: its peers are waiting there.  A rank that learns of a peer's failure in an exchange
 * stops its forward there and returns MMOE_OK from the job, so that the team reports the failed
 * rank's own error (its status and message, "rank R: ...").
 */
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"
#include "gpu_forward_internal.h"
#include "mmoe_clock.h"
#include "mmoe_ep_gpu_forward.h"

/** One rank: its GPU model, buffers and the state of the current call. */
typedef struct ep_fwd_rank {
    mmoe_ep_gpu_model *owner;   /**< back pointer */
    int rank;                   /**< r */
    mmoe_gpu_model *gpu;        /**< the rank's GPU model (owned) */
    ep_rows_scratch scratch;    /**< device scratch (owned, on the rank's device) */
    int32_t *idx32;             /**< host [max_pairs] routing as downloaded */
    int64_t *idx64;             /**< host [max_pairs] the same, for the dispatch table */
    int64_t *which;             /**< host [max_pairs] slot rows of the received rows */
    int64_t exchanges_done;     /**< exchanges of the current call taken part in */
    int layer_base;             /**< sub-layer of the call's first exchange: 0 (main), n_layers (MTP) */
    double *exchange_s;         /**< [n_layers + 1] seconds spent in each sub-layer's exchanges (owner's) */
    int peer_failed;            /**< 1: a peer brought a failure to an exchange of this call */
    mmoe_ep_gpu_stats stats;    /**< the rank's view of the statistics */
} ep_fwd_rank;

/** The model over N ranks. */
struct mmoe_ep_gpu_model {
    mmoe_ep_group *group;       /**< the communicators */
    mmoe_ep_team *team;         /**< the ranks' threads */
    mmoe_ep_partition part;     /**< experts per rank */
    int n_ranks;                /**< N */
    int n_layers;               /**< main layers: the MoE sub-layers (exchanges) of a main forward call */
    int64_t D;                  /**< model width: values per slot row */
    int64_t max_pairs;          /**< max_tokens * topk: slot rows of the largest call */
    ep_fwd_rank *ranks;         /**< [N] */
    double *exchange_s;         /**< [N][n_layers + 1] seconds per rank and MoE sub-layer (the last: MTP) */
};

/* ------------------------------------------------------------------ the exchange */

/** Take part in an exchange that moves nothing, bringing the failure @p local (mmoe_ep_comm.h). */
static void drain(ep_fwd_rank *R, mmoe_status local)
{
    mmoe_ep_comm *c = mmoe_ep_group_comm(R->owner->group, R->rank);
    mmoe_ep_batch none[MMOE_EP_MAX_RANKS];
    memset(none, 0, sizeof none);
    mmoe_error ignored;
    int peer_failed = 0;
    c->ops->exchange_device(c, none, none, local, &peer_failed, &ignored);
    R->exchanges_done++;
}

/** The rank's pairs' rows (dispatch order) to the start of its scratch. */
static mmoe_status gather_own(ep_fwd_rank *R, const mmoe_ep_dispatch *d, const uint16_t *slot_y, mmoe_error *err)
{
    const int r = R->rank;
    return ep_rows_gather(&R->scratch, slot_y, d->pair + d->start[r], d->start[r + 1] - d->start[r], err);
}

/** Record the statistics of one exchange from the dispatch table @p d. */
static void count(ep_fwd_rank *R, const mmoe_ep_dispatch *d)
{
    R->stats.exchanges++;
    for (int q = 0; q < d->n_ranks; q++) {
        const int64_t n = d->start[q + 1] - d->start[q];
        R->stats.pairs[q] += n;
        R->stats.idle[q] += n == 0;
    }
}

/**
 * The part's exchange (gfw_ep_exchange_fn): bring the other ranks' slot rows into @p slot_y.
 * Layout of the scratch: [own rows | rows of peer p0 | rows of p1 | ...] (peers ascending).
 */
static mmoe_status rank_exchange(void *ctx, const int32_t *idx_dev, int64_t T, int k, int64_t D, uint16_t *slot_y,
                                 mmoe_error *err)
{
    ep_fwd_rank *R = ctx;
    mmoe_ep_gpu_model *e = R->owner;
    const int r = R->rank, n = e->n_ranks;
    const int64_t n_pairs = T * k;
    mmoe_ep_dispatch d;
    memset(&d, 0, sizeof d);
    mmoe_status st = MMOE_OK;
    if (n_pairs > e->max_pairs || D != e->D)
        st = mmoe_error_set(err, MMOE_EINTERNAL, "ep gpu forward: %lld slots of width %lld, the buffers hold %lld of %lld",
                            (long long)n_pairs, (long long)D, (long long)e->max_pairs, (long long)e->D);
    if (st == MMOE_OK)
        st = ep_rows_download_i32(idx_dev, n_pairs, R->idx32, err);
    const double t_routed = mmoe_clock_s(); /* the rank's own rows are done: the download waited for them */
    if (st == MMOE_OK) {
        for (int64_t i = 0; i < n_pairs; i++)
            R->idx64[i] = R->idx32[i];
        st = mmoe_ep_dispatch_build(&e->part, R->idx64, T, k, &d, err);
    }
    if (st == MMOE_OK)
        st = gather_own(R, &d, slot_y, err);
    /* the exchange, with this rank's status: a failed rank still takes part (file comment) */
    mmoe_ep_batch send[MMOE_EP_MAX_RANKS], recv[MMOE_EP_MAX_RANKS];
    memset(send, 0, sizeof send);
    memset(recv, 0, sizeof recv);
    const size_t row_bytes = 2 * (size_t)D;
    uint16_t *rows = R->scratch.d_rows;
    const int64_t n_own = st == MMOE_OK ? d.start[r + 1] - d.start[r] : 0;
    int64_t at = n_own, n_in = 0;
    for (int q = 0; q < n && st == MMOE_OK; q++) {
        if (q == r)
            continue;
        const int64_t nq = d.start[q + 1] - d.start[q];
        send[q] = (mmoe_ep_batch){rows, row_bytes * (size_t)n_own};
        recv[q] = (mmoe_ep_batch){rows + at * D, row_bytes * (size_t)nq};
        memcpy(R->which + n_in, d.pair + d.start[q], sizeof(int64_t) * (size_t)nq);
        at += nq;
        n_in += nq;
    }
    mmoe_ep_comm *c = mmoe_ep_group_comm(e->group, r);
    int peer_failed = 0;
    mmoe_error xerr;
    mmoe_error_clear(&xerr);
    const mmoe_status xst = c->ops->exchange_device(c, send, recv, st, &peer_failed, &xerr);
    const int64_t sub_layer = R->layer_base + R->exchanges_done;
    if (sub_layer <= e->n_layers)
        R->exchange_s[sub_layer] += mmoe_clock_s() - t_routed;
    R->exchanges_done++;
    if (st == MMOE_OK && xst != MMOE_OK) {
        R->peer_failed = peer_failed;
        st = mmoe_error_set(err, xst, "%s", xerr.msg);
    }
    if (st == MMOE_OK)
        st = ep_rows_scatter(&R->scratch, n_own, R->which, n_in, slot_y, err);
    if (st == MMOE_OK)
        count(R, &d);
    mmoe_ep_dispatch_free(&d);
    return st;
}

/* ------------------------------------------------------------------ jobs of the team */

/** What a job does, and its arguments. */
typedef enum ep_fwd_job_kind {
    EP_FWD_CREATE = 0,  /**< create rank `target`'s model (one rank at a time) */
    EP_FWD_DESTROY,     /**< free every rank's model and scratch */
    EP_FWD_RESET,       /**< reset every rank's sequence */
    EP_FWD_FORWARD,     /**< a main forward call */
    EP_FWD_MTP          /**< an MTP forward call */
} ep_fwd_job_kind;

/** A job's arguments. */
typedef struct ep_fwd_job {
    ep_fwd_job_kind kind;      /**< what */
    mmoe_ep_gpu_model *e;      /**< the model */
    int target;                /**< EP_FWD_CREATE: the rank to create */
    const mmoe_model *m;       /**< EP_FWD_CREATE: the CPU model */
    int64_t max_seq_len;       /**< EP_FWD_CREATE */
    int64_t max_tokens;        /**< EP_FWD_CREATE */
    const int32_t *ids;        /**< forward: token ids */
    const uint16_t *streams_in;/**< EP_FWD_MTP: the streams */
    int64_t T;                 /**< forward: tokens */
    float *logits;             /**< forward: rank 0's logits (NULL: none) */
    int last_only;             /**< EP_FWD_FORWARD */
    uint16_t *streams;         /**< EP_FWD_FORWARD: rank 0's final streams (NULL: none) */
} ep_fwd_job;

/** Create rank @p R's model and buffers (on its thread, so on its device). */
static mmoe_status create_rank(ep_fwd_rank *R, const ep_fwd_job *j, mmoe_error *err)
{
    mmoe_ep_gpu_model *e = R->owner;
    const int64_t first = e->part.first[R->rank];
    const gfw_ep_part part = {first, e->part.first[R->rank + 1] - first, rank_exchange, R};
    R->idx32 = malloc(sizeof(int32_t) * (size_t)e->max_pairs);
    R->idx64 = malloc(sizeof(int64_t) * (size_t)e->max_pairs);
    R->which = malloc(sizeof(int64_t) * (size_t)e->max_pairs);
    if (!R->idx32 || !R->idx64 || !R->which)
        return mmoe_error_set(err, MMOE_ENOMEM, "ep gpu forward: out of host memory for the routing of %lld slots",
                              (long long)e->max_pairs);
    mmoe_status st = gfw_model_create_part(j->m, &part, j->max_seq_len, j->max_tokens, &R->gpu, err);
    if (st == MMOE_OK)
        st = ep_rows_scratch_init(&R->scratch, e->max_pairs, e->D, err);
    return st;
}

/** Free rank @p R's model and buffers (on its thread). */
static void destroy_rank(ep_fwd_rank *R)
{
    mmoe_gpu_model_destroy(R->gpu);
    R->gpu = NULL;
    ep_rows_scratch_free(&R->scratch);
    free(R->idx32);
    free(R->idx64);
    free(R->which);
    R->idx32 = NULL;
    R->idx64 = R->which = NULL;
}

/** A forward call on rank @p R, with the failure agreement of the file comment. */
static mmoe_status forward_rank(ep_fwd_rank *R, const ep_fwd_job *j, mmoe_error *err)
{
    const int lead = R->rank == 0;
    const int64_t expected = j->kind == EP_FWD_MTP ? 1 : R->owner->n_layers;
    R->exchanges_done = 0;
    R->layer_base = j->kind == EP_FWD_MTP ? R->owner->n_layers : 0;
    R->peer_failed = 0;
    mmoe_status st = j->kind == EP_FWD_MTP
                         ? mmoe_gpu_model_mtp_forward(R->gpu, j->streams_in, j->ids, j->T, lead ? j->logits : NULL, err)
                         : mmoe_gpu_model_forward(R->gpu, j->ids, j->T, lead ? j->logits : NULL, j->last_only,
                                                  lead ? j->streams : NULL, err);
    if (st == MMOE_OK)
        return MMOE_OK;
    if (R->peer_failed)
        return MMOE_OK; /* the failed peer reports its own error */
    if (R->exchanges_done < expected)
        drain(R, st);
    return st;
}

/** The team's job function. */
static mmoe_status run_job(void *ctx, int rank, mmoe_error *err)
{
    ep_fwd_job *j = ctx;
    ep_fwd_rank *R = &j->e->ranks[rank];
    switch (j->kind) {
    case EP_FWD_CREATE: return rank == j->target ? create_rank(R, j, err) : MMOE_OK;
    case EP_FWD_DESTROY: destroy_rank(R); return MMOE_OK;
    case EP_FWD_RESET: return mmoe_gpu_model_reset(R->gpu, err);
    case EP_FWD_FORWARD:
    case EP_FWD_MTP: return forward_rank(R, j, err);
    }
    return mmoe_error_set(err, MMOE_EINTERNAL, "ep gpu forward: unknown job %d", (int)j->kind);
}

/* ------------------------------------------------------------------ the public functions */

void mmoe_ep_gpu_model_destroy(mmoe_ep_gpu_model *e)
{
    if (e == NULL)
        return;
    if (e->team != NULL && e->ranks != NULL) {
        ep_fwd_job j = {.kind = EP_FWD_DESTROY, .e = e};
        mmoe_error ignored;
        mmoe_ep_team_run(e->team, run_job, &j, &ignored);
    }
    mmoe_ep_team_destroy(e->team);
    mmoe_ep_group_destroy(e->group);
    free(e->ranks);
    free(e->exchange_s);
    free(e);
}

mmoe_status mmoe_ep_gpu_model_create(const mmoe_model *m, int n_ranks, mmoe_ep_comm_kind kind, int64_t max_seq_len,
                                     int64_t max_tokens, mmoe_ep_gpu_model **out, mmoe_error *err)
{
    *out = NULL;
    const mmoe_config *cfg = mmoe_model_config(m);
    if (max_tokens < 1)
        return mmoe_error_set(err, MMOE_ERANGE, "ep gpu forward: max_tokens %lld must be >= 1", (long long)max_tokens);
    mmoe_ep_gpu_model *e = calloc(1, sizeof *e);
    if (e == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "ep gpu forward: out of memory");
    e->n_ranks = n_ranks;
    e->n_layers = (int)cfg->n_layers;
    e->D = cfg->dim;
    e->max_pairs = max_tokens * cfg->n_activated_experts;
    mmoe_status st = mmoe_ep_partition_make(cfg->n_routed_experts, n_ranks, &e->part, err);
    if (st == MMOE_OK)
        st = kind == MMOE_EP_COMM_NCCL ? mmoe_ep_group_create_nccl(n_ranks, &e->group, err)
                                       : mmoe_ep_group_create_inproc(n_ranks, &e->group, err);
    if (st == MMOE_OK)
        st = mmoe_ep_team_create(e->group, &e->team, err);
    if (st == MMOE_OK && ((e->ranks = calloc((size_t)n_ranks, sizeof *e->ranks)) == NULL ||
                          (e->exchange_s = calloc((size_t)n_ranks * (size_t)(e->n_layers + 1), sizeof(double))) == NULL))
        st = mmoe_error_set(err, MMOE_ENOMEM, "ep gpu forward: out of memory");
    for (int r = 0; st == MMOE_OK && r < n_ranks; r++) {
        e->ranks[r].owner = e;
        e->ranks[r].rank = r;
        e->ranks[r].exchange_s = e->exchange_s + (size_t)r * (size_t)(e->n_layers + 1);
    }
    /* one rank after the other: each measures its device's free memory after the previous */
    for (int r = 0; st == MMOE_OK && r < n_ranks; r++) {
        ep_fwd_job j = {.kind = EP_FWD_CREATE, .e = e, .target = r, .m = m, .max_seq_len = max_seq_len,
                        .max_tokens = max_tokens};
        st = mmoe_ep_team_run(e->team, run_job, &j, err);
    }
    if (st != MMOE_OK) {
        mmoe_ep_gpu_model_destroy(e);
        return st;
    }
    *out = e;
    return MMOE_OK;
}

mmoe_status mmoe_ep_gpu_model_reset(mmoe_ep_gpu_model *e, mmoe_error *err)
{
    ep_fwd_job j = {.kind = EP_FWD_RESET, .e = e};
    return mmoe_ep_team_run(e->team, run_job, &j, err);
}

int64_t mmoe_ep_gpu_model_pos(const mmoe_ep_gpu_model *e)
{
    return mmoe_gpu_model_pos(e->ranks[0].gpu);
}

mmoe_status mmoe_ep_gpu_model_forward(mmoe_ep_gpu_model *e, const int32_t *ids, int64_t T, float *logits,
                                      int last_only, uint16_t *streams, mmoe_error *err)
{
    ep_fwd_job j = {.kind = EP_FWD_FORWARD, .e = e, .ids = ids, .T = T, .logits = logits, .last_only = last_only,
                    .streams = streams};
    return mmoe_ep_team_run(e->team, run_job, &j, err);
}

mmoe_status mmoe_ep_gpu_model_mtp_forward(mmoe_ep_gpu_model *e, const uint16_t *streams, const int32_t *next_ids,
                                          int64_t T, float *logits, mmoe_error *err)
{
    ep_fwd_job j = {.kind = EP_FWD_MTP, .e = e, .ids = next_ids, .streams_in = streams, .T = T, .logits = logits};
    return mmoe_ep_team_run(e->team, run_job, &j, err);
}

int mmoe_ep_gpu_model_ranks(const mmoe_ep_gpu_model *e)
{
    return e->n_ranks;
}

mmoe_ep_comm_kind mmoe_ep_gpu_model_kind(const mmoe_ep_gpu_model *e)
{
    return mmoe_ep_group_kind(e->group);
}

const mmoe_ep_partition *mmoe_ep_gpu_model_partition(const mmoe_ep_gpu_model *e)
{
    return &e->part;
}

mmoe_gpu_model *mmoe_ep_gpu_model_rank(mmoe_ep_gpu_model *e, int r)
{
    return r >= 0 && r < e->n_ranks ? e->ranks[r].gpu : NULL;
}

void mmoe_ep_gpu_model_exchange_seconds(const mmoe_ep_gpu_model *e, int r, double *out)
{
    memcpy(out, e->ranks[r].exchange_s, sizeof(double) * (size_t)(e->n_layers + 1));
}

void mmoe_ep_gpu_model_stats(const mmoe_ep_gpu_model *e, mmoe_ep_gpu_stats *out)
{
    *out = e->ranks[0].stats;
    mmoe_ep_comm *c = mmoe_ep_group_comm(e->group, 0);
    out->bytes_sent = c->ops->bytes_sent(c);
}
