/**
 * @file mmoe_ep.h
 * @brief Expert parallelism: a MoE layer whose routed experts are spread over N ranks (threads
 *        of this process on the CPU, or GPUs through NCCL), bit-identical to the unsplit layer.
 *
 * ## The split
 *
 * Rank r holds the routed experts [first_r, first_r + n_r) of every MoE layer: contiguous
 * blocks, the first E mod N ranks one expert more (::mmoe_ep_partition).  Everything else --
 * router, shared expert, and in a model the attention, embedding and head -- is replicated:
 * every rank holds it and every rank computes it for every token.  At batch-1 decode these
 * parts are latency-bound, so replicating them costs no time, while splitting them would add
 * a collective per layer; and the routed experts are 94 % of V4-Flash's bytes, so the
 * replicated rest fits every GPU (docs/expert-parallel.md has the numbers).
 *
 * An uneven split (E not a multiple of N) is allowed: which rank computes an expert changes
 * no bit of the result (below), only the balance of work.  N > E is refused: a rank without an
 * expert would hold nothing of its own.
 *
 * ## One call
 *
 * Because the tokens are replicated, every rank holds x and the routing of every token, and so
 * every rank knows, without a message, which (token, slot) pairs every rank computes.  A call:
 *
 *  1. route (the caller's topk_idx, or the router, once: every rank would compute the same
 *     bits from the same x);
 *  2. dispatch bookkeeping (::mmoe_ep_dispatch): the pairs of each rank, in ascending
 *     (token, slot) order, and for each pair its rank and position in that rank's list;
 *  3. on every rank at once (::mmoe_ep_team): its pairs through its executor, giving one BF16
 *     row y_e per pair; the shared expert for all tokens;
 *  4. one exchange: rank r sends its pair rows to every other rank and receives theirs (the
 *     sizes are known from step 2);
 *  5. every rank combines every token with the oracle's combine (moe_combine.c): the slots in
 *     the recipe's order, FP32 from zero, shared last, one BF16 store.
 *
 * ## Why bit-identical
 *
 * The unsplit layer's output for a token is a function of (a) each unmasked slot's BF16 row
 * y_e, (b) the shared row, (c) the combine order; EP keeps all three:
 *  (a) a row y_e depends only on x[token], the expert's weights and the pair's weight: the
 *      activation quantizers work per row and the oracle's expert GEMMs are batch-invariant
 *      (each token row is its own product), so neither the other rows of the batch nor the
 *      expert's neighbours change it.  The per-rank executor gets y_e from a layer of topk 1
 *      without shared expert, whose output is bf16(0 + y_e) = y_e; the only difference,
 *      -0 becoming +0, cannot reach the combine's result (its accumulator starts at +0 and a
 *      round-to-nearest sum is -0 only when both addends are -0, so adding -0 or +0 to it
 *      gives the same value), and NaN stays NaN;
 *  (b) the shared row is computed by the same oracle path (fused or serial, the same
 *      decision) from the same x;
 *  (c) the combine is the oracle's function, run on the same rows in the same order.
 * So the N-rank result equals the unsplit result bit for bit, for every recipe and N
 * (tests/test_ep_moe.c).  On the GPU the same argument holds wherever the GPU layer is
 * batch-invariant; the GPU layer of this build chooses split-K by its number of rows
 * (gpu_moe.cu), so there the bound is the GPU layer's own tolerance against the oracle.
 *
 * ## The per-rank executor
 *
 * What a rank does with its pairs is an ::mmoe_ep_executor: the CPU oracle (two oracle layers
 * per rank: its experts with topk 1, and the shared expert) or the GPU layer on the rank's GPU.
 * The whole GPU forward over N GPUs does not go through an executor: each of its ranks is a
 * whole GPU model that holds its block of experts (mmoe_ep_gpu_forward.h), with the same
 * partition, dispatch table and communicator as here.
 */
#ifndef MMOE_EP_H
#define MMOE_EP_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_ep_comm.h"
#include "mmoe_error.h"
#include "mmoe_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/** @name Partition and dispatch bookkeeping (ep_plan.c) */
/** @{ */

/** Which rank holds which routed experts: rank r holds [first[r], first[r+1]). */
typedef struct mmoe_ep_partition {
    int n_ranks;                          /**< N */
    int64_t n_experts;                    /**< E */
    int64_t first[MMOE_EP_MAX_RANKS + 1]; /**< [N + 1] first expert of each rank; first[N] = E */
} mmoe_ep_partition;

/**
 * Split @p n_experts over @p n_ranks in contiguous blocks, the first E mod N ranks one more.
 * @return MMOE_OK; MMOE_EINVAL (N outside 1..MMOE_EP_MAX_RANKS, or N > E: named)
 */
mmoe_status mmoe_ep_partition_make(int64_t n_experts, int n_ranks, mmoe_ep_partition *p, mmoe_error *err);

/** The rank that holds expert @p e (0 <= e < E). */
int mmoe_ep_partition_owner(const mmoe_ep_partition *p, int64_t e);

/** Which rank computes each (token, slot) pair, and where its row sits in that rank's list. */
typedef struct mmoe_ep_dispatch {
    int n_ranks;                          /**< N */
    int64_t n_tokens;                     /**< T */
    int topk;                             /**< slots per token */
    int64_t start[MMOE_EP_MAX_RANKS + 1]; /**< rank r's pairs are pair[start[r] .. start[r+1]) */
    int64_t active[MMOE_EP_MAX_RANKS];    /**< experts of rank r with at least one pair */
    int64_t *pair;                        /**< [pairs] token * topk + slot, by rank, ascending within */
    int32_t *rank_of;                     /**< [T * topk] rank of the pair, -1 for a masked slot */
    int64_t *pos;                         /**< [T * topk] index of the pair in its rank's list, -1 masked */
} mmoe_ep_dispatch;

/**
 * Build the bookkeeping of @p t tokens routed by @p idx [t, topk] (ids in [-1, E)).
 * @return MMOE_OK; MMOE_EINVAL (an id out of range, named); MMOE_ENOMEM
 */
mmoe_status mmoe_ep_dispatch_build(const mmoe_ep_partition *p, const int64_t *idx, int64_t t, int topk,
                                   mmoe_ep_dispatch *d, mmoe_error *err);

/** Free the arrays of @p d (and zero it). */
void mmoe_ep_dispatch_free(mmoe_ep_dispatch *d);
/** @} */

/* ------------------------------------------------------------------------------------------ */
/** @name The per-rank executor */
/** @{ */

/** A rank's compute: its routed experts and the (replicated) shared expert. */
typedef struct mmoe_ep_executor mmoe_ep_executor;

/** The functions of an executor.  All rows are host BF16 bit patterns, row-major [., D]. */
typedef struct mmoe_ep_executor_ops {
    /**
     * y_rows[j] = the BF16 output of local expert local_expert[j] on x_rows[j] with routing
     * weight weight[j] (the unsplit layer's slot row), for j < n.
     */
    mmoe_status (*run_pairs)(mmoe_ep_executor *x, int64_t n, const uint16_t *x_rows, const int64_t *local_expert,
                             const float *weight, uint16_t *y_rows, mmoe_error *err);
    /** y[t] = the shared expert's BF16 output row for x_rows[t], t < n (only when the layer has one). */
    mmoe_status (*run_shared)(mmoe_ep_executor *x, int64_t n, const uint16_t *x_rows, uint16_t *y, mmoe_error *err);
    /** Free the executor. */
    void (*destroy)(mmoe_ep_executor *x);
} mmoe_ep_executor_ops;

/** The common head of every executor. */
struct mmoe_ep_executor {
    const mmoe_ep_executor_ops *ops; /**< its functions */
    const char *backend;             /**< "cpu" or "gpu" (static) */
    mmoe_moe_path shared_path;       /**< the shared expert's path (none, fused, serial) */
    char shared_reason[MMOE_MOE_REASON_LEN]; /**< why not fused ("" when fused or none) */
};

/**
 * Make rank @p rank's executor for the layer @p desc with weights @p w (all E experts' views;
 * the executor uses experts [first, first + n_local) and the shared expert).  Called on the
 * rank's own thread (a GPU executor lands on the rank's GPU).
 */
typedef mmoe_status (*mmoe_ep_executor_factory)(void *ctx, const mmoe_moe_desc *desc, const mmoe_moe_weights *w,
                                                int rank, int64_t first, int64_t n_local, mmoe_ep_executor **out,
                                                mmoe_error *err);

/**
 * The CPU oracle executor (ep_exec_cpu.c): borrows the weight views (keep them alive).
 * @param ctx      an ::mmoe_moe_pool for the oracle layers' dequantization, or NULL for each
 *                 layer's own pool
 * @param desc     the unsplit layer's description
 * @param w        the unsplit layer's weights (all E experts)
 * @param rank     the rank (unused by this executor)
 * @param first    the rank's first expert
 * @param n_local  the rank's number of experts
 * @param out      the executor
 * @param err      error report
 * @return MMOE_OK; an oracle layer's error (validation, MMOE_ENOMEM)
 */
mmoe_status mmoe_ep_executor_cpu(void *ctx, const mmoe_moe_desc *desc, const mmoe_moe_weights *w, int rank,
                                 int64_t first, int64_t n_local, mmoe_ep_executor **out, mmoe_error *err);

/**
 * The GPU layer executor (ep_exec_gpu.c): copies its experts and the shared expert to the
 * calling thread's GPU.
 * @param ctx      unused
 * @param desc     the unsplit layer's description
 * @param w        the unsplit layer's weights (all E experts)
 * @param rank     the rank (unused: the thread is already on the rank's GPU)
 * @param first    the rank's first expert
 * @param n_local  the rank's number of experts
 * @param out      the executor
 * @param err      error report
 * @return MMOE_OK; MMOE_ENODEV without CUDA; MMOE_EUNSUPPORTED where the GPU layer is
 *         (recipe dsv4-ref, a serial shared expert, topk > 31); the GPU layer's errors
 */
mmoe_status mmoe_ep_executor_gpu(void *ctx, const mmoe_moe_desc *desc, const mmoe_moe_weights *w, int rank,
                                 int64_t first, int64_t n_local, mmoe_ep_executor **out, mmoe_error *err);
/** @} */

/* ------------------------------------------------------------------------------------------ */
/** @name The expert-parallel layer (ep_moe.c) */
/** @{ */

/** An expert-parallel MoE layer over the ranks of a team. */
typedef struct mmoe_ep_moe mmoe_ep_moe;

/** What one call did, per rank and in all. */
typedef struct mmoe_ep_result {
    int n_ranks;                           /**< N */
    const char *backend;                   /**< the executors' backend */
    mmoe_moe_path shared_path;             /**< the shared expert's path */
    int64_t routed_pairs;                  /**< unmasked pairs of the call */
    int64_t pairs[MMOE_EP_MAX_RANKS];      /**< pairs computed by each rank */
    int64_t active[MMOE_EP_MAX_RANKS];     /**< experts of each rank that received pairs */
    uint64_t bytes_sent[MMOE_EP_MAX_RANKS];/**< payload bytes each rank sent in the call */
    double compute_s[MMOE_EP_MAX_RANKS];   /**< seconds in the executor (pairs and shared) */
    double exchange_s[MMOE_EP_MAX_RANKS];  /**< seconds in the exchange (waiting included) */
    double combine_s[MMOE_EP_MAX_RANKS];   /**< seconds in the combine */
    double route_s;                        /**< routing and bookkeeping on the caller */
    double total_s;                        /**< the whole call */
    int ranks_agree;                       /**< 1 when every rank's combined output is the same bytes */
} mmoe_ep_result;

/**
 * Create the layer: check @p desc and @p w as the oracle does, partition the experts over the
 * team's ranks, and make each rank's executor on its own thread.
 * @param desc     the unsplit layer's description
 * @param w        the unsplit layer's weights (views; borrowed for the layer's life by CPU
 *                 executors, copied by GPU executors; the router's tensors are always borrowed)
 * @param team     the ranks (borrowed)
 * @param factory  the executor maker (mmoe_ep_executor_cpu, mmoe_ep_executor_gpu, ...)
 * @param factory_ctx passed to @p factory
 * @param out      the layer
 * @param err      error report (a rank's failure is prefixed with "rank R: ")
 * @return MMOE_OK; the oracle's validation errors; MMOE_EINVAL (N > E); a factory's error
 */
mmoe_status mmoe_ep_moe_create(const mmoe_moe_desc *desc, const mmoe_moe_weights *w, mmoe_ep_team *team,
                               mmoe_ep_executor_factory factory, void *factory_ctx, mmoe_ep_moe **out,
                               mmoe_error *err);

/** Free the layer and its executors (NULL allowed). */
void mmoe_ep_moe_destroy(mmoe_ep_moe *ep);

/** The partition of the layer's experts. */
const mmoe_ep_partition *mmoe_ep_moe_partition(const mmoe_ep_moe *ep);

/**
 * Run one call: same contract as mmoe_moe_layer_run() (routing given or routed, hash layers
 * need token_ids; out->topk_idx / topk_weights written when given), same output bits.
 * @param ep   the layer
 * @param in   the inputs of the call
 * @param out  the outputs (caller-allocated)
 * @param res  optional per-rank statistics (NULL: not wanted)
 * @param err  error report
 * @return MMOE_OK; MMOE_EINVAL (bad routing input); a rank's error ("rank R: ...")
 */
mmoe_status mmoe_ep_moe_run(mmoe_ep_moe *ep, const mmoe_moe_input *in, const mmoe_moe_output *out,
                            mmoe_ep_result *res, mmoe_error *err);
/** @} */

/* ------------------------------------------------------------------------------------------ */
/** @name Memory per GPU (ep_plan.c) */
/** @{ */

/** The bytes a model needs on each of N GPUs. */
typedef struct mmoe_ep_memory_plan {
    int n_gpus;                /**< N */
    uint64_t replicated_bytes; /**< every tensor but the routed experts (held by every GPU) */
    uint64_t expert_bytes;     /**< all routed experts of all layers */
    uint64_t per_gpu_bytes;    /**< replicated + the largest rank's share of the experts */
    uint64_t capacity_bytes;   /**< the usable bytes of one GPU the plan was made for (0: none given) */
    int min_gpus;              /**< the fewest GPUs (<= E) whose per-GPU bytes fit the capacity; 0: none */
} mmoe_ep_memory_plan;

/**
 * Plan the weights of a model with @p n_experts routed experts per layer over @p n_gpus GPUs,
 * from its tensor list (mmoe_model_tensors.h): a tensor whose name contains `ffn.experts.E` (E its expert)
 * goes to the rank that holds expert E (::mmoe_ep_partition), everything else to every rank.
 * @param names     [n] tensor names
 * @param bytes     [n] their sizes
 * @param n         tensors
 * @param n_experts E
 * @param n_gpus    N
 * @param capacity_bytes usable bytes per GPU (for min_gpus), 0: not wanted
 * @param plan      written
 * @param err       error report
 * @return MMOE_OK; MMOE_EINVAL (N > E, an expert index >= E in a name)
 */
mmoe_status mmoe_ep_memory_plan_make(const char *const *names, const uint64_t *bytes, size_t n, int64_t n_experts,
                                     int n_gpus, uint64_t capacity_bytes, mmoe_ep_memory_plan *plan,
                                     mmoe_error *err);

/**
 * Check that the plan fits its capacity: per_gpu_bytes <= capacity_bytes, else MMOE_EUNSUPPORTED
 * with a message that gives the bytes per GPU, the capacity and the fewest GPUs that would do.
 */
mmoe_status mmoe_ep_memory_check(const mmoe_ep_memory_plan *plan, mmoe_error *err);
/** @} */

/* ------------------------------------------------------------------------------------------ */
/** @name A model's MoE sub-layers over N ranks (ep_model.c) */
/** @{ */

struct mmoe_model;

/** The expert-parallel layers of a model, installed as its MoE executor. */
typedef struct mmoe_ep_model mmoe_ep_model;

/**
 * Spread every MoE layer of @p model over @p n_ranks ranks of @p kind with the executor
 * @p factory, and install them as the model's MoE executor (mmoe_model_set_moe_executor()):
 * from then on mmoe_model_forward() runs its MoE sub-layers expert-parallel, with the same
 * output bits as the oracle layers.
 * @param model        the model (borrowed; detach before closing it)
 * @param n_ranks      N
 * @param kind         in-process ranks or NCCL GPUs
 * @param factory      mmoe_ep_executor_cpu (NULL: the same), mmoe_ep_executor_gpu, ...
 * @param factory_ctx  its context; for the CPU executor NULL gives one dequantization pool
 *                     shared by every rank and layer (made here)
 * @param out          the attachment
 * @param err          error report
 * @return MMOE_OK; a group, team or layer error (naming the block)
 */
mmoe_status mmoe_ep_model_attach(struct mmoe_model *model, int n_ranks, mmoe_ep_comm_kind kind,
                                 mmoe_ep_executor_factory factory, void *factory_ctx, mmoe_ep_model **out,
                                 mmoe_error *err);

/** Give the model back its oracle layers and free everything (NULL allowed). */
void mmoe_ep_model_detach(mmoe_ep_model *e);

/** Ranks of @p e. */
int mmoe_ep_model_ranks(const mmoe_ep_model *e);

/** Statistics of the last MoE call (any block). */
const mmoe_ep_result *mmoe_ep_model_last(const mmoe_ep_model *e);

/** Sum of routed pairs computed by each rank over all calls so far: [N]. */
const int64_t *mmoe_ep_model_pairs(const mmoe_ep_model *e);
/** @} */

#ifdef __cplusplus
}
#endif
#endif /* MMOE_EP_H */
