/**
 * @file ep_internal.h
 * @brief Internal vocabulary of expert parallelism: the group object shared by the
 *        communicator implementations, and the entry points of each chapter.
 *
 * | chapter            | concept                                                         |
 * |--------------------|-----------------------------------------------------------------|
 * | ep_group.c         | the group object, the in-process communicator                   |
 * | ep_comm_nccl.cu    | the NCCL communicator (one GPU per rank, ncclCommInitAll)       |
 * | ep_comm_nccl_stub.c| the same entry points in a build without NCCL (MMOE_ENODEV)     |
 * | ep_team.c          | one persistent thread per rank, jobs run on all of them         |
 * | ep_plan.c          | expert partition, dispatch bookkeeping, memory plan per GPU     |
 * | ep_exec_cpu.c      | the per-rank executor on the CPU oracle                         |
 * | ep_exec_gpu.c      | the per-rank executor on the GPU layer                          |
 * | ep_moe.c           | the expert-parallel layer: route, compute, exchange, combine    |
 * | ep_model.c         | the model's MoE sub-layers through expert-parallel layers       |
 * | ep_gpu_forward.c   | the whole GPU forward over N ranks (mmoe_ep_gpu_forward.h)      |
 * | ep_gpu_rows.cu     | its device rows: routing download, gather and scatter of rows   |
 */
#ifndef MMOE_EP_INTERNAL_H
#define MMOE_EP_INTERNAL_H

#include "mmoe_ep_comm.h"
#include "mmoe_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A group: the ranks' communicators and the implementation's shared state. */
struct mmoe_ep_group {
    mmoe_ep_comm_kind kind;                   /**< which implementation */
    int size;                                 /**< ranks */
    mmoe_ep_comm *comms[MMOE_EP_MAX_RANKS];   /**< [size] the ranks' communicators (owned by impl) */
    void *impl;                               /**< the implementation's state */
    void (*impl_destroy)(void *impl);         /**< frees impl and the communicators */
    mmoe_status (*impl_bind)(void *impl, int rank, mmoe_error *err); /**< thread binding (may be NULL) */
};

/**
 * Fill @p g (kind, size, comms, impl and its functions) with NCCL communicators over GPUs
 * 0..n-1 (ep_comm_nccl.cu; the stub answers MMOE_ENODEV).
 */
mmoe_status ep_nccl_group_init(mmoe_ep_group *g, int n_ranks, mmoe_error *err);

/**
 * Count the CUDA devices (0 and MMOE_ENODEV with a reason in a build without CUDA or without
 * a device) and, when @p mem_bytes is not NULL, the total memory of device 0.
 */
mmoe_status ep_cuda_devices(int *count, uint64_t *mem_bytes, mmoe_error *err);

/** Make GPU @p device the calling thread's current device (MMOE_ENODEV without CUDA). */
mmoe_status ep_cuda_set_device(int device, mmoe_error *err);

/** Wait until the calling thread's device has finished all queued work (MMOE_ENODEV without CUDA). */
mmoe_status ep_cuda_sync(mmoe_error *err);

/**
 * Copy @p bytes between device buffers, of this or another GPU of the process, and wait until
 * the copy is done (MMOE_ENODEV without CUDA).
 */
mmoe_status ep_cuda_copy(void *dst, const void *src, size_t bytes, mmoe_error *err);

/** The rows [first, first + n) of a 2-D view (e.g. the gate rows of a rank's experts). */
mmoe_tensor ep_row_slice(const mmoe_tensor *t, int64_t first, int64_t n);

/**
 * Routing of @p n rows whose @p slots slots are all masked (ids -1, weights 0): what the
 * executors' shared layers run, so that a row's output is its shared expert alone.  Both
 * arrays are new (free them); MMOE_ENOMEM names @p who.
 */
mmoe_status ep_masked_routing(int64_t n, int slots, const char *who, int64_t **idx, float **w, mmoe_error *err);

/**
 * @name Slot rows on the device (ep_gpu_rows.cu; without CUDA every call is MMOE_ENODEV)
 * A rank's device scratch, allocated once on the rank's device for @p max_rows rows of
 * @p width BF16 values: row indices and packed rows.
 * @{
 */
/** The scratch of one rank: its outgoing rows, then the incoming ones, in d_rows. */
typedef struct ep_rows_scratch {
    int64_t max_rows;  /**< rows it holds */
    int64_t width;     /**< BF16 values per row */
    int64_t *d_which;  /**< device [max_rows] row indices */
    uint16_t *d_rows;  /**< device [max_rows, width] packed rows */
} ep_rows_scratch;

/** Allocate @p s on the calling thread's device (MMOE_ENOMEM naming the bytes). */
mmoe_status ep_rows_scratch_init(ep_rows_scratch *s, int64_t max_rows, int64_t width, mmoe_error *err);

/** Free @p s (on the calling thread's device; a zeroed scratch is allowed). */
void ep_rows_scratch_free(ep_rows_scratch *s);

/** Copy @p n int32 values from the device to the host (synchronous). */
mmoe_status ep_rows_download_i32(const int32_t *dev, int64_t n, int32_t *host, mmoe_error *err);

/** s->d_rows[j] = rows_dev[which[j]] for j < @p n (rows of s->width values; @p which on the host). */
mmoe_status ep_rows_gather(ep_rows_scratch *s, const uint16_t *rows_dev, const int64_t *which, int64_t n,
                           mmoe_error *err);

/** rows_dev[which[j]] = s->d_rows[first + j] for j < @p n (@p which on the host). */
mmoe_status ep_rows_scatter(ep_rows_scratch *s, int64_t first, const int64_t *which, int64_t n, uint16_t *rows_dev,
                            mmoe_error *err);
/** @} */

#ifdef __cplusplus
}
#endif
#endif /* MMOE_EP_INTERNAL_H */
