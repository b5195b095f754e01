/**
 * @file ep_group.c
 * @brief The group of ranks, and the in-process communicator: ranks as threads, batches as
 *        memcpy through a table of posted buffers.
 *
 * ## The in-process exchange
 *
 * The group holds a table `posted[sender][receiver]` of batch descriptors and a status per
 * rank.  One exchange is two phases separated by a barrier of all ranks:
 *
 *  1. post: rank r writes the descriptors of its outgoing batches (pointers into its own
 *     buffers, not copies) into row r of the table, and its status; barrier;
 *  2. pull: rank r reads every rank's status; if all are MMOE_OK it copies column r of the
 *     table (posted[p][r], p != r) into its receive buffers; barrier.
 *
 * The second barrier keeps every sender's buffers alive and unchanged until every receiver has
 * copied from them, so an exchange needs no copy on the sending side.  Each byte is moved
 * once, by the receiving thread.  A batch whose size differs from what the receiver expects is
 * a bookkeeping error of the caller (both ends derive the sizes from the same routing): each
 * rank posts its expected sizes too and checks the whole table, so every rank reports the same
 * MMOE_EINTERNAL naming both sizes and none waits in a later exchange for a rank that stopped.
 * (NCCL cannot check this: a send/receive pair of different sizes is undefined there.)
 *
 * The table is written in phase 1 and read in phase 2 only, and the barrier orders the two
 * (pthread_barrier_wait synchronizes memory), so the exchange is free of data races by
 * construction; ThreadSanitizer agrees (docs/expert-parallel.md).
 *
 * The same exchange moves device memory (exchange_device, for ranks that are GPU models of
 * this process): each rank first waits for its device's queued work (the kernels that wrote its
 * batches), and the pull is a device copy that is complete before the second barrier, so the
 * barriers order the device bytes as they order host bytes.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"

const char *mmoe_ep_comm_kind_name(mmoe_ep_comm_kind kind)
{
    switch (kind) {
    case MMOE_EP_COMM_INPROC: return "inproc";
    case MMOE_EP_COMM_NCCL: return "nccl";
    }
    return "?";
}

/** The in-process implementation's shared state. */
typedef struct inproc_impl {
    int size;                                                /**< ranks */
    pthread_barrier_t barrier;                               /**< the phase barrier of all ranks */
    mmoe_ep_batch posted[MMOE_EP_MAX_RANKS][MMOE_EP_MAX_RANKS]; /**< [sender][receiver] posted batches */
    size_t expect[MMOE_EP_MAX_RANKS][MMOE_EP_MAX_RANKS];        /**< [receiver][sender] expected bytes */
    mmoe_status status[MMOE_EP_MAX_RANKS];                   /**< each rank's status of the exchange */
    mmoe_ep_comm comm[MMOE_EP_MAX_RANKS];                    /**< the ranks' communicators */
    uint64_t sent[MMOE_EP_MAX_RANKS];                        /**< bytes posted to peers, per rank */
} inproc_impl;

/** The in-process impl behind a rank's communicator (comm[r] sits in the impl's array). */
static inproc_impl *impl_of(const mmoe_ep_comm *c)
{
    return (inproc_impl *)((char *)(c - c->rank) - offsetof(inproc_impl, comm));
}

/** The lowest rank whose status is not MMOE_OK, or -1. */
static int first_failed(const inproc_impl *p)
{
    for (int r = 0; r < p->size; r++)
        if (p->status[r] != MMOE_OK)
            return r;
    return -1;
}

/** Where the batches of an exchange live. */
typedef enum inproc_memory {
    INPROC_HOST = 0,  /**< host memory: memcpy */
    INPROC_DEVICE = 1 /**< device memory: a device copy */
} inproc_memory;

/** The exchange: post, barrier, check and pull, barrier (the file comment). */
static mmoe_status inproc_exchange_in(mmoe_ep_comm *c, const mmoe_ep_batch *send, const mmoe_ep_batch *recv,
                                      mmoe_status local, int *peer_failed, inproc_memory where, mmoe_error *err)
{
    inproc_impl *p = impl_of(c);
    const int r = c->rank;
    /* device batches: the kernels that wrote them finish first; a failure here is this rank's */
    mmoe_error own_err;
    mmoe_status own = MMOE_OK;
    if (where == INPROC_DEVICE && local == MMOE_OK && (own = ep_cuda_sync(&own_err)) != MMOE_OK)
        local = own;
    /* phase 1: post */
    for (int q = 0; q < p->size; q++) {
        p->posted[r][q] = q == r ? (mmoe_ep_batch){NULL, 0} : send[q];
        p->expect[r][q] = q == r ? 0 : recv[q].bytes;
        if (q != r && local == MMOE_OK)
            p->sent[r] += send[q].bytes;
    }
    p->status[r] = local;
    pthread_barrier_wait(&p->barrier);
    /* phase 2: pull */
    mmoe_status st = MMOE_OK;
    const int failed = first_failed(p);
    *peer_failed = failed >= 0;
    if (failed >= 0) {
        st = mmoe_error_set(err, MMOE_EINTERNAL, "ep exchange: rank %d failed (%s)", failed,
                            mmoe_status_name(p->status[failed]));
    } else {
        /* every rank checks every pair of the table, so that all reach the same verdict */
        for (int a = 0; a < p->size && st == MMOE_OK; a++)
            for (int q = 0; q < p->size && st == MMOE_OK; q++)
                if (a != q && p->posted[a][q].bytes != p->expect[q][a])
                    st = mmoe_error_set(err, MMOE_EINTERNAL,
                                        "ep exchange: rank %d sends %zu bytes to rank %d, which expects %zu", a,
                                        p->posted[a][q].bytes, q, p->expect[q][a]);
        for (int q = 0; q < p->size && st == MMOE_OK; q++) {
            if (q == r || recv[q].bytes == 0)
                continue;
            if (where == INPROC_DEVICE)
                st = ep_cuda_copy(recv[q].data, p->posted[q][r].data, recv[q].bytes, err);
            else
                memcpy(recv[q].data, p->posted[q][r].data, recv[q].bytes);
        }
    }
    pthread_barrier_wait(&p->barrier);
    if (own != MMOE_OK) {
        *peer_failed = 0;
        return mmoe_error_set(err, own, "%s", own_err.msg);
    }
    return st;
}

/** The exchange of host batches. */
static mmoe_status inproc_exchange(mmoe_ep_comm *c, const mmoe_ep_batch *send, const mmoe_ep_batch *recv,
                                   mmoe_status local, int *peer_failed, mmoe_error *err)
{
    return inproc_exchange_in(c, send, recv, local, peer_failed, INPROC_HOST, err);
}

/** The exchange of device batches. */
static mmoe_status inproc_exchange_device(mmoe_ep_comm *c, const mmoe_ep_batch *send, const mmoe_ep_batch *recv,
                                          mmoe_status local, int *peer_failed, mmoe_error *err)
{
    return inproc_exchange_in(c, send, recv, local, peer_failed, INPROC_DEVICE, err);
}

/** Payload bytes the rank posted to peers so far. */
static uint64_t inproc_bytes_sent(const mmoe_ep_comm *c)
{
    return impl_of(c)->sent[c->rank];
}

/** The in-process communicator's functions. */
static const mmoe_ep_comm_ops inproc_ops = {inproc_exchange, inproc_exchange_device, inproc_bytes_sent};

/** Free the in-process state. */
static void inproc_destroy(void *v)
{
    inproc_impl *p = v;
    pthread_barrier_destroy(&p->barrier);
    free(p);
}

/** A new, empty group object (kind and size set). */
static mmoe_status group_alloc(mmoe_ep_comm_kind kind, int n_ranks, mmoe_ep_group **out, mmoe_error *err)
{
    *out = NULL;
    if (n_ranks < 1 || n_ranks > MMOE_EP_MAX_RANKS)
        return mmoe_error_set(err, MMOE_EINVAL, "ep: %d ranks: expected 1..%d", n_ranks, MMOE_EP_MAX_RANKS);
    mmoe_ep_group *g = calloc(1, sizeof *g);
    if (g == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "ep: out of memory for a group");
    g->kind = kind;
    g->size = n_ranks;
    *out = g;
    return MMOE_OK;
}

mmoe_status mmoe_ep_group_create_inproc(int n_ranks, mmoe_ep_group **out, mmoe_error *err)
{
    mmoe_ep_group *g;
    mmoe_status st = group_alloc(MMOE_EP_COMM_INPROC, n_ranks, &g, err);
    if (st != MMOE_OK)
        return st;
    inproc_impl *p = calloc(1, sizeof *p);
    if (p == NULL || pthread_barrier_init(&p->barrier, NULL, (unsigned)n_ranks) != 0) {
        free(p);
        free(g);
        return mmoe_error_set(err, MMOE_ENOMEM, "ep: out of memory for an in-process group of %d ranks", n_ranks);
    }
    p->size = n_ranks;
    for (int r = 0; r < n_ranks; r++) {
        p->comm[r] = (mmoe_ep_comm){&inproc_ops, r, n_ranks};
        g->comms[r] = &p->comm[r];
    }
    g->impl = p;
    g->impl_destroy = inproc_destroy;
    *out = g;
    return MMOE_OK;
}

mmoe_status mmoe_ep_group_create_nccl(int n_ranks, mmoe_ep_group **out, mmoe_error *err)
{
    mmoe_ep_group *g;
    mmoe_status st = group_alloc(MMOE_EP_COMM_NCCL, n_ranks, &g, err);
    if (st != MMOE_OK)
        return st;
    if ((st = ep_nccl_group_init(g, n_ranks, err)) != MMOE_OK) {
        free(g);
        return st;
    }
    *out = g;
    return MMOE_OK;
}

void mmoe_ep_group_destroy(mmoe_ep_group *g)
{
    if (g == NULL)
        return;
    if (g->impl_destroy != NULL)
        g->impl_destroy(g->impl);
    free(g);
}

int mmoe_ep_group_size(const mmoe_ep_group *g)
{
    return g->size;
}

mmoe_ep_comm_kind mmoe_ep_group_kind(const mmoe_ep_group *g)
{
    return g->kind;
}

mmoe_ep_comm *mmoe_ep_group_comm(mmoe_ep_group *g, int rank)
{
    return rank >= 0 && rank < g->size ? g->comms[rank] : NULL;
}

mmoe_status mmoe_ep_group_bind_thread(mmoe_ep_group *g, int rank, mmoe_error *err)
{
    return g->impl_bind != NULL ? g->impl_bind(g->impl, rank, err) : MMOE_OK;
}
