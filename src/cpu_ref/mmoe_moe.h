/**
 * @file mmoe_moe.h
 * @brief One DeepSeek-V4 MoE layer ("Mega MoE": FP8 activations x MXFP4 experts): description,
 *        weights, layer object, run inputs and the result of a call.
 *
 * This is the public, backend-neutral interface of the fused MoE layer.  The CPU oracle
 * (src/cpu_ref/moe_*.c) implements it; the GPU path fills the same ::mmoe_moe_result, so a
 * caller (the forward pass, the CLI, a test) can switch backends without changing code.
 *
 * ## What the layer computes
 *
 *     x (BF16 [T, D])
 *       router: s = sqrtsoftplus(x W_g^T) (FP32); top-k of s + bias (ties: lower expert id);
 *               w = s[idx] / sum(s[idx]) * routed_scaling_factor      (or tid2eid[token] on hash layers)
 *       per (token, slot) routed to expert e, and per token for the shared expert (weight 1):
 *               L1  = x_q . [W1_e; W3_e]^T           (FP8 x MXFP4, FP32 accumulators)
 *               a   = silu(min(g, c)) * clamp(u, -c, c) * w            (c = swiglu_limit)
 *               a_q = FP8(a)                                            (recipe's scales)
 *               y_e = BF16(a_q . W2_e^T)
 *       combine: y_t = BF16(sum of the slots' y_e in FP32, shared last)
 *
 * Exactly *where* each value is rounded is the **recipe** (::mmoe_moe_recipe); the rounding
 * points of each recipe are the table @ref spec_moe_recipes.
 *
 * ## Weights: checkpoint layout, borrowed
 *
 * ::mmoe_moe_weights holds borrowed ::mmoe_tensor views in the layout of the DeepSeek-V4
 * checkpoint (names in parentheses; each may carry a `layers.L.` prefix):
 *
 * | tensor (checkpoint name)                     | dtype               | shape                          |
 * |----------------------------------------------|---------------------|--------------------------------|
 * | gate (`ffn.gate.weight`)                     | BF16                | [E, D]                         |
 * | gate_bias (`ffn.gate.bias`), biased routing  | F32                 | [E]                            |
 * | tid2eid (`ffn.gate.tid2eid`), hash routing   | I32 or I64          | [vocab, topk]                  |
 * | experts[e].w1/.w3 (`ffn.experts.e.w1.weight`)| I8 or U8 (FP4 x2)   | [I, D/2]                       |
 * | experts[e].w1_scale/.w3_scale (`...scale`)   | F8_E8M0 or U8       | [I, D/32]                      |
 * | experts[e].w2                                | I8 or U8 (FP4 x2)   | [D, I/2]                       |
 * | experts[e].w2_scale                          | F8_E8M0 or U8       | [D, I/32]                      |
 * | shared.w1/.w3 (`ffn.shared_experts.w1...`)   | F8_E4M3             | [Ws, D], Ws = n_shared*shared_inter |
 * | shared.w1_scale/.w3_scale                    | F8_E8M0, U8 or F32  | [ceil(Ws/B), ceil(D/B)]        |
 * | shared.w2                                    | F8_E4M3             | [D, Ws]                        |
 * | shared.w2_scale                              | F8_E8M0, U8 or F32  | [ceil(D/B), ceil(Ws/B)]        |
 *
 * B is ::mmoe_moe_desc::shared_block (128 for V4, 32 for V4.1).  FP4 bytes hold element 2k in
 * the low nibble and 2k+1 in the high nibble; a UE8M0 byte b is 2^(b-127), and 255 (NaN) is
 * rejected.
 *
 * ## Memory
 *
 * The layer object owns every byte it allocates.  Without padding it *borrows* the weight
 * views (zero copy: the caller keeps them alive, e.g. an mmapped checkpoint, until
 * mmoe_moe_layer_destroy()).  With padding (::mmoe_moe_desc::pad_to) each tensor that grows
 * is written once into one owned padded buffer and the view of the original is dropped;
 * no second copy is ever kept.  ::mmoe_moe_memory reports the owned bytes at the peak and at
 * the end.
 *
 * ## Threads
 *
 * A layer may be run by one thread at a time (it keeps scratch buffers and counters).  The
 * GEMMs run on the calling thread, in one fixed summation order.  The dequantization of weight tiles is
 * split over a small pool of worker threads that the layer starts in mmoe_moe_layer_create()
 * and joins in mmoe_moe_layer_destroy(): the environment variable MMOE_DEQUANT_THREADS (1..64,
 * the calling thread included; 1 starts no thread) sets their number, by default the number of
 * online CPUs, at most 16.  The result does not depend on it, bit for bit.
 *
 * Several layers may share one pool (::mmoe_moe_pool, mmoe_moe_layer_create_on_pool()): a model
 * runs its MoE layers one after another, so one pool serves them all.  Layers that share a pool
 * should not run concurrently; if two threads do run them at once, the calls take turns (each
 * call holds the pool for its duration) and give the same bits as when run alone.
 */
#ifndef MMOE_MOE_H
#define MMOE_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/** @name Options of a layer */
/** @{ */

/**
 * The numeric recipe: the column of @ref spec_moe_recipes the layer reproduces.  These values
 * are the reference numbering of the recipes; the GPU layer's ::mmoe_gpu_recipe names the
 * same recipes (plus "auto") and is converted case by case (gpu_layer.c), never by value.
 */
typedef enum mmoe_moe_recipe {
    MMOE_RECIPE_SM100 = 0,    /**< the SM100 fused kernel (FP8 with 1x32 UE8M0 scales) */
    MMOE_RECIPE_SM90 = 1,     /**< the SM90 kernels (FP8 with one FP32 scale per 128 channels) */
    MMOE_RECIPE_DSV4_REF = 2, /**< DeepSeek-V4's reference inference code (FP8 per 128, UE8M0) */
    MMOE_RECIPE_COUNT = 3 /**< number of recipes (not a recipe) */
} mmoe_moe_recipe;

/** Transcendental and division mode of the SwiGLU epilogue. */
typedef enum mmoe_moe_math {
    MMOE_MATH_PRECISE = 0, /**< expf and IEEE division (the oracle's default; reproducible) */
    MMOE_MATH_FAST = 1     /**< the kernel's fast-math structure: exp2f(x*log2e) and a reciprocal-multiply */
} mmoe_moe_math;

/** How the shared expert(s) are computed. */
typedef enum mmoe_moe_shared_mode {
    MMOE_SHARED_AUTO = 0,  /**< fused when the layout allows it, else serial (reason recorded) */
    MMOE_SHARED_FUSED = 1, /**< fused; MMOE_EUNSUPPORTED with the reason when it is not possible */
    MMOE_SHARED_SERIAL = 2 /**< always the serial FP8 linear path (reason "requested") */
} mmoe_moe_shared_mode;

/** Expert selection. */
typedef enum mmoe_moe_routing {
    MMOE_ROUTING_BIASED = 0, /**< top-k of score + bias (noaux_tc; bias for selection only) */
    MMOE_ROUTING_HASH = 1    /**< experts = tid2eid[token_id] (hash layers) */
} mmoe_moe_routing;

/** Score function of the router. */
typedef enum mmoe_moe_scoring {
    MMOE_SCORING_SQRTSOFTPLUS = 0 /**< sqrt(softplus(logit)), softplus(z) = z > 20 ? z : log1p(exp(z)) */
} mmoe_moe_scoring;

/** Largest topk a layer accepts (the fused kernels need topk + 1 <= 32; the oracle allows more). */
#define MMOE_MOE_MAX_TOPK 64

/** The description of a layer: sizes and options.  Initialise with mmoe_moe_desc_init(). */
typedef struct mmoe_moe_desc {
    int64_t hidden;              /**< D: model width; a multiple of 128 */
    int64_t inter;               /**< I: intermediate width of one routed expert; a multiple of 128 */
    int64_t n_experts;           /**< E: routed experts (may be fewer than the model's, for tests) */
    int topk;                    /**< experts per token (1..min(E, MMOE_MOE_MAX_TOPK)) */
    int n_shared;                /**< S: shared experts (0 = none) */
    int64_t shared_inter;        /**< width of one shared expert; the shared weights hold S * shared_inter rows */
    int shared_block;            /**< block size B of the shared FP8 scales (128 for V4, 32 for V4.1) */
    float routed_scaling_factor; /**< multiplies the renormalized routing weights (1.5 Flash, 2.5 Pro) */
    float swiglu_limit;          /**< clamp c of SwiGLU (10 for V4); 0 or +inf: no clamp */
    mmoe_moe_scoring scoring;    /**< score function */
    mmoe_moe_routing routing;    /**< biased top-k or hash */
    int64_t vocab;               /**< hash routing: rows of tid2eid (token ids must be < vocab) */
    mmoe_moe_recipe recipe;      /**< rounding points to reproduce */
    mmoe_moe_math math;          /**< precise or fast SwiGLU */
    mmoe_moe_shared_mode shared_mode; /**< fused, serial or auto */
    int64_t pad_to;              /**< 0: no padding; else pad I (and the shared width) up to a multiple of pad_to (a multiple of 128) */
} mmoe_moe_desc;

/** Fill @p desc with defaults: V4-style options (sqrtsoftplus, biased, sm100, precise, auto,
 *  shared_block 128, swiglu_limit 10, routed_scaling_factor 1) and zero sizes. */
void mmoe_moe_desc_init(mmoe_moe_desc *desc);

/**
 * Fill @p desc with the sizes of a named shape: "v4-flash" (D 4096, I 2048, E 256),
 * "v4-pro" (D 7168, I 3072, E 384), "v4.1-flash" (D 5120, I 2304, E 384, shared_block 32) or
 * "tiny" (D 256, I 256, E 8, topk 2); topk 6 and one shared expert of width I unless stated.
 * @param shape      the shape's name
 * @param n_experts  0 keeps the shape's E; else the number of routed experts (>= topk)
 * @param desc       the description, written on success
 * @param err        error report
 * @return MMOE_OK, or MMOE_EINVAL naming the unknown shape
 */
mmoe_status mmoe_moe_desc_from_shape(const char *shape, int64_t n_experts, mmoe_moe_desc *desc,
                                     mmoe_error *err);

/** Check a description (sizes, alignments, enum values); the error names the field. */
mmoe_status mmoe_moe_desc_validate(const mmoe_moe_desc *desc, mmoe_error *err);

/** "sm100", "sm90", "dsv4-ref" ("?" for an invalid value). */
const char *mmoe_moe_recipe_name(mmoe_moe_recipe recipe);
/** Parse a recipe name; MMOE_EINVAL (message lists the names) if unknown. */
mmoe_status mmoe_moe_recipe_from_name(const char *name, mmoe_moe_recipe *out, mmoe_error *err);
/** "auto", "fused", "serial". */
const char *mmoe_moe_shared_mode_name(mmoe_moe_shared_mode mode);
/** Parse a shared-mode name; MMOE_EINVAL if unknown. */
mmoe_status mmoe_moe_shared_mode_from_name(const char *name, mmoe_moe_shared_mode *out, mmoe_error *err);
/** @} */

/* ------------------------------------------------------------------------------------------ */
/** @name Weights (borrowed views in checkpoint layout) */
/** @{ */

/** The six tensors of one expert (routed: FP4 + UE8M0 1x32; shared: FP8 + BxB block scales). */
typedef struct mmoe_moe_expert_weights {
    mmoe_tensor w1;       /**< gate projection */
    mmoe_tensor w1_scale; /**< its scales */
    mmoe_tensor w3;       /**< up projection */
    mmoe_tensor w3_scale; /**< its scales */
    mmoe_tensor w2;       /**< down projection */
    mmoe_tensor w2_scale; /**< its scales */
} mmoe_moe_expert_weights;

/** All weights of a layer; views only (see the table in the file comment). */
typedef struct mmoe_moe_weights {
    mmoe_tensor gate;                       /**< [E, D] BF16 */
    mmoe_tensor gate_bias;                  /**< [E] F32 (biased routing; data NULL = zero bias) */
    mmoe_tensor tid2eid;                    /**< [vocab, topk] I32/I64 (hash routing) */
    const mmoe_moe_expert_weights *experts; /**< array of E routed experts */
    mmoe_moe_expert_weights shared;         /**< the S shared experts as one MLP of width S*shared_inter (ignored when S = 0) */
} mmoe_moe_weights;

/**
 * Look a tensor up by its full name (e.g. "layers.3.ffn.experts.7.w1.weight").
 * @return MMOE_OK and the view in @p out, MMOE_ENOTFOUND if absent (then the loader tries
 *         the other prefix form), or another status with @p err set.
 */
typedef mmoe_status (*mmoe_moe_lookup_fn)(void *ctx, const char *name, mmoe_tensor *out, mmoe_error *err);
/** @} */

/* ------------------------------------------------------------------------------------------ */
/** @name The layer object */
/** @{ */

/** Opaque layer: description, weights (borrowed or owned padded copies), scratch, counters. */
typedef struct mmoe_moe_layer mmoe_moe_layer;

/** Weight memory of a layer, in bytes. */
typedef struct mmoe_moe_memory {
    size_t borrowed_bytes;   /**< bytes of weight views the layer reads but does not own */
    size_t owned_bytes;      /**< weight bytes the layer owns now (padded copies, expanded scales) */
    size_t owned_peak_bytes; /**< the largest owned_bytes ever reached while setting/padding weights */
    size_t scratch_bytes;    /**< scratch (activations, dequantized tiles) currently allocated */
} mmoe_moe_memory;

/**
 * Create a layer for @p desc (copied).  No weights yet.
 * @param desc the description (validated)
 * @param out  receives the layer; NULL on failure
 * @param err  error report
 * @return MMOE_OK, MMOE_EINVAL (invalid description, field named; or an invalid
 *         MMOE_DEQUANT_THREADS, named) or MMOE_ENOMEM (also when a dequantization thread
 *         cannot be started)
 */
mmoe_status mmoe_moe_layer_create(const mmoe_moe_desc *desc, mmoe_moe_layer **out, mmoe_error *err);

/**
 * A pool of dequantization worker threads that several layers may share (reference-counted).
 * It runs one layer call at a time: mmoe_moe_layer_run() holds it for the whole call, so
 * layers sharing a pool that are run from two threads at once are serialized, not corrupted.
 */
typedef struct mmoe_moe_pool mmoe_moe_pool;

/**
 * Start a pool of @p n_threads threads, the caller of each layer call included (n_threads - 1
 * worker threads are created; 1: none).
 * @param n_threads 1..64, or 0: MMOE_DEQUANT_THREADS, or by default the online CPUs (at most 16)
 * @param out       receives the pool (the caller's reference); NULL on failure
 * @param err       error report
 * @return MMOE_OK, MMOE_EINVAL (bad count, or invalid MMOE_DEQUANT_THREADS, named) or
 *         MMOE_ENOMEM (also when a thread cannot be started; nothing is left running)
 */
mmoe_status mmoe_moe_pool_create(int n_threads, mmoe_moe_pool **out, mmoe_error *err);

/**
 * Drop the caller's reference to @p pool (NULL: no-op).  Layers created on it keep their own
 * references: the threads are joined when the last of them is destroyed.
 */
void mmoe_moe_pool_destroy(mmoe_moe_pool *pool);

/** Threads of @p pool including the caller's (1 for NULL). */
int mmoe_moe_pool_threads(const mmoe_moe_pool *pool);

/**
 * The CPU kernels the oracle runs on this machine: "avx512" (x86-64 with AVX2, FMA and AVX-512
 * F, DQ, BW and VL), "avx2+fma" (x86-64 with AVX2, FMA and F16C), else "generic" (the scalar
 * definitions, slower).  All give the same bits; benchmarks report it.
 */
const char *mmoe_cpu_kernels(void);

/**
 * Create a layer for @p desc (copied) that decodes its weight tiles on @p pool instead of a pool
 * of its own; the layer takes a reference to the pool (the caller may destroy its own reference
 * at any time).  Results are bit-identical to mmoe_moe_layer_create()'s layer.
 * @param desc the description (validated)
 * @param pool the shared pool (required)
 * @param out  receives the layer; NULL on failure
 * @param err  error report
 * @return MMOE_OK, MMOE_EINVAL (invalid description, field named; NULL pool) or MMOE_ENOMEM
 */
mmoe_status mmoe_moe_layer_create_on_pool(const mmoe_moe_desc *desc, mmoe_moe_pool *pool, mmoe_moe_layer **out,
                                         mmoe_error *err);

/**
 * Attach the weights.  Every view is checked (dtype, shape, scale byte 255 rejected) before
 * anything is kept; on error the layer keeps no weights.  Unpadded tensors are borrowed;
 * tensors that pad_to widens are copied once into an owned padded buffer (zero weights,
 * unit scales = byte 127).
 * @return MMOE_OK, MMOE_EDTYPE / MMOE_ESHAPE / MMOE_ERANGE naming the tensor, MMOE_ENOMEM
 */
mmoe_status mmoe_moe_layer_set_weights(mmoe_moe_layer *layer, const mmoe_moe_weights *weights,
                                       mmoe_error *err);

/**
 * Attach the weights from a checkpoint through @p lookup, with the DeepSeek-V4 names
 * `ffn.gate.weight`, `ffn.gate.bias` | `ffn.gate.tid2eid`, `ffn.experts.E.w1|w2|w3.weight|.scale`,
 * `ffn.shared_experts.w1|w2|w3.weight|.scale`.
 * @param layer        the layer (its description gives E, routing, shared experts)
 * @param lookup       the name resolver
 * @param ctx          passed to @p lookup
 * @param layer_index  L >= 0: names are tried as `layers.L.<name>` first, then bare;
 *                     -1: bare names only
 * @param err          error report
 * @return as mmoe_moe_layer_set_weights(); MMOE_ENOTFOUND naming the missing tensor
 */
mmoe_status mmoe_moe_layer_load(mmoe_moe_layer *layer, mmoe_moe_lookup_fn lookup, void *ctx,
                                int layer_index, mmoe_error *err);

/**
 * Resolve the weight views of one layer through @p lookup (the names of
 * mmoe_moe_layer_load()) without attaching them to a layer: for backends that take an
 * ::mmoe_moe_weights themselves (the GPU layer).  The views borrow whatever @p lookup returns;
 * @p w->experts is an array allocated here, released by mmoe_moe_weights_release().
 * @return MMOE_OK; MMOE_ENOTFOUND naming the missing tensor; MMOE_ENOMEM
 */
mmoe_status mmoe_moe_weights_lookup(const mmoe_moe_desc *desc, mmoe_moe_lookup_fn lookup, void *ctx,
                                    int layer_index, mmoe_moe_weights *w, mmoe_error *err);

/** Free what mmoe_moe_weights_lookup() allocated (the experts array; the views stay borrowed). */
void mmoe_moe_weights_release(mmoe_moe_weights *w);

/**
 * Pad a layer that already has weights: I up to a multiple of @p pad_to and the shared width
 * to the padded routed width (when they were equal), one tensor at a time (allocate the padded
 * buffer, copy, release the original if owned).  The output is bit-identical to the unpadded
 * layer for every recipe.  0 or the current width: no-op.
 */
mmoe_status mmoe_moe_layer_pad(mmoe_moe_layer *layer, int64_t pad_to, mmoe_error *err);

/** Free the layer and everything it owns.  NULL is allowed. */
void mmoe_moe_layer_destroy(mmoe_moe_layer *layer);

/** The layer's description (pad_to as requested; see ::mmoe_moe_result for the padded widths). */
const mmoe_moe_desc *mmoe_moe_layer_desc(const mmoe_moe_layer *layer);

/** Cumulative received (token, slot) pairs per routed expert over all calls: [E], owned by the layer. */
const int64_t *mmoe_moe_layer_counters(const mmoe_moe_layer *layer);

/** Weight memory accounting (see ::mmoe_moe_memory). */
void mmoe_moe_layer_memory(const mmoe_moe_layer *layer, mmoe_moe_memory *out);
/** @} */

/* ------------------------------------------------------------------------------------------ */
/** @name A call */
/** @{ */

/** Inputs of one call.  All host pointers, row-major, borrowed for the call only. */
typedef struct mmoe_moe_input {
    int64_t n_tokens;            /**< T >= 0 */
    const uint16_t *x;           /**< [T, D] BF16 bit patterns */
    const int32_t *token_ids;    /**< [T] token ids (hash routing only; NULL otherwise) */
    const int64_t *topk_idx;     /**< [T, topk] precomputed expert ids, -1 = masked slot; NULL: route */
    const float *topk_weights;   /**< [T, topk] routing weights (routed scaling already applied) with topk_idx */
} mmoe_moe_input;

/** Outputs of one call (caller-allocated). */
typedef struct mmoe_moe_output {
    uint16_t *y;                 /**< [T, D] BF16, always written */
    int64_t *topk_idx;           /**< [T, topk] the routing used (NULL: not wanted) */
    float *topk_weights;         /**< [T, topk] the routing weights used (NULL: not wanted) */
} mmoe_moe_output;

/** How the shared expert was computed in a call. */
typedef enum mmoe_moe_path {
    MMOE_PATH_NONE = 0,  /**< the layer has no shared expert */
    MMOE_PATH_FUSED = 1, /**< one more combine slot in the recipe's activation format */
    MMOE_PATH_SERIAL = 2 /**< DeepSeek's plain FP8 linear (per-128 activations), added last */
} mmoe_moe_path;

/** Why the shared expert was not fused (MMOE_FALLBACK_NONE when it was, or when S = 0). */
typedef enum mmoe_moe_fallback {
    MMOE_FALLBACK_NONE = 0,         /**< fused (or nothing to fuse) */
    MMOE_FALLBACK_REQUESTED,        /**< shared_mode = serial */
    MMOE_FALLBACK_TOPK_LIMIT,       /**< topk + 1 > 32 combine slots */
    MMOE_FALLBACK_SHARED_DTYPE,     /**< shared weights not F8_E4M3 */
    MMOE_FALLBACK_SCALE_BLOCK,      /**< shared scale block not a multiple of 32 */
    MMOE_FALLBACK_SCALE_NOT_POW2,   /**< an F32 shared scale is not a power of two (no UE8M0 form) */
    MMOE_FALLBACK_SHARED_WIDTH,     /**< S*shared_inter not a multiple of the (padded) routed I */
    MMOE_FALLBACK_COUNT             /**< number of reasons (not a reason) */
} mmoe_moe_fallback;

/** Per-stage wall-clock times of one call, in seconds. */
typedef struct mmoe_moe_timings {
    double route_s;    /**< router (logits, scores, top-k) */
    double quant_s;    /**< input activation quantization */
    double dequant_s;  /**< weight dequantization (tiles) */
    double gemm_s;     /**< GEMMs of routed and shared experts */
    double epilogue_s; /**< SwiGLU + weight + requant */
    double combine_s;  /**< combine and the BF16 store */
    double total_s;    /**< the whole call */
} mmoe_moe_timings;

/** Length of ::mmoe_moe_result::fallback_reason. */
#define MMOE_MOE_REASON_LEN 256

/** The result of a call: status, chosen path, counters, timings.  Backend-neutral. */
typedef struct mmoe_moe_result {
    mmoe_status status;            /**< the call's status (also returned) */
    mmoe_error error;              /**< the message when status != MMOE_OK */
    const char *backend;           /**< "cpu" or "gpu" (static string) */
    mmoe_moe_recipe recipe;        /**< recipe used */
    mmoe_moe_math math;            /**< math mode used */
    mmoe_moe_path shared_path;     /**< none, fused or serial */
    mmoe_moe_fallback fallback;    /**< why not fused (NONE if fused or no shared expert) */
    char fallback_reason[MMOE_MOE_REASON_LEN]; /**< human-readable reason; "" when fused */
    int padded;                    /**< 1 if routed or shared weights are padded */
    int64_t inter_used;            /**< routed width the GEMMs ran with (padded I) */
    int64_t shared_inter_used;     /**< total shared width the GEMMs ran with (padded S*shared_inter) */
    int64_t n_tokens;              /**< T of this call */
    int64_t routed_pairs;          /**< unmasked (token, slot) pairs of this call */
    int64_t active_experts;        /**< routed experts that received at least one token */
    /** Optional, caller-owned [E]: this call's per-expert counts are ADDED into it (like the
     *  kernel's cumulative_local_expert_recv_stats).  NULL: not wanted. */
    int64_t *expert_recv_stats;
    double gemm_flops;             /**< 2*M*N*K summed over the GEMMs of the call, at the widths they ran with (padding included) */
    mmoe_moe_timings time;         /**< per-stage times */
} mmoe_moe_result;

/** Zero @p result (expert_recv_stats = NULL, backend "cpu"); set expert_recv_stats afterwards.
 *  mmoe_moe_layer_run() resets every other field itself and keeps expert_recv_stats. */
void mmoe_moe_result_init(mmoe_moe_result *result);

/** "none", "fused", "serial". */
const char *mmoe_moe_path_name(mmoe_moe_path path);

/**
 * Run the layer on @p in and write @p out.  Routing comes from @p in->topk_idx when given,
 * else from the router (hash layers need token_ids).  Masked slots (-1) are skipped; a token
 * with every slot masked and no shared expert gets y = 0.  The per-expert counters of the
 * layer (and result->expert_recv_stats) are incremented by the received pairs.
 * @param layer   the layer (with weights)
 * @param in      the inputs of the call
 * @param out     the outputs (caller-allocated)
 * @param result  optional (NULL allowed); filled with status, path, reason, counters, times
 * @param err     error report (may be NULL)
 * @return MMOE_OK; MMOE_EINVAL (bad input: expert id out of range, token id >= vocab, NaN
 *         routing weight, missing token_ids), MMOE_ENOMEM; the message is in @p err and in result
 */
mmoe_status mmoe_moe_layer_run(mmoe_moe_layer *layer, const mmoe_moe_input *in,
                               const mmoe_moe_output *out, mmoe_moe_result *result, mmoe_error *err);

/**
 * Which shared path a run would take with the current weights, and why (without running);
 * MMOE_PATH_NONE for a layer without shared experts or without weights yet.
 * @param layer     the layer (with weights)
 * @param fallback  optional: the reason code
 * @param reason    optional buffer of MMOE_MOE_REASON_LEN bytes
 */
mmoe_moe_path mmoe_moe_layer_shared_plan(const mmoe_moe_layer *layer, mmoe_moe_fallback *fallback,
                                         char *reason);

/** What decides whether the shared expert can be fused; every backend fills it from its weights. */
typedef struct mmoe_moe_shared_facts {
    mmoe_dtype dtype;       /**< F8_E4M3 when all three shared weights are; else the first other dtype */
    int scales_ue8m0;       /**< 1 when every shared block scale has an exact UE8M0 byte */
    int64_t width_used;     /**< S * shared_inter after padding */
    int64_t inter_used;     /**< the routed I after padding */
} mmoe_moe_shared_facts;

/**
 * The UE8M0 byte of scale @p i of a scale tensor: the byte itself (F8_E8M0, U8), or for an F32
 * scale its exact UE8M0 form (a power of two in [2^-127, 2^127]); -1 when it has none.
 */
int mmoe_moe_scale_ue8m0_byte(const mmoe_tensor *sc, int64_t i);

/** Fill @p f from the shared expert's weight views @p shared and the widths after padding. */
void mmoe_moe_shared_facts_of(const mmoe_moe_expert_weights *shared, int64_t inter_used, int64_t width_used,
                              mmoe_moe_shared_facts *f);

/**
 * The shared-expert plan of both backends: fused, or serial with the first reason that forbids
 * fusion, in the order of ::mmoe_moe_fallback (@ref spec_moe_shared).  A layer without shared
 * experts (n_shared 0) gives MMOE_PATH_NONE.
 * @param d         the description (shared_mode, topk, shared_block, n_shared)
 * @param f         the facts of the weights
 * @param fallback  optional: the reason code
 * @param reason    optional buffer of MMOE_MOE_REASON_LEN bytes ("" when fused)
 */
mmoe_moe_path mmoe_moe_shared_plan(const mmoe_moe_desc *d, const mmoe_moe_shared_facts *f,
                                   mmoe_moe_fallback *fallback, char *reason);
/** @} */

#ifdef __cplusplus
}
#endif
#endif /* MMOE_MOE_H */
