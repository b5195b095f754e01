/**
 * @file generate_session.c
 * @brief Prefill and decode of one sequence, with the sampled-but-not-yet-run tokens kept pending.
 *
 * The bookkeeping that makes KV-cache reuse exact is one invariant: after every
 * call, `mmoe_model_state_pos() + n_pending` is the length of the token sequence
 * the conversation has produced so far, and the logits buffer (when valid) holds
 * the prediction for the position right after the last token *run*.  A decode
 * loop leaves its last token pending (running it would only produce logits that
 * nobody reads when the turn ends); the next prefill runs it first.  See
 * mmoe_generate.h for the contract.
 *
 * Timing uses CLOCK_MONOTONIC wall time: the numbers include OpenBLAS's threads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h" /* the marker strings of the chat encoding */
#include "mmoe_clock.h"
#include "mmoe_generate.h"

const char *mmoe_gen_stop_name(mmoe_gen_stop stop)
{
    switch (stop) {
    case MMOE_GEN_STOP_EOS: return "eos";
    case MMOE_GEN_STOP_MAX_TOKENS: return "max-tokens";
    case MMOE_GEN_STOP_CONTEXT_FULL: return "context-full";
    case MMOE_GEN_STOP_CALLER: return "caller";
    case MMOE_GEN_STOP_NONE: break;
    }
    return "none";
}

/** List the head rows that @p tok cannot decode (beyond its ids, or holes in its id range). */
static mmoe_status find_undecodable(mmoe_gen_session *g, const mmoe_tokenizer *tok)
{
    if (tok == NULL)
        return MMOE_OK;
    int32_t n_ids = mmoe_tokenizer_n_ids(tok);
    for (int pass = 0; pass < 2; pass++) { /* pass 0 counts, pass 1 fills */
        g->n_masked = 0;
        for (int64_t id = 0; id < g->vocab; id++) {
            size_t len;
            if (id < n_ids && mmoe_tokenizer_token_string(tok, (int32_t)id, &len) != NULL)
                continue;
            if (pass == 1)
                g->masked[g->n_masked] = (int32_t)id;
            g->n_masked++;
        }
        if (pass == 0 && (g->masked = malloc(((size_t)g->n_masked + 1) * sizeof *g->masked)) == NULL)
            return MMOE_ENOMEM;
    }
    return MMOE_OK;
}

mmoe_status mmoe_gen_session_init(mmoe_gen_session *g, mmoe_model *model, mmoe_model_state *state,
                                  int64_t max_ctx, const mmoe_tokenizer *tok, float temperature, float top_p, uint64_t seed,
                                  mmoe_error *err)
{
    mmoe_sampler_params sp;
    mmoe_sampler_params_default(&sp);
    sp.temperature = temperature;
    sp.top_p = top_p;
    sp.seed = seed;
    return mmoe_gen_session_init_params(g, model, state, max_ctx, tok, &sp, err);
}

mmoe_status mmoe_gen_session_restart(mmoe_gen_session *g, const mmoe_sampler_params *sp, mmoe_error *err)
{
    mmoe_sampler fresh;
    mmoe_status st = mmoe_sampler_init_params(&fresh, sp, err);
    if (st != MMOE_OK)
        return st;
    if ((g->gpu != NULL && (st = mmoe_gpu_model_reset(g->gpu, err)) != MMOE_OK) ||
        (g->gpus != NULL && (st = mmoe_ep_gpu_model_reset(g->gpus, err)) != MMOE_OK)) {
        mmoe_sampler_free(&fresh);
        return st;
    }
    mmoe_sampler_free(&g->sampler);
    g->sampler = fresh;
    mmoe_model_state_reset(g->state);
    g->n_pending = 0;
    g->have_logits = 0;
    return MMOE_OK;
}

mmoe_status mmoe_gen_session_init_params(mmoe_gen_session *g, mmoe_model *model, mmoe_model_state *state,
                                         int64_t max_ctx, const mmoe_tokenizer *tok, const mmoe_sampler_params *sp,
                                         mmoe_error *err)
{
    memset(g, 0, sizeof *g);
    const mmoe_config *cfg = mmoe_model_config(model);
    if (max_ctx <= 0)
        return mmoe_error_set(err, MMOE_EINVAL, "context size %lld: expected > 0", (long long)max_ctx);
    g->model = model;
    g->state = state;
    g->vocab = cfg->vocab_size;
    g->max_ctx = max_ctx;
    g->eos_id = (int32_t)cfg->eos_token_id;
    mmoe_status st = mmoe_sampler_init_params(&g->sampler, sp, err);
    if (st != MMOE_OK)
        return st;
    g->logits = malloc((size_t)g->vocab * sizeof *g->logits);
    if (g->logits == NULL || (st = find_undecodable(g, tok)) != MMOE_OK) {
        mmoe_gen_session_free(g);
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory for %lld logits", (long long)g->vocab);
    }
    return MMOE_OK;
}

void mmoe_gen_session_free(mmoe_gen_session *g)
{
    if (g == NULL)
        return;
    mmoe_sampler_free(&g->sampler);
    free(g->logits);
    free(g->masked);
    g->logits = NULL;
    g->masked = NULL;
}

mmoe_status mmoe_gen_push_pending(mmoe_gen_session *g, int32_t id, mmoe_error *err)
{
    if (g->n_pending >= 2)
        return mmoe_error_set(err, MMOE_EINVAL, "pending token queue full (2 tokens)");
    g->pending[g->n_pending++] = id;
    g->have_logits = 0;
    mmoe_sampler_accept(&g->sampler, id);
    return MMOE_OK;
}

/** Tokens the sequence's caches hold (the GPU model's or the CPU state's). */
static int64_t cached_pos(const mmoe_gen_session *g)
{
    return g->gpus ? mmoe_ep_gpu_model_pos(g->gpus)
           : g->gpu ? mmoe_gpu_model_pos(g->gpu)
                    : mmoe_model_state_pos(g->state);
}

/** Run @p n tokens through the model, keeping the last token's logits. */
static mmoe_status run_tokens(mmoe_gen_session *g, const int32_t *ids, int64_t n, mmoe_error *err)
{
    mmoe_status st = g->gpus  ? mmoe_ep_gpu_model_forward(g->gpus, ids, n, g->logits, 1, NULL, err)
                     : g->gpu ? mmoe_gpu_model_forward(g->gpu, ids, n, g->logits, 1, NULL, err)
                            : mmoe_model_forward(g->model, g->state, ids, n, g->logits, 1, NULL, err);
    g->have_logits = st == MMOE_OK;
    return st;
}

mmoe_status mmoe_gen_prefill(mmoe_gen_session *g, const int32_t *ids, int64_t n, mmoe_gen_prefill_fn progress,
                             void *progress_ctx, mmoe_gen_stats *stats, mmoe_error *err)
{
    memset(stats, 0, sizeof *stats);
    int64_t pos = cached_pos(g);
    int64_t total = g->n_pending + n;
    stats->n_reused = pos;
    if (total < 1)
        return mmoe_error_set(err, MMOE_EINVAL, "nothing to prefill (empty prompt)");
    if (pos + total > g->max_ctx) {
        /* advice that can be followed: --ctx-size cannot go past the config's max_seq_len */
        const int64_t limit = mmoe_model_config(g->model)->max_seq_len;
        char advice[160];
        if (pos + total <= limit)
            snprintf(advice, sizeof advice, "raise --ctx-size (up to the model's max_seq_len %lld)", (long long)limit);
        else if (total <= limit && pos > 0)
            snprintf(advice, sizeof advice, "the model's max_seq_len is %lld: start a new conversation",
                     (long long)limit);
        else
            snprintf(advice, sizeof advice, "the model's max_seq_len is %lld: shorten the text", (long long)limit);
        return mmoe_error_set(err, MMOE_EINVAL, "context full: %lld cached + %lld new tokens > context size %lld (%s)",
                              (long long)pos, (long long)total, (long long)g->max_ctx, advice);
    }
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= g->vocab)
            return mmoe_error_set(err, MMOE_EINVAL, "prompt token %lld has id %d: the model's vocabulary "
                                  "has %lld ids", (long long)i, ids[i], (long long)g->vocab);
    for (int64_t i = 0; i < n; i++)
        mmoe_sampler_accept(&g->sampler, ids[i]);
    double t0 = mmoe_clock_s();
    mmoe_status st = MMOE_OK;
    int64_t done = 0;
    if (g->n_pending > 0) {
        st = run_tokens(g, g->pending, g->n_pending, err);
        done = g->n_pending;
        g->n_pending = 0;
    }
    for (int64_t i = 0; st == MMOE_OK && i < n; i += MMOE_GEN_PREFILL_CHUNK) {
        int64_t chunk = n - i < MMOE_GEN_PREFILL_CHUNK ? n - i : MMOE_GEN_PREFILL_CHUNK;
        st = run_tokens(g, ids + i, chunk, err);
        done += chunk;
        if (st == MMOE_OK && progress != NULL)
            progress(progress_ctx, done, total);
    }
    stats->prefill_s = mmoe_clock_s() - t0;
    stats->n_prefill = done;
    return st;
}

/** Mask the head rows the tokenizer cannot decode (see mmoe_generate.h). */
static void mask_undecodable(mmoe_gen_session *g)
{
    for (int64_t i = 0; i < g->n_masked; i++)
        g->logits[g->masked[i]] = -INFINITY;
}

mmoe_status mmoe_gen_decode(mmoe_gen_session *g, int64_t max_tokens, mmoe_gen_token_fn on_token, void *token_ctx,
                            mmoe_gen_stats *stats, mmoe_error *err)
{
    stats->n_generated = 0;
    stats->generate_s = 0.0;
    stats->stop = MMOE_GEN_STOP_NONE;
    if (!g->have_logits || g->n_pending > 0)
        return mmoe_error_set(err, MMOE_EINVAL, "decode needs a prefill first");
    double t0 = mmoe_clock_s();
    mmoe_status st = MMOE_OK;
    while (stats->stop == MMOE_GEN_STOP_NONE) {
        if (stats->n_generated >= max_tokens) {
            stats->stop = MMOE_GEN_STOP_MAX_TOKENS;
            break;
        }
        int32_t id;
        mask_undecodable(g);
        if ((st = mmoe_sampler_sample(&g->sampler, g->logits, (size_t)g->vocab, &id, err)) != MMOE_OK)
            break;
        g->have_logits = 0;
        mmoe_sampler_accept(&g->sampler, id);
        g->pending[0] = id;
        g->n_pending = 1;
        if (id == g->eos_id) {
            stats->stop = MMOE_GEN_STOP_EOS;
            break;
        }
        stats->n_generated++;
        if (on_token != NULL && on_token(token_ctx, id) != 0)
            stats->stop = MMOE_GEN_STOP_CALLER;
        else if (stats->n_generated >= max_tokens)
            stats->stop = MMOE_GEN_STOP_MAX_TOKENS;
        else if (cached_pos(g) + 1 > g->max_ctx)
            stats->stop = MMOE_GEN_STOP_CONTEXT_FULL;
        else {
            g->n_pending = 0;
            st = run_tokens(g, &id, 1, err);
            if (st != MMOE_OK)
                break;
        }
    }
    stats->generate_s = mmoe_clock_s() - t0;
    return st;
}

mmoe_status mmoe_gen_check_chat_markers(const mmoe_tokenizer *tok, const mmoe_config *cfg, const char *dir,
                                        mmoe_error *err)
{
    static const char *const markers[] = {BOS, EOS, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE};
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++) {
        int32_t id = mmoe_tokenizer_token_id(tok, markers[i], strlen(markers[i]));
        if (id < 0)
            return mmoe_error_set(err, MMOE_EFORMAT, "%s/tokenizer.json has no token '%s': the chat encoding needs "
                                  "DeepSeek-V4's chat markers (use a raw --prompt)", dir, markers[i]);
        int64_t want = i == 0 ? cfg->bos_token_id : i == 1 ? cfg->eos_token_id : id;
        if (id != want)
            return mmoe_error_set(err, MMOE_EFORMAT, "%s: token '%s' has id %d in tokenizer.json but config.json "
                                  "says %lld", dir, markers[i], id, (long long)want);
    }
    return MMOE_OK;
}
