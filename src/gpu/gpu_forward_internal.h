/**
 * @file gpu_forward_internal.h
 * @brief The host-side description of a model that gpu_forward_load.c builds from a loaded CPU model
 *        and gpu_forward.cu uploads: plain C structs of borrowed host pointers, readable from C and CUDA.
 *
 * The loader (C) is the only code that reads the CPU model's private structures; the CUDA file
 * sees only these structs.  Every pointer borrows the CPU model's mapping, except the few
 * arrays the loader converts (the members marked "owned") which gfw_model_src_free() frees.
 */
#ifndef MMOE_GPU_FORWARD_INTERNAL_H
#define MMOE_GPU_FORWARD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_gpu_forward.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Element type of a dense (non-FP8-linear) weight or vector. */
typedef enum gfw_dtype {
    GFW_BF16 = 0, /**< bf16 bit patterns */
    GFW_F32 = 1,  /**< fp32 */
    GFW_F8 = 2    /**< E4M3 bytes with E8M0 block scales (dense use: dequantized and rounded to bf16) */
} gfw_dtype;

/** A dense weight [rows, cols] (or a vector: rows = 1). */
typedef struct gfw_dense {
    gfw_dtype dtype;       /**< element type */
    const void *data;      /**< host bytes (NULL: absent) */
    const uint8_t *scale;  /**< GFW_F8 only: E8M0 bytes [ceil(rows/block), ceil(cols/block)] */
    int64_t rows, cols;    /**< shape */
    /** @var gfw_dense::rows
     *  shape: rows */
    int block;             /**< GFW_F8 only: scale block edge */
} gfw_dense;

/** An FP8 block-scaled linear: E4M3 [N, K] with E8M0 scales [ceil(N/b), ceil(K/b)]. */
typedef struct gfw_fp8 {
    const uint8_t *w;      /**< codes (NULL: absent) */
    const uint8_t *scale;  /**< scale bytes */
    int64_t N, K;          /**< output and input width */
    /** @var gfw_fp8::N
     *  output width */
    int block;             /**< b */
} gfw_fp8;

/** One mHC site: fn [n_out, hc*D], base [n_out], scale [3] or [1], fp32. */
typedef struct gfw_hc {
    const float *fn, *base, *scale;
    /** @var gfw_hc::fn
     *  [n_out, hc*D]
     *  @var gfw_hc::base
     *  [n_out]
     *  @var gfw_hc::scale
     *  [n_scale] */
    int n_out;             /**< (2+hc)*hc for a sub-layer, hc for a head */
    int n_scale;           /**< 3 or 1 */
} gfw_hc;

/** One compressor (attention: dh = head_dim; indexer: dh = index_head_dim). */
typedef struct gfw_compressor {
    gfw_dense wkv, wgate;  /**< [c*dh, D] BF16 or F32 */
    /** @var gfw_compressor::wkv
     *  kv projection [c*dh, D] BF16 or F32 */
    const float *ape;      /**< [ratio, c*dh] */
    gfw_dense norm;        /**< [dh] */
} gfw_compressor;

/** The MoE of one block (recipe dsv4-ref, serial shared expert: the oracle's model MoE). */
typedef struct gfw_moe {
    int64_t n_experts, inter, topk;  /**< E, I, k */
    /** @var gfw_moe::n_experts
     *  E, routed experts
     *  @var gfw_moe::inter
     *  I, an expert's intermediate width */
    int hash;                        /**< 1: experts = tid2eid[token] */
    float route_scale;               /**< routed_scaling_factor */
    float swiglu_limit;              /**< clamp c (<= 0 or inf: none) */
    const uint16_t *gate;            /**< bf16 [E, D] */
    const float *bias;               /**< [E] or NULL */
    int32_t *tid2eid;                /**< owned [vocab, k] (hash layers), converted to int32 */
    int64_t vocab;                   /**< rows of tid2eid */
    const uint8_t **w1, **w3, **w2;  /**< owned arrays of [E] borrowed pointers: packed E2M1 */
    const uint8_t **s1, **s3, **s2;  /**< owned arrays of [E] borrowed pointers: UE8M0 1x32 */
    /** @var gfw_moe::w1
     *  gate weights: owned array of [E] borrowed pointers, packed E2M1
     *  @var gfw_moe::w3
     *  up weights: owned array of [E] borrowed pointers, packed E2M1
     *  @var gfw_moe::s1
     *  scales of w1: owned array of [E] borrowed pointers, UE8M0 1x32
     *  @var gfw_moe::s3
     *  scales of w3: owned array of [E] borrowed pointers, UE8M0 1x32 */
    int64_t shared_width;            /**< S * shared_inter (0: none) */
    const uint8_t *sw1, *sw3, *sw2;  /**< shared FP8 [Ws, D], [Ws, D], [D, Ws] */
    float *ss1, *ss3, *ss2;          /**< owned fp32 block scales (converted from E8M0/U8/F32) */
    /** @var gfw_moe::sw1
     *  shared gate weights, FP8 [Ws, D]
     *  @var gfw_moe::sw3
     *  shared up weights, FP8 [Ws, D]
     *  @var gfw_moe::ss1
     *  owned fp32 block scales of sw1
     *  @var gfw_moe::ss3
     *  owned fp32 block scales of sw3 */
    int shared_block;                /**< B of the shared scales */
} gfw_moe;

/** The shapes of one block's attention. */
typedef struct gfw_attn_dims {
    int D, H, d, rope_dim, q_lora, G, o_lora, window, ratio, ih, id, topk, weight_block;
    float eps;
    /** @var gfw_attn_dims::D
     *  model width
     *  @var gfw_attn_dims::H
     *  attention heads
     *  @var gfw_attn_dims::d
     *  head dimension
     *  @var gfw_attn_dims::rope_dim
     *  rotary dimensions of a head
     *  @var gfw_attn_dims::q_lora
     *  query low-rank width
     *  @var gfw_attn_dims::G
     *  output projection groups
     *  @var gfw_attn_dims::o_lora
     *  output low-rank width per group
     *  @var gfw_attn_dims::window
     *  sliding window in positions
     *  @var gfw_attn_dims::ratio
     *  compression ratio (0: none)
     *  @var gfw_attn_dims::ih
     *  indexer heads
     *  @var gfw_attn_dims::id
     *  indexer head dimension
     *  @var gfw_attn_dims::topk
     *  compressed blocks the indexer selects
     *  @var gfw_attn_dims::weight_block
     *  FP8 weight scale block edge
     *  @var gfw_attn_dims::eps
     *  RMSNorm epsilon */
} gfw_attn_dims;

/** One transformer block (main layer or MTP block). */
typedef struct gfw_block_src {
    gfw_attn_dims a;                 /**< shapes */
    float freqs[128];                /**< the layer's rope_dim/2 RoPE frequencies (oracle's table) */
    gfw_hc hc_attn, hc_ffn;          /**< mHC sites */
    /** @var gfw_block_src::hc_attn
     *  mHC site of the attention sub-layer */
    gfw_dense attn_norm, ffn_norm;   /**< [D] */
    gfw_fp8 wq_a, wq_b, wkv, wo_b;   /**< FP8 linears */
    gfw_dense q_norm, kv_norm;       /**< [q_lora], [d] */
    /** @var gfw_block_src::attn_norm
     *  attention norm [D]
     *  @var gfw_block_src::wq_a
     *  query down projection (FP8)
     *  @var gfw_block_src::wq_b
     *  query up projection (FP8)
     *  @var gfw_block_src::wkv
     *  kv projection (FP8)
     *  @var gfw_block_src::q_norm
     *  query low-rank norm [q_lora] */
    gfw_dense wo_a;                  /**< [G*o_lora, H*d/G] BF16 or F8 */
    const float *sink;               /**< [H] */
    gfw_compressor comp;             /**< ratio > 0 */
    gfw_fp8 idx_wq_b;                /**< ratio 4 */
    gfw_dense idx_weights_proj;      /**< ratio 4: [ih, D] */
    gfw_compressor idx_comp;         /**< ratio 4 */
    gfw_moe moe;                     /**< the MoE */
} gfw_block_src;

/** The MTP input projection. */
typedef struct gfw_mtp_src {
    gfw_fp8 e_proj, h_proj;          /**< [D, D] */
    gfw_dense enorm, hnorm;          /**< [D] */
    /** @var gfw_mtp_src::e_proj
     *  projection of the embedding [D, D]
     *  @var gfw_mtp_src::enorm
     *  norm of the embedding [D] */
    gfw_hc hc_head;                  /**< the MTP head's mix */
    gfw_dense norm;                  /**< its final norm */
} gfw_mtp_src;

/** The whole model as host views. */
typedef struct gfw_model_src {
    int64_t D, V, hc;                /**< width, vocabulary, streams */
    /** @var gfw_model_src::D
     *  width
     *  @var gfw_model_src::V
     *  vocabulary */
    int n_layers, n_blocks;          /**< main layers; main + MTP blocks */
    /** @var gfw_model_src::n_layers
     *  main layers */
    int sinkhorn_iters;              /**< hc_sinkhorn_iters */
    float norm_eps, hc_eps;          /**< rms_norm_eps, hc_eps */
    /** @var gfw_model_src::norm_eps
     *  rms_norm_eps */
    int64_t max_seq_len;             /**< the config's */
    const uint16_t *embed;           /**< bf16 [V, D] */
    const uint16_t *head_w;          /**< bf16 [V, D] */
    gfw_hc hc_head;                  /**< the main head's mix */
    gfw_dense head_norm;             /**< [D] */
    gfw_block_src *blocks;           /**< owned [n_blocks] */
    int has_mtp;                     /**< 1 when mtp is valid */
    gfw_mtp_src mtp;                 /**< MTP block 0 */
} gfw_model_src;

/**
 * Describe @p m as host views (gpu_forward_load.c).
 * @return MMOE_OK, MMOE_ENOMEM, MMOE_EUNSUPPORTED (a layout not taken, named), or a lookup error
 */
mmoe_status gfw_model_src_build(const mmoe_model *m, gfw_model_src *src, mmoe_error *err);

/** Free what gfw_model_src_build() owns. */
void gfw_model_src_free(gfw_model_src *src);

/** Host bytes of a dense weight (elements of its dtype; F8: codes only). */
size_t gfw_dense_bytes(const gfw_dense *w);

/**
 * @name One rank of an expert-parallel forward (src/ep/ep_gpu_forward.c)
 *
 * A rank's model holds the replicated tensors and only the routed experts [first, first +
 * n_local) of every MoE layer.  Its MoE sub-layer routes every token as the unsplit model does
 * (global expert ids), computes the slot rows of the pairs whose expert it holds and the shared
 * expert's rows, then calls @p exchange, which must fill the slot rows of every other pair
 * (computed by the other ranks); the combine then runs on the full set of rows in the oracle's
 * order, so every rank's output is the unsplit model's, bit for bit (each slot row is computed
 * by the same kernel from the same inputs, whichever rank computes it).
 * @{
 */
/**
 * Fill the other ranks' rows: @p idx_dev [T, k] is the layer's routing on the device (global
 * expert ids, -1 for a masked slot); @p slot_y_dev [T * k, D] the slot rows on the device, row
 * t * k + s for slot s of token t, of which this rank's pairs are written.
 */
typedef mmoe_status (*gfw_ep_exchange_fn)(void *ctx, const int32_t *idx_dev, int64_t T, int k, int64_t D,
                                          uint16_t *slot_y_dev, mmoe_error *err);

/** The expert range and the exchange of one rank. */
typedef struct gfw_ep_part {
    int64_t first;               /**< the rank's first routed expert (every MoE layer) */
    int64_t n_local;             /**< its number of routed experts (>= 1) */
    gfw_ep_exchange_fn exchange; /**< called once per MoE sub-layer, between the rows and the combine */
    void *ctx;                   /**< passed to @p exchange */
} gfw_ep_part;

/**
 * mmoe_gpu_model_bytes_needed() for one rank (@p part NULL: the whole model).
 * @return as mmoe_gpu_model_bytes_needed(); MMOE_EINVAL when the range exceeds a layer's experts
 */
mmoe_status gfw_model_bytes_part(const mmoe_model *m, const gfw_ep_part *part, int64_t max_seq_len, int64_t max_tokens,
                                 mmoe_gpu_model_bytes *out, mmoe_error *err);

/**
 * mmoe_gpu_model_create() for one rank, on the calling thread's current device (@p part NULL:
 * the whole model; the part is copied).
 * @return as mmoe_gpu_model_create(); MMOE_EINVAL when the range exceeds a layer's experts
 */
mmoe_status gfw_model_create_part(const mmoe_model *m, const gfw_ep_part *part, int64_t max_seq_len,
                                  int64_t max_tokens, mmoe_gpu_model **out, mmoe_error *err);
/** @} */

/**
 * @name Single blocks on the device, host arrays in and out (for the block tests)
 * Each runs exactly the kernel the forward runs, on one synchronous call; MMOE_ENODEV
 * without CUDA, MMOE_EINTERNAL naming a CUDA error.
 * @{
 */
/** RMSNorm of T rows of width n with a bf16 weight (k_rmsnorm). */
mmoe_status gfw_test_rmsnorm(const uint16_t *x, int64_t T, int64_t n, const uint16_t *w, float eps, uint16_t *y,
                             mmoe_error *err);
/**
 * FP8 linear: x bf16 [T, K], w E4M3 [N, K], scale E8M0 [ceil(N/b), ceil(K/b)] (k_act_quant, then
 * the kernel that the forward would launch for this weight).
 */
mmoe_status gfw_test_linear_fp8(const uint16_t *x, int64_t T, const uint8_t *w, const uint8_t *scale, int64_t N,
                                int64_t K, int block, uint16_t *y, mmoe_error *err);
/**
 * Two FP8 linears of the same x (bf16 [T, K]) as the forward launches wq_a with wkv: weights
 * E4M3 [N0, K] and [N1, K] with 128x128 E8M0 scales, outputs y0 [T, N0] and y1 [T, N1]
 * (k_act_quant, then one k_linear_fp8_128_split launch for both where it serves them).
 */
mmoe_status gfw_test_linear_fp8_pair(const uint16_t *x, int64_t T, int64_t K, const uint8_t *w0,
                                     const uint8_t *scale0, int64_t N0, const uint8_t *w1, const uint8_t *scale1,
                                     int64_t N1, uint16_t *y0, uint16_t *y1, mmoe_error *err);
/** The arguments of gfw_test_linear_fp8_tc(). */
typedef struct gfw_test_tc_args {
    const uint16_t *x;       /**< bf16 [T, K] */
    int64_t T;               /**< tokens (1..8) */
    int64_t K;               /**< input width */
    const uint8_t *w0;       /**< E4M3 [N0, K] */
    const uint8_t *scale0;   /**< E8M0 [ceil(N0/128), K/128] */
    int64_t N0;              /**< rows of w0 */
    const uint8_t *w1;       /**< a second weight in the same launch (E4M3 [N1, K]), or NULL */
    const uint8_t *scale1;   /**< its scales */
    int64_t N1;              /**< its rows */
    const uint16_t *X;       /**< the streams [T, 4, N0] for the first linear's hc_post, or NULL */
    const float *post;       /**< [T, 4] */
    const float *comb;       /**< [T, 4, 4] */
    int runs;                /**< launches (outputs NaN-filled before each; the last one's are returned) */
    uint16_t *y0;            /**< output bf16 [T, N0] */
    uint16_t *y1;            /**< output bf16 [T, N1] */
    uint16_t *X_out;         /**< the streams after the hc_post (with X) */
} gfw_test_tc_args;
/**
 * The FP8 linear of the `tc` recipe (k_act_quant, then k_linear_fp8_tc; one or two weights,
 * optionally the first one's hc_post with hc = 4).  MMOE_EUNSUPPORTED where the kernel does not
 * serve the shape (tc_serves()).
 */
mmoe_status gfw_test_linear_fp8_tc(const gfw_test_tc_args *args, mmoe_error *err);
/** Dense linear: x bf16 [T, K], w BF16 (w_f32 = 0) or F32 [N, K], y fp32 [T, N] (k_linear_dense_split). */
mmoe_status gfw_test_linear_dense(const uint16_t *x, int64_t T, int64_t K, const void *w, int w_f32, int64_t N,
                                  float *y, mmoe_error *err);
/**
 * Dense linear with an FP8 weight: codes E4M3 [N, K], scale E8M0 [ceil(N/b), ceil(K/b)], y fp32
 * (k_linear_dense_split).
 */
mmoe_status gfw_test_linear_dense_f8(const uint16_t *x, int64_t T, int64_t K, const uint8_t *w,
                                     const uint8_t *scale, int block, int64_t N, float *y, mmoe_error *err);
/** hc_pre of T tokens (k_hc_part, then k_hc_finish_split). */
mmoe_status gfw_test_hc_pre(int hc, int64_t D, int iters, float norm_eps, float hc_eps, const uint16_t *X, int64_t T,
                            const float *fn, const float *base, const float *scale, uint16_t *y, float *post,
                            float *comb, mmoe_error *err);
/**
 * hc_pre (@p n_out = 24) or hc_head (n_out = 4) of T tokens with hc = 4 streams, then the RMSNorm
 * of the mix by the bf16 weight @p w into @p y, and with @p out 1 its FP8 quantization (@p q
 * codes [T, D], @p qs scales [T, D/128]) or with @p out 2 the MoE's quantized input (@p mq
 * [T, D], chain-major); @p fused 1: k_hc_pre_norm (launched twice, the outputs NaN-filled
 * again before the second launch, whose result is returned), 2: the same with the Sinkhorn
 * apart (k_hc_pre_norm leaves its logits in a NaN-filled buffer, k_hc_sinkhorn runs it, after
 * each launch), 0: k_hc_part, k_hc_finish_split and k_rmsnorm.  Every output buffer is returned
 * whole (NaN where nothing was written); @p post and @p comb hold NaN for hc_head.
 */
mmoe_status gfw_test_hc_pre_norm(int64_t D, int n_out, int iters, float norm_eps, float hc_eps, const uint16_t *X,
                                 int64_t T, const float *fn, const float *base, const float *scale,
                                 const uint16_t *w, float eps, int out, int fused, uint16_t *y, float *post,
                                 float *comb, uint8_t *q, float *qs, float *mq, mmoe_error *err);
/** hc_post, in place on X (k_hc_post). */
mmoe_status gfw_test_hc_post(int hc, int64_t D, const uint16_t *out, uint16_t *X, int64_t T, const float *post,
                             const float *comb, mmoe_error *err);
/**
 * T query tokens (H heads of d each, q [T, H, d]) at positions n - T .. n - 1 over n kv rows
 * [n, d] (token t attends rows 0 .. n - T + t: a window of n, the last T rows the call's own)
 * with sinks [H], as one call of the forward launches them (k_attend_one, or k_attend's
 * instances); out [T, H, d].  With @p cs (token t's cos, sin of each of the rope_dim / 2 pairs
 * at its position: [T, rope_dim]), the outputs' last @p rope_dim dims get the inverse RoPE.
 */
mmoe_status gfw_test_attend(const uint16_t *q, int64_t T, int H, int d, const uint16_t *rows, int64_t n,
                            const float *sink, int rope_dim, const float *cs, uint16_t *out, mmoe_error *err);
/**
 * In place on rows of width @p width: kind 0 FP8 round trip of the first width-64 dims; kind 1
 * Hadamard + FP4 (the indexer compressor's device code); kind 2 the same by k_indexer_q_split,
 * kind 3 its Hadamard alone (a power of two width in [32, 1024]; the rows as the heads of one
 * token, no RoPE).
 */
mmoe_status gfw_test_qat(uint16_t *x, int64_t rows, int width, int kind, mmoe_error *err);
/**
 * The indexer of one token at position 4*n_blocks - 1 (so n_blocks blocks are causal): scores [n_blocks]
 * (k_indexer_scores) and the top-@p topk block ids in order [min(topk, n_blocks)] (k_topk_split).
 */
mmoe_status gfw_test_indexer(const uint16_t *qi, const uint16_t *wi, const uint16_t *keys, int ih, int id,
                             int64_t n_blocks, int topk, float *scores, int32_t *idx, mmoe_error *err);
/** The inputs and outputs of gfw_test_route(). */
typedef struct gfw_test_route_args {
    const float *logits; /**< [T, E] router logits */
    const float *bias;   /**< [E] selection bias, or NULL */
    int64_t T;           /**< tokens */
    int64_t E;           /**< routed experts */
    int k;               /**< experts per token */
    int shared;          /**< 1: the plan holds a shared expert's tasks too */
    float route_scale;   /**< routed scaling factor */
    float *scores;       /**< out [T, E]: sqrt(softplus(logits)) */
    int32_t *idx;        /**< out [T, k] */
    float *wts;          /**< out [T, k] */
    int32_t *order;      /**< out [T (k + 1)]: the plan's tasks by rank */
    int32_t *flag;       /**< out [T (k + 1)]: tasks of the item starting at a rank, else 0 */
    int32_t *items;      /**< out [T (k + 1)][4]: (expert or E, first rank, tasks, 0) */
    int32_t *n_items;    /**< out: items */
    int *tt;             /**< out: the token tile the plan's items are cut to */
} gfw_test_route_args;
/**
 * The MoE sub-layer's score routing and plan alone (gfw_moe_route(): the one-token kernel when
 * T = 1 and the experts fit it), every expert held.
 */
mmoe_status gfw_test_route(const gfw_test_route_args *args, mmoe_error *err);
/**
 * One sub-layer of block @p L of a GPU model on given inputs: @p which 0 the attention (the
 * block's caches advance: @p pos0 must continue them), 1 the MoE (router, experts, shared
 * expert, combine; @p ids for hash layers).  x bf16 [T, D] is the sub-layer's normalized input,
 * out bf16 [T, D] its output.
 */
mmoe_status gfw_test_sublayer(mmoe_gpu_model *g, int L, int which, const uint16_t *x, const int32_t *ids,
                              int64_t T, int64_t pos0, uint16_t *out, mmoe_error *err);
/**
 * The routing of block @p L's last MoE call of @p T tokens (gfw_test_sublayer() or the forward):
 * idx [T, k] the experts (-1 = masked), w [T, k] their weights, as the GPU router wrote them.
 */
mmoe_status gfw_test_last_routing(mmoe_gpu_model *g, int L, int64_t T, int32_t *idx, float *w, mmoe_error *err);
/**
 * Call @p fn (NULL: none) after every sub-layer of the model's forward calls, as the CPU
 * model's observer (mmoe_model_set_observer()) does: @p in the sub-layer's normalized input,
 * @p out the attention's output; NULL for the MoE, whose combine the forward does inside
 * hc_post.  Each report synchronizes the stream; decode steps are not graphed meanwhile.
 * MMOE_ENOMEM if the host copies cannot be allocated.
 */
mmoe_status gfw_test_set_observer(mmoe_gpu_model *g, mmoe_model_observer fn, void *ctx, mmoe_error *err);
/**
 * The MoE sub-layer of block @p L with the routing given: idx [T, k] (-1 = masked) and wts
 * [T, k] instead of the router's; out bf16 [T, D] as gfw_test_sublayer(), and logits fp32
 * [T, E] the router GEMM's raw logits of x.
 */
mmoe_status gfw_test_moe_given(mmoe_gpu_model *g, int L, const uint16_t *x, const int32_t *idx, const float *wts,
                               int64_t T, float *logits, uint16_t *out, mmoe_error *err);

/** The device functions of one float that gfw_test_unary() evaluates. */
typedef enum gfw_test_fn {
    GFW_TEST_EXPF = 0,  /**< gfw_expf, the exp of every exp-based block */
    GFW_TEST_LOG1PF = 1 /**< mmoe_log1pf as the device compiles it (the router's softplus) */
} gfw_test_fn;

/** y[i] = the device's @p fn (x[i]). */
mmoe_status gfw_test_unary(gfw_test_fn fn, const float *x, int64_t n, float *y, mmoe_error *err);
/** @} */

#ifdef __cplusplus
}
#endif
#endif /* MMOE_GPU_FORWARD_INTERNAL_H */
