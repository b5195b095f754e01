/**
 * @file gpu_fwd_moe.cuh
 * @brief The GPU forward's MoE sub-layer (gpu_fwd_moe.cu): the layer's device weights, its
 *        work buffers, and the two host entry points (weight packing at upload, one call).
 *
 * The expert weights of a ::dmoe are held in the chain-major packing that gpu_fwd_moe.cu
 * describes (packed in place by gfw_moe_pack() right after the upload), not in the
 * checkpoint's byte order: only the kernels of gpu_fwd_moe.cu read them.
 */
#ifndef MMOE_GPU_FWD_MOE_CUH
#define MMOE_GPU_FWD_MOE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/** The weights of one MoE layer on the device (expert and router matrices chain-packed). */
struct dmoe {
    int64_t E, I, D, k, Ws;       /**< sizes; Ws = shared width (0: none) */
    const uint8_t *w1, *w3, *w2;  /**< [E][I][D/2], [E][I][D/2], [E][D][I/2] */
    const uint8_t *s1, *s3, *s2;  /**< [E][I][D/32], .., [E][D][I/32] */
    const uint8_t *sw1, *sw3, *sw2; /**< shared [Ws][D], [Ws][D], [D][Ws] */
    const float *ss1, *ss3, *ss2; /**< shared block scales (fp32 values) */
    /** @var dmoe::E
     *  routed experts
     *  @var dmoe::I
     *  an expert's intermediate width
     *  @var dmoe::D
     *  model width
     *  @var dmoe::k
     *  experts per token
     *  @var dmoe::w1
     *  gate weights [E][I][D/2], E2M1 codes, chain-packed rows
     *  @var dmoe::w3
     *  up weights [E][I][D/2], E2M1 codes, chain-packed rows
     *  @var dmoe::s1
     *  scales of w1 [E][I][D/32] (the checkpoint's order)
     *  @var dmoe::s3
     *  scales of w3 [E][I][D/32]
     *  @var dmoe::sw1
     *  shared gate weights [Ws][D], E4M3 codes, chain-packed rows
     *  @var dmoe::sw3
     *  shared up weights [Ws][D], chain-packed rows
     *  @var dmoe::ss1
     *  block scales of sw1 [ceil(Ws/B)][ceil(D/B)]
     *  @var dmoe::ss3
     *  block scales of sw3 */
    int B;                        /**< shared block */
    float limit;                  /**< swiglu clamp (<= 0: none) */
    int vb;                       /**< 32-bit words per chain word of the packing (1 or 4) */
    int64_t first;                /**< global id of the first routed expert held (0 unless one rank of an expert-parallel forward) */
    int64_t held;                 /**< routed experts held: w1 .. s2 hold experts [first, first + held) at indices 0 .. held-1 */
};

/** The router of one MoE layer on the device. */
struct gfw_moe_router {
    const uint16_t *gate;         /**< bf16 [E, D], chain-packed rows */
    const float *bias;            /**< [E] or NULL */
    const int32_t *tid2eid;       /**< hash layers: [vocab, k]; NULL otherwise */
    float route_scale;            /**< routed scaling factor */
};

/** Work buffers of the MoE sub-layer (one allocation, gfw_moe_work_carve()). */
struct gfw_moe_work {
    float *xb;                    /**< [Tm][8][D/8]: the bf16 input as fp32, chain-major */
    float *hq;                    /**< [Tm*(k+1)][width]: requantized L2 inputs, chain-major per row */
    int32_t *order;               /**< [Tm*(k+1)]: tasks grouped by expert (shared last) */
    int32_t *flag;                /**< [Tm*(k+1)]: tasks of the item starting at a rank, else 0 */
    int4 *items;                  /**< [Tm*(k+1)]: (expert or E for shared, first rank, tasks, 0) */
    int32_t *n_items;             /**< [1]: items of the current call */
};

/** The buffers of one call (owned by the model; the MoE reads x and ids, writes y). */
struct gfw_moe_io {
    const uint16_t *x;            /**< bf16 [T, D]: the normalized input */
    const int32_t *ids;           /**< [T] token ids (hash layers) */
    int64_t T;                    /**< tokens */
    uint16_t *y;                  /**< bf16 [T, D]: the output */
    float *logits;                /**< [T, E]: router logits, then scores */
    int32_t *idx;                 /**< [T, k]: experts per slot (-1 = masked) */
    float *wts;                   /**< [T, k]: routing weights */
    float *xq;                    /**< [T][8][D/8]: the quantized input's values, chain-major */
    float *h;                     /**< [T*(k+1)][width]: L1 outputs after the epilogue */
    uint16_t *slot_y;             /**< [T*(k+1)][D]: expert outputs per slot */
    int64_t width;                /**< row width of h and hq (max of I, Ws) */
    int x_staged;                 /**< 1: the work's xb and xq already hold x (the norm before wrote them) */
};

/** Bytes of the work buffers for @p Tm tokens, @p kmax experts per token, rows of @p width. */
size_t gfw_moe_work_bytes(int64_t Tm, int64_t D, int64_t kmax, int64_t width);

/** Point @p w into @p base (gfw_moe_work_bytes() bytes, 256-aligned). */
void gfw_moe_work_carve(void *base, int64_t Tm, int64_t D, int64_t kmax, int64_t width, gfw_moe_work *w);

/**
 * Why a layer of these shapes cannot run (a static sentence), or NULL when it can: D, I and
 * the shared width multiples of 128, the shared block a multiple of 32, at most 2048 experts
 * @p held on the GPU, fewer than 2^31 @p tasks (max_tokens x (top-k + 1)).
 */
const char *gfw_moe_unsupported(int64_t D, int64_t I, int64_t Ws, int B, int64_t held, int64_t tasks);

/**
 * Upload gfw_expf()'s table (gpu_forward_kernels.cuh) into this file's copy of the constant
 * (each CUDA translation unit holds its own) and allow the one-token router kernel its shared
 * memory: at model creation, with the forward's own tables.
 */
cudaError_t gfw_moe_upload_tables(const unsigned long long tab[32]);

/** Set m->vb and chain-pack the uploaded matrices of @p m and the router gate in place. */
cudaError_t gfw_moe_pack(dmoe *m, uint16_t *gate);

/**
 * The MoE sub-layer on io.x: router (unless @p given: then io.idx and io.wts hold the routing,
 * and io.logits gets the router's logits only), experts, shared expert, combine into io.y:
 * gfw_moe_rows() then gfw_moe_combine().  On a CUDA error, *what names the step.  Every launch
 * of these three entry points goes to stream @p st, and none of them copies, allocates or
 * waits (the item counts are sized on the host from T alone), so the sub-layer can be
 * captured into a CUDA graph.
 */
cudaError_t gfw_moe_forward(const dmoe &m, const gfw_moe_router &r, const gfw_moe_work &w, const gfw_moe_io &io,
                            int given, cudaStream_t st, const char **what);

/**
 * The router and the plan alone, as the sub-layer launches them (score or hash routing from
 * io.logits into io.logits' scores, io.idx, io.wts and @p w's plan; the shared expert's tasks
 * when m.Ws > 0): for the blocks suite.
 */
cudaError_t gfw_moe_route(const dmoe &m, const gfw_moe_router &r, const gfw_moe_work &w, const gfw_moe_io &io,
                          cudaStream_t st);

/** The token tile of the plan's items for a call of @p T tokens. */
int gfw_moe_tile(int64_t T);

/**
 * The sub-layer up to the combine: routing (as gfw_moe_forward()) into io.idx / io.wts for
 * every slot, and the bf16 slot rows io.slot_y of the pairs whose expert is held
 * ([m.first, m.first + m.held)) and of the shared expert; the other pairs' rows are not
 * written (an expert-parallel rank receives them from the ranks that hold them).
 */
cudaError_t gfw_moe_rows(const dmoe &m, const gfw_moe_router &r, const gfw_moe_work &w, const gfw_moe_io &io,
                         int given, cudaStream_t st, const char **what);

/**
 * gfw_moe_rows() (not given, all experts held) with the shared expert's rows computed on
 * stream @p side, side by side with the router and the routed experts on @p st: @p fork is
 * recorded on @p st once the input is quantized and waited for on @p side, and @p st waits for
 * @p join (recorded on @p side after the shared rows) before it returns, so what is enqueued on
 * @p st after it sees every slot row, in a CUDA graph capture as well.  @p ws: the shared
 * branch's plan arrays (gfw_moe_side_carve()).  Same bits as gfw_moe_rows().
 */
cudaError_t gfw_moe_rows_split(const dmoe &m, const gfw_moe_router &r, const gfw_moe_work &w, const gfw_moe_work &ws,
                               const gfw_moe_io &io, cudaStream_t st, cudaStream_t side, cudaEvent_t fork,
                               cudaEvent_t join, const char **what);

/** Bytes of the shared branch's plan arrays for @p Tm tokens (gfw_moe_rows_split()). */
size_t gfw_moe_side_bytes(int64_t Tm);

/** Point @p ws's plan arrays into @p base (gfw_moe_side_bytes() bytes), its xb and hq at @p w's. */
void gfw_moe_side_carve(void *base, int64_t Tm, const gfw_moe_work &w, gfw_moe_work *ws);

/** The combine of every slot row io.slot_y by io.idx into io.y (moe_combine.c's order). */
cudaError_t gfw_moe_combine(const dmoe &m, const gfw_moe_io &io, cudaStream_t st, const char **what);

#endif
