/**
 * @file mmoe_generate.h
 * @brief The generation loop of `megamoe generate`: prefill, sample, decode, stream, with the KV cache kept between turns.
 *
 * ## The loop
 *
 * A language model writes text one token at a time.  A *turn* has two phases:
 *
 *  1. **Prefill**: the new prompt tokens go through mmoe_model_forward() at the
 *     positions that follow what the KV cache already holds; only the logits of
 *     the last one are kept (they predict the first new token).  The tokens go in
 *     chunks of ::MMOE_GEN_PREFILL_CHUNK so that a long prompt can report progress;
 *     the forward is row-independent and fixed-order (mmoe_model.h), so the chunks
 *     give the same logits as one call.
 *  2. **Decode**: sample a token from the logits (::mmoe_sampler: greedy at
 *     temperature 0), hand it to the caller (which prints it), run it through the
 *     model as a one-token forward, repeat.  The turn stops when the sampled token
 *     is the model's EOS (config.json `eos_token_id`), after @p max_tokens tokens,
 *     or when the context (the state's max_seq_len) is full.
 *
 * The last sampled token is *not* run through the model (nothing would read its
 * logits): it is kept as pending and goes in first at the next prefill.  So a
 * multi-turn chat never recomputes what the cache holds: turn k prefills only
 * the pending token(s) and its own new tokens.  ::mmoe_gen_stats reports both
 * counts, so the CLI's stats line shows the reuse.
 *
 * ## Vocabulary
 *
 * A checkpoint's vocabulary is often padded beyond the tokenizer's ids (DeepSeek-V4:
 * 129280 rows of the head), and a tokenizer's id range may have holes.  Ids the tokenizer
 * cannot decode are never sampled: their logits are set to -inf before the sampler sees
 * them (the count of such ids is ::mmoe_gen_session::n_masked, shown by the CLI).
 *
 * The session borrows the model, its state and the tokenizer; it owns the sampler
 * and the logits buffer.
 */
#ifndef MMOE_GENERATE_H
#define MMOE_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_ep_gpu_forward.h"
#include "mmoe_gpu_forward.h"
#include "mmoe_model.h"
#include "mmoe_sampler.h"
#include "mmoe_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Prompt tokens per forward call during prefill (one progress report per chunk). */
#define MMOE_GEN_PREFILL_CHUNK 64

/** Why a turn's decode stopped. */
typedef enum mmoe_gen_stop {
    MMOE_GEN_STOP_NONE = 0,     /**< not stopped yet */
    MMOE_GEN_STOP_EOS = 1,      /**< the model produced its EOS token */
    MMOE_GEN_STOP_MAX_TOKENS,   /**< max_tokens tokens were produced */
    MMOE_GEN_STOP_CONTEXT_FULL, /**< the state holds max_seq_len tokens */
    MMOE_GEN_STOP_CALLER        /**< the token callback asked to stop */
} mmoe_gen_stop;

/** A short name of a stop reason ("eos", "max-tokens", "context-full", "caller", "none"). */
const char *mmoe_gen_stop_name(mmoe_gen_stop stop);

/** Counts and wall-clock times of one turn (seconds, CLOCK_MONOTONIC). */
typedef struct mmoe_gen_stats {
    int64_t n_reused;    /**< tokens already in the KV cache when the turn started */
    int64_t n_prefill;   /**< tokens run through the model by this turn's prefill (pending + new) */
    double prefill_s;    /**< wall time of the prefill forwards */
    int64_t n_generated; /**< tokens produced by the decode loop (EOS not counted) */
    double generate_s;   /**< wall time of the decode loop: sampling and one-token forwards */
    mmoe_gen_stop stop;  /**< why the decode loop stopped */
} mmoe_gen_stats;

/** Prefill progress: tokens done so far out of total (called after each chunk). */
typedef void (*mmoe_gen_prefill_fn)(void *ctx, int64_t done, int64_t total);

/**
 * Token callback of the decode loop, called once per produced token (EOS excluded)
 * before it is run through the model.  Return 0 to go on, nonzero to stop the turn
 * (the token still counts as produced).  During the call the session's logits still hold
 * the logits the token was sampled from (undecodable rows at -inf).
 */
typedef int (*mmoe_gen_token_fn)(void *ctx, int32_t id);

/** A generation session over one sequence (see the file comment). */
typedef struct mmoe_gen_session {
    mmoe_model *model;         /**< borrowed */
    mmoe_model_state *state;   /**< borrowed: the sequence's KV caches */
    int64_t vocab;             /**< rows of the model's head (config vocab_size) */
    int64_t max_ctx;           /**< the state's max_seq_len: positions available */
    int32_t eos_id;            /**< the model's EOS id (config eos_token_id) */
    int32_t *masked;           /**< owned: the head rows the tokenizer cannot decode (never sampled) */
    int64_t n_masked;          /**< how many */
    mmoe_sampler sampler;      /**< owned: temperature, top-p, random state */
    float *logits;             /**< owned: F32 [vocab], the logits of the last token run */
    int have_logits;           /**< logits hold the prediction for the next position */
    int32_t pending[2];        /**< sampled tokens not yet run through the model */
    int n_pending;             /**< how many (0..2) */
    mmoe_gpu_model *gpu;       /**< borrowed: when set, the forward runs on the GPU (its own state; @p state unused) */
    mmoe_ep_gpu_model *gpus;   /**< borrowed: when set, the forward runs over N GPUs (likewise) */
} mmoe_gen_session;

/**
 * Set up a session.
 * @param g             the session to initialise (free with mmoe_gen_session_free())
 * @param model         the loaded model (borrowed)
 * @param state         a state of @p model (borrowed; used as is, so a fresh state starts at position 0)
 * @param max_ctx       the max_seq_len the state was created with (> 0)
 * @param tok           the tokenizer (borrowed, only read here): head rows it cannot decode are masked;
 *                      NULL: no masking
 * @param temperature   as mmoe_sampler_init(): 0 is greedy
 * @param top_p         as mmoe_sampler_init(): nucleus mass in (0, 1]
 * @param seed          as mmoe_sampler_init()
 * @param err           message on failure
 * @return MMOE_OK, MMOE_ERANGE (a sampler parameter, named), MMOE_ENOMEM
 */
mmoe_status mmoe_gen_session_init(mmoe_gen_session *g, mmoe_model *model, mmoe_model_state *state,
                                  int64_t max_ctx, const mmoe_tokenizer *tok, float temperature, float top_p, uint64_t seed,
                                  mmoe_error *err);

/**
 * Set up a session with every sampler parameter (repetition penalty, top-k, min-p...):
 * as mmoe_gen_session_init() otherwise.  The sampler's penalty history receives every
 * prompt token and every produced token.
 */
mmoe_status mmoe_gen_session_init_params(mmoe_gen_session *g, mmoe_model *model, mmoe_model_state *state,
                                         int64_t max_ctx, const mmoe_tokenizer *tok, const mmoe_sampler_params *sp,
                                         mmoe_error *err);

/**
 * Start a new, unrelated sequence in the same session: the state goes back to position 0,
 * the pending tokens and the logits are dropped, and the sampler starts afresh with @p sp
 * (its seed, its empty history).
 * @return MMOE_OK or the sampler's MMOE_ERANGE naming the bad parameter
 */
mmoe_status mmoe_gen_session_restart(mmoe_gen_session *g, const mmoe_sampler_params *sp, mmoe_error *err);

/** Free what the session owns (not the model, state or tokenizer). */
void mmoe_gen_session_free(mmoe_gen_session *g);

/**
 * Queue a token to be run through the model before the next prefill's tokens (the chat
 * uses it to close an assistant turn with EOS).  At most 2 pending tokens.
 * @return MMOE_OK or MMOE_EINVAL (queue full)
 */
mmoe_status mmoe_gen_push_pending(mmoe_gen_session *g, int32_t id, mmoe_error *err);

/**
 * Prefill: run the pending tokens, then @p ids, through the model; keep the last logits.
 * @param g             the session
 * @param ids           [n] token ids (n >= 0; the pending tokens plus ids must be >= 1 token)
 * @param n             number of ids
 * @param progress      optional, called after each chunk
 * @param progress_ctx  passed to @p progress
 * @param stats         n_reused, n_prefill and prefill_s are written (the rest zeroed)
 * @param err           message on failure
 * @return MMOE_OK, MMOE_EINVAL (nothing to run, an id beyond the vocabulary, or the context
 *         would overflow: the message gives the counts), or the forward's error
 */
mmoe_status mmoe_gen_prefill(mmoe_gen_session *g, const int32_t *ids, int64_t n, mmoe_gen_prefill_fn progress,
                             void *progress_ctx, mmoe_gen_stats *stats, mmoe_error *err);

/**
 * Decode after a prefill: sample, report, run, until EOS, @p max_tokens, a full context or
 * the callback's request.  The last produced token (or the EOS) is left pending.
 * @param g           the session
 * @param max_tokens  >= 0: the most tokens to produce
 * @param on_token    called for each produced token (EOS excluded); NULL allowed
 * @param token_ctx   passed to @p on_token
 * @param stats       n_generated, generate_s and stop are written
 * @param err         message on failure
 * @return MMOE_OK, MMOE_EINVAL (no logits: call mmoe_gen_prefill() first), or a sampler or
 *         forward error
 */
mmoe_status mmoe_gen_decode(mmoe_gen_session *g, int64_t max_tokens, mmoe_gen_token_fn on_token, void *token_ctx,
                            mmoe_gen_stats *stats, mmoe_error *err);

/**
 * The chat encoding writes its markers as text; they must be single tokens of this
 * tokenizer, and BOS/EOS must be the config's ids, or the model would see something else
 * than it was trained on (a tokenizer without them gets an error, not a silent byte split).
 * @param tok  the tokenizer
 * @param cfg  the model's config (bos_token_id, eos_token_id)
 * @param dir  the model directory (for the message)
 * @param err  message on failure
 * @return MMOE_OK or MMOE_EFORMAT naming the marker
 */
mmoe_status mmoe_gen_check_chat_markers(const mmoe_tokenizer *tok, const mmoe_config *cfg, const char *dir,
                                        mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_GENERATE_H */
