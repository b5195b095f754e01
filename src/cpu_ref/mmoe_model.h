/**
 * @file mmoe_model.h
 * @brief The whole DeepSeek-V4 model on the CPU: loading a checkpoint directory, prefill and decode, logits.
 *
 * ## Data flow (@ref spec_arch)
 *
 *     ids [T] ──embed──▶ h bf16 [T, D] ──expand──▶ X bf16 [T, hc, D]
 *     for each layer L:
 *        y,post,C = hc_pre(X, hc_attn_L); o = Attn_L(attn_norm_L(y)); X = hc_post(o, X, post, C)
 *        y,post,C = hc_pre(X, hc_ffn_L);  o = MoE_L(ffn_norm_L(y), ids); X = hc_post(o, X, post, C)
 *     y = hc_head(X); y = norm(y); logits = fp32(y) @ fp32(head)^T
 *
 * and, for the multi-token-prediction block (@ref spec_arch_mtp), from the final streams X at
 * positions t and the tokens at t+1: `X' = e_proj(enorm(embed(ids))) + h_proj(hnorm(X))`,
 * one more block, and the head with the MTP block's own hc_head and norm.
 *
 * Attention is mmoe_attention_forward() (mmoe_attention.h, one cache per layer);
 * the MoE is the oracle of mmoe_moe.h with recipe `dsv4-ref` and the shared expert
 * computed serially as DeepSeek's FP8 linear (what the reference does), hash layers
 * routed by token id.  mHC, embedding and head are mmoe_mhc.h and this file.
 *
 * ## Memory
 *
 * The model borrows every weight from the mmapped shards (::mmoe_ckpt): nothing
 * is copied except what the loader must convert (mHC base/scale vectors stored as
 * BF16, a few hundred bytes).  Per-sequence state (KV caches, compressor state) is a
 * separate ::mmoe_model_state, so one loaded model can serve several sequences.
 *
 * ## Prefill and decode
 *
 * mmoe_model_forward() runs T consecutive tokens from the state's current position:
 * a prefill is one call with all prompt tokens, decode is one call per token, and any
 * chunking in between works.  Attention (reads only its cache, exact-partial GEMMs),
 * mHC, norms and the head (fixed-order double sums) are row-independent, so a token's
 * bits do not depend on its batch -- except through the MoE oracle, whose fp32 BLAS
 * GEMMs may sum in a different order for a different number of rows: decode = prefill
 * bit for bit in most runs, else up to flipped bf16 roundings (docs/forward.md).
 */
#ifndef MMOE_MODEL_H
#define MMOE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_config.h"
#include "mmoe_error.h"
#include "mmoe_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A loaded model (opaque). */
typedef struct mmoe_model mmoe_model;

/** Per-sequence state: position, per-layer attention caches, timings (opaque). */
typedef struct mmoe_model_state mmoe_model_state;

/** Loading progress: called once per loaded layer (and once at the start with done = 0). */
typedef void (*mmoe_model_progress_fn)(void *ctx, int done, int total, const char *what);

/**
 * Open a checkpoint directory: config.json, then model.safetensors.index.json and its
 * shards (or model.safetensors), mmapped; check every tensor the config implies
 * (name, dtype, shape) and bind the layers.
 * @param dir           the checkpoint directory
 * @param progress      optional progress callback (NULL: quiet)
 * @param progress_ctx  passed to @p progress
 * @param out           receives the model
 * @param err           message on failure
 * @return MMOE_OK; MMOE_ENOTFOUND (config, index, shard or tensor missing: the message
 *         names it), MMOE_EDTYPE / MMOE_ESHAPE (naming the tensor, expected and found),
 *         MMOE_ERANGE (config key), MMOE_EUNSUPPORTED (e.g. V4.1 layer types, FP8 experts),
 *         MMOE_EFORMAT, MMOE_EIO, MMOE_ENOMEM
 */
mmoe_status mmoe_model_open(const char *dir, mmoe_model_progress_fn progress, void *progress_ctx,
                            mmoe_model **out, mmoe_error *err);

/** Unmap and free. NULL is allowed. */
void mmoe_model_close(mmoe_model *m);

/** The model's configuration. */
const mmoe_config *mmoe_model_config(const mmoe_model *m);

/** Total bytes of the checkpoint's tensors (the mapped weights). */
uint64_t mmoe_model_weight_bytes(const mmoe_model *m);

/** Threads of the model's worker pool, the caller's included (the MoE layers, the attention's linears). */
int mmoe_model_worker_threads(const mmoe_model *m);

/**
 * Create a state for sequences of at most @p max_seq_len tokens (0: the config's max_seq_len).
 * @return MMOE_OK, MMOE_ERANGE, MMOE_ENOMEM
 */
mmoe_status mmoe_model_state_create(const mmoe_model *m, int64_t max_seq_len, mmoe_model_state **out,
                                    mmoe_error *err);

/** Free a state. NULL is allowed. */
void mmoe_model_state_destroy(mmoe_model_state *s);

/** Start a new sequence (position 0, every cache and compressor state reset). */
void mmoe_model_state_reset(mmoe_model_state *s);

/** Tokens consumed so far by the main model. */
int64_t mmoe_model_state_pos(const mmoe_model_state *s);

/** Bytes held by the state's caches. */
size_t mmoe_model_state_bytes(const mmoe_model_state *s);

/** Wall-clock seconds spent so far, per part (cumulative over calls; reset by state_reset). */
typedef struct mmoe_model_timings {
    int n_layers;          /**< main layers (+ MTP layers) of the arrays below */
    const double *attn_s;  /**< [n_layers]: attn_norm + attention, per layer */
    const double *moe_s;   /**< [n_layers]: ffn_norm + MoE, per layer */
    const double *mhc_s;   /**< [n_layers]: hc_pre + hc_post (both sub-layers) */
    double embed_s;        /**< embedding + expansion */
    double head_s;         /**< hc_head + norm + logits */
} mmoe_model_timings;

/** The state's cumulative timings (arrays owned by the state). */
void mmoe_model_state_timings(const mmoe_model_state *s, mmoe_model_timings *out);

/**
 * The embedding (@ref spec_arch_embed): h[t] = embed.weight[ids[t]], bf16 rows copied from the mapping.
 * @param m    the model
 * @param ids  [T] token ids
 * @param T    tokens
 * @param h    bf16 [T, D], written
 * @param err  message on failure
 * @return MMOE_OK, or MMOE_EINVAL naming the first id outside [0, vocab_size)
 */
mmoe_status mmoe_model_embed(const mmoe_model *m, const int32_t *ids, int64_t T, uint16_t *h, mmoe_error *err);

/**
 * Run T tokens at positions pos .. pos+T-1 (pos = mmoe_model_state_pos()).
 * @param m          the model
 * @param s          the sequence's state (advanced by T on success)
 * @param ids        [T] token ids (< vocab_size)
 * @param T          >= 1; pos + T <= the state's max_seq_len
 * @param logits     F32 [T, vocab] (or [1, vocab] with @p last_only), written; NULL: not wanted
 * @param last_only  1: logits of the last token only
 * @param streams    optional bf16 [T, hc, D]: the final streams (MTP input), written
 * @param err        message on failure
 * @return MMOE_OK, MMOE_EINVAL (bad id, too long: named), MMOE_ENOMEM, or a layer's error
 *         prefixed with "layer L: "
 */
mmoe_status mmoe_model_forward(mmoe_model *m, mmoe_model_state *s, const int32_t *ids, int64_t T,
                               float *logits, int last_only, uint16_t *streams, mmoe_error *err);

/**
 * The MTP block 0 (@ref spec_arch_mtp, wiring assumed as in DeepSeek-V3): for rows i = 0..T-1 it takes
 * the main model's final streams of position p+i and the token id that follows it
 * (@p next_ids[i] = id at p+i+1) and writes the MTP logits (predicting the token at p+i+2).
 * Its own SWA cache advances by T.
 * @param m         the model
 * @param s         the sequence's state (its MTP cache advances by T)
 * @param streams   bf16 [T, hc, D] from mmoe_model_forward()
 * @param next_ids  [T] the token ids that follow the streams' positions
 * @param T         rows
 * @param logits    F32 [T, vocab], written
 * @param err       message on failure
 * @return MMOE_OK, MMOE_EUNSUPPORTED (no MTP layer), or an error as mmoe_model_forward()
 */
mmoe_status mmoe_model_mtp_forward(mmoe_model *m, mmoe_model_state *s, const uint16_t *streams,
                                   const int32_t *next_ids, int64_t T, float *logits, mmoe_error *err);

/**
 * An executor of the model's MoE sub-layers: called for block @p block (main layers, then the
 * MTP blocks) instead of the block's oracle layer, with the oracle layer's inputs and outputs
 * (routing not given; token ids given on hash layers).  Expert parallelism (src/ep) installs one.
 */
typedef mmoe_status (*mmoe_model_moe_fn)(void *ctx, int block, const mmoe_moe_input *in, const mmoe_moe_output *out,
                                         mmoe_error *err);

/** Route the MoE sub-layers through @p fn (NULL: back to the oracle layers). */
void mmoe_model_set_moe_executor(mmoe_model *m, mmoe_model_moe_fn fn, void *ctx);

/** The two sub-layers of a block, in the order they run. */
typedef enum mmoe_sublayer {
    MMOE_SUBLAYER_ATTENTION = 0, /**< hc_pre, attention norm, attention */
    MMOE_SUBLAYER_MOE = 1        /**< hc_pre, ffn norm, MoE */
} mmoe_sublayer;

/**
 * An observer of the forward's sub-layers: called after sub-layer @p which of block @p block
 * ran on @p T rows at positions @p pos .. pos+T-1, with its normalized input @p in and its output
 * @p out (both bf16 [T, D], read-only, valid during the call).  A debugging and testing aid, as
 * llama.cpp's evaluation callback: another backend's sub-layers can then be driven with the
 * oracle's own activations.  A non-zero return stops the forward with MMOE_EINVAL.
 */
typedef int (*mmoe_model_observer)(void *ctx, int block, mmoe_sublayer which, int64_t pos, int64_t T,
                                   const uint16_t *in, const uint16_t *out);

/** Call @p fn after every sub-layer of every block, main layers and MTP blocks (NULL: none). */
void mmoe_model_set_observer(mmoe_model *m, mmoe_model_observer fn, void *ctx);

/** Blocks of the model: main layers + MTP blocks. */
int mmoe_model_n_blocks(const mmoe_model *m);

/**
 * The MoE layer of block @p block as description and weight views (into the mapped
 * checkpoint; valid while the model is open), for another executor of the same layer.
 * @param m      the model
 * @param block  the block (main layers, then MTP blocks)
 * @param desc   the block's MoE description, written
 * @param w      filled by mmoe_moe_weights_lookup(): release with mmoe_moe_weights_release()
 * @param err    error report
 * @return MMOE_OK; MMOE_EINVAL (block out of range); a lookup error
 */
mmoe_status mmoe_model_moe_layer(const mmoe_model *m, int block, mmoe_moe_desc *desc, mmoe_moe_weights *w,
                                 mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_MODEL_H */
