/**
 * @file mmoe_config.h
 * @brief The DeepSeek-V4 model configuration: every number the forward pass needs, loaded from config.json.
 *
 * A checkpoint directory carries a `config.json`.  The published DeepSeek-V4
 * repositories use Hugging Face key names (`hidden_size`, `num_hidden_layers`,
 * `rope_scaling.factor`, ...); the reference inference code reads its own
 * `inference/config.json` with the `ModelArgs` names (`dim`, `n_layers`,
 * `rope_factor`, ...).  ::mmoe_config_parse accepts either spelling for every
 * field (@ref spec_arch_config gives the keys), and a V4.1-style file whose text
 * keys sit under `text_config`.  A key that appears in neither spelling takes
 * the reference code's default where the reference has one (`rms_norm_eps`
 * 1e-6, `hc_eps` 1e-6, one MTP layer, UE8M0 scales, `max_seq_len` 4096);
 * otherwise it is an error that names the key.
 *
 * Validation (::mmoe_config_validate) checks ranges and the consistency rules
 * the forward pass relies on, for example that every FP8/FP4 linear's input
 * width is a multiple of the 128-wide activation-quantization block, that the
 * heads split evenly into output groups, and that `compress_ratios` has one
 * entry per main layer plus one per MTP layer.  Each message names the
 * offending key, the value found and the rule.
 *
 * The struct is plain data (no pointers), so it can be copied freely.
 */
#ifndef MMOE_CONFIG_H
#define MMOE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Largest number of layers (main + MTP) a config may describe. */
#define MMOE_CONFIG_MAX_LAYERS 256
/** Largest config.json read (bytes); a larger file is refused as not a config. */
#define MMOE_CONFIG_MAX_BYTES (64 << 20)

/** Width of one activation-quantization block along K (the reference's `block_size`). */
#define MMOE_ACT_BLOCK 128

/** Expert score function (`scoring_func` / `score_func`). */
typedef enum mmoe_score_func {
    MMOE_SCORE_SOFTMAX = 0,      /**< "softmax": no renormalization of the picked weights */
    MMOE_SCORE_SIGMOID = 1,      /**< "sigmoid" */
    MMOE_SCORE_SQRTSOFTPLUS = 2  /**< "sqrtsoftplus": sqrt(softplus(s)), the V4 choice */
} mmoe_score_func;

/** Storage of the routed-expert weights (`expert_dtype`). */
typedef enum mmoe_expert_dtype {
    MMOE_EXPERT_UNSET = 0, /**< key absent: decided by the checkpoint's tensor dtype at load time */
    MMOE_EXPERT_FP4 = 1,   /**< packed E2M1 [out, in/2] with 1x32 UE8M0 scales */
    MMOE_EXPERT_FP8 = 2    /**< E4M3 with the dense weight block scales */
} mmoe_expert_dtype;

/** Every architectural number of a DeepSeek-V4 model (names follow the reference's ModelArgs). */
typedef struct mmoe_config {
    int64_t vocab_size;          /**< vocabulary size (129280) */
    int64_t dim;                 /**< hidden size D */
    int64_t moe_inter_dim;       /**< expert intermediate width I */
    int n_layers;                /**< main transformer blocks */
    int n_hash_layers;           /**< the first n_hash_layers blocks route by token id (tid2eid) */
    int n_mtp_layers;            /**< multi-token-prediction blocks after the main ones */
    int n_heads;                 /**< query heads H */
    int n_routed_experts;        /**< routed experts E */
    int n_shared_experts;        /**< shared experts (1; its width is moe_inter_dim) */
    int n_activated_experts;     /**< experts per token (top-k) */
    mmoe_score_func score_func;  /**< gate score function */
    double route_scale;          /**< routed_scaling_factor */
    double swiglu_limit;         /**< SwiGLU clamp (0 = none) */
    int64_t q_lora_rank;         /**< query low-rank width */
    int head_dim;                /**< per-head width d (512), also the kv latent width */
    int rope_head_dim;           /**< rotary dims at the end of each head (64) */
    int o_groups;                /**< output projection groups G */
    int64_t o_lora_rank;         /**< output low-rank width per group */
    int window_size;             /**< sliding window (128) */
    int64_t original_seq_len;    /**< YaRN original context (65536) */
    double rope_theta;           /**< RoPE base of window-only layers (10000) */
    double compress_rope_theta;  /**< RoPE base of compressed layers (160000, with YaRN) */
    double rope_factor;          /**< YaRN factor (16) */
    double beta_fast;            /**< YaRN beta_fast (32) */
    double beta_slow;            /**< YaRN beta_slow (1) */
    int index_n_heads;           /**< lightning-indexer heads */
    int index_head_dim;          /**< lightning-indexer head width (128) */
    int index_topk;              /**< compressed blocks each query attends to (ratio-4 layers) */
    int hc_mult;                 /**< residual streams (4) */
    int hc_sinkhorn_iters;       /**< Sinkhorn iterations (20) */
    double hc_eps;               /**< mHC epsilon (1e-6) */
    double norm_eps;             /**< RMSNorm epsilon (rms_norm_eps) */
    int weight_block_n;          /**< FP8 weight scale block along out (128; 32 for V4.1) */
    int weight_block_k;          /**< FP8 weight scale block along in */
    mmoe_expert_dtype expert_dtype; /**< routed-expert storage */
    int64_t max_seq_len;         /**< KV-cache length (the ref's default 4096; not a model property) */
    int64_t bos_token_id;        /**< begin-of-sentence id (0) */
    int64_t eos_token_id;        /**< end-of-sentence id (1) */
    int n_ratios;                /**< entries in compress_ratios (n_layers + n_mtp_layers after parsing) */
    int compress_ratios[MMOE_CONFIG_MAX_LAYERS]; /**< per layer: 0 (window only), 4 (CSA), 128 (HCA); V4.1: 1, 2 */
} mmoe_config;

/**
 * Parse a config.json text (HF or reference key names) into @p cfg, then validate it.
 * @param json_text  NUL-terminated JSON
 * @param source     name used in messages (a path, or "config.json")
 * @param cfg        written on success
 * @param err        message naming the key on failure
 * @return MMOE_OK, MMOE_EFORMAT (bad JSON, wrong value type), MMOE_ENOTFOUND (required key
 *         missing), MMOE_ERANGE (value out of range / inconsistent), MMOE_EUNSUPPORTED
 */
mmoe_status mmoe_config_parse(const char *json_text, const char *source, mmoe_config *cfg,
                              mmoe_error *err);

/** Read and parse the file @p path (see ::mmoe_config_parse). */
mmoe_status mmoe_config_load(const char *path, mmoe_config *cfg, mmoe_error *err);

/**
 * Check ranges and consistency of @p cfg; the message names the key.
 * @return MMOE_OK or MMOE_ERANGE
 */
mmoe_status mmoe_config_validate(const mmoe_config *cfg, mmoe_error *err);

/**
 * A built-in shape: "v4-flash", "v4-pro" (the published configs) or "tiny" (every
 * layer type at test size: hash layers, window-only, ratio 4, ratio 128, one MTP layer).
 * @param name      the shape name
 * @param n_layers  main layers (0 = the shape's own count)
 * @param cfg       written on success
 * @param err       message on failure
 * @return MMOE_OK or MMOE_EINVAL (unknown name or bad layer count)
 */
mmoe_status mmoe_config_preset(const char *name, int n_layers, mmoe_config *cfg, mmoe_error *err);

/**
 * Write @p cfg as a Hugging Face style config.json (the published layout, with
 * quantization_config) into a newly malloc'ed NUL-terminated string.
 * @param cfg  the configuration
 * @param out  receives the text; the caller frees it
 * @param err  message on failure
 * @return MMOE_OK or MMOE_ENOMEM
 */
mmoe_status mmoe_config_to_json(const mmoe_config *cfg, char **out, mmoe_error *err);

/** Compress ratio of layer @p layer (0..n_layers+n_mtp_layers-1). */
int mmoe_config_ratio(const mmoe_config *cfg, int layer);

/** Name of a score function ("sqrtsoftplus"). */
const char *mmoe_score_func_name(mmoe_score_func f);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_CONFIG_H */
