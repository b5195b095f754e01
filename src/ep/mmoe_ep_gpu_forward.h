/**
 * @file mmoe_ep_gpu_forward.h
 * @brief The whole DeepSeek-V4 forward over N GPUs, expert parallel: N GPU models (one per
 *        rank), each with the replicated tensors and its block of routed experts, running the
 *        same tokens; the slot rows of every MoE layer are exchanged; same bits as one GPU.
 *
 * ## The split
 *
 * Rank r is a GPU forward (mmoe_gpu_forward.h) on its own device (NCCL: GPU r) or, with the
 * in-process group, on the device its thread finds current (GPU 0: several ranks may share
 * one GPU, which is how the split is tested on one device).  It holds everything but the
 * routed experts, and the routed experts [first_r, first_r + n_r) of every MoE layer
 * (::mmoe_ep_partition).  Every rank runs every token through the embedding, mHC, attention,
 * router, shared expert and head: these are replicated, and at batch-1 decode they cost a rank
 * no more than they cost one GPU.
 *
 * ## One MoE sub-layer
 *
 * Each rank routes the T tokens (same bits on every rank: same inputs, same kernels), then:
 *
 *  1. computes the slot rows of the (token, slot) pairs whose expert it holds, with the
 *     forward's own MoE kernels (L1, requantization, L2), and the shared expert's rows;
 *  2. copies the routing to the host and builds the dispatch table (::mmoe_ep_dispatch): the
 *     pairs of each rank in ascending (token, slot) order, which every rank derives alike;
 *  3. gathers its pairs' rows in that order and exchanges them (one grouped exchange of the
 *     group's communicator, mmoe_ep_comm.h): every rank receives every other rank's rows and
 *     scatters them to their slot positions;
 *  4. combines every token from the full set of slot rows in the oracle's order (ascending
 *     expert id, FP32 from +0, shared last): the forward's own combine kernel.
 *
 * A slot row depends only on its token's input, its expert's weights and its routing weight
 * (the kernels compute each row by itself, in a fixed order), so the row a rank computes is
 * the row one GPU computes; the combine sees the same rows in the same order; so every rank's
 * output, and hence the logits, are the one-GPU forward's, bit for bit, for every N.
 *
 * ## Where the rows travel
 *
 * Device to device: the rank's rows are gathered into one device batch, the exchange moves
 * device batches (exchange_device of mmoe_ep_comm.h: NCCL send/receive between the GPUs; the
 * in-process communicator copies between device buffers of this process), and the received
 * rows are scattered on the device.  Only the routing goes to the host (T * topk ids per MoE
 * sub-layer): every rank derives the batch sizes from it, and NCCL needs them on the host.
 *
 * ## Failure
 *
 * A rank whose forward fails (a CUDA error, out of memory) before one of the call's exchanges
 * still takes part in that exchange with its failure, so that its peers stop there instead of
 * waiting; the call then reports the failed rank's own error.  The sequence state of the ranks
 * is undefined after a failed call: reset before the next.
 */
#ifndef MMOE_EP_GPU_FORWARD_H
#define MMOE_EP_GPU_FORWARD_H

#include <stdint.h>

#include "mmoe_ep.h"
#include "mmoe_gpu_forward.h"
#include "mmoe_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A model over N ranks with one sequence's state (opaque). */
typedef struct mmoe_ep_gpu_model mmoe_ep_gpu_model;

/**
 * Upload @p m over @p n_ranks ranks of @p kind (NCCL: GPUs 0..N-1, ncclCommInitAll; in-process:
 * threads on the current device), one rank after the other.
 * @param m            the loaded model (only read during the call)
 * @param n_ranks      N, 1..min(E, MMOE_EP_MAX_RANKS)
 * @param kind         the communicator
 * @param max_seq_len  positions of the sequence state (0: the config's)
 * @param max_tokens   largest T of one forward call (> 0)
 * @param out          the model
 * @param err          error report (a rank's failure prefixed with "rank R: ")
 * @return MMOE_OK; MMOE_EINVAL (N > E); MMOE_ENODEV (no CUDA, no NCCL, fewer GPUs); a rank's
 *         mmoe_gpu_model_create() error (MMOE_ENOMEM with the bytes, ...)
 */
mmoe_status mmoe_ep_gpu_model_create(const mmoe_model *m, int n_ranks, mmoe_ep_comm_kind kind, int64_t max_seq_len,
                                     int64_t max_tokens, mmoe_ep_gpu_model **out, mmoe_error *err);

/** Free every rank's model, the threads and the communicators (NULL allowed). */
void mmoe_ep_gpu_model_destroy(mmoe_ep_gpu_model *e);

/** mmoe_gpu_model_reset() on every rank. */
mmoe_status mmoe_ep_gpu_model_reset(mmoe_ep_gpu_model *e, mmoe_error *err);

/** Tokens consumed so far by the main model (rank 0's count; all ranks agree). */
int64_t mmoe_ep_gpu_model_pos(const mmoe_ep_gpu_model *e);

/**
 * mmoe_gpu_model_forward() over the ranks: same contract, same bits (logits and streams come
 * from rank 0).
 */
mmoe_status mmoe_ep_gpu_model_forward(mmoe_ep_gpu_model *e, const int32_t *ids, int64_t T, float *logits,
                                      int last_only, uint16_t *streams, mmoe_error *err);

/** mmoe_gpu_model_mtp_forward() over the ranks. */
mmoe_status mmoe_ep_gpu_model_mtp_forward(mmoe_ep_gpu_model *e, const uint16_t *streams, const int32_t *next_ids,
                                          int64_t T, float *logits, mmoe_error *err);

/** Ranks of @p e. */
int mmoe_ep_gpu_model_ranks(const mmoe_ep_gpu_model *e);

/** The communicator of @p e. */
mmoe_ep_comm_kind mmoe_ep_gpu_model_kind(const mmoe_ep_gpu_model *e);

/** The partition of the routed experts over the ranks. */
const mmoe_ep_partition *mmoe_ep_gpu_model_partition(const mmoe_ep_gpu_model *e);

/** Rank @p r's GPU model (owned by @p e; for its bytes and timings). */
mmoe_gpu_model *mmoe_ep_gpu_model_rank(mmoe_ep_gpu_model *e, int r);

/** What the exchanges did since creation (rank 0's count; every rank derives the same). */
typedef struct mmoe_ep_gpu_stats {
    int64_t exchanges;                     /**< MoE sub-layer calls */
    int64_t pairs[MMOE_EP_MAX_RANKS];      /**< routed pairs computed by each rank */
    int64_t idle[MMOE_EP_MAX_RANKS];       /**< exchanges in which the rank had no pair */
    uint64_t bytes_sent;                   /**< payload bytes rank 0 sent to its peers */
} mmoe_ep_gpu_stats;

/** The statistics so far. */
void mmoe_ep_gpu_model_stats(const mmoe_ep_gpu_model *e, mmoe_ep_gpu_stats *out);

/**
 * Seconds rank @p r (0 <= r < N) spent in the exchanges of each MoE sub-layer since creation,
 * summed over the calls: @p out[L] for main layer L, @p out[n_layers] for the MTP block;
 * n_layers + 1 values (n_layers: the model config's).  One exchange's time runs from the routing on the host (the
 * rank's own rows computed) to the peers' rows on the rank's device: the dispatch table, the
 * gather, waiting for the slowest peer's rows, and the transfer.
 */
void mmoe_ep_gpu_model_exchange_seconds(const mmoe_ep_gpu_model *e, int r, double *out);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_EP_GPU_FORWARD_H */
