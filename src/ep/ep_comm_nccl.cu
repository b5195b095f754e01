/**
 * @file ep_comm_nccl.cu
 * @brief The NCCL communicator: rank r is GPU r; an exchange is one group of ncclSend/ncclRecv.
 *
 * ## Setup
 *
 * ncclCommInitAll() makes the N communicators of GPUs 0..N-1 in one call of this process
 * (mmoe_ep_comm.h says why one process).  Each rank also gets a CUDA stream on its GPU and
 * staging buffers, host (pinned) and device, grown on demand and kept between exchanges.
 *
 * ## One exchange
 *
 * Every message starts with a 16-byte header, {int32 status, int32 zero, uint64 bytes}, then
 * the payload, padded to 16 bytes so that every message starts aligned:
 *
 *     send staging: [hdr|payload to peer p0][hdr|payload to p1] ...   (peers p != rank, ascending)
 *     recv staging: [hdr|payload from p0]  [hdr|payload from p1] ...
 *
 *  1. pack the outgoing messages into pinned host staging, one cudaMemcpyAsync to the device;
 *  2. ncclGroupStart(); for each peer: ncclSend(its message), ncclRecv(its message);
 *     ncclGroupEnd() (the group lets NCCL run all pairs at once without ordering deadlocks);
 *  3. one cudaMemcpyAsync of the received messages back, synchronize the stream;
 *  4. read each header: any non-OK status is a peer's failure; a size that differs from the
 *     expected one is a bookkeeping error; else unpack the payloads.
 *
 * The header makes the failure agreement (mmoe_ep_comm.h) free: it travels with the data,
 * so no extra collective is spent on it.  The sizes of all messages are known to both ends, as
 * NCCL requires of matching send/receive pairs.
 *
 * The host staging exists because the layer objects of this build take and return host
 * arrays.
 *
 * ## The exchange of device batches
 *
 * A rank that is a GPU model keeps its rows on the device (exchange_device).  NCCL cannot check
 * the size of a message, and a send/receive pair of different sizes is undefined, so the sizes
 * travel first, with the statuses, through the host exchange above: every rank sends every peer
 * its row of the size table (the bytes it sends to each rank, the bytes it expects from each),
 * so every rank holds the whole table, checks every pair and reaches the verdict all others
 * reach.  Then, when all is well, one group of ncclSend/ncclRecv moves the batches themselves,
 * device to device, on the rank's stream after the device's queued work, and the stream is
 * synchronized.  The first step costs one small host exchange per call; pairs with nothing to
 * move are skipped on both ends.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"

/** The header in front of every message. */
typedef struct msg_header {
    int32_t status; /**< the sender's status (mmoe_status) */
    int32_t zero;   /**< 0 (padding) */
    uint64_t bytes; /**< payload bytes */
} msg_header;

/** Messages start at multiples of this many bytes. */
#define MSG_ALIGN 16

/** One rank: its communicator, stream and staging buffers. */
typedef struct nccl_rank {
    mmoe_ep_comm comm;   /**< the public part (first member: the ops reach the rest from it) */
    ncclComm_t nc;       /**< the NCCL communicator */
    cudaStream_t stream; /**< the rank's stream on its GPU */
    int device;          /**< its GPU */
    char *h_send;        /**< pinned host staging, outgoing */
    char *h_recv;        /**< pinned host staging, incoming */
    char *d_send;        /**< device staging, outgoing */
    char *d_recv;        /**< device staging, incoming */
    size_t send_cap;     /**< bytes of h_send and d_send */
    size_t recv_cap;     /**< bytes of h_recv and d_recv */
    uint64_t sent;       /**< payload bytes sent to peers so far */
    uint64_t *sizes;     /**< [size][2 * size] the size table of a device exchange (rows: senders) */
} nccl_rank;

/** The group's state: every rank. */
typedef struct nccl_impl {
    int size;                           /**< ranks */
    nccl_rank ranks[MMOE_EP_MAX_RANKS]; /**< [size] */
} nccl_impl;

/** Message size: header + payload, padded. */
static size_t msg_size(size_t payload)
{
    return (sizeof(msg_header) + payload + MSG_ALIGN - 1) / MSG_ALIGN * MSG_ALIGN;
}

/** Grow a pinned host and a device buffer pair to @p bytes. */
static cudaError_t grow(char **h, char **d, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return cudaSuccess;
    cudaFreeHost(*h);
    cudaFree(*d);
    *h = *d = NULL;
    *cap = 0;
    cudaError_t e = cudaMallocHost((void **)h, bytes);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)d, bytes);
    if (e == cudaSuccess)
        *cap = bytes;
    return e;
}

/** The exchange (steps 1-4 of the file comment). */
static mmoe_status nccl_exchange(mmoe_ep_comm *c, const mmoe_ep_batch *send, const mmoe_ep_batch *recv,
                                 mmoe_status local, int *peer_failed, mmoe_error *err)
{
    nccl_rank *R = (nccl_rank *)c; /* comm is the first member */
    const int n = c->size, r = c->rank;
    *peer_failed = 0;
    size_t so[MMOE_EP_MAX_RANKS + 1] = {0}, ro[MMOE_EP_MAX_RANKS + 1] = {0};
    for (int q = 0; q < n; q++) {
        so[q + 1] = so[q] + (q == r ? 0 : msg_size(send[q].bytes));
        ro[q + 1] = ro[q] + (q == r ? 0 : msg_size(recv[q].bytes));
    }
    cudaError_t e = grow(&R->h_send, &R->d_send, &R->send_cap, so[n]);
    if (e == cudaSuccess)
        e = grow(&R->h_recv, &R->d_recv, &R->recv_cap, ro[n]);
    if (e != cudaSuccess)
        return mmoe_error_set(err, MMOE_ENOMEM, "ep nccl: rank %d: staging of %zu + %zu bytes: %s", r, so[n], ro[n],
                              cudaGetErrorString(e));
    /* 1: pack and upload */
    for (int q = 0; q < n; q++) {
        if (q == r)
            continue;
        msg_header h = {(int32_t)local, 0, (uint64_t)send[q].bytes};
        memcpy(R->h_send + so[q], &h, sizeof h);
        if (local == MMOE_OK && send[q].bytes > 0)
            memcpy(R->h_send + so[q] + sizeof h, send[q].data, send[q].bytes);
    }
    if (so[n] > 0)
        e = cudaMemcpyAsync(R->d_send, R->h_send, so[n], cudaMemcpyHostToDevice, R->stream);
    /* 2: one group of sends and receives */
    ncclResult_t nr = ncclSuccess;
    if (e == cudaSuccess && n > 1) {
        nr = ncclGroupStart();
        for (int q = 0; q < n && nr == ncclSuccess; q++) {
            if (q == r)
                continue;
            nr = ncclSend(R->d_send + so[q], so[q + 1] - so[q], ncclUint8, q, R->nc, R->stream);
            if (nr == ncclSuccess)
                nr = ncclRecv(R->d_recv + ro[q], ro[q + 1] - ro[q], ncclUint8, q, R->nc, R->stream);
        }
        ncclResult_t ne = ncclGroupEnd();
        nr = nr != ncclSuccess ? nr : ne;
    }
    /* 3: download */
    if (e == cudaSuccess && nr == ncclSuccess && ro[n] > 0)
        e = cudaMemcpyAsync(R->h_recv, R->d_recv, ro[n], cudaMemcpyDeviceToHost, R->stream);
    if (e == cudaSuccess && nr == ncclSuccess)
        e = cudaStreamSynchronize(R->stream);
    if (nr != ncclSuccess)
        return mmoe_error_set(err, MMOE_EINTERNAL, "ep nccl: rank %d: send/recv: %s", r, ncclGetErrorString(nr));
    if (e != cudaSuccess)
        return mmoe_error_set(err, MMOE_EINTERNAL, "ep nccl: rank %d: staging copy: %s", r, cudaGetErrorString(e));
    /* 4: headers, then payloads */
    int failed = local != MMOE_OK ? r : -1;
    mmoe_status failed_st = local;
    for (int q = 0; q < n; q++) {
        if (q == r)
            continue;
        msg_header h;
        memcpy(&h, R->h_recv + ro[q], sizeof h);
        if (h.status != MMOE_OK && (failed < 0 || q < failed)) {
            failed = q;
            failed_st = (mmoe_status)h.status;
        }
    }
    if (failed >= 0) {
        *peer_failed = 1;
        return mmoe_error_set(err, MMOE_EINTERNAL, "ep exchange: rank %d failed (%s)", failed,
                              mmoe_status_name(failed_st));
    }
    for (int q = 0; q < n; q++) {
        if (q == r)
            continue;
        msg_header h;
        memcpy(&h, R->h_recv + ro[q], sizeof h);
        if (h.bytes != recv[q].bytes)
            return mmoe_error_set(err, MMOE_EINTERNAL, "ep exchange: rank %d sends %llu bytes to rank %d, which expects %zu",
                                  q, (unsigned long long)h.bytes, r, recv[q].bytes);
        if (h.bytes > 0)
            memcpy(recv[q].data, R->h_recv + ro[q] + sizeof h, recv[q].bytes);
    }
    for (int q = 0; q < n; q++)
        if (q != r)
            R->sent += send[q].bytes;
    return MMOE_OK;
}

/** The size table's check (file comment): every sender's bytes against its receiver's expectation. */
static mmoe_status check_sizes(const uint64_t *table, int n, mmoe_error *err)
{
    for (int a = 0; a < n; a++)
        for (int q = 0; q < n; q++)
            if (a != q && table[a * 2 * n + q] != table[q * 2 * n + n + a])
                return mmoe_error_set(err, MMOE_EINTERNAL,
                                      "ep exchange: rank %d sends %llu bytes to rank %d, which expects %llu", a,
                                      (unsigned long long)table[a * 2 * n + q], q,
                                      (unsigned long long)table[q * 2 * n + n + a]);
    return MMOE_OK;
}

/** The exchange of device batches (file comment). */
static mmoe_status nccl_exchange_device(mmoe_ep_comm *c, const mmoe_ep_batch *send, const mmoe_ep_batch *recv,
                                        mmoe_status local, int *peer_failed, mmoe_error *err)
{
    nccl_rank *R = (nccl_rank *)c;
    const int n = c->size, r = c->rank;
    *peer_failed = 0;
    /* the batches were written by kernels queued on this device: they finish first */
    mmoe_status own = MMOE_OK;
    cudaError_t e = local == MMOE_OK ? cudaDeviceSynchronize() : cudaSuccess;
    if (e != cudaSuccess)
        local = own = MMOE_EINTERNAL;
    /* 1: the size table and the statuses, through the host exchange */
    uint64_t *mine = R->sizes + (size_t)r * 2 * (size_t)n;
    mmoe_ep_batch hs[MMOE_EP_MAX_RANKS], hr[MMOE_EP_MAX_RANKS];
    memset(hs, 0, sizeof hs);
    memset(hr, 0, sizeof hr);
    for (int q = 0; q < n; q++) {
        mine[q] = q == r ? 0 : send[q].bytes;
        mine[n + q] = q == r ? 0 : recv[q].bytes;
        hs[q] = (mmoe_ep_batch){mine, sizeof(uint64_t) * 2 * (size_t)n};
        hr[q] = (mmoe_ep_batch){R->sizes + (size_t)q * 2 * (size_t)n, sizeof(uint64_t) * 2 * (size_t)n};
    }
    const uint64_t sent_before = R->sent;
    mmoe_status st = nccl_exchange(c, hs, hr, local, peer_failed, err);
    R->sent = sent_before; /* the statistics count payload only */
    if (own != MMOE_OK) {
        *peer_failed = 0;
        return mmoe_error_set(err, own, "ep nccl: rank %d: device synchronization: %s", r, cudaGetErrorString(e));
    }
    if (st == MMOE_OK)
        st = check_sizes(R->sizes, n, err);
    if (st != MMOE_OK)
        return st;
    /* 2: the batches, device to device */
    ncclResult_t nr = ncclSuccess;
    if (n > 1) {
        nr = ncclGroupStart();
        for (int q = 0; q < n && nr == ncclSuccess; q++) {
            if (q == r)
                continue;
            if (send[q].bytes > 0)
                nr = ncclSend(send[q].data, send[q].bytes, ncclUint8, q, R->nc, R->stream);
            if (nr == ncclSuccess && recv[q].bytes > 0)
                nr = ncclRecv(recv[q].data, recv[q].bytes, ncclUint8, q, R->nc, R->stream);
        }
        ncclResult_t ne = ncclGroupEnd();
        nr = nr != ncclSuccess ? nr : ne;
    }
    if (nr != ncclSuccess)
        return mmoe_error_set(err, MMOE_EINTERNAL, "ep nccl: rank %d: device send/recv: %s", r, ncclGetErrorString(nr));
    if ((e = cudaStreamSynchronize(R->stream)) != cudaSuccess)
        return mmoe_error_set(err, MMOE_EINTERNAL, "ep nccl: rank %d: device send/recv: %s", r, cudaGetErrorString(e));
    for (int q = 0; q < n; q++)
        if (q != r)
            R->sent += send[q].bytes;
    return MMOE_OK;
}

/** Payload bytes the rank sent so far. */
static uint64_t nccl_bytes_sent(const mmoe_ep_comm *c)
{
    return ((const nccl_rank *)c)->sent;
}

/** The NCCL communicator's functions. */
static const mmoe_ep_comm_ops nccl_ops = {nccl_exchange, nccl_exchange_device, nccl_bytes_sent};

/** Free every rank's buffers, stream and communicator, then the state. */
static void nccl_destroy(void *v)
{
    nccl_impl *p = (nccl_impl *)v;
    for (int r = 0; r < p->size; r++) {
        nccl_rank *R = &p->ranks[r];
        cudaSetDevice(R->device);
        free(R->sizes);
        cudaFreeHost(R->h_send);
        cudaFreeHost(R->h_recv);
        cudaFree(R->d_send);
        cudaFree(R->d_recv);
        if (R->stream != NULL)
            cudaStreamDestroy(R->stream);
        if (R->nc != NULL)
            ncclCommDestroy(R->nc);
    }
    free(p);
}

/** Bind the calling thread to the rank's GPU. */
static mmoe_status nccl_bind(void *v, int rank, mmoe_error *err)
{
    return ep_cuda_set_device(((nccl_impl *)v)->ranks[rank].device, err);
}

extern "C" mmoe_status ep_nccl_group_init(mmoe_ep_group *g, int n_ranks, mmoe_error *err)
{
    int n_dev = 0;
    mmoe_status st = ep_cuda_devices(&n_dev, NULL, err);
    if (st != MMOE_OK)
        return st;
    if (n_dev < n_ranks)
        return mmoe_error_set(err, MMOE_ENODEV, "ep nccl: %d ranks need %d GPUs; this machine has %d", n_ranks,
                              n_ranks, n_dev);
    nccl_impl *p = (nccl_impl *)calloc(1, sizeof *p);
    if (p == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "ep nccl: out of memory");
    p->size = n_ranks;
    int prev = 0;
    cudaGetDevice(&prev);
    ncclComm_t comms[MMOE_EP_MAX_RANKS];
    int devs[MMOE_EP_MAX_RANKS];
    for (int r = 0; r < n_ranks; r++)
        devs[r] = r;
    ncclResult_t nr = ncclCommInitAll(comms, n_ranks, devs);
    if (nr != ncclSuccess) {
        free(p);
        return mmoe_error_set(err, MMOE_EINTERNAL, "ep nccl: ncclCommInitAll over %d GPUs: %s", n_ranks,
                              ncclGetErrorString(nr));
    }
    cudaError_t e = cudaSuccess;
    for (int r = 0; r < n_ranks; r++) {
        nccl_rank *R = &p->ranks[r];
        R->comm.ops = &nccl_ops;
        R->comm.rank = r;
        R->comm.size = n_ranks;
        R->nc = comms[r];
        R->device = r;
        g->comms[r] = &R->comm;
        if ((R->sizes = (uint64_t *)calloc((size_t)(2 * n_ranks * n_ranks), sizeof(uint64_t))) == NULL &&
            e == cudaSuccess)
            e = cudaErrorMemoryAllocation;
        if (e == cudaSuccess)
            e = cudaSetDevice(r);
        if (e == cudaSuccess)
            e = cudaStreamCreateWithFlags(&R->stream, cudaStreamNonBlocking);
    }
    cudaSetDevice(prev);
    g->impl = p;
    g->impl_destroy = nccl_destroy;
    g->impl_bind = nccl_bind;
    if (e != cudaSuccess) {
        nccl_destroy(p);
        g->impl = NULL;
        return mmoe_error_set(err, MMOE_EINTERNAL, "ep nccl: streams and size tables: %s", cudaGetErrorString(e));
    }
    return MMOE_OK;
}
