/**
 * @file gpu_internal.cuh
 * @brief Internal declarations shared by the CUDA files of the GPU layer.
 *
 * The layer is a short pipeline of kernels (see mmoe_gpu_moe.h for the
 * stages).  Each stage lives in its own .cu file; this header holds the
 * small device helpers they share (the exact scalar rounding steps) and the
 * host-side launchers with their argument blocks.
 *
 * Scale conventions inside the GPU path: every activation scale is held as
 * an FP32 value (for SM100's UE8M0 scales that value is the power of two
 * 2^(byte-127)), one per (row, group) with group = 128 (SM90) or 32 (SM100)
 * channels.  Weight scales stay UE8M0 bytes, one per (row, 32 along K).
 */
#ifndef MMOE_GPU_INTERNAL_CUH
#define MMOE_GPU_INTERNAL_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "gpu_pdl.cuh"

/** Routed pool entry: which token and which of its top-k slots a pool row holds. */
struct mmoe_pool_entry {
    int token;   /**< token index in [0, T) */
    int slot;    /**< slot in [0, topk), or topk for the shared expert */
    float weight;/**< routing weight applied in the L1 epilogue (1.0 for shared) */
};

/** One GEMM tile of rows: an expert and a contiguous range of its pool rows. */
struct mmoe_tile {
    int expert;   /**< expert index (0 for the shared expert) */
    int row0;     /**< first pool row */
    int nrows;    /**< rows in this tile, 1..BLOCK_M */
};

/** Weight format of the GEMM's B operand. */
enum mmoe_bfmt { MMOE_B_FP4 = 0, MMOE_B_FP8 = 1 };
/** Epilogue of the GEMM. */
enum mmoe_epi {
    MMOE_EPI_SWIGLU = 0,   /**< L1: SwiGLU of the gate/up pair, FP32 out */
    MMOE_EPI_SLOT_BF16 = 1 /**< L2: BF16 into the (token, slot) row of the combine buffer */
};
/** Scale rule of the activation quantizer (see gpu_quant.cu). */
enum mmoe_quant_mode {
    MMOE_QUANT_SM90 = 0,          /**< FP32 scale per 128, 1e-4 clamp (input and intermediate) */
    MMOE_QUANT_SM100_INPUT = 1,   /**< UE8M0 ceil per 32, 1e-4 and [1, 254] clamps */
    MMOE_QUANT_SM100_REQUANT = 2  /**< UE8M0 per 32, the kernel's requant rule, no clamps */
};

/**
 * The L1 epilogue of one intermediate channel, shared by both GEMM families and the split-K
 * finish: the gate and up sums rounded to BF16, clamped in BF16 (gate from above, up on both
 * sides) when @p clamp > 0, then silu(g) * u * w in FP32 with expf and IEEE division (the
 * oracle's precise mode), each product rounded on its own (no FMA contraction).
 */
__device__ __forceinline__ float mmoe_swiglu_channel(float acc_gate, float acc_up, float clamp, float w)
{
    float g = __bfloat162float(__float2bfloat16_rn(acc_gate));
    float u = __bfloat162float(__float2bfloat16_rn(acc_up));
    if (clamp > 0.0f) {
        const float cb = __bfloat162float(__float2bfloat16_rn(clamp));
        g = fminf(g, cb);
        u = fminf(fmaxf(u, -cb), cb);
    }
    const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
    return __fmul_rn(__fmul_rn(__fmul_rn(g, sig), u), w);
}

/**
 * The combine's rule, one place for its two users (the combine kernel, gpu_combine.cu, and the
 * decode L2 launch that combines itself, gpu_decode.cu): the slots of token @p t that take part,
 * as a bit mask: bit k for each slot k < topk that is not masked (topk_idx >= 0), bit topk for
 * the shared expert's slot when there is one.
 */
__device__ __forceinline__ unsigned mmoe_combine_slot_mask(const int32_t *topk_idx, int t, int topk, int has_shared)
{
    unsigned mask = has_shared ? 1u << topk : 0u;
    for (int k = 0; k < topk; k++)
        if (topk_idx[(size_t)t * topk + k] >= 0)
            mask |= 1u << k;
    return mask;
}

/**
 * Channels d and d + 1 of token @p t's output: its slots of @p mask (rows t * (topk + 1) + k of
 * @p slots_buf, width D) summed from 0 in ascending slot order with FP32 additions, then one
 * BF16 rounding.  The slots are read through L2 (another block may have written them).
 */
__device__ __forceinline__ __nv_bfloat162 mmoe_combine_pair(const __nv_bfloat16 *slots_buf, unsigned mask, int t,
                                                            int topk, int D, int d)
{
    float a0 = 0.0f, a1 = 0.0f;
    for (int k = 0; k <= topk; k++) {
        if (!(mask >> k & 1u))
            continue;
        const unsigned int u =
            __ldcg(reinterpret_cast<const unsigned int *>(slots_buf + ((size_t)t * (topk + 1) + k) * D + d));
        a0 = __fadd_rn(a0, __uint_as_float(u << 16));
        a1 = __fadd_rn(a1, __uint_as_float(u & 0xffff0000u));
    }
    return __floats2bfloat162_rn(a0, a1);
}

/** Arguments of one grouped GEMM launch (all pointers are device pointers). */
struct mmoe_gemm_args {
    int K;                      /**< reduction length (D for L1, I for L2), multiple of 128 */
    int n_out;                  /**< output columns (I for L1 = channels after SwiGLU, D for L2) */
    /* A: FP8 rows and their FP32 scales [row, K/AG] */
    const uint8_t *a;           /**< FP8 activations */
    const float *a_scale;       /**< activation scales */
    const mmoe_pool_entry *a_gather; /**< L1 routed: A row of pool row p is token a_gather[p].token; NULL: A row = pool row */
    const uint16_t *a16;        /**< the F16 bits of the same FP8 values [row, K], in wgmma K order (mmoe_launch_widen_e4m3):
                                     what the wgmma kernel reads (it refuses NULL); the mma.sync kernel reads a */
    /* tiles */
    const mmoe_tile *tiles;     /**< tile list, or NULL: uniform tiles over total_rows (expert 0) */
    const int *num_tiles;       /**< device count of valid tiles when tiles != NULL */
    int total_rows;             /**< rows when tiles == NULL */
    /* B: weights tile-major [expert][n-block][K/128][128 rows][128 or 64 bytes], scales
       [expert][n-block][K/128][128 rows][4 bytes] (see mmoe_tile_rows) */
    const uint8_t *b;           /**< weights (E2M1 pairs or E4M3 bytes), tile-major */
    const uint8_t *b_scale;     /**< UE8M0 scale bytes, tile-major */
    size_t b_expert_stride;     /**< bytes between experts' weights */
    size_t bs_expert_stride;    /**< bytes between experts' scales */
    int b_up_row0;              /**< L1: first row of the up half (= I); L2: unused */
    /* epilogue */
    float clamp;                /**< SwiGLU clamp, <= 0: none */
    const mmoe_pool_entry *pool;/**< pool entries (weights, token, slot); NULL: token = row, weight 1, slot = shared_slot */
    int shared_slot;            /**< slot index of the shared expert (= topk) */
    float *out_f32;             /**< L1: FP32 [rows, n_out] */
    __nv_bfloat16 *out_slots;   /**< L2: BF16 [T, slots, D] */
    int slots;                  /**< topk + 1 */
    /* split K (small T): 0 = off; else each block sums split_kb K blocks and stores raw FP32 */
    int split_kb;               /**< K blocks (of 128) per split, 0 = no split */
    float *partial;             /**< [splits][partial_rows][partial_cols] FP32 sums, or NULL */
    int partial_rows;           /**< pool rows of the partial buffer */
    int partial_cols;           /**< 2*n_out (L1: gate then up) or n_out (L2) */
};

/**
 * Finish a split-K GEMM: sum the splits in ascending order (deterministic, and padding adds
 * only exact zeros at the end) and run the epilogue of @p args (SwiGLU to out_f32, or BF16
 * into the combine slots) for the pool rows [0, *num_rows_dev) or [0, rows) when it is NULL.
 */
cudaError_t mmoe_launch_split_finish(const mmoe_gemm_args *args, mmoe_epi epi, int nsplit, int rows,
                                     const int *num_rows_dev, cudaStream_t stream);

/**
 * Rewrite a row-major matrix of 32-bit words [rows][src_row_words] into the GEMM's tile-major
 * layout [n_blocks][nkb][128][tile_row_words]: tile row n of n-block b is source row
 * b*128+n, or, with l1_interleave, gate row b*64+n (n < 64) / up row half_rows+b*64+n-64.
 */
cudaError_t mmoe_tile_rows(const uint32_t *src, uint32_t *dst, int n_blocks, int nkb, int src_row_words,
                           int tile_row_words, int l1_interleave, int half_rows, cudaStream_t stream);

/**
 * The blocks of a grouped GEMM launch, one per (weight block, tile, K split) and numbered in
 * that order, the weight blocks of a tile next to each other: the blocks that run at the same
 * time then share a few tiles' activations in L2 (each block reads all of its tile's K), and
 * the consecutive tiles of one expert share its weights.  Numbered the other way round (tiles
 * first), every block of a wave read another tile's activations, and the routed GEMMs of a
 * large call streamed them from DRAM again for every weight block.
 */
struct mmoe_gemm_block {
    int nb;    /**< weight block: 64 output channels (SwiGLU) or 128 output rows */
    int tile;  /**< tile index (into the tile list, or the uniform tiles) */
    int split; /**< K split (0 without a split) */
};

/** Weight blocks (the first factor of the launch's block count) of a GEMM with epilogue @p epi. */
__host__ __device__ inline int mmoe_gemm_nblocks(const mmoe_gemm_args *a, mmoe_epi epi)
{
    return epi == MMOE_EPI_SWIGLU ? a->n_out / 64 : a->n_out / 128;
}

/** K splits (the last factor of the launch's block count). */
__host__ __device__ inline int mmoe_gemm_nsplit(const mmoe_gemm_args *a)
{
    const int nkb = a->K / 128;
    return a->split_kb > 0 ? (nkb + a->split_kb - 1) / a->split_kb : 1;
}

/** Grid of a grouped GEMM launch: nblocks * max_tiles * nsplit blocks (see mmoe_gemm_block). */
inline dim3 mmoe_gemm_grid(const mmoe_gemm_args *a, mmoe_epi epi, int max_tiles)
{
    return dim3((unsigned)(mmoe_gemm_nblocks(a, epi) * max_tiles * mmoe_gemm_nsplit(a)));
}

#ifdef __CUDACC__
/**
 * The BF16 row of the combine buffer that pool row @p pr of an L2 GEMM writes: the row of its
 * (token, slot), or of (pr, shared_slot) without a pool (the shared expert).
 */
__device__ inline __nv_bfloat16 *mmoe_gemm_slot_row(const mmoe_gemm_args &p, int pr)
{
    int token = pr, slot = p.shared_slot;
    if (p.pool != nullptr) {
        token = p.pool[pr].token;
        slot = p.pool[pr].slot;
    }
    return p.out_slots + ((size_t)token * p.slots + slot) * p.n_out;
}

/** This block's weight block, tile and K split (see mmoe_gemm_block). */
__device__ inline mmoe_gemm_block mmoe_gemm_block_of(const mmoe_gemm_args &p, mmoe_epi epi)
{
    const unsigned nblocks = (unsigned)mmoe_gemm_nblocks(&p, epi), b = blockIdx.x;
    const unsigned max_tiles = gridDim.x / (nblocks * (unsigned)mmoe_gemm_nsplit(&p));
    mmoe_gemm_block r;
    r.nb = (int)(b % nblocks);
    r.tile = (int)((b / nblocks) % max_tiles);
    r.split = (int)(b / nblocks / max_tiles);
    return r;
}

/** What one block of a grouped GEMM computes: its place in the grid and its tile's rows and K range. */
struct mmoe_gemm_work {
    mmoe_gemm_block blk; /**< weight block, tile, K split */
    int expert;          /**< the tile's expert (0 with uniform tiles) */
    int row0, nrows;     /**< the tile's first pool row and its rows (<= the tile height) */
    int kb0, nk;         /**< the K blocks (of 128) it sums: [kb0, kb0 + nk), all of K without a split */
};

/**
 * This block's work with tiles of @p tile_rows rows; false for a block past the last tile (the
 * launches are sized by an upper bound of tiles: such blocks exit at once).
 */
__device__ inline bool mmoe_gemm_work_of(const mmoe_gemm_args &p, mmoe_epi epi, int tile_rows, mmoe_gemm_work *w)
{
    w->blk = mmoe_gemm_block_of(p, epi);
    w->expert = 0;
    if (p.tiles != nullptr) {
        if (w->blk.tile >= *p.num_tiles)
            return false;
        const mmoe_tile tl = p.tiles[w->blk.tile];
        w->expert = tl.expert;
        w->row0 = tl.row0;
        w->nrows = tl.nrows;
    } else {
        w->row0 = w->blk.tile * tile_rows;
        if (w->row0 >= p.total_rows)
            return false;
        w->nrows = min(tile_rows, p.total_rows - w->row0);
    }
    const int nkb = p.K / 128;
    w->kb0 = p.split_kb > 0 ? w->blk.split * p.split_kb : 0;
    w->nk = p.split_kb > 0 ? min(p.split_kb, nkb - w->kb0) : nkb;
    return true;
}
#endif

/**
 * Launch one GEMM kernel instance with @p smem_bytes of dynamic shared memory: raise the
 * instance's limit first (cheap, and idempotent), then launch; the launchers of both kernel
 * families go through here.
 */
template <typename Kernel>
cudaError_t mmoe_launch_gemm_kernel(Kernel kernel, dim3 grid, int threads, int smem_bytes, cudaStream_t s,
                                    const mmoe_gemm_args *a)
{
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (e != cudaSuccess)
        return e;
    kernel<<<grid, threads, smem_bytes, s>>>(*a);
    return cudaGetLastError();
}

/** mmoe_gemm_dispatch() for a known weight format and activation group: the epilogue. */
template <int BFMT, int AG, typename Launcher>
cudaError_t mmoe_gemm_dispatch_epi(const Launcher &l, mmoe_epi epi)
{
    return epi == MMOE_EPI_SWIGLU ? l.template run<BFMT, AG, MMOE_EPI_SWIGLU>()
                                  : l.template run<BFMT, AG, MMOE_EPI_SLOT_BF16>();
}

/**
 * Turn the run-time switches of a GEMM launch (weight format, activation group of 32 or 128,
 * epilogue) into the template arguments of @p l.run<BFMT, AG, EPI>(): the one place where both
 * GEMM kernel families (gpu_gemm.cu, gpu_gemm_wgmma.cu) pick among their 8 instances.
 */
template <typename Launcher>
cudaError_t mmoe_gemm_dispatch(const Launcher &l, mmoe_bfmt bfmt, int ag, mmoe_epi epi)
{
    if (bfmt == MMOE_B_FP4)
        return ag == 32 ? mmoe_gemm_dispatch_epi<MMOE_B_FP4, 32>(l, epi) : mmoe_gemm_dispatch_epi<MMOE_B_FP4, 128>(l, epi);
    return ag == 32 ? mmoe_gemm_dispatch_epi<MMOE_B_FP8, 32>(l, epi) : mmoe_gemm_dispatch_epi<MMOE_B_FP8, 128>(l, epi);
}

/** One weight set of a decode GEMM launch (the routed experts or the shared expert). */
struct mmoe_decode_part {
    mmoe_bfmt bfmt;             /**< weight format */
    int K;                      /**< reduction length, a multiple of 128 */
    int n_out;                  /**< L1: channels after SwiGLU (weight rows / 2); L2 and raw: weight rows */
    const uint8_t *a;           /**< FP8 A rows [rows, K] */
    const float *a_scale;       /**< their scales [rows, K / AG] */
    const uint8_t *b;           /**< weights, tile-major as for mmoe_gemm_args */
    const uint8_t *b_scale;     /**< UE8M0 scales, tile-major */
    size_t b_expert_stride;     /**< bytes between experts' weights */
    size_t bs_expert_stride;    /**< bytes between experts' scales */
    float *out_f32;             /**< L1: FP32 [rows, n_out] after SwiGLU */
};

/**
 * Arguments of one decode GEMM launch (gpu_decode.cu): the shared part (uniform tiles of 8
 * tokens, rows = tokens) and the routed part (tiles from the call's table, gpu_decode_route.h;
 * rows of the routed L1 output and L2 input are pair indices token * topk + slot).
 */
struct mmoe_decode_args {
    mmoe_decode_part shared;    /**< the shared expert (grid rows [0, shared_tiles)) */
    mmoe_decode_part routed;    /**< the routed experts (the next routed_tiles grid rows) */
    int shared_tiles;           /**< tiles of the shared part: ceil(T / 8), or 0 */
    int routed_tiles;           /**< upper bound of the routed tiles (mmoe_decode_route_max_tiles), or 0 */
    int shared_lead;            /**< routed blocks dispatched before the shared part's
                                     (mmoe_decode_shared_lead; set by mmoe_launch_decode_gemm) */
    int tile_rows;              /**< 1..8: the most activation rows a tile of this launch holds, the rows
                                     each block stages (shared: min(8, T); routed: min(8, the most pairs
                                     of one expert)); a block given more traps */
    int T;                      /**< tokens */
    int topk;                   /**< routed slots per token */
    int E;                      /**< routed experts */
    const int32_t *topk_idx;    /**< [T, topk], -1 = masked */
    const int32_t *route;       /**< the routed tiles and counters of the call (gpu_decode_route.h, built for
                                     routed_tiles tiles); NULL when routed_tiles is 0 */
    const float *topk_w;        /**< [T, topk] routing weights */
    int routed_a_by_pair;       /**< 1: the routed A row is the pair (L2); 0: the token (L1) */
    float clamp;                /**< SwiGLU clamp, <= 0: none */
    __nv_bfloat16 *out_slots;   /**< L2: BF16 [T, topk + 1, D] combine slots */
    float *raw;                 /**< per-stage test: raw FP32 sums [rows, n_out] of the shared part instead */
    int *counts;                /**< L1: this call's pairs per expert [E], or NULL */
    long long *cum_counts;      /**< L1: running totals [E] */
    int *num_pairs;             /**< L1: the call's valid pairs */
    /* L1 only: the requantization of both parts' outputs in the launch (gpu_decode.cu); none when
       rq_counters is NULL */
    int *rq_counters;           /**< [grid rows][rq_groups] blocks done per 128-channel group, all zero
                                     between launches (the last block of a group resets its counter) */
    int rq_groups;              /**< counters per grid row: the widest part's n_out / 128 */
    uint8_t *rq_routed_q;       /**< routed L2 input [pairs, routed.n_out] E4M3 */
    float *rq_routed_s;         /**< its scales (the recipe's group: 128 when a_group is 128, else 32) */
    uint8_t *rq_shared_q;       /**< shared L2 input [T, shared.n_out] E4M3 */
    float *rq_shared_s;         /**< its scales */
    /* L2 only: the combine of each token's slots in the launch (gpu_decode.cu); none when
       cb_counters is NULL */
    int *cb_counters;           /**< [T][cb_chunks] slot rows written per token and 64-channel chunk, all
                                     zero between launches (the last writer resets its counter) */
    int cb_chunks;              /**< 64-channel chunks of an output row: n_out / 64 */
    int cb_has_shared;          /**< 1: slot topk (the shared expert) is part of every token's sum */
    __nv_bfloat16 *cb_out;      /**< the layer output [T, n_out] BF16 */
};

/**
 * Launch the decode GEMM with epilogue @p epi (SwiGLU, or BF16 slots / raw sums) and activation
 * group @p a_group (128 or 32); with @p pdl the launch may overlap the previous kernel on the
 * stream (programmatic dependent launch): its blocks load their weights, then wait.
 */
cudaError_t mmoe_launch_decode_gemm(const mmoe_decode_args *a, int a_group, mmoe_epi epi, int pdl, cudaStream_t s);

/**
 * Blocks of the decode GEMM launch @p a (activation group @p a_group, epilogue @p epi) that fit
 * on one SM at once, by cudaOccupancyMaxActiveBlocksPerMultiprocessor with the launch's dynamic
 * shared memory, into @p blocks.
 */
cudaError_t mmoe_decode_gemm_occupancy(const mmoe_decode_args *a, int a_group, mmoe_epi epi, int *blocks);

/**
 * Requantize the decode path's L1 outputs in one launch: the routed rows (pairs; rows whose
 * topk_idx is -1 were never written and are skipped) and the shared rows, with the same rule.
 * Launched with programmatic dependent launch; lets the next kernel start early.
 */
cudaError_t mmoe_launch_requant_decode(const float *routed, int routed_rows, const int32_t *topk_idx, int I,
                                       const float *shared, int shared_rows, int SI, mmoe_quant_mode mode,
                                       uint8_t *routed_q, float *routed_s, uint8_t *shared_q, float *shared_s,
                                       cudaStream_t stream);

/** mmoe_launch_combine() as the dependent of a programmatic launch (decode path). */
cudaError_t mmoe_launch_combine_pdl(const __nv_bfloat16 *slots_buf, const int32_t *topk_idx, int T, int topk,
                                    int has_shared, int D, __nv_bfloat16 *y, cudaStream_t stream);

/** Launch the grouped GEMM with the given tile height, weight format, activation group and epilogue. */
cudaError_t mmoe_launch_gemm(const mmoe_gemm_args *args, int block_m, mmoe_bfmt b_fmt, int a_group, mmoe_epi epi,
                             int max_tiles, cudaStream_t stream);

/**
 * Launch the warp-specialized wgmma GEMM (gpu_gemm_wgmma.cu; sm_90a devices only): the same
 * arguments and results as mmoe_launch_gemm(), with tiles of @p block_m = 16, 64 or 128 tokens.
 */
cudaError_t mmoe_launch_gemm_wgmma(const mmoe_gemm_args *args, int block_m, mmoe_bfmt b_fmt, int a_group, mmoe_epi epi,
                                   int max_tiles, cudaStream_t stream);

/**
 * Was the wgmma kernel compiled for the current device?  A build whose CUDA_GENCODE lacks
 * compute_90a has only the kernel's trap stub: *built = 0 then (also when the build has no code
 * for this device at all).  Runs a one-thread probe kernel.
 */
cudaError_t mmoe_wgmma_built_for_device(int *built);

/**
 * The F16 bits of @p n E4M3 bytes @p q (n a multiple of 32, rows of whole 32-groups) into @p out,
 * each 32-group in the wgmma kernel's K order (gpu_gemm_wgmma.cu, "Fragments and the K order"):
 * every E4M3 number is an F16 number, so the values are the same, only their places within the
 * group change.  The wgmma kernel reads activations widened once this way instead of converting
 * each tile for every weight block it meets.
 */
cudaError_t mmoe_launch_widen_e4m3(const uint8_t *q, long long n, uint16_t *out, cudaStream_t stream);

/**
 * Quantize rows to FP8 E4M3.
 * @param in_bf16  BF16 input rows [rows, cols], or NULL
 * @param in_f32   FP32 input rows [rows, cols], or NULL (exactly one of the two is given)
 * @param rows     rows
 * @param cols     channels per row, a multiple of 128
 * @param q        E4M3 output [rows, cols]
 * @param mode     the scale rule
 * @param scales   FP32 scales [rows, cols/128] (MMOE_QUANT_SM90) or [rows, cols/32] (the SM100 rules)
 * @param stream   CUDA stream
 */
cudaError_t mmoe_launch_quant(const __nv_bfloat16 *in_bf16, const float *in_f32, int rows, int cols, mmoe_quant_mode mode,
                              uint8_t *q, float *scales, cudaStream_t stream);

/** Group the valid (token, slot) pairs by expert and build the tile list (one block). */
cudaError_t mmoe_launch_route(const int32_t *topk_idx, const float *topk_w, int T, int topk, int E,
                              int block_m, int *counts, long long *cum_counts, mmoe_pool_entry *pool,
                              mmoe_tile *tiles, int *num_tiles, int *num_pairs, cudaStream_t stream);

/** y[t] = bf16(sum over valid slots in ascending order, shared slot last). */
cudaError_t mmoe_launch_combine(const __nv_bfloat16 *slots_buf, const int32_t *topk_idx, int T, int topk,
                                int has_shared, int D, __nv_bfloat16 *y, cudaStream_t stream);

#endif /* MMOE_GPU_INTERNAL_CUH */
