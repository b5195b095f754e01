/**
 * @file model_internal.h
 * @brief Private structures of the whole-model oracle, shared by model_load.c, model_forward.c and model_head.c.
 *
 * A ::mmoe_model is the open checkpoint plus one ::model_block per layer (main
 * layers first, then the MTP blocks) and the global tensors.  Every tensor is a
 * borrowed view into the mmapped shards; the only owned floats are the mHC
 * vectors converted from BF16 (if a checkpoint stores them so).
 */
#ifndef MMOE_MODEL_INTERNAL_H
#define MMOE_MODEL_INTERNAL_H

#include "mmoe_attention.h"
#include "mmoe_mhc.h"
#include "mmoe_model.h"
#include "mmoe_moe.h"
#include "mmoe_safetensors.h"

/** The three tensors of one mHC site, as fp32 arrays. */
typedef struct model_hc {
    const float *fn;    /**< [n_out, hc*D] */
    const float *base;  /**< [n_out] */
    const float *scale; /**< [3] (sub-layers) or [1] (head) */
} model_hc;

/** Final mixing + norm of a head (main model or MTP block). */
typedef struct model_head {
    model_hc hc;        /**< hc_head_fn / _base / _scale */
    mmoe_tensor norm;   /**< norm.weight [D] */
} model_head;

/** One transformer block. */
typedef struct model_block {
    int layer;                 /**< layer index (n_layers + i for MTP block i) */
    char prefix[32];           /**< "layers.L." or "mtp.i." */
    model_hc hc_attn;          /**< mHC parameters of the attention sub-layer */
    model_hc hc_ffn;           /**< mHC parameters of the MoE sub-layer */
    mmoe_tensor attn_norm;     /**< attn_norm.weight [D] */
    mmoe_tensor ffn_norm;      /**< ffn_norm.weight [D] */
    mmoe_attn_params attn_p;   /**< attention hyper-parameters of this layer */
    mmoe_attn_weights attn_w;  /**< attention weights (views) */
    mmoe_moe_layer *moe;       /**< the MoE layer (borrows its weights) */
    int hash;                  /**< 1: routed by token id */
} model_block;

/** The MTP input projection of block i. */
typedef struct model_mtp {
    mmoe_tensor e_proj;       /**< e_proj.weight FP8 [D, D] */
    mmoe_tensor e_proj_scale; /**< e_proj.scale E8M0 */
    mmoe_tensor h_proj;       /**< h_proj.weight FP8 [D, D] */
    mmoe_tensor h_proj_scale; /**< h_proj.scale E8M0 */
    mmoe_tensor enorm;        /**< enorm.weight [D] (embedding norm) */
    mmoe_tensor hnorm;        /**< hnorm.weight [D] (stream norm) */
    model_head head;                                        /**< mtp.i.hc_head_* and mtp.i.norm */
} model_mtp;

/** A loaded model: the checkpoint, its config and the bound layers (see mmoe_model.h). */
struct mmoe_model {
    mmoe_config cfg;           /**< the configuration */
    mmoe_ckpt *ck;             /**< the open checkpoint (owns the mappings) */
    mmoe_tensor embed;         /**< embed.weight [V, D] bf16 */
    mmoe_tensor head_w;        /**< head.weight [V, D] bf16 */
    model_head head;           /**< the main head */
    int n_blocks;              /**< n_layers + n_mtp_layers */
    model_block *blocks;       /**< [n_blocks] */
    mmoe_moe_pool *moe_pool;   /**< the dequantization workers shared by every MoE layer (MTP too) */
    model_mtp *mtp;            /**< [n_mtp_layers] */
    float **owned;             /**< converted vectors, freed at close */
    int n_owned;               /**< count of owned */
    uint64_t weight_bytes;     /**< sum of tensor bytes */
    mmoe_hc_params hcp;        /**< mHC parameters */
    mmoe_model_moe_fn moe_fn;  /**< executor of the MoE sub-layers (NULL: the blocks' oracle layers) */
    void *moe_ctx;             /**< its context */
    mmoe_model_observer obs_fn;/**< observer of the sub-layers (NULL: none) */
    void *obs_ctx;             /**< its context */
};

/** Per-sequence state: positions, per-layer caches, timings. */
struct mmoe_model_state {
    const mmoe_model *m;       /**< the model */
    int64_t max_seq_len;       /**< capacity */
    int64_t pos;               /**< main-model position */
    mmoe_attn_cache **caches;  /**< [n_blocks] */
    mmoe_attn_scratch *scratch;/**< attention working memory */
    double *attn_s;            /**< [n_blocks] seconds in attention */
    double *moe_s;             /**< [n_blocks] seconds in the MoE */
    double *mhc_s;             /**< [n_blocks] seconds in hc_pre/hc_post */
    double embed_s;            /**< seconds in the embedding */
    double head_s;             /**< seconds in the head */
};

/**
 * logits[t, v] = fp32(sum_c y[t,c] * head[v,c]) with y = norm(hc_head(X)), the dot products
 * accumulated in double in a fixed order (exact products of bf16 values), one rounding.
 * @param m       the model
 * @param h       which head (main or an MTP block's)
 * @param X       bf16 [T, hc, D] final streams
 * @param T       rows
 * @param logits  F32 [T, vocab], written
 * @param work    bf16 [T, D] scratch
 * @param err     message on failure
 * @return MMOE_OK or MMOE_ENOMEM
 */
mmoe_status mmoe_model_head_logits(const mmoe_model *m, const model_head *h, const uint16_t *X, int64_t T,
                                   float *logits, uint16_t *work, mmoe_error *err);

#endif /* MMOE_MODEL_INTERNAL_H */
