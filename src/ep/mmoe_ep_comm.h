/**
 * @file mmoe_ep_comm.h
 * @brief The communication of expert parallelism: ranks, a grouped exchange of byte batches of
 *        any size, and the threads that run the ranks.
 *
 * Expert parallelism needs one collective: every rank sends a batch of rows to some peers and
 * receives a batch from each of them, the sizes of all batches being known to both ends
 * beforehand (they follow from the routing, which every rank holds; see mmoe_ep.h).  That is a
 * grouped send/receive, an "all-to-all-v" whose counts need no exchange of their own.  This
 * header puts it behind a small interface, ::mmoe_ep_comm, with two implementations:
 *
 *  - **in-process** (mmoe_ep_group_create_inproc()): ranks are threads of this process and a
 *    batch is a memcpy from the sender's buffer to the receiver's, through a shared table of
 *    posted buffers and a barrier.  It needs nothing but pthreads, so the partitioning,
 *    bookkeeping and combine of expert parallelism run and are tested on a CPU-only machine;
 *  - **NCCL** (mmoe_ep_group_create_nccl(), with --with-nccl): rank r is GPU r, driven by the
 *    rank's thread of this process; an exchange is one ncclGroupStart() ... ncclGroupEnd() of
 *    ncclSend()/ncclRecv() pairs on the rank's communicator.
 *
 * ## One process, one thread per rank
 *
 * Both implementations run the ranks as threads of one process (::mmoe_ep_team): the NCCL
 * communicators come from one ncclCommInitAll() over GPUs 0..N-1.  One process keeps the
 * program a single program (no launcher, no unique-id exchange, one tokenizer, sampler and
 * checkpoint mapping shared by all GPUs: the replicated weights are read once from the page
 * cache), and makes the CPU test of the in-process communicator exercise the same driver code
 * as the GPUs.  One *thread* per GPU, rather than one thread driving all, because the GPU layer
 * object's calls block until their result is on the host: a single thread would serialize the
 * GPUs.  The cost is that a crash of one rank ends all of them, which a single-node generation
 * program accepts.
 *
 * ## Failure agreement
 *
 * A rank that fails before an exchange (out of memory, a CUDA error) must not leave its peers
 * waiting for a batch that never comes.  Every exchange therefore carries each sender's status:
 * a failed rank still takes part with its status set, every rank learns of the failure from
 * the same exchange (peer_failed), and the job of a healthy rank ends there without output,
 * so that the team reports the failed rank's own error.  No collective is ever skipped by one
 * rank alone.
 */
#ifndef MMOE_EP_COMM_H
#define MMOE_EP_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Most ranks a group may have (the width of the per-peer tables; 8 GPUs per node and margin). */
#define MMOE_EP_MAX_RANKS 64

/** Which implementation carries the batches. */
typedef enum mmoe_ep_comm_kind {
    MMOE_EP_COMM_INPROC = 0, /**< threads of this process, memcpy through shared memory */
    MMOE_EP_COMM_NCCL = 1    /**< one GPU per rank, NCCL send/receive on its communicator */
} mmoe_ep_comm_kind;

/** "inproc" or "nccl". */
const char *mmoe_ep_comm_kind_name(mmoe_ep_comm_kind kind);

/** One batch of an exchange: @p bytes bytes at @p data (host or, for exchange_device, device memory; NULL allowed when 0). */
typedef struct mmoe_ep_batch {
    void *data;   /**< the bytes (sent from, or received into) */
    size_t bytes; /**< their number; both ends of a batch agree on it */
} mmoe_ep_batch;

/** The communicator of one rank (an implementation behind a table of functions). */
typedef struct mmoe_ep_comm mmoe_ep_comm;

/** The functions of an implementation. */
typedef struct mmoe_ep_comm_ops {
    /**
     * The grouped exchange: send send[p] to every peer p != rank, receive recv[p] from every
     * peer p != rank (send[rank] and recv[rank] are ignored: a rank's own rows never travel).
     * Collective: every rank of the group calls it, in the same order of exchanges.
     * @param c       the rank's communicator
     * @param send    [size] batches to send
     * @param recv    [size] batches to receive (sizes as the senders' send[rank])
     * @param local   this rank's status so far (MMOE_OK, or the failure it brings)
     * @param peer_failed  set to 1 when some rank brought a failure (then recv is undefined and
     *                the status is MMOE_EINTERNAL naming the first failed rank), else 0
     * @param err     error report
     * @return MMOE_OK when every rank brought MMOE_OK and the batches arrived; MMOE_EINTERNAL
     *         when a rank brought a failure, or a batch size disagrees; a transport error
     */
    mmoe_status (*exchange)(mmoe_ep_comm *c, const mmoe_ep_batch *send, const mmoe_ep_batch *recv,
                            mmoe_status local, int *peer_failed, mmoe_error *err);
    /**
     * The same exchange on device memory: every batch's data is a device pointer of the
     * calling rank's GPU (its current device).  The batches are read after all work the rank
     * queued before the call (the kernels that wrote them), and the received bytes are in
     * place when the call returns.  Same statuses, same failure agreement, same size checks
     * as @p exchange (every rank reaches the same verdict, then moves the bytes or not).
     * Needs CUDA (MMOE_ENODEV without).
     */
    mmoe_status (*exchange_device)(mmoe_ep_comm *c, const mmoe_ep_batch *send, const mmoe_ep_batch *recv,
                                   mmoe_status local, int *peer_failed, mmoe_error *err);
    /** Bytes this rank has sent to peers so far (statistics). */
    uint64_t (*bytes_sent)(const mmoe_ep_comm *c);
} mmoe_ep_comm_ops;

/** A rank's communicator: its implementation, rank and group size. */
struct mmoe_ep_comm {
    const mmoe_ep_comm_ops *ops; /**< the implementation */
    int rank;                    /**< 0 .. size-1 */
    int size;                    /**< ranks of the group */
};

/** A group of ranks: the communicators of all of them (owned by one process). */
typedef struct mmoe_ep_group mmoe_ep_group;

/**
 * Create an in-process group of @p n_ranks ranks (threads).
 * @return MMOE_OK; MMOE_EINVAL (n_ranks outside 1..MMOE_EP_MAX_RANKS); MMOE_ENOMEM
 */
mmoe_status mmoe_ep_group_create_inproc(int n_ranks, mmoe_ep_group **out, mmoe_error *err);

/**
 * Create an NCCL group over GPUs 0 .. @p n_ranks - 1 (ncclCommInitAll).
 * @return MMOE_OK; MMOE_ENODEV (a build without NCCL or CUDA, fewer GPUs than @p n_ranks; the
 *         message says which); MMOE_EINTERNAL (an NCCL or CUDA error, named); MMOE_ENOMEM
 */
mmoe_status mmoe_ep_group_create_nccl(int n_ranks, mmoe_ep_group **out, mmoe_error *err);

/** Free a group (NULL allowed).  No rank may be inside an exchange. */
void mmoe_ep_group_destroy(mmoe_ep_group *g);

/** Ranks of @p g. */
int mmoe_ep_group_size(const mmoe_ep_group *g);

/** The implementation of @p g. */
mmoe_ep_comm_kind mmoe_ep_group_kind(const mmoe_ep_group *g);

/** The communicator of rank @p rank of @p g (owned by the group). */
mmoe_ep_comm *mmoe_ep_group_comm(mmoe_ep_group *g, int rank);

/**
 * Make the calling thread rank @p rank's thread: for NCCL, select the rank's GPU
 * (cudaSetDevice); in-process: nothing.  Called by ::mmoe_ep_team at the start of every job.
 */
mmoe_status mmoe_ep_group_bind_thread(mmoe_ep_group *g, int rank, mmoe_error *err);

/* ------------------------------------------------------------------------------------------ */
/** @name The team: one persistent thread per rank */
/** @{ */

/** N threads, thread r running rank r of every job (ep_team.c). */
typedef struct mmoe_ep_team mmoe_ep_team;

/** A job: what rank @p rank does; returns its status (and message in @p err). */
typedef mmoe_status (*mmoe_ep_job_fn)(void *ctx, int rank, mmoe_error *err);

/**
 * Start one thread per rank of @p group (borrowed: it must outlive the team).
 * @return MMOE_OK; MMOE_ENOMEM (also when a thread cannot be started; none is left running)
 */
mmoe_status mmoe_ep_team_create(mmoe_ep_group *group, mmoe_ep_team **out, mmoe_error *err);

/** Stop and join the threads (NULL allowed). */
void mmoe_ep_team_destroy(mmoe_ep_team *team);

/** The group of @p team. */
mmoe_ep_group *mmoe_ep_team_group(const mmoe_ep_team *team);

/**
 * Run @p fn on every rank's thread at once and wait for all of them.
 * @return MMOE_OK when every rank returned MMOE_OK; else the status of the lowest failed rank,
 *         its message prefixed with "rank R: "
 */
mmoe_status mmoe_ep_team_run(mmoe_ep_team *team, mmoe_ep_job_fn fn, void *ctx, mmoe_error *err);
/** @} */

#ifdef __cplusplus
}
#endif
#endif /* MMOE_EP_COMM_H */
