/**
 * @file moe_internal.h
 * @brief Internal vocabulary of the CPU oracle of the MoE layer: weight matrices, the recipe
 *        rules, the layer object, and the functions each chapter (moe_*.c) provides.
 *
 * Not installed.  Read mmoe_moe.h first; this header is the table of contents of the
 * implementation:
 *
 * | chapter          | concept                                                          |
 * |------------------|------------------------------------------------------------------|
 * | moe_desc.c       | layer descriptions, named shapes, option names                   |
 * | moe_recipe.c     | the rounding points of each recipe, as data (::moe_rules)        |
 * | moe_router.c     | sqrtsoftplus scores, biased top-k / hash, renormalization        |
 * | moe_act_quant.c  | FP8 activation quantizers of the recipes (x and the intermediate)|
 * | moe_weight_tile.c| exact dequantization of FP4 / FP8 weight tiles to FP32           |
 * | moe_dequant_pool.c| the same, split over a few threads (a pool, own or shared)      |
 * | moe_dot.c        | the fixed-order GEMM (8 FMA lanes per output), scalar and AVX2   |
 * | moe_expert_gemm.c| an expert's GEMMs: decoded tiles, or FP4 decoded in registers   |
 * | moe_epilogue.c   | the L1 epilogue: BF16, clamp, SwiGLU, routing weight, requant    |
 * | moe_combine.c    | the combine: slot or expert-id order, shared last, one BF16 store|
 * | moe_shared.c     | fused or serial shared expert, the fallback conditions           |
 * | moe_pad.c        | zero/unit-scale padding of I and of the shared width             |
 * | moe_weights.c    | validation of weight views (dtype, shape, scale byte 255)        |
 * | moe_layer.c      | the layer object: create, set weights, run, destroy              |
 * | moe_load.c       | checkpoint names (`ffn.experts.E.w1.weight`, ...) to weights     |
 * | moe_synth.c      | random layers with real shapes (mmoe_moe_synth.h)                |
 */
#ifndef MOE_INTERNAL_H
#define MOE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_clock.h"
#include "mmoe_moe.h"

/** ceil(a / b) for a >= 0, b > 0. */
static inline int64_t moe_ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/** @p x rounded up to a multiple of @p a (a > 0). */
static inline int64_t moe_round_up(int64_t x, int64_t a)
{
    return moe_ceil_div(x, a) * a;
}

/* ------------------------------------------------------------------ weight matrices */

/** Element format of a weight matrix. */
typedef enum moe_wfmt {
    MOE_W_FP4 = 0, /**< packed E2M1 pairs, one UE8M0 byte per 1 x 32 along K */
    MOE_W_FP8 = 1, /**< E4M3 bytes, scales per (block_n x block_k) block, UE8M0 bytes or F32 */
    MOE_W_BF16 = 2 /**< BF16 (a shared expert stored unquantized; serial path only) */
} moe_wfmt;

/**
 * One weight matrix W [rows, cols] in checkpoint layout (row-major, K = cols contiguous),
 * with its scales.  Data may be borrowed (a view) or owned by the layer (a padded copy).
 */
typedef struct moe_mat {
    moe_wfmt fmt;             /**< FP4 or FP8 */
    int64_t rows;             /**< logical N (output channels) */
    int64_t cols;             /**< logical K (input channels, contiguous) */
    const uint8_t *w;         /**< FP4: rows x cols/2 bytes; FP8: rows x cols bytes */
    const void *sf;           /**< scales: uint8 UE8M0 or float (sf_f32) */
    int sf_f32;               /**< 1 if the scales are F32 */
    int64_t block_n;          /**< scale block rows: FP4 1; FP8 B (1 when expanded) */
    int64_t block_k;          /**< scale block columns: FP4 32; FP8 B (32 when expanded) */
    int64_t sf_rows;          /**< scale matrix rows: ceil(rows / block_n) */
    int64_t sf_cols;          /**< scale matrix columns: ceil(cols / block_k) */
    void *w_owned;            /**< non-NULL when the layer owns w (free on destroy) */
    void *sf_owned;           /**< non-NULL when the layer owns sf */
    size_t w_bytes;           /**< size of w in bytes */
    size_t sf_bytes;          /**< size of sf in bytes */
} moe_mat;

/** The three matrices of an expert: w1 (gate) [I, D], w3 (up) [I, D], w2 (down) [D, I]. */
typedef struct moe_expert {
    moe_mat w1; /**< gate projection [I, D] */
    moe_mat w3; /**< up projection [I, D] */
    moe_mat w2; /**< down projection [D, I] */
} moe_expert;

/** Release the owned buffers of @p m and clear it. */
void moe_mat_release(moe_mat *m);

/* ------------------------------------------------------------------ recipe rules */

/** FP8 activation quantizers (moe_act_quant.c). */
typedef enum moe_qrule {
    MOE_Q_UE8M0_32,          /**< 1x32 UE8M0, DeepGEMM caller rule (1e-4 amax clamp, [1,254]) */
    MOE_Q_UE8M0_128,         /**< 1x128 UE8M0, DeepSeek act_quant rule (1e-4 clamp, ceil) */
    MOE_Q_SM100_REQUANT_32,  /**< 1x32 UE8M0, the SM100 kernel's rule (no clamps; amax 0 -> byte 0) */
    MOE_Q_F32_128,           /**< 1x128 continuous FP32 scale: sf = fl(max(amax,1e-4)/448), q = e4m3(x*fl(1/sf)) */
    MOE_Q_NONE               /**< no quantization (BF16 weights: the input stays BF16) */
} moe_qrule;

/** How silu is formed. */
typedef enum moe_silu_form {
    MOE_SILU_MUL_RCP, /**< sig = 1/(1+exp(-g)); gate = g * sig   (the fused kernels) */
    MOE_SILU_DIV      /**< gate = g / (1 + exp(-g))            (torch F.silu, the reference code) */
} moe_silu_form;

/** Combine order of the slots of a token. */
typedef enum moe_combine_order {
    MOE_COMBINE_SLOT,     /**< ascending top-k slot, shared last (the fused kernels) */
    MOE_COMBINE_EXPERT_ID /**< ascending expert id (ties: slot), shared last (the reference code) */
} moe_combine_order;

/** The L1 epilogue of one kind of expert task. */
typedef struct moe_epilogue_rules {
    int clamp_in_bf16;       /**< 1: the clamp bound is rounded to BF16 first (kernel); 0: FP32 bound */
    moe_silu_form silu;      /**< silu form */
    int h_round_bf16;        /**< 1: the intermediate is rounded to BF16 before its quantization */
    moe_qrule requant;       /**< quantizer of the intermediate (L2 input) */
} moe_epilogue_rules;

/** Every rounding point of a recipe (moe_recipe.c). */
typedef struct moe_rules {
    mmoe_moe_recipe recipe;      /**< which recipe */
    moe_qrule x_quant;           /**< quantizer of x (routed experts and the fused shared slot) */
    moe_epilogue_rules routed;   /**< L1 epilogue of routed (and fused shared) tasks */
    moe_combine_order combine;   /**< combine order */
} moe_rules;

/** The rules of @p recipe (static storage; NULL for an invalid recipe). */
const moe_rules *moe_recipe_rules(mmoe_moe_recipe recipe);

/** The rules of the serial shared expert (DeepSeek's plain FP8 linear; the same for all recipes). */
const moe_rules *moe_serial_shared_rules(void);

/* ------------------------------------------------------------------ activation quantization */

/**
 * Quantize @p rows rows of @p k FP32 values with @p rule and write the *dequantized* values
 * (code x scale, the value the tensor core multiplies) to @p out (may alias @p x).  For the
 * power-of-two rules the dequantized values are exact; for MOE_Q_F32_128 they are fl(q*sf).
 * k must be a multiple of the rule's group.
 */
void moe_act_quant_rows(const float *x, int64_t rows, int64_t k, moe_qrule rule, float *out);

/* ------------------------------------------------------------------ weight tiles */

/**
 * Dequantize the tile W[r0 : r0+nr, c0 : c0+nc] exactly to FP32 into @p out (row-major,
 * leading dimension nc).  c0 and nc are multiples of 32 for FP4.
 */
void moe_weight_tile_f32(const moe_mat *m, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *out);

/* ------------------------------------------------------------------ dequantization threads */

/** Upper bound of MMOE_DEQUANT_THREADS. */
#define MOE_DEQUANT_MAX_THREADS 64
/** Default thread count: the online CPUs, at most this many. */
#define MOE_DEQUANT_DEFAULT_CAP 16
/** Jobs of fewer weights than this run on the caller alone. */
#define MOE_DEQUANT_MIN_PARALLEL 16384

/** Weights per grab: the unit of work that a thread takes from a job (moe_dequant_pool.c). */
#define MOE_DEQUANT_GRAB_WEIGHTS 32768

/** A pool of dequantization workers (moe_dequant_pool.c): the public ::mmoe_moe_pool. */
typedef struct mmoe_moe_pool moe_dequant_pool;

/**
 * The thread count from the environment variable MMOE_DEQUANT_THREADS (1..64, the caller
 * included), or min(online CPUs, ::MOE_DEQUANT_DEFAULT_CAP) when it is unset or empty.
 * @return MMOE_OK, or MMOE_EINVAL naming the variable and its value
 */
mmoe_status moe_dequant_threads_from_env(int *n_threads, mmoe_error *err);

/**
 * Start a pool of @p n_threads - 1 workers (1: none; the caller decodes alone).
 * @return MMOE_OK and the pool in @p out; MMOE_EINVAL (bad count) or MMOE_ENOMEM (allocation
 *         or pthread_create failed; nothing is left running)
 */
mmoe_status moe_dequant_pool_create(int n_threads, moe_dequant_pool **out, mmoe_error *err);

/** Take one more reference to @p p (a layer that uses it). */
void moe_dequant_pool_retain(moe_dequant_pool *p);

/** Drop one reference to @p p; the last one stops and joins the workers and frees it (NULL: no-op). */
void moe_dequant_pool_release(moe_dequant_pool *p);

/** Take @p p for one layer call (blocks while another thread's call holds it; NULL: no-op). */
void moe_dequant_pool_lock(moe_dequant_pool *p);

/** Give @p p back after a layer call (NULL: no-op). */
void moe_dequant_pool_unlock(moe_dequant_pool *p);

/** Threads of @p p including the caller (1 for NULL). */
int moe_dequant_pool_threads(const moe_dequant_pool *p);

/* ------------------------------------------------------------------ fixed-order GEMM */

/** Partial sums ("lanes") of every dot product of the MoE oracle (moe_dot.c). */
#define MOE_DOT_LANES 8

/** Implementations of the fixed-order GEMM (all give the same bits). */
typedef enum moe_dot_isa {
    MOE_DOT_ISA_GENERIC = 0,  /**< the scalar formula (every CPU) */
    MOE_DOT_ISA_AVX2_FMA = 1, /**< x86-64 with AVX2, FMA and F16C */
    MOE_DOT_ISA_AVX512 = 2,   /**< x86-64 with AVX2, FMA and AVX-512 (F, DQ, BW, VL: cpu_avx512.h) */
    MOE_DOT_ISA_COUNT         /**< number of variants */
} moe_dot_isa;

/** A short name of @p isa ("generic", "avx2+fma", "avx512"). */
const char *moe_dot_isa_name(moe_dot_isa isa);

/**
 * 1 if @p isa includes AVX2 and FMA (its kernels may take the AVX2 ones where it has none of
 * its own: an AVX-512 CPU runs them all).
 */
int moe_dot_isa_has_avx2(moe_dot_isa isa);

/** 1 if this CPU (and this build) can run @p isa. */
int moe_dot_isa_runs_here(moe_dot_isa isa);

/** The fastest variant that runs here (the one the oracle uses). */
moe_dot_isa moe_dot_isa_best(void);

/**
 * moe_weight_tile_f32() with the kernels of @p isa (which must run here); the values do not
 * depend on it (an FP4 tile under AVX-512 is looked up sixteen weights at a time).
 * moe_weight_tile_f32() takes moe_dot_isa_best().
 */
void moe_weight_tile_f32_isa(moe_dot_isa isa, const moe_mat *m, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                             float *out);

/**
 * c[t * ldc + j] = sum_k a[t * lda + k] * w[j * ldw + k] for t < @p m, j < @p n, k < @p k, each
 * in the fixed order of moe_dot.c (8 lanes of fmaf in ascending k, then a fixed combine).
 * @p isa must run here (moe_dot_isa_runs_here()); the result does not depend on it.
 */
void moe_dot_gemm(moe_dot_isa isa, const float *a, int64_t lda, int64_t m, const float *w, int64_t ldw, int64_t n,
                  int64_t k, float *c, int64_t ldc);

/**
 * Whether moe_dot_gemm_coded() takes @p w in the registers of @p isa: FP4 (groups of 32), or FP8
 * whose width and scale-block width are multiples of 8, with an FMA kernel.
 */
int moe_dot_coded_in_registers(moe_dot_isa isa, const moe_mat *w);

/**
 * As moe_dot_gemm() with W = rows [r0, r0 + n) of the FP4 or FP8 matrix @p w, decoded on the fly
 * (the same values as moe_weight_tile_f32(), so the same bits): c[t * ldc + j] = a_t . W[r0 + j].
 * In registers where moe_dot_coded_in_registers(), else one decoded row at a time.
 * @return 0, or -1 on allocation failure (the row buffer of the second way)
 */
int moe_dot_gemm_coded(moe_dot_isa isa, const float *a, int64_t lda, int64_t m, const moe_mat *w, int64_t r0,
                       int64_t n, float *c, int64_t ldc);

/**
 * moe_dot_gemm_coded() over all rows of @p w (c[t * ldc + r] = a_t . W[r]) with the rows split
 * over the pool's threads (the caller takes part): each output is computed by the same function
 * on the same operands whatever thread runs it, so the bits are those of one thread.
 * moe_dot_coded_in_registers(isa, w) must hold (the other way allocates and could fail); @p p
 * may be NULL.  Returns when every row is done.  Not reentrant: one job per pool at a time.
 */
void moe_pool_gemm_coded(moe_dequant_pool *p, moe_dot_isa isa, const float *a, int64_t lda, int64_t tokens,
                         const moe_mat *w, float *c, int64_t ldc);

/**
 * The work on rows [r0, r1) of a moe_pool_rows() job, done by thread @p thread (0: the caller,
 * 1 .. threads - 1: the workers; the index selects per-thread scratch the caller prepared).  It
 * cannot fail: whatever can fail is done before the job.
 */
typedef void (*moe_rows_fn)(void *ctx, int thread, int64_t r0, int64_t r1);

/**
 * Run @p fn over rows [0, @p nr) split into grabs of about ::MOE_DEQUANT_GRAB_WEIGHTS weights
 * of @p row_weights each (a multiple of @p align rows, the last grab excepted), taken by the
 * pool's threads and the caller; returns when every row is done.  A job too small to share, or
 * a NULL or one-thread pool, runs on the caller alone (thread 0).  Each row's result must not
 * depend on which thread computes it or on the grab it falls in; then the bits are those of one
 * thread.  It holds the pool's run lock (moe_dequant_pool_lock()) for the job, so calls from
 * several threads take turns; it must not be called while that lock is held.
 */
void moe_pool_rows(moe_dequant_pool *p, int64_t nr, int64_t row_weights, int64_t align, moe_rows_fn fn, void *ctx);

/** moe_pool_rows() for a caller that holds the pool's run lock already (a MoE layer's call). */
void moe_pool_rows_held(moe_dequant_pool *p, int64_t nr, int64_t row_weights, int64_t align, moe_rows_fn fn,
                        void *ctx);

/** The scale of weight (r, c) of an FP8 matrix: its block's UE8M0 or F32 scale. */
float moe_fp8_block_scale(const moe_mat *m, int64_t r, int64_t c);

/* ------------------------------------------------------------------ expert GEMMs */

/** Scratch for the tiled GEMMs (grown on demand, owned by the layer). */
typedef struct moe_scratch {
    float *tile;     /**< dequantized weight tile */
    size_t tile_cap; /**< floats allocated in tile */
    float *xg;       /**< gathered activations [m, D] */
    size_t xg_cap;   /**< floats allocated in xg */
    float *gate;     /**< L1 gate accumulators [m, I], then the L2 input */
    size_t gate_cap; /**< floats allocated in gate */
    float *up;       /**< L1 up accumulators [m, I] */
    size_t up_cap;   /**< floats allocated in up */
    float *yl2;      /**< L2 accumulators [m, D] */
    size_t yl2_cap;  /**< floats allocated in yl2 */
    moe_dequant_pool *pool; /**< the layer's dequantization workers (borrowed; NULL: caller only) */
} moe_scratch;

/** Grow @p *buf to at least @p n floats. @return 0 on success, -1 on allocation failure. */
int moe_scratch_reserve(float **buf, size_t *cap, size_t n);

/** Free every buffer of @p s. */
void moe_scratch_free(moe_scratch *s);

/** Dequantization / GEMM timers of one call (seconds, accumulated). */
typedef struct moe_gemm_clock {
    double dequant_s; /**< the caller's time in moe_weight_tile_f32 (the other threads do the same mix) */
    double gemm_s;    /**< the rest of the GEMMs' wall time */
    double flops;     /**< 2*M*N*K performed */
} moe_gemm_clock;

/**
 * out[m, rows(W)] = a[m, K] . W^T, every element in the fixed order of moe_dot.c (so the
 * result depends neither on m nor on the padding of rows(W) or of K).
 * @return 0, or -1 on allocation failure
 */
int moe_expert_gemm(const moe_mat *w, const float *a, int64_t m, float *out, moe_scratch *s, moe_gemm_clock *clk);

/* ------------------------------------------------------------------ L1 epilogue */

/**
 * The L1 epilogue of @p m token rows: from the FP32 accumulators gate/up [m, n] to the
 * dequantized L2 input a_q [m, n] (written into @p gate), with routing weights @p w [m]
 * (NULL: weight 1, the shared expert).
 * @param rules  the recipe's epilogue rules
 * @param math   precise or fast
 * @param limit  swiglu_limit (0 or inf: no clamp)
 * @param gate   [m, n] gate accumulators in, dequantized L2 input out
 * @param up     [m, n] up accumulators
 * @param m      token rows
 * @param n      intermediate channels (a multiple of the requant group)
 * @param w      [m] routing weights, or NULL
 */
void moe_l1_epilogue(const moe_epilogue_rules *rules, mmoe_moe_math math, float limit,
                     float *gate, const float *up, int64_t m, int64_t n, const float *w);

/** The SwiGLU of one element as the epilogue computes it (exposed for the tests). */
float moe_swiglu_one(const moe_epilogue_rules *rules, mmoe_moe_math math, float limit, float g,
                     float u, float w);

/* ------------------------------------------------------------------ router */

/**
 * Route @p t tokens: FP32 logits x . W_g^T, sqrtsoftplus, selection (biased top-k, ties to the
 * lower id; or tid2eid), renormalization and routed scaling.
 * @param desc    the layer description (E, D, topk, routing, scaling)
 * @param t       tokens
 * @param err     error report (token id out of range, no token ids, out of memory)
 * @param x       [t, D] the BF16 input widened to FP32 (exact)
 * @param gate    [E, D] BF16 gate weight
 * @param bias    [E] F32 selection bias, or NULL
 * @param tid2eid hash routing table (I32 or I64 view)
 * @param token_ids [t] token ids (hash routing)
 * @param idx     [t, topk] out: expert ids
 * @param wts     [t, topk] out: routing weights
 * @param logits  scratch [t, E] floats (the scores on return)
 */
mmoe_status moe_route(const mmoe_moe_desc *desc, const float *x, int64_t t, const uint16_t *gate,
                      const float *bias, const mmoe_tensor *tid2eid, const int32_t *token_ids,
                      int64_t *idx, float *wts, float *logits, mmoe_error *err);

/** sqrt(softplus(z)) in FP32 with torch's threshold 20. */
float moe_sqrtsoftplus(float z);

/**
 * Select top-k of @p sel [n] (descending; ties to the lower index) into @p idx [k].
 * NaN scores are never selected before a number.
 */
void moe_topk_select(const float *sel, int64_t n, int k, int64_t *idx);

/* ------------------------------------------------------------------ combine */

/**
 * Combine one token: sum its slot outputs in FP32 from zero in the recipe's order, the shared
 * output last, and store BF16.
 * @param order    slot or expert-id order
 * @param topk     slots of the token
 * @param idx      [topk] expert ids (-1 masked)
 * @param slot_y   [topk] pointers to BF16 rows [D] (unused for masked slots)
 * @param shared_y BF16 row [D] or NULL
 * @param d        row length D
 * @param y        the BF16 output row [D]
 */
void moe_combine_token(moe_combine_order order, int topk, const int64_t *idx,
                       const uint16_t *const *slot_y, const uint16_t *shared_y, int64_t d,
                       uint16_t *y);

/* ------------------------------------------------------------------ the layer object */

/** The layer (opaque in the public header). */
struct mmoe_moe_layer {
    mmoe_moe_desc desc;          /**< the description (copied) */
    int has_weights;             /**< set by set_weights */
    int64_t inter_used;          /**< routed width after padding */
    int64_t shared_inter_used;   /**< width of one shared expert after padding */
    const uint16_t *gate;        /**< [E, D] BF16 (borrowed) */
    const float *bias;           /**< [E] or NULL (borrowed) */
    mmoe_tensor tid2eid;         /**< hash table view (borrowed) */
    moe_expert *experts;         /**< [E] */
    moe_expert shared;           /**< the shared MLP (S * shared_inter_used wide) */
    moe_mat shared_fused_w1;     /**< shared W1 with 1x32 expanded scales (fused path) */
    moe_mat shared_fused_w3;     /**< shared W3 with 1x32 expanded scales (fused path) */
    moe_mat shared_fused_w2;     /**< shared W2 with 1x32 expanded scales (fused path) */
    int shared_fused_ready;      /**< 1 when the expanded scales exist */
    mmoe_moe_shared_facts shared_facts; /**< dtype and scale facts of the shared weights (set_weights) */
    size_t gate_bytes;           /**< bytes of the gate views */
    size_t owned_bytes;          /**< weight bytes owned now */
    size_t owned_peak_bytes;     /**< weight bytes owned at the peak */
    int64_t *counters;           /**< [E] cumulative received pairs */
    moe_scratch scratch;         /**< GEMM scratch */
    moe_dequant_pool *dequant_pool; /**< dequantization workers (one reference; own or shared pool) */
};

/** Account @p delta owned bytes (positive: allocated; negative: freed) and update the peak. */
void moe_layer_account(mmoe_moe_layer *layer, long long delta);

/** Borrowed bytes of all weight views. */
size_t moe_layer_borrowed_bytes(const mmoe_moe_layer *layer);

/* ------------------------------------------------------------------ weights, padding, shared */

/** Validate @p w against @p desc (dtypes, shapes, scale bytes != 255, tid2eid range). */
mmoe_status moe_weights_validate(const mmoe_moe_desc *desc, const mmoe_moe_weights *w, mmoe_error *err);

/** Build the moe_mat views of validated weights (FP4 routed / FP8 shared). */
void moe_mat_from_fp4(moe_mat *m, const mmoe_tensor *w, const mmoe_tensor *sf);
/** As moe_mat_from_fp4() for an FP8 matrix with B x B block scales. */
void moe_mat_from_fp8(moe_mat *m, const mmoe_tensor *w, const mmoe_tensor *sf, int64_t block);

/**
 * Pad @p m: rows to @p new_rows and/or cols to @p new_cols (zero weights, unit scales), as one
 * new owned buffer each for w and sf; the old owned buffers are freed.  @p row_groups /
 * @p col_groups > 1 pad each of that many equal groups (the S shared experts) separately.
 * @return MMOE_OK, MMOE_ENOMEM or MMOE_EUNSUPPORTED (a group not a multiple of the scale block)
 */
mmoe_status moe_pad_mat(mmoe_moe_layer *layer, moe_mat *m, int64_t new_rows, int64_t new_cols,
                        int row_groups, int col_groups, mmoe_error *err);

/** Decide the shared path for the layer's current weights: mmoe_moe_shared_plan() on its facts. */
mmoe_moe_path moe_shared_decide(const mmoe_moe_layer *layer, mmoe_moe_fallback *fb, char *reason);

/** Build the 1x32 expanded shared scales for the fused path (owned).  MMOE_ENOMEM on failure. */
mmoe_status moe_shared_expand(mmoe_moe_layer *layer, mmoe_error *err);

/** Free the expanded shared scales. */
void moe_shared_release(mmoe_moe_layer *layer);


#endif /* MOE_INTERNAL_H */
