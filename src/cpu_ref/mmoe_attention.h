/**
 * @file mmoe_attention.h
 * @brief The attention sub-layer of DeepSeek-V4 on the CPU: weights, hyper-parameters, KV cache, forward.
 *
 * One call of mmoe_attention_forward() computes `o = Attn(x)` for T consecutive
 * tokens of one sequence (@ref spec_arch_attention), where x is the
 * output of the layer's `attn_norm` (bf16 [T, D]).  The three layer types are
 * selected by ::mmoe_attn_params.compress_ratio:
 *
 * - 0: sliding-window attention (SWA) over the last `window` tokens, RoPE base
 *   `rope_theta`, no YaRN;
 * - 4: CSA: window + the top-`index_topk` compressed 4-token blocks chosen by the
 *   lightning indexer (overlapping compressor, Hadamard + FP4 indexer keys);
 * - 128: HCA: window + every complete compressed 128-token block.
 *
 * The per-sequence state lives in a ::mmoe_attn_cache (a ring buffer of the raw
 * kv of the last `window` tokens, the compressed kv blocks, the compressor's
 * partial-block state and, for CSA, the indexer's key cache and compressor
 * state).  A forward call must start at the cache's next position
 * (mmoe_attn_cache_next_pos()); T may be anything >= 1, so a one-shot prefill
 * (start 0, T = prompt length), a decode step (T = 1) and chunked prefill all
 * go through the same code path.  Each token's kv is appended to the cache
 * before that token attends, and the attention of a token reads only the cache,
 * so **decoding token by token gives bit-identical outputs to one prefill**
 * (every GEMM of the oracle is row-independent and order-fixed; see
 * mmoe_linear.h, and docs/attention.md for the one place where the oracle
 * deliberately differs from the reference's prefill rounding).
 *
 * Activations cross this interface as BF16 bit patterns (uint16_t) or as F32
 * holding values that the layer rounds to bf16 first; the weights are borrowed
 * ::mmoe_tensor views with the checkpoint's names, dtypes and shapes (@ref
 * spec_arch_checkpoint), e.g. straight from an mmapped safetensors file.
 */
#ifndef MMOE_ATTENTION_H
#define MMOE_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_config.h"
#include "mmoe_error.h"
#include "mmoe_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Hyper-parameters of one attention layer (@ref spec_arch_config; ref ModelArgs names in brackets).
 * Fill it with mmoe_attn_params_default_v4_flash() or by hand, then check it with
 * mmoe_attn_params_validate().
 */
typedef struct mmoe_attn_params {
    int dim;               /**< D, hidden size [dim] (multiple of 128) */
    int n_heads;           /**< H, query heads [n_heads] */
    int head_dim;          /**< d, q/k/v head width [head_dim] = 512 */
    int rope_dim;          /**< rotary dims at the end of each head [rope_head_dim] = 64 (even) */
    int q_lora_rank;       /**< q latent width [q_lora_rank] (multiple of 128) */
    int o_groups;          /**< G, output-projection groups [o_groups]; divides H */
    int o_lora_rank;       /**< per-group low rank [o_lora_rank]; G*o_lora_rank multiple of 128 */
    int window;            /**< sliding window length [window_size] = 128 */
    int compress_ratio;    /**< 0 (SWA), 4 (CSA) or 128 (HCA): compress_ratios[layer] */
    int index_n_heads;     /**< indexer heads [index_n_heads] (used when ratio == 4) */
    int index_head_dim;    /**< indexer head width [index_head_dim] = 128 (power of two, >= rope_dim) */
    int index_topk;        /**< compressed blocks picked per query [index_topk] */
    int weight_block;      /**< FP8 weight block edge: 128 (V4) or 32 (V4.1); scales are [ceil(out/b), ceil(in/b)] */
    double rope_theta;     /**< RoPE base of ratio-0 layers [rope_theta] = 10000 */
    double compress_rope_theta; /**< RoPE base of ratio>0 layers, with YaRN [compress_rope_theta] = 160000 */
    double rope_factor;    /**< YaRN factor [rope_factor] = 16 */
    int64_t original_seq_len; /**< YaRN original context [original_seq_len] = 65536 */
    double beta_fast;      /**< YaRN beta_fast = 32 */
    double beta_slow;      /**< YaRN beta_slow = 1 */
    double norm_eps;       /**< RMSNorm epsilon [norm_eps] = 1e-6 (also the per-head q scaling) */
} mmoe_attn_params;

/**
 * Fill @p p with V4-Flash's values for a layer of the given compress ratio (0, 4 or 128):
 * mmoe_attn_params_from_config() of the built-in "v4-flash" config preset, so the published
 * values are written down once, in mmoe_config.c.
 */
void mmoe_attn_params_default_v4_flash(mmoe_attn_params *p, int compress_ratio);

/**
 * The attention hyper-parameters a model config gives a layer of the given compress ratio
 * (use mmoe_config_ratio() for a layer's ratio).
 */
void mmoe_attn_params_from_config(const mmoe_config *c, int compress_ratio, mmoe_attn_params *p);

/**
 * Check the invariants the forward relies on (positive sizes, divisibility by 128
 * of every FP8 GEMM input width, H % G == 0, ratio in {0, 4, 128}, rope_dim even and
 * <= head_dim and index_head_dim, index_head_dim a power of two, ...).
 * @return MMOE_OK or MMOE_ERANGE naming the offending field and its value
 */
mmoe_status mmoe_attn_params_validate(const mmoe_attn_params *p, mmoe_error *err);

/**
 * The weights of one compressor (attention compressor: dh = head_dim; indexer
 * compressor: dh = index_head_dim; c = 2 if ratio == 4 else 1).
 * Checkpoint names are relative to `layers.L.attn.compressor.` resp.
 * `layers.L.attn.indexer.compressor.`.
 */
typedef struct mmoe_compressor_weights {
    mmoe_tensor wkv;    /**< `wkv.weight`   BF16 (or F32) [c*dh, D] */
    mmoe_tensor wgate;  /**< `wgate.weight` BF16 (or F32) [c*dh, D] */
    mmoe_tensor ape;    /**< `ape`          F32 [ratio, c*dh], added to the gate */
    mmoe_tensor norm;   /**< `norm.weight`  BF16 (or F32) [dh] */
} mmoe_compressor_weights;

/**
 * The weights of one attention layer, as borrowed views (@ref spec_arch_checkpoint; names
 * relative to the prefix `layers.L.attn`, or `mtp.0.attn` for the MTP block).  FP8 weights
 * are F8_E4M3 [out, in] with F8_E8M0 scales [ceil(out/b), ceil(in/b)], b = weight_block.
 * Tensors a layer type does not have (compressor for ratio 0, indexer unless
 * ratio 4) are left zeroed (data == NULL).
 */
typedef struct mmoe_attn_weights {
    mmoe_tensor wq_a;        /**< `wq_a.weight`  F8 [q_lora, D] */
    mmoe_tensor wq_a_scale;  /**< `wq_a.scale`   E8M0 */
    mmoe_tensor q_norm;      /**< `q_norm.weight` BF16 (or F32) [q_lora] */
    mmoe_tensor wq_b;        /**< `wq_b.weight`  F8 [H*d, q_lora] */
    mmoe_tensor wq_b_scale;  /**< `wq_b.scale`   E8M0 */
    mmoe_tensor wkv;         /**< `wkv.weight`   F8 [d, D] */
    mmoe_tensor wkv_scale;   /**< `wkv.scale`    E8M0 */
    mmoe_tensor kv_norm;     /**< `kv_norm.weight` BF16 (or F32) [d] */
    mmoe_tensor wo_a;        /**< `wo_a.weight`  BF16 [G*o_lora, H*d/G] (convert.py output) or F8 with scale (published) */
    mmoe_tensor wo_a_scale;  /**< `wo_a.scale`   E8M0, only when wo_a is F8 (dequantized exactly to bf16 on use) */
    mmoe_tensor wo_b;        /**< `wo_b.weight`  F8 [D, G*o_lora] */
    mmoe_tensor wo_b_scale;  /**< `wo_b.scale`   E8M0 */
    mmoe_tensor attn_sink;   /**< `attn_sink`    F32 [H] */
    mmoe_compressor_weights compressor;      /**< the tensors under `compressor` (ratio 4 or 128) */
    mmoe_tensor idx_wq_b;                    /**< `indexer.wq_b.weight` F8 [index_n_heads*index_head_dim, q_lora] (ratio 4) */
    mmoe_tensor idx_wq_b_scale;              /**< `indexer.wq_b.scale`  E8M0 */
    mmoe_tensor idx_weights_proj;            /**< `indexer.weights_proj.weight` BF16 (or F32) [index_n_heads, D] */
    mmoe_compressor_weights idx_compressor;  /**< the tensors under `indexer.compressor` (ratio 4) */
} mmoe_attn_weights;

/**
 * How mmoe_attn_weights_bind() finds a tensor: write the view of tensor @p name
 * (full checkpoint name, e.g. "layers.2.attn.wq_a.weight") into @p out.
 * Return MMOE_OK, MMOE_ENOTFOUND if absent (bind then reports the name), or another
 * error with a message in @p err.
 */
typedef mmoe_status (*mmoe_tensor_lookup_fn)(void *ctx, const char *name, mmoe_tensor *out,
                                            mmoe_error *err);

/**
 * Fill @p w with the tensors `PREFIX.wq_a.weight`, ... of one layer (prefix e.g.
 * "layers.2.attn" or "mtp.0.attn") through @p lookup, then validate them with
 * mmoe_attn_weights_validate().  Only the tensors of the layer type are looked up;
 * `wo_a.scale` is looked up only when `wo_a` is F8.
 * @return MMOE_OK, or the first error (naming the tensor, the expected and the found dtype/shape)
 */
mmoe_status mmoe_attn_weights_bind(const mmoe_attn_params *p, const char *prefix,
                                   mmoe_tensor_lookup_fn lookup, void *ctx,
                                   mmoe_attn_weights *w, mmoe_error *err);

/**
 * Check every tensor of @p w needed by a layer of type p->compress_ratio for dtype
 * and shape (@ref spec_arch_checkpoint, scaled by @p p).  @p prefix is only used in messages.
 * @return MMOE_OK, MMOE_ENOTFOUND (data == NULL), MMOE_EDTYPE or MMOE_ESHAPE
 */
mmoe_status mmoe_attn_weights_validate(const mmoe_attn_params *p, const char *prefix,
                                       const mmoe_attn_weights *w, mmoe_error *err);

/**
 * Per-sequence attention state of one layer (opaque).  Holds, all bf16 unless noted:
 * - the raw-kv ring buffer [window, d] (slot pos % window; FP8 round trip on the nope dims);
 * - ratio > 0: compressed kv [max_seq_len/ratio, d] and the compressor state
 *   kv/score [c*ratio, c*d] fp32;
 * - ratio 4: the indexer key cache [max_seq_len/4, index_head_dim] (FP4 round trip)
 *   and the indexer compressor's state.
 */
typedef struct mmoe_attn_cache mmoe_attn_cache;

/**
 * Allocate a cache for sequences of at most @p max_seq_len tokens and reset it.
 * @param p            the layer's parameters (validated here)
 * @param max_seq_len  positions 0 .. max_seq_len-1 can be processed
 * @param out          receives the cache (NULL on error); free it with mmoe_attn_cache_destroy()
 * @param err          error message, or NULL
 * @return MMOE_OK, MMOE_ERANGE (bad params or max_seq_len < 1), MMOE_ENOMEM
 */
mmoe_status mmoe_attn_cache_create(const mmoe_attn_params *p, int64_t max_seq_len,
                                   mmoe_attn_cache **out, mmoe_error *err);

/** Free @p cache (NULL is allowed). */
void mmoe_attn_cache_destroy(mmoe_attn_cache *cache);

/** Start a new sequence: next position 0, compressor state kv = 0 / score = -inf. */
void mmoe_attn_cache_reset(mmoe_attn_cache *cache);

/** The position the next forward call must start at (= tokens consumed so far). */
int64_t mmoe_attn_cache_next_pos(const mmoe_attn_cache *cache);

/** Bytes held by @p cache (for memory reports). */
size_t mmoe_attn_cache_bytes(const mmoe_attn_cache *cache);

/**
 * Reusable working memory of mmoe_attention_forward() (opaque).  It grows on
 * demand; one per thread.  Passing NULL to the forward allocates per call.
 */
typedef struct mmoe_attn_scratch mmoe_attn_scratch;

/** Create an empty scratch (grows on first use).  Returns NULL on allocation failure. */
mmoe_attn_scratch *mmoe_attn_scratch_create(void);

/** Free @p scratch (NULL is allowed). */
void mmoe_attn_scratch_destroy(mmoe_attn_scratch *scratch);

struct mmoe_moe_pool; /* the worker pool of mmoe_moe.h (::mmoe_moe_pool) */

/**
 * Let the forwards that use @p scratch share the output rows of their linears with @p pool's
 * threads (borrowed: it must outlive the scratch's use; NULL: the calling thread alone, the
 * default).  Each output is computed by the same code whatever thread computes it, so the bits
 * do not change.  A pool runs one job at a time: calls that share it take turns.
 */
void mmoe_attn_scratch_set_pool(mmoe_attn_scratch *scratch, struct mmoe_moe_pool *pool);

/**
 * The attention sub-layer for tokens at positions start_pos .. start_pos+T-1.
 *
 * @param p          hyper-parameters (validated)
 * @param w          the layer's weights (validated with mmoe_attn_weights_validate())
 * @param cache      the layer's state for this sequence; start_pos must equal
 *                   mmoe_attn_cache_next_pos(cache) and start_pos+T <= its max_seq_len;
 *                   on success it has consumed the T tokens
 * @param x          attn_norm output, BF16 or F32 [T, D] (F32 is rounded to bf16 first, RNE)
 * @param start_pos  absolute position of the first token (0 for a fresh sequence)
 * @param T          number of tokens (>= 1)
 * @param out        written: the attention output `wo_b(...)`, BF16 or F32 [T, D]
 *                   (F32 receives the bf16 values exactly); must not alias @p x
 * @param scratch    working memory, or NULL
 * @param err        error message, or NULL
 * @return MMOE_OK; MMOE_EINVAL (position mismatch, T < 1, sequence too long),
 *         MMOE_EDTYPE/MMOE_ESHAPE (x or out), MMOE_ENOMEM.  On error the cache is
 *         unchanged only for argument errors detected before any work (all of the above
 *         except MMOE_ENOMEM); after MMOE_ENOMEM reset it.
 */
mmoe_status mmoe_attention_forward(const mmoe_attn_params *p, const mmoe_attn_weights *w,
                                   mmoe_attn_cache *cache, const mmoe_tensor *x,
                                   int64_t start_pos, int64_t T, mmoe_tensor *out,
                                   mmoe_attn_scratch *scratch, mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_ATTENTION_H */
