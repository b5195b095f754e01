/**
 * @file serve_engine.c
 * @brief `megamoe serve`: the request queue and the worker thread that owns the model.
 *
 * The worker takes the oldest job, turns it into token ids (completions: BOS + the
 * prompt's tokens, as `megamoe generate --prompt`; chat: the DeepSeek-V4 chat encoding of
 * the messages with the assistant turn opened, as `generate --chat-format`), checks them
 * against the context, and generates with the generation session of mmoe_generate.h from
 * a fresh KV state: so an answer depends only on its request, never on earlier ones.
 *
 * Context: a prompt that fills the context, or whose length plus an explicit `max_tokens`
 * exceeds it, is refused (HTTP 400, code `context_length_exceeded`, OpenAI's message);
 * without `max_tokens` a chat answer may use the rest of the context.
 *
 * Each generated token goes through the streaming UTF-8 decoder and the stop-string matcher
 * (mmoe_stop_strings.h); what they release is appended to the job's text under the lock and
 * the waiting connection is woken.  Between tokens the worker looks at the job's cancelled
 * flag and the server's stopping flag: either ends the job at once.  Each finished request
 * leaves one line on stderr (number, endpoint, token counts, time, how it ended).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_chat.h"
#include "mmoe_clock.h"
#include "mmoe_stop_strings.h"
#include "serve_internal.h"

mmoe_status serve_engine_load(serve_server *srv, int64_t ctx_size, int64_t default_ctx, mmoe_error *err)
{
    mmoe_status st = mmoe_tokenizer_load_dir(srv->model_dir, &srv->tok, err);
    if (st != MMOE_OK || (st = mmoe_model_open(srv->model_dir, NULL, NULL, &srv->model, err)) != MMOE_OK)
        return st;
    const mmoe_config *cfg = mmoe_model_config(srv->model);
    int32_t n_tok = mmoe_tokenizer_n_ids(srv->tok);
    if (n_tok > cfg->vocab_size)
        return mmoe_error_set(err, MMOE_ESHAPE, "%s/tokenizer.json has %d ids but the model's vocab_size is %lld: "
                              "tokenizer and checkpoint do not belong together", srv->model_dir, n_tok,
                              (long long)cfg->vocab_size);
    mmoe_error chat_err = {0};
    if (mmoe_gen_check_chat_markers(srv->tok, cfg, srv->model_dir, &chat_err) != MMOE_OK)
        snprintf(srv->chat_refusal, sizeof srv->chat_refusal, "this model cannot chat: %s", chat_err.msg);
    srv->ctx = ctx_size > 0 ? ctx_size : cfg->max_seq_len < default_ctx ? cfg->max_seq_len : default_ctx;
    if (srv->ctx > cfg->max_seq_len)
        return mmoe_error_set(err, MMOE_ERANGE, "--ctx-size %lld: the model's max_seq_len is %lld",
                              (long long)srv->ctx, (long long)cfg->max_seq_len);
    if ((st = mmoe_model_state_create(srv->model, srv->ctx, &srv->state, err)) != MMOE_OK)
        return st;
    if ((st = mmoe_backend_open(srv->backend, srv->model, srv->ctx, MMOE_GEN_PREFILL_CHUNK, srv->cuda_graph,
                                "megamoe serve", 0, &srv->gpu, err)) != MMOE_OK)
        return st;
    mmoe_sampler_params sp;
    mmoe_sampler_params_default(&sp);
    if ((st = mmoe_gen_session_init_params(&srv->session, srv->model, srv->state, srv->ctx, srv->tok, &sp, err)) !=
        MMOE_OK)
        return st;
    srv->session.gpu = srv->gpu;
    srv->have_session = 1;
    return MMOE_OK;
}

/** Free a job (lock held or job unreachable). */
static void job_free(serve_job *job)
{
    serve_request_free(&job->req);
    mmoe_text_free(&job->text);
    json_decref(job->lp_tokens);
    json_decref(job->error);
    free(job);
}

/** Drop a reference with the lock held. */
static void job_release_locked(serve_job *job)
{
    if (--job->refs == 0)
        job_free(job);
}

void serve_job_release(serve_server *srv, serve_job *job)
{
    pthread_mutex_lock(&srv->lock);
    job_release_locked(job);
    pthread_mutex_unlock(&srv->lock);
}

void serve_job_cancel(serve_server *srv, serve_job *job)
{
    pthread_mutex_lock(&srv->lock);
    if (job->state == SERVE_JOB_QUEUED || job->state == SERVE_JOB_RUNNING)
        job->cancelled = 1;
    pthread_mutex_unlock(&srv->lock);
}

/** End a job with an error answer (lock held): the waiting connection sends it. */
static void fail_locked(serve_server *srv, serve_job *job, int http_status, json_t *error)
{
    job->state = SERVE_JOB_FAILED;
    job->http_status = http_status;
    json_decref(job->error);
    job->error = error;
    pthread_cond_broadcast(&srv->changed);
}

serve_job *serve_engine_submit(serve_server *srv, serve_request *req)
{
    serve_job *job = calloc(1, sizeof *job);
    if (job == NULL)
        return NULL;
    if (req->logprobs >= 0 && (job->lp_tokens = json_array()) == NULL) {
        free(job);
        return NULL;
    }
    pthread_mutex_lock(&srv->lock);
    if (srv->stopping || srv->n_queued >= srv->max_queue) {
        pthread_mutex_unlock(&srv->lock);
        json_decref(job->lp_tokens);
        free(job);
        return NULL;
    }
    job->req = *req;
    memset(req, 0, sizeof *req);
    job->refs = 2;
    job->number = srv->next_number++;
    job->created = time(NULL);
    if (srv->tail != NULL)
        srv->tail->next = job;
    else
        srv->head = job;
    srv->tail = job;
    srv->n_queued++;
    pthread_cond_broadcast(&srv->changed);
    pthread_mutex_unlock(&srv->lock);
    return job;
}

/** One job's generation state (the worker's). */
typedef struct serve_run {
    serve_server *srv;          /**< the server */
    serve_job *job;             /**< the job */
    mmoe_decode_stream decode;  /**< streaming UTF-8 decoder */
    mmoe_stop_matcher stop;     /**< the request's stop strings */
    mmoe_text piece;            /**< scratch: one token's text */
    mmoe_text released;         /**< scratch: what the stop matcher released */
    int matched;                /**< a stop string ended the answer */
    int abandoned;              /**< the job ended early because its client went away */
    mmoe_status st;             /**< an error inside the token callback */
    mmoe_error err;             /**< its message */
} serve_run;

/** The prompt's token ids: BOS + prompt (completions) or the chat encoding (chat). */
static mmoe_status prompt_ids(serve_server *srv, const serve_request *req, mmoe_token_ids *ids, mmoe_error *err)
{
    if (req->kind == SERVE_COMPLETION) {
        int32_t bos = (int32_t)mmoe_model_config(srv->model)->bos_token_id;
        mmoe_status st = mmoe_token_ids_push(ids, &bos, 1);
        return st != MMOE_OK ? st : mmoe_tokenizer_encode(srv->tok, req->prompt, strlen(req->prompt), 0, ids, err);
    }
    mmoe_chat_options co;
    mmoe_chat_options_default(&co);
    mmoe_text prompt = {0};
    mmoe_status st = mmoe_chat_encode_json(req->messages, strlen(req->messages), &co, &prompt, err);
    if (st == MMOE_OK)
        st = mmoe_tokenizer_encode(srv->tok, prompt.data ? prompt.data : "", prompt.len, 0, ids, err);
    mmoe_text_free(&prompt);
    return st;
}

/** The text of one token as JSON: {"text" (null unless valid UTF-8), "bytes", "logprob"}. */
static json_t *token_entry(serve_server *srv, int32_t id, double logprob)
{
    mmoe_text t = {0};
    json_t *bytes = json_array(), *text = NULL;
    if (mmoe_tokenizer_decode(srv->tok, &id, 1, 0, &t, NULL) == MMOE_OK) {
        text = json_stringn(t.data ? t.data : "", t.len);
        for (size_t i = 0; i < t.len; i++)
            json_array_append_new(bytes, json_integer((unsigned char)t.data[i]));
    }
    mmoe_text_free(&t);
    json_t *e = json_pack("{s:o, s:o}", "text", text ? text : json_null(), "bytes", bytes);
    json_object_set_new(e, "logprob", json_real(logprob));
    return e;
}

/** Record the log-probabilities of @p id (the session's logits are those it was sampled from). */
static mmoe_status record_logprobs(serve_run *run, int32_t id)
{
    serve_server *srv = run->srv;
    int n = run->job->req.logprobs;
    int32_t top_ids[SERVE_MAX_LOGPROBS];
    double top_lp[SERVE_MAX_LOGPROBS], lp;
    mmoe_status st = mmoe_logprobs_top(srv->session.logits, (size_t)srv->session.vocab, id, (size_t)n, &lp, top_ids,
                                       top_lp, &run->err);
    if (st != MMOE_OK)
        return st;
    json_t *e = token_entry(srv, id, lp), *top = json_array();
    for (int k = 0; k < n; k++)
        json_array_append_new(top, token_entry(srv, top_ids[k], top_lp[k]));
    json_object_set_new(e, "top", top);
    /* only the worker touches lp_tokens until the job is DONE */
    if (json_array_append_new(run->job->lp_tokens, e) != 0)
        return mmoe_error_set(&run->err, MMOE_ENOMEM, "out of memory for logprobs");
    return MMOE_OK;
}

/** Pass text through the stop matcher and append what it releases to the job (under the lock). */
static mmoe_status publish(serve_run *run, const char *text, size_t len)
{
    run->released.len = 0;
    if (mmoe_stop_push(&run->stop, text, len, &run->released, &run->matched) != MMOE_OK)
        return mmoe_error_set(&run->err, MMOE_ENOMEM, "out of memory for the answer");
    pthread_mutex_lock(&run->srv->lock);
    mmoe_status st = mmoe_text_append(&run->job->text, run->released.data ? run->released.data : "", run->released.len);
    pthread_cond_broadcast(&run->srv->changed);
    pthread_mutex_unlock(&run->srv->lock);
    return st != MMOE_OK ? mmoe_error_set(&run->err, MMOE_ENOMEM, "out of memory for the answer") : MMOE_OK;
}

/** Token callback: logprobs, decode, stop strings, publish; nonzero stops (stop string, cancel, error). */
static int on_token(void *ctx, int32_t id)
{
    serve_run *run = ctx;
    if (run->job->req.logprobs >= 0 && (run->st = record_logprobs(run, id)) != MMOE_OK)
        return 1;
    run->piece.len = 0;
    if ((run->st = mmoe_decode_stream_push(&run->decode, id, &run->piece, &run->err)) != MMOE_OK)
        return 1;
    if (run->piece.len > 0 && (run->st = publish(run, run->piece.data, run->piece.len)) != MMOE_OK)
        return 1;
    pthread_mutex_lock(&run->srv->lock);
    int give_up = run->job->cancelled || run->srv->stopping;
    run->abandoned = give_up && run->job->cancelled;
    pthread_mutex_unlock(&run->srv->lock);
    return run->matched || give_up;
}

/** Refuse a prompt that does not fit (OpenAI's context_length_exceeded); NULL when it fits. */
static json_t *check_context(const serve_server *srv, serve_kind kind, int64_t n_prompt, int64_t max_tokens)
{
    char msg[400];
    if (n_prompt >= srv->ctx)
        snprintf(msg, sizeof msg, "This model's maximum context length is %lld tokens. However, your prompt has "
                 "%lld tokens, which leaves no room for the completion. Please reduce the length of the prompt.",
                 (long long)srv->ctx, (long long)n_prompt);
    else if (max_tokens > 0 && n_prompt + max_tokens > srv->ctx)
        snprintf(msg, sizeof msg, "This model's maximum context length is %lld tokens. However, you requested %lld "
                 "tokens (%lld in the prompt, %lld for the completion). Please reduce the length of the prompt or "
                 "max_tokens.", (long long)srv->ctx, (long long)(n_prompt + max_tokens), (long long)n_prompt,
                 (long long)max_tokens);
    else
        return NULL;
    const char *param = n_prompt < srv->ctx ? "max_tokens" : kind == SERVE_CHAT ? "messages" : "prompt";
    return serve_error_json(msg, "invalid_request_error", param, "context_length_exceeded");
}

/** Generate after the prompt was accepted (job RUNNING); returns the error that ended it, if any. */
static mmoe_status generate(serve_run *run, const mmoe_token_ids *ids, int64_t max_tokens, mmoe_gen_stats *dec,
                            mmoe_error *err)
{
    serve_server *srv = run->srv;
    mmoe_gen_stats pre;
    mmoe_status st = mmoe_gen_prefill(&srv->session, ids->ids, (int64_t)ids->n, NULL, NULL, &pre, err);
    if (st == MMOE_OK)
        st = mmoe_gen_decode(&srv->session, max_tokens, on_token, run, dec, err);
    if (st == MMOE_OK && run->st != MMOE_OK) {
        *err = run->err;
        st = run->st;
    }
    run->piece.len = 0;
    if (st == MMOE_OK && (st = mmoe_decode_stream_finish(&run->decode, &run->piece, err)) == MMOE_OK &&
        run->piece.len > 0 && (st = publish(run, run->piece.data, run->piece.len)) != MMOE_OK)
        *err = run->err;
    run->released.len = 0;
    if (st == MMOE_OK && mmoe_stop_finish(&run->stop, &run->released) == MMOE_OK && run->released.len > 0) {
        pthread_mutex_lock(&srv->lock);
        st = mmoe_text_append(&run->job->text, run->released.data, run->released.len);
        pthread_mutex_unlock(&srv->lock);
    }
    return st;
}

/** Run one job to its end (called without the lock). */
static void run_job(serve_server *srv, serve_job *job)
{
    serve_run run;
    memset(&run, 0, sizeof run);
    run.srv = srv;
    run.job = job;
    const serve_request *req = &job->req;
    mmoe_error err = {0};
    mmoe_token_ids ids = {0};
    json_t *refusal = NULL;
    mmoe_status st = req->kind == SERVE_CHAT && srv->chat_refusal[0] != '\0'
                         ? mmoe_error_set(&err, MMOE_EUNSUPPORTED, "%s", srv->chat_refusal)
                         : prompt_ids(srv, req, &ids, &err);
    if (st != MMOE_OK)
        refusal = serve_error_json(err.msg, "invalid_request_error", req->kind == SERVE_CHAT ? "messages" : "prompt",
                                   NULL);
    else if ((refusal = check_context(srv, req->kind, (int64_t)ids.n, req->max_tokens)) == NULL &&
             mmoe_gen_session_restart(&srv->session, &req->sampling, &err) != MMOE_OK)
        refusal = serve_error_json(err.msg, "invalid_request_error", NULL, NULL);
    pthread_mutex_lock(&srv->lock);
    if (refusal != NULL) {
        fail_locked(srv, job, 400, refusal);
        pthread_mutex_unlock(&srv->lock);
        mmoe_token_ids_free(&ids);
        return;
    }
    job->state = SERVE_JOB_RUNNING;
    job->prompt_tokens = (int64_t)ids.n;
    pthread_cond_broadcast(&srv->changed);
    pthread_mutex_unlock(&srv->lock);

    int64_t max_tokens = req->max_tokens > 0 ? req->max_tokens : srv->ctx - (int64_t)ids.n;
    mmoe_decode_stream_init(&run.decode, srv->tok, 0);
    mmoe_stop_init(&run.stop, (const char *const *)req->stops, req->n_stops);
    mmoe_gen_stats dec = {0};
    double t0 = mmoe_clock_s();
    st = generate(&run, &ids, max_tokens, &dec, &err);
    double seconds = mmoe_clock_s() - t0;
    mmoe_token_ids_free(&ids);
    mmoe_stop_free(&run.stop);
    mmoe_text_free(&run.piece);
    mmoe_text_free(&run.released);

    pthread_mutex_lock(&srv->lock);
    job->completion_tokens = dec.n_generated;
    job->finish_reason = run.matched || dec.stop == MMOE_GEN_STOP_EOS ? "stop" : "length";
    if (st != MMOE_OK) {
        char msg[sizeof err.msg + 64];
        snprintf(msg, sizeof msg, "generation failed: %s (%s)", err.msg, mmoe_status_name(st));
        fail_locked(srv, job, 500, serve_error_json(msg, "server_error", NULL, NULL));
    } else {
        job->state = SERVE_JOB_DONE;
        srv->n_served++;
        srv->n_cancelled += run.abandoned;
        pthread_cond_broadcast(&srv->changed);
    }
    pthread_mutex_unlock(&srv->lock);
    fprintf(stderr, "megamoe serve: request %lld (%s%s): %lld prompt tokens, %lld generated in %.3f s, %s\n",
            (long long)job->number, req->kind == SERVE_CHAT ? "chat" : "completion", req->stream ? ", stream" : "",
            (long long)job->prompt_tokens, (long long)dec.n_generated, seconds,
            st != MMOE_OK ? "failed" : run.abandoned ? "cancelled: the client went away" : job->finish_reason);
}

/** Take the oldest job off the queue (lock held; the queue is not empty). */
static serve_job *pop_locked(serve_server *srv)
{
    serve_job *job = srv->head;
    srv->head = job->next;
    if (srv->head == NULL)
        srv->tail = NULL;
    job->next = NULL;
    srv->n_queued--;
    return job;
}

/** The worker: jobs in arrival order, one at a time, until the server stops. */
static void *worker_main(void *arg)
{
    serve_server *srv = arg;
    pthread_mutex_lock(&srv->lock);
    for (;;) {
        while (srv->head == NULL && !srv->stopping)
            pthread_cond_wait(&srv->changed, &srv->lock);
        if (srv->stopping)
            break;
        serve_job *job = pop_locked(srv);
        if (job->cancelled) {
            srv->n_cancelled++;
            fail_locked(srv, job, 499, serve_error_json("the client went away", "cancelled", NULL, NULL));
            job_release_locked(job);
            continue;
        }
        srv->busy = 1;
        pthread_mutex_unlock(&srv->lock);
        run_job(srv, job);
        pthread_mutex_lock(&srv->lock);
        srv->busy = 0;
        job_release_locked(job);
        pthread_cond_broadcast(&srv->changed);
    }
    while (srv->head != NULL) {
        serve_job *job = pop_locked(srv);
        fail_locked(srv, job, 503, serve_error_json("the server is shutting down", "server_error", NULL, NULL));
        job_release_locked(job);
    }
    pthread_cond_broadcast(&srv->changed);
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

mmoe_status serve_engine_start(serve_server *srv, mmoe_error *err)
{
    if (pthread_create(&srv->worker, NULL, worker_main, srv) != 0)
        return mmoe_error_set(err, MMOE_EINTERNAL, "cannot start the worker thread");
    srv->have_worker = 1;
    return MMOE_OK;
}

void serve_engine_stop(serve_server *srv)
{
    pthread_mutex_lock(&srv->lock);
    srv->stopping = 1;
    pthread_cond_broadcast(&srv->changed);
    pthread_mutex_unlock(&srv->lock);
    if (srv->have_worker)
        pthread_join(srv->worker, NULL);
    srv->have_worker = 0;
    if (srv->have_session)
        mmoe_gen_session_free(&srv->session);
    srv->have_session = 0;
    mmoe_gpu_model_destroy(srv->gpu);
    mmoe_model_state_destroy(srv->state);
    mmoe_model_close(srv->model);
    mmoe_tokenizer_free(srv->tok);
    srv->state = NULL;
    srv->model = NULL;
    srv->tok = NULL;
}
